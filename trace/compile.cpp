#include "trace/compile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_set>

#include "core/dispatch.h"
#include "cuda/cuda.h"
#include "eager/autograd.h"
#include "eager/node.h"
#include "trace/arg_grads.h"
#include "trace/executor.h"
#include "trace/guards.h"
#include "trace/passes.h"
#include "trace/tracer.h"

// Note [Compiled functions and threads]
// One compiled function may be called from several threads at once (a server's request
// threads, data-parallel workers in one process). Its cache, statistics and specializations
// sit behind one mutex (CompiledCore::mu_), held while a call looks its signature up, traces,
// optimizes and builds plans; a new signature is traced once, by whichever thread sees it
// first, while the others wait for the lock. Plans run with the mutex released, so calls that
// hit the cache run side by side: a plan busy on one thread hands another thread a spare copy
// (Plan::run), so no two calls share an arena. A call that falls back to eager (a full cache)
// runs without the lock. Captured state is shared: two threads running a training step that
// updates the same parameters race as they would eagerly, so train on one thread per model.
// stats() returns a copy taken under the lock.

namespace duet::detail {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The tape node's op, for messages ("[backward] ... compiled function ...").
const OpDef& compiled_def() {
  static const OpDef def = opaque_node_def("compiled function");
  return def;
}

bool is_same_as_arg(const Tensor& t, const std::vector<Tensor>& args) {
  for (const Tensor& a : args)
    if (a.is_same(t)) return true;
  return false;
}

}  // namespace

// The values a set of roots needs, stopping at (and reporting) values in `stop`.
void ancestors(const Graph& g, const std::vector<int32_t>& roots, const std::vector<bool>& stop,
               std::vector<bool>& in, std::set<int32_t>* boundary) {
  std::vector<int32_t> stack;
  for (int32_t r : roots) {
    if (stop[r]) {
      if (boundary) boundary->insert(r);
    } else if (!in[r]) {
      in[r] = true;
      stack.push_back(r);
    }
  }
  while (!stack.empty()) {
    int32_t v = stack.back();
    stack.pop_back();
    for (int32_t i : g.nodes[v].inputs) {
      if (stop[i]) {
        if (boundary) boundary->insert(i);
      } else if (!in[i]) {
        in[i] = true;
        stack.push_back(i);
      }
    }
  }
}

// The part of `g` in `include`, with each value of `boundary` a Saved input (slots first, in
// order) and the other runtime inputs renumbered after them.
Graph extract(const Graph& g, const std::vector<bool>& include,
              const std::vector<int32_t>& boundary, const std::vector<int32_t>& roots,
              KeepWritebacks keep) {
  Graph s;
  s.label = g.label;
  s.scopes = g.scopes;
  std::vector<int32_t> map(g.nodes.size(), -1);
  std::vector<int32_t> cap_map(g.captured.size(), -1);
  for (int32_t b : boundary) {
    GraphNode n;
    n.kind = NodeKind::Input;
    n.role = InputRole::Saved;
    n.meta = g.nodes[b].meta;
    n.index = s.num_runtime_inputs++;
    map[b] = s.add(std::move(n));
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!include[i] || map[i] >= 0) continue;
    GraphNode n = g.nodes[i];
    if (n.kind == NodeKind::Input) {
      if (n.role == InputRole::Captured) {
        if (cap_map[n.index] < 0) {
          cap_map[n.index] = static_cast<int32_t>(s.captured.size());
          s.captured.push_back(g.captured[n.index]);
        }
        n.index = cap_map[n.index];
      } else {
        n.index = s.num_runtime_inputs++;
      }
    }
    for (int32_t& in : n.inputs) in = map[in];
    map[i] = s.add(std::move(n));
  }
  for (int32_t r : roots) s.outputs.push_back(map[r]);
  for (const WriteBack& w : g.writebacks) {
    if (keep == KeepWritebacks::None) break;
    if (!include[w.value] && (keep == KeepWritebacks::Computed || map[w.value] < 0)) continue;
    if (cap_map[w.target] < 0) {
      cap_map[w.target] = static_cast<int32_t>(s.captured.size());
      s.captured.push_back(g.captured[w.target]);
    }
    s.writebacks.push_back({map[w.value], cap_map[w.target]});
  }
  return s;
}

namespace {

bool same_input(const GraphNode& a, const GraphNode& b) {
  return a.kind == NodeKind::Input && b.kind == NodeKind::Input && a.role == b.role &&
         a.index == b.index;
}

// The passes replace a value by one it equals (x * 1 by x, b.clone() by b, two equal results by
// one), which can leave a result in the buffer of an argument, a captured tensor or another
// result where the traced code made a fresh tensor. Returned as is, writing into it would change
// them, and a leaf argument would get the compiled backward as its grad_fn. Each of the first n
// outputs of `opt` whose buffer aliases differently than in `traced` (the graph before the
// passes) gets a copy of its own. Constants need none: the executor clones them. A view of an
// input that the passes turned into the input itself (permute(x, {}) of a 0-d x) gets an
// identity view: a handle of its own on the same memory, as eager returns.
void copy_new_aliases(Graph& opt, const Graph& traced, size_t n) {
  std::vector<int32_t> before, after;
  for (size_t k = 0; k < n; ++k) {
    before.push_back(buffer_root(traced, traced.outputs[k]));
    after.push_back(buffer_root(opt, opt.outputs[k]));
    const GraphNode& a = opt.nodes[after[k]];
    bool copy = a.kind == NodeKind::Input && !same_input(a, traced.nodes[before[k]]);
    for (size_t j = 0; j < k && !copy; ++j)
      copy = a.kind != NodeKind::Constant && after[j] == after[k] && before[j] != before[k];
    const bool view = !copy && a.kind == NodeKind::Input && opt.outputs[k] == after[k] &&
                      traced.outputs[k] != before[k];
    if (!copy && !view) continue;
    GraphNode c;
    c.kind = NodeKind::Op;
    c.op = copy ? OpId::Copy : OpId::Permute;
    c.inputs = {opt.outputs[k]};
    c.meta = opt.nodes[opt.outputs[k]].meta;
    c.scope = opt.nodes[opt.outputs[k]].scope;
    for (int64_t d = 0; view && d < c.meta.shape.size(); ++d) c.attrs.ints.push_back(d);
    opt.outputs[k] = opt.add(std::move(c));
    if (copy) after[k] = opt.outputs[k];
  }
}

}  // namespace

