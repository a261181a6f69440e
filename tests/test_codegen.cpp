// The generated-C++ tier of fused kernels (trace/plan/codegen.h). Programs built by hand run
// through the interpreter and through their generated code: elementwise results bit for bit,
// reductions to a rounding tolerance, both against a scalar reference too. Then the machinery:
// the disk cache, clearing it, the switch, the threshold, and a compiler that fails.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "kernels/functors.h"
#include "kernels/fused.h"
#include "long_sums.h"
#include "trace/plan/codegen.h"
#include "util.h"

namespace duet::test {
namespace {

using kernels::DuetFusedArgs;
using kernels::FusedInstr;
using kernels::FusedKernel;
using kernels::FusedProgram;
using kernels::FusedReduce;
namespace fs = std::filesystem;

// ---- programs, operands, runs ----------------------------------------------------------------

struct Builder {
  FusedProgram p;
  Builder(DType t, std::vector<DType> ins) {
    p.dtype = t;
    p.in_dtypes = std::move(ins);
    p.num_regs = p.num_inputs();
  }
  int op(OpId op, int a, int b = -1, int c = -1, DType to = DType::f32) {
    FusedInstr in;
    in.op = op;
    in.dst = static_cast<int16_t>(p.num_regs++);
    in.src[0] = static_cast<int16_t>(a);
    in.src[1] = static_cast<int16_t>(b);
    in.src[2] = static_cast<int16_t>(c);
    in.to = to;
    p.code.push_back(in);
    return in.dst;
  }
  void out(int r, DType d) {
    p.outputs.push_back(static_cast<int16_t>(r));
    p.out_dtypes.push_back(d);
  }
  void reduce(FusedReduce kind, OpId op, int r) {
    p.reduce = kind;
    p.reduce_op = op;
    p.reduce_src = static_cast<int16_t>(r);
  }
};

struct Strides {
  int64_t so, si;  // element strides along outer and inner (0 broadcasts)
};
struct Shape2 {
  int64_t outer, inner;
};

// An operand's storage: enough elements of its dtype for every (i, j) its strides reach.
struct Buffer {
  DType dtype;
  std::vector<char> bytes;
  template <class T>
  T get(int64_t idx) const {
    switch (dtype) {
      case DType::f32:
        return static_cast<T>(reinterpret_cast<const float*>(bytes.data())[idx]);
      case DType::f64:
        return static_cast<T>(reinterpret_cast<const double*>(bytes.data())[idx]);
      case DType::i32:
        return static_cast<T>(reinterpret_cast<const int32_t*>(bytes.data())[idx]);
      case DType::i64:
        return static_cast<T>(reinterpret_cast<const int64_t*>(bytes.data())[idx]);
      case DType::b8:
        return static_cast<T>(reinterpret_cast<const bool*>(bytes.data())[idx]);
      default:
        FAIL("dtype");
        return T(0);
    }
  }
};

// Random values: multiples of 0.5 half the time (so == hits), with NaN, infinities and signed
// zeros sprinkled in when `specials`.
Buffer random_buffer(DType d, int64_t n, Rng& rng, bool specials) {
  Buffer b{d, std::vector<char>(std::max<int64_t>(n, 1) * itemsize(d))};
  // Beside NaN of both signs and the infinities: the largest f32, which rounds to inf in bf16,
  // and two values halfway between bf16 neighbours (1 + 2^-8 and 1 + 3 * 2^-8), which round to
  // the even one (Note [bf16 by its bits] in kernels/codegen/cpu.cpp).
  const double kSpecial[] = {std::nan(""), -std::nan(""), INFINITY, -INFINITY,  0.0,
                             -0.0,         1.0,           3.4e38,   1.00390625, 1.01171875};
  constexpr uint64_t kSpecials = sizeof(kSpecial) / sizeof(kSpecial[0]);
  for (int64_t i = 0; i < n; ++i) {
    double v = rng.uniform(-3, 3);
    if (rng.next() % 2) v = std::round(v * 2) / 2;
    if (specials && rng.next() % 16 == 0) v = kSpecial[rng.next() % kSpecials];
    switch (d) {
      case DType::f32:
        reinterpret_cast<float*>(b.bytes.data())[i] = static_cast<float>(v);
        break;
      case DType::f64:
        reinterpret_cast<double*>(b.bytes.data())[i] = v;
        break;
      case DType::i32:
        reinterpret_cast<int32_t*>(b.bytes.data())[i] = static_cast<int32_t>(rng.next() % 11) - 5;
        break;
      case DType::i64:
        reinterpret_cast<int64_t*>(b.bytes.data())[i] = static_cast<int64_t>(rng.next() % 11) - 5;
        break;
      case DType::b8:
        reinterpret_cast<bool*>(b.bytes.data())[i] = rng.next() % 2;
        break;
      case DType::f16:
      case DType::bf16:
        reinterpret_cast<uint16_t*>(b.bytes.data())[i] =
            float_to_low_precision(static_cast<float>(v), d);
        break;
      default:
        FAIL("dtype");
    }
  }
  return b;
}

// One call's operands and results.
struct Work {
  const FusedProgram* p;
  Shape2 s;
  std::vector<Strides> st;
  std::vector<Buffer> in;
  std::vector<std::vector<char>> out;  // dense [outer * inner] of each output's dtype
  std::vector<char> red;               // red_out, dtype T
  int64_t units() const {
    return p->reduce == FusedReduce::None    ? s.outer * s.inner
           : p->reduce == FusedReduce::Inner ? s.outer
                                             : s.inner;
  }
  DuetFusedArgs args() {
    DuetFusedArgs a{};
    a.outer = s.outer;
    a.inner = s.inner;
    for (size_t k = 0; k < in.size(); ++k) {
      a.in[k] = in[k].bytes.data();
      a.in_so[k] = st[k].so;
      a.in_si[k] = st[k].si;
    }
    for (size_t k = 0; k < out.size(); ++k) a.out[k] = out[k].data();
    a.red_out = red.data();
    return a;
  }
};

Work make_work(const FusedProgram& p, Shape2 s, std::vector<Strides> st, uint64_t seed,
               bool specials = true) {
  Work w{&p, s, std::move(st), {}, {}, {}};
  Rng rng(seed);
  for (int k = 0; k < p.num_inputs(); ++k) {
    int64_t n = 1 + std::max<int64_t>(0, (s.outer - 1) * w.st[k].so) +
                std::max<int64_t>(0, (s.inner - 1) * w.st[k].si);
    w.in.push_back(random_buffer(p.in_dtypes[k], n, rng, specials));
  }
  for (DType d : p.out_dtypes) w.out.emplace_back(s.outer * s.inner * itemsize(d), char(0x5a));
  int64_t nred = p.reduce == FusedReduce::Inner ? s.outer : s.inner;
  w.red.assign(std::max<int64_t>(nred, 1) * itemsize(p.dtype), char(0x5a));
  return w;
}

// Runs all the work in a few uneven chunks (elementwise chunks cross rows).
template <class F>
void run_chunks(Work& w, F&& f) {
  DuetFusedArgs a = w.args();
  const int64_t n = w.units();
  int64_t cuts[] = {0, n / 3 + 1, 2 * n / 3 + 5, n};
  for (int c = 0; c < 3; ++c) {
    int64_t b = std::min(cuts[c], n), e = std::min(std::max(cuts[c + 1], b), n);
    if (b < e) f(a, b, e);
  }
}

// ---- the scalar reference ----------------------------------------------------------------------

template <class T>
T ref_op(const FusedInstr& in, T a, T b, T c) {
  switch (in.op) {
#define DUET_UNARY(Name, name, math, doc) \
  case OpId::Name:                        \
    return fn::Name{}(a);
#define DUET_BINARY(Name, name, doc) \
  case OpId::Name:                   \
    return fn::Name{}(a, b);
#define DUET_COMPARE(Name, name, expr, doc) \
  case OpId::Name:                          \
    return fn::Name{}(a, b);
#include "core/elementwise.def"
    case OpId::Where:
      return a != T(0) ? b : c;
    case OpId::Cast:
      return in.to == DType::b8 ? T(a != T(0)) : a;
    case OpId::Copy:
      return a;
    default:
      FAIL("op");
      return T(0);
  }
}

// Every register of element (i, j).
template <class T>
std::vector<T> ref_regs(const Work& w, int64_t i, int64_t j) {
  const FusedProgram& p = *w.p;
  std::vector<T> r(p.num_regs);
  for (int k = 0; k < p.num_inputs(); ++k)
    r[k] = w.in[k].template get<T>(i * w.st[k].so + j * w.st[k].si);
  for (const FusedInstr& in : p.code) {
    auto src = [&](int k) { return in.src[k] >= 0 ? r[in.src[k]] : T(0); };
    r[in.dst] = ref_op<T>(in, src(0), src(1), src(2));
  }
  return r;
}

bool same_bits(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}
bool near(double a, double b, double tol) {
  return (std::isnan(a) && std::isnan(b)) || a == b || std::abs(a - b) <= tol;
}

template <class T>
double out_value(const Work& w, int k, int64_t idx) {
  if (w.p->out_dtypes[k] == DType::b8) return reinterpret_cast<const bool*>(w.out[k].data())[idx];
  return reinterpret_cast<const T*>(w.out[k].data())[idx];
}
template <class T>
double red_value(const Work& w, int64_t idx) {
  return reinterpret_cast<const T*>(w.red.data())[idx];
}

// The generated code's function for p, built now (threshold 1) or found in the cache.
kernels::DuetFusedFn compiled(const FusedProgram& p) {
  auto k = std::make_shared<FusedKernel>();
  k->program = p;
  k->runs = 1;
  detail::codegen_note_run(k);
  codegen::wait_idle();
  return k->compiled.load();
}

// A private cache directory for this process, removed after the codegen worker has stopped.
void setup() {
  struct TempDir {
    std::string path =
        fmt::format("{}/duet-test-codegen-{}", fs::temp_directory_path().string(), getpid());
    ~TempDir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static TempDir dir;
  codegen::set_cache_dir(dir.path);
  codegen::set_enabled(true);
  codegen::set_threshold(1);
}

// Runs the work through the generated code and through the interpreter, in the same chunks, and
// checks them against each other (elementwise bit for bit, reductions to a rounding tolerance)
// and against the scalar reference.
template <class T>
void check(kernels::DuetFusedFn fn, const FusedProgram& p, Shape2 s, std::vector<Strides> st,
           uint64_t seed, bool specials = true) {
  CAPTURE(s.outer);
  CAPTURE(s.inner);
  CAPTURE(seed);
  Work g = make_work(p, s, st, seed, specials), r = make_work(p, s, st, seed, specials);
  // As FusedKernel::run chooses: generated code for the layouts it takes, else the interpreter.
  run_chunks(g, [&](const DuetFusedArgs& a, int64_t b, int64_t e) {
    if (kernels::generated_layout(p, a))
      fn(&a, b, e);
    else
      kernels::interpret_fused(p, a, b, e);
  });
  run_chunks(r, [&](const DuetFusedArgs& a, int64_t b, int64_t e) {
    kernels::interpret_fused(p, a, b, e);
  });
  const double eps = std::numeric_limits<T>::epsilon();
  int bad = 0;  // report the first few mismatches, not thousands
  for (int64_t i = 0; i < s.outer && bad < 8; ++i) {
    for (int64_t j = 0; j < s.inner && bad < 8; ++j) {
      std::vector<T> regs = ref_regs<T>(g, i, j);
      for (size_t k = 0; k < p.outputs.size(); ++k) {
        double want = regs[p.outputs[k]];
        if (p.out_dtypes[k] == DType::b8) want = want != 0;
        const int64_t idx = i * s.inner + j;
        double got = out_value<T>(g, static_cast<int>(k), idx);
        double interp = out_value<T>(r, static_cast<int>(k), idx);
        if (same_bits(got, interp) && near(got, want, 64 * eps * (1 + std::abs(want)))) continue;
        ++bad;
        INFO("output ", k, " at (", i, ", ", j, "): generated ", got, ", interpreter ", interp,
             ", reference ", want);
        CHECK(same_bits(got, interp));
        CHECK(near(got, want, 64 * eps * (1 + std::abs(want))));
      }
    }
  }
  if (p.reduce == FusedReduce::None) return;
  const bool inner = p.reduce == FusedReduce::Inner;
  const int64_t nred = inner ? s.outer : s.inner, len = inner ? s.inner : s.outer;
  for (int64_t u = 0; u < nred && bad < 8; ++u) {
    double want = p.reduce_op == OpId::Sum ? 0.0 : p.reduce_op == OpId::Max ? -INFINITY : INFINITY;
    double l1 = 0;
    for (int64_t v = 0; v < len; ++v) {
      double x = ref_regs<T>(g, inner ? u : v, inner ? v : u)[p.reduce_src];
      l1 += std::abs(x);
      if (p.reduce_op == OpId::Sum) want += x;
      if (p.reduce_op == OpId::Max) want = fn::Maximum{}(want, x);
      if (p.reduce_op == OpId::Min) want = fn::Minimum{}(want, x);
    }
    const double tol = 64 * eps * (1 + l1);
    double got = red_value<T>(g, u), interp = red_value<T>(r, u);
    if (near(got, interp, tol) && near(got, want, tol)) continue;
    ++bad;
    INFO("reduced ", u, ": generated ", got, ", interpreter ", interp, ", reference ", want);
    CHECK(near(got, interp, tol));
    CHECK(near(got, want, tol));
  }
  CHECK(bad == 0);
}

// acc * 2 + bit, exactly (small integers).
int shift_in(Builder& b, int acc, int bit) {
  return b.op(OpId::Add, b.op(OpId::Add, acc, acc), bit);
}

// Programs of op(x) for each op in `ops`, one output each (as many programs as the outputs
// need).
std::vector<FusedProgram> one_output_each(DType t, const std::vector<DType>& ins,
                                          const std::vector<OpId>& ops,
                                          std::vector<int> (*operands)(Builder&, OpId)) {
  std::vector<FusedProgram> out;
  for (size_t i = 0; i < ops.size(); i += DUET_FUSED_MAX_OUTPUTS) {
    Builder b(t, ins);
    for (size_t k = i; k < std::min(ops.size(), i + DUET_FUSED_MAX_OUTPUTS); ++k) {
      std::vector<int> r = operands(b, ops[k]);
      r.resize(3, -1);
      b.out(b.op(ops[k], r[0], r[1], r[2]), t);
    }
    out.push_back(b.p);
  }
  return out;
}

std::vector<OpId> ops_where(bool (*pred)(OpId)) {
  std::vector<OpId> ops;
  for (int i = 0; i < kNumOps; ++i)
    if (pred(OpId(i))) ops.push_back(OpId(i));
  return ops;
}

// Every unary op of x (the unary rows of core/elementwise.def), one output each.
std::vector<FusedProgram> unary_programs(DType t) {
  return one_output_each(t, {t},
                         ops_where([](OpId op) { return unary_math(op) != UnaryMath::None; }),
                         [](Builder&, OpId) { return std::vector<int>{0}; });
}

// Inputs of the binary programs: x, y, z of dtype T (x f32 in an f64 program), m b8, n i32 or
// i64.
std::vector<DType> binary_inputs(DType t) {
  return {DType::f32, t, t, DType::b8, t == DType::f32 ? DType::i32 : DType::i64};
}

// Every binary row of core/elementwise.def on x and y (pow on |x|, so that it is real); then
// the comparisons (packed into one exact code), where, casts and the conversions of every
// input dtype.
std::vector<FusedProgram> binary_programs(DType t) {
  std::vector<FusedProgram> ps =
      one_output_each(t, binary_inputs(t), ops_where(is_binary_family), [](Builder& b, OpId op) {
        return std::vector<int>{op == OpId::Pow ? b.op(OpId::Abs, 0) : 0, 1};
      });
  Builder b(t, binary_inputs(t));
  const int x = 0, y = 1, z = 2, m = 3, n = 4;
  const int d = b.op(OpId::Sub, x, y);
  b.out(b.op(OpId::Minimum, x, z), t);
  int code = b.op(OpId::Cast, x, -1, -1, DType::b8);
  for (OpId op : ops_where(is_compare)) code = shift_in(b, code, b.op(op, x, y));
  b.out(code, t);
  const int w = b.op(OpId::Where, m, x, y);
  b.out(b.op(OpId::Where, d, w, z), t);
  b.out(b.op(OpId::Cast, d, -1, -1, DType::b8), DType::b8);
  const int c = b.op(OpId::Cast, b.op(OpId::Lt, z, y), -1, -1, t);
  b.out(b.op(OpId::Copy, b.op(OpId::Mul, b.op(OpId::Add, n, m), c)), t);
  ps.push_back(b.p);
  return ps;
}

}  // namespace

TEST_CASE("codegen: a program's source names its ops, operands and entry point") {
  Builder b(DType::f32, {DType::f32, DType::f32});
  int m = b.op(OpId::Mul, 0, 1);
  b.out(b.op(OpId::Exp, m), DType::f32);
  std::string src = detail::generate_fused_source(b.p);
  CHECK(src.find("//   r2 = mul(r0, r1)") != std::string::npos);
  CHECK(src.find("P t0 = apply2<duet::fn::Mul>(x0, x1);") != std::string::npos);
  CHECK(src.find("P t1 = apply1<duet::fn::Exp>(t0);") != std::string::npos);
  CHECK(src.find("out0.put(j, t1);") != std::string::npos);
  CHECK(src.find("run_none<Body>(a, begin, end)") != std::string::npos);
  CHECK(src.find("extern \"C\"") != std::string::npos);
}

TEST_CASE("codegen: every fusable op has generated code; others are an error") {
  for (int i = 0; i < kNumOps; ++i) {
    const OpId op = static_cast<OpId>(i);
    if (op_class(op) != OpClass::Elementwise) continue;
    CAPTURE(op_name(op));
    Builder b(DType::f32, {DType::f32, DType::f32, DType::f32});
    b.out(b.op(op, 0, 1, 2), DType::f32);
    if (kernels::fusable_op(op))
      CHECK_NOTHROW(detail::generate_fused_source(b.p));
    else
      CHECK_THROWS_AS(detail::generate_fused_source(b.p), Error);
  }
  Builder f16(DType::f16, {DType::f16});
  f16.out(f16.op(OpId::Exp, 0), DType::f16);
  CHECK_THROWS_AS(detail::generate_fused_source(f16.p), DTypeError);
}

TEST_CASE("codegen: unary ops, f32 and f64, dense, strided and broadcast inputs") {
  setup();
  for (DType t : {DType::f32, DType::f64}) {
    CAPTURE(t);
    for (const FusedProgram& p : unary_programs(t)) {
      kernels::DuetFusedFn fn = compiled(p);
      REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
      auto run = [&](Shape2 s, Strides st, uint64_t seed) {
        if (t == DType::f32)
          check<float>(fn, p, s, {st}, seed);
        else
          check<double>(fn, p, s, {st}, seed);
      };
      run({1, 1000}, {0, 1}, 1);  // one dense row
      run({5, 37}, {37, 1}, 2);   // rows with tails, chunks crossing them
      run({6, 21}, {50, 2}, 3);   // strided rows
      run({9, 13}, {1, 0}, 4);    // a column broadcast along rows
      run({3, 3}, {0, 0}, 5);     // one scalar
    }
  }
}

TEST_CASE(
    "codegen: f16 and bf16 values are loaded, rounded after each op and stored as the "
    "interpreter does") {
  // An f32 program over low-precision values (Note [Fused registers] in kernels/fused.h): each
  // instruction whose op has a low result rounds its register. Generated code and the
  // interpreter agree bit for bit on every output; the interpreter agrees with eager ops
  // (test_low_precision).
  setup();
  for (DType low : {DType::bf16, DType::f16}) {
    CAPTURE(low);
    Builder b(DType::f32, {low, low, DType::f32});
    auto rounded = [&](int r) {
      b.p.code.back().round = low;
      return r;
    };
    const int m = rounded(b.op(OpId::Mul, 0, 1));
    const int e = rounded(b.op(OpId::Exp, m));
    const int c = rounded(b.op(OpId::Cast, 2, -1, -1, DType::f32));  // f32 -> low
    const int s = b.op(OpId::Add, e, 2);                             // low + f32 -> f32
    const int lt = b.op(OpId::Lt, e, c);
    // Rounded and only stored: the store rounds (Note [Rounding at the store]).
    const int only = rounded(b.op(OpId::Mul, 0, 2));
    b.out(e, low);
    b.out(s, DType::f32);
    b.out(lt, DType::b8);
    b.out(c, low);
    b.out(only, low);
    kernels::DuetFusedFn fn = compiled(b.p);
    REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
    for (auto [shape, st] :
         {std::pair{Shape2{5, 37}, Strides{37, 1}}, std::pair{Shape2{6, 21}, Strides{50, 2}},
          std::pair{Shape2{9, 13}, Strides{1, 0}}}) {
      Work g = make_work(b.p, shape, {st, st, st}, 7), r = make_work(b.p, shape, {st, st, st}, 7);
      // f32 denormals in every seventh element of the f32 input, whose products with the low
      // values are denormals, which f16 and bf16 keep, and NaNs with payloads in every eleventh,
      // which rounding makes the quiet NaN of their sign (AVX512-BF16's conversion flushes the
      // first and keeps the payloads: Note [Rounding at the store]).
      for (Work* w : {&g, &r}) {
        auto* f = reinterpret_cast<float*>(w->in[2].bytes.data());
        const size_t n = w->in[2].bytes.size() / sizeof(float);
        for (size_t i = 0; i < n; i += 7) f[i] = i % 2 ? 1.0001e-39f : -2.5e-39f;
        for (size_t i = 5; i < n; i += 11) {
          const uint32_t bits = i % 2 ? 0x7F812345u : 0xFFA0F00Du;
          std::memcpy(f + i, &bits, sizeof(bits));
        }
      }
      run_chunks(g, [&](const DuetFusedArgs& a, int64_t lo, int64_t hi) {
        if (kernels::generated_layout(b.p, a))
          fn(&a, lo, hi);
        else
          kernels::interpret_fused(b.p, a, lo, hi);
      });
      run_chunks(r, [&](const DuetFusedArgs& a, int64_t lo, int64_t hi) {
        kernels::interpret_fused(b.p, a, lo, hi);
      });
      for (size_t k = 0; k < g.out.size(); ++k) {
        CAPTURE(k);
        CHECK(g.out[k] == r.out[k]);
      }
      // The values are rounded: a bf16 output holds exp of the rounded product, rounded.
      const uint16_t* out = reinterpret_cast<const uint16_t*>(r.out[0].data());
      const uint16_t* x = reinterpret_cast<const uint16_t*>(r.in[0].bytes.data());
      const uint16_t* y = reinterpret_cast<const uint16_t*>(r.in[1].bytes.data());
      // Element (0, 0): both inputs' first elements.
      const float prod = low_precision_to_float(
          float_to_low_precision(
              low_precision_to_float(x[0], low) * low_precision_to_float(y[0], low), low),
          low);
      CHECK(out[0] == float_to_low_precision(fn::Exp{}(prod), low));
    }
  }
}

// Stands in for generated code: marks every element of its range.
void fake_generated(const DuetFusedArgs* a, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) static_cast<float*>(a->out[0])[i] = 42.0f;
}

TEST_CASE("codegen: FusedKernel::run gives generated code only the layouts it takes") {
  Builder b(DType::f32, {DType::f32, DType::i64});
  b.out(b.op(OpId::Add, 0, 1), DType::f32);
  FusedKernel k;
  k.program = b.p;
  k.compiled.store(fake_generated);
  std::vector<float> x(64);
  std::vector<int64_t> y(64);
  for (int i = 0; i < 64; ++i) {
    x[i] = 0.5f * static_cast<float>(i);
    y[i] = i % 3;
  }
  std::vector<float> out(8);
  DuetFusedArgs a{};
  a.outer = 2;
  a.inner = 4;
  a.in[0] = x.data();
  a.in[1] = y.data();
  a.out[0] = out.data();
  // Dense rows, and an i64 input at any stride: generated code.
  for (auto [so, si, yso, ysi] : {std::array<int64_t, 4>{4, 1, 4, 1}, {0, 1, 8, 3}, {1, 0, 0, 5}}) {
    CAPTURE(so);
    CAPTURE(si);
    CAPTURE(ysi);
    a.in_so[0] = so;
    a.in_si[0] = si;
    a.in_so[1] = yso;
    a.in_si[1] = ysi;
    std::fill(out.begin(), out.end(), 0.0f);
    CHECK(kernels::generated_layout(k.program, a));
    k.run(a);
    for (float v : out) CHECK(v == 42.0f);
  }
  // An f32 input strided along the row: the interpreter, whatever generated code there is.
  a.in_so[0] = 16;
  a.in_si[0] = 2;
  a.in_so[1] = 4;
  a.in_si[1] = 1;
  CHECK_FALSE(kernels::generated_layout(k.program, a));
  k.run(a);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      CHECK(out[i * 4 + j] == x[i * 16 + j * 2] + static_cast<float>(y[i * 4 + j]));
}

TEST_CASE("codegen: binary ops, comparisons, where and casts, f32 and f64") {
  setup();
  for (DType t : {DType::f32, DType::f64}) {
    CAPTURE(t);
    for (const FusedProgram& p : binary_programs(t)) {
      kernels::DuetFusedFn fn = compiled(p);
      REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
      auto run = [&](Shape2 s, std::vector<Strides> st, uint64_t seed) {
        if (t == DType::f32)
          check<float>(fn, p, s, st, seed);
        else
          check<double>(fn, p, s, st, seed);
      };
      const int64_t n = 333;
      run({1, n}, {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}}, 10);
      run({7, 45}, {{45, 1}, {0, 1}, {0, 0}, {1, 0}, {45, 1}}, 11);   // row, scalar, column
      run({4, 30}, {{90, 3}, {60, 2}, {1, 0}, {30, 1}, {0, 0}}, 12);  // strided
      run({11, 5}, {{5, 1}, {5, 1}, {5, 1}, {5, 1}, {5, 1}}, 13);     // rows shorter than a packet
    }
  }
}

