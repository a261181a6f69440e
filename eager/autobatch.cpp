// duet: Autobatch (eager/autobatch.h).
//
// Note [Autobatch]
// An Autobatch scope is a dispatch mode. An op call in it is recorded, and returns a tensor whose
// storage is lazy (StorageImpl::lazy: metadata and no data yet). Views of it are made at once
// (they read no data), unless a gradient flows through them. Ops whose results need gradients
// get no per-sample tape node: the run differentiates the batched ops (Note [Autobatch's tape]
// in eager/autobatch_tape.cpp). When a
// value is needed (a data read: TensorImpl::data() calls force_lazy), before an in-place write,
// before an op with effects (print, collectives, transfers, optimization barriers), before a
// trace starts, and when the scope ends, the pending ops run:
//  1. Dead ops go: walking back from the newest, an op whose result nobody holds (no tensor, view,
//     saved value or pending op) is dropped, and drops its hold on its operands.
//  2. The ops are grouped by signature: op, attributes, and each operand's shape, dtype and
//     device (and value, for wrapped numbers, which promote as numbers).
//  3. DyNet's agenda heuristic picks what runs next: of the signatures with ready ops (every
//     operand computed), the one whose ops lie least deep on average (depth: the longest chain of
//     pending ops behind an op), and runs all its ready ops as one call. Ops deep in a chain
//     (the steps of a long sentence, the root of a tree) wait, so that more of their kind
//     become ready and join them.
//  4. A group runs through the op's batching rule (OpDef::batch, the rules of func::vmap). An
//     operand that is one tensor for the whole group (a weight) is passed once; a group whose
//     ops read one of a few weights runs once per weight (Note [Groups by operand]); the other
//     operands form a batch. When the samples' operands lie in one buffer at a fixed stride (the
//     results of the previous batched op, in order, or the rows of one input), the batch is a
//     strided view of it; otherwise it is gathered with one copy. Sources of one signature (zeros,
//     aranges) are made once and copied into a batch. A group of one, an op without a rule, and
//     random ops run as they would eagerly.
//  5. Each op's result is its sample of the batched result: the lazy storage points into the
//     batched result's buffer and holds it alive (StorageImpl::base), so no copy is made unless
//     the sample is not contiguous (a differentiated group's samples are placed only when read,
//     Note [Placed when read] in eager/autobatch_tape.cpp). Gathered batches are temporaries,
//     freed (back to the caching allocator, for the next gather) right after their op.
// The ops run with autocast off (autocast cast their operands when they were recorded), and with
// grad mode on only for groups whose results need gradients.
#include "eager/autobatch.h"

#include "eager/autobatch_impl.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "core/autocast.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {

namespace autobatch {

thread_local AutobatchStats tls_stats;
thread_local Autobatch::Impl* tls_open = nullptr;

// Note [Groups by operand]
// Ops of one signature may read one of a few tensors at an operand: the weights of two cells of
// one shape (an LSTM's w_ih and w_hh, a forward and a backward cell) multiply vectors of one
// shape. Gathering that operand would copy a whole weight per sample. Where an operand takes at
// most kMaxParts distinct tensors and each is read by at least kMinShare samples on average,
// the group runs as one batch per tensor instead, each passing its tensor once (as shared
// operands are, step 4 of Note [Autobatch]). An operand that differs in most samples (their
// activations, read once or twice each) is gathered as before.
constexpr size_t kMaxParts = 64, kMinShare = 4;

// The group's ops split by the first operand that calls for it, or {} (Note [Groups by
// operand]).
std::vector<std::vector<int32_t>> split_by_operand(const std::vector<PendingOp>& ops,
                                                   const std::vector<int32_t>& ids) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  std::vector<const TensorImpl*> distinct;
  std::vector<uint32_t> part(ids.size());
  for (size_t p = 0; p < first.inputs.size(); ++p) {
    if (first.inputs[p].unsafe_impl()->wrapped_number) continue;
    // A sample of a batch (an activation) is read by its own sample: gathered, never split.
    if (const PendingOp* src = batch_source(ops, first, p); src && src->index >= 0) continue;
    distinct.clear();
    bool split = true, whole = true;
    for (size_t k = 0; k < ids.size() && split; ++k) {
      // A result its whole group computed once (a weight's transpose) stands for that value.
      const TensorImpl* u = uniform_value(ops, ids[k], p);
      whole = whole && u;
      const TensorImpl* x = u ? u : ops[static_cast<size_t>(ids[k])].inputs[p].unsafe_impl();
      size_t d = 0;
      while (d < distinct.size() && !same_operand(distinct[d], x)) ++d;
      if (d == distinct.size()) distinct.push_back(x);
      part[k] = static_cast<uint32_t>(d);
      // Values a whole group computed once always split (gathered, each sample would carry a
      // copy); once a sample is not one, too many distinct values already decide.
      split = distinct.size() <= kMaxParts && (whole || distinct.size() * kMinShare <= ids.size());
    }
    if (!split || distinct.size() < 2) continue;
    std::vector<std::vector<int32_t>> parts(distinct.size());
    for (size_t k = 0; k < ids.size(); ++k) parts[part[k]].push_back(ids[k]);
    return parts;
  }
  return {};
}

