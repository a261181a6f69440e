// The CPU code generator: a fused program (kernels/fused.h) as C++ over Eigen packets, computing
// what the interpreter computes (kernels/fused.cpp) bit for bit. Its twin for CUDA is
// kernels/codegen/cuda.cpp; both read each op from one expression table (kernels/codegen/exprs.h).
// trace/plan/codegen.cpp builds, caches and loads what this writes.
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/codegen/exprs.h"
#include "kernels/codegen/source.h"
#include "kernels/jit.h"

namespace duet::detail {

namespace {

using kernels::FusedInstr;
using kernels::FusedProgram;
using kernels::FusedReduce;

// ---- the generated source --------------------------------------------------------------------

// The fixed part of every kernel: packet helpers, input and output cursors, and the three loop
// drivers of Note [Fused iteration]. A program adds `using T`, its Body and the entry point.
// A reduction whose body has more ops runs it from one place (Note [One body per reduction]).
constexpr int kOneBodyOps = 16;

constexpr const char* kPreludeHead = R"duet_src(#include <stdint.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "duet_fused_abi.h"
#include "duet_functors.h"
)duet_src";

constexpr const char* kPreludeBody = R"duet_src(
namespace {
namespace ei = Eigen::internal;
using duet::kernels::DuetFusedArgs;
using P = ei::packet_traits<T>::type;
constexpr int W = ei::unpacket_traits<P>::size;

#define DUET_INLINE inline __attribute__((always_inline))
#define DUET_TAIL __attribute__((noinline, cold))
// The interpreter rounds each op's result to T in memory. This keeps the compiler from
// contracting one op's multiply and the next op's add into an FMA, so results match bit for bit.
#if defined(__x86_64__) || defined(__i386__)
#define DUET_KEEP(x) __asm__("" : "+v"(x))
#elif defined(__aarch64__)
#define DUET_KEEP(x) __asm__("" : "+w"(x))
#else
#define DUET_KEEP(x) ((void)0)
#endif

// An op without packet math for T runs its scalar functor lane by lane.
template <class F>
DUET_INLINE P apply1(const P& x) {
  if constexpr (F::template has_packet<T>) {
    return F{}.packet(x);
  } else {
    alignas(64) T a[W];
    ei::pstore(a, x);
    for (int l = 0; l < W; ++l) a[l] = static_cast<T>(F{}(a[l]));
    return ei::pload<P>(a);
  }
}
template <class F>
DUET_INLINE P apply2(const P& x, const P& y) {
  if constexpr (F::template has_packet<T>) {
    return F{}.packet(x, y);
  } else {
    alignas(64) T a[W], b[W];
    ei::pstore(a, x);
    ei::pstore(b, y);
    for (int l = 0; l < W; ++l) a[l] = static_cast<T>(F{}(a[l], b[l]));
    return ei::pload<P>(a);
  }
}

// b8 values are 1 or 0 in T (Note [Fused registers]); ordered compares: NaN gives 0, except !=.
DUET_INLINE P ones() { return ei::pset1<P>(T(1)); }
DUET_INLINE P cmp_lt(const P& a, const P& b) { return ei::pand(ei::pcmp_lt(a, b), ones()); }
DUET_INLINE P cmp_le(const P& a, const P& b) { return ei::pand(ei::pcmp_le(a, b), ones()); }
DUET_INLINE P cmp_eq(const P& a, const P& b) { return ei::pand(ei::pcmp_eq(a, b), ones()); }
DUET_INLINE P cmp_ne(const P& a, const P& b) { return ei::pandnot(ones(), ei::pcmp_eq(a, b)); }
DUET_INLINE P to_b8(const P& x) { return cmp_ne(x, ei::pzero(x)); }
DUET_INLINE P pwhere(const P& c, const P& a, const P& b) {
  return ei::pselect(ei::pcmp_eq(c, ei::pzero(c)), b, a);
}

// Note [bf16 by its bits]
// A bf16 is the high half of an f32. Rounding an f32 to bf16 adds 0x7FFF plus the lowest kept bit
// and clears the low half (round to nearest, ties to even; a carry into the exponent gives inf);
// a NaN becomes the quiet NaN of its sign. That is Eigen's conversion to the bit, but written
// on a whole packet as one vector of lanes (the compilers' vector extension), and so are the
// loads and stores: 16-bit lanes widen into the high halves of 32-bit ones with
// __builtin_convertvector (one vpmovzxwd) and narrow back the same way (one vpmovdw). Eigen's
// cast of a packet converts one lane at a time, and so did a loop over the lanes or a round trip
// through an array, which the compiler turned into lane extracts: a bf16 fused kernel ran 3 to
// 7x slower than its f32 twin.
//
// Note [Rounding at the store]
// A value rounded to bf16 that only goes to a bf16 output (no later op reads it) is rounded by
// the store itself: with AVX512-BF16, one vcvtneps2bf16 rounds and narrows a packet (a packet
// holding a NaN or an f32 denormal, which that instruction treats otherwise, takes the bits
// above); without it, the same bits as rounding first. W8's bf16 GELU forward-and-gradient kernel
// took 0.47 ms where it took 0.65 (its f32 twin: 0.37).
constexpr bool kBf16Bits = std::is_same_v<T, float>;
typedef uint32_t LaneBits __attribute__((vector_size(W * 4)));
typedef uint16_t HalfBits __attribute__((vector_size(W * 2)));
// (Templates, so that only an f32 kernel, whose P has W * 4 bytes, instantiates them.)
template <class To, class From>
DUET_INLINE To bitcast(const From& x) {
  static_assert(sizeof(To) == sizeof(From));
  To y;
  __builtin_memcpy(&y, &x, sizeof(y));
  return y;
}
template <class Q>
DUET_INLINE Q round_bf16_bits(const Q& x) {
  const LaneBits b = bitcast<LaneBits>(x);
  const LaneBits r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  const LaneBits nan = (LaneBits)((b & 0x7FFFFFFFu) > 0x7F800000u);  // all ones where NaN
  const LaneBits q = (b & 0x80000000u) | 0x7FC00000u;
  return bitcast<Q>((nan & q) | (~nan & r));
}
// W dense bf16 values at p, widened (exact).
template <class Q>
DUET_INLINE Q load_bf16_bits(const void* p) {
  HalfBits h;
  __builtin_memcpy(&h, p, sizeof(h));
  return bitcast<Q>(__builtin_convertvector(h, LaneBits) << 16);
}
// W values already rounded to bf16, stored as their high halves (exact).
template <class Q>
DUET_INLINE void store_bf16_bits(void* p, const Q& x) {
  const HalfBits h = __builtin_convertvector(bitcast<LaneBits>(x) >> 16, HalfBits);
  __builtin_memcpy(p, &h, sizeof(h));
}

// Note [f16 with F16C]
// f16 lanes convert 8 at a time with the CPU's F16C instructions, and the lanes that hold a NaN
// again with Eigen's conversion, whose NaNs F16C does not give: Eigen's conversion to the bit,
// as the kernels' rows convert (Note [f16 rows with F16C] in kernels/low_precision.h), where
// Eigen's cast of a packet converts one lane at a time (an f16 fused kernel ran 30x slower
// than its bf16 twin).
#if defined(__F16C__)
constexpr bool kF16C = std::is_same_v<T, float> && W % 8 == 0;
#else
constexpr bool kF16C = false;
#endif
#if defined(__AVX512F__) && defined(DUET_T_F32)
constexpr bool kF16C512 = std::is_same_v<T, float> && W == 16;  // P is __m512
#else
constexpr bool kF16C512 = false;
#endif
// W lanes of a rounded to f16 in h, and W f16 lanes of h widened into a.
DUET_INLINE void f16_from_lanes(const T* a, Eigen::half* h) {
#if defined(__F16C__)
  for (int l = 0; l < W; l += 8) {
    const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(a + l));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + l),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0))
      for (int k = 0; k < 8; ++k) h[l + k] = Eigen::half(a[l + k]);
  }
