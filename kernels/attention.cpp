// CPU kernels of Attention and AttentionBackward (Note [Attention] in core/ops/attention.cpp).
//
// Both walk tiles of kTileQ queries by kTileK keys. A tile's operands are converted to the
// accumulation type (f32, or f64 for f64 inputs) into per-thread buffers, so that any strides,
// broadcast batch dims (expand's stride 0) and the low dtypes read the same way; its products go
// to a GEMM on those buffers (oneDNN's sgemm for f32, Eigen's for f64) and its exponentials to
// Eigen's vectorized exp.
//  - The forward runs one (batch, query tile) per task, with the online softmax: a running row
//    maximum m, sum l and output accumulator rescaled by exp(m_old - m_new) at each key tile.
//  - The backward walks each key tile (its dk and dv stay in the task's buffers) over the query
//    tiles that see it; dq is summed across key tiles. With at least kParts batches a task is a
//    whole batch and writes its dq in place; otherwise the key tiles of a batch are dealt to
//    kParts tasks, each summing into its own dq, and the partial sums are added in order. The
//    split follows the sizes only, so the result is the same bits on any number of threads.
// Causal attention skips the tiles above the diagonal in both.
// Note [Low-precision tiles]
// With q, k and v all bf16 (or all f16) and instructions for that dtype on this CPU
// (low_products_native), the tile products take the low values themselves (low_gemm_to_f32:
// AVX512-BF16 or AMX, exact products summed in f32) instead of f32 copies through sgemm: a bf16
// 64x64x64 product ran 2.6x faster so. Without them, oneDNN's emulated products are slower than
// sgemm, and the tiles stay in f32. The softmax, the masks and every sum between the products stay
// in f32; the operands that the kernel computes (the probabilities P, the output's gradient dO, and
// dS) are rounded to the dtype before their products, as PyTorch's CPU flash attention and
// FlashAttention-2 round them. Each product still runs on one thread, so the bits do not
// depend on the thread count, and eager and compiled calls agree. Small products (a decoding
// step's single query, ragged last tiles: kLowMinWork) widen their low operands and go to
// sgemm instead, as each new shape would cost a oneDNN primitive.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/ops.h"
#include "kernels/composed.h"
#include "kernels/cpu_kernels.h"
#include "kernels/low_precision.h"

