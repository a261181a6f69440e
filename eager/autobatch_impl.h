// duet: Autobatch's internal state (eager/autobatch.h): the pending ops of a scope and the
// scope itself, shared by its recording and run (eager/autobatch.cpp) and its tape
// (eager/autobatch_tape.cpp). Not part of the public API.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/dispatch.h"
#include "core/ops.h"
#include "eager/autobatch.h"
#include "eager/node.h"

namespace duet {

using detail::GradModeScope;
using detail::LazyRunner;
using detail::StorageImpl;
using detail::StoragePtr;
using detail::TensorImpl;
using detail::TensorImplPtr;

namespace autobatch {

// The statistics of the last scope that ended on this thread.
extern thread_local AutobatchStats tls_stats;

// Whether a signature leaves out operand i's dim 0: a pick's input and index (Note [Picks] in
// eager/autobatch_pick.cpp), or an operand by rows (Note [Rows] in core/ops/rows.cpp).
inline bool leaves_dim0(bool pick, const RowsUse& rows, int64_t i) {
  return (pick && i <= 1) || rows.has(i);
}

// The signature of a recorded op (step 2 of Note [Autobatch]).
struct OperandSig {
  DType dtype;
  Device device;
  bool wrapped;
  uint64_t bits;  // a wrapped number's value
  Shape shape;
  bool operator==(const OperandSig& o) const {
    return dtype == o.dtype && device == o.device && wrapped == o.wrapped && bits == o.bits &&
           shape == o.shape;
  }
};
struct SigKey {
  OpId op;
  Attrs attrs;
  std::vector<OperandSig> in;
  size_t hash = 0;
  bool pick = false;  // a pick of rows (Note [Picks] in eager/autobatch_pick.cpp)
  RowsUse rows;       // by rows: the operands whose dim 0 it leaves out (Note [Rows])
  bool operator==(const SigKey& o) const {
    return op == o.op && pick == o.pick && rows == o.rows && attrs == o.attrs && in == o.in;
  }
  // Whether the signature leaves out operand i's dim 0.
  bool free0(size_t i) const { return leaves_dim0(pick, rows, static_cast<int64_t>(i)); }
  // By rows: the first call's length, and whether a call of another length came (not part of
  // the signature: recorded with its calls, so that a group of one length runs by shape at once).
  int64_t rows_len = -1;
  bool mixed = false;
  // The attributes of the calls of length len (a reshape's size along dim 0 is left out).
  Attrs attrs_of_length(int64_t len) const {
    Attrs a = attrs;
    if (op == OpId::Reshape && rows.operands) a.ints[0] = len;
    return a;
  }
};
// A call's signature before it is a SigKey: the table is searched with it, and a key is made
// only for a signature not seen before.
struct SigProbe {
  OpId op;
  const Attrs* attrs;
  TensorRefs inputs;
  bool pick;
  RowsUse rows;
  size_t hash;
  bool free0(int64_t i) const { return leaves_dim0(pick, rows, i); }
  // The operands the signature holds: a join's first only (Note [Groups by rows]).
  int64_t count() const { return rows.joined ? 1 : inputs.size(); }
};
bool same_signature(const SigKey& k, const SigProbe& p);
struct SigHash {
  using is_transparent = void;
  size_t operator()(const SigKey& k) const { return k.hash; }
  size_t operator()(const SigProbe& p) const { return p.hash; }
};
struct SigEq {
  using is_transparent = void;
  bool operator()(const SigKey& a, const SigKey& b) const { return a == b; }
  bool operator()(const SigProbe& p, const SigKey& k) const { return same_signature(k, p); }
  bool operator()(const SigKey& k, const SigProbe& p) const { return same_signature(k, p); }
};

inline size_t mix(size_t h, uint64_t v) {
  return h ^ (std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}

// An op's operands: up to four inline (no allocation per op), the rest (lstm_step's weights,
// cat's operands) in one allocation of the size that reserve() asks for. Kept small: a run
// passes over every pending op several times, and B2's ops read at most three operands.
class Operands {
 public:
  void reserve(size_t n) {
    if (n > kInline) more_.reserve(n - kInline);
  }
  // `producer`: the pending op that computes t (-1: t is computed), kept so that a run finds
  // the dependencies without reading each tensor again.
  void push_back(const Tensor& t, int32_t producer) {
    if (n_ < kInline) {
      inline_[n_] = t;
      producer_[n_] = producer;
    } else {
      more_.push_back({t, producer});
    }
    ++n_;
  }
  size_t size() const { return n_; }
  const Tensor& operator[](size_t i) const {
    return i < kInline ? inline_[i] : more_[i - kInline].tensor;
  }
  int32_t producer(size_t i) const {
    return i < kInline ? producer_[i] : more_[i - kInline].producer;
  }
  void clear() {
    for (size_t i = 0; i < std::min(n_, kInline); ++i) inline_[i] = Tensor();
    more_ = {};
    n_ = 0;
  }
  struct Iter {
    const Operands* o;
    size_t i;
    const Tensor& operator*() const { return (*o)[i]; }
    Iter& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const Iter& b) const { return i != b.i; }
  };
  Iter begin() const { return {this, 0}; }
  Iter end() const { return {this, n_}; }

 private:
  struct Spilled {
    Tensor tensor;
    int32_t producer;
  };
  static constexpr size_t kInline = 4;
  Tensor inline_[kInline];
  int32_t producer_[kInline];
  std::vector<Spilled> more_;
  size_t n_ = 0;
};

// A differentiated group's batched result, held by the run (Autobatch::Impl::batches_) while
// its samples' consumers read it (Note [Autobatch's tape]); `seq` numbers the run's batches.
struct Batch {
  Tensor value;
  int32_t seq;
};

struct PendingOp {
  OpId op;
  Operands inputs;
  CallSite site;       // the user's line that called it: an error at the run names it
  TensorImplPtr impl;  // the result (Note [Autobatch's tape]: a survivor gets its history)
  bool grad = false;   // the result needs a gradient (a tape node, had it run eagerly)
  const Batch* batch = nullptr;  // once run as part of a differentiated batch: that batch,
                                 // samples first
  int64_t index = 0;             // and the result's sample in it (-1: batch is the result, as every
                                 // sample of its group computed the same value)
  int64_t start = 0;  // a pick's first row, which its signature leaves out (Note [Picks])
  int64_t rows = -1;  // once run by rows (Note [Rows]): the result is rows index..index + rows
                      // of its batch, rather than sample index
  // The result's lazy storage, shape and dtype.
  StorageImpl* out() const { return impl->storage.get(); }
  const Shape& shape() const { return impl->shape; }
  DType dtype() const { return impl->dtype; }
};

// The storage that owns a tensor's memory.
inline StorageImpl* root_of(const TensorImpl* x) {
  StorageImpl* s = x->storage.get();
  return s->base ? s->base.get() : s;
}
inline const StoragePtr& owner_of(const TensorImpl* x) {
  return x->storage->base ? x->storage->base : x->storage;
}

// Whether an op's result, in the buffer owned by `root`, shares memory with one of its operands.
inline bool aliases_operand(const PendingOp& op, const StorageImpl* root) {
  for (const Tensor& x : op.inputs)
    if (root_of(x.unsafe_impl()) == root) return true;
  return false;
}

// A lazy storage computed: its value is at `data`, in the buffer `root` owns.
inline void fill(StorageImpl* st, void* data, const StoragePtr& root) {
  st->data = st->nbytes ? data : nullptr;
  st->base = root;
  st->lazy = false;
  st->lazy_op = -1;
}

// Whether two operands are the same tensor: one memory, read the same way, and the same
// history. Two tensors over one memory are interchangeable as values only where neither
// requires grad: a detached alias of a tensor (x.detach()) and the tensor itself hold the same
// values, but a group that ran them as one operand gave the tensor the alias's lack of history,
// and its gradient was lost (autocast's casts of both, as matmul(x.detach(), x) asks).
inline bool same_operand(const TensorImpl* x, const TensorImpl* y) {
  return x == y || (!x->requires_grad && !y->requires_grad && x->storage == y->storage &&
                    x->offset == y->offset && x->strides == y->strides && x->dtype == y->dtype);
}

// The pending op whose result operand p of op o is, once a differentiated batch computed it
// (PendingOp::batch), or null (Note [Autobatch's tape]).
inline const PendingOp* batch_source(const std::vector<PendingOp>& ops, const PendingOp& o,
                                     size_t p) {
  const int32_t prod = o.inputs.producer(p);
  if (prod < 0) return nullptr;
  const PendingOp& src = ops[static_cast<size_t>(prod)];
  return src.batch && o.inputs[p].unsafe_impl() == src.impl.get() ? &src : nullptr;
}

// A differentiated op's result as its part of its batch (PendingOp::batch): the batch itself
// (index -1), its rows (Note [Rows]), or its sample.
inline Tensor part_of_batch(const PendingOp& src) {
  const Tensor& b = src.batch->value;
  if (src.index < 0) return b;
  if (src.rows >= 0) return slice(b, 0, src.index, src.index + src.rows);
  return select(b, 0, src.index);
}

// The value computed once for the whole group that made operand p of op id (a weight's
// transpose, Note [Autobatch's tape]), or null.
inline const TensorImpl* uniform_value(const std::vector<PendingOp>& ops, int32_t id, size_t p) {
  const PendingOp* src = batch_source(ops, ops[static_cast<size_t>(id)], p);
  return src && src->index < 0 ? src->batch->value.unsafe_impl() : nullptr;
}

// Whether operand p is one tensor for the whole group: a wrapped number (a signature holds its
// value), one tensor, or one value its group computed once (step 4 of Note [Autobatch]).
bool shared_operand(const std::vector<PendingOp>& ops, const std::vector<int32_t>& ids, size_t p);

// Index values as an i64 vector on `device`.
inline Tensor index_tensor(const std::vector<int64_t>& at, Device device) {
  Tensor i = detail::empty({static_cast<int64_t>(at.size())}, DType::i64, Device::cpu());
  std::copy(at.begin(), at.end(), static_cast<int64_t*>(i.unsafe_impl()->data()));
  return device.is_cpu() ? i : i.to(device);
}

// Whether an op call picks rows of its input along dim 0 such that ops of one signature may
// read inputs of different lengths (Note [Picks] in eager/autobatch_pick.cpp).
bool is_pick(const OpCall& c);

// The group's ops split by the first operand that calls for it, or {} (Note [Groups by
// operand] in eager/autobatch.cpp).
std::vector<std::vector<int32_t>> split_by_operand(const std::vector<PendingOp>& ops,
                                                   const std::vector<int32_t>& ids);
// The group's ops split by the batch that made their first operand, or {} (Note [Views by
// source] in eager/autobatch_tape.cpp).
std::vector<std::vector<int32_t>> split_by_source(const std::vector<PendingOp>& ops,
                                                  const std::vector<int32_t>& ids);

// What recording and a run's passes read of each pending op, in arrays of their own: reading
// it from the PendingOps (and their result tensors) missed the cache at every op and edge.
struct OpIndex {
  std::vector<const StorageImpl*> out;  // the op's result's storage
  std::vector<int32_t> sig, depth;      // its signature and depth (step 3 of Note [Autobatch])
  std::vector<char> grad;               // whether it records a gradient (PendingOp::grad)
  std::vector<int32_t> edge_at{0};      // its pending operands' producers: edges[edge_at[i]..]
  std::vector<int32_t> edges;
  std::vector<char> edge_grad;  // by edge: whether the operand requires grad (a gradient can flow)
  void clear() {
    out.clear();
    sig.clear();
    depth.clear();
    grad.clear();
    edge_at.assign(1, 0);
    edges.clear();
    edge_grad.clear();
  }
};

// The run's graph (Note [Autobatch]): step 1, dead ops, found newest first, let go of their
// operands; then how many pending operands each live op waits for, and each op's consumers:
// op i's are consumer[first_consumer[i]..first_consumer[i + 1]].
struct RunGraph {
  std::vector<char> live;
  std::vector<int32_t> waiting, first_consumer, consumer;
};

RunGraph run_graph(std::vector<PendingOp>& ops, const OpIndex& index);

// Each live op's share of the work that follows it (Note [Longest chains first] in
// eager/autobatch_order.cpp).
std::vector<double> shares(const RunGraph& g, const OpIndex& index);

// A ready group in the row order its batch takes (Note [Longest chains first]).
void order_group(std::vector<int32_t>& group, bool pick, const RunGraph& g, const OpIndex& index,
                 const std::vector<double>& share);

// A run's per-sample graph, kept for the backward through its batches (Note [Gradients off
// the loss's path] in eager/autobatch_reach.cpp).
struct SampleGraph final : detail::Keeper {
  // Each op's pending operands' producers (as OpIndex's), of the operands that require grad: a
  // detached read sends no gradient, so a backward reaches no op through it.
  std::vector<int32_t> edge_at, edges;
  std::vector<uint64_t> reached;  // by op: the backward (backward_id) that reached it
  std::vector<char> grad;         // by op: whether it records a gradient (PendingOp::grad)
  std::vector<std::vector<int32_t>> readers;  // by gate: the ops that read its tensor
  bool open = false;  // a backward with create_graph ran: every gate passes its gradient on
  std::vector<int32_t> survivors;  // the ops whose results outlived the run with their history
  // Whether the run's nodes keep their saved values past the running backward: a survivor was
  // not reached (yet). Cached per backward and marks made (Note [Batches shared by losses]).
  bool keep() override;
  uint64_t marks = 0, cached_backward = 0, cached_marks = 0;
  bool cached = false;
  std::vector<char> consumed;  // by survivor: reached by a backward that did not retain
  // Op `op` and the ops behind it were reached in backward `backward`.
  void mark(int32_t op, uint64_t backward);
  // By op: whether a backward from the ops `roots` reaches it (Note [Groups on the loss's path]
  // in eager/autobatch.cpp).
  std::vector<char> reached_from(const std::vector<int32_t>& roots) const;
  // Whether backward `backward` reached one of gate's readers.
  bool read_by_reached(size_t gate, uint64_t backward) const;
};

}  // namespace autobatch
using namespace autobatch;

struct Autobatch::Impl final : DispatchMode, LazyRunner {
  Tensor handle(const OpCall& c) override;
  void run_lazy() override { run(); }
  bool resolve(const StorageImpl* st) override;
  void place_sample(PendingOp& o);
  // roots: a backward's, which ran it (Note [Groups on the loss's path] in eager/autobatch.cpp).
  void run(const std::vector<Tensor>* roots = nullptr);
  template <class Run>
  bool split_by_path(const std::vector<char>& on_path, const std::vector<int32_t>& group,
                     Run&& run_ids);

