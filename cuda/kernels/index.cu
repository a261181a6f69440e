// CUDA kernels of gather and scatter_add (atomic adds: positions may share a row) and the
// index range check that both run first, as the CPU kernels do.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class T>
__global__ void gather_kernel(Loop L, int64_t step) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += grid) {
    int64_t off[3];
    offsets<2>(L, i, off);
    const int64_t j = static_cast<const int64_t*>(L.in[0].data)[off[1]];
    static_cast<T*>(const_cast<void*>(L.out.data))[off[0]] =
        static_cast<const T*>(L.in[1].data)[off[2] + j * step];
  }
}

// Integer atomics wrap (two's complement), as fn::wrap_add does.
template <class T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v) *p = true;  // wrap_add on b8 is "or": racing writers all store true
  } else if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else {
    atomicAdd(p, v);
  }
}

template <class T>
__global__ void scatter_add_kernel(Loop L, int64_t step) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += grid) {
    int64_t off[3];
    offsets<2>(L, i, off);
    const int64_t j = static_cast<const int64_t*>(L.in[0].data)[off[1]];
    atomic_add(static_cast<T*>(const_cast<void*>(L.out.data)) + off[0] + j * step,
               static_cast<const T*>(L.in[1].data)[off[2]]);
  }
}

__global__ void check_index_kernel(Loop L, int64_t size, int64_t* flag) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += grid) {
    int64_t off[2];
    offsets<1>(L, i, off);
    const int64_t j = static_cast<const int64_t*>(L.in[0].data)[off[1]];
    if (j < 0 || j >= size) {
      flag[0] = 1;
      flag[1] = j;
    }
  }
}

}  // namespace

cudaError_t launch_gather(DT dt, const Loop& L, int64_t step, cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    gather_kernel<T><<<blocks_for(L.numel), kThreads, 0, s>>>(L, step);
    return cudaGetLastError();
  });
}

cudaError_t launch_scatter_add(DT dt, const Loop& L, int64_t step, cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    scatter_add_kernel<T><<<blocks_for(L.numel), kThreads, 0, s>>>(L, step);
    return cudaGetLastError();
  });
}

cudaError_t launch_check_index(const Loop& L, int64_t size, int64_t* flag, cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  check_index_kernel<<<blocks_for(L.numel), kThreads, 0, s>>>(L, size, flag);
  return cudaGetLastError();
}

}  // namespace duet::cuda::kern
