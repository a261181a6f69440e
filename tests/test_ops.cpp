// The op sweep: every row of op_rows.h run on the samples of layouts.h (0-d, empty, broadcast,
// non-contiguous, expanded, large), against its float64 reference. Reductions and matmul are in
// test_reduce_matmul.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "layouts.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using L = Layout;

double rtol_for(const ElementwiseRow& row, DType out) {
  return out == DType::f32 ? row.rtol32 : out == DType::f64 ? 1e-12 : 0;
}
double atol_for(const ElementwiseRow& row, DType out) {
  return out == DType::f32 ? row.atol32 : out == DType::f64 ? 1e-12 : 0;
}

// The reference result of `row` on logical inputs (scalars are inputs of shape ()).
std::vector<double> reference(const ElementwiseRow& row, const std::vector<std::vector<double>>& v,
                              const std::vector<Shape>& shapes, DType out_dtype, Shape* out) {
  *out = shapes[0];
  for (const Shape& s : shapes) *out = broadcast_shape(*out, s);
  std::vector<std::vector<double>> bv;
  for (size_t i = 0; i < v.size(); ++i) bv.push_back(broadcast_values(v[i], shapes[i], *out));
  std::vector<double> r(static_cast<size_t>(out->numel()));
  const double* in[3] = {};
  const size_t k = v.size();
  for (size_t i = 0; i < k; ++i) in[i] = bv[i].data();
  double args[3];
  for (size_t e = 0; e < r.size(); ++e) {
    for (size_t i = 0; i < k; ++i) args[i] = in[i][e];
    r[e] = round_to(row.ref(args), out_dtype);
  }
  return r;
}

void check_result(const ElementwiseRow& row, const Tensor& got, const Built& b, DType out_dtype) {
  Shape out;
  std::vector<double> want = reference(row, b.vals, b.shapes, out_dtype, &out);
  check_tensor(got, out, out_dtype, want, rtol_for(row, out_dtype), atol_for(row, out_dtype));
}

void check_unchanged(const Built& b) {
  for (size_t i = 0; i < b.in.size(); ++i) {
    std::string m = differences(values(b.in[i]), b.vals[i], 0, 0);
    CHECK_MESSAGE(m.empty(), "input " << i << " was modified: " << m);
  }
}

Scalar to_scalar(double v, DType dt) {
  if (dt == DType::b8) return Scalar(v != 0);
  if (is_integral(dt)) return Scalar(static_cast<int64_t>(v));
  return Scalar(v);
}

}  // namespace

TEST_CASE("elementwise rows: every sample, every dtype, against the float64 reference") {
  Rng rng(1);
  for (const ElementwiseRow& row : elementwise_rows()) {
    for (size_t k = 0; k < row.dtypes.size(); ++k) {
      const DType dt = row.dtypes[k], out_dtype = result_dtype(row.result, dt);
      for (const Sample& s : samples(kEagerSweep)) {
        if (row.arity < s.min_arity || !runs_large(s, k)) continue;
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s.name));
        Built b = build(row, {dt}, s, rng);
        check_result(row, row.fn(b.in), b, out_dtype);
        check_unchanged(b);
      }
    }
  }
}

TEST_CASE("elementwise rows: a result's bits do not depend on its operands' layout") {
  // Eager runs contiguous operands through the packet math (Eigen's psin and the like), which can
  // differ from the scalar functions in the last place; a strided, transposed or expanded operand
  // must get the same bits, or eager and compiled (whose fused kernels gather operands) differ.
  Rng rng(7);
  std::vector<ElementwiseRow> rows = elementwise_rows();
  for (const ElementwiseRow& r : special_function_rows()) rows.push_back(r);
  for (const ElementwiseRow& row : rows) {
    for (size_t k = 0; k < row.dtypes.size(); ++k) {
      const DType dt = row.dtypes[k];
      for (const Sample& s : samples(kEagerSweep)) {
        if (row.arity < s.min_arity || !runs_large(s, k)) continue;
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s.name));
        Built b = build(row, {dt}, s, rng);
        std::vector<Tensor> dense;
        for (const Tensor& t : b.in) dense.push_back(t.contiguous());
        const Tensor got = row.fn(b.in), want = row.fn(dense);
        CHECK_MESSAGE(bitwise_equal(got, want), differences(values(got), values(want), 0, 0));
      }
    }
  }
}

