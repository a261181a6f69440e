// Composites for neural networks: no kernel or gradient of their own. Each is written so that
// the gradient the tape derives is as accurate as a hand-written one: the max subtracted by
// softmax, log_softmax and logsumexp is detached (the result does not depend on it), and the
// logistic losses use the LogSigmoid primitive, whose gradient is exact at 0.
#include <cmath>

#include "core/autocast.h"
#include "core/op_table.h"
#include "core/op_errors.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {

namespace {
// Checks a floating input and wraps dim, so that errors name the op called.
int64_t check_soft(const char* op, const Tensor& x, int64_t dim) {
  DUET_CHECK_DTYPE(is_floating(x.dtype()), "[{}] needs a floating input, got {}", op, x.dtype());
  return detail::wrap_dim(op, dim, x.dim());
}
Tensor stable_max(const Tensor& x, int64_t dim) {
  // An empty dim has no maximum: its rows are empty, and their sums 0 (so logsumexp is -inf).
  if (x.dim() && detail::size_is(x, dim, 0, "max")) {
    SymDims s = detail::sym_dims(x);
    s[dim] = 1;
    return detail::full_dims(s, 0, Options().dtype(x.dtype()).device(x.device()));
  }
  // The row maximum, detached; +-inf rows use 0 so that x - m stays finite where x is.
  Tensor m = max(x, dim, /*keepdim=*/true).detach();
  return where(eq(abs(m), INFINITY), 0.0, m);
}
}  // namespace

// The softmax family computes f16 and bf16 in f32 and rounds once, as PyTorch's kernels do:
// x - max and x - logsumexp cancel, and rounding each step to 11 or 8 bits lost a few percent of
// a log-probability near 0 (cross_entropy of a confident prediction).
Tensor softmax(const Tensor& x_in, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("softmax", [&]() -> Tensor {
    Tensor held_x;
    const Tensor& x = detail::autocast_f32(x_in, held_x);
    dim = check_soft("softmax", x, dim);
    if (is_low_precision(x.dtype())) return softmax(x.to(DType::f32), dim).to(x.dtype());
    Tensor e = exp(x - stable_max(x, dim));
    return e / sum(e, dim, /*keepdim=*/true);
  });
}

// Note [log_softmax]
// log_softmax is one op: cross_entropy starts with it, and as nine ops (the stable maximum and
// its guard, the difference, exp, sum, log and the last difference) it was nine tape nodes per
// call eagerly, and nine groups per length of per-sample logits under Autobatch. Its values are
// the composite's, x - m - log(sum(exp(x - m))), m the row's maximum or 0 where that is +-inf:
// the CPU kernel computes them row by row in cache, other devices with their own kernels of
// those steps (kernels/softmax.cpp); f16 and bf16 in f32, rounded once. Its gradient is
// g - exp(out) * sum(g) along the dim, from the saved result, as PyTorch's: a compiled step
// keeps that result to the backward, where the fused composite had kept the input and two
// values per row (W9's compiled bf16 step: 27 MiB more; recomputing the softmax from the input
// instead materialized an f32 copy of it in the backward, which was worse). attrs.dtype is the
// result's: the input's, or f32 for an f16 or bf16 input under autocast, which reads the input
// as it is (PyTorch's half_to_float): an f32 copy of the input would be one more buffer of the
// logits' size (a language model's: vocabulary x tokens).
Tensor log_softmax(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.dim = check_soft("log_softmax", x, dim);
  a.dtype = detail::autocast_f32_dtype(x);
  const Tensor* in[] = {&x};
  return detail::call(OpId::LogSoftmax, TensorRefs(in, 1), a);
}

Tensor logsumexp(const Tensor& x_in, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("logsumexp", [&]() -> Tensor {
    Tensor held_x;
    const Tensor& x = detail::autocast_f32(x_in, held_x);
    dim = check_soft("logsumexp", x, dim);
    if (is_low_precision(x.dtype())) return logsumexp(x.to(DType::f32), dim).to(x.dtype());
    // An empty dim sums nothing: -inf, with the empty sum's history. Through log(sum(exp(...)))
    // the gradient divides by that sum of 0, which reverse mode never shows (the gradient is
    // empty) but jvp, differentiating the gradient again, did: 0 * inf, NaN where J v is 0
    // (Note [jvp by two vjps] in trace/func.cpp).
    if (x.dim() && detail::size_is(x, dim, 0, "logsumexp")) return sum(x, dim) - INFINITY;
    Tensor m = stable_max(x, dim);
    return squeeze(m + log(sum(exp(x - m), dim, /*keepdim=*/true)), dim);
  });
}

