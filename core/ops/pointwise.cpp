// Pointwise composites of torch's: reciprocal, square, clamp_min, clamp_max, lerp, addcmul,
// addcdiv and the logical ops, each a few elementwise primitives (so differentiated, traced,
// fused and batched as they are), with PyTorch's dtypes and gradients.
#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace {

void check_defined(const char* op, std::initializer_list<const Tensor*> xs) {
  int k = 0;
  for (const Tensor* x : xs) {
    DUET_CHECK_VALUE(x->defined(), "[{}] input {} is an undefined tensor", op, k);
    ++k;
  }
}

// An integer bound beyond the range of an i32 (or narrower) tensor bounds nothing: the range's
// end instead, so that the bound does not promote the result or fail the wrapped-number check.
Scalar within_range(const Tensor& x, Scalar bound) {
  if (detail::is_narrower_than_i64(x.dtype()) && bound.is_integral()) {
    const auto [least, most] = detail::integral_range(x.dtype());
    const int64_t b = bound.to<int64_t>();
    if (b < least) return Scalar(least);
    if (b > most) return Scalar(most);
  }
  return bound;
}

// b8 values as 0 and 1, and every other dtype's nonzero elements, as b8 truths.
Tensor truth(const Tensor& x) { return x.dtype() == DType::b8 ? x : ne(x, 0); }

}  // namespace

Tensor reciprocal(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("reciprocal", [&]() -> Tensor {
    check_defined("reciprocal", {&x});
    return 1 / x;  // (integers and b8 give f32, as PyTorch's)
  });
}

Tensor square(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("square", [&]() -> Tensor {
    check_defined("square", {&x});
    if (x.dtype() == DType::b8) {  // PyTorch's pow(x, 2) on b8: i64
      const Tensor i = x.to(DType::i64);
      return i * i;
    }
    return x * x;
  });
}

// With where rather than maximum/minimum, the gradient is 1 at the bound itself (maximum would
// split it there), and NaN passes through, as torch.clamp_min and torch.clamp_max.
Tensor clamp_min(const Tensor& x, Scalar min, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("clamp_min", [&]() -> Tensor {
    check_defined("clamp_min", {&x});
    const Scalar lo = within_range(x, min);
    return where(lt(x, lo), lo, x);
  });
}

Tensor clamp_max(const Tensor& x, Scalar max, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("clamp_max", [&]() -> Tensor {
    check_defined("clamp_max", {&x});
    const Scalar hi = within_range(x, max);
    return where(gt(x, hi), hi, x);
  });
}

// With lo > hi every element becomes hi, as torch.clamp documents.
Tensor clamp(const Tensor& x, Scalar lo, Scalar hi, std::source_location loc) {
  detail::SiteGuard site(loc);
  return clamp_max(clamp_min(x, lo), hi);
}

// Note [Lerp's two forms]
// PyTorch's lerp computes start + w (end - start) for |w| < 0.5 and end - (end - start) (1 - w)
// otherwise, so that w = 1 gives end exactly (the first form rounds end - start + start); the
// same forms here, chosen per element for a tensor weight. The operands promote to one floating
// dtype, as the elementwise ops' do.
namespace {
DType lerp_dtype(const Tensor& start, const Tensor& end, const Tensor* weight) {
  check_defined("lerp", {&start, &end});
  const Tensor* all[] = {&start, &end, weight};
  const DType d = detail::result_type(TensorRefs(all, weight ? 3 : 2));
  DUET_CHECK_DTYPE(
      is_floating(d), "[lerp] needs floating operands, got start {} {}, end {} {}{}", start.dtype(),
      start.sizes(), end.dtype(), end.sizes(),
      weight ? fmt::format(" and weight {} {}", weight->dtype(), weight->sizes()) : "");
  return d;
}
}  // namespace

Tensor lerp(const Tensor& start, const Tensor& end, double weight, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("lerp", [&]() -> Tensor {
    const DType dt = lerp_dtype(start, end, nullptr);
    const Tensor s = start.to(dt), d = end.to(dt) - s;
    return std::abs(weight) < 0.5 ? s + d * weight : end.to(dt) - d * (1 - weight);
  });
}

Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight,
            std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("lerp", [&]() -> Tensor {
    check_defined("lerp", {&weight});
    const DType dt = lerp_dtype(start, end, &weight);
    const Tensor s = start.to(dt), e = end.to(dt), w = weight.to(dt), d = e - s;
    return where(lt(abs(w), 0.5), s + d * w, e - d * (1 - w));
  });
}

Tensor addcmul(const Tensor& x, const Tensor& t1, const Tensor& t2, Scalar value,
               std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("addcmul", [&]() -> Tensor {
    check_defined("addcmul", {&x, &t1, &t2});
    return x + value * (t1 * t2);
  });
}

Tensor addcdiv(const Tensor& x, const Tensor& t1, const Tensor& t2, Scalar value,
               std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("addcdiv", [&]() -> Tensor {
    check_defined("addcdiv", {&x, &t1, &t2});
    DUET_CHECK_DTYPE(is_floating(t1.dtype()) || is_floating(t2.dtype()),
                     "[addcdiv] integer division ({} {} by {} {}) is not supported, as in "
                     "PyTorch; use addcmul with a reciprocal, or floating tensors",
                     t1.dtype(), t1.sizes(), t2.dtype(), t2.sizes());
    return x + value * (t1 / t2);
  });
}

Tensor logical_not(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("logical_not", [&]() -> Tensor {
    check_defined("logical_not", {&x});
    return eq(x, 0);
  });
}

Tensor logical_and(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("logical_and", [&]() -> Tensor {
    check_defined("logical_and", {&a, &b});
    return truth(a) * truth(b);  // (a product of b8 is their conjunction)
  });
}

Tensor logical_or(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("logical_or", [&]() -> Tensor {
    check_defined("logical_or", {&a, &b});
    return maximum(truth(a), truth(b));
  });
}

Tensor logical_xor(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("logical_xor", [&]() -> Tensor {
    check_defined("logical_xor", {&a, &b});
    return ne(truth(a), truth(b));
  });
}

}  // namespace duet
