// duet: the backward engine. It walks the tape from the outputs in reverse creation order,
// calls each node's gradient rule (duet ops), sums gradients back to each input's shape and
// dtype, and accumulates into leaves' .grad, or captures them for grad().
#include <atomic>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/autocast.h"
#include "core/autograd_hooks.h"
#include "core/ops.h"
#include "eager/autobatch.h"
#include "eager/autograd.h"

#include "core/dist.h"
#include "eager/node.h"

namespace duet {

NoGradGuard::NoGradGuard() : prev_(detail::grad_mode()) { detail::set_grad_mode(false); }
NoGradGuard::~NoGradGuard() { detail::set_grad_mode(prev_); }
bool grad_enabled() { return detail::grad_mode(); }

namespace detail {
namespace {

// Sums a gradient over the dims that broadcasting added or expanded, and converts its dtype and
// device.
Tensor sum_to(Tensor g, const TensorMeta& m) {
  if (__builtin_expect(!m.sym.empty() || !g.impl()->sym.empty(), 0)) {
    // Symbolic dims: the same rule, with size-1 tests decided (and guarded) on SymInts.
    const SymDims gs = sym_dims(g), ms = meta_dims(m);
    if (gs != ms) {
      const int64_t lead = static_cast<int64_t>(gs.size() - ms.size());
      Dims dims;
      for (int64_t d = 0; d < static_cast<int64_t>(gs.size()); ++d)
        // A dim of size 1 in the input is summed whatever g's size (a sum over one element
        // changes nothing), so that no guard on g's size is needed.
        if (d < lead || (!(gs[d] == ms[d - lead]) && !(gs[d] == SymInt(1)) &&
                         sym_decide(ms[d - lead], SymRel::Eq, 1, "backward")))
          dims.push_back(d);
      if (dims.size()) g = sum(g, dims, /*keepdim=*/true);
      g = reshape_dims(g, ms);
    }
    if (g.dtype() != m.dtype) g = g.to(m.dtype);
    if (!(g.device() == m.device)) g = g.to(m.device);
    return g;
  }
  if (g.sizes() != m.shape) {
    const int64_t lead = g.dim() - m.shape.size();
    DUET_ASSERT(lead >= 0, "gradient of shape {} for an input of shape {}", g.sizes(), m.shape);
    Dims dims;
    for (int64_t d = 0; d < g.dim(); ++d)
      if (d < lead || (m.shape[d - lead] == 1 && g.sizes()[d] != 1)) dims.push_back(d);
    if (dims.size()) g = sum(g, dims, /*keepdim=*/true);
    g = reshape(g, m.shape);
  }
  if (g.dtype() != m.dtype) g = g.to(m.dtype);
  // A CPU number that met CUDA tensors (Note [CPU scalars beside device tensors]) gets its
  // gradient on the CPU.
  if (!(g.device() == m.device)) g = g.to(m.device);
  return g;
}

uint32_t version_now(const SavedTensor& s) {
  return s.value.unsafe_impl()->storage->version_.load(std::memory_order_relaxed);
}
bool is_stale(const SavedTensor& s) { return s.value.defined() && version_now(s) != s.version; }

std::string stale_message(const Node& n, const SavedTensor& s) {
  return fmt::format(
      "[backward] a tensor of shape {} saved by {} was modified in place after it was saved "
      "(version {}, now {}); clone() it before the in-place op, or use an out-of-place op",
      s.value.sizes(), n.def->name, s.version, version_now(s));
}
[[noreturn]] void throw_stale(const Node& n, const SavedTensor& s) {
  throw Error(::duet::detail::with_context(stale_message(n, s)));
}

// The saved output, checked here (every rule that saves it reads it); saved inputs are checked
// when a rule reads them (SavedInputs).
Tensor unpack_output(const Node& n, bool create_graph) {
  const SavedTensor& s = n.saved_output;
  if (!s.value.defined()) return s.value;
  if (is_stale(s)) throw_stale(n, s);
  if (!create_graph) return s.value;
  // With create_graph, the saved output must lead back to this node, so that second-order
  // gradients flow through it (Note [Saved tensors]).
  const TensorImpl* x = s.value.unsafe_impl();
  Tensor a = make_view(s.value, x->shape, x->strides, x->offset);
  a.unsafe_impl()->is_view = false;
  a.unsafe_impl()->requires_grad = true;
  autograd_meta(*a.unsafe_impl()).grad_fn = std::const_pointer_cast<Node>(n.shared_from_this());
  return a;
}

// A leaf's .grad keeps its buffer across steps (optimizers and compiled steps rely on it):
// the first gradient is stored (copied unless nobody else holds it), later ones are added in
// place. With create_graph the sum is out of place, so it stays differentiable.
//
// Two backward passes on two threads may reach one leaf (a shared weight): its .grad is read,
// added to and replaced under a lock of its own (one of a fixed set, chosen by the leaf's
// address), as PyTorch's AccumulateGrad locks, so no update is lost.
std::mutex& leaf_lock(const TensorImpl* leaf) {
  static std::mutex locks[64];
  return locks[(reinterpret_cast<uintptr_t>(leaf) >> 6) % 64];
}

void accumulate(TensorImpl* leaf, Tensor g, bool create_graph) {
  std::lock_guard<std::mutex> lock(leaf_lock(leaf));
  AutogradMeta& m = autograd_meta(*leaf);
  // A captured leaf's missing .grad becomes a real buffer the trace captures ("Missing .grad"
  // in docs/design.md). A traced leaf (an argument of a compiled function) keeps its gradient
  // as a traced value, which the compiled call writes into the argument's .grad (Note
  // [Argument gradients] in trace/compile.cpp).
  if (!m.grad && mode_depth() > 0 && !create_graph && !leaf->trace) materialize_grad(leaf);
  if (!m.grad) {
    if (!create_graph && !(g.is_unique() && g.is_contiguous() && !g.requires_grad()))
      g = g.contiguous().is_same(g) ? g.clone() : g.contiguous();
    m.grad = g.impl_ptr();
    return;
  }
  Tensor cur(m.grad);
  if (create_graph) {
    m.grad = (cur + g).impl_ptr();
  } else if (leaf->trace) {
    // An argument's .grad is an input of the trace, which may not be written in place: the sum
    // is a new value, which the call copies into the argument's .grad buffer.
    NoGradGuard ng;
    m.grad = (cur + g).impl_ptr();
  } else {
    NoGradGuard ng;
    cur.add_(g);
  }
}

// Tensor::register_post_accumulate_grad_hook's hooks of a leaf whose gradient is complete.
void run_post_accumulate_hooks(const Tensor& leaf) {
  const TensorImpl* l = leaf.unsafe_impl();
  if (!l->autograd || l->autograd->post_accumulate_hooks.empty()) return;
  const auto hooks = l->autograd->post_accumulate_hooks;  // a hook may add or remove hooks
  for (const auto& h : hooks) h.second(leaf);
}

thread_local std::vector<std::function<void()>>* tls_backward_end = nullptr;
thread_local uint64_t tls_backward_id = 0;     // counts the backwards run on this thread
thread_local int tls_backward_depth = 0;       // backwards running on this thread
thread_local uint64_t tls_backward_edges = 0;  // starts and ends of outermost backwards

// The callbacks at_backward_end() queued during one backward, run at its end (also on a throw,
// so none leaks into the next backward, but then not run).
struct BackwardEndScope {
  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* prev;
  BackwardEndScope() : prev(tls_backward_end) {
    tls_backward_end = &callbacks;
    ++tls_backward_id;
    if (tls_backward_depth++ == 0) ++tls_backward_edges;
  }
  ~BackwardEndScope() {
    tls_backward_end = prev;
    if (--tls_backward_depth == 0) ++tls_backward_edges;
  }
  void run() {
    for (size_t i = 0; i < callbacks.size(); ++i) callbacks[i]();  // may queue more
    callbacks.clear();
  }
};

struct Capture {
  std::unordered_map<const TensorImpl*, size_t> leaves;
  std::unordered_map<const Node*, size_t> nodes;
  std::vector<Tensor> results;
};

// Whether a Gather's index is one index along dim 0, broadcast along the others (stride 0):
// index_select's, each of its values a row of `rows`, and no row twice.
bool distinct_rows(const Tensor& index, int64_t rows) {
  if (!detail::index_rows(index)) return false;
  const TensorImpl* i = index.unsafe_impl();
  const auto* at = static_cast<const int64_t*>(i->data());
  const int64_t n = i->shape[0], step = i->strides[0];
  bool increasing = true;
  for (int64_t k = 0; k < n && increasing; ++k)
    increasing =
        at[k * step] >= 0 && at[k * step] < rows && (k == 0 || at[k * step] > at[(k - 1) * step]);
  if (increasing) return true;
  thread_local std::vector<char> seen;
  seen.assign(static_cast<size_t>(rows), 0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = at[k * step];
    if (r < 0 || r >= rows || seen[static_cast<size_t>(r)]) return false;
    seen[static_cast<size_t>(r)] = 1;
  }
  return true;
}

// A gradient summed over its uses (a node's output read by several ops, a leaf): each part is
// added as it comes, or, for a slice's gradient, added into a buffer of the whole (Note
// [Slices' gradients]).
class GradSum {
 public:
  void add(Tensor g) {
    sum_ = sum_.defined() ? sum_ + g : std::move(g);
    owned_ = false;
  }
  // Adds g into the slice `a` of a gradient of the whole's shape (Note [Slices' gradients]).
  void add_slice(const Tensor& g, const Attrs& a, const TensorMeta& whole, bool select) {
    NoGradGuard no_grad;
    Tensor& sum = own(g, whole);
    Tensor part =
        select ? duet::select(sum, a.dim, a.start) : slice(sum, a.dim, a.start, a.end, a.step);
    part.add_(g);
  }
  // Adds g into the rows `index` (no row twice: distinct_rows) of a gradient of the whole's
  // shape.
  void add_rows(const Tensor& g, const Tensor& index, const TensorMeta& whole) {
    NoGradGuard no_grad;
    Tensor& sum = own(g, whole);
    const Tensor* in[] = {&sum, &index, &g};
    Attrs a;
    a.dim = 0;
    detail::call_inplace(OpId::ScatterAdd, TensorRefs(in, 3), a, sum);
  }
  bool empty() const { return !sum_.defined(); }
  // The sum as a buffer of its own, of the whole's shape (the sum so far added into zeros).
  Tensor& own(const Tensor& g, const TensorMeta& whole) {
    if (!owned_) {
      Tensor z = zeros(whole.shape, Options().dtype(g.dtype()).device(whole.device));
      if (sum_.defined()) z.add_(sum_);
      sum_ = std::move(z);
      owned_ = true;
    }
    return sum_;
  }
  Tensor take() {
    owned_ = false;
    return std::exchange(sum_, Tensor());
  }