// The plans of one entry for one set of symbol values.
struct Plans {
  /// With value guards: the guards' part of the forward (outputs: the guarded values, then the
  /// values `forward` reads from it), run and checked first (Note [Data-dependent reads]).
  std::unique_ptr<Plan> guard;
  std::unique_ptr<Plan> forward;                ///< outputs: the results, then the saved values
  std::vector<std::shared_ptr<Plan>> backward;  ///< per Entry::backward
};

// One traced signature: what its guards compare (EntryGuards), and what it runs.
struct CompiledCore::Entry : EntryGuards {
  /// Values read into C++ in guard mode: their data at the traced call, and what read them.
  struct ValueGuard {
    Tensor expected;
    std::string why;
  };
  std::vector<ValueGuard> value_guards;
  uint64_t used = 0;  ///< CompiledCore::clock_ at its latest call
  /// Its timings (CompileStats::signatures); recent holds the latest cached calls' durations
  /// in microseconds, a ring of kRecent.
  SignatureStats timing;
  static constexpr size_t kRecent = 64;
  std::vector<double> recent;
  size_t next_recent = 0;

  size_t num_outputs = 0;
  /// The names of the probes, whose values come after the function's results.
  std::vector<std::string> probe_names;
  /// The arguments whose .grad the function writes, whose values are the last results (Note
  /// [Argument gradients] in trace/arg_grads.cpp).
  std::vector<size_t> arg_grads;
  /// Differentiation: the tensors gradients flow to (an argument index, or a captured tensor).
  struct Source {
    int arg = -1;
    Tensor captured;
  };
  std::vector<Source> wrt;
  struct Backward {
    size_t output;              ///< the result it differentiates
    std::vector<size_t> saved;  ///< indices into the forward plan's saved values
  };
  std::vector<Backward> backward;
  /// Outputs whose backward failed while tracing: the index, and the error.
  std::vector<std::pair<size_t, std::string>> failed;
  /// The graphs as traced (forward, then one per backward), before the passes: the plans of
  /// each set of symbol values are built from them.
  Graph traced_forward;
  /// With value guards: the guards' part of the forward, split off traced_forward.
  Graph traced_guard;
  std::vector<Graph> traced_backward;
  /// The graphs after the passes (traced_forward's with copies of new aliases, then one per
  /// backward, and the guards' part as traced), symbolic like them: optimized once, at the
  /// entry's first plans; the plans of each set of symbol values instantiate them.
  bool optimized = false;
  Graph opt_forward, opt_guard;
  std::vector<Graph> opt_backward;
  /// With symbolic dims: what the plans of opt_forward (first) and of each opt_backward share
  /// across sizes (Note [Fusion across sizes] in trace/plan_build.cpp).
  std::vector<std::shared_ptr<FusionShare>> shares;
  /// The plans per set of symbol values (one entry, {}, without symbolic dims).
  std::map<std::vector<int64_t>, Plans> plans;
  Plans* last_plans = nullptr;
};

CompiledCore::CompiledCore(CompileOptions options, std::string label)
    : options_(std::move(options)), label_(std::move(label)) {
  check_pass_names(options_.disable_passes);
  DUET_CHECK_VALUE(options_.cache_limit >= 1, "[compile] cache_limit must be at least 1, got {}",
                   options_.cache_limit);
  for (const auto& [arg, dim] : options_.dynamic)
    DUET_CHECK_VALUE(arg >= 0 && dim >= 0,
                     "[compile] a dynamic dim is {{argument index, dim}} with both >= 0, got "
                     "{{{}, {}}}",
                     arg, dim);
}

CompiledCore::~CompiledCore() = default;

CompileStats CompiledCore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CompileStats s = stats_;
  for (const auto& e : entries_) {
    SignatureStats t = e->timing;
    for (size_t i = 0; i < e->sig.size(); ++i)
      t.signature += fmt::format("{}{}", i ? "; " : "", signature_text(*e, i));
    if (!e->recent.empty()) {
      std::vector<double> r = e->recent;
      std::nth_element(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(r.size() / 2), r.end());
      t.steady_median_us = r[r.size() / 2];
    }
    s.signatures.push_back(std::move(t));
  }
  s.cuda_graph_replays = 0;
  for (const auto& e : entries_)
    for (const auto& [values, p] : e->plans) {
      if (p.forward) s.cuda_graph_replays += p.forward->graph_replays();
      if (p.guard) s.cuda_graph_replays += p.guard->graph_replays();
      for (const auto& b : p.backward) s.cuda_graph_replays += b->graph_replays();
    }
  return s;
}

const Graph& CompiledCore::graph() const {
  std::lock_guard<std::mutex> lock(mu_);
  DUET_CHECK(last_ && last_->last_plans, "[compile] {} has not been called yet, so it has no graph",
             label_);
  return last_->last_plans->forward->graph();
}

