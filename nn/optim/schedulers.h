// duet: learning-rate schedulers (docs/optim.md), as torch.optim.lr_scheduler: StepLR,
// CosineAnnealingLR, LinearLR, OneCycleLR and SequentialLR.
//
// Note [Schedulers and compiled steps]
// A scheduler is host bookkeeping: step() computes the next learning rate as a double, with
// PyTorch's formulas, and writes it into the optimizer with Optimizer::set_lr, which copies it
// into the optimizer's 0-d learning-rate tensor in place. The update reads that tensor (Note
// [Optimizers under compile] in nn/optim/optim.h), so a compiled training step that captured it
// uses the scheduled value at its next call, with no retrace. It follows that step() belongs
// outside the compiled function, between its calls: inside a trace the value would be fixed in
// the graph, so there it is a ValueError.
//
// As in PyTorch, step() uses each scheduler's chainable (recursive) form, which starts from the
// optimizer's current learning rate, so two schedulers stepped on one optimizer compose
// multiplicatively; SequentialLR starts each later scheduler at its milestone from its closed
// form at step 0. The constructor takes the first step (last_epoch 0), as PyTorch's does.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nn/optim/optim.h"

namespace duet::optim {

/// Base of the schedulers (torch.optim.lr_scheduler.LRScheduler). A scheduler holds a
/// reference to its optimizer, which must outlive it and stay where it is (not moved from).
/// Not copyable or movable, so that SequentialLR's references to schedulers stay valid.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances the schedule by one step and sets the optimizer's learning rate (in place: Note
  /// [Schedulers and compiled steps]). Call it after the optimizer's step, outside any compiled
  /// function.
  virtual void step();
  /// The learning rate this scheduler set last (PyTorch returns one per parameter group; a duet
  /// optimizer has one).
  double get_last_lr() const { return last_lr_; }
  /// Steps taken: 0 after construction, then one more per step() (PyTorch's last_epoch).
  int64_t last_epoch() const { return last_epoch_; }
  /// The learning rate the schedule starts from: the optimizer's initial_lr().
  double base_lr() const { return base_lr_; }
  Optimizer& optimizer() const { return *optimizer_; }
  /// "StepLR", ...: the name errors start with.
  const std::string& name() const { return name_; }

 protected:
  LRScheduler(Optimizer& optimizer, std::string name);
  /// Ends a derived constructor, after its checks: sets the optimizer's initial_lr to
  /// `initial_lr` if given, else to its current lr when no scheduler has set one; takes base_lr_
  /// from it, and takes the first step in initial mode (PyTorch's _initial_step). If that step
  /// throws, the optimizer's initial_lr is put back.
  void start(std::optional<double> initial_lr = std::nullopt);
  /// The chainable form at last_epoch_, from the optimizer's current learning rate.
  virtual double get_lr() = 0;
  /// The closed form at last_epoch_, from base_lr_; get_lr() where a scheduler has none.
  virtual double closed_form_lr() { return get_lr(); }
  /// PyTorch's _initial_step: step() with is_initial_ set (PyTorch's _step_count, which only
  /// its resume-from-last_epoch paths read, is left out).
  void initial_step();
  /// PyTorch's _update_lr(epoch): last_epoch_ = epoch, the closed form written.
  void restart_at(int64_t epoch);
  /// Writes lr into the optimizer and records it as the last learning rate.
  void apply(double lr);
  /// Raises a ValueError naming `what` when called inside a trace.
  void check_not_tracing(const char* what) const;

  Optimizer* optimizer_;
  std::string name_;
  double base_lr_ = 0;
  int64_t last_epoch_ = -1;
  bool is_initial_ = false;
  double last_lr_ = 0;

  friend class SequentialLR;
};

/// torch.optim.lr_scheduler.StepLR: the learning rate times gamma every step_size steps, so
/// base_lr * gamma^(last_epoch / step_size) (integer division) when nothing else changes it.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double get_lr() override;
  double closed_form_lr() override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// torch.optim.lr_scheduler.CosineAnnealingLR: eta_min + (base_lr - eta_min) (1 + cos(pi t /
/// T_max)) / 2 at step t, computed recursively from the current learning rate as PyTorch does.
/// Past T_max the cosine goes on (back up to base_lr at 2 T_max), as PyTorch's.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);

 protected:
  double get_lr() override;
  double closed_form_lr() override;

 private:
  int64_t T_max_;
  double eta_min_;
};

/// torch.optim.lr_scheduler.LinearLR, the usual warm-up: the learning rate times a factor that
/// goes linearly from start_factor at step 0 to end_factor at step total_iters, and stays there:
/// base_lr (start + (end - start) min(t, total_iters) / total_iters).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);

 protected:
  double get_lr() override;
  double closed_form_lr() override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

struct OneCycleLROptions {
  double pct_start = 0.3;               ///< the share of the steps spent going up
  std::string anneal_strategy = "cos";  ///< "cos" or "linear"
  double div_factor = 25;               ///< initial_lr = max_lr / div_factor
  double final_div_factor = 1e4;        ///< min_lr = initial_lr / final_div_factor
  /// Three phases, as the paper: up to max_lr, back down to initial_lr symmetrically, then
  /// down to min_lr. Without it (fastai's two phases), the second goes from max_lr to min_lr.
  bool three_phase = false;
};

/// torch.optim.lr_scheduler.OneCycleLR with total_steps: the 1cycle policy, from
/// max_lr / div_factor up to max_lr over pct_start of the steps, then down to min_lr. It sets
/// the optimizer's initial_lr to max_lr / div_factor. The schedule ends at min_lr after
/// total_steps - 1 calls of step(); PyTorch allows one call more (its value overshoots the last
/// phase a little), and so does this, and a call past that is a ValueError. (Where that
/// overshoot of a linear schedule is below 0, PyTorch sets the negative rate; duet sets 0.) Not
/// chainable: it computes each value from the phases, not from the current learning rate. PyTorch's
/// cycle_momentum is left out: duet's optimizers take momentum and betas as constants of the graph,
/// not tensors, so there is no momentum to cycle.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             OneCycleLROptions options = {});
  const OneCycleLROptions& options() const { return options_; }

 protected:
  double get_lr() override;

 private:
  struct Phase {
    double end_step, start_lr, end_lr;
  };
  OneCycleLROptions options_;
  int64_t total_steps_;
  std::vector<Phase> phases_;
};

/// torch.optim.lr_scheduler.SequentialLR: schedulers[0] runs until milestones[0], where
/// schedulers[1] starts from its closed form at step 0, and so on. The schedulers must belong to
/// `optimizer`; they are held by reference, so they must outlive this one. The constructor
/// resets the learning rate to the optimizer's initial_lr, undoes the first step each
/// scheduler's constructor took, and takes schedulers[0]'s first step again, as PyTorch's does.
/// Milestones must increase, one fewer than the schedulers. A SequentialLR inside another is
/// not supported.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::reference_wrapper<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void step() override;

 protected:
  double get_lr() override;

 private:
  std::vector<std::reference_wrapper<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace duet::optim
