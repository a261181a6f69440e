// duet: the tracer. A dispatch mode that records every op call into a Graph and runs no kernel.
//
// Note [Functionalization]
// (docs/design.md, "Captured state and compiled backward".) Traced tensors stand for graph
// values: a TensorImpl with a TraceTag, the value id, and a storage with no data; views share
// their base's traced storage, as in eager. A concrete tensor the traced code reads is
// captured: wrapped numbers become constants, anything else becomes a graph input read by
// reference at every run (parameters, .grad buffers, the RNG state, tensors built from C++ data).
// An in-place op records a pure op whose result is the new value of the written tensor, and the
// tracer keeps a table from each written storage to its current value and the layout written.
// Reading a tensor looks its storage up: a tensor whose storage was written after it was made
// reads the current value when its layout is the written one; another layout of a written
// storage (a view made before the write) is an error, never a stale value. At the end, every
// written captured storage becomes a write-back that the executor copies into it.
//
// Note [Sub-traces]
// The functions of cond, scan and while_loop are traced by a child tracer into subgraphs
// (Note [Control flow nodes] in trace/ir/graph.h). A tensor the function reads from outside (a
// value of an enclosing trace, a parameter, a tensor built from C++ data) is lifted: the parent
// gives it a value (capturing it if needed), and the subgraph gets a runtime input for it after
// its explicit ones. Sibling subgraphs (the two branches of a cond) share one list of lifted
// values, so they take the same inputs. A sub-trace writes in place only tensors it made: a
// write into anything from outside would be a side effect of a branch or a loop step.
//
// Note [Data-dependent reads]
// Every tracer is the thread's ValueReader while it lives, so that reading values into C++
// (item(), to_vector()) during a trace never reads stale or missing data. A concrete tensor
// whose storage the trace has not written reads as usual. By default (strict) a traced tensor
// is an error that points to cond/scan, and so is a captured tensor written in place earlier
// in the trace (its data changes only when the compiled function runs). With guard mode
// (CompileOptions::guard_data_reads) the top-level tracer computes the value instead: compile's
// evaluator runs the part of the graph so far that the value needs on the traced call's data,
// and the value is recorded as a ValueGuard. The compiled function then runs the guards' part
// of the graph first, checks each value, and only then the rest (which writes captured tensors
// and the RNG state): a changed value retraces, with nothing written.
#pragma once

#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/dispatch.h"
#include "eager/autograd.h"
#include "trace/ir/graph.h"

namespace duet::detail {

/// A C++ flag a trace read, such as a module's training flag: a compiled entry keeps `owner`
/// alive and matches a call only while *flag is still `value` (Note [Flags a trace read] in
/// trace/compile.cpp).
struct FlagGuard {
  std::shared_ptr<const void> owner;
  const bool* flag;
  bool value;
  std::string what;  ///< "module Dropout(p=0.5)'s training flag"
};

/// While a trace runs on this thread, notes that it read *flag (which `owner` keeps alive), so
/// that a compiled function traces again when the flag changes; `what` names it. Nothing
/// otherwise.
void guard_flag(std::shared_ptr<const void> owner, const bool* flag,
                const std::function<std::string()>& what);

/// A value read into C++ in guard mode (Note [Data-dependent reads]).
struct ValueGuard {
  int32_t value;    ///< in the top-level graph
  Tensor expected;  ///< its data at the traced call (contiguous, CPU)
  std::string why;  ///< "item() at f.cpp:12 read 1"
};
/// A value read in guard mode, as messages show it: "true", "3", or "the values of a tensor of
/// shape (2, 3)".
std::string show_value(const Tensor& value);
/// Computes a value of the graph traced so far on the traced call's data.
using ValueEvaluator = std::function<Tensor(const Graph&, int32_t)>;

class Tracer final : public DispatchMode, public ValueReader {
 public:
  /// `label` names the traced function in errors and in the graph ("compile() at f.cpp:12").
  explicit Tracer(std::string label);
  /// The values a sub-trace reads from outside (Note [Sub-traces]); shared by siblings.
  struct Lifts {
    int32_t first_slot = 0;       ///< runtime slot of the first lifted value
    std::vector<Tensor> tensors;  ///< the tensors read, as the parent sees them
    std::vector<int32_t> outer;   ///< their values in the parent's graph
  };
  /// A tracer for one subgraph of a construct that `parent` is tracing.
  Tracer(std::string label, Tracer* parent, Lifts* lifts);
  /// Marks the trace dead: its traced tensors raise an error naming `label` if used later.
  ~Tracer() override;
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// A traced graph input standing for `like` (same shape, dtype, strides, requires_grad);
  /// `sym` gives its dims as SymInts when some are symbolic (Note [Symbolic dims]).
  Tensor input(InputRole role, const Tensor& like, std::string name = {}, SymDims sym = {});
  /// A traced graph input of the given metadata (contiguous).
  Tensor input(InputRole role, const TensorMeta& meta, bool requires_grad, std::string name = {});

  /// The graph value a tensor stands for, capturing a concrete tensor if needed.
  int32_t value_of(const Tensor& t);
  /// Gives the value of a traced tensor a name (duet::name).
  void set_name(const Tensor& t, const std::string& name);

  Tensor handle(const OpCall& call) override;
  /// Note [Data-dependent reads]: t itself, its computed value (guard mode), or an error.
  Tensor read(const Tensor& t, const char* what, const char* file, unsigned line) override;
  /// Turns guard mode on for this (top-level) trace.
  void guard_reads(ValueEvaluator evaluate) { evaluate_ = std::move(evaluate); }
  /// The values read in guard mode, in order.
  const std::vector<ValueGuard>& value_guards() const { return value_guards_; }

