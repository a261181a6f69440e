// duet: elementwise fusion (the "fuse" pass). Finds groups of elementwise ops over one iteration
// shape, chains and DAGs with broadcast inputs, optionally ending in a reduction over the
// trailing or the leading dims (sum(x*y), the pieces of softmax and cross_entropy), and turns
// each into a kernels::FusedProgram. The graph itself keeps its primitive nodes (debugging
// tools, save/load and export see ops, not kernels): fusion is part of the plan.
//
// Note [Fusion rules]
// An op joins a group when it is elementwise and fusable (kernels::fusable_op), on the group's
// device (the CPU, or CUDA: cuda/fused.h; one-element constants may live on the CPU), of
// the group's shape, computing in the group's dtype T (f32 or f64; b8 values ride along as 0/1),
// and when none of its other inputs depends on the group (which would make a cycle). It looks
// for a group among its producers first, then among the groups that read the same inputs
// (siblings, as tanh(x) and sigmoid(x) in W2), but not through a captured tensor: a parameter's
// readers are far apart (forward, gradient, optimizer), and a sibling group would keep the
// optimizer's values live from the forward on; nor through a constant; a node that reads two groups
// merges them when that makes no cycle. A group never holds nodes of a forward phase and of its
// backward (GraphNode::phase): a backward op joined to the forward op that makes its input would
// run in the forward, and its result (relu's mask for its gradient) would live until the backward,
// as an activation of its own. A reduction whose input is in a group closes it. A cast to b8 of a
// value of another dtype stays out (its rounding differs from the eager cast). eq and ne of
// integers join an f32 group where one operand holds integers f32 represents exactly (Note
// [Integer equality in registers]). Groups of one op are dissolved: the eager kernel runs them.
#pragma once

#include <vector>

#include "kernels/fused.h"
#include "trace/ir/graph.h"

namespace duet::detail {

struct FusionGroup {
  std::vector<int32_t> members;  ///< op values, topological order (the reduction, if any, last)
  std::vector<int32_t> inputs;   ///< external values, in register order
  std::vector<int32_t> outputs;  ///< members stored for later steps, in output order
  int32_t reduction = -1;        ///< the reduction's value (written to red_out), or -1
  int32_t reduce_dims = 0;       ///< how many dims the reduction folds (trailing or leading)
  Shape shape;                   ///< the iteration shape
  kernels::FusedProgram program;
};

/// The fusion groups of g (Note [Fusion rules]). A member read outside its group, a result or
/// a write-back is a group output; other members live in registers only.
std::vector<FusionGroup> find_fusion_groups(const Graph& g);

}  // namespace duet::detail
