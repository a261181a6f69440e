// duet: activation checkpointing (duet::checkpoint).
//
// Note [Checkpoint]
// checkpoint(fn, args...) runs fn with grad mode on, so its ops are taped as usual, while
// autograd_prepare appends every node it makes to the region's list (checkpoint_nodes()). When
// fn returns, each of those nodes gives up the saved values that fn computed: a storage whose
// serial is above the one read before fn began was made inside (StorageImpl::serial). What fn
// read from outside (its inputs, parameters) stays saved, and so do fn's results, which the
// caller holds anyway. The nodes keep their edges, so the backward reaches parameters and the
// region's inputs as without a checkpoint; a node that gave something up points at the region's
// Recompute, which the engine runs before the node's rule.
//
// The rerun calls fn on its inputs, each passed through optimization_barrier after the gradient
// that reached the node (Note [Optimization barrier]): in a compiled step that makes the
// recomputation part of the backward, never merged with the forward's ops nor scheduled before
// the backward gets there. Grad mode is on and the autocast state is the one fn first ran under;
// the generators that fn drew from are rewound to their state at its start (their clones, taken
// then) and put back after, so dropout draws the same mask. The rerun tapes the same nodes in the
// same order; node k of the rerun refills what node k of the first run gave up (detached: the
// rerun's own tape is dropped), and a rerun that tapes other ops is an Error.
//
// Nesting: a region that ends inside another hands its nodes to the enclosing list, which then
// takes them over, so the outermost region recomputes everything inside it at once; while a
// region reruns, checkpoint() inside it is a plain call. Double backward (create_graph) through
// a checkpoint is an Error, and an in-place update of state outside fn (batch norm's running
// statistics) happens again on the rerun, as in PyTorch.
#include "eager/checkpoint.h"

#include <atomic>

#include "core/autocast.h"
#include "core/error.h"
#include "core/ops.h"
#include "eager/autograd.h"
#include "eager/node.h"

namespace duet::detail {
namespace checkpointing {

// > 0 while a region reruns on this thread: checkpoint() inside it is a plain call.
thread_local int tls_rerunning = 0;

struct Counter {
  int& n;
  explicit Counter(int& c) : n(c) { ++n; }
  ~Counter() { --n; }
};

// Makes `list` the region list of this thread for a scope.
struct Collect {
  std::vector<std::weak_ptr<Node>>* prev;
  explicit Collect(std::vector<std::weak_ptr<Node>>* list) : prev(checkpoint_nodes()) {
    checkpoint_nodes() = list;
  }
  ~Collect() { checkpoint_nodes() = prev; }
};

uint32_t version_of(const Tensor& t) {
  return t.unsafe_impl()->storage->version_.load(std::memory_order_relaxed);
}

struct Region final : Recompute {
  CheckpointFn fn;
  std::vector<Tensor> inputs;  // detached aliases of fn's inputs
  std::vector<bool> input_grad;
  std::vector<Tensor> generators, rewound;  // the generators fn drew from, and their start
  uint32_t autocast = 0;
  std::vector<std::weak_ptr<Node>> nodes;  // the region's nodes, in the order they were made
  std::vector<const OpDef*> defs;          // their ops, for the rerun's check
  bool ran = false;

