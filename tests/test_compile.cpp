// The compiled face: compile(), the guard cache, compiled backward, training steps, Program, the
// passes (IR before and after, as text), and the errors of traced code.
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "trace/ir/passes.h"
#include "trace/tracer.h"
#include "util.h"

namespace duet::test {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A small MLP as plain tensors, with a hand-written SGD step (nn/optim come later).
struct Mlp {
  std::vector<Tensor> params;
  explicit Mlp(uint64_t seed) {
    manual_seed(seed);
    params = {randn({16, 8}) * 0.3, zeros({16}), randn({4, 16}) * 0.3, zeros({4})};
    for (Tensor& p : params) p = p.detach().requires_grad_();
  }
  Tensor forward(const Tensor& x) const {
    Tensor h = relu(linear(x, params[0], params[1]));
    return linear(h, params[2], params[3]);
  }
  Tensor step(const Tensor& x, const Tensor& y) {
    {
      NoGradGuard ng;
      for (Tensor& p : params)
        if (p.grad().defined()) p.grad().zero_();
    }
    Tensor loss = cross_entropy(forward(x), y);
    loss.backward();
    NoGradGuard ng;
    for (Tensor& p : params) p.sub_(p.grad() * 0.1);
    return loss;
  }
};

TEST_CASE("compile: a function runs compiled, and a second call does not retrace") {
  manual_seed(1);
  Tensor x = randn({3, 5}), y = randn({5});
  auto f = compile([](Tensor a, Tensor b) { return tanh(a * 1.5 + 0.5) * sigmoid(b) + relu(a); });
  Tensor want = tanh(x * 1.5 + 0.5) * sigmoid(y) + relu(x);
  CHECK(close(f(x, y), want));
  CHECK(close(f(x, y), want));
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 1);
  CHECK(f.graph().num_nodes() == 7);
  // New values, same signature: still no retrace, and the new values are used.
  Tensor x2 = randn({3, 5});
  CHECK(close(f(x2, y), tanh(x2 * 1.5 + 0.5) * sigmoid(y) + relu(x2)));
  CHECK(f.stats().traces == 1);
}

TEST_CASE("compile: retraces say why, in words") {
  auto f = compile([](Tensor a, int64_t k) { return a * double(k); });
  f(ones({2, 31}), 2);
  f(ones({2, 32}), 2);
  f(ones({2, 32}).to(DType::f64), 2);
  f(ones({2, 32}).to(DType::f64), 3);
  f(transpose(ones({32, 2}).to(DType::f64), 0, 1), 3);
  {
    NoGradGuard ng;
    f(ones({2, 32}), 2);
  }
  const auto r = f.stats().retrace_reasons;
  REQUIRE(r.size() == 5);
  CHECK(r[0] == "arg 0 dim 1 changed 31 -> 32: retraced with these dims symbolic");
  CHECK(r[1] == "arg 0 dtype changed f32 -> f64");
  CHECK(r[2] == "static argument changed: arg 1 = 2 -> arg 1 = 3");
  CHECK(r[3] == "arg 0 layout changed (contiguous -> strides (1, 2))");
  CHECK(r[4] == "grad mode changed on -> off");
  CHECK(f.stats().traces == 6);
  // A signature seen before is a hit, not a retrace.
  CHECK(close(f(ones({2, 31}), 2), full({2, 31}, 2.0)));
  CHECK(f.stats().traces == 6);
}

// Two non-contiguous layouts of one shape are two signatures: a hit compares each tensor's
// strides with the entry's where the tensor lies (Note [Call overhead]).
TEST_CASE("compile: another non-contiguous layout of one shape retraces") {
  auto f = compile([](Tensor a) { return a.reshape({-1}) * 2.0; });
  const Tensor x = arange(12.0).reshape({3, 4});
  const Tensor t = transpose(x.reshape({4, 3}), 0, 1);               // (3, 4), strides (1, 3)
  const Tensor s = slice(arange(24.0).reshape({3, 8}), 1, 0, 8, 2);  // (3, 4), strides (8, 2)
  CHECK(close(f(t), t.reshape({-1}) * 2.0));
  CHECK(close(f(s), s.reshape({-1}) * 2.0));
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().retrace_reasons.at(0) ==
        "arg 0 layout changed (strides (1, 3) -> strides (8, 2))");
  CHECK(close(f(t), t.reshape({-1}) * 2.0));  // a hit
  CHECK(f.stats().traces == 2);
}

TEST_CASE("compile: tuples and vectors in and out") {
  auto f = compile([](std::vector<Tensor> xs, std::tuple<Tensor, Tensor> p) {
    Tensor s = std::get<0>(p) * std::get<1>(p);
    for (const Tensor& x : xs) s = s + x;
    return std::make_tuple(s, s * 2);
  });
  auto [a, b] = f({ones({2}), ones({2})}, std::make_tuple(full({2}, 3.0), full({2}, 2.0)));
  CHECK(values(a) == std::vector<double>{8, 8});
  CHECK(values(b) == std::vector<double>{16, 16});
  // Another length of the vector is another signature.
  f({ones({2})}, std::make_tuple(full({2}, 3.0), full({2}, 2.0)));
  CHECK(f.stats().retrace_reasons.at(0) ==
        "static argument changed: arg 0 has 2 tensors -> arg 0 has 1 tensors");
  auto g = compile([](Tensor x) { return std::vector<Tensor>{x + 1, x + 2, x + 3}; });
  CHECK(g(zeros({1})).size() == 3);
}

TEST_CASE("compile: outputs are fresh tensors at every call") {
  auto f = compile([](Tensor x) { return x * 2; });
  Tensor a = f(ones({3}));
  Tensor b = f(full({3}, 5.0));
  CHECK(values(a) == std::vector<double>{2, 2, 2});
  CHECK(values(b) == std::vector<double>{10, 10, 10});
  CHECK_FALSE(same_storage(a, b));
}

TEST_CASE("compile: a step after set_grad(Tensor()) writes .grad again, and a new .grad retraces") {
  // The trace captures the leaf's .grad buffer and accumulates into it. A call after the
  // user dropped .grad (PyTorch's zero_grad(set_to_none=True)) once ran into the old buffer
  // and left .grad undefined.
  Tensor p = make({1, -2, 3}, {3});
  p.requires_grad_(true);
  auto step = compile([&p](Tensor s) {
    Tensor loss = sum(p * p * s);
    loss.backward();
    return loss;
  });
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i + 1);
    p.set_grad(Tensor());
    CHECK(step(make({1}, {})).item<double>() == 14);
    REQUIRE(p.grad().defined());
    CHECK(values(p.grad()) == std::vector<double>{2, -4, 6});
  }
  // Kept, .grad accumulates as it does eagerly.
  step(make({1}, {}));
  CHECK(values(p.grad()) == std::vector<double>{4, -8, 12});
  CHECK(step.stats().traces == 1);
  // Another tensor as .grad: the graph would write the old one, so it traces again.
  p.set_grad(zeros({3}));
  step(make({1}, {}));
  CHECK(values(p.grad()) == std::vector<double>{2, -4, 6});
  CHECK(step.stats().traces == 2);
  REQUIRE(!step.stats().retrace_reasons.empty());
  CHECK(contains(step.stats().retrace_reasons.back(), ".grad of a captured tensor"));
}

