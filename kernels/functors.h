// duet: the math of every elementwise op, once. Each functor has a scalar operator() that both
// the C++ compiler and nvcc read, and (on the host) a packet() over Eigen's SIMD packets. The
// same functor serves the eager CPU kernels, the CPU fused loop and the CUDA kernel generator.
//
// Note [Integer wraparound]
// Signed overflow is undefined behaviour in C++, and PyTorch wraps. Integer add, sub, mul, neg
// and abs therefore compute in the unsigned type and convert back, which wraps on every target.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (the generated fused CUDA kernels, cuda/fused.cpp) has no host standard library. It
// includes nothing here: libcu++'s <cuda/std/...> headers took about 0.9 s of every kernel's
// 1 s build. CUDA's math API is declared without an include (namespace math below), and the
// few type traits the functors ask of a scalar are written out.
namespace duet::fn::rtc {
template <class A, class B>
inline constexpr bool is_same_v = false;
template <class A>
inline constexpr bool is_same_v<A, A> = true;
template <class T>
inline constexpr bool is_floating_point_v =
    is_same_v<T, float> || is_same_v<T, double> || is_same_v<T, long double>;
template <class T>
inline constexpr bool is_integral_v = false;
template <class T>
struct make_unsigned {};  // no `type` but for the integers below, as in std
template <class T>
using make_unsigned_t = typename make_unsigned<T>::type;
#define DUET_RTC_INTEGER(T, U)                   \
  template <>                                    \
  inline constexpr bool is_integral_v<T> = true; \
  template <>                                    \
  struct make_unsigned<T> {                      \
    using type = U;                              \
  };
DUET_RTC_INTEGER(char, unsigned char)
DUET_RTC_INTEGER(signed char, unsigned char)
DUET_RTC_INTEGER(unsigned char, unsigned char)
DUET_RTC_INTEGER(short, unsigned short)
DUET_RTC_INTEGER(unsigned short, unsigned short)
DUET_RTC_INTEGER(int, unsigned)
DUET_RTC_INTEGER(unsigned, unsigned)
DUET_RTC_INTEGER(long, unsigned long)
DUET_RTC_INTEGER(unsigned long, unsigned long)
DUET_RTC_INTEGER(long long, unsigned long long)
DUET_RTC_INTEGER(unsigned long long, unsigned long long)
#undef DUET_RTC_INTEGER
template <>
inline constexpr bool is_integral_v<bool> = true;  // (with no make_unsigned, as in std)
}  // namespace duet::fn::rtc
#define DUET_STD ::duet::fn::rtc
#else
#include <cmath>
#include <cstdint>
#include <type_traits>
#define DUET_STD std
#endif

#if defined(__CUDACC__)
#define DUET_HD __host__ __device__ __forceinline__
#else
#define DUET_HD inline
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>
#endif

