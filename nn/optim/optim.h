// duet: optimizers (docs/design.md, "nn and optim"; docs/optim.md): SGD, Adam, AdamW and RMSprop,
// with PyTorch's update rules. Learning-rate schedulers are in nn/optim/schedulers.h.
//
// Note [Optimizers under compile]
// An optimizer is written for both faces at once. step() and zero_grad() are in-place tensor
// ops under NoGradGuard, so inside duet::compile they are recorded like any other op, and the
// compiled training step writes parameters, .grad buffers and optimizer state back into their
// storage at every call. Two rules make the replay correct:
//  - All state (momentum buffers, moments, the step count) is made eagerly in the constructor,
//    as zeros. A tensor created inside a trace could not outlive it.
//  - Everything that changes between calls is a tensor that step() reads as a tensor: the step
//    count (a 0-d f64 per parameter, advanced with add_(1), the bias corrections computed with
//    pow of it) and the learning rate (a 0-d f64 per device, which set_lr() writes in place). A
//    C++ double computed from them would be baked into the graph as a constant at trace time.
//    The other hyperparameters are fixed at construction and are constants in the graph.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace duet::optim {

/// Common base: the parameters, the learning rate and zero_grad(). Not copyable (the state
/// tensors are shared handles); movable.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;

  /// Applies one update to every parameter whose .grad is defined (others are skipped and
  /// their state is left as it is, as in PyTorch).
  virtual void step() = 0;
  /// Every tensor step() updates in place besides the parameters (momentum buffers, moments,
  /// step counts): what GradScaler restores when it skips a step. An optimizer of your own
  /// lists its state here; the default lists none.
  virtual std::vector<Tensor> state_tensors() const { return {}; }
  /// Zeroes every existing .grad buffer in place; it does not free them (so a compiled step
  /// keeps stable buffers). Undefined gradients stay undefined.
  void zero_grad();
  /// The parameters, in the order given.
  const std::vector<Tensor>& params() const { return params_; }
  /// Sets the learning rate (>= 0). It is written into a tensor in place, so a compiled step
  /// uses the new value at its next call without a retrace. Inside a compiled function it is a
  /// ValueError (the value would be a constant of the graph).
  void set_lr(double lr);
  /// The learning rate last set.
  double lr() const { return lr_; }
  /// "SGD", "Adam", "AdamW" or "RMSprop": the name errors start with.
  const std::string& name() const { return name_; }
  /// The learning rate the schedulers of this optimizer start from (PyTorch's
  /// param_group["initial_lr"]): set by the first scheduler made for it (OneCycleLR sets its
  /// own), unset before. Scheduler bookkeeping; training code has no need of it.
  std::optional<double> initial_lr() const { return initial_lr_; }
  void set_initial_lr(std::optional<double> lr) { initial_lr_ = lr; }

 protected:
  /// Checks the parameters (non-empty, distinct leaves that require grad) and the learning rate,
  /// and makes the learning-rate tensors.
  Optimizer(std::string name, std::vector<Tensor> params, double lr);
  /// The 0-d f64 learning rate on the device of parameter i.
  const Tensor& lr_tensor(size_t i) const { return lr_of_param_[i]; }

  std::string name_;
  std::vector<Tensor> params_;

 private:
  double lr_;
  std::optional<double> initial_lr_;
  std::vector<Tensor> lr_tensors_;   // one per device the parameters live on
  std::vector<Tensor> lr_of_param_;  // per parameter: the one of its device
};

struct SGDOptions {
  double lr = 0.01, momentum = 0, weight_decay = 0;
  bool nesterov = false;  ///< Nesterov momentum (needs momentum > 0), as torch.optim.SGD
};

/// Stochastic gradient descent, as torch.optim.SGD without dampening:
/// d = g + weight_decay * p; buf = momentum * buf + d; p -= lr * (nesterov ? d + momentum * buf
/// : buf). Without momentum, p -= lr * d. The buffer starts at zero (the same as PyTorch's
/// first buf = d when there is no dampening).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  void step() override;
  std::vector<Tensor> state_tensors() const override;
  const SGDOptions& options() const { return options_; }
  /// The momentum buffer of parameter i (undefined without momentum).
  const Tensor& momentum_buffer(size_t i) const { return buffers_.at(i); }

 private:
  SGDOptions options_;
  std::vector<Tensor> buffers_;
};

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8, weight_decay = 0;
};
/// AdamW's options: AdamOptions with PyTorch's AdamW default weight_decay = 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8, weight_decay = 1e-2;
};

namespace detail {
/// The state of one parameter under Adam or AdamW.
struct AdamState {
  Tensor exp_avg, exp_avg_sq;  ///< first and second moments, zeros like the parameter
  Tensor step;                 ///< 0-d f64: updates applied so far
};
}  // namespace detail

/// Adam, as torch.optim.Adam (amsgrad off). weight_decay is L2: it adds weight_decay * p to the
/// gradient. Per parameter with a gradient: t += 1; m = b1 m + (1 - b1) g;
/// v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  void step() override;
  std::vector<Tensor> state_tensors() const override;
  const AdamOptions& options() const { return options_; }
  /// The moments and step count of parameter i.
  const detail::AdamState& state(size_t i) const { return state_.at(i); }

 private:
  AdamOptions options_;
  std::vector<detail::AdamState> state_;
};

/// AdamW, as torch.optim.AdamW: Adam with decoupled weight decay, p *= 1 - lr * weight_decay
/// before the Adam update (the gradient itself is not changed).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  void step() override;
  std::vector<Tensor> state_tensors() const override;
  const AdamWOptions& options() const { return options_; }
  /// The moments and step count of parameter i.
  const detail::AdamState& state(size_t i) const { return state_.at(i); }

 private:
  AdamWOptions options_;
  std::vector<detail::AdamState> state_;
};

struct RMSpropOptions {
  double lr = 0.01, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool centered = false;  ///< divide by an estimate of the gradient's variance, not its 2nd moment
};

namespace detail {
/// The state of one parameter under RMSprop (LibTorch's RMSpropParamState).
struct RMSpropState {
  Tensor square_avg;       ///< running mean of g^2, zeros like the parameter
  Tensor grad_avg;         ///< running mean of g (centered only; else undefined)
  Tensor momentum_buffer;  ///< (momentum > 0 only; else undefined)
  Tensor step;             ///< 0-d f64: updates applied so far (the update does not read it)
};
}  // namespace detail

/// RMSprop, as torch.optim.RMSprop. Per parameter with a gradient: g += weight_decay * p;
/// v = alpha v + (1 - alpha) g^2; with centered, a = alpha a + (1 - alpha) g and the denominator
/// is sqrt(v - a^2) + eps, else sqrt(v) + eps; with momentum, buf = momentum buf + g / denom and
/// p -= lr * buf, else p -= lr * g / denom.
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  void step() override;
  std::vector<Tensor> state_tensors() const override;
  const RMSpropOptions& options() const { return options_; }
  /// The running averages, momentum buffer and step count of parameter i.
  const detail::RMSpropState& state(size_t i) const { return state_.at(i); }

 private:
  RMSpropOptions options_;
  std::vector<detail::RMSpropState> state_;
};

}  // namespace duet::optim
