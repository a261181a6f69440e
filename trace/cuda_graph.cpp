// duet: CUDA-graph replay of a plan (Note [CUDA graph replay] in trace/executor.h): which plans
// qualify, the capture at their second run, the replays after it, and the process-wide counters.
#include <exception>
#include <mutex>

#include "core/allocator.h"
#include "core/tensor_impl.h"
#include "trace/compile.h"
#include "trace/plan_internal.h"

namespace duet::detail {

Plan::GraphState::~GraphState() {
  if (graph) backend->destroy_graph(graph, device);
}

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
  // steps (their trip counts are decided on the host) and no transfers (host memory).
  if (!opt_.cuda_graph || !controls_.empty() || !wave_begin_.empty()) return;
  Device dev;
  bool any = false;
  for (const GraphNode& n : graph_.nodes) {
    if (n.kind != NodeKind::Op && n.kind != NodeKind::Input) continue;
    if (n.kind == NodeKind::Op && n.op == OpId::Transfer) return;
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

std::vector<Tensor> Plan::run_graphed(const std::vector<Tensor>& inputs) {
  GraphState& gs = *cuda_graph_;
  bool ok = !gs.failed;
  for (const Tensor& t : inputs) ok = ok && t.device() == gs.device;
  if (!ok || gs.runs++ == 0) return execute(inputs);  // the first run builds kernels and state
  // A captured tensor with new storage (Module::to) invalidates the graph's addresses.
  if (gs.graph) {
    for (size_t k = 0; k < graph_.captured.size(); ++k)
      if (graph_.captured[k].unsafe_impl()->data() != gs.addresses[k]) {
        gs.backend->destroy_graph(gs.graph, gs.device);
        gs.graph = nullptr;
        break;
      }
  }
  if (!gs.graph) {
    gs.inputs.clear();
    for (const Tensor& t : inputs) {
      gs.inputs.push_back(empty(t.sizes(), t.dtype(), gs.device));
      copy_into(gs.inputs.back(), t);
    }
    run_hoisted_if_stale();  // not in the graph: they run when a parameter changes
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
        outs = execute(gs.inputs);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    void* graph = pool ? gs.backend->end_capture(gs.device, pool, &why) : nullptr;
    if (!graph || !why.empty()) {
      if (graph) gs.backend->destroy_graph(graph, gs.device);
      gs.failed = true;
      {
        std::lock_guard<std::mutex> lock(g_graph_mu);
        ++g_graph_stats.failed;
        g_graph_stats.last_failure = fmt::format("{}: {}", graph_.label, why);
      }
      return execute(inputs);  // nothing ran during the capture
    }
    gs.graph = graph;
    gs.outputs = std::move(outs);
    gs.addresses.clear();
    for (const Tensor& c : graph_.captured) gs.addresses.push_back(c.unsafe_impl()->data());
    std::lock_guard<std::mutex> lock(g_graph_mu);
    ++g_graph_stats.captured;
  } else {
    for (size_t k = 0; k < inputs.size(); ++k) copy_into(gs.inputs[k], inputs[k]);
    run_hoisted_if_stale();
  }
  gs.backend->launch_graph(gs.graph, gs.device);
  {
    std::lock_guard<std::mutex> lock(g_graph_mu);
    ++g_graph_stats.replays;
    ++graph_replays_;
  }
  // What the write-backs did to the captured tensors, as execute() records it.
  for (const WriteBack& w : graph_.writebacks)
    graph_.captured[w.target].unsafe_impl()->storage->version_.fetch_add(1,
                                                                         std::memory_order_relaxed);
  std::vector<Tensor> out;
  out.reserve(gs.outputs.size());
  for (size_t k = 0; k < gs.outputs.size(); ++k) {
    const Tensor& v = gs.outputs[k];
    if (alias_output_[k]) {  // a view of a captured tensor: the caller's own memory
      const TensorImpl* x = v.unsafe_impl();
      out.push_back(make_view(v, x->shape, x->strides, x->offset));
    } else {  // a copy: the next replay writes the graph's buffer again
      out.push_back(empty(v.sizes(), v.dtype(), v.device()));
      copy_into(out.back(), v);
    }
  }
  return out;
}

}  // namespace duet::detail
