// duet: compile(fn), the static face (docs/eager-vs-compiled.md; docs/design.md, "Data, walked").
//
// A call computes the guard key of its arguments (shapes, dtypes, devices, layouts,
// requires_grad, static argument values, grad mode) and looks it up. A hit runs the cached plan;
// a miss traces fn on traced tensors (no kernel runs), records why it retraced, optimizes the
// graph and builds a plan. When outputs require grad, the trace also differentiates them (the
// same gradient rules eager uses) and the joint graph is split into a forward plan, which
// returns the outputs and the values the backward needs, and a backward plan per output, which
// one tape node runs when an eager backward() reaches the output.
//
// Note [Symbolic dims]
// A dim named by CompileOptions::dynamic, or one whose size changed since the most recent
// signature (automatic dynamic), is traced as a symbol: s0, s1, ... (dims of equal size share
// one, as PyTorch's duck sizing does). The traced tensors of such a trace keep the call's
// sizes in their Shape (the hints, which shape rules validate) and every dim as a SymInt beside
// them (TensorImpl::sym, TensorMeta::sym). Each op's symbolic rule (OpDef::sym_infer, beside its
// shape rule) computes the result's dims with SymInts; the tracer checks them against the shape
// rule's result at the hints, so the two can never drift apart. Library code that builds a
// shape from a traced tensor's shape does so with SymInts (reshape_dims, expand_dims, full_dims,
// size_scalar, and size-holding attributes in Attrs::sym): reshape with -1, mean's count, cat's
// sizes, slicing bounds and the gradient rules follow the symbols. A decision on a symbolic size
// (broadcasting a size 1, clamping a slice, squeeze) is taken at the hints and recorded as a
// guard ("s0 == 1 (add)"): size 1 is specialized only where such a decision needs it. Reading a
// symbolic size as an integer (Tensor::sizes(), size(), numel(), in user code or in library code
// not written for symbols) or an op without a symbolic rule (unfold, fold) specializes: the trace
// restarts with those dims concrete, and stats() records why. A call binds the symbols from its
// arguments' sizes and checks the guards; the passes run once, on the symbolic graph, and the
// plans of each set of sizes are built once from the optimized graph (instantiated: every size
// evaluated, then the memory plan and the steps, with the fusion groups and kernels of the
// first plan) and cached, so a new size costs a plan, not a trace nor the passes (Note [A new
// size costs a plan] in trace/compile.cpp).
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <mutex>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/small_vector.h"
#include "core/tensor.h"
#include "core/tensor_tree.h"
#include "trace/check.h"
#include "trace/plan/cuda_graph.h"
#include "trace/ir/graph.h"

