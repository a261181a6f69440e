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
DUET_RTC_MATH(acos)
DUET_RTC_MATH(acosh)
DUET_RTC_MATH(asin)
DUET_RTC_MATH(asinh)
DUET_RTC_MATH(atan)
DUET_RTC_MATH(atanh)
DUET_RTC_MATH(ceil)
DUET_RTC_MATH(cos)
DUET_RTC_MATH(cosh)
DUET_RTC_MATH(erf)
DUET_RTC_MATH(exp)
DUET_RTC_MATH(exp2)
DUET_RTC_MATH(expm1)
DUET_RTC_MATH(fabs)
DUET_RTC_MATH(floor)
DUET_RTC_MATH(log)
DUET_RTC_MATH(log10)
DUET_RTC_MATH(log1p)
DUET_RTC_MATH(log2)
DUET_RTC_MATH(rint)
DUET_RTC_MATH(sin)
DUET_RTC_MATH(sinh)
DUET_RTC_MATH(sqrt)
DUET_RTC_MATH(tan)
DUET_RTC_MATH(tanh)
DUET_RTC_MATH(trunc)
#undef DUET_RTC_MATH
DUET_HD float pow(float a, float b) { return ::powf(a, b); }
DUET_HD double pow(double a, double b) { return ::pow(a, b); }
#else
using std::acos;
using std::acosh;
using std::asin;
using std::asinh;
using std::atan;
using std::atanh;
using std::ceil;
using std::cos;
using std::cosh;
using std::erf;
using std::exp;
using std::exp2;
using std::expm1;
using std::fabs;
using std::floor;
using std::log;
using std::log10;
using std::log1p;
using std::log2;
using std::pow;
using std::rint;
using std::sin;
using std::sinh;
using std::sqrt;
using std::tan;
using std::tanh;
using std::trunc;
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
// Note [Eigen's exp below its range]
// Eigen 3.4's pexp clamps its argument before it computes: in f64, every x below -709.78 gave
// e^-709.78 = 5.6e-309, exp(-inf) included, where std::exp's and PyTorch's fall through the
// denormals to 0 below -745.13. Lanes below that are set to 0, a comparison and a mask per packet
// (a lane by lane std::exp where any lane was low cost f32's exp half again and f64's a fifth);
// so exp(-inf) and the e^x of a masked softmax lane are 0 in every dtype. Results in the
// denormal range stay Eigen's: f64's between -745.13 and -709.78 are e^-709.78, below the
// smallest normal, and f32's denormals are flushed to 0.
#if !defined(__CUDACC__)
template <class P>
P exp_packet(const P& x) {
  using T = typename ei::unpacket_traits<P>::type;
  if constexpr (DUET_STD::is_same_v<T, double>) {
    return ei::pandnot(ei::pexp(x), ei::pcmp_lt(x, ei::pset1<P>(-745.2)));
  } else {
    return ei::pexp(x);
  }
}
#endif
struct Exp {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return math::exp(x);
  }
  DUET_PACKET(exp_packet(x))
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
// IEEE square root, correctly rounded as std::sqrt is: Eigen's psqrt under EIGEN_FAST_MATH is
// a Newton step from an estimate, for AVX-512 (sqrt(9.0) gave 3.0000000000000004) and for AVX
// and SSE floats, where it is also NaN at infinity (inf * rsqrt(inf) = inf * 0). So every x86
// width calls the instruction.
template <class P>
inline P exact_sqrt(const P& x) {
  // (Told apart by scalar type and width: naming Packet16f in a template argument drops its
  // vector attribute, and GCC warns.)
  using S = typename Eigen::internal::unpacket_traits<P>::type;
  constexpr int kWidth = Eigen::internal::unpacket_traits<P>::size;
  [[maybe_unused]] constexpr bool kFloat = DUET_STD::is_same_v<S, float>;
  [[maybe_unused]] constexpr bool kDouble = DUET_STD::is_same_v<S, double>;
#if defined(__AVX512F__)
  if constexpr (kFloat && kWidth == 16) return _mm512_sqrt_ps(x);
  if constexpr (kDouble && kWidth == 8) return _mm512_sqrt_pd(x);
#endif
#if defined(__AVX__)
  if constexpr (kFloat && kWidth == 8) return _mm256_sqrt_ps(x);
  if constexpr (kDouble && kWidth == 4) return _mm256_sqrt_pd(x);
#endif
#if defined(__SSE2__)
  if constexpr (kFloat && kWidth == 4) return _mm_sqrt_ps(x);
  if constexpr (kDouble && kWidth == 2) return _mm_sqrt_pd(x);
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
// The rounding ops: integers are their own floor, ceiling, nearest integer and truncation.
// Round takes halves to even, as torch.round: rint in the default rounding mode (Eigen's pround
// rounds halves away from zero; its print is the instruction's current-direction rounding).
// Trunc's packet is the ceiling below 0 and the floor from 0 (-0.5 gives -0, as std::trunc).
#define DUET_ROUNDING(Name, fn, ...)                  \
  struct Name {                                       \
    template <class T>                                \
    static constexpr bool has_packet = is_float_v<T>; \
    template <class T>                                \
    DUET_HD T operator()(T x) const {                 \
      if constexpr (is_float_v<T>)                    \
        return math::fn(x);                           \
      else                                            \
        return x;                                     \
    }                                                 \
    DUET_PACKET(__VA_ARGS__)                          \
  };
DUET_ROUNDING(Floor, floor, ei::pfloor(x))
DUET_ROUNDING(Ceil, ceil, ei::pceil(x))
DUET_ROUNDING(Round, rint, ei::print(x))
DUET_ROUNDING(Trunc, trunc, ei::pselect(ei::pcmp_lt(x, ei::pzero(x)), ei::pceil(x), ei::pfloor(x)))
#undef DUET_ROUNDING
// (0 < x) - (x < 0): +0 for both zeros and for NaN, as torch.sign.
struct Sign {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    return static_cast<T>(static_cast<int>(T(0) < x) - static_cast<int>(x < T(0)));
  }
#if !defined(__CUDACC__)
  template <class P>
  P packet(const P& x) const {
    const P one = ei::pset1<P>(1), zero = ei::pzero(x);
    return ei::psub(ei::pand(ei::pcmp_lt(zero, x), one), ei::pand(ei::pcmp_lt(x, zero), one));
  }
#endif
};
// The standard library's functions, one lane at a time (Eigen 3.4 vectorizes none of them for
// both float widths; they are rare in hot loops).
#define DUET_SCALAR_MATH(Name, fn)            \
  struct Name {                               \
    template <class T>                        \
    static constexpr bool has_packet = false; \
    template <class T>                        \
    DUET_HD T operator()(T x) const {         \
      return math::fn(x);                     \
    }                                         \
  };
