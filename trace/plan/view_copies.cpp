// duet: explicit copies for the views that no strides express, before a plan is built.
//
// Note [Copies for views no strides express]
// A reshape of a permuted value (attention's heads merged back into rows) has no strides over
// its input's buffer, so a view step that met one copied its input at run time, into memory
// outside the plan's arena: the memory plan neither counted those copies nor reused their
// bytes, and a copy saved for the backward lived as long as the plan's activations (W8's
// training step held ten of them, 1.25 MiB a sample, beside a plan of 3.5 MiB a sample). Before
// a plan is built, the layouts of the values in buffers the plan makes (an op's result is dense)
// are followed through their views with metadata alone. A view that no strides express reads an
// explicit copy of its input instead (a Copy node, as contiguous() records eagerly), made just
// before it, with its phase, scope and call site: a step like any other, whose buffer the memory
// plan places and frees after its last reader, and which fusion may join to its producer. Views
// of runtime inputs, whose strides are the caller's, still copy at run time when they must.
//
// The plans of one graph at other sizes (Note [Fusion across sizes] in plan_build.cpp) share its
// fusion groups by node, so they must have the same nodes: the first plan records which views
// read a copy in the FusionShare, and the others copy at the same views (a copy where a view
// would do is exact, only slower), whatever their own sizes allow.
#include "core/op_table.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {

Graph copy_unviewable_views(const Graph& g, FusionShare* share) {
  const auto n = static_cast<int32_t>(g.nodes.size());
  std::vector<int32_t> copied;  // the views that read a copy, by node
  bool decided = false;
  if (share) {
    std::lock_guard<std::mutex> lock(share->mu);
    if (share->copies_found) {
      copied = share->copied_views;
      decided = true;
    }
  }
  if (!decided) {
    // Layouts (metadata-only tensors) of values in buffers the plan makes, and their views.
    std::vector<Tensor> layout(n);
    for (int32_t i = 0; i < n; ++i) {
      const GraphNode& node = g.nodes[i];
      if (node.kind != NodeKind::Op) continue;
      if (!is_view_node(node)) {
        layout[i] = make_meta_tensor(node.meta);
        continue;
      }
      const Tensor& base = layout[node.inputs[0]];
      if (!base.defined()) continue;
      layout[i] = op_def(node.op).view(base, node.attrs, node.meta);
      if (layout[i].defined()) continue;
      copied.push_back(i);
      layout[i] = op_def(node.op).view(make_meta_tensor(g.nodes[node.inputs[0]].meta), node.attrs,
                                       node.meta);
    }
    if (share) {
      std::lock_guard<std::mutex> lock(share->mu);
      if (!share->copies_found) {
        share->copied_views = copied;
        share->copies_found = true;
      } else {
        copied = share->copied_views;  // another size's plan decided first
      }
    }
  }
  if (copied.empty()) return g;
  Graph out = g;
  out.nodes.clear();
  std::vector<int32_t> map(n, -1);
  size_t next = 0;
  for (int32_t i = 0; i < n; ++i) {
    GraphNode node = g.nodes[i];
    for (int32_t& in : node.inputs) in = map[in];
    if (next < copied.size() && copied[next] == i) {
      ++next;
      GraphNode copy;
      copy.kind = NodeKind::Op;
      copy.op = OpId::Copy;
      copy.inputs = {node.inputs[0]};
      copy.meta = g.nodes[g.nodes[i].inputs[0]].meta;
      copy.scope = node.scope;
      copy.site = node.site;
      copy.phase = node.phase;
      node.inputs[0] = out.add(std::move(copy));
    }
    map[i] = out.add(std::move(node));
  }
  for (int32_t& o : out.outputs) o = map[o];
  for (WriteBack& w : out.writebacks) w.value = map[w.value];
  return out;
}

}  // namespace duet::detail