TEST_CASE("compile: backward through compiled outputs matches eager") {
  Mlp m(3);
  manual_seed(4);
  Tensor x = randn({6, 8});
  Tensor y = tensor({0, 1, 2, 3, 1, 0}, Options().dtype(DType::i64));
  auto fwd = compile([&](Tensor in) { return m.forward(in); });
  Tensor loss = cross_entropy(fwd(x), y);
  loss.backward();
  std::vector<Tensor> got;
  for (Tensor& p : m.params) {
    got.push_back(p.grad().clone());
    p.set_grad(Tensor());
  }
  cross_entropy(m.forward(x), y).backward();
  for (size_t i = 0; i < got.size(); ++i) CHECK(close(got[i], m.params[i].grad(), 1e-5));
  // The second call hits, and the compiled backward runs again.
  for (Tensor& p : m.params) p.grad().zero_();
  cross_entropy(fwd(x), y).backward();
  for (size_t i = 0; i < got.size(); ++i) CHECK(close(got[i], m.params[i].grad(), 1e-5));
  CHECK(fwd.stats().traces == 1);
  // Gradients with respect to arguments, through duet::grad.
  Tensor xr = x.clone().requires_grad_();
  Tensor gx = grad({sum(fwd(xr))}, {xr})[0];
  Tensor ge = grad({sum(m.forward(xr))}, {xr})[0];
  CHECK(close(gx, ge, 1e-5));
  // The compiled backward frees its saved values like any node.
  Tensor out = sum(fwd(xr));
  out.backward();
  CHECK(error_of([&] { out.backward(); }).find("second time") != std::string::npos);
}

TEST_CASE("compile: an output that its own gradient saves is freed without a backward") {
  // tanh's gradient reads tanh's result, so the compiled forward saves its output. Saving the
  // output's own handle made a cycle (output -> grad_fn -> saved -> output): an output never
  // backpropagated leaked, with everything its history held.
  auto f = compile([](const Tensor& x) { return tanh(x * 2); });
  Tensor x = randn({4, 3}).requires_grad_();
  for (int call = 0; call < 3; ++call) {
    Tensor y = f(x);
    REQUIRE(y.requires_grad());
    CHECK(y.impl_ptr().use_count() == 1);  // only y: the saved value is an alias
  }
  // The gradient still reads the saved value, and a write to the output after the call is
  // still caught when backward reads it.
  Tensor y = f(x);
  sum(y).backward();
  Tensor want = (1 - tanh(x * 2) * tanh(x * 2)) * 2;
  CHECK(close(x.grad(), want.detach(), 1e-6));
  Tensor z = f(x);
  {
    NoGradGuard no_grad;
    z.mul_(2);
  }
  CHECK(contains(error_of([&] { sum(z).backward(); }), "modified in place"));
}

TEST_CASE("compile: gradcheck works on a compiled function") {
  auto f = compile([](std::vector<Tensor> in) {
    return sum(tanh(matmul(in[0], in[1])) * sigmoid(sum(in[0], Dims{1}, true)));
  });
  manual_seed(5);
  Tensor a = randn({3, 4}, Options().dtype(DType::f64)).requires_grad_();
  Tensor b = randn({4, 2}, Options().dtype(DType::f64)).requires_grad_();
  GradcheckResult r = gradcheck([&](const std::vector<Tensor>& in) { return f(in); }, {a, b});
  CHECK_MESSAGE(r, r.message);
}

TEST_CASE("compile: 20 compiled SGD steps equal 20 eager steps, in place, one trace") {
  Mlp eager(7), compiled(7);
  manual_seed(8);
  Tensor x = randn({10, 8});
  Tensor y = randint(4, {10});
  std::vector<void*> storage;
  for (const Tensor& p : compiled.params) storage.push_back(p.raw_data());
  auto step = compile([&](Tensor in, Tensor target) { return compiled.step(in, target); });
  for (int i = 0; i < 20; ++i) {
    Tensor le = eager.step(x, y);
    Tensor lc = step(x, y);
    CHECK_MESSAGE(close(le, lc, 1e-6), "step ", i, ": ", le.item<float>(), " vs ",
                  lc.item<float>());
  }
  for (size_t i = 0; i < eager.params.size(); ++i) {
    CHECK(close(eager.params[i], compiled.params[i], 1e-5));
    CHECK(compiled.params[i].raw_data() == storage[i]);  // updated in place
    CHECK(close(eager.params[i].grad(), compiled.params[i].grad(), 1e-5));
  }
  CHECK(step.stats().traces == 1);
  CHECK(step.stats().hits == 19);
}

TEST_CASE("compile: gradients accumulate across calls without zero_grad, as in eager") {
  Tensor w = ones({3}).requires_grad_();
  auto f = compile([&](Tensor x) {
    Tensor l = sum(w * x);
    l.backward();
    return l.detach();
  });
  f(full({3}, 2.0));
  CHECK(values(w.grad()) == std::vector<double>{2, 2, 2});
  f(full({3}, 3.0));
  CHECK(values(w.grad()) == std::vector<double>{5, 5, 5});
  CHECK(f.stats().traces == 1);
}

TEST_CASE("compile: the RNG state is captured and advanced, so dropout draws as eager does") {
  Tensor x = ones({4, 6});
  auto f = compile([](Tensor a) { return dropout(a, 0.5, true); });
  manual_seed(11);
  Tensor e1 = dropout(x, 0.5, true), e2 = dropout(x, 0.5, true);
  manual_seed(11);
  Tensor c1 = f(x), c2 = f(x);
  CHECK(bitwise_equal(e1, c1));
  CHECK(bitwise_equal(e2, c2));
  CHECK_FALSE(bitwise_equal(c1, c2));
  CHECK(f.stats().traces == 1);
}

TEST_CASE("compile: item() inside a traced function names the call site and cond/scan") {
  auto f = compile([](Tensor x) {
    if (sum(x).item<float>() > 0) return x * 2;  // a branch on data
    return x;
  });
  std::string e = error_of([&] { f(ones({2})); });
  CHECK(e.find("[item]") == 0);
  CHECK(e.find("test_compile.cpp:") != std::string::npos);
  CHECK(e.find("duet::cond") != std::string::npos);
  CHECK(e.find("duet::scan") != std::string::npos);
  auto g = compile([](Tensor x) { return x * double(x.to_vector<float>()[0]); });
  CHECK(error_of([&] { g(ones({2})); }).find("[to_vector]") == 0);
}

