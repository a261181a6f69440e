// CUDA kernel of Random: element i draws exactly as kernels/random.cpp does (block offset + i/2
// of kernels/philox.h, words 2*(i%2) and 2*(i%2)+1), so uniform and integer draws are
// bit-identical to the CPU's and normals differ only by the device's double-precision
// log/sin/cos (within 2 ulp). The state {seed, offset} is read on the device: no host sync.
#include "cuda/kernels/common.cuh"
#include "kernels/philox.h"

namespace duet::cuda::kern {
namespace {

template <class T>
__device__ __forceinline__ T draw(int dist, int64_t high, uint64_t key, uint64_t offset,
                                  int64_t i) {
  const philox::Block b = philox::generate(key, offset + static_cast<uint64_t>(i / 2));
  const int j = 2 * static_cast<int>(i % 2);
  const uint32_t hi = b.w[j], lo = b.w[j + 1];
  if (dist == 2) {
    const uint64_t r = (uint64_t(hi) << 32) | lo;
    return static_cast<T>(r % static_cast<uint64_t>(high));
  }
  if (dist == 0) {
    if constexpr (std::is_same_v<T, float>) return philox::to_float(hi);
    return static_cast<T>(philox::to_double(hi, lo));
  }
  const double u1 = 1.0 - philox::to_double(b.w[0], b.w[1]);
  const double u2 = philox::to_double(b.w[2], b.w[3]);
  const double r = sqrt(-2.0 * log(u1)), theta = 6.283185307179586 * u2;
  return static_cast<T>(i % 2 ? r * sin(theta) : r * cos(theta));
}

template <class T>
__global__ void random_kernel(RandomArg A) {
  const uint64_t key = static_cast<uint64_t>(A.state[0]);
  const uint64_t offset = static_cast<uint64_t>(A.state[A.state_stride]);
  T* out = static_cast<T*>(A.out);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < A.n; i += step)
    out[i] = draw<T>(A.dist, A.high, key, offset, i);
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
    default:
      return cudaErrorNotSupported;
  }
  return cudaGetLastError();
}

}  // namespace duet::cuda::kern
