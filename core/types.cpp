// duet: DType, Device, Shape, Dims helpers and errors.
#include <Eigen/Core>
#include <algorithm>
#include <ostream>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/check_shape.h"
#include "core/shape.h"

namespace duet {

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::b8:
      return "b8";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
    case DType::i16:
      return "i16";
  }
  return "?";
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // Order within a category by width; across categories the higher category wins, except that
  // mixing f16 and bf16 gives f32, and mixing u8 with i8 gives i16 (PyTorch's table: the
  // smallest signed type that holds both).
  auto rank = [](DType d) {
    switch (d) {
      case DType::b8:
        return 0;
      case DType::u8:
      case DType::i8:
        return 1;
      case DType::i16:
        return 2;
      case DType::i32:
        return 3;
      case DType::i64:
        return 4;
      case DType::f16:
      case DType::bf16:
        return 5;
      case DType::f32:
        return 6;
      case DType::f64:
        return 7;
    }
    return 0;
  };
  auto pair = [&](DType x, DType y) { return (a == x && b == y) || (a == y && b == x); };
  if (pair(DType::f16, DType::bf16)) return DType::f32;
  if (pair(DType::u8, DType::i8)) return DType::i16;
  return rank(a) >= rank(b) ? a : b;
}

// Eigen's half and bfloat16 convert with round-to-nearest-even, keep NaN a NaN and overflow
// f16 to infinity.
float low_precision_to_float(uint16_t bits, DType d) {
  if (d == DType::bf16) return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
}
uint16_t float_to_low_precision(float v, DType d) {
  if (d == DType::bf16) return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(v));
  return Eigen::numext::bit_cast<uint16_t>(Eigen::half(v));
}

std::string Device::str() const {
  return is_cuda() ? fmt::format("cuda:{}", static_cast<int>(index)) : std::string("cpu");
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : v_) n *= d;
  return n;
}

static std::string join_dims(const int64_t* b, const int64_t* e) {
  std::string s = "(";
  for (const int64_t* p = b; p != e; ++p) {
    if (p != b) s += ", ";
    s += std::to_string(*p);
  }
  return s + ")";
}
std::string Shape::str() const { return join_dims(begin(), end()); }
std::string Dims::str() const { return join_dims(begin(), end()); }
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

namespace detail {

void throw_internal(const char* cond, const char* file, int line, std::string msg) {
  throw InternalError(fmt::format("[internal] duet bug: {} failed at {}:{}{}{}", cond, file, line,
                                  msg.empty() ? "" : ": ", msg));
}

// Note [Checked sizes]
// Sizes multiply in many places (numel, contiguous strides, byte counts), and a product that
// wraps around int64 is a wrong answer, not an error: (2^62 + 1) x 4 elements "is" 4. So every
// shape is checked once where it enters: the output of every op call (the dispatcher checks
// what the shape rule computed, before anything is allocated or viewed), and every tensor made
// without an op (empty(), tensor()). The check covers the product of the sizes, the product
// with size-0 dims taken as 1 (which the strides are), and the bytes; after it, products of
// these sizes cannot overflow anywhere else. The rank is checked there too (at most kMaxRank,
// 64), so that per-dim arrays and 64-bit dim masks (permute, reductions, loops) fit every tensor.
void check_shape(const char* op, const Shape& shape, int64_t itemsize) {
  if (__builtin_expect(shape.size() > kMaxRank, 0)) {
    throw ValueError(::duet::detail::with_context(
        fmt::format("[{}] a tensor of rank {} is above the maximum rank {} (shape {})", op,
                    shape.size(), kMaxRank, shape.str())));
  }
  int64_t span = itemsize;  // bytes spanned by the strides (size-0 dims count as 1)
  bool ok = true;
  for (int64_t d : shape) {
    if (d < 0) {
      throw ValueError(::duet::detail::with_context(
          fmt::format("[{}] shape {} has a negative size (sizes must be >= 0)", op, shape.str())));
    }
    ok = ok && !__builtin_mul_overflow(span, std::max<int64_t>(d, 1), &span);
  }
  if (!ok) {
    throw ValueError(::duet::detail::with_context(fmt::format(
        "[{}] shape {} is too large: its {}-byte elements would take more than 2^63 bytes", op,
        shape.str(), itemsize)));
  }
}

void set_contiguous_strides(const Shape& shape, Strides& out) {
  out.resize(shape.size());
  int64_t st = 1;
  for (int64_t i = shape.size() - 1; i >= 0; --i) {
    out[i] = st;
    st *= std::max<int64_t>(shape[i], 1);
  }
}

Strides contiguous_strides(const Shape& shape) {
  Strides s;
  set_contiguous_strides(shape, s);
  return s;
}

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1, as in PyTorch
  DUET_CHECK_VALUE(dim >= -n && dim < n,
                   "[{}] dim {} is out of range for a tensor of rank {} (expected {} to {})", op,
                   dim, ndim, -n, n - 1);
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  if (a == b) return a;
  int64_t n = std::max(a.size(), b.size());
  Shape out;
  out.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DUET_CHECK_SHAPE(da == db || da == 1 || db == 1, "[{}] shapes {} and {} cannot broadcast", op,
                     a.str(), b.str());
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace detail
}  // namespace duet
