// duet: the learning-rate schedulers, PyTorch's formulas on doubles (Note [Schedulers and
// compiled steps] in nn/optim/schedulers.h).
#include "nn/optim/schedulers.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "core/error.h"
#include "trace/tracer.h"

namespace duet::optim {

// ---- LRScheduler ----

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name)
    : optimizer_(&optimizer), name_(std::move(name)) {}

void LRScheduler::check_not_tracing(const char* what) const {
  DUET_CHECK_VALUE(duet::detail::Tracer::current() == nullptr,
                   "[{}] {} inside a compiled function: the learning rate it sets would be a "
                   "constant of the graph. Call it outside, between calls of the compiled step "
                   "(the step reads the learning-rate tensor, so it follows without a retrace)",
                   name_, what);
}

void LRScheduler::start(std::optional<double> initial_lr) {
  check_not_tracing("a scheduler made");
  const std::optional<double> before = optimizer_->initial_lr();
  if (initial_lr)
    optimizer_->set_initial_lr(*initial_lr);
  else if (!before)
    optimizer_->set_initial_lr(optimizer_->lr());
  base_lr_ = *optimizer_->initial_lr();
  try {
    initial_step();
  } catch (...) {
    optimizer_->set_initial_lr(before);  // a scheduler that failed to start leaves no trace
    throw;
  }
}

void LRScheduler::initial_step() {
  is_initial_ = true;
  try {
    step();
  } catch (...) {
    is_initial_ = false;
    throw;
  }
  is_initial_ = false;
}

void LRScheduler::apply(double lr) {
  optimizer_->set_lr(lr);
  last_lr_ = optimizer_->lr();
}

void LRScheduler::step() {
  check_not_tracing("step()");
  // The step count moves first, as in PyTorch (get_lr reads it), and back if the step fails.
  ++last_epoch_;
  try {
    apply(get_lr());
  } catch (...) {
    --last_epoch_;
    throw;
  }
}

void LRScheduler::restart_at(int64_t epoch) {
  last_epoch_ = epoch;
  apply(closed_form_lr());
}

// ---- StepLR ----

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  DUET_CHECK_VALUE(step_size >= 1, "[StepLR] invalid step_size {}: it must be >= 1", step_size);
  DUET_CHECK_VALUE(gamma >= 0, "[StepLR] invalid gamma {}: it must be >= 0", gamma);
  start();
}

double StepLR::get_lr() {
  const double lr = optimizer_->lr();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lr;
  return lr * gamma_;
}

double StepLR::closed_form_lr() {
  return base_lr_ * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_));
}

// ---- CosineAnnealingLR ----

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), T_max_(T_max), eta_min_(eta_min) {
  DUET_CHECK_VALUE(T_max >= 1, "[CosineAnnealingLR] invalid T_max {}: it must be >= 1", T_max);
  DUET_CHECK_VALUE(eta_min >= 0, "[CosineAnnealingLR] invalid eta_min {}: it must be >= 0",
                   eta_min);
  start();
}

double CosineAnnealingLR::get_lr() {
  using std::numbers::pi;
  const double lr = optimizer_->lr();
  const double t = static_cast<double>(last_epoch_), T = static_cast<double>(T_max_);
  if (is_initial_) return lr;
  // Where the ratio below would divide by 1 + cos(pi) = 0 (the step after each minimum), PyTorch
  // adds the closed form's increment instead. (PyTorch also has a branch for a scheduler resumed
  // at a later last_epoch, which duet's schedulers cannot be.)
  if ((last_epoch_ - 1 - T_max_) % (2 * T_max_) == 0)
    return lr + (base_lr_ - eta_min_) * (1 - std::cos(pi / T)) / 2;
  return (1 + std::cos(pi * t / T)) / (1 + std::cos(pi * (t - 1) / T)) * (lr - eta_min_) + eta_min_;
}

double CosineAnnealingLR::closed_form_lr() {
  using std::numbers::pi;
  return eta_min_ +
         (base_lr_ - eta_min_) * (1 + std::cos(pi * static_cast<double>(last_epoch_) / T_max_)) / 2;
}

// ---- LinearLR ----

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  DUET_CHECK_VALUE(start_factor > 0 && start_factor <= 1,
                   "[LinearLR] invalid start_factor {}: it must be in (0, 1]", start_factor);
  DUET_CHECK_VALUE(end_factor >= 0 && end_factor <= 1,
                   "[LinearLR] invalid end_factor {}: it must be in [0, 1]", end_factor);
  DUET_CHECK_VALUE(total_iters >= 1, "[LinearLR] invalid total_iters {}: it must be >= 1",
                   total_iters);
  start();
}

double LinearLR::get_lr() {
  const double lr = optimizer_->lr();
  if (last_epoch_ == 0) return lr * start_factor_;
  if (is_initial_ || last_epoch_ > total_iters_) return lr;
  const double span = end_factor_ - start_factor_;
  return lr * (1.0 + span / (static_cast<double>(total_iters_) * start_factor_ +
                             static_cast<double>(last_epoch_ - 1) * span));
}

double LinearLR::closed_form_lr() {
  return base_lr_ * (start_factor_ + (end_factor_ - start_factor_) *
                                         static_cast<double>(std::min(total_iters_, last_epoch_)) /
                                         static_cast<double>(total_iters_));
}

