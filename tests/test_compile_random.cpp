// Random programs, run eagerly and compiled (issue: "Random programs"). The programs and their
// generator are in random_program.h.
//
// Each program runs eagerly and through duet::compile(fn), on two sets of input values
// (resampled when eager gives NaN or Inf), without and with inputs that require grad, then with
// grad mode off, with contiguous arguments, and (where an argument has the shape and dtype of a
// buffer the program writes in place) with that buffer passed as the argument; outputs,
// buffers, requires_grad flags and
// gradients (duet::grad through the compiled outputs, which runs the compiled backward; per
// output and of all outputs together) are compared, and the number of traces is checked (no
// retrace for new values; one for each new signature). Tolerances: f32 rtol 1.3e-5 and atol
// 1.5e-5, f64 1e-7 (f32's in programs of the fusion mix or with control flow that compute in
// both, see looseness), bf16 and f16 values, integers and bools exactly (bf16 and f16
// gradients within two ulps; every floating value within two bf16 ulps in the mixed mix in bf16
// and f16); atol scales with the tensor's largest
// magnitude (compare_tensors and compare_grads say why), and in the fusion mix, for the
// gradients of broadcast operands, with the square root of how many terms each of their elements
// sums (gradient_widening). A program that differs is checked again with each element of eager's
// results allowed a few times how far it moves on inputs nudged by a few ulps, and counted as
// ill-conditioned, not failed, if it passes so (Note [Ill-conditioned programs]); one that
// matches eager with a cond's gradient made lax.cond's (Note [A cond's zeros]) is counted apart
// too. On a mismatch
// the seed, the program (one line per step, with the inputs) and the differences are printed,
// and the program runs again with every optimization pass disabled, and with each alone, to say
// whether a pass is involved, and which.
//
// The same checks run on programs of the fusion mix (random_program.h), built to stress fused
// kernels and the memory planner; that test also asserts that most of them got fused kernels.
// Every plan checks the memory planner's invariant (no two buffers live at once overlap) as it
// is built: the whole binary runs with detail::set_verify_plans(true).
//
// Programs of the batch mix (random_program.h) have arguments with a batch dim and are compiled
// with it symbolic (named in CompileOptions::dynamic, or found by automatic dynamic); each is
// called at every batch size of kBatchSizes, without and with gradients, and compared with
// eager at each; that test also checks the traces (one per grad mode, one more for automatic
// dynamic, unless the retrace reasons show a specialization or a failed guard), that most keep
// the batch dim symbolic, and that the ops meeting the batch dim met it.
//
// DUET_RANDOM_PROGRAMS=n runs seeds 0..n-1 (default 2000); DUET_RANDOM_SEED=s runs seed s only.
// DUET_FUSION_PROGRAMS and DUET_FUSION_SEED do the same for the fusion mix (default 600),
// DUET_LOW_FUSION_PROGRAMS and DUET_LOW_FUSION_SEED for its bf16 and f16 programs (default 300),
// DUET_LOW_MIXED_PROGRAMS and DUET_LOW_MIXED_SEED for mixed programs in bf16 and f16 (default
// 500), DUET_AUTOCAST_PROGRAMS and DUET_AUTOCAST_SEED for mixed programs under autocast (default
// 600),
// and DUET_BATCH_PROGRAMS and DUET_BATCH_SEED for the batch mix (default 300).
// DUET_REDUCE=1 also shrinks each failing program (reduce_program) and prints the result.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "random_program.h"
#include "trace/plan/executor.h"
#include "util.h"

namespace duet::test {
namespace {

// Every plan any test here builds checks its memory plan (an InternalError otherwise, which
// check() reports as "threw").
[[maybe_unused]] const bool kVerifyPlans = (detail::set_verify_plans(true), true);

// ---- running and comparing ----

using Tol = Tolerance;
/// How much looser than its dtype's a value's comparison is: not at all; f64 values at f32's
/// tolerances (they may have been computed in f32, see looseness); every floating value at two
/// bf16 ulps (a program of the mixed mix in bf16 and f16, see looseness).
enum class Loose : uint8_t { None, F32, Low };
// `widen` multiplies atol (see gradient_widening); `gradient`: a bf16 or f16 gradient may be a
// few ulps off where a low-precision sum on its way rounded the other way, its values not at
// all (Note [Low-precision fusion programs] in random_program_fusion.cpp).
Tol tolerance(DType d, Loose loose = Loose::None, double widen = 1, bool gradient = false) {
  if ((gradient && is_low_precision(d)) || (loose == Loose::Low && is_floating(d))) {
    const double two_ulps = d == DType::f16 && loose != Loose::Low ? 0x1p-9 : 0x1p-6;
    return {two_ulps, two_ulps};
  }
  Tol t = value_tolerance(d == DType::f64 && loose == Loose::F32 ? DType::f32 : d);
  t.atol *= widen;
  return t;
}

// Note [Ill-conditioned programs]
// A fused kernel sums in another order than eager (Note [Inexact values] in
// random_program_fusion.cpp), so compiled and eager differ by rounding. The fusion mix's
// generator estimates those errors and rejects the steps that would blow them up; the other mixes
// have no such model, and rely on the tolerances. A program that amplifies rounding (cos(exp(x))
// of values near 5, whose gradient moves 1e-3 when a mean of 100 elements rounds the other way:
// seed 284922) fails them however correct the kernels are. So when a program differs, eager runs
// it again on its inputs moved by 2^-21 of themselves (about four f32 ulps; up and down in turn,
// then all up, as test_autobatch_random does), and each element of eager's results may then
// differ by kNoise times the farthest eager's own element moved (noise_of). A program that
// passes so is counted as ill-conditioned, not failed. The allowance is per element: an error in
// a well-conditioned output or gradient beside an ill-conditioned one still fails, and the
// comparison's self-test (an error of 1e-4, "the comparison notices") runs with it.
constexpr double kNoise = 4;
bool allow_noise = true;  // (off in the test of the allowance itself)
// Per eager result tensor (by its impl), each element's allowance; filled only while a
// differing program is checked again (ill_conditioned).
std::map<const void*, std::vector<double>> noise_of;

// The largest finite magnitude in t (0 if none): eager's results are finite but for those of the
// run with a cond's zeros (Note [A cond's zeros]), whose NaNs must not make every other element's
// tolerance infinite.
double finite_max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t))
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  return m;
}

// Compares a compiled result with the eager one. Floating absolute tolerances scale with the
// largest magnitude in the eager tensor: an element that cancels to near zero (a - b, a
// gradient summed over many uses) carries the rounding error of the terms it was computed
// from, and those are bounded by the tensor's scale, not by the element. Values stay O(1) by
// construction (see the generator), so the scale is 1 for most tensors.
std::string compare_tensors(const Tensor& got, const Tensor& want, const std::string& what,
                            Loose loose = Loose::None, double widen = 1, bool gradient = false) {
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype())
    return fmt::format("{}: compiled gives {} {}, eager {} {}\n", what, dtype_name(got.dtype()),
                       got.sizes(), dtype_name(want.dtype()), want.sizes());
  Tol t = tolerance(want.dtype(), loose, widen, gradient);
  const double scale = is_floating(want.dtype()) ? std::max(1.0, finite_max_abs(want)) : 1.0;
  if (auto it = noise_of.find(want.unsafe_impl()); it != noise_of.end()) {
    const std::vector<double> g = values(got), w = values(want);
    bool within = g.size() == w.size() && it->second.size() == w.size();
    for (size_t j = 0; within && j < w.size(); ++j)
      within = std::abs(g[j] - w[j]) <=
               t.atol * scale + t.rtol * std::abs(w[j]) + kNoise * it->second[j];
    if (within) return "";
  }
  std::string d = differences(values(got), values(want), t.rtol, t.atol * scale);
  return d.empty()
             ? ""
             : fmt::format("{} ({} {}): {}\n", what, dtype_name(want.dtype()), want.sizes(), d);
}

bool all_finite(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (t.defined() && is_floating(t.dtype()))
      for (double x : values(t))
        if (!std::isfinite(x)) return false;
  return true;
}

struct EagerRun {
  std::vector<Tensor> ins;  ///< the inputs after the run (buffers updated)
  std::vector<Tensor> outs;
  std::vector<int> diff;      ///< outputs that require grad
  std::vector<Tensor> gouts;  ///< their gradients (random)
  std::vector<int> wrt;       ///< the floating inputs
  /// Gradients of the floating inputs: per output that requires grad, then of all together.
  std::vector<std::vector<Tensor>> per_output;
  std::vector<Tensor> grads;
};

std::vector<Tensor> wrt_of(const std::vector<Tensor>& in, const std::vector<int>& wrt) {
  std::vector<Tensor> w;
  for (int i : wrt) w.push_back(in[size_t(i)]);
  return w;
}
std::vector<Tensor> pick_outs(const std::vector<Tensor>& outs, const std::vector<int>& diff) {
  std::vector<Tensor> d;
  for (int i : diff) d.push_back(outs[size_t(i)]);
  return d;
}