TEST_CASE("codegen: inner and outer reductions, Sum, Max and Min, with NaN") {
  setup();
  {  // f32: sum over rows of x * y, and exp(x * y) stored
    Builder b(DType::f32, {DType::f32, DType::f32});
    const int m = b.op(OpId::Mul, 0, 1);
    b.out(b.op(OpId::Exp, m), DType::f32);
    b.reduce(FusedReduce::Inner, OpId::Sum, m);
    kernels::DuetFusedFn fn = compiled(b.p);
    REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
    check<float>(fn, b.p, {7, 37}, {{37, 1}, {0, 1}}, 20, false);
    check<float>(fn, b.p, {3, 1000}, {{1000, 1}, {1, 0}}, 21, false);
    check<float>(fn, b.p, {50, 1}, {{1, 1}, {1, 1}}, 22, false);
    check<float>(fn, b.p, {4, 0}, {{0, 1}, {0, 1}}, 23, false);  // empty rows: 0
    check<float>(fn, b.p, {5, 100}, {{300, 3}, {0, 1}}, 24, false);
  }
  {  // f32: max over columns of x - y (NaN propagates), relu stored as b8-free output
    Builder b(DType::f32, {DType::f32, DType::f32});
    const int d = b.op(OpId::Sub, 0, 1);
    b.out(b.op(OpId::Relu, d), DType::f32);
    b.reduce(FusedReduce::Outer, OpId::Max, d);
    kernels::DuetFusedFn fn = compiled(b.p);
    REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
    check<float>(fn, b.p, {40, 37}, {{37, 1}, {0, 1}}, 30);
    check<float>(fn, b.p, {1, 300}, {{300, 1}, {300, 1}}, 31);
    check<float>(fn, b.p, {100, 3}, {{3, 1}, {1, 0}}, 32);
    check<float>(fn, b.p, {0, 20}, {{20, 1}, {20, 1}}, 33);  // no rows: -inf
    check<float>(fn, b.p, {9, 200}, {{400, 2}, {0, 0}}, 34);
  }
  {  // f64: min over rows of the input itself
    Builder b(DType::f64, {DType::f64});
    b.reduce(FusedReduce::Inner, OpId::Min, 0);
    kernels::DuetFusedFn fn = compiled(b.p);
    REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
    check<double>(fn, b.p, {30, 77}, {{77, 1}}, 40);
    check<double>(fn, b.p, {8, 3}, {{1, 8}}, 41);
  }
  {  // f64: sum over columns of where(x < y, x, y), the comparison stored as b8
    Builder b(DType::f64, {DType::f64, DType::f64});
    const int lt = b.op(OpId::Lt, 0, 1);
    b.out(lt, DType::b8);
    b.reduce(FusedReduce::Outer, OpId::Sum, b.op(OpId::Where, lt, 0, 1));
    kernels::DuetFusedFn fn = compiled(b.p);
    REQUIRE(reinterpret_cast<void*>(fn) != nullptr);
    check<double>(fn, b.p, {60, 70}, {{70, 1}, {0, 1}}, 50, false);
    check<double>(fn, b.p, {1, 5}, {{5, 1}, {5, 1}}, 51, false);
    check<double>(fn, b.p, {33, 129}, {{1, 33}, {129, 1}}, 52, false);
  }
}

