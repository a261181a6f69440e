// The CUDA code generator: a fused program (kernels/fused.h) as one CUDA C++ kernel over the
// scalar functors (Note [Fused CUDA kernels] in cuda/fused.h), computing what the interpreter
// computes. Its twin for the CPU is kernels/codegen/cpu.cpp; both read each op from one
// expression table (kernels/codegen/exprs.h). cuda/fused.cpp compiles what this writes with NVRTC.
// Plain C++: it builds, and its output can be checked, without the CUDA toolkit.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/codegen/exprs.h"
#include "kernels/codegen/source.h"
#include "kernels/jit.h"

namespace duet::cuda::detail {
namespace {

using kernels::FusedInstr;
using kernels::FusedProgram;
using kernels::FusedReduce;

// The helpers of kernels/codegen/exprs.h over scalar T registers (b8 values are 1 or 0 in T;
// ordered comparisons of NaN give 0, != gives 1), as the interpreter computes them.
constexpr const char* kHelpers = R"duet_src(
template <class F>
__device__ __forceinline__ T apply1(T x) { return static_cast<T>(F{}(x)); }
template <class F>
__device__ __forceinline__ T apply2(T a, T b) { return static_cast<T>(F{}(a, b)); }
__device__ __forceinline__ T cmp_lt(T a, T b) { return a < b ? T(1) : T(0); }
__device__ __forceinline__ T cmp_le(T a, T b) { return a <= b ? T(1) : T(0); }
__device__ __forceinline__ T cmp_eq(T a, T b) { return a == b ? T(1) : T(0); }
__device__ __forceinline__ T cmp_ne(T a, T b) { return a != b ? T(1) : T(0); }
__device__ __forceinline__ T pwhere(T c, T a, T b) { return c != T(0) ? a : b; }
// Add, Sub and Mul round to nearest through intrinsics that are never contracted into a fused
// multiply-add: a * b + c of two ops rounds twice, as the two eager kernels do. Inside a functor
// the compiler contracts as nvcc does for the eager kernels (both with FMA contraction on).
__device__ __forceinline__ float rn_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double rn_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float rn_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double rn_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float rn_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rn_mul(double a, double b) { return __dmul_rn(a, b); }
template <>
__device__ __forceinline__ T apply2<duet::fn::Add>(T a, T b) { return rn_add(a, b); }
template <>
__device__ __forceinline__ T apply2<duet::fn::Sub>(T a, T b) { return rn_sub(a, b); }
template <>
__device__ __forceinline__ T apply2<duet::fn::Mul>(T a, T b) { return rn_mul(a, b); }
)duet_src";

// The fixed part of every kernel; a program adds T, its tables, load_in/store_out, compute()
// and the reducer before it, and the block sizes (kernels/codegen/source.h): kBlockThreads, the
// largest block it is launched with, and an outer reduction's kOuterCols x kOuterRows at most.
constexpr const char* kKernels = R"duet_src(
// Block-wide fold of v (blockDim.x a multiple of 32); the result is valid in thread 0.
__device__ __forceinline__ T block_reduce(T v, T* sh) {
  for (int off = 16; off > 0; off >>= 1) v = Red::op(v, __shfl_down_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // sh may still be read for the previous row
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : Red::id();
    for (int off = 16; off > 0; off >>= 1) v = Red::op(v, __shfl_down_sync(0xffffffffu, v, off));
  }
  return v;
}

// A thread's share of a fold: a sum adds in a cascade (Note [Cascade sums] in
// duet_functors.h), max and min in any order.
struct RedFn {
  __device__ __forceinline__ T operator()(T a, T b) const { return Red::op(a, b); }
};
struct ThreadFold {
  duet::fn::CascadeRun<T, RedFn> run;
  T acc;
  __device__ __forceinline__ ThreadFold() : run(Red::id()), acc(Red::id()) {}
  __device__ __forceinline__ void add(T v) {
    if (Red::kCascade)
      run.add(v);
    else
      acc = Red::op(acc, v);
  }
  __device__ __forceinline__ T total() const { return Red::kCascade ? run.total() : acc; }
};

struct alignas(16) Vec {
  T v[V];
};

// Element (i, j): loads its inputs, runs the program, stores its outputs at i * inner + j, and
// returns the value a reduction folds.
__device__ __forceinline__ T element(const DuetFusedArgs& a, int64_t i, int64_t j) {
  T x[NIA], y[NOA], r;
#pragma unroll
  for (int k = 0; k < NI; ++k) x[k] = load_in(a, k, i * a.in_so[k] + j * a.in_si[k]);
  compute(x, y, r);
#pragma unroll
  for (int o = 0; o < NO; ++o) store_out(a, o, i * a.inner + j, y[o]);
  return r;
}

// Outputs of V consecutive elements from e: 16-byte stores of T outputs (vec: rows a multiple of V
// long, outputs aligned), lane stores of the others.
template <class I>
__device__ __forceinline__ void store_vec(const DuetFusedArgs& a, const T (&y)[V][NOA], I e) {
#pragma unroll
  for (int o = 0; o < NO; ++o) {
    if (kOutT[o]) {
      Vec w;
#pragma unroll
      for (int l = 0; l < V; ++l) w.v[l] = y[l][o];
      *reinterpret_cast<Vec*>(static_cast<T*>(a.out[o]) + e) = w;
    } else {
#pragma unroll
      for (int l = 0; l < V; ++l) store_out(a, o, e + l, y[l][o]);
    }
  }
}

// V consecutive elements (i, j..j+V) of an elementwise program: an input whose bit in wmask is
// set is the constant whole[k]; one whose bit in vmask is set is read with one 16-byte load (its
// rows dense and aligned); a row broadcast once; any other lane by lane. Outputs are written
// with 16-byte stores (vec: rows a multiple of V long, outputs aligned).
__device__ __forceinline__ void vec_step(const DuetFusedArgs& a, unsigned vmask, unsigned wmask,
                                         const T* whole, int64_t i, int64_t j) {
  const int64_t e = i * a.inner + j;
  T x[V][NIA], y[V][NOA], r;
#pragma unroll
  for (int k = 0; k < NI; ++k) {
    if (kScalar[k] || (wmask >> k & 1u)) {
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = whole[k];
      continue;
    }
    const int64_t off = i * a.in_so[k] + j * a.in_si[k];
    if (a.in_si[k] == 0) {
      const T b = load_in(a, k, off);
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = b;
    } else if (kInT[k] && (vmask >> k & 1u)) {
      const Vec w = *reinterpret_cast<const Vec*>(static_cast<const T*>(a.in[k]) + off);
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = w.v[l];
    } else {
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = load_in(a, k, off + l * a.in_si[k]);
    }
  }
#pragma unroll
  for (int l = 0; l < V; ++l) compute(x[l], y[l], r);
  store_vec(a, y, e);
}

// The dense step (vec == 2): every input is whole (its bit in wmask) or dense at the output's
// own offsets, and every offset fits 32 bits. No per-input layout or index arithmetic: one
// 16-byte load per input of dtype T, lane loads for the others.
__device__ __forceinline__ void dense_step(const DuetFusedArgs& a, unsigned wmask, const T* whole,
                                           unsigned e) {
  T x[V][NIA], y[V][NOA], r;
#pragma unroll
  for (int k = 0; k < NI; ++k) {
    if (kScalar[k] || (wmask >> k & 1u)) {
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = whole[k];
    } else if (kInT[k]) {
      const Vec w = *reinterpret_cast<const Vec*>(static_cast<const T*>(a.in[k]) + e);
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = w.v[l];
    } else {
#pragma unroll
      for (int l = 0; l < V; ++l) x[l][k] = load_in(a, k, e + l);
    }
  }
#pragma unroll
  for (int l = 0; l < V; ++l) compute(x[l], y[l], r);
  store_vec(a, y, e);
}

// nsplit > 1 (reductions): each row's or column's reduced range in nsplit slices, each folded
// by a block of its own into a partial (red_out then points at nsplit partials per result, in
// the layout duet_fused_fold reads), so that a few long rows or columns still fill the device.
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    duet_fused(DuetFusedArgs a, unsigned vmask, int vec, int nsplit) {
#if DUET_REDUCE == 0
  const int64_t n = a.outer * a.inner;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    // An input constant over the whole space (a number, a Scalar) is loaded once, not per step.
    T whole[NIA];
    unsigned wmask = 0;
#pragma unroll
    for (int k = 0; k < NI; ++k)
      if (kScalar[k] || (a.in_si[k] == 0 && (a.outer == 1 || a.in_so[k] == 0))) {
        whole[k] = load_in(a, k, 0);
        wmask |= 1u << k;
      }
    if (vec == 2) {
      // Dense (fused_launch checked it): 32-bit offsets, n a multiple of V.
      const unsigned nv = static_cast<unsigned>(n) / V, st = gridDim.x * blockDim.x;
      for (unsigned q = static_cast<unsigned>(t); q < nv; q += st)
        dense_step(a, wmask, whole, q * V);
    } else {
      for (int64_t q = t; q * V < n; q += stride) {
        const int64_t e = q * V, i = a.outer == 1 ? 0 : e / a.inner;
        vec_step(a, vmask, wmask, whole, i, e - i * a.inner);
      }
    }
  } else {
    for (int64_t e = t; e < n; e += stride) {
      const int64_t i = a.outer == 1 ? 0 : e / a.inner;
      element(a, i, e - i * a.inner);
    }
  }
#elif DUET_REDUCE == 1
  // Block b folds slice b % nsplit of row b / nsplit: partial b.
  __shared__ T sh[32];
  const int64_t chunk = (a.inner + nsplit - 1) / nsplit;
  for (int64_t b = blockIdx.x; b < a.outer * nsplit; b += gridDim.x) {
    const int64_t i = b / nsplit, lo = (b % nsplit) * chunk;
    const int64_t hi = lo + chunk < a.inner ? lo + chunk : a.inner;
    ThreadFold f;
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) f.add(element(a, i, j));
    const T acc = block_reduce(f.total(), sh);
    if (threadIdx.x == 0) static_cast<T*>(a.red_out)[b] = acc;
  }