/// The gradients of the inputs `wrt` from the outputs `diff`, weighted by `gouts`; retain keeps
/// the graphs for another call.
std::vector<Tensor> gradients(const std::vector<Tensor>& outs, const std::vector<int>& diff,
                              const std::vector<Tensor>& in, const std::vector<int>& wrt,
                              const std::vector<Tensor>& gouts, bool retain) {
  return detail::grad(pick_outs(outs, diff), wrt_of(in, wrt), gouts, false, retain);
}

EagerRun run_eager(const Program& p, const std::vector<Tensor>& in, bool rg, uint64_t gseed) {
  EagerRun r;
  manual_seed(kRandSeed);
  r.outs = run_program(p, in);
  r.ins = in;
  if (!rg) return r;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].requires_grad()) r.wrt.push_back(int(i));
  for (size_t i = 0; i < r.outs.size(); ++i)
    if (r.outs[i].requires_grad()) r.diff.push_back(int(i));
  if (r.wrt.empty() || r.diff.empty()) return r;
  Rng g = rng_for(gseed, 2);
  for (int i : r.diff) {
    const Tensor& o = r.outs[size_t(i)];
    r.gouts.push_back(
        make(random_values(o.numel(), Domain{-1, 1}, o.dtype(), g), o.sizes(), o.dtype()));
  }
  for (size_t k = 0; k < r.diff.size(); ++k)
    r.per_output.push_back(gradients(r.outs, {r.diff[k]}, in, r.wrt, {r.gouts[k]}, true));
  r.grads = gradients(r.outs, r.diff, in, r.wrt, r.gouts, false);
  return r;
}

/// One set of input values: resampled until eager gives finite outputs and gradients, and no
/// cond's predicate lies too close to its threshold (branches_taken).
struct Sample {
  Values values;
  EagerRun plain, with_grad;
  bool finite = false;
  std::vector<int> branches;  ///< per cond step, the branch it takes (branches_taken)
};

/// `other`: the first sample; then the first few attempts also look for values on which every
/// cond takes the other branch, so that the two samples run both.
Sample sample(const Program& p, Rng& rng, uint64_t gseed, const Values* first,
              const Sample* other = nullptr) {
  Sample s;
  for (int attempt = 0; attempt < 20; ++attempt) {
    s.values = attempt == 0 && first ? *first : random_inputs(p, rng);
    s.branches = branches_taken(p, s.values);
    if (std::count(s.branches.begin(), s.branches.end(), -1)) continue;
    if (other && attempt < 8) {
      bool all_other = true;
      for (size_t k = 0; k < s.branches.size(); ++k)
        all_other = all_other && s.branches[k] != other->branches[k];
      if (!all_other) continue;
    }
    s.with_grad = run_eager(p, build_inputs(p, s.values, true), true, gseed);
    if (all_finite(s.with_grad.outs) && all_finite(s.with_grad.grads)) {
      s.finite = true;
      break;
    }
  }
  s.plain = run_eager(p, build_inputs(p, s.values, false), false, gseed);
  return s;
}

bool has_control_flow(const Program& p) {
  return std::any_of(p.steps.begin(), p.steps.end(), [](const Step& st) {
    return st.op == Op::Cond || st.op == Op::Scan || st.op == Op::While;
  });
}

/// How loosely p's results are compared (Loose). Loose::F32 for a program that computes in f32
/// and f64: its f64 results may carry f32 rounding (a gradient of an f64 input read by an f32
/// op is computed in f32; fused and eager f32 sums add in different orders, even of 30 terms,
/// where a 0-d f64 input subtracted from an f32 tensor gets their sum as its gradient; and so
/// do the gradient rules of cond and scan, which add a value's gradients from inside and
/// outside the construct, or step by step, where eager's tape adds them as they come). Loose::Low
/// for the mixed mix in bf16 and f16, which has no error model (the fusion mix's): an f32 sum fused
/// in another order may round the other way when cast to bf16, and cond and scan add bf16 gradients
/// in another order.
Loose looseness(const Program& p) {
  if (p.mix == Mix::LowMixed) return Loose::Low;
  return has_dtype(p, DType::f32) && has_dtype(p, DType::f64) ? Loose::F32 : Loose::None;
}

/// Per input, a factor for the absolute tolerance of its gradients: in the fusion mix, for an
/// input of n elements in a program whose largest input has N, sqrt(N / n). Each element of its
/// gradient is a sum of about N / n terms (the input is broadcast, or read by a reduction), which
/// fused and eager add in different orders; where the terms nearly cancel (a gradient that is 0
/// in exact arithmetic, as that of x in softmax(x + c) for c), the difference is noise of the
/// size of the terms, not of the result.
std::vector<double> gradient_widening(const Program& p) {
  std::vector<double> w(p.inputs.size(), 1.0);
  if (!fusion_mix(p.mix)) return w;
  int64_t most = 1;
  for (const InputSpec& in : p.inputs) most = std::max(most, in.shape.numel());
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::sqrt(double(most) / double(std::max<int64_t>(p.inputs[i].shape.numel(), 1)));
  return w;
}

/// Whether step st, on input `in`, returns the input itself, as PyTorch does (a squeeze with no
/// dim of size 1, a 0-d transpose, a cast to its dtype, contiguous() of a contiguous tensor):
/// no op is recorded, so the trace reads nothing there.
bool returns_operand(const Step& st, const InputSpec& in) {
  const int64_t nd = in.shape.size();
  switch (st.op) {
    case Op::SqueezeAll:
      for (int64_t d = 0; d < nd; ++d)
        if (in.shape[d] == 1) return false;
      return true;
    case Op::Squeeze:
      return nd == 0 || in.shape[st.ints[0] < 0 ? st.ints[0] + nd : st.ints[0]] != 1;
    case Op::Transpose:
      return nd == 0;
    case Op::Cast:
      return static_cast<DType>(st.mode) == in.dtype;
    case Op::Contiguous:
      return in.layout == Layout::Contiguous;
    default:
      return false;
  }
}

/// Whether a call with gradients traces once more than one without: a floating input that
/// requires grad changes the signature (an argument's flag, or the flag of a captured tensor the
/// trace read). A step that returns its input itself reads nothing; what reads its result reads
/// the input (seed 1001629: a captured scalar read only by squeeze() and, detached, by an
/// UpdateBuffer left the guard alone).
bool grad_retraces(const Program& p) {
  const size_t n_in = p.inputs.size();
  std::vector<bool> used(n_in, false);
  std::vector<int> same(n_in + p.steps.size());  // the value each value is (itself, or an input)
  for (size_t v = 0; v < same.size(); ++v) same[v] = int(v);
  auto input_of = [&](int v) { return size_t(v) < same.size() ? same[size_t(v)] : v; };
  for (size_t j = 0; j < p.steps.size(); ++j) {
    const Step& st = p.steps[j];
    const int a = st.args.empty() ? -1 : input_of(st.args[0]);
    if (a >= 0 && size_t(a) < n_in && returns_operand(st, p.inputs[size_t(a)])) {
      same[n_in + j] = a;
      continue;
    }
    for (size_t k = 0; k < st.args.size(); ++k) {
      const bool detached = k == 1 && (st.op == Op::MulInplace || st.op == Op::DivInplace ||
                                       st.op == Op::UpdateBuffer);
      const int r = input_of(st.args[k]);
      if (size_t(r) < used.size() && !detached) used[size_t(r)] = true;
    }
  }
  for (int o : p.outputs)
    if (size_t(input_of(o)) < used.size()) used[size_t(input_of(o))] = true;
  bool any_float = false;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const InputSpec& in = p.inputs[i];
    any_float |= is_floating(in.dtype) && !in.buffer && (!in.captured || used[i]);
  }
  return any_float;
}

/// The calls of one compiled function of program p and their comparison with eager: the
/// captured inputs (the same tensors for every call, their values written in place), and the
/// differences found (err).
struct Calls {
  const Program& p;
  std::vector<Tensor> caps;
  const Loose loose;
  const std::vector<double> widen;
  std::string err;

  explicit Calls(const Program& prog)
      : p(prog), caps(prog.inputs.size()), loose(looseness(prog)), widen(gradient_widening(prog)) {}

