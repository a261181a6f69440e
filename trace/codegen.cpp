// The generated-C++ tier of fused kernels: the source generator, then the background builder
// with its disk cache (Note [Codegen cache]).
#include "trace/codegen.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "kernels/jit.h"

extern char** environ;

namespace duet::detail {

// Written by CMakeLists.txt into the build tree: the compiler and flags of duet's own kernels,
// Eigen's include directory, and the texts of the headers the generated code includes.
extern const char* const kCodegenCompiler;
extern const char* const kCodegenFlags;
extern const char* const kCodegenEigenInclude;
extern const char* const kCodegenEigenVersion;
extern const char* const kCodegenFunctorsH;
extern const char* const kCodegenFusedAbiH;

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

// How each fusable op reads in generated code: a pattern over its operands {0}, {1}, {2}.
// Cast is not here: its pattern depends on the target dtype.
struct OpCode {
  OpId op;
  int arity;
  const char* expr;
};
constexpr OpCode kOpCodes[] = {
    {OpId::Neg, 1, "apply1<duet::fn::Neg>({0})"},
    {OpId::Exp, 1, "apply1<duet::fn::Exp>({0})"},
    {OpId::Log, 1, "apply1<duet::fn::Log>({0})"},
    {OpId::Sqrt, 1, "apply1<duet::fn::Sqrt>({0})"},
    {OpId::Rsqrt, 1, "apply1<duet::fn::Rsqrt>({0})"},
    {OpId::Abs, 1, "apply1<duet::fn::Abs>({0})"},
    {OpId::Sin, 1, "apply1<duet::fn::Sin>({0})"},
    {OpId::Cos, 1, "apply1<duet::fn::Cos>({0})"},
    {OpId::Tanh, 1, "apply1<duet::fn::Tanh>({0})"},
    {OpId::Sigmoid, 1, "apply1<duet::fn::Sigmoid>({0})"},
    {OpId::Relu, 1, "apply1<duet::fn::Relu>({0})"},
    {OpId::Erf, 1, "apply1<duet::fn::Erf>({0})"},
    {OpId::LogSigmoid, 1, "apply1<duet::fn::LogSigmoid>({0})"},
    {OpId::Add, 2, "apply2<duet::fn::Add>({0}, {1})"},
    {OpId::Sub, 2, "apply2<duet::fn::Sub>({0}, {1})"},
    {OpId::Mul, 2, "apply2<duet::fn::Mul>({0}, {1})"},
    {OpId::Div, 2, "apply2<duet::fn::Div>({0}, {1})"},
    {OpId::Pow, 2, "apply2<duet::fn::Pow>({0}, {1})"},
    {OpId::Maximum, 2, "apply2<duet::fn::Maximum>({0}, {1})"},
    {OpId::Minimum, 2, "apply2<duet::fn::Minimum>({0}, {1})"},
    {OpId::Lt, 2, "cmp_lt({0}, {1})"},
    {OpId::Le, 2, "cmp_le({0}, {1})"},
    {OpId::Gt, 2, "cmp_lt({1}, {0})"},
    {OpId::Ge, 2, "cmp_le({1}, {0})"},
    {OpId::Eq, 2, "cmp_eq({0}, {1})"},
    {OpId::Ne, 2, "cmp_ne({0}, {1})"},
    {OpId::Where, 3, "pwhere({0}, {1}, {2})"},
    {OpId::Copy, 1, "{0}"},
};

const OpCode* find_op_code(OpId op) {
  for (const OpCode& c : kOpCodes)
    if (c.op == op) return &c;
  return nullptr;
}

std::string reg_list(const FusedInstr& in, int arity) {
  std::string s;
  for (int k = 0; k < arity; ++k) s += fmt::format("{}r{}", k ? ", " : "", in.src[k]);
  return s;
}

}  // namespace

