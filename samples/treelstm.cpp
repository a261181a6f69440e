// A binary TreeLSTM (Tai et al. 2015) trained on random binary trees, written one tree at a
// time as per-sample code is, twice from the same seed: with the plain eager loop over the trees
// of a batch, and with the same loop in a duet::Autobatch scope, which runs the ops of the whole
// batch (forward and backward) as batched calls. The task: a tree's class is the word at its
// leftmost leaf modulo the number of classes, which the root can only know from the leaves up.
// The program prints both losses side by side and both speeds, checks that the losses agree to
// rounding and that the model learned, and exits with 1 when either fails (CI runs it).
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

using namespace duet;

namespace {

constexpr int64_t kVocab = 50, kClasses = 5, kBatch = 32;

struct Tree {
  Tensor pick;  // a leaf's position among its sentence's words (i64, shape (1))
  std::unique_ptr<Tree> left, right;
};

struct Sample {
  Tensor words, label;
  std::unique_ptr<Tree> tree;
};

std::unique_ptr<Tree> random_tree(std::mt19937& g, int lo, int hi) {
  auto t = std::make_unique<Tree>();
  if (hi - lo == 1) {
    t->pick = full({1}, lo, Options().dtype(DType::i64));
    return t;
  }
  const int k = lo + 1 + static_cast<int>(g() % static_cast<unsigned>(hi - lo - 1));
  t->left = random_tree(g, lo, k);
  t->right = random_tree(g, k, hi);
  return t;
}

// Trees of 2-16 leaves over random words; the class is the first word modulo kClasses.
std::vector<Sample> make_batch(std::mt19937& g) {
  std::vector<Sample> batch;
  for (int64_t i = 0; i < kBatch; ++i) {
    const int n = 2 + static_cast<int>(g() % 15);
    std::vector<double> w;
    for (int k = 0; k < n; ++k) w.push_back(static_cast<double>(g() % kVocab));
    const double label = static_cast<double>(static_cast<int64_t>(w[0]) % kClasses);
    batch.push_back({tensor(w, Options().dtype(DType::i64)),
                     full({1}, label, Options().dtype(DType::i64)), random_tree(g, 0, n)});
  }
  return batch;
}

struct TreeLSTM : nn::Module {
  int64_t h;
  nn::Embedding emb;
  nn::Linear leaf, inner, out;
  explicit TreeLSTM(int64_t hidden)
      : Module("TreeLSTM"),
        h(hidden),
        emb(kVocab, hidden),
        leaf(hidden, 3 * hidden),
        inner(2 * hidden, 5 * hidden),
        out(hidden, kClasses) {
    register_module("emb", emb);
    register_module("leaf", leaf);
    register_module("inner", inner);
    register_module("out", out);
  }
  struct State {
    Tensor h, c;
  };
  // A node's state from its children's (a leaf's from its word's row of `xs`).
  State node(const Tree& t, const Tensor& xs) {
    Tensor iou, fl, fr;
    State a, b;
    if (t.pick.defined()) {
      iou = index_select(xs, 0, t.pick).reshape({3 * h});
    } else {
      a = node(*t.left, xs);
      b = node(*t.right, xs);
      Tensor z = inner(cat({a.h, b.h}, 0));
      iou = z.slice(0, 0, 3 * h);
      fl = sigmoid(z.slice(0, 3 * h, 4 * h));
      fr = sigmoid(z.slice(0, 4 * h, 5 * h));
    }
    Tensor c = sigmoid(iou.slice(0, 0, h)) * tanh(iou.slice(0, 2 * h, 3 * h));
    if (!t.pick.defined()) c = c + fl * a.c + fr * b.c;
    return {sigmoid(iou.slice(0, h, 2 * h)) * tanh(c), c};
  }
  // The mean cross-entropy over a batch, one tree at a time.
  Tensor loss(const std::vector<Sample>& batch) {
    Tensor total;
    for (const Sample& s : batch) {
      Tensor l =
          cross_entropy(out(node(*s.tree, leaf(emb(s.words))).h).reshape({1, kClasses}), s.label);
      total = total.defined() ? total + l : l;
    }
    return total / static_cast<double>(batch.size());
  }
};

struct Run {
  std::vector<float> losses;
  double seconds = 0;
  AutobatchStats stats;
};

Run train(bool autobatch, int steps, int64_t hidden) {
  manual_seed(1);
  TreeLSTM model(hidden);
  optim::Adam opt(model.parameters(), optim::AdamOptions(0.01));
  std::mt19937 g(2);
  Run r;
  for (int step = 0; step < steps; ++step) {
    const std::vector<Sample> batch = make_batch(g);
    const auto start = std::chrono::steady_clock::now();
    opt.zero_grad();
    Tensor loss;
    {
      std::optional<Autobatch> scope;
      if (autobatch) scope.emplace();
      loss = model.loss(batch);
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
