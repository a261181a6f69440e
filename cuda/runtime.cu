// duet: CUDA runtime queries. Device kernels arrive with the CUDA backend; this file only asks
// the driver what is there, so a build with nvcc runs unchanged on a machine without a GPU.
#include <cuda_runtime.h>

#include "cuda/cuda.h"
#include "kernels/functors.h"

namespace duet::cuda {

int device_count() {
  int n = 0;
  // No driver or no device: report none (and clear the sticky error state).
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool is_available() { return device_count() > 0; }

void synchronize() {
  if (is_available()) cudaDeviceSynchronize();
}

void empty_cache() {}

// The elementwise functors are shared with the CPU kernels; instantiating them here keeps them
// compilable by nvcc (DESIGN.md: one functor per op for every backend).
template <class F, class T>
__global__ void unary_check(const T* x, T* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = F{}(x[i]);
}
template <class F, class T>
__global__ void binary_check(const T* a, const T* b, T* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = F{}(a[i], b[i]);
}
template __global__ void unary_check<fn::Exp, float>(const float*, float*, int);
template __global__ void unary_check<fn::Log, float>(const float*, float*, int);
template __global__ void unary_check<fn::Tanh, float>(const float*, float*, int);
template __global__ void unary_check<fn::Sigmoid, float>(const float*, float*, int);
template __global__ void unary_check<fn::Relu, float>(const float*, float*, int);
template __global__ void unary_check<fn::Abs, int>(const int*, int*, int);
template __global__ void binary_check<fn::Add, int64_t>(const int64_t*, const int64_t*, int64_t*,
                                                        int);
template __global__ void binary_check<fn::Maximum, double>(const double*, const double*, double*,
                                                           int);
template __global__ void binary_check<fn::Pow, float>(const float*, const float*, float*, int);

}  // namespace duet::cuda
