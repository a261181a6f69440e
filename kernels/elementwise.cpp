// CPU kernels of the elementwise ops: where, the conversions and the sources here; the unary
// family in elementwise_unary.cpp, the binary and comparison families in elementwise_binary.cpp.
#include "kernels/elementwise_loops.h"

namespace duet::kernels {
namespace {

using ew::in_dtype;

// ---- where, cast, copy, sources -------------------------------------------------------------

// A dense row of where: each value's bits kept under a mask of all ones where c holds, so the
// loop vectorizes. A branch on a mask of random bits mispredicts half the time: a 1M-element f32
// where took 2.0 ms against 0.07 for a mul. DX and DY: 1 for a row, 0 for one broadcast value.
template <class T, int DX, int DY>
void where_rows(const bool* __restrict c, const T* __restrict x, const T* __restrict y,
                T* __restrict o, int64_t n) {
  using U =
      std::conditional_t<sizeof(T) == 8, uint64_t,
                         std::conditional_t<sizeof(T) == 4, uint32_t,
                                            std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>>;
  static_assert(sizeof(U) == sizeof(T));
  const auto* cb = reinterpret_cast<const uint8_t*>(c);  // (read as bytes, the loop vectorizes)
  for (int64_t i = 0; i < n; ++i) {
    U u, v;
    std::memcpy(&u, x + i * DX, sizeof(T));
    std::memcpy(&v, y + i * DY, sizeof(T));
    const U m = U(0) - U(cb[i] != 0);
    const U r = (u & m) | (v & ~m);
    std::memcpy(o + i, &r, sizeof(T));
  }
}

void where_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  DType ct = out.dtype();
  Tensor ta, tb;
  const Tensor& a = in_dtype(in[1], ct, ta);
  const Tensor& b = in_dtype(in[2], ct, tb);
  // Dense rows pick by the bits, without a branch (where_rows); others read both values and keep
  // one.
  DUET_DISPATCH_DTYPE(ct, "where", [&] {
    using T = scalar_t;
    for_each<4>(out.sizes(), {&out, &in[0], &a, &b}, [&](char** p, const int64_t* s, int64_t n) {
      constexpr int64_t z = sizeof(T);
      if (s[0] == z && s[1] == 1 && (s[2] == z || s[2] == 0) && (s[3] == z || s[3] == 0)) {
        const auto* c = reinterpret_cast<const bool*>(p[1]);
        const auto* x = reinterpret_cast<const T*>(p[2]);
        const auto* y = reinterpret_cast<const T*>(p[3]);
        T* o = reinterpret_cast<T*>(p[0]);
        if (s[2] && s[3]) return where_rows<T, 1, 1>(c, x, y, o, n);
        if (s[2]) return where_rows<T, 1, 0>(c, x, y, o, n);
        if (s[3]) return where_rows<T, 0, 1>(c, x, y, o, n);
        return where_rows<T, 0, 0>(c, x, y, o, n);
      }
      for (int64_t i = 0; i < n; ++i) {
        const T u = *reinterpret_cast<const T*>(p[2] + i * s[2]);
        const T v = *reinterpret_cast<const T*>(p[3] + i * s[3]);
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            *reinterpret_cast<const bool*>(p[1] + i * s[1]) ? u : v;
      }
    });
  });
}

template <class T>
constexpr bool is_narrow_int_v =
    std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t> || std::is_same_v<T, int16_t>;

template <class D, class S>
D convert(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (is_narrow_int_v<D> && !std::is_integral_v<S>) {
    // A float to a narrow integer: truncated toward zero to i64, then its low bits, as PyTorch's
    // CPU conversion does (-1.0 to u8 is 255, 300.0 is 44). NaN and values beyond i64 give 0.
    double x;
    if constexpr (std::is_floating_point_v<S>)
      x = v;
    else
      x = static_cast<float>(v);  // Eigen's half and bfloat16
    const bool fits = x > -9223372036854775808.0 && x < 9223372036854775808.0;
    return static_cast<D>(fits ? static_cast<int64_t>(x) : int64_t(0));
  } else {
    return static_cast<D>(v);
  }
}

// The rows of a conversion from S to D: p[0] the output, p[1] the input, s their strides in bytes.
template <class D, class S>
void convert_rows(char** p, const int64_t* s, int64_t n) {
  if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
    D* o = reinterpret_cast<D*>(p[0]);
    const S* v = reinterpret_cast<const S*>(p[1]);
    // Note [bf16 rows by their bits] in kernels/low_precision.h.
    if constexpr (std::is_same_v<D, float> && std::is_same_v<S, bf16_t>)
      widen_bf16(v, o, n);
    else if constexpr (std::is_same_v<D, bf16_t> && std::is_same_v<S, float>)
      round_to_bf16(v, o, n);
    else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, f16_t>)
      widen_f16(v, o, n);  // Note [f16 rows with F16C]
    else if constexpr (std::is_same_v<D, f16_t> && std::is_same_v<S, float>)
      round_to_f16(v, o, n);
    else if constexpr (std::is_same_v<S, bool> && sizeof(D) == 2 && !std::is_integral_v<D>) {
      // A mask (ReLU's gradient, a comparison) as bf16 or f16 numbers: 1.0's bits where the byte
      // is 1, without a branch, so that it vectorizes. Each element through float, with a branch
      // on the mask, was 15% of W4's bf16 step.
      const D one = convert<D>(true);
      uint16_t bits;
      std::memcpy(&bits, &one, sizeof(bits));
      auto* o16 = reinterpret_cast<uint16_t*>(o);
      const auto* b = reinterpret_cast<const uint8_t*>(v);
      for (int64_t i = 0; i < n; ++i) o16[i] = static_cast<uint16_t>(0 - b[i]) & bits;
    } else
      for (int64_t i = 0; i < n; ++i) o[i] = convert<D>(v[i]);
  } else if (s[0] == sizeof(D) && s[1] == 0) {
    // A broadcast source (zero_(), fill_, copy_ of a 0-d tensor): one conversion, then a fill
    // the compiler vectorizes, instead of a strided loop converting each element.
    D* o = reinterpret_cast<D*>(p[0]);
    std::fill(o, o + n, convert<D>(*reinterpret_cast<const S*>(p[1])));
  } else {
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<D*>(p[0] + i * s[0]) =
          convert<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
  }
}

