// The losses of torch.nn.functional, each with PyTorch's reduction argument: the elementwise
// regression, divergence and binary losses (mse_loss, l1_loss, smooth_l1_loss, huber_loss,
// kl_div, binary_cross_entropy and binary_cross_entropy_with_logits with its weights), composed
// of elementwise math and a reduction, in f32 under autocast (PyTorch's autocast runs them in
// f32); the margin and likelihood losses; and the multi-class and multi-label margin losses.
#include <cmath>
#include <string>

#include "core/autocast.h"
#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace {

// The elementwise loss reduced as `reduction` asks: "none", "mean" (over every element) or
// "sum"; kl_div also takes "batchmean", the sum over the size of dim 0.
Tensor reduce_loss(const char* op, const Tensor& loss, std::string_view reduction,
                   bool batchmean = false) {
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  if (reduction == "mean") return mean(loss);
  DUET_CHECK_VALUE(batchmean && reduction == "batchmean",
                   "[{}] reduction must be \"none\", \"mean\"{} or \"sum\", got \"{}\"", op,
                   batchmean ? ", \"batchmean\"" : "", reduction);
  if (loss.dim() <= 1) return loss.dim() ? mean(loss) : loss;
  Dims rest;  // the sum of each sample's terms, averaged over the samples: a symbolic N stays so
  for (int64_t d = 1; d < loss.dim(); ++d) rest.push_back(d);
  return mean(sum(loss, rest));
}

// A prediction and a target of one floating dtype and one shape (after autocast's f32).
void check_pair(const char* op, const Tensor& pred, const Tensor& target) {
  DUET_CHECK_VALUE(pred.defined() && target.defined(), "[{}] an input is an undefined tensor", op);
  DUET_CHECK_DTYPE(is_floating(pred.dtype()) && pred.dtype() == target.dtype(),
                   "[{}] needs a floating input and target of one dtype, got {} and {}", op,
                   pred.dtype(), target.dtype());
  DUET_CHECK_SHAPE(detail::same_shape(pred, target, op),
                   "[{}] input {} and target {} must have the same shape", op, pred.sizes(),
                   target.sizes());
}

// The loss of each element, terms(pred, target), reduced: both inputs in f32 under autocast, and
// f16 and bf16 computed in f32 and rounded once (each term's rounding, summed, lost more than the
// low dtype's precision where the terms cancel, as kl_div's do).
template <class Terms>
Tensor loss_of(const char* op, const Tensor& pred_in, const Tensor& target_in,
               std::string_view reduction, bool batchmean, Terms terms) {
  Tensor held_pred, held_target;
  const Tensor& pred = detail::autocast_f32(pred_in, held_pred);
  const Tensor& target = detail::autocast_f32(target_in, held_target);
  check_pair(op, pred, target);
  if (is_low_precision(pred.dtype()))
    return loss_of(op, pred.to(DType::f32), target.to(DType::f32), reduction, batchmean, terms)
        .to(pred.dtype());
  return reduce_loss(op, terms(pred, target), reduction, batchmean);
}

// An optional weight of a binary loss (`what`: "weight", "pos_weight"): floating, and
// broadcastable to the input's shape without growing it.
void check_weight(const char* op, const char* what, const Tensor& w, const Tensor& input) {
  if (!w.defined()) return;
  DUET_CHECK_DTYPE(is_floating(w.dtype()), "[{}] {} must be floating, got {}", op, what, w.dtype());
  bool fits = w.dim() <= input.dim();
  for (int64_t k = 0; fits && k < w.dim(); ++k) {
    const int64_t n = w.size(k);
    fits = n == 1 || detail::size_is(input, input.dim() - w.dim() + k, n, op);
  }
  DUET_CHECK_SHAPE(fits, "[{}] {} {} must broadcast to the input's shape {}", op, what, w.sizes(),
                   detail::dims_str(detail::sym_dims(input)));
}

// w in the dtype the terms are computed in (f32 for f16 and bf16 inputs), or undefined.
Tensor weight_as(const Tensor& w, DType dtype) { return w.defined() ? w.to(dtype) : w; }

// max(log v, -100), as PyTorch clamps binary_cross_entropy's logs: a probability of exactly 0
// gives -100 with a gradient of 0 (the log reads 1 there, Note [Piecewise activations] in
// core/ops/activations.cpp, so that no 0 * inf reaches the input).
Tensor clamped_log(const Tensor& v) {
  const Tensor positive = gt(v, 0);
  const Tensor l = where(positive, log(where(positive, v, 1)), -100.0);
  return where(lt(l, -100.0), -100.0, l);
}

}  // namespace

