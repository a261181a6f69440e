// duet: the graph IR of the compiled face (DESIGN.md, "Graph IR").
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
#pragma once

#include <string>
#include <vector>

#include "core/op_table.h"

namespace duet {

enum class NodeKind : uint8_t { Input, Constant, Op };

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
  /// The scalar value of a constant or a Full node with one value for all elements.
  bool scalar_value(int32_t v, double* out) const;
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
/// The current scope path of this thread ("" outside any scope).
const std::string& current_scope();
/// A tensor with metadata and no data, for running shape rules (never a kernel) on it.
Tensor make_meta_tensor(const TensorMeta& m);
}  // namespace detail

}  // namespace duet
