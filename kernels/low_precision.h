// duet: f16 and bf16, and the narrow integers, in the kernels.
//
// Note [Low precision]
// f16 and bf16 tensors store 2-byte elements and compute in f32, as PyTorch's do: a kernel
// loads each element as a float, computes in f32 (reductions, cumsum and the softmax family
// accumulate there) and rounds the result to nearest-even once, when it stores it. So a
// low-precision result is the f32 result of the same (rounded) inputs, rounded, up to the
// order of a sum, and every device and both faces agree on it.
//
// Two kinds of kernel do that:
//  - kernels written for the low dtypes themselves: Cast and Copy, the elementwise families
//    (blocks converted to f32 and back around the f32 functors), the products that have
//    library kernels (matmul through oneDNN's bf16 primitives), Gather, which moves each
//    element's bits (bits_of_size; an embedding lookup no longer widens its whole table), its
//    gradient's rows added into a table (ScatterAdd, add_rows_low: only the touched rows
//    widened), and Full, which rounds its value once;
//  - every other kernel is registered through via_wide<kernel>, which converts the f16 and bf16
//    inputs to f32 with the Cast kernel of the output's device, runs the f32 kernel into an f32
//    temporary, and casts that into the output. Data movement (gather, cat, unfold) is exact
//    that way; sums and products accumulate in f32.
// f32 and every other dtype pass through via_wide at the cost of a dtype test.
//
// The narrow integers (i8, u8, i16) go the same way through i32 (compute_dtype in core/dtype.h),
// in every kernel but Cast and Copy, which convert them directly. i32 holds every value of each,
// and the cast back keeps the low bits, so a sum or product wraps as it does in PyTorch
// (uint8 250 + 10 is 4); comparisons, data movement and max/min are exact.
#pragma once

#include <Eigen/Core>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <algorithm>

#include "core/op_table.h"