 private:
  Tensor sum_;
  bool owned_ = false;  // sum_ is a buffer of this sum's own, which add_slice writes into
};

// Note [Backward bookkeeping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A backward keeps, per node it reaches, the gradient summed so far, the count of consumers
// still to run, whether it leads to a wanted gradient and whether it is queued; per leaf, the
// gradient summed so far and its uses still to come. Each lives in one record of a vector, and
// the per-node scratch (input pointers, needs, metadata, input gradients) reuses buffers across
// nodes: an eager training step's backward allocates little beyond its tensors.
// A node's record is found through the node itself (Node::walk, Node::walk_slot: the backward's
// number and the record's index). A hash map from node to record cost a fifth of a per-sample
// loop's time (BiLSTM steps of 64 wide: its lookups missed the cache three times per edge). Two
// threads may run backwards through graphs that share nodes, and a gradient hook may start a
// backward inside one, so only a backward that starts while no other runs anywhere uses the
// fields; any other keeps its records in a hash map of its own, and leaves the fields alone.
class BackwardRun {
 public:
  BackwardRun(bool retain_graph, bool create_graph, Capture* capture)
      : retain_graph_(retain_graph), create_graph_(create_graph), capture_(capture) {
    st_.reserve(64);
    if (!fields_) index_.reserve(64);
  }
  ~BackwardRun() { g_running.fetch_sub(1, std::memory_order_acq_rel); }
  BackwardRun(const BackwardRun&) = delete;
  BackwardRun& operator=(const BackwardRun&) = delete;
  // Sums each root's gradient into its node's buffer; a root without history is a leaf, whose
  // gradient is captured (grad()) or accumulated into .grad at once.
  void seed(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads);
  // Finds the nodes that lead to something that wants a gradient, and counts their consumers
  // and each leaf's uses.
  void plan() {
    mark_useful();
    count_uses();
  }
  // Runs the nodes, each once all its useful consumers have, later nodes first.
  void run();