  /// The inputs of one call on the values of s (p's inputs at the sizes of `at`, when given):
  /// fresh argument tensors; the captured ones get the values in place.
  std::pair<std::vector<Tensor>, std::vector<Tensor>> inputs(const Sample& s, bool rg,
                                                             bool contiguous = false,
                                                             const Program* at = nullptr) {
    std::vector<Tensor> fresh = build_inputs(at ? *at : p, s.values, rg, contiguous), in, args;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      if (!p.inputs[i].captured) {
        in.push_back(fresh[i]);
        args.push_back(fresh[i]);
        continue;
      }
      if (!caps[i].defined()) {
        caps[i] = fresh[i];
      } else {
        NoGradGuard ng;  // a leaf that requires grad is updated as an optimizer would
        caps[i].copy_(fresh[i]);
        if (is_floating(caps[i].dtype()) && !p.inputs[i].buffer) caps[i].requires_grad_(rg);
      }
      in.push_back(caps[i]);
    }
    return std::make_pair(in, args);
  }

  void outputs(const std::vector<Tensor>& outs, const EagerRun& e, const std::string& which,
               bool flags = true) {
    for (size_t i = 0; i < p.inputs.size(); ++i)  // the state the call wrote back
      if (p.inputs[i].buffer)
        err += compare_tensors(caps[i], e.ins[i], fmt::format("{}, buffer %{} after", which, i),
                               loose);
    if (outs.size() != e.outs.size()) {
      err += fmt::format("{}: {} outputs, eager {}\n", which, outs.size(), e.outs.size());
      return;
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      err += compare_tensors(outs[i], e.outs[i], fmt::format("{}, output {}", which, i), loose);
      if (flags && outs[i].requires_grad() != e.outs[i].requires_grad())
        err += fmt::format("{}, output {}: requires_grad {} compiled, {} eager\n", which, i,
                           outs[i].requires_grad(), e.outs[i].requires_grad());
    }
  }

  // Gradients from each output alone, against eager's: the compiled backward of one output is
  // traced from the same tape, so it adds in eager's order. Then from all outputs together,
  // against eager's from all outputs together: a backward that reaches several outputs of a
  // compiled call runs its joint backward, also traced from the same tape with every output's
  // gradient (Note [One backward for several outputs] in trace/compile.cpp), so it adds the
  // outputs' contributions where eager does, at every value they share.
  void grads(const std::vector<Tensor>& outs, const std::vector<Tensor>& in, const EagerRun& e,
             const std::string& which) {
    if (e.grads.empty()) return;
    for (size_t j = 0; j < e.diff.size(); ++j) {
      std::vector<Tensor> g = gradients(outs, {e.diff[j]}, in, e.wrt, {e.gouts[j]}, true);
      for (size_t i = 0; i < g.size(); ++i)
        err += compare_tensors(
            g[i], e.per_output[j][i],
            fmt::format("{}, gradient of input %{} from output {}", which, e.wrt[i], e.diff[j]),
            loose, widen[size_t(e.wrt[i])], true);
    }
    std::vector<Tensor> g = gradients(outs, e.diff, in, e.wrt, e.gouts, false);
    for (size_t i = 0; i < g.size(); ++i)
      err += compare_tensors(
          g[i], e.grads[i],
          fmt::format("{}, gradient of input %{} from all outputs", which, e.wrt[i]), loose,
          widen[size_t(e.wrt[i])], true);
  }
};

/// The first argument (its input index and its position among the arguments) that has the
/// shape and dtype of a buffer the program writes in place, and that buffer's input index; -1s
/// when there is none.
std::tuple<int, int, int> argument_like_buffer(const Program& p) {
  for (size_t b = 0; b < p.inputs.size(); ++b) {
    if (!p.inputs[b].buffer) continue;
    int at = 0;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      if (p.inputs[i].captured) continue;
      if (p.inputs[i].shape == p.inputs[b].shape && p.inputs[i].dtype == p.inputs[b].dtype)
        return {int(i), at, int(b)};
      ++at;
    }
  }
  return {-1, -1, -1};
}

/// The differences between compiled and eager for one program; empty when they agree.
/// `perturb` moves the compiled floating outputs by a relative and an absolute `perturb` (a
/// self-test of the comparison).
/// `fused`, when given, gets the most fused kernels the compiled function's plans had after a
/// call (CompileStats::fused_kernels).
/// `aliased`, when given, counts the calls with an argument that is a written buffer, and of
/// them the calls that ran eagerly.
std::string check(const Program& p, const Sample& a, const Sample& b, CompileOptions opts,
                  double perturb = 0, int64_t* fused = nullptr,
                  std::pair<int, int>* aliased = nullptr) {
  Calls calls(p);
  std::string& err = calls.err;
  std::vector<Tensor>& caps = calls.caps;
  auto fn = [&p, &caps, perturb](std::vector<Tensor> args) {
    std::vector<Tensor> in;
    size_t pos = 0;
    for (size_t i = 0; i < p.inputs.size(); ++i)
      in.push_back(p.inputs[i].captured ? caps[i] : args[pos++]);
    std::vector<Tensor> outs = run_program(p, in);
    if (perturb != 0)
      for (Tensor& o : outs)
        if (floating(o)) o = o * (1 + perturb) + perturb;
    return outs;
  };
  auto c = compile(fn, opts);
  auto note_fused = [&] {
    if (fused) *fused = std::max(*fused, c.stats().fused_kernels);
  };
  const bool any_float = grad_retraces(p);
  const bool any_captured = std::any_of(p.inputs.begin(), p.inputs.end(),
                                        [](const InputSpec& in) { return in.captured; });
  auto inputs = [&](const Sample& s, bool rg, bool contiguous = false) {
    return calls.inputs(s, rg, contiguous);
  };
  auto compare_outputs = [&](const std::vector<Tensor>& outs, const EagerRun& e, const char* which,
                             bool flags = true) { calls.outputs(outs, e, which, flags); };
  auto compare_grads = [&](const std::vector<Tensor>& outs, const std::vector<Tensor>& in,
                           const EagerRun& e,
                           const char* which) { calls.grads(outs, in, e, which); };
  try {
    // Without gradients: two sets of values, one trace.
    for (const Sample* s : {&a, &b}) {
      auto [in, args] = inputs(*s, false);
      manual_seed(kRandSeed);
      compare_outputs(c(args), s->plain, s == &a ? "values A" : "values B");
    }
    note_fused();
    if (c.stats().traces != 1 || c.stats().hits != 1)
      err += fmt::format("no-grad calls: {} traces, {} hits (want 1 and 1)\n", c.stats().traces,
                         c.stats().hits);
    // With gradients. Without captured inputs, both calls first and then both backwards (the
    // second call must not disturb what the first saved); a captured input can only be
    // updated after the backward that reads it (the forward may save it, as eager would).
    std::vector<std::vector<Tensor>> ins(2), outs(2);
    for (int k = 0; k < 2; ++k) {
      const Sample& s = k == 0 ? a : b;
      std::vector<Tensor> args;
      std::tie(ins[k], args) = inputs(s, true);
      manual_seed(kRandSeed);
      outs[k] = c(args);
      compare_outputs(outs[k], s.with_grad, k == 0 ? "values A (grad)" : "values B (grad)");
      if (any_captured) compare_grads(outs[k], ins[k], s.with_grad, k == 0 ? "A" : "B");
    }
    note_fused();
    if (!any_captured)
      for (int k = 0; k < 2; ++k)
        compare_grads(outs[k], ins[k], (k == 0 ? a : b).with_grad, k == 0 ? "A" : "B");
    int want_traces = any_float ? 2 : 1;
    if (c.stats().traces != want_traces)
      err += fmt::format("grad calls: {} traces (want {}); retraced because: {}\n",
                         c.stats().traces, want_traces, fmt::join(c.stats().retrace_reasons, "; "));
    // Grad mode off, with inputs that require grad: the guard includes grad mode, and the
    // outputs get no backward. (Flags are not compared: a captured tensor returned as it is
    // comes back as a handle of its own, which does not require grad, where eager returns the
    // tensor itself.)
    {
      NoGradGuard ng;
      auto [in, args] = inputs(a, true);
      EagerRun e = run_eager(p, build_inputs(p, a.values, true), false, 0);
      manual_seed(kRandSeed);
      std::vector<Tensor> outs = c(args);
      compare_outputs(outs, e, "values A (grad mode off)", false);
      for (size_t i = 0; i < outs.size(); ++i)
        if (outs[i].requires_grad() && !e.outs[i].requires_grad())
          err += fmt::format("values A (grad mode off), output {} requires grad\n", i);
      ++want_traces;
    }
    // The arguments contiguous (the same values): a new layout retraces (the guard includes
    // strides), the same one hits the first trace; eager runs on these inputs too.
    {
      bool strided = false;
      for (const Tensor& t : inputs(a, false).second) strided |= !t.is_contiguous();
      auto [in, args] = inputs(a, false, true);
      EagerRun e = run_eager(p, build_inputs(p, a.values, false, true), false, 0);
      manual_seed(kRandSeed);
      compare_outputs(c(args), e, "values A (contiguous arguments)");
      want_traces += strided;
    }
    if (c.stats().traces != want_traces)
      err += fmt::format(
          "after grad mode off and contiguous calls: {} traces (want {}); "
          "retraced because: {}\n",
          c.stats().traces, want_traces, fmt::join(c.stats().retrace_reasons, "; "));
    // An argument that is a buffer the program writes in place, where one has its shape and
    // dtype (Note [Arguments that share memory with written captures] in trace/compile.cpp):
    // eagerly each read of it sees the writes before it; the compiled call copies it as it
    // begins or runs eagerly, and must agree.
    if (const auto [j, at, b] = argument_like_buffer(p); j >= 0) {
      std::vector<Tensor> ein = build_inputs(p, a.values, false, true);
      ein[size_t(j)] = ein[size_t(b)];
      EagerRun e = run_eager(p, ein, false, 0);
      auto [in, args] = inputs(a, false, true);
      args[size_t(at)] = caps[size_t(b)];
      manual_seed(kRandSeed);
      const int eager_before = c.stats().eager_calls;
      compare_outputs(c(args), e, "values A (an argument that is a written buffer)");
      if (aliased) {
        ++aliased->first;
        aliased->second += c.stats().eager_calls - eager_before;
      }
    }
  } catch (const std::exception& ex) {
    err += fmt::format("threw: {}\n", ex.what());
  }
  return err;
}

