// CUDA kernels of gather and scatter_add (atomic adds: positions may share a row). Each checks
// its indices as it reads them and records the first one out of range (Note [Device index
// checks] in cuda/runtime.cpp) instead of touching memory with it.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

// Whether index j is in range; records it otherwise (the first recorder fills the record).
__device__ __forceinline__ bool index_ok(int64_t j, const IndexCheck& c) {
  if (j >= 0 && j < c.size) return true;
  auto* set = reinterpret_cast<unsigned long long*>(c.record);
  if (atomicCAS(set, 0ull, 1ull) == 0ull) {
    c.record[1] = j;
    c.record[2] = c.size;
    c.record[3] = c.dim;
    c.record[4] = c.op;
    __threadfence_system();
  }
  return false;
}

template <class T>
__global__ void gather_kernel(Loop L, int64_t step, IndexCheck c) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += grid) {
    int64_t off[3];
    offsets<2>(L, i, off);
    const int64_t j = static_cast<const int64_t*>(L.in[0].data)[off[1]];
    static_cast<T*>(const_cast<void*>(L.out.data))[off[0]] =
        index_ok(j, c) ? static_cast<const T*>(L.in[1].data)[off[2] + j * step] : T(0);
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
__global__ void scatter_add_kernel(Loop L, int64_t step, IndexCheck c) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += grid) {
    int64_t off[3];
    offsets<2>(L, i, off);
    const int64_t j = static_cast<const int64_t*>(L.in[0].data)[off[1]];
    if (!index_ok(j, c)) continue;
    atomic_add(static_cast<T*>(const_cast<void*>(L.out.data)) + off[0] + j * step,
               static_cast<const T*>(L.in[1].data)[off[2]]);
  }
}

}  // namespace

cudaError_t launch_gather(DT dt, const Loop& L, int64_t step, const IndexCheck& check,
                          cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    gather_kernel<T><<<blocks_for(L.numel), kThreads, 0, s>>>(L, step, check);
    return cudaGetLastError();
  });
}

cudaError_t launch_scatter_add(DT dt, const Loop& L, int64_t step, const IndexCheck& check,
                               cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    scatter_add_kernel<T><<<blocks_for(L.numel), kThreads, 0, s>>>(L, step, check);
    return cudaGetLastError();
  });
}

}  // namespace duet::cuda::kern
