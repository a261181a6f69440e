// The compiled sweep: every row of op_rows.h runs eagerly and through duet::compile, on the
// samples of layouts.h (0-d, empty, broadcast, non-contiguous, expanded, every dtype it lists),
// and the compiled results must match the eager ones: float32 within rtol 1.3e-5 and atol 1.5e-5,
// float64 within 1e-7, integers and bools exactly, with the same shape and dtype; on samples of
// NaN, infinities and signed zeros (special_grid() in util.h) bit for bit where IEEE defines the
// result (ieee_exact()), else with the signs of zeros, and so the Scalar identities the passes
// rewrite (x + -0.0, x - 0.0, x * 1, x / 1) and the constants CSE must keep apart. Each sample
// gets a fresh compiled function that is called twice with one signature: one trace, then a hit.
// Rows that are differentiable also compare gradients: duet::grad through the eager tape against
// duet::grad through the compiled backward, with a random output gradient. Random draws compare
// exactly under the same seed. The last test case checks that no table was skipped: every op in
// core/ops.def ran compiled in some row, and every differentiable op had its gradient compared.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "grad_samples.h"
#include "layouts.h"
#include "op_rows.h"
#include "trace/plan/codegen.h"

namespace duet::test {
namespace {

using L = Layout;
using Ins = std::vector<Tensor>;
using Fn = std::function<Tensor(const Ins&)>;

// ---- what ran ---------------------------------------------------------------------------------

// Per table: the rows that ran compiled, forward samples, gradient comparisons, and whether the
// sweep of the table finished (the completeness check needs every sweep).
struct Tally {
  std::set<std::string> rows;
  int samples = 0, grads = 0;
  bool done = false;
};
std::map<std::string, Tally>& tallies() {
  static std::map<std::string, Tally> t;
  return t;
}
// Per op: forward samples and gradient comparisons of primitive rows (composites do not count,
// as in test_ops.cpp's completeness check).
std::vector<int>& forward_ops() {
  static std::vector<int> v(kNumOps, 0);
  return v;
}
std::vector<int>& grad_ops() {
  static std::vector<int> v(kNumOps, 0);
  return v;
}

void count(const char* table, const std::string& row, OpId op, bool primitive, bool grad) {
  Tally& t = tallies()[table];
  t.rows.insert(row);
  ++(grad ? t.grads : t.samples);
  if (primitive) ++(grad ? grad_ops() : forward_ops())[int(op)];
}

void finish(const char* table, size_t table_rows) {
  Tally& t = tallies()[table];
  t.done = true;
  CHECK_MESSAGE(t.rows.size() == table_rows,
                table << ": " << t.rows.size() << " of " << table_rows << " rows ran compiled");
  MESSAGE(fmt::format("{}: {} rows, {} compiled samples, {} compiled gradients", table,
                      t.rows.size(), t.samples, t.grads));
}

// ---- the comparison ---------------------------------------------------------------------------

double rtol_of(DType d) { return d == DType::f32 ? 1.3e-5 : d == DType::f64 ? 1e-7 : 0; }
double atol_of(DType d) { return d == DType::f32 ? 1.5e-5 : d == DType::f64 ? 1e-7 : 0; }

// How a compiled result must match the eager one.
enum class Match {
  Close,   ///< within the dtype's tolerance (integers and bools exactly), zeros of either sign
  Signed,  ///< Close, but a zero matches only a zero of its sign
  Exact,   ///< the same values
  Bits,    ///< the same bits, element by element: signs of zeros, NaN payloads
};

// The compiled result against the eager one: shape, dtype, then values as `match` says.
void check_same(const Tensor& got, const Tensor& want, Match match, const char* what) {
  INFO(std::string(what));
  REQUIRE(got.defined());
  CHECK(got.sizes().str() == want.sizes().str());
  CHECK(dtype_name(got.dtype()) == dtype_name(want.dtype()));
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) return;
  const DType d = want.dtype();
  if (match == Match::Bits) {
    const std::string m = differences(values(got), values(want), 0, 0, Zeros::Signed);
    CHECK_MESSAGE(bitwise_equal(got, want), (m.empty() ? "the bits of a NaN differ" : m));
    return;
  }
  const bool exact = match == Match::Exact;
  const std::string m =
      differences(values(got), values(want), exact ? 0 : rtol_of(d), exact ? 0 : atol_of(d),
                  match == Match::Signed ? Zeros::Signed : Zeros::Equal);
  CHECK_MESSAGE(m.empty(), m);
}

void check_one_trace(const CompileStats& s) {
  CHECK(s.traces == 1);
  CHECK(s.hits >= 1);
  const std::string why = s.retrace_reasons.empty() ? "" : s.retrace_reasons[0];
  CHECK_MESSAGE(s.retrace_reasons.empty(), "retraced: " << why);
  CHECK(s.eager_calls == 0);
}

// Whether the result aliases each input (shares its storage). A compiled result may alias an
// input only where the eager one does: writing into it must not change what eager leaves alone.
void check_aliasing(const Tensor& got, const Tensor& want, const Ins& in) {
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK_MESSAGE(got.is_same(in[i]) == want.is_same(in[i]),
                  "input " << i << " itself is returned by one and not the other");
    if (in[i].numel() == 0 || got.numel() == 0) continue;  // no storage to speak of
    const bool g = same_storage(got, in[i]), w = same_storage(want, in[i]);
    CHECK_MESSAGE(g == w, "input " << i << ": the compiled result "
                                   << std::string(g ? "shares" : "does not share")
                                   << " its storage, the eager one "
                                   << std::string(w ? "does" : "does not"));
  }
}

// fn eagerly and through a fresh compiled function, called twice with one signature: `make`
// builds new inputs (same shapes, dtypes and layouts, new values) for each call, so a plan that
// kept the first call's values would be caught. One trace, a hit, the inputs left as they were,
// and results aliasing inputs only as eager ones do. With a seed, the generator is seeded before
// each eager run and each compiled call (random draws compare exactly).
void check_forward(const Fn& fn, const std::function<Ins()>& make, Match match = Match::Close,
                   std::optional<uint64_t> seed = {}) {
  auto c = compile([&fn](const Ins& x) { return fn(x); });
  for (const char* call : {"first compiled call", "second compiled call"}) {
    INFO(std::string(call));
    const Ins in = make();
    std::vector<std::vector<double>> before;
    for (const Tensor& t : in) before.push_back(values(t));
    if (seed) manual_seed(*seed);
    const Tensor want = fn(in);
    if (seed) manual_seed(*seed);
    const Tensor got = c(in);
    check_same(got, want, match, "output");
    check_aliasing(got, want, in);
    for (size_t i = 0; i < in.size(); ++i) {
      const std::string m = differences(values(in[i]), before[i], 0, 0);
      CHECK_MESSAGE(m.empty(), "input " << i << " was modified: " << m);
    }
  }
  check_one_trace(c.stats());
}