TEST_CASE("elementwise rows: Scalar operands keep the tensor's dtype") {
  Rng rng(2);
  const Sample& normal = sample("normal");
  for (const ElementwiseRow& row : elementwise_rows()) {
    for (DType dt : row.dtypes) {
      const DType out_dtype = result_dtype(row.result, dt);
      INFO(std::string(row.name) << " on " << dtype_name(dt));
      if (row.fn_scalar) {
        // The last operand becomes a C++ number of the same kind as dt.
        Built b = build(row, {dt}, normal, rng);
        double v = random_values(1, row.domains[row.arity - 1], dt, rng)[0];
        Tensor got =
            row.fn_scalar(std::vector<Tensor>(b.in.begin(), b.in.end() - 1), to_scalar(v, dt));
        b.vals.back() = {v};
        b.shapes.back() = Shape{};
        check_result(row, got, b, out_dtype);
      }
      if (row.fn_lscalar) {
        Built b = build(row, {dt}, normal, rng);
        double v = random_values(1, row.domains[0], dt, rng)[0];
        Tensor got =
            row.fn_lscalar(to_scalar(v, dt), std::vector<Tensor>(b.in.begin() + 1, b.in.end()));
        b.vals.front() = {v};
        b.shapes.front() = Shape{};
        check_result(row, got, b, out_dtype);
      }
    }
  }
}

TEST_CASE("elementwise rows on mixed dtypes promote like PyTorch") {
  Rng rng(9);
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (row.arity - (row.cond_first ? 1 : 0) != 2) continue;
    size_t pair = 0;
    for (DType da : row.dtypes) {
      for (DType db : row.dtypes) {
        if (da == db) continue;
        const DType out_dtype = result_dtype(row.result, promote_types(da, db));
        for (const char* name :
             {"normal", "broadcast (3,1) (1,4) (4)", "mixed layouts", "offset", "big strided"}) {
          const Sample& s = sample(name);
          if (!runs_large(s, pair)) continue;
          INFO(std::string(row.name) << " on " << dtype_name(da) << " and " << dtype_name(db)
                                     << ", sample " << std::string(name));
          Built b = build(row, {da, db}, s, rng);
          check_result(row, row.fn(b.in), b, out_dtype);
          check_unchanged(b);
        }
        ++pair;
      }
    }
  }
}

// ---- NaN, infinities and signed zeros ---------------------------------------------------------

namespace {

// The inputs of `row` on special_grid() in dtype dt (a where's condition in b8), of shape
// (n / 8, 8) laid out as asked; input `skip` is left out (the caller passes it as a Scalar).
Built special_inputs(const ElementwiseRow& row, DType dt, Layout layout, int skip = -1) {
  std::vector<bool> cond;
  for (int i = 0; i < row.arity; ++i)
    if (i != skip) cond.push_back(row.cond_first && i == 0);
  std::vector<std::vector<double>> grid = special_grid(cond);
  Built b;
  for (size_t k = 0; k < grid.size(); ++k) {
    const Shape shape{static_cast<int64_t>(grid[k].size()) / 8, 8};
    b.in.push_back(make_layout(grid[k], shape, cond[k] ? DType::b8 : dt, layout));
    b.vals.push_back(std::move(grid[k]));
    b.shapes.push_back(shape);
  }
  return b;
}

// `got` against the reference on special inputs, with NaN and infinities where the reference
// has them: exactly and signbit-aware where IEEE defines the result (ieee_exact), else within
// the row's tolerance. A composite of such ops rounds more than once (hardsigmoid's x / 6 + 0.5):
// within the tolerance, its zeros still signed. A mismatch names the inputs of its first element.
void check_special(const ElementwiseRow& row, const Tensor& got, const Built& b, DType out_dtype) {
  Shape out;
  const std::vector<double> want = reference(row, b.vals, b.shapes, out_dtype, &out);
  CHECK(got.sizes().str() == out.str());
  CHECK(dtype_name(got.dtype()) == dtype_name(out_dtype));
  if (got.sizes() != out) return;
  const bool exact = ieee_exact(row.op) && !row.composite;
  const double rtol = exact ? 0 : rtol_for(row, out_dtype);
  const double atol = exact ? 0 : atol_for(row, out_dtype);
  const Zeros zeros = ieee_exact(row.op) ? Zeros::Signed : Zeros::Equal;
  const std::vector<double> g = values(got);
  const std::string m = differences(g, want, rtol, atol, zeros);
  if (m.empty()) return;
  std::ostringstream inputs;
  inputs.precision(17);
  for (size_t e = 0; e < g.size(); ++e) {
    if (differences({g[e]}, {want[e]}, rtol, atol, zeros).empty()) continue;
    for (size_t i = 0; i < b.vals.size(); ++i)
      inputs << (i ? ", " : "") << b.vals[i][b.vals[i].size() == 1 ? 0 : e];
    break;
  }
  FAIL_CHECK(m << "; the inputs there: " << inputs.str());
}

}  // namespace

