// Normalizations: layer_norm, rms_norm and group_norm (torch.nn.functional's), and the vector
// norms of normalize and cosine_similarity. Composites of reductions and elementwise
// math, in f32 for f16 and bf16 inputs and under autocast, as layer_norm.
#include <cmath>
#include <limits>
#include <string>

#include "core/autocast.h"
#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace {

// The trailing dims of x that `normalized` names, checked as layer_norm checks them.
Dims trailing_dims(const char* op, const Tensor& x, const Shape& normalized) {
  const int64_t k = normalized.size(), nd = x.dim();
  DUET_CHECK_SHAPE(k >= 1 && k <= nd, "[{}] normalized shape {} does not fit input {}", op,
                   normalized, x.sizes());
  Dims dims;
  for (int64_t i = 0; i < k; ++i) {
    DUET_CHECK_SHAPE(detail::size_is(x, nd - k + i, normalized[i], op),
                     "[{}] normalized shape {} does not match the last dims of {}", op, normalized,
                     x.sizes());
    dims.push_back(nd - k + i);
  }
  return dims;
}

// Note [Norms at zero]
// The p-norm (sum |x|^p)^(1/p) of an all-zero vector is 0, and its gradient there is 0, as
// PyTorch's linalg_vector_norm's: the root's derivative is infinite at 0, and the zero gradient
// of the sum times it was NaN. The root reads 1 where the sum is 0, and the norm is 0 there.
// The infinity norms are amax and amin of |x| (the gradient split evenly among ties, as
// PyTorch's), the 0 "norm" counts the nonzero elements (no gradient), and 1 sums |x|.
Tensor p_norm(const Tensor& x, double p, const Dims& dims, bool keepdim) {
  if (std::isinf(p)) return p > 0 ? amax(abs(x), dims, keepdim) : amin(abs(x), dims, keepdim);
  if (p == 0) return sum(ne(x, 0), dims, keepdim).to(x.dtype());
  if (p == 1) return sum(abs(x), dims, keepdim);
  const Tensor s = p == 2 ? sum(x * x, dims, keepdim) : sum(pow(abs(x), p), dims, keepdim);
  const Tensor zero = eq(s, 0);  // (not s > 0: a NaN sum gives a NaN norm, as PyTorch's)
  const Tensor safe = where(zero, 1, s);
  return where(zero, 0, p == 2 ? sqrt(safe) : pow(safe, 1 / p));
}

int64_t wrap_dim(const char* op, int64_t dim, const Tensor& x) {
  DUET_CHECK_VALUE(dim >= -x.dim() && dim < x.dim(), "[{}] dim {} is out of range for {}", op, dim,
                   x.sizes());
  return dim < 0 ? dim + x.dim() : dim;
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, Shape normalized, const Tensor& weight_in,
                  const Tensor& bias_in, double eps, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("layer_norm", [&]() -> Tensor {
    Tensor held_x;
    const Tensor& x = detail::autocast_f32(x_in, held_x);
    Tensor held_weight;
    const Tensor& weight = detail::autocast_f32(weight_in, held_weight);
    Tensor held_bias;
    const Tensor& bias = detail::autocast_f32(bias_in, held_bias);
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[layer_norm] needs a floating input, got {}",
                     x.dtype());
    const Dims dims = trailing_dims("layer_norm", x, normalized);
    // f16 and bf16 compute in f32 and round once (a square overflows f16 above 256).
    if (is_low_precision(x.dtype()))
      return layer_norm(x.to(DType::f32), normalized,
                        weight.defined() ? weight.to(DType::f32) : weight,
                        bias.defined() ? bias.to(DType::f32) : bias, eps)
          .to(x.dtype());
    Tensor mu = mean(x, dims, /*keepdim=*/true);
    Tensor xc = x - mu;
    Tensor var = mean(xc * xc, dims, /*keepdim=*/true);
    Tensor y = xc * rsqrt(var + eps);
    if (weight.defined()) {
      DUET_CHECK_SHAPE(weight.sizes() == normalized, "[layer_norm] weight {} must have shape {}",
                       weight.sizes(), normalized);
      y = y * weight;
    }
    if (bias.defined()) {
      DUET_CHECK_SHAPE(bias.sizes() == normalized, "[layer_norm] bias {} must have shape {}",
                       bias.sizes(), normalized);
      y = y + bias;
    }
    return y;
  });
}

