// Learning-rate schedulers (nn/optim/schedulers.h): every step against PyTorch's documented
// closed forms, chaining, SequentialLR, the learning-rate tensor the update reads, compiled
// training steps that follow a schedule with one trace, and errors.
#include <cmath>
#include <functional>
#include <memory>
#include <numbers>

#include "nn/layers.h"
#include "nn/optim/schedulers.h"
#include "nn/utils.h"
#include "nn_rows.h"
#include "util.h"

namespace duet::test {
namespace {

using optim::CosineAnnealingLR;
using optim::LinearLR;
using optim::LRScheduler;
using optim::OneCycleLR;
using optim::SequentialLR;
using optim::SGD;
using optim::StepLR;
using std::numbers::pi;

// ---- PyTorch's closed forms, as its documentation writes them ----

double step_lr(double base, int64_t t, int64_t step_size, double gamma) {
  return base * std::pow(gamma, static_cast<double>(t / step_size));
}
double cosine_lr(double base, int64_t t, int64_t T_max, double eta_min) {
  return eta_min + 0.5 * (base - eta_min) * (1 + std::cos(pi * t / T_max));
}
double linear_lr(double base, int64_t t, double start, double end, int64_t total) {
  return base * (start + (end - start) * static_cast<double>(std::min(t, total)) / total);
}
/// The 1cycle policy: from initial = max_lr / div up to max_lr over the steps 0 .. pct T - 1,
/// then (two phases) down to min = initial / final_div at step T - 1, or (three phases) back to
/// initial at step 2 pct T - 2 and down to min at T - 1; each piece annealed by cosine or
/// linearly in the fraction of its steps done.
double one_cycle_lr(int64_t t, double max_lr, int64_t T, double pct, bool cos, double div,
                    double final_div, bool three_phase) {
  const double initial = max_lr / div, min_lr = initial / final_div;
  auto anneal = [&](double from, double to, double frac) {
    return cos ? to + (from - to) * (1 + std::cos(pi * frac)) / 2 : from + (to - from) * frac;
  };
  const double up = pct * T - 1;
  if (t <= up) return anneal(initial, max_lr, t / up);
  if (!three_phase) return anneal(max_lr, min_lr, (t - up) / (T - 1 - up));
  const double down = 2 * pct * T - 2;
  if (t <= down) return anneal(max_lr, initial, (t - up) / (down - up));
  return anneal(initial, min_lr, (t - down) / (T - 1 - down));
}

/// |got - want| within 1e-9 relative (PyTorch's recursive forms drift from the closed ones by a
/// few ulps per step), far inside the 1e-6 asked of them.
void check_lr(double got, double want) {
  CHECK_MESSAGE(std::abs(got - want) <= 1e-9 * std::abs(want) + 1e-15, got, " vs ", want);
}

Tensor param() { return zeros({2}, Options().dtype(DType::f64)).requires_grad_(); }

/// Steps `sched` n times and checks get_last_lr() and the optimizer's lr against want(t) at
/// t = 0 (after construction) .. n.
void check_schedule(LRScheduler& sched, int n, const std::function<double(int64_t)>& want) {
  for (int64_t t = 0; t <= n; ++t) {
    CAPTURE(t);
    if (t > 0) sched.step();
    CHECK(sched.last_epoch() == t);
    check_lr(sched.get_last_lr(), want(t));
    CHECK(sched.optimizer().lr() == sched.get_last_lr());
  }
}

TEST_CASE("lr_scheduler: StepLR, CosineAnnealingLR and LinearLR follow PyTorch's closed forms") {
  Tensor p = param();
  {
    SGD opt({p}, {.lr = 0.1});
    StepLR s(opt, 3, 0.5);
    CHECK(s.base_lr() == 0.1);
    check_schedule(s, 20, [](int64_t t) { return step_lr(0.1, t, 3, 0.5); });
  }
  {
    SGD opt({p}, {.lr = 0.05});
    StepLR s(opt, 1);  // PyTorch's default gamma 0.1
    check_schedule(s, 4, [](int64_t t) { return step_lr(0.05, t, 1, 0.1); });
  }
  // Past T_max the cosine goes back up, through the step after the minimum (PyTorch's special
  // case of its recursion) and on past 2 T_max.
  for (double eta_min : {0.0, 0.001}) {
    CAPTURE(eta_min);
    SGD opt({p}, {.lr = 0.1});
    CosineAnnealingLR s(opt, 10, eta_min);
    check_schedule(s, 45, [&](int64_t t) { return cosine_lr(0.1, t, 10, eta_min); });
  }
  {
    SGD opt({p}, {.lr = 0.2});
    CosineAnnealingLR s(opt, 1);
    check_schedule(s, 5, [](int64_t t) { return cosine_lr(0.2, t, 1, 0); });
  }
  {
    SGD opt({p}, {.lr = 0.1});
    LinearLR s(opt, 0.25, 1.0, 4);
    check_schedule(s, 10, [](int64_t t) { return linear_lr(0.1, t, 0.25, 1.0, 4); });
  }
  {
    SGD opt({p}, {.lr = 0.3});
    LinearLR s(opt);  // PyTorch's defaults: 1/3 to 1 over 5 steps
    check_schedule(s, 8, [](int64_t t) { return linear_lr(0.3, t, 1.0 / 3, 1.0, 5); });
  }
  {
    SGD opt({p}, {.lr = 0.1});
    LinearLR s(opt, 1.0, 0.2, 6);  // a linear decay
    check_schedule(s, 9, [](int64_t t) { return linear_lr(0.1, t, 1.0, 0.2, 6); });
  }
  // Hand values: PyTorch's documented LinearLR example (lr 0.05, start_factor 0.05, 40 steps).
  {
    SGD opt({p}, {.lr = 0.05});
    LinearLR s(opt, 0.05, 1.0, 40);
    check_lr(s.get_last_lr(), 0.0025);
    s.step();
    check_lr(s.get_last_lr(), 0.05 * (0.05 + 0.95 / 40));
  }
}

TEST_CASE("lr_scheduler: OneCycleLR, two and three phases, cos and linear") {
  Tensor p = param();
  struct Row {
    int64_t total;
    optim::OneCycleLROptions o;
  };
  const std::vector<Row> rows = {
      {20, {}},
      {20, {.anneal_strategy = "linear"}},
      {20, {.three_phase = true}},
      {20, {.anneal_strategy = "linear", .three_phase = true}},
      {15, {.pct_start = 0.25, .div_factor = 10, .final_div_factor = 100}},  // up ends at 2.75
      {17, {.pct_start = 0.4, .anneal_strategy = "linear", .three_phase = true}},
  };
  for (const Row& r : rows) {
    CAPTURE(r.total);
    CAPTURE(r.o.anneal_strategy);
    CAPTURE(r.o.three_phase);
    SGD opt({p}, {.lr = 123.0});  // OneCycleLR ignores the optimizer's learning rate
    OneCycleLR s(opt, 0.5, r.total, r.o);
    CHECK(s.base_lr() == 0.5 / r.o.div_factor);
    CHECK(opt.initial_lr() == 0.5 / r.o.div_factor);
    // PyTorch allows total_steps calls of step() (the last one past the end of the cycle).
    // The linear overshoot at step total_steps may be negative, where duet stops at 0.
    check_schedule(s, static_cast<int>(r.total), [&](int64_t t) {
      return std::max(0.0,
                      one_cycle_lr(t, 0.5, r.total, r.o.pct_start, r.o.anneal_strategy == "cos",
                                   r.o.div_factor, r.o.final_div_factor, r.o.three_phase));
    });
    std::string msg = error_of<ValueError>([&] { s.step(); });
    CHECK(contains(msg, "[OneCycleLR] tried to step"));
    CHECK(s.last_epoch() == r.total);  // the failed step changed nothing
  }
  // Hand values at the ends of the phases: max_lr / 25 at the start, max_lr at step 5, and
  // max_lr / 25 / 1e4 at step 19.
  SGD opt({p}, {.lr = 0.1});
  OneCycleLR s(opt, 0.5, 20);
  check_lr(s.get_last_lr(), 0.02);
  for (int i = 0; i < 5; ++i) s.step();
  check_lr(s.get_last_lr(), 0.5);
  for (int i = 0; i < 14; ++i) s.step();
  check_lr(s.get_last_lr(), 0.02 / 1e4);
}

TEST_CASE("lr_scheduler: SequentialLR hands over at the milestones") {
  Tensor p = param();
  {
    // Warm-up then cosine: the usual pairing.
    SGD opt({p}, {.lr = 0.1});
    LinearLR warmup(opt, 0.1, 1.0, 5);
    CosineAnnealingLR cosine(opt, 15, 1e-4);
    SequentialLR s(opt, {warmup, cosine}, {5});
    CHECK(s.base_lr() == 0.1);
    check_schedule(s, 25, [](int64_t t) {
      return t < 5 ? linear_lr(0.1, t, 0.1, 1.0, 5) : cosine_lr(0.1, t - 5, 15, 1e-4);
    });
    CHECK(warmup.last_epoch() == 4);
    CHECK(cosine.last_epoch() == 20);
  }
  {
    // Three schedulers; the middle one starts from its closed form at step 0 (base_lr * 0.5).
    SGD opt({p}, {.lr = 0.4});
    StepLR decay(opt, 2, 0.5);
    LinearLR ramp(opt, 0.5, 1.0, 3);
    CosineAnnealingLR cosine(opt, 6);
    SequentialLR s(opt, {decay, ramp, cosine}, {4, 8});
    check_schedule(s, 16, [](int64_t t) {
      if (t < 4) return step_lr(0.4, t, 2, 0.5);
      if (t < 8) return linear_lr(0.4, t - 4, 0.5, 1.0, 3);
      return cosine_lr(0.4, t - 8, 6, 0);
    });
  }
  {
    // PyTorch's documented example, with ConstantLR(factor 0.1, total_iters 2) written as a
    // LinearLR from 0.1 to 0.1 (lr 0.1, 0.1, then the StepLR from 1 at the milestone 2).
    SGD opt({p}, {.lr = 1.0});
    LinearLR constant(opt, 0.1, 0.1, 2);
    StepLR step(opt, 1, 0.9);
    SequentialLR s(opt, {constant, step}, {2});
    const double want[] = {0.1, 0.1, 1.0, 0.9, 0.81, 0.729};
    check_schedule(s, 5, [&](int64_t t) { return want[t]; });
  }
}

TEST_CASE("lr_scheduler: two schedulers stepped on one optimizer compose, as PyTorch's chain") {
  // Each step() starts from the optimizer's current learning rate, so the factors multiply:
  // PyTorch's chainable form (and its ChainedScheduler).
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1});
  StepLR decay(opt, 2, 0.5);
  LinearLR warmup(opt, 0.5, 1.0, 4);
  for (int64_t t = 0; t <= 12; ++t) {
    CAPTURE(t);
    if (t > 0) {
      decay.step();
      warmup.step();
    }
    check_lr(opt.lr(), 0.1 * std::pow(0.5, static_cast<double>(t / 2)) *
                           (0.5 + 0.5 * static_cast<double>(std::min<int64_t>(t, 4)) / 4));
  }
  // The first scheduler recorded the initial_lr; the second started from it too.
  CHECK(opt.initial_lr() == 0.1);
  CHECK(warmup.base_lr() == 0.1);
}