// The gradients of fn with respect to its inputs from `make` that require grad (f32 or f64
// leaves; others, as where's condition, are constants), weighted by a random output gradient:
// eager against the compiled backward, on two calls of one compiled function with new inputs of
// the same signature.
void check_backward(const Fn& fn, const std::function<Ins()>& make, Rng& rng) {
  auto c = compile([&fn](const Ins& x) { return fn(x); });
  for (const char* call : {"first compiled call", "second compiled call"}) {
    INFO(std::string(call));
    const Ins in = make();
    Ins leaves;
    for (const Tensor& t : in)
      if (t.requires_grad()) leaves.push_back(t);
    REQUIRE(!leaves.empty());
    const Tensor want = fn(in);
    REQUIRE(want.requires_grad());
    const Tensor gout = make_layout(random_values(want.numel(), Domain{-2, 2}, want.dtype(), rng),
                                    want.sizes(), want.dtype(), L::Contiguous);
    const Ins gw = grad({want}, leaves, {gout});
    const Tensor got = c(in);
    check_same(got, want, Match::Close, "output");
    REQUIRE(got.requires_grad());
    const Ins gg = grad({got}, leaves, {gout});
    REQUIRE(gg.size() == gw.size());
    for (size_t i = 0; i < gg.size(); ++i) {
      INFO("gradient of input " << i);
      check_same(gg[i], gw[i], Match::Close, "gradient");
    }
    for (const Tensor& l : leaves) {
      CHECK(l.is_leaf());          // the compiled backward lands on the output, not on it
      CHECK(!l.grad().defined());  // grad() leaves .grad alone
    }
  }
  check_one_trace(c.stats());
  // Under NoGradGuard the same inputs give the same values and nothing to differentiate (but an
  // argument returned as is, contiguous() of a contiguous leaf, still requires grad).
  NoGradGuard no_grad;
  auto n = compile([&fn](const Ins& x) { return fn(x); });
  const Ins in = make();
  const Tensor want = fn(in);
  for (const char* call : {"first call without grad", "second call without grad"}) {
    const Tensor got = n(in);
    check_same(got, want, Match::Close, call);
    CHECK(got.requires_grad() == want.requires_grad());
    CHECK(got.is_leaf());
  }
  check_one_trace(n.stats());
}

// check_backward with only input `only` requiring grad, the others detached (constants): the
// compiled backward differentiates with respect to a subset of the arguments.
void check_backward_only(const Fn& fn, const std::function<Ins()>& make, size_t only, Rng& rng) {
  INFO("only input " << only << " requires grad");
  check_backward(
      fn,
      [&] {
        Ins in = make();
        for (size_t i = 0; i < in.size(); ++i)
          if (i != only) in[i] = in[i].detach();
        return in;
      },
      rng);
}

bool differentiable(OpId op) { return detail::op_def(op).differentiable; }
bool has(const std::vector<DType>& v, DType d) {
  return std::find(v.begin(), v.end(), d) != v.end();
}

// n distinct values of [d.lo, d.hi] on a grid of step 1/64, shifted by a fraction of the step
// that depends on the input (as in test_op_grads.cpp): no ties between inputs and none at 0, so
// gradients are compared away from kinks, where a rule's convention could differ.
std::vector<double> smooth_values(int64_t n, const Domain& d, int input, Rng& rng) {
  const double h = 1.0 / 64, shift = h * (0.2 + 0.25 * input);
  const auto k0 = static_cast<int64_t>(std::ceil((d.lo - shift) / h));
  const auto k1 = static_cast<int64_t>(std::floor((d.hi - shift) / h));
  REQUIRE(k1 - k0 + 1 >= n);
  std::set<int64_t> used;
  std::vector<double> v;
  while (static_cast<int64_t>(v.size()) < n) {
    const int64_t k = k0 + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(k1 - k0 + 1));
    if (used.insert(k).second) v.push_back(static_cast<double>(k) * h + shift);
  }
  return v;
}

Tensor leaf(const std::vector<double>& v, const Shape& shape, DType dt, Layout layout) {
  Tensor t = make_layout(v, shape, dt, layout);
  REQUIRE(t.is_leaf());
  t.requires_grad_();
  return t;
}

constexpr int64_t kBig = 10000;  // elements: samples above run once per elementwise row only

// ---- elementwise rows -------------------------------------------------------------------------

bool is_big(const Sample& s) { return s.shapes[0].numel() > kBig; }

Scalar to_scalar(double v, DType dt) {
  if (dt == DType::b8) return Scalar(v != 0);
  if (is_integral(dt)) return Scalar(static_cast<int64_t>(v));
  return Scalar(v);
}

// The inputs of `row` on special_grid() (NaN, infinities, signed zeros) in the float dtype dt (a
// where's condition in b8), of shape (n / 8, 8) laid out as asked; input `skip` is left out (the
// caller passes it as a Scalar). `call` 1 reverses the values: the second call of a compiled
// function gets new values of the same signature.
Ins special_ins(const ElementwiseRow& row, DType dt, Layout layout, int call, int skip = -1) {
  std::vector<bool> cond;
  for (int i = 0; i < row.arity; ++i)
    if (i != skip) cond.push_back(row.cond_first && i == 0);
  Ins in;
  for (size_t k = 0; k < cond.size(); ++k) {
    std::vector<double> v = special_grid(cond)[k];
    if (call == 1) std::reverse(v.begin(), v.end());
    in.push_back(
        make_layout(v, {static_cast<int64_t>(v.size()) / 8, 8}, cond[k] ? DType::b8 : dt, layout));
  }
  return in;
}

// How compiled results on special values must match eager ones: bit for bit where IEEE defines
// the result (the same functors run both ways), else within the tolerance with the signs of
// zeros, NaN and infinities where eager has them. A composite is a chain of such ops, whose
// generated code may take a commutative op's operands in the other order: a NaN's payload
// (which x86 takes from the first NaN operand) may differ, as the reference check allows.
Match special_match(const ElementwiseRow& row) {
  return ieee_exact(row.op) && !row.composite ? Match::Bits : Match::Signed;
}

}  // namespace

TEST_CASE("compiled elementwise rows: every sample and dtype match eager") {
  Rng rng(101);
  for (const ElementwiseRow& row : elementwise_rows()) {
    const Fn fn = [&](const Ins& x) { return row.fn(x); };
    for (DType dt : row.dtypes) {
      for (const Sample& s : samples(kCompiledSweep)) {
        if (row.arity < s.min_arity) continue;
        if (is_big(s) && dt != row.dtypes[0]) continue;
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s.name));
        check_forward(fn, [&] { return build(row, {dt}, s, rng).in; });
        count("elementwise", row.name, row.op, !row.composite, false);
      }
      // Contiguous inputs at offset 0, then at an offset into a larger buffer: one signature.
      INFO(std::string(row.name) << " on " << dtype_name(dt) << ", normal then offset");
      int calls = 0;
      check_forward(
          fn, [&] { return build(row, {dt}, sample(calls++ ? "offset" : "normal"), rng).in; });
      count("elementwise", row.name, row.op, !row.composite, false);
    }
  }
}

