// Rows of the pointwise composites (reciprocal, square, clamp_min, clamp_max, lerp, addcmul,
// addcdiv, the logical ops), of prod, cumprod, all and any, and of the norms vector_norm, norm
// and cdist, with references on plain doubles written without duet's ops (see op_rows.h).
#include <algorithm>
#include <cmath>
#include <limits>

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

}  // namespace duet::test