struct Coverage {
  std::vector<int> ops = std::vector<int>(size_t(Op::Count), 0);
  int programs = 0, steps = 0, skipped = 0, failed = 0;
  int control = 0;            ///< programs with cond, scan or while_loop steps
  int conds = 0;              ///< cond steps in the programs compared
  int both_branches = 0;      ///< those whose branches the two samples both took
  int fused = 0;              ///< programs whose plans had a fused kernel
  int64_t fused_kernels = 0;  ///< their kernels, summed
  int refused = 0;            ///< under autocast: programs not compared (run_seed says why)
  int aliased = 0;            ///< calls with an argument that is a written buffer
  int aliased_eager = 0;      ///< of them, those run eagerly (the others copied it)
  int low = 0;                ///< under autocast: programs with a value in the low dtype
  int seeds = 0;              ///< the seeds run
  /// programs that differ from eager only within their noise (Note [Ill-conditioned programs])
  int ill_conditioned = 0;
  /// programs that differ from eager only by a cond's zeros (Note [A cond's zeros])
  int cond_zeros = 0;
  std::string failed_seeds;
};

const std::vector<std::string> kPasses = {"dce",     "cse",         "fold",     "simplify", "fuse",
                                          "codegen", "plan_memory", "parallel", "hoist"};

// The eager runs of a sample for another program on the same inputs (the reducer's).
Sample rerun(const Program& p, const Sample& s, uint64_t gseed) {
  Sample r;
  r.values = s.values;
  r.with_grad = run_eager(p, build_inputs(p, s.values, true), true, gseed);
  r.finite = all_finite(r.with_grad.outs) && all_finite(r.with_grad.grads);
  r.plain = run_eager(p, build_inputs(p, s.values, false), false, gseed);
  return r;
}

// Shrinks a failing program (DUET_REDUCE=1, for reports): drops outputs, steps (whose uses then
// read one of their operands of the same shape and dtype) and non-contiguous layouts while the
// compiled function still differs from eager with the passes on and matches it with them off.
Program reduce_program(Program p, const Sample& a, const Sample& b) {
  auto fails = [&](const Program& q) {
    const Sample qa = rerun(q, a, q.seed + 1), qb = rerun(q, b, q.seed + 2);
    return qa.finite && qb.finite && !check(q, qa, qb, {}).empty() &&
           check(q, qa, qb, CompileOptions{.disable_passes = kPasses, .cache_limit = 8}).empty();
  };
  auto values = [&](const Program& q) {
    NoGradGuard ng;
    manual_seed(kRandSeed);
    return run_values(q, build_inputs(q, a.values, false));
  };
  // And inputs made contiguous and passed rather than captured.
  auto layouts = [&](Program& q) {
    bool changed = false;
    for (size_t i = 0; i < q.inputs.size(); ++i) {
      const InputSpec& in = q.inputs[i];
      if (in.layout == Layout::Contiguous && !in.captured) continue;
      Program r = q;
      r.inputs[i].layout = Layout::Contiguous;
      r.inputs[i].captured = false;
      if (fails(r)) {
        q = r;
        changed = true;
      }
    }
    return changed;
  };
  return shrink_program(std::move(p), values, fails, layouts);
}

// Notes, for each floating tensor of eager's run `want`, how far each element moved in the runs
// on nudged inputs (m1, m2): the allowance of Note [Ill-conditioned programs].
void note_noise(const EagerRun& want, const EagerRun& m1, const EagerRun& m2) {
  auto note = [](const Tensor& w, const Tensor& a, const Tensor& b) {
    if (!w.defined() || !a.defined() || !b.defined() || !is_floating(w.dtype()) ||
        a.sizes() != w.sizes() || b.sizes() != w.sizes())
      return;
    const std::vector<double> wv = values(w), av = values(a), bv = values(b);
    std::vector<double> n(wv.size());
    for (size_t j = 0; j < wv.size(); ++j)
      n[j] = std::max(std::abs(av[j] - wv[j]), std::abs(bv[j] - wv[j]));
    noise_of[w.unsafe_impl()] = std::move(n);
  };
  auto each = [&](const std::vector<Tensor>& w, const std::vector<Tensor>& a,
                  const std::vector<Tensor>& b) {
    for (size_t i = 0; i < w.size() && i < a.size() && i < b.size(); ++i) note(w[i], a[i], b[i]);
  };
  each(want.ins, m1.ins, m2.ins);
  each(want.outs, m1.outs, m2.outs);
  each(want.grads, m1.grads, m2.grads);
  for (size_t k = 0;
       k < want.per_output.size() && k < m1.per_output.size() && k < m2.per_output.size(); ++k)
    each(want.per_output[k], m1.per_output[k], m2.per_output[k]);
}

// Whether a program that differs passes with the allowance of Note [Ill-conditioned
// programs]: checked again (with the same perturb), each eager result allowed kNoise times how
// far it moves on nudged inputs.
bool ill_conditioned(const Program& p, const Sample& a, const Sample& b, uint64_t seed,
                     double perturb) {
  if (!allow_noise) return false;
  bool passes = true;
  try {
    for (const Sample* s : {&a, &b}) {
      auto moved = [&](bool alternate) {  // the eager runs on nudged inputs
        Sample m;
        m.values = nudged(p, s->values, alternate);
        return rerun(p, m, seed + (s == &a ? 1 : 2));
      };
      const Sample m1 = moved(true), m2 = moved(false);
      passes = passes && m1.finite && m2.finite;
      note_noise(s->plain, m1.plain, m2.plain);
      note_noise(s->with_grad, m1.with_grad, m2.with_grad);
    }
    passes = passes && check(p, a, b, {}, perturb).empty();
  } catch (const std::exception&) {
    passes = false;
  }
  noise_of.clear();
  return passes;
}

// Note [A cond's zeros]
// The one way the two faces' gradients may differ by design (Note [Gradients a branch cannot
// reach] in trace/control_flow.cpp): compiled, an operand that only the branch that did not run
// reaches gets zeros, as in lax.cond, and a gradient rule that is NaN at its point (std of one
// element) makes them NaN where eager's tape never reached it (seed 529585). A program that
// differs is compared again with eager's runs under CondZerosScope, which give the cond those
// zeros; a program that matches them is counted apart, not failed. Every element is compared
// again so, at the usual tolerances: the zeros change no value, and a NaN they bring must be a
// NaN compiled too.
bool differs_by_cond_zeros(const Program& p, const Sample& a, const Sample& b, uint64_t seed,
                           double perturb) {
  if (a.branches.empty()) return false;  // (no cond)
  try {
    Sample za, zb;
    {
      CondZerosScope zeros;
      za = rerun(p, a, seed + 1);
      zb = rerun(p, b, seed + 2);
    }
    return check(p, za, zb, {}, perturb).empty();
  } catch (const std::exception&) {
    return false;
  }
}