// Its own checks and no f32 for f16 and bf16 (as it computed before the losses above).
Tensor mse_loss(const Tensor& pred_in, const Tensor& target_in, std::string_view reduction,
                std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("mse_loss", [&]() -> Tensor {
    Tensor held_pred;
    const Tensor& pred = detail::autocast_f32(pred_in, held_pred);
    Tensor held_target;
    const Tensor& target = detail::autocast_f32(target_in, held_target);
    DUET_CHECK_SHAPE(detail::same_shape(pred, target, "mse_loss"),
                     "[mse_loss] prediction {} and target {} must have the same shape",
                     pred.sizes(), target.sizes());
    const Tensor d = pred - target;
    return reduce_loss("mse_loss", d * d, reduction);
  });
}

Tensor l1_loss(const Tensor& pred, const Tensor& target, std::string_view reduction,
               std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("l1_loss", [&]() -> Tensor {
    return loss_of("l1_loss", pred, target, reduction, false,
                   [](const Tensor& p, const Tensor& t) { return abs(p - t); });
  });
}

// 0.5 d^2 / beta below beta, |d| - 0.5 beta above; beta 0 is l1_loss (PyTorch's).
Tensor smooth_l1_loss(const Tensor& pred, const Tensor& target, std::string_view reduction,
                      double beta, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("smooth_l1_loss", [&]() -> Tensor {
    DUET_CHECK_VALUE(beta >= 0 && std::isfinite(beta),
                     "[smooth_l1_loss] beta must be non-negative and finite, got {}", beta);
    return loss_of(
        "smooth_l1_loss", pred, target, reduction, false, [beta](const Tensor& p, const Tensor& t) {
          const Tensor d = abs(p - t);
          return beta == 0 ? d : where(lt(d, beta), d * d * (0.5 / beta), d - 0.5 * beta);
        });
  });
}

// 0.5 d^2 up to delta, delta (|d| - 0.5 delta) above (PyTorch's huber_loss).
Tensor huber_loss(const Tensor& pred, const Tensor& target, std::string_view reduction,
                  double delta, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("huber_loss", [&]() -> Tensor {
    DUET_CHECK_VALUE(delta > 0 && std::isfinite(delta),
                     "[huber_loss] delta must be positive and finite, got {}", delta);
    return loss_of("huber_loss", pred, target, reduction, false,
                   [delta](const Tensor& p, const Tensor& t) {
                     const Tensor d = abs(p - t);
                     return where(le(d, delta), d * d * 0.5, (d - 0.5 * delta) * delta);
                   });
  });
}

// target (log target - input), 0 where the target is 0 (PyTorch's xlogy); with log_target, the
// target is a log-probability: e^target (target - input).
Tensor kl_div(const Tensor& input, const Tensor& target, std::string_view reduction,
              bool log_target, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("kl_div", [&]() -> Tensor {
    return loss_of("kl_div", input, target, reduction, /*batchmean=*/true,
                   [log_target](const Tensor& x, const Tensor& t) {
                     if (log_target) return exp(t) * (t - x);
                     // The log reads 1 where the target is 0, whose term is 0 (Note [Piecewise
                     // activations] in core/ops/activations.cpp: the unselected branch takes
                     // part in the gradient).
                     const Tensor zero = eq(t, 0);
                     return where(zero, 0, t * log(where(zero, 1, t))) - t * x;
                   });
  });
}

// -w (y log x + (1 - y) log (1 - x)), each log clamped at -100 (PyTorch's formula). An input
// outside [0, 1] gives NaN (PyTorch checks the values, which reads them: a sync, and no check
// under compile).
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight,
                            std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("binary_cross_entropy", [&]() -> Tensor {
    check_weight("binary_cross_entropy", "weight", weight, input);
    return loss_of("binary_cross_entropy", input, target, reduction, false,
                   [&](const Tensor& x, const Tensor& y) {
                     Tensor l = neg(y * clamped_log(x) + (1 - y) * clamped_log(1 - x));
                     return weight.defined() ? l * weight_as(weight, x.dtype()) : l;
                   });
  });
}