#else
  // Blocks of row blockIdx.y fold row slice blockIdx.y (of gridDim.y == nsplit): partial
  // blockIdx.y * inner + j of column j.
  __shared__ T sh[kOuterRows][kOuterCols + 1];
  const int64_t chunk = (a.outer + nsplit - 1) / nsplit, lo = int64_t(blockIdx.y) * chunk;
  const int64_t hi = lo + chunk < a.outer ? lo + chunk : a.outer;
  for (int64_t j0 = int64_t(blockIdx.x) * kOuterCols; j0 < a.inner;
       j0 += int64_t(gridDim.x) * kOuterCols) {
    const int64_t j = j0 + threadIdx.x;
    ThreadFold f;
    if (j < a.inner) {
      for (int64_t i = lo + threadIdx.y; i < hi; i += blockDim.y) f.add(element(a, i, j));
    }
    sh[threadIdx.y][threadIdx.x] = f.total();
    __syncthreads();
    if (threadIdx.y == 0 && j < a.inner) {
      T v = sh[0][threadIdx.x];
      for (unsigned y = 1; y < blockDim.y; ++y) v = Red::op(v, sh[y][threadIdx.x]);
      static_cast<T*>(a.red_out)[int64_t(blockIdx.y) * a.inner + j] = v;
    }
    __syncthreads();
  }