// A retrace because an argument dim changed that changed before (kept concrete, or not
// contiguous): each new size costs a trace. Warns once per function, pointing to
// CompileOptions::dynamic. Called with mu_ held.
void CompiledCore::warn_changed_again(const FlatArgs& args, const std::vector<TensorSig>& sig) {
  std::vector<std::pair<size_t, int64_t>> changed;
  for (size_t i = 0; i < sig.size() && i < last_->sig.size(); ++i) {
    const Shape& a = last_->sig[i].shape;
    const Shape& b = sig[i].shape;
    if (a.size() != b.size()) continue;
    for (int64_t d = 0; d < a.size(); ++d)
      if (a[d] != b[d] && (last_->dim_sym.empty() || last_->dim_sym[i][d] < 0))
        changed.push_back({i, d});
  }
  for (const auto& cd : changed) {
    if (!warned_dims_ && retraced_dims_.count(cd)) {
      fmt::print(stderr,
                 "duet: warning: {} traces again because {} dim {} changed again (now {}); "
                 "each new size costs a trace. If it varies, make it symbolic: "
                 "CompileOptions::dynamic = {{{{{}, {}}}}}{}\n",
                 label_, args.labels[cd.first], cd.second, sig[cd.first].shape[cd.second], cd.first,
                 cd.second,
                 specialized_.count(cd)
                     ? fmt::format(" (it was kept concrete: {})", specialized_.at(cd))
                     : std::string());
      warned_dims_ = true;
    }
    retraced_dims_.insert(cd);
  }
}

// Tensor argument i of an entry's signature, in words: "arg 0: f32 (s0, 32) cpu".
std::string CompiledCore::signature_text(const Entry& e, size_t i) {
  const TensorSig& t = e.sig[i];
  const std::string label = i < e.labels.size() ? e.labels[i] : fmt::format("arg {}", i);
  std::string dims;
  for (int64_t d = 0; d < t.shape.size(); ++d) {
    const int32_t sym = e.dim_sym.empty() ? -1 : e.dim_sym[i][d];
    dims += fmt::format("{}{}", d ? ", " : "",
                        sym >= 0 ? fmt::format("s{}", sym) : std::to_string(t.shape[d]));
  }
  return fmt::format(
      "{}: {} ({}) {}{}{}", label, t.dtype, dims, t.device.str(),
      t.contiguous ? "" : fmt::format(", strides {}", Shape(t.strides.data(), t.strides.size())),
      t.requires_grad ? ", requires grad" : "");
}

CacheExplanation CompiledCore::explain() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheExplanation x;
  x.function = label_;
  x.traces = stats_.traces;
  x.hits = stats_.hits;
  x.eager_calls = stats_.eager_calls;
  x.eager_reason = stats_.eager_reason;
  x.retraces = stats_.retrace_reasons;
  for (const auto& [dim, why] : specialized_)
    x.specializations.push_back(fmt::format("arg {} dim {}: {}", dim.first, dim.second, why));
  for (const auto& e : entries_) {
    CacheExplanation::Entry en;
    en.statics = e->statics;
    en.grad_mode = e->grad_mode;
    for (size_t i = 0; i < e->sig.size(); ++i) {
      const std::string label = i < e->labels.size() ? e->labels[i] : fmt::format("arg {}", i);
      for (int64_t d = 0; d < e->sig[i].shape.size(); ++d) {
        const int32_t sym = e->dim_sym.empty() ? -1 : e->dim_sym[i][d];
        if (sym >= 0) en.symbolic_dims.push_back(fmt::format("{} dim {}: s{}", label, d, sym));
      }
      en.args.push_back(signature_text(*e, i));
    }
    for (const SymGuard& g : e->guards) en.guards.push_back(g.str());
    for (const auto& v : e->value_guards) en.value_guards.push_back(v.why);
    x.entries.push_back(std::move(en));
  }
  return x;
}

std::vector<Tensor> CompiledCore::call(const FlatArgs& plain, const TraceFn& fn) {
  // Inside another trace, a compiled function is inlined into it (as nested jit in JAX).
  if (Tracer::current()) return fn(plain.tensors);
  const auto call_start = std::chrono::steady_clock::now();
  FlatArgs with_grads;
  const FlatArgs& args = with_arg_grads(plain, with_grads) ? with_grads : plain;
  std::vector<TensorSig> sig = call_signature(args, label_);
  const bool gm = grad_mode();
  std::unique_lock<std::mutex> lock(mu_);
  call_start_ = call_start;
  probes_.clear();  // the last call's: a CUDA graph may replay into the buffers they view
  std::vector<Tensor> outs;
  std::string value_why;
  if (run_cached(args, sig, gm, outs, value_why, lock)) {
    write_arg_grads(last_->arg_grads, args, outs);
    take_probes(*last_, outs);
    return outs;
  }
  // The dims the new trace makes symbolic: those CompileOptions::dynamic names, those symbolic
  // in the most recent entry, and (automatic dynamic) those whose size changed since it.
  std::set<std::pair<size_t, int64_t>> dynamic = requested_dynamic_dims(options_, args, label_);
  if (last_) {
    const std::string why = explain_miss(args, sig, gm, value_why, dynamic);
    DUET_CHECK_VALUE(options_.on_miss != OnMiss::Error,
                     "[compile] {} matches none of its {} cached signature{}, and its on_miss is "
                     "error: {}",
                     label_, entries_.size(), entries_.size() == 1 ? "" : "s", why);
    const bool full = int(entries_.size()) >= options_.cache_limit;
    if (full || options_.on_miss == OnMiss::Eager) {
      if (stats_.eager_reason.empty())
        stats_.eager_reason = full ? fmt::format(
                                         "cache_limit of {} signatures reached; this "
                                         "call: {}",
                                         options_.cache_limit, why)
                                   : fmt::format("on_miss = eager; this call: {}", why);
      if (full && !warned_) {
        fmt::print(stderr,
                   "duet: warning: {} reached its cache_limit of {} signatures ({}); this call "
                   "and further new signatures run eagerly (CompileStats::eager_calls), the "
                   "cached ones stay compiled\n",
                   label_, options_.cache_limit, why);
        warned_ = true;
      }
      ++stats_.eager_calls;
      lock.unlock();
      return fn(plain.tensors);
    }
    stats_.retrace_reasons.push_back(why);
    warn_changed_again(args, sig);
  }
  // Non-contiguous tensors keep their sizes (their strides depend on them).
  for (auto it = dynamic.begin(); it != dynamic.end();)
    it = sig[it->first].contiguous && !specialized_.count(*it) ? std::next(it) : dynamic.erase(it);
  std::vector<int64_t> hints;
  const auto trace_start = std::chrono::steady_clock::now();
  const double nvrtc_before = cuda::codegen_stats().build_ms;
  Entry* e = trace_specializing(args, fn, sig, dynamic, hints);
  e->timing.trace_ms = ms_since(trace_start);
  e->sig = std::move(sig);
  e->labels = args.labels;
  e->statics = args.statics;
  e->grad_mode = gm;
  last_ = e;
  std::string why;
  // The trace read its guarded values from this call's data with the kernels the guards' plan
  // runs, so they hold.
  const bool ran = run(*e, hints, args, outs, &why, lock);
  DUET_ASSERT(ran, "a fresh trace failed its value guard: {}", why);
  // build_plans set the passes' and the plan's times for this entry's first plans.
  e->timing.optimize_ms = stats_.optimize_ms;
  e->timing.plan_ms = stats_.plan_ms;
  e->timing.codegen_ms = cuda::codegen_stats().build_ms - nvrtc_before;
  e->timing.first_call_ms = ms_since(call_start);
  write_arg_grads(e->arg_grads, args, outs);
  take_probes(*e, outs);
  return outs;
}

