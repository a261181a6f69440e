// The piecewise activations of torch.nn.functional: leaky_relu, elu, selu, celu, hardtanh, relu6,
// hardsigmoid, hardswish, mish, glu and prelu, composed of comparisons, where and elementwise math
// (Note [Piecewise activations]).
#include <cmath>
#include <string>

#include "core/op_errors.h"
#include "core/ops.h"

namespace duet {
namespace {

// Note [Piecewise activations]
// Each is a `where` over its pieces, written so that its gradient is PyTorch's own, at the
// joins too: a piece's gradient flows only where the piece is selected, and PyTorch's backward
// kernels decide the joins (hardtanh passes no gradient at its bounds, hardswish's is x / 3 +
// 0.5 inside (-3, 3), leaky_relu's at 0 is the slope). An exponential piece reads 0 where it is not
// selected: the unselected branch of a where still takes part in its gradient, and e^x
// overflowing there would turn that zero gradient into NaN (0 * inf). f16 and bf16 compute in f32
// and round once, as PyTorch's kernels do (Note [Activations in f32] in core/ops/nn.cpp).

void check_floating(const char* op, const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", op);
  DUET_CHECK_DTYPE(is_floating(x.dtype()), "[{}] needs a floating input, got {} (input {})", op,
                   x.dtype(), x.sizes());
}

void check_finite(const char* op, const char* what, double v) {
  DUET_CHECK_VALUE(std::isfinite(v), "[{}] {} must be finite, got {}", op, what, v);
}

// f32 for f16 and bf16, rounded back once (Note [Piecewise activations]).
template <class F>
Tensor in_f32(const Tensor& x, F f) {
  if (is_low_precision(x.dtype())) return f(x.to(DType::f32)).to(x.dtype());
  return f(x);
}

// alpha (e^(x / alpha) - 1) for x <= 0, x above: elu's and celu's negative piece.
Tensor exp_below_zero(const Tensor& x, double alpha, double inv_scale) {
  const Tensor pos = gt(x, 0);
  const Tensor neg = where(pos, 0, x);  // (Note [Piecewise activations])
  return where(pos, x, expm1(inv_scale == 1 ? neg : neg * inv_scale) * alpha);
}

}  // namespace

Tensor leaky_relu(const Tensor& x, double negative_slope, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("leaky_relu", [&]() -> Tensor {
    check_floating("leaky_relu", x);
    check_finite("leaky_relu", "negative_slope", negative_slope);
    return in_f32(x, [&](const Tensor& v) { return where(gt(v, 0), v, v * negative_slope); });
  });
}

Tensor elu(const Tensor& x, double alpha, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("elu", [&]() -> Tensor {
    check_floating("elu", x);
    check_finite("elu", "alpha", alpha);
    return in_f32(x, [&](const Tensor& v) { return exp_below_zero(v, alpha, 1); });
  });
}

Tensor selu(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("selu", [&]() -> Tensor {
    check_floating("selu", x);
    constexpr double kAlpha = 1.6732632423543772848170429916717;
    constexpr double kScale = 1.0507009873554804934193349852946;
    return in_f32(x, [&](const Tensor& v) { return exp_below_zero(v, kAlpha, 1) * kScale; });
  });
}

Tensor celu(const Tensor& x, double alpha, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("celu", [&]() -> Tensor {
    check_floating("celu", x);
    DUET_CHECK_VALUE(std::isfinite(alpha) && alpha != 0,
                     "[celu] alpha must be finite and nonzero, got {}", alpha);
    return in_f32(x, [&](const Tensor& v) { return exp_below_zero(v, alpha, 1 / alpha); });
  });
}

Tensor hardtanh(const Tensor& x, double min_val, double max_val, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("hardtanh", [&]() -> Tensor {
    DUET_CHECK_VALUE(x.defined(), "[hardtanh] the input is an undefined tensor");
    DUET_CHECK_DTYPE(x.dtype() != DType::b8, "[hardtanh] is not defined for b8 input");
    DUET_CHECK_VALUE(min_val <= max_val, "[hardtanh] min_val {} must be at most max_val {}",
                     min_val, max_val);
    // clamp's values (NaN stays NaN, -0 at a bound of 0 stays -0, as PyTorch's), but no gradient
    // at or beyond the bounds, as PyTorch's hardtanh_backward (clamp's passes one at them).
    const Tensor bound = clamp(x, min_val, max_val).detach();
    return where(gt(x, min_val), where(lt(x, max_val), x, bound), bound);
  });
}

Tensor relu6(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("relu6", [&]() -> Tensor { return hardtanh(x, 0, 6); });
}

Tensor hardsigmoid(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("hardsigmoid", [&]() -> Tensor {
    check_floating("hardsigmoid", x);
    return in_f32(
        x, [](const Tensor& v) { return where(le(v, -3), 0, where(ge(v, 3), 1, v / 6 + 0.5)); });
  });
}

Tensor hardswish(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("hardswish", [&]() -> Tensor {
    check_floating("hardswish", x);
    // x * 0 up to -3 (-0 for a negative x, as PyTorch's x * relu6(x + 3) / 6), x (x + 3) / 6
    // inside, x from 3: the gradient x / 3 + 0.5 strictly inside, 0 and 1 at the ends, as
    // PyTorch's hardswish_backward.
    return in_f32(x, [](const Tensor& v) {
      return where(le(v, -3), v * 0, where(lt(v, 3), v * (v + 3) / 6, v));
    });
  });
}

Tensor mish(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("mish", [&]() -> Tensor {
    check_floating("mish", x);
    return in_f32(x, [](const Tensor& v) { return v * tanh(softplus(v)); });
  });
}

Tensor glu(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("glu", [&]() -> Tensor {
    check_floating("glu", x);
    DUET_CHECK_SHAPE(x.dim() > 0, "[glu] needs at least one dim, got a 0-d input");
    DUET_CHECK_VALUE(dim >= -x.dim() && dim < x.dim(), "[glu] dim {} is out of range for {}", dim,
                     x.sizes());
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    const int64_t n = x.size(d);
    DUET_CHECK_SHAPE(n % 2 == 0, "[glu] dim {} of {} must have an even size, got {}", dim,
                     x.sizes(), n);
    return in_f32(
        x, [&](const Tensor& v) { return slice(v, d, 0, n / 2) * sigmoid(slice(v, d, n / 2, n)); });
  });
}

Tensor prelu(const Tensor& x, const Tensor& weight, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("prelu", [&]() -> Tensor {
    check_floating("prelu", x);
    DUET_CHECK_VALUE(weight.defined(), "[prelu] the weight is an undefined tensor");
    DUET_CHECK_DTYPE(weight.dtype() == x.dtype(),
                     "[prelu] input ({}) and weight ({}) must share a dtype", x.dtype(),
                     weight.dtype());
    const int64_t c = x.dim() >= 2 ? x.size(1) : 1;
    DUET_CHECK_SHAPE(weight.dim() <= 1 && (weight.numel() == 1 || weight.numel() == c),
                     "[prelu] weight {} must hold 1 value or one per channel (dim 1 of {})",
                     weight.sizes(), x.sizes());
    // One slope as a 0-d weight; one per channel laid along them: (C, 1, ..., 1).
    Shape along;
    if (weight.numel() > 1) {
      along.push_back(c);
      for (int64_t d = 2; d < x.dim(); ++d) along.push_back(1);
    }
    const Tensor w = reshape(weight, along);
    return where(gt(x, 0), x, x * w);
  });
}

}  // namespace duet
