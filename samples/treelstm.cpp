// A binary TreeLSTM (Tai et al. 2015; samples/treelstm.h) trained on random binary trees,
// written one tree at a time as per-sample code is, twice from the same seed: with the plain
// eager loop over the trees of a batch, and with the same loop in a duet::Autobatch scope, which
// runs the ops of the whole batch (forward and backward) as batched calls. The task: a tree's
// class is the word at its leftmost leaf modulo the number of classes. The program prints both
// losses side by side and both speeds, checks that the losses agree to rounding and that the
// model learned, and exits with 1 when either fails (CI runs it).
//
//   treelstm [--steps N] [--hidden H]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "duet.h"
#include "treelstm.h"

using namespace duet;

namespace {

using treelstm::Sample;
using treelstm::TreeLSTM;

constexpr int64_t kVocab = 50, kClasses = 5, kBatch = 32;

struct Run {
  std::vector<float> losses;
  double seconds = 0;
  AutobatchStats stats;
};

Run train(bool autobatch, int steps, int64_t hidden) {
  manual_seed(1);
  TreeLSTM model(kVocab, hidden, kClasses);
  optim::Adam opt(model.parameters(), optim::AdamOptions(0.01));
  std::mt19937 g(2);
  Run r;
  for (int step = 0; step < steps; ++step) {
    const std::vector<Sample> batch = treelstm::random_batch(g, kBatch, 2, 16, kVocab, kClasses);
    const auto start = std::chrono::steady_clock::now();
    opt.zero_grad();
    Tensor loss;
    {
      std::optional<Autobatch> scope;
      if (autobatch) scope.emplace();
      loss = model.loss(batch) / static_cast<double>(kBatch);
      loss.backward();
    }
    opt.step();
    r.losses.push_back(loss.item<float>());
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (autobatch && step == 0) r.stats = autobatch_stats();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 40;
  int64_t hidden = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--hidden")) hidden = std::atoll(argv[i + 1]);
  }
  const Run loop = train(false, steps, hidden);
  const Run batched = train(true, steps, hidden);
  std::printf("step   loop loss   autobatch loss\n");
  bool agree = true;
  for (int s = 0; s < steps; ++s) {
    const float a = loop.losses[static_cast<size_t>(s)], b = batched.losses[static_cast<size_t>(s)];
    // Rounding differs (batched sums add in another order), and training amplifies it over
    // many steps; the first ten steps agree to 1e-4.
    if (s < 10 && std::abs(a - b) > 1e-4 * (1 + std::abs(a))) agree = false;
    if (s % 5 == 0 || s == steps - 1) std::printf("%4d   %9.5f   %14.5f\n", s, a, b);
  }
  const double n = static_cast<double>(steps * kBatch);
  std::printf("loop:      %7.1f trees/s\n", n / loop.seconds);
  std::printf("autobatch: %7.1f trees/s, %lld ops recorded and %lld kernels run in one step\n",
              n / batched.seconds, static_cast<long long>(batched.stats.ops_recorded),
              static_cast<long long>(batched.stats.kernels_launched));
  const bool learned = batched.losses.back() < 0.5f * batched.losses.front();
  if (!agree) std::printf("FAILED: the losses of the two runs differ\n");
  if (!learned) std::printf("FAILED: the model did not learn\n");
  return agree && learned ? 0 : 1;
}
