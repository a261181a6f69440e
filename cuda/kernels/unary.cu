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

// Neg, Abs and Relu also take integers; the others are float math (integers arrive as f32).
template <class F>
cudaError_t run_float(DT dt, const Loop& L, cudaStream_t s) {
  if (dt == DT::f32) return run_elementwise<F, float, float>(L, F{}, s);
  if (dt == DT::f64) return run_elementwise<F, double, double>(L, F{}, s);
  return cudaErrorNotSupported;
}

}  // namespace

cudaError_t launch_unary(Unary op, DT dt, const Loop& L, cudaStream_t s) {
  switch (op) {
    case Unary::Neg:
      return run<fn::Neg>(dt, false, L, s);
    case Unary::Abs:
      return run<fn::Abs>(dt, false, L, s);
    case Unary::Relu:
      return run<fn::Relu>(dt, false, L, s);
    case Unary::Exp:
      return run_float<fn::Exp>(dt, L, s);
    case Unary::Log:
      return run_float<fn::Log>(dt, L, s);
    case Unary::Sqrt:
      return run_float<fn::Sqrt>(dt, L, s);
    case Unary::Rsqrt:
      return run_float<fn::Rsqrt>(dt, L, s);
    case Unary::Sin:
      return run_float<fn::Sin>(dt, L, s);
    case Unary::Cos:
      return run_float<fn::Cos>(dt, L, s);
    case Unary::Tanh:
      return run_float<fn::Tanh>(dt, L, s);
    case Unary::Sigmoid:
      return run_float<fn::Sigmoid>(dt, L, s);
    case Unary::Erf:
      return run_float<fn::Erf>(dt, L, s);
    case Unary::LogSigmoid:
      return run_float<fn::LogSigmoid>(dt, L, s);
  }
  return cudaErrorNotSupported;
}

}  // namespace duet::cuda::kern