TEST_CASE("lr_scheduler: the update reads the learning rate the scheduler set") {
  // SGD with a constant gradient 1 moves p by exactly -lr per step, so p after n steps is minus
  // the sum of the learning rates the schedule gave.
  Tensor p = zeros({1}, Options().dtype(DType::f64)).requires_grad_();
  SGD opt({p}, {.lr = 0.1});
  CosineAnnealingLR s(opt, 8, 0.01);
  double sum = 0;
  for (int64_t t = 0; t < 10; ++t) {
    p.set_grad(ones({1}, Options().dtype(DType::f64)));
    opt.step();
    sum += cosine_lr(0.1, t, 8, 0.01);
    s.step();
  }
  check_tensor(p, {1}, DType::f64, {-sum}, 1e-12, 1e-12);
}

// ---- compiled training steps over a schedule ----

/// A tiny MLP of raw tensors: 6 -> 12 -> tanh -> 3.
struct Net {
  std::vector<Tensor> params;
  explicit Net(uint64_t seed) {
    manual_seed(seed);
    Options o = Options().dtype(DType::f64);
    params = {randn({12, 6}, o) * 0.4, randn({12}, o) * 0.1, randn({3, 12}, o) * 0.4,
              randn({3}, o) * 0.1};
    for (Tensor& p : params) p = p.detach().requires_grad_();
  }
  Tensor forward(const Tensor& x) const {
    return linear(tanh(linear(x, params[0], params[1])), params[2], params[3]);
  }
};

