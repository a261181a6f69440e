// CUDA kernels of Attention and AttentionBackward (Note [Attention] in core/ops/attention.cpp):
// one warp per row, the row's head dims spread over the lanes (at most kMaxHeadDim / 32 each),
// accumulating in f32 (f64 for f64 inputs) with the online softmax. The backward is two passes
// without atomics, so its sums have a fixed order: one warp per query row for dq, one per key row
// for dk and dv, each recomputing the probabilities from the saved logsumexp.
//
// A plain, correct kernel with O(L) memory: no shared-memory tiles and no tensor-core MMA yet.
#include <cmath>

#include "cuda/kernels/common.cuh"

namespace duet::cuda::kern {
namespace {

constexpr int kWarps = 4;           // per block
constexpr int kPerLane = 256 / 32;  // kMaxHeadDim (core/ops.h) over a warp's lanes

template <class T, class A>
__device__ __forceinline__ A ld(const AttnOperand& o, int64_t base, int64_t r, int64_t c) {
  const T v = static_cast<const T*>(o.data)[base + r * o.rs + c * o.cs];
  if constexpr (is_low_v<T>)
    return static_cast<A>(low_to_float(v));
  else
    return static_cast<A>(v);
}

// The element offset of batch b in operand o.
__device__ __forceinline__ int64_t batch_offset(const AttnArg& a, const AttnOperand& o, int64_t b) {
  int64_t off = 0;
  for (int d = a.nbatch - 1; d >= 0; --d) {
    const int64_t n = a.batch_sizes[d];
    off += (b % n) * o.batch[d];
    b /= n;
  }
  return off;
}

// The warp's row: index i (a query, or a key for attention_dkdv) of batch b, with the operands'
// offsets for batch b. `rows`: rows per batch (L or S).
struct WarpRow {
  int lane;
  int64_t row, b, i, qb, kb, vb, mb;
};
__device__ __forceinline__ WarpRow warp_row(const AttnArg& a, int64_t rows) {
  WarpRow w;
  w.lane = threadIdx.x & 31;
  w.row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  w.b = w.row / rows;
  w.i = w.row % rows;
  const int64_t b = w.b < a.nb ? w.b : 0;  // rows past the end return before reading
  w.qb = batch_offset(a, a.q, b);
  w.kb = batch_offset(a, a.k, b);
  w.vb = batch_offset(a, a.v, b);
  w.mb = a.mask ? batch_offset(a, a.m, b) : 0;
  return w;
}

template <class A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) x += __shfl_xor_sync(0xffffffffu, x, k);
  return x;
}

// q_i . k_j * scale, masked (the same value in every lane).
template <class T, class A>
__device__ __forceinline__ A score(const AttnArg& a, const A* qv, int64_t kb, int64_t mb, int64_t i,
                                   int64_t j, int lane) {
  A dot = 0;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < a.e) dot += qv[t] * ld<T, A>(a.k, kb, j, c);
  }
  A sc = warp_sum(dot) * static_cast<A>(a.scale);
  const A ninf = -static_cast<A>(INFINITY);
  if (a.causal && j > i) return ninf;
  if (a.mask == 1 && !static_cast<const bool*>(a.m.data)[mb + i * a.m.rs + j * a.m.cs]) return ninf;
  if (a.mask == 2) sc += ld<T, A>(a.m, mb, i, j);
  return sc;
}

template <class T, class A>
__global__ void attention_forward(AttnArg a) {
  const WarpRow w = warp_row(a, a.l);
  if (w.row >= a.nb * a.l) return;
  const int lane = w.lane;
  const int64_t b = w.b, i = w.i, kb = w.kb, vb = w.vb, mb = w.mb, qb = w.qb;
  A qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    qv[t] = c < a.e ? ld<T, A>(a.q, qb, i, c) : A(0);
    acc[t] = 0;
  }
  const A ninf = -static_cast<A>(INFINITY);
  A m = ninf, l = 0;
  const int64_t kend = a.causal ? (i + 1 < a.s ? i + 1 : a.s) : a.s;
  for (int64_t j = 0; j < kend; ++j) {
    const A sc = score<T, A>(a, qv, kb, mb, i, j, lane);
    if (sc == ninf) continue;  // masked: its probability is 0
    const A m_new = sc > m ? sc : m;
    const A alpha = exp(m - m_new), p = exp(sc - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < a.f) acc[t] = acc[t] * alpha + p * ld<T, A>(a.v, vb, j, c);
    }
    m = m_new;
  }
  // No keys: zeros (the composite's empty sum); every key masked: NaN (its softmax).
  const A inv = a.s == 0 ? A(0) : l > 0 ? A(1) / l : static_cast<A>(NAN);
  A* r = static_cast<A*>(a.out) + batch_offset(a, a.r, b) + i * a.r.rs;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < a.f) r[c * a.r.cs] = acc[t] * inv;
  }
  if (lane == 0) r[a.f * a.r.cs] = l > 0 ? m + log(l) : ninf;
}