#endif
}

#if DUET_REDUCE != 0
// The second pass of a split reduction: result r folds its partials part[r * ps + c * pc] for c
// in [0, nsplit), in that order, so a sum does not depend on which block finished first.
extern "C" __global__ void __launch_bounds__(kFoldThreads)
    duet_fused_fold(const T* part, T* out, int64_t n, int nsplit, int64_t ps, int64_t pc) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
       r += int64_t(gridDim.x) * blockDim.x) {
    ThreadFold f;
    for (int c = 0; c < nsplit; ++c) f.add(part[r * ps + c * pc]);
    out[r] = f.total();
  }
}
#endif
)duet_src";

}  // namespace

std::string fused_source(const FusedProgram& p) {
  duet::detail::check_generatable(p, "fused");
  DUET_CHECK_T(!p.has_low_precision(), DTypeError,
               "[fused] the CUDA code generator does not take f16 or bf16 values yet");
  const int nin = p.num_inputs(), nout = static_cast<int>(p.outputs.size());
  std::string s = fmt::format(
      "// duet: generated fused CUDA kernel (kernels/codegen/cuda.cpp), T = {}\n"
      "#include \"duet_fused_abi.h\"\n#include \"duet_functors.h\"\n\n"
      "typedef {} T;\nusing duet::kernels::DuetFusedArgs;\n"
      "#define DUET_REDUCE {}\n"
      "constexpr int NI = {}, NO = {}, NIA = {}, NOA = {}, V = 16 / sizeof(T);\n"
      "constexpr int kBlockThreads = {}, kOuterCols = {}, kOuterRows = {}, kFoldThreads = {};\n",
      dtype_name(p.dtype), kernels::jit::c_type(p.dtype), static_cast<int>(p.reduce), nin, nout,
      std::max(nin, 1), std::max(nout, 1), fused_block_limit(p.reduce), kFusedOuterColumns,
      kFusedOuterRows, kFusedFoldBlock);
  s += kHelpers;
  std::string in_t, out_t;
  for (int k = 0; k < nin; ++k)
    in_t += fmt::format("{}{}", k ? ", " : "", p.in_dtypes[k] == p.dtype);
  for (int k = 0; k < nout; ++k)
    out_t += fmt::format("{}{}", k ? ", " : "", p.out_dtypes[k] == p.dtype);
  std::string scalar;
  for (int k = 0; k < nin; ++k)
    scalar += fmt::format("{}{}", k ? ", " : "", (p.scalar_inputs >> k & 1u) != 0);
  s += fmt::format(
      "constexpr bool kInT[NIA] = {{{}}};\nconstexpr bool kOutT[NOA] = {{{}}};\n"
      "constexpr bool kScalar[NIA] = {{{}}};\n",
      nin ? in_t : "false", nout ? out_t : "false", nin ? scalar : "false");
  // Loads convert to T; stores write T, or b8 as != 0.
  s += "__device__ __forceinline__ T load_in(const DuetFusedArgs& a, int k, int64_t off) {\n"
       "  switch (k) {\n";
  for (int k = 0; k < nin; ++k) {
    const char* ct = kernels::jit::c_type(p.in_dtypes[k]);
    DUET_CHECK_T(ct != nullptr, DTypeError, "[fused] cannot load an input of dtype {}",
                 dtype_name(p.in_dtypes[k]));
    s += fmt::format("    case {}: return static_cast<T>(static_cast<const {}*>(a.in[{}])[off]);\n",
                     k, ct, k);
  }
  s += "  }\n  return T(0);\n}\n";
  s += "__device__ __forceinline__ void store_out(const DuetFusedArgs& a, int o, int64_t e, T v) "
       "{\n  switch (o) {\n";
  for (int k = 0; k < nout; ++k) {
    DUET_ASSERT(p.out_dtypes[k] == p.dtype || p.out_dtypes[k] == DType::b8);
    if (p.out_dtypes[k] == DType::b8)
      s += fmt::format("    case {}: static_cast<bool*>(a.out[{}])[e] = v != T(0); break;\n", k, k);
    else
      s += fmt::format("    case {}: static_cast<T*>(a.out[{}])[e] = v; break;\n", k, k);
  }
  s += "  }\n}\n";

  // The program, with registers renamed to SSA values (Copy and Cast to T only rename).
  std::vector<std::string> reg(static_cast<size_t>(p.num_regs));
  for (int k = 0; k < nin; ++k) reg[k] = fmt::format("x[{}]", k);
  auto read = [&](int r) -> const std::string& {
    DUET_ASSERT(r >= 0 && r < p.num_regs && !reg[r].empty(), "[fused] r{} read before written", r);
    return reg[r];
  };
  std::string body;
  for (size_t n = 0; n < p.code.size(); ++n) {
    const FusedInstr& in = p.code[n];
    DUET_ASSERT(in.dst >= 0 && in.dst < p.num_regs, "[fused] bad destination r{}", in.dst);
    if (in.op == OpId::Copy || (in.op == OpId::Cast && in.to == p.dtype)) {
      reg[in.dst] = read(in.src[0]);
      continue;
    }
    std::string expr;
    if (in.op == OpId::Cast) {
      DUET_CHECK_T(in.to == DType::b8, DTypeError,
                   "[fused] a fused cast converts to T or b8, not {}", dtype_name(in.to));
      expr = fmt::format("({} != T(0) ? T(1) : T(0))", read(in.src[0]));
    } else {
      const char* pattern = duet::detail::op_expr(in.op);
      DUET_CHECK_T(pattern != nullptr, ValueError, "[fused] op {} does not fuse", op_name(in.op));
      std::string a[3];
      for (int k = 0; k < op_arity(in.op); ++k) a[k] = read(in.src[k]);
      expr = fmt::format(fmt::runtime(pattern), a[0], a[1], a[2]);
    }
    body += fmt::format("  const T t{} = static_cast<T>({});  // r{} = {}\n", n, expr, in.dst,
                        op_name(in.op));
    reg[in.dst] = fmt::format("t{}", n);
  }
  for (int k = 0; k < nout; ++k) body += fmt::format("  y[{}] = {};\n", k, read(p.outputs[k]));
  // Max and Min start from infinity: float's bits, as libcu++'s numeric_limits writes it under
  // NVRTC (its <cuda/std/limits> would cost a tenth of a second a build); it converts exactly.
  const char* red_op = "Add";
  const char* red_id = "T(0)";
  if (p.reduce != FusedReduce::None) {
    body += fmt::format("  r = {};\n", read(p.reduce_src));
    switch (p.reduce_op) {
      case OpId::Sum:
        break;
      case OpId::Max:
        red_op = "Maximum";
        red_id = "-T(__int_as_float(0x7f800000))";
        break;
      case OpId::Min:
        red_op = "Minimum";
        red_id = "T(__int_as_float(0x7f800000))";
        break;
      default:
        DUET_CHECK_T(false, ValueError, "[fused] {} is not a fused reduction",
                     op_name(p.reduce_op));
    }
  } else {
    body += "  r = T(0);\n";
  }
  s += "__device__ __forceinline__ void compute(const T* x, T* y, T& r) {\n" + body + "}\n";
  s += fmt::format(
      "struct Red {{\n"
      "  static __device__ __forceinline__ T op(T a, T b) {{ return apply2<duet::fn::{}>(a, b); "
      "}}\n"
      "  static __device__ __forceinline__ T id() {{ return {}; }}\n"
      "  static constexpr bool kCascade = {};\n}};\n",
      red_op, red_id, p.reduce == FusedReduce::None || p.reduce_op == OpId::Sum);
  s += kKernels;
  return s;
}

}  // namespace duet::cuda::detail