std::string generate_fused_source(const FusedProgram& p) {
  DUET_CHECK_T(p.dtype == DType::f32 || p.dtype == DType::f64, DTypeError,
               "[codegen] fused programs compute in f32 or f64, not {}", dtype_name(p.dtype));
  const int nin = p.num_inputs(), nout = static_cast<int>(p.outputs.size());
  DUET_ASSERT(nin <= DUET_FUSED_MAX_INPUTS && nout <= DUET_FUSED_MAX_OUTPUTS);
  DUET_ASSERT(p.out_dtypes.size() == p.outputs.size());
  DUET_ASSERT(p.num_regs >= nin);
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

  std::string header = fmt::format("// duet: generated fused kernel (trace/codegen.cpp), T = {}\n",
                                   dtype_name(p.dtype));
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
      const OpCode* c = find_op_code(in.op);
      DUET_CHECK_T(c != nullptr, ValueError, "[codegen] op {} does not fuse", op_name(in.op));
      std::string a[3];
      for (int k = 0; k < c->arity; ++k) a[k] = read(in.src[k]);
      expr = fmt::format(fmt::runtime(c->expr), a[0], a[1], a[2]);
      text = fmt::format("r{} = {}({})", in.dst, op_name(in.op), reg_list(in, c->arity));
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

// ---- building, caching and loading -----------------------------------------------------------

namespace duet::codegen {
namespace {

namespace fs = std::filesystem;

std::atomic<int> g_enabled{-1};          // -1: DUET_CODEGEN not read yet
std::atomic<int> g_threshold{-1};        // -1: DUET_CODEGEN_THRESHOLD not read yet (default 3)
std::atomic<bool> g_worker_gone{false};  // set by ~Worker: a kernel run during exit queues nothing

std::string default_cache_dir() {
  if (const char* d = std::getenv("DUET_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/duet/kernels";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/duet/kernels";
  return fmt::format("/tmp/duet-kernels-{}", getuid());
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(sep, i);
    if (j == std::string_view::npos) j = s.size();
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// Starts argv[0] (looked up in PATH) with no shell: stdin from /dev/null, stdout and stderr to
// out_fd. Returns the pid, or -1.
pid_t spawn(const std::vector<std::string>& argv, int out_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// The compiler with its flags; `identity` (its path, flags and `--version`) enters the key.
struct Toolchain {
  std::vector<std::string> argv;  // compiler, flags; the output and the source are appended
  std::string identity;
};

// One worker thread builds the queued kernels, one at a time. The object lives until static
// destruction, which kills a compiler still running and joins the thread.
class Worker {
 public:
  static Worker& get() {
    static Worker w;
    return w;
  }
  ~Worker() {
    g_worker_gone.store(true);
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      queue_.clear();
      if (child_ > 0) kill(child_, SIGKILL);
    }
    work_cv_.notify_all();
    idle_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void enqueue(std::shared_ptr<kernels::FusedKernel> k) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      queue_.push_back(std::move(k));
      ++stats_.queued;
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    work_cv_.notify_one();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return stop_ || (queue_.empty() && !busy_); });
  }
  CodegenStats stats() {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }
  std::string dir() {
    std::lock_guard<std::mutex> l(mu_);
    return dir_.empty() ? default_cache_dir() : dir_;
  }
  void set_dir(std::string d) {
    std::lock_guard<std::mutex> l(mu_);
    dir_ = std::move(d);
  }

 private:
  Worker() = default;

  void loop() {
    for (;;) {
      std::shared_ptr<kernels::FusedKernel> k;
      {
        std::unique_lock<std::mutex> l(mu_);
        work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        k = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      try {
        build(*k);
      } catch (const std::exception& e) {
        fail(fmt::format("codegen failed: {}", e.what()));
      }
      k.reset();
      {
        std::lock_guard<std::mutex> l(mu_);
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }

  void fail(const std::string& why) {
    fmt::print(stderr, "duet: warning: {}; the interpreter keeps running this fused kernel\n", why);
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.failed;
  }

  // Runs argv to completion, its output to out_fd; the exit status, or -1. The child is waited
  // for without being reaped first, so that ~Worker can kill it by pid with no race on reuse.
  int run(const std::vector<std::string>& argv, int out_fd) {
    pid_t pid = spawn(argv, out_fd);
    if (pid < 0) return -1;
    {
      std::lock_guard<std::mutex> l(mu_);
      child_ = pid;
      if (stop_) kill(pid, SIGKILL);
    }
    siginfo_t info;
    while (waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      child_ = 0;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  Toolchain toolchain() {
    const char* env = std::getenv("DUET_CODEGEN_CXX");
    std::string cxx = env && *env ? env : detail::kCodegenCompiler;
    Toolchain tc;
    tc.argv.push_back(cxx);
    for (std::string& f : split(detail::kCodegenFlags, ' ')) tc.argv.push_back(std::move(f));
    for (const char* f : {"-std=c++20", "-fPIC", "-shared", "-fvisibility=hidden"})
      tc.argv.emplace_back(f);
    for (std::string& d : split(detail::kCodegenEigenInclude, ';')) {
      tc.argv.emplace_back("-isystem");
      tc.argv.push_back(std::move(d));
    }
    auto it = versions_.find(cxx);
    if (it == versions_.end()) it = versions_.emplace(cxx, compiler_version(cxx)).first;
    for (const std::string& a : tc.argv) tc.identity += a + '\n';
    tc.identity += it->second;
    tc.identity += detail::kCodegenEigenVersion;
    return tc;
  }

  std::string compiler_version(const std::string& cxx) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return "";
    int status = -1;
    std::string out;
    {
      pid_t pid = spawn({cxx, "--version"}, fds[1]);
      close(fds[1]);
      char buf[4096];
      ssize_t n;
      while (pid > 0 && ((n = read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0) out.append(buf, n);
      if (pid > 0) waitpid(pid, &status, 0);
    }
    close(fds[0]);
    return fmt::format("{}\nstatus {}\n", out, status);
  }

  void build(kernels::FusedKernel& k) {
    const std::string source = detail::generate_fused_source(k.program);
    const std::string headers =
        std::string(detail::kCodegenFunctorsH) + '\0' + detail::kCodegenFusedAbiH;
    Toolchain tc = toolchain();
    const std::string key = fmt::format(
        "{:016x}",
        kernels::jit::fnv1a(tc.identity,
                            kernels::jit::fnv1a(headers, kernels::jit::fnv1a(source + '\0'))));
    if (failed_.count(key)) return;  // reported once, never retried

    const std::string dir = this->dir();
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string base = fmt::format("{}/duet-fused-{}", dir, key), so = base + ".so";
    const bool hit = access(so.c_str(), F_OK) == 0;
    if (!hit) {
      const std::string inc =
          fmt::format("{}/duet-include-{:016x}", dir, kernels::jit::fnv1a(headers));
      fs::create_directories(inc, ec);
      if (!kernels::jit::write_file_once(inc + "/duet_functors.h", detail::kCodegenFunctorsH) ||
          !kernels::jit::write_file_once(inc + "/duet_fused_abi.h", detail::kCodegenFusedAbiH) ||
          !kernels::jit::write_file_once(base + ".cpp", source)) {
        failed_.insert(key);
        fail(fmt::format("codegen cannot write to its cache directory {}", dir));
        return;
      }
      const std::string tmp = fmt::format("{}.so.tmp-{}", base, getpid());
      const std::string log = fmt::format("{}.log.tmp-{}", base, getpid());
      std::vector<std::string> argv = tc.argv;
      for (const std::string& a : {std::string("-I"), inc, std::string("-o"), tmp, base + ".cpp"})
        argv.push_back(a);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = fd >= 0 ? run(argv, fd) : -1;
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (fd >= 0) close(fd);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_) {  // killed at exit: leave no partial files
          std::remove(tmp.c_str());
          std::remove(log.c_str());
          return;
        }
        stats_.build_ms += ms;
      }
      if (rc != 0 || std::rename(tmp.c_str(), so.c_str()) != 0) {
        std::remove(tmp.c_str());
        std::rename(log.c_str(), (base + ".log").c_str());
        failed_.insert(key);
        fail(
            fmt::format("codegen could not compile a fused kernel with {} (exit status {}, see {})",
                        tc.argv[0], rc, base + ".log"));
        return;
      }
      std::remove(log.c_str());
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.built;
    }
    // Handles stay open for the life of the process: a kernel may run at any time.
    void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* fn = handle ? dlsym(handle, "duet_fused") : nullptr;
    if (fn == nullptr) {
      const char* err = dlerror();
      failed_.insert(key);
      fail(fmt::format("codegen could not load {}: {}", so, err ? err : "no duet_fused"));
      return;
    }
    k.compiled.store(reinterpret_cast<kernels::DuetFusedFn>(fn), std::memory_order_release);
    std::lock_guard<std::mutex> l(mu_);
    if (hit) ++stats_.cache_hits;
    ++stats_.loaded;
  }

  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<std::shared_ptr<kernels::FusedKernel>> queue_;  // guarded by mu_
  std::thread thread_;
  bool busy_ = false, stop_ = false;  // guarded by mu_
  pid_t child_ = 0;                   // the compiler running, guarded by mu_
  std::string dir_;                   // guarded by mu_; "" is the default
  CodegenStats stats_;                // guarded by mu_
  // The worker thread's own: keys that failed, and each compiler's --version.
  std::unordered_set<std::string> failed_;
  std::unordered_map<std::string, std::string> versions_;
};

}  // namespace

void set_enabled(bool on) { g_enabled.store(on ? 1 : 0, std::memory_order_relaxed); }

bool enabled() {
  int v = g_enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("DUET_CODEGEN");
    int want = env && std::string_view(env) == "0" ? 0 : 1;
    g_enabled.compare_exchange_strong(v, want, std::memory_order_relaxed);
    v = g_enabled.load(std::memory_order_relaxed);
  }
  return v != 0;
}

void set_threshold(int runs) {
  DUET_CHECK_T(runs >= 0, ValueError, "[codegen] threshold must be 0 or more, got {}", runs);
  g_threshold.store(runs, std::memory_order_relaxed);
}
int threshold() {
  int v = g_threshold.load(std::memory_order_relaxed);
  if (v < 0) {
    int want = 3;
    if (const char* env = std::getenv("DUET_CODEGEN_THRESHOLD"); env && *env) {
      char* end = nullptr;
      long n = std::strtol(env, &end, 10);
      if (end && *end == '\0' && n >= 0 && n < (1L << 30)) want = static_cast<int>(n);
    }
    g_threshold.compare_exchange_strong(v, want, std::memory_order_relaxed);
    v = g_threshold.load(std::memory_order_relaxed);
  }
  return v;
}

void set_cache_dir(std::string dir) { Worker::get().set_dir(std::move(dir)); }
std::string cache_dir() { return Worker::get().dir(); }

void clear_cache() {
  std::vector<fs::path> ours;
  std::error_code ec;
  for (fs::directory_iterator it(cache_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("duet-fused-", 0) == 0 || name.rfind("duet-include-", 0) == 0)
      ours.push_back(it->path());
  }
  for (const fs::path& p : ours) fs::remove_all(p, ec);
}

void wait_idle() { Worker::get().wait_idle(); }
CodegenStats stats() { return Worker::get().stats(); }

}  // namespace duet::codegen

namespace duet::detail {

void codegen_consider(const std::shared_ptr<kernels::FusedKernel>& k) {
  if (!codegen::enabled() || !k->codegen_allowed) return;
  if (k->runs.load(std::memory_order_relaxed) < codegen::threshold()) return;
  if (codegen::g_worker_gone.load() || k->codegen_requested.exchange(true)) return;
  codegen::Worker::get().enqueue(k);
}

}  // namespace duet::detail