namespace duet {

/// What a compiled function does with a call that matches none of its cached signatures, once
/// it has traced one (the first call always traces).
enum class OnMiss {
  Retrace,  ///< trace again (up to cache_limit signatures; then eager)
  Eager,    ///< run the function eagerly, keep the cache as it is
  Error,    ///< throw a ValueError saying which guard failed
};

struct CompileOptions {
  /// {argument index, dim}: dims symbolic from the first trace (Note [Symbolic dims]). Without
  /// them, a dim becomes symbolic when its size changes between calls (automatic dynamic).
  std::vector<std::pair<int, int>> dynamic{};
  /// Passes to switch off: "dce", "cse", "fold", "simplify", "remat", "duplicate" (graph passes;
  /// remat: the backward recomputes cheap elementwise activations, docs/memory.md; duplicate:
  /// a large value made of small inputs is computed in each fused reader, Note [Duplicated
  /// producers] in trace/ir/duplicate.cpp), "fuse" (elementwise
  /// and reduction-prologue fusion), "codegen" (the generated-C++ tier of fused kernels),
  /// "plan_memory" (one arena, buffers reused), "parallel" (independent branches on both
  /// cores), "hoist" (work on captured parameters done once per parameter version),
  /// "cuda_graph" (a plan on a CUDA device replayed as one CUDA graph), "donate" (intermediates
  /// placed in a write-back target, such as a .grad, while its old value is dead:
  /// docs/memory.md).
  std::vector<std::string> disable_passes{};
  /// Signatures traced at most. A new signature beyond them runs eagerly: the first such call
  /// prints a warning once and records why (CompileStats::eager_reason); each counts in
  /// eager_calls.
  int cache_limit = 8;
  /// Bytes one call's plan may hold at most (its arena and the results it allocates; 0: no
  /// limit). Past it, the backward of a training step recomputes forward ops instead of keeping
  /// their results, cheapest per byte first (after the cheap elementwise ones that the remat
  /// pass recomputes anyway), until the plan fits; a budget that cannot be met is a ValueError
  /// naming the smallest peak reached. CompileStats says what was recomputed (docs/memory.md).
  int64_t memory_budget = 0;
  /// Data-dependent reads (Note [Data-dependent reads] in trace/tracer.h). Off (strict): item()
  /// or to_vector() of a traced value is an error pointing to cond and scan. On: the read gets
  /// the value at the traced call and records it as a guard; a call where the value differs
  /// traces again (each distinct value is one more signature, up to cache_limit).
  bool guard_data_reads = false;
  /// A call matching no cached signature, after the first trace: see OnMiss.
  OnMiss on_miss = OnMiss::Retrace;
  /// Before every call, run the shadow-eager check (trace/check.h) on its arguments and throw a
  /// MismatchError when the compiled function and its eager twin differ; the call then runs
  /// as usual. A debugging aid: each call costs an eager run and three compiled runs more.
  bool check_against_eager = false;
  /// The check's tolerances (its throw_on_mismatch is always on here).
  CheckOptions check{};
};

/// The timings of one cached signature (CompileStats::signatures), in milliseconds.
struct SignatureStats {
  std::string signature;   ///< "arg 0: f32 (s0, 32) cpu; arg 1: i64 (s0) cpu"
  double trace_ms = 0;     ///< tracing the function (restarts that made a dim concrete included)
  double optimize_ms = 0;  ///< the graph passes of its first plans
  double plan_ms = 0;      ///< building its first plans (memory plan, fusion groups, steps)
  double codegen_ms =
      0;  ///< NVRTC builds during its first call (CPU kernels build in the background)
  double first_call_ms = 0;  ///< the whole call that traced it, its first run included
  int64_t calls = 0;         ///< calls that ran it from the cache
  /// The median of its recent timed cached calls, in microseconds; 0 before one. Its first 64
  /// cached calls are timed, then one in 16 (Note [Call overhead] in trace/compile.cpp); the
  /// median is over the latest 64 timed.
  double steady_median_us = 0;
};

/// The memory of one plan of a compiled function (Note [Plan memory] in
/// trace/plan/plan_memory.cpp).
struct PlanMemoryStats {
  std::string plan;         ///< "step" (forward and backward in one), "forward", "backward 0"
  int64_t arena_bytes = 0;  ///< the arena it needs (the function's plans share one)
  int64_t saved_bytes = 0;  ///< activations: values made before the backward and read in it
  int64_t peak_bytes = 0;   ///< its arena plus what a run allocates outside it (results)
  /// Arena bytes saved by placing intermediates in write-back targets (a .grad) while their
  /// old value is dead (docs/memory.md)
  int64_t donated_bytes = 0;
};

struct CompileStats {
  /// Traces of the function, the first included. A trace restarted because code read a
  /// symbolic size (the dim made concrete) counts again: it ran the function again. The cache
  /// holds at most CompileOptions::cache_limit signatures; explain() lists them.
  int traces = 0;
  int hits = 0;
  std::vector<std::string> retrace_reasons;  ///< one per retrace: "arg 0 dim 1 changed 31 -> 32"
  int eager_calls = 0;  ///< calls run eagerly (cache_limit reached, OnMiss::Eager, or a tensor
                        ///< sharing memory with one the function writes in place)
  /// Why the first of them ran eagerly: "cache_limit of 8 signatures reached; this call: arg 0
  /// rank changed 2 -> 3", or "on_miss = eager; ...". Empty while none has.
  std::string eager_reason;
  /// The symbolic dims of the most recent trace ("arg 0 dim 0: s0"), and the guards it recorded
  /// ("s0 != 1 (squeeze)"): the relations between sizes that its graph assumes.
  std::vector<std::string> symbolic_dims, guards;
  /// The values the most recent trace read into C++ under CompileOptions::guard_data_reads
  /// ("item() at f.cpp:12 read true"): a call where one differs traces again.
  std::vector<std::string> value_guards;
  int plans_built = 0;  ///< plans built: one per trace, plus one per new size of symbolic dims
  /// Runs of the graph passes: one per trace. A new size of symbolic dims reuses its trace's
  /// optimized graphs (it costs a plan only: plan_ms, new_size_ms).
  int optimizations = 0;
  /// The most recent call at new sizes of an entry's symbolic dims, up to running its plans:
  /// finding the entry, binding the symbols, checking the guards and building the plans.
  double new_size_ms = 0;
  /// Per cached signature, oldest first: what it cost to trace, optimize, plan and build
  /// kernels, its first call, and its steady-state median.
  std::vector<SignatureStats> signatures;
  // In milliseconds: tracing fn and the passes (the most recent trace), and building the most
  // recent plans (those of a new size included).
  double trace_ms = 0, optimize_ms = 0, plan_ms = 0;
  int64_t nodes_before = 0;  ///< op nodes of the most recent trace (forward and backward)
  int64_t nodes_after = 0;   ///< after the passes
  int64_t buffer_bytes = 0;  ///< intermediate buffers the most recent plans keep (arena included)
  int64_t device_buffer_bytes = 0;  ///< those of them in a device's memory (a GPU's)
  int64_t fused_kernels = 0;        ///< fused groups in the most recent plans (each one kernel)
  int64_t fused_nodes = 0;          ///< op nodes those groups absorbed
  int64_t epilogues = 0;            ///< fused groups that finish a matmul's output in place
  int64_t arena_bytes = 0;          ///< the planned arena of the most recent plans
  /// The sum of the sizes of all their intermediate values, as if each had a buffer of its own:
  /// every op value of the optimized graphs, those a fused kernel keeps in registers included.
  int64_t intermediate_bytes = 0;
  int64_t hoisted_nodes = 0;   ///< nodes that depend only on parameters, run once per version
  int64_t parallel_plans = 0;  ///< plans that run independent branches on two threads
  /// Plans that run as CUDA graphs (Note [CUDA graph replay] in trace/plan/executor.h): captured at
  /// their second run, replayed from the third. cuda_graph_stats() says how captures went.
  int64_t cuda_graph_plans = 0;
  /// Runs of those plans that replayed their graph (a capture that failed, or a plan that is
  /// not called again, replays none; cuda_graph_stats().last_failure says why a capture failed).
  int64_t cuda_graph_replays = 0;
  /// matmul + bias (+ relu) pairs run as one device GEMM with an epilogue (cuBLASLt).
  int64_t gemm_epilogues = 0;
  /// Per plan of the most recent call's signature: its arena, saved activations and peak.
  std::vector<PlanMemoryStats> plans;
  /// What the backward of the most recent plans computes again instead of keeping it (Note
  /// [Rematerialization] in trace/ir/remat.cpp): the saved values, their bytes, the work (a
  /// product's multiply-adds, one per element otherwise), and the ops recomputed to meet
  /// memory_budget, in words with their work.
  int64_t recomputed_values = 0, recomputed_bytes = 0;
  double recomputed_flops = 0;
  std::vector<std::string> recomputed_for_budget;
};

/// Where a compiled function's memory goes (Compiled::memory_report()).
struct MemoryReport {
  /// One buffer live at the peak.
  struct Buffer {
    int64_t bytes = 0;
    std::string value;   ///< "%12 = matmul(%3, %7) : f32 (256, 512)", as graph().str() shows it
    std::string op;      ///< "matmul"
    std::string site;    ///< the user's line that made it ("model.cpp:12"), or ""
    std::string scope;   ///< its duet::scope path, or ""
    bool saved = false;  ///< an activation: made before the backward, read in it
  };
  std::string function;            ///< "compiled function at model.cpp:12"
  int64_t peak_bytes = 0;          ///< the largest peak of its plans
  int64_t arena_bytes = 0;         ///< the arena its plans share (the largest they need)
  int64_t intermediate_bytes = 0;  ///< all intermediate values, as if each had a buffer
  int64_t saved_bytes = 0;         ///< activations, over its plans
  int64_t donated_bytes = 0;       ///< arena saved in dead write-back targets, its largest plan
  std::vector<PlanMemoryStats> plans;
  std::string peak_plan;             ///< the plan whose arena is largest
  std::vector<Buffer> live_at_peak;  ///< its buffers live at its peak step, largest first
  /// A table: the figures, then the buffers live at the peak with their ops and lines.
  std::string str() const;
};

/// Pins an intermediate value under a name and returns t. Inside a compiled function the value
/// becomes an extra result of the plan, so it is stored even when its op is fused with others,
/// and `f.probe(name)` returns it after each call. Eagerly, `duet::probed(name)` returns the
/// last value pinned under that name on any thread. A probe is detached: it takes no part in
/// autograd. Inside the body of a cond, scan or while_loop it is an error (probe the
/// construct's results); a name used twice in one trace is an error.
Tensor probe(const Tensor& t, std::string name, DUET_HERE);
/// The last value duet::probe pinned eagerly under `name`; a ValueError when there is none.
Tensor probed(const std::string& name);
/// Forgets the eagerly pinned values.
void clear_probes();

namespace detail {

/// Where a tensor sits in a call's arguments: the argument's index, then its index in each
/// vector or tuple around it ("arg 1[2]").
struct ArgPath {
  static constexpr size_t kDepth = 8;
  uint32_t at[kDepth] = {};
  uint32_t n = 0;
  ArgPath() = default;
  explicit ArgPath(uint32_t arg) : at{arg}, n(1) {}
  ArgPath inner(uint32_t i) const {  // (a path deeper than kDepth keeps its first kDepth)
    ArgPath p = *this;
    if (p.n < kDepth) p.at[p.n++] = i;
    return p;
  }
  std::string str() const;
};

/// The labels of a call's tensors ("arg 0", "arg 1[2]", "arg 0.grad"), kept as paths and
/// formatted when read: a call that hits the cache reads none (Note [Call overhead] in
/// trace/compile.cpp).
class ArgLabels {
 public:
  size_t size() const { return static_cast<size_t>(labels_.size()); }
  std::string operator[](size_t i) const;
  void add(const ArgPath& p);
  void add_grad_of(size_t i);  ///< label i's .grad buffer
  void reserve(size_t n) {
    labels_.reserve(static_cast<int64_t>(n));
    paths_.reserve(static_cast<int64_t>(n));
  }
  std::vector<std::string> strings() const;