// Every elementwise row on the same two inputs: the ops are siblings, so fusion makes them one
// group (a few, where a dtype or a cast splits them), one kernel each. In
// test_compile_sweep_codegen (DUET_CODEGEN=1, threshold 0) the first call queues the kernels'
// generated C++, codegen::wait_idle() waits until it is built and swapped in, and the second call
// runs the generated code that users get: both calls must equal eager. With DUET_CODEGEN=0 the
// call runs the interpreter.
TEST_CASE("compiled elementwise rows as one fused kernel, on generated code too") {
  const bool generated = codegen::enabled();
  if (generated) codegen::set_threshold(0);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dtype_name(dt));
    auto all = [dt](const Tensor& x, const Tensor& y) {
      std::vector<Tensor> out;
      for (const ElementwiseRow& row : elementwise_rows()) {
        if (std::find(row.dtypes.begin(), row.dtypes.end(), dt) == row.dtypes.end()) continue;
        if (row.cond_first)
          out.push_back(row.fn({gt(x, y), x, y}));
        else if (row.arity == 1)
          out.push_back(row.fn({x}));
        else if (row.arity == 2)
          out.push_back(row.fn({x, y}));
      }
      return out;
    };
    manual_seed(17);
    // In (0.5, 2): inside every row's domain (log, sqrt, rsqrt, pow, div).
    const Tensor x = rand({37, 29}, Options().dtype(dt)) * 1.5 + 0.5;
    const Tensor y = rand({37, 29}, Options().dtype(dt)) * 1.5 + 0.5;
    const std::vector<Tensor> want = all(x, y);
    REQUIRE(want.size() >= 20);
    auto f = compile(all);
    const int64_t loaded_before = codegen::stats().loaded;
    for (int tier = 0; tier < (generated ? 2 : 1); ++tier) {
      INFO(std::string(tier == 0 ? "first call" : "on generated kernels"));
      const std::vector<Tensor> got = f(x, y);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK_MESSAGE(close(got[i], want[i], 1e-6), i);
      CHECK(f.stats().fused_kernels >= 1);
      if (generated && tier == 0) {
        codegen::wait_idle();
        CHECK(codegen::stats().failed == 0);
        CHECK(codegen::stats().loaded > loaded_before);  // the second call runs generated code
      }
    }
  }
}

TEST_CASE("compiled elementwise rows: Scalar operands, rvalue operands, mixed dtypes") {
  Rng rng(102);
  for (const ElementwiseRow& row : elementwise_rows()) {
    for (DType dt : row.dtypes) {
      for (const char* name : {"normal", "transposed"}) {
        const Sample& s = sample(name);
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", sample " << std::string(s.name));
        if (row.fn_scalar) {
          INFO("a Scalar last operand");
          const Scalar v = to_scalar(random_values(1, row.domains.back(), dt, rng)[0], dt);
          check_forward([&](const Ins& x) { return row.fn_scalar(x, v); },
                        [&] {
                          Ins in = build(row, {dt}, s, rng).in;
                          in.pop_back();
                          return in;
                        });
          count("elementwise", row.name, row.op, !row.composite, false);
        }
        if (row.fn_lscalar) {
          INFO("a Scalar first operand");
          const Scalar v = to_scalar(random_values(1, row.domains[0], dt, rng)[0], dt);
          check_forward([&](const Ins& x) { return row.fn_lscalar(v, x); },
                        [&] {
                          Ins in = build(row, {dt}, s, rng).in;
                          in.erase(in.begin());
                          return in;
                        });
          count("elementwise", row.name, row.op, !row.composite, false);
        }
        if (row.fn_rvalue) {
          // A temporary that nobody else holds: eager may write the result into its buffer;
          // the trace records that as a pure op on a value of its own.
          INFO("an rvalue temporary");
          check_forward(
              [&](const Ins& x) {
                Ins in = x;
                in[0] = x[0].clone();
                return row.fn_rvalue(std::move(in));
              },
              [&] { return build(row, {dt}, s, rng).in; });
          count("elementwise", row.name, row.op, !row.composite, false);
        }
      }
    }
    // The identities 0, -0.0 and 1 as Scalar operands: the passes drop x + -0.0, x - 0.0, x * 1
    // and x / 1 (not x + 0.0: -0.0 + 0.0 is +0.0), and the result must still be a tensor of its
    // own. Float inputs hold NaN, infinities and signed zeros, and the results must have eager's
    // bits.
    for (DType dt : row.dtypes)
      for (double id : {0.0, -0.0, 1.0}) {
        const bool special = is_floating(dt);
        if (!special && std::signbit(id)) continue;  // -0.0 is 0 in integers
        INFO(std::string(row.name) << " on " << dtype_name(dt) << " with the Scalar " << id);
        const Scalar v = to_scalar(id, dt);
        const Match match = special ? Match::Bits : Match::Close;
        for (int skip : {row.arity - 1, 0}) {
          if (skip == 0 ? !row.fn_lscalar : !row.fn_scalar) continue;
          int calls = 0;
          auto make_in = [&] {
            if (special) return special_ins(row, dt, L::Contiguous, calls++ % 2, skip);
            Ins in = build(row, {dt}, sample("normal"), rng).in;
            in.pop_back();
            return in;
          };
          if (skip == 0)
            check_forward([&](const Ins& x) { return row.fn_lscalar(v, x); }, make_in, match);
          else
            check_forward([&](const Ins& x) { return row.fn_scalar(x, v); }, make_in, match);
        }
      }
    // Two value operands of different dtypes promote as eager does.
    if (row.arity - (row.cond_first ? 1 : 0) != 2) continue;
    for (DType da : row.dtypes)
      for (DType db : row.dtypes) {
        if (da == db) continue;
        for (const char* name : {"mixed layouts", "broadcast (3,1) (1,4) (4)"}) {
          INFO(std::string(row.name) << " on " << dtype_name(da) << " and " << dtype_name(db)
                                     << ", sample " << std::string(name));
          check_forward([&](const Ins& x) { return row.fn(x); },
                        [&] {
                          return build(row, {da, db}, sample(name), rng).in;
                        });
          count("elementwise", row.name, row.op, !row.composite, false);
        }
      }
  }
}

TEST_CASE("compiled elementwise rows on NaN, infinities and signed zeros match eager") {
  for (const ElementwiseRow& row : elementwise_rows()) {
    for (DType dt : row.dtypes) {
      if (!is_floating(dt)) continue;
      const Match match = special_match(row);
      for (Layout layout : {L::Contiguous, L::Transposed}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", " << std::string(layout_name(layout)));
        int calls = 0;
        check_forward([&](const Ins& x) { return row.fn(x); },
                      [&] { return special_ins(row, dt, layout, calls++ % 2); }, match);
        count("elementwise", row.name, row.op, !row.composite, false);
      }
      // Every special value as a Scalar operand, all in one graph (x * 0.0 beside x * -0.0, a
      // NaN beside infinities): the passes must keep each constant apart.
      for (int skip : {row.arity - 1, 0}) {
        if (skip == 0 ? !row.fn_lscalar : !row.fn_scalar) continue;
        INFO(std::string(row.name) << " on " << dtype_name(dt) << ", each special value as the "
                                   << std::string(skip == 0 ? "first" : "last") << " operand");
        const Fn fn = [&](const Ins& x) {
          Ins r;
          for (double v : special_values())
            r.push_back(skip == 0 ? row.fn_lscalar(to_scalar(v, dt), x)
                                  : row.fn_scalar(x, to_scalar(v, dt)));
          return cat(r, 0);
        };
        int calls = 0;
        check_forward(
            fn, [&] { return special_ins(row, dt, L::Contiguous, calls++ % 2, skip); }, match);
        count("elementwise", row.name, row.op, !row.composite, false);
      }
    }
  }
}

