// duet: the loss modules of nn/loss.h.
#include "nn/loss.h"

#include <cmath>

#include "core/ops.h"

namespace duet::nn {

Loss::Loss(const char* name, std::string r, bool batchmean)
    : Module(fmt::format("{}()", name)), reduction(std::move(r)), class_(name) {
  DUET_CHECK_VALUE(reduction == "none" || reduction == "mean" || reduction == "sum" ||
                       (batchmean && reduction == "batchmean"),
                   "[{}] reduction must be \"none\", \"mean\"{} or \"sum\", got \"{}\"", name,
                   batchmean ? ", \"batchmean\"" : "", reduction);
}

Tensor Loss::forward(const Tensor&, const Tensor&) {
  throw ValueError(fmt::format("[{}] takes three operands: forward(a, b, c)", class_));
}
Tensor Loss::forward(const Tensor&, const Tensor&, const Tensor&) {
  throw ValueError(fmt::format("[{}] takes two operands: forward(input, target)", class_));
}

Tensor MSELoss::forward(const Tensor& x, const Tensor& y) { return mse_loss(x, y, reduction); }
Tensor L1Loss::forward(const Tensor& x, const Tensor& y) { return l1_loss(x, y, reduction); }

SmoothL1Loss::SmoothL1Loss(std::string r, double beta_)
    : Loss("SmoothL1Loss", std::move(r)), beta(beta_) {
  DUET_CHECK_VALUE(beta_ >= 0 && std::isfinite(beta_),
                   "[SmoothL1Loss] beta must be non-negative and finite, got {}", beta_);
}
Tensor SmoothL1Loss::forward(const Tensor& x, const Tensor& y) {
  return smooth_l1_loss(x, y, reduction, beta);
}

HuberLoss::HuberLoss(std::string r, double delta_)
    : Loss("HuberLoss", std::move(r)), delta(delta_) {
  DUET_CHECK_VALUE(delta_ > 0 && std::isfinite(delta_),
                   "[HuberLoss] delta must be positive and finite, got {}", delta_);
}
Tensor HuberLoss::forward(const Tensor& x, const Tensor& y) {
  return huber_loss(x, y, reduction, delta);
}

Tensor KLDivLoss::forward(const Tensor& x, const Tensor& y) {
  return kl_div(x, y, reduction, log_target);
}

namespace {
const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean";
}
}  // namespace

CrossEntropyLoss::CrossEntropyLoss(const CrossEntropyOptions& o)
    : Loss("CrossEntropyLoss", reduction_name(o.reduction())), options(o) {
  const double s = o.label_smoothing();
  DUET_CHECK_VALUE(s >= 0.0 && s <= 1.0,
                   "[CrossEntropyLoss] label_smoothing must be in [0, 1], got {}", s);
  if (o.weight().defined()) options.weight(register_buffer("weight", o.weight()));
}
Tensor CrossEntropyLoss::forward(const Tensor& x, const Tensor& y) {
  return cross_entropy(x, y, options);
}

NLLLoss::NLLLoss(Tensor w, int64_t ignore, std::string r)
    : Loss("NLLLoss", std::move(r)), ignore_index(ignore) {
  if (w.defined()) weight = register_buffer("weight", std::move(w));
}
Tensor NLLLoss::forward(const Tensor& x, const Tensor& y) {
  return weight.defined() ? nll_loss(x, y, weight, reduction, ignore_index)
                          : nll_loss(x, y, reduction, ignore_index);
}

