// duet: a Scalar remembers whether it is a bool, an integer or a float (LibTorch's rules):
// i64_tensor + 1 stays i64, i64_tensor + 1.0 becomes f32.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/dtype.h"

namespace duet {

/// A number that keeps its kind: bool, integer or floating.
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };
  Scalar() : kind_(Kind::Int), i_(0) {}
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(Kind::Float), d_(static_cast<double>(v)) {}

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Int; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  /// The value converted to T.
  template <class T>
  T to() const {
    return kind_ == Kind::Float ? static_cast<T>(d_) : static_cast<T>(i_);
  }
  /// Whether the value converts to dtype d without overflow, as PyTorch checks: an integer
  /// dtype must hold it (a float truncated toward zero; NaN and infinities never fit), a float
  /// dtype must hold it when finite (infinities and NaN fit), and b8 holds every value.
  bool fits(DType d) const {
    if (kind_ == Kind::Bool) return true;
    if (detail::is_narrower_than_i64(d)) {
      // A float truncates toward zero: (least - 1, most + 1).
      const auto [least, most] = detail::integral_range(d);
      return kind_ == Kind::Int
                 ? i_ >= least && i_ <= most
                 : d_ > static_cast<double>(least) - 1.0 && d_ < static_cast<double>(most) + 1.0;
    }
    if (kind_ == Kind::Int)  // i64, b8, f32, bf16 and f64 hold every int64 value (rounded)
      return d != DType::f16 || (i_ >= -65504 && i_ <= 65504);
    const double v = d_;
    switch (d) {
      case DType::i64:  // [-2^63, 2^63)
        return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
      case DType::f32:
        return !std::isfinite(v) || (v <= 3.4028234663852886e38 && v >= -3.4028234663852886e38);
      case DType::bf16:
        return !std::isfinite(v) || (v <= 3.3895313892515355e38 && v >= -3.3895313892515355e38);
      case DType::f16:
        return !std::isfinite(v) || (v <= 65504.0 && v >= -65504.0);
      default:  // f64, b8
        return true;
    }
  }
  /// The dtype a tensor made from this scalar gets: f32, i64 or b8.
  DType default_dtype() const {
    return kind_ == Kind::Float ? DType::f32 : kind_ == Kind::Int ? DType::i64 : DType::b8;
  }
  friend bool operator==(const Scalar& a, const Scalar& b) {
    if (a.kind_ != b.kind_) return false;
    return a.kind_ == Kind::Float ? a.d_ == b.d_ || (a.d_ != a.d_ && b.d_ != b.d_) : a.i_ == b.i_;
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

namespace detail {
/// Throws the ValueError "[op] value V does not fit in D" (core/tensor.cpp).
[[noreturn]] void throw_scalar_range(const char* op, const Scalar& s, DType d);
/// A Scalar that is converted to dtype d must fit it (Scalar::fits): creation functions, and
/// Scalar operands of ops that compute in an integer dtype.
inline void check_fits(const char* op, const Scalar& s, DType d) {
  if (__builtin_expect(!s.fits(d), 0)) throw_scalar_range(op, s, d);
}
}  // namespace detail

}  // namespace duet