// Note [Eigen's exp below its range] in kernels/functors.h: Eigen's packet exp gave e^-709.78
// for every f64 below it, exp(-inf) included. Now 0 below -745.13, as std::exp's, eagerly (a
// packet per 8 or 16 lanes, some low) and in a fused kernel; the denormal results within the
// smallest normal of std::exp's (Eigen's, which flushes or clamps them).
TEST_CASE("exp underflows to 0 as std::exp does") {
  for (DType dt : {DType::f64, DType::f32}) {
    CAPTURE(dtype_name(dt));
    std::vector<double> xs = {-INFINITY, -1e30, -1000, -745.2, -744, -720, -708, -100, -88, 0, 1};
    xs.resize(40, -1.0);  // whole packets, and lanes of normal values beside them
    std::vector<double> want;
    for (double x : xs) want.push_back(dt == DType::f64 ? std::exp(x) : double(std::exp(float(x))));
    const Tensor x = tensor(xs).to(dt);
    const double rtol = dt == DType::f64 ? 1e-15 : 1e-7;  // (pexp's ulps)
    const double tiny = dt == DType::f64 ? 2.2250738585072014e-308 : 1.1754943508222875e-38;
    auto f = compile([](const Tensor& t) { return exp(t * 1.0) + 0.0; });
    for (const Tensor& got : {exp(x), f(x)}) {
      const std::vector<double> g = values(got);
      CHECK(differences(g, want, rtol, tiny, Zeros::Signed) == "");
      for (size_t i = 0; i < 4; ++i) CHECK(g[i] == 0);  // -inf to -745.2: exactly 0
    }
  }
  // softplus(-inf) is 0, as PyTorch's (it was 5.6e-309 in f64).
  CHECK(softplus(tensor({-INFINITY}).to(DType::f64)).item<double>() == 0);
  // and mish's -inf * tanh(0) NaN, as PyTorch's (it was -inf).
  CHECK(std::isnan(mish(tensor({-INFINITY}).to(DType::f64)).item<double>()));
}

TEST_CASE("close() and differences(): a NaN equals only a NaN; zeros signed when asked") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor with_nan = make({1, nan, -2}, {3}, dt), number = make({1, 0.5, -2}, {3}, dt);
    CHECK_FALSE(close(with_nan, number));  // NaN against a number
    CHECK_FALSE(close(number, with_nan));  // a number against NaN
    CHECK(close(with_nan, with_nan));      // NaN against NaN, in the same place
    CHECK(close(with_nan, make({1, -nan, -2 + 1e-9}, {3}, dt)));  // whatever the NaN's sign
    CHECK_FALSE(close(with_nan, make({nan, 1, -2}, {3}, dt)));    // NaN in another place
    // Infinities match only themselves; a large number is not close to one.
    const Tensor infs = make({inf, -inf}, {2}, dt);
    CHECK(close(infs, infs));
    CHECK_FALSE(close(make({3e38, -inf}, {2}, dt), infs));
    CHECK_FALSE(close(infs, make({-inf, -inf}, {2}, dt)));
    // close() does not look at the signs of zeros.
    CHECK(close(make({-0.0}, {1}, dt), make({0.0}, {1}, dt), 0));
  }
  CHECK(differences({nan, 1}, {-nan, 1}, 0, 0).empty());
  CHECK_FALSE(differences({nan}, {1}, 1, 1).empty());
  CHECK_FALSE(differences({1}, {nan}, 1, 1).empty());
  // Signed zeros: equal by default, different when asked, also under a tolerance; a nonzero
  // within the tolerance of a zero still matches it.
  CHECK(differences({-0.0, 0.0}, {0.0, -0.0}, 0, 0).empty());
  CHECK_FALSE(differences({-0.0}, {0.0}, 0, 0, Zeros::Signed).empty());
  CHECK_FALSE(differences({0.0}, {-0.0}, 1e-6, 1e-6, Zeros::Signed).empty());
  CHECK(differences({-0.0, 0.0, 1e-9}, {-0.0, 0.0, -0.0}, 1e-6, 1e-6, Zeros::Signed).empty());
  CHECK(differences({nan, -inf}, {nan, -inf}, 0, 0, Zeros::Signed).empty());
  CHECK_FALSE(differences({nan}, {0.0}, 1, 1, Zeros::Signed).empty());
  const std::string m = differences({1, -0.0}, {1, 0.0}, 0, 0, Zeros::Signed);
  CHECK(m == "1 of 2 elements differ; first at 1: got -0, want 0");
}

