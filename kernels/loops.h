// duet: CPU loops. Elementwise kernels walk their operands through `Loop`: broadcast and
// strided operands are aligned to the output shape, size-1 dims dropped and mergeable dims
// coalesced, so most strided work runs as a few long inner rows. Rows whose operands are all
// dense (or broadcast scalars) run on Eigen packets.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <type_traits>

#include "core/tensor.h"
#include "kernels/functors.h"

namespace duet::kernels {

/// Elements below which a kernel stays on the calling thread: starting a parallel region costs
/// more than it gains.
inline constexpr int64_t kParallelGrain = 32768;

/// Runs f(begin, end) over [0, n) on the OpenMP threads, in chunks that are multiples of
/// `align`, or inline when n is small. f must not throw.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f, int64_t align = 64) {
  if (n < 2 * grain) {
    f(int64_t(0), n);
    return;
  }
  int nt = omp_get_max_threads();
  if (nt <= 1 || omp_in_parallel()) {
    f(int64_t(0), n);
    return;
  }
  nt = static_cast<int>(std::min<int64_t>(nt, n / grain));
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), k = omp_get_num_threads();
    int64_t chunk = ((n + k - 1) / k + align - 1) / align * align;
    int64_t b = std::min<int64_t>(n, t * chunk), e = std::min<int64_t>(n, b + chunk);
    if (b < e) f(b, e);
  }
}

/// Runs f(thread, nthreads) on nt OpenMP threads (at least 1). f must not throw.
template <class F>
void parallel_threads(int nt, F&& f) {
  if (nt <= 1 || omp_in_parallel()) {
    f(0, 1);
    return;
  }
#pragma omp parallel num_threads(nt)
  f(omp_get_thread_num(), omp_get_num_threads());
}

// Note [Rows by reference]: for_each hands the walkers below (tiles, rows, the slow walk, the
// parallel split) the kernel's row function as a RowRef, so each is compiled once per operand
// count instead of once per kernel body: with a dozen functors, ten dtypes and three walkers,
// that was most of the compile time of the elementwise kernels. The price is one indirect call
// per row, where a row is a whole parallel chunk of a dense operand, a tile row of 32, or one
// inner run of a strided walk. Where the rows are short and the work per element is a load and
// a store (a strided copy within one dtype), the call showed in one measurement (a transposed
// 1024 x 1024 copy took 1.45 times as long; such tight loops also move with code layout on this
// CPU), so for_each_inline keeps the row inlined there.

/// A non-owning reference to a callable row(ptrs, inner_strides, count).
class RowRef {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, RowRef>)
      RowRef(F&& f)  // NOLINT(google-explicit-constructor): built where for_each is called
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, char** p, const int64_t* s, int64_t n) {
          (*static_cast<std::remove_reference_t<F>*>(o))(p, s, n);
        }) {}
  void operator()(char** p, const int64_t* s, int64_t n) const { call_(obj_, p, s, n); }

 private:
  void* obj_;
  void (*call_)(void*, char**, const int64_t*, int64_t);
};

/// K operands (operand 0 is the output) aligned to one iteration shape, byte strides.
template <int K>
struct Loop {
  int64_t nd = 0;
  int64_t numel = 0;
  int64_t shape[16];
  int64_t strides[K][16];
  char* base[K];
  bool overflow = false;  ///< more than 16 dims left after coalescing: use the slow walk
};

/// Aligns operands to `shape` (broadcasting) and coalesces dims. ops[0] is the output.
template <int K>
Loop<K> make_loop(const Shape& shape, const std::array<const Tensor*, K>& ops) {
  Loop<K> L;
  L.numel = shape.numel();
  int64_t nd = shape.size();
  for (int k = 0; k < K; ++k) L.base[k] = static_cast<char*>(ops[k]->raw_data());
  // Walk from the innermost dim outwards, merging a dim into the previous kept one when every
  // operand steps through both as one.
  int64_t n = 0;
  int64_t sh[64];
  int64_t st[K][64];
  for (int64_t d = nd - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    int64_t s[K];
    for (int k = 0; k < K; ++k) {
      const detail::TensorImpl* t = ops[k]->unsafe_impl();
      int64_t lead = nd - t->ndim();
      s[k] = (d < lead || t->shape[d - lead] == 1) ? 0 : t->strides[d - lead] * itemsize(t->dtype);
    }
    bool merge = n > 0;
    for (int k = 0; merge && k < K; ++k) merge = s[k] == st[k][n - 1] * sh[n - 1];
    if (merge) {
      sh[n - 1] *= shape[d];
    } else {
      if (n == 64) {
        L.overflow = true;
        return L;
      }
      sh[n] = shape[d];
      for (int k = 0; k < K; ++k) st[k][n] = s[k];
      ++n;
    }
  }
  if (n > 16) {
    L.overflow = true;
    return L;
  }
  if (n == 0) {  // one element
    n = 1;
    sh[0] = 1;
    for (int k = 0; k < K; ++k) st[k][0] = 0;
  }
  L.nd = n;
  for (int64_t i = 0; i < n; ++i) {  // reverse: outer .. inner
    L.shape[i] = sh[n - 1 - i];
    for (int k = 0; k < K; ++k) L.strides[k][i] = st[k][n - 1 - i];
  }
  return L;
}

