#include "trace/compile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_set>

#include "core/dispatch.h"
#include "core/ops.h"
#include "cuda/cuda.h"
#include "eager/autograd.h"
#include "eager/node.h"
#include "trace/arg_grads.h"
#include "trace/compile_entry.h"
#include "trace/plan/executor.h"
#include "trace/guards.h"
#include "trace/ir/passes.h"
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

// Note [Call overhead]
// A call that hits the cache pays for what it does before its plan runs: flattening its
// arguments, their signature, the lookup and the guards. On a 64^3 matmul (3 us) that was a
// sixth of the call. The tensors' labels ("arg 1[2]") name them only in errors, explanations
// and saved programs, so a call keeps their paths (ArgLabels, inline for a few tensors) and
// formats them when read: formatting each label and holding it as a string cost about a
// seventh of that. A hit builds no signature either: bind_symbols compares each tensor with
// the entry's signature where it lies, and a miss builds the call's (call_signature). The
// clock is read around the plan of an entry's first Entry::kRecent calls, then of one call in
// Entry::kTimeEvery (CompileStats' steady median is a median of those), and by a plan built for
// new sizes; a miss reads it again for its first call's time. Together these took a compiled
// 8 x 8 matmul's time over the eager one's from about 310 to about 175 ns.

namespace duet::detail {

std::string ArgPath::str() const {
  std::string s = fmt::format("arg {}", n ? at[0] : 0);
  for (uint32_t k = 1; k < n; ++k) s += fmt::format("[{}]", at[k]);
  return s;
}

std::string ArgLabels::operator[](size_t i) const {
  DUET_ASSERT(i < size(), "label {} of {}", i, size());
  const Label& l = labels_[static_cast<int64_t>(i)];
  ArgPath p;
  p.n = l.n;
  std::copy(paths_.begin() + l.begin, paths_.begin() + l.begin + l.n, p.at);
  return l.grad ? p.str() + ".grad" : p.str();
}

void ArgLabels::add(const ArgPath& p) {
  labels_.push_back({static_cast<uint32_t>(paths_.size()), p.n, false});
  for (uint32_t k = 0; k < p.n; ++k) paths_.push_back(p.at[k]);
}

void ArgLabels::add_grad_of(size_t i) {
  DUET_ASSERT(i < size(), "label {} of {}", i, size());
  Label l = labels_[static_cast<int64_t>(i)];
  l.grad = true;
  labels_.push_back(l);
}

std::vector<std::string> ArgLabels::strings() const {
  std::vector<std::string> s;
  s.reserve(size());
  for (size_t i = 0; i < size(); ++i) s.push_back((*this)[i]);
  return s;
}

namespace {

// The tape node's op, for messages ("[backward] ... compiled function ...").
const OpDef& compiled_def() {
  static const OpDef def = opaque_node_def("compiled function");
  return def;
}

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
    for (const FlagGuard& f : e->flags) en.flags.push_back(fmt::format("{}: {}", f.what, f.value));
    x.entries.push_back(std::move(en));
  }
  return x;
}