TEST_CASE("compile: a tensor that escapes its trace is an error naming the function") {
  Tensor w = ones({2});
  auto f = compile([&](Tensor g) {
    w = w - g * 0.1;  // rebinds the captured tensor instead of updating it in place
    return sum(w);
  });
  f(ones({2}));
  std::string e = error_of([&] { Tensor z = w + 1; });
  CHECK(e.find("[add]") == 0);
  CHECK(e.find("compiled function at test_compile.cpp:") != std::string::npos);
  CHECK(e.find("in place") != std::string::npos);
  CHECK(error_of([&] { w.item<float>(); }).find("after that trace ended") != std::string::npos);
}

TEST_CASE("compile: writing an argument in place is an error, not a lost update") {
  auto f = compile([](Tensor x) {
    x.add_(1);
    return x;
  });
  std::string e = error_of([&] { f(ones({2})); });
  CHECK(e.find("[add_]") == 0);
  CHECK(e.find("argument") != std::string::npos);
}

TEST_CASE("compile: in-place updates of captured tensors are written back") {
  Tensor state = zeros({3});
  Tensor counter = zeros({}, Options().dtype(DType::i64));
  auto f = compile([&](Tensor x) {
    state.mul_(0.5).add_(x);
    counter.add_(1);
    return state * 1;
  });
  f(full({3}, 2.0));
  Tensor r = f(full({3}, 2.0));
  CHECK(values(state) == std::vector<double>{3, 3, 3});
  CHECK(values(r) == std::vector<double>{3, 3, 3});
  CHECK(counter.item<int64_t>() == 2);
  CHECK(f.graph().writebacks.size() == 2);
}

// What the process writes to stderr while it lives (a warning), read back as text.
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()), saved_(dup(2)) {
    std::fflush(stderr);
    dup2(fileno(file_), 2);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    for (int c; (c = std::fgetc(file_)) != EOF;) out += static_cast<char>(c);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_;
};

size_t count_of(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// Note [Arguments that share memory with written captures]: a tensor that is, or views, one
// the function writes in place (here the .grad its backward accumulates into) is read after
// that write eagerly; its plan would read it before. Such calls run eagerly, the others stay
// compiled.
TEST_CASE("compile: an argument sharing memory with a captured tensor it writes runs eagerly") {
  auto run = [](bool compiled) {
    Tensor w = tensor({1.0, 2.0, 3.0}).requires_grad_();
    auto body = [&](Tensor x) {
      Tensor loss = (w * x).sum();
      loss.backward();
      return x + 1;
    };
    auto f = compile(body);
    auto call = [&](const Tensor& x) { return compiled ? f(x) : body(x); };
    std::vector<std::vector<double>> seen;
    StderrCapture err;
    // The first call already shares memory: w.grad from an eager backward.
    (w * ones({3})).sum().backward();
    seen.push_back(values(call(w.grad())));
    seen.push_back(values(call(w.grad().slice(0, 0, 3))));  // a view of it
    seen.push_back(values(call(full({3}, 2.0))));           // apart from it: compiled
    seen.push_back(values(call(w.grad())));                 // a hit's entry, shared again
    seen.push_back(values(w.grad()));
    const std::string printed = err.text();
    if (compiled) {
      CHECK(f.stats().traces == 1);
      CHECK(f.stats().eager_calls == 3);
      CHECK(f.stats().eager_reason.find("arg 0 shares memory with a tensor the function "
                                        "captures and writes in place") == 0);
      CHECK(count_of(printed, "such calls run eagerly") == 1);
    }
    return seen;
  };
  CHECK(run(true) == run(false));
}

// Where the trace reads its arguments before writing any captured tensor, eager reads see the
// values the call began with: the overlapping argument is copied as the call begins, and the
// call stays compiled.
TEST_CASE("compile: an argument sharing a written capture, read before the write, stays compiled") {
  Tensor state = tensor({1.0, 2.0});
  auto f = compile([&](Tensor x) {
    Tensor y = x * 2.0;
    state.mul_(10);
    return y;
  });
  CHECK(values(f(full({2}, 3.0))) == std::vector<double>{6, 6});
  CHECK(values(f(state)) == std::vector<double>{20, 40});  // eagerly: state * 2, then the write
  CHECK(values(state) == std::vector<double>{100, 200});
  CHECK(values(f(state.slice(0, 0, 2))) == std::vector<double>{200, 400});
  CHECK(values(state) == std::vector<double>{1000, 2000});
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().hits == 2);
  CHECK(f.stats().eager_calls == 0);
}

// A captured tensor the function only reads may be an argument too: no overlap to guard.
TEST_CASE("compile: an argument that is a captured tensor it only reads stays compiled") {
  Tensor b = tensor({1.0, 2.0});
  auto f = compile([&](Tensor x) { return x * b; });
  f(ones({2}));
  CHECK(values(f(b)) == std::vector<double>{1, 4});
  CHECK(f.stats().hits == 1);
  CHECK(f.stats().eager_calls == 0);
}

// Note [Flags a trace read]: eval() after a trace in training mode traces again (dropout off,
// running statistics), and train() finds the first trace again.
TEST_CASE("compile: a module's training flag is guarded: eval() traces again, train() hits") {
  manual_seed(5);
  nn::BatchNorm1d bn(4);
  nn::Dropout drop(0.5);
  auto body = [&](Tensor x) { return drop(bn(x)); };
  auto f = compile(body);
  const Tensor x = randn({6, 4});
  f(x);  // training: batch statistics, dropout, the running statistics updated
  bn.eval();
  drop.eval();
  CHECK(close(f(x), body(x)));
  CHECK(f.stats().traces == 2);
  REQUIRE(f.stats().retrace_reasons.size() == 1);
  CHECK(f.stats().retrace_reasons[0].find("training flag changed true -> false") !=
        std::string::npos);
  const CacheExplanation why = f.explain();
  REQUIRE(why.entries.size() == 2);
  REQUIRE(why.entries[1].flags.size() == 2);  // named by the modules' reprs
  CHECK(why.entries[1].flags[0].starts_with("module BatchNorm1d(4, "));
  CHECK(why.entries[1].flags[1] == "module Dropout(p=0.5)'s training flag: false");
  CHECK(why.entries[0].flags[1] == "module Dropout(p=0.5)'s training flag: true");
  bn.train();
  drop.train();
  f(x);
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().hits == 1);
}

