// Integer matmul (cuBLAS has no i32/i64 GEMM): one thread per output element, products and
// sums wrapping as the CPU's Eigen GEMM does in practice (fn::wrap_mul / wrap_add).
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class T>
__global__ void int_gemm_kernel(IntGemmArg A) {
  const int64_t total = A.m * A.n, grid = int64_t(gridDim.x) * blockDim.x;
  const T* a = static_cast<const T*>(A.a);
  const T* b = static_cast<const T*>(A.b);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += grid) {
    const int64_t r = i / A.n, c = i % A.n;
    T acc = 0;
    for (int64_t k = 0; k < A.k; ++k)
      acc = fn::wrap_add(acc, fn::wrap_mul(a[r * A.as0 + k * A.as1], b[k * A.bs0 + c * A.bs1]));
    static_cast<T*>(A.c)[i] = acc;
  }
}

}  // namespace

cudaError_t launch_int_gemm(DT dt, const IntGemmArg& A, cudaStream_t s) {
  if (A.m * A.n == 0) return cudaSuccess;
  if (dt == DT::i32)
    int_gemm_kernel<int32_t><<<blocks_for(A.m * A.n), kThreads, 0, s>>>(A);
  else if (dt == DT::i64)
    int_gemm_kernel<int64_t><<<blocks_for(A.m * A.n), kThreads, 0, s>>>(A);
  else
    return cudaErrorNotSupported;
  return cudaGetLastError();
}

}  // namespace duet::cuda::kern
