// Reductions and matmul: the reduce and matmul rows of op_rows.h on many dims sets, layouts and
// sizes (both sides of the parallel threshold, with one and two threads), against references.
#include <algorithm>
#include <cmath>

#include "kernels/matrices.h"
#include "long_sums.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using L = Layout;

struct ReduceCase {
  const char* name;
  Shape shape;
  Layout layout;
  std::vector<std::vector<int64_t>> dims;
  Shape small = {};  // made at this shape, then expanded to `shape`
  bool big = false;  // run with 1 and with 2 threads
};

const std::vector<ReduceCase>& reduce_cases() {
  const std::vector<std::vector<int64_t>> rank3 = {{},     {0},    {1},      {2},       {-1},
                                                   {0, 2}, {2, 0}, {-1, -3}, {0, 1, 2}, {1, -1}};
  static const std::vector<ReduceCase> c = {
      {"0-d", {}, L::Contiguous, {{}, {0}, {-1}}},
      {"rank 1", {7}, L::Contiguous, {{}, {0}, {-1}}},
      {"rank 3", {2, 3, 4}, L::Contiguous, rank3},
      {"rank 3 transposed", {2, 3, 4}, L::Transposed, rank3},
      {"rank 3 strided", {2, 3, 4}, L::Strided, rank3},
      {"size-1 dims", {1, 3, 1}, L::Contiguous, {{}, {0}, {1}, {0, 2}}},
      {"empty", {2, 0, 3}, L::Contiguous, {{}, {0}, {1}, {2}, {0, 2}}},
      {"expanded", {3, 4}, L::Contiguous, {{}, {0}, {1}}, {1, 4}},
      {"expanded column", {5, 3}, L::Transposed, {{}, {0}, {1}}, {5, 1}},
      {"big", {300, 500}, L::Contiguous, {{}, {0}, {1}, {-1, 0}}, {}, true},
      {"big transposed", {300, 500}, L::Transposed, {{}, {0}, {1}}, {}, true},
      {"big strided", {300, 500}, L::Strided, {{}, {0}, {1}}, {}, true},
      {"big offset", {300, 500}, L::Offset, {{}, {0}, {1}}, {}, true},
      {"offset 0-d", {}, L::Offset, {{}, {0}}},
      {"big rank 3", {64, 40, 30}, L::Contiguous, {{1}, {0, 2}, {2}, {}}, {}, true},
      {"big single row", {1, 70000}, L::Contiguous, {{1}, {0}}, {}, true},
      {"big single column", {70000, 1}, L::Transposed, {{0}, {1}}, {}, true},
  };
  return c;
}

DType reduce_dtype(ReduceKind kind, DType in) {
  return kind == ReduceKind::Sum && !is_floating(in) ? DType::i64 : in;
}

// Float sums are checked against a bound that scales with the magnitude summed.
std::string differences_scaled(const std::vector<double>& got, const std::vector<double>& want,
                               const std::vector<double>& scale, double rel) {
  if (got.size() != want.size()) return differences(got, want, 0, 0);
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok = (std::isnan(got[i]) && std::isnan(want[i])) ||
              std::fabs(got[i] - want[i]) <= rel * scale[i] + 1e-6;
    if (!ok) return differences({got[i]}, {want[i]}, 0, 0) + " at element " + std::to_string(i);
  }
  return "";
}

