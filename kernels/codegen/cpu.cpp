// The CPU code generator: a fused program (kernels/fused.h) as C++ over Eigen packets, computing
// what the interpreter computes (kernels/fused.cpp) bit for bit. Its twin for CUDA is
// kernels/codegen/cuda.cpp; both read each op from one expression table (kernels/codegen/exprs.h).
// trace/codegen.cpp builds, caches and loads what this writes.
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

// n <= W elements p[0], p[s], ... converted to T; the lanes past n are 0.
template <class S>
DUET_INLINE P load_lanes(const S* p, int64_t s, int n) {
  alignas(64) T b[W] = {};
  for (int l = 0; l < n; ++l) b[l] = static_cast<T>(p[l * s]);
  return ei::pload<P>(b);
}

// Input k along one row: element j is p[j * s]. A broadcast (s == 0) is converted once per row.
template <class S>
struct Input {
  static constexpr bool kSame = std::is_same_v<S, T>;
  alignas(64) T c[W];
  const S* p;
  const T* q;  // packets of T load from q + j * s: p, or c for a broadcast
  int64_t s;
  // Whether the fast loop may load it with ploadu: T values, contiguous or broadcast.
  static bool fast(const DuetFusedArgs* a, int k) {
    return !kSame || a->in_si[k] == 0 || a->in_si[k] == 1;
  }
  DUET_INLINE void row(const DuetFusedArgs* a, int k, int64_t i) {
    p = static_cast<const S*>(a->in[k]) + i * a->in_so[k];
    s = a->in_si[k];
    if (s == 0) std::fill(c, c + W, static_cast<T>(*p));
    if constexpr (kSame) q = s == 0 ? c : reinterpret_cast<const T*>(p);
  }
  template <bool Fast, bool Tail>
  DUET_INLINE P load(int64_t j, int n) const {
    if constexpr (Tail) {
      return s == 0 ? ei::pload<P>(c) : load_lanes(p + j * s, s, n);
    } else if constexpr (kSame) {
      if (Fast || s == 0 || s == 1) return ei::ploadu<P>(q + j * s);
      return load_lanes(p + j * s, s, W);
    } else {
      if (s == 0) return ei::pload<P>(c);
      if (s == 1) return load_lanes(p + j, 1, W);
      return load_lanes(p + j * s, s, W);
    }
  }
};

// Output k (dense) along one row, stored as T or as b8 (x != 0).
template <class S>
struct Output {
  S* p;
  DUET_INLINE void row(const DuetFusedArgs* a, int k, int64_t i) {
    p = static_cast<S*>(a->out[k]) + i * a->inner;
  }
  template <bool Tail>
  DUET_INLINE void put(int64_t j, const P& x, int n) const {
    if constexpr (std::is_same_v<S, T> && !Tail) {
      ei::pstoreu(p + j, x);
    } else {
      alignas(64) T b[W];
      ei::pstore(b, x);
      for (int l = 0; l < n; ++l) {
        if constexpr (std::is_same_v<S, bool>)
          p[j + l] = b[l] != T(0);
        else
          p[j + l] = b[l];
      }
    }
  }
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

// Elementwise: [begin, end) are flat elements; a range may cross rows.
template <class B, bool Fast>
void run_none(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  const int64_t inner = a->inner;
  if (inner <= 0) return;
  B b;
  int64_t i = begin / inner, j = begin % inner;
  while (begin < end) {
    const int64_t e = std::min(inner, j + (end - begin));
    b.row(a, i);
    begin += e - j;
    for (; j + W <= e; j += W) b.template step<Fast, false>(j, W);
    if (j < e) b.template step<Fast, true>(j, static_cast<int>(e - j));
    ++i;
    j = 0;
  }
}

// Inner reduction: [begin, end) are rows, each folded into red_out[i].
template <class B, class R, bool Fast>
void run_inner(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  const int64_t n = a->inner;
  T* red = static_cast<T*>(a->red_out);
  B b;
  alignas(64) T buf[W];
  for (int64_t i = begin; i < end; ++i) {
    b.row(a, i);
    P acc0 = ei::pset1<P>(R::identity()), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t j = 0;
    for (; j + 4 * W <= n; j += 4 * W) {
      acc0 = R::packet(acc0, b.template step<Fast, false>(j, W));
      acc1 = R::packet(acc1, b.template step<Fast, false>(j + W, W));
      acc2 = R::packet(acc2, b.template step<Fast, false>(j + 2 * W, W));
      acc3 = R::packet(acc3, b.template step<Fast, false>(j + 3 * W, W));
    }
    for (; j + W <= n; j += W) acc0 = R::packet(acc0, b.template step<Fast, false>(j, W));
    ei::pstore(buf, R::packet(R::packet(acc0, acc1), R::packet(acc2, acc3)));
    T r = R::identity();
    for (int l = 0; l < W; ++l) r = R::scalar(r, buf[l]);
    if (j < n) {
      const int m = static_cast<int>(n - j);
      ei::pstore(buf, b.template step<Fast, true>(j, m));
      for (int l = 0; l < m; ++l) r = R::scalar(r, buf[l]);
    }
    red[i] = r;
  }
}

// Outer reduction: [begin, end) are columns, each folded over the rows into red_out[j]. The
// rows stream through a block of columns whose accumulators stay in L1.
template <class B, class R, bool Fast>
void run_outer(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  constexpr int64_t kCols = 8192 / sizeof(T);
  const int64_t outer = a->outer;
  T* red = static_cast<T*>(a->red_out);
  B b;
  alignas(64) T acc[kCols];
  for (int64_t j0 = begin; j0 < end; j0 += kCols) {
    const int64_t width = std::min(end - j0, kCols), full = width / W * W;
    std::fill(acc, acc + (width > full ? full + W : full), R::identity());
    for (int64_t i = 0; i < outer; ++i) {
      b.row(a, i);
      for (int64_t q = 0; q < full; q += W)
        ei::pstore(acc + q,
                   R::packet(ei::pload<P>(acc + q), b.template step<Fast, false>(j0 + q, W)));
      if (full < width) {
        const P v = b.template step<Fast, true>(j0 + full, static_cast<int>(width - full));
        ei::pstore(acc + full, R::packet(ei::pload<P>(acc + full), v));
      }
    }
    std::copy(acc, acc + width, red + j0);
  }
}
)duet_src";