std::vector<Tensor> CompiledCore::call(const FlatArgs& plain, const TraceFn& fn) {
  // Inside another trace, a compiled function is inlined into it (as nested jit in JAX).
  if (Tracer::current()) return fn(plain.tensors);
  FlatArgs with_grads;
  const FlatArgs& args = with_arg_grads(plain, with_grads) ? with_grads : plain;
  check_call_tensors(args, label_);  // (a hit builds no signature: Note [Call overhead])
  const bool gm = grad_mode();
  std::unique_lock<std::mutex> lock(mu_);
  probes_.clear();  // the last call's: a CUDA graph may replay into the buffers they view
  std::vector<Tensor> outs;
  std::string value_why;
  int64_t overlap = -1;
  if (run_cached(args, gm, outs, value_why, overlap, lock)) {
    write_arg_grads(last_->arg_grads, args, outs);
    take_probes(*last_, outs);
    return outs;
  }
  if (overlap >= 0) return run_overlapping(args, overlap, plain, fn, lock);
  const auto call_start = std::chrono::steady_clock::now();  // (Note [Call overhead])
  call_start_ = call_start;
  std::vector<TensorSig> sig = call_signature(args, label_);
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
  e->labels = args.labels.strings();
  e->statics = args.statics;
  e->grad_mode = gm;
  e->autocast = detail::autocast_key();
  last_ = e;
  std::optional<FlatArgs> snap;
  if (const int64_t i = snapshot(*e, args, snap); i >= 0)
    return run_overlapping(args, i, plain, fn, lock);
  std::string why;
  // The trace read its guarded values from this call's data with the kernels the guards' plan
  // runs, so they hold.
  const bool ran = run(*e, hints, snap ? *snap : args, outs, &why, lock);
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
  e->labels = args.labels.strings();
  e->statics = args.statics;
  e->grad_mode = grad_mode();
  e->autocast = detail::autocast_key();
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

// Note [Flags a trace read]
// A trace runs the function's C++ once, so a C++ value it branches on is fixed in the graph: a
// module's training flag picks dropout or not, batch statistics or running ones. PyTorch's
// compiled code guards on `module.training`; here Module::is_training() notes the flag on the
// running trace (guard_flag), the entry keeps the flags it read with their values
// (EntryGuards::flags), and a call fits only while each still has its value. After eval(), a
// function traced in training mode traces again, and says why ("module Dropout(p=0.5)'s training
// flag changed true -> false"); after train(), the first entry fits again.

// Note [Arguments that share memory with written captures]
// A plan reads its arguments where they lie, at the step that reads them, and writes the
// captured tensors it updates in place (a .grad a backward accumulates into, a parameter an
// optimizer steps) at its end, or into their buffers as it goes (Notes [Products computed into
// write-back targets] and [Intermediates in dead write-back targets] in
// trace/plan/plan_build.cpp). The trace saw an argument and a captured tensor as two tensors,
// but a call may pass one that shares the other's memory (`step(w.grad())`, a view of a
// parameter). Eagerly, each read of the argument then sees the writes made before it. So:
//  - where the trace read every argument before its first write to a captured tensor (Tracer::
//    reads_arguments_after_writes), eager reads see the values of the call's start: the
//    overlapping tensors are copied as the call begins, and the plan reads the copies, whatever
//    order its steps take;
//  - otherwise an argument read after a write sees it eagerly, which the plan cannot: the call
//    runs eagerly, as PyTorch's compiled code would recompile for the aliasing. It warns once
//    and counts in CompileStats::eager_calls, and the entry stays for calls that do not overlap.
int64_t CompiledCore::snapshot(const Entry& e, const FlatArgs& args,
                               std::optional<FlatArgs>& snap) {
  const std::vector<size_t> overlap = overlapping_written(e, args);
  if (overlap.empty()) return -1;
  if (e.reads_args_after_writes) return static_cast<int64_t>(overlap[0]);
  snap = args;
  for (size_t i : overlap) snap->tensors[i] = args.tensors[i].clone();
  return -1;
}

std::vector<Tensor> CompiledCore::run_overlapping(const FlatArgs& args, int64_t i,
                                                  const FlatArgs& plain, const TraceFn& fn,
                                                  std::unique_lock<std::mutex>& lock) {
  const std::string why = fmt::format(
      "{} shares memory with a tensor the function captures and writes in place (a parameter, "
      "a buffer or a .grad)",
      args.labels[static_cast<size_t>(i)]);
  if (stats_.eager_reason.empty()) stats_.eager_reason = why;
  if (!warned_overlap_) {
    fmt::print(stderr,
               "duet: warning: {}: {}; such calls run eagerly (CompileStats::eager_calls)\n",
               label_, why);
    warned_overlap_ = true;
  }
  ++stats_.eager_calls;
  lock.unlock();
  return fn(plain.tensors);
}

bool CompiledCore::run_cached(const FlatArgs& args, bool gm, std::vector<Tensor>& outs,
                              std::string& value_why, int64_t& overlap,
                              std::unique_lock<std::mutex>& lock) {
  std::vector<int64_t> values;
  // The most recent entry first; an entry whose value guards fail says why in value_why.
  auto attempt = [&](Entry& e) {
    if (!fits(e, args, gm, values)) return false;
    std::optional<FlatArgs> snap;  // (Note [Arguments that share memory with written captures])
    if (!e.written.empty())
      if (const int64_t i = snapshot(e, args, snap); i >= 0) {
        overlap = i;
        return false;
      }
    restore_grad_buffers(e);
    std::string why;
    // Timed: the first kRecent calls, then one in kTimeEvery (Note [Call overhead]).
    const bool timed = e.recent.size() < Entry::kRecent || e.timing.calls % Entry::kTimeEvery == 0;
    const auto t0 =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    call_start_ = t0;  // (untimed: a plan for new sizes reads the clock as it starts, in run())
    if (!run(e, values, snap ? *snap : args, outs, &why, lock)) {
      if (value_why.empty()) value_why = std::move(why);
      return false;
    }
    if (timed) {
      const double us = ms_since(t0) * 1e3;
      if (e.recent.size() < Entry::kRecent)
        e.recent.push_back(us);
      else
        e.recent[e.next_recent++ % Entry::kRecent] = us;
    }
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

// Note [A new size costs a plan]
// The passes run once per entry, on its graphs as traced, with their symbolic dims: they are
// written for symbols (Note [Passes on symbolic graphs] in trace/ir/passes.cpp), so the optimized
// graph holds at every size its guards admit. A call at new sizes of the entry's symbols then
// only instantiates the optimized graphs (every size evaluated) and plans them: the memory
// plan and the steps. The fusion groups and their kernels are the first plan's (Note [Fusion
// across sizes] in trace/plan/plan_build.cpp), so a kernel whose generated code is loaded runs it
// at a new size from its first call.
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
  if (!arena_share_) arena_share_ = make_arena_share();
  auto opts = [&](size_t k) {
    PlanOptions o = popt;
    if (e.num_symbols) o.share = e.shares[k];
    o.arenas = arena_share_;  // Note [One arena per function] in trace/plan/plan_build.cpp
    return o;
  };
  Plans p;
  if (!e.value_guards.empty()) p.guard = std::make_unique<Plan>(std::move(gg), plain_plan());
  p.forward = options_.memory_budget > 0
                  ? plan_within_budget(std::move(fg), opts(0), options_.memory_budget)
                  : std::make_unique<Plan>(std::move(fg), opts(0));
  for (size_t k = 0; k < bgs.size(); ++k)
    p.backward.push_back(std::make_shared<Plan>(std::move(bgs[k]), opts(k + 1)));
  stats_.buffer_bytes = stats_.device_buffer_bytes = stats_.fused_kernels = stats_.fused_nodes =
      stats_.epilogues = stats_.arena_bytes = stats_.intermediate_bytes = stats_.hoisted_nodes =
          stats_.parallel_plans = stats_.cuda_graph_plans = stats_.gemm_epilogues = 0;
  auto add_stats = [&](const Plan& pl) {
    const PlanStats& s = pl.stats();
    stats_.buffer_bytes += s.buffer_bytes;
    stats_.device_buffer_bytes += s.device_buffer_bytes;
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
  stats_.plans = plan_memory_stats(p, e.num_outputs);
  const RematRecord& rr = p.forward->graph().remat;
  stats_.recomputed_values = rr.values;
  stats_.recomputed_bytes = rr.bytes;
  stats_.recomputed_flops = rr.flops;
  stats_.recomputed_for_budget = rr.forced;
  stats_.plan_ms = ms_since(t2);
  ++stats_.plans_built;
  return p;
}

// Note [One backward for several outputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each differentiated output of a compiled call has a tape node of its own, which runs that
// output's backward plan. A loss that read several outputs (a VAE's reconstruction, mean and
// log-variance) ran one plan per output, each a whole backward through the function. A trace
// with two or more differentiated outputs therefore also traces a joint backward, which takes
// every output's gradient at once, as AOTAutograd's single backward does, and the outputs'
// nodes form a group whose rule runs it once (Note [Results of one construct] in
// eager/engine.cpp), with zeros for the outputs the backward did not reach. A backward that
// reaches one output runs that output's own plan, which does only its part.
static void attach_joint(const std::vector<std::shared_ptr<Node>>& nodes,
                         const std::vector<TensorMeta>& metas,
                         std::function<std::vector<Tensor>(std::vector<Tensor>)> run) {
  auto group = std::make_shared<NodeGroup>();
  for (size_t j = 0; j < nodes.size(); ++j) {
    group->members.push_back(nodes[j]);
    nodes[j]->group = group;
    nodes[j]->group_index = static_cast<int32_t>(j);
  }
  group->rule = [metas, run = std::move(run)](const std::vector<Tensor>& gs, const bool*,
                                              Tensor* gi) {
    std::vector<Tensor> in;
    for (size_t j = 0; j < gs.size(); ++j)
      in.push_back(
          gs[j].defined()
              ? gs[j]
              : zeros(metas[j].shape, Options().dtype(metas[j].dtype).device(metas[j].device)));
    std::vector<Tensor> r = run(std::move(in));
    for (size_t j = 0; j < r.size(); ++j) gi[j] = std::move(r[j]);
  };
}

bool CompiledCore::run(Entry& e, const std::vector<int64_t>& values, const FlatArgs& args,
                       std::vector<Tensor>& outs, std::string* why,
                       std::unique_lock<std::mutex>& lock) {
  auto it = e.plans.find(values);
  if (it == e.plans.end()) {
    const bool new_size = e.optimized;  // not the entry's first plans: a new size of its symbols
    if (call_start_ == std::chrono::steady_clock::time_point{})  // an untimed call's
      call_start_ = std::chrono::steady_clock::now();
    it = e.plans.emplace(values, build_plans(e, values)).first;
    if (new_size) stats_.new_size_ms = ms_since(call_start_);
  }
  Plans& plans = it->second;
  e.last_plans = &plans;
  e.used = ++clock_;
  // The plans run unlocked: an entry and its plans live as long as the core, what the rest of
  // this function reads of the entry was fixed when it was traced, and a plan that another
  // thread is running hands this call a spare copy (Note [Plan buffers] in trace/plan/executor.h).
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
  if ((e.backward.empty() && e.failed.empty()) || !grad_mode()) {
    outs = std::move(res);  // (the saved values after the outputs are not needed)
    outs.resize(e.num_outputs);
    return true;
  }
  outs.assign(res.begin(), res.begin() + static_cast<std::ptrdiff_t>(e.num_outputs));
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
  auto attach =
      [&](Tensor& out,
          std::function<void(const Tensor&, const bool*, Tensor*)> fn) -> std::shared_ptr<Node> {
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
    autograd_meta(*out.unsafe_impl()).grad_fn = node;
    return node;
  };
  // A backward plan's inputs: the saved values it reads (checked against in-place writes),
  // then the gradients.
  const std::string label = label_;
  auto saved_inputs = [saved, label](const std::vector<size_t>& idx) {
    std::vector<Tensor> in;
    for (size_t i : idx) {
      const SavedTensor& s = (*saved)[i];
      DUET_CHECK(s.value.unsafe_impl()->storage->version_.load() == s.version,
                 "[backward] a tensor of shape {} saved by {} was modified in place after the "
                 "call that saved it; clone() it first, or update it after backward()",
                 s.value.sizes(), label);
      in.push_back(s.value);
    }
    return in;
  };
  std::vector<std::shared_ptr<Node>> nodes;  // per differentiated output
  std::vector<TensorMeta> metas;
  for (size_t k = 0; k < e.backward.size(); ++k) {
    const Entry::Backward& b = e.backward[k];
    std::shared_ptr<Plan> plan = plans.backward[k];
    std::vector<size_t> idx = b.saved;
    if (b.joint) {
      attach_joint(nodes, metas, [plan, idx, saved_inputs](std::vector<Tensor> gs) {
        std::vector<Tensor> in = saved_inputs(idx);
        in.insert(in.end(), std::make_move_iterator(gs.begin()), std::make_move_iterator(gs.end()));
        return plan->run(in);
      });
      continue;
    }
    Tensor& out = outs[b.output];
    for (size_t j = 0; j < outs.size(); ++j)  // the same tensor twice: a second handle
      if (j != b.output && outs[j].is_same(out)) out = out.detach();
    const TensorImpl* o = out.unsafe_impl();
    metas.push_back({o->shape, o->dtype, o->device(), {}});
    nodes.push_back(
        attach(out, [plan, idx, saved_inputs](const Tensor& g, const bool*, Tensor* gi) {
          std::vector<Tensor> in = saved_inputs(idx);
          in.push_back(g);
          std::vector<Tensor> r = plan->run(in);
          for (size_t j = 0; j < r.size(); ++j) gi[j] = std::move(r[j]);
        }));
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
    tr->add_probe(std::move(name), detail::detached_alias(t));  // t's own value
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
    for (const std::string& a : e.flags) s += "  flag: " + a + "\n";
  }
  for (size_t k = 0; k < retraces.size(); ++k)
    s += fmt::format("retrace {}: {}\n", k + 1, retraces[k]);
  for (const std::string& a : specializations) s += "kept concrete: " + a + "\n";
  if (!eager_reason.empty()) s += "ran eagerly: " + eager_reason + "\n";
  return s;
}

}  // namespace duet
