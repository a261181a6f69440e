// duet: Autobatch's tape (Note [Autobatch's tape]): the groups whose results need gradients
// run with their history, and a backward walks the batched ops they recorded.
#include "eager/autobatch_impl.h"

#include <unordered_map>

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

namespace autobatch {

// Note [Views by source]
// A differentiated group of a view op whose samples view results of several batches (the h'
// and c' slices of a BiLSTM step's forward and backward cells, one batch per weight) runs as one
// group per source batch: each part is the view op applied to its batch, a view on the tape and
// no copy, where one group had to gather its operand from the batches first (a piece of each
// and their concatenation), or the batches had to be joined (Note [Joined parts]). Since
// lstm_step computes a whole cell per weight (Note [LSTM step] in core/ops/rnn.cpp), joining
// its two parts at every step served only those slices: B1's step ran its 73 concatenations a
// step, about 1.5 ms of copies. Split, its view groups go from 119 to 235 a step and its pieces
// from 530 to 353, and the step took 27.4 to 29.9 ms against 28.8 to 31.0 (a scratch harness,
// six pairs of 20 steps alternating, one thread per process).
constexpr size_t kMaxSources = 64;

// The group's ops split by the batch that made their first operand, or {} where that is one
// batch for all, or more than kMaxSources (Note [Views by source]).
std::vector<std::vector<int32_t>> split_by_source(const std::vector<PendingOp>& ops,
                                                  const std::vector<int32_t>& ids) {
  std::vector<const Batch*> sources;
  std::vector<std::vector<int32_t>> parts;
  for (int32_t id : ids) {
    const PendingOp* src = batch_source(ops, ops[static_cast<size_t>(id)], 0);
    const Batch* b = src ? src->batch : nullptr;
    size_t q = 0;
    while (q < sources.size() && sources[q] != b) ++q;
    if (q == sources.size()) {
      if (sources.size() == kMaxSources) return {};
      sources.push_back(b);
      parts.emplace_back();
    }
    parts[q].push_back(id);
  }
  if (parts.size() < 2) return {};
  return parts;
}

}  // namespace autobatch

// An op without a batching rule whose results need gradients: each sample runs alone on
// operands with their history (slices of their batches), and its result is a batch of one.
void Autobatch::Impl::run_each_differentiated(std::vector<PendingOp>& ops, const Attrs& attrs,
                                              const std::vector<int32_t>& ids) {
  GradModeScope tape(true);
  for (int32_t id : ids) {
    PendingOp& o = ops[static_cast<size_t>(id)];
    count_group(o.op, 1);
    detail::SiteGuard at(o.site);
    const std::vector<int32_t> one{id};
    std::vector<Tensor> in;
    for (size_t p = 0; p < o.inputs.size(); ++p)
      in.push_back(row_gated(with_history(ops, o, p), one));  // (Note [Row gates])
    std::vector<const Tensor*> ptrs;
    for (const Tensor& x : in) ptrs.push_back(&x);
    const Tensor r =
        detail::call(o.op, TensorRefs(ptrs.data(), static_cast<int64_t>(ptrs.size())), attrs);
    place_batch(ops, one, {unsqueeze(r, 0), 0}, /*keep=*/true);
  }
}

// Note [Pieces by source]
// A group's samples come in the order its ops became ready, which follows the batches of one
// operand (Autobatch::Impl::run orders consumers so); another operand may then come from many
// batches in turns: the children of a tree's nodes, the backward states of sentences of
// different lengths. Taken run by run, each run is a piece (a slice or an index_select with its
// tape node, and its gradient in the backward): B2's cell products gathered their children in
// 950 pieces a step from about a hundred batches. Where that saves ops, each source gives one
// piece for all its samples, and one index_select puts the concatenation in the group's order
// (its gradient one scatter into the concatenation's, Note [Slices' gradients] in
// eager/engine.cpp).