 private:
  struct Label {
    uint32_t begin, n;  // the path, paths_[begin, begin + n)
    bool grad;          // ".grad" after it
  };
  // (Inline for a few tensors: a call allocates nothing for them.)
  SmallVec<Label, 4> labels_;
  SmallVec<uint32_t, 8> paths_;
};

/// The tensors of one call, flattened, with what guards the rest.
struct FlatArgs {
  std::vector<Tensor> tensors;
  ArgLabels labels;                  ///< per tensor: "arg 0", "arg 1[2]"
  std::vector<std::string> statics;  ///< per static argument: "arg 2 = 3"
  /// The last grad_of.size() tensors are the .grad buffers of these tensors (Note [Argument
  /// gradients] in trace/arg_grads.cpp); the function takes the others.
  std::vector<size_t> grad_of;
};
using TraceFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Plans;
struct TensorSig;
struct ValueGuard;
class TraceSyms;
class Tracer;

}  // namespace detail

/// What a compiled function's cache holds and why (Compiled::explain()).
struct CacheExplanation {
  struct Entry {
    std::vector<std::string> args;     ///< "arg 0: f32 (s0, 32) cpu", one per tensor argument
    std::vector<std::string> statics;  ///< the non-tensor arguments it was traced with
    bool grad_mode = true;
    std::vector<std::string> symbolic_dims;  ///< "arg 0 dim 0: s0"
    std::vector<std::string> guards;         ///< relations between sizes: "s0 != 1 (squeeze)"
    std::vector<std::string> value_guards;   ///< data read into C++ (guard_data_reads)
    /// C++ flags the trace read: "module Dropout(p=0.5)'s training flag: true"
    std::vector<std::string> flags;
  };
  std::string function;               ///< "compiled function at model.cpp:12"
  std::vector<Entry> entries;         ///< oldest first
  std::vector<std::string> retraces;  ///< per retrace, the guard that failed, as was -> now
  /// Dims kept concrete because the code read their sizes: "arg 0 dim 0: size(0) of ...".
  std::vector<std::string> specializations;
  std::string eager_reason;  ///< CompileStats::eager_reason
  int traces = 0, hits = 0, eager_calls = 0;
  /// In words, one line per fact.
  std::string str() const;
};

namespace detail {

struct ArenaShare;

class CompiledCore {
 public:
  CompiledCore(CompileOptions options, std::string label);
  ~CompiledCore();
  /// The outputs of fn for these arguments: from the cached plan, a new trace, or eagerly (fn
  /// on the real tensors) when the cache is full or another trace is running (inlined there).
  std::vector<Tensor> call(const FlatArgs& args, const TraceFn& fn);
  /// A copy, taken under the lock: calls on other threads may update the counters meanwhile.
  CompileStats stats() const;
  CacheExplanation explain() const;
  MemoryReport memory_report() const;
  Tensor probe(const std::string& name) const;
  const Graph& graph() const;
  const std::string& label() const { return label_; }
  const CompileOptions& options() const { return options_; }

