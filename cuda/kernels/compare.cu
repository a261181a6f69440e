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
#define DUET_COMPARE(Name, name, expr, doc) \
  case Binary::Name:                        \
    return run<fn::Name>(dt, L, s);
#include "core/elementwise.def"
    default:
      return launch_binary_arith(op, dt, L, s);
  }
}

}  // namespace duet::cuda::kern
