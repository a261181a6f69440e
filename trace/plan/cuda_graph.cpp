// duet: CUDA-graph replay of a plan (Note [CUDA graph replay] in trace/plan/executor.h): which
// plans qualify, the capture at their second run, the replays after it, and the process-wide
// counters.
#include <algorithm>
#include <exception>
#include <mutex>
#include <utility>

#include "core/dist.h"
#include "core/allocator.h"
#include "core/tensor_impl.h"
#include "trace/plan/cuda_graph.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {

void Plan::GraphState::clear() {
  for (Slot& slot : slots)
    if (slot.graph) backend->destroy_graph(slot.graph, device);
  slots.clear();
}

Plan::GraphState::~GraphState() { clear(); }

namespace {
std::mutex g_graph_mu;
CudaGraphStats g_graph_stats;
}  // namespace

}  // namespace duet::detail

namespace duet {
CudaGraphStats cuda_graph_stats() {
  std::lock_guard<std::mutex> lock(detail::g_graph_mu);
  return detail::g_graph_stats;
}
}  // namespace duet

namespace duet::detail {

int64_t Plan::graph_replays() const {
  std::lock_guard<std::mutex> lock(g_graph_mu);
  return graph_replays_;
}

void Plan::prepare_graph_replay() {
  // CUDA-graph replay: every step on one device whose backend captures graphs; no control
  // steps (their trip counts are decided on the host), no transfers (host memory), and no
  // collectives while the consistency check, which waits on the host, is on.
  if (!opt_.cuda_graph || !controls_.empty() || !wave_begin_.empty()) return;
  const bool checked = dist::is_initialized() && dist::detail::options().check_consistency;
  Device dev;
  bool any = false;
  for (const GraphNode& n : graph_.nodes) {
    if (n.kind != NodeKind::Op && n.kind != NodeKind::Input) continue;
    if (n.kind == NodeKind::Op && n.op == OpId::Transfer) return;
    if (checked && n.kind == NodeKind::Op && dist::detail::is_collective(n.op)) return;
    if (n.meta.device.is_cpu()) {
      if (n.kind == NodeKind::Input || op_class(n.op) != OpClass::View) return;
      continue;
    }
    if (any && !(n.meta.device == dev)) return;
    dev = n.meta.device;
    any = true;
  }
  if (!any) return;
  // A result that is an argument or a view of one aliases the caller's tensor, which a copy out
  // of the graph's buffers would not.
  for (int32_t o : graph_.outputs) {
    const GraphNode& r = graph_.nodes[buffer_root(graph_, o)];
    if (r.kind == NodeKind::Input && r.role != InputRole::Captured) return;
  }
  const DeviceBackend* b = device_backend(dev.type);
  if (!b || !b->begin_capture) return;
  cuda_graph_ = std::make_unique<GraphState>();
  cuda_graph_->device = dev;
  cuda_graph_->backend = b;
  stats_.cuda_graph = true;
}

namespace {

// The graphs one plan keeps: a call whose inputs or held results no graph fits runs kernel by
// kernel once there are this many.
constexpr size_t kMaxGraphs = 4;

InputKey key_of(const Tensor& t) {
  const TensorImpl* x = t.unsafe_impl();
  return {x->data(), x->strides};
}

// Whether a graph that reads the caller's inputs read them where these are (no allocation:
// this runs at every replay).
bool reads_these(const std::vector<InputKey>& reads, const std::vector<Tensor>& inputs) {
  if (reads.size() != inputs.size()) return false;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorImpl* x = inputs[k].unsafe_impl();
    if (reads[k].data != x->data() || !(reads[k].strides == x->strides)) return false;
  }
  return true;
}

// Whether the caller holds none of a graph's results (a view of one counts): each result's
// storage is referenced by the graph's own tensors alone. A result that is a view of a captured
// tensor is the caller's memory anyway (Plan::alias_output_), and does not count.
bool results_free(const std::vector<Tensor>& outputs, const std::vector<bool>& alias) {
  std::vector<std::pair<const StorageImpl*, int32_t>> ours;  // storage, our references to it
  std::vector<const TensorImpl*> seen;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (alias[k]) continue;
    const TensorImpl* t = outputs[k].unsafe_impl();
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    auto it = std::find_if(ours.begin(), ours.end(),
                           [&](const auto& p) { return p.first == t->storage.get(); });
    if (it == ours.end())
      ours.emplace_back(t->storage.get(), 1);
    else
      ++it->second;
  }
  for (const auto& [st, n] : ours)
    if (st->refcount_.load(std::memory_order_acquire) != n) return false;
  return true;
}

}  // namespace