void run_reduce(const ReduceRow& row, DType dt, const ReduceCase& c, Rng& rng) {
  const Shape& made = c.small.size() ? c.small : c.shape;
  std::vector<double> v = random_values(made.numel(), Domain{-3, 3, -9, 9}, dt, rng);
  Tensor x = make_sample(v, made, c.shape, dt, c.layout);
  std::vector<double> absv(v.size());
  for (size_t i = 0; i < v.size(); ++i) absv[i] = std::fabs(v[i]);
  const int64_t nd = c.shape.size();
  const DType out_dtype = reduce_dtype(row.kind, dt);
  for (const auto& dims : c.dims) {
    std::vector<int64_t> wrapped;
    bool reduces_empty = dims.empty() && c.shape.numel() == 0;
    for (int64_t d : dims) {
      if (nd == 0) continue;  // a 0-d tensor accepts dim 0 and -1 and reduces nothing
      int64_t w = d < 0 ? d + nd : d;
      wrapped.push_back(w);
      reduces_empty |= c.shape[w] == 0;
    }
    // The values do not depend on keepdim: one reference serves both.
    std::vector<double> want, scale;
    if (!(reduces_empty && (row.kind == ReduceKind::Max || row.kind == ReduceKind::Min))) {
      Shape unused;
      want = ref_reduce(row.kind, v, c.shape, wrapped, false, &unused);
      for (double& w : want) w = round_to(w, out_dtype);
      scale = ref_reduce(row.kind == ReduceKind::Mean ? ReduceKind::Mean : ReduceKind::Sum, absv,
                         c.shape, wrapped, false, &unused);
    }
    for (bool keepdim : {false, true}) {
      INFO(std::string(row.name) << " on " << dtype_name(dt) << ", " << std::string(c.name)
                                 << ", dims " << Dims(dims).str()
                                 << std::string(keepdim ? ", keepdim" : ""));
      if (reduces_empty && (row.kind == ReduceKind::Max || row.kind == ReduceKind::Min)) {
        std::string msg = error_of<ValueError>([&] { row.fn(x, Dims(dims), keepdim); });
        CHECK(msg.rfind(std::string("[") + row.name + "]", 0) == 0);
        continue;
      }
      const Shape out = reduced_shape(c.shape, wrapped, keepdim);
      auto check = [&] {
        Tensor got = row.fn(x, Dims(dims), keepdim);
        CHECK(got.sizes().str() == out.str());
        CHECK(dtype_name(got.dtype()) == dtype_name(out_dtype));
        if (got.sizes() != out) return;
        const bool exact =
            !is_floating(dt) || row.kind == ReduceKind::Max || row.kind == ReduceKind::Min;
        std::string m =
            exact ? differences(values(got), want, 0, 0)
                  : differences_scaled(values(got), want, scale, dt == DType::f32 ? 1e-5 : 1e-13);
        CHECK_MESSAGE(m.empty(), m);
      };
      if (c.big) {
        with_threads(1, check);
        with_threads(2, check);
      } else {
        check();
      }
    }
    CHECK(differences(values(x), v, 0, 0).empty());  // the input is left as it was
  }
}

}  // namespace

TEST_CASE("reduce rows: dims sets, keepdim, layouts, sizes and thread counts") {
  Rng rng(11);
  for (const ReduceRow& row : reduce_rows())
    for (DType dt : row.dtypes)
      for (const ReduceCase& c : reduce_cases()) run_reduce(row, dt, c, rng);
}

TEST_CASE("reductions: NaN propagates through max, min and sum") {
  const double nan = std::nan("");
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = make({1, nan, 3, 4, 5, 6}, {2, 3}, dt);
    CHECK(std::isnan(max(x).item<double>()));
    CHECK(std::isnan(min(x).item<double>()));
    CHECK(std::isnan(sum(x).item<double>()));
    check_tensor(max(x, 1), {2}, dt, {nan, 6});
    check_tensor(min(x, 0), {3}, dt, {1, nan, 3});
    check_tensor(max(transpose(x, 0, 1), 0), {2}, dt, {nan, 6});
  }
}

TEST_CASE("reductions: integer and bool sums accumulate in i64") {
  Tensor big = make({2e9, 2e9, 2e9}, {3}, DType::i32);
  check_tensor(sum(big), {}, DType::i64, {6e9});
  Tensor b = make({1, 0, 1, 1, 0, 1}, {2, 3}, DType::b8);
  check_tensor(sum(b), {}, DType::i64, {4});
  check_tensor(sum(b, 0), {3}, DType::i64, {2, 0, 2});
  check_tensor(max(b, 1), {2}, DType::b8, {1, 1});
  check_tensor(min(b, 1), {2}, DType::b8, {0, 0});
  check_tensor(mean(make({1, 2, 3, 4}, {2, 2}, DType::f64), {0, 1}, true), {1, 1}, DType::f64,
               {2.5});
}

TEST_CASE("reductions: sums of empty tensors are zero; means are NaN") {
  check_tensor(sum(zeros({0})), {}, DType::f32, {0});
  check_tensor(sum(zeros({2, 0}), 1), {2}, DType::f32, {0, 0});
  check_tensor(sum(zeros({2, 0}), 0), {0}, DType::f32, {});
  CHECK(std::isnan(mean(zeros({0})).item<float>()));
  check_tensor(max(zeros({0, 3}), 1), {0}, DType::f32, {});
}