#endif
}
DUET_INLINE void f16_to_lanes(const Eigen::half* h, T* a) {
#if defined(__F16C__)
  for (int l = 0; l < W; l += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + l)));
    _mm256_storeu_ps(reinterpret_cast<float*>(a + l), v);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0))
      for (int k = 0; k < 8; ++k) a[l + k] = static_cast<T>(h[l + k]);
  }
#endif
}

// A packet with a NaN rounded to f16 by Eigen's conversion, lane by lane. Out of line and cold:
// inlined at each rounding op, it made a kernel's code several times larger to compile.
DUET_TAIL P round_f16_lanes(P x) {
  alignas(64) T a[W];
  ei::pstore(a, x);
  for (int l = 0; l < W; ++l) a[l] = static_cast<T>(Eigen::half(a[l]));
  return ei::pload<P>(a);
}

// An op whose result is f16 or bf16 (L) rounds it, as the eager kernel rounds what it stores
// (Note [Fused registers]): the interpreter's conversion, lane for lane.
template <class L>
DUET_INLINE P round_to(const P& x) {
  if constexpr (kBf16Bits && std::is_same_v<L, Eigen::bfloat16>) return round_bf16_bits(x);
  alignas(64) T a[W];
  ei::pstore(a, x);
  if constexpr (kF16C512 && std::is_same_v<L, Eigen::half>) {
#if defined(__AVX512F__) && defined(DUET_T_F32)
    // In registers: both conversions on the whole packet, Eigen's lanes where a NaN is.
    const __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (__builtin_expect(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) == 0, 1)) return r;
    return round_f16_lanes(x);
#endif
  } else if constexpr (kF16C && std::is_same_v<L, Eigen::half>) {
    alignas(64) Eigen::half h[W];
    f16_from_lanes(a, h);
    f16_to_lanes(h, a);
  } else {
    Eigen::Map<Eigen::Array<T, W, 1>> v(a);
    v = v.template cast<L>().template cast<T>();
  }
  return ei::pload<P>(a);
}

