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

// Whether value b (at position jb) goes before value c (at jc) in a row: NaN the largest,
// ties by position.
template <class T>
__device__ __forceinline__ bool goes_before(T b, int64_t jb, T c, int64_t jc, bool desc) {
  if constexpr (std::is_floating_point_v<T>) {
    const bool nb = b != b, nc = c != c;
    if (nb || nc) {
      if (nb && nc) return jb < jc;
      return desc ? nb : nc;
    }
  }
  if (b == c) return jb < jc;
  return desc ? b > c : b < c;
}

// Note [Argsort primitive] in core/ops/stats.cpp: one thread per element finds its rank.
template <class T>
__global__ void argsort_kernel(Loop L, int64_t len, int64_t step, int64_t out_step, bool desc) {
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += grid) {
    int64_t off[4];
    offsets<3>(L, i, off);
    const T* row = static_cast<const T*>(L.in[1].data) + off[2];
    const T v = static_cast<const T*>(L.in[0].data)[off[1]];
    // The element's position along the row, from its offset in out (contiguous: out_step >= 1).
    const int64_t j = out_step ? (off[0] - off[3]) / out_step : 0;
    int64_t rank = 0;
    for (int64_t k = 0; k < len; ++k)
      if (k != j && goes_before(row[k * step], k, v, j, desc)) ++rank;
    static_cast<int64_t*>(const_cast<void*>(L.out.data))[off[3] + rank * out_step] = j;
  }
}

}  // namespace

cudaError_t launch_argsort(DT dt, const Loop& L, int64_t len, int64_t step, int64_t out_step,
                           bool descending, cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    argsort_kernel<T><<<blocks_for(L.numel), kThreads, 0, s>>>(L, len, step, out_step, descending);
    return cudaGetLastError();
  });
}

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