namespace {

// The sweep runs the eager sweep's samples, the empty ones included.
std::vector<GradSample> all_grad_samples() {
  std::vector<GradSample> s = grad_samples();
  s.insert(s.end(), empty_samples().begin(), empty_samples().end());
  return s;
}

}  // namespace

TEST_CASE("compiled elementwise rows: gradients match eager") {
  Rng rng(103);
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (!differentiable(row) || !has(row.dtypes, DType::f64)) continue;
    for (DType dt : {DType::f32, DType::f64}) {
      for (const GradSample& s : all_grad_samples()) {
        if (row.arity < s.min_arity) continue;
        INFO(std::string(row.name) << " on " << dtype_name(dt) << ", " << std::string(s.name));
        // where's condition is a b8 argument that does not require grad.
        auto make_args = [&] {
          Ins args;
          for (int i = 0; i < row.arity; ++i) {
            const Shape ls = leaf_shape(s, i);
            if (row.cond_first && i == 0)
              args.push_back(make_layout(random_values(ls.numel(), Domain{}, DType::b8, rng), ls,
                                         DType::b8, s.layouts[i]));
            else
              args.push_back(leaf(smooth_values(ls.numel(), grad_domains(row)[i], i, rng), ls, dt,
                                  s.layouts[i]));
          }
          return args;
        };
        const Fn fn = [&](const Ins& x) {
          Ins in;
          for (size_t k = 0; k < x.size(); ++k) in.push_back(take(x[k], s, int(k)));
          return row.fn(in);
        };
        check_backward(fn, make_args, rng);
        count("elementwise", row.name, row.op, !row.composite, true);
        // Each value operand alone requiring grad, on the broadcast samples.
        if (row.arity - (row.cond_first ? 1 : 0) < 2 || s.min_arity < 2) continue;
        for (int only = row.cond_first ? 1 : 0; only < row.arity; ++only) {
          check_backward_only(fn, make_args, size_t(only), rng);
          count("elementwise", row.name, row.op, !row.composite, true);
        }
        // Operands of both float dtypes: the result promotes to f64, and each gradient comes
        // back in its leaf's dtype.
        if (dt != DType::f32) continue;
        INFO("the last operand f64");
        check_backward(
            fn,
            [&] {
              Ins args = make_args();
              Tensor& last = args.back();
              last = last.detach().to(DType::f64).requires_grad_();
              return args;
            },
            rng);
        count("elementwise", row.name, row.op, !row.composite, true);
      }
      // A Scalar operand, (3, 4).
      const GradSample& s = grad_samples()[1];
      INFO(std::string(row.name) << " on " << dtype_name(dt) << ", (3, 4) with a Scalar");
      if (row.fn_scalar && !row.cond_first) {
        const Scalar v(smooth_values(1, grad_domains(row)[row.arity - 1], row.arity - 1, rng)[0]);
        auto make_leaves = [&] {
          Ins leaves;
          for (int i = 0; i + 1 < row.arity; ++i)
            leaves.push_back(leaf(smooth_values(12, grad_domains(row)[i], i, rng), s.shapes[i], dt,
                                  L::Contiguous));
          return leaves;
        };
        check_backward([&](const Ins& x) { return row.fn_scalar(x, v); }, make_leaves, rng);
        count("elementwise", row.name, row.op, !row.composite, true);
      }
      if (row.fn_lscalar) {
        const Scalar v(smooth_values(1, grad_domains(row)[0], 0, rng)[0]);
        auto make_leaves = [&] {
          Ins leaves;
          for (int i = 1; i < row.arity; ++i)
            leaves.push_back(leaf(smooth_values(12, grad_domains(row)[i], i, rng), s.shapes[i], dt,
                                  L::Transposed));
          return leaves;
        };
        check_backward([&](const Ins& x) { return row.fn_lscalar(v, x); }, make_leaves, rng);
        count("elementwise", row.name, row.op, !row.composite, true);
      }
      if (row.fn_rvalue) {
        // An expiring operand that requires grad: eager must not reuse a buffer a node saved,
        // and the trace records the reuse as a pure op.
        INFO("an rvalue operand that requires grad");
        auto make_leaves = [&] {
          Ins leaves;
          for (int i = 0; i < row.arity; ++i)
            leaves.push_back(leaf(smooth_values(12, grad_domains(row)[i], i, rng), s.shapes[i], dt,
                                  L::Contiguous));
          return leaves;
        };
        check_backward(
            [&](const Ins& x) {
              Ins in = x;
              in[0] = x[0] * 1.5;
              return row.fn_rvalue(std::move(in));
            },
            make_leaves, rng);
        count("elementwise", row.name, row.op, !row.composite, true);
      }
    }
  }
}

TEST_CASE("compiled elementwise rows: not differentiable ops stay out of autograd") {
  Rng rng(104);
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (differentiable(row)) continue;
    INFO(std::string(row.name));
    Ins in;
    for (int i = 0; i < row.arity; ++i)
      in.push_back(
          leaf(smooth_values(12, row.domains[i], i, rng), {3, 4}, DType::f64, L::Contiguous));
    auto c = compile([&](const Ins& x) { return row.fn(x); });
    for (int call = 0; call < 2; ++call) {
      const Tensor got = c(in);
      CHECK(!got.requires_grad());
      check_same(got, row.fn(in), Match::Close, "output");
    }
    check_one_trace(c.stats());
  }
  finish("elementwise", elementwise_rows().size());
}

// ---- conversions ------------------------------------------------------------------------------

TEST_CASE("compiled conversion rows: every dtype pair and layout; gradients") {
  const std::vector<ConversionCase> cases = conversion_cases(kCompiledSweep);
  Rng rng(105);
  for (const ConversionRow& row : conversion_rows()) {
    for (DType from : kAllDTypes) {
      for (DType to : kAllDTypes) {
        if (row.keeps_dtype && to != from) continue;
        for (const ConversionCase& c : cases) {
          INFO(std::string(row.name) << " " << dtype_name(from) << " -> " << dtype_name(to) << ", "
                                     << std::string(c.name));
          const Shape& made = c.small.size() ? c.small : c.shape;
          check_forward([&](const Ins& x) { return row.fn(x[0], to); },
                        [&] {
                          std::vector<double> v =
                              random_values(made.numel(), Domain{-50, 50, -50, 50}, from, rng);
                          return Ins{make_sample(v, made, c.shape, from, c.layout)};
                        });
          count("conversion", row.name, row.op, !row.composite, false);
        }
      }
    }
    // Gradients through f32 <-> f64 (clone and contiguous keep the dtype), the leaf expanded
    // inside where the case says so.
    for (const ConversionCase& c : cases) {
      if (c.layout == L::Offset) continue;
      for (DType dt : {DType::f32, DType::f64}) {
        const DType to = row.keeps_dtype ? dt : dt == DType::f64 ? DType::f32 : DType::f64;
        INFO(std::string(row.name) << " " << dtype_name(dt) << " -> " << dtype_name(to) << ", "
                                   << std::string(c.name) << ", gradient");
        const Shape& ls = c.small.size() ? c.small : c.shape;
        check_backward(
            [&](const Ins& x) { return row.fn(c.small.size() ? expand(x[0], c.shape) : x[0], to); },
            [&] {
              return Ins{leaf(smooth_values(ls.numel(), Domain{}, 0, rng), ls, dt, c.layout)};
            },
            rng);
        count("conversion", row.name, row.op, !row.composite, true);
      }
    }
  }
  finish("conversion", conversion_rows().size());
}