/// Whether a loop steps through some operand across its rows: a large inner stride and a small
/// one on the next dim out, as when adding a transposed matrix into a contiguous one. Rows then
/// touch a new cache line (and often a new page) per element; walking the last two dims in
/// square tiles reuses each line for a whole tile. Only for elementwise loops: the output has
/// no zero stride there (a reduction's accumulation order stays as it is).
template <int K>
bool wants_tiles(const Loop<K>& L) {
  const int64_t nd = L.nd;
  if (nd < 2 || L.shape[nd - 1] < 64 || L.shape[nd - 2] < 64) return false;
  if (L.strides[0][nd - 1] == 0 || L.strides[0][nd - 2] == 0) return false;
  for (int k = 0; k < K; ++k) {
    const int64_t in = std::abs(L.strides[k][nd - 1]), out = std::abs(L.strides[k][nd - 2]);
    if (in >= 256 && out > 0 && out <= 16) return true;
  }
  return false;
}

/// run_loop over 32 x 32 tiles of the last two dims (see wants_tiles), in parallel over tiles.
template <int K, class Row>
void run_tiled(const Loop<K>& L, Row&& row) {
  constexpr int64_t T = 32;
  const int64_t nd = L.nd, R = L.shape[nd - 2], C = L.shape[nd - 1];
  const int64_t tr = (R + T - 1) / T, tc = (C + T - 1) / T, per = tr * tc;
  const int64_t tiles = L.numel / (R * C) * per;
  int64_t inner_st[K];
  for (int k = 0; k < K; ++k) inner_st[k] = L.strides[k][nd - 1];
  parallel_for(
      tiles, std::max<int64_t>(1, kParallelGrain / (T * T)),
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          int64_t off[K] = {}, o = t / per;
          for (int64_t d = nd - 3; d >= 0; --d) {
            const int64_t c = o % L.shape[d];
            o /= L.shape[d];
            for (int k = 0; k < K; ++k) off[k] += c * L.strides[k][d];
          }
          const int64_t r0 = (t % per) / tc * T, c0 = (t % per) % tc * T;
          const int64_t r1 = std::min(R, r0 + T), cnt = std::min(C, c0 + T) - c0;
          for (int64_t i = r0; i < r1; ++i) {
            char* p[K];
            for (int k = 0; k < K; ++k)
              p[k] = L.base[k] + off[k] + i * L.strides[k][nd - 2] + c0 * inner_st[k];
            row(p, inner_st, cnt);
          }
        }
      },
      1);
}

/// Calls row(ptrs, inner_strides, count) over the inner rows that hold elements [begin, end) of
/// the loop, in order, on the calling thread.
template <int K, class Row>
void run_rows(const Loop<K>& L, int64_t begin, int64_t end, Row&& row) {
  const int64_t nd = L.nd, inner = L.shape[nd - 1];
  int64_t inner_st[K];
  for (int k = 0; k < K; ++k) inner_st[k] = L.strides[k][nd - 1];
  int64_t idx[16];
  int64_t rest = begin / inner;
  for (int64_t d = nd - 2; d >= 0; --d) {
    idx[d] = rest % L.shape[d];
    rest /= L.shape[d];
  }
  int64_t pos = begin % inner;
  while (begin < end) {
    int64_t cnt = std::min(inner - pos, end - begin);
    char* p[K];
    for (int k = 0; k < K; ++k) {
      int64_t off = pos * inner_st[k];
      for (int64_t d = 0; d < nd - 1; ++d) off += idx[d] * L.strides[k][d];
      p[k] = L.base[k] + off;
    }
    row(p, inner_st, cnt);
    begin += cnt;
    pos = 0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      if (++idx[d] < L.shape[d]) break;
      idx[d] = 0;
    }
  }
}

/// Calls row(ptrs, inner_strides, count) over every inner row of the loop, in parallel.
template <int K, class Row>
void run_loop(const Loop<K>& L, Row&& row) {
  if (L.numel == 0) return;
  if (wants_tiles(L)) {
    run_tiled(L, row);
    return;
  }
  parallel_for(L.numel, kParallelGrain,
               [&](int64_t begin, int64_t end) { run_rows<K>(L, begin, end, row); });
}