// A post-accumulate-grad hook runs as ops of the traced backward: one added after the trace
// traces again (it was ignored: the gradient came out twice what eager gives), and its removal
// finds the first trace again.
TEST_CASE("compile: a hook added to a captured leaf after the trace traces again") {
  auto run = [](bool compiled) {
    Tensor w = tensor({1.0, 2.0}).requires_grad_();
    auto body = [&](Tensor x) {
      Tensor l = (w * x).sum();
      l.backward();
      return l;
    };
    auto f = compile(body);
    const Tensor x = tensor({3.0, 4.0});
    auto call = [&] { compiled ? f(x) : body(x); };
    std::vector<std::vector<double>> seen;
    call();
    const int64_t h = w.register_post_accumulate_grad_hook([](const Tensor& p) {
      NoGradGuard ng;
      p.grad().mul_(0.5);
    });
    call();
    seen.push_back(values(w.grad()));
    w.remove_post_accumulate_grad_hook(h);
    call();
    seen.push_back(values(w.grad()));
    if (compiled) {
      CHECK(f.stats().traces == 2);
      CHECK(f.stats().hits == 1);
      REQUIRE(f.stats().retrace_reasons.size() == 1);
      CHECK(f.stats().retrace_reasons[0].find("post-accumulate-grad hook") != std::string::npos);
    }
    return seen;
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("compile: cache_limit falls back to eager, warns once and records why") {
  CompileOptions o;
  o.cache_limit = 2;
  auto f = compile([](Tensor x) { return x + 1; }, o);
  StderrCapture err;
  f(ones({1}));
  f(ones({1, 1}));
  Tensor r = f(ones({3, 1, 1}));  // each rank is a signature: a third one runs eagerly
  f(ones({1, 1, 1, 1}));
  f(ones({1}));  // a cached signature stays compiled
  const std::string printed = err.text();
  CHECK(values(r) == std::vector<double>{2, 2, 2});
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().hits == 1);
  CHECK(f.stats().eager_calls == 2);
  CHECK(f.stats().eager_reason ==
        "cache_limit of 2 signatures reached; this call: arg 0 rank changed 2 -> 3 (shape (1, 1) "
        "-> (3, 1, 1))");
  CHECK(count_of(printed, "reached its cache_limit of 2 signatures") == 1);
}

TEST_CASE("compile: on_miss = eager runs new signatures eagerly, on_miss = error says why") {
  CompileOptions o;
  o.on_miss = OnMiss::Eager;
  auto f = compile([](Tensor x) { return x * 2.0; }, o);
  f(ones({2}));
  CHECK(values(f(ones({3}))) == std::vector<double>{2, 2, 2});
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().eager_calls == 1);
  CHECK(f.stats().eager_reason ==
        "on_miss = eager; this call: arg 0 dim 0 changed 2 -> 3: "
        "retraced with these dims symbolic");
  o.on_miss = OnMiss::Error;
  auto g = compile([](Tensor x) { return x * 2.0; }, o);
  g(ones({2}));
  const std::string e = error_of([&] { (void)g(ones({2, 2})); });
  CHECK(contains(e,
                 "matches none of its 1 cached signature, and its on_miss is error: arg 0 "
                 "rank changed 1 -> 2"));
  CHECK(values(g(ones({2}))) == std::vector<double>{2, 2});  // the cached one still runs
  CHECK(g.stats().traces == 1);
  CHECK(g.stats().hits == 1);
}

TEST_CASE("compile: a dim that makes a second retrace warns once, pointing to dynamic") {
  // Reading size(0) as an integer keeps dim 0 concrete: each new batch size traces again.
  auto f = compile([](Tensor x) { return x * static_cast<double>(x.size(0)); });
  StderrCapture err;
  for (int64_t b : {2, 3, 4, 5}) CHECK(values(f(ones({b, 2})))[0] == static_cast<double>(b));
  const std::string printed = err.text();
  // 2, then 3 (traced with dim 0 symbolic, and again concrete), 4 and 5.
  CHECK(f.stats().traces == 5);
  CHECK(count_of(printed, "changed again") == 1);
  CHECK(contains(printed, "arg 0 dim 0 changed again (now 4)"));
  CHECK(contains(printed, "CompileOptions::dynamic = {{0, 0}}"));
  CHECK(contains(printed, "was kept concrete"));
}

TEST_CASE("compile: stats() times each signature: trace, passes, plan, first call, median") {
  auto f = compile([](Tensor x) { return tanh(x * 2.0) + 1.0; });
  const Tensor a = ones({8}), b = ones({2, 8});
  for (int i = 0; i < 5; ++i) f(a);
  f(b);
  const std::vector<SignatureStats> s = f.stats().signatures;
  REQUIRE(s.size() == 2);
  CHECK(s[0].signature == "arg 0: f32 (8) cpu");
  CHECK(s[1].signature == "arg 0: f32 (2, 8) cpu");
  CHECK(s[0].calls == 4);  // the first call traced it
  CHECK(s[1].calls == 0);
  for (const SignatureStats& t : s) {
    CHECK(t.trace_ms > 0);
    CHECK(t.optimize_ms > 0);
    CHECK(t.plan_ms > 0);
    CHECK(t.first_call_ms >= t.trace_ms + t.optimize_ms + t.plan_ms);
    CHECK(t.codegen_ms == 0);  // no NVRTC on the CPU; its kernels build in the background
  }
  CHECK(s[0].steady_median_us > 0);
  CHECK(s[0].steady_median_us < s[0].first_call_ms * 1e3);
  CHECK(s[1].steady_median_us == 0);
}

// Past its first calls, one call in Entry::kTimeEvery is timed (Note [Call overhead]): every
// call still counts, the median stays, and a plan for new sizes built in an untimed call is
// timed from its own start.
TEST_CASE("compile: a long run of calls keeps its counts and times") {
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([](Tensor x) { return tanh(x * 2.0) + 1.0; }, o);
  const Tensor a = ones({8});
  for (int i = 0; i < 203; ++i) f(a);  // the 203rd call (the 202nd cached) is not timed
  CHECK(f.stats().signatures.at(0).calls == 202);
  CHECK(f.stats().signatures.at(0).steady_median_us > 0);
  f(ones({5}));  // a new size of the symbolic dim: a plan built in an untimed call
  const CompileStats s = f.stats();
  CHECK(s.traces == 1);
  CHECK(s.plans_built == 2);
  CHECK(s.new_size_ms > 0);
  CHECK(s.new_size_ms >= s.plan_ms);
  CHECK(s.new_size_ms < 1e4);  // from the plan's start, not from a clock of zero
}

TEST_CASE("compile: explain() lists the entries, their guards, the retraces and why") {
  auto f = compile([](Tensor x, Tensor y) { return squeeze(x, {1}) + y; });
  f(ones({4, 1}), ones({4}));
  f(ones({5, 1}), ones({5}));  // dim 0 of both changed: symbolic
  const CacheExplanation x = f.explain();
  REQUIRE(x.entries.size() == 2);
  CHECK(x.traces == 2);
  CHECK(x.entries[0].args ==
        std::vector<std::string>{"arg 0: f32 (4, 1) cpu", "arg 1: f32 (4) cpu"});
  CHECK(x.entries[1].args ==
        std::vector<std::string>{"arg 0: f32 (s0, 1) cpu", "arg 1: f32 (s0) cpu"});
  CHECK(x.entries[1].symbolic_dims ==
        std::vector<std::string>{"arg 0 dim 0: s0", "arg 1 dim 0: s0"});
  REQUIRE(x.retraces.size() == 1);
  CHECK(contains(x.retraces[0], "arg 0 dim 0 changed 4 -> 5"));
  const std::string text = x.str();
  CHECK(contains(text, "2 traces, 0 cache hits, 0 eager calls"));
  CHECK(contains(text, "entry 2 (grad mode on):\n  arg 0: f32 (s0, 1) cpu\n"));
  CHECK(contains(text, "retrace 1: arg 0 dim 0 changed 4 -> 5"));
}