Tensor train_step(Net& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = cross_entropy(m.forward(x), y);
  loss.backward();
  opt.step();
  return loss;
}

TEST_CASE("lr_scheduler: a compiled step follows each schedule like eager, with one trace") {
  const std::vector<ScheduleRow>& rows = schedule_rows();

  const int n = 15;
  for (const ScheduleRow& r : rows) {
    for (bool adam : {false, true}) {
      CAPTURE(r.name);
      CAPTURE(adam);
      Net eager(21), compiled(21), fixed(21);
      auto make_opt = [&](Net& m) -> std::unique_ptr<optim::Optimizer> {
        if (adam) return std::make_unique<optim::Adam>(m.params, optim::AdamOptions{.lr = 0.05});
        return std::make_unique<SGD>(m.params, optim::SGDOptions{.lr = 0.2, .momentum = 0.9});
      };
      auto eager_opt = make_opt(eager), compiled_opt = make_opt(compiled),
           fixed_opt = make_opt(fixed);
      std::vector<std::unique_ptr<LRScheduler>> held_e, held_c;
      auto eager_sched = r.make(*eager_opt, held_e);
      auto compiled_sched = r.make(*compiled_opt, held_c);
      manual_seed(22);
      Tensor x = randn({8, 6}, Options().dtype(DType::f64));
      Tensor y = randint(3, {8});
      auto step = compile([&](Tensor in, Tensor target) {
        return train_step(compiled, *compiled_opt, in, target);
      });
      // `fixed` runs with the learning rate as first set, never scheduled: what a step that
      // baked the learning rate in would give.
      fixed_opt->set_lr(compiled_opt->lr());
      for (int i = 0; i < n; ++i) {
        CAPTURE(i);
        Tensor le = train_step(eager, *eager_opt, x, y);
        Tensor lc = step(x, y);
        train_step(fixed, *fixed_opt, x, y);
        CHECK(close(le, lc, 1e-12));
        eager_sched->step();
        compiled_sched->step();
        CHECK(eager_sched->get_last_lr() == compiled_sched->get_last_lr());
      }
      for (size_t i = 0; i < eager.params.size(); ++i)
        CHECK(close(eager.params[i], compiled.params[i], 1e-11));
      CHECK_FALSE(close(compiled.params[0], fixed.params[0], 1e-6));
      CHECK(step.stats().traces == 1);
      CHECK(step.stats().hits == n - 1);
    }
  }
}