// -w (p y log s(x) + (1 - y) log s(-x)), p the positive examples' weight (PyTorch's formula):
// log_sigmoid keeps it finite for logits of any size.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        std::string_view reduction, const Tensor& weight,
                                        const Tensor& pos_weight, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("binary_cross_entropy_with_logits", [&]() -> Tensor {
    const char* op = "binary_cross_entropy_with_logits";
    check_weight(op, "weight", weight, logits);
    check_weight(op, "pos_weight", pos_weight, logits);
    return loss_of(op, logits, targets, reduction, false, [&](const Tensor& x, const Tensor& y) {
      Tensor pos = y * log_sigmoid(x);
      if (pos_weight.defined()) pos = pos * weight_as(pos_weight, x.dtype());
      Tensor l = neg(pos + (1 - y) * log_sigmoid(neg(x)));
      return weight.defined() ? l * weight_as(weight, x.dtype()) : l;
    });
  });
}

// ---- the margin and likelihood losses ----

namespace {
// A loss's operands of one floating dtype and shape (op: the loss; names for the message).
void check_same(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> in) {
  const Tensor& first = *in.begin()->second;
  for (const auto& [name, t] : in) {
    DUET_CHECK_VALUE(t->defined(), "[{}] {} is an undefined tensor", op, name);
    DUET_CHECK_DTYPE(is_floating(t->dtype()) && t->dtype() == first.dtype(),
                     "[{}] needs floating operands of one dtype, got {} {} and {} {}", op,
                     in.begin()->first, first.dtype(), name, t->dtype());
    DUET_CHECK_SHAPE(detail::same_shape(*t, first, op),
                     "[{}] {} {} and {} {} must have the same shape", op, in.begin()->first,
                     first.sizes(), name, t->sizes());
  }
}
}  // namespace

Tensor margin_ranking_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin,
                           std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("margin_ranking_loss", [&]() -> Tensor {
    check_same("margin_ranking_loss", {{"input1", &x1}, {"input2", &x2}, {"target", &y}});
    return reduce_loss("margin_ranking_loss", relu(neg(y) * (x1 - x2) + margin), reduction);
  });
}

// x where y is 1, max(0, margin - x) where y is -1 (PyTorch's: both terms where y is neither).
Tensor hinge_embedding_loss(const Tensor& x, const Tensor& y, double margin,
                            std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("hinge_embedding_loss", [&]() -> Tensor {
    check_same("hinge_embedding_loss", {{"input", &x}, {"target", &y}});
    const Tensor l = where(ne(y, 1), relu(margin - x), 0.0) + where(ne(y, -1), x, 0.0);
    return reduce_loss("hinge_embedding_loss", l, reduction);
  });
}

Tensor soft_margin_loss(const Tensor& x, const Tensor& y, std::string_view reduction,
                        std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("soft_margin_loss", [&]() -> Tensor {
    check_same("soft_margin_loss", {{"input", &x}, {"target", &y}});
    return reduce_loss("soft_margin_loss", neg(log_sigmoid(y * x)), reduction);
  });
}

// 1 - cos(x1, x2) where y is 1, max(0, cos - margin) where y is -1, cos over the last dim with
// PyTorch's 1e-12 added to each squared norm.
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& y, double margin,
                             std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("cosine_embedding_loss", [&]() -> Tensor {
    const char* op = "cosine_embedding_loss";
    check_same(op, {{"input1", &x1}, {"input2", &x2}});
    DUET_CHECK_SHAPE((x1.dim() == 1 || x1.dim() == 2) && y.dim() == x1.dim() - 1 &&
                         (y.dim() == 0 || detail::size_is(y, 0, detail::sym_dim(x1, 0), op)),
                     "[{}] expected inputs (N, D) with a target (N), or (D) with a 0-d target; "
                     "got {} and {}",
                     op, x1.sizes(), y.sizes());
    DUET_CHECK_DTYPE(y.dtype() == x1.dtype(), "[{}] target must have the inputs' dtype {}, got {}",
                     op, x1.dtype(), y.dtype());
    const int64_t d = x1.dim() - 1;
    const Tensor dot = sum(x1 * x2, {d});
    const Tensor m1 = sum(x1 * x1, {d}) + 1e-12, m2 = sum(x2 * x2, {d}) + 1e-12;
    const Tensor cos = dot / sqrt(m1 * m2);
    const Tensor l = where(eq(y, 1), 1 - cos, 0.0) + where(eq(y, -1), relu(cos - margin), 0.0);
    return reduce_loss(op, l, reduction);
  });
}

Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           double margin, double p, double eps, bool swap,
                           std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("triplet_margin_loss", [&]() -> Tensor {
    check_same("triplet_margin_loss",
               {{"anchor", &anchor}, {"positive", &positive}, {"negative", &negative}});
    DUET_CHECK_VALUE(margin > 0, "[triplet_margin_loss] margin must be positive, got {}", margin);
    const Tensor d_ap = pairwise_distance(anchor, positive, p, eps);
    Tensor d_an = pairwise_distance(anchor, negative, p, eps);
    if (swap) d_an = minimum(d_an, pairwise_distance(positive, negative, p, eps));
    return reduce_loss("triplet_margin_loss", relu(d_ap - d_an + margin), reduction);
  });
}