  /// What prepare() traced: the forward graph as traced (before the passes; symbolic dims at
  /// the call's sizes), and every tensor its graphs capture.
  struct Prepared {
    Graph forward;
    size_t num_outputs = 0;     ///< the function's results among forward's outputs (first)
    bool value_guards = false;  ///< it read data into C++ (guard_data_reads)
    std::vector<Tensor> captured;
    /// The forward graph as traced, its symbols not instantiated; per argument and dim the
    /// symbol (-1: concrete; empty: none); the symbols' sizes in this call; the guards.
    Graph symbolic;
    std::vector<std::vector<int32_t>> dim_sym;
    std::vector<int64_t> hints;
    struct Guard {
      SymInt a;
      SymRel rel;
      SymInt b;
      std::string why;
    };
    std::vector<Guard> guards;
    std::vector<std::string> probe_names;
  };
  /// Traces fn for these arguments into a new cache entry, as a first call would, but runs
  /// nothing: a later call() with them runs the entry's plans. Only on a core with no entries.
  Prepared prepare(const FlatArgs& args, const TraceFn& fn);

 private:
  struct Entry;
  /// Traces fn with the dims of dim_sym symbolic (Note [Symbolic dims]), hints their sizes.
  Entry* trace(const FlatArgs& args, const TraceFn& fn,
               const std::vector<std::vector<int32_t>>& dim_sym, const std::vector<int64_t>& hints);
  /// The steps of call(): a cached entry that fits (trace/guards.h) runs; else the reason for
  /// the miss; else a new trace, restarted with fewer symbolic dims while code needs sizes.
  /// `overlap`: set to a call's tensor that shares memory with a tensor a fitting entry writes
  /// in place (that entry does not run).
  bool run_cached(const FlatArgs& args, bool grad_mode, std::vector<Tensor>& outs,
                  std::string& value_why, int64_t& overlap, std::unique_lock<std::mutex>& lock);
  /// For a call whose tensors share memory with ones entry e writes in place: -1 with those
  /// tensors copied into `snap`, or the first such tensor where the call must run eagerly (Note
  /// [Arguments that share memory with written captures]).
  static int64_t snapshot(const Entry& e, const FlatArgs& args, std::optional<FlatArgs>& snap);
  /// A call whose tensor `i` shares memory with a tensor the function writes in place, run
  /// eagerly (Note [Arguments that share memory with written captures]).
  std::vector<Tensor> run_overlapping(const FlatArgs& args, int64_t i, const FlatArgs& plain,
                                      const TraceFn& fn, std::unique_lock<std::mutex>& lock);
  void warn_changed_again(const FlatArgs& args, const std::vector<TensorSig>& sig);
  static std::string signature_text(const Entry& e, size_t i);
  std::string explain_miss(const FlatArgs& args, const std::vector<TensorSig>& sig, bool grad_mode,
                           const std::string& value_why,
                           std::set<std::pair<size_t, int64_t>>& dynamic) const;
  Entry* trace_specializing(const FlatArgs& args, const TraceFn& fn,
                            const std::vector<TensorSig>& sig,
                            std::set<std::pair<size_t, int64_t>>& dynamic,
                            std::vector<int64_t>& hints);
  /// The steps of trace(): the gradients of the outputs, what the trace assumed, and the joint
  /// graph cut into the entry's forward and backward graphs.
  struct Gradients;
  static void differentiate(Tracer& tr, const std::vector<Tensor>& sym,
                            const std::vector<Tensor>& outs, Entry& e, Gradients& grads);
  void record_guards(const FlatArgs& args, const std::vector<std::vector<int32_t>>& dim_sym,
                     const std::vector<int64_t>& hints, TraceSyms& syms,
                     const std::vector<ValueGuard>& value_guards, Entry& e);
  static void split_joint(const Graph& joint, const std::vector<ValueGuard>& value_guards,
                          const Gradients& grads, Entry& e);
  /// Runs the passes on e's traced graphs, once (Note [A new size costs a plan]).
  void optimize_entry(Entry& e);
  /// e's plans for these symbol values: its optimized graphs instantiated and planned.
  Plans build_plans(Entry& e, const std::vector<int64_t>& values);
  /// Runs e's plans for these symbol values into `outs`; false (with `why`, and nothing run
  /// but the guards' part) when a value guard fails (Note [Data-dependent reads]).
  /// Called with `lock` held; runs the plans with it released, and holds it again on return.
  bool run(Entry& e, const std::vector<int64_t>& values, const FlatArgs& args,
           std::vector<Tensor>& outs, std::string* why, std::unique_lock<std::mutex>& lock);
  /// Moves the probes (the last results of e's plans) out of outs into probes_.
  void take_probes(const Entry& e, std::vector<Tensor>& outs);