 private:
  struct NodeState {
    Node* node;
    uint64_t sequence;  // the node's, kept here for the queue's comparisons
    GradSum buffer{};   // the gradient of the node's output, summed over its consumers so far
    int deps = 0;       // useful consumers that have not run yet
    bool visited = false, useful = false, queued = false;
  };
  // A leaf's gradient is summed over its uses, then accumulated into .grad once, as PyTorch's
  // AccumulateGrad does (two backwards then add the same tensor twice, bit for bit).
  struct LeafState {
    TensorImpl* leaf;
    GradSum grad{};
    int uses = 0;
  };
  struct LaterFirst {
    const std::vector<NodeState>* st;
    bool operator()(int32_t a, int32_t b) const { return (*st)[a].sequence < (*st)[b].sequence; }
  };

  static void add_to(Tensor& slot, const Tensor& g) { slot = slot.defined() ? slot + g : g; }

  int32_t slot(Node* n) {
    if (fields_) {
      if (n->walk != walk_) {
        n->walk = walk_;
        n->walk_slot = static_cast<int32_t>(st_.size());
        st_.push_back(NodeState{n, n->sequence});
      }
      return n->walk_slot;
    }
    auto [it, fresh] = index_.try_emplace(n, static_cast<int32_t>(st_.size()));
    if (fresh) st_.push_back(NodeState{n, n->sequence});
    return it->second;
  }
  // The record of a node the traversal reached (every input edge of a reached node is).
  int32_t index_of(Node* n) const {
    if (fields_) {
      DUET_ASSERT(n->walk == walk_, "[backward] a node ({}) the traversal did not reach",
                  n->def ? n->def->name : "?");
      return n->walk_slot;
    }
    return index_.at(n);
  }
  NodeState& state(Node* n) { return st_[static_cast<size_t>(index_of(n))]; }
  // Whether a gradient along e is wanted: e leads to a useful node, or to a leaf that wants
  // one (every leaf for backward(), the inputs for grad()).
  bool wanted(const InputEdge& e) {
    return e.fn ? state(e.fn.get()).useful
                : e.leaf && (!capture_ || capture_->leaves.count(e.leaf.get()));
  }
  void enqueue(int32_t i) {
    st_[i].queued = true;
    ready_.push(i);
  }
  // Node i received the gradient of one of its consumers: queued once it has them all.
  void got_gradient(int32_t i) {
    if (--st_[i].deps == 0 && !st_[i].queued) enqueue(i);
  }
  void mark_useful();
  void count_uses();
  bool gather_inputs(const Node& n, uint32_t& stale);
  void apply_rule(Node& n, const Tensor& g, uint32_t stale);
  void release(Node& n);
  static bool kept(const Node& n);
  void send_grads(const Node& n, bool none_ok = false);
  bool add_into_slice(const Node& n, const Tensor& g);
  bool apply_group_rule(Node& n, const Tensor& g);
  // A backward_fn (or its group's rule) with create_graph must be written in duet ops.
  void check_differentiable(const Node& n) const {
    DUET_CHECK(!create_graph_ || n.backward_fn_differentiable,
               "[backward] {} has a compiled backward, which is not itself differentiable: "
               "create_graph (double backward) needs the function run eagerly",
               n.def->name);
  }
  // The record of n when this backward reached it, else -1.
  int32_t reached(Node* n) const {
    if (fields_) return n->walk == walk_ ? n->walk_slot : -1;
    auto it = index_.find(n);
    return it == index_.end() ? -1 : it->second;
  }

