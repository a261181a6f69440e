// duet: BatchNorm1d/2d/3d (Note [Batch norm under compile] in nn/norm.h), GroupNorm, RMSNorm and
// InstanceNorm1d/2d/3d.
#include "nn/norm.h"

#include "core/op_table.h"
#include "core/ops.h"
#include "eager/autograd.h"
#include "nn/init.h"

namespace duet::nn {
namespace {

std::string layer_name(const char* kind, const BatchNormOptions& o) {
  return fmt::format("{}({}, eps={}, momentum={}, affine={}, track_running_stats={})", kind,
                     o.num_features(), o.eps(),
                     o.momentum() ? fmt::format("{}", *o.momentum()) : std::string("None"),
                     o.affine(), o.track_running_stats());
}

}  // namespace

BatchNormBase::BatchNormBase(const BatchNormOptions& o, const char* kind, int64_t lo, int64_t hi)
    : Module(layer_name(kind, o)), options(o), kind_(kind), lo_(lo), hi_(hi) {
  DUET_CHECK_VALUE(o.num_features() > 0 && o.eps() >= 0 &&
                       (!o.momentum() || (*o.momentum() >= 0 && *o.momentum() <= 1)),
                   "[{}] num_features must be positive, eps non-negative and momentum in [0, 1], "
                   "got {}",
                   kind, name());
  const int64_t c = o.num_features();
  if (o.affine()) {
    weight = register_parameter("weight", ones({c}));
    bias = register_parameter("bias", zeros({c}));
  }
  if (o.track_running_stats()) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", zeros({}, Options().dtype(DType::i64)));
  }
}

void BatchNormBase::reset_running_stats() {
  if (!running_mean.defined()) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (weight.defined()) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNormBase::forward(const Tensor& x) {
  const char* op = kind_;
  const int64_t c = options.num_features();
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", op);
  const int64_t rank = x.dim();
  DUET_CHECK_SHAPE(rank >= lo_ && rank <= hi_ && duet::detail::size_is(x, 1, c, op),
                   "[{}] input must be {} with C = num_features = {}, got {}", op,
                   lo_ == 2   ? "(N, C) or (N, C, L)"
                   : lo_ == 4 ? "(N, C, H, W)"
                              : "(N, C, D, H, W)",
                   c, x.sizes());
  DUET_CHECK_DTYPE(is_floating(x.dtype()), "[{}] input must be floating, got {}", op, x.dtype());
  // Statistics and parameters broadcast as (C, 1, ...) against (N, C, *).
  Shape per_channel{c};
  for (int64_t d = 2; d < rank; ++d) per_channel.push_back(1);
  Dims reduce{0};
  for (int64_t d = 2; d < rank; ++d) reduce.push_back(d);

  Tensor y;
  const bool batch_stats = is_training() || !running_mean.defined();
  if (batch_stats) {
    // The count of values per channel, symbolic when the batch is.
    const SymDims dims = duet::detail::sym_dims(x);
    SymInt count = dims[0];
    for (int64_t d = 2; d < rank; ++d) count *= dims[static_cast<size_t>(d)];
    DUET_CHECK_VALUE(
        !is_training() || !duet::detail::sym_decide(count, duet::detail::SymRel::Le, 1, op),
        "[{}] expected more than 1 value per channel when training, got input {}", op, x.sizes());
    Tensor mu = mean(x, reduce, true);
    Tensor centered = x - mu;
    Tensor sq = sum(centered * centered, reduce, true);
    // f64: a wrapped number when the count is concrete, which keeps x's dtype.
    const Tensor n = duet::detail::size_scalar(count, DType::f64, x.device());
    y = centered * rsqrt(sq / n + options.eps());
    if (is_training() && running_mean.defined()) {
      NoGradGuard no_grad;
      num_batches_tracked.add_(1);
      const Tensor m = reshape(mu.detach(), {c});
      const Tensor unbiased = reshape(sq.detach(), {c}) / (n - 1);
      if (options.momentum()) {
        const double f = *options.momentum();
        running_mean.copy_(m * f + running_mean * (1 - f));
        running_var.copy_(unbiased * f + running_var * (1 - f));
      } else {
        const Tensor f = 1.0 / num_batches_tracked.to(running_mean.dtype());
        running_mean.copy_(m * f + running_mean * (1.0 - f));
        running_var.copy_(unbiased * f + running_var * (1.0 - f));
      }
    }
  } else {
    y = (x - reshape(running_mean, per_channel)) *
        rsqrt(reshape(running_var, per_channel) + options.eps());
  }
  if (weight.defined()) y = y * reshape(weight, per_channel) + reshape(bias, per_channel);
  return y;
}

// ---- GroupNorm, RMSNorm ----

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine)
    : Module(fmt::format("GroupNorm({}, {}, eps={}, affine={})", groups, channels, eps_, affine)),
      num_groups(groups),
      num_channels(channels),
      eps(eps_) {
  DUET_CHECK_VALUE(groups > 0 && channels > 0 && channels % groups == 0 && eps_ >= 0,
                   "[GroupNorm] num_channels must split into num_groups groups (both positive) "
                   "and eps must be non-negative, got {}",
                   name());
  if (affine) {
    weight = register_parameter("weight", ones({channels}));
    bias = register_parameter("bias", zeros({channels}));
  }
}

