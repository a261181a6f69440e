// The fused-kernel interpreter (kernels/fused.h): a register program run block by block over
// L1-sized blocks, each instruction one call of the eager kernels' dense row loops
// (kernels/loops.h) with the same packet functors.
#include "kernels/fused.h"

#include <cstring>
#include <limits>
#include <memory>

#include "kernels/functors.h"
#include "kernels/loops.h"
#include "kernels/low_precision.h"

namespace duet::kernels {
namespace {

// ---- one instruction over a block of n elements ----------------------------------------------

template <class T>
using BlockFn = void (*)(T* d, const T* a, const T* b, const T* c, int64_t n);

template <class F, class T>
void block_unary(T* d, const T* a, const T*, const T*, int64_t n) {
  unary_dense<T>(F{}, a, d, n);
}
template <class F, class T>
void block_binary(T* d, const T* a, const T* b, const T*, int64_t n) {
  binary_dense<T>(F{}, a, false, b, false, d, n);
}
template <class F, class T>
void block_compare(T* d, const T* a, const T* b, const T*, int64_t n) {
  const F f{};
  for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]) ? T(1) : T(0);
}
template <class T>
void block_where(T* d, const T* c, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = c[i] != T(0) ? a[i] : b[i];
}
template <class T>
void block_copy(T* d, const T* a, const T*, const T*, int64_t n) {
  if (d != a) std::memcpy(d, a, n * sizeof(T));
}
template <class T>
void block_to_bool(T* d, const T* a, const T*, const T*, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = a[i] != T(0) ? T(1) : T(0);
}

template <class T>
BlockFn<T> block_fn(const FusedInstr& in) {
  switch (in.op) {
#define DUET_UNARY(Name, name, math, doc) \
  case OpId::Name:                        \
    return block_unary<fn::Name, T>;
#define DUET_BINARY(Name, name, doc) \
  case OpId::Name:                   \
    return block_binary<fn::Name, T>;
#define DUET_COMPARE(Name, name, expr, doc) \
  case OpId::Name:                          \
    return block_compare<fn::Name, T>;
#include "core/elementwise.def"
    case OpId::Where:
      return block_where<T>;
    case OpId::Copy:
      return block_copy<T>;
    case OpId::Cast:
      return in.to == DType::b8 ? block_to_bool<T> : block_copy<T>;
    default:
      DUET_ASSERT(false, "[fused] op {} is not fusable", op_name(in.op));
  }
}

// ---- the interpreter --------------------------------------------------------------------------

constexpr int64_t kL1Bytes = 32 * 1024;
constexpr int64_t kMaxBlock = 16384;
constexpr int kMaxRegs = 256;
constexpr size_t kMaxInstrs = 256;

