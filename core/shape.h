// duet: Shape (sizes of a tensor), Dims (dims to reduce or permute), and the helpers on them.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/small_vector.h"

namespace duet {

/// Sizes of a tensor, inline up to rank 6: Shape{2, 3}; Shape{} is 0-d.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> il) : v_(il) {}
  Shape(const std::vector<int64_t>& v) : v_(v.data(), static_cast<int64_t>(v.size())) {}
  Shape(const int64_t* p, int64_t n) : v_(p, n) {}

  int64_t size() const { return v_.size(); }
  int64_t operator[](int64_t i) const { return v_[i]; }
  int64_t& operator[](int64_t i) { return v_[i]; }
  const int64_t* begin() const { return v_.begin(); }
  const int64_t* end() const { return v_.end(); }
  const int64_t* data() const { return v_.data(); }
  int64_t* data() { return v_.data(); }
  void push_back(int64_t d) { v_.push_back(d); }
  void insert(int64_t pos, int64_t d) { v_.insert(pos, d); }
  void erase(int64_t pos) { v_.erase(pos); }
  void resize(int64_t n, int64_t fill = 1) { v_.resize(n, fill); }
  /// Product of the sizes (1 for 0-d).
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  /// "(2, 3)"; "()" for 0-d.
  std::string str() const;
  friend bool operator==(const Shape& a, const Shape& b) { return a.v_ == b.v_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  detail::SmallVec<int64_t, 6> v_;
};

/// Prints "(2, 3)".
std::ostream& operator<<(std::ostream& os, const Shape& s);

/// Strides in elements, one per dim.
using Strides = detail::SmallVec<int64_t, 6>;

/// Dims to reduce over (or a permutation): Dims{} means all, Dims{0, 2}, or one int64_t.
class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> il) : v_(il) {}
  Dims(int64_t d) : v_{d} {}
  Dims(int d) : v_{d} {}
  Dims(const std::vector<int64_t>& v) : v_(v.data(), static_cast<int64_t>(v.size())) {}
  int64_t size() const { return v_.size(); }
  bool empty() const { return v_.empty(); }
  int64_t operator[](int64_t i) const { return v_[i]; }
  const int64_t* begin() const { return v_.begin(); }
  const int64_t* end() const { return v_.end(); }
  void push_back(int64_t d) { v_.push_back(d); }
  std::string str() const;
  friend bool operator==(const Dims& a, const Dims& b) { return a.v_ == b.v_; }

 private:
  detail::SmallVec<int64_t, 6> v_;
};

/// Two sizes, along the height and the width: conv2d's and unfold's kernel, stride, padding and
/// dilation. One int stands for both, as PyTorch's int arguments do; {h, w} gives each.
struct Size2 {
  int64_t h, w;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT(google-explicit-constructor): as an int
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  friend bool operator==(const Size2&, const Size2&) = default;
};

/// A 3-D window's size, stride, padding or dilation, as PyTorch's int-or-triple arguments: one
/// int for all three dims, or {d, h, w} (depth, height, width).
struct Size3 {
  int64_t d, h, w;
  Size3(int64_t all) : d(all), h(all), w(all) {}  // NOLINT(google-explicit-constructor): as an int
  Size3(int64_t depth, int64_t height, int64_t width) : d(depth), h(height), w(width) {}
  friend bool operator==(const Size3&, const Size3&) = default;
};

/// PyTorch's padding="same" (LibTorch's torch::kSame) for conv2d and nn::Conv2d: a type of its
/// own, so that a padding of 0 stays a Size2. ("valid" is a padding of 0.)
struct SamePadding {};
inline constexpr SamePadding kSame{};

/// padding "same" of a stride-1 window, as PyTorch's: {left, right, top, bottom} (pad()'s order),
/// d (k - 1) along each dim, half before and the rest after.
inline std::array<int64_t, 4> same_padding(Size2 kernel, Size2 dilation) {
  const int64_t th = dilation.h * (kernel.h - 1), tw = dilation.w * (kernel.w - 1);
  return {tw / 2, tw - tw / 2, th / 2, th - th / 2};
}

namespace detail {
/// Row-major strides of a contiguous tensor of this shape.
Strides contiguous_strides(const Shape& shape);
/// The same strides, written into `out` (its memory reused: no allocation for a short shape).
void set_contiguous_strides(const Shape& shape, Strides& out);
/// Wraps a possibly negative dim into [0, ndim); throws naming `op` if out of range.
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim);
/// Broadcasts two shapes (PyTorch rules); throws ShapeError naming `op`.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
}  // namespace detail

}  // namespace duet
