// CUDA kernels of the unary elementwise ops: the functors of kernels/functors.h, as on the CPU.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class F>
cudaError_t run(DT dt, bool float_only, const Loop& L, cudaStream_t s) {
  switch (dt) {
    case DT::f32:
      return run_elementwise<F, float, float>(L, F{}, s);
    case DT::f64:
      return run_elementwise<F, double, double>(L, F{}, s);
    case DT::i32:
      if (!float_only) return run_elementwise<F, int32_t, int32_t>(L, F{}, s);
      return cudaErrorNotSupported;
    case DT::i64:
      if (!float_only) return run_elementwise<F, int64_t, int64_t>(L, F{}, s);
      return cudaErrorNotSupported;
    default:
      return cudaErrorNotSupported;
  }
}

// Float math takes f32 and f64 only (integers arrive as f32).
template <class F>
cudaError_t run_float(DT dt, const Loop& L, cudaStream_t s) {
  if (dt == DT::f32) return run_elementwise<F, float, float>(L, F{}, s);
  if (dt == DT::f64) return run_elementwise<F, double, double>(L, F{}, s);
  return cudaErrorNotSupported;
}

// The math column of core/elementwise.def.
struct Float {};
struct Same {};
template <class F>
cudaError_t run_math(Float, DT dt, const Loop& L, cudaStream_t s) {
  return run_float<F>(dt, L, s);
}
template <class F>
cudaError_t run_math(Same, DT dt, const Loop& L, cudaStream_t s) {
  return run<F>(dt, false, L, s);
}

}  // namespace

cudaError_t launch_unary(Unary op, DT dt, const Loop& L, cudaStream_t s) {
  switch (op) {
#define DUET_UNARY(Name, name, math, doc) \
  case Unary::Name:                       \
    return run_math<fn::Name>(math{}, dt, L, s);
#include "core/elementwise.def"
  }
  return cudaErrorNotSupported;
}

}  // namespace duet::cuda::kern