// Builds, runs and checks the program of one seed; returns the failure report ("" if none).
// With `perturb`, the compiled outputs are moved by it (see check) and the bare differences are
// returned (the self-test). With `autocast` (bf16 or f16), the program runs inside an autocast
// scope (Program::autocast). The generator does not know that its products then give the low
// dtype, so some programs are not compared (Coverage::refused): those with control flow, whose
// cond branches, scan steps and loop bodies must keep their operands' dtypes (as torch.cond's
// and lax.scan's must), and those that eager refuses with a DTypeError (a scatter_add of a
// product's bf16 result into an f32 tensor, refused by PyTorch's CPU autocast too).
std::string run_seed(uint64_t seed, Coverage& cov, double perturb = 0, Mix mix = Mix::Mixed,
                     DType autocast = DType::f32) {
  Program p;
  p.seed = seed;
  p.autocast = autocast;
  Generator gen(p, seed, mix);
  gen.make_inputs();
  Rng r = rng_for(seed, 1);
  std::string err = gen.make_steps(gen.random_length());
  if (!err.empty()) return program_text(p) + err;
  gen.choose_outputs();
  const bool cast = is_low_precision(autocast);
  if (cast && has_control_flow(p)) {
    ++cov.refused;
    return "";
  }
  for (const Step& st : p.steps) ++cov.ops[size_t(st.op)];
  cov.steps += int(p.steps.size());
  Sample a, b;
  try {
    a = sample(p, r, seed + 1, &gen.first_values());
    b = sample(p, r, seed + 2, nullptr, &a);
  } catch (const DTypeError&) {
    if (!cast) throw;
    ++cov.refused;
    return "";
  }
  if (cast) {  // does any value of the program have the low dtype (a product's result)?
    Autocast scope(Device::cpu(), autocast);
    const std::vector<Tensor> v = run_values(p, build_inputs(p, a.values, false));
    cov.low += std::any_of(v.begin(), v.end(),
                           [&](const Tensor& t) { return t.defined() && t.dtype() == autocast; });
  }
  if (!a.finite || !b.finite) {
    ++cov.skipped;
    return "";
  }
  ++cov.programs;
  cov.control += has_control_flow(p);
  cov.conds += int(a.branches.size());
  for (size_t k = 0; k < a.branches.size(); ++k)
    cov.both_branches += a.branches[k] != b.branches[k];
  int64_t fused = 0;
  std::pair<int, int> aliased{0, 0};
  err = check(p, a, b, {}, perturb, &fused, &aliased);
  cov.aliased += aliased.first;
  cov.aliased_eager += aliased.second;
  cov.fused += fused > 0;
  cov.fused_kernels += fused;
  if (!err.empty() && ill_conditioned(p, a, b, seed, perturb)) {
    ++cov.ill_conditioned;
    return "";
  }
  if (!err.empty() && differs_by_cond_zeros(p, a, b, seed, perturb)) {
    ++cov.cond_zeros;
    return "";
  }
  if (err.empty() || perturb != 0) return err;
  // Is an optimization pass involved? And which: the passes that, disabled alone, make it pass.
  std::string off = check(p, a, b, CompileOptions{.disable_passes = kPasses, .cache_limit = 8});
  std::string alone;
  if (off.empty())
    for (const std::string& pass : kPasses)
      if (check(p, a, b, CompileOptions{.disable_passes = {pass}, .cache_limit = 8}).empty())
        alone += " " + pass;
  std::string report = fmt::format(
      "{}{}with every pass disabled: {}", program_text(p), err,
      !off.empty()    ? "still differs:\n" + off
      : alone.empty() ? "compiled matches eager; no pass alone is the cause\n"
                      : "compiled matches eager; it does with only" + alone + " disabled too\n");
  if (off.empty() && env_int("DUET_REDUCE", 0)) {
    const Program q = reduce_program(p, a, b);
    report +=
        "reduced:\n" + program_text(q) + check(q, rerun(q, a, seed + 1), rerun(q, b, seed + 2), {});
  }
  return report;
}

// Runs and checks every seed's program, failing (with the first ten reports) on a mismatch.
void run_seeds(const std::vector<uint64_t>& seeds, Coverage& cov, Mix mix, bool autocast = false) {
  for (uint64_t seed : seeds) {
    const DType cast = !autocast ? DType::f32 : seed % 2 ? DType::f16 : DType::bf16;
    std::string report = run_seed(seed, cov, 0, mix, cast);
    if (!report.empty()) {
      ++cov.failed;
      cov.failed_seeds += fmt::format(" {}", seed);
      if (cov.failed <= 10) FAIL_CHECK(report);
    }
  }
  std::string ops;
  for (int i = 0; i < int(Op::Count); ++i)
    if (cov.ops[size_t(i)]) ops += fmt::format(" {}:{}", op_text(Op(i)), cov.ops[size_t(i)]);
  const std::string control =
      cov.control ? fmt::format("; {} with control flow, {} of {} conds ran both branches",
                                cov.control, cov.both_branches, cov.conds)
                  : "";
  const std::string cast = autocast
                               ? fmt::format(
                                     "; under autocast, {} not compared (run_seed says why) and {} "
                                     "with values in the low dtype",
                                     cov.refused, cov.low)
                               : "";
  const std::string aliased =
      cov.aliased ? fmt::format(
                        "; {} called with an argument that is a written buffer ({} of "
                        "them run eagerly)",
                        cov.aliased, cov.aliased_eager)
                  : "";
  MESSAGE(fmt::format(
      "{} programs compared ({} steps), {} skipped for non-finite values, {} ill-conditioned, {} "
      "matching a cond's zeros, {} failed{}; {} with fused kernels ({} kernels){}{}{}; steps per "
      "op:{}",
      cov.programs, cov.steps, cov.skipped, cov.ill_conditioned, cov.cond_zeros, cov.failed,
      cov.failed ? " (seeds" + cov.failed_seeds + ")" : "", cov.fused, cov.fused_kernels, control,
      cast, aliased, ops));
}

// ---- the batch mix: a symbolic batch dim ----

/// What one compiled function of a program of the batch mix did over its calls.
struct BatchResult {
  std::string err;
  bool symbolic = false;      ///< its latest trace has symbolic dims (CompileStats::symbolic_dims)
  bool specialized = false;   ///< a batch dim was made concrete (a retrace reason says why)
  bool guard_failed = false;  ///< a call failed a guard of a symbolic trace
  std::vector<std::string> reasons;  ///< CompileStats::retrace_reasons
};

/// Calls the compiled program at each size of kBatchSizes (on samples[k] at kBatchSizes[k]),
/// without gradients and then with them, and compares each call with eager. The batched
/// inputs are argument 0 (a vector), the others argument 1; `dynamic`: the batch dims are
/// named in CompileOptions::dynamic (dim 0 of argument 0), else automatic dynamic finds them
/// when the second call changes their size. Traces: one per grad mode with `dynamic`, else one
/// more (the first call's, concrete), unless a batch dim was specialized or a guard failed.
/// `perturb` moves the compiled floating outputs as in check (the self-test).
BatchResult check_batch(const Program& p, const std::vector<Sample>& samples, bool dynamic,
                        const std::vector<std::string>& disable = {}, double perturb = 0) {
  BatchResult r;
  Calls calls(p);
  std::string& err = calls.err;
  std::vector<Tensor>& caps = calls.caps;
  auto fn = [&p, &caps, perturb](std::vector<Tensor> batched, std::vector<Tensor> rest) {
    std::vector<Tensor> in;
    size_t b = 0, o = 0;
    for (size_t i = 0; i < p.inputs.size(); ++i)
      in.push_back(p.inputs[i].captured ? caps[i] : p.inputs[i].batched ? batched[b++] : rest[o++]);
    std::vector<Tensor> outs = run_program(p, in);
    if (perturb != 0)
      for (Tensor& t : outs)
        if (floating(t)) t = t * (1 + perturb) + perturb;
    return outs;
  };
  CompileOptions opts;
  if (dynamic) opts.dynamic = {{0, 0}};
  opts.disable_passes = disable;
  opts.cache_limit = 16;  // a specialized program traces once per size and grad mode
  auto c = compile(fn, opts);
  auto st = [&c] { return c.stats(); };  // a fresh copy at each read
  auto call = [&](size_t k, bool rg, std::vector<Tensor>& in) {
    const Program q = at_batch(p, kBatchSizes[k]);
    auto [ins, args] = calls.inputs(samples[k], rg, false, &q);
    std::vector<Tensor> batched, rest;
    size_t a = 0;
    for (const InputSpec& s : p.inputs)
      if (!s.captured) (s.batched ? batched : rest).push_back(args[a++]);
    in = ins;
    manual_seed(kRandSeed);
    return c(batched, rest);
  };
  const size_t n = std::size(kBatchSizes);
  int want = dynamic ? 1 : 2;
  try {
    for (size_t k = 0; k < n; ++k) {
      const int plans = st().plans_built, traces = st().traces;
      std::vector<Tensor> in;
      calls.outputs(call(k, false, in), samples[k].plain, fmt::format("batch {}", kBatchSizes[k]));
      // A size seen before reuses its plan.
      if (std::count(kBatchSizes, kBatchSizes + k, kBatchSizes[k]) && st().traces == traces &&
          st().plans_built != plans)
        err += fmt::format("batch {} again: a new plan (plans_built {} -> {})\n", kBatchSizes[k],
                           plans, st().plans_built);
    }
    const int no_grad_traces = st().traces;
    for (size_t k = 0; k < n; ++k) {
      std::vector<Tensor> in;
      const std::vector<Tensor> outs = call(k, true, in);
      const std::string which = fmt::format("batch {} (grad)", kBatchSizes[k]);
      calls.outputs(outs, samples[k].with_grad, which);
      calls.grads(outs, in, samples[k].with_grad, which);
    }
    r.reasons = st().retrace_reasons;
    for (const std::string& why : r.reasons) {
      r.specialized |= why.find("made concrete") != std::string::npos ||
                       why.find("kept concrete") != std::string::npos;
      r.guard_failed |= why.starts_with("guard ");
    }
    r.symbolic = !st().symbolic_dims.empty();
    if (!r.specialized && !r.guard_failed) {
      if (no_grad_traces != want)
        err += fmt::format("calls without gradients: {} traces (want {}); retraced because: {}\n",
                           no_grad_traces, want, fmt::join(st().retrace_reasons, "; "));
      want += grad_retraces(p);
      if (st().traces != want)
        err +=
            fmt::format("calls with gradients: {} traces in all (want {}); retraced because: {}\n",
                        st().traces, want, fmt::join(st().retrace_reasons, "; "));
      if (!r.symbolic) err += "no symbolic dims, and no specialization\n";
    }
    if (st().eager_calls)
      err += fmt::format("{} calls ran eagerly (cache full)\n", st().eager_calls);
  } catch (const std::exception& ex) {
    err += fmt::format("threw: {}\n", ex.what());
  }
  r.err = err;
  return r;
}

