// duet: loss scaling for f16 training, as torch.amp.GradScaler.
//
// Note [GradScaler]
// f16 gradients underflow to zero below 6e-8. GradScaler multiplies the loss by a large scale
// before backward, so the gradients are scaled too, then divides them back before the
// optimizer's step. A step whose gradients hold an infinity or a NaN (the scale was too large)
// is skipped, and the scale backs off; after growth_interval clean steps in a row it grows.
//
// Every decision is made on the device, by tensor ops: the scale, the count of clean steps and
// the "found an inf" flag are 0-d tensors, and a skipped step is a step whose writes are undone
// by where(found, old, new). So there is no host sync (no .item()), and a compiled training step
// that uses a GradScaler stays one graph (a CUDA graph too). The cost is one copy of the
// parameters and the optimizer's state per step.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/optim/optim.h"

namespace duet {

/// GradScaler's settings, PyTorch's defaults, with chained setters.
struct GradScalerOptions {
  GradScalerOptions& init_scale(double v) {
    init_scale_ = v;
    return *this;
  }
  GradScalerOptions& growth_factor(double v) {
    growth_factor_ = v;
    return *this;
  }
  GradScalerOptions& backoff_factor(double v) {
    backoff_factor_ = v;
    return *this;
  }
  GradScalerOptions& growth_interval(int64_t v) {
    growth_interval_ = v;
    return *this;
  }
  GradScalerOptions& enabled(bool v) {
    enabled_ = v;
    return *this;
  }
  double init_scale_ = 65536.0, growth_factor_ = 2.0, backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
  bool enabled_ = true;
};

/// Loss scaling (Note [GradScaler]): scale(loss).backward(); step(opt); update().
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// loss times the current scale (the loss unchanged when disabled).
  Tensor scale(const Tensor& loss);
  /// Divides the gradients of opt's parameters by the scale, in place, and notes whether any
  /// holds an inf or a NaN. Once per optimizer between update() calls (a ValueError
  /// otherwise); step() calls it when you have not (to clip gradients, call it first).
  void unscale_(optim::Optimizer& opt);
  /// opt.step(), undone where the gradients held an inf or a NaN.
  void step(optim::Optimizer& opt);
  /// The next scale: backoff_factor times the scale after a step with an inf or a NaN,
  /// growth_factor times after growth_interval clean steps in a row, else the same.
  void update();
  /// The current scale (reads it from its device: a host sync).
  double get_scale() const;
  /// The scale as a 0-d f32 tensor (on the device of the first loss scaled).
  const Tensor& scale_tensor() const { return scale_; }
  bool is_enabled() const { return options_.enabled_; }

 private:
  struct Stepped {
    const optim::Optimizer* opt;
    Tensor found;  ///< 0-d b8: a gradient held an inf or a NaN
  };
  void ensure_state(Device device);
  Stepped* find(const optim::Optimizer& opt);

  GradScalerOptions options_;
  Tensor scale_, clean_steps_;     ///< 0-d f32 scale; 0-d f64 count of clean steps in a row
  std::vector<Stepped> unscaled_;  ///< the optimizers unscaled since the last update()
};

}  // namespace duet