// W elements p[0], p[s], ... converted to T. A dense bf16 row widens by its bits, a dense f16
// one with F16C.
template <class S>
DUET_INLINE P load_lanes(const S* p, int64_t s) {
  alignas(64) T b[W];
  if constexpr (kF16C && std::is_same_v<S, Eigen::half>) {
    if (s == 1) {
#if defined(__AVX512F__) && defined(DUET_T_F32)
      if constexpr (kF16C512) {
        const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        if (__builtin_expect(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) == 0, 1)) return v;
      }
#endif
      f16_to_lanes(p, b);
      return ei::pload<P>(b);
    }
  }
  if constexpr (kBf16Bits && std::is_same_v<S, Eigen::bfloat16>) {
    if (s == 1) return load_bf16_bits<P>(p);
  }
  if constexpr (std::is_integral_v<S> && !std::is_same_v<S, bool> && sizeof(T) * W == sizeof(P)) {
    // A dense row of integers (an i64 arange compared in f32: Note [Integer equality in
    // registers] in trace/plan/fusion.cpp) converts as a vector (vcvtqq2ps), not lane by lane.
    typedef S Lanes __attribute__((vector_size(W * sizeof(S))));
    typedef T Wide __attribute__((vector_size(W * sizeof(T))));
    if (s == 1) {
      Lanes v;
      __builtin_memcpy(&v, p, sizeof(v));
      return bitcast<P>(__builtin_convertvector(v, Wide));
    }
  }
  for (int l = 0; l < W; ++l) b[l] = static_cast<T>(p[l * s]);
  return ei::pload<P>(b);
}

// Note [Generated layouts]
// Generated code runs a call only when every input of dtype T is contiguous along the row or a
// broadcast (FusedKernel::run checks, and gives other calls to the interpreter): its loads of T
// are then one ploadu each. An input of another dtype converts lane by lane.
//
// Note [Generated tails]
// Each kernel's body is compiled once: the loop drivers below call it only on whole packets,
// from one function per iteration mode that is not inlined. The last, partial packet of a row
// runs that same function on a padded copy of the row's cursors: its inputs copied into W-lane
// buffers (zero past the row's end), its outputs written to buffers and copied out, and only
// the row's lanes of a reduction folded. A second, tail copy of the body cost more to compile
// than the body itself.