BCELoss::BCELoss(Tensor w, std::string r) : Loss("BCELoss", std::move(r)) {
  if (w.defined()) weight = register_buffer("weight", std::move(w));
}
Tensor BCELoss::forward(const Tensor& x, const Tensor& y) {
  return binary_cross_entropy(x, y, weight, reduction);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(Tensor w, std::string r, Tensor pw)
    : Loss("BCEWithLogitsLoss", std::move(r)) {
  if (w.defined()) weight = register_buffer("weight", std::move(w));
  if (pw.defined()) pos_weight = register_buffer("pos_weight", std::move(pw));
}
Tensor BCEWithLogitsLoss::forward(const Tensor& x, const Tensor& y) {
  return binary_cross_entropy_with_logits(x, y, reduction, weight, pos_weight);
}

Tensor MarginRankingLoss::forward(const Tensor& x1, const Tensor& x2, const Tensor& y) {
  return margin_ranking_loss(x1, x2, y, margin, reduction);
}
Tensor HingeEmbeddingLoss::forward(const Tensor& x, const Tensor& y) {
  return hinge_embedding_loss(x, y, margin, reduction);
}
Tensor SoftMarginLoss::forward(const Tensor& x, const Tensor& y) {
  return soft_margin_loss(x, y, reduction);
}
Tensor CosineEmbeddingLoss::forward(const Tensor& x1, const Tensor& x2, const Tensor& y) {
  return cosine_embedding_loss(x1, x2, y, margin, reduction);
}

TripletMarginLoss::TripletMarginLoss(double m, double p_, double e, bool s, std::string r)
    : Loss("TripletMarginLoss", std::move(r)), margin(m), p(p_), eps(e), swap(s) {
  DUET_CHECK_VALUE(m > 0, "[TripletMarginLoss] margin must be positive, got {}", m);
}
Tensor TripletMarginLoss::forward(const Tensor& a, const Tensor& pos, const Tensor& neg) {
  return triplet_margin_loss(a, pos, neg, margin, p, eps, swap, reduction);
}

Tensor PoissonNLLLoss::forward(const Tensor& x, const Tensor& y) {
  return poisson_nll_loss(x, y, log_input, full, eps, reduction);
}

GaussianNLLLoss::GaussianNLLLoss(bool f, double e, std::string r)
    : Loss("GaussianNLLLoss", std::move(r)), full(f), eps(e) {
  DUET_CHECK_VALUE(e > 0, "[GaussianNLLLoss] eps must be positive, got {}", e);
}
Tensor GaussianNLLLoss::forward(const Tensor& x, const Tensor& y, const Tensor& var) {
  return gaussian_nll_loss(x, y, var, full, eps, reduction);
}

MultiLabelSoftMarginLoss::MultiLabelSoftMarginLoss(Tensor w, std::string r)
    : Loss("MultiLabelSoftMarginLoss", std::move(r)) {
  if (w.defined()) weight = register_buffer("weight", std::move(w));
}
Tensor MultiLabelSoftMarginLoss::forward(const Tensor& x, const Tensor& y) {
  return multilabel_soft_margin_loss(x, y, weight, reduction);
}

MultiMarginLoss::MultiMarginLoss(int64_t p_, double m, Tensor w, std::string r)
    : Loss("MultiMarginLoss", std::move(r)), p(p_), margin(m) {
  DUET_CHECK_VALUE(p_ == 1 || p_ == 2, "[MultiMarginLoss] p must be 1 or 2, got {}", p_);
  if (w.defined()) weight = register_buffer("weight", std::move(w));
}
Tensor MultiMarginLoss::forward(const Tensor& x, const Tensor& y) {
  return multi_margin_loss(x, y, p, margin, weight, reduction);
}

Tensor MultiLabelMarginLoss::forward(const Tensor& x, const Tensor& y) {
  return multilabel_margin_loss(x, y, reduction);
}

PairwiseDistance::PairwiseDistance(double p_, double e, bool k)
    : Module(fmt::format("PairwiseDistance(p={}, eps={}, keepdim={})", p_, e, k)),
      p(p_),
      eps(e),
      keepdim(k) {
  DUET_CHECK_VALUE(p_ >= 0, "[PairwiseDistance] p must be non-negative, got {}", p_);
}
Tensor PairwiseDistance::forward(const Tensor& x1, const Tensor& x2) {
  return pairwise_distance(x1, x2, p, eps, keepdim);
}

CosineSimilarity::CosineSimilarity(int64_t d, double e)
    : Module(fmt::format("CosineSimilarity(dim={}, eps={})", d, e)), dim(d), eps(e) {}
Tensor CosineSimilarity::forward(const Tensor& x1, const Tensor& x2) {
  return cosine_similarity(x1, x2, dim, eps);
}

}  // namespace duet::nn