CompiledCore::Prepared CompiledCore::prepare(const FlatArgs& args, const TraceFn& fn) {
  DUET_ASSERT(!Tracer::current(), "prepare() inside a trace");
  std::vector<TensorSig> sig = call_signature(args, label_);
  std::lock_guard<std::mutex> lock(mu_);
  DUET_ASSERT(entries_.empty(), "prepare() of a core with entries");
  std::set<std::pair<size_t, int64_t>> dynamic = requested_dynamic_dims(options_, args, label_);
  for (auto it = dynamic.begin(); it != dynamic.end();)
    it = sig[it->first].contiguous ? std::next(it) : dynamic.erase(it);
  std::vector<int64_t> hints;
  Entry* e = trace_specializing(args, fn, sig, dynamic, hints);
  DUET_CHECK_VALUE(e->arg_grads.empty(),
                   "[compile] {} runs a backward that reaches {} and writes its .grad: save, "
                   "export_onnx and check_against_eager take functions that write none of "
                   "their arguments. Return duet::grad(loss, {{x}}) from the function instead",
                   label_, args.labels[e->arg_grads[0]]);
  e->sig = std::move(sig);
  e->labels = args.labels;
  e->statics = args.statics;
  e->grad_mode = grad_mode();
  Prepared p;
  p.forward = e->num_symbols ? instantiate(e->traced_forward, hints) : e->traced_forward;
  p.num_outputs = e->num_outputs;
  p.value_guards = !e->value_guards.empty();
  std::unordered_set<const TensorImpl*> seen;
  auto add = [&](const Graph& g) {
    for (const Tensor& c : g.captured)
      if (seen.insert(c.unsafe_impl()).second) p.captured.push_back(c);
  };
  add(e->traced_guard);
  add(e->traced_forward);
  for (const Graph& b : e->traced_backward) add(b);
  p.symbolic = e->traced_forward;
  p.dim_sym = e->dim_sym;
  p.hints = hints;
  for (const SymGuard& g : e->guards) p.guards.push_back({g.a, g.rel, g.b, g.why});
  p.probe_names = e->probe_names;
  return p;
}

void CompiledCore::take_probes(const Entry& e, std::vector<Tensor>& outs) {
  const size_t n = e.probe_names.size();
  if (n == 0) return;
  DUET_ASSERT(outs.size() >= n, "{} results for {} probes", outs.size(), n);
  const size_t first = outs.size() - n;
  for (size_t k = 0; k < n; ++k) probes_[e.probe_names[k]] = std::move(outs[first + k]);
  outs.resize(first);
}

Tensor CompiledCore::probe(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = probes_.find(name);
  if (it != probes_.end()) return it->second;
  std::string names;
  for (const auto& [n, t] : probes_) names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", n);
  DUET_CHECK_VALUE(false, "[probe] the last call of {} pinned no value named \"{}\" ({})", label_,
                   name, names.empty() ? "it pinned none" : "it pinned " + names);
  return {};
}

bool CompiledCore::run_cached(const FlatArgs& args, const std::vector<TensorSig>& sig, bool gm,
                              std::vector<Tensor>& outs, std::string& value_why,
                              std::unique_lock<std::mutex>& lock) {
  std::vector<int64_t> values;
  // The most recent entry first; an entry whose value guards fail says why in value_why.
  auto attempt = [&](Entry& e) {
    if (!fits(e, sig, args, gm, values)) return false;
    restore_grad_buffers(e);
    std::string why;
    const auto t0 = std::chrono::steady_clock::now();
    if (!run(e, values, args, outs, &why, lock)) {
      if (value_why.empty()) value_why = std::move(why);
      return false;
    }
    const double us = ms_since(t0) * 1e3;
    if (e.recent.size() < Entry::kRecent)
      e.recent.push_back(us);
    else
      e.recent[e.next_recent++ % Entry::kRecent] = us;
    ++e.timing.calls;
    ++stats_.hits;
    last_ = &e;
    return true;
  };
  if (last_ && attempt(*last_)) return true;
  // By index: while an attempt runs its plans unlocked, another thread may add entries.
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].get() != last_ && attempt(*entries_[i])) return true;
  return false;
}

std::string CompiledCore::explain_miss(const FlatArgs& args, const std::vector<TensorSig>& sig,
                                       bool gm, const std::string& value_why,
                                       std::set<std::pair<size_t, int64_t>>& dynamic) const {
  // A miss: say why, in words, against the most recently used entry that differs from this
  // call in sizes only (automatic dynamic compares sizes with it), else the most recent one.
  const Entry* ref = nullptr;
  for (const auto& e : entries_)
    if (!(ref && ref->used >= e->used) && differs_in_sizes_only(*e, sig, args, gm)) ref = e.get();
  return miss_reason(ref ? *ref : *last_, sig, args, gm, specialized_, value_why, dynamic);
}