// Input k along one row: element j is p[j * s]. A broadcast (s == 0) is converted once per row.
template <class S>
struct Input {
  static constexpr bool kSame = std::is_same_v<S, T>;
  alignas(64) T c[W];
  const S* p;
  const T* q;  // packets of T load from q + j * s: p, or c for a broadcast
  int64_t s;
  DUET_INLINE void row(const DuetFusedArgs* a, int k, int64_t i) {
    p = static_cast<const S*>(a->in[k]) + i * a->in_so[k];
    s = a->in_si[k];
    if (s == 0) std::fill(c, c + W, static_cast<T>(*p));
    if constexpr (kSame) q = s == 0 ? c : reinterpret_cast<const T*>(p);
  }
  DUET_INLINE P load(int64_t j) const {
    if constexpr (kSame) {
      return ei::ploadu<P>(q + j * s);
    } else {
      if (s == 0) return ei::pload<P>(c);
      return load_lanes(p + j * s, s);
    }
  }
  // The n < W values of `from` at j onwards, as a contiguous row in buf (zero past n). Out of
  // line and cold: one copy per dtype, not one per input, and not vectorized (cheap to build).
  DUET_TAIL void pad(const Input& from, int64_t j, int n, void* buf) {
    *this = from;
    if (from.s == 0) {
      if constexpr (kSame) q = c;
      return;
    }
    S* b = static_cast<S*>(buf);
    for (int l = 0; l < W; ++l) b[l] = l < n ? from.p[(j + l) * from.s] : S(0);
    p = b;
    s = 1;
    if constexpr (kSame) q = b;
  }
};

// Output k (dense) along one row, stored as T or as b8 (x != 0).
template <class S>
struct Output {
  S* p;
  DUET_INLINE void row(const DuetFusedArgs* a, int k, int64_t i) {
    p = static_cast<S*>(a->out[k]) + i * a->inner;
  }
  DUET_INLINE void put(int64_t j, const P& x) const {
    if constexpr (std::is_same_v<S, T>) {
      ei::pstoreu(p + j, x);
    } else if constexpr (std::is_same_v<S, bool>) {
      alignas(64) T b[W];
      ei::pstore(b, x);
      for (int l = 0; l < W; ++l) p[j + l] = b[l] != T(0);
    } else if constexpr (kBf16Bits && std::is_same_v<S, Eigen::bfloat16>) {
      // Exact: the value was rounded when it was computed, so its high half is the bf16.
      store_bf16_bits(p + j, x);
    } else if constexpr (kF16C && std::is_same_v<S, Eigen::half>) {  // exact, as below
#if defined(__AVX512F__) && defined(DUET_T_F32)
      if constexpr (kF16C512) {
        if (__builtin_expect(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) == 0, 1)) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j),
                              _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
          return;
        }
      }
#endif
      alignas(64) T b[W];
      ei::pstore(b, x);
      f16_from_lanes(b, p + j);
    } else {  // f16: exact, the value was rounded when it was computed
      alignas(64) T b[W];
      ei::pstore(b, x);
      for (int l = 0; l < W; ++l) p[j + l] = static_cast<S>(b[l]);
    }
  }
  // x rounded to bf16 and stored, for a value only stored (Note [Rounding at the store]).
  DUET_INLINE void put_rounded(int64_t j, const P& x) const {
    static_assert(kBf16Bits && std::is_same_v<S, Eigen::bfloat16>);
#if defined(__AVX512BF16__) && defined(DUET_T_F32)
    if constexpr (W == 16) {
      if (__builtin_expect(_mm512_fpclass_ps_mask(x, 0x01 | 0x20 | 0x80) == 0, 1)) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(x));
        return;
      }
    }
#endif
    store_bf16_bits(p + j, round_bf16_bits(x));
  }
  DUET_INLINE void pad(void* buf) { p = static_cast<S*>(buf); }
  DUET_TAIL void unpad(const Output& to, int64_t j, int n) const {
    for (int l = 0; l < n; ++l) to.p[j + l] = p[l];
  }
};

// A padded row's buffers: one W-lane buffer per input and output, of their widest dtype.
template <class B>
struct Pad {
  alignas(64) unsigned char buf[B::kBufs][W * 8];
};

struct RedSum {
  static T identity() { return T(0); }
  static DUET_INLINE P packet(const P& a, const P& b) { return duet::fn::Add{}.packet(a, b); }
  static T scalar(T a, T b) { return duet::fn::Add{}(a, b); }
};
struct RedMax {
  static T identity() { return -std::numeric_limits<T>::infinity(); }
  static DUET_INLINE P packet(const P& a, const P& b) { return duet::fn::Maximum{}.packet(a, b); }
  static T scalar(T a, T b) { return duet::fn::Maximum{}(a, b); }
};
struct RedMin {
  static T identity() { return std::numeric_limits<T>::infinity(); }
  static DUET_INLINE P packet(const P& a, const P& b) { return duet::fn::Minimum{}.packet(a, b); }
  static T scalar(T a, T b) { return duet::fn::Minimum{}(a, b); }
};