template <class T>
class Interp {
 public:
  Interp(const FusedProgram& p, const DuetFusedArgs& a) : p_(p), a_(a) {
    const int nin = p.num_inputs();
    DUET_ASSERT(p.num_regs <= kMaxRegs, "[fused] {} registers", p.num_regs);
    DUET_ASSERT(p.code.size() <= kMaxInstrs, "[fused] {} instructions", p.code.size());
    for (size_t i = 0; i < p.code.size(); ++i) fns_[i] = block_fn<T>(p.code[i]);
    // An input read in place: dtype T, dense along the whole space or a broadcast scalar.
    for (int k = 0; k < nin; ++k) {
      filled_[k] = false;
      const bool t = p.in_dtypes[k] == p.dtype;
      dense_[k] = t && a.in_si[k] == 1 && (a.in_so[k] == a.inner || a.outer == 1);
      scalar_[k] = a.in_si[k] == 0 && (a.in_so[k] == 0 || a.outer == 1);
    }
    // Outputs of dtype T are written straight into their buffer (Note [Interpreter outputs]).
    const int64_t n = a.outer * a.inner;
    std::fill(direct_, direct_ + p.num_regs, 0);
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      const int r = p.outputs[o];
      if (p.out_dtypes[o] != p.dtype || r < nin) continue;
      const char* ob = static_cast<const char*>(a.out[o]);
      const char* oe = ob + n * itemsize(p.out_dtypes[o]);
      bool ok = true;
      for (int k = 0; k < nin && ok; ++k) {
        const int64_t last = a.in_so[k] * (a.outer - 1) + a.in_si[k] * (a.inner - 1);
        const char* ib = static_cast<const char*>(a.in[k]);
        const char* ie = ib + (last + 1) * itemsize(p.in_dtypes[k]);
        if (!(ib < oe && ob < ie)) continue;
        ok = ib == ob && dense_[k] && last_read(k) <= first_write(r);
      }
      if (ok) direct_[r] = int(o) + 1;
    }
    // Note [Interpreter blocks]
    // Registers that are neither read in place (dense inputs) nor written in place (direct
    // outputs) share an L1-sized scratch, in blocks of B elements (B a multiple of 64). The fewer
    // such registers, the longer the block, up to kMaxBlock: a program of adds from dense inputs
    // into direct outputs runs each instruction once over a W6 weight (4096 values) instead of in
    // ten pieces, one call each.
    int scratch_regs = 0;
    for (int r = 0; r < p.num_regs; ++r) scratch_regs += own_needed(r) ? 1 : 0;
    block_ = std::clamp<int64_t>(kL1Bytes / (sizeof(T) * std::max(scratch_regs, 1)) / 64 * 64, 64,
                                 kMaxBlock);
    // One scratch per thread, kept between calls (a kernel call must not cost an allocation).
    static thread_local std::vector<T> scratch;
    const size_t need = static_cast<size_t>(block_) * (scratch_regs + 1) + 64;
    if (scratch.size() < need) scratch.resize(need);
    T* base = scratch.data();
    while (reinterpret_cast<uintptr_t>(base) % 64) ++base;
    int used = 0;
    for (int r = 0; r < p.num_regs; ++r) own_[r] = own_needed(r) ? base + block_ * used++ : nullptr;
  }

  void run(int64_t begin, int64_t end) {
    switch (p_.reduce) {
      case FusedReduce::None:
        for (int64_t s = begin; s < end; s += block_) block(s, std::min(block_, end - s));
        break;
      case FusedReduce::Inner:
        run_inner(begin, end);
        break;
      case FusedReduce::Outer:
        run_outer(begin, end);
        break;
    }
  }

 private:
  // Computes the program over flat elements [s, s + n) and stores the outputs; the registers
  // then hold the block's values (reg(r) points at them).
  void block(int64_t s, int64_t n) {
    const int nin = p_.num_inputs();
    for (int k = 0; k < nin; ++k) load(k, s, n);
    for (int r = nin; r < p_.num_regs; ++r)
      reg_[r] = direct_[r] ? static_cast<T*>(a_.out[direct_[r] - 1]) + s : own_[r];
    for (size_t i = 0; i < p_.code.size(); ++i) {
      const FusedInstr& in = p_.code[i];
      auto src = [&](int j) -> const T* { return in.src[j] >= 0 ? reg_[in.src[j]] : nullptr; };
      fns_[i](reg_[in.dst], src(0), src(1), src(2), n);
      if constexpr (std::is_same_v<T, float>)
        if (in.round != DType::f32) round_block(reg_[in.dst], n, in.round);
    }
    for (size_t o = 0; o < p_.outputs.size(); ++o) {
      const int r = p_.outputs[o];
      if (direct_[r]) continue;
      const T* v = reg_[r];
      if (p_.out_dtypes[o] == DType::b8) {
        bool* d = static_cast<bool*>(a_.out[o]) + s;
        for (int64_t i = 0; i < n; ++i) d[i] = v[i] != T(0);
      } else if (is_low_precision(p_.out_dtypes[o])) {  // exact: the register was rounded
        if constexpr (std::is_same_v<T, float>) store_low(v, p_.out_dtypes[o], a_.out[o], s, n);
      } else {
        std::memcpy(static_cast<T*>(a_.out[o]) + s, v, n * sizeof(T));
      }
    }
  }

  // Input k's values at flat elements [s, s + n), converted to T, in reg_[k].
  void load(int k, int64_t s, int64_t n) {
    const DType dt = p_.in_dtypes[k];
    if (dense_[k]) {
      reg_[k] = const_cast<T*>(static_cast<const T*>(a_.in[k])) + s;
      return;
    }
    T* d = own_[k];
    reg_[k] = d;
    if (scalar_[k]) {
      if (!filled_[k]) {
        const T v = read(dt, a_.in[k], 0);
        std::fill(d, d + block_, v);
        filled_[k] = true;
      }
      return;
    }
    const int64_t so = a_.in_so[k], si = a_.in_si[k], inner = a_.inner;
    int64_t i = s / inner, j = s % inner, done = 0;
    while (done < n) {
      const int64_t m = std::min(n - done, inner - j);
      const int64_t off = i * so + j * si;
      if (dt == p_.dtype && si == 1) {
        std::memcpy(d + done, static_cast<const T*>(a_.in[k]) + off, m * sizeof(T));
      } else if (std::is_same_v<T, float> && si == 1 && is_low_precision(dt)) {
        // Dense f16 and bf16 rows widen as the eager kernels' do (kernels/low_precision.h).
        widen_low_row(dt, static_cast<const uint16_t*>(a_.in[k]) + off,
                      reinterpret_cast<float*>(d + done), m);
      } else if (si == 0) {
        std::fill(d + done, d + done + m, read(dt, a_.in[k], off));
      } else {
        DUET_DISPATCH_WITH_LOW(dt, "fused", [&] {
          const scalar_t* x = static_cast<const scalar_t*>(a_.in[k]) + off;
          for (int64_t q = 0; q < m; ++q) d[done + q] = static_cast<T>(x[q * si]);
        });
      }
      done += m;
      j = 0;
      ++i;
    }
  }

  static T read(DType dt, const void* p, int64_t off) {
    return DUET_DISPATCH_WITH_LOW(
        dt, "fused", [&] { return static_cast<T>(static_cast<const scalar_t*>(p)[off]); });
  }

  // Rounds n values to f16 or bf16 in place (the values the eager kernel would store).
  // bf16 by its bits (Note [bf16 rows by their bits] in kernels/low_precision.h).
  // f16 with F16C (Note [f16 rows with F16C] there).
  static void round_block(float* v, int64_t n, DType d) {
    if (d == DType::bf16)
      round_bf16_in_place(v, n);
    else
      round_f16_in_place(v, n);
  }
  static void store_low(const float* v, DType d, void* out, int64_t s, int64_t n) {
    round_low(v, n, d, static_cast<uint16_t*>(out) + s);
  }

  T identity() const {
    if (p_.reduce_op == OpId::Sum) return T(0);
    return p_.reduce_op == OpId::Max ? -std::numeric_limits<T>::infinity()
                                     : std::numeric_limits<T>::infinity();
  }
  // A row (or a piece of one) folded; sums in a cascade (Note [Cascade sums]).
  T fold(const T* x, int64_t n) const {
    Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> v(x, n);
    switch (p_.reduce_op) {
      case OpId::Sum:
        return fn::cascade_sum(x, n);
      case OpId::Max:
        return v.template maxCoeff<Eigen::PropagateNaN>();
      default:
        return v.template minCoeff<Eigen::PropagateNaN>();
    }
  }
  T combine(T a, T b) const {
    switch (p_.reduce_op) {
      case OpId::Sum:
        return a + b;
      case OpId::Max:
        return fn::Maximum{}(a, b);
      default:
        return fn::Minimum{}(a, b);
    }
  }

  // Rows [begin, end): a block holds whole rows when they fit, else a row goes in pieces, whose
  // sums add in a cascade.
  // Stores reduced value i: as T, or rounded once to red_round.
  void put_reduced(int64_t i, T v) const {
    if (p_.red_round == DType::bf16)
      static_cast<bf16_t*>(a_.red_out)[i] = bf16_t(static_cast<float>(v));
    else if (p_.red_round == DType::f16)
      static_cast<f16_t*>(a_.red_out)[i] = f16_t(static_cast<float>(v));
    else
      static_cast<T*>(a_.red_out)[i] = v;
  }

  void run_inner(int64_t begin, int64_t end) {
    const int64_t inner = a_.inner;
    if (inner == 0) {
      for (int64_t i = begin; i < end; ++i) put_reduced(i, identity());
      return;
    }
    if (inner <= block_) {
      const int64_t rows = block_ / inner;
      for (int64_t i = begin; i < end; i += rows) {
        const int64_t r = std::min(rows, end - i);
        block(i * inner, r * inner);
        const T* v = reg_[p_.reduce_src];
        for (int64_t q = 0; q < r; ++q) put_reduced(i + q, fold(v + q * inner, inner));
      }
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      fn::Cascade<T, fn::ScalarOf<fn::SumOf<T>>> sum;
      T acc = identity();
      for (int64_t j = 0; j < inner; j += block_) {
        const int64_t m = std::min(block_, inner - j);
        block(i * inner + j, m);
        const T v = fold(reg_[p_.reduce_src], m);
        if (p_.reduce_op == OpId::Sum)
          sum.push(v);
        else
          acc = combine(acc, v);
      }
      put_reduced(i, p_.reduce_op == OpId::Sum ? sum.total(T(0)) : acc);
    }
  }

  // Columns [begin, end), in blocks of columns: every row adds its piece to the block's
  // accumulators, a ColumnCascade (Note [Cascade sums]).
  void run_outer(int64_t begin, int64_t end) {
    switch (p_.reduce_op) {
      case OpId::Sum:
        return run_outer_with<fn::SumOf<T>>(begin, end);
      case OpId::Max:
        return run_outer_with<Extremum<fn::Maximum, true>>(begin, end);
      default:
        return run_outer_with<Extremum<fn::Minimum, false>>(begin, end);
    }
  }
  template <class F, bool kMax>
  struct Extremum {
    static T identity() {
      return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    }
    template <class P>
    static P packet(const P& a, const P& b) {
      return F{}.packet(a, b);
    }
    static T scalar(T a, T b) { return F{}(a, b); }
  };
  template <class R>
  void run_outer_with(int64_t begin, int64_t end) {
    // Rows of up to 16 KiB, which the prefetchers stream; the accumulators are too large for a
    // worker's stack: one per thread, reused (trivially destructible).
    constexpr int64_t kCols = 16384 / sizeof(T);
    using Columns = fn::ColumnCascade<T, R, kCols>;
    static thread_local std::unique_ptr<Columns> columns;
    // A result rounded to red_round is finished in T first.
    alignas(64) static thread_local T wide[kCols];
    const bool direct = p_.red_round == DType::f32;
    const int64_t width = std::min(block_, kCols);
    for (int64_t j = begin; j < end; j += width) {
      const int64_t m = std::min(width, end - j);
      if (columns)
        std::construct_at(columns.get(), m);
      else
        columns = std::make_unique<Columns>(m);
      Columns& acc = *columns;
      for (int64_t i = 0; i < a_.outer; ++i) {
        block(i * a_.inner + j, m);
        acc.add(reg_[p_.reduce_src], m);
      }
      if (direct) {
        acc.finish(static_cast<T*>(a_.red_out) + j, m);
        continue;
      }
      acc.finish(wide, m);
      for (int64_t q = 0; q < m; ++q) put_reduced(j + q, wide[q]);
    }
  }

  // Note [Interpreter outputs]
  // An output of dtype T is written straight into its buffer as its instructions run, unless
  // the buffer overlaps an input (planned in place): then its values are stored after the
  // block's last read. An output that is exactly an input's buffer (an in-place update such as
  // SGD's p - lr * g into p) is still written straight there when no instruction reads that
  // input after the first one that writes the output: each instruction reads element i before
  // it writes element i, so the values read are the input's.
  int first_write(int r) const {
    for (size_t i = 0; i < p_.code.size(); ++i)
      if (p_.code[i].dst == r) return static_cast<int>(i);
    return static_cast<int>(p_.code.size());
  }
  int last_read(int k) const {
    int last = -1;
    for (size_t i = 0; i < p_.code.size(); ++i)
      for (int16_t src : p_.code[i].src)
        if (src == k) last = static_cast<int>(i);
    if (p_.reduce != FusedReduce::None && p_.reduce_src == k)
      last = static_cast<int>(p_.code.size());
    return last;
  }

  // Whether register r needs scratch: an input not read in place, or a value not written
  // straight into an output.
  bool own_needed(int r) const { return r < p_.num_inputs() ? !dense_[r] : !direct_[r]; }

  const FusedProgram& p_;
  const DuetFusedArgs& a_;
  int64_t block_ = 0;
  // Sized for the largest program, and set up to the program's own sizes only: a call over a
  // small tensor must not pay for clearing them whole.
  BlockFn<T> fns_[kMaxInstrs];
  T* own_[kMaxRegs];
  T* reg_[kMaxRegs];
  int direct_[kMaxRegs];  ///< register -> output index + 1 when written straight there
  bool dense_[DUET_FUSED_MAX_INPUTS];
  bool scalar_[DUET_FUSED_MAX_INPUTS];
  bool filled_[DUET_FUSED_MAX_INPUTS];
};

}  // namespace