// Operand p of a differentiated group as one batch at dim 0, with its history (Note
// [Autobatch's tape]): the samples of one batch are a slice of it, or an index_select; any other
// sample (a tensor computed before the run, a result that needs no gradient, a value its group
// computed once) is itself with a batch dim; the pieces are concatenated. Each piece is an op
// on the tape, and its gradient one more in the backward, so the pieces are as few as the order
// allows (Note [Pieces by source]).
Tensor Autobatch::Impl::gather_grad(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                                    size_t p) {
  // Where each sample comes from: its batch's value (or the operand itself when it comes from
  // no batch) and its row there (-1: the whole value, a value computed once or an own tensor).
  const size_t n = ids.size();
  std::vector<const Tensor*> from(n);
  std::vector<int64_t> row(n), rows(n);
  std::vector<char> own(n);
  std::vector<Tensor> gates(n);  // each own operand through its gate
  for (size_t k = 0; k < n; ++k) {
    const PendingOp& o = ops[static_cast<size_t>(ids[k])];
    const PendingOp* src = batch_source(ops, o, p);
    if (!src) gates[k] = gated(o.inputs[p], ids[k]);
    from[k] = src ? &src->batch->value : &gates[k];
    row[k] = src ? src->index : -1;
    rows[k] = src ? src->rows : -1;  // (a batch by rows: the sample's first row and its rows)
    own[k] = !src;
  }
  // Whether samples j and k read one source the same way (rows of a batch, or its one value).
  auto same_source = [&](size_t j, size_t k) {
    return from[j]->unsafe_impl() == from[k]->unsafe_impl() && (row[j] >= 0) == (row[k] >= 0);
  };
  // A run continues with the same source; each own tensor is a run of its own.
  size_t runs = 0;
  for (size_t k = 0; k < n; ++k) runs += !(k > 0 && !own[k] && same_source(k - 1, k));
  // The sources in order of first use, each with the group positions that read it: only where
  // by source could take fewer ops than the runs (at least 4). Found by a scan while they are
  // few, then through a table (a group of many samples, each with a tensor of its own, would
  // scan quadratically).
  std::vector<const Tensor*> sources;
  std::vector<std::vector<size_t>> readers;
  std::unordered_map<uintptr_t, size_t> source_at;
  auto key = [&](size_t k) {  // the source's tensor, and whether it is read by rows
    return reinterpret_cast<uintptr_t>(from[k]->unsafe_impl()) | (row[k] >= 0 ? 1 : 0);
  };
  for (size_t k = 0; runs > 3 && k < n; ++k) {
    size_t s = 0;
    if (sources.size() <= 16) {
      while (s < sources.size() && !same_source(readers[s][0], k)) ++s;
    } else {
      if (source_at.empty())
        for (size_t j = 0; j < sources.size(); ++j) source_at.emplace(key(readers[j][0]), j);
      const auto it = source_at.find(key(k));
      s = it == source_at.end() ? sources.size() : it->second;
    }
    if (s == sources.size()) {
      if (!source_at.empty()) source_at.emplace(key(k), s);
      sources.push_back(from[k]);
      readers.emplace_back();
    }
    readers[s].push_back(k);
  }
  // By source only where it saves ops: its pieces, their concatenation and one reordering.
  const bool by_source = runs > 3 && sources.size() + 2 < runs;
  std::vector<Tensor> pieces;
  std::vector<int64_t> order;  // by source: group position k's row in the concatenation
  // Samples of one batch by rows (Note [Rows]), all of one length here (the group's signature
  // holds it): their rows, as one batch of samples.
  auto rows_piece = [&](const Tensor& value, const std::vector<size_t>& at) {
    const auto m = static_cast<int64_t>(at.size());
    const int64_t len = rows[at[0]], first = row[at[0]];
    bool next = true;
    for (int64_t j = 1; next && j < m; ++j) next = row[at[j]] == first + j * len;
    Tensor v;
    if (next && first == 0 && m * len == value.sizes()[0]) {
      v = value;
    } else if (next) {
      v = slice(value, 0, first, first + m * len);
    } else {
      std::vector<int64_t> where;
      for (size_t k : at)
        for (int64_t j = 0; j < len; ++j) where.push_back(row[k] + j);
      v = index_select(value, 0, index_tensor(where, value.device()));
    }
    Shape s{m, len};
    for (int64_t d = 1; d < value.dim(); ++d) s.push_back(value.sizes()[d]);
    return reshape(v, s);
  };
  auto piece = [&](const Tensor& value, const std::vector<size_t>& at) {
    const auto m = static_cast<int64_t>(at.size());
    ++stats_.pieces;       // (but for a whole batch, below)
    if (row[at[0]] < 0) {  // one value for each of these samples
      Shape s{m};
      for (int64_t d = 0; d < value.dim(); ++d) s.push_back(value.sizes()[d]);
      return expand(unsqueeze(value, 0), s);
    }
    if (rows[at[0]] >= 0) return rows_piece(value, at);
    const int64_t first = row[at[0]], step = m > 1 ? row[at[1]] - first : 1;
    bool even = step > 0;
    for (int64_t j = 1; even && j < m; ++j) even = row[at[j]] == first + step * j;
    if (even && m == value.sizes()[0] && first == 0 && step == 1) {
      --stats_.pieces;
      return value;
    }
    if (even) return slice(value, 0, first, first + step * (m - 1) + 1, step);
    std::vector<int64_t> where;
    for (size_t k : at) where.push_back(row[k]);
    return index_select(value, 0, index_tensor(where, value.device()));
  };
  if (by_source) {
    order.resize(n);
    int64_t at = 0;
    for (size_t s = 0; s < sources.size(); ++s) {
      pieces.push_back(piece(*sources[s], readers[s]));
      for (size_t k : readers[s]) order[k] = at++;
    }
  } else {
    std::vector<size_t> run;
    for (size_t k = 0; k < n; ++k) {
      if (!run.empty() && (own[k] || !same_source(run[0], k))) {
        pieces.push_back(piece(*from[run[0]], run));
        run.clear();
      }
      run.push_back(k);
    }
    pieces.push_back(piece(*from[run[0]], run));
  }
  if (pieces.size() == 1 && !by_source) return pieces[0];
  ++stats_.gathers;
  Tensor all = pieces.size() == 1 ? pieces[0] : cat(pieces, 0);
  bool in_order = true;
  for (size_t k = 0; by_source && in_order && k < n; ++k)
    in_order = order[k] == static_cast<int64_t>(k);
  return in_order ? all : index_select(all, 0, index_tensor(order, all.device()));
}