#define DUET_BODY_ONCE __attribute__((noinline))

// Elementwise: [begin, end) are flat elements; a range may cross rows.
template <class B>
DUET_BODY_ONCE void packets_none(B& b, int64_t j, int64_t e) {
  for (; j < e; j += W) b.step(j);
}
template <class B>
void run_none(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  const int64_t inner = a->inner;
  if (inner <= 0) return;
  B b;
  Pad<B> pad;
  int64_t i = begin / inner, j = begin % inner;
  while (begin < end) {
    const int64_t e = std::min(inner, j + (end - begin));
    b.row(a, i);
    begin += e - j;
    const int64_t full = j + (e - j) / W * W;
    packets_none(b, j, full);
    if (full < e) {
      const int n = static_cast<int>(e - full);
      B t;
      t.pad(b, full, n, pad.buf);
      packets_none(t, 0, W);
      t.unpad(b, full, n);
    }
    ++i;
    j = 0;
  }
}

// Inner reduction: [begin, end) are rows, each folded into red_out[i]: the row's packets in a
// cascade, its lanes as a tree (Note [Cascade sums] in duet_functors.h).
//
// Note [One body per reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cascade_packets folds a block's packets into four accumulators, then the rest into the first.
// Inlined there, the body appears five times (four unrolled, one for the rest): a body of twenty
// ops with transcendentals took the compiler 5 to 7 s. A body of more than kOneBodyOps ops
// (B::kOneBody) appears once: each packet goes to a0, and while whole groups of four remain the
// accumulators rotate, so packet k of a group still meets accumulator k and the rest meet a0:
// the same sums in the same order. One such kernel of 22 ops compiled in 2.5 s instead of 7.
// Smaller bodies keep the unrolled loop, which ran faster on short rows: rows of 64 f32 took
// 2.2 ms unrolled against 3.4 ms once for a body of 18 ops (the rows of 2^20 values, one
// thread, the best of 300), though 3.9 against 2.5 ms for one of 8; rows of 4,096 were within
// a few percent either way.
template <class B, class R>
DUET_BODY_ONCE P packets_inner(B& b, int64_t n) {
  if constexpr (!B::kOneBody) {
    return duet::fn::cascade_packets<P, R>(
        [&b](int64_t j) __attribute__((always_inline)) { return b.step(j); }, n);
  } else {
    using duet::fn::kCascadeBlock;
    const P id = ei::pset1<P>(R::identity());
    duet::fn::Cascade<P, duet::fn::PacketOf<R>> c;
    for (int64_t j = 0; j < n;) {
      const int64_t e = n - j < kCascadeBlock * W ? n : j + kCascadeBlock * W;
      const int64_t e4 = j + (e - j) / (4 * W) * (4 * W);
      P a0 = id, a1 = id, a2 = id, a3 = id;
      for (; j < e; j += W) {
        a0 = R::packet(a0, b.step(j));
        if (j < e4) {
          const P t = a0;
          a0 = a1;
          a1 = a2;
          a2 = a3;
          a3 = t;
        }
      }
      c.push(R::packet(R::packet(a0, a1), R::packet(a2, a3)));
    }
    return c.total(id);
  }
}
template <class B, class R>
void run_inner(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  const int64_t n = a->inner, full = n / W * W;
  RedT* red = static_cast<RedT*>(a->red_out);
  B b;
  Pad<B> pad;
  alignas(64) T buf[W];
  for (int64_t i = begin; i < end; ++i) {
    b.row(a, i);
    T r = duet::fn::fold_lanes<R>(packets_inner<B, R>(b, full));
    if (full < n) {
      const int m = static_cast<int>(n - full);
      B t;
      t.pad(b, full, m, pad.buf);
      ei::pstore(buf, packets_inner<B, R>(t, W));
      t.unpad(b, full, m);
      for (int l = 0; l < m; ++l) r = R::scalar(r, buf[l]);
    }
    red[i] = static_cast<RedT>(r);  // (rounded once, where RedT is f16 or bf16)
  }
}