// Note [Activations in f32]
// gelu and silu of an f16 or bf16 tensor compute in f32 and round once, as PyTorch's kernels do
// (their opmath type is float): the composite's every step rounded to bf16 lost precision (seven
// roundings in tanh-GELU's forward, twenty in its backward), and a fused kernel spent most of its
// time on those roundings (W8's GELU under autocast ran 5x slower in bf16 than in f32). The casts
// fuse with the math, so a compiled step loads bf16, computes in f32 and stores bf16, and the
// backward, through the casts' gradients, does the same.
Tensor gelu(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (is_low_precision(x.dtype())) return gelu(x.to(DType::f32), loc).to(x.dtype());
  return x * 0.5 * (1 + erf(x * 0.70710678118654752440));
}

// The tanh form, one op (GeluTanh), reads x^3 as x * x * x, and
// sqrt(2/pi) to double precision. Its 0.5 (1 + tanh(u)) is computed as sigmoid(2u), the same
// function: for negative x, 1 + tanh(u) cancels (tanh(u) near -1), and so do 1 - tanh(u)^2 and
// 1 + tanh(u) in the gradient, which lost a thousandth of its value in f32 at x = -4 (twice
// PyTorch's error there, tests/test_torch_reference.cpp's gelu_tanh); sigmoid(2u) and its
// gradient s (1 - s) keep their relative precision on that side.
Tensor gelu(const Tensor& x, std::string_view approximate, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (approximate == "none") return gelu(x, loc);
  DUET_CHECK_VALUE(approximate == "tanh",
                   "[gelu] approximate must be \"none\" or \"tanh\", got \"{}\" (input {} of "
                   "dtype {})",
                   approximate, x.sizes(), x.dtype());
  if (is_low_precision(x.dtype())) return gelu(x.to(DType::f32), approximate, loc).to(x.dtype());
  return gelu_tanh(x);  // one op (Note [GELU's tanh form as one op] in kernels/functors.h)
}

Tensor silu(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (is_low_precision(x.dtype())) return silu(x.to(DType::f32), loc).to(x.dtype());
  return x * sigmoid(x);
}

// The exponential reads beta * x only where it is at most the threshold (0 elsewhere): the
// unselected branch of a where still takes part in its gradient, and e^(beta * x) overflowing
// there would turn that zero gradient into NaN (0 * inf).
Tensor softplus(const Tensor& x, double beta, double threshold, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(std::isfinite(beta) && beta != 0,
                   "[softplus] beta must be finite and nonzero, got {} (input {} of dtype {})",
                   beta, x.sizes(), x.dtype());
  // f16 and bf16 compute in f32 and round once, as one kernel would (exp overflows f16 at 11).
  if (is_low_precision(x.dtype()))
    return softplus(x.to(DType::f32), beta, threshold, loc).to(x.dtype());
  Tensor z = x * beta;
  Tensor linear = gt(z, threshold);
  return where(linear, x, log1p(exp(where(linear, 0, z))) / beta);
}