bool fusable_op(OpId op) { return is_fusable(op); }

bool generated_layout(const FusedProgram& p, const DuetFusedArgs& a) {
  for (int k = 0; k < p.num_inputs(); ++k)
    if (p.in_dtypes[k] == p.dtype && a.in_si[k] != 0 && a.in_si[k] != 1) return false;
  return true;
}

void interpret_fused(const FusedProgram& p, const DuetFusedArgs& a, int64_t begin, int64_t end) {
  if (begin >= end) return;
  if (p.dtype == DType::f32) {
    Interp<float>(p, a).run(begin, end);
  } else {
    DUET_ASSERT(p.dtype == DType::f64, "[fused] compute dtype {}", p.dtype);
    Interp<double>(p, a).run(begin, end);
  }
}

int64_t FusedKernel::work(const DuetFusedArgs& a) const {
  switch (program.reduce) {
    case FusedReduce::None:
      return a.outer * a.inner;
    case FusedReduce::Inner:
      return a.outer;
    case FusedReduce::Outer:
      return a.inner;
  }
  return 0;
}

void FusedKernel::run(const DuetFusedArgs& a) {
  runs.fetch_add(1, std::memory_order_relaxed);
  const int64_t w = work(a);
  if (w <= 0) return;
  DuetFusedFn f = compiled.load(std::memory_order_acquire);
  if (f && !generated_layout(program, a)) f = nullptr;
  // The grain: about kParallelGrain elements of the space per thread.
  const int64_t per = program.reduce == FusedReduce::None    ? 1
                      : program.reduce == FusedReduce::Inner ? std::max<int64_t>(a.inner, 1)
                                                             : std::max<int64_t>(a.outer, 1);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / per);
  const int64_t align = program.reduce == FusedReduce::Inner ? 1 : 64;
  parallel_for(
      w, grain,
      [&](int64_t b, int64_t e) {
        if (f)
          f(&a, b, e);
        else
          interpret_fused(program, a, b, e);
      },
      align);
}