namespace duet::kernels {

/// The C++ types of the low-precision dtypes: Eigen's, which convert with round-to-nearest-even.
using f16_t = Eigen::half;
using bf16_t = Eigen::bfloat16;

#if !defined(__CUDACC__)
// Note [bf16 packets]
// The elementwise kernels run a dense bf16 row in one pass of f32 packets: W lanes widened by
// their bits, the functor's packet math, and the result rounded (bf16_rounded_bits on every
// lane) and narrowed in registers, as the generated kernels do (Note [bf16 by its bits] in
// kernels/codegen/cpu.cpp). The blocked loops widened 256 elements into a buffer, computed, and
// rounded them into another: three passes, which made a bf16 add of a bias 3x slower than the
// f32 add of twice the bytes. The bits are the blocked loops' (the same packet math and rounding;
// those loops convert with these packets too). With AVX512-BF16, one vcvtneps2bf16 rounds a
// packet: a bf16 add of (1024, 256) and a bias took 35 us, 32 in one pass, 24 so (f32: 16).
namespace bf16_packets {
using P = Eigen::internal::packet_traits<float>::type;
inline constexpr int W = Eigen::internal::packet_traits<float>::size;
typedef uint32_t Bits __attribute__((vector_size(W * 4)));
typedef uint16_t Halves __attribute__((vector_size(W * 2)));
static_assert(sizeof(P) == sizeof(Bits));

/// W bf16 values at p, widened to f32 (exact).
inline P load(const bf16_t* p) {
#if defined(__AVX512F__)
  if constexpr (W == 16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
#endif
  Halves h;
  __builtin_memcpy(&h, static_cast<const void*>(p), sizeof(h));
  const Bits b = __builtin_convertvector(h, Bits) << 16;
  P x;
  __builtin_memcpy(&x, &b, sizeof(x));
  return x;
}
/// x rounded to bf16 (as bf16_rounded_bits rounds each lane), stored at p.
inline void store(bf16_t* p, const P& x) {
#if defined(__AVX512BF16__)
  // vcvtneps2bf16 rounds to nearest even, as bf16_rounded_bits does, but treats an f32 denormal as
  // zero and keeps a NaN's payload: a packet holding either takes the bits below.
  if constexpr (W == 16) {
    if (__builtin_expect(_mm512_fpclass_ps_mask(x, 0x01 | 0x20 | 0x80) == 0, 1)) {
      _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(x));
      return;
    }
  }
#endif
  Bits b;
  __builtin_memcpy(&b, &x, sizeof(b));
  const Bits r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  const Bits nan = (Bits)((b & 0x7FFFFFFFu) > 0x7F800000u);  // all ones where NaN
  const Bits q = (b & 0x80000000u) | 0x7FC00000u;
  const Halves h = __builtin_convertvector(((nan & q) | (~nan & r)) >> 16, Halves);
  __builtin_memcpy(static_cast<void*>(p), &h, sizeof(h));
}
}  // namespace bf16_packets
#endif

// Note [bf16 rows by their bits]
// Eigen's bfloat16 converts one element at a time, with a branch for NaN that keeps the loop
// scalar: a dense row of bf16 converted with an Eigen array cast ran 5x slower than these loops,
// which the compiler vectorizes. A bf16 is the high half of an f32, so widening is a shift;
// rounding adds 0x7FFF plus the lowest kept bit and keeps the high half (nearest, ties to even; a
// carry into the exponent gives inf), and a NaN becomes the quiet NaN of its sign: Eigen's
// conversion to the bit (the generated kernels do the same on their packets, Note [bf16 by its
// bits] in kernels/codegen/cpu.cpp).

/// n bf16 values widened to f32 (exact).
inline void widen_bf16(const bf16_t* s, float* d, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(s);
  int64_t i = 0;
#if !defined(__CUDACC__)
  for (; i + bf16_packets::W <= n; i += bf16_packets::W)
    Eigen::internal::pstoreu(d + i, bf16_packets::load(s + i));
#endif
  for (; i < n; ++i) {
    const uint32_t u = uint32_t(h[i]) << 16;
    __builtin_memcpy(d + i, &u, 4);
  }
}

/// The f32 bits u rounded to bf16, as Eigen's conversion rounds them: the bf16 in the high half.
inline uint32_t bf16_rounded_bits(uint32_t u) {
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  const uint32_t q = (u & 0x80000000u) | 0x7FC00000u;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? q : r;
}

/// n f32 values rounded to bf16, as Eigen's conversion rounds them.
inline void round_to_bf16(const float* s, bf16_t* d, int64_t n) {
  auto* h = reinterpret_cast<uint16_t*>(d);
  int64_t i = 0;
#if !defined(__CUDACC__)
  for (; i + bf16_packets::W <= n; i += bf16_packets::W)
    bf16_packets::store(d + i, Eigen::internal::ploadu<bf16_packets::P>(s + i));
#endif
  for (; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, s + i, 4);
    h[i] = static_cast<uint16_t>(bf16_rounded_bits(u) >> 16);
  }
}

/// n f32 values rounded to bf16 in place, as floats again.
inline void round_bf16_in_place(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, v + i, 4);
    const uint32_t b = bf16_rounded_bits(u);
    __builtin_memcpy(v + i, &b, 4);
  }
}

// Note [f16 rows with F16C]
// Eigen's half converts one element at a time too, in software without F16C (Eigen defines no
// EIGEN_HAS_FP16_C for GCC here): a dense f16 row ran about 5x slower than a bf16 one (an f16
// mul of 4M elements 3.3 ms, bf16 0.58). These rows convert 16 lanes at a time with the CPU's
// F16C instructions (8 lanes with AVX2; vcvtps2ph rounds to nearest even, as Eigen does, and
// overflows to inf; the widening is exact), and redo with Eigen's scalar conversion the lanes that
// hold a NaN, whose payload F16C keeps where Eigen gives the quiet NaN of its sign (narrowing) or
// keeps a signaling one (widening): so the results are Eigen's to the bit, which the fused kernels'
// conversions give too. Without F16C they are Eigen's loops.

/// n f16 values widened to f32 (exact), as Eigen's conversion widens them.
inline void widen_f16(const f16_t* s, float* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_ps(d + i, v);
    if (__builtin_expect(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0, 0))
      for (int l = 0; l < 16; ++l) d[i + l] = static_cast<float>(s[i + l]);
  }
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, v);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0))
      for (int l = 0; l < 8; ++l) d[i + l] = static_cast<float>(s[i + l]);
  }
#endif
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}

/// n f32 values rounded to f16, as Eigen's conversion rounds them.
inline void round_to_f16(const float* s, f16_t* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(s + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0, 0))
      for (int l = 0; l < 16; ++l) d[i + l] = f16_t(s[i + l]);
  }
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(s + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0))
      for (int l = 0; l < 8; ++l) d[i + l] = f16_t(s[i + l]);
  }