  int32_t record(const OpCall& c, const TensorImplPtr& out, bool grad);
  Tensor gather_grad(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids, size_t p);
  // Operand p of op o with its history: its sample of a batch, or the operand through its gate
  // (read by `readers`, or by o alone when null).
  Tensor with_history(std::vector<PendingOp>& ops, const PendingOp& o, size_t p,
                      const std::vector<int32_t>* readers = nullptr);
  // Operand p shared by the group's ops `ids`, with its history (Note [Row gates]).
  Tensor shared_gated(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids, size_t p);
  // Note [Gradients off the loss's path] in eager/autobatch_reach.cpp: a tensor from outside the
  // run through its gate (x itself when it needs none), a survivor's mark, and the run's graph
  // (graph_, made as the run starts: start_graph) kept for the backward as the run ends.
  Tensor gated(const Tensor& x, const int32_t* readers, size_t count);
  Tensor gated(const Tensor& x, int32_t reader) { return gated(x, &reader, 1); }
  // Note [Row gates] in eager/autobatch_reach.cpp: x through a gate that knows the op of each
  // of its rows along dim 0, or (whole, or one op) the ops that read all of it.
  Tensor row_gated(const Tensor& x, std::vector<int32_t> row_ops, bool whole = false);
  void mark_survivor(PendingOp& o, int32_t id, const Tensor& history);
  void start_graph(const OpIndex& index);
  void keep_graph();
  void end_run(std::vector<PendingOp>& ops);  // Note [The run's end] in eager/autobatch_tape.cpp
  void run_group(std::vector<PendingOp>& ops, const Attrs& attrs, const std::vector<int32_t>& ids);
  // Note [Joined parts] in eager/autobatch.cpp.
  bool joins_parts(const std::vector<PendingOp>& ops,
                   const std::vector<std::vector<int32_t>>& parts) const;
  bool run_parts_joined(std::vector<PendingOp>& ops, const OpDef& def, const Attrs& attrs,
                        const std::vector<std::vector<int32_t>>& parts);
  void run_picks(std::vector<PendingOp>& ops, const Attrs& attrs, std::vector<int32_t> ids);
  bool copy_picks(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                  const std::vector<int64_t>& rows, const std::vector<int64_t>& at);
  Tensor gather(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids, size_t p);
  void run_rows(std::vector<PendingOp>& ops, const SigKey& key, const std::vector<int32_t>& ids);
  // Operand .second of op .first, for each item: their rows, one after another.
  Tensor gather_rows(std::vector<PendingOp>& ops,
                     const std::vector<std::pair<int32_t, uint32_t>>& items, bool grad);
  void place_rows(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids, Tensor r,
                  bool keep);
  // *fresh: the result shares no memory with the operands' batches.
  BatchedArg run_rule(std::vector<PendingOp>& ops, const OpDef& def, const Attrs& attrs,
                      const std::vector<int32_t>& ids, bool grad, bool* fresh);
  void run_each_differentiated(std::vector<PendingOp>& ops, const Attrs& attrs,
                               const std::vector<int32_t>& ids);
  void place_batch(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                   const BatchedArg& r, bool keep = false, bool defer = false);
  void place(PendingOp& op, const Tensor& r);
  // One group of n calls of op ran (AutobatchStats::by_op).
  void count_group(OpId op, int64_t n) {
    auto& [groups, calls] = per_op_[static_cast<size_t>(op)];
    ++groups;
    calls += n;
  }
  // stats_ with by_op made from per_op_.
  const AutobatchStats& stats();