namespace duet::kernels {
namespace attention_cpu {  // named: unity builds join this file with others

// Tiles of 128 take half as many products as tiles of 64, each a oneDNN call with a fixed cost:
// bf16 at L = 1024 with 12 heads ran about 20% faster so on an AMX Xeon (docs/attention.md).
constexpr int64_t kTileQ = 128, kTileK = 128;
// The backward splits the key tiles of a batch into this many parts when there are fewer
// batches (so that two threads, or four, have work at L = 4096 with one head).
constexpr int64_t kParts = 4;
// Below this many multiply-adds a call runs on one thread.
constexpr double kSerialWork = 1 << 18;

// One operand's addressing: element offsets of each (flattened) batch, and the row and column
// strides of its last two dims; a dim of size 1 against a larger one has stride 0 (a mask).
struct Operand {
  const char* base = nullptr;
  DType dtype = DType::f32;
  int64_t item = 4;
  std::vector<int64_t> batch;
  int64_t rs = 0, cs = 0;
};

Operand operand(const Tensor& t, const Shape& batch, int64_t rows, int64_t cols) {
  Operand o;
  o.base = static_cast<const char*>(t.raw_data());
  o.dtype = t.dtype();
  o.item = static_cast<int64_t>(itemsize(t.dtype()));
  const int64_t nd = t.dim(), nb = static_cast<int64_t>(batch.size());
  const Shape& s = t.sizes();
  const Strides& st = t.strides();
  auto stride = [&](int64_t d, int64_t want) { return s[d] == 1 && want != 1 ? 0 : st[d]; };
  o.rs = stride(nd - 2, rows);
  o.cs = stride(nd - 1, cols);
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  o.batch.assign(static_cast<size_t>(n), 0);
  std::vector<int64_t> idx(static_cast<size_t>(nb), 0);
  int64_t off = 0;
  for (int64_t b = 0; b < n; ++b) {
    o.batch[static_cast<size_t>(b)] = off;
    for (int64_t d = nb - 1; d >= 0; --d) {  // odometer over the batch dims
      const int64_t sd = stride(d, batch[d]);
      if (++idx[d] < batch[d]) {
        off += sd;
        break;
      }
      off -= sd * (batch[d] - 1);
      idx[d] = 0;
    }
  }
  return o;
}

template <class Acc, class T>
void load_rows(const Operand& o, const char* p, int64_t rows, int64_t cols, Acc* dst) {
  // f16 and bf16 convert through float (Eigen's types); f32 and f64 directly.
  const auto acc = [](T x) {
    if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>)
      return static_cast<Acc>(static_cast<float>(x));
    else
      return static_cast<Acc>(x);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = reinterpret_cast<const T*>(p + r * o.rs * o.item);
    Acc* d = dst + r * cols;
    if constexpr (std::is_same_v<T, bf16_t> && std::is_same_v<Acc, float>) {
      if (o.cs == 1) {  // by the bits (Note [bf16 rows by their bits])
        widen_bf16(src, d, cols);
        continue;
      }
    }
    if constexpr (std::is_same_v<T, f16_t> && std::is_same_v<Acc, float>) {
      if (o.cs == 1) {  // Note [f16 rows with F16C]
        widen_f16(src, d, cols);
        continue;
      }
    }
    if (o.cs == 1) {
      for (int64_t c = 0; c < cols; ++c) d[c] = acc(src[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = acc(src[c * o.cs]);
    }
  }
}
template <class Acc>
void load_rows(const Operand& o, const char* p, int64_t rows, int64_t cols, Acc* dst) {
  switch (o.dtype) {
    case DType::f64:
      return load_rows<Acc, double>(o, p, rows, cols, dst);
    case DType::f32:
      if (std::is_same_v<Acc, float> && o.cs == 1) {
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(dst + r * cols, p + r * o.rs * o.item, static_cast<size_t>(cols) * 4);
        return;
      }
      return load_rows<Acc, float>(o, p, rows, cols, dst);
    case DType::bf16:
      return load_rows<Acc, bf16_t>(o, p, rows, cols, dst);
    case DType::f16:
      return load_rows<Acc, f16_t>(o, p, rows, cols, dst);
    default:
      DUET_ASSERT(false, "[attention] operand of dtype {}", o.dtype);
  }
}
// rows x cols of operand o for batch b from row r0 into dst (row-major, cols wide).
template <class Acc>
void load(const Operand& o, int64_t b, int64_t r0, int64_t rows, int64_t cols, Acc* dst,
          int64_t c0 = 0) {
  const char* p = o.base + (o.batch[static_cast<size_t>(b)] + r0 * o.rs + c0 * o.cs) * o.item;
  load_rows(o, p, rows, cols, dst);
}

// ---- low-precision tiles (Note [Low-precision tiles]) ---------------------------------------

using LowBuffer = std::vector<uint16_t>;

// Each buffer sized for a rows x cols tile.
template <class... B>
void size_tiles(int64_t rows, int64_t cols, B&... buffers) {
  (buffers.resize(static_cast<size_t>(rows * cols)), ...);
}

// rows x cols of operand o for batch b from row r0 in the low dtype (row-major, cols wide): its
// bits where o holds that dtype along dense rows, else rounded from f32 (through `row`).
void load_low(const Operand& o, int64_t b, int64_t r0, int64_t rows, int64_t cols, DType low,
              uint16_t* dst, std::vector<float>& row) {
  const char* p = o.base + (o.batch[static_cast<size_t>(b)] + r0 * o.rs) * o.item;
  if (o.dtype == low && o.cs == 1) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * cols, p + r * o.rs * o.item, static_cast<size_t>(cols) * 2);
    return;
  }
  row.resize(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    load_rows(o, p + r * o.rs * o.item, 1, cols, row.data());
    round_low(row.data(), cols, low, dst + r * cols);
  }
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The rows x cols low matrix at p (rows ld apart) widened to f32 into w, with the same layout.
void widen_low(DType low, const uint16_t* p, int64_t rows, int64_t cols, int64_t ld,
               std::vector<float>& w) {
  const int64_t n = rows == 0 ? 0 : (rows - 1) * ld + cols;
  w.resize(static_cast<size_t>(n));
  widen_low_row(low, p, w.data(), n);
}

// Products below this many multiply-adds (a decoding step's one query, the ragged last tiles)
// widen their operands and go to sgemm: each new shape would cost oneDNN a primitive (about
// 75 µs to make, against a fraction of one for such a product), and a growing key length
// makes a new last tile at every step.
constexpr int64_t kLowMinWork = 1 << 15;

// gemm() below with alpha 1 and beta 0 (or 1: `accumulate`), on low operands.
void low_gemm(DType low, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t* a,
              int64_t lda, const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  if (m * n * k < kLowMinWork) {
    thread_local std::vector<float> wa, wb;
    widen_low(low, a, ta ? k : m, ta ? m : k, lda, wa);
    widen_low(low, b, tb ? n : k, tb ? k : n, ldb, wb);
    return gemm(ta, tb, m, n, k, 1.0f, wa.data(), lda, wb.data(), ldb, accumulate ? 1.0f : 0.0f, c,
                ldc);
  }
  const bool ok = low_gemm_to_f32(low, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  DUET_ASSERT(ok, "[attention] oneDNN made no {} product of {}x{}x{}, though it made one of 16^3",
              low, m, n, k);
}

// C (m x n, ldc) = alpha * op(A) op(B) + beta * C, row-major; op transposes where asked.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // (oneDNN refuses an empty inner dim)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] *= beta;
    return;
  }
  const dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  DUET_ASSERT(st == dnnl_success, "dnnl_sgemm failed with status {}", static_cast<int>(st));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  Eigen::Map<Mat, 0, Eigen::OuterStride<>> C(c, m, n, Eigen::OuterStride<>(ldc));
  const Map A(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda));
  const Map B(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (beta == 0) C.setZero();
  if (ta && tb)
    C.noalias() += alpha * (A.transpose() * B.transpose());
  else if (ta)
    C.noalias() += alpha * (A.transpose() * B);
  else if (tb)
    C.noalias() += alpha * (A * B.transpose());
  else
    C.noalias() += alpha * (A * B);
}

// Inside each task's parallel region: its GEMMs run on its own thread. oneDNN's sgemm splits a
// product over the threads it sees outside an active parallel region (a region of one thread,
// or one nested in a compiled plan's branch), which changes the order of its sums; one thread
// keeps eager and compiled calls bit for bit equal.
inline void pin_gemm_threads() { omp_set_num_threads(1); }

// Tile buffers aligned as Eigen aligns its packets: Eigen's exp runs the elements before the
// first aligned one through the scalar exp, which rounds differently, so a buffer's alignment
// must not depend on the allocation (the thread, the call).
template <class Acc>
using Buffer = std::vector<Acc, Eigen::aligned_allocator<Acc>>;

template <class Acc>
using Row = Eigen::Map<Eigen::Array<Acc, Eigen::Dynamic, 1>>;

// What both passes share: the sizes, the scale, the masks and the operands.
struct Problem {
  int64_t nb = 0, l = 0, s = 0, e = 0, f = 0;
  double scale = 0;
  bool causal = false;
  Shape batch;
  Operand q, k, v, mask;
  bool has_mask = false, bool_mask = false;
  DType low = DType::f32;  // bf16 or f16: tile products in that dtype (Note [Low-precision tiles])
};

// Whether oneDNN multiplies dtype dt here (tried once per dtype, on a small product).
bool low_tiles_available(DType dt) {
  auto probe = [](DType t) {
    uint16_t a[16 * 16] = {}, b[16 * 16] = {};
    float c[16 * 16];
    return low_gemm_to_f32(t, false, false, 16, 16, 16, a, 16, b, 16, c, 16, false);
  };
  static const bool bf16 = low_products_native(DType::bf16) && probe(DType::bf16),
                    f16 = low_products_native(DType::f16) && probe(DType::f16);
  return dt == DType::bf16 ? bf16 : dt == DType::f16 && f16;
}

Problem problem(TensorRefs in, int64_t mask_at, const Attrs& a) {
  Problem p;
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int64_t nd = q.dim();
  p.batch = Shape(q.sizes().data(), nd - 2);
  p.nb = 1;
  for (int64_t d : p.batch) p.nb *= d;
  p.l = q.sizes()[nd - 2];
  p.e = q.sizes()[nd - 1];
  p.s = k.sizes()[nd - 2];
  p.f = v.sizes()[nd - 1];
  const double sc = a.value.to<double>();
  p.scale = sc > 0 ? sc : 1 / std::sqrt(static_cast<double>(p.e));
  p.causal = a.keepdim;
  const DType dt = q.dtype();
  if ((dt == DType::bf16 || dt == DType::f16) && k.dtype() == dt && v.dtype() == dt &&
      low_tiles_available(dt))
    p.low = dt;
  p.q = operand(q, p.batch, p.l, p.e);
  p.k = operand(k, p.batch, p.s, p.e);
  p.v = operand(v, p.batch, p.s, p.f);
  if (in.size() > mask_at) {
    p.has_mask = true;
    p.bool_mask = in[mask_at].dtype() == DType::b8;
    p.mask = operand(in[mask_at], p.batch, p.l, p.s);
  }
  return p;
}

// Scales a (rows x cols) score tile at queries i0.., keys j0.. and applies the mask.
template <class Acc>
void mask_scores(const Problem& p, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                 Acc* sc, Buffer<Acc>& mrow) {
  const Acc scale = static_cast<Acc>(p.scale), ninf = -std::numeric_limits<Acc>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    Acc* x = sc + r * cols;
    Row<Acc>(x, cols) *= scale;
    if (p.causal) {
      for (int64_t c = std::max<int64_t>(i0 + r - j0 + 1, 0); c < cols; ++c) x[c] = ninf;
    } else if (p.has_mask) {
      const char* base = p.mask.base + (p.mask.batch[static_cast<size_t>(b)] +
                                        (i0 + r) * p.mask.rs + j0 * p.mask.cs) *
                                           p.mask.item;
      if (p.bool_mask) {
        for (int64_t c = 0; c < cols; ++c)
          if (!base[c * p.mask.cs]) x[c] = ninf;
      } else {
        mrow.resize(static_cast<size_t>(cols));
        load_rows(p.mask, base, 1, cols, mrow.data());
        Row<Acc>(x, cols) += Row<Acc>(mrow.data(), cols);
      }
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------

template <class Acc>
struct ForwardScratch {
  Buffer<Acc> q, k, v, sc, acc, m, l, mrow;
  LowBuffer ql, kl, vl, pl;  // the low tiles (Note [Low-precision tiles])
  std::vector<float> row;
  explicit ForwardScratch(const Problem& p) {
    // The operands' tiles in the low dtype or in Acc, whichever the products read.
    if (p.low != DType::f32) {
      size_tiles(kTileQ, p.e, ql);
      size_tiles(kTileK, p.e, kl);
      size_tiles(kTileK, p.f, vl);
      size_tiles(kTileQ, kTileK, pl);
    } else {
      size_tiles(kTileQ, p.e, q);
      size_tiles(kTileK, p.e, k);
      size_tiles(kTileK, p.f, v);
    }
    sc.resize(static_cast<size_t>(kTileQ * kTileK));
    acc.resize(static_cast<size_t>(kTileQ * p.f));
    m.resize(kTileQ);
    l.resize(kTileQ);
  }
};

// Folds one tile of scores (already masked) into the running softmax of `rows` queries; leaves
// the probabilities in sc.
template <class Acc>
void online_softmax(int64_t rows, int64_t cols, int64_t f, ForwardScratch<Acc>& w) {
  const Acc ninf = -std::numeric_limits<Acc>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    Row<Acc> x(w.sc.data() + r * cols, cols);
    const Acc mx = x.maxCoeff(), m_old = w.m[r];
    const Acc m_new = std::max(m_old, mx);
    if (m_new == ninf) {  // every score so far masked
      x.setZero();
      continue;
    }
    const Acc alpha = std::exp(m_old - m_new);
    x = (x - m_new).exp();
    w.l[r] = w.l[r] * alpha + x.sum();
    if (alpha != Acc(1)) Row<Acc>(w.acc.data() + r * f, f) *= alpha;
    w.m[r] = m_new;
  }
}

// Queries i0 .. i0 + rows of batch b: writes their output and logsumexp into r.
template <class Acc>
void forward_tile(const Problem& p, const Operand& r, int64_t b, int64_t i0, int64_t rows,
                  ForwardScratch<Acc>& w) {
  const int64_t e = p.e, f = p.f;
  constexpr bool kF32 = std::is_same_v<Acc, float>;
  const bool low = kF32 && p.low != DType::f32;  // Note [Low-precision tiles]
  if (low)
    load_low(p.q, b, i0, rows, e, p.low, w.ql.data(), w.row);
  else
    load(p.q, b, i0, rows, e, w.q.data());
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<Acc>::infinity());
  std::fill(w.l.begin(), w.l.end(), Acc(0));
  std::fill(w.acc.begin(), w.acc.end(), Acc(0));
  const int64_t kend = p.causal ? std::min(p.s, i0 + rows) : p.s;
  for (int64_t j0 = 0; j0 < kend; j0 += kTileK) {
    const int64_t cols = std::min(kTileK, kend - j0);
    if constexpr (kF32) {
      if (low) {
        load_low(p.k, b, j0, cols, e, p.low, w.kl.data(), w.row);
        load_low(p.v, b, j0, cols, f, p.low, w.vl.data(), w.row);
        low_gemm(p.low, false, true, rows, cols, e, w.ql.data(), e, w.kl.data(), e, false,
                 w.sc.data(), cols);
        mask_scores(p, b, i0, rows, j0, cols, w.sc.data(), w.mrow);
        online_softmax(rows, cols, f, w);
        round_low(w.sc.data(), rows * cols, p.low, w.pl.data());
        low_gemm(p.low, false, false, rows, f, cols, w.pl.data(), cols, w.vl.data(), f, true,
                 w.acc.data(), f);
        continue;
      }
    }
    load(p.k, b, j0, cols, e, w.k.data());
    load(p.v, b, j0, cols, f, w.v.data());
    gemm(false, true, rows, cols, e, Acc(1), w.q.data(), e, w.k.data(), e, Acc(0), w.sc.data(),
         cols);
    mask_scores(p, b, i0, rows, j0, cols, w.sc.data(), w.mrow);
    online_softmax(rows, cols, f, w);
    gemm(false, false, rows, f, cols, Acc(1), w.sc.data(), cols, w.v.data(), f, Acc(1),
         w.acc.data(), f);
  }
  const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
  for (int64_t i = 0; i < rows; ++i) {
    Acc* o = reinterpret_cast<Acc*>(const_cast<char*>(r.base)) +
             (r.batch[static_cast<size_t>(b)] + (i0 + i) * r.rs);
    const Acc li = w.l[i];
    // No keys: zeros (the composite's empty sum); every key masked: NaN (its softmax).
    const Acc inv = p.s == 0 ? Acc(0) : li > 0 ? Acc(1) / li : nan;
    for (int64_t c = 0; c < f; ++c) o[c * r.cs] = w.acc[static_cast<size_t>(i * f + c)] * inv;
    o[f * r.cs] = li > 0 ? w.m[i] + std::log(li) : -std::numeric_limits<Acc>::infinity();
  }
}

template <class Acc>
void forward(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Problem p = problem(in, 3, a);
  if (p.nb == 0 || p.l == 0) return;
  const Operand r = operand(out, p.batch, p.l, p.f + 1);
  const int64_t tiles = (p.l + kTileQ - 1) / kTileQ, tasks = p.nb * tiles;
  const double work = double(p.nb) * double(p.l) * double(p.s) * double(p.e + p.f);
#pragma omp parallel if (work > kSerialWork && tasks > 1)
  {
    pin_gemm_threads();
    ForwardScratch<Acc> w(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / tiles, i0 = (t % tiles) * kTileQ;
      forward_tile(p, r, b, i0, std::min(kTileQ, p.l - i0), w);
    }
  }
}

// ---- backward --------------------------------------------------------------------------------

template <class Acc>
struct BackwardScratch {
  Buffer<Acc> q, k, v, go, sc, dp, dk, dv, mrow;
  LowBuffer ql, kl, vl, gol, pl, dsl;  // the low tiles (Note [Low-precision tiles])
  std::vector<float> row;
  explicit BackwardScratch(const Problem& p) {
    // The operands' tiles in the low dtype or in Acc, whichever the products read.
    if (p.low != DType::f32) {
      size_tiles(kTileQ, p.e, ql);
      size_tiles(kTileQ, p.f, gol);
      size_tiles(kTileK, p.e, kl);
      size_tiles(kTileK, p.f, vl);
      size_tiles(kTileQ, kTileK, pl, dsl);
    } else {
      size_tiles(kTileQ, p.e, q);
      size_tiles(kTileQ, p.f, go);
      size_tiles(kTileK, p.e, k);
      size_tiles(kTileK, p.f, v);
    }
    size_tiles(kTileK, p.e, dk);
    size_tiles(kTileK, p.f, dv);
    size_tiles(kTileQ, kTileK, sc, dp);
  }
};

// Each query row's logsumexp and D = rowsum(dO * O) - g_lse, of batch b. g has F + 1 columns,
// or F when the logsumexp's gradient is zero (Note [Attention]): then g_lse is +0.0, as the
// zeros a slice's gradient writes it into hold.
template <class Acc>
void row_terms(const Problem& p, const Operand& r, const Operand& g, bool g_lse, int64_t b,
               Acc* lse, Acc* d) {
  std::vector<Acc> ro(static_cast<size_t>(p.f + 1)), go(static_cast<size_t>(p.f + 1));
  // Rows of Acc along contiguous columns (the primitive's result and its gradient, as a
  // backward receives them) are read in place; others through copies.
  auto row = [&](const Operand& o, int64_t i, int64_t cols, std::vector<Acc>& buf) -> const Acc* {
    if (o.dtype == detail::dtype_of<Acc>::value && o.cs == 1)
      return reinterpret_cast<const Acc*>(o.base) + o.batch[static_cast<size_t>(b)] + i * o.rs;
    load(o, b, i, 1, cols, buf.data());
    return buf.data();
  };
  for (int64_t i = 0; i < p.l; ++i) {
    const Acc* rr = row(r, i, p.f + 1, ro);
    const Acc* gr = row(g, i, g_lse ? p.f + 1 : p.f, go);
    Acc acc = 0;
    for (int64_t c = 0; c < p.f; ++c) acc += rr[c] * gr[c];
    lse[i] = rr[p.f];
    d[i] = acc - (g_lse ? gr[p.f] : Acc(0));
  }
}

// P = exp(s - lse) of a (rows x cols) score tile, in place; then, given dP, dS = P * (dP - D) *
// scale in place of dP. Both passes of the backward share them.
template <class Acc>
void probabilities(int64_t rows, int64_t cols, const Acc* lse, Acc* sc) {
  for (int64_t r = 0; r < rows; ++r)
    Row<Acc>(sc + r * cols, cols) = (Row<Acc>(sc + r * cols, cols) - lse[r]).exp();
}
template <class Acc>
void score_grads(int64_t rows, int64_t cols, const Acc* sc, const Acc* d, Acc scale, Acc* dp) {
  for (int64_t r = 0; r < rows; ++r)
    Row<Acc>(dp + r * cols, cols) = Row<Acc>(const_cast<Acc*>(sc) + r * cols, cols) *
                                    (Row<Acc>(dp + r * cols, cols) - d[r]) * scale;
}

// backward_tile's query tiles with low-precision products (Note [Low-precision tiles]): the
// key tile is in w.kl and w.vl; dk and dv are summed into w.dk and w.dv.
void backward_queries_low(const Problem& p, const Operand& g, const float* lse, const float* d,
                          int64_t b, int64_t j0, int64_t cols, float* dq,
                          BackwardScratch<float>& w) {
  const int64_t e = p.e, f = p.f;
  const auto scale = static_cast<float>(p.scale);
  const DType low = p.low;
  for (int64_t i0 = p.causal ? j0 / kTileQ * kTileQ : 0; i0 < p.l; i0 += kTileQ) {
    const int64_t rows = std::min(kTileQ, p.l - i0);
    load_low(p.q, b, i0, rows, e, low, w.ql.data(), w.row);
    load_low(g, b, i0, rows, f, low, w.gol.data(), w.row);
    float *sc = w.sc.data(), *dp = w.dp.data();
    low_gemm(low, false, true, rows, cols, e, w.ql.data(), e, w.kl.data(), e, false, sc, cols);
    mask_scores(p, b, i0, rows, j0, cols, sc, w.mrow);
    probabilities(rows, cols, lse + i0, sc);
    round_low(sc, rows * cols, low, w.pl.data());
    low_gemm(low, true, false, cols, f, rows, w.pl.data(), cols, w.gol.data(), f, true, w.dv.data(),
             f);
    low_gemm(low, false, true, rows, cols, f, w.gol.data(), f, w.vl.data(), f, false, dp, cols);
    score_grads(rows, cols, sc, d + i0, scale, dp);
    round_low(dp, rows * cols, low, w.dsl.data());
    low_gemm(low, false, false, rows, e, cols, w.dsl.data(), cols, w.kl.data(), e, true,
             dq + i0 * e, e);
    low_gemm(low, true, false, cols, e, rows, w.dsl.data(), cols, w.ql.data(), e, true, w.dk.data(),
             e);
  }
}

// Key tile j0 .. j0 + cols of batch b against every query tile that sees it: its dk and dv into
// the output, dq added into dq (l x e, row-major).
template <class Acc>
void backward_tile(const Problem& p, const Operand& g, const Acc* lse, const Acc* d, int64_t b,
                   int64_t j0, int64_t cols, Acc* dq, Acc* flat, BackwardScratch<Acc>& w) {
  const int64_t e = p.e, f = p.f;
  std::fill(w.dk.begin(), w.dk.end(), Acc(0));
  std::fill(w.dv.begin(), w.dv.end(), Acc(0));
  bool done = false;
  if constexpr (std::is_same_v<Acc, float>) {
    if (p.low != DType::f32) {
      load_low(p.k, b, j0, cols, e, p.low, w.kl.data(), w.row);
      load_low(p.v, b, j0, cols, f, p.low, w.vl.data(), w.row);
      backward_queries_low(p, g, lse, d, b, j0, cols, dq, w);
      done = true;
    }
  }
  if (!done) {
    load(p.k, b, j0, cols, e, w.k.data());
    load(p.v, b, j0, cols, f, w.v.data());
  }
  const Acc scale = static_cast<Acc>(p.scale);
  for (int64_t i0 = p.causal ? j0 / kTileQ * kTileQ : 0; !done && i0 < p.l; i0 += kTileQ) {
    const int64_t rows = std::min(kTileQ, p.l - i0);
    load(p.q, b, i0, rows, e, w.q.data());
    load(g, b, i0, rows, f, w.go.data());
    Acc* sc = w.sc.data();
    gemm(false, true, rows, cols, e, Acc(1), w.q.data(), e, w.k.data(), e, Acc(0), sc, cols);
    mask_scores(p, b, i0, rows, j0, cols, sc, w.mrow);
    probabilities(rows, cols, lse + i0, sc);
    // dv += P^T dO; dP = dO v^T; dS = P * (dP - D) * scale; dq += dS k; dk += dS^T q.
    gemm(true, false, cols, f, rows, Acc(1), sc, cols, w.go.data(), f, Acc(1), w.dv.data(), f);
    Acc* dp = w.dp.data();
    gemm(false, true, rows, cols, f, Acc(1), w.go.data(), f, w.v.data(), f, Acc(0), dp, cols);
    score_grads(rows, cols, sc, d + i0, scale, dp);
    gemm(false, false, rows, e, cols, Acc(1), dp, cols, w.k.data(), e, Acc(1), dq + i0 * e, e);
    gemm(true, false, cols, e, rows, Acc(1), dp, cols, w.q.data(), e, Acc(1), w.dk.data(), e);
  }
  Acc* dk = flat + p.l * e + j0 * e;
  Acc* dv = flat + p.l * e + p.s * e + j0 * f;
  std::copy(w.dk.begin(), w.dk.begin() + cols * e, dk);
  std::copy(w.dv.begin(), w.dv.begin() + cols * f, dv);
}

template <class Acc>
void backward(TensorRefs in, const Attrs& a, const Tensor& out_in) {
  const Problem p = problem(in, 5, a);
  Tensor out = out_in;
  if (!out.is_contiguous()) out = detail::empty(out_in.sizes(), out_in.dtype(), out_in.device());
  Acc* base = static_cast<Acc*>(out.raw_data());
  const int64_t per = p.l * p.e + p.s * p.e + p.s * p.f;
  if (p.nb == 0 || p.l == 0 || p.s == 0) {
    std::fill(base, base + p.nb * per, Acc(0));
    if (!out.is_same(out_in)) copy_on_device(out, out_in);
    return;
  }
  const bool g_lse = in[4].size(-1) == p.f + 1;  // (else F columns: Note [Attention])
  const Operand r = operand(in[3], p.batch, p.l, p.f + 1),
                g = operand(in[4], p.batch, p.l, g_lse ? p.f + 1 : p.f);
  const int64_t tiles = (p.s + kTileK - 1) / kTileK;
  // The split depends on the sizes alone, never on the threads, so that the sums' order (and so
  // every bit of the result) is the same on any thread count: with fewer than kParts batches,
  // the key tiles of a batch go round-robin to kParts parts, each summing its own dq (from duet's
  // allocator, so that memory statistics count them), added in part order at the end.
  const int64_t parts = p.nb >= kParts ? 1 : std::min(kParts, tiles);
  const Tensor held = parts > 1
                          ? detail::empty(Shape{p.nb, parts, p.l * p.e}, out.dtype(), out.device())
                          : Tensor();
  Acc* partial = parts > 1 ? static_cast<Acc*>(held.raw_data()) : nullptr;
  std::vector<Acc> lse(static_cast<size_t>(p.nb * p.l)), d(static_cast<size_t>(p.nb * p.l));
  const double work = double(p.nb) * double(p.l) * double(p.s) * double(p.e + p.f);
  const int64_t tasks = p.nb * parts;
#pragma omp parallel if (work > kSerialWork && tasks > 1)
  {
    pin_gemm_threads();
    // Each batch's zeros and row terms first, on the threads too (serial, they took a fifth of
    // a backward of W8's attention), then the tasks.
#pragma omp for schedule(static)
    for (int64_t b = 0; b < p.nb; ++b) {
      std::fill(base + b * per, base + (b + 1) * per, Acc(0));
      if (partial)
        std::fill(partial + b * parts * p.l * p.e, partial + (b + 1) * parts * p.l * p.e, Acc(0));
      row_terms(p, r, g, g_lse, b, &lse[b * p.l], &d[b * p.l]);
    }
    BackwardScratch<Acc> w(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / parts, part = task % parts;
      Acc* flat = base + b * per;
      Acc* dq = partial ? partial + task * p.l * p.e : flat;
      for (int64_t t = part; t < tiles; t += parts)
        backward_tile(p, g, &lse[b * p.l], &d[b * p.l], b, t * kTileK,
                      std::min(kTileK, p.s - t * kTileK), dq, flat, w);
    }
  }
  for (int64_t b = 0; partial && b < p.nb; ++b)
    for (int64_t part = 0; part < parts; ++part)
      Row<Acc>(base + b * per, p.l * p.e) +=
          Row<Acc>(partial + (b * parts + part) * p.l * p.e, p.l * p.e);
  if (!out.is_same(out_in)) copy_on_device(out, out_in);
}

void attention_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  if (out.dtype() == DType::f64) return forward<double>(in, a, out);
  forward<float>(in, a, out);
}
void attention_backward_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  if (out.dtype() == DType::f64) return backward<double>(in, a, out);
  backward<float>(in, a, out);
}

}  // namespace attention_cpu

void register_attention_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Attention, DeviceType::CPU, attention_cpu::attention_kernel);
  detail::register_kernel(t, OpId::AttentionBackward, DeviceType::CPU,
                          attention_cpu::attention_backward_kernel);
}

}  // namespace duet::kernels