// Note [One body per reduction] in kernels/codegen/cpu.cpp: a long body runs from one place in
// the loop and a short one unrolled, and both add each row as cascade_packets does, then the
// row's last partial packet one value at a time. The body is also stored, so the sums can be
// redone here from its values, bit for bit. The rows cross the cascade's blocks (64 packets) and
// end in whole groups of four packets, in fewer, and in less than a packet.
TEST_CASE("codegen: a reduction's body, unrolled or run from one place, adds as the cascade") {
  setup();
  using P = Eigen::internal::packet_traits<float>::type;
  constexpr int64_t W = Eigen::internal::unpacket_traits<P>::size;
  for (int len : {2, 30}) {
    CAPTURE(len);
    Builder b(DType::f32, {DType::f32, DType::f32});
    int r = b.op(OpId::Mul, 0, 1);
    for (int k = 1; k < len; ++k)
      r = k % 3 == 0 ? b.op(OpId::Tanh, r) : b.op(k % 3 == 1 ? OpId::Add : OpId::Mul, r, k % 2);
    b.out(r, DType::f32);
    b.reduce(FusedReduce::Inner, OpId::Sum, r);
    const bool one_body =
        detail::generate_fused_source(b.p).find("kOneBody = true") != std::string::npos;
    CHECK(one_body == (len > 2));
    kernels::DuetFusedFn kernel = compiled(b.p);
    REQUIRE(reinterpret_cast<void*>(kernel) != nullptr);
    for (int64_t n : {5, 64, 72, 1000, 2100, 4160}) {
      CAPTURE(n);
      Work g = make_work(b.p, {3, n}, {{n, 1}, {n, 1}}, 70 + static_cast<uint64_t>(n), false);
      const DuetFusedArgs a = g.args();
      kernel(&a, 0, 3);
      for (int64_t i = 0; i < 3; ++i) {
        const float* row = reinterpret_cast<const float*>(g.out[0].data()) + i * n;
        const int64_t full = n / W * W;
        float want = fn::fold_lanes<fn::SumOf<float>>(fn::cascade_packets<P, fn::SumOf<float>>(
            [row](int64_t j) { return Eigen::internal::ploadu<P>(row + j); }, full));
        for (int64_t j = full; j < n; ++j) want += row[j];
        CHECK(std::isfinite(want));
        CHECK(same_bits(red_value<float>(g, i), want));
      }
    }
  }
}