// ---- reductions -------------------------------------------------------------------------------

TEST_CASE("compiled reduce rows: dims sets, keepdim, layouts, dtypes; gradients") {
  struct Case {
    const char* name;
    Shape shape;
    Layout layout;
    std::vector<std::vector<int64_t>> dims;
    Shape small = {};
  };
  const std::vector<std::vector<int64_t>> rank3 = {{},     {0},    {1},      {2},       {-1},
                                                   {0, 2}, {2, 0}, {-1, -3}, {0, 1, 2}, {1, -1}};
  const std::vector<Case> cases = {
      {"0-d", {}, L::Contiguous, {{}, {0}, {-1}}},
      {"rank 1", {7}, L::Contiguous, {{}, {0}}},
      {"rank 3", {2, 3, 4}, L::Contiguous, rank3},
      {"rank 3 transposed", {2, 3, 4}, L::Transposed, {{}, {1}, {-1}, {0, 2}}},
      {"rank 3 strided", {2, 3, 4}, L::Strided, {{}, {0}, {2}, {1, -1}}},
      {"size-1 dims", {1, 3, 1}, L::Contiguous, {{}, {0}, {1}, {0, 2}}},
      {"empty", {2, 0, 3}, L::Contiguous, {{}, {0}, {1}, {2}, {0, 2}}},
      {"expanded", {3, 4}, L::Contiguous, {{}, {0}, {1}}, {1, 4}},
      {"expanded column", {5, 3}, L::Transposed, {{}, {0}, {1}}, {5, 1}},
      {"offset 0-d", {}, L::Offset, {{}, {0}}},
  };
  Rng rng(106);
  for (const ReduceRow& row : reduce_rows()) {
    const bool extremum = row.kind == ReduceKind::Max || row.kind == ReduceKind::Min;
    for (const Case& c : cases) {
      const Shape& made = c.small.size() ? c.small : c.shape;
      for (const auto& dims : c.dims) {
        bool reduces_empty = dims.empty() && c.shape.numel() == 0;
        for (int64_t d : dims)
          if (c.shape.size()) reduces_empty |= c.shape[d < 0 ? d + c.shape.size() : d] == 0;
        for (bool keepdim : {false, true}) {
          const Fn fn = [&](const Ins& x) { return row.fn(x[0], Dims(dims), keepdim); };
          for (DType dt : row.dtypes) {
            INFO(std::string(row.name)
                 << " on " << dtype_name(dt) << ", " << std::string(c.name) << ", dims "
                 << Dims(dims).str() << std::string(keepdim ? ", keepdim" : ""));
            auto make_x = [&] {
              std::vector<double> v = random_values(made.numel(), Domain{-3, 3, -9, 9}, dt, rng);
              return Ins{make_sample(v, made, c.shape, dt, c.layout)};
            };
            if (extremum && reduces_empty) {
              const Ins x = make_x();
              // An error eagerly; the trace runs the same shape rule, so the same error.
              CHECK_THROWS_AS(fn(x), ValueError);
              auto cf = compile([&](const Ins& in) { return fn(in); });
              CHECK_THROWS_AS(cf(x), ValueError);
              count("reduce", row.name, row.op, !row.composite, false);
              continue;
            }
            check_forward(fn, make_x);
            count("reduce", row.name, row.op, !row.composite, false);
          }
          if (extremum && reduces_empty) continue;
          // Gradients, the leaf expanded inside where the case says so (max and min then tie
          // across the copies and split the gradient).
          if (c.layout == L::Offset) continue;
          for (DType dt : {DType::f32, DType::f64}) {
            INFO(std::string(row.name)
                 << " on " << dtype_name(dt) << ", " << std::string(c.name) << ", dims "
                 << Dims(dims).str() << std::string(keepdim ? ", keepdim" : "") << ", gradient");
            check_backward(
                [&](const Ins& x) {
                  return row.fn(c.small.size() ? expand(x[0], c.shape) : x[0], Dims(dims), keepdim);
                },
                [&] {
                  return Ins{
                      leaf(smooth_values(made.numel(), Domain{}, 0, rng), made, dt, c.layout)};
                },
                rng);
            count("reduce", row.name, row.op, !row.composite, true);
          }
        }
      }
    }
  }
  finish("reduce", reduce_rows().size());
}

// ---- views ------------------------------------------------------------------------------------

TEST_CASE("compiled view rows: every dtype and input layout; gradients") {
  Rng rng(107);
  for (const ViewRow& row : view_rows()) {
    const Fn fn = [&](const Ins& x) { return row.fn(x[0]); };
    for (Layout layout : {L::Contiguous, L::Transposed, L::Strided, L::Offset}) {
      for (DType dt : kAllDTypes) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", input " << std::string(layout_name(layout)));
        check_forward(fn, [&] {
          return Ins{make_layout(random_values(row.in.numel(), Domain{-9, 9}, dt, rng), row.in, dt,
                                 layout)};
        });
        count("view", row.name, row.op, !row.composite, false);
      }
      if (layout == L::Offset) continue;
      for (DType dt : {DType::f32, DType::f64}) {
        INFO(std::string(row.name) << " on " << dtype_name(dt) << ", input "
                                   << std::string(layout_name(layout)) << ", gradient");
        check_backward(
            fn,
            [&] {
              return Ins{leaf(smooth_values(row.in.numel(), Domain{}, 0, rng), row.in, dt, layout)};
            },
            rng);
        count("view", row.name, row.op, !row.composite, true);
      }
    }
  }
  finish("view", view_rows().size());
}

// ---- slice_scatter ----------------------------------------------------------------------------

TEST_CASE("compiled scatter rows: slice_scatter on every dtype and layout; gradients") {
  Rng rng(108);
  const std::vector<std::pair<Layout, Layout>> layouts = {{L::Contiguous, L::Contiguous},
                                                          {L::Transposed, L::Strided},
                                                          {L::Strided, L::Transposed},
                                                          {L::Offset, L::Offset}};
  for (const ScatterRow& row : scatter_rows()) {
    const Fn fn = [&](const Ins& x) {
      return slice_scatter(x[0], x[1], row.dim, row.start, row.end, row.step);
    };
    for (auto [lb, ls] : layouts) {
      for (DType dt : kAllDTypes) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", base " << std::string(layout_name(lb)) << ", source "
             << std::string(layout_name(ls)));
        check_forward(fn, [&] {
          std::vector<double> vb = random_values(row.base.numel(), Domain{-9, 9}, dt, rng);
          std::vector<double> vs = random_values(row.src.numel(), Domain{-9, 9}, dt, rng);
          return Ins{make_layout(vb, row.base, dt, lb), make_layout(vs, row.src, dt, ls)};
        });
        count("slice_scatter", row.name, OpId::SliceScatter, true, false);
      }
      if (lb == L::Offset) continue;
      for (DType dt : {DType::f32, DType::f64}) {
        INFO(std::string(row.name) << " on " << dtype_name(dt) << ", base "
                                   << std::string(layout_name(lb)) << ", gradient");
        check_backward(
            fn,
            [&] {
              return Ins{leaf(smooth_values(row.base.numel(), Domain{}, 0, rng), row.base, dt, lb),
                         leaf(smooth_values(row.src.numel(), Domain{}, 1, rng), row.src, dt, ls)};
            },
            rng);
        count("slice_scatter", row.name, OpId::SliceScatter, true, true);
      }
    }
  }
  finish("slice_scatter", scatter_rows().size());
}

