// duet: the loss modules of nn/loss.h.
#include "nn/loss.h"

#include <cmath>

#include "core/ops.h"

namespace duet::nn {

Loss::Loss(const char* name, std::string r, bool batchmean)
    : Module(fmt::format("{}()", name)), reduction(std::move(r)) {
  DUET_CHECK_VALUE(reduction == "none" || reduction == "mean" || reduction == "sum" ||
                       (batchmean && reduction == "batchmean"),
                   "[{}] reduction must be \"none\", \"mean\"{} or \"sum\", got \"{}\"", name,
                   batchmean ? ", \"batchmean\"" : "", reduction);
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

}  // namespace duet::nn