// Operand p of op o as a tensor with its history: its sample of the batch that computed it in
// this run, or itself (Note [Autobatch's tape]).
Tensor Autobatch::Impl::with_history(std::vector<PendingOp>& ops, const PendingOp& o, size_t p,
                                     const std::vector<int32_t>* readers) {
  if (const PendingOp* src = batch_source(ops, o, p)) return part_of_batch(*src);
  if (readers) return gated(o.inputs[p], readers->data(), readers->size());
  return gated(o.inputs[p], static_cast<int32_t>(&o - ops.data()));
}

// Operand p, one tensor for the whole group, with its history; where this run computed it, through
// a gate of the whole (Note [Row gates] in eager/autobatch_reach.cpp).
Tensor Autobatch::Impl::shared_gated(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                                     size_t p) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  Tensor v = with_history(ops, first, p, &ids);
  return batch_source(ops, first, p) ? row_gated(v, ids, /*whole=*/true) : v;
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
// end_run). The others are freed unplaced.

// Note [The run's end]
// Once its groups ran, a run lets go of what its ops hold, and tells which results are still
// held (a tensor of the user's, a view of their storage): a result still held gets its history
// (Note [Autobatch's tape]), and one that needs none, or is held only through a view of its
// storage, is placed (Note [Placed when read]). One pass does all of it, newest op first: an op
// lets go of its operands, which are older, so each result's holders are known once the pass
// reaches it; then the result is decided and let go of. Passes of their own (operands let go of
// as each group ended, the results in one more pass) each read every op's operands, tensor and
// storage again, missing the cache at most ops: B1's step took 1.9 to 2.0 ms longer (of 27 to
// 30) and B2's 0.5 to 1.4 (of 18 to 20) in harnesses alternating the two within one process,
// though in duet_bench, run four times each way in turn, the two were within its noise.
// The results go, newest first, to the list the next step's pending tensors are drawn from,
// which then draws them in the order they were made (Note [Tensor object cache]).

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

// The run's end, one pass over its ops, newest first (Note [The run's end]).
void Autobatch::Impl::end_run(std::vector<PendingOp>& ops) {
  GradModeScope tape(true);
  for (size_t i = ops.size(); i-- > 0;) {
    PendingOp& o = ops[i];
    o.inputs.clear();  // (its operands are older: each is decided after its readers let go)
    if (o.batch) {
      const bool held = o.impl.use_count() > 1;
      if (!o.grad || !held) {
        if (o.out()->lazy && o.index >= 0 && (held || o.impl->storage.use_count() > 1))
          place_sample(o);
      } else {
        const Tensor s = part_of_batch(o).clone();
        fill(o.out(), s.unsafe_impl()->data(), owner_of(s.unsafe_impl()));
        if (s.unsafe_impl()->autograd && s.unsafe_impl()->autograd->grad_fn)
          mark_survivor(o, static_cast<int32_t>(i), s);
      }
    }
    detail::ObjectCacheScope pending;
    o.impl.reset();
  }
}

struct detail::AutobatchBackward::State {
  Autobatch::Impl* impl;
  LazyRunner* runner;
  detail::SuspendModes suspend;
  detail::KernelCountScope count;
  int64_t before;
  State(Autobatch::Impl* i, LazyRunner* r)
      : impl(i), runner(r), count(&i->kernels_), before(i->kernels_) {}
};

detail::AutobatchBackward::AutobatchBackward(const std::vector<Tensor>& roots) {
  Autobatch::Impl* ab = tls_open;
  if (!ab || detail::mode_depth() != 1) return;  // a trace inside the scope records it
  ab->run(&roots);
  state_ = std::make_unique<State>(ab, detail::set_lazy_runner(nullptr));
}

detail::AutobatchBackward::~AutobatchBackward() {
  if (!state_) return;
  Autobatch::Impl* ab = state_->impl;
  ab->stats_.kernels_launched += ab->kernels_ - state_->before;
  tls_stats = ab->stats();
  LazyRunner* runner = state_->runner;
  state_.reset();
  detail::set_lazy_runner(runner);
}

}  // namespace duet
