// duet: f16 and bf16 in the kernels.
//
// Note [Low precision]
// f16 and bf16 tensors store 2-byte elements and compute in f32, as PyTorch's do: a kernel
// loads each element as a float, computes in f32 (reductions, cumsum and the softmax family
// accumulate there) and rounds the result to nearest-even once, when it stores it. So a
// low-precision result is the f32 result of the same (rounded) inputs, rounded, up to the
// order of a sum, and every device and both faces agree on it.
//
// Two kinds of kernel do that:
//  - kernels written for the low dtypes themselves: Cast and Copy, the elementwise families
//    (blocks converted to f32 and back around the f32 functors), and the products that have
//    library kernels (matmul through oneDNN's bf16 primitives);
//  - every other kernel is registered through via_f32<kernel>, which converts the f16 and bf16
//    inputs to f32 with the Cast kernel of the output's device, runs the f32 kernel into an f32
//    temporary, and casts that into the output. Data movement (gather, cat, unfold) is exact
//    that way; sums and products accumulate in f32.
// f32 and every other dtype pass through via_f32 at the cost of a dtype test.
#pragma once

#include <Eigen/Core>

#include "core/op_table.h"

namespace duet::kernels {

/// The C++ types of the low-precision dtypes: Eigen's, which convert with round-to-nearest-even.
using f16_t = Eigen::half;
using bf16_t = Eigen::bfloat16;

/// Whether an input or the output of a call is f16 or bf16.
bool has_low_precision(TensorRefs in, const Tensor& out);
/// Runs kernel k with its f16/bf16 inputs and output in f32 (Note [Low precision]).
void run_in_f32(KernelFn k, TensorRefs in, const Attrs& attrs, const Tensor& out);

/// Kernel K, computing f16 and bf16 in f32 (Note [Low precision]).
template <KernelFn K>
void via_f32(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  if (has_low_precision(in, out)) [[unlikely]]
    return run_in_f32(K, in, attrs, out);
  K(in, attrs, out);
}

}  // namespace duet::kernels

/// DUET_DISPATCH_DTYPE with f16 and bf16 too, as f16_t and bf16_t.
#define DUET_DISPATCH_WITH_LOW(dtype, op_name, ...)              \
  [&] {                                                          \
    switch (dtype) {                                             \
      case ::duet::DType::f16: {                                 \
        using scalar_t = ::duet::kernels::f16_t;                 \
        return __VA_ARGS__();                                    \
      }                                                          \
      case ::duet::DType::bf16: {                                \
        using scalar_t = ::duet::kernels::bf16_t;                \
        return __VA_ARGS__();                                    \
      }                                                          \
      default:                                                   \
        return DUET_DISPATCH_DTYPE(dtype, op_name, __VA_ARGS__); \
    }                                                            \
  }()