bool shared_operand(const std::vector<PendingOp>& ops, const std::vector<int32_t>& ids, size_t p) {
  const TensorImpl* x0 = ops[static_cast<size_t>(ids[0])].inputs[p].unsafe_impl();
  const TensorImpl* u0 = uniform_value(ops, ids[0], p);  // one value for all, computed once
  for (int32_t id : ids) {
    const TensorImpl* x = ops[static_cast<size_t>(id)].inputs[p].unsafe_impl();
    // Wrapped numbers of a signature hold one value (step 2), and promote as numbers.
    if (!(x->wrapped_number || same_operand(x, x0) || (u0 && uniform_value(ops, id, p) == u0)))
      return false;
  }
  return true;
}

// A wrapped number's value (its signature holds it: wrapped numbers promote as numbers), or 0.
uint64_t operand_bits(const TensorImpl* x) {
  uint64_t bits = 0;
  if (x->wrapped_number) std::memcpy(&bits, x->data(), itemsize(x->dtype));
  return bits;
}

// The attributes' part of a signature's hash: the fields that tell most calls apart, packed
// into few mixes (Attrs::hash mixes every field one after another, a tenth of what recording a
// call cost). Equal attributes hash equally; the table compares whole keys, so the fields left
// out (a Full's value, a Transfer's device, symbolic sizes) only share a bucket.
size_t attrs_hash(const Attrs& a) {
  size_t h = static_cast<size_t>(a.ints.size());
  for (int64_t v : a.ints) h = mix(h, static_cast<uint64_t>(v));
  h = mix(h, static_cast<uint64_t>(a.dim) ^ static_cast<uint64_t>(a.step) << 32);
  h = mix(h, static_cast<uint64_t>(a.start) ^ static_cast<uint64_t>(a.end) << 24 ^
                 static_cast<uint64_t>(a.dtype) << 52 ^ static_cast<uint64_t>(a.keepdim) << 60);
  return h;
}

// Note [Last signatures]
// A call's signature is found by its hash in sigs_; before that, record() compares the call
// with the key its op's last call found (last_sig_), and most calls match it: a cell's steps,
// a tree's nodes and their slices come in the same order sample after sample. Keys are unique
// (sigs_ holds one per signature, and same_signature is equality with a key), so a key that
// matches is the one the table would find, and a match skips the hash and the lookup. B2's
// recording took 1.7% fewer instructions, B1's cells 2.4% (callgrind).

SigKey make_key(const SigProbe& p) {
  SigKey k{p.op, *p.attrs, {}, p.hash, p.pick, p.rows};
  for (int64_t i = 0; i < p.count(); ++i) {
    const TensorImpl* x = p.inputs[i].unsafe_impl();
    OperandSig s{x->dtype, p.inputs[i].device(), x->wrapped_number, operand_bits(x), x->shape};
    if (p.free0(i)) s.shape[0] = -1;
    k.in.push_back(std::move(s));
  }
  return k;
}

bool same_signature(const SigKey& k, const SigProbe& p) {
  if (k.op != p.op || k.pick != p.pick || !(k.rows == p.rows) ||
      k.in.size() != static_cast<size_t>(p.count()) || !(k.attrs == *p.attrs))
    return false;
  for (int64_t i = 0; i < p.count(); ++i) {
    const TensorImpl* x = p.inputs[i].unsafe_impl();
    const OperandSig& s = k.in[static_cast<size_t>(i)];
    if (s.dtype != x->dtype || s.wrapped != x->wrapped_number ||
        s.shape.size() != x->shape.size() || s.device != x->device() ||
        (s.wrapped && s.bits != operand_bits(x)))
      return false;
    for (int64_t d = 0; d < x->shape.size(); ++d)
      if (s.shape[d] != (d == 0 && p.free0(i) ? -1 : x->shape[d])) return false;
  }
  return true;
}

}  // namespace autobatch
using namespace autobatch;

namespace {
// A training step's scope records hundreds of thousands of ops. A fresh list per scope grew by
// doubling into new pages at every step (a quarter of B1's page faults): the thread keeps the
// largest list's memory for its next scope, as the caching allocator keeps tensors' memory.
thread_local std::vector<PendingOp> tls_spare_ops;
thread_local OpIndex tls_spare_index;
}  // namespace

Tensor Autobatch::Impl::handle(const OpCall& c) {
  const OpDef& def = detail::op_def(c.op);
  const bool view = def.cls == OpClass::View && !c.inplace_out;
  if (!view) ++stats_.ops_recorded;
  // What the dispatcher would record on the tape (core/dispatch.cpp) is differentiated batched
  // instead (Note [Autobatch's tape]).
  bool needs = false;
  for (int64_t i = 0; i < c.inputs.size(); ++i) needs |= c.inputs[i].unsafe_impl()->requires_grad;
  const bool grad = needs && !c.inplace_out && detail::grad_mode() && def.differentiable &&
                    is_floating(c.meta.dtype);
  // Views read no data: made at once over the lazy storage (OptimizationBarrier orders work),
  // unless a gradient flows through them.
  if (view && !grad && c.op != OpId::OptimizationBarrier) {
    Tensor v = def.view(c.inputs[0], c.attrs, c.meta);
    if (v.defined()) return v;
  }
  // In-place writes and effects run after what is pending.
  const bool effect = c.inplace_out || c.op == OpId::Print || c.op == OpId::Transfer ||
                      c.op == OpId::OptimizationBarrier || c.op == OpId::AllReduce ||
                      c.op == OpId::Broadcast || c.op == OpId::AllGather ||
                      c.op == OpId::ReduceScatter || c.op == OpId::CollectiveWait;
  if (effect) {
    run();
    if (!view) ++stats_.kernels_launched;
    if (!view) count_group(c.op, 1);  // (run alone, at once)
    return detail::redispatch(this, c);
  }
  TensorImplPtr p;
  {
    detail::ObjectCacheScope pending;  // Note [Tensor object cache]
    p = TensorImplPtr::adopt(new TensorImpl());
    p->storage = StoragePtr::adopt(
        new StorageImpl(nullptr, static_cast<size_t>(c.meta.shape.numel()) * itemsize(c.meta.dtype),
                        c.meta.device, nullptr));
  }
  TensorImpl* t = p.get();
  t->dtype = c.meta.dtype;
  t->shape = c.meta.shape;
  detail::set_contiguous_strides(t->shape, t->strides);  // (a new TensorImpl is contiguous)
  t->storage->lazy = true;
  t->requires_grad = grad;
  record(c, p, grad);
  if (grad) detail::claim_autograd();
  return Tensor(std::move(p));
}