// Outer reduction: [begin, end) are columns, each folded over the rows into red_out[j]. The
// rows stream through a block of columns whose accumulators (a ColumnCascade) stay in L1.
template <class B, class R>
DUET_BODY_ONCE void packets_outer(B& b, T* acc, int64_t j0, int64_t width) {
  for (int64_t q = 0; q < width; q += W)
    ei::pstore(acc + q, R::packet(ei::pload<P>(acc + q), b.step(j0 + q)));
}
template <class B, class R>
void run_outer(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  constexpr int64_t kCols = 8192 / sizeof(T);
  const int64_t outer = a->outer;
  RedT* red = static_cast<RedT*>(a->red_out);
  B b;
  Pad<B> pad;
  for (int64_t j0 = begin; j0 < end; j0 += kCols) {
    const int64_t width = std::min(end - j0, kCols), full = width / W * W;
    duet::fn::ColumnCascade<T, R, kCols> acc(width);
    for (int64_t i = 0; i < outer; ++i) {
      b.row(a, i);
      packets_outer<B, R>(b, acc.row(), j0, full);
      if (full < width) {
        const int m = static_cast<int>(width - full);
        B t;
        t.pad(b, j0 + full, m, pad.buf);
        packets_outer<B, R>(t, acc.row() + full, 0, W);
        t.unpad(b, j0 + full, m);
      }
      acc.next();
    }
    if constexpr (std::is_same_v<RedT, T>) {
      acc.finish(red + j0, width);
    } else {  // finished in T, then rounded once
      alignas(64) T wide[kCols];
      acc.finish(wide, width);
      for (int64_t q = 0; q < width; ++q) red[j0 + q] = static_cast<RedT>(wide[q]);
    }
  }
}
)duet_src";

// The C++ type of a dtype in generated CPU code: jit::c_type's, and Eigen's for f16 and bf16.
const char* cpu_type(DType d) {
  if (d == DType::f16) return "Eigen::half";
  if (d == DType::bf16) return "Eigen::bfloat16";
  return kernels::jit::c_type(d);
}

std::string reg_list(const FusedInstr& in, int arity) {
  std::string s;
  for (int k = 0; k < arity; ++k) s += fmt::format("{}r{}", k ? ", " : "", in.src[k]);
  return s;
}

// For each instruction, whether its result is rounded to bf16 by the stores rather than by itself
// (Note [Rounding at the store]): no later instruction or the reduction reads it, and each output
// that stores it is bf16.
std::vector<bool> rounded_at_store(const FusedProgram& p) {
  std::vector<int> writer(p.num_regs, -1);  // instruction holding each register, -1: an input
  std::vector<bool> read(p.code.size(), false), stored(p.code.size(), false),
      other(p.code.size(), false);
  auto use = [&](int r) {
    if (r >= 0 && r < p.num_regs && writer[r] >= 0) read[writer[r]] = true;
  };
  for (size_t n = 0; n < p.code.size(); ++n) {
    const FusedInstr& in = p.code[n];
    const int arity = in.op == OpId::Cast || in.op == OpId::Copy ? 1 : op_arity(in.op);
    for (int k = 0; k < arity; ++k) use(in.src[k]);
    writer[in.dst] = static_cast<int>(n);
  }
  if (p.reduce != FusedReduce::None) use(p.reduce_src);
  for (size_t k = 0; k < p.outputs.size(); ++k) {
    const int w = writer[p.outputs[k]];
    if (w < 0) continue;
    (p.out_dtypes[k] == DType::bf16 ? stored : other)[w] = true;
  }
  std::vector<bool> out(p.code.size(), false);
  for (size_t n = 0; n < p.code.size(); ++n)
    out[n] = p.dtype == DType::f32 && p.code[n].round == DType::bf16 && stored[n] && !read[n] &&
             !other[n];
  return out;
}

// The ops of a body's code: one DUET_KEEP each (renames have none).
int body_ops(const std::string& code) {
  int n = 0;
  for (size_t at = code.find("DUET_KEEP("); at != std::string::npos;
       at = code.find("DUET_KEEP(", at + 1))
    ++n;
  return n;
}

}  // namespace

const char* fused_source_includes() { return kPreludeHead; }

