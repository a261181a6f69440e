// duet_bench MEM (docs/benchmarks.md): the memory of training steps, eager against compiled,
// with and without duet::checkpoint around each block. Each case is a model with its optimizer,
// written with nn modules as a user writes it; every mode has its own copy from one seed.
//  - W4: the Fashion-MNIST demo's step (784-1024-1024-10 MLP, batch 256, Adam);
//  - MLP12: twelve blocks of Linear(512, 512) and ReLU, then Linear(512, 10), Adam, steps at
//    batch 256 and at 96 in turn (an epoch's short last batch);
//  - W8: the transformer step of W8 (bench/w8.h), AdamW.
// Rows per case and mode:
//  - peak_MiB: the allocator's high-water mark over the measured steps, above what was
//    allocated before the first step (the model and the optimizer's state): the gradients, the
//    activations and temporaries, and a compiled function's arena and kept buffers, as
//    samples/fashion_mnist measures it;
//  - ms_per_step: the median step time (the modes interleaved, rep by rep).
// Modes: eager, compiled, and "checkpoint" variants of both (each block under duet::checkpoint);
// for MLP12 and W8 also "compiled budget 0.N": CompileOptions::memory_budget at the smallest
// of 0.5, 0.6, ... times the plan peak of the unconstrained compiled step (plan_peak_MiB: a
// compiled step's plan, arena and results) that it meets, whose losses must equal the compiled
// step's bit for bit (the budgets it could not meet are printed with the smallest peak reached).
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/w8.h"
#include "duet.h"