namespace duet::fn {

// The math the scalar functors call: the standard library's, or under NVRTC CUDA's.
namespace math {
#if defined(__CUDACC_RTC__)
// CUDA's own functions, which libcu++'s float and double overloads call (the same code).
#define DUET_RTC_MATH(name)                            \
  DUET_HD float name(float x) { return ::name##f(x); } \
  DUET_HD double name(double x) { return ::name(x); }
DUET_RTC_MATH(atan)
DUET_RTC_MATH(cos)
DUET_RTC_MATH(erf)
DUET_RTC_MATH(exp)
DUET_RTC_MATH(expm1)
DUET_RTC_MATH(fabs)
DUET_RTC_MATH(floor)
DUET_RTC_MATH(log)
DUET_RTC_MATH(log1p)
DUET_RTC_MATH(sin)
DUET_RTC_MATH(sqrt)
DUET_RTC_MATH(tanh)
#undef DUET_RTC_MATH
DUET_HD float pow(float a, float b) { return ::powf(a, b); }
DUET_HD double pow(double a, double b) { return ::pow(a, b); }
#else
using std::atan;
using std::cos;
using std::erf;
using std::exp;
using std::expm1;
using std::fabs;
using std::floor;
using std::log;
using std::log1p;
using std::pow;
using std::sin;
using std::sqrt;
using std::tanh;
#endif
}  // namespace math

template <class T>
inline constexpr bool is_float_v = DUET_STD::is_floating_point_v<T>;

template <class T>
DUET_HD T wrap_add(T a, T b) {
  if constexpr (DUET_STD::is_same_v<T, bool>) {
    return a || b;
  } else if constexpr (DUET_STD::is_integral_v<T>) {
    using U = DUET_STD::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
DUET_HD T wrap_sub(T a, T b) {
  if constexpr (DUET_STD::is_integral_v<T> && !DUET_STD::is_same_v<T, bool>) {
    using U = DUET_STD::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class T>
DUET_HD T wrap_mul(T a, T b) {
  if constexpr (DUET_STD::is_same_v<T, bool>) {
    return a && b;
  } else if constexpr (DUET_STD::is_integral_v<T>) {
    using U = DUET_STD::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

#if !defined(__CUDACC__)
namespace ei = Eigen::internal;
#define DUET_PACKET(...)       \
  template <class P>           \
  P packet(const P& x) const { \
    return __VA_ARGS__;        \
  }
#define DUET_PACKET2(...)                  \
  template <class P>                       \
  P packet(const P& a, const P& b) const { \
    return __VA_ARGS__;                    \
  }
#else
#define DUET_PACKET(...)
#define DUET_PACKET2(...)
#endif

// ---- unary ----------------------------------------------------------------------------------
// has_packet<T>: whether packet() is vectorized for T (Eigen vectorizes some math only for f32).

// IEEE negation flips the sign bit, of zeros and NaNs too: -(+0.0) is -0.0, where 0 - x gives
// +0.0. (Eigen 3.4's pnegate is 0 - x on SSE and AVX, so the packet form flips the bit itself.)
struct Neg {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    if constexpr (is_float_v<T>)
      return -x;
    else
      return wrap_sub(T(0), x);
  }
  DUET_PACKET(ei::pxor(x, ei::pset1<P>(typename ei::unpacket_traits<P>::type(-0.0))))
};
struct Exp {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::exp(x);
  }
  DUET_PACKET(ei::pexp(x))
};
// e^x - 1, accurate near 0.
struct Expm1 {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;  // Eigen's pexpm1: f32 only
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::expm1(x);
  }
  DUET_PACKET(ei::pexpm1(x))
};
struct Log {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::log(x);
  }
  DUET_PACKET(ei::plog(x))
};
// log(1 + x), accurate near 0.
struct Log1p {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;  // Eigen's plog1p: f32 only
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::log1p(x);
  }
  DUET_PACKET(ei::plog1p(x))
};
#if !defined(__CUDACC__)
// IEEE square root, correctly rounded as std::sqrt is: Eigen's AVX-512 psqrt under
// EIGEN_FAST_MATH is a Newton step from an estimate (sqrt(9.0) gave 3.0000000000000004).
template <class P>
inline P exact_sqrt(const P& x) {
#if defined(__AVX512F__)
  // (Told apart by scalar type and width: naming Packet16f in a template argument drops its
  // vector attribute, and GCC warns.)
  using S = typename Eigen::internal::unpacket_traits<P>::type;
  constexpr int kWidth = Eigen::internal::unpacket_traits<P>::size;
  if constexpr (DUET_STD::is_same_v<S, float> && kWidth == 16) return _mm512_sqrt_ps(x);
  if constexpr (DUET_STD::is_same_v<S, double> && kWidth == 8) return _mm512_sqrt_pd(x);
#endif
  return Eigen::internal::psqrt(x);
}
#endif

struct Sqrt {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::sqrt(x);
  }
  DUET_PACKET(exact_sqrt(x))
};
struct Rsqrt {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return T(1) / math::sqrt(x);
  }
  DUET_PACKET(ei::pdiv(ei::pset1<P>(1), exact_sqrt(x)))
};
struct Abs {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    if constexpr (DUET_STD::is_integral_v<T>) {
      return x < 0 ? wrap_sub(T(0), x) : x;
    } else {
      return math::fabs(x);
    }
  }
  DUET_PACKET(ei::pabs(x))
};
struct Sin {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::sin(x);
  }
  DUET_PACKET(ei::psin(x))
};
struct Cos {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::cos(x);
  }
  DUET_PACKET(ei::pcos(x))
};
struct Atan {
  template <class T>
  static constexpr bool has_packet = false;  // Eigen 3.4 has no packet arctangent
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::atan(x);
  }
};
struct Tanh {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::tanh(x);
  }
  DUET_PACKET(ei::ptanh(x))
};
// 1 / (1 + e^-x) in every dtype. (Eigen's f32 logistic packet is a rational approximation
// accurate in absolute terms only: sigmoid(-8.1) came out 4e-4 off relative to its 3e-4.)
struct Sigmoid {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return T(1) / (T(1) + math::exp(-x));
  }
