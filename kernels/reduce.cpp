// CPU kernels of sum, max and min over any dims.
//
// The input's dims split into kept dims (the output's, in order) and reduced dims, each list
// merged where the strides allow. Two walks then cover every layout:
//  - by output: each output folds its reduced elements, a row of the innermost reduced dim at a
//    time (contiguous rows on packets, strided ones gathered);
//  - by columns: when the innermost kept dim is contiguous and the reduced dims are not (a sum
//    over the batch), neighbouring outputs fold together, a row of them per reduced element.
// Floating-point sums add in a cascade, a row's packets and the rows alike (Note [Cascade sums]
// in kernels/functors.h). Threads split the outputs and, for a long reduction, the reduced
// elements too: into pieces of a fixed length (kPiece), whatever the thread count, folded in
// order, so that a sum does not depend on the number of threads.
#include <limits>
#include <memory>

#include "kernels/cpu_kernels.h"
#include "kernels/low_precision.h"
#include "kernels/loops.h"

namespace duet::kernels {
namespace {

/// The reduced elements of one output are split into pieces of this many, each folded on its
/// own (by any thread), then folded in order.
constexpr int64_t kPiece = int64_t(1) << 16;

template <class T>
struct SumOp {
  using R = fn::SumOf<T>;
  static T identity() { return T(0); }
  static T combine(T a, T b) { return fn::wrap_add(a, b); }
  static T fold(const T* x, int64_t n, int64_t s) {
    if constexpr (std::is_floating_point_v<T>) {
      return fn::cascade_sum(x, n, s);
    } else {
      T acc = 0;
      for (int64_t i = 0; i < n; ++i) acc = fn::wrap_add(acc, x[i * s]);
      return acc;
    }
  }
};
template <class T, class F, bool kMax>
struct ExtremumOp {
  struct R {
    static T identity() { return ExtremumOp::identity(); }
    template <class P>
    static P packet(const P& a, const P& b) {
      return F{}.packet(a, b);
    }
    static T scalar(T a, T b) { return F{}(a, b); }
  };
  static T identity() {
    if constexpr (std::is_floating_point_v<T>)
      return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
  static T combine(T a, T b) { return F{}(a, b); }
  static T fold(const T* x, int64_t n, int64_t s) {
    if constexpr (std::is_floating_point_v<T>) {
      if (s == 1) {
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> v(x, n);
        return kMax ? v.template maxCoeff<Eigen::PropagateNaN>()
                    : v.template minCoeff<Eigen::PropagateNaN>();
      }
    }
    T acc = identity();
    for (int64_t i = 0; i < n; ++i) acc = F{}(acc, x[i * s]);
    return acc;
  }
};
template <class T>
using MaxOp = ExtremumOp<T, fn::Maximum, true>;
template <class T>
using MinOp = ExtremumOp<T, fn::Minimum, false>;

template <class Op>
struct Combine {
  template <class T>
  T operator()(T a, T b) const {
    return Op::combine(a, b);
  }
};

// Dims of the input, merged where one stride steps through both; strides in elements.
struct Dims {
  int n = 0;
  int64_t size[64];
  int64_t stride[64];
  int64_t numel() const {
    int64_t k = 1;
    for (int d = 0; d < n; ++d) k *= size[d];
    return k;
  }
  void add(int64_t sz, int64_t st) {
    if (sz == 1) return;
    if (n > 0 && stride[n - 1] == st * sz) {
      size[n - 1] *= sz;
      stride[n - 1] = st;
      return;
    }
    size[n] = sz;
    stride[n++] = st;
  }
  // The offset of element i (row-major over the dims) of the first `dims` dims.
  int64_t offset(int64_t i, int dims) const {
    int64_t off = 0;
    for (int d = dims - 1; d >= 0; --d) {
      off += i % size[d] * stride[d];
      i /= size[d];
    }
    return off;
  }
};

// Calls row(offset, count) over the rows (along the innermost dim) that hold elements [b, e)
// of dims d, in order.
template <class F>
void walk(const Dims& d, int64_t b, int64_t e, F&& row) {
  const int n = d.n;
  const int64_t inner = d.size[n - 1], st = d.stride[n - 1];
  int64_t idx[64];
  int64_t rest = b / inner;
  for (int k = n - 2; k >= 0; --k) {
    idx[k] = rest % d.size[k];
    rest /= d.size[k];
  }
  int64_t pos = b % inner;
  while (b < e) {
    const int64_t cnt = std::min(inner - pos, e - b);
    int64_t off = pos * st;
    for (int k = 0; k < n - 1; ++k) off += idx[k] * d.stride[k];
    row(off, cnt);
    b += cnt;
    pos = 0;
    for (int k = n - 2; k >= 0; --k) {
      if (++idx[k] < d.size[k]) break;
      idx[k] = 0;
    }
  }
}

// Elements [b, e) of the reduced dims at base, folded.
template <class Op, class T>
T fold_range(const T* base, const Dims& red, int64_t b, int64_t e) {
  fn::Cascade<T, Combine<Op>> acc;
  const int64_t s = red.stride[red.n - 1];
  walk(red, b, e, [&](int64_t off, int64_t cnt) { acc.push(Op::fold(base + off, cnt, s)); });
  return acc.total(Op::identity());
}

// By output: work unit u is piece u % pieces of output u / pieces.
template <class Op, class T>
void reduce_outputs(const T* px, const Dims& kept, const Dims& red, T* po) {
  const int64_t nout = kept.numel(), nred = red.numel();
  const int64_t pieces = (nred + kPiece - 1) / kPiece, units = nout * pieces;
  std::unique_ptr<T[]> part(pieces > 1 ? new T[units] : nullptr);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::min(nred, kPiece));
  parallel_for(
      units, grain,
      [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) {
          const int64_t o = u / pieces, lo = u % pieces * kPiece;
          const T* base = px + kept.offset(o, kept.n);
          if (pieces == 1 && red.n == 1)  // one row
            po[o] = Op::fold(base, nred, red.stride[0]);
          else if (pieces == 1)
            po[o] = fold_range<Op>(base, red, 0, nred);
          else
            part[u] = fold_range<Op>(base, red, lo, std::min(nred, lo + kPiece));
        }
      },
      1);
  if (pieces == 1) return;
  for (int64_t o = 0; o < nout; ++o) {
    fn::Cascade<T, Combine<Op>> acc;
    for (int64_t p = 0; p < pieces; ++p) acc.push(part[o * pieces + p]);
    po[o] = acc.total(Op::identity());
  }
}

// A row of m elements of type S as T*: the row itself, or (an f16 or bf16 row summed in f32)
// its values widened into `buf`.
template <class T, class S>
const T* row_as(const S* row, int64_t m, T* buf) {
  if constexpr (std::is_same_v<S, T>) {
    return row;
  } else if constexpr (std::is_same_v<S, bf16_t>) {
    widen_bf16(row, buf, m);
    return buf;
  } else {
    for (int64_t j = 0; j < m; ++j) buf[j] = static_cast<T>(row[j]);
    return buf;
  }
}

// By columns: the innermost kept dim (C outputs side by side, contiguous in the input) in tiles
// of up to kCols (whole rows of up to 16 KiB, which the prefetchers stream; narrower when the
// tiles would leave threads idle), each tile folded over every reduced element; work unit u is
// tile u % tiles of the outputs' row u / tiles. A column's sum does not depend on the tiles.
// An f16 or bf16 input (S) is summed in f32 (T), each row of a tile widened as it is read
// (Note [Low precision sums]).
template <class Op, class T, class S = T>
void reduce_columns(const S* px, const Dims& kept, const Dims& red, T* po) {
  constexpr int64_t kCols = std::is_floating_point_v<T> ? 16384 / sizeof(T) : 1024;
  const int64_t C = kept.size[kept.n - 1], nrows = kept.numel() / C, nred = red.numel();
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t tile = kCols;
  if (nrows * ((C + tile - 1) / tile) < nt)
    tile = std::min(kCols, std::max<int64_t>(64, ((C + nt - 1) / nt + 63) / 64 * 64));
  const int64_t tiles = (C + tile - 1) / tile;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (std::min(C, tile) * nred));
  parallel_for(
      nrows * tiles, grain,
      [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; ++u) {
          const int64_t q = u / tiles, j0 = u % tiles * tile, m = std::min(tile, C - j0);
          const S* base = px + kept.offset(q, kept.n - 1) + j0;
          T* out = po + q * C + j0;
          if constexpr (std::is_floating_point_v<T>) {
            static thread_local std::unique_ptr<T[]> wide;  // a widened row (S != T)
            if (!std::is_same_v<S, T> && !wide) wide.reset(new T[kCols]);
            // Too large for a worker's stack: one per thread, reused (trivially destructible).
            using Columns = fn::ColumnCascade<T, typename Op::R, kCols>;
            static thread_local std::unique_ptr<Columns> columns;
            if (columns)
              std::construct_at(columns.get(), m);
            else
              columns = std::make_unique<Columns>(m);
            Columns& cc = *columns;
            walk(red, 0, nred, [&](int64_t off, int64_t cnt) {
              for (int64_t i = 0; i < cnt; ++i)
                cc.add(row_as(base + off + i * red.stride[red.n - 1], m, wide.get()), m);
            });
            cc.finish(out, m);
          } else {  // exact in any order (integer sums wrap)
            static_assert(std::is_same_v<S, T>);
            std::fill(out, out + m, Op::identity());
            walk(red, 0, nred, [&](int64_t off, int64_t cnt) {
              for (int64_t i = 0; i < cnt; ++i) {
                const T* row = base + off + i * red.stride[red.n - 1];
                for (int64_t j = 0; j < m; ++j) out[j] = Op::combine(out[j], row[j]);
              }
            });
          }
        }
      },
      1);
}