// An input of rank > 2 is multiplied as one (rows, in) matrix, reshaped back afterwards: one
// GEMM rather than one per leading index, and the weight's gradient is one product x^T dy in the
// weight's layout instead of a batch of products summed over the batch. A bias is added inside
// that GEMM (addmm, Note [addmm] in core/ops/linalg.cpp). A vector (one sample,
// per-sample code) is the weight times it, one op with the bias (addmv; Note [Vector operands]
// in core/ops/linalg.cpp): no transposed weight, no view around the product and no add after it
// (each a tape node eagerly, an op to record and run under Autobatch, whose batching rule makes
// the samples' vectors one product again).
Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
              std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("linear", [&]() -> Tensor {
    Tensor held_x;
    const Tensor& x = detail::autocast_lower(x_in, held_x);
    Tensor held_weight;
    const Tensor& weight = detail::autocast_lower(weight_in, held_weight);
    Tensor held_bias;
    const Tensor& bias = detail::autocast_lower(bias_in, held_bias);
    DUET_CHECK_SHAPE(weight.dim() == 2, "[linear] weight must be (out, in), got {}",
                     weight.sizes());
    DUET_CHECK_SHAPE(
        x.dim() >= 1 && detail::size_is(x, x.dim() - 1, detail::sym_dim(weight, 1), "linear"),
        "[linear] input {} has {} features but the weight {} expects {}", x.sizes(),
        x.dim() ? x.sizes()[x.dim() - 1] : 0, weight.sizes(), weight.sizes()[1]);
    DUET_CHECK_DTYPE(x.dtype() == weight.dtype(),
                     "[linear] input ({}) and weight ({}) must share a dtype", x.dtype(),
                     weight.dtype());
    if (bias.defined())
      DUET_CHECK_SHAPE(
          bias.dim() == 1 && detail::size_is(bias, 0, detail::sym_dim(weight, 0), "linear"),
          "[linear] bias must be ({}), got {}", weight.sizes()[0], bias.sizes());
    if (x.dim() == 1) {  // one op with its bias (Note [addmv] in core/ops/linalg.cpp)
      if (bias.defined() && bias.dtype() == x.dtype()) return addmv(bias, weight, x);
      Tensor y = matmul(weight, x);
      return bias.defined() ? std::move(y) + bias : y;
    }
    const SymDims xd = detail::sym_dims(x);
    Tensor x2 = x;
    if (x.dim() > 2) {
      SymInt rows = 1;
      for (size_t i = 0; i + 1 < xd.size(); ++i) rows *= xd[i];
      x2 = detail::reshape_dims(x, {rows, xd.back()});
    }
    // With a bias of the product's dtype, one op that adds it inside the GEMM (Note [addmm]).
    Tensor y = bias.defined() && bias.dtype() == x.dtype()
                   ? addmm(bias, x2, transpose(weight, 0, 1))
                   : matmul(x2, transpose(weight, 0, 1));
    if (bias.defined() && bias.dtype() != x.dtype()) y = std::move(y) + bias;
    if (x.dim() <= 2) return y;
    SymDims yd(xd.begin(), xd.end() - 1);
    yd.push_back(detail::sym_dim(weight, 0));
    return detail::reshape_dims(y, yd);
  });
}

namespace detail {
void check_attention_options(const char* op, const Tensor& q, const Tensor& attn_mask,
                             bool is_causal, double scale) {
  DUET_CHECK_VALUE(std::isfinite(scale) && scale >= 0,
                   "[{}] scale must be finite and non-negative (0: 1/sqrt(E)), got {}", op, scale);
  DUET_CHECK_VALUE(!(is_causal && attn_mask.defined()),
                   "[{}] is_causal cannot be combined with an attn_mask (mask {} of dtype {})", op,
                   attn_mask.sizes(), attn_mask.dtype());
  if (attn_mask.defined())
    DUET_CHECK_DTYPE(attn_mask.dtype() == DType::b8 || attn_mask.dtype() == q.dtype(),
                     "[{}] attn_mask must be b8 or the query's dtype {}, got {} of shape {}", op,
                     q.dtype(), attn_mask.dtype(), attn_mask.sizes());
}

Tensor attention_weights(const char* op, const Tensor& q, const Tensor& k, const Tensor& attn_mask,
                         bool is_causal, double scale) {
  DUET_CHECK_DTYPE(is_floating(q.dtype()) && k.dtype() == q.dtype(),
                   "[{}] query and key must share a floating dtype, got {} and {}", op, q.dtype(),
                   k.dtype());
  DUET_CHECK_SHAPE(q.dim() >= 2 && k.dim() >= 2,
                   "[{}] query and key need at least 2 dims (..., L, E) and (..., S, E), got {} "
                   "and {}",
                   op, q.sizes(), k.sizes());
  const SymDims qd = sym_dims(q), kd = sym_dims(k);
  DUET_CHECK_SHAPE(size_is(k, k.dim() - 1, qd.back(), op),
                   "[{}] query {} (..., L, E) and key {} (..., S, E) differ in E", op, q.sizes(),
                   k.sizes());
  check_attention_options(op, q, attn_mask, is_causal, scale);
  // The default scale of a symbolic E is a tensor of its size, not a constant of the trace.
  const SymInt e = qd.back();
  Tensor scores = matmul(q, transpose(k, -1, -2));
  if (scale > 0)
    scores = std::move(scores) * scale;
  else if (e.is_concrete())
    scores = std::move(scores) * (1 / std::sqrt(static_cast<double>(e.concrete())));
  else
    scores = std::move(scores) * rsqrt(size_scalar(e, q.dtype(), q.device()));
  if (is_causal) {
    const Options io = Options().dtype(DType::i64).device(q.device());
    Tensor row = unsqueeze(arange_dims(qd[qd.size() - 2], io), 1);
    Tensor col = unsqueeze(arange_dims(kd[kd.size() - 2], io), 0);
    scores = where(ge(row, col), scores, -INFINITY);
  } else if (attn_mask.defined()) {
    scores = attn_mask.dtype() == DType::b8 ? where(attn_mask, scores, -INFINITY)
                                            : std::move(scores) + attn_mask;
  }
  return softmax(scores, -1);
}
}  // namespace detail

