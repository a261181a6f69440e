#include "trace/check.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/dispatch.h"
#include "core/ops.h"
#include "core/tensor_impl.h"
#include "eager/autograd.h"
#include "trace/plan/codegen.h"
#include "trace/compile.h"
#include "trace/plan/executor.h"
#include "trace/ir/passes.h"
#include "trace/tracer.h"

namespace duet {

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return {1e-7, 1e-7};
    case DType::f32:
      return {1e-5, 1e-5};
    case DType::f16:
      return {1e-3, 1e-5};
    case DType::bf16:
      return {1.6e-2, 1e-5};
    default:
      return {0, 0};
  }
}

std::string CheckDifference::str() const {
  if (!detail.empty()) return fmt::format("{}: {}", value, detail);
  std::string at;
  for (size_t i = 0; i < where.size(); ++i) at += fmt::format("{}{}", i ? ", " : "", where[i]);
  return fmt::format(
      "{} ({}): {} of {} elements differ; the largest difference is {:.6g} at [{}] ({} {:.9g}, "
      "{} {:.9g}; tolerance rtol {:g}, atol {:g})",
      value, shape, mismatched, numel, max_abs_diff, at, expected_from, expected, actual_from,
      actual, tolerance.rtol, tolerance.atol);
}

std::string CheckReport::str() const {
  if (ok)
    return fmt::format("{}: same as eager ({} values, {} compiled runs)\n", function,
                       values_compared, runs);
  static const char* const kRuns[] = {"", "first run", "second run (generated code, CUDA capture)",
                                      "third run (CUDA graph replay)"};
  std::string s = fmt::format("{} differs from eager on its {}:\n  {}\n", function,
                              run >= 1 && run <= 3 ? kRuns[run] : "run", difference.str());
  if (!bisection.empty()) {
    s += "passes switched on one at a time:\n";
    for (const std::string& b : bisection) s += "  " + b + "\n";
  }
  if (!cause.empty()) s += cause + "\n";
  if (node >= 0) {
    s += fmt::format("first node that differs: {}\n", node_text);
    s += fmt::format("  op {}{}{}\n", op, site.empty() ? "" : ", called at " + site,
                     scope.empty() ? "" : ", scope " + scope);
    if (node_difference.numel > 0 || !node_difference.detail.empty())
      s += "  " + node_difference.str() + "\n";
  }
  return s;
}