bool FusedProgram::has_low_precision() const {
  for (DType d : in_dtypes)
    if (is_low_precision(d)) return true;
  for (DType d : out_dtypes)
    if (is_low_precision(d)) return true;
  for (const FusedInstr& in : code)
    if (in.round != DType::f32) return true;
  return red_round != DType::f32;
}

std::string FusedProgram::str() const {
  std::string s = fmt::format("fused {} ({} inputs", dtype, num_inputs());
  for (int k = 0; k < num_inputs(); ++k)
    s += fmt::format("{}r{}:{}{}", k ? ", " : ": ", k, in_dtypes[k],
                     scalar_inputs >> k & 1u ? " number" : "");
  s += ")\n";
  for (const FusedInstr& in : code) {
    s += fmt::format("  r{} = {}(", in.dst, op_name(in.op));
    for (int j = 0; j < 3 && in.src[j] >= 0; ++j)
      s += fmt::format("{}r{}", j ? ", " : "", in.src[j]);
    s += in.op == OpId::Cast ? fmt::format(") to {}", in.to) : ")";
    s += in.round != DType::f32 ? fmt::format(", rounded to {}\n", in.round) : "\n";
  }
  for (size_t o = 0; o < outputs.size(); ++o)
    s += fmt::format("  out{} = r{} ({})\n", o, outputs[o], out_dtypes[o]);
  if (reduce != FusedReduce::None)
    s += fmt::format("  {} r{} over the {} dims{}\n", op_name(reduce_op), reduce_src,
                     reduce == FusedReduce::Inner ? "inner" : "outer",
                     red_round != DType::f32 ? fmt::format(", rounded to {}", red_round) : "");
  return s;
}