TEST_CASE("elementwise rows on NaN, infinities and signed zeros match the reference") {
  for (const ElementwiseRow& row : elementwise_rows()) {
    for (DType dt : row.dtypes) {
      if (!is_floating(dt)) continue;
      const DType out_dtype = result_dtype(row.result, dt);
      for (Layout layout : {L::Contiguous, L::Transposed, L::Strided}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", " << std::string(layout_name(layout)));
        const Built b = special_inputs(row, dt, layout);
        check_special(row, row.fn(b.in), b, out_dtype);
        check_unchanged(b);
      }
      // Each special value as a Scalar operand: x * -0.0, x / -0.0, NaN < x, ...
      for (double v : special_values()) {
        INFO(std::string(row.name) << " on " << dtype_name(dt) << " with the Scalar " << v);
        if (row.fn_scalar) {
          Built b = special_inputs(row, dt, L::Contiguous, row.arity - 1);
          const Tensor got = row.fn_scalar(b.in, to_scalar(v, dt));
          b.vals.push_back(std::vector<double>{v});
          b.shapes.push_back(Shape{});
          check_special(row, got, b, out_dtype);
        }
        if (row.fn_lscalar) {
          Built b = special_inputs(row, dt, L::Transposed, 0);
          const Tensor got = row.fn_lscalar(to_scalar(v, dt), b.in);
          b.vals.insert(b.vals.begin(), std::vector<double>{v});
          b.shapes.insert(b.shapes.begin(), Shape{});
          check_special(row, got, b, out_dtype);
        }
      }
    }
  }
}

// IEEE negation flips the sign bit, of zeros and NaNs too. fn::Neg (kernels/functors.h) once
// computed 0 - x, in its scalar form and in Eigen 3.4's pnegate, so neg(+0.0) was +0.0 eagerly,
// fused and on CUDA.
TEST_CASE("neg flips the sign bit: neg(+0.0) is -0.0, and a NaN's sign flips") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor x = make({0.0, -0.0, nan}, {3}, dt);
    for (const Tensor& y : {neg(x), -x}) {
      const std::vector<double> v = values(y);
      CHECK(std::signbit(v[0]));
      CHECK(!std::signbit(v[1]));
      CHECK(std::signbit(v[2]));
      CHECK(bitwise_equal(neg(y), x));
    }
  }
}

// What the pointwise composites and products promise beyond their rows' references (PyTorch's
// behaviour where random inputs do not reach: exact bounds, zeros, dtypes, aliasing).
TEST_CASE("composites at their edges: bounds, zeros, dtypes and fresh results") {
  Tensor x = tensor({-1.0, 0.5, 2.0}, Options().dtype(DType::f64)).requires_grad_();
  // clamp_min and clamp_max pass the whole gradient at the bound itself (maximum splits it).
  clamp_min(x, 0.5).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 1});
  x.set_grad(Tensor());
  clamp_max(x, 0.5).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1, 0});
  // lerp's weight 1 gives end exactly; the second form is chosen from |weight| = 0.5 up.
  const Tensor a = tensor({0.1, -3.7}), b = tensor({1e8, 0.3});
  CHECK(bitwise_equal(lerp(a, b, 1.0), b));
  CHECK(bitwise_equal(lerp(a, b, ones({2})), b));
  // b8 squares in i64; integers multiply in i64; an empty product is 1.
  CHECK(square(tensor({1, 0}).ne(0)).dtype() == DType::i64);
  CHECK(prod(tensor({3, 4}, Options().dtype(DType::i32))).dtype() == DType::i64);
  CHECK(prod(zeros({0, 2}), {0}).to_vector<float>() == std::vector<float>{1, 1});
  // A product with nothing to multiply is a new tensor, not a view of x.
  const Tensor y = randn({3, 1});
  Tensor p = prod(y, {1});
  p.add_(1);
  CHECK(y.squeeze(1).add(1).to_vector<float>() == p.to_vector<float>());
  // The logical ops and all/any: b8 for any input, NaN counts as true, empty reductions.
  const Tensor n = tensor({NAN, 0.0});
  CHECK(logical_not(n).to_vector<bool>() == std::vector<bool>{false, true});
  CHECK(all(zeros({0})).item<bool>());
  CHECK(!any(zeros({0})).item<bool>());
  // A NaN makes the norm NaN; zeros make it 0, with gradient 0.
  CHECK(std::isnan(vector_norm(tensor({1.0, NAN})).item<float>()));
  Tensor z = zeros({3}, Options().dtype(DType::f64)).requires_grad_();
  for (double ord : {2.0, 3.0, 1.5}) {
    z.set_grad(Tensor());
    Tensor v = vector_norm(z, ord);
    CHECK(v.item<double>() == 0);
    v.backward();
    CHECK(z.grad().to_vector<double>() == std::vector<double>{0, 0, 0});
  }
}

TEST_CASE("elementwise rows: rvalue operands reuse only buffers nobody else sees") {
  Rng rng(3);
  const Sample& normal = sample("normal");
  const Sample& bcast = sample("broadcast (3,1) (1,4) (4)");
  const Sample& big = sample("big");
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (!row.fn_rvalue) continue;
    for (size_t k = 0; k < row.dtypes.size(); ++k) {
      const DType dt = row.dtypes[k], out_dtype = result_dtype(row.result, dt);
      for (const Sample* s : {&normal, &bcast, &big}) {
        if (row.arity < s->min_arity || !runs_large(*s, k)) continue;
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s->name));
        Built b = build(row, {dt}, *s, rng);
        // A temporary that nobody else holds: its buffer may become the result.
        std::vector<Tensor> in = b.in;
        in[0] = b.in[0].clone();
        check_result(row, row.fn_rvalue(std::move(in)), b, out_dtype);
        // A fresh handle to storage that an lvalue still sees must not be written.
        in = b.in;
        in[0] = b.in[0].detach();
        check_result(row, row.fn_rvalue(std::move(in)), b, out_dtype);
        check_unchanged(b);
      }
    }
  }
}