namespace detail {
namespace {

// ---- comparing tensors ----

// A CPU, contiguous copy as f64 (floats) or i64 (integers and bool), with no tape.
Tensor as_host(const Tensor& t) {
  const DType to = is_floating(t.dtype()) ? DType::f64 : DType::i64;
  Tensor h = t.to(Device::cpu()).to(to).contiguous();
  return h.is_same(t) ? h.clone() : h;
}

std::string meta_text(const Tensor& t) { return fmt::format("{} {}", t.dtype(), t.sizes()); }

std::optional<CheckDifference> compare(const std::string& what, const Tensor& expected,
                                       const Tensor& actual, const CheckOptions& opt) {
  CheckDifference d;
  d.value = what;
  if (expected.defined() != actual.defined()) {
    d.detail = expected.defined() ? "eager made it, the compiled run did not"
                                  : "the compiled run made it, eager did not";
    return d;
  }
  if (!expected.defined()) return std::nullopt;
  d.shape = meta_text(actual);
  if (expected.dtype() != actual.dtype() || expected.sizes() != actual.sizes()) {
    d.detail =
        fmt::format("eager made {}, the compiled run {}", meta_text(expected), meta_text(actual));
    return d;
  }
  auto it = opt.tolerances.find(expected.dtype());
  d.tolerance = it != opt.tolerances.end() ? it->second : default_tolerance(expected.dtype());
  const Tensor e = as_host(expected), a = as_host(actual);
  const int64_t n = e.numel();
  d.numel = n;
  int64_t worst = -1;
  double worst_diff = -1;
  if (is_floating(expected.dtype())) {
    const double* pe = static_cast<const double*>(e.raw_data());
    const double* pa = static_cast<const double*>(a.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      const double x = pe[i], y = pa[i];
      double diff;
      bool bad;
      if (std::isnan(x) || std::isnan(y)) {
        bad = std::isnan(x) != std::isnan(y);
        diff = bad ? INFINITY : 0;
      } else if (std::isinf(x) || std::isinf(y)) {
        bad = x != y;
        diff = bad ? INFINITY : 0;
      } else {
        diff = std::fabs(y - x);
        bad = diff > d.tolerance.atol + d.tolerance.rtol * std::fabs(x);
      }
      if (bad) ++d.mismatched;
      if (diff > worst_diff) {
        worst_diff = diff;
        worst = i;
      }
    }
    if (worst >= 0) {
      d.expected = pe[worst];
      d.actual = pa[worst];
    }
  } else {
    const int64_t* pe = static_cast<const int64_t*>(e.raw_data());
    const int64_t* pa = static_cast<const int64_t*>(a.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      const double diff = std::fabs(double(pa[i]) - double(pe[i]));
      if (pa[i] != pe[i]) ++d.mismatched;
      if (diff > worst_diff) {
        worst_diff = diff;
        worst = i;
      }
    }
    if (worst >= 0) {
      d.expected = double(pe[worst]);
      d.actual = double(pa[worst]);
    }
  }
  if (d.mismatched == 0) return std::nullopt;
  d.max_abs_diff = worst_diff;
  for (int64_t k = expected.dim() - 1, rest = worst; k >= 0; --k) {
    const int64_t size = expected.sizes()[k];
    d.where.insert(d.where.begin(), size ? rest % size : 0);
    rest = size ? rest / size : 0;
  }
  return d;
}

// ---- the caller's state (Note [Shadow-eager check], step 1) ----

class State {
 public:
  // The tensors the trace captured and the arguments; `materialized`: leaves the trace gave a
  // .grad buffer that they did not have.
  State(const std::vector<Tensor>& captured, const std::vector<Tensor>& args,
        const std::vector<const TensorImpl*>& materialized) {
    std::unordered_set<const TensorImpl*> made(materialized.begin(), materialized.end());
    // The buffers the trace made are no state of the caller's: a leaf's .grad is compared
    // through the leaf instead.
    std::unordered_set<const TensorImpl*> seen;
    for (const TensorImpl* leaf : materialized)
      if (leaf->autograd && leaf->autograd->grad) seen.insert(leaf->autograd->grad.get());
    auto add = [&](const Tensor& t, std::string label) {
      if (!t.defined() || !seen.insert(t.unsafe_impl()).second) return;
      tensors_.push_back(t);
      labels_.push_back(std::move(label));
    };
    for (size_t i = 0; i < args.size(); ++i) add(args[i], fmt::format("argument {}", i));
    for (size_t i = 0; i < captured.size(); ++i)
      add(captured[i], fmt::format("captured tensor {} ({})", i, meta_text(captured[i])));
    for (size_t i = 0; i < captured.size(); ++i) {
      const Tensor& c = captured[i];
      const TensorImpl* x = c.unsafe_impl();
      if (!c.requires_grad() || (x->autograd && x->autograd->grad_fn)) continue;
      Grad g;
      g.leaf = c;
      g.label = fmt::format(".grad of captured tensor {} ({})", i, meta_text(c));
      if (!made.count(x)) g.buffer = c.grad();
      grads_.push_back(std::move(g));
    }
    SuspendModes eager;
    NoGradGuard ng;
    for (const Tensor& t : tensors_) saved_.push_back(t.clone());
    for (Grad& g : grads_)
      if (g.buffer.defined()) g.saved = g.buffer.clone();
  }

  // Puts every value and .grad back as it was.
  void restore() const {
    SuspendModes eager;
    NoGradGuard ng;
    for (size_t i = 0; i < tensors_.size(); ++i) Tensor(tensors_[i]).copy_(saved_[i]);
    for (const Grad& g : grads_) {
      Tensor(g.leaf).set_grad(g.buffer);
      if (g.buffer.defined()) Tensor(g.buffer).copy_(g.saved);
    }
  }

  // What a run left: the results, then every tensor and .grad after it (copies).
  struct Values {
    std::vector<std::string> labels;
    std::vector<Tensor> values;
  };
  Values after(const std::vector<Tensor>& results) const {
    SuspendModes eager;
    NoGradGuard ng;
    Values v;
    for (size_t i = 0; i < results.size(); ++i) {
      v.labels.push_back(fmt::format("result {}", i));
      v.values.push_back(results[i].defined() ? results[i].detach().clone() : Tensor());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      v.labels.push_back(labels_[i] + " after the call");
      v.values.push_back(tensors_[i].clone());
    }
    for (const Grad& g : grads_) {
      v.labels.push_back(g.label);
      const Tensor gr = g.leaf.grad();
      v.values.push_back(gr.defined() ? gr.clone() : Tensor());
    }
    return v;
  }