DUET_SCALAR_MATH(Exp2, exp2)
DUET_SCALAR_MATH(Log2, log2)
DUET_SCALAR_MATH(Log10, log10)
DUET_SCALAR_MATH(Tan, tan)
DUET_SCALAR_MATH(Asin, asin)
DUET_SCALAR_MATH(Acos, acos)
DUET_SCALAR_MATH(Sinh, sinh)
DUET_SCALAR_MATH(Cosh, cosh)
DUET_SCALAR_MATH(Asinh, asinh)
DUET_SCALAR_MATH(Acosh, acosh)
DUET_SCALAR_MATH(Atanh, atanh)
#undef DUET_SCALAR_MATH

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

// Note [GELU's tanh form as one op]
// gelu(x, "tanh") = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (0.5 (1 + tanh(u)) as
// sigmoid(2u): core/ops/nn.cpp), and its derivative
// s + x s (1 - s) 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2), as single ops: eagerly the composite
// ran seven kernels forward and about fifteen backward over the activations, PyTorch's one each.
// 1 - s is sigmoid(-u), not 1 - s: from s, it rounds to 0 where s rounds to 1 (x near 4 in f32),
// and the derivative's bump above 1 there would be lost. Both sigmoids come from one exponential,
// t = exp(-|u|) in (0, 1]: 1 / (1 + t) is the sigmoid of |u| and t / (1 + t) that of -|u|, each
// without cancellation or overflow. (Two exponentials made the derivative's kernel, and a fused
// kernel of both, about a third slower.) t is 0 where |u| is infinite (or NaN): Eigen's exp clamps
// its argument, and a tiny t there would make gelu(-inf) -inf where PyTorch's is NaN.
template <class T>
DUET_HD T gelu_exp(T u) {
  const T a = math::fabs(u);
  return a - a == T(0) ? math::exp(-a) : T(0);  // (a - a is 0 where a is finite)
}
struct GeluTanh {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    const T u = (x + x * x * x * T(0.044715)) * T(1.5957691216057307118);
    const T t = gelu_exp(u), d = T(1) / (T(1) + t);
    return x * (u >= T(0) ? d : t * d);
  }