TEST_CASE("chains of temporaries: right values, one buffer, lvalues untouched") {
  const int64_t n = int64_t(1) << 20;  // 4 MiB of f32: an exact size class
  Rng rng(4);
  std::vector<double> v = random_values(n, Domain{-2, 2}, DType::f32, rng);
  Tensor x = make(v, {n});
  std::vector<double> want(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    float t = static_cast<float>(static_cast<float>(v[i] * 1.5f) + 0.5f);
    want[i] = std::tanh(static_cast<double>(t));
  }
  reset_peak_memory();
  const int64_t before = cpu_memory_stats().current;
  Tensor y = tanh(x * 1.5 + 0.5);
  const int64_t peak = cpu_memory_stats().peak - before;
  // x * 1.5 allocates; + 0.5 and tanh write into that temporary (wrapped numbers are 64 B).
  CHECK(peak >= n * 4);
  CHECK(peak <= n * 4 + 1024);
  check_tensor(y, {n}, DType::f32, want, 1e-6, 1e-6);
  CHECK(differences(values(x), v, 0, 0).empty());
  // A Scalar on the left of a temporary: 2 - (x * 3) writes into the temporary too.
  for (size_t i = 0; i < v.size(); ++i) want[i] = 2.0 - static_cast<float>(v[i] * 3.0f);
  check_tensor(2.0 - x * 3, {n}, DType::f32, want, 1e-6, 1e-6);
  CHECK(differences(values(x), v, 0, 0).empty());

  // The same chain on a strided lvalue and with a second lvalue operand.
  Tensor xt = transpose(reshape(x, {1024, 1024}), 0, 1);
  Tensor z = relu(exp(-(xt * xt)) - xt);
  std::vector<double> xv = values(xt), zw(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    float sq = static_cast<float>(xv[i] * xv[i]);
    double e = std::exp(-static_cast<double>(sq));
    zw[i] = std::max(0.0, e - xv[i]);
  }
  check_tensor(z, {1024, 1024}, DType::f32, zw, 1e-5, 1e-6);
  CHECK(differences(values(x), v, 0, 0).empty());
}

TEST_CASE("elementwise ops on tensors of rank above the loop's 16 coalesced dims") {
  // 17 dims of size 2, permuted so that no two dims merge: the kernels walk element by element.
  Shape s;
  std::vector<int64_t> order;
  for (int i = 0; i < 17; ++i) {
    s.push_back(2);
    order.push_back(i % 2 == 0 ? i / 2 : 16 - i / 2);
  }
  Rng rng(5);
  std::vector<double> va = random_values(s.numel(), Domain{}, DType::f64, rng);
  std::vector<double> vb = random_values(s.numel(), Domain{}, DType::f64, rng);
  Tensor a = permute(make(va, s, DType::f64), Dims(order));
  Tensor b = permute(make(vb, s, DType::f64), Dims(order));
  std::vector<double> xa = values(a), xb = values(b), want(xa.size());
  for (size_t i = 0; i < xa.size(); ++i) want[i] = xa[i] * xb[i] + xa[i];
  check_tensor(a * b + a, a.shape(), DType::f64, want, 1e-12, 1e-12);
  Tensor c = zeros(a.shape(), Options().dtype(DType::f32));
  c.copy_(a);
  check_tensor(c, a.shape(), DType::f32, std::vector<double>(xa.begin(), xa.end()), 1e-6, 1e-6);
  double total = 0;
  for (double x : va) total += x;
  check_tensor(sum(a), {}, DType::f64, {total}, 1e-12, 1e-12);
  Shape out;
  std::vector<double> want_sum = ref_reduce(ReduceKind::Sum, xa, a.shape(), {0, 16}, true, &out);
  check_tensor(sum(a, {0, 16}, true), out, DType::f64, want_sum, 1e-12, 1e-12);
}

// ---- conversions ------------------------------------------------------------------------------

