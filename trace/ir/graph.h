// duet: the graph IR of the compiled face (docs/design.md, "Graph IR").
//
// Note [Graph IR]
// SSA: every op in core/ops.def has one output, so a value is named by the node that makes it
// (%3 is node 3's result). Nodes are kept in topological order. A node is an op call (op,
// attributes, input values, output metadata), a constant (a C++ number the traced code used),
// or a graph input: an argument of the compiled function, a tensor it captured (read by
// reference at every run), a placeholder, or, in split graphs, a gradient or a saved value.
// The graph's outputs are the results, and write-backs: the new values of captured tensors
// that the code updated in place, which the executor writes into their storage.
// Every node keeps its provenance: the name scope active when it was recorded (duet::scope)
// and, for errors, the compiled function it belongs to.
//
// Note [Control flow nodes]
// cond, scan and while_loop (trace/control_flow.h) are Control nodes: their functions are
// subgraphs held in a ControlFlow, and their results a tuple that Project nodes take apart
// (%7 = project %6 [1]), so that every other value keeps one tensor. A Control node's inputs
// are the construct's operands followed by the values its functions read from outside
// (lifted free values: outer values, captured tensors), in the order of the subgraphs' runtime
// inputs:
//   cond:       pred, operands..., free...      branches: operands..., free... -> results
//   scan:       carry..., xs..., free...        body: carry..., x_t..., free... -> carry..., y_t...
//                                               results: carry..., ys stacked along dim 0...
//   while_loop: state..., free...               cond_fn: state..., free... -> b8 one element
//                                               body:    state..., free... -> state...
// Subgraphs have no captured tensors and no write-backs of their own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/call_site.h"
#include "core/op_table.h"

namespace duet {

enum class NodeKind : uint8_t { Input, Constant, Op, Control, Project };

enum class ControlKind : uint8_t { Cond, Scan, WhileLoop };

struct ControlFlow;

/// What a graph input stands for.
enum class InputRole : uint8_t {
  Argument,     ///< a tensor argument of the compiled function
  Captured,     ///< a tensor the function read but did not create (parameters, .grad, RNG)
  Placeholder,  ///< a Program's placeholder
  GradOutput,   ///< the gradient of an output (backward graphs)
  Saved,        ///< a value the forward graph saved for the backward graph
};

struct GraphNode {
  NodeKind kind = NodeKind::Op;
  OpId op{};                    ///< Op nodes
  Attrs attrs;                  ///< Op nodes
  std::vector<int32_t> inputs;  ///< Op nodes: the values they read
  TensorMeta meta;              ///< the value's shape, dtype and device
  InputRole role{};             ///< Input nodes
  /// Input nodes: captured tensors index Graph::captured; other roles index the runtime inputs.
  int32_t index = -1;
  Tensor constant;     ///< Constant nodes: the value
  std::string name;    ///< placeholder name, or a name given by duet::name()
  int32_t scope = -1;  ///< index into Graph::scopes; -1: no scope
  CallSite site;       ///< the user's line that made it (Note [Call sites] in core/call_site.h)
  /// Which phase of the traced code recorded it: 0 before the first backward, then one more at
  /// each start and each end of a backward. Odd phases are backwards (gradient rules, a
  /// checkpoint's recomputation); a value made in phase p and read in p + 1 is an activation
  /// saved for the backward, which fusion does not join to its readers there (Note [Fusion
  /// rules]) and the memory report counts as saved.
  uint16_t phase = 0;
  /// Op nodes recorded with grad mode off (under NoGradGuard, or a detach): vmap's replay runs
  /// them so, and gradients stop there as they did where the function was traced (Note [vmap]).
  bool no_grad = false;
  /// Control nodes: the construct (shared and immutable: passes make a new one to change it).
  /// Project nodes read result `index` of the Control node inputs[0].
  std::shared_ptr<const ControlFlow> control;
};

/// What the remat pass recomputed (Note [Rematerialization] in trace/ir/remat.cpp).
struct RematRecord {
  int64_t values = 0;  ///< saved values the backward computes again instead
  int64_t bytes = 0;   ///< their bytes
  double flops = 0;    ///< the work of computing them again (one per element of elementwise ops)
  /// The ops recomputed to meet CompileOptions::memory_budget, in words.
  std::vector<std::string> forced;
};

/// A captured tensor updated in place: after a run, value is written into captured[target].
struct WriteBack {
  int32_t value;
  int32_t target;
};

class Graph {
 public:
  std::vector<GraphNode> nodes;  ///< topological order; value i is nodes[i]'s result
  std::vector<int32_t> outputs;  ///< result values, in order
  std::vector<WriteBack> writebacks;
  std::vector<Tensor> captured;     ///< the tensors captured by reference (held)
  std::vector<std::string> scopes;  ///< scope paths ("encoder/layer1")
  int32_t num_runtime_inputs = 0;   ///< inputs given at each run (all but captured)
  std::string label;                ///< the compiled function or Program, for messages
  RematRecord remat;                ///< what the remat pass recomputed