// ---- sources ----------------------------------------------------------------------------------

TEST_CASE("compiled source rows: creation functions with no arguments") {
  for (const SourceRow& row : source_rows()) {
    INFO(std::string(row.name));
    const Tensor want = row.fn();
    auto c = compile([&] { return row.fn(); });
    for (const char* call : {"first compiled call", "second compiled call"}) {
      const Tensor got = c();
      check_same(got, want, Match::Exact, call);
      CHECK(got.is_contiguous());
      CHECK(!got.requires_grad());
    }
    check_one_trace(c.stats());
    // Each call returns a tensor of its own, even when the graph folded to a constant.
    CHECK((c().numel() == 0 || !same_storage(c(), c())));
    // Through a function of an argument too: the source combined with a traced value.
    if (is_floating(row.dtype) && row.shape.numel() > 0) {
      Rng rng(109);
      check_forward([&](const Ins& in) { return in[0] * row.fn() + row.fn(); },
                    [&] {
                      return Ins{make(random_values(row.shape.numel(), Domain{}, row.dtype, rng),
                                      row.shape, row.dtype)};
                    });
    }
    count("source", row.name, row.op, true, false);
  }
  finish("source", source_rows().size());
}

// ---- matmul -----------------------------------------------------------------------------------

TEST_CASE("compiled matmul rows: shapes, layouts and dtypes; gradients") {
  Rng rng(110);
  const Fn fn = [](const Ins& x) { return matmul(x[0], x[1]); };
  for (const MatmulRow& row : matmul_rows()) {
    const bool big = row.a.numel() > kBig || row.b.numel() > kBig;
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
      if (big && dt != DType::f32) continue;  // one sample of the large rows
      INFO("matmul " << std::string(row.name) << " on " << dtype_name(dt));
      const Domain dom{-1, 1, -3, 3};
      check_forward(fn, [&] {
        return Ins{make_layout(random_values(row.a.numel(), dom, dt, rng), row.a, dt, row.la),
                   make_layout(random_values(row.b.numel(), dom, dt, rng), row.b, dt, row.lb)};
      });
      count("matmul", row.name, OpId::MatMul, true, false);
    }
    if (big) continue;
    for (DType dt : {DType::f32, DType::f64}) {
      INFO("matmul " << std::string(row.name) << " on " << dtype_name(dt) << ", gradient");
      check_backward(
          fn,
          [&] {
            return Ins{
                leaf(smooth_values(row.a.numel(), Domain{-1, 1}, 0, rng), row.a, dt, row.la),
                leaf(smooth_values(row.b.numel(), Domain{-1, 1}, 1, rng), row.b, dt, row.lb)};
          },
          rng);
      count("matmul", row.name, OpId::MatMul, true, true);
      if (row.la != L::Contiguous || row.lb != L::Contiguous) continue;
      for (size_t only : {0, 1}) {
        check_backward_only(
            fn,
            [&] {
              return Ins{
                  leaf(smooth_values(row.a.numel(), Domain{-1, 1}, 0, rng), row.a, dt, row.la),
                  leaf(smooth_values(row.b.numel(), Domain{-1, 1}, 1, rng), row.b, dt, row.lb)};
            },
            only, rng);
        count("matmul", row.name, OpId::MatMul, true, true);
      }
    }
  }
  finish("matmul", matmul_rows().size());
}

// ---- op rows: indexing, joining, images, normalizations, losses, random draws ----------------

namespace {

enum class Variant { Contiguous, Transposed, Strided, Offset, Expanded };
const char* variant_name(Variant v) {
  static const char* names[] = {"contiguous", "transposed", "strided", "offset", "expanded"};
  return names[int(v)];
}

// The inputs of `row` in dtype dt laid out as `v` (test_ops.cpp's rule). False when the variant
// would change no input.
bool build_inputs(const OpRow& row, DType dt, Variant v, Rng& rng, Ins* in) {
  bool changed = v == Variant::Contiguous || v == Variant::Offset;
  for (size_t i = 0; i < row.shapes.size(); ++i) {
    const Shape& s = row.shapes[i];
    const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
    if (v == Variant::Expanded && s.size() >= 1 && s[0] > 1) {
      Shape small = s;
      small[0] = 1;
      in->push_back(expand(make(random_values(small.numel(), d, dt, rng), small, dt), s));
      changed = true;
      continue;
    }
    const Layout l = s.numel() == 0             ? L::Contiguous
                     : v == Variant::Transposed ? L::Transposed
                     : v == Variant::Strided    ? L::Strided
                     : v == Variant::Offset     ? L::Offset
                                                : L::Contiguous;
    changed |= (l == L::Transposed && s.size() >= 2) || (l == L::Strided && s.size() >= 1);
    in->push_back(make_layout(random_values(s.numel(), d, dt, rng), s, dt, l));
  }
  return changed;
}

bool is_big(const OpRow& r) {
  int64_t n = r.out.numel();
  for (const Shape& s : r.shapes) n = std::max(n, s.numel());
  return n > kBig;
}

bool expandable(const Shape& s) { return s.size() >= 2 && s[0] > 1; }

}  // namespace

TEST_CASE("compiled op rows: every dtype and input layout") {
  Rng rng(111);
  for (const OpRow& row : op_rows()) {
    // Random draws (rows without inputs) compare exactly, seeded before each run; the rows
    // seed inside the call too.
    const bool draw = row.shapes.empty();
    for (DType dt : row.dtypes) {
      for (Variant v : {Variant::Contiguous, Variant::Transposed, Variant::Strided, Variant::Offset,
                        Variant::Expanded}) {
        if ((draw || is_big(row)) && v != Variant::Contiguous) continue;
        if (is_big(row) && dt != row.dtypes[0]) continue;  // one sample of the large rows
        Ins first;
        if (!build_inputs(row, dt, v, rng, &first)) continue;
        INFO(row.name << " on " << dtype_name(dt) << ", " << std::string(variant_name(v))
                      << " inputs");
        // The second call's inputs are new; contiguous ones sit at an offset (one signature).
        int calls = 0;
        auto make_in = [&] {
          if (calls++ == 0) return first;
          Ins in;
          build_inputs(row, dt, v == Variant::Contiguous ? Variant::Offset : v, rng, &in);
          return in;
        };
        check_forward(row.fn, make_in, draw ? Match::Exact : Match::Close,
                      draw ? std::optional<uint64_t>(1234) : std::nullopt);
        count("op", row.name, row.op, !row.composite, false);
      }
    }
  }
}