int32_t Autobatch::Impl::record(const OpCall& c, const TensorImplPtr& out, bool grad) {
  // A lazy operand that is not this scope's cannot be recorded: force_lazy runs what is pending
  // and throws. First, before the op is made in ops_, where that run would find it half made.
  for (int64_t i = 0; i < c.inputs.size(); ++i) {
    const StorageImpl* st = c.inputs[i].unsafe_impl()->storage.get();
    if (st && st->lazy && producer(st) < 0) detail::force_lazy(st);
  }
  const auto id = static_cast<int32_t>(ops_.size());
  // Made in place (a PendingOp moved in and destroyed read its operands once more), and taken
  // back if the rest fails (an allocation), so that ops_ and index_ stay in step.
  PendingOp& op = ops_.emplace_back();
  struct Undo {
    std::vector<PendingOp>& ops;
    bool done = false;
    ~Undo() {
      if (!done) ops.pop_back();
    }
  } undo{ops_};
  op.op = c.op;
  op.site = detail::tls_site;
  op.impl = out;
  int32_t sig = -1, depth = 0;
  op.grad = grad;
  // The signature (step 2 of Note [Autobatch]), hashed from the call; a key is made only for a
  // signature not seen before. A pick's leaves out its input's length and a slice's start
  // (Note [Picks]).
  const bool pick = is_pick(c);
  std::optional<Attrs> normalized;  // (made only where the signature changes the call's)
  const Attrs* attrs = &c.attrs;
  if (pick && (c.op == OpId::Slice || c.op == OpId::Select)) {
    op.start = c.attrs.start;
    normalized.emplace(c.attrs);
    normalized->start = 0;
    normalized->end = c.attrs.end - c.attrs.start;
    attrs = &*normalized;
  }
  // By rows (Note [Rows]): the signature leaves out the row operands' dim 0, a reshape's size
  // along it, and a join's operands after its first.
  RowsUse rows;
  if (!pick && c.op != OpId::Random && !c.attrs.sym) {
    const OpDef& def = detail::op_def(c.op);
    if (def.rows) rows = def.rows(c.inputs, c.attrs, c.meta);
  }
  if (rows.operands && c.op == OpId::Reshape) {
    normalized.emplace(c.attrs);
    normalized->ints[0] = -1;
    attrs = &*normalized;
  }
  if (rows.joined) {  // (a cat's attributes hold each operand's length)
    normalized.emplace(c.attrs);
    normalized->ints.clear();
    attrs = &*normalized;
  }
  op.inputs.reserve(static_cast<size_t>(c.inputs.size()));
  for (int64_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& x = c.inputs[i];
    const TensorImpl* xi = x.unsafe_impl();
    int32_t p = -1;
    if (xi->storage && xi->storage->lazy) {
      p = producer(xi->storage.get());  // (this scope's: checked above)
      depth = std::max(depth, index_.depth[static_cast<size_t>(p)] + 1);
      index_.edges.push_back(p);
      index_.edge_grad.push_back(xi->requires_grad);
    }
    op.inputs.push_back(x, p);
  }
  SigProbe probe{c.op, attrs, c.inputs, pick, rows, 0};
  // The hash, made only where the op's last signature is not this call's.
  auto hash = [&] {
    size_t h = attrs_hash(*attrs) ^ static_cast<size_t>(c.op) ^ (pick ? 0x5bd1e995u : 0u) ^
               (static_cast<size_t>(rows.operands) << 40) ^ (rows.summed ? 0x27d4eb2fu : 0u) ^
               (rows.joined ? 0x165667b1u : 0u);
    for (int64_t i = 0; i < probe.count(); ++i) {  // (a join's signature: its first operand)
      const TensorImpl* xi = c.inputs[i].unsafe_impl();
      h = mix(h, operand_bits(xi) ^ static_cast<uint64_t>(xi->dtype) << 56);
      for (int64_t d = 0; d < xi->shape.size(); ++d)
        h = mix(h, static_cast<uint64_t>(d == 0 && probe.free0(i) ? -1 : xi->shape[d]));
    }
    return h;
  };
  // Random ops never batch: each draws from its own state, so each has a signature of its own.
  if (c.op == OpId::Random) {
    probe.hash = hash();
    sig = static_cast<int32_t>(keys_.size());
    keys_.push_back(make_key(probe));
  } else {
    // Most calls of an op have the signature of its call before (a cell's steps, a tree's
    // nodes); any key equal to the probe is the one the table holds (Note [Last signatures]).
    const auto o = static_cast<size_t>(c.op);
    if (last_sig_.size() <= o) last_sig_.resize(o + 1, -1);
    const int32_t last = last_sig_[o];
    if (last >= 0 && same_signature(keys_[static_cast<size_t>(last)], probe)) {
      sig = last;
    } else {
      probe.hash = hash();
      auto it = sigs_.find(probe);
      if (it == sigs_.end()) {
        it = sigs_.emplace(make_key(probe), static_cast<int32_t>(keys_.size())).first;
        keys_.push_back(it->first);
      }
      sig = last_sig_[o] = it->second;
    }
  }
  if (rows.operands && !rows.joined) {  // (Note [Groups by rows]: one length, or several)
    SigKey& k = keys_[static_cast<size_t>(sig)];
    const int64_t len = c.inputs[std::countr_zero(rows.operands)].unsafe_impl()->shape[0];
    if (k.rows_len < 0) k.rows_len = len;
    k.mixed = k.mixed || k.rows_len != len;
  }
  out->storage->lazy_op = id;
  index_.out.push_back(out->storage.get());
  index_.sig.push_back(sig);
  index_.depth.push_back(depth);
  index_.grad.push_back(grad);
  index_.edge_at.push_back(static_cast<int32_t>(index_.edges.size()));
  undo.done = true;
  return id;
}