  /// Guards everything below: the cache, the statistics and the specializations (Note
  /// [Compiled functions and threads] in trace/compile.cpp). Plans run without it.
  mutable std::mutex mu_;
  CompileOptions options_;
  std::string label_;
  CompileStats stats_;
  std::vector<std::unique_ptr<Entry>> entries_;
  /// The arenas all of this function's plans share (Note [One arena per function] in
  /// trace/plan/plan_build.cpp).
  std::shared_ptr<ArenaShare> arena_share_;
  Entry* last_ = nullptr;
  uint64_t clock_ = 0;  ///< counts calls: Entry::used
  /// When the call holding the lock started (CompileStats::new_size_ms).
  std::chrono::steady_clock::time_point call_start_{};
  bool warned_ = false;
  bool warned_overlap_ = false;  ///< the warning about a call run eagerly for an overlap
  bool warned_dims_ = false;     ///< the warning about a dim that changed again was printed
  /// Argument dims whose change made a retrace: a second retrace of one of them warns once.
  std::set<std::pair<size_t, int64_t>> retraced_dims_;
  /// Dims kept concrete because the code needed their sizes, with the reason.
  std::map<std::pair<size_t, int64_t>, std::string> specialized_;
  /// The probes of the most recent call, by name (dropped when the next call starts, so that
  /// a CUDA graph's buffers they view are free for it again).
  std::map<std::string, Tensor> probes_;
};

// ---- flattening of arguments and results ----

template <class T>
std::string static_key(const T& v) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_arithmetic_v<U>) {
    return fmt::format("{}", v);
  } else if constexpr (std::is_enum_v<U>) {
    return fmt::format("{}", static_cast<std::underlying_type_t<U>>(v));
  } else if constexpr (std::is_convertible_v<const U&, std::string>) {
    return fmt::format("\"{}\"", std::string(v));
  } else if constexpr (std::is_same_v<U, Shape>) {
    return v.str();
  } else {
    static_assert(sizeof(U) == 0,
                  "duet::compile: a non-Tensor argument must be a number, bool, enum, string or "
                  "Shape (it is guarded by value); capture other objects in the lambda instead");
    return {};
  }
}