  void run(const Tensor& grad) override;
  void refill(const std::vector<std::weak_ptr<Node>>& again);
};

// Gives up the saved values of n that the region made (storage serial above `first`), except
// fn's results. True when something was given up.
bool give_up(Node& n, uint64_t first, const std::vector<const StorageImpl*>& results) {
  auto made_inside = [&](const SavedTensor& s) {
    if (!s.value.defined()) return false;
    const StorageImpl* st = s.value.unsafe_impl()->storage.get();
    if (st->serial <= first) return false;
    for (const StorageImpl* r : results)
      if (r == st) return false;
    return true;
  };
  bool any = false;
  for (SavedTensor& s : n.saved)
    if (made_inside(s)) {
      s.value = Tensor();
      any = true;
    }
  if (made_inside(n.saved_output)) {
    n.saved_output.value = Tensor();
    any = true;
  }
  return any;
}

void Region::run(const Tensor& grad) {
  if (ran) return;
  ran = true;
  Counter rerunning(tls_rerunning);
  AutocastState state(autocast);
  GradModeScope grad_on(true);
  auto after_grad = [&](const Tensor& x) {
    return x.defined() && grad.defined() ? optimization_barrier(x, grad) : x;
  };
  std::vector<Tensor> now;
  for (size_t i = 0; i < generators.size(); ++i) {
    now.push_back(generators[i].clone());
    generators[i].copy_(after_grad(rewound[i]));
  }
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = after_grad(inputs[i]);
    if (input_grad[i]) x.requires_grad_(true);
    xs.push_back(std::move(x));
  }
  std::vector<std::weak_ptr<Node>> again;
  {
    Collect collect(&again);
    std::vector<Tensor> out = fn(xs);
    for (size_t i = 0; i < generators.size(); ++i) generators[i].copy_(now[i]);
    refill(again);
  }
  fn = nullptr;
  inputs.clear();
  generators.clear();
  rewound.clear();
}

void Region::refill(const std::vector<std::weak_ptr<Node>>& again) {
  auto op_list = [](const std::vector<const OpDef*>& ds) {
    std::string s;
    for (size_t k = 0; k < ds.size() && k < 8; ++k)
      s += fmt::format("{}{}", k ? ", " : "", ds[k] ? ds[k]->name : "?");
    return ds.size() > 8 ? s + ", ..." : s;
  };
  std::vector<std::shared_ptr<Node>> rerun;
  std::vector<const OpDef*> rerun_defs;
  for (const std::weak_ptr<Node>& w : again) {
    rerun.push_back(w.lock());
    rerun_defs.push_back(rerun.back() ? rerun.back()->def : nullptr);
  }
  // Nodes that died before the region ended (results nobody kept) have no op to compare.
  bool same = rerun.size() == nodes.size();
  for (size_t k = 0; same && k < nodes.size(); ++k)
    same = !defs[k] || !rerun_defs[k] || rerun_defs[k] == defs[k];
  DUET_CHECK_VALUE(same,
                   "[checkpoint] the function taped {} ops when first run ({}) but {} when rerun "
                   "for the backward ({}): a checkpointed function must run the same ops each "
                   "time",
                   defs.size(), op_list(defs), rerun_defs.size(), op_list(rerun_defs));
  for (size_t k = 0; k < nodes.size(); ++k) {
    std::shared_ptr<Node> o = nodes[k].lock();
    if (!o) continue;
    const Node& r = *rerun[k];
    auto put = [](SavedTensor& dst, const SavedTensor& src) {
      if (dst.value.defined() || !src.value.defined()) return;
      dst = {src.value.detach(), src.version};
    };
    for (size_t i = 0; i < o->saved.size() && i < r.saved.size(); ++i) put(o->saved[i], r.saved[i]);
    put(o->saved_output, r.saved_output);
    if (o->recompute.get() == this) o->recompute = nullptr;
  }
}

}  // namespace checkpointing

std::vector<Tensor> checkpoint_call(CheckpointFn fn, const std::vector<Tensor>& inputs) {
  using namespace checkpointing;
  if (!grad_mode() || tls_rerunning > 0) return fn(inputs);
  auto region = std::make_shared<Region>();
  region->autocast = autocast_key();
  // Every generator's start, kept below for those that fn draws from.
  std::vector<Tensor> gens = generator_states();
  std::vector<Tensor> starts;
  std::vector<uint32_t> versions;
  for (const Tensor& g : gens) {
    starts.push_back(g.clone());
    versions.push_back(version_of(g));
  }
  const uint64_t first = g_storage_serial.load(std::memory_order_relaxed);
  std::vector<Tensor> out;
  {
    Collect collect(&region->nodes);
    out = fn(inputs);
  }
  for (size_t i = 0; i < gens.size(); ++i)
    if (version_of(gens[i]) != versions[i]) {
      region->generators.push_back(gens[i]);
      region->rewound.push_back(starts[i]);
    }
  std::vector<const StorageImpl*> results;
  for (const Tensor& t : out)
    if (t.defined()) results.push_back(t.unsafe_impl()->storage.get());
  bool any = false;
  for (const std::weak_ptr<Node>& w : region->nodes) {
    std::shared_ptr<Node> n = w.lock();
    region->defs.push_back(n ? n->def : nullptr);
    if (!n) continue;
    // A node that a region inside this one took over is this region's now.
    if (give_up(*n, first, results) || n->recompute) {
      n->recompute = region;
      any = true;
    }
  }
  if (std::vector<std::weak_ptr<Node>>* outer = checkpoint_nodes())
    outer->insert(outer->end(), region->nodes.begin(), region->nodes.end());
  if (!any) return out;
  region->fn = std::move(fn);
  for (const Tensor& t : inputs) {
    region->inputs.push_back(t.defined() ? t.detach() : t);
    region->input_grad.push_back(t.defined() && t.requires_grad());
  }
  return out;
}

}  // namespace duet::detail