// Note [Groups on the loss's path]
// A group may batch samples on a loss's path with samples off it (the abs of two scalars, one
// summed into the loss, one only read detached). The batched backward then sends the off-path
// samples zeros, and where a gradient rule gives NaN for a zero gradient (std of equal values:
// 0 * 0 / 0) behind them, the NaN reaches the inputs through the batches, and through a shared
// operand's gradient, which the rule sums over all samples; eagerly no gradient reaches that
// rule at all. Gates (Note [Gradients off the loss's path] in eager/autobatch_reach.cpp) stop
// zeros only where they enter from a tensor outside the run. So a run that a backward starts
// (loss.backward() in the scope, the usual end of a step) knows its roots: the ops they reach,
// through operands that require grad of ops that record a gradient, are on the path, and a
// group that holds ops on it and ops that record a gradient off it runs as two groups, on the
// path first. Off-path ops then share no batched tape node with the backward's. A run that
// starts otherwise (a value read first: loss.item() before backward) cannot know its loss, and
// batches as before.

// Runs the group's ops on a backward's path apart from those off it that record a gradient
// (Note [Groups on the loss's path]), or returns false where the group need not be split.
template <class Run>
bool Autobatch::Impl::split_by_path(const std::vector<char>& on_path,
                                    const std::vector<int32_t>& group, Run&& run_ids) {
  if (on_path.empty()) return false;
  bool on = false, off = false;
  for (int32_t id : group) {
    const auto i = static_cast<size_t>(id);
    on = on || on_path[i];
    off = off || (!on_path[i] && run_index_->grad[i]);
  }
  if (!on || !off) return false;
  std::vector<int32_t> first, second;
  for (int32_t id : group) (on_path[static_cast<size_t>(id)] ? first : second).push_back(id);
  run_ids(first);
  run_ids(second);
  return true;
}