template <class T>
void flatten_arg(FlatArgs& f, const T& a, const ArgPath& path) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, Tensor>) {
    f.tensors.push_back(a);
    f.labels.add(path);
  } else if constexpr (std::is_same_v<U, std::vector<Tensor>>) {
    f.statics.push_back(fmt::format("{} has {} tensors", path.str(), a.size()));
    for (size_t i = 0; i < a.size(); ++i)
      flatten_arg(f, a[i], path.inner(static_cast<uint32_t>(i)));
  } else if constexpr (is_tuple<U>::value) {
    std::apply(
        [&](const auto&... x) {
          uint32_t i = 0;
          (flatten_arg(f, x, path.inner(i++)), ...);
        },
        a);
  } else {
    f.statics.push_back(fmt::format("{} = {}", path.str(), static_key(a)));
  }
}

// fn's signature, when it has one (not a generic lambda): so that Compiled<F>::operator() takes
// exactly fn's parameters, and braced arguments ({a, b} for a std::vector<Tensor>) work.
template <class M>
struct member_signature {
  using type = void;
};
template <class R, class C, class... A>
struct member_signature<R (C::*)(A...) const> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct member_signature<R (C::*)(A...)> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct member_signature<R (C::*)(A...) const noexcept> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct member_signature<R (C::*)(A...) noexcept> {
  using type = R(A...);
};
template <class F, class = void>
struct signature {
  using type = void;
};
template <class F>
struct signature<F, std::void_t<decltype(&F::operator())>>
    : member_signature<decltype(&F::operator())> {};
