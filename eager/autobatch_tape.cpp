// duet: Autobatch's tape (Note [Autobatch's tape]): the groups whose results need gradients
// run with their history, and a backward walks the batched ops they recorded.
#include "eager/autobatch_impl.h"

namespace duet {
using namespace autobatch;

// Note [Autobatch's tape]
// In a scope, an op whose result needs a gradient (grad mode on, an input that requires one) is
// recorded without a tape node of its own: the mode claims it from the dispatcher
// (detail::claim_autograd). Its views are recorded too, rather than made at once, so that the
// gradient can flow through them. A run differentiates the batched ops instead:
//  - a group with such ops runs its batching rule with grad mode on, so the tape holds one node
//    per batched op, and the backward is one batched op per node: the per-sample tape, and its
//    per-sample backward, never exist;
//  - its operands are gathered with their history (gather_grad): a run of samples from one
//    batch is a slice of it (an index_select where not evenly spaced), and the pieces are
//    concatenated; so that the runs are long, a group's consumers become ready in the order of
//    the batches it made (Autobatch::Impl::run);
//  - a group whose samples all compute one value (a weight's transpose) computes it once, and
//    its readers take it as a shared operand (index -1);
//  - after the run, each such result still held (by the user: a loss, an output) gets its
//    history: a copy of its sample of the batch, whose tape node it takes, so that an in-place
//    write to it cannot change what the batched tape saved.
// A backward (or grad()) on the scope's thread first runs what is pending, then walks the tape
// with the scope's mode set aside (AutobatchBackward): its ops are batched already, and run at
// once. A batch read slice by slice gets its gradient through the engine's slice buffers (Note
// [Slices' gradients] in eager/engine.cpp), not a zero tensor per slice.

// An op without a batching rule whose results need gradients: each sample runs alone on
// operands with their history (slices of their batches), and its result is a batch of one.
void Autobatch::Impl::run_each_differentiated(std::vector<PendingOp>& ops, const Attrs& attrs,
                                              const std::vector<int32_t>& ids) {
  GradModeScope tape(true);
  for (int32_t id : ids) {
    PendingOp& o = ops[static_cast<size_t>(id)];
    detail::SiteGuard at(o.site);
    const std::vector<int32_t> one{id};
    std::vector<Tensor> in;
    for (size_t p = 0; p < o.inputs.size(); ++p) in.push_back(with_history(ops, o, p));
    std::vector<const Tensor*> ptrs;
    for (const Tensor& x : in) ptrs.push_back(&x);
    const Tensor r =
        detail::call(o.op, TensorRefs(ptrs.data(), static_cast<int64_t>(ptrs.size())), attrs);
    place_batch(ops, one, {unsqueeze(r, 0), 0}, /*keep=*/true);
  }
}

// Operand p of a differentiated group as one batch at dim 0, with its history (Note
// [Autobatch's tape]): a run of samples from one batch is a slice of it, or an index_select;
// any other sample (a tensor computed before the run, a result that needs no gradient, a value
// its group computed once) is itself with a batch dim; the pieces are concatenated.
Tensor Autobatch::Impl::gather_grad(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                                    size_t p) {
  // The batch and place of the sample of op `id` at operand p, or null.
  auto source = [&](int32_t id, int64_t* index) -> const Tensor* {
    const PendingOp* src = batch_source(ops, ops[static_cast<size_t>(id)], p);
    if (!src) return nullptr;
    *index = src->index;
    return &src->batch->value;
  };
  std::vector<Tensor> pieces;
  for (size_t k = 0; k < ids.size();) {
    int64_t start = 0;
    const Tensor* batch = source(ids[k], &start);
    if (!batch || start < 0) {  // a tensor of its own, or one value for its whole group
      const Tensor one = batch ? *batch : Tensor(ops[static_cast<size_t>(ids[k])].inputs[p]);
      size_t e = k + 1;
      int64_t at = 0;
      for (const Tensor* next = nullptr; batch && e < ids.size() && (next = source(ids[e], &at)) &&
                                         next->unsafe_impl() == batch->unsafe_impl() && at < 0;)
        ++e;
      Shape s{static_cast<int64_t>(e - k)};
      for (int64_t d = 0; d < one.dim(); ++d) s.push_back(one.sizes()[d]);
      pieces.push_back(expand(unsqueeze(one, 0), s));
      k = e;
      continue;
    }
    // The run of samples from this batch: a slice where evenly spaced, else an index_select
    // (one op either way, whose gradient is one scatter into the batch's).
    size_t e = k + 1;
    int64_t step = 0, at = 0;
    bool even = true;
    std::vector<double> where{static_cast<double>(start)};
    for (; e < ids.size(); ++e) {
      const Tensor* next = source(ids[e], &at);
      if (!next || next->unsafe_impl() != batch->unsafe_impl() || at < 0) break;
      if (e == k + 1) step = at - start;
      even = even && step > 0 && at == start + step * static_cast<int64_t>(e - k);
      where.push_back(static_cast<double>(at));
    }
    const int64_t n = static_cast<int64_t>(e - k);
    if (n == 1 || even)
      pieces.push_back(n == batch->sizes()[0] && start == 0 && step <= 1
                           ? *batch
                           : slice(*batch, 0, start,
                                   start + std::max<int64_t>(step, 1) * (n - 1) + 1,
                                   std::max<int64_t>(step, 1)));
    else
      pieces.push_back(index_select(
          *batch, 0, tensor(where, Options().dtype(DType::i64).device(batch->device()))));
    k = e;
  }
  if (pieces.size() == 1) return pieces[0];
  ++stats_.gathers;
  return cat(pieces, 0);
}

// Operand p of op o as a tensor with its history: its sample of the batch that computed it in
// this run, or itself (Note [Autobatch's tape]).
Tensor Autobatch::Impl::with_history(std::vector<PendingOp>& ops, const PendingOp& o, size_t p) {
  const PendingOp* src = batch_source(ops, o, p);
  if (!src) return o.inputs[p];
  return src->index < 0 ? src->batch->value : select(src->batch->value, 0, src->index);
}

// Note [Placed when read]
// A differentiated group's consumers read its samples through its batch (batch_source), not
// through each sample's storage, so placing each sample (step 5 of Note [Autobatch]: its lazy
// storage pointed into the batch, holding the batch's buffer) is work no one reads for most
// of them. Such a group's samples stay lazy while the run goes on, unless the batched result
// shares memory with an operand (which eager copies, per sample): a read of one during the
// run (a consumer without a gradient, an op run alone) places it then (resolve, from
// force_lazy), and at the run's end each sample still held, by a tensor or a view of its
// storage, is placed (or, needing a gradient, gets its own copy with its history,
// give_history). The others are freed unplaced.

// Places sample o.index of o's batch: its storage points into the batch.
void Autobatch::Impl::place_sample(PendingOp& o) {
  const TensorImpl* b = o.batch->value.unsafe_impl();
  const int64_t step = b->shape.size() ? b->strides[0] * itemsize(b->dtype) : 0;
  fill(o.out(), static_cast<char*>(b->data()) + o.index * step, owner_of(b));
}

bool Autobatch::Impl::resolve(const StorageImpl* st) {
  if (!run_ops_ || !st->lazy) return false;
  const int32_t id = st->lazy_op;
  if (id < 0 || static_cast<size_t>(id) >= run_ops_->size() ||
      run_index_->out[static_cast<size_t>(id)] != st)
    return false;
  PendingOp& o = (*run_ops_)[static_cast<size_t>(id)];
  if (!o.batch || o.index < 0) return false;
  place_sample(o);
  return true;
}

// A result still held after the run gets its history (Note [Autobatch's tape]); one that needs
// none, or is held only through a view of its storage, is placed (Note [Placed when read]).
void Autobatch::Impl::give_history(std::vector<PendingOp>& ops) {
  GradModeScope tape(true);
  for (PendingOp& o : ops) {
    if (!o.batch) continue;
    const bool held = o.impl.use_count() > 1;
    if (!o.grad || !held) {
      if (o.out()->lazy && o.index >= 0 && (held || o.impl->storage.use_count() > 1))
        place_sample(o);
      continue;
    }
    const Tensor& b = o.batch->value;
    const Tensor s = (o.index < 0 ? b : select(b, 0, o.index)).clone();
    fill(o.out(), s.unsafe_impl()->data(), owner_of(s.unsafe_impl()));
    if (s.unsafe_impl()->autograd)
      detail::autograd_meta(*o.impl).grad_fn = s.unsafe_impl()->autograd->grad_fn;
  }
}

struct detail::AutobatchBackward::State {
  Autobatch::Impl* impl;
  LazyRunner* runner;
  detail::SuspendModes suspend;
  ModeGuard count;
  int64_t before;
  State(Autobatch::Impl* i, LazyRunner* r)
      : impl(i), runner(r), count(&i->counter_), before(i->counter_.kernels) {}
};

detail::AutobatchBackward::AutobatchBackward() {
  Autobatch::Impl* ab = tls_open;
  if (!ab || detail::mode_depth() != 1) return;  // a trace inside the scope records it
  ab->run();
  state_ = std::make_unique<State>(ab, detail::set_lazy_runner(nullptr));
}

detail::AutobatchBackward::~AutobatchBackward() {
  if (!state_) return;
  Autobatch::Impl* ab = state_->impl;
  ab->stats_.kernels_launched += ab->counter_.kernels - state_->before;
  tls_stats = ab->stats_;
  LazyRunner* runner = state_->runner;
  state_.reset();
  detail::set_lazy_runner(runner);
}

}  // namespace duet