TEST_CASE("conversion rows: every dtype pair and layout") {
  Rng rng(6);
  const std::vector<ConversionCase> cases = conversion_cases(kEagerSweep);
  for (const ConversionRow& row : conversion_rows()) {
    size_t pair = 0;
    for (DType from : kAllDTypes) {
      for (DType to : kAllDTypes) {
        if (row.keeps_dtype && to != from) continue;
        ++pair;
        for (const ConversionCase& c : cases) {
          if (!runs_large(c.shape.numel(), pair - 1)) continue;
          INFO(std::string(row.name) << " " << dtype_name(from) << " -> " << dtype_name(to) << ", "
                                     << std::string(c.name));
          const Shape& made = c.small.size() ? c.small : c.shape;
          std::vector<double> v = random_values(made.numel(), Domain{-50, 50, -50, 50}, from, rng);
          Tensor x = make_sample(v, made, c.shape, from, c.layout);
          std::vector<double> want(v.size());
          for (size_t i = 0; i < v.size(); ++i) want[i] = round_to(v[i], to);
          Tensor y = row.fn(x, to);
          check_tensor(y, c.shape, to, want);
          CHECK(differences(values(x), v, 0, 0).empty());
          if (row.keeps_dtype) CHECK(y.is_contiguous());
        }
      }
    }
  }
}

TEST_CASE("clone is independent; contiguous copies only when needed") {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor c = x.clone();
  CHECK(!same_storage(x, c));
  c.add_(1);
  CHECK(values(x) == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(same_storage(x.contiguous(), x));
  Tensor t = transpose(x, 0, 1);
  Tensor tc = t.contiguous();
  CHECK(!same_storage(t, tc));
  CHECK(tc.is_contiguous());
  CHECK(values(tc) == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(x.to(DType::f32).is_same(x));  // no conversion, no copy
}

// ---- views ------------------------------------------------------------------------------------

TEST_CASE("view rows: values, storage sharing and writes through the view") {
  Rng rng(7);
  for (const ViewRow& row : view_rows()) {
    for (Layout layout : {L::Contiguous, L::Transposed, L::Strided, L::Offset}) {
      INFO(std::string(row.name) << ", input " << std::string(layout_name(layout)));
      std::vector<double> v = random_values(row.in.numel(), Domain{-9, 9}, DType::f32, rng);
      Tensor x = make_layout(v, row.in, DType::f32, layout);
      Tensor y = row.fn(x);
      // Element j of y reads x at offset + sum(index_j[d] * strides[d]) (logical positions).
      std::vector<int64_t> src(static_cast<size_t>(row.out.numel()));
      std::vector<double> want(src.size());
      for (int64_t j = 0; j < row.out.numel(); ++j) {
        int64_t r = j, p = row.offset;
        for (int64_t d = row.out.size() - 1; d >= 0; --d) {
          p += (r % row.out[d]) * row.strides[d];
          r /= row.out[d];
        }
        src[j] = p;
        want[j] = v[p];
      }
      check_tensor(y, row.out, DType::f32, want);
      const bool shared = same_storage(x, y);
      if (row.always_view || x.is_contiguous()) CHECK(shared);
      if (row.op == OpId::Expand) continue;  // an expanded view aliases its elements
      // Writing through a view changes the base; writing into a copy does not.
      y.add_(1000);
      std::vector<double> after = v;
      if (shared)
        for (int64_t p : src) after[p] = round_to(after[p] + 1000, DType::f32);
      CHECK(differences(values(x), after, 0, 0).empty());
    }
  }
}

TEST_CASE("views of views compose their strides and offsets") {
  Tensor x = make(
      [] {
        std::vector<double> v(60);
        for (int i = 0; i < 60; ++i) v[i] = i;
        return v;
      }(),
      {3, 4, 5});
  // y[a][b][c] = x[2c][b][1 + 2a]
  Tensor y = slice(transpose(slice(x, 2, 1, 5, 2), 0, 2), 2, 0, 3, 2);  // (2, 4, 2)
  CHECK(same_storage(x, y));
  std::vector<double> want;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 2; ++c) want.push_back(2 * c * 20 + b * 5 + (1 + 2 * a));
  check_tensor(y, {2, 4, 2}, DType::f32, want);
  // The non-contiguous view through an elementwise op and a reduction.
  check_tensor(sum(y * 2, {0, 2}), {4}, DType::f32, [&] {
    std::vector<double> s(4, 0);
    for (size_t i = 0; i < want.size(); ++i) s[(i / 2) % 4] += 2 * want[i];
    return s;
  }());
}

// ---- slice_scatter ----------------------------------------------------------------------------

TEST_CASE("scatter rows: slice_scatter against the reference, every dtype and layout") {
  Rng rng(10);
  const std::vector<std::pair<Layout, Layout>> layouts = {{L::Contiguous, L::Contiguous},
                                                          {L::Transposed, L::Strided},
                                                          {L::Strided, L::Transposed},
                                                          {L::Offset, L::Offset}};
  for (const ScatterRow& row : scatter_rows()) {
    for (DType dt : kAllDTypes) {
      for (auto [lb, ls] : layouts) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", base " << std::string(layout_name(lb)) << ", source "
             << std::string(layout_name(ls)));
        std::vector<double> vb = random_values(row.base.numel(), Domain{-9, 9}, dt, rng);
        std::vector<double> vs = random_values(row.src.numel(), Domain{-9, 9}, dt, rng);
        Tensor base = make_layout(vb, row.base, dt, lb);
        Tensor src = make_layout(vs, row.src, dt, ls);
        Tensor got = slice_scatter(base, src, row.dim, row.start, row.end, row.step);
        check_tensor(got, row.base, dt, ref_slice_scatter(vb, row.base, vs, row));
        CHECK(got.is_contiguous());
        CHECK(!same_storage(got, base));
        CHECK(differences(values(base), vb, 0, 0).empty());
        CHECK(differences(values(src), vs, 0, 0).empty());
        // The slice of the result is the source.
        Tensor back = slice(got, row.dim, row.start, row.end, row.step);
        check_tensor(back, row.src, dt, vs);
      }
    }
  }
}