void Autobatch::Impl::run(const std::vector<Tensor>* roots) {
  if (ops_.empty() || running_) return;
  std::vector<PendingOp> ops;
  ops.swap(ops_);
  OpIndex index;
  std::swap(index, index_);
  index_.clear();
  std::vector<SigKey> keys = std::move(keys_);
  keys_.clear();
  sigs_.clear();
  last_sig_.clear();
  struct Running {
    bool& flag;
    explicit Running(bool& f) : flag(f) { flag = true; }
    ~Running() { flag = false; }
  } running(running_);
  struct Release {  // the run's batches, once its ops (which point at them) are done
    Autobatch::Impl& impl;
    ~Release() {
      impl.batches_.clear();
      impl.gates_.clear();  // (the nodes that need them hold them)
      impl.graph_.reset();
      impl.run_ops_ = nullptr;
      impl.run_index_ = nullptr;
      impl.run_on_path_ = nullptr;
      impl.run_first_consumer_ = impl.run_consumer_ = nullptr;
    }
  } release{*this};
  run_ops_ = &ops;
  run_index_ = &index;
  ++stats_.runs;
  // The run's tape nodes keep their saved values while a result not yet reached reads them
  // (Note [Batches shared by losses] in eager/autobatch_reach.cpp).
  start_graph(index);
  std::shared_ptr<detail::Keeper> keeper = graph_;
  struct KeeperScope {
    std::shared_ptr<detail::Keeper>* prev = detail::node_keeper();
    explicit KeeperScope(std::shared_ptr<detail::Keeper>* k) { detail::node_keeper() = k; }
    ~KeeperScope() { detail::node_keeper() = prev; }
  } keeping(&keeper);
  const size_t n = ops.size();
  RunGraph graph = run_graph(ops, index);
  auto& [live, waiting, first_consumer, consumer] = graph;
  run_first_consumer_ = first_consumer.data(), run_consumer_ = consumer.data();
  // Which ops the backward that runs the run reaches (Note [Groups on the loss's path]).
  std::vector<char> on_path;
  if (roots) {
    // A pending root is the result of the op its lazy storage names (a pass over every op to
    // find it missed the cache once per op).
    std::vector<int32_t> root_ops;
    for (const Tensor& r : *roots) {
      if (!r.defined()) continue;
      const StorageImpl* st = r.unsafe_impl()->storage.get();
      const int32_t k = st && st->lazy ? st->lazy_op : -1;
      if (k >= 0 && static_cast<size_t>(k) < n &&
          ops[static_cast<size_t>(k)].impl.get() == r.unsafe_impl())
        root_ops.push_back(k);
    }
    std::sort(root_ops.begin(), root_ops.end());
    root_ops.erase(std::unique(root_ops.begin(), root_ops.end()), root_ops.end());
    on_path = graph_->reached_from(root_ops);
  }
  run_on_path_ = &on_path;
  // The mean depth of each signature (its ops' sum of depths over their count).
  const size_t nsig = keys.size();
  std::vector<double> depth_sum(nsig, 0);
  std::vector<int64_t> count(nsig, 0);
  const std::vector<int32_t>& sig = index.sig;
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    depth_sum[static_cast<size_t>(sig[i])] += index.depth[i];
    ++count[static_cast<size_t>(sig[i])];
  }
  std::vector<std::vector<int32_t>> ready(nsig);
  for (size_t i = 0; i < n; ++i)
    if (live[i] && waiting[i] == 0) ready[static_cast<size_t>(sig[i])].push_back(int32_t(i));
  // Steps 3-5, with modes off (kernels counted by a KernelCountScope, no mode: eager's fast path),
  // grad mode off and autocast off.
  detail::SuspendModes eager;
  detail::KernelCountScope count_kernels(&kernels_);
  GradModeScope no_grad(false);
  detail::AutocastOff no_autocast;
  const int64_t kernels_before = kernels_;
  std::vector<int32_t> group;
  const std::vector<double> share = shares(graph, index);
  // The signatures with ready ops, the least deep on average on top (ties: the lower id).
  auto deeper = [&](int32_t a, int32_t b) {
    const double x = depth_sum[static_cast<size_t>(a)] *
                     static_cast<double>(count[static_cast<size_t>(b)]),
                 y = depth_sum[static_cast<size_t>(b)] *
                     static_cast<double>(count[static_cast<size_t>(a)]);
    return x > y || (x == y && a > b);
  };
  std::priority_queue<int32_t, std::vector<int32_t>, decltype(deeper)> agenda(deeper);
  std::vector<char> queued(nsig, 0);
  auto offer = [&](size_t t) {
    if (!queued[t] && !ready[t].empty()) {
      queued[t] = 1;
      agenda.push(static_cast<int32_t>(t));
    }
  };
  for (size_t t = 0; t < nsig; ++t) offer(t);
  while (!agenda.empty()) {
    const auto best = static_cast<size_t>(agenda.top());
    agenda.pop();
    queued[best] = 0;
    group.swap(ready[best]);
    ready[best].clear();
    order_group(group, keys[best].pick, graph, index, share);
    const SigKey& key = keys[best];
    auto run_ids = [&](const std::vector<int32_t>& ids) {
      if (key.pick)
        run_picks(ops, key.attrs, ids);
      else if (key.rows.operands && (key.mixed || key.rows.joined))
        run_rows(ops, key, ids);
      else  // (calls by rows of one length run by shape)
        run_group(ops, key.attrs_of_length(key.rows_len), ids);
    };
    if (!split_by_path(on_path, group, run_ids)) run_ids(group);
    // Consumers become ready in the order of their operands in the batches (a group split by
    // operand made several): a later group then gathers whole runs of a batch, not samples
    // from alternating ones.
    auto before = [&](int32_t a, int32_t b) {
      const PendingOp &x = ops[static_cast<size_t>(a)], &y = ops[static_cast<size_t>(b)];
      const int32_t bx = x.batch ? x.batch->seq : -1, by = y.batch ? y.batch->seq : -1;
      return bx < by || (bx == by && x.index < y.index);
    };
    if (!std::is_sorted(group.begin(), group.end(), before))
      std::stable_sort(group.begin(), group.end(), before);
    for (int32_t id : group) {
      for (int32_t k = first_consumer[static_cast<size_t>(id)];
           k < first_consumer[static_cast<size_t>(id) + 1]; ++k) {
        const int32_t c = consumer[static_cast<size_t>(k)];
        if (--waiting[static_cast<size_t>(c)] == 0) {
          const auto t = static_cast<size_t>(sig[static_cast<size_t>(c)]);
          ready[t].push_back(c);
          offer(t);
        }
      }
    }
  }
  end_run(ops);
  keep_graph();
  stats_.kernels_launched += kernels_ - kernels_before;
  tls_stats = stats();
  ops.clear();  // (end_run let go of their results; nothing records while a run runs)
  if (ops.capacity() > ops_.capacity()) ops_.swap(ops);
  index.clear();
  if (index.out.capacity() > index_.out.capacity()) std::swap(index, index_);
}

