// duet: the autograd tape. One Node per recorded op call: the op's gradient rule, its
// attributes, edges to its inputs' history, and the values the rule saved.
//
// Note [Saved tensors]
// A node saves inputs as handles (so with create_graph a rule's ops connect to their history)
// and its output as an alias over the same storage without autograd state (a handle to the
// output itself would make a cycle: output -> grad_fn -> output). Each saved value records its
// storage version, checked at backward time: a rule reading a saved input that was written in
// place after it was saved throws, naming the op (SavedInputs), and so does unpacking a saved
// output; a rule that does not read the stale input still runs (y.mul_(2) needs only the 2).
// In-place ops save an alias of the overwritten tensor with its old autograd identity
// (autograd_alias); so do ops that read the target of an in-place op computed out of place
// (call_inplace), since a handle to the target would make a cycle once it gets its new grad_fn.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/dispatch.h"

namespace duet::detail {

/// What refills the saved values that a checkpoint dropped from the nodes of its region (Note
/// [Checkpoint] in eager/checkpoint.cpp): run() reruns the region, once, when the backward first
/// reaches one of them, with the gradient that reached it.
struct Recompute {
  virtual ~Recompute() = default;
  virtual void run(const Tensor& grad) = 0;
};

struct SavedTensor {
  Tensor value;
  uint32_t version = 0;
};

/// Where the gradient of one input goes.
struct InputEdge {
  std::shared_ptr<Node> fn;  ///< the node that produced the input (non-leaf)
  TensorImplPtr leaf;        ///< the leaf that requires grad, whose .grad accumulates
  TensorMeta meta;           ///< the input's shape, dtype and device
  bool needs = false;        ///< the input requires grad
};

/// What keeps a node's saved values past a backward that does not retain the graph, while
/// keep() says so: the nodes of an Autobatch run whose batches results not yet reached still
/// read (Note [Batches shared by losses] in eager/autobatch_reach.cpp).
struct Keeper {
  virtual ~Keeper() = default;
  virtual bool keep() = 0;
};

/// The tape nodes of the results of one traced construct (a scan's carries and stacked
/// results), and a rule that takes the gradients of several of them at once (Note [Results of
/// one construct] in eager/engine.cpp).
struct NodeGroup {
  /// The members, by result index (expired or null where a result has no node).
  std::vector<std::weak_ptr<Node>> members;
  /// Arguments: each member's gradient (undefined: none), needs[i] per input, and the input
  /// gradients to fill; the members' inputs are the same, in the same order.
  std::function<void(const std::vector<Tensor>& grads, const bool* needs, Tensor* grad_in)> rule;
};

struct Node : std::enable_shared_from_this<Node> {
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Releases the history behind the node without recursion (Note [Releasing deep tapes]).
  ~Node();
  const OpDef* def = nullptr;
  Attrs attrs;
  std::vector<InputEdge> inputs;
  std::vector<SavedTensor> saved;  ///< one per input (value undefined when not saved)
  SavedTensor saved_output;
  TensorMeta output_meta;
  uint64_t sequence = 0;  ///< creation order: later nodes run first in backward
  /// The backward that reached this node last, and the node's record in it (Note [Backward
  /// bookkeeping] in eager/engine.cpp); only a backward that starts while none runs uses them.
  uint64_t walk = 0;
  int32_t walk_slot = -1;
  bool released = false;  ///< saved tensors freed by a backward without retain_graph
  /// Set for a call of a compiled function (trace/compile.cpp): runs its compiled backward
  /// instead of def->grad. Arguments: the output's gradient, needs[i] per input, and the
  /// input gradients to fill. Freed with the saved tensors.
  std::function<void(const Tensor& grad, const bool* needs, Tensor* grad_in)> backward_fn;
  /// The backward_fn is written in duet ops and may run with create_graph (control flow); a
  /// compiled call's backward is a plan, which is not.
  bool backward_fn_differentiable = false;
  /// A view op's node whose output shares its input's storage (reshape that had to copy does
  /// not): when the input's history is superseded by an in-place write, the view's history is
  /// regenerated (Note [Views of written tensors]).
  bool view_of_input = false;
  /// Between autograd_prepare and autograd_finish of a view op: its input's storage, compared
  /// with the output's to set view_of_input. Never dereferenced.
  const void* view_source = nullptr;
  /// Set when the tensor whose grad_fn this node is gets written in place: the node that
  /// replaced this one as its history (weak: the new node points back at this one).
  std::weak_ptr<Node> superseded_by;
  /// Set on a node of a checkpointed region that gave up saved values: the backward runs it
  /// before the node's rule, which refills them.
  std::shared_ptr<Recompute> recompute;
  /// Set on the nodes of an Autobatch run (node_keeper()): asked before the node's saved values
  /// are freed.
  std::shared_ptr<Keeper> keeper;
  /// Set on the result nodes of a traced construct: the group and this node's index in it.
  std::shared_ptr<NodeGroup> group;
  int32_t group_index = -1;
};

/// A new tape node, from the thread's cache of freed ones (Note [Tensor object cache]).
inline std::shared_ptr<Node> make_node() {
  return std::allocate_shared<Node>(CachedObjectAllocator<Node, 3>());
}

/// The next creation number of a tape node (later nodes run first in backward).
uint64_t next_sequence();
/// The OpDef of a tape node that runs a backward_fn instead of a rule (a compiled call, a
/// while_loop), for the engine's messages: the name, and no rule or kernel.
inline OpDef opaque_node_def(const char* name) {
  OpDef d{};
  d.id = OpId::Copy;
  d.name = name;
  d.arity = -1;
  d.cls = OpClass::Opaque;
  d.doc = "";
  return d;
}
/// While not null, each tape node that autograd_prepare makes on this thread is appended to
/// the list (a checkpoint collects the nodes of its region).
std::vector<std::weak_ptr<Node>>*& checkpoint_nodes();
/// While not null, each tape node that autograd_prepare makes on this thread gets it as its
/// keeper (an Autobatch run's).
std::shared_ptr<Keeper>*& node_keeper();
/// Fills the edge along which an input's gradient flows: to its grad_fn, or to it as a leaf.
void set_input_edge(InputEdge& e, const Tensor& t);
/// t's grad_fn (t must have one), regenerated first when t is a view whose base was written in
/// place since (Note [Views of written tensors] in eager/record.cpp).
const std::shared_ptr<Node>& current_grad_fn(TensorImpl* t);
/// Autograd's recording, called from dispatch through core's hook table (Note [Autograd
/// hooks] in core/autograd_hooks.h): prepare() makes the tape node of a call (edges to the
/// inputs' history, saved inputs and their versions); finish() attaches it to the output.
/// In-place calls pass the tensor they overwrite as `inplace_self`; record() is both halves of
/// an out-of-place call.
std::shared_ptr<Node> autograd_prepare(const OpDef& def, TensorRefs inputs, const Attrs& attrs,
                                       const Tensor* inplace_self);
void autograd_finish(std::shared_ptr<Node> node, const Tensor& out);
void autograd_record(const OpDef& def, TensorRefs inputs, const Attrs& attrs, const Tensor& out);
/// An alias of t over the same storage with t's current autograd identity (requires_grad,
/// grad_fn) but a TensorImpl of its own: how a node saves the target of an in-place op.
Tensor autograd_alias(const Tensor& t);

}  // namespace duet::detail
