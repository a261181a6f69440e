// duet: element types and PyTorch's type promotion.
#pragma once

#include <cstdint>
#include <string_view>

namespace duet {

/// Element types. f32 is the default float dtype. f16 (IEEE half) and bf16 (bfloat16) are the
/// low-precision floats (Note [Low precision] in kernels/low_precision.h): stored in 2 bytes,
/// computed in f32 inside the kernels. i8, u8 and i16 are the narrow integers (images, ONNX
/// models): stored in their own width, computed in i32 inside the kernels and wrapped back to
/// their width on store, as PyTorch's arithmetic wraps.
enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, b8, i8, u8, i16 };
inline constexpr int kNumDTypes = 10;

/// "f32", "i64", ...
std::string_view dtype_name(DType);
/// Bytes per element.
constexpr int64_t itemsize(DType d) {
  switch (d) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
      return 2;
    case DType::b8:
    case DType::i8:
    case DType::u8:
      return 1;
  }
  return 0;
}
constexpr bool is_floating(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16;
}
/// i32, i64 and the narrow integers (b8 is not integral).
constexpr bool is_integral(DType d) {
  return d == DType::i32 || d == DType::i64 || d == DType::i8 || d == DType::u8 || d == DType::i16;
}
/// f16 and bf16: stored in 2 bytes, computed in f32.
constexpr bool is_low_precision(DType d) { return d == DType::f16 || d == DType::bf16; }
/// i8, u8 and i16: stored in their width, computed in i32.
constexpr bool is_narrow_integral(DType d) {
  return d == DType::i8 || d == DType::u8 || d == DType::i16;
}
/// The dtype a kernel computes a dtype in: f32 for f16 and bf16, i32 for the narrow integers,
/// the dtype itself otherwise.
constexpr DType compute_dtype(DType d) {
  return is_low_precision(d) ? DType::f32 : is_narrow_integral(d) ? DType::i32 : d;
}
/// Whether kernels compute a dtype in a wider one (compute_dtype differs).
constexpr bool is_storage_only(DType d) { return is_low_precision(d) || is_narrow_integral(d); }

/// The value of an f16 or bf16 element from its bits, and the bits of a float rounded to
/// nearest-even in f16 or bf16 (NaN stays NaN; f16 overflows to infinity).
float low_precision_to_float(uint16_t bits, DType d);
uint16_t float_to_low_precision(float v, DType d);

/// PyTorch's promote_types: the smallest dtype both convert to without losing kind.
DType promote_types(DType a, DType b);

namespace detail {
/// The least and the greatest value of an integral dtype.
struct IntRange {
  int64_t least, most;
};
constexpr IntRange integral_range(DType d) {
  switch (d) {
    case DType::i8:
      return {-128, 127};
    case DType::u8:
      return {0, 255};
    case DType::i16:
      return {-32768, 32767};
    case DType::i32:
      return {-2147483648LL, 2147483647LL};
    default:
      return {INT64_MIN, INT64_MAX};
  }
}
/// i32 and the narrow integers: the integral dtypes whose range a Scalar may exceed.
constexpr bool is_narrower_than_i64(DType d) { return is_integral(d) && d != DType::i64; }

/// 0 bool, 1 integer, 2 floating: the category order of PyTorch's promotion.
constexpr int category(DType d) { return d == DType::b8 ? 0 : is_integral(d) ? 1 : 2; }

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::i8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<int16_t> {
  static constexpr DType value = DType::i16;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::b8;
};
}  // namespace detail

/// Calls f(T{}) with T the C++ type of dtype, for the dtypes kernels compute in their own type;
/// throws for f16/bf16 and the narrow integers, which kernels compute in f32 and i32
/// (kernels/low_precision.h has the dispatches that include them).
#define DUET_DISPATCH_DTYPE(dtype, op_name, ...)                                                 \
  [&] {                                                                                          \
    switch (dtype) {                                                                             \
      case ::duet::DType::f32: {                                                                 \
        using scalar_t = float;                                                                  \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::duet::DType::f64: {                                                                 \
        using scalar_t = double;                                                                 \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::duet::DType::i32: {                                                                 \
        using scalar_t = int32_t;                                                                \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::duet::DType::i64: {                                                                 \
        using scalar_t = int64_t;                                                                \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      case ::duet::DType::b8: {                                                                  \
        using scalar_t = bool;                                                                   \
        return __VA_ARGS__();                                                                    \
      }                                                                                          \
      default:                                                                                   \
        throw ::duet::DTypeError(                                                                \
            fmt::format("[{}] has no kernel for dtype {}", op_name, ::duet::dtype_name(dtype))); \
    }                                                                                            \
  }()

}  // namespace duet