#endif
  for (; i < n; ++i) d[i] = f16_t(s[i]);
}

/// n f32 values rounded to f16 in place, as floats again.
inline void round_f16_in_place(float* v, int64_t n) {
  alignas(64) f16_t h[256];
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t m = std::min<int64_t>(256, n - i);
    round_to_f16(v + i, h, m);
    widen_f16(h, v + i, m);
  }
}

/// Whether an input or the output of a call has a dtype kernels compute in a wider one (f16, bf16,
/// i8, u8, i16: is_storage_only).
bool has_storage_only(TensorRefs in, const Tensor& out);
/// Runs kernel k with those inputs and its output in their compute dtypes (Note [Low precision]).
void run_wide(KernelFn k, TensorRefs in, const Attrs& attrs, const Tensor& out);

/// n f32 values rounded to the low dtype (bf16 or f16), as its bits.
inline void round_low(const float* src, int64_t n, DType low, uint16_t* dst) {
  if (low == DType::bf16) return round_to_bf16(src, reinterpret_cast<bf16_t*>(dst), n);
  round_to_f16(src, reinterpret_cast<f16_t*>(dst), n);  // Note [f16 rows with F16C]
}

/// n values of the low dtype (bf16 or f16, as their bits) widened to f32.
inline void widen_low_row(DType low, const uint16_t* src, float* dst, int64_t n) {
  if (low == DType::bf16) return widen_bf16(reinterpret_cast<const bf16_t*>(src), dst, n);
  widen_f16(reinterpret_cast<const f16_t*>(src), dst, n);  // Note [f16 rows with F16C]
}

/// body(U{}) with U the unsigned integer of `size` bytes (1, 2, 4 or 8): kernels that only move
/// elements (copies, gathers) move their bits, whatever the dtype. (Loops over Eigen's half and
/// bfloat16, class types, did not vectorize.)
template <class Body>
decltype(auto) bits_of_size(int64_t size, Body&& body) {
  switch (size) {
    case 1:
      return body(uint8_t{});
    case 2:
      return body(uint16_t{});
    case 4:
      return body(uint32_t{});
    default:
      DUET_ASSERT(size == 8, "[kernels] an element of {} bytes", size);
      return body(uint64_t{});
  }
}

/// Kernel K, computing f16 and bf16 in f32 and the narrow integers in i32 (Note [Low precision]).
template <KernelFn K>
void via_wide(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  if (has_storage_only(in, out)) [[unlikely]]
    return run_wide(K, in, attrs, out);
  K(in, attrs, out);
}

}  // namespace duet::kernels

/// DUET_DISPATCH_DTYPE with f16 and bf16 too, as f16_t and bf16_t.
#define DUET_DISPATCH_WITH_LOW(dtype, op_name, ...)              \
  [&] {                                                          \
    switch (dtype) {                                             \
      case ::duet::DType::f16: {                                 \
        using scalar_t = ::duet::kernels::f16_t;                 \
        return __VA_ARGS__();                                    \
      }                                                          \
      case ::duet::DType::bf16: {                                \
        using scalar_t = ::duet::kernels::bf16_t;                \
        return __VA_ARGS__();                                    \
      }                                                          \
      default:                                                   \
        return DUET_DISPATCH_DTYPE(dtype, op_name, __VA_ARGS__); \
    }                                                            \
  }()

/// DUET_DISPATCH_WITH_LOW with the narrow integers too: the conversions' dispatch.
#define DUET_DISPATCH_ALL(dtype, op_name, ...)                      \
  [&] {                                                             \
    switch (dtype) {                                                \
      case ::duet::DType::i8: {                                     \
        using scalar_t = int8_t;                                    \
        return __VA_ARGS__();                                       \
      }                                                             \
      case ::duet::DType::u8: {                                     \
        using scalar_t = uint8_t;                                   \
        return __VA_ARGS__();                                       \
      }                                                             \
      case ::duet::DType::i16: {                                    \
        using scalar_t = int16_t;                                   \
        return __VA_ARGS__();                                       \
      }                                                             \
      default:                                                      \
        return DUET_DISPATCH_WITH_LOW(dtype, op_name, __VA_ARGS__); \
    }                                                               \
  }()