struct BatchCoverage {
  int programs = 0, skipped = 0, failed = 0, steps = 0;
  int runs = 0;                      ///< compiled functions checked (two per program)
  int symbolic = 0;                  ///< of those, kept a batch dim symbolic to the end
  int specialized = 0;               ///< made a batch dim concrete
  int guard_failed = 0;              ///< failed a guard at some size
  int conds = 0, both_branches = 0;  ///< conds, and those the sizes' samples ran both ways
  int cond_zeros =
      0;  ///< compiled functions that differ only by a cond's zeros (Note [A cond's zeros])
  int scans = 0, scans_over_batch = 0;  ///< scans, and those whose length is the batch size
  int broadcasts = 0;  ///< elementwise steps broadcasting operands of which one has a batch dim
  /// Per op: steps (of programs and of control-flow functions), those reading a value with a
  /// batch dim, and of those the ones whose result keeps one.
  std::vector<int> ops = std::vector<int>(size_t(Op::Count), 0);
  std::vector<int> batched = std::vector<int>(size_t(Op::Count), 0);
  std::vector<int> kept = std::vector<int>(size_t(Op::Count), 0);
  /// The reasons for specializations (the shape read left out), counted.
  std::map<std::string, int> why;
  std::string failed_seeds;
};

void count_steps(const std::vector<Step>& steps, BatchCoverage& cov) {
  for (const Step& st : steps) {
    ++cov.ops[size_t(st.op)];
    cov.batched[size_t(st.op)] += st.batch & 1;
    cov.kept[size_t(st.op)] += (st.batch & 3) == 3;
    cov.broadcasts += (st.batch & 4) != 0;
    cov.scans += st.op == Op::Scan;
    cov.scans_over_batch += st.op == Op::Scan && st.mode == 1;  // its length is the batch size
    count_steps(st.body, cov);
    count_steps(st.body2, cov);
  }
}

// "size(1) of a tensor of shape (4, s0) was read as an integer" without the shape.
std::string specialization(const std::string& why) {
  const size_t at = why.find("made concrete: ");
  if (at == std::string::npos) return "";
  std::string s = why.substr(at + 15);
  const size_t from = s.find(" of shape "), to = s.find(" w", from == s.npos ? 0 : from + 10);
  if (from != s.npos && to != s.npos) s.replace(from + 10, to - from - 10, "...");
  return s;
}

// Builds, runs and checks the program of one seed in the batch mix, with the batch dims named
// dynamic and found by automatic dynamic; returns the failure report ("" if none). With
// `perturb`, only the first, its outputs moved by it (see check_batch), and the bare
// differences are returned (the self-test).
// Note [A cond's zeros], for the batch mix: each batch size's sample again, under
// CondZerosScope.
bool batch_differs_by_cond_zeros(const Program& p, const std::vector<Sample>& samples,
                                 uint64_t seed, bool dynamic) {
  if (samples.empty() || samples[0].branches.empty()) return false;  // (no cond)
  try {
    std::vector<Sample> z;
    {
      CondZerosScope zeros;
      for (size_t k = 0; k < samples.size(); ++k) {
        z.push_back(rerun(at_batch(p, kBatchSizes[k]), samples[k], seed + 1 + k));
        z.back().branches = samples[k].branches;
      }
    }
    return check_batch(p, z, dynamic).err.empty();
  } catch (const std::exception&) {
    return false;
  }
}

std::string run_batch_seed(uint64_t seed, BatchCoverage& cov, double perturb = 0) {
  Program p;
  p.seed = seed;
  Generator gen(p, seed, Mix::Batch);
  gen.make_inputs();
  Rng r = rng_for(seed, 1);
  std::string err = gen.make_steps(gen.random_length());
  if (!err.empty()) return program_text(p) + err;
  gen.choose_outputs();
  std::vector<Sample> samples;
  for (size_t k = 0; k < std::size(kBatchSizes); ++k) {
    // Each sample looks for values on which every cond goes the other way than the last.
    Sample s = sample(at_batch(p, kBatchSizes[k]), r, seed + 1 + k,
                      k == 0 ? &gen.first_values() : nullptr, k ? &samples.back() : nullptr);
    if (!s.finite) {
      ++cov.skipped;
      return "";
    }
    samples.push_back(std::move(s));
  }
  ++cov.programs;
  cov.steps += int(p.steps.size());
  count_steps(p.steps, cov);
  for (size_t j = 0; j < samples[0].branches.size(); ++j) {
    ++cov.conds;
    bool taken[2] = {false, false};
    for (const Sample& s : samples) taken[s.branches[j]] = true;
    cov.both_branches += taken[0] && taken[1];
  }
  if (perturb != 0) return check_batch(p, samples, true, {}, perturb).err;
  std::string report;
  for (bool dynamic : {true, false}) {
    const BatchResult b = check_batch(p, samples, dynamic);
    ++cov.runs;
    cov.symbolic += b.symbolic && !b.specialized;
    cov.specialized += b.specialized;
    cov.guard_failed += b.guard_failed;
    for (const std::string& why : b.reasons)
      if (!specialization(why).empty()) ++cov.why[specialization(why)];
    if (b.err.empty()) continue;
    if (batch_differs_by_cond_zeros(p, samples, seed, dynamic)) {
      ++cov.cond_zeros;
      continue;
    }
    const bool off = check_batch(p, samples, dynamic, kPasses).err.empty();
    report += fmt::format("{}:\n{}with every pass disabled: {}\n",
                          dynamic ? "CompileOptions::dynamic = {0, 0}" : "automatic dynamic", b.err,
                          off ? "compiled matches eager" : "still differs");
  }
  return report.empty() ? "" : program_text(p) + report;
}

}  // namespace

// Runs the seeds of a mix that the environment names (`count` of them, else `fallback`, or the
// one seed `one` names), checks that none failed, and returns the coverage for the test's checks.
Coverage run_mix(Mix mix, const char* count, int fallback, const char* one, bool autocast = false) {
  Coverage cov;
  const std::vector<uint64_t> seeds = seeds_from_env(count, fallback, one);
  cov.seeds = int(seeds.size());
  run_seeds(seeds, cov, mix, autocast);
  CHECK(cov.failed == 0);
  return cov;
}

TEST_CASE("random programs: compiled outputs and gradients match eager") {
  const Coverage cov = run_mix(Mix::Mixed, "DUET_RANDOM_PROGRAMS", 2000, "DUET_RANDOM_SEED");
  // Resampling makes non-finite programs rare; many would mean the generator lost its guards.
  CHECK(cov.skipped * 50 <= cov.seeds);
  // The issue asks for at least 500 programs per run.
  if (cov.seeds >= 500) CHECK(cov.programs >= 500);
  // A quarter of the programs have control flow (random_program.h), and the second sample
  // takes the other branch of most conds (sample): else the branches would go unchecked.
  if (cov.seeds >= 500) {
    CHECK(cov.control * 5 >= cov.programs);
    CHECK(cov.both_branches * 4 >= cov.conds * 3);
  }
}

// Seeds of the mixed mix that sweeps far past the default ones found failing, each for a reason
// since fixed; they run whatever DUET_RANDOM_PROGRAMS says. 609637: a captured f64 read only as
// div_'s detached divisor was read by abs() first, so the compiled guard (rightly) retraced on
// its requires_grad where grad_retraces predicted no retrace; the program now detaches first.
// 1001629: a captured f64 scalar read only by squeeze(), which returns it itself (no op), and
// detached by an UpdateBuffer left the guard alone where grad_retraces predicted a retrace.
TEST_CASE("random programs: seeds that sweeps found") {
  Coverage cov;
  const std::vector<uint64_t> seeds = {609637, 1001629};
  cov.seeds = int(seeds.size());
  run_seeds(seeds, cov, Mix::Mixed);
  CHECK(cov.failed == 0);
  CHECK(cov.programs == cov.seeds);
}

// Programs of elementwise chains, diamonds, broadcasts and reductions (the fusion mix): the same
// comparison, and most of them must have run fused kernels, or the test would prove nothing
// about fusion. Its bf16 and f16 programs (Note [Low-precision fusion programs] in
// random_program_fusion.cpp) must agree bit for bit on every low-precision value.
void run_fusion_seeds(Mix mix, const char* count, int fallback, const char* one) {
  const Coverage cov = run_mix(mix, count, fallback, one);
  CHECK(cov.skipped * 50 <= cov.seeds);
  CHECK(cov.fused * 4 >= cov.programs * 3);
}

TEST_CASE("random programs built to stress fusion") {
  run_fusion_seeds(Mix::Fusion, "DUET_FUSION_PROGRAMS", 600, "DUET_FUSION_SEED");
}

TEST_CASE("random bf16 and f16 programs built to stress fusion") {
  run_fusion_seeds(Mix::LowFusion, "DUET_LOW_FUSION_PROGRAMS", 300, "DUET_LOW_FUSION_SEED");
}

// Programs of the whole op table in bf16 and f16 (the mixed mix in bf16 and f16): every op's
// low-precision path through the trace, the passes, the memory plan and the executor, against
// eager within two bf16 ulps (looseness).
TEST_CASE("random bf16 and f16 programs of the whole op table") {
  const Coverage cov =
      run_mix(Mix::LowMixed, "DUET_LOW_MIXED_PROGRAMS", 500, "DUET_LOW_MIXED_SEED");
  CHECK(cov.skipped * 10 <= cov.seeds);
}

