// Data-dependent reads in compiled functions (Note [Data-dependent reads] in trace/tracer.h):
// strict by default; with CompileOptions::guard_data_reads a read value becomes a guard, a
// changed value traces again, and nothing is written before the guards are checked.
#include "trace/compile.h"
#include "trace/control_flow.h"
#include "util.h"

namespace duet::test {
namespace {

CompileOptions guarded() {
  CompileOptions o;
  o.guard_data_reads = true;
  return o;
}

// The seed's branch, with a data-dependent predicate written as a plain C++ if.
Tensor seed_branch(const Tensor& x) {
  if ((sum(x) > 2).item<bool>()) return x * (x * 3);
  return x * 4 - x;
}

}  // namespace

TEST_CASE("data reads: a C++ if on item() retraces per value and equals eager") {
  auto f = compile(seed_branch, guarded());
  const std::vector<double> scales = {1, -1, 2, -3, 1};  // sum > 2, <= 2, ...
  for (double s : scales) {
    Tensor x = full({4}, s, Options().dtype(DType::f64));
    CHECK(close(f(x), seed_branch(x), 0));
  }
  CHECK(f.stats().traces == 2);  // one per branch; later calls find theirs
  CHECK(f.stats().hits == 3);
  REQUIRE(f.stats().retrace_reasons.size() == 1);
  const std::string why = f.stats().retrace_reasons[0];
  CHECK_MESSAGE(contains(why, "item() at test_data_reads.cpp:"), why);
  CHECK_MESSAGE(contains(why, "read true when traced, now false"), why);
  REQUIRE(f.stats().value_guards.size() == 1);
  CHECK(contains(f.stats().value_guards[0], "read false"));
}

TEST_CASE("data reads: strict by default, and a read after an in-place write is an error") {
  auto f = compile(seed_branch);
  std::string e = error_of([&] { f(ones({4})); });
  CHECK_MESSAGE(contains(e, "CompileOptions::guard_data_reads"), e);

  Tensor counter = zeros({}, Options().dtype(DType::f32));
  auto g = compile([&](const Tensor& x) {
    counter.add_(1);
    return x * counter.item<float>();  // the write happens when the compiled function runs
  });
  e = error_of([&] { g(ones({2})); });
  CHECK_MESSAGE(contains(e, "wrote in place earlier in this trace"), e);
  CHECK(counter.item<float>() == 0);

  // Guard mode reads the value the write will produce: a new value each call.
  auto h = compile(
      [&](const Tensor& x) {
        counter.add_(1);
        return x * counter.item<float>();
      },
      guarded());
  for (int i = 1; i <= 3; ++i) CHECK(close(h(ones({2})), full({2}, double(i)), 0));
  CHECK(counter.item<float>() == 3);
  CHECK(h.stats().traces == 3);
}

TEST_CASE("data reads: a failed guard writes nothing, so captured state matches eager") {
  auto step = [](Tensor& counter, const Tensor& x) {
    counter.add_(1);
    if ((sum(x) > 0).item<bool>()) return x + counter;
    return x - counter;
  };
  Tensor ce = zeros({}), cc = zeros({});
  auto f = compile([&](const Tensor& x) { return step(cc, x); }, guarded());
  for (double s : {1.0, -1.0, -2.0, 3.0, -1.0}) {
    Tensor x = full({3}, s);
    CHECK(close(f(x), step(ce, x), 0));
    CHECK(cc.item<float>() == ce.item<float>());
  }
  CHECK(f.stats().traces == 2);
}

TEST_CASE("data reads: random draws read in guard mode match eager draw for draw") {
  auto fn = [](const Tensor& x) {
    Tensor r = rand({1});
    if ((r > 0.5).item<bool>()) return x + r;
    return x - r;
  };
  Tensor x = arange(4, Options().dtype(DType::f32));
  manual_seed(7);
  std::vector<Tensor> eager;
  for (int i = 0; i < 8; ++i) eager.push_back(fn(x));
  manual_seed(7);
  auto f = compile(fn, guarded());
  for (int i = 0; i < 8; ++i) CHECK(close(f(x), eager[size_t(i)], 0));
  CHECK(f.stats().traces == 2);
}

TEST_CASE("data reads: a read value that sets a shape, and gradients through each path") {
  // n = count.item() sets the result's shape: each n is a trace of its own.
  auto head = compile([](const Tensor& x,
                         const Tensor& count) { return slice(x, 0, 0, count.item<int64_t>()) * 2; },
                      guarded());
  Tensor x = arange(6, Options().dtype(DType::f32));
  for (int64_t n : {2, 4, 2}) {
    Tensor c = full({}, double(n), Options().dtype(DType::i64));
    Tensor y = head(x, c);
    CHECK(y.sizes() == Shape{n});
    CHECK(close(y, slice(x, 0, 0, n) * 2, 0));
  }
  CHECK(head.stats().traces == 2);

  auto loss = [](const Tensor& x, const Tensor& w) {
    if ((mean(x) > 0).item<bool>()) return sum(x * w);
    return sum(x * w * w);
  };
  auto f = compile(loss, guarded());
  for (double s : {1.0, -1.0, 2.0}) {
    Tensor x = full({3}, s, Options().dtype(DType::f64));
    Tensor we = (arange(3, Options().dtype(DType::f64)) + 1).requires_grad_(true);
    Tensor wc = we.detach().clone().requires_grad_(true);
    loss(x, we).backward();
    Tensor yc = f(x, wc);
    yc.backward();
    CHECK(close(yc, loss(x, we.detach()), 1e-12));
    CHECK(close(wc.grad(), we.grad(), 1e-12));
  }
}

TEST_CASE("data reads: guards with a symbolic batch dim, and inside a cond body") {
  CompileOptions o = guarded();
  o.dynamic = {{0, 0}};
  auto f = compile(seed_branch, o);
  for (int64_t n : {3, 5, 1, 5}) {
    Tensor x = full({n}, 1.0);
    CHECK(close(f(x), seed_branch(x), 0));
  }
  // n = 1 sums to 1 (the false branch); 3 and 5 sum past 2.
  CHECK(f.stats().traces == 2);

  auto g = compile(
      [](const Tensor& x) {
        return cond(
            sum(x) > 0,
            [](const std::vector<Tensor>& a) {
              Tensor y = a[0] * 2;
              return std::vector<Tensor>{(sum(y) > 1).item<bool>() ? y : -y};
            },
            [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0]}; }, {x})[0];
      },
      guarded());
  const std::string e = error_of([&] { g(ones({2})); });
  CHECK_MESSAGE(contains(e, "computed inside"), e);
}

}  // namespace duet::test