TEST_CASE("compile: options and graph() are checked") {
  CompileOptions o;
  o.disable_passes = {"cse", "nonsense"};
  CHECK(error_of([&] { compile([](Tensor x) { return x; }, o); }).find("nonsense") !=
        std::string::npos);
  auto f = compile([](Tensor x) { return x; });
  CHECK(error_of([&] { f.graph(); }).find("has not been called") != std::string::npos);
}

TEST_CASE("compile: a compiled function called while tracing is inlined") {
  auto inner = compile([](Tensor x) { return exp(x); });
  auto outer = compile([&](Tensor x) { return inner(x) + 1; });
  CHECK(close(outer(zeros({2})), full({2}, 2.0)));
  CHECK(outer.graph().num_nodes() == 2);
  CHECK(inner.stats().traces == 0);
}

TEST_CASE("compile: scopes label nodes; str() and dot() show them") {
  auto f = compile([](Tensor x) {
    Tensor h;
    {
      auto s = scope("encoder");
      h = tanh(x);
    }
    return h * 3;
  });
  f(ones({2}));
  std::string s = f.graph().str();
  CHECK(s.find("tanh(%0) : f32[2]  @encoder") != std::string::npos);
  CHECK(f.graph().dot().find("digraph") == 0);
  CHECK(f.graph().dot().find("@encoder") != std::string::npos);
}

TEST_CASE("Program: the TF-1 seed example, with gradients and an intermediate fetched") {
  Program p([] {
    Tensor x1 = placeholder({2}, DType::f32, "X1");
    Tensor x2 = placeholder({2}, DType::f32, "X2");
    Tensor prod = name(x1 * x2, "prod");
    Tensor y = name((prod + x1) / x2, "Y");
    std::vector<Tensor> g = grad({sum(y)}, {x1, x2});
    return std::vector<Tensor>{y, g[0], g[1]};
  });
  std::map<std::string, Tensor> feeds{{"X1", tensor({1, 2})}, {"X2", tensor({3, 4})}};
  std::vector<Tensor> r = p.run(feeds);
  REQUIRE(r.size() == 3);
  // y = (x1 x2 + x1) / x2; dy/dx1 = (x2 + 1) / x2; dy/dx2 = -x1 / x2^2
  CHECK(close(r[0], tensor({4.0 / 3, 10.0 / 4})));
  CHECK(close(r[1], tensor({4.0 / 3, 5.0 / 4})));
  CHECK(close(r[2], tensor({-1.0 / 9, -2.0 / 16})));
  std::vector<Tensor> f = p.run(feeds, {"prod", "out1", "X2"});
  CHECK(close(f[0], tensor({3, 8})));
  CHECK(close(f[1], r[1]));
  CHECK(close(f[2], tensor({3, 4})));
  // Feeding only what the fetched nodes need.
  CHECK(
      close(p.run({{"X1", tensor({1, 2})}, {"X2", tensor({3, 4})}}, {"prod"})[0], tensor({3, 8})));
}

// A feed is a value: one that is a captured tensor the program updates in place is read as it
// was when run() began, whichever order the plan gives the read and the write.
TEST_CASE("Program: a feed that shares memory with a tensor the program writes is its old value") {
  Tensor state = tensor({1.0, 2.0});
  Program p([&] {
    Tensor x = placeholder({2}, DType::f32, "X");
    state.mul_(10);
    return std::vector<Tensor>{name(x + 1, "Y")};
  });
  CHECK(values(p.run({{"X", full({2}, 5.0)}})[0]) == std::vector<double>{6, 6});
  CHECK(values(state) == std::vector<double>{10, 20});
  CHECK(values(p.run({{"X", state}})[0]) == std::vector<double>{11, 21});
  CHECK(values(state) == std::vector<double>{100, 200});
}

TEST_CASE("Program: feed and fetch errors name the placeholder") {
  Program p([] {
    Tensor a = placeholder({2, 3}, DType::f32, "a");
    Tensor b = placeholder({3}, DType::f32, "b");
    return std::vector<Tensor>{a + b};
  });
  Tensor a = ones({2, 3}), b = ones({3});
  CHECK(error_of([&] { p.run({{"a", a}}); }).find("placeholder \"b\"") != std::string::npos);
  CHECK(error_of([&] {
          p.run({{"a", a}, {"b", ones({4})}});
        }).find("placeholder \"b\" expects shape (3), fed shape (4)") != std::string::npos);
  CHECK(error_of([&] {
          p.run({{"a", a}, {"b", b.to(DType::f64)}});
        }).find("placeholder \"b\" expects dtype f32, fed f64") != std::string::npos);
  CHECK(error_of([&] {
          p.run({{"a", a}, {"b", b}}, {"nope"});
        }).find("\"nope\"") != std::string::npos);
  CHECK(error_of([&] {
          p.run({{"a", a}, {"b", b}, {"c", b}});
        }).find("\"c\"") != std::string::npos);
  CHECK(error_of([] { placeholder({1}, DType::f32, "x"); }).find("Program builder") !=
        std::string::npos);
}

// ---- passes: IR before and after, as text ----

// Traces fn on contiguous f32 inputs of the given shapes into a graph.
Graph trace_graph(const std::vector<Shape>& shapes,
                  const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn) {
  detail::Tracer tr("test");
  std::vector<Tensor> outs;
  {
    std::vector<Tensor> in;
    for (const Shape& s : shapes) in.push_back(tr.input(InputRole::Argument, zeros(s)));
    ModeGuard g(&tr);
    outs = fn(in);
  }
  tr.finish(outs);
  Graph g = std::move(tr.graph());
  g.label.clear();
  // The pass tables below compare whole graphs; call sites have tests of their own.
  for (GraphNode& n : g.nodes) n.site = {};
  return g;
}

TEST_CASE("passes: dce removes what no output needs") {
  Graph g = trace_graph({{2}}, [](const std::vector<Tensor>& in) {
    Tensor unused = exp(in[0]);
    return std::vector<Tensor>{tanh(in[0])};
  });
  CHECK(g.str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  %1 = exp(%0) : f32[2]\n"
        "  %2 = tanh(%0) : f32[2]\n"
        "  return %2\n");
  CHECK(detail::dce(g).str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  %1 = tanh(%0) : f32[2]\n"
        "  return %1\n");
}

