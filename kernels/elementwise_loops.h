// The loops of the CPU elementwise kernels, shared by the unary (elementwise_unary.cpp), binary
// and comparison (elementwise_binary.cpp) families and the conversions (elementwise.cpp). Each
// family is its own translation unit: they are the largest template instantiations of duet, and
// a build compiles them side by side.
#pragma once

#include <algorithm>
#include <cstring>

#include "kernels/cpu_kernels.h"
#include "kernels/functors.h"
#include "kernels/loops.h"
#include "kernels/low_precision.h"

namespace duet::kernels::ew {

// Calls body.template operator()<T>() for the floating dtypes only (the float-math ops).
#define DUET_DISPATCH_FLOAT(dtype, op_name, ...)                                  \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case DType::f32: {                                                          \
        using scalar_t = float;                                                   \
        return __VA_ARGS__();                                                     \
      }                                                                           \
      case DType::f64: {                                                          \
        using scalar_t = double;                                                  \
        return __VA_ARGS__();                                                     \
      }                                                                           \
      default:                                                                    \
        throw DTypeError(::duet::detail::with_context(                            \
            fmt::format("[{}] has no CPU kernel for dtype {}", op_name, dtype))); \
    }                                                                             \
  }()

inline bool dense_like(const Tensor& t, const Tensor& out) {
  return t.is_contiguous() && t.sizes() == out.sizes();
}

// ---- unary ----------------------------------------------------------------------------------

template <class F, class T>
void unary_typed(const Tensor& x, const Tensor& out) {
  const F f{};
  if (dense_like(x, out) && out.is_contiguous()) {
    const T* px = static_cast<const T*>(x.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    parallel_for(out.numel(), kParallelGrain,
                 [&](int64_t b, int64_t e) { unary_dense<T>(f, px + b, po + b, e - b); });
    return;
  }
  for_each<2>(out.sizes(), {&out, &x}, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
      unary_dense<T>(f, reinterpret_cast<const T*>(p[1]), reinterpret_cast<T*>(p[0]), n);
    } else if constexpr (F::template has_packet<T>) {
      // Gather, run the packet loop, scatter: a strided or expanded operand gets the same bits
      // as a contiguous one (the packet math, Eigen's psin and the like, can differ from the
      // scalar std:: function in the last place).
      constexpr int64_t B = 256;
      alignas(64) T xs[B], ys[B];
      for (int64_t i0 = 0; i0 < n; i0 += B) {
        const int64_t m = std::min(B, n - i0);
        const char* px = p[1] + i0 * s[1];
        for (int64_t i = 0; i < m; ++i) xs[i] = *reinterpret_cast<const T*>(px + i * s[1]);
        unary_dense<T>(f, xs, ys, m);
        char* po = p[0] + i0 * s[0];
        for (int64_t i = 0; i < m; ++i) *reinterpret_cast<T*>(po + i * s[0]) = ys[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]));
    }
  });
}

// The compute-dtype version of an input: the input itself, or a converted copy held in `tmp`.
// (No handle copies on the hot path: each costs two atomic operations.)
inline const Tensor& in_dtype(const Tensor& t, DType ct, Tensor& tmp) {
  if (t.dtype() == ct) return t;
  tmp = cast_to(t, ct);
  return tmp;
}

// ---- f16 and bf16: blocks converted to f32 around the f32 functors (Note [Low precision]) ----

constexpr int64_t kLowBlock = 256;

// m elements of dtype dt (f32 or L) at p, stepping by s bytes, as floats in d.
template <class L>
void load_f32(const char* p, int64_t s, DType dt, float* d, int64_t m) {
  if (dt == DType::f32) {
    for (int64_t i = 0; i < m; ++i) d[i] = *reinterpret_cast<const float*>(p + i * s);
  } else if (std::is_same_v<L, bf16_t> && s == int64_t(sizeof(L))) {
    widen_bf16(reinterpret_cast<const bf16_t*>(p), d, m);  // Note [bf16 rows by their bits]
  } else if (std::is_same_v<L, f16_t> && s == int64_t(sizeof(L))) {
    widen_f16(reinterpret_cast<const f16_t*>(p), d, m);  // Note [f16 rows with F16C]
  } else if (s == int64_t(sizeof(L))) {
    Eigen::Map<Eigen::ArrayXf>(d, m) =
        Eigen::Map<const Eigen::Array<L, Eigen::Dynamic, 1>>(reinterpret_cast<const L*>(p), m)
            .template cast<float>();
  } else {
    for (int64_t i = 0; i < m; ++i)
      d[i] = static_cast<float>(*reinterpret_cast<const L*>(p + i * s));
  }
}
template <class L>
void store_low(const float* v, char* p, int64_t s, int64_t m) {
  if (std::is_same_v<L, bf16_t> && s == int64_t(sizeof(L))) {
    round_to_bf16(v, reinterpret_cast<bf16_t*>(p), m);  // Note [bf16 rows by their bits]
  } else if (std::is_same_v<L, f16_t> && s == int64_t(sizeof(L))) {
    round_to_f16(v, reinterpret_cast<f16_t*>(p), m);  // Note [f16 rows with F16C]
  } else if (s == int64_t(sizeof(L))) {
    Eigen::Map<Eigen::Array<L, Eigen::Dynamic, 1>>(reinterpret_cast<L*>(p), m) =
        Eigen::Map<const Eigen::ArrayXf>(v, m).template cast<L>();
  } else {
    for (int64_t i = 0; i < m; ++i) *reinterpret_cast<L*>(p + i * s) = L(v[i]);
  }
}