Tensor rms_norm(const Tensor& x_in, Shape normalized, const Tensor& weight_in,
                std::optional<double> eps, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("rms_norm", [&]() -> Tensor {
    DUET_CHECK_VALUE(x_in.defined(), "[rms_norm] the input is an undefined tensor");
    // PyTorch's default eps: the machine epsilon of the input's own dtype.
    const double e = eps ? *eps
                         : (x_in.dtype() == DType::f64    ? std::numeric_limits<double>::epsilon()
                            : x_in.dtype() == DType::bf16 ? 0.0078125
                            : x_in.dtype() == DType::f16  ? 0.0009765625
                                                          : std::numeric_limits<float>::epsilon());
    Tensor held_x;
    const Tensor& x = detail::autocast_f32(x_in, held_x);
    Tensor held_w;
    const Tensor& weight = detail::autocast_f32(weight_in, held_w);
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[rms_norm] needs a floating input, got {}",
                     x.dtype());
    DUET_CHECK_VALUE(e >= 0, "[rms_norm] eps must be non-negative, got {}", e);
    const Dims dims = trailing_dims("rms_norm", x, normalized);
    if (weight.defined())
      DUET_CHECK_SHAPE(weight.sizes() == normalized, "[rms_norm] weight {} must have shape {}",
                       weight.sizes(), normalized);
    if (is_low_precision(x.dtype()))
      return rms_norm(x.to(DType::f32), normalized,
                      weight.defined() ? weight.to(DType::f32) : weight, e)
          .to(x.dtype());
    Tensor y = x * rsqrt(mean(x * x, dims, /*keepdim=*/true) + e);
    return weight.defined() ? y * weight : y;
  });
}

Tensor group_norm(const Tensor& x_in, int64_t num_groups, const Tensor& weight_in,
                  const Tensor& bias_in, double eps, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("group_norm", [&]() -> Tensor {
    DUET_CHECK_VALUE(x_in.defined(), "[group_norm] the input is an undefined tensor");
    Tensor held_x, held_w, held_b;
    const Tensor& x = detail::autocast_f32(x_in, held_x);
    const Tensor& weight = detail::autocast_f32(weight_in, held_w);
    const Tensor& bias = detail::autocast_f32(bias_in, held_b);
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[group_norm] needs a floating input, got {}",
                     x.dtype());
    DUET_CHECK_SHAPE(x.dim() >= 2, "[group_norm] input must be (N, C, ...), got {}", x.sizes());
    const int64_t c = x.size(1);
    DUET_CHECK_VALUE(num_groups > 0 && c % num_groups == 0,
                     "[group_norm] {} channels of input {} do not split into {} groups", c,
                     x.sizes(), num_groups);
    for (const Tensor* t : {&weight, &bias})
      if (t->defined())
        DUET_CHECK_SHAPE(t->dim() == 1 && t->size(0) == c,
                         "[group_norm] weight and bias must be ({}), got {}", c, t->sizes());
    if (is_low_precision(x.dtype()))
      return group_norm(x.to(DType::f32), num_groups,
                        weight.defined() ? weight.to(DType::f32) : weight,
                        bias.defined() ? bias.to(DType::f32) : bias, eps)
          .to(x.dtype());
    // (N, G, C / G * rest): each group's statistics over its channels and positions.
    const SymDims xs = detail::sym_dims(x);
    const Tensor g = detail::reshape_dims(x, {xs[0], SymInt(num_groups), SymInt(-1)});
    const Tensor mu = mean(g, {2}, /*keepdim=*/true);
    const Tensor gc = g - mu;
    const Tensor var = mean(gc * gc, {2}, /*keepdim=*/true);
    Tensor y = detail::reshape_dims(gc * rsqrt(var + eps), xs);
    Shape along{c};  // the per-channel affine, (C, 1, ..., 1)
    for (int64_t d = 2; d < x.dim(); ++d) along.push_back(1);
    if (weight.defined()) y = y * reshape(weight, along);
    if (bias.defined()) y = y + reshape(bias, along);
    return y;
  });
}