void GroupNorm::reset_parameters() {
  if (weight.defined()) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor GroupNorm::forward(const Tensor& x) { return group_norm(x, num_groups, weight, bias, eps); }

RMSNorm::RMSNorm(Shape shape, std::optional<double> eps_, bool affine)
    : Module(fmt::format("RMSNorm({}, eps={}, elementwise_affine={})", shape,
                         eps_ ? fmt::format("{}", *eps_) : std::string("None"), affine)),
      normalized_shape(shape),
      eps(eps_) {
  bool positive = shape.size() > 0;
  for (int64_t d : shape) positive = positive && d > 0;
  DUET_CHECK_VALUE(positive && (!eps_ || *eps_ >= 0),
                   "[RMSNorm] normalized_shape must have at least one dim, all positive, and eps "
                   "must be non-negative, got {}",
                   name());
  if (affine) weight = register_parameter("weight", ones(shape));
}

void RMSNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, normalized_shape, weight, eps); }

// ---- InstanceNorm1d/2d/3d ----

InstanceNormBase::InstanceNormBase(const char* kind, int64_t rank, int64_t c, double eps_,
                                   double momentum_, bool affine, bool track)
    : Module(fmt::format("{}({}, eps={}, momentum={}, affine={}, track_running_stats={})", kind, c,
                         eps_, momentum_, affine, track)),
      num_features(c),
      eps(eps_),
      momentum(momentum_),
      kind_(kind),
      rank_(rank) {
  DUET_CHECK_VALUE(c > 0 && eps_ >= 0,
                   "[{}] num_features must be positive and eps non-negative, "
                   "got {}",
                   kind, name());
  if (affine) {
    weight = register_parameter("weight", ones({c}));
    bias = register_parameter("bias", zeros({c}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", zeros({}, Options().dtype(DType::i64)));
  }
}

void InstanceNormBase::reset_parameters() {
  if (weight.defined()) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor InstanceNormBase::forward(const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", kind_);
  const bool batched = x.dim() == rank_;
  DUET_CHECK_SHAPE((batched || x.dim() == rank_ - 1) &&
                       duet::detail::size_is(x, batched ? 1 : 0, num_features, kind_),
                   "[{}] input must be {}-D (N, {}, ...) or {}-D unbatched ({}, ...), got {}",
                   kind_, rank_, num_features, rank_ - 1, num_features, x.sizes());
  const Tensor in = batched ? x : unsqueeze(x, 0);
  Tensor y;
  if (!running_mean.defined() || is_training()) {
    y = group_norm(in, num_features, weight, bias, eps);
    if (running_mean.defined()) track(in);
  } else {  // the running statistics, per channel (C, 1, ...)
    Shape per_channel{num_features};
    for (int64_t d = 2; d < in.dim(); ++d) per_channel.push_back(1);
    y = (in - reshape(running_mean, per_channel)) * rsqrt(reshape(running_var, per_channel) + eps);
    if (weight.defined()) y = y * reshape(weight, per_channel) + reshape(bias, per_channel);
  }
  return batched ? y : squeeze(y, 0);
}

// PyTorch runs batch_norm over the input as (1, N * C, *) with the running statistics repeated
// N times, then averages each channel's N updated copies: the same as moving them toward the
// mean over the batch of the instances' means and unbiased variances.
void InstanceNormBase::track(const Tensor& in) {
  NoGradGuard no_grad;
  const Tensor x = in.detach();
  Dims spatial;
  int64_t count = 1;  // the values per instance
  for (int64_t d = 2; d < x.dim(); ++d) {
    spatial.push_back(d);
    count *= x.size(d);
  }
  DUET_CHECK_VALUE(count > 1,
                   "[{}] expected more than 1 spatial element when training with "
                   "track_running_stats, got input {}",
                   kind_, x.sizes());
  const Tensor mu = mean(x, spatial, true);
  const Tensor centered = x - mu;
  const Tensor unbiased = sum(centered * centered, spatial) / static_cast<double>(count - 1);
  const Tensor batch_mean = mean(reshape(mu, {x.size(0), num_features}), {0});
  const Tensor batch_var = mean(unbiased, {0});
  running_mean.copy_(batch_mean.to(running_mean.dtype()) * momentum +
                     running_mean * (1 - momentum));
  running_var.copy_(batch_var.to(running_var.dtype()) * momentum + running_var * (1 - momentum));
}

}  // namespace duet::nn