std::vector<Tensor> Plan::run_graphed(const std::vector<Tensor>& inputs) {
  GraphState& gs = *cuda_graph_;
  bool ok = !gs.failed;
  for (const Tensor& t : inputs) ok = ok && t.device() == gs.device;
  if (!ok || gs.runs++ == 0) return execute(inputs);  // the first run builds kernels and state
  // A captured tensor with new storage (Module::to) invalidates the graphs' addresses.
  if (!gs.slots.empty()) {
    for (size_t k = 0; k < graph_.captured.size(); ++k)
      if (graph_.captured[k].unsafe_impl()->data() != gs.addresses[k]) {
        gs.clear();
        break;
      }
  }
  run_hoisted_if_stale();  // not in the graphs: they run when a parameter changes
  // A graph that reads these very inputs, else one with static input buffers; its results free.
  GraphState::Slot* use = nullptr;
  bool moved = false;  // some graph reads the caller's inputs elsewhere: they move between calls
  for (GraphState::Slot& slot : gs.slots) {
    if (slot.copies) continue;
    if (!reads_these(slot.reads, inputs)) {
      moved = true;
    } else if (results_free(slot.outputs, alias_output_)) {
      use = &slot;
      break;
    }
  }
  for (size_t k = 0; !use && k < gs.slots.size(); ++k)
    if (gs.slots[k].copies && results_free(gs.slots[k].outputs, alias_output_)) use = &gs.slots[k];
  if (!use) {
    if (gs.slots.size() >= kMaxGraphs) {
      std::lock_guard<std::mutex> lock(g_graph_mu);
      ++g_graph_stats.ungraphed_runs;
      return execute(inputs);
    }
    // Capture another graph: over the caller's inputs where they are, unless they have moved
    // since an earlier capture (a new batch at every call), then over static buffers.
    GraphState::Slot slot;
    slot.copies = moved;
    if (moved) {
      for (const Tensor& t : inputs) {
        slot.inputs.push_back(empty(t.sizes(), t.dtype(), gs.device));
        copy_into(slot.inputs.back(), t);
      }
    } else {
      for (const Tensor& t : inputs) slot.reads.push_back(key_of(t));
    }
    std::string why;
    void* pool = nullptr;
    try {
      pool = gs.backend->begin_capture(gs.device);
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::vector<Tensor> outs;
    if (pool) {
      try {
        outs = execute(moved ? slot.inputs : inputs);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    void* graph = pool ? gs.backend->end_capture(gs.device, pool, &why) : nullptr;
    if (!graph || !why.empty()) {
      if (graph) gs.backend->destroy_graph(graph, gs.device);
      gs.failed = true;
      gs.clear();
      {
        std::lock_guard<std::mutex> lock(g_graph_mu);
        ++g_graph_stats.failed;
        g_graph_stats.last_failure = fmt::format("{}: {}", graph_.label, why);
      }
      return execute(inputs);  // nothing ran during the capture
    }
    slot.graph = graph;
    slot.outputs = std::move(outs);
    if (gs.slots.empty()) {
      gs.addresses.clear();
      for (const Tensor& c : graph_.captured) gs.addresses.push_back(c.unsafe_impl()->data());
    }
    gs.slots.push_back(std::move(slot));
    use = &gs.slots.back();
    std::lock_guard<std::mutex> lock(g_graph_mu);
    ++g_graph_stats.captured;
  } else if (use->copies) {
    for (size_t k = 0; k < inputs.size(); ++k) copy_into(use->inputs[k], inputs[k]);
    std::lock_guard<std::mutex> lock(g_graph_mu);
    ++g_graph_stats.input_copies;
  }
  gs.backend->launch_graph(use->graph, gs.device);
  {
    std::lock_guard<std::mutex> lock(g_graph_mu);
    ++g_graph_stats.replays;
    ++graph_replays_;
  }
  // What the write-backs did to the captured tensors, as execute() records it.
  for (const WriteBack& w : graph_.writebacks)
    graph_.captured[w.target].unsafe_impl()->storage->version_.fetch_add(1,
                                                                         std::memory_order_relaxed);
  // The results themselves, as views of the graph's buffers (or of the captured tensors they
  // view): this graph replays again only once the caller has let go of all of them.
  std::vector<Tensor> out;
  out.reserve(use->outputs.size());
  for (const Tensor& v : use->outputs) {
    const TensorImpl* x = v.unsafe_impl();
    out.push_back(make_view(v, x->shape, x->strides, x->offset));
  }
  return out;
}

}  // namespace duet::detail