template <class R, class... A>
struct signature<R (*)(A...), void> {
  using type = R(A...);
};

template <class Self, class Sig>
struct CallOperator {  // a generic lambda: forward anything
  template <class... A>
  auto operator()(A&&... a) {
    return static_cast<Self*>(this)->invoke(std::forward<A>(a)...);
  }
};
template <class Self, class R, class... A>
struct CallOperator<Self, R(A...)> {
  R operator()(A... a) { return static_cast<Self*>(this)->invoke(std::forward<A>(a)...); }
};

}  // namespace detail

/// A compiled function: call it like fn. See docs/eager-vs-compiled.md.
template <class F>
class Compiled : public detail::CallOperator<Compiled<F>, typename detail::signature<F>::type> {
 public:
  Compiled(F fn, CompileOptions options, std::string label)
      : fn_(std::move(fn)),
        core_(std::make_shared<detail::CompiledCore>(std::move(options), std::move(label))) {}

  /// Calls the compiled function (operator() has fn's signature).
  template <class... A>
  auto invoke(A&&... a) {
    using R = std::invoke_result_t<F&, A&&...>;
    std::vector<Tensor> out = with_flat_args(
        [&](const detail::FlatArgs& flat, const detail::TraceFn& run) {
          if (core_->options().check_against_eager) {
            CheckOptions c = core_->options().check;
            c.throw_on_mismatch = true;
            detail::check_against_eager(core_->options(), core_->label(), flat, run, c);
          }
          return core_->call(flat, run);
        },
        std::forward<A>(a)...);
    if constexpr (!std::is_void_v<R>) {
      size_t pos = 0;
      return detail::unflatten_result<std::decay_t<R>>(out, pos);
    }
  }

  /// Calls body(flat, run) with the arguments flattened, and run calling fn with tensors
  /// substituted for theirs (shared by calls and by check_against_eager).
  template <class Body, class... A>
  auto with_flat_args(Body&& body, A&&... a) {
    using R = std::invoke_result_t<F&, A&&...>;
    detail::FlatArgs flat;
    flat.tensors.reserve(sizeof...(A));
    flat.labels.reserve(sizeof...(A));
    uint32_t i = 0;
    (detail::flatten_arg(flat, a, detail::ArgPath(i++)), ...);
    detail::TraceFn run = [&](const std::vector<Tensor>& ts) {
      size_t pos = 0;
      // Braced initialisation evaluates left to right, so tensors are taken in order.
      std::tuple<decltype(detail::substitute(a, ts, pos))...> args{
          detail::substitute(a, ts, pos)...};
      std::vector<Tensor> out;
      if constexpr (std::is_void_v<R>) {
        std::apply(fn_, args);
      } else {
        detail::flatten_result(std::apply(fn_, args), out);
      }
      return out;
    };
    return body(flat, run);
  }

  const CompileOptions& options() const { return core_->options(); }
  const std::string& label() const { return core_->label(); }

  /// Traces, hits and the reason for each retrace: a copy, consistent even while other threads
  /// call the function.
  CompileStats stats() const { return core_->stats(); }
  /// The cache in a structured record: each entry's signature and guards, why each retrace
  /// happened, which dims were kept concrete and why, and why calls ran eagerly. Print it
  /// with str().
  CacheExplanation explain() const { return core_->explain(); }
  /// The optimized graph of the most recent signature; Error before the first call.
  const Graph& graph() const { return core_->graph(); }
  /// Where the memory of the most recent signature's plans goes: their peak, the buffers live
  /// there with their ops and lines, the arena against all intermediates, the saved
  /// activations. Error before the first call.
  MemoryReport memory_report() const { return core_->memory_report(); }
  /// The value duet::probe(t, name) pinned in the most recent call; a ValueError naming the
  /// probes there are when that call made none of that name.
  Tensor probe(const std::string& name) const { return core_->probe(name); }