// Mixed programs of f32 and f64 run inside an autocast scope, bf16 for even seeds and f16 for odd
// ones (Program::autocast): the trace records the casts autocast makes, so compiled equals eager
// as it does without the scope, the low-precision values bit for bit. Most programs must be
// compared (a quarter of the mixed programs have control flow, which is not), and many must
// have had values in the low dtype (a product's result), or the test would say little about
// autocast.
TEST_CASE("random programs under autocast: compiled matches eager") {
  const Coverage cov =
      run_mix(Mix::Mixed, "DUET_AUTOCAST_PROGRAMS", 600, "DUET_AUTOCAST_SEED", true);
  INFO(cov.refused << " not compared, " << cov.low << " with low-precision values");
  CHECK(cov.programs * 10 >= cov.seeds * 6);
  CHECK(cov.low * 5 >= cov.programs);
}

// Programs with a batch dim (the batch mix, random_program.h), compiled with that dim symbolic:
// named in CompileOptions::dynamic, and found by automatic dynamic; each is called at every
// size of kBatchSizes (1 and a repeat among them), without and with gradients, and compared
// with eager at each. They trace once per grad mode (one more with automatic dynamic) unless
// a batch dim was specialized or a guard failed, which the retrace reasons must say; most must
// keep the batch dim symbolic to the end; and the ops that meet the batch dim must meet it.
TEST_CASE("random programs with a symbolic batch dim") {
  BatchCoverage cov;
  const std::vector<uint64_t> seeds = seeds_from_env("DUET_BATCH_PROGRAMS", 300, "DUET_BATCH_SEED");
  for (uint64_t seed : seeds) {
    const std::string report = run_batch_seed(seed, cov);
    if (!report.empty()) {
      ++cov.failed;
      cov.failed_seeds += fmt::format(" {}", seed);
      if (cov.failed <= 10) FAIL_CHECK(fmt::format("seed {}: {}", seed, report));
    }
  }
  std::string ops, why;
  for (int i = 0; i < int(Op::Count); ++i)
    if (cov.ops[size_t(i)])
      ops += fmt::format(" {}:{}/{}/{}", op_text(Op(i)), cov.kept[size_t(i)],
                         cov.batched[size_t(i)], cov.ops[size_t(i)]);
  for (const auto& [w, n] : cov.why) why += fmt::format("\n  {} x {}", n, w);
  MESSAGE(fmt::format(
      "{} programs compared ({} steps) at batch sizes {}, {} skipped for non-finite values, {} "
      "failed{}; of {} compiled functions, {} matched a cond's zeros, {} kept the batch dim "
      "symbolic, {} specialized it, "
      "{} failed a guard; {} of {} conds ran both branches; {} of {} scans ran over the batch "
      "dim; {} broadcasts; steps per op (keeping a batch dim / reading one / all):{}; specialized "
      "because:{}",
      cov.programs, cov.steps, fmt::join(kBatchSizes, ", "), cov.skipped, cov.failed,
      cov.failed ? " (seeds" + cov.failed_seeds + ")" : "", cov.runs, cov.cond_zeros, cov.symbolic,
      cov.specialized, cov.guard_failed, cov.both_branches, cov.conds, cov.scans_over_batch,
      cov.scans, cov.broadcasts, ops, why));
  CHECK(cov.failed == 0);
  CHECK(cov.skipped * 50 <= int(seeds.size()));
  if (seeds.size() >= 200) {
    // Specializations come from code that reads sizes as integers (randn(x.sizes()), full,
    // arange and eye of a batch dim, copy_, a batched conv2d weight): a few programs in ten.
    CHECK(cov.symbolic * 20 >= cov.runs * 17);
    CHECK(cov.both_branches * 4 >= cov.conds * 3);
    CHECK(cov.scans_over_batch >= 5);
    CHECK(cov.broadcasts >= 50);
    // The ops that meet the batch dim: broadcasting elementwise ops, reductions over it and
    // over other dims, matmul, reshapes with -1, permutes, slices, cats, means, expands, cond
    // and scan.
    for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Where, Op::MatMul, Op::Reshape,
                  Op::Transpose, Op::Permute, Op::Slice, Op::Cat, Op::Sum, Op::Mean, Op::Max,
                  Op::Expand, Op::Unsqueeze, Op::Cond, Op::Scan}) {
      INFO(op_text(op));
      CHECK(cov.kept[size_t(op)] >= 5);
    }
    for (Op op : {Op::Sum, Op::Mean, Op::Max, Op::MatMul})  // over the batch dim
      CHECK(cov.batched[size_t(op)] - cov.kept[size_t(op)] >= 5);
  }
}

// The allowance of Note [Ill-conditioned programs] is per element: each element of an eager
// result may differ by kNoise times how far that element moved on nudged inputs, and an element
// that did not move gets the plain tolerance. (Seeds 284922 and 333561 of the mixed mix differ
// by more than the tolerances only where the generated kernels run, which ctest's runs of this
// binary switch off; sweeps run them, and count the two as ill-conditioned.)
TEST_CASE("random programs: the noise allowance is per element") {
  const Tensor want = tensor({1.0, 2.0, 3.0});
  auto differs = [&](std::vector<double> got) {
    return !compare_tensors(tensor(got), want, "allowance").empty();
  };
  CHECK(differs({1.0003, 2.0, 2.9997}));  // beyond the tolerance, without an allowance
  noise_of[want.unsafe_impl()] = {1e-4, 0, 1e-4};
  CHECK_FALSE(differs({1.0003, 2.0, 2.9997}));  // within kNoise times each element's noise
  CHECK(differs({1.0003, 2.0001, 3.0}));        // the element that did not move
  CHECK(differs({1.0006, 2.0, 3.0}));           // beyond kNoise times its noise
  CHECK_FALSE(differs({1.0, 2.0000001, 3.0}));  // the plain tolerance still holds
  noise_of.clear();
}

// The comparison itself: compiled outputs off by 1e-4 (relative and absolute; about 800 f32 ulps;
// a bf16 ulp in the low-precision programs) must be noticed in nearly every program (not in those
// with integer and bool outputs only).
TEST_CASE("random programs: a cond's zeros are counted apart, and only where they explain") {
  // Seed 529585: the false branch ran, the true branch reads std of one element (NaN); compiled,
  // its zeros made that operand's gradient NaN (Note [A cond's zeros]).
  Coverage cov;
  CHECK(run_seed(529585, cov).empty());
  CHECK(cov.cond_zeros == 1);
  CHECK(cov.ill_conditioned == 0);
  // An error the zeros do not explain still fails it.
  CHECK(!run_seed(529585, cov, 1e-4).empty());
  CHECK(cov.cond_zeros == 1);
}

TEST_CASE("random programs: the comparison notices an error of 1e-4") {
  Coverage cov;
  int noticed = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) noticed += !run_seed(seed, cov, 1e-4).empty();
  INFO(noticed << " of 50 noticed");
  CHECK(noticed >= 45);
  // And in programs of the fusion mix, whose f64 results may be compared with f32 tolerances.
  int fused = 0;
  for (uint64_t seed = 0; seed < 30; ++seed)
    fused += !run_seed(seed, cov, 1e-4, Mix::Fusion).empty();
  INFO(fused << " of 30 fusion-mix programs noticed");
  CHECK(fused >= 28);
  // And in its bf16 and f16 programs, compared bit for bit: an error of 1e-4 rounds away in
  // most low-precision values, one ulp (2^-7 for bf16 at magnitude 1) does not.
  int low = 0;
  for (uint64_t seed = 0; seed < 30; ++seed)
    low += !run_seed(seed, cov, 0x1p-7, Mix::LowFusion).empty();
  INFO(low << " of 30 low-precision fusion-mix programs noticed");
  CHECK(low >= 28);
  // And in the mixed mix in bf16 and f16, whose floating values are compared within two bf16
  // ulps: an error of 2^-4 (four times that) is noticed. (Four of its first 30 programs are not:
  // three have integer outputs only, and one's output lies near -1, where the move o * 2^-4 +
  // 2^-4 nearly cancels.)
  int low_mixed = 0;
  for (uint64_t seed = 0; seed < 30; ++seed)
    low_mixed += !run_seed(seed, cov, 0x1p-4, Mix::LowMixed).empty();
  INFO(low_mixed << " of 30 low-precision mixed-mix programs noticed");
  CHECK(low_mixed >= 25);
  // And in programs of the batch mix, at every batch size.
  BatchCoverage bc;
  int batched = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) batched += !run_batch_seed(seed, bc, 1e-4).empty();
  INFO(batched << " of 30 batch-mix programs noticed");
  CHECK(batched >= 27);
}

