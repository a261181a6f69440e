// RN (not a standard workload; the acceptance check of scan with symbolic dims): an Elman RNN
// over duet::scan, h_t = tanh(x_t W + h_{t-1} U + b), batch 16, 32 inputs, 64 hidden, f32. One
// call is a gradient step: the loss sum(h_t^2) over every step plus sum(h_T), and its gradient
// with respect to W, U and b. Eager runs the body once per step on the tape; compiled runs one scan
// node (its body a plan) and the backward as a reverse scan. Reported per call and per scan
// step at lengths 8 and 64, and the number of traces the compiled step takes over the lengths
// 1..64 called in turn.
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

namespace {

constexpr int64_t kBatch = 16, kIn = 32, kHidden = 64;

struct Rnn {
  Tensor W, U, b, h0;
  Rnn() {
    duet::manual_seed(7);
    W = (duet::randn({kIn, kHidden}) * (1.0 / std::sqrt(double(kIn)))).requires_grad_();
    U = (duet::randn({kHidden, kHidden}) * (1.0 / std::sqrt(double(kHidden)))).requires_grad_();
    b = duet::zeros({kHidden}).requires_grad_();
    h0 = duet::zeros({kBatch, kHidden});
  }
  std::vector<Tensor> grads(const Tensor& seq) const {
    Tensor W_ = W, U_ = U, b_ = b;
    auto cell = [W_, U_, b_](const std::vector<Tensor>& s) {
      Tensor h = duet::tanh(duet::matmul(s[1], W_) + duet::matmul(s[0], U_) + b_);
      return std::vector<Tensor>{h, h};
    };
    std::vector<Tensor> o = duet::scan(cell, {h0}, {seq});
    Tensor loss = duet::sum(o[1] * o[1]) + duet::sum(o[0]);
    return duet::grad({loss}, {W, U, b});
  }
};

double max_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<float> x = a[i].to_vector<float>(), y = b[i].to_vector<float>();
    for (size_t j = 0; j < x.size(); ++j)
      d = std::max(d, double(std::abs(x[j] - y[j])) / (1.0 + std::abs(double(x[j]))));
  }
  return d;
}

}  // namespace

void run_rn(const Config& c, std::vector<Result>& out) {
  Rnn m;
  // The trace count over lengths 1..64, each called once in turn.
  {
    auto step =
        duet::compile([&](Tensor seq) { return m.grads(seq); }, duet::CompileOptions{{}, {}, 64});
    double worst = 0;
    for (int64_t len = 1; len <= 64; ++len) {
      Tensor seq = duet::randn({len, kBatch, kIn});
      worst = std::max(worst, max_diff(step(seq), m.grads(seq)));
    }
    const duet::CompileStats s = step.stats();
    std::fprintf(stderr,
                 "RN: lengths 1..64 called in turn: %d traces, %d hits, %d eager calls; largest "
                 "relative gradient difference against eager %.2g\n",
                 s.traces, s.hits, s.eager_calls, worst);
    out.push_back(single(base("RN", "compiled", c, "traces_lengths_1_to_64"), s.traces));
  }
  for (int64_t len : {8, 64}) {
    Tensor seq = duet::randn({len, kBatch, kIn});
    auto step = duet::compile([&](Tensor x) { return m.grads(x); });
    std::vector<Tensor> ge = m.grads(seq), gc;
    for (int i = 0; i < warmup_calls(); ++i) gc = step(seq);
    wait_codegen("RN");
    const double diff = max_diff(ge, gc);
    if (diff > 1e-4)
      std::fprintf(stderr, "RN: compiled and eager gradients differ by %.3g at length %lld\n", diff,
                   static_cast<long long>(len));
    const int calls = len == 8 ? 50 : 10;
    auto t = time_interleaved({[&] {
                                 for (int i = 0; i < calls; ++i) ge = m.grads(seq);
                               },
                               [&] {
                                 for (int i = 0; i < calls; ++i) gc = step(seq);
                               }},
                              c.reps);
    auto us_step = [&](double s) { return s / calls / double(len) * 1e6; };
    const std::string v = "len" + std::to_string(len);
    Result e = summarize(base("RN", "eager", c, "us_per_scan_step"), t[0], us_step);
    Result k = summarize(base("RN", "compiled", c, "us_per_scan_step"), t[1], us_step);
    e.variant = k.variant = v;
    out.push_back(e);
    out.push_back(k);
    std::fprintf(stderr,
                 "RN length %lld: eager %.1f us, compiled %.1f us per scan step (%.2fx); %d "
                 "trace(s)\n",
                 static_cast<long long>(len), e.median, k.median, e.median / k.median,
                 step.stats().traces);
  }
}

}  // namespace bench
