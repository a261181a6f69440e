// duet: SGD, Adam, AdamW and RMSprop. Every update is an in-place tensor op under NoGradGuard, and
// every value that changes between steps is read as a tensor (Note [Optimizers under compile]).
#include "nn/optim/optim.h"

#include "core/ops.h"
#include "eager/autograd.h"
#include "trace/tracer.h"

namespace duet::optim {
namespace {

/// A 0-d f64 tensor on `device` holding v.
Tensor scalar_on(double v, Device device) {
  return zeros(Shape{}, Options().dtype(DType::f64).device(device)).add_(v);
}

/// Writes v into a 0-d tensor in place (one copy_, so that inside a trace it is a write of the
/// captured tensor like any other).
void fill(Tensor& t, double v) {
  NoGradGuard ng;
  t.copy_(duet::detail::wrap_scalar(Scalar(v), DType::f64, Device::cpu()));
}

/// State of the parameter's shape: f32 for f16 and bf16 parameters (pure low-precision
/// training keeps its moments in f32; the updates compute in f32 and round once into p).
Tensor zeros_like(const Tensor& p) {
  const DType d = is_low_precision(p.dtype()) ? DType::f32 : p.dtype();
  return zeros(p.shape(), Options().dtype(d).device(p.device()));
}

void check_lr(const std::string& name, double lr) {
  DUET_CHECK_VALUE(lr >= 0, "[{}] invalid learning rate {}: it must be >= 0", name, lr);
}

// The learning rate is checked by Optimizer's constructor.
void check_adam(const std::string& name, std::pair<double, double> betas, double eps,
                double weight_decay) {
  DUET_CHECK_VALUE(betas.first >= 0 && betas.first < 1,
                   "[{}] invalid beta1 {}: it must be in [0, 1)", name, betas.first);
  DUET_CHECK_VALUE(betas.second >= 0 && betas.second < 1,
                   "[{}] invalid beta2 {}: it must be in [0, 1)", name, betas.second);
  DUET_CHECK_VALUE(eps >= 0, "[{}] invalid eps {}: it must be >= 0", name, eps);
  DUET_CHECK_VALUE(weight_decay >= 0, "[{}] invalid weight_decay {}: it must be >= 0", name,
                   weight_decay);
}

std::vector<detail::AdamState> make_adam_state(const std::vector<Tensor>& params) {
  NoGradGuard ng;
  std::vector<detail::AdamState> state;
  for (const Tensor& p : params)
    state.push_back({zeros_like(p), zeros_like(p), scalar_on(0, p.device())});
  return state;
}

/// One Adam or AdamW update of parameter p (PyTorch's single-tensor Adam with the step count as
/// a tensor, as its "capturable" variant). `lr` is the 0-d learning-rate tensor.
void adam_update(Tensor& p, detail::AdamState& s, const Tensor& lr, std::pair<double, double> betas,
                 double eps, double weight_decay, bool decoupled) {
  const auto [beta1, beta2] = betas;
  Tensor g = p.grad();
  if (weight_decay != 0) {
    if (decoupled)
      p.mul_(1.0 - lr * weight_decay);
    else
      g = g + p * weight_decay;  // out of place: the .grad buffer itself is never changed
  }
  s.step.add_(1);
  s.exp_avg.mul_(beta1).add_(g * (1 - beta1));
  s.exp_avg_sq.mul_(beta2).add_(g * g * (1 - beta2));
  // The bias corrections are 0-d f64 tensors computed from the step count, so a compiled step
  // recomputes them at every call.
  Tensor bias_correction1 = 1.0 - pow(beta1, s.step);
  Tensor bias_correction2 = 1.0 - pow(beta2, s.step);
  Tensor step_size = lr / bias_correction1;
  Tensor denom = sqrt(s.exp_avg_sq) / sqrt(bias_correction2) + eps;
  p.sub_(s.exp_avg / denom * step_size);
}

}  // namespace

// ---- Optimizer ----

Optimizer::Optimizer(std::string name, std::vector<Tensor> params, double lr)
    : name_(std::move(name)), params_(std::move(params)), lr_(lr) {
  DUET_CHECK_VALUE(!params_.empty(), "[{}] got an empty parameter list", name_);
  check_lr(name_, lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    DUET_CHECK_VALUE(p.defined(), "[{}] parameter {} is an undefined tensor", name_, i);
    DUET_CHECK_VALUE(p.is_leaf(),
                     "[{}] parameter {} of shape {} is not a leaf (it was computed by an op); "
                     "optimize the leaf tensor itself (detach().requires_grad_() makes one)",
                     name_, i, p.shape());
    DUET_CHECK_VALUE(p.requires_grad(),
                     "[{}] parameter {} of shape {} does not require grad (call "
                     "requires_grad_() on it, or leave it out)",
                     name_, i, p.shape());
    for (size_t j = 0; j < i; ++j)
      DUET_CHECK_VALUE(!params_[j].is_same(p), "[{}] parameters {} and {} are the same tensor",
                       name_, j, i);
  }
  NoGradGuard ng;
  for (const Tensor& p : params_) {
    const Tensor* found = nullptr;
    for (const Tensor& t : lr_tensors_)
      if (t.device() == p.device()) found = &t;
    if (!found) {
      lr_tensors_.push_back(scalar_on(lr, p.device()));
      found = &lr_tensors_.back();
    }
    lr_of_param_.push_back(*found);
  }
}

void Optimizer::zero_grad() {
  NoGradGuard ng;
  for (const Tensor& p : params_) {
    Tensor g = p.grad();
    if (g.defined()) g.zero_();
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(name_, lr);
  DUET_CHECK_VALUE(duet::detail::Tracer::current() == nullptr,
                   "[{}] set_lr inside a compiled function: the learning rate would be a constant "
                   "of the graph. Call it outside, between calls of the compiled step (the step "
                   "reads the learning-rate tensor, so it follows without a retrace)",
                   name_);
  lr_ = lr;
  for (Tensor& t : lr_tensors_) fill(t, lr);
}

// ---- SGD ----

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer("SGD", std::move(params), options.lr), options_(options) {
  DUET_CHECK_VALUE(options.momentum >= 0, "[SGD] invalid momentum {}: it must be >= 0",
                   options.momentum);
  DUET_CHECK_VALUE(options.weight_decay >= 0, "[SGD] invalid weight_decay {}: it must be >= 0",
                   options.weight_decay);
  DUET_CHECK_VALUE(!options.nesterov || options.momentum > 0,
                   "[SGD] nesterov momentum needs momentum > 0, got momentum {}", options.momentum);
  NoGradGuard ng;
  buffers_.resize(params_.size());
  if (options.momentum != 0)
    for (size_t i = 0; i < params_.size(); ++i) buffers_[i] = zeros_like(params_[i]);
}

void SGD::step() {
  NoGradGuard ng;
  const SGDOptions& o = options_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor d = p.grad();
    if (!d.defined()) continue;
    if (o.weight_decay != 0) d = d + p * o.weight_decay;
    if (o.momentum != 0) {
      Tensor& buf = buffers_[i];
      buf.mul_(o.momentum).add_(d);
      d = o.nesterov ? d + buf * o.momentum : buf;
    }
    p.sub_(d * lr_tensor(i));
  }
}

// ---- Adam and AdamW ----

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Optimizer("Adam", std::move(params), options.lr), options_(options) {
  check_adam(name_, options.betas, options.eps, options.weight_decay);
  state_ = make_adam_state(params_);
}

void Adam::step() {
  NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    adam_update(params_[i], state_[i], lr_tensor(i), options_.betas, options_.eps,
                options_.weight_decay, /*decoupled=*/false);
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Optimizer("AdamW", std::move(params), options.lr), options_(options) {
  check_adam(name_, options.betas, options.eps, options.weight_decay);
  state_ = make_adam_state(params_);
}

void AdamW::step() {
  NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    adam_update(params_[i], state_[i], lr_tensor(i), options_.betas, options_.eps,
                options_.weight_decay, /*decoupled=*/true);
  }
}

// ---- RMSprop ----

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions options)
    : Optimizer("RMSprop", std::move(params), options.lr), options_(options) {
  DUET_CHECK_VALUE(options.alpha >= 0, "[RMSprop] invalid alpha {}: it must be >= 0",
                   options.alpha);
  DUET_CHECK_VALUE(options.eps >= 0, "[RMSprop] invalid eps {}: it must be >= 0", options.eps);
  DUET_CHECK_VALUE(options.momentum >= 0, "[RMSprop] invalid momentum {}: it must be >= 0",
                   options.momentum);
  DUET_CHECK_VALUE(options.weight_decay >= 0, "[RMSprop] invalid weight_decay {}: it must be >= 0",
                   options.weight_decay);
  NoGradGuard ng;
  for (const Tensor& p : params_) {
    detail::RMSpropState s;
    s.square_avg = zeros_like(p);
    if (options.centered) s.grad_avg = zeros_like(p);
    if (options.momentum > 0) s.momentum_buffer = zeros_like(p);
    s.step = scalar_on(0, p.device());
    state_.push_back(std::move(s));
  }
}