namespace {

// The per-class weight laid along the class dim of a (N, C, d1, ...) input: (C, 1, ..., 1).
Tensor weight_along_classes(const Tensor& w, const Tensor& lp, int64_t cdim) {
  if (cdim == 0) return w;
  Shape s{w.size(0)};
  for (int64_t d = cdim + 1; d < lp.dim(); ++d) s.push_back(1);
  return reshape(w, s);
}

void check_ce_options(const Tensor& logits, const CrossEntropyOptions& o, int64_t cdim) {
  const double s = o.label_smoothing();
  DUET_CHECK_VALUE(s >= 0.0 && s <= 1.0,
                   "[cross_entropy] label_smoothing must be in [0, 1], got {}", s);
  const Tensor& w = o.weight();
  if (!w.defined()) return;
  DUET_CHECK_SHAPE(
      w.dim() == 1 && detail::size_is(w, 0, detail::sym_dim(logits, cdim), "cross_entropy"),
      "[cross_entropy] weight must be 1-D with one element per class: logits {} "
      "have {} classes, weight has shape {}",
      detail::dims_str(detail::sym_dims(logits)), detail::sym_dim(logits, cdim).str(), w.sizes());
  DUET_CHECK_DTYPE(w.dtype() == logits.dtype(),
                   "[cross_entropy] weight must have the logits' dtype {}, got {}", logits.dtype(),
                   w.dtype());
}

// None keeps one loss per target, Sum adds them, Mean is mean_of(loss) (each kind of target
// has its own denominator).
template <class MeanOf>
Tensor reduced(const Tensor& loss, Reduction r, MeanOf&& mean_of) {
  if (r == Reduction::None) return loss;
  if (r == Reduction::Sum) return sum(loss);
  return mean_of(loss);
}

// Class-index targets: PyTorch's nll_loss of log_softmax, with the label-smoothing term
// -sum_c w_c lp_c on the targets not ignored, both reduced over the same denominator.
Tensor ce_indices(const Tensor& lp, const Tensor& targets, const CrossEntropyOptions& o,
                  int64_t cdim) {
  const SymDims ls = detail::sym_dims(lp);
  bool fits =
      (lp.dim() == 1 && targets.dim() == 0) || (lp.dim() >= 2 && targets.dim() == lp.dim() - 1);
  for (int64_t d = 0; fits && lp.dim() >= 2 && d < targets.dim(); ++d)
    fits = detail::size_is(targets, d, ls[d == 0 ? 0 : d + 1], "cross_entropy");
  DUET_CHECK_SHAPE(fits,
                   "[cross_entropy] expected logits (N, C, d1, ...) with class indices (N, d1, "
                   "...), or (C) with a 0-d index; got logits {} and targets {}",
                   detail::dims_str(ls), detail::dims_str(detail::sym_dims(targets)));
  const Tensor& w = o.weight();
  // Per target: its class's weight, 0 where ignored (the mean's denominator adds them).
  // (Named, not a structured binding: clang's OpenMP cannot capture one in the lambda below.)
  const std::pair<Tensor, Tensor> terms_and_weights =
      detail::class_nll(lp, targets, w, o.ignore_index(), cdim);
  const Tensor &nll = terms_and_weights.first, &wt = terms_and_weights.second;
  Tensor loss = nll;
  if (const double s = o.label_smoothing(); s > 0) {
    Tensor terms = w.defined() ? lp * weight_along_classes(w, lp, cdim) : lp;
    Tensor smooth = where(ne(targets, o.ignore_index()), neg(sum(terms, cdim)), 0.0);
    loss = nll * (1.0 - s) + smooth * (s / static_cast<double>(lp.size(cdim)));
  }
  return reduced(loss, o.reduction(), [&](const Tensor& l) { return sum(l) / sum(wt); });
}

// Class-probability targets: -sum_c w_c p_c lp_c per row, smoothed towards uniform; the mean is
// over the rows (PyTorch's).
Tensor ce_probabilities(const Tensor& lp, const Tensor& targets, const CrossEntropyOptions& o,
                        int64_t cdim) {
  DUET_CHECK_SHAPE(detail::same_shape(lp, targets, "cross_entropy"),
                   "[cross_entropy] class probabilities must have the logits' shape: logits {} "
                   "and targets {}",
                   detail::dims_str(detail::sym_dims(lp)),
                   detail::dims_str(detail::sym_dims(targets)));
  DUET_CHECK_DTYPE(targets.dtype() == lp.dtype(),
                   "[cross_entropy] class probabilities must have the logits' dtype {}, got {}",
                   lp.dtype(), targets.dtype());
  Tensor p = targets;
  if (const double s = o.label_smoothing(); s > 0)
    p = p * (1.0 - s) + s / static_cast<double>(lp.size(cdim));
  Tensor terms = lp * p;
  if (o.weight().defined()) terms = terms * weight_along_classes(o.weight(), lp, cdim);
  Tensor loss = neg(sum(terms, cdim));
  return reduced(loss, o.reduction(), [](const Tensor& l) { return mean(l); });
}

Reduction parse_reduction(std::string_view r) {
  if (r == "none") return Reduction::None;
  if (r == "sum") return Reduction::Sum;
  DUET_CHECK_VALUE(r == "mean",
                   "[cross_entropy] reduction must be \"none\", \"mean\" or \"sum\", got \"{}\"",
                   r);
  return Reduction::Mean;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                     const CrossEntropyOptions& options, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("cross_entropy", [&]() -> Tensor {
    // A loss: f32 under autocast (Note [Autocast]); log_softmax reads f16 or bf16 logits as
    // they are and gives f32 (Note [log_softmax]).
    Tensor held_targets;
    const Tensor& logits = logits_in;
    const Tensor& targets = detail::autocast_f32(targets_in, held_targets);
    DUET_CHECK_DTYPE(is_floating(logits.dtype()), "[cross_entropy] logits must be floating, got {}",
                     logits.dtype());
    DUET_CHECK_SHAPE(logits.dim() >= 1,
                     "[cross_entropy] logits must have a class dim: (N, C, d1, ...) or (C), got a "
                     "0-d tensor");
    const int64_t cdim = logits.dim() == 1 ? 0 : 1;
    Tensor lp = log_softmax(logits, cdim);
    check_ce_options(lp, options, cdim);
    if (is_floating(targets.dtype())) return ce_probabilities(lp, targets, options, cdim);
    DUET_CHECK_DTYPE(targets.dtype() == DType::i64,
                     "[cross_entropy] targets must be i64 class indices or floating class "
                     "probabilities, got {} of shape {}",
                     targets.dtype(), detail::dims_str(detail::sym_dims(targets)));
    return ce_indices(lp, targets, options, cdim);
  });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction,
                     std::source_location loc) {
  return cross_entropy(logits, targets, CrossEntropyOptions().reduction(reduction), loc);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::string_view reduction,
                     std::source_location loc) {
  detail::SiteGuard site(loc);
  return cross_entropy(logits, targets, CrossEntropyOptions().reduction(parse_reduction(reduction)),
                       loc);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits_in, const Tensor& targets_in,
                                        std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("binary_cross_entropy_with_logits", [&]() -> Tensor {
    Tensor held_logits;
    const Tensor& logits = detail::autocast_f32(logits_in, held_logits);
    Tensor held_targets;
    const Tensor& targets = detail::autocast_f32(targets_in, held_targets);
    DUET_CHECK_SHAPE(detail::same_shape(logits, targets, "binary_cross_entropy_with_logits"),
                     "[binary_cross_entropy_with_logits] logits {} and targets {} must have the "
                     "same shape",
                     logits.sizes(), targets.sizes());
    DUET_CHECK_DTYPE(is_floating(targets.dtype()),
                     "[binary_cross_entropy_with_logits] targets must be floating, got {}",
                     targets.dtype());
    // -(y log s(x) + (1 - y) log s(-x)): d/dx = s(x) - y exactly, finite for any logits.
    return neg(mean(targets * log_sigmoid(logits) + (1 - targets) * log_sigmoid(neg(logits))));
  });
}

}  // namespace duet