TEST_CASE("compiled op rows: gradients on contiguous, transposed, strided and expanded leaves") {
  Rng rng(112);
  enum class V { Contiguous, Transposed, Strided, Expanded };
  for (const OpRow& row : op_rows()) {
    if (!row.grad || row.index_result || row.shapes.empty()) continue;
    for (V v : {V::Contiguous, V::Transposed, V::Strided, V::Expanded}) {
      bool changes = v == V::Contiguous;
      for (const Shape& s : row.shapes)
        changes |= (v == V::Transposed && s.size() >= 2) || (v == V::Strided && s.size() >= 1) ||
                   (v == V::Expanded && expandable(s));
      if (!changes) continue;
      const Fn fn = [&](const Ins& x) {
        Ins in = x;
        for (size_t i = 0; v == V::Expanded && i < in.size(); ++i)
          if (expandable(row.shapes[i])) in[i] = expand(x[i], row.shapes[i]);
        return row.fn(in);
      };
      for (DType dt : {DType::f32, DType::f64}) {
        INFO(row.name << " on " << dtype_name(dt) << ", variant " << int(v) << ", gradient");
        auto make_leaves = [&] {
          Ins leaves;
          for (size_t i = 0; i < row.shapes.size(); ++i) {
            Shape s = row.shapes[i];
            if (v == V::Expanded && expandable(s)) s[0] = 1;
            const Layout l = s.numel() == 0       ? L::Contiguous
                             : v == V::Transposed ? L::Transposed
                             : v == V::Strided    ? L::Strided
                                                  : L::Contiguous;
            const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
            leaves.push_back(leaf(smooth_values(s.numel(), d, int(i), rng), s, dt, l));
          }
          return leaves;
        };
        check_backward(fn, make_leaves, rng);
        count("op", row.name, row.op, !row.composite, true);
        // One input requiring grad, the others constants: the compiled backward differentiates
        // with respect to that one only.
        for (size_t only = 0;
             v == V::Contiguous && row.shapes.size() > 1 && only < row.shapes.size(); ++only) {
          check_backward_only(fn, make_leaves, only, rng);
          count("op", row.name, row.op, !row.composite, true);
        }
      }
    }
  }
  // Index results (argmax, argmin) stay out of autograd, compiled as eagerly.
  for (const OpRow& row : op_rows()) {
    if (!row.index_result || !row.grad) continue;
    INFO(row.name << ", inputs requiring grad");
    Ins in;
    for (size_t i = 0; i < row.shapes.size(); ++i)
      in.push_back(leaf(smooth_values(row.shapes[i].numel(), row.domains[0], int(i), rng),
                        row.shapes[i], DType::f64, L::Contiguous));
    auto c = compile([&](const Ins& x) { return row.fn(x); });
    for (int call = 0; call < 2; ++call) {
      const Tensor got = c(in);
      CHECK(!got.requires_grad());
      CHECK(got.is_leaf());
      check_same(got, row.fn(in), Match::Exact, "output");
    }
    check_one_trace(c.stats());
  }
  finish("op", op_rows().size());
}

TEST_CASE("compiled random draws advance the generator as eager draws do") {
  // Unseeded inside the call: the compiled function reads the captured generator state and
  // writes its advance back, so consecutive calls draw what consecutive eager calls draw.
  struct Draw {
    const char* name;
    std::function<Tensor(const Tensor&)> fn;
  };
  const std::vector<Draw> draws = {
      {"rand (3, 5)",
       [](const Tensor& x) {
         return rand({3, 5}) + x;
       }},
      {"randn (7) f64",
       [](const Tensor& x) { return randn({7}, Options().dtype(DType::f64)) * x; }},
      {"randint (4, 4)",
       [](const Tensor& x) {
         return randint(10, {4, 4}) + x;
       }},
      {"rand (5) twice", [](const Tensor& x) { return rand({5}) - rand({5}) + x; }},
      {"dropout (3, 4)", [](const Tensor& x) { return dropout(x, 0.5, true); }},
  };
  Rng rng(113);
  for (const Draw& d : draws) {
    INFO(std::string(d.name));
    const Tensor x = make(random_values(1, Domain{}, DType::f64, rng), {}, DType::f64);
    const Tensor xd = make(random_values(12, Domain{}, DType::f32, rng), {3, 4});
    const Tensor& arg = std::string(d.name).rfind("dropout", 0) == 0 ? xd : x;
    manual_seed(77);
    std::vector<Tensor> eager;
    for (int i = 0; i < 3; ++i) eager.push_back(d.fn(arg));
    manual_seed(77);
    auto c = compile([&](const Tensor& a) { return d.fn(a); });
    for (int i = 0; i < 3; ++i) {
      INFO("call " << i);
      check_same(c(arg), eager[i], Match::Exact, "draw");
    }
    check_one_trace(c.stats());
    // Eager draws after the compiled calls continue from the written-back state.
    const Tensor after = d.fn(arg);
    manual_seed(77);
    for (int i = 0; i < 3; ++i) d.fn(arg);
    check_same(after, d.fn(arg), Match::Exact, "eager draw after the compiled calls");
  }
}

// ---- aliasing of results ---------------------------------------------------------------------

TEST_CASE("compiled results alias arguments and each other only where eager results do") {
  // The passes turn x * 1 into x and b.clone() into b; the results must still be tensors of
  // their own, as eagerly (the sweep's Scalar rows found this with x * 1 and x + 0 on integers).
  Tensor x = make({1, 2, 3}, {3});
  auto f = compile([](const Tensor& a) { return a + 0; });
  Tensor y = f(x);
  CHECK(!same_storage(y, x));
  y.add_(5);
  CHECK(values(x) == std::vector<double>{1, 2, 3});
  // A leaf that requires grad stays a leaf, and the gradient reaches it.
  Tensor w = make({1, 2, 3}, {3}, DType::f64).requires_grad_();
  auto g = compile([](const Tensor& a) { return a * 1; });
  Tensor gw = g(w);
  CHECK(w.is_leaf());
  CHECK(!gw.is_same(w));
  sum(gw * gw).backward();
  REQUIRE(w.grad().defined());
  CHECK(values(w.grad()) == std::vector<double>{2, 4, 6});
  // Equal results made separately are separate tensors; a view of an argument stays a view.
  auto h = compile([](const Tensor& a) {
    Tensor b = a * 2;
    return std::make_tuple(b, b.clone(), a * 2, reshape(a, {3, 1}), transpose(a * 1, 0, 0));
  });
  auto [p, q, r, v, t] = h(x);
  CHECK(!same_storage(p, q));
  CHECK(!same_storage(p, r));
  CHECK(same_storage(v, x));
  CHECK(!same_storage(t, x));
  for (const Tensor& o : {p, q, r}) CHECK(values(o) == std::vector<double>{2, 4, 6});
  CHECK(values(t) == std::vector<double>{1, 2, 3});
  // Returning an argument itself, or the same result twice, is the same tensor as eagerly.
  auto k = compile([](const Tensor& a) {
    Tensor b = a * 3;
    return std::make_tuple(a, b, b);
  });
  auto [ka, kb, kc] = k(x);
  CHECK(ka.is_same(x));
  CHECK(kb.is_same(kc));
}