std::string reg_list(const FusedInstr& in, int arity) {
  std::string s;
  for (int k = 0; k < arity; ++k) s += fmt::format("{}r{}", k ? ", " : "", in.src[k]);
  return s;
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
    header += "//   " + text + "\n";
    if (in.op == OpId::Copy || (in.op == OpId::Cast && in.to != DType::b8)) {  // a rename
      reg[in.dst] = reg[in.src[0]];
      continue;
    }
    reg[in.dst] = {fmt::format("t{}", n)};
    code += fmt::format("    P t{} = {};  // {}\n    DUET_KEEP(t{});\n", n, expr, text, n);
  }
  std::string stores;
  for (int k = 0; k < nout; ++k) {
    DUET_ASSERT(p.out_dtypes[k] == p.dtype || p.out_dtypes[k] == DType::b8);
    stores += fmt::format("    out{}.template put<Tail>(j, {}, n);\n", k, read(p.outputs[k]));
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
    header += fmt::format("//   {} over the {} dims of r{}\n", op_name(p.reduce_op),
                          p.reduce == FusedReduce::Inner ? "inner" : "outer", p.reduce_src);
  }

  std::string s = header + kPreludeHead + fmt::format("\nnamespace {{\nusing T = {};\n}}\n", T);
  s += kPreludeBody;
  s += "\nstruct Body {\n";
  std::string fast, row;
  for (int k = 0; k < nin; ++k) {
    if (!used[k]) continue;
    const char* S = kernels::jit::c_type(p.in_dtypes[k]);
    DUET_CHECK_T(S != nullptr, DTypeError,
                 "[codegen] input {} has dtype {}, not computed on the CPU", k,
                 dtype_name(p.in_dtypes[k]));
    s += fmt::format("  Input<{}> in{};\n", S, k);
    fast += fmt::format("{}Input<{}>::fast(a, {})", fast.empty() ? "" : " && ", S, k);
    row += fmt::format("    in{}.row(a, {}, i);\n", k, k);
  }
  for (int k = 0; k < nout; ++k) {
    s += fmt::format("  Output<{}> out{};\n", p.out_dtypes[k] == DType::b8 ? "bool" : "T", k);
    row += fmt::format("    out{}.row(a, {}, i);\n", k, k);
  }
  s += fmt::format("  static bool fast(const DuetFusedArgs* a) {{ return {}; }}\n",
                   fast.empty() ? "true" : fast);
  s += fmt::format("  DUET_INLINE void row(const DuetFusedArgs* a, int64_t i) {{\n{}  }}\n", row);
  s += "  template <bool Fast, bool Tail>\n  DUET_INLINE P step(int64_t j, int n) {\n";
  for (int k = 0; k < nin; ++k)
    if (used[k])
      s += fmt::format("    const P x{} = in{}.template load<Fast, Tail>(j, n);\n", k, k);
  s += code + stores + fmt::format("    return {};\n  }}\n}};\n}}  // namespace\n\n", result);

  std::string run = p.reduce == FusedReduce::None ? "run_none<Body, {}>"
                    : p.reduce == FusedReduce::Inner
                        ? fmt::format("run_inner<Body, {}, {{}}>", reducer)
                        : fmt::format("run_outer<Body, {}, {{}}>", reducer);
  s += "extern \"C\" __attribute__((visibility(\"default\"))) void duet_fused(\n"
       "    const DuetFusedArgs* a, int64_t begin, int64_t end) {\n";
  s += fmt::format(
      "  if (Body::fast(a))\n    {}(a, begin, end);\n  else\n    {}(a, begin, end);\n}}\n",
      fmt::format(fmt::runtime(run), "true"), fmt::format(fmt::runtime(run), "false"));
  return s;
}

}  // namespace duet::detail