CompiledCore::Entry* CompiledCore::trace_specializing(const FlatArgs& args, const TraceFn& fn,
                                                      const std::vector<TensorSig>& sig,
                                                      std::set<std::pair<size_t, int64_t>>& dynamic,
                                                      std::vector<int64_t>& hints) {
  for (;;) {
    const std::vector<std::vector<int32_t>> dim_sym = assign_symbols(sig, dynamic, hints);
    try {
      return trace(args, fn, dim_sym, hints);
    } catch (const SpecializeRequest& r) {
      // Library or user code needed concrete sizes: those dims become concrete, and the
      // function is traced again.
      std::string dims;
      for (auto it = dynamic.begin(); it != dynamic.end();) {
        const int32_t id = dim_sym[it->first][static_cast<size_t>(it->second)];
        if (std::find(r.symbols.begin(), r.symbols.end(), id) == r.symbols.end()) {
          ++it;
          continue;
        }
        specialized_[*it] = r.why;
        dims += fmt::format("{}{} dim {}", dims.empty() ? "" : ", ", args.labels[it->first],
                            it->second);
        it = dynamic.erase(it);
      }
      DUET_ASSERT(!dims.empty(), "a specialization of no dynamic dim: {}", r.why);
      stats_.retrace_reasons.push_back(fmt::format("{} made concrete: {}", dims, r.why));
    }
  }
}

// The gradients of one trace's outputs, as its joint graph computes them.
struct CompiledCore::Gradients {
  std::vector<std::vector<Tensor>> grads;  ///< per differentiated output
  std::vector<size_t> diff_outputs;        ///< the outputs differentiated
  std::vector<int32_t> gout_values;  ///< per differentiated output: its gradient's graph input
};

CompiledCore::Entry* CompiledCore::trace(const FlatArgs& args, const TraceFn& fn,
                                         const std::vector<std::vector<int32_t>>& dim_sym,
                                         const std::vector<int64_t>& hints) {
  ++stats_.traces;
  auto t0 = std::chrono::steady_clock::now();
  auto e = std::make_unique<Entry>();
  TraceSyms syms;
  syms.hints = hints;
  Tracer tr(label_);
  if (options_.guard_data_reads)
    tr.guard_reads([&args, &hints](const Graph& g, int32_t v) {
      return evaluate_value(g, v, args.tensors, hints);
    });
  std::vector<Tensor> outs;
  Gradients grads;
  {
    std::vector<Tensor> sym;
    for (size_t i = 0; i < args.tensors.size(); ++i)
      sym.push_back(tr.input(InputRole::Argument, args.tensors[i], {},
                             symbolic_dims(args.tensors[i], dim_sym, i)));
    SymContextGuard sym_scope(dim_sym.empty() ? nullptr : &syms);
    ModeGuard mode(&tr);
    outs = fn(bind_arg_grads(args, sym));
    for (size_t i = 0; i < outs.size(); ++i)
      DUET_CHECK(outs[i].defined(), "[compile] {} returned an undefined tensor as output {}",
                 label_, i);
    // Probes are results too, after the function's own (take_probes moves them out).
    for (const auto& [name, t] : tr.probes()) {
      e->probe_names.push_back(name);
      outs.push_back(t);
    }
    // Then the .grad values of the arguments a backward reached.
    e->arg_grads = collect_arg_grads(args, sym, label_, outs);
    // A tensor returned without being read by an op (a parameter returned as it is) is captured
    // now, so that it is among the sources below and its gradient reaches it.
    for (const Tensor& o : outs)
      if (!o.unsafe_impl()->trace) tr.value_of(o);
    bool any = false;
    for (const Tensor& o : outs) any |= o.requires_grad();
    if (grad_mode() && any) differentiate(tr, sym, outs, *e, grads);
  }
  std::vector<Tensor> all = outs;
  for (const auto& gs : grads.grads) all.insert(all.end(), gs.begin(), gs.end());
  tr.finish(all);
  Graph joint = std::move(tr.graph());
  joint.verify();
  stats_.trace_ms = ms_since(t0);
  for (const Tensor& c : joint.captured) e->captured_flags.push_back({c, c.requires_grad()});
  {
    std::unordered_set<const detail::TensorImpl*> captured;
    for (const Tensor& c : joint.captured) captured.insert(c.unsafe_impl());
    for (const Tensor& c : joint.captured)
      if (const Tensor g = c.grad(); g.defined() && captured.count(g.unsafe_impl()))
        e->grad_buffers.push_back({c, g});
  }
  e->num_outputs = outs.size();
  record_guards(args, dim_sym, hints, syms, tr.value_guards(), *e);
  split_joint(joint, tr.value_guards(), grads, *e);
  entries_.push_back(std::move(e));
  return entries_.back().get();
}

// The joint graph (docs/design.md, "Backward through compiled outputs"): each output that
// requires grad is differentiated with respect to every argument and captured tensor that
// requires grad, with its gradient a graph input.
void CompiledCore::differentiate(Tracer& tr, const std::vector<Tensor>& sym,
                                 const std::vector<Tensor>& outs, Entry& e, Gradients& grads) {
  std::vector<Tensor> wrt;
  for (size_t i = 0; i < sym.size(); ++i)
    if (sym[i].requires_grad()) {
      wrt.push_back(sym[i]);
      e.wrt.push_back({int(i), Tensor()});
    }
  for (const Tensor& c : tr.graph().captured)
    if (c.requires_grad()) {
      wrt.push_back(c);
      e.wrt.push_back({-1, c});
    }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].requires_grad() || is_same_as_arg(outs[i], sym)) continue;
    const TensorImpl* o = outs[i].unsafe_impl();
    Tensor g =
        tr.input(InputRole::GradOutput, TensorMeta{o->shape, o->dtype, o->device(), o->sym}, false);
    try {
      grads.grads.push_back(detail::grad({outs[i]}, wrt, {g}, false, /*retain_graph=*/true));
    } catch (const Error& err) {
      // This output cannot be differentiated: the function already ran backward through
      // it (a training step), or its backward fails as it would eagerly (a value it saved
      // was overwritten in place, a while_loop). It is returned with a tape node that
      // raises the same error when a backward reaches it, as eager would; the other outputs
      // keep their compiled backward.
      e.failed.push_back({i, err.what()});
      continue;
    }
    grads.diff_outputs.push_back(i);
    grads.gout_values.push_back(g.unsafe_impl()->value);
  }
  if (grads.grads.empty() && e.failed.empty()) e.wrt.clear();
}