// Whether functor F runs dense bf16 rows in one pass of packets (Note [bf16 packets]).
template <class F, class L>
inline constexpr bool kBf16Packets = std::is_same_v<L, bf16_t>&& F::template has_packet<float>;

// The whole packets of a dense bf16 row of n (x, or the constant *cx where cx is set) in one
// pass (Note [bf16 packets]); returns how many elements it did, a multiple of W.
template <class F>
int64_t unary_bf16_packets(const F& f, const bf16_t* x, bf16_t* y, int64_t n) {
  namespace bp = bf16_packets;
  int64_t i = 0;
  for (; i + bp::W <= n; i += bp::W) bp::store(y + i, f.packet(bp::load(x + i)));
  return i;
}
template <class F>
int64_t binary_bf16_packets(const F& f, const bf16_t* a, const float* ca, const bf16_t* b,
                            const float* cb, bf16_t* y, int64_t n) {
  namespace bp = bf16_packets;
  namespace ei = Eigen::internal;
  int64_t i = 0;
  if (ca) {
    const bp::P va = ei::pset1<bp::P>(*ca);
    for (; i + bp::W <= n; i += bp::W) bp::store(y + i, f.packet(va, bp::load(b + i)));
  } else if (cb) {
    const bp::P vb = ei::pset1<bp::P>(*cb);
    for (; i + bp::W <= n; i += bp::W) bp::store(y + i, f.packet(bp::load(a + i), vb));
  } else {
    for (; i + bp::W <= n; i += bp::W) bp::store(y + i, f.packet(bp::load(a + i), bp::load(b + i)));
  }
  return i;
}

template <class F, class L>
void unary_low(const Tensor& x, const Tensor& out) {
  const F f{};
  for_each<2>(out.sizes(), {&out, &x}, [&](char** p, const int64_t* s, int64_t n) {
    alignas(64) float xs[kLowBlock], ys[kLowBlock];
    int64_t done = 0;
    if constexpr (kBf16Packets<F, L>) {
      if (s[0] == 2 && s[1] == 2)  // (x has the output's dtype: unary_kernel converts it)
        done = unary_bf16_packets(f, reinterpret_cast<const bf16_t*>(p[1]),
                                  reinterpret_cast<bf16_t*>(p[0]), n);
    }
    for (int64_t i0 = done; i0 < n; i0 += kLowBlock) {
      const int64_t m = std::min(kLowBlock, n - i0);
      load_f32<L>(p[1] + i0 * s[1], s[1], x.dtype(), xs, m);
      unary_dense<float>(f, xs, ys, m);
      store_low<L>(ys, p[0] + i0 * s[0], s[0], m);
    }
  });
}

// a and b are L, or f32 when 0-d: a 0-d operand (a wrapped number) enters the f32 math as it
// is, without first rounding to L, as in PyTorch. R: L, or bool for comparisons.
template <class F, class L, class R>
void binary_low(const Tensor& a, const Tensor& b, const Tensor& out) {
  const F f{};
  for_each<3>(out.sizes(), {&out, &a, &b}, [&](char** p, const int64_t* s, int64_t n) {
    alignas(64) float xa[kLowBlock], xb[kLowBlock], ys[kLowBlock];
    const bool sa = s[1] == 0, sb = s[2] == 0;
    if (sa) load_f32<L>(p[1], 0, a.dtype(), xa, 1);
    if (sb) load_f32<L>(p[2], 0, b.dtype(), xb, 1);
    int64_t done = 0;
    if constexpr (kBf16Packets<F, L> && !std::is_same_v<R, bool>) {
      // (An operand of stride 2 is a bf16 row: only a 0-d one may be f32, and it is broadcast.)
      if (s[0] == 2 && (sa || s[1] == 2) && (sb || s[2] == 2) && !(sa && sb))
        done = binary_bf16_packets(f, reinterpret_cast<const bf16_t*>(p[1]), sa ? xa : nullptr,
                                   reinterpret_cast<const bf16_t*>(p[2]), sb ? xb : nullptr,
                                   reinterpret_cast<bf16_t*>(p[0]), n);
    }
    for (int64_t i0 = done; i0 < n; i0 += kLowBlock) {
      const int64_t m = std::min(kLowBlock, n - i0);
      if (!sa) load_f32<L>(p[1] + i0 * s[1], s[1], a.dtype(), xa, m);
      if (!sb) load_f32<L>(p[2] + i0 * s[2], s[2], b.dtype(), xb, m);
      if constexpr (std::is_same_v<R, bool>) {
        for (int64_t i = 0; i < m; ++i)
          *reinterpret_cast<bool*>(p[0] + (i0 + i) * s[0]) = f(xa[sa ? 0 : i], xb[sb ? 0 : i]);
      } else {
        binary_dense<float>(f, xa, sa, xb, sb, ys, m);
        store_low<L>(ys, p[0] + i0 * s[0], s[0], m);
      }
    }
  });
}