// ---- sources ----------------------------------------------------------------------------------

TEST_CASE("source rows: creation functions") {
  for (const SourceRow& row : source_rows()) {
    INFO(std::string(row.name));
    Tensor t = row.fn();
    check_tensor(t, row.shape, row.dtype, row.want);
    CHECK(t.is_contiguous());
  }
  // A long arange, past the parallel threshold of the fill kernels.
  Tensor a = arange(100000, Options().dtype(DType::f32));
  std::vector<double> want(100000);
  for (int i = 0; i < 100000; ++i) want[i] = i;
  check_tensor(a, {100000}, DType::f32, want);
  Tensor f = full({70000}, -1.25, Options().dtype(DType::f64));
  check_tensor(f, {70000}, DType::f64, std::vector<double>(70000, -1.25));
}

// ---- op rows: indexing, joining, images, normalizations, losses, random draws ----------------

namespace {

// How the inputs of an op row sit in memory; Expanded inputs are made with dim 0 of size 1.
enum class Variant { Contiguous, Transposed, Strided, Offset, Expanded };
const char* variant_name(Variant v) {
  static const char* names[] = {"contiguous", "transposed", "strided", "offset", "expanded"};
  return names[int(v)];
}

// The inputs of `row` in dtype dt, laid out as `v`, and their logical values. False when the
// variant would change no input (a transpose of 1-D inputs).
bool build_inputs(const OpRow& row, DType dt, Variant v, Rng& rng, std::vector<Tensor>* in,
                  Values* vals) {
  bool changed = v == Variant::Contiguous || v == Variant::Offset;
  for (size_t i = 0; i < row.shapes.size(); ++i) {
    const Shape& s = row.shapes[i];
    const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
    if (v == Variant::Expanded && s.size() >= 1 && s[0] > 1) {
      Shape small = s;
      small[0] = 1;
      std::vector<double> sv = random_values(small.numel(), d, dt, rng);
      in->push_back(expand(make(sv, small, dt), s));
      vals->push_back(broadcast_values(sv, small, s));
      changed = true;
      continue;
    }
    const Layout l = s.numel() == 0             ? L::Contiguous  // no layout to speak of
                     : v == Variant::Transposed ? L::Transposed
                     : v == Variant::Strided    ? L::Strided
                     : v == Variant::Offset     ? L::Offset
                                                : L::Contiguous;
    changed |= (l == L::Transposed && s.size() >= 2) || (l == L::Strided && s.size() >= 1);
    vals->push_back(random_values(s.numel(), d, dt, rng));
    in->push_back(make_layout(vals->back(), s, dt, l));
  }
  return changed;
}

}  // namespace

TEST_CASE("op rows: every dtype and input layout against the float64 reference") {
  Rng rng(14);
  int checks = 0;
  for (const OpRow& row : op_rows()) {
    for (DType dt : row.dtypes) {
      const DType out_dtype = row.index_result ? DType::i64 : dt;
      const double tol = out_dtype == DType::f32 ? row.tol32 : out_dtype == DType::f64 ? 1e-12 : 0;
      for (Variant v : {Variant::Contiguous, Variant::Transposed, Variant::Strided, Variant::Offset,
                        Variant::Expanded}) {
        if (row.shapes.empty() && v != Variant::Contiguous) continue;
        std::vector<Tensor> in;
        Values vals;
        if (!build_inputs(row, dt, v, rng, &in, &vals)) continue;
        INFO(row.name << " on " << dtype_name(dt) << ", " << std::string(variant_name(v))
                      << " inputs");
        std::vector<double> want = row.ref(vals);
        for (double& w : want) w = round_to(w, out_dtype);
        check_tensor(row.fn(in), row.out, out_dtype, want, tol, tol);
        for (size_t i = 0; i < in.size(); ++i)
          CHECK_MESSAGE(differences(values(in[i]), vals[i], 0, 0).empty(), "input " << i);
        ++checks;
      }
    }
  }
  MESSAGE(fmt::format("{} op rows, {} forward checks", op_rows().size(), checks));
}

