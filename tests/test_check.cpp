// The shadow-eager check (trace/check.h): a clean training step matches and leaves the caller's
// state bit for bit as it was; deliberately broken passes (tests/testing) are named with the
// node they broke; a trace-level difference blames no pass; tolerances and their overrides;
// CompileOptions::check_against_eager; the pass registry's errors.
#include <fmt/format.h>

#include "broken_passes.h"
#include "trace/ir/passes.h"
#include "util.h"

using namespace duet;
using namespace duet::test;

namespace {

// A copy of every tensor's bits, to compare before and after.
std::vector<std::vector<unsigned char>> bits(const std::vector<Tensor>& ts) {
  std::vector<std::vector<unsigned char>> r;
  for (const Tensor& t : ts)
    r.push_back(t.defined() ? element_bytes(t) : std::vector<unsigned char>{});
  return r;
}

}  // namespace

TEST_CASE("check: a training step matches eager, and the caller's state is left as it was") {
  manual_seed(3);
  nn::Linear fc1(8, 16), fc2(16, 4);
  nn::Dropout drop(0.25);
  std::vector<Tensor> params = fc1.parameters();
  for (const Tensor& p : fc2.parameters()) params.push_back(p);
  optim::Adam opt(params, {.lr = 0.01});
  Tensor x = randn({6, 8});
  Tensor y = randint(4, {6});
  auto step = compile([&](Tensor in, Tensor target) {
    opt.zero_grad();
    Tensor loss = cross_entropy(fc2(drop(relu(fc1(in)))), target);
    loss.backward();
    opt.step();
    return loss;
  });
  step(x, y);                    // the cache holds an entry, and every parameter has a .grad buffer
  params[3].set_grad(Tensor());  // one leaf without a .grad: the check must leave it so
  std::vector<Tensor> grads, moments;
  for (const Tensor& p : params) grads.push_back(p.grad());
  for (size_t i = 0; i < params.size(); ++i)
    for (const Tensor& t : {opt.state(i).exp_avg, opt.state(i).exp_avg_sq, opt.state(i).step})
      moments.push_back(t);
  const auto params_before = bits(params), grads_before = bits(grads),
             moments_before = bits(moments);
  const CompileStats stats_before = step.stats();
  const std::string explain_before = step.explain().str();
  // The random generator: the draw after the check is the draw there would have been.
  manual_seed(11);
  Tensor expected_draw = rand({5});
  manual_seed(11);

  CheckReport r = check_against_eager(step, x, y);
  INFO(r.str());
  CHECK(r.ok);
  CHECK(r.runs == 3);
  // The result, each argument, each captured tensor after the call, each .grad.
  CHECK(r.values_compared >= 1 + 2 + int64_t(params.size()) * 2);
  CHECK(contains(r.str(), "same as eager"));

  CHECK(bitwise_equal(rand({5}), expected_draw));
  CHECK(bits(params) == params_before);
  CHECK(bits(moments) == moments_before);  // the optimizer's state, its step count included
  for (size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    CHECK(params[i].grad().is_same(grads[i]));  // the same buffers (or none), same bits
  }
  CHECK_FALSE(params[3].grad().defined());
  CHECK(bits(grads) == grads_before);
  const CompileStats stats_after = step.stats();
  CHECK(stats_after.traces == stats_before.traces);
  CHECK(stats_after.hits == stats_before.hits);
  CHECK(step.explain().str() == explain_before);
}

TEST_CASE("check: a pass that drops a negation is named, with the node it broke") {
  const int line = __LINE__ + 3;
  auto f = compile([](Tensor x, Tensor w) {
    auto s = duet::scope("head");
    Tensor y = -x;
    return sum(exp(y) * w);
  });
  Tensor x = randn({4, 5}), w = randn({4, 5});
  CHECK(check_against_eager(f, x, w).ok);
  testing::BrokenPass broken(testing::kDropNegation);
  CheckReport r = check_against_eager(f, x, w);
  INFO(r.str());
  REQUIRE_FALSE(r.ok);
  CHECK(r.difference.value == "result 0");
  CHECK(r.run == 1);
  CHECK(r.pass == testing::kDropNegation);
  CHECK(r.op == "neg");
  CHECK(r.site == fmt::format("test_check.cpp:{}", line));
  CHECK(r.scope == "head");
  CHECK(r.node_difference.mismatched > 0);
  CHECK(r.node_difference.expected == doctest::Approx(-r.node_difference.actual));
  CHECK(contains(r.str(), "introduced by the pass \"testing.drop_negation\""));
  CHECK(contains(r.str(), fmt::format("called at test_check.cpp:{}, scope head", line)));
  // The bisection switched the passes on one at a time, up to the broken one.
  REQUIRE(r.bisection.size() >= 2);
  CHECK(r.bisection.front() == "every pass off: same as eager");
  CHECK(contains(r.bisection.back(), "testing.drop_negation: differs"));

  // Thrown, with the report as the message.
  CheckOptions c;
  c.throw_on_mismatch = true;
  bool thrown = false;
  try {
    check_against_eager(c, f, x, w);
  } catch (const MismatchError& e) {
    thrown = true;
    CHECK(contains(e.what(), "testing.drop_negation"));
  }
  CHECK(thrown);

  // Switched off like any pass, the broken pass does no harm.
  CompileOptions o;
  o.disable_passes = {testing::kDropNegation};
  auto g = compile([](Tensor x, Tensor w) { return sum(exp(-x) * w); }, o);
  CHECK(check_against_eager(g, x, w).ok);
}