// Calls body.template operator()<L>() for f16 or bf16.
template <class Body>
void dispatch_low(DType d, Body&& body) {
  if (d == DType::bf16)
    body.template operator()<bf16_t>();
  else
    body.template operator()<f16_t>();
}

template <class F, bool FloatOnly>
void unary_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  // The narrow integers compute in i32 (Note [Low precision]).
  if (is_narrow_integral(out.dtype()) || is_narrow_integral(in[0].dtype())) [[unlikely]]
    return run_wide(unary_kernel<F, FloatOnly>, in, attrs, out);
  DType ct = out.dtype();
  Tensor tx;
  const Tensor& x = in_dtype(in[0], ct, tx);
  if (is_low_precision(ct)) {
    dispatch_low(ct, [&]<class L>() { unary_low<F, L>(x, out); });
    return;
  }
  if constexpr (FloatOnly) {
    DUET_DISPATCH_FLOAT(ct, "unary", [&] { unary_typed<F, scalar_t>(x, out); });
  } else {
    DUET_DISPATCH_DTYPE(ct, "unary", [&] {
      if constexpr (std::is_same_v<scalar_t, bool>)
        throw DTypeError(::duet::detail::with_context("[unary] has no CPU kernel for b8"));
      else
        unary_typed<F, scalar_t>(x, out);
    });
  }
}

// ---- binary ---------------------------------------------------------------------------------

template <class F, class T, class R>
void binary_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  const F f{};
  constexpr bool same = std::is_same_v<T, R>;
  const bool a_sc = a.dim() == 0, b_sc = b.dim() == 0;
  if (out.is_contiguous() && (a_sc || dense_like(a, out)) && (b_sc || dense_like(b, out))) {
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    R* po = static_cast<R*>(out.raw_data());
    parallel_for(out.numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
      const T* qa = a_sc ? pa : pa + lo;
      const T* qb = b_sc ? pb : pb + lo;
      if constexpr (same) {
        binary_dense<T>(f, qa, a_sc, qb, b_sc, po + lo, hi - lo);
      } else {
        const int64_t sa = a_sc ? 0 : 1, sb = b_sc ? 0 : 1;
        for (int64_t i = 0; i < hi - lo; ++i) po[lo + i] = f(qa[i * sa], qb[i * sb]);
      }
    });
    return;
  }
  for_each<3>(out.sizes(), {&out, &a, &b}, [&](char** p, const int64_t* s, int64_t n) {
    const bool da = s[1] == sizeof(T) || s[1] == 0, db = s[2] == sizeof(T) || s[2] == 0;
    if constexpr (same) {
      if (s[0] == sizeof(R) && da && db) {
        binary_dense<T>(f, reinterpret_cast<const T*>(p[1]), s[1] == 0,
                        reinterpret_cast<const T*>(p[2]), s[2] == 0, reinterpret_cast<R*>(p[0]), n);
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<R*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]),
                                                 *reinterpret_cast<const T*>(p[2] + i * s[2]));
  });
}

// Inputs whose dtype differs from the compute dtype are converted first. A 0-d operand becomes a
// 0-d tensor of the compute dtype (one element, so the conversion is negligible).
template <class F, bool Compare>
void binary_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  // The narrow integers compute in i32 (Note [Low precision]).
  if (is_narrow_integral(out.dtype()) || is_narrow_integral(in[0].dtype()) ||
      is_narrow_integral(in[1].dtype())) [[unlikely]]
    return run_wide(binary_kernel<F, Compare>, in, attrs, out);
  DType ct = Compare ? detail::result_type(in) : out.dtype();
  Tensor ta, tb;
  if (is_low_precision(ct)) {
    auto operand = [&](const Tensor& t, Tensor& tmp) -> const Tensor& {
      return in_dtype(t, t.dim() == 0 ? DType::f32 : ct, tmp);
    };
    const Tensor& a = operand(in[0], ta);
    const Tensor& b = operand(in[1], tb);
    dispatch_low(
        ct, [&]<class L>() { binary_low<F, L, std::conditional_t<Compare, bool, L>>(a, b, out); });
    return;
  }
  const Tensor& a = in_dtype(in[0], ct, ta);
  const Tensor& b = in_dtype(in[1], ct, tb);
  DUET_DISPATCH_DTYPE(ct, "binary", [&] {
    using R = std::conditional_t<Compare, bool, scalar_t>;
    binary_typed<F, scalar_t, R>(a, b, out);
  });
}

}  // namespace duet::kernels::ew