#if !defined(__CUDACC__)
  template <class P>
  P packet(const P& x) const {
    const P one = ei::pset1<P>(1);
    return ei::pdiv(one, ei::padd(one, ei::pexp(ei::pnegate(x))));
  }
#endif
};
struct Relu {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  // NaN stays NaN, as in PyTorch.
  template <class T>
  DUET_HD T operator()(T x) const {
    return x < T(0) ? T(0) : x;
  }
  DUET_PACKET(ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pzero(x), x))
};
// Integers are their own floor.
struct Floor {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    if constexpr (is_float_v<T>)
      return math::floor(x);
    else
      return x;
  }
  DUET_PACKET(ei::pfloor(x))
};

struct Erf {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::erf(x);
  }
  DUET_PACKET(ei::generic_fast_erf_float(x))
};
// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): finite for any finite x.
struct LogSigmoid {
  template <class T>
  static constexpr bool has_packet = DUET_STD::is_same_v<T, float>;  // Eigen's plog1p: f32 only
  template <class T>
  DUET_HD T operator()(T x) const {
    return (x < T(0) ? x : T(0)) - math::log1p(math::exp(-math::fabs(x)));
  }
  DUET_PACKET(ei::psub(ei::pmin(x, ei::pzero(x)), ei::plog1p(ei::pexp(ei::pnegate(ei::pabs(x))))))
};

// ---- binary ---------------------------------------------------------------------------------

struct Add {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    return wrap_add(a, b);
  }
  DUET_PACKET2(ei::padd(a, b))
};
struct Sub {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    return wrap_sub(a, b);
  }
  DUET_PACKET2(ei::psub(a, b))
};
struct Mul {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    return wrap_mul(a, b);
  }
  DUET_PACKET2(ei::pmul(a, b))
};
struct Div {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    return a / b;
  }  // floats only: ints promote to f32
  DUET_PACKET2(ei::pdiv(a, b))
};
struct Pow {
  template <class T>
  static constexpr bool has_packet = false;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    if constexpr (DUET_STD::is_same_v<T, bool>) {
      return a || !b;  // 0^0 = 1, 0^1 = 0, 1^b = 1
    } else if constexpr (DUET_STD::is_integral_v<T>) {
      // Negative exponents truncate 1/a^|b| toward zero, as PyTorch does for tensor exponents.
      if (b < 0) return a == 1 ? T(1) : a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0);
      T r = 1;
      while (b) {
        if (b & 1) r = wrap_mul(r, a);
        a = wrap_mul(a, a);
        b >>= 1;
      }
      return r;
    } else {
      return math::pow(a, b);
    }
  }
};
// maximum / minimum propagate NaN, as in PyTorch.
struct Maximum {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    if constexpr (is_float_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a > b ? a : b;
  }
  DUET_PACKET2(ei::pmax<Eigen::PropagateNaN>(a, b))
};
struct Minimum {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T a, T b) const {
    if constexpr (is_float_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? a : b;
  }
  DUET_PACKET2(ei::pmin<Eigen::PropagateNaN>(a, b))
};

// ---- comparisons (result bool; no packets, the compiler vectorizes the loops) -----------------
#define DUET_COMPARE_FUNCTOR(Name, expr)      \
  struct Name {                               \
    template <class T>                        \
    static constexpr bool has_packet = false; \
    template <class T>                        \
    DUET_HD bool operator()(T a, T b) const { \
      return expr;                            \
    }                                         \
  };
DUET_COMPARE_FUNCTOR(Lt, a < b)
DUET_COMPARE_FUNCTOR(Le, a <= b)
DUET_COMPARE_FUNCTOR(Gt, a > b)
DUET_COMPARE_FUNCTOR(Ge, a >= b)
DUET_COMPARE_FUNCTOR(Eq, a == b)
DUET_COMPARE_FUNCTOR(Ne, a != b)
#undef DUET_COMPARE_FUNCTOR

#undef DUET_PACKET
#undef DUET_PACKET2

}  // namespace duet::fn
