// Autobatch: a tensor that only samples off the loss's path read gets no gradient, as eagerly
// (Note [Gradients off the loss's path] in eager/autobatch_reach.cpp).
#include <optional>
#include <utility>
#include <vector>

#include "util.h"

namespace duet::test {
namespace {

// Per sample: a head on the loss's path (x * w_on) and one computed and kept but left out of it
// (x * w_off), the two of one signature, so that they batch together.
struct TwoHeads {
  Tensor w_on = randn({3}).requires_grad_(true);
  Tensor w_off = randn({3}).requires_grad_(true);
  std::vector<Tensor> x;
  TwoHeads() {
    for (int i = 0; i < 4; ++i) x.push_back(randn({3}).requires_grad_(true));
  }
  // The loss (samples 0 and 2 of the first head; with `all`, every sample of both) and the sum
  // of the second heads, kept.
  std::pair<Tensor, Tensor> forward(bool all) const {
    Tensor loss, kept;
    for (int i = 0; i < 4; ++i) {
      const Tensor on = sum(tanh(x[static_cast<size_t>(i)] * w_on));
      const Tensor off = sum(tanh(x[static_cast<size_t>(i)] * w_off));
      if (all || i % 2 == 0) loss = loss.defined() ? loss + on : on;
      if (all) loss = loss + off;
      kept = kept.defined() ? kept + off : off;
    }
    return {loss, kept};
  }
  // forward(false) and its backward (keeping the graph), in an Autobatch scope or not.
  std::pair<Tensor, Tensor> step(bool batched) {
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    auto r = forward(false);
    r.first.backward({}, /*retain_graph=*/true);
    return r;
  }
  void clear() {
    for (Tensor& t : {std::ref(w_on), std::ref(w_off)}) t.set_grad(Tensor());
    for (Tensor& t : x) t.set_grad(Tensor());
  }
};

TEST_CASE("autobatch: a weight only samples off the loss's path read gets no gradient") {
  TwoHeads m;
  auto [eager_loss, eager_kept] = m.step(false);
  const Tensor want_on = m.w_on.grad().clone();
  std::vector<Tensor> want_x;
  for (const Tensor& x : m.x) want_x.push_back(x.grad().defined() ? x.grad().clone() : Tensor());
  CHECK_FALSE(m.w_off.grad().defined());
  m.clear();

  auto [loss, kept] = m.step(true);
  CHECK(autobatch_stats().batches > 0);
  CHECK(close(loss, eager_loss, 1e-6));
  CHECK(close(m.w_on.grad(), want_on, 1e-5));
  CHECK_FALSE(m.w_off.grad().defined());  // the batched backward reached it with zeros
  for (size_t i = 0; i < m.x.size(); ++i) {
    CAPTURE(i);
    // Samples 1 and 3 are off the path: their inputs get no gradient either.
    REQUIRE(m.x[i].grad().defined() == want_x[i].defined());
    if (want_x[i].defined()) CHECK(close(m.x[i].grad(), want_x[i], 1e-5));
  }

  // A second backward, from the kept heads, reaches the other samples and w_off, not w_on.
  kept.backward();
  REQUIRE(m.w_off.grad().defined());
  CHECK(close(m.w_on.grad(), want_on, 1e-5));
  const Tensor got_off = m.w_off.grad().clone();
  m.clear();
  eager_kept.backward();
  CHECK(close(got_off, m.w_off.grad(), 1e-5));
}

TEST_CASE("autobatch: a second loss's backward runs after the first's, as eagerly") {
  // The two losses' samples share batches; eagerly their graphs are separate, and the first
  // backward (not retaining its graph) leaves the second's alone (Note [Batches shared by
  // losses] in eager/autobatch_reach.cpp). A third backward, from a loss spent, raises.
  TwoHeads m;
  std::vector<Tensor> want;
  for (bool batched : {false, true}) {
    CAPTURE(batched);
    m.clear();
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    auto [loss, kept] = m.forward(false);
    loss.backward();
    kept.backward();
    REQUIRE(m.w_on.grad().defined());
    REQUIRE(m.w_off.grad().defined());
    if (!batched) {
      want = {m.w_on.grad().clone(), m.w_off.grad().clone()};
    } else {
      CHECK(close(m.w_on.grad(), want[0], 1e-5));
      CHECK(close(m.w_off.grad(), want[1], 1e-5));
    }
    CHECK_THROWS_AS(loss.backward(), Error);
  }
}

TEST_CASE("autobatch: Adam leaves a parameter off the loss's path alone") {
  // After a step on both heads, Adam's moments of w_off are not zero: a gradient of zeros in the
  // next step would still move it. Eagerly it gets none there, and Adam skips it.
  TwoHeads m;
  optim::Adam opt({m.w_on, m.w_off}, {.lr = 0.1});
  m.forward(/*all=*/true).first.backward();
  opt.step();
  m.clear();
  const Tensor before = m.w_off.clone();
  m.step(true);
  opt.step();
  CHECK(close(m.w_off, before, 0));
}

TEST_CASE("autobatch: grad() of a tensor off the loss's path is zeros, as eagerly") {
  TwoHeads m;
  const Tensor eager = grad({m.forward(false).first}, {m.w_off})[0];
  Tensor batched;
  {
    Autobatch scope;
    batched = grad({m.forward(false).first}, {m.w_off})[0];
  }
  CHECK(close(eager, zeros({3}), 0));
  CHECK(close(batched, eager, 0));
}

TEST_CASE("autobatch: ops by rows read a weight off the loss's path through its gate") {
  // Samples of different lengths, (n_i, 3) rows times a shared weight: one call on their rows
  // (Note [Groups by rows] in eager/autobatch_rows.cpp).
  Tensor w_on = randn({3}).requires_grad_(true), w_off = randn({3}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int64_t n : {2, 5, 3, 4}) x.push_back(randn({n, 3}));
  // Samples 0 and 2 on the loss's path (x + w_on), 1 and 3 off it (x * w_off, one group of
  // their own that reads w_off whole), and tanh of all four as one group.
  auto run = [&](bool batched) {
    w_on.set_grad(Tensor());
    w_off.set_grad(Tensor());
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    Tensor loss;
    std::vector<Tensor> kept;
    for (size_t i = 0; i < x.size(); ++i) {
      const Tensor t = sum(tanh(i % 2 == 0 ? x[i] + w_on : x[i] * w_off));
      if (i % 2 == 0)
        loss = loss.defined() ? loss + t : t;
      else
        kept.push_back(t);
    }
    loss.backward();
    return w_on.grad().clone();
  };
  const Tensor want = run(false);
  CHECK_FALSE(w_off.grad().defined());
  const Tensor got = run(true);
  CHECK(close(got, want, 1e-5));
  CHECK_FALSE(w_off.grad().defined());
}

// Three samples of one structure, abs(std(x * w)), the third only read detached, and of equal
// values (x[2] is all ones, w one number), where std's gradient rule gives NaN for a zero
// gradient. Batched with the others, it got the batched backward's zeros, which std's rule made
// NaN, and the NaN reached w through the product's sum over samples. Eagerly no gradient reaches
// that std at all. (The third x gets no gradient either way: its reader is off the path, and
// detached reads do not reach it.) Checks the gradients of w and each x, eager against the
// scope, with the loss read before the backward where read_first; returns the scope's row gates.
int64_t check_std_off_the_path(bool read_first) {
  manual_seed(11);
  Tensor w = randn({1}).requires_grad_(true);
  std::vector<Tensor> x{randn({3}).requires_grad_(true), randn({3}).requires_grad_(true),
                        ones({3}).requires_grad_(true)};
  int64_t gates = 0;
  auto run = [&](bool batched) {
    w.set_grad(Tensor());
    for (Tensor& t : x) t.set_grad(Tensor());
    std::vector<Tensor> g;
    {
      std::optional<Autobatch> scope;
      if (batched) scope.emplace();
      Tensor loss, scale;
      for (size_t i = 0; i < x.size(); ++i) {
        const Tensor a = abs(std(x[i] * w));
        if (i < 2)
          loss = loss.defined() ? loss + a : a;
        else
          scale = (a + 0.5).detach();
      }
      const Tensor l = loss * scale;
      if (read_first) (void)l.item<float>();
      l.backward();
      g.push_back(w.grad().clone());
      for (const Tensor& t : x) g.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
    }
    if (batched) gates = autobatch_stats().row_gates;
    return g;
  };
  const std::vector<Tensor> want = run(false), got = run(true);
  REQUIRE(got.size() == want.size());
  CHECK_FALSE(want[3].defined());
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CHECK(want[k].defined() == got[k].defined());
    if (want[k].defined() && got[k].defined()) CHECK(close(got[k], want[k], 1e-5));
  }
  return gates;
}

// Note [Groups on the loss's path] in eager/autobatch.cpp: the backward starts the run, which
// splits the std's group by the loss's path.
TEST_CASE("autobatch: samples off the loss's path do not share the backward's groups") {
  check_std_off_the_path(/*read_first=*/false);
}

// A run that the backward starts finds its loss among the pending ops (the op its lazy storage
// names), so every group on the loss's path runs without row gates; a loss not found would gate
// every batched operand, the results the same and the run slower.
TEST_CASE("autobatch: a run that a backward starts finds its loss and gates no rows") {
  manual_seed(5);
  Tensor w = randn({3}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int i = 0; i < 4; ++i) x.push_back(randn({3}).requires_grad_(true));
  auto run = [&](bool batched) {
    w.set_grad(Tensor());
    for (Tensor& t : x) t.set_grad(Tensor());
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    Tensor loss;
    for (const Tensor& t : x) {
      const Tensor l = sum(tanh(t * w));
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    std::vector<Tensor> g{w.grad().clone()};
    for (const Tensor& t : x) g.push_back(t.grad().clone());
    return g;
  };
  const std::vector<Tensor> want = run(false), got = run(true);
  const AutobatchStats s = autobatch_stats();
  CHECK(s.batches > 0);
  CHECK(s.row_gates == 0);
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CHECK(close(got[k], want[k], 1e-5));
  }
}

// Note [Row gates] in eager/autobatch_reach.cpp: the run starts at a read of the loss before the
// backward (as a loop that logs its loss does), so it cannot split its groups by the loss's
// path. The std's group batches the third sample with the others; its batched operand's gate
// sets the third row of the gradient to zero after std's rule made it NaN. Without the gates w's
// gradient is NaN (autobatch seeds 320822 and 585027 of test_autobatch_random).
TEST_CASE("autobatch: a run that a read starts stops the off-path samples' NaN at its row gates") {
  CHECK(check_std_off_the_path(/*read_first=*/true) > 0);
}

// A detached read sends no gradient, so a backward reaches nothing through it: b is read only
// detached, and the mark of the loss (Note [Gradients off the loss's path]) walked through that
// read too, so x[1]'s gate passed its zeros on (a gradient where eagerly it has none). The run
// starts at item(), before the backward, as where a loop logs its loss.
TEST_CASE("autobatch: a backward reaches nothing through a detached read") {
  manual_seed(12);
  std::vector<Tensor> x{randn({3}).requires_grad_(true), randn({3}).requires_grad_(true)};
  auto run = [&](bool batched) {
    for (Tensor& t : x) t.set_grad(Tensor());
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    const Tensor a = sum(x[0] * 2), b = sum(x[1] * 2).detach();
    const Tensor loss = a * b;
    (void)loss.item<float>();
    loss.backward();
    return std::make_pair(x[0].grad().clone(), x[1].grad().defined());
  };
  const auto [want, want_b] = run(false);
  const auto [got, got_b] = run(true);
  CHECK_FALSE(want_b);
  CHECK_FALSE(got_b);
  CHECK(close(got, want, 1e-6));
}

}  // namespace
}  // namespace duet::test
