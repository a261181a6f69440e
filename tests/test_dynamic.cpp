// Symbolic dims in compiled functions (Note [Symbolic dims] in trace/compile.h): dims marked
// dynamic or found to change trace once into a graph over SymInts, each new size gets its own
// plan from it, and code that needs a concrete size specializes with the reason recorded.
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
  const CompileStats& s = step.stats();
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

}  // namespace duet::test
