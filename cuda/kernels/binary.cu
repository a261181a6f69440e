// CUDA kernels of the arithmetic binary ops (broadcasting): the functors of kernels/functors.h.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class F>
cudaError_t run(DT dt, const Loop& L, cudaStream_t s) {
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    return run_elementwise<F, T, T, T>(L, F{}, s);
  });
}

}  // namespace

// Division computes in a float dtype only (core/ops/elementwise.cpp promotes integers to f32).
cudaError_t launch_binary_arith(Binary op, DT dt, const Loop& L, cudaStream_t s) {
  switch (op) {
#define DUET_BINARY(Name, name, doc) \
  case Binary::Name:                 \
    return run<fn::Name>(dt, L, s);
#include "core/elementwise.def"
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace duet::cuda::kern