// ---- the table itself -------------------------------------------------------------------------

// Completeness: the op table is the one list of ops, so adding an op without its test rows and
// rules fails.
TEST_CASE("every op in ops.def has a test row, a shape rule, a gradient rule and a CPU kernel") {
  std::vector<int> rows(kNumOps, 0);
  for (const auto& r : elementwise_rows())
    if (!r.composite) ++rows[int(r.op)];
  for (const auto& r : conversion_rows())
    if (!r.composite) ++rows[int(r.op)];
  for (const auto& r : reduce_rows())
    if (!r.composite) ++rows[int(r.op)];
  for (const auto& r : view_rows())
    if (!r.composite) ++rows[int(r.op)];
  for (const auto& r : source_rows()) ++rows[int(r.op)];
  if (!matmul_rows().empty()) ++rows[int(OpId::MatMul)];
  if (!scatter_rows().empty()) ++rows[int(OpId::SliceScatter)];
  for (const auto& r : op_rows())
    if (!r.composite) ++rows[int(r.op)];
  MESSAGE(
      fmt::format("{} ops; {} elementwise, {} conversion, {} reduce, {} view, {} source, {} "
                  "matmul, {} slice_scatter and {} other op rows",
                  kNumOps, elementwise_rows().size(), conversion_rows().size(),
                  reduce_rows().size(), view_rows().size(), source_rows().size(),
                  matmul_rows().size(), scatter_rows().size(), op_rows().size()));
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& def = detail::op_def(OpId(i));
    INFO(std::string(def.name));
    CHECK_MESSAGE(rows[i] > 0, "no test row");
    CHECK_MESSAGE((def.infer != nullptr), "no shape rule");
    // A gradient rule, or an explicit "not differentiable" (set_not_differentiable); a rule on
    // an op marked not differentiable would never run.
    CHECK_MESSAGE(!(def.differentiable && def.grad == nullptr), "no gradient rule");
    CHECK_MESSAGE(!(!def.differentiable && def.grad != nullptr), "a rule that never runs");
    // View ops make views (reshape of a non-contiguous tensor copies first); the others run a
    // kernel.
    if (def.cls == OpClass::View)
      CHECK_MESSAGE((def.view != nullptr), "a view op without a view rule");
    else
      CHECK_MESSAGE((def.kernel[int(DeviceType::CPU)] != nullptr), "no CPU kernel");
    // A rule saves only inputs that exist.
    if (def.arity >= 0)
      for (int k = def.arity; k < 4; ++k) CHECK(!(def.save >> k & 1));
  }
}

TEST_CASE("every row dispatches the primitive it claims") {
  Rng rng(8);
  auto check_dispatch = [](OpId op, auto&& f) {
    CountingMode mode;
    {
      ModeGuard guard(&mode);
      f();
    }
    CHECK_MESSAGE(mode.count(std::string(op_name(op))) > 0, "expected a call of " << op_name(op));
  };
  for (const auto& r : elementwise_rows()) {
    INFO(std::string(r.name));
    Built b = build(r, {r.dtypes[0]}, sample("normal"), rng);
    check_dispatch(r.op, [&] { r.fn(b.in); });
  }
  Tensor x = transpose(make({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);
  for (const auto& r : conversion_rows()) {
    INFO(std::string(r.name));
    check_dispatch(r.op, [&] { r.fn(x, DType::f64); });
  }
  for (const auto& r : reduce_rows()) {
    INFO(std::string(r.name));
    check_dispatch(r.op, [&] { r.fn(x, Dims{0}, false); });
  }
  for (const auto& r : view_rows()) {
    INFO(std::string(r.name));
    Tensor in = make(std::vector<double>(r.in.numel(), 1), r.in);
    check_dispatch(r.op, [&] { r.fn(in); });
  }
  for (const auto& r : source_rows()) {
    INFO(std::string(r.name));
    check_dispatch(r.op, [&] { r.fn(); });
  }
  check_dispatch(OpId::MatMul, [&] { matmul(x, transpose(x, 0, 1)); });
  for (const auto& r : scatter_rows()) {
    INFO(std::string(r.name));
    Tensor base = make(std::vector<double>(r.base.numel(), 1), r.base);
    Tensor src = make(std::vector<double>(r.src.numel(), 2), r.src);
    check_dispatch(OpId::SliceScatter,
                   [&] { slice_scatter(base, src, r.dim, r.start, r.end, r.step); });
  }
  for (const auto& r : op_rows()) {
    INFO(r.name);
    std::vector<Tensor> in;
    Values vals;
    build_inputs(r, r.dtypes[0], Variant::Contiguous, rng, &in, &vals);
    check_dispatch(r.op, [&] { r.fn(in); });
  }
}

}  // namespace duet::test
