// CUDA kernels of the comparisons (b8 results): the functors of kernels/functors.h.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {

cudaError_t launch_binary_arith(Binary op, DT dt, const Loop& L, cudaStream_t s);  // binary.cu

namespace {

template <class F>
cudaError_t run(DT dt, const Loop& L, cudaStream_t s) {
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    return run_elementwise<F, bool, T, T>(L, F{}, s);
  });
}

}  // namespace

cudaError_t launch_binary(Binary op, DT dt, const Loop& L, cudaStream_t s) {
  switch (op) {
    case Binary::Lt:
      return run<fn::Lt>(dt, L, s);
    case Binary::Le:
      return run<fn::Le>(dt, L, s);
    case Binary::Gt:
      return run<fn::Gt>(dt, L, s);
    case Binary::Ge:
      return run<fn::Ge>(dt, L, s);
    case Binary::Eq:
      return run<fn::Eq>(dt, L, s);
    case Binary::Ne:
      return run<fn::Ne>(dt, L, s);
    default:
      return launch_binary_arith(op, dt, L, s);
  }
}

}  // namespace duet::cuda::kern