// ---- OneCycleLR ----

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       OneCycleLROptions options)
    : LRScheduler(optimizer, "OneCycleLR"),
      options_(std::move(options)),
      total_steps_(total_steps) {
  const OneCycleLROptions& o = options_;
  DUET_CHECK_VALUE(max_lr >= 0, "[OneCycleLR] invalid max_lr {}: it must be >= 0", max_lr);
  DUET_CHECK_VALUE(total_steps >= 1, "[OneCycleLR] invalid total_steps {}: it must be >= 1",
                   total_steps);
  DUET_CHECK_VALUE(o.pct_start >= 0 && o.pct_start <= 1,
                   "[OneCycleLR] invalid pct_start {}: it must be in [0, 1]", o.pct_start);
  DUET_CHECK_VALUE(o.anneal_strategy == "cos" || o.anneal_strategy == "linear",
                   "[OneCycleLR] invalid anneal_strategy \"{}\": it must be \"cos\" or \"linear\"",
                   o.anneal_strategy);
  DUET_CHECK_VALUE(o.div_factor > 0, "[OneCycleLR] invalid div_factor {}: it must be > 0",
                   o.div_factor);
  DUET_CHECK_VALUE(o.final_div_factor > 0,
                   "[OneCycleLR] invalid final_div_factor {}: it must be > 0", o.final_div_factor);
  const double initial = max_lr / o.div_factor, min_lr = initial / o.final_div_factor;
  const double total = static_cast<double>(total_steps), up = o.pct_start * total - 1;
  if (o.three_phase)
    phases_ = {{up, initial, max_lr},
               {2 * o.pct_start * total - 2, max_lr, initial},
               {total - 1, initial, min_lr}};
  else
    phases_ = {{up, initial, max_lr}, {total - 1, max_lr, min_lr}};
  // PyTorch's OneCycleLR writes the group's initial_lr itself, over any earlier one.
  start(initial);
}

double OneCycleLR::get_lr() {
  using std::numbers::pi;
  DUET_CHECK_VALUE(last_epoch_ <= total_steps_,
                   "[OneCycleLR] tried to step {} times; the specified number of total steps is {}",
                   last_epoch_, total_steps_);
  const double t = static_cast<double>(last_epoch_);
  double start_step = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& ph = phases_[i];
    if (t <= ph.end_step || i + 1 == phases_.size()) {
      // PyTorch divides by zero here (a ZeroDivisionError) when a phase has no length.
      DUET_CHECK_VALUE(ph.end_step != start_step,
                       "[OneCycleLR] phase {} has no steps (it starts and ends at step {}) with "
                       "total_steps {} and pct_start {}",
                       i, start_step, total_steps_, options_.pct_start);
      const double pct = (t - start_step) / (ph.end_step - start_step);
      if (options_.anneal_strategy == "cos")
        return ph.end_lr + (ph.start_lr - ph.end_lr) / 2.0 * (std::cos(pi * pct) + 1);
      // At step total_steps the linear overshoot can fall below 0, which PyTorch sets as it is;
      // no duet optimizer takes a negative rate, so it stops at 0.
      return std::max(0.0, (ph.end_lr - ph.start_lr) * pct + ph.start_lr);
    }
    start_step = ph.end_step;
  }
  return optimizer_->lr();  // not reached: the last phase always returns
}

// ---- SequentialLR ----

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::reference_wrapper<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, "SequentialLR"),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  check_not_tracing("a scheduler made");
  DUET_CHECK_VALUE(!schedulers_.empty(), "[SequentialLR] expects at least one scheduler, got none");
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    const LRScheduler& s = schedulers_[i].get();
    DUET_CHECK_VALUE(&s.optimizer() == &optimizer,
                     "[SequentialLR] scheduler {} ({}) belongs to another optimizer than the "
                     "{} given; all must belong to the same one",
                     i, s.name(), optimizer.name());
    DUET_CHECK_VALUE(dynamic_cast<const SequentialLR*>(&s) == nullptr,
                     "[SequentialLR] scheduler {} is a SequentialLR: nesting is not supported", i);
  }
  DUET_CHECK_VALUE(milestones_.size() + 1 == schedulers_.size(),
                   "[SequentialLR] expects one milestone fewer than schedulers, got {} "
                   "schedulers and {} milestones",
                   schedulers_.size(), milestones_.size());
  for (size_t i = 0; i < milestones_.size(); ++i)
    DUET_CHECK_VALUE(milestones_[i] > (i == 0 ? 0 : milestones_[i - 1]),
                     "[SequentialLR] milestones must be positive and increase; got {} after {}",
                     milestones_[i], i == 0 ? int64_t{0} : milestones_[i - 1]);
  // Every scheduler made before has recorded the optimizer's initial_lr.
  base_lr_ = optimizer.initial_lr().value_or(optimizer.lr());
  last_epoch_ = 0;
  optimizer.set_lr(base_lr_);
  for (auto& s : schedulers_) s.get().last_epoch_ -= 1;
  schedulers_[0].get().initial_step();
  last_lr_ = schedulers_[0].get().get_last_lr();
}

void SequentialLR::step() {
  check_not_tracing("step()");
  ++last_epoch_;
  const size_t idx = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& s = schedulers_[idx].get();
  try {
    if (idx > 0 && milestones_[idx - 1] == last_epoch_)
      s.restart_at(0);
    else
      s.step();
  } catch (...) {
    --last_epoch_;
    throw;
  }
  last_lr_ = s.get_last_lr();
}

double SequentialLR::get_lr() { return optimizer_->lr(); }

}  // namespace duet::optim