void RMSprop::step() {
  NoGradGuard ng;
  const RMSpropOptions& o = options_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    detail::RMSpropState& s = state_[i];
    s.step.add_(1);
    if (o.weight_decay != 0) g = g + p * o.weight_decay;  // out of place, as in SGD
    s.square_avg.mul_(o.alpha).add_(g * g * (1 - o.alpha));
    Tensor avg;
    if (o.centered) {
      // PyTorch's grad_avg.lerp_(g, w) with w = 1 - alpha, in lerp's two forms: a + w (g - a)
      // for w < 0.5, else g - (1 - w) (g - a).
      const double w = 1 - o.alpha;
      if (w < 0.5)
        s.grad_avg.add_((g - s.grad_avg) * w);
      else
        s.grad_avg.copy_(g - (g - s.grad_avg) * (1 - w));
      avg = sqrt(s.square_avg - s.grad_avg * s.grad_avg) + o.eps;
    } else {
      avg = sqrt(s.square_avg) + o.eps;
    }
    if (o.momentum > 0) {
      s.momentum_buffer.mul_(o.momentum).add_(g / avg);
      p.sub_(s.momentum_buffer * lr_tensor(i));
    } else {
      p.sub_(g / avg * lr_tensor(i));
    }
  }
}

// ---- state, for GradScaler's skipped steps ----

namespace {
void add_defined(std::vector<Tensor>& out, const Tensor& t) {
  if (t.defined()) out.push_back(t);
}

std::vector<Tensor> adam_state_tensors(const std::vector<detail::AdamState>& state) {
  std::vector<Tensor> out;
  for (const detail::AdamState& s : state)
    for (const Tensor* t : {&s.exp_avg, &s.exp_avg_sq, &s.step}) add_defined(out, *t);
  return out;
}
}  // namespace

std::vector<Tensor> SGD::state_tensors() const {
  std::vector<Tensor> out;
  for (const Tensor& b : buffers_) add_defined(out, b);
  return out;
}

std::vector<Tensor> Adam::state_tensors() const { return adam_state_tensors(state_); }

std::vector<Tensor> AdamW::state_tensors() const { return adam_state_tensors(state_); }

std::vector<Tensor> RMSprop::state_tensors() const {
  std::vector<Tensor> out;
  for (const detail::RMSpropState& s : state_)
    for (const Tensor* t : {&s.square_avg, &s.grad_avg, &s.momentum_buffer, &s.step})
      add_defined(out, *t);
  return out;
}

}  // namespace duet::optim