void Autobatch::Impl::run_group(std::vector<PendingOp>& ops, const Attrs& attrs,
                                const std::vector<int32_t>& ids) {
  PendingOp& first = ops[static_cast<size_t>(ids[0])];
  const OpDef& def = detail::op_def(first.op);
  detail::SiteGuard at(first.site);  // a batch's error names its first sample's line
  auto run_each = [&] {
    for (int32_t id : ids) {
      PendingOp& o = ops[static_cast<size_t>(id)];
      count_group(o.op, 1);
      detail::SiteGuard at(o.site);
      std::vector<const Tensor*> in;
      for (const Tensor& x : o.inputs) in.push_back(&x);
      place(o, detail::call(o.op, TensorRefs(in.data(), static_cast<int64_t>(in.size())), attrs));
    }
  };
  const auto b = static_cast<int64_t>(ids.size());
  BatchedArg r;
  bool grad = false, fresh = false;
  for (int32_t id : ids) grad |= ops[static_cast<size_t>(id)].grad;
  GradModeScope tape(grad);  // a differentiated group records its batched ops on the tape
  if (def.cls == OpClass::Source && b > 1) {
    // Sources of one signature make one value: made once and copied into the batch.
    Tensor one = detail::call(first.op, TensorRefs(), attrs);
    Shape s{b};
    for (int64_t d = 0; d < one.dim(); ++d) s.push_back(one.sizes()[d]);
    r = {expand(unsqueeze(one, 0), s).contiguous(), 0};
  } else {
    // (Random ops have signatures of their own: they come alone.) A differentiated op runs
    // batched even alone: its operands are slices of their batches (Note [Autobatch's tape]).
    if ((ids.size() == 1 && !grad) || !def.batch) {
      if (!grad) return run_each();
      return run_each_differentiated(ops, attrs, ids);
    }
    if (grad && def.cls == OpClass::View) {  // (Note [Views by source] in autobatch_tape.cpp)
      if (auto parts = split_by_source(ops, ids); !parts.empty()) {
        for (const std::vector<int32_t>& part : parts) run_group(ops, attrs, part);
        return;
      }
    }
    if (auto parts = split_by_operand(ops, ids); !parts.empty()) {
      // (Note [Joined parts])
      if (grad && def.cls != OpClass::View && joins_parts(ops, parts) &&
          run_parts_joined(ops, def, attrs, parts))
        return;
      for (const std::vector<int32_t>& part : parts) run_group(ops, attrs, part);
      return;
    }
    r = run_rule(ops, def, attrs, ids, grad, &fresh);
  }
  ++stats_.batches;
  stats_.batched_ops += b;
  count_group(first.op, b);
  place_batch(ops, ids, r, /*keep=*/grad,
              /*defer=*/grad && (def.cls == OpClass::View || fresh));
}

// Note [Joined parts]
// A differentiated group split by operand (Note [Groups by operand]) gives one batch per part.
// Where one signature reads the results of two parts (the forward and the backward cell of a
// BiLSTM step both take gates from their own weight's product, and one cell op of both
// directions reads them), each of its groups gathered from several batches: a piece per batch
// and their concatenation, each on the tape with its gradient, at every step. Such a group's
// parts are joined instead: each runs its rule, and one concatenation makes them one batch, in
// the order of the parts. Its readers then take a slice or one index_select of it. B1 runs 1,933
// kernels a step where it ran 2,110, and 16 gathers where it ran 134. Parts that no signature
// reads across stay apart, as a concatenation would copy for nothing; so do parts that only
// views read across, which split by source instead (Note [Views by source] in
// eager/autobatch_tape.cpp).

// Whether one signature other than a view's reads the results of two of the parts (Note
// [Joined parts]).
bool Autobatch::Impl::joins_parts(const std::vector<PendingOp>& ops,
                                  const std::vector<std::vector<int32_t>>& parts) const {
  const std::vector<int32_t>& sig = run_index_->sig;
  std::vector<std::pair<int32_t, size_t>> seen;  // a reading signature and its first part
  for (size_t q = 0; q < parts.size(); ++q)
    for (int32_t id : parts[q])
      for (int32_t k = run_first_consumer_[id]; k < run_first_consumer_[id + 1]; ++k) {
        const int32_t c = run_consumer_[k];
        if (detail::op_def(ops[static_cast<size_t>(c)].op).cls == OpClass::View) continue;
        const int32_t s = sig[static_cast<size_t>(c)];
        auto it =
            std::find_if(seen.begin(), seen.end(), [&](const auto& e) { return e.first == s; });
        if (it == seen.end())
          seen.emplace_back(s, q);
        else if (it->second != q)
          return true;
      }
  return false;
}

// The parts of a differentiated group, each by the op's rule, joined as one batch (Note [Joined
// parts]); false, having run nothing, where a part would split again.
bool Autobatch::Impl::run_parts_joined(std::vector<PendingOp>& ops, const OpDef& def,
                                       const Attrs& attrs,
                                       const std::vector<std::vector<int32_t>>& parts) {
  for (const std::vector<int32_t>& part : parts)
    if (!split_by_operand(ops, part).empty()) return false;
  std::vector<Tensor> values;
  std::vector<int32_t> all;
  for (const std::vector<int32_t>& part : parts) {
    bool fresh = false;
    const BatchedArg r = run_rule(ops, def, attrs, part, /*grad=*/true, &fresh);
    const auto m = static_cast<int64_t>(part.size());
    values.push_back(detail::batched_first(r, m));  // (one value for the part: repeated)
    all.insert(all.end(), part.begin(), part.end());
    ++stats_.batches;
    stats_.batched_ops += m;
    count_group(def.id, m);
  }
  place_batch(ops, all, {cat(values, 0), 0}, /*keep=*/true, /*defer=*/true);
  return true;
}