TEST_CASE("codegen: long f32 sums on generated kernels stay within a few ulps") {
  setup();
  check_long_sums_compiled(Device::cpu(), true);
}

TEST_CASE("codegen: the disk cache is hit by a second build, and clear_cache empties it") {
  setup();
  Builder b(DType::f32, {DType::f32, DType::f32});
  b.out(b.op(OpId::Mul, b.op(OpId::Add, 0, 1), 1), DType::f32);
  REQUIRE(reinterpret_cast<void*>(compiled(b.p)) != nullptr);  // built, or a hit of an earlier run
  const codegen::CodegenStats s0 = codegen::stats();
  REQUIRE(reinterpret_cast<void*>(compiled(b.p)) != nullptr);
  const codegen::CodegenStats s1 = codegen::stats();
  CHECK(s1.cache_hits == s0.cache_hits + 1);
  CHECK(s1.built == s0.built);
  CHECK(s1.loaded == s0.loaded + 1);

  const fs::path dir = codegen::cache_dir();
  auto ours = [&] {
    int n = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      n += e.path().filename().string().rfind("duet-", 0) == 0;
    return n;
  };
  CHECK(ours() >= 3);  // a library, its source, the headers
  std::ofstream(dir / "not-ours.txt") << "kept";
  codegen::clear_cache();
  CHECK(ours() == 0);
  CHECK(fs::exists(dir / "not-ours.txt"));
  fs::remove(dir / "not-ours.txt");
}