// dq of query row i, and D_i = rowsum(dO * O) - g_lse into the scratch.
template <class T, class A>
__global__ void attention_dq(AttnArg a) {
  const WarpRow w = warp_row(a, a.l);
  if (w.row >= a.nb * a.l) return;
  const int lane = w.lane;
  const int64_t row = w.row, b = w.b, i = w.i, qb = w.qb, kb = w.kb, vb = w.vb, mb = w.mb;
  const A* r = static_cast<const A*>(a.r.data) + batch_offset(a, a.r, b) + i * a.r.rs;
  const A* g = static_cast<const A*>(a.g.data) + batch_offset(a, a.g, b) + i * a.g.rs;
  A qv[kPerLane], go[kPerLane], dq[kPerLane];
  A d = 0;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    qv[t] = c < a.e ? ld<T, A>(a.q, qb, i, c) : A(0);
    go[t] = c < a.f ? g[c * a.g.cs] : A(0);
    if (c < a.f) d += go[t] * r[c * a.r.cs];
    dq[t] = 0;
  }
  d = warp_sum(d) - g[a.f * a.g.cs];
  const A lse = r[a.f * a.r.cs], scale = static_cast<A>(a.scale);
  if (lane == 0) static_cast<A*>(a.scratch)[row] = d;
  const int64_t kend = a.causal ? (i + 1 < a.s ? i + 1 : a.s) : a.s;
  for (int64_t j = 0; j < kend; ++j) {
    const A p = exp(score<T, A>(a, qv, kb, mb, i, j, lane) - lse);
    A dp = 0;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < a.f) dp += go[t] * ld<T, A>(a.v, vb, j, c);
    }
    const A ds = p * (warp_sum(dp) - d) * scale;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < a.e) dq[t] += ds * ld<T, A>(a.k, kb, j, c);
    }
  }
  A* out = static_cast<A*>(a.out) + b * (a.l * a.e + a.s * a.e + a.s * a.f) + i * a.e;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < a.e) out[c] = dq[t];
  }
}

// dk and dv of key row j (after attention_dq has written the D_i).
template <class T, class A>
__global__ void attention_dkdv(AttnArg a) {
  const WarpRow w = warp_row(a, a.s);
  if (w.row >= a.nb * a.s) return;
  const int lane = w.lane;
  const int64_t b = w.b, j = w.i, qb = w.qb, kb = w.kb, vb = w.vb, mb = w.mb;
  const int64_t rb = batch_offset(a, a.r, b), gb = batch_offset(a, a.g, b);
  const A* ra = static_cast<const A*>(a.r.data);
  const A* ga = static_cast<const A*>(a.g.data);
  const A* dsum = static_cast<const A*>(a.scratch) + b * a.l;
  A vv[kPerLane], dk[kPerLane], dv[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    vv[t] = c < a.f ? ld<T, A>(a.v, vb, j, c) : A(0);
    dk[t] = dv[t] = 0;
  }
  const A scale = static_cast<A>(a.scale);
  A qv[kPerLane];
  for (int64_t i = a.causal ? j : 0; i < a.l; ++i) {
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      qv[t] = c < a.e ? ld<T, A>(a.q, qb, i, c) : A(0);
    }
    const A lse = ra[rb + i * a.r.rs + a.f * a.r.cs];
    const A p = exp(score<T, A>(a, qv, kb, mb, i, j, lane) - lse);
    A dp = 0;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < a.f) {
        const A go = ga[gb + i * a.g.rs + c * a.g.cs];
        dp += go * vv[t];
        dv[t] += p * go;
      }
    }
    const A ds = p * (warp_sum(dp) - dsum[i]) * scale;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) dk[t] += ds * qv[t];
  }
  A* out = static_cast<A*>(a.out) + b * (a.l * a.e + a.s * a.e + a.s * a.f) + a.l * a.e;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    if (c < a.e) out[j * a.e + c] = dk[t];
    if (c < a.f) out[a.s * a.e + j * a.f + c] = dv[t];
  }
}

unsigned blocks_for_rows(int64_t rows) {
  return static_cast<unsigned>((rows + kWarps - 1) / kWarps);
}

}  // namespace

cudaError_t launch_attention(DT dt, const AttnArg& arg, cudaStream_t s) {
  if (arg.nb * arg.l == 0) return cudaSuccess;
  return dispatch_floating(dt, [&](auto t, auto acc) -> cudaError_t {
    using T = decltype(t);
    using A = decltype(acc);
    attention_forward<T, A><<<blocks_for_rows(arg.nb * arg.l), 32 * kWarps, 0, s>>>(arg);
    return cudaGetLastError();
  });
}

cudaError_t launch_attention_backward(DT dt, const AttnArg& arg, cudaStream_t s) {
  if (arg.nb * arg.l == 0 || arg.s == 0) return cudaSuccess;  // the adapter zeroed the result
  return dispatch_floating(dt, [&](auto t, auto acc) -> cudaError_t {
    using T = decltype(t);
    using A = decltype(acc);
    attention_dq<T, A><<<blocks_for_rows(arg.nb * arg.l), 32 * kWarps, 0, s>>>(arg);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    attention_dkdv<T, A><<<blocks_for_rows(arg.nb * arg.s), 32 * kWarps, 0, s>>>(arg);
    return cudaGetLastError();
  });
}

}  // namespace duet::cuda::kern