TEST_CASE("passes: cse merges equal nodes") {
  Graph g = trace_graph({{2}, {2}}, [](const std::vector<Tensor>& in) {
    Tensor a = in[0] * in[1];
    Tensor b = in[0] * in[1];
    return std::vector<Tensor>{a + b, in[0] * in[1]};
  });
  CHECK(g.str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  %1 = arg 1 : f32[2]\n"
        "  %2 = mul(%0, %1) : f32[2]\n"
        "  %3 = mul(%0, %1) : f32[2]\n"
        "  %4 = add(%2, %3) : f32[2]\n"
        "  %5 = mul(%0, %1) : f32[2]\n"
        "  return %4, %5\n");
  CHECK(detail::dce(detail::cse(g)).str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  %1 = arg 1 : f32[2]\n"
        "  %2 = mul(%0, %1) : f32[2]\n"
        "  %3 = add(%2, %2) : f32[2]\n"
        "  return %3, %2\n");
}

TEST_CASE("passes: fold evaluates ops on constants") {
  Graph g = trace_graph({{2}}, [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] * sqrt(neg(full({}, -4.0, Options().dtype(DType::f64))) + 5)};
  });
  CHECK(g.str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  %1 = full() {dtype=f64 value=-4} : f64[]\n"
        "  %2 = neg(%1) : f64[]\n"
        "  %3 = constant 5 : i64[]\n"
        "  %4 = add(%2, %3) : f64[]\n"
        "  %5 = sqrt(%4) : f64[]\n"
        "  %6 = mul(%0, %5) : f32[2]\n"
        "  return %6\n");
  CHECK(detail::dce(detail::fold(g)).str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  %1 = constant 3 : f64[]\n"
        "  %2 = mul(%0, %1) : f32[2]\n"
        "  return %2\n");
}

TEST_CASE("passes: simplify removes identities") {
  Graph g = trace_graph({{2, 3}}, [](const std::vector<Tensor>& in) {
    Tensor x = in[0] * 1 + 0;
    Tensor t = transpose(transpose(x, 0, 1), 0, 1);
    Tensor r = reshape(reshape(t, {3, 2}), {6});
    return std::vector<Tensor>{neg(neg(r)) / 1.0, in[0] - 0};
  });
  CHECK(g.str() ==
        "  %0 = arg 0 : f32[2, 3]\n"
        "  %1 = constant 1 : i64[]\n"
        "  %2 = mul(%0, %1) : f32[2, 3]\n"
        "  %3 = constant 0 : i64[]\n"
        "  %4 = add(%2, %3) : f32[2, 3]\n"
        "  %5 = permute(%4) {dims=[1, 0]} : f32[3, 2]\n"
        "  %6 = permute(%5) {dims=[1, 0]} : f32[2, 3]\n"
        "  %7 = reshape(%6) {shape=[3, 2]} : f32[3, 2]\n"
        "  %8 = reshape(%7) {shape=[6]} : f32[6]\n"
        "  %9 = neg(%8) : f32[6]\n"
        "  %10 = neg(%9) : f32[6]\n"
        "  %11 = constant 1 : f64[]\n"
        "  %12 = div(%10, %11) : f32[6]\n"
        "  %13 = constant 0 : i64[]\n"
        "  %14 = sub(%0, %13) : f32[2, 3]\n"
        "  return %12, %14\n");
  // x + 0 stays on floats: -0.0 + 0 is +0.0 (IEEE), so it is not x at x = -0.0; x - 0 goes.
  CHECK(detail::dce(detail::simplify(g)).str() ==
        "  %0 = arg 0 : f32[2, 3]\n"
        "  %1 = constant 0 : i64[]\n"
        "  %2 = add(%0, %1) : f32[2, 3]\n"
        "  %3 = reshape(%2) {shape=[6]} : f32[6]\n"
        "  return %3, %0\n");
  // x + -0.0 is x for every x (NaN and both zeros included): it goes.
  Graph h = trace_graph(
      {{2}}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + -0.0}; });
  CHECK(detail::dce(detail::simplify(h)).str() ==
        "  %0 = arg 0 : f32[2]\n"
        "  return %0\n");
}

TEST_CASE("passes: simplify computes a transposed product in the layout it is read in") {
  // The weight gradient of a linear layer: (x^T dy)^T, read only transposed.
  Graph g = trace_graph({{4, 3}, {4, 5}}, [](const std::vector<Tensor>& in) {
    Tensor w_grad = transpose(matmul(transpose(in[0], 0, 1), in[1]), 0, 1);
    Tensor shared = matmul(in[0], transpose(in[0], 0, 1));  // also read untransposed: kept
    return std::vector<Tensor>{w_grad, shared + transpose(shared, 0, 1)};
  });
  CHECK(detail::dce(detail::simplify(g)).str() ==
        "  %0 = arg 0 : f32[4, 3]\n"
        "  %1 = arg 1 : f32[4, 5]\n"
        "  %2 = permute(%1) {dims=[1, 0]} : f32[5, 4]\n"
        "  %3 = matmul(%2, %0) : f32[5, 3]\n"
        "  %4 = permute(%0) {dims=[1, 0]} : f32[3, 4]\n"
        "  %5 = matmul(%0, %4) : f32[4, 4]\n"
        "  %6 = permute(%5) {dims=[1, 0]} : f32[4, 4]\n"
        "  %7 = add(%5, %6) : f32[4, 4]\n"
        "  return %3, %7\n");
  manual_seed(3);
  Tensor x = randn({4, 3}), dy = randn({4, 5});
  auto f =
      compile([](Tensor a, Tensor b) { return transpose(matmul(transpose(a, 0, 1), b), 0, 1); });
  Tensor y = f(x, dy);
  CHECK(y.is_contiguous());
  CHECK(close(y, transpose(matmul(transpose(x, 0, 1), dy), 0, 1), 1e-6));
}

