// duet: device helpers shared by the .cu files: grid sizing, dtype dispatch, the offset
// calculator and the elementwise loop (vectorized when dense, strided otherwise).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/launch.h"

namespace duet::cuda::kern {

inline constexpr int kThreads = 256;

// Blocks for n items of work, capped: the loops are grid-stride.
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

// Calls f(T{}) for the dtypes the CPU computes (f32, f64, i32, i64, b8).
template <class F>
cudaError_t dispatch_dt(DT dt, F&& f) {
  switch (dt) {
    case DT::f32:
      return f(float{});
    case DT::f64:
      return f(double{});
    case DT::i32:
      return f(int32_t{});
    case DT::i64:
      return f(int64_t{});
    case DT::b8:
      return f(bool{});
    default:
      return cudaErrorNotSupported;
  }
}

// dispatch_dt with f16 and bf16 too (as __half and __nv_bfloat16) and the narrow integers: for
// the conversions.
template <class F>
cudaError_t dispatch_dt_all(DT dt, F&& f) {
  switch (dt) {
    case DT::f16:
      return f(__half{});
    case DT::bf16:
      return f(__nv_bfloat16{});
    case DT::i8:
      return f(int8_t{});
    case DT::u8:
      return f(uint8_t{});
    case DT::i16:
      return f(int16_t{});
    default:
      return dispatch_dt(dt, f);
  }
}

// Calls f(T{}, A{}) for the floating dtypes: the storage type T and the type A the math runs
// in (f32 for f16 and bf16, which are loaded as floats and rounded once when stored).
template <class F>
cudaError_t dispatch_floating(DT dt, F&& f) {
  switch (dt) {
    case DT::f32:
      return f(float{}, float{});
    case DT::f64:
      return f(double{}, double{});
    case DT::f16:
      return f(__half{}, float{});
    case DT::bf16:
      return f(__nv_bfloat16{}, float{});
    default:
      return cudaErrorNotSupported;
  }
}

template <class T>
inline constexpr bool is_low_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// A low-precision value as a float, and a float rounded to nearest-even in a low dtype.
template <class T>
__device__ __forceinline__ float low_to_float(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}
template <class T>
__device__ __forceinline__ T float_to_low(float v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else
    return __float2bfloat16_rn(v);
}

template <class T>
__device__ __forceinline__ T load(const Operand& o, int64_t off) {
  if (o.by_value) {
    T v;
    memcpy(&v, o.value, sizeof(T));
    return v;
  }
  return static_cast<const T*>(o.data)[off];
}

// Element offsets of out and the first N inputs for linear index i (row-major over sizes).
template <int N>
__device__ __forceinline__ void offsets(const Loop& L, int64_t i, int64_t* off) {
#pragma unroll
  for (int k = 0; k <= N; ++k) off[k] = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= L.ndim) continue;
    const int64_t s = L.sizes[d], c = i % s;
    i /= s;
    off[0] += c * L.out.strides[d];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k + 1] += c * L.in[k].strides[d];
  }
}

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// The general case: any sizes and strides, broadcast inputs stepping by 0.
template <class Op, class R, class... In, size_t... I>
__device__ __forceinline__ void ew_one(const Loop& L, const Op& op, int64_t i,
                                       std::index_sequence<I...>) {
  int64_t off[sizeof...(In) + 1];
  offsets<sizeof...(In)>(L, i, off);
  static_cast<R*>(const_cast<void*>(L.out.data))[off[0]] = op(load<In>(L.in[I], off[I + 1])...);
}
template <class Op, class R, class... In>
__global__ void ew_strided(Loop L, Op op) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < L.numel; i += step)
    ew_one<Op, R, In...>(L, op, i, std::index_sequence_for<In...>{});
}

// The dense case: one dim, out and inputs of stride 1 (or a single broadcast value), moved V
// elements at a time in 16-byte (or narrower, for b8 results) accesses.
template <class T, int V>
__device__ __forceinline__ void load_vec(const Operand& o, int64_t j, T* x) {
  if (o.by_value || o.strides[0] == 0) {
    const T v = load<T>(o, 0);
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = v;
  } else {
    const Vec<T, V> p = reinterpret_cast<const Vec<T, V>*>(o.data)[j];
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = p.v[e];
  }
}
template <int V, class Op, class R, class... In, size_t... I>
__device__ __forceinline__ void ew_vec_one(const Loop& L, const Op& op, int64_t j,
                                           std::index_sequence<I...>) {
  Vec<R, V> r;
  if constexpr (sizeof...(In) == 1) {
    using A = std::tuple_element_t<0, std::tuple<In...>>;
    A a[V];
    load_vec<A, V>(L.in[0], j, a);
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = op(a[e]);
  } else if constexpr (sizeof...(In) == 2) {
    using A = std::tuple_element_t<0, std::tuple<In...>>;
    using B = std::tuple_element_t<1, std::tuple<In...>>;
    A a[V];
    B b[V];
    load_vec<A, V>(L.in[0], j, a);
    load_vec<B, V>(L.in[1], j, b);
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = op(a[e], b[e]);
  } else {
    using A = std::tuple_element_t<0, std::tuple<In...>>;
    using B = std::tuple_element_t<1, std::tuple<In...>>;
    using C = std::tuple_element_t<2, std::tuple<In...>>;
    A a[V];
    B b[V];
    C c[V];
    load_vec<A, V>(L.in[0], j, a);
    load_vec<B, V>(L.in[1], j, b);
    load_vec<C, V>(L.in[2], j, c);
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = op(a[e], b[e], c[e]);
  }
  reinterpret_cast<Vec<R, V>*>(const_cast<void*>(L.out.data))[j] = r;
}
template <int V, class Op, class R, class... In>
__global__ void ew_dense(Loop L, Op op) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t nv = L.numel / V;
  const int64_t t0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t j = t0; j < nv; j += step)
    ew_vec_one<V, Op, R, In...>(L, op, j, std::index_sequence_for<In...>{});
  // The tail that does not fill a vector (the strided path handles one-dim loops too).
  for (int64_t i = nv * V + t0; i < L.numel; i += step)
    ew_one<Op, R, In...>(L, op, i, std::index_sequence_for<In...>{});
}

template <class T>
inline bool aligned_to(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Runs out = op(in...) over the loop: vectorized when dense and aligned, else strided.
template <class Op, class R, class... In>
cudaError_t run_elementwise(const Loop& L, const Op& op, cudaStream_t s) {
  if (L.numel == 0) return cudaSuccess;
  constexpr size_t widest = std::max({sizeof(R), sizeof(In)...});
  constexpr int V = static_cast<int>(16 / widest);
  bool dense = L.ndim == 1 && !L.out.by_value && L.out.strides[0] == 1 &&
               aligned_to<R>(L.out.data, sizeof(R) * V);
  const size_t sizes[] = {sizeof(In)...};
  for (size_t k = 0; k < sizeof...(In); ++k) {
    const Operand& o = L.in[k];
    if (o.by_value || o.strides[0] == 0) continue;
    dense = dense && o.strides[0] == 1 && aligned_to<R>(o.data, int64_t(sizes[k]) * V);
  }
  if (dense && V > 1) {
    ew_dense<V, Op, R, In...><<<blocks_for(L.numel / V + 1), kThreads, 0, s>>>(L, op);
  } else {
    ew_strided<Op, R, In...><<<blocks_for(L.numel), kThreads, 0, s>>>(L, op);
  }
  return cudaGetLastError();
}

}  // namespace duet::cuda::kern