TEST_CASE("check: a fusion that swaps two operands is named, with the node it broke") {
  const int line = __LINE__ + 2;
  auto f = compile([](Tensor a, Tensor b) {
    Tensor d = a - b;
    return exp(d) * 2;
  });
  Tensor a = randn({3, 7}), b = randn({3, 7});
  testing::BrokenPass broken(testing::kSwapOperands);
  CheckReport r = check_against_eager(f, a, b);
  INFO(r.str());
  REQUIRE_FALSE(r.ok);
  CHECK(r.pass == testing::kSwapOperands);
  CHECK(r.op == "sub");
  CHECK(r.site == fmt::format("test_check.cpp:{}", line));
  CHECK(r.node_difference.expected == doctest::Approx(-r.node_difference.actual));
  CHECK(contains(r.bisection.back(), "fuse, testing.swap_operands: differs"));
  // Every pass before it, fuse included, gave eager's values.
  for (size_t i = 0; i + 1 < r.bisection.size(); ++i)
    CHECK(contains(r.bisection[i], "same as eager"));
  // The difference is reported where it is largest.
  REQUIRE(r.node_difference.where.size() == 2);
  const double at =
      values(a - b)[size_t(r.node_difference.where[0] * 7 + r.node_difference.where[1])];
  CHECK(r.node_difference.expected == doctest::Approx(at));
}

TEST_CASE("check: a C++ value read at trace time blames no pass; tolerances per dtype") {
  // The function reads a C++ number that changes at every call: the trace bakes in the value it
  // saw, the eager twin sees the next one.
  double k = 1;
  const int line = __LINE__ + 3;
  auto f = compile([&](Tensor x) {
    k += 1e-6;
    return x * k;
  });
  Tensor x32 = randn({4}), x64 = randn({4}, Options().dtype(DType::f64));
  // f32: a relative difference of 1e-6 is within the default tolerance (rtol 1e-5).
  CHECK(check_against_eager(f, x32).ok);
  // f64: not within 1e-7.
  CheckReport r = check_against_eager(f, x64);
  INFO(r.str());
  REQUIRE_FALSE(r.ok);
  CHECK(r.pass.empty());
  CHECK(contains(r.cause, "no pass introduced it"));
  CHECK(r.bisection.size() == 1);
  CHECK(r.op == "mul");  // the node that computes the result
  CHECK(r.site == fmt::format("test_check.cpp:{}", line));
  CHECK(r.difference.tolerance.rtol == 1e-7);
  CHECK(r.difference.mismatched == 4);
  // An override per dtype.
  CheckOptions loose;
  loose.tolerances[DType::f64] = {1e-4, 0};
  CHECK(check_against_eager(loose, f, x64).ok);
  CheckOptions tight;
  tight.tolerances[DType::f32] = {1e-9, 0};
  tight.bisect = false;
  CheckReport t = check_against_eager(tight, f, x32);
  CHECK_FALSE(t.ok);
  CHECK(t.bisection.empty());
  // Integers compare exactly.
  int64_t n = 0;
  auto g = compile([&](Tensor i) { return i + (++n); });
  CheckReport ri = check_against_eager(g, full({3}, 5, Options().dtype(DType::i64)));
  CHECK_FALSE(ri.ok);
  CHECK(ri.difference.max_abs_diff == 1);
  CHECK(ri.difference.tolerance.atol == 0);
}

TEST_CASE("check: CompileOptions::check_against_eager checks every call") {
  CompileOptions o;
  o.check_against_eager = true;
  auto f = compile([](Tensor x) { return sum(exp(-x)); }, o);
  Tensor x = randn({8});
  const double expected = values(sum(exp(-x)))[0];
  CHECK(values(f(x))[0] == doctest::Approx(expected));
  CHECK(values(f(x))[0] == doctest::Approx(expected));
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 1);
  testing::BrokenPass broken(testing::kDropNegation);
  const std::string e = error_of([&] { f(x * 2); });
  CHECK(contains(e, "[check_against_eager]"));
  CHECK(contains(e, "testing.drop_negation"));
}

TEST_CASE("check: registered passes join the pipeline, and misuse is an error") {
  {
    testing::BrokenPass a(testing::kDropNegation), b(testing::kSwapOperands);
    const std::vector<std::string> p = detail::pipeline_passes();
    auto at = [&](const std::string& n) { return std::find(p.begin(), p.end(), n) - p.begin(); };
    CHECK(at("dce") < at(testing::kDropNegation));
    CHECK(at(testing::kDropNegation) < at("fuse"));
    CHECK(at("fuse") < at(testing::kSwapOperands));
    CHECK(at(testing::kSwapOperands) < at("codegen"));
    CHECK(contains(error_of([] { testing::BrokenPass again(testing::kDropNegation); }),
                   "already in the pipeline"));
  }
  const std::vector<std::string> p = detail::pipeline_passes();
  CHECK(std::find(p.begin(), p.end(), testing::kDropNegation) == p.end());
  CHECK(contains(error_of([] { testing::BrokenPass x("nonsense"); }), "no broken pass named"));
  CompileOptions o;
  o.disable_passes = {testing::kDropNegation};  // not registered now
  CHECK(contains(error_of([&] { compile([](Tensor x) { return x; }, o); }),
                 "unknown pass \"testing.drop_negation\""));
  auto f = compile([](Tensor x) { return x; });
  CHECK(contains(error_of([&] {
                   auto inner = compile([&](Tensor x) {
                     check_against_eager(f, x);
                     return x;
                   });
                   inner(randn({2}));
                 }),
                 "[check_against_eager] cannot run while"));
}