 private:
  struct Grad {
    Tensor leaf, buffer, saved;
    std::string label;
  };
  std::vector<Tensor> tensors_, saved_;
  std::vector<std::string> labels_;
  std::vector<Grad> grads_;
};

// The first value of `actual` that differs from `expected` (a missing .grad counts as zeros).
std::optional<CheckDifference> first_difference(const State::Values& expected,
                                                const State::Values& actual,
                                                const CheckOptions& opt) {
  if (expected.values.size() != actual.values.size()) {
    CheckDifference d;
    d.value = "results";
    d.detail = fmt::format("eager returned {} values, the compiled run {}", expected.values.size(),
                           actual.values.size());
    return d;
  }
  for (size_t i = 0; i < expected.values.size(); ++i) {
    Tensor e = expected.values[i], a = actual.values[i];
    if (e.defined() != a.defined() && expected.labels[i].starts_with(".grad")) {
      SuspendModes eager;
      const Tensor& d = e.defined() ? e : a;
      (e.defined() ? a : e) = zeros(d.sizes(), Options().dtype(d.dtype()).device(d.device()));
    }
    if (auto d = compare(expected.labels[i], e, a, opt)) return d;
  }
  return std::nullopt;
}

// Sets the codegen threshold to 0 while it lives (generated code from a kernel's first run on).
struct EagerCodegen {
  int prev = codegen::threshold();
  EagerCodegen() { codegen::set_threshold(0); }
  ~EagerCodegen() { codegen::set_threshold(prev); }
};

constexpr int kRuns = 3;

struct Outcome {
  std::optional<CheckDifference> diff;
  int run = 0;
};

// Runs `once` kRuns times from the restored state, comparing each run's values with eager's
// (when given; otherwise keeping the last run's in `last`). An Error raised by a run is a
// difference.
template <class Once>
Outcome run_compiled(const State& state, const State::Values* eager, const CheckOptions& opt,
                     Once&& once, State::Values* last = nullptr) {
  Outcome r;
  for (int k = 1; k <= kRuns; ++k) {
    state.restore();
    State::Values v;
    try {
      v = state.after(once());
    } catch (const Error& e) {
      CheckDifference d;
      d.value = "the call";
      d.detail = fmt::format("the compiled run raised: {}", e.what());
      r.diff = d;
      r.run = k;
      return r;
    }
    if (k == 1) codegen::wait_idle();
    if (last) *last = v;
    if (!eager) continue;
    if (auto d = first_difference(*eager, v, opt)) {
      r.diff = d;
      r.run = k;
      return r;
    }
  }
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The traced node behind a value that differs with no pass to blame: the result's node, or the
// write-back into the captured tensor.
int32_t node_of_value(const CompiledCore::Prepared& p, const std::string& value) {
  for (size_t i = 0; i < p.num_outputs && i < p.forward.outputs.size(); ++i)
    if (value == fmt::format("result {}", i)) return p.forward.outputs[i];
  for (const WriteBack& w : p.forward.writebacks)
    if (value.starts_with(fmt::format("captured tensor {} ", w.target)) ||
        value.starts_with(fmt::format(".grad of captured tensor {} ", w.target)))
      return w.value;
  return -1;
}

}  // namespace

CheckReport check_against_eager(const CompileOptions& options, const std::string& label,
                                const FlatArgs& args, const TraceFn& fn,
                                const CheckOptions& check) {
  DUET_CHECK_VALUE(!Tracer::current(),
                   "[check_against_eager] cannot run while {} is being traced: call it eagerly",
                   Tracer::current() ? Tracer::current()->graph().label : std::string());
  CheckReport rep;
  rep.function = label;
  CompileOptions base = options;
  base.check_against_eager = false;
  std::optional<EagerCodegen> eager_codegen;
  if (codegen::enabled()) eager_codegen.emplace();

  // 1. Trace once to learn the state, noting the .grad buffers the trace made.
  auto core = std::make_unique<CompiledCore>(base, label);
  std::vector<const TensorImpl*> made;
  CompiledCore::Prepared prep;
  {
    tls_materialized = &made;
    struct Unset {
      ~Unset() { tls_materialized = nullptr; }
    } unset;
    prep = core->prepare(args, fn);
  }
  const State state(prep.captured, args.tensors, made);
  struct RestoreAtEnd {
    const State& s;
    ~RestoreAtEnd() { s.restore(); }
  } restore_at_end{state};

  // 2. Eager, then the compiled function as configured.
  state.restore();
  const State::Values eager = state.after(fn(args.tensors));
  rep.values_compared = static_cast<int64_t>(eager.values.size());
  Outcome out = run_compiled(state, &eager, check, [&] { return core->call(args, fn); });
  rep.runs = out.diff ? out.run : kRuns;
  if (!out.diff) return rep;
  rep.ok = false;
  rep.difference = *out.diff;
  rep.run = out.run;

  if (check.bisect) {
    // 3. The passes, switched on one at a time.
    std::vector<std::string> order;
    for (const std::string& p : pipeline_passes())
      if (std::find(base.disable_passes.begin(), base.disable_passes.end(), p) ==
          base.disable_passes.end())
        order.push_back(p);
    auto disabled_for = [&](size_t k) {
      std::vector<std::string> d = base.disable_passes;
      d.insert(d.end(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
      return d;
    };
    auto differs = [&](size_t k) {
      CompileOptions o = base;
      o.disable_passes = disabled_for(k);
      CompiledCore c(o, label);
      Outcome r = run_compiled(state, &eager, check, [&] { return c.call(args, fn); });
      const std::vector<std::string> on(order.begin(),
                                        order.begin() + static_cast<std::ptrdiff_t>(k));
      rep.bisection.push_back(fmt::format("{}: {}", on.empty() ? "every pass off" : join(on),
                                          r.diff ? "differs" : "same as eager"));
      return bool(r.diff);
    };
    size_t culprit = order.size() + 1;  // 0: none (differs with every pass off)
    for (size_t k = 0; k <= order.size(); ++k)
      if (differs(k)) {
        culprit = k;
        break;
      }
    if (culprit >= 1 && culprit <= order.size()) {
      rep.pass = order[culprit - 1];
      rep.cause = fmt::format("introduced by the pass \"{}\"", rep.pass);
    } else if (culprit == 0) {
      rep.cause =
          "no pass introduced it: with every pass off the compiled function still differs, so "
          "the traced graph itself computes otherwise than the eager run (a C++ value read at "
          "trace time, state the trace does not see, or a kernel's rounding)";
    } else {
      rep.cause =
          "no configuration reproduced it: the difference comes and goes between runs (threads "
          "racing on shared state, or a nondeterministic kernel)";
    }

    // 4. The node: the traced graph with every value kept, with and without the pass.
    const Graph& g = prep.forward;
    if (!rep.pass.empty() && !prep.value_guards) {
      Graph pinned = g;
      std::vector<int32_t> pins;
      // Every computed value; a view of an input is no pass's work, and a view of a captured
      // tensor would show it after the write-backs.
      for (size_t v = 0; v < g.nodes.size(); ++v)
        if ((g.nodes[v].kind == NodeKind::Op || g.nodes[v].kind == NodeKind::Project) &&
            g.nodes[buffer_root(g, int32_t(v))].kind != NodeKind::Input)
          pins.push_back(int32_t(v));
      const size_t first_pin = pinned.outputs.size();
      pinned.outputs.insert(pinned.outputs.end(), pins.begin(), pins.end());
      auto values_with = [&](size_t k) {
        const std::vector<std::string> d = disabled_for(k);
        Plan plan(optimize(pinned, d), PlanOptions::from_disabled(d));
        State::Values last;
        // Every run, so that generated code and CUDA graphs take part; the last one counts.
        const Outcome o = run_compiled(
            state, nullptr, check, [&] { return plan.run(args.tensors); }, &last);
        if (o.diff) rep.cause += fmt::format(" (planning every value: {})", o.diff->str());
        return last;
      };
      const State::Values ref = values_with(culprit - 1), bad = values_with(culprit);
      for (size_t i = 0; i < pins.size() && rep.node < 0; ++i) {
        const size_t at = first_pin + i;
        if (at >= ref.values.size() || at >= bad.values.size()) break;
        if (auto d = compare(node_str(g, pins[i]), ref.values[at], bad.values[at], check)) {
          rep.node = pins[i];
          d->value = fmt::format("%{}", pins[i]);
          d->expected_from = "without the pass";
          d->actual_from = "with it";
          rep.node_difference = *d;
        }
      }
    }
    if (rep.node < 0) rep.node = node_of_value(prep, rep.difference.value);
    if (rep.node >= 0) {
      const GraphNode& n = g.nodes[rep.node];
      rep.node_text = node_str(g, rep.node);
      rep.op = n.kind == NodeKind::Op        ? std::string(op_name(n.op))
               : n.kind == NodeKind::Project ? "project"
                                             : "";
      rep.site = n.site ? n.site.str() : "";
      rep.scope = n.scope >= 0 && n.scope < int32_t(g.scopes.size()) ? g.scopes[n.scope] : "";
    }
  }
  if (check.throw_on_mismatch) throw MismatchError("[check_against_eager] " + rep.str());
  return rep;
}

}  // namespace detail
}  // namespace duet