TEST_CASE("passes: simplify reads a fill of an op's whole shape as a 0-d fill") {
  // zero_grad()'s zeroed .grad accumulated into, and a scale of the batch's shape: the fills
  // become 0-d (Note [Fills as operands]). A fill of another dtype, or one that gives the result
  // its shape, is kept as it is: its promotion or its shape would change.
  Graph g = trace_graph({{2, 3}, {3}}, [](const std::vector<Tensor>& in) {
    Tensor acc = zeros({2, 3}) + in[0];
    Tensor scaled = full({2, 3}, 0.25) * in[0];
    Tensor wider = in[1] * full({2, 3}, 2.0);  // in[1] alone is (3): kept
    Tensor promoted = in[0] + zeros({2, 3}, Options().dtype(DType::f64));  // f64: kept
    return std::vector<Tensor>{acc, scaled, wider, promoted};
  });
  CHECK(detail::dce(detail::simplify(g)).str() ==
        "  %0 = arg 0 : f32[2, 3]\n"
        "  %1 = arg 1 : f32[3]\n"
        "  %2 = full() {dtype=f32 value=0} : f32[]\n"
        "  %3 = add(%2, %0) : f32[2, 3]\n"
        "  %4 = full() {dtype=f32 value=0.25} : f32[]\n"
        "  %5 = mul(%4, %0) : f32[2, 3]\n"
        "  %6 = full() {shape=[2, 3] dtype=f32 value=2} : f32[2, 3]\n"
        "  %7 = mul(%1, %6) : f32[2, 3]\n"
        "  %8 = full() {shape=[2, 3] dtype=f64 value=0} : f64[2, 3]\n"
        "  %9 = add(%0, %8) : f64[2, 3]\n"
        "  return %3, %5, %7, %9\n");
  // Compiled and eager agree bit for bit, -0.0 included (+0.0 + -0.0 is +0.0 either way).
  auto f = compile([](Tensor x) {
    return std::vector<Tensor>{zeros({2, 3}) + x, full({2, 3}, 0.25) * x};
  });
  Tensor x = tensor({-0.0, 1, -2, 3.5, 0, -1e-30}, {2, 3});
  std::vector<Tensor> got = f(x);
  CHECK(bitwise_equal(got[0], zeros({2, 3}) + x));
  CHECK(bitwise_equal(got[1], full({2, 3}, 0.25) * x));
}

TEST_CASE("passes: simplify sums disjoint slice writes as one concatenation") {
  // Note [Sums of slice writes]: the gradient of a tensor read as slices (a packed qkv
  // weight) sums each slice's gradient written into zeros of the whole.
  auto writes = [](const std::vector<Tensor>& in, int parts) {
    const Tensor z = zeros({6, 4});
    Tensor s = slice_scatter(z, in[0], 0, 0, 2) + slice_scatter(z, in[1], 0, 2, 4);
    return parts == 3 ? s + slice_scatter(z, in[2], 0, 4, 6) : s;
  };
  Graph g = trace_graph({{2, 4}, {2, 4}, {2, 4}}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{writes(in, 3)};
  });
  CHECK(detail::dce(detail::simplify(g)).str() ==
        "  %0 = arg 0 : f32[2, 4]\n"
        "  %1 = arg 1 : f32[2, 4]\n"
        "  %2 = arg 2 : f32[2, 4]\n"
        "  %3 = full() {dtype=f32 value=0} : f32[]\n"
        "  %4 = add(%0, %3) : f32[2, 4]\n"
        "  %5 = add(%1, %3) : f32[2, 4]\n"
        "  %6 = full() {dtype=f32 value=0} : f32[]\n"
        "  %7 = add(%2, %6) : f32[2, 4]\n"
        "  %8 = cat(%4, %5, %7) {shape=[2, 2, 2]} : f32[6, 4]\n"
        "  return %8\n");
  // Two of three rows: writes into one fill. Overlapping slices, or a fill of another value,
  // stay sums.
  Graph two = trace_graph({{2, 4}, {2, 4}}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{writes(in, 2)};
  });
  const std::string two_str = detail::dce(detail::simplify(two)).str();
  CAPTURE(two_str);
  CHECK(two_str.find(" cat(") == std::string::npos);
  CHECK(two_str.find(" add(%0") != std::string::npos);
  CHECK(two_str.find("slice_scatter(%") != std::string::npos);
  Graph overlap = trace_graph({{2, 4}, {2, 4}}, [](const std::vector<Tensor>& in) {
    const Tensor z = zeros({6, 4});
    return std::vector<Tensor>{
        slice_scatter(z, in[0], 0, 0, 2) + slice_scatter(z, in[1], 0, 1, 3),
        slice_scatter(ones({6, 4}), in[0], 0, 0, 2) + slice_scatter(z, in[1], 0, 2, 4)};
  });
  const std::string overlap_str = detail::dce(detail::simplify(overlap)).str();
  auto count = [&](const std::string& what) {
    int k = 0;
    for (size_t at = overlap_str.find(what); at != std::string::npos;
         at = overlap_str.find(what, at + 1))
      ++k;
    return k;
  };
  CAPTURE(overlap_str);
  CHECK(count(" cat(") == 0);
  CHECK(count("slice_scatter(") == 4);
  CHECK(count(" add(") == 2);
  // Compiled and eager agree bit for bit, -0.0 included (each value is x + 0.0 either way); a
  // packed parameter's gradient through its slices is a concatenation in the compiled graph.
  for (DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    auto typed = [dt](const std::vector<Tensor>& in) {
      const Tensor z = zeros({6, 4}, Options().dtype(dt));
      return slice_scatter(z, in[0], 0, 0, 2) + slice_scatter(z, in[1], 0, 2, 4) +
             slice_scatter(z, in[2], 0, 4, 6);
    };
    auto f = compile([&](Tensor a, Tensor b, Tensor c) { return typed({a, b, c}); });
    const Tensor a = tensor({-0.0, 1, -2, 3.5, 0, -1e-30, 2, -0.0}, {2, 4}).to(dt);
    const Tensor b = -a, c = a * 3;
    CHECK(bitwise_equal(f(a, b, c), typed({a, b, c})));
    int cats = 0;
    for (const GraphNode& n : f.graph().nodes) cats += n.kind == NodeKind::Op && n.op == OpId::Cat;
    CHECK(cats == 1);
  }
  manual_seed(5);
  Tensor w = randn({6, 4}).requires_grad_();
  const Tensor x = randn({3, 4});
  auto grads = [&](const Tensor& in) {
    Tensor loss = sum(matmul(in, transpose(slice(w, 0, 0, 2), 0, 1))) +
                  sum(relu(matmul(in, transpose(slice(w, 0, 2, 4), 0, 1)))) * 2 +
                  sum(tanh(matmul(in, transpose(slice(w, 0, 4, 6), 0, 1))));
    return duet::grad({loss}, {w})[0];
  };
  auto step = compile(grads);
  const Tensor got = step(x), want = grads(x);
  CHECK(bitwise_equal(got, want));
  int cats = 0, scatters = 0;
  for (const GraphNode& n : step.graph().nodes) {
    cats += n.kind == NodeKind::Op && n.op == OpId::Cat;
    scatters += n.kind == NodeKind::Op && n.op == OpId::SliceScatter;
  }
  CAPTURE(step.graph().str());
  CHECK(cats == 1);
  CHECK(scatters == 0);
}

TEST_CASE("passes: disable_passes switches each one off") {
  auto body = [](Tensor x) { return (x * 1) * (x * 1) + exp(x) * 0 + exp(x) * 0; };
  auto all = compile(body);
  CompileOptions o;
  o.disable_passes = {"simplify", "cse"};
  auto some = compile(body, o);
  Tensor x = tensor({1, 2});
  CHECK(close(all(x), some(x)));
  CHECK(all.graph().num_nodes() < some.graph().num_nodes());
  CHECK(all.stats().nodes_after < all.stats().nodes_before);
}

