// duet: a Scalar remembers whether it is a bool, an integer or a float (LibTorch's rules):
// i64_tensor + 1 stays i64, i64_tensor + 1.0 becomes f32.
#pragma once

#include <cstdint>
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

}  // namespace duet
