// CUDA kernels of the arithmetic binary ops (broadcasting): the functors of kernels/functors.h.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class F, bool FloatOnly = false>
cudaError_t run(DT dt, const Loop& L, cudaStream_t s) {
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    if constexpr (FloatOnly && !std::is_floating_point_v<T>) {
      return cudaErrorNotSupported;
    } else {
      return run_elementwise<F, T, T, T>(L, F{}, s);
    }
  });
}

}  // namespace

cudaError_t launch_binary_arith(Binary op, DT dt, const Loop& L, cudaStream_t s) {
  switch (op) {
    case Binary::Add:
      return run<fn::Add>(dt, L, s);
    case Binary::Sub:
      return run<fn::Sub>(dt, L, s);
    case Binary::Mul:
      return run<fn::Mul>(dt, L, s);
    case Binary::Div:
      return run<fn::Div, true>(dt, L, s);  // integers divide in f32
    case Binary::Pow:
      return run<fn::Pow>(dt, L, s);
    case Binary::Maximum:
      return run<fn::Maximum>(dt, L, s);
    case Binary::Minimum:
      return run<fn::Minimum>(dt, L, s);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace duet::cuda::kern