// exp(x) - y x with log_input (x a log rate), else x - y log(x + eps); full adds Stirling's
// y log y - y + log(2 pi y) / 2 where y > 1 (read as 1 elsewhere, so no NaN reaches a gradient).
Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, bool log_input, bool full,
                        double eps, std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("poisson_nll_loss", [&]() -> Tensor {
    return loss_of("poisson_nll_loss", input, target, reduction, false,
                   [&](const Tensor& x, const Tensor& y) {
                     Tensor l = log_input ? exp(x) - y * x : x - y * log(x + eps);
                     if (!full) return l;
                     const Tensor big = gt(y, 1), t = where(big, y, 1.0);
                     const Tensor stirling = t * log(t) - t + 0.5 * log(2 * M_PI * t);
                     return l + where(big, stirling, 0.0);
                   });
  });
}

// (log var + (x - y)^2 / var) / 2 (+ log(2 pi) / 2 with full), var clamped below at eps in its
// value only (PyTorch clamps it without recording: its gradient is var's own). var is the
// input's shape, or that with its last dim 1 or without it (one variance for a row).
Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var, bool full,
                         double eps, std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("gaussian_nll_loss", [&]() -> Tensor {
    const char* op = "gaussian_nll_loss";
    check_same(op, {{"input", &input}, {"target", &target}});
    DUET_CHECK_VALUE(var.defined(), "[{}] var is an undefined tensor", op);
    DUET_CHECK_DTYPE(var.dtype() == input.dtype(),
                     "[{}] var must have the input's dtype {}, got {}", op, input.dtype(),
                     var.dtype());
    Tensor v = var;
    if (var.dim() + 1 == input.dim()) v = unsqueeze(var, -1);
    bool fits = v.dim() == input.dim() && v.dim() > 0;
    for (int64_t d = 0; fits && d < v.dim(); ++d)
      fits = d + 1 == v.dim()
                 ? (v.size(d) == 1 || detail::size_is(v, d, detail::sym_dim(input, d), op))
                 : detail::size_is(v, d, detail::sym_dim(input, d), op);
    DUET_CHECK_SHAPE(fits,
                     "[{}] var {} must have the input's shape {}, or that with its last dim 1 or "
                     "without it",
                     op, var.sizes(), input.sizes());
    DUET_CHECK_VALUE(eps > 0, "[{}] eps must be positive, got {}", op, eps);
    const Tensor vc = v + (clamp(v, eps, INFINITY) - v).detach();
    Tensor l = 0.5 * (log(vc) + (input - target) * (input - target) / vc);
    if (full) l = l + 0.5 * std::log(2 * M_PI);
    return reduce_loss(op, l, reduction);
  });
}

// ---- the multi-class and multi-label margin losses ----

namespace {
// A multi-class loss's scores: (N, C), or (C) for one sample, of a floating dtype.
void check_scores(const char* op, const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] input is an undefined tensor", op);
  DUET_CHECK_DTYPE(is_floating(x.dtype()), "[{}] input must be floating, got {}", op, x.dtype());
  DUET_CHECK_SHAPE(x.dim() == 1 || x.dim() == 2, "[{}] input must be (N, C) or (C), got {}", op,
                   x.sizes());
}
// A weight per class: 1-D, C elements, the input's dtype.
void check_class_weight(const char* op, const Tensor& w, const Tensor& x) {
  if (!w.defined()) return;
  const int64_t c = x.dim() - 1;
  DUET_CHECK_SHAPE(w.dim() == 1 && detail::size_is(w, 0, detail::sym_dim(x, c), op),
                   "[{}] weight must be 1-D with one element per class ({}), got {}", op, x.size(c),
                   w.sizes());
  DUET_CHECK_DTYPE(w.dtype() == x.dtype(), "[{}] weight must have the input's dtype {}, got {}", op,
                   x.dtype(), w.dtype());
}
// An integer target: i64 of the shape `want` describes.
void check_index_target(const char* op, const Tensor& t, bool fits, const char* want,
                        const Tensor& x) {
  DUET_CHECK_VALUE(t.defined(), "[{}] target is an undefined tensor", op);
  DUET_CHECK_DTYPE(t.dtype() == DType::i64, "[{}] target must be i64 class indices, got {}", op,
                   t.dtype());
  DUET_CHECK_SHAPE(fits, "[{}] target must be {} for input {}, got {}", op, want, x.sizes(),
                   t.sizes());
}
}  // namespace

