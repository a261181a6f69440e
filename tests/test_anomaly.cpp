// Anomaly detection (Note [Anomaly mode] in core/anomaly.h), as a table: each row computes
// something eagerly under AnomalyMode and names the op that must be blamed, or none.
#include <cmath>
#include <limits>

#include "util.h"

namespace duet::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct AnomalyRow {
  const char* name;
  std::function<void()> run;
  const char* blamed;            ///< the "[anomaly] <op> produced" the error names; null: no error
  const char* detail = nullptr;  ///< more text the message must hold
};

Tensor vec(std::vector<double> v, DType d = DType::f32, bool grad = false) {
  const int64_t n = static_cast<int64_t>(v.size());
  return tensor(v, {n}, Options().dtype(d).requires_grad(grad));
}

const std::vector<AnomalyRow>& rows() {
  static const std::vector<AnomalyRow> r = {
      {"log(0)",
       [] {
         log(vec({1, 0, 2}));
       },
       "log", "0 NaN and 1 infinite values (the first at flat index 1)"},
      {"log of a negative, f64",
       [] {
         log(vec({1, -1}, DType::f64));
       },
       "log", "flat index 1"},
      {"x / 0",
       [] {
         div(vec({1, 2}), vec({1, 0}));
       },
       "div", "infinite"},
      {"exp overflows f32", [] { exp(vec({100})); }, "exp", "shape (1) and dtype f32"},
      {"deep in a chain",
       [] {
         sqrt(relu(vec({1, 2})) - 3);
       },
       "sqrt", "inputs without any"},
      {"a cast that overflows", [] { vec({1e300}, DType::f64).to(DType::f32); }, "cast", nullptr},
      {"in place",
       [] {
         vec({1, 2}).div_(0);
       },
       "div", nullptr},
      {"an rvalue input is not reused before the check", [] { log(vec({0}) * 1); }, "log", nullptr},
      {"backward names the forward op",
       [] {
         Tensor x = vec({0, 1}, DType::f32, true);
         sum(sqrt(x)).backward();  // d sqrt / dx at 0 is 0.5 / 0
       },
       "div", "inside the gradient rule of sqrt"},
      {"finite values pass",
       [] {
         log(vec({1, 2}));
       },
       nullptr},
      {"NaN in, NaN out is not new",
       [] {
         relu(vec({kNaN, 1})) + 1;
       },
       nullptr},
      {"infinity in, infinity out", [] { vec({kInf}) * 2; }, nullptr},
      {"sources make what they are asked for", [] { full({2}, kNaN); }, nullptr},
      {"integers are never checked",
       [] {
         vec({1, 2}, DType::i64) * 3;
       },
       nullptr},
  };
  return r;
}

TEST_CASE("anomaly: the first op that makes a NaN or an infinity is named") {
  for (const AnomalyRow& row : rows()) {
    CAPTURE(std::string(row.name));
    AnomalyMode on;
    CHECK(anomaly_enabled());
    if (!row.blamed) {
      CHECK_NOTHROW(row.run());
      continue;
    }
    try {
      row.run();
      FAIL("no AnomalyError");
    } catch (const AnomalyError& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(starts_with(what, std::string("[anomaly] ") + row.blamed + " produced"));
      if (row.detail) CHECK(contains(what, row.detail));
    }
  }
}

TEST_CASE("anomaly: off by default and after the guard, which nests") {
  CHECK(!anomaly_enabled());
  CHECK_NOTHROW(log(vec({0})));
  {
    AnomalyMode on;
    {
      AnomalyMode off(false);
      CHECK(!anomaly_enabled());
      CHECK_NOTHROW(log(vec({0})));
    }
    CHECK(anomaly_enabled());
    CHECK_THROWS_AS(log(vec({0})), AnomalyError);
  }
  CHECK(!anomaly_enabled());
  CHECK_NOTHROW(log(vec({0})));
}

