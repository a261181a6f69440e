// duet: the state of a compiled function's traced signatures (CompiledCore::Entry, its Plans),
// shared by trace/compile.cpp (looking up, optimizing and running them) and
// trace/compile_trace.cpp (tracing them).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trace/compile.h"
#include "trace/guards.h"
#include "trace/plan/executor.h"

namespace duet::detail {

/// Milliseconds since t0.
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The plans of one entry for one set of symbol values.
struct Plans {
  /// With value guards: the guards' part of the forward (outputs: the guarded values, then the
  /// values `forward` reads from it), run and checked first (Note [Data-dependent reads]).
  std::unique_ptr<Plan> guard;
  std::unique_ptr<Plan> forward;                ///< outputs: the results, then the saved values
  std::vector<std::shared_ptr<Plan>> backward;  ///< per Entry::backward
};

/// The forward plan of g within `budget` bytes (CompileOptions::memory_budget; Note [Memory
/// budget] in trace/memory_report.cpp); a ValueError naming the smallest peak reached when no
/// recomputation fits it.
std::unique_ptr<Plan> plan_within_budget(Graph g, PlanOptions o, int64_t budget);

/// Per plan of `p`, its memory (Note [Plan memory] in trace/plan/plan_memory.cpp): the guards,
/// the forward (outputs past `num_outputs` are the values it saves for its backwards), the
/// backwards.
std::vector<PlanMemoryStats> plan_memory_stats(const Plans& p, size_t num_outputs);

// One traced signature: what its guards compare (EntryGuards), and what it runs.
struct CompiledCore::Entry : EntryGuards {
  /// Values read into C++ in guard mode: their data at the traced call, and what read them.
  struct ValueGuard {
    Tensor expected;
    std::string why;
  };
  std::vector<ValueGuard> value_guards;
  uint64_t used = 0;  ///< CompiledCore::clock_ at its latest call
  /// Its timings (CompileStats::signatures); recent holds cached calls' durations in
  /// microseconds, a ring of kRecent: the first calls, then one in kTimeEvery.
  SignatureStats timing;
  static constexpr size_t kRecent = 64;
  static constexpr int64_t kTimeEvery = 16;  ///< past kRecent calls, one in kTimeEvery is timed
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
    size_t output;              ///< the result it differentiates (joint: unused)
    std::vector<size_t> saved;  ///< indices into the forward plan's saved values
    /// The joint backward: the gradients of every differentiated result at once, read in the
    /// order of the backwards before it (Note [One backward for several outputs] in
    /// trace/compile.cpp). Only the last backward may be one.
    bool joint = false;
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
  /// across sizes (Note [Fusion across sizes] in trace/plan/plan_build.cpp).
  std::vector<std::shared_ptr<FusionShare>> shares;
  /// The plans per set of symbol values (one entry, {}, without symbolic dims).
  std::map<std::vector<int64_t>, Plans> plans;
  Plans* last_plans = nullptr;
};

// The gradients of one trace's outputs, as its joint graph computes them.
struct CompiledCore::Gradients {
  std::vector<std::vector<Tensor>> grads;  ///< per differentiated output
  std::vector<size_t> diff_outputs;        ///< the outputs differentiated
  std::vector<int32_t> gout_values;  ///< per differentiated output: its gradient's graph input
  /// With two or more differentiated outputs: their gradients taken together (empty where that
  /// failed).
  std::vector<Tensor> joint;
};

}  // namespace duet::detail
