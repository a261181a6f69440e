// duet: recording op calls on the autograd tape (called from dispatch through core's hook table,
// Note [Autograd hooks] in core/autograd_hooks.h).
//
// Note [Releasing deep tapes]
// A tape is a chain: a tensor holds its grad_fn, a node holds its inputs' nodes and its saved
// tensors, which hold theirs. Freed by the members' destructors, a chain of a million ops
// recurses a million frames deep and overflows the stack (y = y + 1 in a loop, then drop y).
// ~Node therefore moves what it holds (input nodes, saved tensors, the backward closure) onto a
// per-thread list, and the outermost ~Node on the thread empties that list in a loop: each
// destructor it triggers only adds to the list, so the depth stays constant. The backward
// engine is a loop too (eager/engine.cpp), so a backward over a million nodes needs no deep
// stack either.
//
// Note [Views of written tensors]
// v = slice(a) records a node whose input edge is a's history at that time. When a is then
// written in place (a.mul_(5)), a's history is a new node, and v's values are the new ones, so
// a backward through v must go through the write too (PyTorch regenerates a view's grad_fn
// from its base's version). The in-place op marks a's old node as superseded by the new one
// (weakly, so no cycle); when v is next used by autograd (an op records it as an input, or a
// backward starts from it), a view node whose input was superseded is copied with its input
// edge moved to the newest history, recursively through views of views, and becomes v's
// grad_fn. A reshape that had to copy is no view of its input and keeps its history.
#include <atomic>
#include <vector>

#include "eager/autograd.h"
#include "eager/node.h"