// What a trace assumed, on its entry and (for the most recent trace) in stats_: its symbolic
// dims, their guards, and the values it read into C++.
void CompiledCore::record_guards(const FlatArgs& args,
                                 const std::vector<std::vector<int32_t>>& dim_sym,
                                 const std::vector<int64_t>& hints, TraceSyms& syms,
                                 const std::vector<ValueGuard>& value_guards, Entry& e) {
  e.dim_sym = dim_sym;
  e.num_symbols = static_cast<int32_t>(hints.size());
  e.guards = std::move(syms.guards);
  stats_.symbolic_dims.clear();
  for (size_t i = 0; i < e.dim_sym.size(); ++i)
    for (size_t d = 0; d < e.dim_sym[i].size(); ++d)
      if (e.dim_sym[i][d] >= 0)
        stats_.symbolic_dims.push_back(
            fmt::format("{} dim {}: s{}", args.labels[i], d, e.dim_sym[i][d]));
  stats_.guards.clear();
  for (const SymGuard& g : e.guards) stats_.guards.push_back(g.str());
  stats_.value_guards.clear();
  for (const ValueGuard& g : value_guards) {
    e.value_guards.push_back({g.expected, g.why});
    stats_.value_guards.push_back(g.why);
  }
}

// Split: the forward part is what the results and write-backs need (and every input but the
// gradients); each backward reads the forward values it uses as saved inputs.
void CompiledCore::split_joint(const Graph& joint, const std::vector<ValueGuard>& value_guards,
                               const Gradients& grads, Entry& e) {
  const size_t n = joint.nodes.size();
  const size_t num_outputs = e.num_outputs;
  std::vector<bool> fwd(n, false), none(n, false);
  std::vector<int32_t> fwd_roots(joint.outputs.begin(), joint.outputs.begin() + num_outputs);
  for (const WriteBack& w : joint.writebacks) fwd_roots.push_back(w.value);
  for (const ValueGuard& g : value_guards) fwd_roots.push_back(g.value);
  // Prints are forward roots (nothing reads them), unless they need a gradient.
  std::vector<bool> after_grad(n, false);
  for (size_t i = 0; i < n; ++i) {
    const GraphNode& g = joint.nodes[i];
    after_grad[i] = g.kind == NodeKind::Input && g.role == InputRole::GradOutput;
    for (int32_t in : g.inputs) after_grad[i] = after_grad[i] || after_grad[in];
  }
  for (size_t i = 0; i < n; ++i)
    if ((joint.nodes[i].kind == NodeKind::Input && joint.nodes[i].role != InputRole::GradOutput) ||
        (has_effect(joint.nodes[i]) && !after_grad[i]))
      fwd_roots.push_back(int32_t(i));
  ancestors(joint, fwd_roots, none, fwd, nullptr);
  // Every result of a construct the forward runs is a forward value: the backward reads some
  // (a scan's stacked carries) as saved values, never the construct's tuple itself.
  for (size_t i = 0; i < n; ++i)
    if (joint.nodes[i].kind == NodeKind::Project && fwd[joint.nodes[i].inputs[0]]) fwd[i] = true;
  const size_t num_grads = grads.grads.size();
  std::vector<std::set<int32_t>> saved_per(num_grads);
  std::vector<std::vector<bool>> bwd_sets;
  std::set<int32_t> saved_all;
  size_t pos = num_outputs;
  std::vector<std::vector<int32_t>> bwd_roots(num_grads);
  for (size_t k = 0; k < num_grads; ++k) {
    const size_t count = grads.grads[k].size();
    bwd_roots[k].assign(joint.outputs.begin() + pos, joint.outputs.begin() + pos + count);
    pos += count;
    std::vector<bool> in(n, false);
    ancestors(joint, bwd_roots[k], fwd, in, &saved_per[k]);
    // The gradient is an input of the plan even when no result reads it (all of them zeros):
    // the tape node always passes it.
    in[grads.gout_values[k]] = true;
    saved_all.insert(saved_per[k].begin(), saved_per[k].end());
    bwd_sets.push_back(std::move(in));
  }
  std::vector<int32_t> saved_vec(saved_all.begin(), saved_all.end());
  std::vector<int32_t> fwd_out(joint.outputs.begin(), joint.outputs.begin() + num_outputs);
  fwd_out.insert(fwd_out.end(), saved_vec.begin(), saved_vec.end());

  for (const ValueGuard& g : value_guards) fwd_out.push_back(g.value);
  if (value_guards.empty()) {
    e.traced_forward = extract(joint, fwd, {}, fwd_out);
  } else {
    split_guards(extract(joint, fwd, {}, fwd_out), value_guards.size(), e.traced_guard,
                 e.traced_forward);
  }
  for (size_t k = 0; k < num_grads; ++k) {
    std::vector<int32_t> boundary(saved_per[k].begin(), saved_per[k].end());
    e.traced_backward.push_back(extract(joint, bwd_sets[k], boundary, bwd_roots[k]));
    Entry::Backward b;
    b.output = grads.diff_outputs[k];
    for (int32_t v : boundary)
      b.saved.push_back(
          size_t(std::lower_bound(saved_vec.begin(), saved_vec.end(), v) - saved_vec.begin()));
    e.backward.push_back(std::move(b));
  }
}