// ---- IEEE special values through the passes ---------------------------------------------------

namespace {
// A 0-d Full of x's dtype: a constant the passes see as a Full node, not a wrapped number.
Tensor filled(const Tensor& x, double v) { return full({}, v, Options().dtype(x.dtype())); }
}  // namespace

TEST_CASE("compiled identities keep eager's bits on NaN, infinities and signed zeros") {
  // What simplify rewrites (x + -0.0, x - 0.0, x * 1, x / 1, -(-x), where(c, x, x)) and what it
  // must keep (x + 0.0: -0.0 + 0.0 is +0.0; x - -0.0; x * 0: inf * 0 is NaN; x / -0.0), with the
  // constant a Scalar (a wrapped number), an integer, and a Full.
  using F = Tensor (*)(const Tensor&);
  const std::vector<std::pair<const char*, F>> cases = {
      {"x + 0.0", [](const Tensor& x) { return x + 0.0; }},
      {"x + -0.0", [](const Tensor& x) { return x + -0.0; }},
      {"0.0 + x", [](const Tensor& x) { return 0.0 + x; }},
      {"-0.0 + x", [](const Tensor& x) { return -0.0 + x; }},
      {"x + 0", [](const Tensor& x) { return x + 0; }},
      {"x - 0.0", [](const Tensor& x) { return x - 0.0; }},
      {"x - -0.0", [](const Tensor& x) { return x - -0.0; }},
      {"x - 0", [](const Tensor& x) { return x - 0; }},
      {"0.0 - x", [](const Tensor& x) { return 0.0 - x; }},
      {"x * 1", [](const Tensor& x) { return x * 1; }},
      {"1.0 * x", [](const Tensor& x) { return 1.0 * x; }},
      {"x * -1.0", [](const Tensor& x) { return x * -1.0; }},
      {"x * 0.0", [](const Tensor& x) { return x * 0.0; }},
      {"x * -0.0", [](const Tensor& x) { return x * -0.0; }},
      {"x * 0", [](const Tensor& x) { return x * 0; }},
      {"x / 1", [](const Tensor& x) { return x / 1; }},
      {"x / 0.0", [](const Tensor& x) { return x / 0.0; }},
      {"x / -0.0", [](const Tensor& x) { return x / -0.0; }},
      {"where(x > 0, x, x)", [](const Tensor& x) { return where(x > 0, x, x); }},
      {"(x + 0.0) + -0.0", [](const Tensor& x) { return (x + 0.0) + -0.0; }},
      {"x + full(0.0)", [](const Tensor& x) { return x + filled(x, 0.0); }},
      {"x + full(-0.0)", [](const Tensor& x) { return x + filled(x, -0.0); }},
      {"x - full(-0.0)", [](const Tensor& x) { return x - filled(x, -0.0); }},
      {"x * full(1.0)", [](const Tensor& x) { return x * filled(x, 1.0); }},
      {"x + full(0.0).to(f64).to(x's dtype)",
       [](const Tensor& x) { return x + filled(x, 0.0).to(DType::f64).to(x.dtype()); }},
  };
  auto specials = [](DType dt, int call) {
    std::vector<double> v = special_grid({false})[0];
    if (call % 2) std::reverse(v.begin(), v.end());
    return Ins{make(v, {4, 8}, dt)};
  };
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& [name, f] : cases) {
      INFO(std::string(name) << " on " << dtype_name(dt));
      int calls = 0;
      check_forward([f = f](const Ins& x) { return f(x[0]); },
                    [&] { return specials(dt, calls++); }, Match::Bits);
    }
    // -(-x) is x bit for bit (IEEE negation flips the sign bit, of zeros and NaNs too), and
    // simplify makes it x: compiled and eager agree bit for bit.
    INFO("-(-x) on " << dtype_name(dt));
    int calls = 0;
    const Fn twice = [](const Ins& x) { return neg(neg(x[0])); };
    const std::function<Ins()> make_x = [&] { return specials(dt, calls++); };
    check_forward(twice, make_x, Match::Bits);
    auto c = compile([&twice](const Ins& a) { return twice(a); });
    const Ins x = specials(dt, 0);
    CHECK(bitwise_equal(c(x), x[0]));
  }
}

TEST_CASE("compiled constants equal under == but with other bits stay apart (cse)") {
  // 0.0 == -0.0: a CSE that compares constants with == (or hashes them with std::hash<double>,
  // which hashes both zeros alike) merges them, and compiled x / -0.0 gives +inf where eager
  // gives -inf, x * -0.0 the sign of x * 0.0. The same for Full's value, and for NaNs of either
  // sign (Scalar's == holds every NaN equal).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(std::string(dtype_name(dt)));
    const Options o = Options().dtype(dt);
    const Fn fn = [&](const Ins& in) {
      const Tensor& x = in[0];
      return cat({x * 0.0, x / -0.0, x * -0.0, x / 0.0, x * full({}, 0.0, o), x * full({}, -0.0, o),
                  x + full({}, nan, o), x + full({}, -nan, o)},
                 0);
    };
    int calls = 0;
    check_forward(
        fn,
        [&] {
          std::vector<double> v = special_grid({false})[0];
          if (calls++ % 2) std::reverse(v.begin(), v.end());
          return Ins{make(v, {4, 8}, dt)};
        },
        Match::Bits);
    // The two alone, as first reported: compiled x / -0.0 beside x * 0.0.
    auto c = compile([](const Tensor& x) { return std::make_tuple(x * 0.0, x / -0.0); });
    const Tensor x = make({1, -2, 0}, {3}, dt);
    auto [p, q] = c(x);
    check_same(p, x * 0.0, Match::Bits, "x * 0.0");
    check_same(q, x / -0.0, Match::Bits, "x / -0.0");
    CHECK(values(q)[0] == -std::numeric_limits<double>::infinity());
  }
}

// ---- completeness -----------------------------------------------------------------------------

TEST_CASE("every op in ops.def runs compiled in some row; every differentiable op's gradient") {
  const char* tables[] = {"elementwise",   "conversion", "reduce", "view",
                          "slice_scatter", "source",     "matmul", "op"};
  std::vector<std::string> missing;
  for (const char* t : tables)
    if (!tallies()[t].done) missing.push_back(t);
  if (!missing.empty()) {
    // Run with a test-case filter: the sweeps that count did not all run in this process.
    MESSAGE("completeness not checked: the sweep of " << missing[0] << " did not run");
    return;
  }
  int rows = 0, samples = 0, grads = 0;
  for (const auto& [name, t] : tallies()) {
    rows += int(t.rows.size());
    samples += t.samples;
    grads += t.grads;
  }
  MESSAGE(fmt::format("{} rows, {} compiled samples, {} compiled gradients; {} ops", rows, samples,
                      grads, kNumOps));
  for (int i = 0; i < kNumOps; ++i) {
    INFO(std::string(op_name(OpId(i))));
    CHECK_MESSAGE(forward_ops()[i] > 0, "no row ran this op compiled");
    if (differentiable(OpId(i)))
      CHECK_MESSAGE(grad_ops()[i] > 0, "differentiable, but no compiled gradient was compared");
  }
}

}  // namespace duet::test