  /// The number of op nodes (inputs and constants are not counted).
  int64_t num_nodes() const;
  /// Readable text: one line per node, then the outputs and write-backs.
  std::string str() const;
  /// A Graphviz picture of the graph.
  std::string dot() const;
  /// Checks the invariants (topological order, metadata of every op against its shape rule,
  /// inputs and outputs in range); throws InternalError naming the node.
  void verify() const;

  /// Appends a node and returns its value.
  int32_t add(GraphNode n);
  /// The scalar value of a constant or a Full node with one value for all elements (not one
  /// whose value depends on symbolic sizes).
  bool scalar_value(int32_t v, double* out) const;
};

/// A structured control-flow construct (Note [Control flow nodes]).
struct ControlFlow {
  ControlKind kind = ControlKind::Cond;
  /// cond: {true branch, false branch}; scan: {body}; while_loop: {cond_fn, body}.
  std::vector<Graph> graphs;
  int32_t num_carry = 0;  ///< scan: carries; while_loop: state values
  int32_t num_xs = 0;     ///< scan: the tensors scanned along dim 0
  bool reverse = false;   ///< scan: steps run from the last index to the first (backward scans)
  std::vector<TensorMeta> results;  ///< the tuple's metadata
  /// The construct's name ("cond", "scan", "while_loop").
  const char* name() const;
  /// How many inputs of the Control node come before the subgraphs' inputs (cond: the pred).
  int32_t num_leading() const { return kind == ControlKind::Cond ? 1 : 0; }
};

/// Text of one node's attributes ("dims=[0, 1] keepdim"), shared by str() and dot().
std::string attrs_str(OpId op, const Attrs& a);

/// A name scope for the nodes recorded while it lives (RAII): `auto s = duet::scope("enc");`.
/// Scopes nest ("enc/layer1"). Outside a trace it does nothing.
class [[nodiscard]] Scope {
 public:
  explicit Scope(std::string name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};
Scope scope(std::string name);

namespace detail {
/// Same shape, dtype and device.
inline bool same_meta(const TensorMeta& a, const TensorMeta& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.device == b.device;
}
/// Whether phase q is the backward of forward phase p (a node of q reading a value of p reads a
/// saved activation).
inline bool backward_of(uint16_t p, uint16_t q) { return p % 2 == 0 && q == p + 1; }
/// Whether g records a backward (a node of an odd phase): a training step's graph.
inline bool has_backward_phase(const Graph& g) {
  for (const GraphNode& n : g.nodes)
    if (n.phase % 2) return true;
  return false;
}
/// Whether a node is a view op (its value lives in its input's buffer).
inline bool is_view_node(const GraphNode& n) {
  return n.kind == NodeKind::Op && op_class(n.op) == OpClass::View;
}
/// The value whose buffer v lives in: v itself, or the root of its chain of views.
inline int32_t buffer_root(const Graph& g, int32_t v) {
  while (is_view_node(g.nodes[v])) v = g.nodes[v].inputs[0];
  return v;
}
/// Whether a node has an effect beyond its value (a Print, a collective, or a construct whose
/// functions hold one): the passes keep it though nothing reads it, never merge it, never fold
/// it, never hoist it.
bool has_effect(const GraphNode& n);
/// One line of Graph::str(): "%7 = mul(%5, %6) : f32 (4, 8)  @mlp  at model.cpp:12".
std::string node_str(const Graph& g, int32_t v);
/// The current scope path of this thread ("" outside any scope).
const std::string& current_scope();
/// A tensor with metadata and no data, for running shape rules (never a kernel) on it.
Tensor make_meta_tensor(const TensorMeta& m);
}  // namespace detail

}  // namespace duet
