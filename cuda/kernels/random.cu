// CUDA kernel of Random: element i runs philox::draw (kernels/philox.h), the function the CPU
// kernel runs, so uniform and integer draws are bit-identical to the CPU's and normals differ
// only by the device's double-precision log/sin/cos (within 2 ulp). The state {seed, offset} is
// read on the device: no host sync.
#include "cuda/kernels/common.cuh"
#include "kernels/philox.h"

namespace duet::cuda::kern {
namespace {

template <class T>
__global__ void random_kernel(RandomArg A) {
  const uint64_t key = static_cast<uint64_t>(A.state[0]);
  const uint64_t offset = static_cast<uint64_t>(A.state[A.state_stride]);
  T* out = static_cast<T*>(A.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < A.n; i += step)
    out[i] = philox::draw<T>(A.dist, A.high, key, offset, i);
}

// f16 and bf16: uniform draws keep the dtype's digits, as on the CPU (philox::draw_low).
template <class T>
__global__ void random_low_kernel(RandomArg A, int digits) {
  const uint64_t key = static_cast<uint64_t>(A.state[0]);
  const uint64_t offset = static_cast<uint64_t>(A.state[A.state_stride]);
  T* out = static_cast<T*>(A.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < A.n; i += step)
    out[i] = float_to_low<T>(philox::draw_low(A.dist, A.high, key, offset, i, digits));
}

}  // namespace

cudaError_t launch_random(DT dt, const RandomArg& A, cudaStream_t s) {
  if (A.n == 0) return cudaSuccess;
  switch (dt) {
    case DT::f32:
      random_kernel<float><<<blocks_for(A.n), kThreads, 0, s>>>(A);
      break;
    case DT::f64:
      random_kernel<double><<<blocks_for(A.n), kThreads, 0, s>>>(A);
      break;
    case DT::i32:
      random_kernel<int32_t><<<blocks_for(A.n), kThreads, 0, s>>>(A);
      break;
    case DT::i64:
      random_kernel<int64_t><<<blocks_for(A.n), kThreads, 0, s>>>(A);
      break;
    case DT::f16:
      random_low_kernel<__half><<<blocks_for(A.n), kThreads, 0, s>>>(A, 11);
      break;
    case DT::bf16:
      random_low_kernel<__nv_bfloat16><<<blocks_for(A.n), kThreads, 0, s>>>(A, 8);
      break;
    default:
      return cudaErrorNotSupported;
  }
  return cudaGetLastError();
}

}  // namespace duet::cuda::kern