namespace bench {

namespace {

/// One way of running a case: its step at a batch size (returning the loss), and for a
/// compiled step the peak of the plan that ran it (0 eagerly).
struct Runner {
  std::string mode;
  std::function<float(int64_t batch)> step;
  std::function<int64_t()> plan_peak = [] { return int64_t(0); };
  std::vector<float> losses;  ///< of the measured pass
};

/// A compiled step behind a Runner: calls, and its most recent plan's peak.
template <class F>
void set_compiled(Runner& r, std::shared_ptr<F> f, std::function<float(F&, int64_t)> call) {
  r.step = [f, call](int64_t b) { return call(*f, b); };
  r.plan_peak = [f] { return f->memory_report().peak_bytes; };
}

/// An MLP of `depth` blocks Linear(width, width) + ReLU and a head, optionally checkpointed per
/// block.
class BlockMlp : public duet::nn::Module {
 public:
  BlockMlp(int64_t in, int64_t width, int depth, int64_t out, bool ckpt) : checkpointed(ckpt) {
    first = register_module("first", duet::nn::Linear(in, width));
    for (int i = 0; i < depth; ++i)
      blocks.push_back(register_module(fmt::format("block{}", i), duet::nn::Linear(width, width)));
    head = register_module("head", duet::nn::Linear(width, out));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = duet::relu(first(x));
    for (duet::nn::Linear& b : blocks) {
      auto block = [&b](const Tensor& t) { return duet::relu(b(t)); };
      h = checkpointed ? duet::checkpoint(block, h) : block(h);
    }
    return head(h);
  }
  duet::nn::Linear first{1, 1}, head{1, 1};
  std::vector<duet::nn::Linear> blocks;
  bool checkpointed;
};

/// A classifier case: model, optimizer, and a batch per size.
struct Classifier {
  std::shared_ptr<duet::nn::Module> model;
  std::unique_ptr<duet::optim::Adam> opt;
  std::map<int64_t, std::pair<Tensor, Tensor>> batches;
  Tensor step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    Tensor loss = duet::cross_entropy((*model)(x), y);
    loss.backward();
    opt->step();
    return loss;
  }
};

/// A runner of step(x, y) on batch(size), eager or compiled (under `budget`); `owner` keeps the
/// model and optimizer alive.
Runner runner_of(std::function<Tensor(Tensor, Tensor)> step,
                 std::function<std::pair<Tensor, Tensor>(int64_t)> batch,
                 std::shared_ptr<void> owner, bool compiled, std::string mode, int64_t budget) {
  Runner r;
  r.mode = std::move(mode);
  if (compiled) {
    duet::CompileOptions o;
    o.memory_budget = budget;
    auto fn = duet::compile(
        [step, owner](Tensor x, Tensor y) { return step(std::move(x), std::move(y)); }, o);
    using F = decltype(fn);
    set_compiled<F>(r, std::make_shared<F>(std::move(fn)), [batch](F& f, int64_t b) {
      const auto [x, y] = batch(b);
      return f(x, y).template item<float>();
    });
  } else {
    r.step = [step, batch, owner](int64_t b) {
      const auto [x, y] = batch(b);
      return step(x, y).item<float>();
    };
  }
  return r;
}

Runner classifier_runner(std::shared_ptr<duet::nn::Module> model, int64_t in, int64_t classes,
                         const std::vector<int64_t>& sizes, bool compiled, std::string mode,
                         int64_t budget = 0) {
  auto c = std::make_shared<Classifier>();
  c->model = std::move(model);
  c->opt = std::make_unique<duet::optim::Adam>(c->model->parameters());
  duet::manual_seed(5);
  for (int64_t b : sizes) c->batches[b] = {duet::randn({b, in}), duet::randint(classes, {b})};
  return runner_of([c](Tensor x, Tensor y) { return c->step(x, y); },
                   [c](int64_t b) { return c->batches.at(b); }, c, compiled, std::move(mode),
                   budget);
}

Runner w8_runner(bool compiled, bool ckpt, std::string mode, int64_t budget = 0,
                 int64_t batch = kBatch) {
  auto w = std::make_shared<W8>(81, false, batch);
  w->model->checkpoint_blocks = ckpt;
  return runner_of([w](Tensor x, Tensor y) { return w->step(x, y); },
                   [w](int64_t) { return std::make_pair(w->x, w->y); }, w, compiled,
                   std::move(mode), budget);
}

/// The largest plan peak of a fresh runner's steps over `sizes` (the unconstrained compiled
/// step's, which the budget rows halve).
int64_t plan_peak_of(Runner r, const std::vector<int64_t>& sizes) {
  int64_t peak = 0;
  for (int64_t b : sizes) {
    r.step(b);
    peak = std::max(peak, r.plan_peak());
  }
  return peak;
}

/// A compiled runner at the smallest fraction of `full` bytes (0.5, 0.6, ...) that its
/// memory_budget can meet: make(budget) makes a fresh one. Prints the budgets that failed.
Runner budget_runner(const char* name, const std::function<Runner(int64_t)>& make, int64_t full,
                     const std::vector<int64_t>& sizes) {
  for (int tenths = 5; tenths <= 9; ++tenths) {
    const int64_t budget = full * tenths / 10;
    try {
      plan_peak_of(make(budget), sizes);
    } catch (const duet::ValueError& e) {
      std::fprintf(stderr, "MEM %s: a budget of 0.%d x the plan peak is not met: %s\n", name,
                   tenths, e.what());
      continue;
    }
    Runner r = make(budget);
    r.mode = fmt::format("compiled budget 0.{}", tenths);
    return r;
  }
  return make(0);
}

/// Runs each runner's steps over `sizes`: warm-up, then the peak over one pass of the sizes, then
/// the interleaved timing; appends the rows of case `name`.
void measure(const char* name, const Config& c, std::vector<Runner>& runners,
             const std::vector<int64_t>& sizes, std::vector<Result>& out) {
  std::vector<double> peaks, plans;
  for (Runner& r : runners) {
    // What the other runners hold stays the same while this one steps.
    const int64_t before = duet::cpu_memory_stats().current;
    for (int i = 0; i < warmup_calls(); ++i)
      for (int64_t b : sizes) r.step(b);
    wait_codegen();
    duet::reset_peak_memory();
    int64_t plan = 0;
    for (int64_t b : sizes) {
      r.losses.push_back(r.step(b));
      plan = std::max(plan, r.plan_peak());
    }
    peaks.push_back(double(duet::cpu_memory_stats().peak - before) / (1 << 20));
    plans.push_back(double(plan) / (1 << 20));
  }
  std::vector<std::function<void()>> bodies;
  for (Runner& r : runners)
    bodies.push_back([&r, &sizes] {
      for (int64_t b : sizes) r.step(b);
    });
  const auto t = time_interleaved(bodies, c.reps, 1);
  for (size_t i = 0; i < runners.size(); ++i) {
    Result r = base("MEM", runners[i].mode.c_str(), c, "peak_MiB");
    r.variant = name;
    out.push_back(single(r, peaks[i]));
    r.metric = "ms_per_step";
    out.push_back(summarize(r, t[i], [&](double s) { return 1e3 * s / double(sizes.size()); }));
    const double ms = out.back().median;
    if (plans[i] > 0) {
      r.metric = "plan_peak_MiB";
      out.push_back(single(r, plans[i]));
    }
    // A budgeted step must train as the unconstrained compiled one does, bit for bit.
    std::string same;
    for (const Runner& o : runners)
      if (o.mode == "compiled" && runners[i].mode.find("budget") != std::string::npos)
        same = o.losses == runners[i].losses ? ", losses identical to compiled"
                                             : ", LOSSES DIFFER from compiled";
    std::fprintf(
        stderr, "MEM %s %s: peak %.2f MiB (%.2fx eager), plan %.2f MiB, %.2f ms per step%s\n", name,
        runners[i].mode.c_str(), peaks[i], peaks[i] / peaks[0], plans[i], ms, same.c_str());
  }
}

/// The most memory one W8 step holds beyond what was allocated before it, compiled plus the
/// peak of its plan (W9's peak_MiB), after warm-up, in MiB; `plan` gets the plan's part. -1
/// when the budget cannot be met.
double w8_step_peak(bool compiled, bool ckpt, int64_t budget, int64_t batch, double* plan) {
  Runner r = w8_runner(compiled, ckpt, "", budget, batch);
  try {
    for (int i = 0; i < warmup_calls(); ++i) r.step(batch);
  } catch (const duet::ValueError&) {
    return -1;
  }
  wait_codegen();
  const int64_t before = duet::cpu_memory_stats().current;
  duet::reset_peak_memory();
  r.step(batch);
  const int64_t kept = compiled ? r.plan_peak() : 0;
  if (plan) *plan = double(kept) / (1 << 20);
  return double(duet::cpu_memory_stats().peak - before + kept) / (1 << 20);
}

}  // namespace