 private:
  F fn_;
  std::shared_ptr<detail::CompiledCore> core_;
};

/// Runs the compiled function f and its eager twin on these arguments, from the same state,
/// and compares everything both produce: results, captured tensors after the call, .grad
/// buffers. On a difference it names the pass that introduced it and the first node whose value
/// differs (Note [Shadow-eager check] in trace/check.h). Neither run changes the caller's state:
/// captured tensors, gradients, optimizer state and the random generator are restored, and f's
/// cache and statistics are untouched. With check.throw_on_mismatch a difference throws a
/// MismatchError; otherwise the report says it.
template <class F, class... A>
CheckReport check_against_eager(const CheckOptions& check, Compiled<F>& f, A&&... a) {
  return f.with_flat_args(
      [&](const detail::FlatArgs& flat, const detail::TraceFn& run) {
        return detail::check_against_eager(f.options(), f.label(), flat, run, check);
      },
      std::forward<A>(a)...);
}
template <class F, class... A>
CheckReport check_against_eager(Compiled<F>& f, A&&... a) {
  return check_against_eager(CheckOptions{}, f, std::forward<A>(a)...);
}

/// How duet::save names what it writes.
struct SaveOptions {
  /// Names for the captured tensors, as a Program's named_parameters() gives them back: a
  /// tensor the function captures that is listed here (the very tensor, not an equal one) takes
  /// its name, such as a module's named_parameters() ("fc1.weight", "0.bias"; append
  /// named_buffers() for the buffers). Others are "captured0", "captured1", ... (by position).
  std::vector<std::pair<std::string, Tensor>> parameter_names{};
};

namespace detail {
/// duet::save of a compiled function (trace/deploy.cpp).
void save_compiled(const CompileOptions& options, const std::string& label, const FlatArgs& args,
                   const TraceFn& fn, const std::string& path,
                   const SaveOptions& save_options = {});
/// Whether a pack of arguments starts with a SaveOptions (then it is no example argument).
template <class... A>
inline constexpr bool leads_with_save_options = false;
template <class A0, class... A>
inline constexpr bool leads_with_save_options<A0, A...> =
    std::is_same_v<std::remove_cvref_t<A0>, SaveOptions>;
}  // namespace detail

/// Writes the compiled function f, traced for the signature of its example arguments, to a
/// file that duet::load reads back as a Program (Note [Program files] in trace/serialize.h):
/// its graph as traced (dims that f holds symbolic, through CompileOptions::dynamic, stay
/// symbolic, with the guards on them), the values of the tensors it captures, and the names
/// of its inputs ("arg0", ...) and outputs ("out0", ..., and its probes' names). The forward
/// computation only: a loaded program has no backward of its outputs, though a function that
/// runs backward() and an optimizer step itself is saved with them.
template <class F, class... A>
requires(!detail::leads_with_save_options<A...>) void save(Compiled<F>& f, const std::string& path,
                                                           A&&... example_args) {
  f.with_flat_args(
      [&](const detail::FlatArgs& flat, const detail::TraceFn& run) {
        detail::save_compiled(f.options(), f.label(), flat, run, path);
        return 0;
      },
      std::forward<A>(example_args)...);
}
/// save(f, path, example_args...), with the captured tensors named as options say:
/// `save(f, "mlp.duet", {.parameter_names = model.named_parameters()}, x)`.
template <class F, class... A>
void save(Compiled<F>& f, const std::string& path, const SaveOptions& options,
          A&&... example_args) {
  f.with_flat_args(
      [&](const detail::FlatArgs& flat, const detail::TraceFn& run) {
        detail::save_compiled(f.options(), f.label(), flat, run, path, options);
        return 0;
      },
      std::forward<A>(example_args)...);
}

/// Compiles fn: traced once per input signature, optimized, and replayed.
template <class F>
Compiled<F> compile(F fn, CompileOptions options = {},
                    std::source_location loc = std::source_location::current()) {
  return Compiled<F>(std::move(fn), std::move(options),
                     fmt::format("compiled function at {}:{}",
                                 detail::file_basename(loc.file_name()), loc.line()));
}

}  // namespace duet