TEST_CASE("reductions: long f32 sums and means stay within a few ulps, at 1 and 2 threads") {
  for (const LongSum& c : long_sums()) {
    INFO(c.name);
    const Tensor x = long_sum_input(c);
    const std::vector<double> want = long_sum_reference(c);
    const Dims dims(c.dims);
    std::vector<double> sums[2];
    for (int threads : {1, 2})
      with_threads(threads, [&] {
        INFO(threads << " threads");
        const Tensor s = sum(x, dims);
        const std::string e = long_sum_errors(c, want, s, false);
        CHECK_MESSAGE(e.empty(), e);
        const std::string em = long_sum_errors(c, want, mean(x, dims), true);
        CHECK_MESSAGE(em.empty(), em);
        sums[threads - 1] = values(s);
      });
    CHECK_MESSAGE(sums[0] == sums[1], "a sum depends on the thread count");
  }
}

// ---- more than 16 dims ------------------------------------------------------------------------

namespace {

// Element idx of the broadcast of row-major values v of shape s (aligned to the right; size-1
// dims repeat) to a shape of idx.size() dims.
double read_broadcast(const std::vector<double>& v, const Shape& s,
                      const std::vector<int64_t>& idx) {
  const int64_t lead = static_cast<int64_t>(idx.size()) - s.size();
  int64_t k = 0;
  for (int64_t d = 0; d < s.size(); ++d) k = k * s[d] + (s[d] == 1 ? 0 : idx[lead + d]);
  return v[k];
}
// n values, multiples of 1/4 in [-4, 4]: f64 sums of up to 2^18 of them are exact.
std::vector<double> quarters(int64_t n, Rng& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = static_cast<double>(static_cast<int64_t>(rng.next() % 33) - 16) / 4;
  return v;
}
}  // namespace

