// Symbolic dims in compiled functions (Note [Symbolic dims] in trace/compile.h): dims marked
// dynamic or found to change trace once into a graph over SymInts, each new size gets its own
// plan from it, and code that needs a concrete size specializes with the reason recorded.
#include <set>

#include "trace/plan/codegen.h"
#include "trace/compile.h"
#include "trace/control_flow.h"
#include "util.h"

namespace duet::test {
namespace {

Options f64() { return Options().dtype(DType::f64); }

// An Elman RNN over scan: h_t = tanh(x_t W + h_{t-1} U + b); the loss reads h_T and every h_t.
Tensor rnn_loss(const Tensor& seq, const Tensor& h0, const Tensor& W, const Tensor& U,
                const Tensor& b) {
  auto cell = [W, U, b](const std::vector<Tensor>& s) {
    Tensor h = tanh(matmul(s[1], W) + matmul(s[0], U) + b);
    return std::vector<Tensor>{h, h};
  };
  std::vector<Tensor> o = scan(cell, {h0}, {seq});
  return mean(o[1] * o[1]) + sum(o[0]);
}

double max_rel(const Tensor& a, const Tensor& b) {
  std::vector<double> x = values(a), y = values(b);
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i)
    m = std::max(m, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  return m;
}

}  // namespace

TEST_CASE("dynamic: an Elman RNN over lengths 1..64 takes two traces and equals eager") {
  manual_seed(3);
  Tensor W = (randn({3, 5}, f64()) * 0.5).requires_grad_();
  Tensor U = (randn({5, 5}, f64()) * 0.5).requires_grad_();
  Tensor b = (randn({5}, f64()) * 0.1).requires_grad_();
  Tensor h0 = zeros({2, 5}, f64());
  auto step = compile([&](Tensor seq) {
    Tensor loss = rnn_loss(seq, h0, W, U, b);
    std::vector<Tensor> g = grad({loss}, {W, U, b, seq});
    return std::make_tuple(loss, g[0], g[1], g[2], g[3]);
  });
  for (int64_t len = 1; len <= 64; ++len) {
    Tensor seq = randn({len, 2, 3}, f64()).requires_grad_();
    auto [loss, gw, gu, gb, gs] = step(seq);
    Tensor el = rnn_loss(seq, h0, W, U, b);
    std::vector<Tensor> eg = grad({el}, {W, U, b, seq});
    INFO("length " << len);
    CHECK(max_rel(loss, el) < 1e-12);
    CHECK(max_rel(gw, eg[0]) < 1e-12);
    CHECK(max_rel(gu, eg[1]) < 1e-12);
    CHECK(max_rel(gb, eg[2]) < 1e-12);
    CHECK(max_rel(gs, eg[3]) < 1e-12);
  }
  const CompileStats s = step.stats();
  CHECK(s.traces == 2);
  REQUIRE(s.retrace_reasons.size() == 1);
  CHECK(s.retrace_reasons[0] == "arg 0 dim 0 changed 1 -> 2: retraced with these dims symbolic");
  CHECK(s.symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
  // One plan per length, from one symbolic graph; a length seen before reuses its plan.
  CHECK(s.plans_built == 64);
  step(randn({7, 2, 3}, f64()).requires_grad_());
  CHECK(s.plans_built == 64);
  CHECK(s.traces == 2);
}

TEST_CASE("dynamic: CompileOptions::dynamic: one trace for every batch size, equal to eager") {
  manual_seed(5);
  Tensor W = (randn({5, 12}, f64()) * 0.3).requires_grad_();
  Tensor b = (randn({5}, f64()) * 0.1).requires_grad_();
  // reshape with -1, linear (matmul, broadcast bias), slicing, cat, reductions over and beside the
  // batch, mean, softmax and cross_entropy over a batch of symbolic size.
  auto fn = [&](Tensor x, Tensor labels) {
    Tensor h = reshape(x, {-1, 12});
    Tensor y = linear(h, W, b);
    Tensor both = cat({y, y * 2}, 0);
    Tensor tail = slice(y, 0, 1, std::numeric_limits<int64_t>::max(), 1);
    Tensor loss = cross_entropy(y, labels) + sum(mean(both, {0})) + mean(softmax(y, 1)) +
                  sum(tail) + sum(max(y, 1));
    return std::make_tuple(loss, both, transpose(y, 0, 1), unsqueeze(sum(y, 1), 0));
  };
  CompileOptions o;
  o.dynamic = {{0, 0}, {1, 0}};
  auto f = compile(fn, o);
  for (int64_t n : {3, 5, 1, 8, 5}) {
    INFO("batch " << n);
    Tensor x = randn({n, 4, 3}, f64());
    Tensor labels = randint(5, {n});
    auto [loss, both, yt, rows] = f(x, labels);
    auto [el, eboth, eyt, erows] = fn(x, labels);
    CHECK(both.sizes() == Shape{2 * n, 5});
    CHECK(yt.sizes() == Shape{5, n});
    CHECK(max_rel(loss, el) < 1e-12);
    CHECK(max_rel(both, eboth) < 1e-12);
    CHECK(max_rel(yt, eyt) < 1e-12);
    CHECK(max_rel(rows, erows) < 1e-12);
    // The compiled backward is built from the symbolic graph too.
    std::vector<Tensor> g = grad({loss}, {W, b});
    std::vector<Tensor> eg = grad({el}, {W, b});
    CHECK(max_rel(g[0], eg[0]) < 1e-12);
    CHECK(max_rel(g[1], eg[1]) < 1e-12);
  }
  INFO(fmt::format("{}", fmt::join(f.stats().retrace_reasons, "; ")));
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0", "arg 1 dim 0: s0"});
  CHECK(f.stats().plans_built == 4);
  CHECK(f.graph().str().find("f64[s0, 12]") != std::string::npos);
}

TEST_CASE("dynamic: a new size of a symbolic dim costs a plan: the passes do not run again") {
  // Note [A new size costs a plan]: the passes run once, on the symbolic graph; each new size
  // instantiates the optimized graph and plans it. The first call is at n = 8, where x (n, 8) and
  // its transpose (8, n) have the same sizes: a pass comparing sizes at the traced call would
  // take the reshape of the transpose to (n, 8) for the transpose itself. x * 1 (simplify), the
  // same relu twice (cse) and a product of numbers (fold) give the passes work.
  manual_seed(9);
  Tensor W = (randn({8, 5}, f64()) * 0.3).requires_grad_();
  Tensor b = (randn({5}, f64()) * 0.1).requires_grad_();
  auto fn = [&](Tensor x, Tensor labels) {
    Tensor xt = reshape(transpose(x, 0, 1), {-1, 8});
    Tensor h = matmul(xt * 1.0, W) + b;
    Tensor y = relu(h) + relu(h);
    Tensor loss = cross_entropy(y, labels) + mean(sum(x, 1)) * (2.0 * 3.0);
    return std::make_tuple(loss, y, xt);
  };
  CompileOptions o;
  o.dynamic = {{0, 0}, {1, 0}};
  auto f = compile(fn, o);
  std::set<int64_t> sizes;
  for (int64_t n : {8, 3, 5, 8, 12, 1, 3}) {
    INFO("batch " << n);
    Tensor x = randn({n, 8}, f64());
    Tensor labels = randint(5, {n});
    const CompileStats before = f.stats();
    auto [loss, y, xt] = f(x, labels);
    const CompileStats after = f.stats();
    auto [el, ey, ext] = fn(x, labels);
    REQUIRE(xt.sizes() == Shape{n, 8});
    CHECK(max_rel(xt, ext) < 1e-12);
    CHECK(max_rel(y, ey) < 1e-12);
    CHECK(max_rel(loss, el) < 1e-12);
    std::vector<Tensor> g = grad({loss}, {W, b});
    std::vector<Tensor> eg = grad({el}, {W, b});
    CHECK(max_rel(g[0], eg[0]) < 1e-12);
    CHECK(max_rel(g[1], eg[1]) < 1e-12);
    CHECK(after.traces == 1);
    CHECK(after.optimizations == 1);  // the first call's passes only
    const bool seen = !sizes.insert(n).second;
    CHECK(after.plans_built == before.plans_built + (seen ? 0 : 1));
    if (before.traces == 1 && !seen) {
      CHECK(after.new_size_ms > 0);
      CHECK(after.plan_ms > 0);
      CHECK(after.new_size_ms >= after.plan_ms);
    }
  }
  CHECK(f.stats().plans_built == 5);

  // mean over a symbolic dim divides by a fill computed from the size: 1 at the first call,
  // which no pass may take for a division by one.
  CompileOptions o0;
  o0.dynamic = {{0, 0}};
  auto m = compile([](Tensor x) { return mean(x, {0}) + x * 0.0; }, o0);
  for (int64_t n : {1, 3, 4}) {
    INFO("batch " << n);
    Tensor x = randn({n, 4}, f64());
    CHECK(max_rel(m(x), mean(x, {0}) + x * 0.0) < 1e-12);
  }
  CHECK(m.stats().traces == 1);
  CHECK(m.stats().optimizations == 1);
  CHECK(m.stats().plans_built == 3);
}

TEST_CASE("dynamic: a new size runs the fused kernels of the first plan") {
  // Note [Fusion across sizes]: the plans at new sizes take the first plan's fusion groups and
  // kernel objects, so a kernel queued for codegen at the first size is not queued again (a new
  // kernel object per plan would be, once it reached the threshold).
  const bool was = codegen::enabled();
  codegen::set_enabled(true);
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto fn = [](Tensor x) { return tanh(x * 2.0 + 1.0) * x; };
  auto f = compile(fn, o);
  auto calls = [&](int64_t n) {
    INFO("batch " << n);
    for (int i = 0; i <= codegen::threshold() + 1; ++i) {
      Tensor x = randn({n, 16});
      CHECK(max_rel(f(x), fn(x)) < 1e-6);
    }
  };
  const int64_t before = codegen::stats().queued;
  calls(4);
  const int64_t queued = codegen::stats().queued;
  CHECK(queued > before);
  CHECK(f.stats().fused_kernels >= 1);
  calls(9);
  calls(33);
  CHECK(codegen::stats().queued == queued);
  CHECK(f.stats().plans_built == 3);
  CHECK(f.stats().optimizations == 1);
  codegen::set_enabled(was);
}

TEST_CASE("dynamic: a new size still checks the guards and the data reads, and retraces") {
  // A guard on the symbolic size: a size that breaks it traces (and optimizes) again.
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([](Tensor x, Tensor y) { return x * 2 + y; }, o);
  CHECK(values(f(ones({1, 3}), ones({4, 3}))) == std::vector<double>(12, 3));
  CHECK(f.stats().guards == std::vector<std::string>{"s0 == 1 (add)"});
  CHECK(values(f(full({4, 3}, 2.0), ones({4, 3}))) == std::vector<double>(12, 5));
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().optimizations == 2);
  REQUIRE(f.stats().retrace_reasons.size() == 1);
  CHECK(f.stats().retrace_reasons[0] == "guard s0 == 1 (add) failed at s0 = 4");

  // A value read into C++ (guard_data_reads): a new size runs the guards' part at that size and
  // reuses the optimized graph while the value holds; another value traces again.
  CompileOptions d;
  d.dynamic = {{0, 0}};
  d.guard_data_reads = true;
  auto branch = [](Tensor x) {
    if ((sum(x) > 0).item<bool>()) return x * (x * 3);
    return x * 4 - x;
  };
  auto g = compile(branch, d);
  for (int64_t n : {2, 5, 7}) {
    INFO("batch " << n);
    Tensor x = ones({n, 3}, f64()) * double(n);
    CHECK(max_rel(g(x), branch(x)) < 1e-12);
  }
  CHECK(g.stats().traces == 1);
  CHECK(g.stats().optimizations == 1);
  CHECK(g.stats().plans_built == 3);
  Tensor neg = ones({5, 3}, f64()) * -2.0;
  CHECK(max_rel(g(neg), branch(neg)) < 1e-12);
  CHECK(g.stats().traces == 2);
  CHECK(g.stats().optimizations == 2);
}

TEST_CASE("dynamic: strided slices of a symbolic dim, odd and even sizes, equal eager") {
  // x[start:end:step] has ceil((end - start) / step) elements: a length rule that rounds the
  // other way is off by one at some sizes only. Steps 2 and 3 from 0, 1 and 2, to the end and to
  // a negative end, each compiled once with dim 0 symbolic and called at odd and even sizes,
  // forward and backward (slice_scatter).
  struct Case {
    int64_t start, end, step;
  };
  const int64_t kEnd = std::numeric_limits<int64_t>::max();
  const Case cases[] = {{0, kEnd, 2}, {1, kEnd, 2}, {0, kEnd, 3}, {1, kEnd, 3},
                        {2, kEnd, 3}, {0, -1, 2},   {1, -2, 3}};
  manual_seed(11);
  for (const Case& c : cases) {
    INFO("slice(x, 0, " << c.start << ", " << c.end << ", " << c.step << ")");
    auto fn = [c](Tensor x) {
      Tensor s = slice(x, 0, c.start, c.end, c.step);
      return std::make_tuple(s * 2.0, sum(tanh(s) * s));
    };
    CompileOptions o;
    o.dynamic = {{0, 0}};
    auto f = compile(fn, o);
    for (int64_t n : {7, 8, 9, 10, 11, 12, 13, 5}) {
      INFO("size " << n);
      const int64_t end = c.end == kEnd ? n : c.end < 0 ? n + c.end : std::min(c.end, n);
      const int64_t len = std::max<int64_t>(0, (end - c.start + c.step - 1) / c.step);
      Tensor x = randn({n, 3}, f64()).requires_grad_();
      auto [s, loss] = f(x);
      auto [es, eloss] = fn(x);
      CHECK(es.sizes() == Shape{len, 3});
      CHECK(s.sizes() == Shape{len, 3});
      if (s.sizes() != es.sizes()) continue;
      CHECK(max_rel(s, es) < 1e-12);
      CHECK(max_rel(loss, eloss) < 1e-12);
      const std::vector<Tensor> g = grad({loss}, {x}), eg = grad({eloss}, {x});
      REQUIRE(g[0].sizes() == x.sizes());
      CHECK(max_rel(g[0], eg[0]) < 1e-12);
    }
    INFO(fmt::format("{}", fmt::join(f.stats().retrace_reasons, "; ")));
    CHECK(f.stats().traces == 1);
    CHECK(f.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
  }
}

TEST_CASE("dynamic: reading a symbolic size as an integer specializes it, with the reason") {
  const int line = __LINE__ + 1;  // the reason names the line that read the size
  auto f = compile([](Tensor x) { return x * double(x.size(0)); });
  for (int64_t n : {3, 4, 5}) CHECK(values(f(ones({n, 2}))) == std::vector<double>(2 * n, n));
  const auto r = f.stats().retrace_reasons;
  REQUIRE(r.size() == 3);
  const std::string why = fmt::format(
      "size(0) at test_dynamic.cpp:{} of a tensor of shape (s0, 2) was read as an "
      "integer",
      line);
  CHECK(r[0] == "arg 0 dim 0 changed 3 -> 4: retraced with these dims symbolic");
  CHECK(r[1] == "arg 0 dim 0 made concrete: " + why);
  CHECK(r[2] == "arg 0 dim 0 changed 4 -> 5 (kept concrete: " + why + ")");
  CHECK(f.stats().traces == 4);
  CHECK(f.stats().symbolic_dims.empty());
}

TEST_CASE(
    "dynamic: size 1 is specialized only where broadcasting needs it, and the guard says so") {
  CompileOptions o;
  o.dynamic = {{0, 0}};
  // x (n, 3) + b (3): n stays symbolic at n = 1.
  auto g = compile([](Tensor x, Tensor b) { return x + b; }, o);
  for (int64_t n : {1, 6, 2})
    CHECK(values(g(ones({n, 3}), ones({3}))) == std::vector<double>(3 * n, 2));
  CHECK(g.stats().traces == 1);
  CHECK(g.stats().guards.empty());
  // x (n, 3) + y (4, 3) at n = 1 broadcasts x: the graph holds for n == 1 only.
  auto f = compile([](Tensor x, Tensor y) { return x + y; }, o);
  CHECK(values(f(ones({1, 3}), ones({4, 3}))) == std::vector<double>(12, 2));
  CHECK(f.stats().guards == std::vector<std::string>{"s0 == 1 (add)"});
  CHECK(values(f(ones({4, 3}), ones({4, 3}))) == std::vector<double>(12, 2));
  REQUIRE(f.stats().retrace_reasons.size() == 1);
  CHECK(f.stats().retrace_reasons[0] == "guard s0 == 1 (add) failed at s0 = 4");
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().guards == std::vector<std::string>{"s0 == 4 (add)"});
}

TEST_CASE("dynamic: copy_ keeps symbolic dims, broadcasting a source into them") {
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile(
      [](Tensor x, Tensor b) {
        Tensor y = x * 0;
        y.copy_(x + 1);
        Tensor z = x * 0;
        z.copy_(b);  // b (3) broadcast into (s0, 3)
        return y + z;
      },
      o);
  for (int64_t n : {2, 4, 1, 5}) {
    Tensor x = reshape(arange(3 * n, Options().dtype(DType::f32)), {n, 3});
    Tensor b = arange(3, Options().dtype(DType::f32));
    CHECK(close(f(x, b), x + 1 + b, 0));
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().retrace_reasons.empty());
  CHECK(f.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
}

TEST_CASE("dynamic: calls that alternate grad mode still make a changed dim symbolic") {
  // Each size is seen with and without grad: the changed dim is compared with the most recent
  // entry of the same grad mode, not with the previous call.
  auto f = compile([](Tensor x, Tensor w) { return sum(matmul(x, w)); });
  Tensor w = ones({3, 2}).requires_grad_(true);
  for (int64_t n : {2, 3, 4, 5, 6}) {
    Tensor x = ones({n, 3});
    CHECK(f(x, w).item<float>() == float(6 * n));
    NoGradGuard no_grad;
    CHECK(f(x, w).item<float>() == float(6 * n));
  }
  CHECK(f.stats().traces == 4);
  const auto r = f.stats().retrace_reasons;
  REQUIRE(r.size() == 3);
  CHECK(r[0] == "grad mode changed on -> off");
  CHECK(r[1] == "arg 0 dim 0 changed 2 -> 3: retraced with these dims symbolic");
  CHECK(r[2] == "arg 0 dim 0 changed 2 -> 3: retraced with these dims symbolic");
}

TEST_CASE("dynamic: a graph with a cond, a scan and a symbolic dim prints them") {
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile(
      [](Tensor xs, Tensor h0) {
        std::vector<Tensor> s = scan(
            [](const std::vector<Tensor>& in) {
              Tensor h = tanh(in[0] + in[1]);
              return std::vector<Tensor>{h, h * 2};
            },
            {h0}, {xs});
        return cond(
            sum(s[0]) > 0,
            [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 3}; },
            [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] - 1}; },
            {s[1]})[0];
      },
      o);
  for (int64_t n : {4, 9}) {
    Tensor xs = randn({n, 2}), h0 = zeros({2});
    Tensor y = f(xs, h0);
    CHECK(y.sizes() == Shape{n, 2});
  }
  CHECK(f.stats().traces == 1);
  const std::string s = f.graph().str();
  CHECK(s.find("scan") != std::string::npos);
  CHECK(s.find("cond") != std::string::npos);
  CHECK(s.find("f32[s0, 2]") != std::string::npos);
}

}  // namespace duet::test
