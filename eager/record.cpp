// duet: recording op calls on the autograd tape (called from dispatch; see core/dispatch.h).
#include <atomic>

#include "eager/autograd.h"
#include "eager/node.h"

namespace duet::detail {
namespace {

std::atomic<uint64_t> g_sequence{0};

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

uint64_t next_sequence() { return g_sequence.fetch_add(1, std::memory_order_relaxed); }

void set_input_edge(InputEdge& e, const Tensor& t) {
  TensorImpl* ti = t.unsafe_impl();
  e.meta = {ti->shape, ti->dtype, ti->device(), ti->sym};
  e.needs = ti->requires_grad;
  if (e.needs) {
    if (ti->autograd && ti->autograd->grad_fn)
      e.fn = ti->autograd->grad_fn;
    else
      e.leaf = t.impl_ptr();
  }
}

std::shared_ptr<Node> autograd_prepare(const OpDef& def, TensorRefs in, const Attrs& attrs,
                                       const Tensor* inplace_self) {
  auto node = std::make_shared<Node>();
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
  return node;
}

void autograd_finish(std::shared_ptr<Node> node, const Tensor& out) {
  TensorImpl* o = out.unsafe_impl();
  node->output_meta = {o->shape, o->dtype, o->device(), o->sym};
  if (node->def->save & kSaveOut) node->saved_output = save(alias(out, nullptr));
  o->requires_grad = true;
  autograd_meta(*o).grad_fn = std::move(node);
}

}  // namespace duet::detail