TEST_CASE("codegen: on a warm disk cache a plan loads its kernels as it is built") {
  setup();
  codegen::set_threshold(3);
  // Constants of their own: a program no other test has.
  auto fn = [](Tensor x, Tensor y) { return sigmoid(x * 1.875 - y) * 0.3125; };
  const Tensor x = full({64}, 0.5), y = full({64}, 0.25);
  {
    auto f = compile(fn);
    for (int i = 0; i < 3; ++i) (void)f(x, y);
    codegen::wait_idle();
  }
  const codegen::CodegenStats s0 = codegen::stats();
  auto g = compile(fn);
  const Tensor out = g(x, y);  // its first call: the plan is built, its kernel found and loaded
  const codegen::CodegenStats s1 = codegen::stats();
  CHECK(s1.loaded == s0.loaded + 1);
  CHECK(s1.cache_hits == s0.cache_hits + 1);
  CHECK(s1.built == s0.built);
  CHECK(close(out, fn(x, y), 1e-6));
  codegen::set_threshold(1);
}

TEST_CASE("codegen: a generated source file names the call sites of its ops") {
  setup();
  codegen::clear_cache();
  int line = 0;
  auto f = compile([&line](Tensor x, Tensor y) {
    line = __LINE__ + 1;
    return tanh(x * 3.25 + y) * 0.125;  // constants of their own: a program no other test has
  });
  const Tensor x = ones({64}), y = ones({64});
  for (int i = 0; i < 3; ++i) (void)f(x, y);
  codegen::wait_idle();
  std::string found;
  for (const fs::directory_entry& e : fs::directory_iterator(codegen::cache_dir())) {
    if (e.path().extension() != ".cpp") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    if (contains(text, "// duet: computes the ops called at ")) found = text;
  }
  INFO(found);
  CHECK(contains(found, fmt::format("// duet: computes the ops called at test_codegen.cpp:{} mul, "
                                    "add, tanh, mul",
                                    line)));
}

