// duet: the guards of a compiled function (trace/compile.h). A cache entry fits a call when its
// tensors have the entry's signatures, its static arguments and grad mode are the entry's, the
// captured tensors require grad as they did, and its sizes bind the entry's symbols with every
// guard on them holding (Note [Symbolic dims]); then the entry's value guards, if any, run
// (Note [Data-dependent reads]). A call that fits no entry gets, in words, the reason why. Private
// to trace/compile.cpp and trace/guards.cpp.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "core/symbolic.h"
#include "trace/compile.h"
#include "trace/plan/executor.h"
#include "trace/tracer.h"

namespace duet::detail {

// What the guard compares for one tensor.
struct TensorSig {
  Shape shape;
  Strides strides;  // only when not contiguous
  DType dtype;
  Device device;
  bool requires_grad;
  bool contiguous;
  bool operator==(const TensorSig& o) const {
    return shape == o.shape && dtype == o.dtype && device == o.device &&
           requires_grad == o.requires_grad && contiguous == o.contiguous &&
           (contiguous || strides == o.strides);
  }
};

TensorSig sig_of(const Tensor& t);
/// The signatures of a call's tensors; throws for an undefined or a traced one.
std::vector<TensorSig> call_signature(const FlatArgs& args, const std::string& label);
/// Throws for an undefined or a traced tensor among a call's (call_signature checks the same).
void check_call_tensors(const FlatArgs& args, const std::string& label);

// A guard of a symbolic entry: a relation its graph assumes (Note [Symbolic dims]).
struct SymGuard {
  SymInt a;
  SymRel rel;
  SymInt b;
  std::string why;
  bool holds(const std::vector<int64_t>& v) const {
    return sym_rel_holds(a.evaluate(v), rel, b.evaluate(v));
  }
  std::string str() const {
    return fmt::format("{} {} {} ({})", a.str(), sym_rel_str(rel), b.str(), why);
  }
};

// The SymContext of one trace: the symbols' values at the traced call, and what it decided.
class TraceSyms final : public SymContext {
 public:
  std::vector<int64_t> hints;
  std::vector<SymGuard> guards;
  SymbolBounds bounds_;
  int64_t hint(const SymInt& s) const override { return s.evaluate(hints); }
  void guard(const SymInt& a, SymRel rel, const SymInt& b, std::string why) override {
    for (const SymGuard& g : guards)
      if (g.a == a && g.rel == rel && g.b == b) return;
    guards.push_back({a, rel, b, std::move(why)});
  }
  [[noreturn]] void specialize(const std::vector<SymInt>& sizes, std::string why) override {
    SpecializeRequest r;
    for (const SymInt& s : sizes)
      for (int32_t id : s.symbols())
        if (std::find(r.symbols.begin(), r.symbols.end(), id) == r.symbols.end())
          r.symbols.push_back(id);
    r.why = std::move(why);
    throw r;
  }
  const SymbolBounds& bounds() const override { return bounds_; }
};

/// What the guards of one traced signature (CompiledCore::Entry) compare of a call, but its
/// value guards.
struct EntryGuards {
  std::vector<TensorSig> sig;  ///< symbolic dims hold the traced call's sizes, not compared
  /// Per tensor, per dim: its symbol, or -1 for a concrete dim. Empty: no symbolic dims.
  std::vector<std::vector<int32_t>> dim_sym;
  int32_t num_symbols = 0;
  std::vector<SymGuard> guards;
  std::vector<std::string> statics;
  std::vector<std::string> labels;  ///< per tensor input: "arg 0", "arg 1[2]", "arg 0.grad"
  bool grad_mode = true;
  /// The autocast state traced under (detail::autocast_key(), Note [Autocast]): the casts are
  /// in the trace.
  uint32_t autocast = 0;
  /// Captured tensors that require grad at trace time, and those that do not: the trace
  /// depends on the flags.
  std::vector<std::pair<Tensor, bool>> captured_flags;
  /// Per captured tensor (as captured_flags): the serial of its storage at trace time. A
  /// tensor given new storage in place since (Module::to) is a miss: plans hold views of the
  /// storage they were built over.
  std::vector<uint64_t> captured_storage;
  /// Per captured tensor (as captured_flags): its post-accumulate-grad hooks at trace time
  /// (hooks_key). The trace ran them as ops of its backward, so a hook added or removed since is
  /// a miss.
  std::vector<uint64_t> captured_hooks;
  /// Captured leaves whose .grad buffer the graph also captured (reads and accumulates into),
  /// with that buffer. A call finds each leaf's .grad still that buffer, or none (set_grad of
  /// an undefined tensor, or zero_grad(set_to_none)): the buffer is then zeroed and attached
  /// again (restore_grad_buffers), the state the trace saw. Another tensor there is a miss.
  std::vector<std::pair<Tensor, Tensor>> grad_buffers;
  /// Captured tensors the function writes in place (its write-backs: parameters, buffers,
  /// .grad): a call's tensor that shares memory with one is read as it was when the call began,
  /// or the call runs eagerly (Note [Arguments that share memory with written captures] in
  /// trace/compile.cpp).
  std::vector<Tensor> written;
  /// The trace read an argument after writing a captured tensor (Tracer::
  /// reads_arguments_after_writes): a call whose tensor shares memory with a written one would
  /// read it otherwise than eagerly, and runs eagerly.
  bool reads_args_after_writes = false;
  /// The C++ flags the trace read (a module's training flag), each with its value then: a call
  /// fits only while each still has it (Note [Flags a trace read] in trace/compile.cpp).
  std::vector<FlagGuard> flags;
};

/// The first flag of e that no longer has its traced value, or null.
const FlagGuard* changed_flag(const EntryGuards& e);

/// Whether the storages a and b lie in share bytes (a view of a tensor shares its memory).
bool shares_memory(const Tensor& a, const Tensor& b);
/// The call's tensors whose memory overlaps a captured tensor the entry writes in place.
std::vector<size_t> overlapping_written(const EntryGuards& e, const FlatArgs& args);

/// A key of t's post-accumulate-grad hooks (Tensor::register_post_accumulate_grad_hook), made of
/// their handles in order; 0 for none.
inline uint64_t hooks_key(const Tensor& t) {
  const detail::TensorImpl* x = t.unsafe_impl();
  if (!x->autograd || x->autograd->post_accumulate_hooks.empty()) return 0;
  uint64_t k = x->autograd->post_accumulate_hooks.size();
  for (const auto& h : x->autograd->post_accumulate_hooks)
    k = k * 0x100000001b3ull ^ static_cast<uint64_t>(h.first);
  return k;
}

/// The serial of t's storage (0: none).
inline uint64_t storage_serial(const Tensor& t) {
  const StorageImpl* s = t.unsafe_impl()->storage.get();
  return s ? s->serial : 0;
}

/// Attaches each of the entry's gradient buffers whose leaf has no .grad now, zeroed.
void restore_grad_buffers(const EntryGuards& e);

/// Dims by {tensor index, dim}.
using DimSet = std::set<std::pair<size_t, int64_t>>;

// ---- binding a call to an entry's symbols ----

/// Binds a call's tensors (each one's signature, read from the tensor: a call that hits builds
/// none) to the signature `want`, with the values of its symbols; false when they do not fit.
bool bind_symbols(const std::vector<std::vector<int32_t>>& dim_sym, int32_t num_symbols,
                  const std::vector<SymGuard>& guards, const std::vector<TensorSig>& want,
                  const std::vector<Tensor>& tensors, const ArgLabels& labels,
                  std::vector<int64_t>& values, std::string* why);
/// Whether a call (its tensors `args`, in grad mode `grad_mode`) fits entry e, with the values
/// of e's symbols; its value guards are not checked here.
bool fits(const EntryGuards& e, const FlatArgs& args, bool grad_mode, std::vector<int64_t>& values);
/// Whether e differs from the call in sizes at most (automatic dynamic compares sizes with it).
bool differs_in_sizes_only(const EntryGuards& e, const std::vector<TensorSig>& sig,
                           const FlatArgs& args, bool grad_mode);
/// Why a call that missed does not fit entry p, in words ("arg 0 dim 1 changed 31 -> 32"). Adds
/// to `dynamic` the dims the new trace makes symbolic: those symbolic in p, and those whose size
/// changed since p and are not kept concrete (`specialized`). value_why: why p's value guards
/// failed, if they did.
std::string miss_reason(const EntryGuards& p, const std::vector<TensorSig>& sig,
                        const FlatArgs& args, bool grad_mode,
                        const std::map<std::pair<size_t, int64_t>, std::string>& specialized,
                        const std::string& value_why, DimSet& dynamic);
/// The dims CompileOptions::dynamic names in this call.
DimSet requested_dynamic_dims(const CompileOptions& options, const FlatArgs& args,
                              const std::string& label);
std::vector<std::vector<int32_t>> assign_symbols(const std::vector<TensorSig>& sig,
                                                 const DimSet& dynamic,
                                                 std::vector<int64_t>& hints);
/// The dims tensor i of a call is traced with: symbols where dim_sym has them, else none.
SymDims symbolic_dims(const Tensor& t, const std::vector<std::vector<int32_t>>& dim_sym, size_t i);
Graph instantiate(const Graph& g, const std::vector<int64_t>& v);

// ---- value guards (Note [Data-dependent reads]) ----

PlanOptions plain_plan();
Tensor evaluate_value(const Graph& g, int32_t v, const std::vector<Tensor>& args,
                      const std::vector<int64_t>& hints);
void split_guards(const Graph& f, size_t k, Graph& guard, Graph& rest);
bool same_data(const Tensor& a, const Tensor& b);

// ---- cutting parts out of a graph (trace/compile.cpp) ----
// The joint graph of a trace is cut into its forward and backward parts, and a forward graph
// into the guards' part and the rest, with these.

void ancestors(const Graph& g, const std::vector<int32_t>& roots, const std::vector<bool>& stop,
               std::vector<bool>& in, std::set<int32_t>* boundary);
// Which write-backs a part of a graph keeps: those whose value it computes, those whose value
// it computes or takes as a boundary input, or none.
enum class KeepWritebacks { Computed, ComputedOrBoundary, None };
Graph extract(const Graph& g, const std::vector<bool>& include,
              const std::vector<int32_t>& boundary, const std::vector<int32_t>& roots,
              KeepWritebacks keep = KeepWritebacks::Computed);

}  // namespace duet::detail
