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
// Modes: eager, compiled, and "checkpoint" variants of both (each block under duet::checkpoint).
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

/// One way of running a case: its step at a batch size.
struct Runner {
  std::string mode;
  std::function<void(int64_t batch)> step;
};

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

Runner classifier_runner(std::shared_ptr<duet::nn::Module> model, int64_t in, int64_t classes,
                         const std::vector<int64_t>& sizes, bool compiled, std::string mode) {
  auto c = std::make_shared<Classifier>();
  c->model = std::move(model);
  c->opt = std::make_unique<duet::optim::Adam>(c->model->parameters());
  duet::manual_seed(5);
  for (int64_t b : sizes) c->batches[b] = {duet::randn({b, in}), duet::randint(classes, {b})};
  Runner r;
  r.mode = std::move(mode);
  if (compiled) {
    auto fn = duet::compile([c](Tensor x, Tensor y) { return c->step(x, y); });
    auto f = std::make_shared<decltype(fn)>(std::move(fn));
    r.step = [c, f](int64_t b) {
      const auto& [x, y] = c->batches.at(b);
      (*f)(x, y).item<float>();
    };
  } else {
    r.step = [c](int64_t b) {
      const auto& [x, y] = c->batches.at(b);
      c->step(x, y).item<float>();
    };
  }
  return r;
}

Runner w8_runner(bool compiled, bool ckpt, std::string mode) {
  auto w = std::make_shared<W8>(81);
  w->model->checkpoint_blocks = ckpt;
  Runner r;
  r.mode = std::move(mode);
  if (compiled) {
    auto f = std::make_shared<decltype(w->compile())>(w->compile());
    r.step = [w, f](int64_t) { (*f)(w->x, w->y).item<float>(); };
  } else {
    r.step = [w](int64_t) { w->step(w->x, w->y).item<float>(); };
  }
  return r;
}

/// Runs each runner's steps over `sizes`: warm-up, then the peak over one pass of the sizes, then
/// the interleaved timing; appends the rows of case `name`.
void measure(const char* name, const Config& c, std::vector<Runner>& runners,
             const std::vector<int64_t>& sizes, std::vector<Result>& out) {
  std::vector<double> peaks;
  for (Runner& r : runners) {
    // What the other runners hold stays the same while this one steps.
    const int64_t before = duet::cpu_memory_stats().current;
    for (int i = 0; i < warmup_calls(); ++i)
      for (int64_t b : sizes) r.step(b);
    wait_codegen();
    duet::reset_peak_memory();
    for (int64_t b : sizes) r.step(b);
    peaks.push_back(double(duet::cpu_memory_stats().peak - before) / (1 << 20));
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
    std::fprintf(stderr, "MEM %s %s: peak %.2f MiB (%.2fx eager), %.2f ms per step\n", name,
                 runners[i].mode.c_str(), peaks[i], peaks[i] / peaks[0], out.back().median);
  }
}

}  // namespace

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
    measure("MLP12", c, rs, {256, 96}, out);
  }
  {
    std::vector<Runner> rs;
    for (bool ckpt : {false, true})
      for (bool compiled : {false, true})
        rs.push_back(
            w8_runner(compiled, ckpt,
                      std::string(compiled ? "compiled" : "eager") + (ckpt ? " checkpoint" : "")));
    measure("W8", c, rs, {8}, out);
  }
}

}  // namespace bench