TEST_CASE("codegen: switched off or below the threshold, nothing is queued") {
  setup();
  Builder b(DType::f32, {DType::f32});
  b.out(b.op(OpId::Neg, 0), DType::f32);
  auto k = std::make_shared<FusedKernel>();
  k->program = b.p;
  const int64_t queued = codegen::stats().queued;
  codegen::set_enabled(false);
  k->runs = 10;
  detail::codegen_note_run(k);
  CHECK_FALSE(k->codegen_requested.load());
  codegen::set_enabled(true);
  codegen::set_threshold(3);
  k->runs = 2;
  detail::codegen_note_run(k);
  CHECK_FALSE(k->codegen_requested.load());
  k->codegen_allowed = false;
  k->runs = 3;
  detail::codegen_note_run(k);
  CHECK_FALSE(k->codegen_requested.load());
  CHECK(codegen::stats().queued == queued);
  CHECK_THROWS_AS(codegen::set_threshold(-1), ValueError);
  codegen::set_threshold(1);
}

TEST_CASE("codegen: a compiler that fails is reported once, and the interpreter runs on") {
  setup();
  Builder b(DType::f32, {DType::f32});
  b.out(b.op(OpId::Sigmoid, b.op(OpId::Neg, 0)), DType::f32);
  const codegen::CodegenStats s0 = codegen::stats();
  setenv("DUET_CODEGEN_CXX", "/bin/false", 1);
  CHECK(reinterpret_cast<void*>(compiled(b.p)) == nullptr);
  CHECK(reinterpret_cast<void*>(compiled(b.p)) == nullptr);  // not retried
  unsetenv("DUET_CODEGEN_CXX");
  const codegen::CodegenStats s1 = codegen::stats();
  CHECK(s1.queued == s0.queued + 2);
  CHECK(s1.failed == s0.failed + 1);
  CHECK(s1.built == s0.built);

  auto k = std::make_shared<FusedKernel>();
  k->program = b.p;
  Work w = make_work(b.p, {1, 100}, {{0, 1}}, 60);
  k->run(w.args());
  const float* x = reinterpret_cast<const float*>(w.in[0].bytes.data());
  const float* y = reinterpret_cast<const float*>(w.out[0].data());
  for (int i = 0; i < 100; ++i) CHECK(near(y[i], fn::Sigmoid{}(-x[i]), 1e-6));
}

}  // namespace duet::test