namespace duet::detail {
namespace {

std::atomic<uint64_t> g_sequence{0};

// Note [Releasing deep tapes]: what the nodes being destroyed on this thread held.
struct Graveyard {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<Tensor> tensors;
  std::vector<std::function<void(const Tensor&, const bool*, Tensor*)>> closures;
  bool draining = false;
  ~Graveyard();
};
// Trivially destructible, so readable while the thread's other thread_locals are destroyed.
thread_local bool tls_graveyard_gone = false;
thread_local Graveyard tls_graveyard;
Graveyard::~Graveyard() { tls_graveyard_gone = true; }

// The newest history of a view node: unchanged unless its input (or, for a view of a view, its
// input's input) was superseded by an in-place write (Note [Views of written tensors]).
std::shared_ptr<Node> current_view_fn(const std::shared_ptr<Node>& n) {
  if (!n->view_of_input || n->inputs.empty() || !n->inputs[0].fn) return n;
  std::shared_ptr<Node> in = n->inputs[0].fn;
  for (std::shared_ptr<Node> next; (next = in->superseded_by.lock());) in = std::move(next);
  in = current_view_fn(in);
  if (in == n->inputs[0].fn) return n;
  auto c = make_node();
  c->def = n->def;
  c->attrs = n->attrs;
  c->inputs = n->inputs;
  c->inputs[0].fn = std::move(in);
  c->saved.resize(n->saved.size());
  c->output_meta = n->output_meta;
  c->sequence = next_sequence();
  c->view_of_input = true;
  return c;
}

SavedTensor save(const Tensor& t) {
  return {t, t.unsafe_impl()->storage->version_.load(std::memory_order_relaxed)};
}

// An alias over the same storage: no autograd state of its own, unless `identity` gives one.
Tensor alias(const Tensor& t, const TensorImpl* identity) {
  const TensorImpl* x = t.unsafe_impl();
  Tensor a = make_view(t, x->shape, x->strides, x->offset);
  TensorImpl* ai = a.unsafe_impl();
  ai->is_view = false;
  ai->wrapped_number = x->wrapped_number;
  if (identity && identity->requires_grad) {
    ai->requires_grad = true;
    if (identity->autograd && identity->autograd->grad_fn)
      autograd_meta(*ai).grad_fn = identity->autograd->grad_fn;
  }
  return a;
}

}  // namespace

Tensor autograd_alias(const Tensor& t) { return alias(t, t.unsafe_impl()); }

std::vector<std::weak_ptr<Node>>*& checkpoint_nodes() {
  thread_local std::vector<std::weak_ptr<Node>>* nodes = nullptr;
  return nodes;
}

std::shared_ptr<Keeper>*& node_keeper() {
  thread_local std::shared_ptr<Keeper>* keeper = nullptr;
  return keeper;
}

uint64_t next_sequence() { return g_sequence.fetch_add(1, std::memory_order_relaxed); }

Node::~Node() {
  // Nothing that leads further (only leaf edges, nothing saved): the members go as usual.
  bool deeper = saved_output.value.defined() || backward_fn != nullptr;
  for (const InputEdge& e : inputs) deeper |= e.fn != nullptr;
  for (const SavedTensor& s : saved) deeper |= s.value.defined();
  if (!deeper || tls_graveyard_gone) return;  // (at thread exit, too)
  Graveyard& g = tls_graveyard;
  for (InputEdge& e : inputs)
    if (e.fn) g.nodes.push_back(std::move(e.fn));
  for (SavedTensor& s : saved)
    if (s.value.defined()) g.tensors.push_back(std::move(s.value));
  if (saved_output.value.defined()) g.tensors.push_back(std::move(saved_output.value));
  if (backward_fn) g.closures.push_back(std::move(backward_fn));
  if (g.draining) return;
  g.draining = true;
  // Each pop may destroy a node, which adds to the lists and returns: no recursion.
  while (!g.nodes.empty() || !g.tensors.empty() || !g.closures.empty()) {
    if (!g.nodes.empty()) {
      std::shared_ptr<Node> n = std::move(g.nodes.back());
      g.nodes.pop_back();
    } else if (!g.tensors.empty()) {
      Tensor t = std::move(g.tensors.back());
      g.tensors.pop_back();
    } else {
      auto f = std::move(g.closures.back());
      g.closures.pop_back();
    }
  }
  g.draining = false;
}

const std::shared_ptr<Node>& current_grad_fn(TensorImpl* t) {
  std::shared_ptr<Node>& fn = t->autograd->grad_fn;
  if (t->is_view && fn->view_of_input) {
    std::shared_ptr<Node> now = current_view_fn(fn);
    if (now != fn) fn = std::move(now);
  }
  return fn;
}

void set_input_edge(InputEdge& e, const Tensor& t) {
  TensorImpl* ti = t.unsafe_impl();
  e.meta = {ti->shape, ti->dtype, ti->device(), ti->sym};
  e.needs = ti->requires_grad;
  if (e.needs) {
    if (ti->autograd && ti->autograd->grad_fn)
      e.fn = current_grad_fn(ti);
    else
      e.leaf = t.impl_ptr();
  }
}

std::shared_ptr<Node> autograd_prepare(const OpDef& def, TensorRefs in, const Attrs& attrs,
                                       const Tensor* inplace_self) {
  auto node = make_node();
  node->def = &def;
  node->attrs = attrs;
  node->sequence = next_sequence();
  const int64_t n = in.size();
  node->inputs.resize(n);
  node->saved.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& t = in[i];
    TensorImpl* ti = t.unsafe_impl();
    set_input_edge(node->inputs[i], t);
    // Saving an in-place op's target by handle would make a cycle once it gets this node as
    // grad_fn; an alias keeps its old identity instead (Note [Saved tensors]).
    const bool is_self = inplace_self && inplace_self->unsafe_impl() == ti;
    // Save bits 0..6 name inputs (bit 7 is the output); a variadic op's later inputs have none.
    if (i < 7 && (def.save >> i & 1)) node->saved[i] = save(is_self ? autograd_alias(t) : t);
  }
  if (def.cls == OpClass::View && n == 1) node->view_source = in[0].unsafe_impl()->storage.get();
  if (std::vector<std::weak_ptr<Node>>* region = checkpoint_nodes()) region->push_back(node);
  if (std::shared_ptr<Keeper>* keeper = node_keeper()) node->keeper = *keeper;
  return node;
}

void autograd_finish(std::shared_ptr<Node> node, const Tensor& out) {
  TensorImpl* o = out.unsafe_impl();
  node->output_meta = {o->shape, o->dtype, o->device(), o->sym};
  if (node->def->save & kSaveOut) node->saved_output = save(alias(out, nullptr));
  if (node->view_source) {
    node->view_of_input = node->view_source == o->storage.get();
    node->view_source = nullptr;
  }
  o->requires_grad = true;
  std::shared_ptr<Node>& fn = autograd_meta(*o).grad_fn;
  // An in-place write: the tensor's old history is superseded (Note [Views of written tensors]).
  if (fn && fn != node) fn->superseded_by = node;
  fn = std::move(node);
}

void autograd_record(const OpDef& def, TensorRefs in, const Attrs& attrs, const Tensor& out) {
  autograd_finish(autograd_prepare(def, in, attrs, nullptr), out);
}

}  // namespace duet::detail
