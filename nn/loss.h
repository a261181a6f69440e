// duet: torch.nn's loss modules, each a Module over one loss function (core/ops: losses.cpp,
// nn.cpp, stats.cpp) with PyTorch's argument names, defaults and printed names, called as
// loss(input, target). A reduction other than those the loss takes, or a parameter out of
// range, raises a duet::Error naming the module when it is made; bad inputs raise the function's.
// A class or element weight is a buffer ("weight", "pos_weight"): to() moves it with the module.
#pragma once

#include <string>

#include "core/loss_options.h"
#include "nn/module.h"

namespace duet::nn {

/// The base of the loss modules: forward(input, target), and `reduction` as PyTorch keeps it.
class Loss : public Module {
 public:
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  using Module::forward;
  using Module::operator();
  /// forward(input, target), with the caller's line as the call site of the ops inside.
  Tensor operator()(const Tensor& input, const Tensor& target, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, target);
  }
  std::string reduction;  ///< "none", "mean" or "sum" (KLDivLoss also "batchmean")

 protected:
  // name: the class's ("MSELoss"); checks the reduction against those the loss takes.
  Loss(const char* name, std::string reduction, bool batchmean = false);
};

/// mse_loss: (input - target)^2, reduced.
class MSELoss : public Loss {
 public:
  explicit MSELoss(std::string reduction = "mean") : Loss("MSELoss", std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

/// l1_loss: |input - target|, reduced.
class L1Loss : public Loss {
 public:
  explicit L1Loss(std::string reduction = "mean") : Loss("L1Loss", std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

/// smooth_l1_loss with its beta (non-negative; 0 is L1Loss).
class SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(std::string reduction = "mean", double beta = 1);
  Tensor forward(const Tensor& input, const Tensor& target) override;
  double beta;
};

/// huber_loss with its delta (positive).
class HuberLoss : public Loss {
 public:
  explicit HuberLoss(std::string reduction = "mean", double delta = 1);
  Tensor forward(const Tensor& input, const Tensor& target) override;
  double delta;
};

/// kl_div of log-probabilities against probabilities (log-probabilities with log_target);
/// reduction also "batchmean", the divergence per sample.
class KLDivLoss : public Loss {
 public:
  explicit KLDivLoss(std::string reduction = "mean", bool log_target = false)
      : Loss("KLDivLoss", std::move(reduction), /*batchmean=*/true), log_target(log_target) {}
  Tensor forward(const Tensor& input, const Tensor& target) override;
  bool log_target;
};

/// cross_entropy of logits against class indices or probabilities, with the options' weight,
/// ignore_index, label_smoothing and reduction.
class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(const CrossEntropyOptions& options = {});
  Tensor forward(const Tensor& input, const Tensor& target) override;
  CrossEntropyOptions options;  ///< its weight is the module's buffer
};

/// nll_loss of log-probabilities against class indices, with a weight per class.
class NLLLoss : public Loss {
 public:
  explicit NLLLoss(Tensor weight = {}, int64_t ignore_index = -100, std::string reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight;  ///< undefined: every class weighs 1
  int64_t ignore_index;
};

/// binary_cross_entropy of probabilities, with a weight broadcast to the input.
class BCELoss : public Loss {
 public:
  explicit BCELoss(Tensor weight = {}, std::string reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight;
};

/// binary_cross_entropy_with_logits, with a weight and the positive examples' weight.
class BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(Tensor weight = {}, std::string reduction = "mean",
                             Tensor pos_weight = {});
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight, pos_weight;
};

}  // namespace duet::nn
