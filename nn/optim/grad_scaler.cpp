// GradScaler (Note [GradScaler] in nn/optim/grad_scaler.h): every decision as tensor ops on the
// scale's device, so that nothing reads a value back to the host.
#include "nn/optim/grad_scaler.h"

#include "core/dispatch.h"
#include "core/ops.h"
#include "eager/autograd.h"

namespace duet {

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  DUET_CHECK_VALUE(options.init_scale_ > 0, "[GradScaler] init_scale must be > 0, got {}",
                   options.init_scale_);
  DUET_CHECK_VALUE(options.growth_factor_ > 1, "[GradScaler] growth_factor must be > 1, got {}",
                   options.growth_factor_);
  DUET_CHECK_VALUE(options.backoff_factor_ > 0 && options.backoff_factor_ < 1,
                   "[GradScaler] backoff_factor must be in (0, 1), got {}",
                   options.backoff_factor_);
  DUET_CHECK_VALUE(options.growth_interval_ >= 1,
                   "[GradScaler] growth_interval must be >= 1, got {}", options.growth_interval_);
}

void GradScaler::ensure_state(Device device) {
  if (scale_.defined()) return;
  // Real tensors even when the first scale() runs inside a compiled function: the scaler keeps
  // them across calls, and the trace captures them like parameters.
  detail::SuspendModes eager;
  NoGradGuard ng;
  scale_ = full({}, options_.init_scale_, Options().dtype(DType::f32).device(device));
  clean_steps_ = zeros({}, Options().dtype(DType::f64).device(device));
}

GradScaler::Stepped* GradScaler::find(const optim::Optimizer& opt) {
  for (Stepped& s : unscaled_)
    if (s.opt == &opt) return &s;
  return nullptr;
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled_) return loss;
  DUET_CHECK_DTYPE(is_floating(loss.dtype()), "[GradScaler] scale() needs a floating loss, got {}",
                   loss.dtype());
  ensure_state(loss.device());
  return loss * scale_;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled_) return;
  DUET_CHECK_VALUE(!find(opt),
                   "[GradScaler] unscale_() was already called on this {} since the last "
                   "update()",
                   opt.name());
  DUET_CHECK_VALUE(scale_.defined(),
                   "[GradScaler] unscale_() before any scale(): there are no scaled gradients");
  NoGradGuard ng;
  const Tensor inv = 1.0 / scale_;
  // g * 0 is NaN where g is an inf or a NaN and 0 elsewhere, so the sum of them all is NaN
  // exactly when some gradient holds one: a flag that never leaves the device.
  Tensor total = zeros({}, Options().dtype(DType::f32).device(scale_.device()));
  for (const Tensor& p : opt.params()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(g.device() == inv.device() ? inv : inv.to(g.device()));
    total.add_(sum(g * 0.0).to(scale_.device()));
  }
  unscaled_.push_back({&opt, ne(total, total)});
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled_) {
    opt.step();
    return;
  }
  if (!find(opt)) unscale_(opt);
  const Tensor found = find(opt)->found;
  NoGradGuard ng;
  std::vector<Tensor> written = opt.params();
  for (const Tensor& t : opt.state_tensors()) written.push_back(t);
  std::vector<Tensor> before;
  for (const Tensor& t : written) before.push_back(t.clone());
  opt.step();
  // A step with an inf or a NaN in its gradients is undone: every value it wrote goes back.
  for (size_t i = 0; i < written.size(); ++i)
    written[i].copy_(where(found.to(written[i].device()), before[i], written[i]));
}

void GradScaler::update() {
  if (!options_.enabled_) return;
  DUET_CHECK_VALUE(!unscaled_.empty(),
                   "[GradScaler] update() with no step() or unscale_() since the last update()");
  NoGradGuard ng;
  Tensor found = unscaled_[0].found;
  for (size_t i = 1; i < unscaled_.size(); ++i)
    found = gt(found.to(DType::f32) + unscaled_[i].found.to(DType::f32), 0.0);
  const Tensor clean = where(found, clean_steps_ * 0.0, clean_steps_ + 1.0);
  const Tensor grow = ge(clean, static_cast<double>(options_.growth_interval_));
  const Tensor next = where(found, scale_ * options_.backoff_factor_,
                            where(grow, scale_ * options_.growth_factor_, scale_));
  scale_.copy_(next);
  clean_steps_.copy_(where(grow, clean * 0.0, clean));
  unscaled_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled_) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale_;
}

}  // namespace duet