// Whether the sums go by columns (reduce_columns): the innermost kept dim is contiguous and the
// innermost reduced one is not.
bool by_columns(const Dims& kept, const Dims& red) {
  return kept.n > 0 && red.n > 0 && kept.stride[kept.n - 1] == 1 && red.stride[red.n - 1] != 1;
}

// x's dims split into the kept ones and the reduced ones (attrs.ints; none: all), each merged.
void split_dims(const Tensor& x, const Attrs& attrs, Dims& kept, Dims& red) {
  const int64_t nd = x.dim();
  bool reduced[64] = {};
  if (attrs.ints.empty())
    for (int64_t d = 0; d < nd; ++d) reduced[d] = true;
  else
    for (int64_t d : attrs.ints) reduced[d] = true;
  for (int64_t d = 0; d < nd; ++d) (reduced[d] ? red : kept).add(x.sizes()[d], x.strides()[d]);
}

template <template <class> class OpT>
void reduce_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  // Sums of integers accumulate in the output dtype (i64).
  Tensor x = in[0].dtype() == out.dtype() ? in[0] : cast_to(in[0], out.dtype());
  DUET_DISPATCH_DTYPE(out.dtype(), "reduce", [&] {
    using T = scalar_t;
    using Op = OpT<T>;
    if constexpr (std::is_same_v<T, bool> && std::is_same_v<Op, SumOp<T>>) {
      DUET_ASSERT(false, "bool sums accumulate in i64");
    } else {
      T* po = static_cast<T*>(out.raw_data());
      const int64_t nout = out.numel();
      std::fill(po, po + nout, Op::identity());
      if (x.numel() == 0 || nout == 0) return;
      Dims kept, red;
      split_dims(x, attrs, kept, red);
      if (red.n == 0) {  // one element each: a row of one
        red.n = 1;
        red.size[0] = red.stride[0] = 1;
      }
      const T* px = static_cast<const T*>(x.raw_data());
      if (by_columns(kept, red))
        reduce_columns<Op>(px, kept, red, po);
      else
        reduce_outputs<Op>(px, kept, red, po);
    }
  });
}