TEST_CASE("graph: verify() catches a node whose metadata disagrees with its shape rule") {
  Graph g = trace_graph(
      {{2}}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(in[0])}; });
  g.verify();
  g.nodes[1].meta.shape = Shape{3};
  CHECK_THROWS_AS(g.verify(), InternalError);
}

}  // namespace
TEST_CASE("probe: a pinned intermediate is read after each call, through fusion, in both faces") {
  clear_probes();
  auto body = [](Tensor x) {
    Tensor h = probe(tanh(x * 2.0) + 1.0, "h");  // inside one fused group with the sum
    return sum(h * h);
  };
  auto f = compile(body);
  for (int call = 0; call < 3; ++call) {
    const Tensor x = make({0.1 * call, -0.5, 2.0}, {3});
    const Tensor y = f(x);
    const Tensor want = tanh(x * 2.0) + 1.0;
    CHECK(values(f.probe("h")) == values(want));
    CHECK(values(y) == values(body(x)));  // the eager twin pins it too
    CHECK(values(probed("h")) == values(want));
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().fused_kernels > 0);
  // A name the last call did not pin: the error lists the ones it did.
  const std::string e = error_of([&] { f.probe("g"); });
  CHECK(contains(e, "[probe] the last call of compiled function at test_compile.cpp:"));
  CHECK(contains(e, "pinned no value named \"g\" (it pinned \"h\")"));
  // Probes take no part in autograd; gradients through the function are unchanged.
  const Tensor w = make({0.3, -0.2, 0.9}, {3}).requires_grad_();
  auto g = compile([](Tensor v) { return sum(probe(v * v, "sq") * 3.0); });
  g(w).backward();
  CHECK(values(w.grad()) == values(w.detach() * 6.0));
  CHECK_FALSE(g.probe("sq").requires_grad());
  // Twice in one trace, or inside a scan body: errors that say so.
  auto twice = compile([](Tensor v) {
    probe(v, "a");
    return probe(v + 1.0, "a");
  });
  CHECK(contains(error_of([&] { twice(ones({2})); }), "[probe] the name \"a\" is used twice"));
  auto in_scan = compile([](Tensor h, Tensor xs) {
    return scan(
        [](const std::vector<Tensor>& in) {
          Tensor n = probe(in[0] + in[1], "n");
          return std::vector<Tensor>{n, n};
        },
        {h}, {xs})[0];
  });
  CHECK(contains(error_of([&] {
                   in_scan(zeros({2}), zeros({3, 2}));
                 }),
                 "is inside the body of a cond, scan or while_loop"));
  clear_probes();
  CHECK(contains(error_of([] { probed("h"); }), "no value was pinned eagerly under \"h\""));
}

TEST_CASE("probe: after a call that pins nothing, f.probe names nothing from the call before") {
  // A static argument picks what a trace pins: "h", "g" or nothing, each its own trace. The
  // second round of calls runs the cached plans, the first traces them.
  auto f = compile([](Tensor x, int64_t which) {
    Tensor h = x * 2.0;
    if (which == 1) probe(h, "h");
    if (which == 2) probe(h + 1.0, "g");
    return sum(h);
  });
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    const Tensor x = make({1.0 + round, 2.0, 3.0}, {3});
    f(x, int64_t(1));
    CHECK(values(f.probe("h")) == values(x * 2.0));
    // This call pins nothing: f.probe reads this call's probes, which are none, never the
    // value the call before pinned.
    f(x * 10.0, int64_t(0));
    CHECK(
        contains(error_of([&] { f.probe("h"); }), "pinned no value named \"h\" (it pinned none)"));
    f(x, int64_t(1));
    f(x * 10.0, int64_t(2));
    CHECK(values(f.probe("g")) == values(x * 20.0 + 1.0));
    CHECK(
        contains(error_of([&] { f.probe("h"); }), "pinned no value named \"h\" (it pinned \"g\")"));
  }
  CHECK(f.stats().traces == 3);
}

TEST_CASE("backward() inside a compiled function fills the .grad of its arguments, as eagerly") {
  nn::Linear fc(3, 2);
  auto step = [&](const Tensor& x) {
    Tensor loss = (fc(x * x)).sum() + x.sum();
    loss.backward();
    // Reading the argument's .grad inside the function reads its accumulated value.
    return std::vector<Tensor>{loss.detach(), x.grad() * 1.0};
  };
  auto f = compile(step);
  const Tensor data = randn({4, 3}, Options().dtype(DType::f64));
  fc.to(DType::f64);
  auto run = [&](bool compiled, int calls) {
    fc.zero_grad();
    Tensor x = data.clone().requires_grad_();
    std::vector<Tensor> outs;
    for (int k = 0; k < calls; ++k) outs = compiled ? f(x) : step(x);
    return std::make_pair(x, outs);
  };
  for (int calls : {1, 3}) {
    CAPTURE(calls);
    auto [xe, oe] = run(false, calls);
    Tensor eager_w = fc.weight.grad().clone();
    auto [xc, oc] = run(true, calls);
    REQUIRE(xc.grad().defined());
    CHECK(close(xc.grad(), xe.grad(), 1e-12));
    CHECK(close(oc[1], oe[1], 1e-12));
    CHECK(close(fc.weight.grad(), eager_w, 1e-12));
  }
  // Later calls add into the same buffer: a handle taken after the first call sees the sum.
  Tensor x = data.clone().requires_grad_();
  f(x);
  Tensor held = x.grad();
  f(x);
  CHECK(x.grad().is_same(held));
  CHECK(close(held, step(data.clone().requires_grad_())[1] * 2.0, 1e-12));
  // A fresh leaf gets a .grad of its own.
  Tensor y = data.clone().requires_grad_();
  f(y);
  CHECK(!y.grad().is_same(held));
  // With and without a .grad: two entries, and the retrace says why.
  CHECK(f.stats().traces == 2);
  bool said = false;
  for (const std::string& r : f.stats().retrace_reasons)
    said = said || contains(r, "the arguments that have a .grad changed: none -> arg 0");
  CHECK(said);
}

TEST_CASE("backward() inside a compiled function: a non-leaf argument, and one passed twice") {
  auto f = compile([](const Tensor& a) {
    (a * a).sum().backward();
    return a.detach();
  });
  Tensor leaf = randn({3}).requires_grad_();
  Tensor non_leaf = leaf * 2;
  const std::string msg = error_of([&] { f(non_leaf); });
  CHECK_MESSAGE(contains(msg, "not a leaf"), msg);
  auto g = compile([](const Tensor& a, const Tensor& b) {
    (a * b).sum().backward();
    return a.detach();
  });
  Tensor z = randn({3}).requires_grad_();
  CHECK(contains(error_of([&] { g(z, z); }), "are the same tensor"));
  // Saving such a function is refused: a program cannot write its caller's tensors.
  CHECK(contains(error_of([&] { save(f, "/tmp/duet_arg_grad.duet", leaf); }), "writes its .grad"));
}

}  // namespace duet::test
