// Rows of the pointwise composites (reciprocal, square, clamp_min, clamp_max, lerp, addcmul,
// addcdiv, the logical ops), of prod, cumprod, all and any, of the norms vector_norm, norm and
// cdist, and of the ops that repeat and rearrange (repeat, tile, repeat_interleave, movedim,
// swapaxes, unflatten, unbind, broadcast_to, outer, bmm, baddbmm, diag, diag_embed, trace, diff,
// meshgrid, hstack, vstack), with references on plain doubles written without duet's ops (see
// op_rows.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "core/ops.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;
using Vec = std::vector<double>;
using R = ResultKind;

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8};
const std::vector<DType> kNumeric = {DType::f32, DType::f64, DType::i32, DType::i64};
const std::vector<DType> kFloat = {DType::f32, DType::f64};
const Domain kAny{-3, 3, -5, 5};
const Domain kAwayFromZero{0.25, 4, 1, 5};
const Domain kWithZeros{-2, 2, -2, 2, true};

double lerp_ref(double s, double e, double w) {
  return std::abs(w) < 0.5 ? s + (e - s) * w : e - (e - s) * (1 - w);
}

// ---- reductions over dims ---------------------------------------------------------------------

int64_t wrap(int64_t dim, int64_t rank) { return dim < 0 ? dim + rank : dim; }