std::string generate_fused_source(const FusedProgram& p) {
  check_generatable(p, "codegen");
  const int nin = p.num_inputs(), nout = static_cast<int>(p.outputs.size());
  const char* T = kernels::jit::c_type(p.dtype);

  // Registers are renamed to SSA values: x<k> for input k, t<n> for instruction n. Cast and
  // Copy to T only rename. Inputs nobody reads are not loaded.
  struct Value {
    std::string name;
    int input = -1;
    bool round_at_store = false;  // its rounding left to the stores (rounded_at_store)
  };
  std::vector<Value> reg(p.num_regs);
  std::vector<bool> used(nin, false);
  auto read = [&](int r) -> const std::string& {
    DUET_ASSERT(r >= 0 && r < p.num_regs && !reg[r].name.empty(),
                "[codegen] r{} read before written", r);
    if (reg[r].input >= 0) used[reg[r].input] = true;
    return reg[r].name;
  };
  for (int k = 0; k < nin; ++k) reg[k] = {fmt::format("x{}", k), k};

  std::string header = fmt::format(
      "// duet: generated fused kernel (kernels/codegen/cpu.cpp), T = {}\n", dtype_name(p.dtype));
  for (int k = 0; k < nin; ++k)
    header += fmt::format("//   r{} = input {} ({})\n", k, k, dtype_name(p.in_dtypes[k]));
  const std::vector<bool> at_store = rounded_at_store(p);
  std::string code;
  for (size_t n = 0; n < p.code.size(); ++n) {
    const FusedInstr& in = p.code[n];
    DUET_ASSERT(in.dst >= 0 && in.dst < p.num_regs, "[codegen] bad destination r{}", in.dst);
    std::string expr, text;
    if (in.op == OpId::Cast) {
      DUET_CHECK_T(in.to == p.dtype || in.to == DType::b8, DTypeError,
                   "[codegen] a fused cast converts to T or b8, not {}", dtype_name(in.to));
      expr = in.to == DType::b8 ? fmt::format("to_b8({})", read(in.src[0])) : read(in.src[0]);
      text = fmt::format("r{} = cast(r{}, {})", in.dst, in.src[0], dtype_name(in.to));
    } else {
      const char* pattern = op_expr(in.op);
      DUET_CHECK_T(pattern != nullptr, ValueError, "[codegen] op {} does not fuse", op_name(in.op));
      const int arity = op_arity(in.op);
      std::string a[3];
      for (int k = 0; k < arity; ++k) a[k] = read(in.src[k]);
      expr = fmt::format(fmt::runtime(pattern), a[0], a[1], a[2]);
      text = fmt::format("r{} = {}({})", in.dst, op_name(in.op), reg_list(in, arity));
    }
    const bool rounds = in.round != DType::f32;
    if (rounds) {
      DUET_CHECK_T(p.dtype == DType::f32 && is_low_precision(in.round), DTypeError,
                   "[codegen] an f32 program rounds to f16 or bf16, not {} in {}",
                   dtype_name(in.round), dtype_name(p.dtype));
      if (!at_store[n]) expr = fmt::format("round_to<{}>({})", cpu_type(in.round), expr);
      text += fmt::format(", rounded to {}{}", dtype_name(in.round),
                          at_store[n] ? " (by the store)" : "");
    }
    header += "//   " + text + "\n";
    if (!rounds && (in.op == OpId::Copy || (in.op == OpId::Cast && in.to != DType::b8))) {
      reg[in.dst] = reg[in.src[0]];  // a rename
      continue;
    }
    reg[in.dst] = {fmt::format("t{}", n), -1, at_store[n]};
    code += fmt::format("    P t{} = {};  // {}\n    DUET_KEEP(t{});\n", n, expr, text, n);
  }
  std::string stores;
  for (int k = 0; k < nout; ++k) {
    DUET_ASSERT(p.out_dtypes[k] == p.dtype || p.out_dtypes[k] == DType::b8 ||
                (p.dtype == DType::f32 && is_low_precision(p.out_dtypes[k])));
    const std::string& v = read(p.outputs[k]);
    stores += fmt::format("    out{}.{}(j, {});\n", k,
                          reg[p.outputs[k]].round_at_store ? "put_rounded" : "put", v);
    header +=
        fmt::format("//   output {} = r{} ({})\n", k, p.outputs[k], dtype_name(p.out_dtypes[k]));
  }
  std::string result = "ei::pzero(P())";
  const char* reducer = nullptr;
  if (p.reduce != FusedReduce::None) {
    reducer = p.reduce_op == OpId::Sum   ? "RedSum"
              : p.reduce_op == OpId::Max ? "RedMax"
              : p.reduce_op == OpId::Min ? "RedMin"
                                         : nullptr;
    DUET_CHECK_T(reducer != nullptr, ValueError, "[codegen] {} is not a fused reduction",
                 op_name(p.reduce_op));
    result = read(p.reduce_src);
    header += fmt::format(
        "//   {} over the {} dims of r{}{}\n", op_name(p.reduce_op),
        p.reduce == FusedReduce::Inner ? "inner" : "outer", p.reduce_src,
        p.red_round != DType::f32 ? fmt::format(", rounded to {}", dtype_name(p.red_round)) : "");
  }

  const char* red_t = "T";
  if (p.red_round != DType::f32) {
    DUET_CHECK_T(p.dtype == DType::f32 && is_low_precision(p.red_round), DTypeError,
                 "[codegen] an f32 program rounds its reduction to f16 or bf16, not {} in {}",
                 dtype_name(p.red_round), dtype_name(p.dtype));
    red_t = cpu_type(p.red_round);
  }
  std::string s =
      header + kPreludeHead +
      fmt::format("\nnamespace {{\nusing T = {};\nusing RedT = {};\n}}\n{}", T, red_t,
                  p.dtype == DType::f32 ? "#define DUET_T_F32 1  // P is float's packet\n" : "");
  s += kPreludeBody;
  s += "\nstruct Body {\n";
  std::string row, pad, unpad;
  int bufs = 0;
  for (int k = 0; k < nin; ++k) {
    if (!used[k]) continue;
    const char* S = cpu_type(p.in_dtypes[k]);
    DUET_CHECK_T(S != nullptr, DTypeError,
                 "[codegen] input {} has dtype {}, not computed on the CPU", k,
                 dtype_name(p.in_dtypes[k]));
    s += fmt::format("  Input<{}> in{};\n", S, k);
    row += fmt::format("    in{}.row(a, {}, i);\n", k, k);
    pad += fmt::format("    in{}.pad(b.in{}, j, n, buf[{}]);\n", k, k, bufs++);
  }
  for (int k = 0; k < nout; ++k) {
    const DType od = p.out_dtypes[k];
    s += fmt::format("  Output<{}> out{};\n",
                     od == DType::b8        ? "bool"
                     : is_low_precision(od) ? cpu_type(od)
                                            : "T",
                     k);
    row += fmt::format("    out{}.row(a, {}, i);\n", k, k);
    pad += fmt::format("    out{}.pad(buf[{}]);\n", k, bufs++);
    unpad += fmt::format("    out{}.unpad(b.out{}, j, n);\n", k, k);
  }
  s += fmt::format(
      "  static constexpr int kBufs = {};\n"
      "  static constexpr bool kOneBody = {};  // Note [One body per reduction]\n",
      std::max(bufs, 1), body_ops(code) > kOneBodyOps);
  s += fmt::format("  DUET_INLINE void row(const DuetFusedArgs* a, int64_t i) {{\n{}  }}\n", row);
  s += fmt::format(
      "  DUET_INLINE void pad(const Body& b, int64_t j, int n, unsigned char (*buf)[W * 8]) "
      "{{\n{}  }}\n",
      pad);
  s += fmt::format("  DUET_INLINE void unpad(const Body& b, int64_t j, int n) const {{\n{}  }}\n",
                   unpad);
  s += "  DUET_INLINE P step(int64_t j) {\n";
  for (int k = 0; k < nin; ++k)
    if (used[k]) s += fmt::format("    const P x{} = in{}.load(j);\n", k, k);
  s += code + stores + fmt::format("    return {};\n  }}\n}};\n}}  // namespace\n\n", result);

  const std::string run = p.reduce == FusedReduce::None ? "run_none<Body>"
                          : p.reduce == FusedReduce::Inner
                              ? fmt::format("run_inner<Body, {}>", reducer)
                              : fmt::format("run_outer<Body, {}>", reducer);
  s += "extern \"C\" __attribute__((visibility(\"default\"))) void duet_fused(\n"
       "    const DuetFusedArgs* a, int64_t begin, int64_t end) {\n";
  s += fmt::format("  {}(a, begin, end);\n}}\n", run);
  return s;
}

}  // namespace duet::detail
