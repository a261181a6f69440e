// duet_bench: floors written by hand in CUDA, for the CUDA workloads (bench/cuda.cpp).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/functors.h"

namespace bench {
using namespace duet;  // fn:: functors
namespace {

// W2's chain fused by hand: one thread per four floats, with one 16-byte load and one 16-byte
// store, the same scalar functors as duet's kernels, and whatever nvcc makes of them (fused
// multiply-adds allowed: a floor may be faster than what duet promises to compute).
__device__ __forceinline__ float w2(float v) {
  return fn::Tanh{}(v * 1.5f + 0.5f) * fn::Sigmoid{}(v) + fn::Relu{}(v - 0.25f);
}

__global__ void __launch_bounds__(256) w2_kernel(const float4* x, float4* y, int64_t n4) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 v = x[i];
  y[i] = make_float4(w2(v.x), w2(v.y), w2(v.z), w2(v.w));
}

__global__ void w2_tail(const float* x, float* y, int64_t from, int64_t n) {
  const int64_t i = from + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = w2(x[i]);
}

}  // namespace

// y = tanh(x * 1.5 + 0.5) * sigmoid(x) + relu(x - 0.25) over n floats (x and y 16-byte aligned).
cudaError_t w2_hand_fused(const float* x, float* y, int64_t n, cudaStream_t s) {
  const int64_t n4 = n / 4;
  if (n4 > 0)
    w2_kernel<<<static_cast<unsigned>((n4 + 255) / 256), 256, 0, s>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n4);
  if (n % 4) w2_tail<<<1, 4, 0, s>>>(x, y, n4 * 4, n);
  return cudaGetLastError();
}

}  // namespace bench