// Operands whose dims coalesce to more than 16 take the element-by-element walk (run_slow in
// kernels/loops.h). Dims of size 2 where the operands alternate between broadcasting (stride 0)
// and stepping cannot merge, so 17 or 18 of them stay 17 or 18 loop dims.
TEST_CASE("ops on more than 16 dims that do not coalesce: broadcasting, reductions, scatter_add") {
  Rng rng(14);
  const Shape full(std::vector<int64_t>(17, 2));
  // a: rank 17, size 1 on the odd dims; b: rank 16 (aligned to dims 1..16), size 1 where a is 2
  // except dim 0, which b lacks. Every dim broadcasts one operand and not the other.
  std::vector<int64_t> as, bs;
  for (int64_t d = 0; d < 17; ++d) as.push_back(d % 2 ? 1 : 2);
  for (int64_t j = 0; j < 16; ++j) bs.push_back(j % 2 ? 1 : 2);
  const Shape sa(as), sb(bs);
  const std::vector<double> va = quarters(sa.numel(), rng), vb = quarters(sb.numel(), rng);
  const Tensor a = make(va, sa, DType::f64), b = make(vb, sb, DType::f64);
  std::vector<double> sum_ab, diff_ba;
  for (int64_t i = 0; i < full.numel(); ++i) {
    const std::vector<int64_t> idx = unravel(i, full);
    const double x = read_broadcast(va, sa, idx), y = read_broadcast(vb, sb, idx);
    sum_ab.push_back(x + y);
    diff_ba.push_back(y - x);
  }
  check_tensor(a + b, full, DType::f64, sum_ab);
  check_tensor(b - a, full, DType::f64, diff_ba);
  // f32 and i32 operands, converted from exact values: the same walk for other item sizes.
  check_tensor(a.to(DType::f32) + b.to(DType::f32), full, DType::f32, sum_ab);
  std::vector<double> vai(va.size()), vbi(vb.size()), sum_i;
  for (size_t i = 0; i < va.size(); ++i) vai[i] = va[i] * 4;
  for (size_t i = 0; i < vb.size(); ++i) vbi[i] = vb[i] * 4;
  for (double v : sum_ab) sum_i.push_back(v * 4);
  check_tensor(make(vai, sa, DType::i32) + make(vbi, sb, DType::i32), full, DType::i32, sum_i);

  // A full 17-dim operand with its dims reversed (no two dims merge) times the lower-rank b, and
  // a unary op on it.
  std::vector<int64_t> rev;
  for (int64_t d = 16; d >= 0; --d) rev.push_back(d);
  const std::vector<double> vx = quarters(full.numel(), rng);
  const Tensor xt = permute(make(vx, full, DType::f64), Dims(rev));
  std::vector<double> prod, negx;
  for (int64_t i = 0; i < full.numel(); ++i) {
    std::vector<int64_t> idx = unravel(i, full), back(idx.rbegin(), idx.rend());
    const double x = vx[ravel(back, full)];
    prod.push_back(x * read_broadcast(vb, sb, idx));
    negx.push_back(-x);
  }
  check_tensor(xt * b, full, DType::f64, prod);
  check_tensor(neg(xt), full, DType::f64, negx);

  // Reductions over several dims: of a + b's values (made directly, so that a wrong a + b does
  // not fail these), of the expanded a (stride 0 on every odd dim), and of an 18-dim tensor,
  // whose halves (two threads split a kept dim) still have 17 loop dims.
  const Tensor abv = make(sum_ab, full, DType::f64), aexp = expand(a, full);
  const Shape full18(std::vector<int64_t>(18, 2));
  const std::vector<double> v18 = quarters(full18.numel(), rng);
  const Tensor x18 = make(v18, full18, DType::f64);
  std::vector<double> vaexp;
  for (int64_t i = 0; i < full.numel(); ++i)
    vaexp.push_back(read_broadcast(va, sa, unravel(i, full)));
  struct R {
    const char* name;
    const Tensor* x;
    const std::vector<double>* v;
    Shape s;
    std::vector<int64_t> dims;
  };
  const std::vector<R> reductions = {
      {"a + b over the odd dims", &abv, &sum_ab, full, {1, 3, 5, 7, 9, 11, 13, 15}},
      {"a + b over the even dims", &abv, &sum_ab, full, {0, 2, 4, 6, 8, 10, 12, 14, 16}},
      {"expanded a over dims 0, 3, 5, 8 and 16", &aexp, &vaexp, full, {0, 3, 5, 8, 16}},
      {"18 dims over the even dims", &x18, &v18, full18, {0, 2, 4, 6, 8, 10, 12, 14, 16}},
      {"18 dims over dims 1, 2, 7 and 17", &x18, &v18, full18, {1, 2, 7, 17}},
  };
  for (const R& r : reductions) {
    for (bool is_max : {false, true}) {
      INFO(std::string(is_max ? "max of " : "sum of ") << std::string(r.name));
      Shape out;
      const std::vector<double> want =
          ref_reduce(is_max ? ReduceKind::Max : ReduceKind::Sum, *r.v, r.s, r.dims, false, &out);
      auto check = [&] {
        check_tensor(is_max ? max(*r.x, Dims(r.dims)) : sum(*r.x, Dims(r.dims)), out, DType::f64,
                     want);
      };
      with_threads(1, check);
      with_threads(2, check);
    }
  }

  // scatter_add into a 17-dim base along dim 5: an index of size 3 there (repeated targets) and
  // of size 1 on some other dims, and a source with its dims reversed.
  const int64_t dim = 5;
  std::vector<int64_t> is;
  for (int64_t d = 0; d < 17; ++d) is.push_back(d == dim ? 3 : d % 3 == 1 ? 1 : 2);
  const Shape sidx(is);
  std::vector<double> vi(static_cast<size_t>(sidx.numel()));
  for (double& v : vi) v = static_cast<double>(rng.next() % 2);
  const std::vector<double> vbase = quarters(full.numel(), rng);
  const std::vector<double> vsrc = quarters(sidx.numel(), rng);
  Shape sidx_rev;
  for (int64_t d = 16; d >= 0; --d) sidx_rev.push_back(sidx[d]);
  std::vector<double> vsrc_rev(vsrc.size());  // the source stored with its dims reversed
  for (int64_t i = 0; i < sidx.numel(); ++i) {
    std::vector<int64_t> idx = unravel(i, sidx), back(idx.rbegin(), idx.rend());
    vsrc_rev[ravel(back, sidx_rev)] = vsrc[i];
  }
  const Tensor src = permute(make(vsrc_rev, sidx_rev, DType::f64), Dims(rev));
  REQUIRE(differences(values(src), vsrc, 0, 0).empty());
  std::vector<double> want = vbase;
  for (int64_t i = 0; i < sidx.numel(); ++i) {
    std::vector<int64_t> q = unravel(i, sidx);
    q[dim] = static_cast<int64_t>(vi[i]);
    want[ravel(q, full)] += vsrc[i];
  }
  check_tensor(scatter_add(make(vbase, full, DType::f64), dim, make(vi, sidx, DType::i64), src),
               full, DType::f64, want);
}