// The group's batching rule on its operands, shared or batched (step 4 of Note [Autobatch]).
BatchedArg Autobatch::Impl::run_rule(std::vector<PendingOp>& ops, const OpDef& def,
                                     const Attrs& attrs, const std::vector<int32_t>& ids, bool grad,
                                     bool* fresh) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  const auto b = static_cast<int64_t>(ids.size());
  std::vector<BatchedArg> in;
  bool batched = false;
  for (size_t p = 0; p < first.inputs.size(); ++p) {
    const bool shared = shared_operand(ops, ids, p);
    bool needs = false;  // a gradient flows through this operand
    for (int32_t id : ids)
      needs |= grad && ops[static_cast<size_t>(id)].inputs[p].unsafe_impl()->requires_grad;
    if (shared && needs)  // one tensor for all, with its history (Note [Row gates])
      in.push_back({shared_gated(ops, ids, p), -1});
    else if (shared)
      in.push_back({first.inputs[p], -1});
    else
      in.push_back({needs ? row_gated(gather_grad(ops, ids, p), ids) : gather(ops, ids, p), 0});
    batched |= !shared;
  }
  if (!batched) {  // every sample computes one value (a weight's transpose): computed once
    std::vector<const Tensor*> ptrs;
    for (const BatchedArg& x : in) ptrs.push_back(&x.value);
    return {detail::call(def.id, TensorRefs(ptrs.data(), static_cast<int64_t>(ptrs.size())), attrs),
            -1};
  }
  BatchedArg r = def.batch(def, in, attrs, b);
  // Whether the result shares no memory with an operand's batch (so with no sample that lies
  // in it), which place_batch would copy per sample, as eager makes a copy.
  const StorageImpl* root = r.value.defined() ? root_of(r.value.unsafe_impl()) : nullptr;
  *fresh = root != nullptr;
  for (const BatchedArg& x : in) *fresh = *fresh && root_of(x.value.unsafe_impl()) != root;
  return r;
}

// Each op of the group gets its sample of the batched result r (step 5 of Note [Autobatch]).
void Autobatch::Impl::place_batch(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                                  const BatchedArg& r, bool keep, bool defer) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  const auto b = static_cast<int64_t>(ids.size());
  // keep: the ops' consumers read them as samples of this batch (Note [Autobatch's tape]).
  auto kept = [&](const Tensor& v) {
    if (!keep) return;
    const Batch* held = hold(v);
    for (size_t k = 0; k < ids.size(); ++k) {
      PendingOp& o = ops[static_cast<size_t>(ids[k])];
      o.batch = held;
      o.index = static_cast<int64_t>(k);
    }
  };
  if (r.bdim < 0 && keep) {
    // The same result for every sample, held once: a sample that outlives the run gets a copy
    // of its own (end_run), so no write to one reaches the others.
    const Tensor one = r.value.contiguous();
    for (int32_t id : ids)
      fill(ops[static_cast<size_t>(id)].out(), one.unsafe_impl()->data(),
           owner_of(one.unsafe_impl()));
    const Batch* held = hold(r.value);
    for (int32_t id : ids) {  // index -1: the batch is the one value itself
      ops[static_cast<size_t>(id)].batch = held;
      ops[static_cast<size_t>(id)].index = -1;
    }
    return;
  }
  if (r.bdim < 0) {  // the same result for every sample (each gets its own copy)
    for (int32_t id : ids) place(ops[static_cast<size_t>(id)], r.value.clone());
    return;
  }
  const bool view = detail::op_def(first.op).cls == OpClass::View;
  // Sample k of a result with the batch first and each sample contiguous starts k samples in.
  Tensor v = r.value;
  if (r.bdim != 0) {
    Dims order{r.bdim};
    for (int64_t d = 0; d < v.dim(); ++d)
      if (d != r.bdim) order.push_back(d);
    v = permute(v, order);
  }
  const TensorImpl* vi = v.unsafe_impl();
  bool dense = v.dim() == first.shape().size() + 1 && v.sizes()[0] == b;
  for (int64_t d = 1; dense && d < v.dim(); ++d) dense = v.sizes()[d] == first.shape()[d - 1];
  Strides want = detail::contiguous_strides(first.shape());
  for (int64_t d = 1; dense && d < v.dim(); ++d)
    dense = v.sizes()[d] == 1 || vi->strides[d] == want[d - 1];
  // A rule's result of another dtype would be read as the samples' dtype: garbage, not an error.
  DUET_ASSERT(vi->dtype == first.dtype(),
              "[autobatch] {}'s batching rule gave {} where its shape "
              "rule said {}",
              detail::op_def(first.op).name, vi->dtype, first.dtype());
  if (!dense) v = v.contiguous();
  vi = v.unsafe_impl();
  if (defer) {  // each sample is placed when read, or at the run's end (Note [Placed when
    kept(v);    // read]); deferring implies keeping
    return;
  }
  const StoragePtr root = owner_of(vi);
  const int64_t step = (dense ? vi->strides[0] : first.shape().numel()) * itemsize(first.dtype());
  char* base = static_cast<char*>(vi->data());
  for (size_t k = 0; k < ids.size(); ++k) {
    PendingOp& o = ops[static_cast<size_t>(ids[k])];
    // Copied, as eager makes one (a view shares its operand's memory, eagerly too).
    if (!view && aliases_operand(o, root.get()))
      place(o, select(v, 0, static_cast<int64_t>(k)).clone());
    else
      fill(o.out(), base + static_cast<int64_t>(k) * step, root);
  }
  kept(v);
}