// Note [Low precision sums]
// A sum of an f16 or bf16 tensor accumulates in f32 (Note [Low precision]). Through via_wide it
// widened the whole input into an f32 copy first: a bf16 bias gradient (a column sum of a
// Linear's output gradient under autocast) wrote and read twice as many bytes as the input has,
// and ran at a third of the f32 sum's speed. The column sums widen each row of a tile as they
// read it instead, into a buffer the size of a tile; on a dense input they add the same f32
// values in the same order as via_wide did, so the result is the same, bit for bit. Other sums
// go through via_wide.
void sum_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  const Tensor& x = in[0];
  const DType dt = x.dtype();
  if ((dt == DType::bf16 || dt == DType::f16) && out.dtype() == dt && x.numel() > 0 &&
      out.numel() > 0) {
    Dims kept, red;
    split_dims(x, attrs, kept, red);
    if (by_columns(kept, red)) {
      Tensor wide = detail::empty(out.sizes(), DType::f32, out.device());
      float* po = static_cast<float*>(wide.raw_data());
      std::fill(po, po + out.numel(), 0.0f);
      if (dt == DType::bf16)
        reduce_columns<SumOp<float>>(static_cast<const bf16_t*>(x.raw_data()), kept, red, po);
      else
        reduce_columns<SumOp<float>>(static_cast<const f16_t*>(x.raw_data()), kept, red, po);
      const Tensor* src[] = {&wide};
      Attrs c;
      c.dtype = dt;
      detail::op_def(OpId::Cast)
          .kernel[static_cast<int>(DeviceType::CPU)](TensorRefs(src, 1), c, out);
      return;
    }
  }
  via_wide<reduce_kernel<SumOp>>(in, attrs, out);
}

}  // namespace

void register_reduction_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Sum, DeviceType::CPU, sum_kernel);
  detail::register_kernel(t, OpId::Max, DeviceType::CPU, via_wide<reduce_kernel<MaxOp>>);
  detail::register_kernel(t, OpId::Min, DeviceType::CPU, via_wide<reduce_kernel<MinOp>>);
}

}  // namespace duet::kernels
