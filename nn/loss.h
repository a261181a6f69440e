// duet: torch.nn's loss modules (and PairwiseDistance, CosineSimilarity), each a Module over one
// function (core/ops: losses.cpp,
// nn.cpp, stats.cpp) with PyTorch's argument names, defaults and printed names, called as
// loss(input, target). A reduction other than those the loss takes, or a parameter out of
// range, raises a duet::Error naming the module when it is made; bad inputs raise the function's.
// A class or element weight is a buffer ("weight", "pos_weight"): to() moves it with the module.
#pragma once

#include <string>

#include "core/loss_options.h"
#include "nn/module.h"

namespace duet::nn {

/// The base of the loss modules: forward(input, target), or forward(a, b, c) for the losses of
/// three operands (MarginRankingLoss, CosineEmbeddingLoss, TripletMarginLoss, GaussianNLLLoss),
/// and `reduction` as PyTorch keeps it. The forward a loss does not take raises a ValueError.
class Loss : public Module {
 public:
  virtual Tensor forward(const Tensor& input, const Tensor& target);
  virtual Tensor forward(const Tensor& a, const Tensor& b, const Tensor& c);
  using Module::forward;
  using Module::operator();
  /// forward(input, target), with the caller's line as the call site of the ops inside.
  Tensor operator()(const Tensor& input, const Tensor& target, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, target);
  }
  Tensor operator()(const Tensor& a, const Tensor& b, const Tensor& c, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(a, b, c);
  }
  std::string reduction;  ///< "none", "mean" or "sum" (KLDivLoss also "batchmean")

 protected:
  // name: the class's ("MSELoss"); checks the reduction against those the loss takes.
  Loss(const char* name, std::string reduction, bool batchmean = false);

 private:
  const char* class_;
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

/// margin_ranking_loss(x1, x2, y): forward(x1, x2, y).
class MarginRankingLoss : public Loss {
 public:
  explicit MarginRankingLoss(double margin = 0, std::string reduction = "mean")
      : Loss("MarginRankingLoss", std::move(reduction)), margin(margin) {}
  using Loss::forward;
  Tensor forward(const Tensor& x1, const Tensor& x2, const Tensor& y) override;
  double margin;
};

/// hinge_embedding_loss(x, y).
class HingeEmbeddingLoss : public Loss {
 public:
  explicit HingeEmbeddingLoss(double margin = 1, std::string reduction = "mean")
      : Loss("HingeEmbeddingLoss", std::move(reduction)), margin(margin) {}
  using Loss::forward;
  Tensor forward(const Tensor& x, const Tensor& y) override;
  double margin;
};

/// soft_margin_loss(x, y).
class SoftMarginLoss : public Loss {
 public:
  explicit SoftMarginLoss(std::string reduction = "mean")
      : Loss("SoftMarginLoss", std::move(reduction)) {}
  using Loss::forward;
  Tensor forward(const Tensor& x, const Tensor& y) override;
};

/// cosine_embedding_loss(x1, x2, y): forward(x1, x2, y).
class CosineEmbeddingLoss : public Loss {
 public:
  explicit CosineEmbeddingLoss(double margin = 0, std::string reduction = "mean")
      : Loss("CosineEmbeddingLoss", std::move(reduction)), margin(margin) {}
  using Loss::forward;
  Tensor forward(const Tensor& x1, const Tensor& x2, const Tensor& y) override;
  double margin;
};

/// triplet_margin_loss(anchor, positive, negative): forward(anchor, positive, negative).
class TripletMarginLoss : public Loss {
 public:
  explicit TripletMarginLoss(double margin = 1, double p = 2, double eps = 1e-6, bool swap = false,
                             std::string reduction = "mean");
  using Loss::forward;
  Tensor forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative) override;
  double margin, p, eps;
  bool swap;
};

/// poisson_nll_loss(input, target).
class PoissonNLLLoss : public Loss {
 public:
  explicit PoissonNLLLoss(bool log_input = true, bool full = false, double eps = 1e-8,
                          std::string reduction = "mean")
      : Loss("PoissonNLLLoss", std::move(reduction)), log_input(log_input), full(full), eps(eps) {}
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target) override;
  bool log_input, full;
  double eps;
};

/// gaussian_nll_loss(input, target, var): forward(input, target, var).
class GaussianNLLLoss : public Loss {
 public:
  explicit GaussianNLLLoss(bool full = false, double eps = 1e-6, std::string reduction = "mean");
  using Loss::forward;
  Tensor forward(const Tensor& input, const Tensor& target, const Tensor& var) override;
  bool full;
  double eps;
};

/// multilabel_soft_margin_loss(input, target, weight), weight a buffer (one per class).
class MultiLabelSoftMarginLoss : public Loss {
 public:
  explicit MultiLabelSoftMarginLoss(Tensor weight = {}, std::string reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight;  ///< undefined: every class weighs 1
};

/// multi_margin_loss(input, target, p, margin, weight), p 1 or 2, weight a buffer.
class MultiMarginLoss : public Loss {
 public:
  explicit MultiMarginLoss(int64_t p = 1, double margin = 1, Tensor weight = {},
                           std::string reduction = "mean");
  Tensor forward(const Tensor& input, const Tensor& target) override;
  int64_t p;
  double margin;
  Tensor weight;  ///< undefined: every class weighs 1
};

/// multilabel_margin_loss(input, target), target rows of class indices ended by -1.
class MultiLabelMarginLoss : public Loss {
 public:
  explicit MultiLabelMarginLoss(std::string reduction = "mean")
      : Loss("MultiLabelMarginLoss", std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

/// pairwise_distance(x1, x2, p, eps, keepdim) as a layer: forward(x1, x2).
class PairwiseDistance : public Module {
 public:
  explicit PairwiseDistance(double p = 2, double eps = 1e-6, bool keepdim = false);
  using Module::operator();
  Tensor operator()(const Tensor& x1, const Tensor& x2, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(x1, x2);
  }
  using Module::forward;
  Tensor forward(const Tensor& x1, const Tensor& x2);
  double p, eps;
  bool keepdim;
};

/// cosine_similarity(x1, x2, dim, eps) as a layer: forward(x1, x2).
class CosineSimilarity : public Module {
 public:
  explicit CosineSimilarity(int64_t dim = 1, double eps = 1e-8);
  using Module::operator();
  Tensor operator()(const Tensor& x1, const Tensor& x2, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(x1, x2);
  }
  using Module::forward;
  Tensor forward(const Tensor& x1, const Tensor& x2);
  int64_t dim;
  double eps;
};

}  // namespace duet::nn
