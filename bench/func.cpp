// duet_bench VM (docs/benchmarks.md): per-sample gradients, as a user writes them with
// duet::func, against a loop over the samples and against the same gradients batched by hand.
// The model: a 2-layer MLP, loss_i = (tanh(x_i W1) W2 - y_i)^2 for each of 256 samples, the
// gradient with respect to W2 (128 x 1) per sample:
//  - vmap: func::vmap(func::grad(loss), {nullopt, 0, 0})(W2, X, Y), eagerly, and compiled;
//  - loop: func::grad(loss) once per sample, stacked (what the code does without vmap);
//  - floor: the gradient written out batched, 2 (h_i W2 - y_i) h_i for all i at once.
// Rows: ms per call, median; the three agree (checked before timing).
#include <optional>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

void run_vm(const Config& c, std::vector<Result>& out) {
  constexpr int64_t kSamples = 256, kIn = 64, kHidden = 128;
  duet::manual_seed(31);
  const Tensor w1 = duet::randn({kIn, kHidden}) * 0.1, w2 = duet::randn({kHidden, 1}) * 0.1;
  const Tensor x = duet::randn({kSamples, kIn}), y = duet::randn({kSamples, 1});
  auto loss = [&](const Tensor& w, const Tensor& xi, const Tensor& yi) {
    Tensor e = duet::matmul(duet::tanh(duet::matmul(xi.reshape({1, kIn}), w1)), w) - yi;
    return (e * e).sum();
  };
  auto per_sample = duet::func::vmap(duet::func::grad(loss), {std::nullopt, 0, 0});
  auto compiled = duet::compile(
      [&](const Tensor& w, const Tensor& xs, const Tensor& ys) { return per_sample(w, xs, ys); });
  auto loop = [&] {
    std::vector<Tensor> g;
    for (int64_t i = 0; i < kSamples; ++i)
      g.push_back(duet::func::grad(loss)(w2, x.select(0, i), y.select(0, i)));
    return duet::stack(g, 0);
  };
  auto floor = [&] {
    const Tensor h = duet::tanh(duet::matmul(x, w1));       // (N, 128)
    const Tensor e = (duet::matmul(h, w2) - y) * 2.0;       // (N, 1)
    return (h.unsqueeze(2) * e.unsqueeze(1)).contiguous();  // (N, 128, 1)
  };
  const Tensor want = floor();
  for (const Tensor& got : {per_sample(w2, x, y), compiled(w2, x, y), loop()}) {
    const double diff = duet::abs(got - want).max().item<float>();
    if (!(diff <= 1e-4))
      throw duet::Error(fmt::format("VM: per-sample gradients differ from the floor by {}", diff));
  }
  const auto t = time_interleaved({[&] { per_sample(w2, x, y); }, [&] { compiled(w2, x, y); },
                                   [&] { loop(); }, [&] { floor(); }},
                                  c.reps);
  const char* modes[] = {"eager", "compiled", "loop", "floor"};
  for (size_t k = 0; k < t.size(); ++k) {
    Result r = base("VM", modes[k], c, "ms_per_call");
    r.variant = k == 3 ? "hand_batched" : "vmap_grad";
    if (k == 2) r.variant = "grad_per_sample";
    out.push_back(summarize(r, t[k], [](double s) { return 1e3 * s; }));
  }
}

// B3: per-sample gradients of the W4 MLP (784-1024-1024-10, ReLU, softmax cross-entropy) at
// batch 64, with respect to its last weight (1024 x 10), as func::vmap(func::grad(loss)) against
// the loop of func::grad per sample, and against the floor: the gradients written out batched,
// h_i (softmax(h_i W3) - onehot(y_i)) for all i at once, whose two products of the batch by W1
// and W2 any batched way must compute. The four are checked to agree first. ms per call.
void run_b3(const Config& c, std::vector<Result>& out) {
  constexpr int64_t kSamples = 64;
  duet::manual_seed(37);
  const Tensor w1 = duet::randn({784, 1024}) * 0.03, w2 = duet::randn({1024, 1024}) * 0.03;
  const Tensor w3 = duet::randn({1024, 10}) * 0.03;
  const Tensor x = duet::rand({kSamples, 784});
  const Tensor y = duet::randint(10, {kSamples}, duet::Options().dtype(duet::DType::i64));
  auto loss = [&](const Tensor& w, const Tensor& xi, const Tensor& yi) {
    Tensor h = duet::relu(duet::matmul(duet::relu(duet::matmul(xi.reshape({1, 784}), w1)), w2));
    return duet::cross_entropy(duet::matmul(h, w), yi.reshape({1}));
  };
  auto per_sample = duet::func::vmap(duet::func::grad(loss), {std::nullopt, 0, 0});
  auto loop = [&] {
    std::vector<Tensor> g;
    for (int64_t i = 0; i < kSamples; ++i)
      g.push_back(duet::func::grad(loss)(w3, x.select(0, i), y.select(0, i)));
    return duet::stack(g, 0);
  };
  auto compiled = duet::compile(
      [&](const Tensor& w, const Tensor& xs, const Tensor& ys) { return per_sample(w, xs, ys); });
  const Tensor onehot = duet::one_hot(y, 10).to(duet::DType::f32);
  auto floor = [&] {
    const Tensor h = duet::relu(duet::matmul(duet::relu(duet::matmul(x, w1)), w2));  // (64, 1024)
    const Tensor g = duet::softmax(duet::matmul(h, w3), 1) - onehot;                 // (64, 10)
    return duet::matmul(h.unsqueeze(2), g.unsqueeze(1));  // (64, 1024, 10)
  };
  const Tensor want = loop();
  for (const Tensor& got : {per_sample(w3, x, y), compiled(w3, x, y), floor()}) {
    const double diff = duet::abs(got - want).max().item<float>();
    if (!(diff <= 1e-4))
      throw duet::Error(
          fmt::format("B3: the per-sample gradients and the loop's differ by {}", diff));
  }
  const auto t = time_interleaved({[&] { per_sample(w3, x, y); }, [&] { compiled(w3, x, y); },
                                   [&] { loop(); }, [&] { floor(); }},
                                  c.reps);
  const char* modes[] = {"eager", "compiled", "loop", "floor"};
  for (size_t k = 0; k < t.size(); ++k) {
    Result r = base("B3", modes[k], c, "ms_per_call");
    r.variant = k == 3 ? "hand_batched" : k == 2 ? "grad_per_sample" : "vmap_grad";
    out.push_back(summarize(r, t[k], [](double s) { return 1e3 * s; }));
  }
}

}  // namespace bench