  static inline std::atomic<int> g_running{0};
  static inline std::atomic<uint64_t> g_walks{0};
  // Whether this backward keeps its records' places in the nodes (none other ran as it began).
  const bool fields_ = g_running.fetch_add(1, std::memory_order_acq_rel) == 0;
  const uint64_t walk_ = g_walks.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool retain_graph_, create_graph_;
  Capture* const capture_;
  std::vector<NodeState> st_;
  std::unordered_map<Node*, int32_t> index_;
  std::vector<LeafState> leaves_;
  std::unordered_map<TensorImpl*, int32_t> leaf_index_;
  std::vector<int32_t> starts_;
  std::priority_queue<int32_t, std::vector<int32_t>, LaterFirst> ready_{LaterFirst{&st_}};
  // Scratch of one node's rule, reused from node to node.
  std::vector<const Tensor*> ptrs_;
  SmallVec<bool, 16> needs_;
  std::vector<TensorMeta> metas_;
  std::vector<Tensor> gi_;
};

void BackwardRun::seed(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads) {
  for (size_t i = 0; i < roots.size(); ++i) {
    TensorImpl* r = roots[i].unsafe_impl();
    if (r->autograd && r->autograd->grad_fn) {
      const int32_t n = slot(current_grad_fn(r).get());
      st_[n].buffer.add(root_grads[i]);
      starts_.push_back(n);
    } else if (capture_) {
      auto it = capture_->leaves.find(r);
      if (it != capture_->leaves.end()) add_to(capture_->results[it->second], root_grads[i]);
    } else {
      accumulate(const_cast<TensorImpl*>(r), root_grads[i], create_graph_);
      run_post_accumulate_hooks(roots[i]);
    }
  }
}

// Depth first from the roots, without recursion: a node is useful once its inputs are visited
// and one of them is wanted (or, for grad(), it is itself an input).
void BackwardRun::mark_useful() {
  std::vector<std::pair<int32_t, bool>> stack;
  for (int32_t s : starts_) stack.push_back({s, false});
  while (!stack.empty()) {
    auto [i, expanded] = stack.back();
    stack.pop_back();
    Node* n = st_[i].node;
    if (expanded) {
      bool u = !capture_ || capture_->nodes.count(n);
      for (const InputEdge& e : n->inputs) u |= wanted(e);
      st_[i].useful = u;
      continue;
    }
    if (st_[i].visited) continue;
    st_[i].visited = true;  // and not useful while its inputs are visited
    stack.push_back({i, true});
    for (const InputEdge& e : n->inputs)
      if (e.fn) {
        const int32_t j = slot(e.fn.get());
        if (!st_[j].visited) stack.push_back({j, false});
      }
  }
}

void BackwardRun::count_uses() {
  for (size_t i = 0; i < st_.size(); ++i) {
    if (!st_[i].useful) continue;
    for (const InputEdge& e : st_[i].node->inputs) {
      if (e.fn) {
        NodeState& p = state(e.fn.get());
        if (p.useful) ++p.deps;
      } else if (e.leaf && !capture_) {
        auto [it, fresh] =
            leaf_index_.try_emplace(e.leaf.get(), static_cast<int32_t>(leaves_.size()));
        if (fresh) leaves_.push_back(LeafState{e.leaf.get()});
        ++leaves_[it->second].uses;
      }
    }
  }
}

// Fills the scratch for n's rule: its saved inputs, their metadata and which need a gradient;
// sets bit i of `stale` for a saved input written in place since. False when none is needed.
bool BackwardRun::gather_inputs(const Node& n, uint32_t& stale) {
  const int64_t k = n.inputs.size();
  ptrs_.resize(static_cast<size_t>(k));
  needs_.resize(k);
  metas_.resize(static_cast<size_t>(k));
  bool any_needed = false;
  for (int64_t i = 0; i < k; ++i) {
    ptrs_[i] = &n.saved[i].value;
    if (is_stale(n.saved[i])) stale |= 1u << i;  // only inputs 0..6 are ever saved
    metas_[i] = n.inputs[i].meta;
    const InputEdge& e = n.inputs[i];
    needs_[i] = e.needs && wanted(e);
    any_needed |= needs_[i];
  }
  gi_.clear();
  gi_.resize(static_cast<size_t>(k));
  return any_needed;
}

// Runs n's compiled backward or its gradient rule on g, into the input gradients gi_.
void BackwardRun::apply_rule(Node& n, const Tensor& g, uint32_t stale) {
  const bool* need = needs_.data();
  if (n.backward_fn) {
    check_differentiable(n);
    n.backward_fn(g, need, gi_.data());
    return;
  }
  Tensor out = unpack_output(n, create_graph_);
  const int64_t k = n.inputs.size();
  GradCtx ctx{n.attrs, SavedInputs(TensorRefs(ptrs_.data(), k), stale, &n), out, metas_.data(),
              need};
  try {
    n.def->grad(ctx, g, gi_.data());
  } catch (const AnomalyError& e) {  // Note [Anomaly mode]: name the forward op too
    throw AnomalyError(::duet::detail::with_context(
        fmt::format("{}; in backward, inside the gradient rule of {}", e.what(), n.def->name)));
  }
}

// Note [Results of one construct]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each result of a traced construct has a tape node of its own, with a rule for that result
// (trace/control_flow.cpp). A backward that reaches several results of one scan, its last
// carry and its stacked outputs say, ran the scan's rule once per result: a reverse scan each,
// each rerunning the body. A compiled Elman RNN whose loss read both (bench RN) took 1.3x to
// 1.4x the eager step's time. The result nodes of a construct now form a group, whose rule
// takes the gradients of several results at once. The first member the backward runs runs that
// rule for every member whose gradient is complete, taking their gradients from their records.
// Those members then find no gradient and send none on (Note [No gradient]).
// Nodes run latest first, and every consumer of a result was made after all the construct's
// result nodes. So when the first member runs, every other member's consumers have run, and its
// gradient is complete. A member whose record still waits for a consumer keeps its gradient and
// runs its own rule later, which gives the same sum. Scan, cond and the outputs of a compiled
// call have group rules (Note [One backward for several outputs] in trace/compile.cpp).
bool BackwardRun::apply_group_rule(Node& n, const Tensor& g) {
  NodeGroup& group = *n.group;
  std::vector<Tensor> grads(group.members.size());
  grads[static_cast<size_t>(n.group_index)] = g;
  std::vector<std::shared_ptr<Node>> taken;
  for (const std::weak_ptr<Node>& w : group.members) {
    std::shared_ptr<Node> m = w.lock();
    if (!m || m.get() == &n) continue;
    const int32_t i = reached(m.get());
    if (i < 0 || !st_[i].useful || st_[i].deps != 0 || st_[i].buffer.empty() || m->released)
      continue;
    Tensor gm = st_[i].buffer.take();
    if (capture_) {
      auto it = capture_->nodes.find(m.get());
      if (it != capture_->nodes.end()) add_to(capture_->results[it->second], gm);
    }
    grads[static_cast<size_t>(m->group_index)] = std::move(gm);
    taken.push_back(std::move(m));
  }
  if (taken.empty()) return false;  // n's own rule does the same
  check_differentiable(n);
  group.rule(grads, needs_.data(), gi_.data());
  if (!retain_graph_)
    for (const std::shared_ptr<Node>& m : taken)
      if (!kept(*m)) release(*m);
  return true;
}

// Whether a node's keeper keeps its saved values past this backward (Note [Batches shared by
// losses] in eager/autobatch_reach.cpp).
bool BackwardRun::kept(const Node& n) { return n.keeper && n.keeper->keep(); }

// Without retain_graph a node's saved tensors are freed once its rule has run.
void BackwardRun::release(Node& n) {
  n.released = true;
  for (SavedTensor& s : n.saved) s.value = Tensor();
  n.saved_output.value = Tensor();
  n.backward_fn = nullptr;
  n.recompute = nullptr;
  n.group = nullptr;
}

// Sends each needed input gradient, summed back to its input's shape and dtype, to the node
// that made the input (queued once it has all its gradients), to grad()'s capture, or to the
// leaf (accumulated into .grad at its last use).
// Note [No gradient]
// A node may send no gradient along an edge: an Autobatch gate whose readers the backward did
// not reach (Note [Gradients off the loss's path] in eager/autobatch_reach.cpp), and then any
// node all of whose consumers sent none. The input's node counts the edge as run all the same;
// a node that got no gradient at all runs no rule and sends none on, and a leaf that got none
// keeps the .grad it had (undefined, if it had none), as if the backward had not reached it.
// Only nodes with a backward_fn may send none; a gradient rule that gives none is a bug.
void BackwardRun::send_grads(const Node& n, bool none_ok) {
  const int64_t k = n.inputs.size();
  for (int64_t i = 0; i < k; ++i) {
    if (!needs_[i]) continue;
    const InputEdge& e = n.inputs[i];
    DUET_ASSERT(none_ok || gi_[i].defined(), "gradient rule of {} gave no gradient for input {}",
                n.def->name, i);
    Tensor gin = gi_[i].defined() ? sum_to(std::move(gi_[i]), e.meta) : Tensor();
    if (e.fn) {
      const int32_t p = index_of(e.fn.get());
      if (gin.defined()) st_[p].buffer.add(std::move(gin));
      got_gradient(p);
    } else if (capture_) {
      if (gin.defined()) add_to(capture_->results[capture_->leaves.at(e.leaf.get())], gin);
    } else {
      LeafState& l = leaves_[leaf_index_.at(e.leaf.get())];
      if (gin.defined()) l.grad.add(std::move(gin));
      if (--l.uses == 0 && !l.grad.empty()) {  // its last use
        accumulate(l.leaf, l.grad.take(), create_graph_);
        run_post_accumulate_hooks(Tensor(e.leaf));
      }
    }
  }
}

// Note [Slices' gradients]
// The gradient of a slice (or a select) is a zero tensor of the whole with the slice's gradient
// written in, and the whole's gradient sums those over its slices: for a tensor read slice by slice
// (a sentence's embeddings, token by token; under Autobatch, a batch read by many later groups),
// each slice costs three passes over the whole (zeros, scatter, add). Eagerly, without
// create_graph, the engine adds each slice's gradient into one zero buffer of the whole
// instead, at the slice: one pass over the whole, and one over each slice. The sums are the
// same, element by element (each is a sum of the slices' values at that element, zeros
// included, in the same order).
// The same holds for the rows an index_select reads (a Gather along dim 0 whose index is one
// index broadcast along the other dims; under Autobatch, a batch's samples read by a later
// group), when no row is read twice: each index_select then costs one pass over the rows it
// read, where zeros, scatter_add and add each passed over the whole. (A row read twice would
// sum its two gradients into the buffer one after the other, not with each other first.)
bool BackwardRun::add_into_slice(const Node& n, const Tensor& g) {
  const OpId id = n.def->id;
  const bool slice = id == OpId::Slice || id == OpId::Select, rows = id == OpId::Gather;
  if (create_graph_ || capture_ || !(slice || rows) || n.backward_fn || n.recompute ||
      n.inputs.size() != (slice ? 1u : 2u) || is_traced(g))
    return false;
  const InputEdge& e = n.inputs[0];
  if (!e.fn || !e.needs || !wanted(e) || e.meta.dtype != g.dtype() || !e.meta.sym.empty())
    return false;
  const int32_t p = index_of(e.fn.get());
  if (slice) {
    st_[p].buffer.add_slice(g, n.attrs, e.meta, id == OpId::Select);
  } else {
    if (n.attrs.dim != 0 || n.saved.size() < 2 || is_stale(n.saved[1])) return false;
    const Tensor& index = n.saved[1].value;
    if (!index.defined() || !index.device().is_cpu() || !g.device().is_cpu() ||
        e.meta.shape.size() == 0 || !distinct_rows(index, e.meta.shape[0]))
      return false;
    st_[p].buffer.add_rows(g, index, e.meta);
  }
  got_gradient(p);
  return true;
}

void BackwardRun::run() {
  for (int32_t s : starts_)
    if (st_[s].useful && st_[s].deps == 0 && !st_[s].queued) enqueue(s);
  while (!ready_.empty()) {
    const int32_t ni = ready_.top();
    ready_.pop();
    Node* n = st_[ni].node;
    Tensor g = st_[ni].buffer.take();
    if (!g.defined()) {  // every consumer sent none (Note [No gradient]): none goes on
      uint32_t stale = 0;
      gather_inputs(*n, stale);
      send_grads(*n, /*none_ok=*/true);
      continue;
    }
    if (capture_) {
      auto it = capture_->nodes.find(n);
      if (it != capture_->nodes.end()) add_to(capture_->results[it->second], g);
    }
    DUET_CHECK(!n->released,
               "[backward] trying to backward through the graph a second time ({} already "
               "freed its saved tensors); pass retain_graph=true to the first backward",
               n->def->name);
    if (n->recompute) {  // Note [Checkpoint]: a checkpointed region gave up n's saved values
      DUET_CHECK(!create_graph_,
                 "[backward] {} ran inside duet::checkpoint, whose backward reruns the function "
                 "without a graph of its own: create_graph (double backward) needs it run "
                 "without checkpoint",
                 n->def->name);
      std::shared_ptr<Recompute> r = n->recompute;
      r->run(g);
    }
    if (add_into_slice(*n, g)) {
      if (!retain_graph_ && !kept(*n)) release(*n);
      continue;
    }
    uint32_t stale = 0;
    const bool none_ok = n->backward_fn != nullptr;  // (release drops it)
    if (gather_inputs(*n, stale) && !(n->group && apply_group_rule(*n, g)))
      apply_rule(*n, g, stale);
    // Started collectives (data-parallel gradient buckets) move data only inside the
    // transport's calls: give them a turn between nodes.
    if (__builtin_expect(dist::detail::g_started.load(std::memory_order_relaxed) > 0, 0))
      dist::detail::progress();
    if (!retain_graph_ && !kept(*n)) release(*n);
    send_grads(*n, none_ok);
  }
  int64_t pending = 0;
  for (const LeafState& l : leaves_) pending += !l.grad.empty();
  DUET_ASSERT(pending == 0, "{} leaf gradients were never accumulated", pending);
}

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads,
                  bool retain_graph, bool create_graph, Capture* capture) {
  // Under an Autobatch scope: the pending ops run first, and the tape they made is walked
  // with the scope set aside (Note [Autobatch's tape]).
  std::optional<AutobatchBackward> batched;
  if (lazy_runner_active()) batched.emplace(roots);
  GradModeScope mode(create_graph);
  // Gradient rules run in the dtypes their forward ops had (Note [Autocast] in core/autocast.h).
  AutocastOff autocast_off;
  BackwardEndScope end;
  BackwardRun backward(retain_graph, create_graph, capture);
  backward.seed(roots, root_grads);
  backward.plan();
  backward.run();
  end.run();
}

Tensor default_grad(const char* op, const Tensor& out, const Tensor& given, size_t i) {
  if (given.defined()) {
    DUET_CHECK_SHAPE(same_shape(given, out, op),
                     "[{}] grad_output {} has shape {} but the output has shape {}", op, i,
                     given.sizes(), out.sizes());
    // Rules expect the output's dtype (matmul needs equal dtypes); PyTorch converts too.
    return given.dtype() == out.dtype() ? given : given.to(out.dtype());
  }
  DUET_CHECK_SHAPE(sym_decide(sym_numel(sym_dims(out)), SymRel::Eq, 1, op),
                   "[{}] a gradient can be implied only for one-element outputs; output {} has "
                   "shape {}, so pass grad_output",
                   op, i, out.sizes());
  return full_dims(sym_dims(out), 1, Options().dtype(out.dtype()).device(out.device()));
}

// A traced tensor outside its trace (an escaped tensor, or one read with no trace running)
// has no values and no tape: backward() and grad() through it would silently do nothing.
// Undefined tensors (an omitted grad_output) pass.
void check_not_escaped(const Tensor& t, const char* what) {
  if (!t.defined()) return;
  const TensorImpl* x = t.unsafe_impl();
  if (__builtin_expect(x->trace.get() != nullptr, 0) && (!x->trace->alive || mode_depth() == 0))
    throw_traced_use(t, what);
}

}  // namespace

uint64_t backward_id() { return tls_backward_id; }
uint64_t backward_edges() { return tls_backward_edges; }

void at_backward_end(std::function<void()> callback) {
  DUET_CHECK(tls_backward_end != nullptr,
             "[at_backward_end] called outside a backward (from a gradient hook, say)");
  tls_backward_end->push_back(std::move(callback));
}

namespace {

// Tensor::backward (core/autograd_hooks.cpp opens the call site's guard).
void backward_from(const Tensor& root, const Tensor& grad_output, bool retain_graph) {
  check_not_escaped(root, "backward");
  check_not_escaped(grad_output, "backward");
  DUET_CHECK(root.requires_grad(),
             "[backward] the tensor (shape {}) does not require grad: no input of the ops that "
             "made it requires grad, or it was computed under NoGradGuard",
             root.sizes());
  Tensor g = default_grad("backward", root, grad_output, 0);
  run_backward({root}, {g}, retain_graph, /*create_graph=*/false, nullptr);
}

std::string stale_input_message(const Node& n, int64_t i) { return stale_message(n, n.saved[i]); }

// Note [Autograd hooks] in core/autograd_hooks.h.
constexpr AutogradHooks kEagerHooks{&autograd_record, &autograd_prepare,    &autograd_finish,
                                    &autograd_alias,  &stale_input_message, &backward_from};

}  // namespace

void register_autograd() { set_autograd_hooks(&kEagerHooks); }

}  // namespace detail