// MB (docs/benchmarks.md): the largest W8 batch whose training step fits kMbBudgetMiB, eager
// and compiled, with and without checkpoints around the blocks, and compiled under
// memory_budget at that many bytes; bench/peers/memory_batch.py runs PyTorch beside it.
void run_mb(const Config& c, std::vector<Result>& out) {
  constexpr double kMbBudgetMiB = 256;
  const std::vector<int64_t> batches = {8, 16, 24, 32, 48, 64, 80, 96, 112, 128};
  struct Mode {
    const char* name;
    bool compiled, ckpt, budget;
  };
  const Mode modes[] = {{"eager", false, false, false},
                        {"eager checkpoint", false, true, false},
                        {"compiled", true, false, false},
                        {"compiled checkpoint", true, true, false},
                        {"compiled budget", true, false, true}};
  for (const Mode& m : modes) {
    int64_t largest = 0;
    for (int64_t b : batches) {
      // The budget is the plan's: what the step holds outside its plan (its part measured
      // unconstrained) comes off the fixed memory first, as a user sizing it would.
      double peak = -1;
      if (m.budget) {
        double plan = 0;
        const double outside = w8_step_peak(true, false, 0, b, &plan) - plan;
        if (kMbBudgetMiB - outside > 0)
          peak =
              w8_step_peak(true, false, int64_t((kMbBudgetMiB - outside) * (1 << 20)), b, nullptr);
      } else {
        peak = w8_step_peak(m.compiled, m.ckpt, 0, b, nullptr);
      }
      Result r = base("MB", m.name, c, "step_peak_MiB");
      r.n = b;
      r.variant = fmt::format("batch {}", b);
      out.push_back(single(r, peak));
      std::fprintf(stderr, "MB %s batch %lld: %s\n", m.name, static_cast<long long>(b),
                   peak < 0 ? "budget not met" : fmt::format("{:.1f} MiB", peak).c_str());
      if (peak >= 0 && peak <= kMbBudgetMiB) largest = b;
    }
    Result r = base("MB", m.name, c, "largest_batch");
    r.variant = fmt::format("within {:.0f} MiB", kMbBudgetMiB);
    out.push_back(single(r, double(largest)));
  }
}

void run_mem(const Config& c, std::vector<Result>& out) {
  {
    std::vector<Runner> rs;
    for (bool compiled : {false, true}) {
      duet::manual_seed(4);
      auto m = std::make_shared<duet::nn::Sequential>(duet::nn::Linear(784, 1024), duet::nn::ReLU(),
                                                      duet::nn::Linear(1024, 1024),
                                                      duet::nn::ReLU(), duet::nn::Linear(1024, 10));
      rs.push_back(classifier_runner(m, 784, 10, {256}, compiled, compiled ? "compiled" : "eager"));
    }
    measure("W4", c, rs, {256}, out);
  }
  {
    std::vector<Runner> rs;
    for (bool ckpt : {false, true})
      for (bool compiled : {false, true}) {
        duet::manual_seed(12);
        auto m = std::make_shared<BlockMlp>(512, 512, 12, 10, ckpt);
        const std::string mode =
            std::string(compiled ? "compiled" : "eager") + (ckpt ? " checkpoint" : "");
        rs.push_back(classifier_runner(m, 512, 10, {256, 96}, compiled, mode));
      }
    duet::manual_seed(12);
    const int64_t full =
        plan_peak_of(classifier_runner(std::make_shared<BlockMlp>(512, 512, 12, 10, false), 512, 10,
                                       {256, 96}, true, "compiled"),
                     {256, 96});
    rs.push_back(budget_runner("MLP12",
                               [](int64_t budget) {
                                 duet::manual_seed(12);
                                 return classifier_runner(
                                     std::make_shared<BlockMlp>(512, 512, 12, 10, false), 512, 10,
                                     {256, 96}, true, "compiled budget", budget);
                               },
                               full, {256, 96}));
    measure("MLP12", c, rs, {256, 96}, out);
  }
  {
    std::vector<Runner> rs;
    for (bool ckpt : {false, true})
      for (bool compiled : {false, true})
        rs.push_back(
            w8_runner(compiled, ckpt,
                      std::string(compiled ? "compiled" : "eager") + (ckpt ? " checkpoint" : "")));
    const int64_t full = plan_peak_of(w8_runner(true, false, "compiled"), {8});
    rs.push_back(budget_runner(
        "W8", [](int64_t budget) { return w8_runner(true, false, "compiled budget", budget); },
        full, {8}));
    measure("W8", c, rs, {8}, out);
  }
}

}  // namespace bench
