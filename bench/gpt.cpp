// duet_bench W9 (docs/benchmarks.md): GPT-2 small (samples/gpt.h: 12 layers, width 768, 12
// heads, vocabulary 50257, context 1024, tied embeddings; 124M parameters) on random tokens, as
// a user writes it: nn modules, cross-entropy, clip_grad_norm_(1.0) and AdamW (betas 0.9/0.95,
// weight decay 0.1). On the CPU, batch 1 x 1024 tokens. Rows, eager and compiled, in f32 and
// with the forward under Autocast(cpu, bf16):
//  - train_tok_s: tokens per second of a whole training step;
//  - fwd_tok_s: tokens per second of the forward and the loss alone (no grad);
//  - peak_MiB: the most memory a training step holds beyond what is allocated before it (the
//    model, the previous step's gradients, the optimizer's state), measured with duet's
//    allocator on one step after the timed ones; compiled, plus the buffers its plan keeps
//    (plan_buffers_MiB: those alone).
// Each mode has its own model from the same seed; per precision, the eager and compiled steps
// alternate rep by rep.
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "duet.h"
#include "samples/gpt.h"

namespace bench {

using duet::Tensor;

namespace {

constexpr int64_t kBatch = 1, kSeq = 1024;

struct Mode {
  std::string name, variant;
  bool compiled;
  std::optional<duet::DType> autocast;
  std::unique_ptr<gpt::Gpt> model;
  std::unique_ptr<duet::optim::AdamW> opt;
  std::function<Tensor(const Tensor&, const Tensor&)> train, forward;
  std::function<int64_t()> kept_bytes = [] { return int64_t(0); };  ///< a plan's buffers
};

Tensor loss_under(gpt::Gpt& m, const Tensor& x, const Tensor& y, std::optional<duet::DType> ac) {
  duet::Autocast scope(duet::Device::cpu(), ac.value_or(duet::DType::bf16), ac.has_value());
  return gpt::loss_of(m, x, y);
}

std::unique_ptr<Mode> make_mode(bool compiled, std::optional<duet::DType> ac) {
  auto m = std::make_unique<Mode>();
  m->name = compiled ? "compiled" : "eager";
  m->variant = ac ? "bf16 autocast" : "f32";
  m->compiled = compiled;
  m->autocast = ac;
  duet::manual_seed(90);
  m->model = std::make_unique<gpt::Gpt>(gpt::GptConfig{});
  m->opt = std::make_unique<duet::optim::AdamW>(m->model->parameters(), gpt::adamw_options(3e-4));
  gpt::Gpt& model = *m->model;
  duet::optim::AdamW& opt = *m->opt;
  auto train = [&model, &opt, ac](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = loss_under(model, x, y, ac);
    loss.backward();
    duet::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    return loss;
  };
  auto forward = [&model, ac](const Tensor& x, const Tensor& y) {
    duet::NoGradGuard no_grad;
    return loss_under(model, x, y, ac);
  };
  if (compiled) {
    auto ct = std::make_shared<duet::Compiled<decltype(train)>>(duet::compile(train));
    auto cf = std::make_shared<duet::Compiled<decltype(forward)>>(duet::compile(forward));
    m->train = [ct](const Tensor& x, const Tensor& y) { return (*ct)(x, y); };
    m->forward = [cf](const Tensor& x, const Tensor& y) { return (*cf)(x, y); };
    m->kept_bytes = [ct] { return ct->stats().buffer_bytes; };
  } else {
    m->train = train;
    m->forward = forward;
  }
  return m;
}

}  // namespace

void run_w9(const Config& c, std::vector<Result>& out) {
  duet::manual_seed(91);
  const Tensor tokens = duet::randint(50257, {kBatch, kSeq + 1});
  const Tensor x = duet::slice(tokens, 1, 0, kSeq).contiguous();
  const Tensor y = duet::slice(tokens, 1, 1, kSeq + 1).contiguous();
  // Per precision, the eager and the compiled model (two GPT-2s with their AdamW state, about
  // 4 GiB in f32): their steps alternate rep by rep.
  const int reps = std::max(3, c.reps / 2);
  const double tokens_per_step = double(kBatch * kSeq);
  for (auto ac : {std::optional<duet::DType>{}, std::optional<duet::DType>{duet::DType::bf16}}) {
    std::vector<std::unique_ptr<Mode>> modes;
    for (bool compiled : {false, true}) modes.push_back(make_mode(compiled, ac));
    std::vector<std::function<void()>> train, forward;
    for (auto& m : modes) {
      Mode* p = m.get();
      train.push_back([p, &x, &y] { p->train(x, y).item<float>(); });
      forward.push_back([p, &x, &y] { p->forward(x, y).item<float>(); });
    }
    const auto tt = time_interleaved(train, reps, 2);
    const auto tf = time_interleaved(forward, reps, 2);
    for (size_t i = 0; i < modes.size(); ++i) {
      const Mode& m = *modes[i];
      Result r = base("W9", m.name.c_str(), c, "train_tok_s");
      r.variant = m.variant;
      out.push_back(summarize(r, tt[i], [&](double s) { return tokens_per_step / s; }));
      r.metric = "fwd_tok_s";
      out.push_back(summarize(r, tf[i], [&](double s) { return tokens_per_step / s; }));
      const int64_t before = duet::cpu_memory_stats().current;
      duet::reset_peak_memory();
      train[i]();
      r.metric = "peak_MiB";
      const double in_call = double(duet::cpu_memory_stats().peak - before) / (1 << 20);
      const double kept = double(m.kept_bytes()) / (1 << 20);
      r.median = r.min = r.max = in_call + kept;
      out.push_back(r);
      if (m.compiled) {  // the peak's two parts: the plan's buffers, and what a call adds
        r.metric = "plan_buffers_MiB";
        r.median = r.min = r.max = kept;
        out.push_back(r);
      }
    }
  }
}

}  // namespace bench