TEST_CASE("lr_scheduler: the example of docs/optim.md runs, with one trace") {
  // The page's example as written there: warm-up and cosine in a SequentialLR, clipping and
  // AdamW in a compiled step.
  manual_seed(0);
  nn::Sequential model(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 4));
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  optim::LinearLR warmup(opt, 0.1, 1.0, 100);
  optim::CosineAnnealingLR cosine(opt, 900, 1e-5);
  optim::SequentialLR schedule(opt, {warmup, cosine}, {100});
  auto step = compile([&](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model(x), y);
    loss.backward();
    nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    return loss;
  });
  Tensor x = randn({16, 32}), y = randint(4, {16});
  const double first = step(x, y).item<double>();
  schedule.step();
  double last = first;
  for (int i = 1; i < 1000; ++i) {
    last = step(x, y).item<double>();
    schedule.step();
  }
  check_lr(schedule.get_last_lr(), 1e-5);
  CHECK(last < first);
  CHECK(step.stats().traces == 1);
}

// ---- errors ----

TEST_CASE("lr_scheduler: invalid options are errors naming the scheduler and the value") {
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1});
  SGD other({param()}, {.lr = 0.1});
  StepLR a(opt, 2);
  StepLR b(other, 2);
  struct Row {
    std::function<void()> make;
    std::vector<std::string> want;
  };
  const std::vector<Row> rows = {
      {[&] { StepLR(opt, 0); }, {"[StepLR]", "step_size 0"}},
      {[&] { StepLR(opt, 2, -0.5); }, {"[StepLR]", "gamma -0.5"}},
      {[&] { CosineAnnealingLR(opt, 0); }, {"[CosineAnnealingLR]", "T_max 0"}},
      {[&] { CosineAnnealingLR(opt, 5, -1); }, {"[CosineAnnealingLR]", "eta_min -1"}},
      {[&] { LinearLR(opt, 0.0); }, {"[LinearLR]", "start_factor 0", "(0, 1]"}},
      {[&] { LinearLR(opt, 1.5); }, {"[LinearLR]", "start_factor 1.5"}},
      {[&] { LinearLR(opt, 0.5, 2.0); }, {"[LinearLR]", "end_factor 2"}},
      {[&] { LinearLR(opt, 0.5, 1.0, 0); }, {"[LinearLR]", "total_iters 0"}},
      {[&] { OneCycleLR(opt, -1, 10); }, {"[OneCycleLR]", "max_lr -1"}},
      {[&] { OneCycleLR(opt, 0.1, 0); }, {"[OneCycleLR]", "total_steps 0"}},
      {[&] { OneCycleLR(opt, 0.1, 10, {.pct_start = 1.5}); }, {"[OneCycleLR]", "pct_start 1.5"}},
      {[&] { OneCycleLR(opt, 0.1, 10, {.anneal_strategy = "exp"}); },
       {"[OneCycleLR]", "\"exp\"", "\"cos\" or \"linear\""}},
      {[&] { OneCycleLR(opt, 0.1, 10, {.div_factor = 0}); }, {"[OneCycleLR]", "div_factor 0"}},
      {[&] { OneCycleLR(opt, 0.1, 10, {.final_div_factor = -2}); },
       {"[OneCycleLR]", "final_div_factor -2"}},
      // pct_start * total_steps = 1: the first phase ends where it starts (PyTorch divides by 0).
      {[&] { OneCycleLR(opt, 0.1, 10, {.pct_start = 0.1}); },
       {"[OneCycleLR]", "phase 0 has no steps"}},
      {[&] { SequentialLR(opt, {}, {}); }, {"[SequentialLR]", "at least one scheduler"}},
      {[&] { SequentialLR(opt, {a}, {3}); }, {"[SequentialLR]", "1 schedulers and 1 milestones"}},
      {[&] {
         SequentialLR(opt, {a, b}, {3});
       },
       {"[SequentialLR]", "scheduler 1 (StepLR)", "another optimizer"}},
      {[&] {
         StepLR c(opt, 2), d(opt, 2), e(opt, 2);
         SequentialLR(opt, {c, d, e}, {4, 4});
       },
       {"[SequentialLR]", "milestones must be positive and increase", "4 after 4"}},
      {[&] {
         StepLR c(opt, 2);
         SequentialLR inner(opt, {c}, {});
         SequentialLR(opt, {c, inner}, {2});
       },
       {"[SequentialLR]", "scheduler 1 is a SequentialLR"}},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(i);
    const std::string msg = error_of<ValueError>(rows[i].make);
    for (const std::string& w : rows[i].want)
      CHECK_MESSAGE(msg.find(w) != std::string::npos, "\"", w, "\" not in: ", msg);
  }
}

TEST_CASE("lr_scheduler: step() and set_lr inside a compiled function are errors") {
  Net m(5);
  SGD opt(m.params, {.lr = 0.1});
  StepLR sched(opt, 2);
  Tensor x = randn({4, 6}, Options().dtype(DType::f64));
  Tensor y = randint(3, {4});
  auto with_step = compile([&](Tensor in, Tensor target) {
    Tensor loss = train_step(m, opt, in, target);
    sched.step();
    return loss;
  });
  std::string msg = error_of<ValueError>([&] { with_step(x, y); });
  CHECK(contains(msg, "[StepLR] step() inside a compiled function"));
  CHECK(sched.last_epoch() == 0);
  auto with_set_lr = compile([&](Tensor in, Tensor target) {
    opt.set_lr(0.5);
    return train_step(m, opt, in, target);
  });
  msg = error_of<ValueError>([&] { with_set_lr(x, y); });
  CHECK(contains(msg, "[SGD] set_lr inside a compiled function"));
  CHECK(opt.lr() == 0.1);
}

}  // namespace
}  // namespace duet::test