// The wrapped dims a reduction over `dims` (all when empty) reduces, and its result's shape.
std::vector<int64_t> reduced(const Shape& xs, const std::vector<int64_t>& dims) {
  std::vector<int64_t> w;
  for (int64_t d : dims) w.push_back(wrap(d, xs.size()));
  if (w.empty())
    for (int64_t d = 0; d < xs.size(); ++d) w.push_back(d);
  return w;
}
Shape reduced_shape(const Shape& xs, const std::vector<int64_t>& w, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < xs.size(); ++d) {
    if (std::find(w.begin(), w.end(), d) == w.end())
      out.push_back(xs[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}
// f over each group of elements that share their position in the dims that stay.
Vec reduce_ref(const Vec& x, const Shape& xs, const std::vector<int64_t>& w,
               const std::function<double(const Vec&)>& f) {
  Shape kept = xs;
  for (int64_t d : w) kept[d] = 1;
  std::vector<Vec> groups(static_cast<size_t>(kept.numel()));
  for (int64_t i = 0; i < xs.numel(); ++i) {
    std::vector<int64_t> p = unravel(i, xs);
    for (int64_t d : w) p[d] = 0;
    groups[ravel(p, kept)].push_back(x[i]);
  }
  Vec o;
  for (const Vec& g : groups) o.push_back(f(g));
  return o;
}

OpRow reduce_row(std::string name, OpId op, Shape xs, std::vector<int64_t> dims, bool keepdim,
                 std::function<Tensor(const Tensor&, Dims, bool)> fn,
                 std::function<double(const Vec&)> f) {
  const std::vector<int64_t> w = reduced(xs, dims);
  return OpRow{
      fmt::format("{} {} dims {}{}", name, xs.str(), Dims(dims).str(), keepdim ? " keepdim" : ""),
      op,
      true,
      {xs},
      [=](const Ins& in) { return fn(in[0], Dims(dims), keepdim); },
      [=](const Values& v) { return reduce_ref(v[0], xs, w, f); },
      reduced_shape(xs, w, keepdim)};
}

OpRow prod_row(Shape xs, std::vector<int64_t> dims, bool keepdim) {
  OpRow r = reduce_row(
      "prod", OpId::Mul, xs, dims, keepdim,
      [](const Tensor& x, Dims d, bool k) { return prod(x, d, k); },
      [](const Vec& g) {
        double p = 1;
        for (double e : g) p *= e;
        return p;
      });
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.domains = {Domain{-2, 2, -3, 3}};
  r.low_rtol_scale = 4;  // (a product of rounded products)
  // Nothing to multiply: a copy (or a fill of ones for an empty reduction).
  int64_t n = 1;
  for (int64_t d : reduced(xs, dims)) n *= xs[d];
  if (xs.size() == 0 || n == 1) r.op = OpId::Copy;
  if (n == 0) r.op = OpId::Sum;  // (ones, read from the empty x)
  return r;
}

// all (any when `some`): b8 results, compared as 1 and 0 in the input's dtype.
OpRow truth_row(bool some, Shape xs, std::vector<int64_t> dims, bool keepdim) {
  OpRow r = reduce_row(
      some ? "any" : "all", OpId::Sum, xs, dims, keepdim,
      [=](const Tensor& x, Dims d, bool k) {
        return (some ? any(x, d, k) : all(x, d, k)).to(x.dtype());
      },
      [=](const Vec& g) {
        bool a = true, s = false;
        for (double e : g) {
          a = a && e != 0;
          s = s || e != 0;
        }
        return static_cast<double>(some ? s : a);
      });
  r.dtypes = kNumeric;
  r.domains = {kWithZeros};
  r.grad = false;
  return r;
}

double norm_ref(const Vec& g, double p) {
  if (std::isinf(p)) {
    double m = p > 0 ? 0 : std::numeric_limits<double>::infinity();
    for (double e : g) m = p > 0 ? std::max(m, std::abs(e)) : std::min(m, std::abs(e));
    return m;
  }
  double s = 0;
  for (double e : g) s += p == 0 ? (e != 0) : std::pow(std::abs(e), p);
  return p == 0 ? s : std::pow(s, 1 / p);
}

OpRow norm_row(bool method, Shape xs, double p, std::vector<int64_t> dims, bool keepdim) {
  OpRow r = reduce_row(
      fmt::format("{} p {}", method ? "norm" : "vector_norm", p),
      std::isinf(p) ? OpId::Max : OpId::Sum, xs, dims, keepdim,
      [=](const Tensor& x, Dims d, bool k) {
        return method ? x.norm(p, d, k) : vector_norm(x, p, d, k);
      },
      [=](const Vec& g) { return norm_ref(g, p); });
  if (std::isinf(p) && p < 0) r.op = OpId::Min;
  if (p == 0) r.grad = false;  // (a count)
  return r;
}

// cumprod along dim.
OpRow cumprod_row(Shape xs, int64_t dim) {
  OpRow r{fmt::format("cumprod {} dim {}", xs.str(), dim),
          OpId::Mul,
          true,
          {xs},
          [=](const Ins& in) { return cumprod(in[0], dim); },
          [=](const Values& v) {
            if (xs.size() == 0) return v[0];
            const int64_t d = wrap(dim, xs.size());
            Vec o = v[0];
            for (int64_t i = 0; i < xs.numel(); ++i) {
              std::vector<int64_t> p = unravel(i, xs);
              if (p[d] == 0) continue;
              p[d] -= 1;
              o[i] *= o[ravel(p, xs)];  // (row-major: the element before along d is done)
            }
            return o;
          },
          xs};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.domains = {Domain{-2, 2, -3, 3}};
  r.low_rtol_scale = 4;
  if (xs.size() == 0 || xs[wrap(dim, xs.size())] <= 1) r.op = OpId::Copy;  // nothing to multiply
  return r;
}

// cdist of x1 (..., P, M) and x2 (..., R, M), the batch dims broadcast (given as equal here, or
// x2's as 1).
OpRow cdist_row(Shape a, Shape b, double p) {
  const int64_t m = a[a.size() - 1], pa = a[a.size() - 2], rb = b[b.size() - 2];
  Shape out;
  for (int64_t d = 0; d + 2 < a.size(); ++d) out.push_back(a[d]);
  out.push_back(pa);
  out.push_back(rb);
  OpRow r{fmt::format("cdist {} {} p {}", a.str(), b.str(), p),
          std::isinf(p) ? OpId::Max : OpId::Sum,
          true,
          {a, b},
          [=](const Ins& in) { return cdist(in[0], in[1], p); },
          [=](const Values& v) {
            const int64_t batches = a.numel() / (pa * m), b_batches = b.numel() / (rb * m);
            Vec o;
            for (int64_t n = 0; n < batches; ++n)
              for (int64_t i = 0; i < pa; ++i)
                for (int64_t j = 0; j < rb; ++j) {
                  Vec diff;
                  const int64_t nb = b_batches == 1 ? 0 : n;
                  for (int64_t k = 0; k < m; ++k)
                    diff.push_back(v[0][(n * pa + i) * m + k] - v[1][(nb * rb + j) * m + k]);
                  o.push_back(norm_ref(diff, p));
                }
            return o;
          },
          out};
  return r;
}

// ---- repeating and rearranging -----------------------------------------------------------------

// Each output element is input `in`'s element at the row-major index `at(out index)` (-1: zero),
// or, for outer, bmm and the like, computed from the inputs by `at` directly.
OpRow place_row(std::string name, OpId op, std::vector<Shape> ins, Shape out,
                std::function<Tensor(const Ins&)> fn,
                std::function<double(const Values&, const std::vector<int64_t>&)> at) {
  OpRow r{std::move(name),
          op,
          true,
          ins,
          std::move(fn),
          [=](const Values& v) {
            Vec o;
            for (int64_t i = 0; i < out.numel(); ++i) o.push_back(at(v, unravel(i, out)));
            return o;
          },
          out};
  return r;
}
// Input k's element at index p (row-major in shape s).
double elem(const Values& v, int k, const Shape& s, const std::vector<int64_t>& p) {
  return v[static_cast<size_t>(k)][static_cast<size_t>(ravel(p, s))];
}

OpRow repeat_row(bool tile_form, Shape xs, Shape reps) {
  Shape r;  // (tile: reps padded to x's dims)
  for (int64_t i = reps.size(); i < xs.size(); ++i) r.push_back(1);
  for (int64_t v : reps) r.push_back(v);
  Shape out;
  const int64_t pad = r.size() - xs.size();
  for (int64_t i = 0; i < r.size(); ++i) out.push_back(r[i] * (i < pad ? 1 : xs[i - pad]));
  return place_row(
      fmt::format("{} {} by {}", tile_form ? "tile" : "repeat", xs.str(), reps.str()), OpId::Copy,
      {xs}, out, [=](const Ins& in) { return tile_form ? tile(in[0], reps) : in[0].repeat(reps); },
      [=](const Values& v, const std::vector<int64_t>& p) {
        std::vector<int64_t> q;
        for (int64_t i = pad; i < r.size(); ++i) q.push_back(p[i] % xs[i - pad]);
        return elem(v, 0, xs, q);
      });
}

OpRow interleave_row(Shape xs, int64_t repeats, std::optional<int64_t> dim) {
  const Shape flat{xs.numel()};
  const Shape src = dim ? xs : flat;
  const int64_t d = dim ? wrap(*dim, xs.size()) : 0;
  Shape out = src;
  out[d] *= repeats;
  return place_row(
      fmt::format("repeat_interleave {} by {} dim {}", xs.str(), repeats,
                  dim ? std::to_string(*dim) : "none"),
      OpId::Copy, {xs}, out, [=](const Ins& in) { return repeat_interleave(in[0], repeats, dim); },
      [=](const Values& v, std::vector<int64_t> p) {
        p[d] /= repeats;
        return elem(v, 0, src, p);
      });
}

OpRow movedim_row(Shape xs, std::vector<int64_t> src, std::vector<int64_t> dst) {
  // The permutation, written out as torch documents it: the moved dims at their places, the
  // others in order in the places left.
  const int64_t n = xs.size();
  std::vector<int64_t> order(n, -1);
  std::vector<bool> moved(n, false);
  for (size_t i = 0; i < src.size(); ++i) {
    order[wrap(dst[i], n)] = wrap(src[i], n);
    moved[wrap(src[i], n)] = true;
  }
  int64_t next = 0;
  for (int64_t& o : order) {
    if (o >= 0) continue;
    while (moved[next]) ++next;
    o = next++;
  }
  Shape out;
  for (int64_t o : order) out.push_back(xs[o]);
  OpRow r = place_row(
      fmt::format("movedim {} {} to {}", xs.str(), Dims(src).str(), Dims(dst).str()), OpId::Permute,
      {xs}, out, [=](const Ins& in) { return movedim(in[0], Dims(src), Dims(dst)); },
      [=](const Values& v, const std::vector<int64_t>& p) {
        std::vector<int64_t> q(n);
        for (int64_t i = 0; i < n; ++i) q[order[i]] = p[i];
        return elem(v, 0, xs, q);
      });
  r.dtypes = kAll;
  return r;
}

OpRow diag_row(Shape xs, int64_t k) {
  Shape out;
  if (xs.size() == 1) {
    out = {xs[0] + std::abs(k), xs[0] + std::abs(k)};
  } else {
    const int64_t len =
        std::max<int64_t>(0, k >= 0 ? std::min(xs[0], xs[1] - k) : std::min(xs[0] + k, xs[1]));
    out = {len};
  }
  return place_row(
      fmt::format("diag {} diagonal {}", xs.str(), k), xs.size() == 1 ? OpId::Where : OpId::Slice,
      {xs}, out, [=](const Ins& in) { return in[0].diag(k); },
      [=](const Values& v, const std::vector<int64_t>& p) {
        if (xs.size() == 2)
          return k >= 0 ? elem(v, 0, xs, {p[0], p[0] + k}) : elem(v, 0, xs, {p[0] - k, p[0]});
        const int64_t i = k >= 0 ? p[0] : p[1];  // the vector's element on this row or column
        return p[1] - p[0] == k ? v[0][static_cast<size_t>(i)] : 0.0;
      });
}

}  // namespace

std::vector<ElementwiseRow> pointwise_rows() {
  return {
      {"reciprocal",
       OpId::Div,
       true,
       1,
       [](const Ins& in) { return reciprocal(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return 1 / x[0]; },
       {kAwayFromZero},
       kAll,
       R::FloatIfNotFloat},
      {"square",
       OpId::Mul,
       true,
       1,
       [](const Ins& in) { return square(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] * x[0]; },
       {kAny},
       kNumeric,
       R::Same},
      {"clamp_min 0.5",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return clamp_min(in[0], 0.5); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] < 0.5 ? 0.5 : x[0]; },
       {kAny},
       kFloat,
       R::Same},
      {"clamp_max 1",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return clamp_max(in[0], 1); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] > 1 ? 1.0 : x[0]; },
       {kAny},
       kNumeric,
       R::Same},
      {"lerp weight 0.3",
       OpId::Add,
       true,
       2,
       [](const Ins& in) { return lerp(in[0], in[1], 0.3); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return lerp_ref(x[0], x[1], 0.3); },
       {kAny, kAny},
       kFloat,
       R::Same},
      {"lerp weight 0.75",
       OpId::Sub,
       true,
       2,
       [](const Ins& in) { return in[0].lerp(in[1], 0.75); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return lerp_ref(x[0], x[1], 0.75); },
       {kAny, kAny},
       kFloat,
       R::Same},
      {"lerp tensor weight",
       OpId::Where,
       true,
       3,
       [](const Ins& in) { return lerp(in[0], in[1], in[2]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return lerp_ref(x[0], x[1], x[2]); },
       {kAny, kAny, Domain{-1, 2}},
       kFloat,
       R::Same},
      {"addcmul value 0.5",
       OpId::Add,
       true,
       3,
       [](const Ins& in) { return addcmul(in[0], in[1], in[2], 0.5); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] + 0.5 * (x[1] * x[2]); },
       {kAny, kAny, kAny},
       kFloat,
       R::Same},
      {"addcmul",
       OpId::Add,
       true,
       3,
       [](const Ins& in) { return in[0].addcmul(in[1], in[2]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] + 1 * (x[1] * x[2]); },
       {kAny, kAny, kAny},
       kNumeric,
       R::Same},
      {"addcdiv value -2",
       OpId::Add,
       true,
       3,
       [](const Ins& in) { return addcdiv(in[0], in[1], in[2], -2); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] + -2 * (x[1] / x[2]); },
       {kAny, kAny, kAwayFromZero},
       kFloat,
       R::Same},
      {"logical_not",
       OpId::Eq,
       true,
       1,
       [](const Ins& in) { return logical_not(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return static_cast<double>(x[0] == 0); },
       {kWithZeros},
       kAll,
       R::Bool},
      {"logical_and",
       OpId::Mul,
       true,
       2,
       [](const Ins& in) { return logical_and(in[0], in[1]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return static_cast<double>(x[0] != 0 && x[1] != 0); },
       {kWithZeros, kWithZeros},
       kAll,
       R::Bool},
      {"logical_or",
       OpId::Maximum,
       true,
       2,
       [](const Ins& in) { return logical_or(in[0], in[1]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return static_cast<double>(x[0] != 0 || x[1] != 0); },
       {kWithZeros, kWithZeros},
       kAll,
       R::Bool},
      {"logical_xor",
       OpId::Ne,
       true,
       2,
       [](const Ins& in) { return in[0].logical_xor(in[1]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return static_cast<double>((x[0] != 0) != (x[1] != 0)); },
       {kWithZeros, kWithZeros},
       kAll,
       R::Bool},
  };
}

std::vector<OpRow> math_rows() {
  return {
      prod_row({3, 4}, {1}, false),
      prod_row({2, 3, 4}, {0, 2}, true),
      prod_row({7}, {}, false),
      prod_row({2, 5}, {}, true),
      prod_row({}, {}, false),
      prod_row({0, 3}, {0}, false),
      prod_row({3, 1}, {1}, false),
      cumprod_row({3, 5}, 1),
      cumprod_row({6, 2}, 0),
      cumprod_row({}, 0),
      cumprod_row({2, 0}, 1),
      truth_row(false, {3, 4}, {1}, false),
      truth_row(false, {2, 3}, {}, true),
      truth_row(false, {0, 2}, {0}, false),
      truth_row(true, {3, 4}, {0}, true),
      truth_row(true, {5}, {}, false),
      truth_row(true, {2, 0}, {1}, false),
      norm_row(false, {3, 4}, 2, {1}, false),
      norm_row(false, {2, 3, 2}, 2, {}, false),
      norm_row(false, {3, 4}, 1, {0}, true),
      norm_row(false, {4, 3}, 3, {-1}, false),
      norm_row(false, {3, 4}, INFINITY, {1}, false),
      norm_row(false, {3, 4}, -INFINITY, {}, false),
      norm_row(false, {3, 4}, 0, {1}, true),
      norm_row(true, {2, 5}, 2, {}, false),
      norm_row(true, {2, 5}, 1.5, {1}, true),
      cdist_row({3, 2}, {4, 2}, 2),
      cdist_row({2, 3, 2}, {1, 2, 2}, 1),
      cdist_row({2, 3}, {2, 3}, INFINITY),
      cdist_row({1, 2, 3}, {1, 3, 3}, 3),
  };
}

std::vector<OpRow> arrange_rows() {
  using P = std::vector<int64_t>;
  std::vector<OpRow> r = {
      repeat_row(false, {2, 3}, {2, 1}),
      repeat_row(false, {3}, {2, 1, 2}),
      repeat_row(false, {}, {3}),
      repeat_row(false, {2, 2}, {1, 1}),
      repeat_row(false, {2, 0}, {2, 3}),
      repeat_row(true, {2, 3}, {2}),
      repeat_row(true, {2}, {2, 2}),
      interleave_row({2, 3}, 2, 1),
      interleave_row({3, 2}, 3, 0),
      interleave_row({2, 2}, 2, std::nullopt),
      interleave_row({4}, 1, -1),
      movedim_row({2, 3, 4}, {0}, {2}),
      movedim_row({2, 3, 4, 1}, {-1, 0}, {0, 1}),
      diag_row({3}, 0),
      diag_row({2}, 1),
      diag_row({3}, -2),
      diag_row({3, 4}, 0),
      diag_row({4, 3}, 1),
      diag_row({3, 4}, -1),
      diag_row({2, 3}, 5),
      place_row(
          "swapaxes (2, 3, 4) 0 2", OpId::Permute, {{2, 3, 4}}, {4, 3, 2},
          [](const Ins& in) { return in[0].swapaxes(0, 2); },
          [](const Values& v, const P& p) {
            return elem(v, 0, {2, 3, 4}, {p[2], p[1], p[0]});
          }),
      place_row(
          "swapdims (2, 3) -1 0", OpId::Permute, {{2, 3}}, {3, 2},
          [](const Ins& in) { return swapdims(in[0], -1, 0); },
          [](const Values& v, const P& p) {
            return elem(v, 0, {2, 3}, {p[1], p[0]});
          }),
      place_row(
          "unflatten (2, 6) dim 1 (3, -1)", OpId::Reshape, {{2, 6}}, {2, 3, 2},
          [](const Ins& in) {
            return in[0].unflatten(1, {3, -1});
          },
          [](const Values& v, const P& p) {
            return elem(v, 0, {2, 6}, {p[0], p[1] * 2 + p[2]});
          }),
      place_row(
          "broadcast_to (3, 1) (2, 3, 4)", OpId::Expand, {{3, 1}}, {2, 3, 4},
          [](const Ins& in) {
            return in[0].broadcast_to({2, 3, 4});
          },
          [](const Values& v, const P& p) {
            return elem(v, 0, {3, 1}, {p[1], 0});
          }),
      place_row(
          "outer (3) (4)", OpId::Mul, {{3}, {4}}, {3, 4},
          [](const Ins& in) { return in[0].outer(in[1]); },
          [](const Values& v, const P& p) { return v[0][p[0]] * v[1][p[1]]; }),
      place_row(
          "bmm (2, 3, 2) (2, 2, 4)", OpId::MatMul, {{2, 3, 2}, {2, 2, 4}}, {2, 3, 4},
          [](const Ins& in) { return in[0].bmm(in[1]); },
          [](const Values& v, const P& p) {
            double acc = 0;
            for (int64_t k = 0; k < 2; ++k)
              acc +=
                  elem(v, 0, {2, 3, 2}, {p[0], p[1], k}) * elem(v, 1, {2, 2, 4}, {p[0], k, p[2]});
            return acc;
          }),
      place_row(
          "baddbmm (3, 1) beta 0.5 alpha -2", OpId::MatMul, {{3, 1}, {2, 3, 2}, {2, 2, 4}},
          {2, 3, 4}, [](const Ins& in) { return baddbmm(in[0], in[1], in[2], 0.5, -2); },
          [](const Values& v, const P& p) {
            double acc = 0;
            for (int64_t k = 0; k < 2; ++k)
              acc +=
                  elem(v, 1, {2, 3, 2}, {p[0], p[1], k}) * elem(v, 2, {2, 2, 4}, {p[0], k, p[2]});
            return 0.5 * v[0][p[1]] + -2 * acc;
          }),
      place_row(
          "diag_embed (2, 3) offset 1 dims 0 2", OpId::Where, {{2, 3}}, {4, 2, 4},
          [](const Ins& in) { return diag_embed(in[0], 1, 0, 2); },
          [](const Values& v, const P& p) {
            return p[2] - p[0] == 1 ? elem(v, 0, {2, 3}, {p[1], p[0]}) : 0.0;
          }),
      place_row(
          "trace (3, 4)", OpId::Sum, {{3, 4}}, {}, [](const Ins& in) { return in[0].trace(); },
          [](const Values& v, const P&) { return v[0][0] + v[0][5] + v[0][10]; }),
      place_row(
          "diff (2, 5) n 2", OpId::Sub, {{2, 5}}, {2, 3},
          [](const Ins& in) { return in[0].diff(2); },
          [](const Values& v, const P& p) {
            const auto x = [&](int64_t j) { return elem(v, 0, {2, 5}, {p[0], j}); };
            return x(p[1] + 2) - 2 * x(p[1] + 1) + x(p[1]);
          }),
      place_row(
          "diff (3, 2) dim 0 prepend (1, 2) append (2, 2)", OpId::Sub, {{3, 2}, {1, 2}, {2, 2}},
          {5, 2}, [](const Ins& in) { return diff(in[0], 1, 0, in[1], in[2]); },
          [](const Values& v, const P& p) {
            const auto y = [&](int64_t i) {  // the joined rows: prepend, x, append
              return i < 1   ? elem(v, 1, {1, 2}, {i, p[1]})
                     : i < 4 ? elem(v, 0, {3, 2}, {i - 1, p[1]})
                             : elem(v, 2, {2, 2}, {i - 4, p[1]});
            };
            return y(p[0] + 1) - y(p[0]);
          }),
      place_row(
          "hstack (2, 1) (2, 3)", OpId::Cat, {{2, 1}, {2, 3}}, {2, 4},
          [](const Ins& in) {
            return hstack({in[0], in[1]});
          },
          [](const Values& v, const P& p) {
            return p[1] < 1 ? elem(v, 0, {2, 1}, p) : elem(v, 1, {2, 3}, {p[0], p[1] - 1});
          }),
      place_row(
          "vstack (3) (2, 3)", OpId::Cat, {{3}, {2, 3}}, {3, 3},
          [](const Ins& in) {
            return vstack({in[0], in[1]});
          },
          [](const Values& v, const P& p) {
            return p[0] < 1 ? v[0][p[1]] : elem(v, 1, {2, 3}, {p[0] - 1, p[1]});
          }),
  };
  // The pieces of unbind and the grids of meshgrid, one row each.
  for (int64_t i = 0; i < 3; ++i)
    r.push_back(place_row(
        fmt::format("unbind (2, 3) dim 1 piece {}", i), OpId::Select, {{2, 3}}, {2},
        [=](const Ins& in) { return in[0].unbind(1)[i]; },
        [=](const Values& v, const P& p) {
          return elem(v, 0, {2, 3}, {p[0], i});
        }));
  // Both grids of meshgrid, stacked (each reads one input; the row reads both).
  for (const char* indexing : {"ij", "xy"}) {
    const bool xy = std::string(indexing) == "xy";
    r.push_back(place_row(
        fmt::format("meshgrid (2) (3) {}, grids stacked", indexing), OpId::Expand, {{2}, {3}},
        xy ? Shape{2, 3, 2} : Shape{2, 2, 3},
        [=](const Ins& in) {
          return stack(meshgrid({in[0], in[1]}, indexing), 0);
        },
        [=](const Values& v, const P& p) {
          const int64_t k = p[0], at = xy ? 1 - k : k;  // the grid dim along which input k runs
          return v[static_cast<size_t>(k)][static_cast<size_t>(p[1 + at])];
        }));
  }
  return r;
}

}  // namespace duet::test