// The library bugs the random programs found, reduced to a few lines each.
TEST_CASE("random programs: reductions of the bugs they found") {
  const Tensor ones2 = make({1, 1}, {2}, DType::f64);
  SUBCASE("fold marked a result of numbers only as a wrapped number") {
    // pow(2, x)'s gradient multiplies by log(2), a 0-d f64 constant: as a wrapped number it
    // promoted differently than eager's 0-d tensor, and the graph failed verify().
    Tensor x = make({0.7}, {}, DType::f32);
    x.requires_grad_(true);
    auto f = [](Tensor x) { return pow(2.0, x); };
    Tensor want = grad({f(x)}, {x})[0];
    auto c = compile(f);
    CHECK(values(grad({c(x)}, {x})[0]) == values(want));
  }
  SUBCASE("a captured tensor returned as it is gets its gradient") {
    Tensor w = make({0.5, -1.5}, {2}, DType::f64), x = make({2, 3}, {2}, DType::f64);
    w.requires_grad_(true);
    x.requires_grad_(true);
    auto alone = compile([&w](Tensor) { return std::vector<Tensor>{w}; });
    CHECK(values(grad(alone(x), {w}, {make({10, 20}, {2}, DType::f64)})[0]) ==
          std::vector<double>{10, 20});  // was 0
    auto both = compile([&w](Tensor x) { return std::vector<Tensor>{x * 2, w}; });
    // Was an InternalError: the backward plan of w read no gradient ("plan of 0 given 1 inputs").
    std::vector<Tensor> g = grad(both(x), {x, w}, {ones2, make({10, 20}, {2}, DType::f64)});
    CHECK(values(g[0]) == std::vector<double>{2, 2});
    CHECK(values(g[1]) == std::vector<double>{10, 20});
  }
  SUBCASE("a captured tensor read through detach() first") {
    Tensor w = make({0.5, -1.5}, {2}, DType::f64), x = make({2, 3}, {2}, DType::f64);
    auto f = [&w](Tensor x) {
      Tensor y = x * w.detach();  // the same storage and layout as w, another tensor
      return y + sin(w);
    };
    auto c = compile(f);
    c(x);  // traced with w not requiring grad
    w.requires_grad_(true);
    Tensor want = grad({f(x)}, {w}, {ones2})[0];
    // One captured input stood for both tensors, whichever was read first: the guard watched
    // w.detach()'s flag (no retrace), and the gradient went to it (0 for w).
    Tensor got = grad({c(x)}, {w}, {ones2})[0];
    CHECK(c.stats().traces == 2);
    CHECK(values(got) == values(want));
    auto fresh = compile(f);  // traced with w requiring grad from the start
    CHECK(values(grad({fresh(x)}, {w}, {ones2})[0]) == values(want));
  }
  SUBCASE("an output that cannot be differentiated leaves the others their backward") {
    // t.mul_(y) overwrote the value mul saved for y's gradient: eager fails at backward of t;
    // compiled dropped the backward of every output.
    Tensor x = make({2, 3}, {2}, DType::f64), y = make({5, 7}, {2}, DType::f64);
    x.requires_grad_(true);
    y.requires_grad_(true);
    auto c = compile([](Tensor x, Tensor y) {
      Tensor t = x.clone();
      t.mul_(y);
      return std::vector<Tensor>{t, x * 2};
    });
    std::vector<Tensor> o = c(x, y);
    REQUIRE(o[1].requires_grad());
    CHECK(values(grad({o[1]}, {x}, {ones2})[0]) == std::vector<double>{2, 2});
  }
  SUBCASE("a scan reaches what its steps reach, not what any number of steps would") {
    // The std of one element is NaN, and so is its gradient rule at any gradient, zero too.
    // Eagerly the loop's tape reaches it only where a step read it; compiled, the reverse scan
    // gave zeros to every input that some number of steps could reach, and std turned them into
    // NaN (seeds 535022 and 563811).
    Tensor x = make({0.7}, {1}, DType::f64), y = make({1.5, -0.5}, {2}, DType::f64);
    x.requires_grad_(true);
    y.requires_grad_(true);
    for (int64_t steps : {0, 1}) {
      CAPTURE(steps);
      auto f = [steps](Tensor x, Tensor y) {
        auto nan_of = [](const Tensor& t) { return duet::std(t, Dims{0}, 1, false); };
        Tensor xs = slice(expand(reshape(nan_of(slice(y, 0, 0, 1)), {1}), {2}), 0, 0, steps);
        // Carry (a, b): a step returns (2 b, b + x_t). After no steps b is its initial value
        // (not xs); after one, a is twice b's initial value (not a's, nor xs).
        std::vector<Tensor> r = scan(
            [](const std::vector<Tensor>& c) {
              return std::vector<Tensor>{c[1] * 2, c[1] + c[2]};
            },
            {reshape(nan_of(x), {1}), slice(y, 0, 1, 2) * 1}, {xs});
        return r[steps == 0 ? 1 : 0];
      };
      const Tensor ones = make({1}, {1}, DType::f64);
      std::vector<Tensor> want = grad({f(x, y)}, {x, y}, {ones});
      auto c = compile(f);
      std::vector<Tensor> got = grad({c(x, y)}, {x, y}, {ones});
      for (size_t i = 0; i < 2; ++i) {
        CAPTURE(i);
        REQUIRE(got[i].defined() == want[i].defined());
        if (want[i].defined()) CHECK(values(got[i]) == values(want[i]));
      }
    }
  }
}

}  // namespace duet::test

namespace duet::test {
namespace {
// f compiled with dim 0 of its argument symbolic, called at batch sizes 2, 5 and 1 on random
// values (manual_seed before each call, eager and compiled): equal to eager at each, within
// 1e-12, in one trace.
template <class F>
void check_one_trace(F f, const Shape& per_row, bool with_grad = false) {
  auto c = compile(f, CompileOptions{.dynamic = {{0, 0}}, .cache_limit = 8});
  Rng rng(7);
  for (int64_t b : {2, 5, 1}) {
    std::vector<int64_t> dims = {b};
    dims.insert(dims.end(), per_row.begin(), per_row.end());
    const Shape s(dims);
    Tensor x = make(random_values(s.numel(), Domain{}, DType::f64, rng), s, DType::f64);
    x.requires_grad_(with_grad);
    manual_seed(11);
    const Tensor want = f(x);
    const Tensor want_next = randn({3}, Options().dtype(DType::f64));  // the generator moved on
    manual_seed(11);
    const Tensor got = c(x);
    INFO("batch " << b);
    CHECK(differences(values(got), values(want), 1e-12, 1e-12) == "");
    CHECK(values(randn({3}, Options().dtype(DType::f64))) == values(want_next));
    if (with_grad) {
      const Tensor g =
          make(random_values(want.numel(), Domain{}, DType::f64, rng), want.sizes(), DType::f64);
      CHECK(differences(values(grad({got}, {x}, {g})[0]), values(grad({want}, {x}, {g})[0]), 1e-12,
                        1e-12) == "");
    }
  }
  CHECK(c.stats().traces == 1);
  CHECK(c.stats().retrace_reasons.empty());
  CHECK(c.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
}
}  // namespace

// The library bugs the batch mix found: ops that read a symbolic batch dim as an integer, which
// specialized it (every batch size traced again), reduced to one op each.
TEST_CASE("random programs with a symbolic batch dim: reductions of the bugs they found") {
  const Tensor v = make({1, -2, 0.5}, {3}, DType::f64);
  SUBCASE("matmul with a 1-D operand") {
    // The inner sizes were compared as integers.
    check_one_trace([&v](Tensor x) { return matmul(x, v); }, {3}, true);     // (B, 3) @ (3)
    check_one_trace([&v](Tensor x) { return matmul(v, x); }, {3, 2}, true);  // (3) @ (B, 3, 2)
    check_one_trace([](Tensor x) { return matmul(x, x); }, {}, true);        // (B) @ (B)
  }
  SUBCASE("dropout") {
    // The mask was drawn at x.sizes(); now at its symbolic dims, and the generator's state
    // advances by a count computed from them.
    check_one_trace([](Tensor x) { return dropout(x, 0.4, true); }, {3}, true);
    check_one_trace([](Tensor x) { return dropout(dropout(x, 0.25, true) * 2, 0.5, true); },
                    {2, 3});
  }
  SUBCASE("conv2d, max_pool2d, avg_pool2d, unfold and fold over a batch of images") {
    // Unfold and Fold had no symbolic rule, and conv2d and the pools reshaped with x.sizes().
    Tensor w = make({0.5, -1, 0.25, 2, -0.5, 1, 1.5, -0.25, 0.75, -1.5, 0.5, 1, -2, 0.25, 1, -1},
                    {2, 2, 2, 2}, DType::f64);
    Tensor b = make({0.1, -0.2}, {2}, DType::f64);
    check_one_trace([&](Tensor x) { return conv2d(x, w, b, 1, 1); }, {2, 4, 3}, true);
    check_one_trace([](Tensor x) { return max_pool2d(x, 2, 1) + avg_pool2d(x, 2, 1); }, {2, 4, 3},
                    true);
    check_one_trace([](Tensor x) { return fold(unfold(x, 2, 1, 1), 4, 3, 2, 1, 1); }, {2, 4, 3},
                    true);
  }
}

}  // namespace duet::test