// -(y log sigmoid(x) + (1 - y) log sigmoid(-x)), times the class weight, averaged over the
// classes: one loss per sample.
Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target, const Tensor& weight,
                                   std::string_view reduction, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("multilabel_soft_margin_loss", [&]() -> Tensor {
    const char* op = "multilabel_soft_margin_loss";
    check_scores(op, input);
    check_same(op, {{"input", &input}, {"target", &target}});
    check_class_weight(op, weight, input);
    Tensor l = neg(target * log_sigmoid(input) + (1 - target) * log_sigmoid(neg(input)));
    if (weight.defined()) l = l * weight;
    const int64_t c = input.dim() - 1;
    return reduce_loss(op, mean(l, {c}), reduction);
  });
}

// sum over i != y of w[y] max(0, margin - x[y] + x[i])^p, over the number of classes.
Tensor multi_margin_loss(const Tensor& input, const Tensor& target, int64_t p, double margin,
                         const Tensor& weight, std::string_view reduction,
                         std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("multi_margin_loss", [&]() -> Tensor {
    const char* op = "multi_margin_loss";
    check_scores(op, input);
    check_index_target(
        op, target,
        target.dim() == input.dim() - 1 &&
            (target.dim() == 0 || detail::size_is(target, 0, detail::sym_dim(input, 0), op)),
        "(N) for input (N, C), or 0-d for (C)", input);
    DUET_CHECK_VALUE(p == 1 || p == 2, "[{}] p must be 1 or 2, got {}", op, p);
    check_class_weight(op, weight, input);
    const bool one = input.dim() == 1;
    const Tensor x = one ? unsqueeze(input, 0) : input;
    const Tensor y = unsqueeze(one ? unsqueeze(target, 0) : target, 1);  // (N, 1)
    const int64_t classes = x.size(1);
    Tensor h = relu(margin - gather(x, 1, y) + x);
    if (p == 2) h = h * h;
    // The target's own class adds nothing (its term would be margin^p).
    h = where(eq(arange(classes, Options().dtype(DType::i64).device(x.device())), y), 0.0, h);
    if (weight.defined()) h = h * unsqueeze(index_select(weight, 0, squeeze(y, 1)), 1);
    Tensor l = mean(h, {1});
    if (one) l = squeeze(l, 0);
    return reduce_loss(op, l, reduction);
  });
}

// For each target class j (the leading entries of the target's row, up to the first -1) and
// each class i that is not a target, max(0, 1 - (x[j] - x[i])), summed, over the classes.
Tensor multilabel_margin_loss(const Tensor& input, const Tensor& target, std::string_view reduction,
                              std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("multilabel_margin_loss", [&]() -> Tensor {
    const char* op = "multilabel_margin_loss";
    check_scores(op, input);
    check_index_target(op, target, detail::same_shape(target, input, op), "the input's shape",
                       input);
    const bool one = input.dim() == 1;
    const Tensor x = one ? unsqueeze(input, 0) : input;
    const Tensor t = one ? unsqueeze(target, 0) : target;
    const int64_t classes = x.size(1);
    // valid: the entries before the row's first -1; their classes, and which classes they are.
    const Tensor valid = eq(cumsum(eq(t, -1).to(DType::i64), 1), 0);
    const Tensor y = where(valid, t, 0);
    const Tensor classes_at =
        arange(classes, Options().dtype(DType::i64).device(x.device())).reshape({1, 1, classes});
    const Tensor v = unsqueeze(valid.to(DType::i64), 2);  // (N, J, 1)
    const Tensor is_target =
        gt(sum(eq(unsqueeze(y, 2), classes_at).to(DType::i64) * v, {1}), 0);     // (N, C)
    const Tensor h = relu(1 - unsqueeze(gather(x, 1, y), 2) + unsqueeze(x, 1));  // (N, J, C)
    const Tensor counted = gt(v * unsqueeze(1 - is_target.to(DType::i64), 1), 0);
    Tensor l = sum(where(counted, h, 0.0), {1, 2}) / static_cast<double>(classes);
    if (one) l = squeeze(l, 0);
    return reduce_loss(op, l, reduction);
  });
}

}  // namespace duet