#if !defined(__CUDACC__)
  template <class P>
  static P exp_packet(const P& u) {  // gelu_exp's
    const P a = ei::pabs(u);
    return ei::pand(ei::pexp(ei::pnegate(a)), ei::pcmp_eq(ei::psub(a, a), ei::pzero(a)));
  }
  template <class P>
  P packet(const P& x) const {
    const P one = ei::pset1<P>(1);
    const P u = ei::pmul(ei::padd(x, ei::pmul(ei::pmul(ei::pmul(x, x), x), ei::pset1<P>(0.044715))),
                         ei::pset1<P>(1.5957691216057307118));
    const P t = exp_packet(u), d = ei::pdiv(one, ei::padd(one, t));
    return ei::pmul(x, ei::pselect(ei::pcmp_le(ei::pzero(u), u), d, ei::pmul(t, d)));
  }
#endif
};
struct GeluTanhGrad {
  template <class T>
  static constexpr bool has_packet = is_float_v<T>;
  template <class T>
  DUET_HD T operator()(T x) const {
    const T u = (x + x * x * x * T(0.044715)) * T(1.5957691216057307118);
    const T t = gelu_exp(u), d = T(1) / (T(1) + t), td = t * d;
    const T s = u >= T(0) ? d : td, r = u >= T(0) ? td : d;  // r = 1 - s
    const T du = (T(1) + x * x * T(0.134145)) * T(1.5957691216057307118);
    return s + x * (s * r) * du;
  }
#if !defined(__CUDACC__)
  template <class P>
  P packet(const P& x) const {
    const P one = ei::pset1<P>(1), k = ei::pset1<P>(1.5957691216057307118);
    const P xx = ei::pmul(x, x);
    const P u = ei::pmul(ei::padd(x, ei::pmul(ei::pmul(xx, x), ei::pset1<P>(0.044715))), k);
    const P t = GeluTanh::exp_packet(u), d = ei::pdiv(one, ei::padd(one, t));
    const P td = ei::pmul(t, d), pos = ei::pcmp_le(ei::pzero(u), u);
    const P s = ei::pselect(pos, d, td), r = ei::pselect(pos, td, d);
    const P du = ei::pmul(ei::padd(one, ei::pmul(xx, ei::pset1<P>(0.134145))), k);
    return ei::padd(s, ei::pmul(ei::pmul(x, ei::pmul(s, r)), du));
  }
#endif
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
      // x^2 as x * x and x^1 as x, as PyTorch's CPU pow does: each rounds once, as a correctly
      // rounded pow would (the library's is within about half an ulp more), and a square is what
      // a loss or a norm asks most, where std::pow costs about 80 times a product.
      if (b == T(2)) return a * a;
      if (b == T(1)) return a;
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

// ---- sums: the cascade -----------------------------------------------------------------------
// Note [Cascade sums]
// Floats added one after another lose up to an ulp of the running sum at each step: 2^26
// copies of 1e4 summed so in f32 come out 1.4% off. Every floating-point reduction of duet (sum,
// and so mean, var, softmax's and layer_norm's statistics; eager, fused, generated and CUDA)
// adds in a cascade instead, as NumPy's pairwise and PyTorch's cascade sums do:
//  - values are added serially only within a short block: on the CPU kCascadeBlock packets in
//    four accumulators (sixteen deep in each lane), a block of rows for a sum over columns
//    (ColumnCascade), a few values per CUDA thread (CascadeRun);
//  - block sums go into a binary counter (Cascade): level k holds the sum of 2^k blocks, and
//    each new block carries upwards as in an increment, so blocks add as a balanced tree;
//  - the lanes of a packet, the warps of a CUDA block and the threads' partials fold as trees.
// A sum's error is then a few ulps (the block depth plus log2 of the block count) instead of a
// multiple of its length, at the cost of one packet add per block. Where threads split one sum,
// the CPU splits it at fixed points (not per thread) and folds the pieces in order, so the
// result does not depend on the thread count. Max and min are exact in any order; they share
// these loops where that keeps one loop.

/// A binary counter of block values (Note [Cascade sums]); F combines two values. Past the top
/// level (2^(kLevels-1) blocks), the top level adds serially.
template <class V, class F, int kLevels = 32>
struct Cascade {
  static_assert(kLevels <= 32, "the levels in use are the bits of an unsigned");
  V level[kLevels];
  unsigned used = 0;  ///< bit k: level[k] holds the sum of 2^k blocks
  DUET_HD void push(V v) {
    int k = 0;
    for (; k < kLevels - 1 && (used >> k & 1u); ++k) {
      v = F{}(level[k], v);
      used &= ~(1u << k);
    }
    if (used >> k & 1u) v = F{}(level[k], v);
    level[k] = v;
    used |= 1u << k;
  }
  /// Everything pushed, the lowest level first; `id` when nothing was.
  DUET_HD V total(V id) const {
    V acc = id;
    bool any = false;
    int k = 0;
    for (unsigned u = used; u; u >>= 1, ++k) {
      if (!(u & 1u)) continue;
      acc = any ? F{}(level[k], acc) : level[k];
      any = true;
    }
    return acc;
  }
};

/// A cascade fed one value at a time (a CUDA thread's share of a reduction): kBlock values add
/// serially, then go to the counter.
template <class V, class F, int kBlock = 16>
struct CascadeRun {
  Cascade<V, F> c;
  V id, block;
  int n = 0;
  DUET_HD explicit CascadeRun(V identity) : id(identity), block(identity) {}
  DUET_HD void add(V v) {
    block = F{}(block, v);
    if (++n == kBlock) {
      c.push(block);
      block = id;
      n = 0;
    }
  }
  DUET_HD V total() const {
    if (!c.used) return block;
    const V t = c.total(id);
    return n ? F{}(t, block) : t;
  }
};

#if !defined(__CUDACC__)
/// Packets in one block of cascade_packets: four accumulators, sixteen packets deep.
inline constexpr int kCascadeBlock = 64;

/// The sum reduction as cascade_packets, fold_lanes and ColumnCascade take one (the generated
/// kernels' RedMax and RedMin have the same three members).
template <class T>
struct SumOf {
  static T identity() { return T(0); }
  template <class P>
  static P packet(const P& a, const P& b) {
    return ei::padd(a, b);
  }
  static T scalar(T a, T b) { return a + b; }
};
template <class R>
struct PacketOf {
  template <class P>
  P operator()(const P& a, const P& b) const {
    return R::packet(a, b);
  }
};
template <class R>
struct ScalarOf {
  template <class T>
  T operator()(T a, T b) const {
    return R::scalar(a, b);
  }
};

/// The cascade (Note [Cascade sums]) over the packets load(0), load(W), ..., load(n - W), lane
/// by lane; n is a multiple of the packet width W.
template <class P, class R, class Load>
inline P cascade_packets(Load&& load, int64_t n) {
  constexpr int64_t W = ei::unpacket_traits<P>::size;
  const P id = ei::pset1<P>(R::identity());
  Cascade<P, PacketOf<R>> c;
  for (int64_t j = 0; j < n;) {
    const int64_t e = n - j < kCascadeBlock * W ? n : j + kCascadeBlock * W;
    P a0 = id, a1 = id, a2 = id, a3 = id;
    for (; j + 4 * W <= e; j += 4 * W) {
      a0 = R::packet(a0, load(j));
      a1 = R::packet(a1, load(j + W));
      a2 = R::packet(a2, load(j + 2 * W));
      a3 = R::packet(a3, load(j + 3 * W));
    }
    for (; j < e; j += W) a0 = R::packet(a0, load(j));
    c.push(R::packet(R::packet(a0, a1), R::packet(a2, a3)));
  }
  return c.total(id);
}

/// The W lanes of a packet folded as a tree: (l0 + l(W/2)) + ..., not one after another.
template <class R, class P>
inline typename ei::unpacket_traits<P>::type fold_lanes(const P& p) {
  using T = typename ei::unpacket_traits<P>::type;
  constexpr int W = ei::unpacket_traits<P>::size;
  alignas(64) T b[W];
  ei::pstore(b, p);
  for (int w = W / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) b[l] = R::scalar(b[l], b[l + w]);
  return b[0];
}

/// The cascade sum of x[0], x[s], ..., x[(n - 1) * s] (floating T).
template <class T>
inline T cascade_sum(const T* x, int64_t n, int64_t s = 1) {
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::packet_traits<T>::size;
  if (n < W) {  // too short for a packet
    T acc = T(0);
    for (int64_t i = 0; i < n; ++i) acc += x[i * s];
    return acc;
  }
  const int64_t full = n / W * W;
  P acc;
  if (s == 1)
    acc = cascade_packets<P, SumOf<T>>([x](int64_t j) { return ei::ploadu<P>(x + j); }, full);
  else
    acc = cascade_packets<P, SumOf<T>>(
        [x, s](int64_t j) { return ei::pgather<T, P>(x + j * s, s); }, full);
  T tail = T(0);
  for (int64_t i = full; i < n; ++i) tail += x[i * s];
  return fold_lanes<SumOf<T>>(acc) + tail;
}

/// Sums of up to kCols columns over rows given one at a time (Note [Cascade sums]): add(), or
/// the caller adds a row into row() (its first width() values, in packets) and calls next(). Blocks
/// of kRows rows add serially, the blocks in a binary counter of column vectors.
template <class T, class R, int64_t kCols>
class ColumnCascade {
 public:
  using P = typename ei::packet_traits<T>::type;
  static constexpr int64_t W = ei::packet_traits<T>::size;
  static constexpr int kRows = 32, kLevels = 20;
  static_assert(kCols % W == 0, "whole packets of columns");