// Note [A new size costs a plan]
// The passes run once per entry, on its graphs as traced, with their symbolic dims: they are
// written for symbols (Note [Passes on symbolic graphs] in trace/passes.cpp), so the optimized
// graph holds at every size its guards admit. A call at new sizes of the entry's symbols then
// only instantiates the optimized graphs (every size evaluated) and plans them: the memory
// plan and the steps. The fusion groups and their kernels are the first plan's (Note [Fusion
// across sizes] in trace/plan_build.cpp), so a kernel whose generated code is loaded runs it at
// a new size from its first call.
void CompiledCore::optimize_entry(Entry& e) {
  auto t1 = std::chrono::steady_clock::now();
  const Graph& traced = e.traced_forward;
  stats_.nodes_before = traced.num_nodes();
  e.opt_forward = optimize(traced, options_.disable_passes);
  copy_new_aliases(e.opt_forward, traced, e.num_outputs);
  e.opt_forward.verify();
  stats_.nodes_after = e.opt_forward.num_nodes();
  e.opt_backward.clear();
  for (const Graph& b : e.traced_backward) {
    stats_.nodes_before += b.num_nodes();
    Graph bg = optimize(b, options_.disable_passes);
    bg.verify();
    stats_.nodes_after += bg.num_nodes();
    e.opt_backward.push_back(std::move(bg));
  }
  if (!e.value_guards.empty()) {
    // No passes: the guarded values must be computed bit for bit as the trace read them
    // (evaluate_value), and a fused or rewritten float computation may round differently.
    e.opt_guard = e.traced_guard;
    stats_.nodes_before += e.opt_guard.num_nodes();
    stats_.nodes_after += e.opt_guard.num_nodes();
  }
  e.optimized = true;
  ++stats_.optimizations;
  stats_.optimize_ms = ms_since(t1);
}

Plans CompiledCore::build_plans(Entry& e, const std::vector<int64_t>& values) {
  if (!e.optimized) optimize_entry(e);
  auto t2 = std::chrono::steady_clock::now();
  auto at = [&](const Graph& g) { return e.num_symbols ? instantiate(g, values) : g; };
  Graph fg = at(e.opt_forward);
  std::vector<Graph> bgs;
  for (const Graph& b : e.opt_backward) bgs.push_back(at(b));
  Graph gg;
  if (!e.value_guards.empty()) gg = at(e.opt_guard);
  const PlanOptions popt = PlanOptions::from_disabled(options_.disable_passes);
  if (e.num_symbols && e.shares.empty())
    for (size_t k = 0; k <= bgs.size(); ++k) e.shares.push_back(make_fusion_share());
  auto opts = [&](size_t k) {
    PlanOptions o = popt;
    if (e.num_symbols) o.share = e.shares[k];
    return o;
  };
  Plans p;
  if (!e.value_guards.empty()) p.guard = std::make_unique<Plan>(std::move(gg), plain_plan());
  p.forward = std::make_unique<Plan>(std::move(fg), opts(0));
  for (size_t k = 0; k < bgs.size(); ++k)
    p.backward.push_back(std::make_shared<Plan>(std::move(bgs[k]), opts(k + 1)));
  stats_.buffer_bytes = stats_.fused_kernels = stats_.fused_nodes = stats_.epilogues =
      stats_.arena_bytes = stats_.intermediate_bytes = stats_.hoisted_nodes =
          stats_.parallel_plans = stats_.cuda_graph_plans = stats_.gemm_epilogues = 0;
  auto add_stats = [&](const Plan& pl) {
    const PlanStats& s = pl.stats();
    stats_.buffer_bytes += s.buffer_bytes;
    stats_.fused_kernels += s.fused_kernels;
    stats_.fused_nodes += s.fused_nodes;
    stats_.epilogues += s.epilogues;
    stats_.arena_bytes += s.arena_bytes;
    stats_.intermediate_bytes += s.intermediate_bytes;
    stats_.hoisted_nodes += s.hoisted_nodes;
    stats_.parallel_plans += s.parallel ? 1 : 0;
    stats_.cuda_graph_plans += s.cuda_graph ? 1 : 0;
    stats_.gemm_epilogues += s.gemm_epilogues;
  };
  add_stats(*p.forward);
  if (p.guard) add_stats(*p.guard);
  for (const auto& b : p.backward) add_stats(*b);
  stats_.plan_ms = ms_since(t2);
  ++stats_.plans_built;
  return p;
}