  // The op of a lazy storage of this scope, or -1 (index_ holds the ops recorded whole; ops_
  // may hold one more, being recorded).
  int32_t producer(const StorageImpl* st) const {
    const int32_t id = st->lazy_op;
    return id >= 0 && static_cast<size_t>(id) < index_.out.size() &&
                   index_.out[static_cast<size_t>(id)] == st
               ? id
               : -1;
  }

  // The batch that holds v for the rest of the run.
  const Batch* hold(const Tensor& v) {
    batches_.push_back({v, static_cast<int32_t>(batches_.size())});
    return &batches_.back();
  }

  std::vector<PendingOp> ops_;
  OpIndex index_;              // beside ops_, one entry per op
  std::deque<Batch> batches_;  // a run's differentiated batches (stable addresses)
  // The run in progress (Note [Placed when read]): its ops and their index.
  std::vector<PendingOp>* run_ops_ = nullptr;
  const OpIndex* run_index_ = nullptr;
  // By op, whether the backward that started the run reaches it (empty: a read started it).
  const std::vector<char>* run_on_path_ = nullptr;
  // Its ops' consumers: op i's are run_consumer_[run_first_consumer_[i]..[i + 1]].
  const int32_t* run_first_consumer_ = nullptr;
  const int32_t* run_consumer_ = nullptr;
  std::vector<SigKey> keys_;  // by signature id: the op's attributes too
  std::unordered_map<SigKey, int32_t, SigHash, SigEq> sigs_;
  // By op: the signature its last call found (-1: none), cleared with keys_.
  std::vector<int32_t> last_sig_;
  std::vector<const char*> addresses_;  // gather's scratch
  // The run's per-sample graph and gates, by the tensor each lets in (Note [Gradients off the
  // loss's path]).
  std::shared_ptr<SampleGraph> graph_;
  std::unordered_map<const TensorImpl*, std::pair<Tensor, size_t>> gates_;
  bool running_ = false;
  int64_t kernels_ = 0;  // the kernels a run (and the scope's backward) calls (KernelCountScope)
  AutobatchStats stats_;
  std::vector<std::pair<int64_t, int64_t>> per_op_ =  // groups and calls, by OpId
      std::vector<std::pair<int64_t, int64_t>>(kNumOps);
  LazyRunner* prev_runner_ = nullptr;
  int uncaught_ = std::uncaught_exceptions();
  std::optional<ModeGuard> mode_;
};

namespace autobatch {
// The open scope of this thread (null: none).
extern thread_local Autobatch::Impl* tls_open;
}  // namespace autobatch

}  // namespace duet