// ---- matmul -----------------------------------------------------------------------------------

TEST_CASE("matmul rows: shapes, layouts and dtypes against the reference") {
  Rng rng(12);
  for (const MatmulRow& row : matmul_rows()) {
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
      INFO("matmul " << std::string(row.name) << " on " << dtype_name(dt));
      Domain dom{-1, 1, -3, 3};
      std::vector<double> va = random_values(row.a.numel(), dom, dt, rng);
      std::vector<double> vb = random_values(row.b.numel(), dom, dt, rng);
      Tensor a = make_layout(va, row.a, dt, row.la);
      Tensor b = make_layout(vb, row.b, dt, row.lb);
      Shape out;
      std::vector<double> want = ref_matmul(va, row.a, vb, row.b, &out);
      const double tol = dt == DType::f32 ? 1e-5 : dt == DType::f64 ? 1e-12 : 0;
      auto check = [&] { check_tensor(matmul(a, b), out, dt, want, tol, tol); };
      if (row.a.numel() > 10000) {
        with_threads(1, check);
        with_threads(2, check);
      } else {
        check();
      }
      CHECK(differences(values(a), va, 0, 0).empty());
      CHECK(differences(values(b), vb, 0, 0).empty());
    }
  }
}

TEST_CASE("matmul with expanded and offset operands") {
  Rng rng(13);
  std::vector<double> va = random_values(4, Domain{-1, 1}, DType::f64, rng);
  std::vector<double> vb = random_values(20, Domain{-1, 1}, DType::f64, rng);
  Tensor a = expand(make(va, {1, 4}, DType::f64), {3, 4});  // stride 0 rows
  Tensor b = make(vb, {4, 5}, DType::f64);
  Shape out;
  std::vector<double> want =
      ref_matmul(broadcast_values(va, {1, 4}, {3, 4}), {3, 4}, vb, {4, 5}, &out);
  check_tensor(matmul(a, b), {3, 5}, DType::f64, want, 1e-12, 1e-12);
  // A batch taken from the middle of a larger tensor (non-zero storage offset).
  Tensor big = make(random_values(3 * 4 * 5, Domain{-1, 1}, DType::f32, rng), {3, 4, 5});
  Tensor mid = slice(big, 0, 1, 2);  // (1, 4, 5)
  std::vector<double> vm = values(mid), vt = values(transpose(mid, 1, 2));
  want = ref_matmul(vt, {1, 5, 4}, vm, {1, 4, 5}, &out);
  check_tensor(matmul(transpose(mid, 1, 2), mid), {1, 5, 5}, DType::f32, want, 1e-5, 1e-5);
}

// Note [OpenBLAS's choice of kernels] in kernels/matmul.cpp: OpenBLAS's generic kernels for an
// AVX2 CPU it did not recognize ran small products 3 to 8 times slower than its right ones.
TEST_CASE("matmul: small f32 products stay off OpenBLAS kernels made for older CPUs") {
  using kernels::openblas_core_fits;
  CHECK_FALSE(openblas_core_fits("Prescott", true));
  CHECK_FALSE(openblas_core_fits("Sandybridge", true));
  CHECK_FALSE(openblas_core_fits("", true));
  CHECK_FALSE(openblas_core_fits("SkylakeXY", true));
  for (const char* fits : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", "ZEN"})
    CHECK(openblas_core_fits(fits, true));
  CHECK(openblas_core_fits("Prescott", false));  // a CPU without AVX2: OpenBLAS's own choice
  const std::string lib = kernels::small_product_library();
  INFO(lib);
  CHECK((lib.rfind("OpenBLAS", 0) == 0) == kernels::small_products_on_openblas());
}

}  // namespace duet::test