std::vector<Tensor> grad(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                         std::vector<Tensor> grad_outputs, bool create_graph) {
  return detail::grad(std::move(outputs), std::move(inputs), std::move(grad_outputs), create_graph,
                      /*retain_graph=*/create_graph);
}

std::vector<Tensor> detail::grad(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                                 std::vector<Tensor> grad_outputs, bool create_graph,
                                 bool retain_graph) {
  DUET_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
             "[grad] {} grad_outputs for {} outputs", grad_outputs.size(), outputs.size());
  for (const Tensor& t : outputs) detail::check_not_escaped(t, "grad");
  for (const Tensor& t : inputs) detail::check_not_escaped(t, "grad");
  for (const Tensor& t : grad_outputs) detail::check_not_escaped(t, "grad");
  detail::Capture cap;
  cap.results.resize(inputs.size());
  std::vector<size_t> first(inputs.size());  // an input passed twice gets the gradient twice
  for (size_t i = 0; i < inputs.size(); ++i) {
    detail::TensorImpl* t = inputs[i].impl();
    DUET_CHECK(t->requires_grad, "[grad] input {} (shape {}) does not require grad", i, t->shape);
    if (t->autograd && t->autograd->grad_fn)
      first[i] = cap.nodes.emplace(detail::current_grad_fn(t).get(), i).first->second;
    else
      first[i] = cap.leaves.emplace(t, i).first->second;
  }
  std::vector<Tensor> roots, gs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    DUET_CHECK(outputs[i].requires_grad(), "[grad] output {} (shape {}) does not require grad", i,
               outputs[i].sizes());
    roots.push_back(outputs[i]);
    gs.push_back(detail::default_grad("grad", outputs[i],
                                      grad_outputs.empty() ? Tensor() : grad_outputs[i], i));
  }
  detail::run_backward(roots, gs, retain_graph, create_graph, &cap);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& r = cap.results[i];
    if (first[i] != i) r = cap.results[first[i]];
    if (!r.defined())
      r = full_dims(sym_dims(inputs[i]), 0,
                    Options().dtype(inputs[i].dtype()).device(inputs[i].device()));
    else if (r.dtype() != inputs[i].dtype())
      r = r.to(inputs[i].dtype());
  }
  return std::move(cap.results);
}

}  // namespace duet