/// Element-by-element walk for the rare tensors that do not coalesce to 16 dims.
template <int K, class Row>
void run_slow(const Shape& shape, const std::array<const Tensor*, K>& ops, Row&& row) {
  int64_t n = shape.numel(), nd = shape.size();
  int64_t zero[K] = {};
  for (int64_t i = 0; i < n; ++i) {
    char* p[K];
    for (int k = 0; k < K; ++k) {
      const detail::TensorImpl* t = ops[k]->unsafe_impl();
      int64_t lead = nd - t->ndim(), off = 0, r = i;
      for (int64_t d = nd - 1; d >= 0; --d) {
        int64_t c = r % shape[d];
        r /= shape[d];
        if (d >= lead && t->shape[d - lead] != 1) off += c * t->strides[d - lead];
      }
      p[k] = static_cast<char*>(ops[k]->raw_data()) + off * itemsize(t->dtype);
    }
    row(p, zero, 1);
  }
}

/// Iterates `ops` (output first) over `shape` on the calling thread, calling row() on inner rows
/// in row-major order: for kernels where two positions may write one element (scatter_add).
template <int K, class Row>
void for_each_serial(const Shape& shape, const std::array<const Tensor*, K>& ops, Row&& row_fn) {
  const RowRef row(row_fn);
  Loop<K> L = make_loop<K>(shape, ops);
  if (L.overflow)
    run_slow<K>(shape, ops, row);
  else if (L.numel)
    run_rows<K>(L, 0, L.numel, row);
}

/// Iterates `ops` (output first) over `shape`, calling row() on inner rows, with the row inlined
/// into the walkers: for a kernel whose rows are short and cheap, as a strided copy's, where a
/// call per row shows (Note [Rows by reference]).
template <int K, class Row>
void for_each_inline(const Shape& shape, const std::array<const Tensor*, K>& ops, Row&& row) {
  Loop<K> L = make_loop<K>(shape, ops);
  if (L.overflow)
    run_slow<K>(shape, ops, row);
  else
    run_loop<K>(L, row);
}

/// Iterates `ops` (output first) over `shape`, calling row() on inner rows through a RowRef.
template <int K, class Row>
void for_each(const Shape& shape, const std::array<const Tensor*, K>& ops, Row&& row_fn) {
  for_each_inline<K>(shape, ops, RowRef(row_fn));
}

#if !defined(__CUDACC__)
template <class T>
using Packet = typename Eigen::internal::packet_traits<T>::type;
template <class T>
inline constexpr int kPacketSize = Eigen::internal::unpacket_traits<Packet<T>>::size;

/// y[i] = f(x[i]) on dense rows; a partial last packet goes through a padded buffer so every
/// element sees the same math wherever it sits.
template <class T, class F>
void unary_dense(const F& f, const T* x, T* y, int64_t n) {
  namespace ei = Eigen::internal;
  if constexpr (F::template has_packet<T>) {
    constexpr int W = kPacketSize<T>;
    int64_t i = 0;
    for (; i + W <= n; i += W) ei::pstoreu(y + i, f.packet(ei::ploadu<Packet<T>>(x + i)));
    if (i < n) {
      alignas(64) T buf[W] = {};
      std::memcpy(buf, x + i, (n - i) * sizeof(T));
      ei::pstore(buf, f.packet(ei::pload<Packet<T>>(buf)));
      std::memcpy(y + i, buf, (n - i) * sizeof(T));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  }
}

/// out[i] = f(a[i*sa], b[i*sb]) where sa, sb are 1 (dense) or 0 (broadcast scalar).
template <class T, class F>
void binary_dense(const F& f, const T* a, bool a_scalar, const T* b, bool b_scalar, T* o,
                  int64_t n) {
  namespace ei = Eigen::internal;
  using P = Packet<T>;
  if constexpr (F::template has_packet<T>) {
    constexpr int W = kPacketSize<T>;
    int64_t i = 0;
    auto lda = [&](int64_t j) { return a_scalar ? ei::pset1<P>(*a) : ei::ploadu<P>(a + j); };
    auto ldb = [&](int64_t j) { return b_scalar ? ei::pset1<P>(*b) : ei::ploadu<P>(b + j); };
    for (; i + W <= n; i += W) ei::pstoreu(o + i, f.packet(lda(i), ldb(i)));
    if (i < n) {
      alignas(64) T ba[W] = {}, bb[W] = {};
      for (int64_t j = i; j < n; ++j) {
        ba[j - i] = a_scalar ? *a : a[j];
        bb[j - i] = b_scalar ? *b : b[j];
      }
      ei::pstore(ba, f.packet(ei::pload<P>(ba), ei::pload<P>(bb)));
      std::memcpy(o + i, ba, (n - i) * sizeof(T));
    }
  } else {
    const int64_t sa = a_scalar ? 0 : 1, sb = b_scalar ? 0 : 1;
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
  }
}
#endif

}  // namespace duet::kernels