  explicit ColumnCascade(int64_t width) : width_((width + W - 1) / W * W) { clear(block_); }
  int64_t width() const { return width_; }
  T* row() { return block_; }
  void next() {
    if (++rows_ == kRows) push();
  }
  /// Adds the row x[0 .. m), m <= width(), and moves to the next.
  void add(const T* x, int64_t m) {
    int64_t j = 0;
    for (; j + W <= m; j += W)
      ei::pstore(block_ + j, R::packet(ei::pload<P>(block_ + j), ei::ploadu<P>(x + j)));
    for (; j < m; ++j) block_[j] = R::scalar(block_[j], x[j]);
    next();
  }
  /// The sums of the first n <= width columns, into out.
  void finish(T* out, int64_t n) {
    if (rows_) push();
    T* acc = nullptr;
    int k = 0;
    for (unsigned u = used_; u; u >>= 1, ++k) {
      if (!(u & 1u)) continue;
      if (acc)
        add(level_[k], acc, acc);
      else
        acc = level_[k];
    }
    for (int64_t j = 0; j < n; ++j) out[j] = acc ? acc[j] : R::identity();
  }

 private:
  void clear(T* v) const {
    for (int64_t j = 0; j < width_; ++j) v[j] = R::identity();
  }
  // dst = a + b, column by column
  void add(const T* a, const T* b, T* dst) const {
    for (int64_t j = 0; j < width_; j += W)
      ei::pstore(dst + j, R::packet(ei::pload<P>(a + j), ei::pload<P>(b + j)));
  }
  void push() {
    int k = 0;
    for (; k < kLevels - 1 && (used_ >> k & 1u); ++k) {
      add(level_[k], block_, block_);
      used_ &= ~(1u << k);
    }
    if (used_ >> k & 1u) add(level_[k], block_, block_);
    for (int64_t j = 0; j < width_; ++j) level_[k][j] = block_[j];
    used_ |= 1u << k;
    clear(block_);
    rows_ = 0;
  }

  int64_t width_;
  int rows_ = 0;
  unsigned used_ = 0;
  alignas(64) T block_[kCols];
  alignas(64) T level_[kLevels][kCols];
};
#endif

#undef DUET_PACKET
#undef DUET_PACKET2

}  // namespace duet::fn