  /// Records a Control node reading `inputs` (Note [Control flow nodes]) and its Project nodes;
  /// returns one traced tensor per result.
  std::vector<Tensor> control(std::shared_ptr<const ControlFlow> cf,
                              const std::vector<Tensor>& inputs);
  /// The tracer of the enclosing construct, or null for a top-level trace.
  Tracer* parent() const { return parent_; }
  /// The top-level tracer of this one's constructs (this one at top level).
  Tracer* top() {
    Tracer* t = this;
    while (t->parent_) t = t->parent_;
    return t;
  }
  /// guard_flag on this trace: notes *flag, once, on the top-level tracer.
  void note_flag(std::shared_ptr<const void> owner, const bool* flag,
                 const std::function<std::string()>& what);
  /// Lets this sub-trace write in place into concrete tensors from outside (the generator's
  /// state): a write-back of its graph, which vmap applies once, in order (Note [vmap]). The
  /// bodies of cond, scan and while_loop may not: a write there would be a side effect of a
  /// branch or of a loop step.
  void allow_outside_writes() { outside_writes_ = true; }
  /// duet::probe under this trace: `t` pinned as an extra result named `name`.
  void add_probe(std::string name, const Tensor& t);
  /// The probes, in the order they were made.
  const std::vector<std::pair<std::string, Tensor>>& probes() const { return probes_; }

  /// Closes the graph: outputs are resolved and write-backs of written captured tensors added.
  void finish(const std::vector<Tensor>& outputs);
  /// The flags the trace read (guard_flag), each once; a top-level trace's.
  const std::vector<FlagGuard>& flags() const { return flags_; }
  /// Whether an op read an argument (or a view of one), or the function returned one, after a
  /// captured tensor was written in place (Note [Arguments that share memory with written
  /// captures] in trace/compile.cpp). A top-level trace's; sub-traces report to it.
  bool reads_arguments_after_writes() const { return args_after_writes_; }

  Graph& graph() { return graph_; }
  const TraceTag* tag() const { return tag_.get(); }
  /// The innermost tracer on this thread, or null.
  static Tracer* current();

 private:
  struct Layout {
    int64_t offset;
    Shape shape;
    Strides strides;
    DType dtype;
    bool operator==(const Layout& o) const {
      return offset == o.offset && shape == o.shape && strides == o.strides && dtype == o.dtype;
    }
  };
  static Layout layout_of(const TensorImpl* x);
  /// The value, layout and captured target (or -1) of a written storage.
  struct Written {
    Layout layout;
    int32_t value;
    int32_t captured = -1;
  };
  Tensor traced(int32_t value, const TensorMeta& meta, bool requires_grad);
  int32_t capture(const Tensor& t);
  int32_t lift(const Tensor& t);
  bool owns_storage(const StorageImpl* st) const;
  bool is_ancestor_tag(const TraceTag* tag) const;
  /// The call's output metadata with its symbolic dims (Note [Symbolic dims]).
  TensorMeta symbolic_meta(const OpDef& def, const OpCall& c);
  int32_t add_op(OpId op, const Attrs& attrs, std::vector<int32_t> inputs, const TensorMeta& m);
  int32_t scope_index();
  [[noreturn]] void throw_stale_view(const char* what, const TensorImpl* x, const Layout& written);

  Graph graph_;
  IntrusivePtr<TraceTag> tag_;
  uint64_t edges_at_start_ = backward_edges();  ///< GraphNode::phase counts from here
  /// Grad mode where the trace started: an op traced with it off when it was on is
  /// GraphNode::no_grad (the function turned it off: NoGradGuard, a detach).
  bool grad_at_start_ = detail::grad_mode();
  Tracer* prev_;
  Tracer* parent_ = nullptr;        ///< sub-traces: the enclosing construct's tracer
  bool outside_writes_ = false;     ///< allow_outside_writes()
  bool captured_written_ = false;   ///< top level: a captured tensor was written in place
  bool args_after_writes_ = false;  ///< top level: reads_arguments_after_writes()
  std::vector<FlagGuard> flags_;    ///< top level: flags()
  /// Notes, on the top-level tracer, a read of t (value_of) after a captured tensor was
  /// written.
  void note_read(const Tensor& t);
  Lifts* lifts_ = nullptr;
  std::unordered_map<size_t, int32_t> lifted_;  ///< position in lifts_ -> this graph's input
  std::unordered_map<const StorageImpl*, Written> written_;
  std::vector<StoragePtr> symbolic_storages_;       ///< held so that their addresses stay unique
  std::vector<const StorageImpl*> input_storages_;  ///< of arguments and placeholders
  /// Captured tensors by (storage, layout) and identity: the same tensor read twice is one
  /// input, and an alias of it (w.detach()) is another. Gradients flow to the tensor read, and
  /// the guard watches the requires_grad flag of each; one input for both would stand for
  /// whichever was read first.
  std::map<std::tuple<const StorageImpl*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int,
                      const TensorImpl*>,
           int32_t>
      captured_;
  std::string last_scope_;
  int32_t last_scope_index_ = -1;
  std::vector<std::pair<std::string, Tensor>> probes_;
  int32_t last_print_ = -1;  ///< the latest Print node (its token orders the next one)
  ValueEvaluator evaluate_;
  std::vector<ValueGuard> value_guards_;
  ValueReaderGuard reader_{this};
};

}  // namespace duet::detail