uint64_t FusedProgram::hash() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  mix(static_cast<uint64_t>(dtype));
  for (DType d : in_dtypes) mix(static_cast<uint64_t>(d) + 17);
  for (const FusedInstr& in : code) {
    mix(static_cast<uint64_t>(in.op) + 1000);
    mix(static_cast<uint64_t>(in.dst + 1));
    for (int16_t s : in.src) mix(static_cast<uint64_t>(s + 2));
    mix(static_cast<uint64_t>(in.to));
    mix(static_cast<uint64_t>(in.round) + 31);
  }
  mix(static_cast<uint64_t>(num_regs));
  for (size_t o = 0; o < outputs.size(); ++o) {
    mix(static_cast<uint64_t>(outputs[o]) + 5000);
    mix(static_cast<uint64_t>(out_dtypes[o]));
  }
  mix(static_cast<uint64_t>(reduce));
  mix(static_cast<uint64_t>(reduce_op));
  mix(static_cast<uint64_t>(reduce_src + 3));
  mix(static_cast<uint64_t>(red_round) + 53);
  mix(static_cast<uint64_t>(scalar_inputs) + 7);
  return h;
}

namespace {
FusedDeviceRunner g_runners[kNumDeviceTypes];
GemmEpilogueFn g_epilogues[kNumDeviceTypes];
}  // namespace
void set_gemm_epilogue(DeviceType type, GemmEpilogueFn fn) {
  g_epilogues[static_cast<int>(type)] = fn;
}
GemmEpilogueFn gemm_epilogue(DeviceType type) { return g_epilogues[static_cast<int>(type)]; }
void set_fused_device_runner(DeviceType type, const FusedDeviceRunner& runner) {
  g_runners[static_cast<int>(type)] = runner;
}
const FusedDeviceRunner* fused_device_runner(DeviceType type) {
  const FusedDeviceRunner& r = g_runners[static_cast<int>(type)];
  return r.run ? &r : nullptr;
}

}  // namespace duet::kernels
