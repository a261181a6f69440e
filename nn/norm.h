// duet: batch normalization (torch.nn's BatchNorm1d, 2d and 3d), with PyTorch's parameters,
// buffers, defaults and running statistics, so that a PyTorch state dict loads by name; and
// GroupNorm, RMSNorm and InstanceNorm1d/2d/3d over group_norm and rms_norm.
//
// Note [Batch norm under compile]
// In training mode with track_running_stats, forward updates the buffers in place, outside
// autograd: num_batches_tracked += 1, then running = (1 - momentum) * running + momentum *
// batch statistic (the unbiased variance for running_var; the normalization itself uses the
// biased one, as PyTorch). Traced, these in-place writes of captured tensors become write-backs
// (Note [Functionalization] in trace/tracer.h): the compiled step updates the module's buffers
// at every call, as the eager step does, and a later eval() forward (eager or compiled) reads
// them. The training flag is read while tracing: a function compiled in one mode keeps that
// mode's graph, so compile the evaluation forward separately from the training step (or pass
// the mode as an argument, which makes it part of the signature).
#pragma once

#include <optional>

#include "nn/module.h"
#include "nn/options.h"

namespace duet::nn {

/// BatchNorm1d/2d/3d's options (LibTorch's BatchNormOptions). momentum nullopt means a
/// cumulative moving average (factor 1 / num_batches_tracked), as PyTorch's momentum=None.
class BatchNormOptions {
 public:
  /* implicit */ BatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  DUET_NN_OPTION(int64_t, num_features);
  DUET_NN_OPTION(double, eps) = 1e-5;
  DUET_NN_OPTION(std::optional<double>, momentum) = 0.1;
  DUET_NN_OPTION(bool, affine) = true;
  DUET_NN_OPTION(bool, track_running_stats) = true;
};

/// The shared implementation of BatchNorm1d/2d/3d. Over an input (N, C, *), with C =
/// num_features: y = (x - mean) / sqrt(var + eps) * weight + bias, per channel. In training mode
/// (or without track_running_stats) mean and var are the batch's (over every dim but 1, var
/// biased), and the running statistics are updated (Note [Batch norm under compile]); in
/// evaluation mode with track_running_stats they are running_mean and running_var.
/// Parameters weight (ones) and bias (zeros), with affine; buffers running_mean (zeros),
/// running_var (ones) and num_batches_tracked (i64, 0-d, 0), with track_running_stats.
class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  /// running_mean to zeros, running_var to ones, num_batches_tracked to 0 (in place).
  void reset_running_stats();
  /// reset_running_stats(), then weight to ones and bias to zeros.
  void reset_parameters();

  BatchNormOptions options;
  Tensor weight, bias;  ///< undefined without affine
  /// Undefined without track_running_stats.
  Tensor running_mean, running_var, num_batches_tracked;

 protected:
  /// `kind` names the layer ("BatchNorm2d"); the input has one of the ranks lo..hi.
  BatchNormBase(const BatchNormOptions& options, const char* kind, int64_t lo, int64_t hi);

 private:
  const char* kind_;
  int64_t lo_, hi_;
};

/// Batch norm over (N, C) or (N, C, L).
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(const BatchNormOptions& options)
      : BatchNormBase(options, "BatchNorm1d", 2, 3) {}
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm1d(BatchNormOptions(num_features)
                        .eps(eps)
                        .momentum(momentum)
                        .affine(affine)
                        .track_running_stats(track_running_stats)) {}
};

/// Batch norm over (N, C, H, W).
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(const BatchNormOptions& options)
      : BatchNormBase(options, "BatchNorm2d", 4, 4) {}
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm2d(BatchNormOptions(num_features)
                        .eps(eps)
                        .momentum(momentum)
                        .affine(affine)
                        .track_running_stats(track_running_stats)) {}
};

/// Batch norm over (N, C, D, H, W).
class BatchNorm3d : public BatchNormBase {
 public:
  explicit BatchNorm3d(const BatchNormOptions& options)
      : BatchNormBase(options, "BatchNorm3d", 5, 5) {}
  explicit BatchNorm3d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm3d(BatchNormOptions(num_features)
                        .eps(eps)
                        .momentum(momentum)
                        .affine(affine)
                        .track_running_stats(track_running_stats)) {}
};

/// Group norm over (N, C, *), as torch.nn.GroupNorm: group_norm with num_groups groups of
/// num_channels / num_groups channels; weight (ones) and bias (zeros) of (num_channels), with
/// affine.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  /// weight to ones and bias to zeros.
  void reset_parameters();

  int64_t num_groups, num_channels;
  double eps;
  Tensor weight, bias;  ///< undefined without affine
};

/// RMS norm over the trailing normalized_shape dims, as torch.nn.RMSNorm (LLaMA's): rms_norm with
/// a weight (ones) of normalized_shape, with elementwise_affine; eps nullopt is the machine
/// epsilon of the input's dtype, as PyTorch's eps=None.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  /// weight to ones.
  void reset_parameters();

  Shape normalized_shape;
  std::optional<double> eps;
  Tensor weight;  ///< undefined without elementwise_affine
};

/// Instance norm, as torch.nn.InstanceNorm1d/2d/3d: each sample's channels normalized over their
/// own positions (group_norm with a group per channel), input (N, C, *) or unbatched (C, *);
/// weight (ones) and bias (zeros) of (C) with affine (false by default, as PyTorch's). With
/// track_running_stats, training also moves running_mean and running_var (buffers of (C)) by
/// momentum toward the batch's mean of the instances' means and unbiased variances, as PyTorch
/// does, and evaluation normalizes with them instead (num_batches_tracked is kept, and stays 0,
/// as PyTorch's).
class InstanceNormBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  /// weight to ones and bias to zeros.
  void reset_parameters();

  int64_t num_features;
  double eps, momentum;
  Tensor weight, bias;  ///< undefined without affine
  /// Undefined without track_running_stats.
  Tensor running_mean, running_var, num_batches_tracked;

 protected:
  /// `kind` names the layer ("InstanceNorm2d"), whose batched input has `rank` dims.
  InstanceNormBase(const char* kind, int64_t rank, int64_t num_features, double eps,
                   double momentum, bool affine, bool track_running_stats);

 private:
  // Moves the running statistics toward those of `in` (N, C, *) (training, with them).
  void track(const Tensor& in);
  const char* kind_;
  int64_t rank_;
};

/// Instance norm over (N, C, L) or (C, L).
class InstanceNorm1d : public InstanceNormBase {
 public:
  explicit InstanceNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false)
      : InstanceNormBase("InstanceNorm1d", 3, num_features, eps, momentum, affine,
                         track_running_stats) {}
};

/// Instance norm over (N, C, H, W) or (C, H, W).
class InstanceNorm2d : public InstanceNormBase {
 public:
  explicit InstanceNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false)
      : InstanceNormBase("InstanceNorm2d", 4, num_features, eps, momentum, affine,
                         track_running_stats) {}
};

/// Instance norm over (N, C, D, H, W) or (C, D, H, W).
class InstanceNorm3d : public InstanceNormBase {
 public:
  explicit InstanceNorm3d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                          bool affine = false, bool track_running_stats = false)
      : InstanceNormBase("InstanceNorm3d", 5, num_features, eps, momentum, affine,
                         track_running_stats) {}
};

}  // namespace duet::nn