bool CompiledCore::run(Entry& e, const std::vector<int64_t>& values, const FlatArgs& args,
                       std::vector<Tensor>& outs, std::string* why,
                       std::unique_lock<std::mutex>& lock) {
  auto it = e.plans.find(values);
  if (it == e.plans.end()) {
    const bool new_size = e.optimized;  // not the entry's first plans: a new size of its symbols
    it = e.plans.emplace(values, build_plans(e, values)).first;
    if (new_size) stats_.new_size_ms = ms_since(call_start_);
  }
  Plans& plans = it->second;
  e.last_plans = &plans;
  e.used = ++clock_;
  // The plans run unlocked: an entry and its plans live as long as the core, what the rest of
  // this function reads of the entry was fixed when it was traced, and a plan that another
  // thread is running hands this call a spare copy (Note [Plan buffers] in trace/executor.h).
  lock.unlock();
  struct Relock {
    std::unique_lock<std::mutex>& l;
    ~Relock() { l.lock(); }
  } relock{lock};
  std::vector<Tensor> res;
  if (plans.guard) {
    // Note [Data-dependent reads]: the guards' part first, and nothing else unless they hold.
    std::vector<Tensor> g;
    try {
      g = plans.guard->run(args.tensors);
    } catch (const Error& err) {
      // The values computed for another path can be out of range for this one: trace again.
      *why = fmt::format("computing the values read by {} raised an error ({})",
                         e.value_guards[0].why, err.what());
      return false;
    }
    const size_t k = e.value_guards.size();
    for (size_t i = 0; i < k; ++i)
      if (!same_data(g[i], e.value_guards[i].expected)) {
        *why = fmt::format("{} when traced, now {}", e.value_guards[i].why, show_value(g[i]));
        return false;
      }
    std::vector<Tensor> in(g.begin() + static_cast<std::ptrdiff_t>(k), g.end());
    in.insert(in.end(), args.tensors.begin(), args.tensors.end());
    res = plans.forward->run(in);
  } else {
    res = plans.forward->run(args.tensors);
  }
  outs.assign(res.begin(), res.begin() + static_cast<std::ptrdiff_t>(e.num_outputs));
  if ((e.backward.empty() && e.failed.empty()) || !grad_mode()) return true;
  auto saved = std::make_shared<std::vector<SavedTensor>>();
  for (size_t i = e.num_outputs; i < res.size(); ++i) {
    // A saved value that is also an output (tanh's gradient reads tanh's result) is kept as an
    // alias without autograd state, as eager saves an output (Note [Saved tensors]): a handle
    // to the output itself would make a cycle, output -> grad_fn -> backward_fn -> output, and
    // leak both when no backward runs.
    Tensor v = res[i];
    for (size_t j = 0; j < e.num_outputs; ++j)
      if (res[j].is_same(v)) {
        v = v.detach();
        break;
      }
    saved->push_back({v, v.unsafe_impl()->storage->version_.load()});
  }
  std::vector<const Tensor*> sources;
  for (const Entry::Source& s : e.wrt)
    sources.push_back(s.arg >= 0 ? &args.tensors[s.arg] : &s.captured);
  // Puts `out` on the tape: a node with edges to every source, running `fn` in backward.
  auto attach = [&](Tensor& out, std::function<void(const Tensor&, const bool*, Tensor*)> fn) {
    auto node = make_node();
    node->def = &compiled_def();
    node->sequence = next_sequence();
    node->inputs.resize(sources.size());
    node->saved.resize(sources.size());
    for (size_t j = 0; j < sources.size(); ++j) set_input_edge(node->inputs[j], *sources[j]);
    const TensorImpl* o = out.unsafe_impl();
    node->output_meta = {o->shape, o->dtype, o->device(), {}};
    node->backward_fn = std::move(fn);
    out.unsafe_impl()->requires_grad = true;
    autograd_meta(*out.unsafe_impl()).grad_fn = std::move(node);
  };
  for (size_t k = 0; k < e.backward.size(); ++k) {
    const Entry::Backward& b = e.backward[k];
    Tensor& out = outs[b.output];
    for (size_t j = 0; j < outs.size(); ++j)  // the same tensor twice: a second handle
      if (j != b.output && outs[j].is_same(out)) out = out.detach();
    std::shared_ptr<Plan> plan = plans.backward[k];
    std::vector<size_t> idx = b.saved;
    std::string label = label_;
    attach(out, [plan, idx, saved, label](const Tensor& g, const bool*, Tensor* gi) {
      std::vector<Tensor> in;
      for (size_t i : idx) {
        const SavedTensor& s = (*saved)[i];
        DUET_CHECK(s.value.unsafe_impl()->storage->version_.load() == s.version,
                   "[backward] a tensor of shape {} saved by {} was modified in place after the "
                   "call that saved it; clone() it first, or update it after backward()",
                   s.value.sizes(), label);
        in.push_back(s.value);
      }
      in.push_back(g);
      std::vector<Tensor> r = plan->run(in);
      for (size_t j = 0; j < r.size(); ++j) gi[j] = std::move(r[j]);
    });
  }
  for (const auto& [index, message] : e.failed) {
    Tensor& out = outs[index];
    if (out.unsafe_impl()->autograd && out.unsafe_impl()->autograd->grad_fn) continue;
    std::string msg = message;
    attach(out, [msg](const Tensor&, const bool*, Tensor*) {
      throw Error(::duet::detail::with_context(msg));
    });
  }
  return true;
}

}  // namespace duet::detail

namespace duet {

namespace {
std::mutex g_probe_mu;
std::map<std::string, Tensor> g_probes;  // the eager ones
}  // namespace

Tensor probe(const Tensor& t, std::string name, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(!name.empty(), "[probe] a probe needs a name (a tensor of shape {})", t.sizes());
  if (detail::Tracer* tr = detail::Tracer::current()) {
    tr->add_probe(std::move(name), t.detach());
    return t;
  }
  std::lock_guard<std::mutex> lock(g_probe_mu);
  g_probes[std::move(name)] = t.detach();
  return t;
}

Tensor probed(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  auto it = g_probes.find(name);
  DUET_CHECK_VALUE(it != g_probes.end(), "[probe] no value was pinned eagerly under \"{}\"", name);
  return it->second;
}

void clear_probes() {
  std::lock_guard<std::mutex> lock(g_probe_mu);
  g_probes.clear();
}

std::string CacheExplanation::str() const {
  std::string s = fmt::format("{}: {} trace{}, {} cache hit{}, {} eager call{}\n", function, traces,
                              traces == 1 ? "" : "s", hits, hits == 1 ? "" : "s", eager_calls,
                              eager_calls == 1 ? "" : "s");
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    s += fmt::format("entry {} (grad mode {}):\n", k + 1, e.grad_mode ? "on" : "off");
    for (const std::string& a : e.args) s += "  " + a + "\n";
    for (const std::string& a : e.statics) s += "  static argument: " + a + "\n";
    for (const std::string& a : e.symbolic_dims) s += "  symbolic: " + a + "\n";
    for (const std::string& a : e.guards) s += "  guard: " + a + "\n";
    for (const std::string& a : e.value_guards) s += "  value guard: " + a + "\n";
  }
  for (size_t k = 0; k < retraces.size(); ++k)
    s += fmt::format("retrace {}: {}\n", k + 1, retraces[k]);
  for (const std::string& a : specializations) s += "kept concrete: " + a + "\n";
  if (!eager_reason.empty()) s += "ran eagerly: " + eager_reason + "\n";
  return s;
}

}  // namespace duet
