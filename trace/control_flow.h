// duet: structured control flow (docs/design.md, "Control flow"): cond, scan and while_loop.
//
// Note [Control flow]
// One entry point per construct serves both faces. Eagerly, cond runs the chosen branch, scan
// runs its body once per step and stacks the per-step results, and while_loop runs its body
// while its predicate holds; the ops they run are taped as any other, so gradients need no rule
// of their own.
// Traced (inside compile or a Program), each function is traced once into a subgraph (Note
// [Sub-traces] in trace/tracer.h) and the construct becomes one Control node (Note [Control
// flow nodes] in trace/ir/graph.h): both branches of a cond, one step of a scan. Its gradient rule
// is written in these same constructs, so a traced backward is again a graph: the gradient of a
// cond is a cond of the branches' vector-Jacobian products, and the gradient of a scan is a
// reverse scan of its body's, reading the carries that the forward scan stacks for it.
// while_loop is forward only: asking for a gradient through it raises an error that points to
// scan.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace duet {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// Runs true_fn(operands) when the one-element b8 `pred` holds, else false_fn(operands). The two
/// branches return tensors of the same shapes and dtypes.
std::vector<Tensor> cond(const Tensor& pred, Fn true_fn, Fn false_fn, std::vector<Tensor> operands);

/// fn(carry..., x_t...) -> {new_carry..., y_t...}, for t along dim 0 of every xs (all of one
/// length). Returns {final carry..., ys stacked along a new dim 0...}. The carry keeps its
/// shapes and dtypes from step to step.
std::vector<Tensor> scan(Fn fn, std::vector<Tensor> init_carry, std::vector<Tensor> xs);

/// state = init; while cond_fn(state) (one one-element b8 tensor): state = body_fn(state).
/// Returns the final state. Forward only: a gradient through it is an error (use scan).
std::vector<Tensor> while_loop(Fn cond_fn, Fn body_fn, std::vector<Tensor> init);

class Graph;
namespace detail {
/// scan, with the steps run from the last index of xs to the first when `reverse` (the ys are
/// still stacked by index): the backward of a scan.
std::vector<Tensor> scan_impl(const Fn& fn, std::vector<Tensor> init_carry, std::vector<Tensor> xs,
                              bool reverse);
/// Runs a graph's nodes as op calls on `inputs` (by runtime slot): eagerly, taped, or into
/// the current trace. Gradient rules of constructs replay their subgraphs with it, so it skips
/// prints (they printed when the construct ran).
std::vector<Tensor> call_graph(const Graph& g, const std::vector<Tensor>& inputs);
}  // namespace detail

}  // namespace duet
