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
// plan places and frees after its last reader. Views of runtime inputs, whose strides are the
// caller's, still copy at run time when they must.
//
// When the view's input is a chain of views of a one-input elementwise op that nothing else
// reads (attention's result cast to bf16 under autocast, then permuted), the op itself is
// computed on the same chain of views of its own input instead: its result is then dense in the
// order the view reads it, and one pass does what a cast and a copy did. An elementwise op
// gives the same value at each element whatever the layout it reads, so results are the same,
// bit for bit. Several such views of one value (a linear layer's weight and bias gradients both
// reshape the permuted gradient of attention's heads, as rows and as (batch, seq, width)) read
// one copy, or one moved op, made before the first of them.
//
// The plans of one graph at other sizes (Note [Fusion across sizes] in plan_build.cpp) share its
// fusion groups by node, so they must have the same nodes: the first plan records its decisions
// in the FusionShare, and the others follow them (a copy where a view would do is exact, only
// slower), whatever their own sizes allow.
#include <algorithm>

#include "core/op_table.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {
namespace {

// The views of g that no strides express, and what each reads instead. Views of one value that
// all need a copy (the weight's and the bias's gradients of a linear layer both reshape the
// permuted gradient of attention's heads) read one copy, or one moved op.
std::vector<ViewFix> find_view_fixes(const Graph& g) {
  const auto n = static_cast<int32_t>(g.nodes.size());
  std::vector<int32_t> readers(n, 0);
  for (const GraphNode& node : g.nodes)
    for (int32_t in : node.inputs) ++readers[in];
  for (int32_t o : g.outputs) readers[o] += 2;  // a result is read outside the plan
  for (const WriteBack& w : g.writebacks) readers[w.value] += 2;
  // Layouts (metadata-only tensors) of values in buffers the plan makes, and of their views.
  std::vector<Tensor> layout(n);
  std::vector<int32_t> unviewable;        // the views no strides express, in order
  std::vector<int32_t> fixed_readers(n);  // per value: how many of those read it
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& node = g.nodes[i];
    if (node.kind != NodeKind::Op) continue;
    const OpDef& def = op_def(node.op);
    if (!is_view_node(node)) {
      layout[i] = make_meta_tensor(node.meta);
      continue;
    }
    const Tensor& base = layout[node.inputs[0]];
    if (!base.defined()) continue;
    layout[i] = def.view(base, node.attrs, node.meta);
    if (layout[i].defined()) continue;
    layout[i] = def.view(make_meta_tensor(g.nodes[node.inputs[0]].meta), node.attrs, node.meta);
    unviewable.push_back(i);
    ++fixed_readers[node.inputs[0]];
  }
  std::vector<ViewFix> fixes;
  std::vector<int32_t> first_fix(n, -1);  // per value read: the fix of its first such view
  for (int32_t i : unviewable) {
    const int32_t x0 = g.nodes[i].inputs[0];
    if (first_fix[x0] >= 0) {  // reads what the first view of x0 reads
      ViewFix shared = fixes[static_cast<size_t>(first_fix[x0])];
      shared.view = i;
      fixes.push_back(std::move(shared));
      continue;
    }
    first_fix[x0] = static_cast<int32_t>(fixes.size());
    ViewFix fix;
    fix.view = i;
    // The chain of views down to the op that made their buffer: the first read only by the
    // views fixed here, the others once.
    std::vector<int32_t> chain;
    int32_t x = x0;
    while (is_view_node(g.nodes[x]) && readers[x] == (chain.empty() ? fixed_readers[x] : 1)) {
      chain.push_back(x);
      x = g.nodes[x].inputs[0];
    }
    const GraphNode& c = g.nodes[x];
    if (!chain.empty() && !is_view_node(c) && c.kind == NodeKind::Op && readers[x] == 1 &&
        c.inputs.size() == 1 && op_class(c.op) == OpClass::Elementwise && !has_effect(c) &&
        c.op != OpId::Random && layout[c.inputs[0]].defined()) {
      std::reverse(chain.begin(), chain.end());
      Tensor t = layout[c.inputs[0]];
      for (size_t k = 0; k < chain.size() && t.defined(); ++k) {
        const GraphNode& w = g.nodes[chain[k]];
        t = op_def(w.op).view(t, w.attrs, w.meta);
      }
      if (t.defined()) {
        fix.op = x;
        fix.chain = std::move(chain);
      }
    }
    fixes.push_back(std::move(fix));
  }
  return fixes;
}

}  // namespace

Graph copy_unviewable_views(Graph g, FusionShare* share) {
  std::vector<ViewFix> fixes;
  bool decided = false;
  if (share) {
    std::lock_guard<std::mutex> lock(share->mu);
    if (share->copies_found) {
      fixes = share->view_fixes;
      decided = true;
    }
  }
  if (!decided) {
    fixes = find_view_fixes(g);
    if (share) {
      std::lock_guard<std::mutex> lock(share->mu);
      if (!share->copies_found) {
        share->view_fixes = fixes;
        share->copies_found = true;
      } else {
        fixes = share->view_fixes;  // another size's plan decided first
      }
    }
  }
  if (fixes.empty()) return g;
  // The nodes move out; the rest of the graph (captured tensors, outputs) stays in g.
  const std::vector<GraphNode> old = std::move(g.nodes);
  g.nodes.clear();
  const auto n = static_cast<int32_t>(old.size());
  // The op and views a moved op replaces are dropped: the view was their only reader.
  std::vector<bool> dropped(n, false);
  for (const ViewFix& f : fixes)
    if (f.op >= 0) {
      dropped[f.op] = true;
      for (int32_t w : f.chain) dropped[w] = true;
    }
  Graph& out = g;
  std::vector<int32_t> map(n, -1);
  std::vector<int32_t> replaced(n, -1);  // per value read by fixed views: the copy they read
  size_t next = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    GraphNode node = old[i];
    for (int32_t& in : node.inputs) in = map[in];
    if (next < fixes.size() && fixes[next].view == i) {
      const ViewFix& f = fixes[next++];
      const int32_t x0 = old[i].inputs[0];
      if (replaced[x0] >= 0) {
        node.inputs[0] = replaced[x0];
      } else if (f.op < 0) {
        GraphNode copy;
        copy.kind = NodeKind::Op;
        copy.op = OpId::Copy;
        copy.inputs = {node.inputs[0]};
        copy.meta = old[old[i].inputs[0]].meta;
        copy.scope = node.scope;
        copy.site = node.site;
        copy.phase = node.phase;
        node.inputs[0] = replaced[x0] = out.add(std::move(copy));
      } else {
        const GraphNode& c = old[f.op];
        const DType in_dtype = old[c.inputs[0]].meta.dtype;
        int32_t cur = map[c.inputs[0]];
        for (int32_t w : f.chain) {
          GraphNode v = old[w];
          for (size_t k = 1; k < v.inputs.size(); ++k) v.inputs[k] = map[v.inputs[k]];
          v.inputs[0] = cur;
          v.meta.dtype = in_dtype;
          cur = out.add(std::move(v));
        }
        GraphNode moved = c;
        moved.inputs = {cur};
        moved.meta = old[f.chain.back()].meta;
        moved.meta.dtype = c.meta.dtype;
        node.inputs[0] = replaced[x0] = out.add(std::move(moved));
      }
    }
    map[i] = out.add(std::move(node));
  }
  for (int32_t& o : out.outputs) o = map[o];
  for (WriteBack& w : out.writebacks) w.value = map[w.value];
  return std::move(out);
}

}  // namespace duet::detail