Tensor normalize(const Tensor& x, double p, int64_t dim, double eps, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("normalize", [&]() -> Tensor {
    DUET_CHECK_VALUE(x.defined(), "[normalize] the input is an undefined tensor");
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[normalize] needs a floating input, got {}",
                     x.dtype());
    DUET_CHECK_VALUE(p > 0 && !std::isnan(p), "[normalize] p must be positive, got {}", p);
    DUET_CHECK_SHAPE(x.dim() > 0, "[normalize] needs at least one dim, got a 0-d input");
    const int64_t d = wrap_dim("normalize", dim, x);
    return x / clamp(p_norm(x, p, {d}, true), eps, INFINITY);
  });
}

Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim, double eps,
                         std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("cosine_similarity", [&]() -> Tensor {
    DUET_CHECK_VALUE(a.defined() && b.defined(),
                     "[cosine_similarity] an input is an undefined tensor");
    DUET_CHECK_DTYPE(is_floating(a.dtype()) && a.dtype() == b.dtype(),
                     "[cosine_similarity] needs two floating inputs of one dtype, got {} and {}",
                     a.dtype(), b.dtype());
    bool fits = a.dim() == b.dim() && a.dim() > 0;
    for (int64_t i = 0; fits && i < a.dim(); ++i)
      fits = a.size(i) == b.size(i) || a.size(i) == 1 || b.size(i) == 1;
    DUET_CHECK_SHAPE(fits,
                     "[cosine_similarity] inputs {} and {} must have one number of dims (at least "
                     "1) and broadcast",
                     a.sizes(), b.sizes());
    const int64_t d = wrap_dim("cosine_similarity", dim, a);
    // Each side over its own norm, as PyTorch's: the clamped norms below eps.
    const Tensor an = a / clamp(p_norm(a, 2, {d}, true), eps, INFINITY);
    const Tensor bn = b / clamp(p_norm(b, 2, {d}, true), eps, INFINITY);
    return sum(an * bn, {d});
  });
}

// ||x1 - x2 + eps||_p over the last dim, as torch.nn.functional.pairwise_distance (the eps keeps
// the norm of equal rows off 0).
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim,
                         std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("pairwise_distance", [&]() -> Tensor {
    DUET_CHECK_VALUE(x1.defined() && x2.defined(),
                     "[pairwise_distance] an input is an undefined tensor");
    DUET_CHECK_DTYPE(is_floating(x1.dtype()) && x1.dtype() == x2.dtype(),
                     "[pairwise_distance] needs two floating inputs of one dtype, got {} and {}",
                     x1.dtype(), x2.dtype());
    DUET_CHECK_VALUE(p >= 0, "[pairwise_distance] p must be non-negative, got {}", p);
    const Tensor d = x1 - x2 + eps;  // (broadcast: mismatched shapes raise sub's error)
    DUET_CHECK_SHAPE(d.dim() >= 1,
                     "[pairwise_distance] needs inputs of at least 1 dim, got {} and {}",
                     x1.sizes(), x2.sizes());
    const Tensor n = p_norm(d, p, {d.dim() - 1}, true);
    return keepdim ? n : squeeze(n, d.dim() - 1);
  });
}

namespace {
void check_norm_input(const char* op, const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", op);
  DUET_CHECK_DTYPE(is_floating(x.dtype()),
                   "[{}] needs a floating input, got {} of shape {}; convert with "
                   ".to(DType::f32)",
                   op, x.dtype(), x.sizes());
}
}  // namespace

// torch.linalg.vector_norm (Note [Norms at zero]); f16 and bf16 sum in f32 and round once.
Tensor vector_norm(const Tensor& x_in, double ord, Dims dims, bool keepdim,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("vector_norm", [&]() -> Tensor {
    check_norm_input("vector_norm", x_in);
    DUET_CHECK_VALUE(!std::isnan(ord), "[vector_norm] ord must be a number, got NaN");
    const bool low = x_in.dtype() == DType::f16 || x_in.dtype() == DType::bf16;
    const Tensor x = low ? x_in.to(DType::f32) : x_in;
    const Tensor n = p_norm(x, ord, dims, keepdim);
    return low ? n.to(x_in.dtype()) : n;
  });
}

Tensor norm(const Tensor& x, double p, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("norm", [&]() -> Tensor { return vector_norm(x, p, dims, keepdim); });
}

// Every row of x1 (..., P, M) against every row of x2 (..., R, M): (..., P, R), the batch dims
// broadcast, as torch.cdist. The differences are formed whole (P R M elements per batch), so
// the result is exact and its gradient at equal rows is 0 (Note [Norms at zero]).
Tensor cdist(const Tensor& x1, const Tensor& x2, double p, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("cdist", [&]() -> Tensor {
    check_norm_input("cdist", x1);
    check_norm_input("cdist", x2);
    DUET_CHECK_VALUE(p >= 0 && !std::isnan(p), "[cdist] p must be non-negative, got {}", p);
    DUET_CHECK_SHAPE(
        x1.dim() >= 2 && x2.dim() >= 2 &&
            detail::size_is(x2, x2.dim() - 1, detail::sym_dim(x1, x1.dim() - 1), "cdist"),
        "[cdist] needs x1 (..., P, M) and x2 (..., R, M) with one M, got {} and {}", x1.sizes(),
        x2.sizes());
    DUET_CHECK_DTYPE(x1.dtype() == x2.dtype(), "[cdist] x1 ({}) and x2 ({}) must share a dtype",
                     x1.dtype(), x2.dtype());
    return vector_norm(unsqueeze(x1, -2) - unsqueeze(x2, -3), p, {-1});
  });
}

}  // namespace duet