using ConvertRows = void (*)(char**, const int64_t*, int64_t);

// Cast and Copy share this kernel: out may have any dtype and layout, x any dtype and layout.
// A copy within one dtype (contiguous() of a transpose, a strided assignment) keeps its rows
// inlined into the loop (for_each_inline): it is the common case, and its rows are short and
// cheap. A conversion between dtypes instantiates the loop once, around a pointer to the rows of
// the pair (Note [Rows by reference] in kernels/loops.h): instantiated for each of the 90 pairs,
// the loop doubled this file's compile time.
void convert_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const Tensor& x = in[0];
  if (x.dtype() == out.dtype()) {
    if (x.is_contiguous() && out.is_contiguous() && x.sizes() == out.sizes()) {
      const char* src = static_cast<const char*>(x.raw_data());
      char* dst = static_cast<char*>(out.raw_data());
      const int64_t isz = itemsize(x.dtype());
      if (src != dst)
        parallel_for(x.numel() * isz, kParallelGrain * 4,
                     [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, e - b); });
      return;
    }
    // Elements are moved as their bits (bits_of_size): a bf16 copy of a permuted (8, 128, 4, 64)
    // tensor took 5x the time of the same copy in f32 through Eigen's bfloat16.
    bits_of_size(itemsize(out.dtype()), [&](auto zero) {
      using T = decltype(zero);
      for_each_inline<2>(out.sizes(), {&out, &x}, [&](char** p, const int64_t* s, int64_t n) {
        if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
          T* o = reinterpret_cast<T*>(p[0]);
          const T* v = reinterpret_cast<const T*>(p[1]);
          for (int64_t i = 0; i < n; ++i) o[i] = v[i];
        } else if (s[0] == sizeof(T) && s[1] == 0) {
          T* o = reinterpret_cast<T*>(p[0]);
          std::fill(o, o + n, *reinterpret_cast<const T*>(p[1]));
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const T*>(p[1] + i * s[1]);
        }
      });
    });
    return;
  }
  ConvertRows rows = DUET_DISPATCH_ALL(out.dtype(), "copy", [&] {
    using D = scalar_t;
    return DUET_DISPATCH_ALL(x.dtype(), "copy", [&] {
      using S = scalar_t;
      return ConvertRows(&convert_rows<D, S>);
    });
  });
  for_each<2>(out.sizes(), {&out, &x},
              [rows](char** p, const int64_t* s, int64_t n) { rows(p, s, n); });
}

void full_kernel(TensorRefs, const Attrs& a, const Tensor& out) {
  DUET_DISPATCH_DTYPE(out.dtype(), "full", [&] {
    using T = scalar_t;
    const T v = a.value.to<T>();
    T* o = static_cast<T*>(out.raw_data());
    parallel_for(out.numel(), kParallelGrain,
                 [&](int64_t b, int64_t e) { std::fill(o + b, o + e, v); });
  });
}

// A fill of f16 or bf16: the value as f32, rounded once (as via_wide's f32 fill, cast, rounds
// it), then its bits filled, without an f32 temporary of the whole (2.4x the time of the f32 fill).
void full_any_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  if (!is_low_precision(out.dtype())) return via_wide<full_kernel>(in, a, out);
  const float v = a.value.to<float>();
  uint16_t bits;
  round_low(&v, 1, out.dtype(), &bits);
  auto* o = static_cast<uint16_t*>(out.raw_data());
  parallel_for(out.numel(), kParallelGrain,
               [&](int64_t b, int64_t e) { std::fill(o + b, o + e, bits); });
}

void arange_kernel(TensorRefs, const Attrs&, const Tensor& out) {
  DUET_DISPATCH_DTYPE(out.dtype(), "arange", [&] {
    using T = scalar_t;
    T* o = static_cast<T*>(out.raw_data());
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = static_cast<T>(i);
  });
}

}  // namespace

void copy_into(const Tensor& src, const Tensor& dst) {
  const Tensor* in[] = {&src};
  convert_kernel(TensorRefs(in, 1), Attrs{}, dst);
}

Tensor cast_to(const Tensor& t, DType dtype) {
  Tensor out = detail::empty(t.sizes(), dtype, t.device());
  const Tensor* in[] = {&t};
  convert_kernel(TensorRefs(in, 1), Attrs{}, out);
  return out;
}

void register_elementwise_kernels(OpDef* t) {
  auto reg = [&](OpId op, KernelFn k) { detail::register_kernel(t, op, DeviceType::CPU, k); };
  register_unary_kernels(t);
  register_binary_kernels(t);
  reg(OpId::Where, via_wide<where_kernel>);
  reg(OpId::Cast, convert_kernel);
  reg(OpId::Copy, convert_kernel);
  reg(OpId::Full, full_any_kernel);
  reg(OpId::Arange, via_wide<arange_kernel>);
}

}  // namespace duet::kernels