TEST_CASE("anomaly: isnan, isinf and isfinite, eager and compiled, every dtype") {
  for (DType d : {DType::f32, DType::f64}) {
    CAPTURE(d);
    Tensor x = vec({kNaN, kInf, -kInf, 0, -1.5}, d);
    CHECK(values(isnan(x)) == std::vector<double>{1, 0, 0, 0, 0});
    CHECK(values(isinf(x)) == std::vector<double>{0, 1, 1, 0, 0});
    CHECK(values(isfinite(x)) == std::vector<double>{0, 0, 0, 1, 1});
    CHECK(isnan(x).dtype() == DType::b8);
    auto f = compile([](std::vector<Tensor> in) {
      return std::vector<Tensor>{isnan(in[0]), isinf(in[0]), isfinite(in[0])};
    });
    std::vector<Tensor> r = f({x});
    CHECK(bitwise_equal(r[0], isnan(x)));
    CHECK(bitwise_equal(r[1], isinf(x)));
    CHECK(bitwise_equal(r[2], isfinite(x)));
  }
  for (DType d : {DType::i32, DType::i64, DType::b8}) {
    CAPTURE(d);
    Tensor x = vec({1, 0, 1}, d);
    CHECK(values(isnan(x)) == std::vector<double>{0, 0, 0});
    CHECK(values(isinf(x)) == std::vector<double>{0, 0, 0});
    CHECK(values(isfinite(x)) == std::vector<double>{1, 1, 1});
  }
  CHECK(isnan(zeros({0, 3})).sizes() == Shape{0, 3});
  CHECK(values(isinf(scalar(kInf))) == std::vector<double>{1});
}

// Run by the ctest entry test_anomaly_env, with DUET_DETECT_ANOMALY=1 in the environment.
// The AnomalyError message a call throws, or "" when it throws none.
template <class F>
std::string anomaly_of(F&& f) {
  try {
    f();
  } catch (const AnomalyError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("anomaly, compiled: the step and the fused group's primitive are named") {
  // log(x - 1) is -inf at x = 1, deep inside one fused group with exp and a sum.
  const int line = __LINE__ + 1;
  auto f = compile([](Tensor x) { return sum(exp(x) * log(x - 1.0)); });
  const Tensor x = make({1, 2, 3}, {3});
  CHECK(std::isinf(f(x).item<double>()));  // off: the value goes through
  CHECK(f.stats().fused_kernels >= 1);
  std::string what;
  {
    AnomalyMode on;  // takes effect at the next call of the function already compiled
    what = anomaly_of([&] { (void)f(x); });
  }
  CAPTURE(what);
  CHECK(starts_with(what, "[anomaly] fused("));
  CHECK(contains(what, "produced 0 NaN and 1 infinite values (the first at flat index 0)"));
  CHECK(contains(what, "compiled function at test_anomaly.cpp:"));
  CHECK(contains(what, fmt::format("(log, called at test_anomaly.cpp:{}) made it", line)));
  CHECK(f.stats().traces == 1);                    // the cached plan ran, with its checks
  CHECK(anomaly_of([&] { (void)f(x); }).empty());  // off again
  // A kernel step of its own: a product that overflows.
  auto g = compile([](Tensor a, Tensor b) { return matmul(a, b) * 2.0; });
  const Tensor big = make({3e38, 3e38}, {1, 2}), col = make({1, 1}, {2, 1});
  (void)g(big, col);
  AnomalyMode on;
  const std::string w = anomaly_of([&] { (void)g(big, col); });
  CAPTURE(w);
  CHECK(starts_with(w, "[anomaly] matmul produced 0 NaN and 1 infinite values"));
  // Inputs that already hold an infinity blame nothing.
  CHECK(anomaly_of([&] { (void)f(make({INFINITY, 2, 3}, {3})); }).empty());
}

TEST_CASE("anomaly: DUET_DETECT_ANOMALY=1 turns it on from the start") {
  if (!std::getenv("DUET_DETECT_ANOMALY")) skip("run by test_anomaly_env");
  CHECK(anomaly_enabled());
  CHECK_THROWS_AS(log(vec({0})), AnomalyError);
}

}  // namespace
}  // namespace duet::test