// Operand p of the group as one batch at dim 0 (step 4 of Note [Autobatch]).
Tensor Autobatch::Impl::gather(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                               size_t p) {
  const TensorImpl* x0 = ops[static_cast<size_t>(ids[0])].inputs[p].unsafe_impl();
  (void)x0->data();  // placed first (Note [Placed when read]), so that its buffer is known
  StorageImpl* root = root_of(x0);
  const int64_t item = itemsize(x0->dtype);
  const auto* base = static_cast<const char*>(root->data);
  // One pass over the samples: where each starts, whether all lie in one buffer at a fixed
  // stride, and whether each is contiguous.
  addresses_.resize(ids.size());
  bool strided = ids.size() > 1 && !x0->wrapped_number;
  bool copyable = x0->device().is_cpu() && !x0->wrapped_number;
  for (size_t k = 0; k < ids.size(); ++k) {
    const TensorImpl* x = ops[static_cast<size_t>(ids[k])].inputs[p].unsafe_impl();
    addresses_[k] = static_cast<const char*>(x->data());
    copyable = copyable && x->contiguous;
    strided = strided && root_of(x) == root && x->strides == x0->strides &&
              addresses_[k] - addresses_[0] ==
                  static_cast<std::ptrdiff_t>(k) * (addresses_[1] - addresses_[0]);
  }
  const char* a0 = addresses_[0];
  const int64_t step = ids.size() > 1 ? addresses_[1] - a0 : 0;
  if (strided && step > 0 && step % item == 0 && (a0 - base) % item == 0) {
    auto* t = new TensorImpl();
    TensorImplPtr v = TensorImplPtr::adopt(t);
    t->dtype = x0->dtype;
    t->shape.push_back(static_cast<int64_t>(ids.size()));
    t->strides.push_back(step / item);
    for (int64_t d = 0; d < x0->shape.size(); ++d) {
      t->shape.push_back(x0->shape[d]);
      t->strides.push_back(x0->strides[d]);
    }
    t->offset = (a0 - base) / item;
    t->storage = owner_of(x0);
    t->is_view = true;
    t->refresh_contiguous();
    return Tensor(std::move(v));
  }
  ++stats_.gathers;
  // On the CPU, contiguous samples are copied into the batch one after another: one pass, where
  // stack would make a view per sample first.
  if (copyable) {
    Shape shape{static_cast<int64_t>(ids.size())};
    for (int64_t d = 0; d < x0->shape.size(); ++d) shape.push_back(x0->shape[d]);
    Tensor batch = detail::empty(shape, x0->dtype, x0->device());
    const auto bytes = static_cast<size_t>(x0->shape.numel() * item);
    auto* dst = static_cast<char*>(batch.unsafe_impl()->data());
    if (bytes)  // (empty samples have no data: null, which memcpy may not read)
      for (size_t k = 0; k < ids.size(); ++k) std::memcpy(dst + k * bytes, addresses_[k], bytes);
    ++kernels_;
    return batch;
  }
  std::vector<Tensor> parts;
  for (int32_t id : ids) parts.push_back(ops[static_cast<size_t>(id)].inputs[p]);
  return stack(parts, 0);
}

// The lazy storage of `op` gets the memory of its result r (step 5 of Note [Autobatch]).
void Autobatch::Impl::place(PendingOp& op, const Tensor& r) {
  DUET_ASSERT(r.sizes() == op.shape() && r.dtype() == op.dtype(),
              "[autobatch] {} gave {} {} where its shape rule said {} {}",
              detail::op_def(op.op).name, r.sizes(), r.dtype(), op.shape(), op.dtype());
  // A result that shares memory with an operand is copied, as eager makes one.
  const Tensor m =
      !r.is_contiguous() || aliases_operand(op, root_of(r.unsafe_impl())) ? r.clone() : r;
  fill(op.out(), m.unsafe_impl()->data(), owner_of(m.unsafe_impl()));
}

Autobatch::Autobatch() {
  // Inside another scope, or while a trace or vmap runs: nothing to do (see the header).
  if (detail::mode_depth() > 0) return;
  impl_ = new Impl();
  impl_->ops_.swap(tls_spare_ops);
  std::swap(impl_->index_, tls_spare_index);
  impl_->prev_runner_ = detail::set_lazy_runner(impl_);
  impl_->mode_.emplace(impl_);
  tls_open = impl_;
}

Autobatch::~Autobatch() noexcept(false) {
  if (!impl_) return;
  std::unique_ptr<Impl> impl(impl_);
  std::exception_ptr error;
  try {
    impl->run();
  } catch (...) {
    error = std::current_exception();
  }
  impl->mode_.reset();
  detail::set_lazy_runner(impl->prev_runner_);
  tls_open = nullptr;
  tls_stats = impl->stats();
  if (impl->ops_.empty() && impl->ops_.capacity() > tls_spare_ops.capacity())
    tls_spare_ops.swap(impl->ops_);
  if (impl->index_.out.empty() && impl->index_.out.capacity() > tls_spare_index.out.capacity())
    std::swap(impl->index_, tls_spare_index);
  // The error of the last run, unless the scope ends because of another error.
  if (error && std::uncaught_exceptions() == impl->uncaught_) std::rethrow_exception(error);
}

void Autobatch::flush() {
  if (impl_) impl_->run();
}

const AutobatchStats& Autobatch::Impl::stats() {
  stats_.by_op.clear();
  for (size_t i = 0; i < per_op_.size(); ++i)
    if (per_op_[i].first)
      stats_.by_op.push_back(
          {std::string(op_name(static_cast<OpId>(i))), per_op_[i].first, per_op_[i].second});
  std::stable_sort(
      stats_.by_op.begin(), stats_.by_op.end(),
      [](const AutobatchOpStats& a, const AutobatchOpStats& b) { return a.groups > b.groups; });
  return stats_;
}

AutobatchStats autobatch_stats() { return tls_open ? tls_open->stats() : tls_stats; }

}  // namespace duet
