#include "trace/executor.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <unordered_map>

#include <omp.h>

#include <exception>

#include "core/dispatch.h"
#include "kernels/loops.h"
#include "core/tensor_impl.h"
#include "eager/autograd.h"
#include "kernels/cpu_kernels.h"
#include "trace/codegen.h"
#include "trace/compile.h"
#include "trace/fusion.h"

namespace duet::detail {

namespace {
std::atomic<bool> g_verify_plans{false};
}
void set_verify_plans(bool on) { g_verify_plans.store(on); }
bool verify_plans() { return g_verify_plans.load(std::memory_order_relaxed); }

PlanOptions PlanOptions::from_disabled(const std::vector<std::string>& disabled) {
  // DUET_DISABLE_PLAN_PASSES=fuse,plan_memory switches plan passes off everywhere (debugging).
  const char* env = std::getenv("DUET_DISABLE_PLAN_PASSES");
  const std::string extra = env ? env : "";
  auto on = [&](const char* p) {
    return std::find(disabled.begin(), disabled.end(), p) == disabled.end() &&
           extra.find(p) == std::string::npos;
  };
  PlanOptions o;
  o.fuse = on("fuse");
  o.codegen = on("codegen");
  o.plan_memory = on("plan_memory");
  o.parallel = on("parallel");
  o.hoist = on("hoist");
  o.cuda_graph = on("cuda_graph");
  return o;
}

/// One fused group as the plan runs it.
struct Plan::FusedStep {
  std::shared_ptr<kernels::FusedKernel> kernel;
  std::vector<int32_t> inputs;   ///< values, in register order
  std::vector<int32_t> outputs;  ///< values stored, in output order
  std::vector<bool> fresh;       ///< per output: allocated at every run
  int32_t reduction = -1;
  bool fresh_reduction = false;
  int32_t reduce_dims = 0;
  Shape shape;
  std::vector<Tensor> tmp;  ///< inputs made dense for one run (layouts no 2-D walk expresses)
  Device device;            ///< where it runs (not the CPU: a device backend's fused runner)
  std::vector<Tensor> device_consts;  ///< per input: a CPU constant copied to the device, or none
  bool prepared = false;              ///< the device runner's prepare() ran
};

/// One control-flow node as the plan runs it (Note [Control steps]).
struct Plan::ControlStep {
  std::shared_ptr<const ControlFlow> cf;
  std::vector<std::unique_ptr<Plan>> plans;  ///< per subgraph
  std::vector<int32_t> inputs;               ///< the node's input values
  std::vector<int32_t> projects;             ///< per result: its Project value, or -1
};

namespace {

bool is_step_node(const GraphNode& g) {
  return g.kind == NodeKind::Op || g.kind == NodeKind::Control || g.kind == NodeKind::Project;
}
// The first `count` results of g, each in a buffer of its own: one that is an input, a view of
// one, or the buffer of an earlier result gets a copy (Note [Control steps]).
Graph ensure_fresh_results(Graph g, size_t count) {
  std::vector<int32_t> roots;
  for (size_t k = 0; k < count && k < g.outputs.size(); ++k) {
    const int32_t r = buffer_root(g, g.outputs[k]);
    bool copy = g.nodes[r].kind == NodeKind::Input;
    for (int32_t q : roots) copy = copy || (q == r && g.nodes[r].kind != NodeKind::Constant);
    roots.push_back(r);
    if (!copy) continue;
    GraphNode c;
    c.kind = NodeKind::Op;
    c.op = OpId::Copy;
    c.inputs = {g.outputs[k]};
    c.meta = g.nodes[g.outputs[k]].meta;
    g.outputs[k] = g.add(std::move(c));
  }
  return g;
}

// Copies src into dst with the Copy kernel (no dispatch, no tape).
void copy_into(const Tensor& dst, const Tensor& src) {
  const Tensor* in[] = {&src};
  op_def(OpId::Copy).kernel[static_cast<int>(dst.device().type)](TensorRefs(in, 1), Attrs{}, dst);
}

// Row t of x along dim 0, as a view.
Tensor row(const Tensor& x, int64_t t) {
  const TensorImpl* a = x.unsafe_impl();
  Shape s(a->shape.data() + 1, a->shape.size() - 1);
  Strides st(a->strides.data() + 1, a->strides.size() - 1);
  return make_view(x, s, st, a->offset + t * a->strides[0]);
}

bool truth(const Tensor& t) { return read_double(t, 0) != 0; }

/// A tensor over `storage` at a byte offset (the arena's buffers).
Tensor tensor_in(const StoragePtr& storage, int64_t byte_offset, const TensorMeta& m) {
  auto* t = new TensorImpl();
  TensorImplPtr p = TensorImplPtr::adopt(t);
  t->dtype = m.dtype;
  t->shape = m.shape;
  t->strides = contiguous_strides(m.shape);
  t->offset = byte_offset / static_cast<int64_t>(itemsize(m.dtype));
  t->storage = storage;
  return Tensor(std::move(p));
}

int64_t nbytes(const TensorMeta& m) { return m.shape.numel() * int64_t(itemsize(m.dtype)); }

/// Collapses dims [lo, hi) of `st` (aligned to `shape`) into one stride; false when no single
/// stride walks them in row-major order.
bool collapse(const int64_t* st, const Shape& shape, int64_t lo, int64_t hi, int64_t* out) {
  int64_t stride = 0, size = 1;
  bool any = false;
  for (int64_t d = hi - 1; d >= lo; --d) {
    if (shape[d] == 1) continue;
    if (!any) {
      stride = st[d];
      size = shape[d];
      any = true;
    } else if (st[d] == stride * size) {
      size *= shape[d];
    } else {
      return false;
    }
  }
  *out = stride;
  return true;
}

}  // namespace

/// A plan's CUDA graph (Note [CUDA graph replay]).
struct Plan::GraphState {
  Device device;
  const DeviceBackend* backend = nullptr;
  int64_t runs = 0;
  void* graph = nullptr;               ///< the backend's executable graph, once captured
  std::vector<Tensor> inputs;          ///< static input buffers the graph reads
  std::vector<Tensor> outputs;         ///< the results, in the graph's private pool
  std::vector<const void*> addresses;  ///< data of each captured tensor at capture
  bool failed = false;
  ~GraphState() {
    if (graph) backend->destroy_graph(graph, device);
  }
};

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

Plan::Plan(Graph graph, PlanOptions options) : g_(std::move(graph)), opt_(options) {
  build();
  find_epilogues();
  // CUDA-graph replay: every step on one device whose backend captures graphs; no control
  // steps (their trip counts are decided on the host) and no transfers (host memory).
  if (!opt_.cuda_graph || !controls_.empty() || !wave_begin_.empty()) return;
  Device dev;
  bool any = false;
  for (const GraphNode& n : g_.nodes) {
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
  for (int32_t o : g_.outputs) {
    const GraphNode& r = g_.nodes[buffer_root(g_, o)];
    if (r.kind == NodeKind::Input && r.role != InputRole::Captured) return;
  }
  const DeviceBackend* b = device_backend(dev.type);
  if (!b || !b->begin_capture) return;
  graph_ = std::make_unique<GraphState>();
  graph_->device = dev;
  graph_->backend = b;
  stats_.cuda_graph = true;
}
Plan::~Plan() = default;

void Plan::build() {
  const bool debug = std::getenv("DUET_DEBUG_PLAN") != nullptr;  // print what is decided
  const int32_t n = static_cast<int32_t>(g_.nodes.size());
  vals_.assign(n, Tensor());
  slot_value_.assign(g_.num_runtime_inputs, -1);
  // The buffer each value lives in: itself, or the root of its chain of views.
  std::vector<int32_t> root(n);
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = g_.nodes[i];
    root[i] = is_view_node(g) ? root[g.inputs[0]] : i;
    if (g.kind == NodeKind::Op && op_class(g.op) != OpClass::View)
      stats_.intermediate_bytes += nbytes(g.meta);
  }
  std::vector<bool> fresh(n, false);
  clone_output_.assign(g_.outputs.size(), false);
  alias_output_.assign(g_.outputs.size(), false);
  for (size_t k = 0; k < g_.outputs.size(); ++k) {
    const GraphNode& r = g_.nodes[root[g_.outputs[k]]];
    if (r.kind == NodeKind::Op) fresh[root[g_.outputs[k]]] = true;
    clone_output_[k] = r.kind == NodeKind::Constant;
    // A captured tensor returned as a result gets a handle of its own, as a view would.
    alias_output_[k] = r.kind == NodeKind::Input && r.role == InputRole::Captured;
  }
  stage_writeback_.assign(g_.writebacks.size(), false);
  for (size_t k = 0; k < g_.writebacks.size(); ++k)
    stage_writeback_[k] = g_.nodes[root[g_.writebacks[k].value]].kind != NodeKind::Op;

  // ---- fusion groups and the schedule (Note [Schedule]) ----
  std::vector<FusionGroup> groups;
  if (opt_.fuse) groups = find_fusion_groups(g_);
  std::vector<int32_t> group_of(n, -1);
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int32_t m : groups[gi].members) group_of[m] = static_cast<int32_t>(gi);
  // Step units: each group, and each op node outside groups. Kahn's algorithm over them.
  const int32_t ng = static_cast<int32_t>(groups.size());
  // A Control node and its Project nodes are one unit.
  auto owner = [&](int32_t v) {
    return g_.nodes[v].kind == NodeKind::Project ? g_.nodes[v].inputs[0] : v;
  };
  auto unit_of = [&](int32_t v) -> int32_t {
    return group_of[v] >= 0 ? group_of[v] : ng + owner(v);
  };
  bool has_control = false;
  std::vector<int32_t> first_node(ng + n, -1);
  std::vector<std::vector<int32_t>> unit_nodes(ng + n);
  for (int32_t i = 0; i < n; ++i)
    if (is_step_node(g_.nodes[i])) {
      has_control = has_control || g_.nodes[i].kind == NodeKind::Control;
      const int32_t u = unit_of(i);
      if (first_node[u] < 0) first_node[u] = i;
      unit_nodes[u].push_back(i);
    }
  std::vector<int32_t> indeg(ng + n, 0);
  std::vector<std::vector<int32_t>> users(ng + n);
  for (int32_t u = 0; u < ng + n; ++u) {
    std::vector<int32_t> deps;
    for (int32_t v : unit_nodes[u])
      for (int32_t in : g_.nodes[v].inputs)
        if (is_step_node(g_.nodes[in]) && unit_of(in) != u) deps.push_back(unit_of(in));
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    indeg[u] = static_cast<int32_t>(deps.size());
    for (int32_t d : deps) users[d].push_back(u);
  }
  // Values a group keeps in registers need no buffer.
  std::vector<bool> materialized(n, true);
  for (const FusionGroup& f : groups) {
    for (int32_t m : f.members) materialized[m] = false;
    for (int32_t o : f.outputs) materialized[o] = true;
    if (f.reduction >= 0) materialized[f.reduction] = true;
  }
  // Memory-aware choice (with plan_memory): of the ready steps, the one that frees the most
  // bytes net (the buffers it reads for the last time, less the buffers it makes) runs first
  // when that is positive; else the one first in the graph. In a backward pass this runs a
  // weight gradient (which frees the activation it reads) before the input gradient beside it.
  // Views cost nothing and run as soon as they can, so that their readers are ready to choose.
  std::vector<int64_t> made_bytes(ng + n, 0);
  std::vector<std::vector<int32_t>> unit_reads(ng + n);
  std::vector<int32_t> readers_left(n, 0);
  std::vector<bool> kept(n, false);  // results and write-backs: live to the end anyway
  for (int32_t o : g_.outputs) kept[root[o]] = true;
  for (const WriteBack& w : g_.writebacks) kept[root[w.value]] = true;
  std::vector<bool> view_unit(ng + n, false);
  for (int32_t u = ng; u < ng + n; ++u)
    view_unit[u] = first_node[u] >= 0 && is_view_node(g_.nodes[u - ng]);
  for (int32_t u = 0; u < ng + n; ++u) {
    if (view_unit[u]) continue;  // its readers read the buffer
    for (int32_t v : unit_nodes[u]) {
      const GraphNode& g = g_.nodes[v];
      if (!is_view_node(g) && g.kind != NodeKind::Control && materialized[v] && !kept[v])
        made_bytes[u] += nbytes(g.meta);
      for (int32_t in : g.inputs) {
        const int32_t r = root[in];
        const NodeKind rk = g_.nodes[r].kind;
        if ((rk == NodeKind::Op || rk == NodeKind::Project) && !kept[r] && unit_of(r) != u)
          unit_reads[u].push_back(r);
      }
    }
    std::sort(unit_reads[u].begin(), unit_reads[u].end());
    unit_reads[u].erase(std::unique(unit_reads[u].begin(), unit_reads[u].end()),
                        unit_reads[u].end());
    for (int32_t r : unit_reads[u]) ++readers_left[r];
  }
  auto net_freed = [&](int32_t u) {
    int64_t freed = -made_bytes[u];
    for (int32_t r : unit_reads[u])
      if (readers_left[r] == 1) freed += nbytes(g_.nodes[r].meta);
    return freed;
  };
  std::vector<int32_t> ready;
  for (int32_t u = 0; u < ng + n; ++u)
    if (first_node[u] >= 0 && indeg[u] == 0) ready.push_back(u);
  std::vector<int32_t> order;
  while (!ready.empty()) {
    size_t pick = 0;
    int64_t best_freed = 0;
    for (size_t k = 0; k < ready.size(); ++k) {
      if (opt_.plan_memory && view_unit[ready[k]]) {  // free: lets its readers become ready
        pick = k;
        break;
      }
      const int64_t f = opt_.plan_memory ? std::max<int64_t>(net_freed(ready[k]), 0) : 0;
      if (f > best_freed || (f == best_freed && first_node[ready[k]] < first_node[ready[pick]])) {
        pick = k;
        best_freed = f;
      }
    }
    const int32_t u = ready[pick];
    ready[pick] = ready.back();
    ready.pop_back();
    order.push_back(u);
    for (int32_t r : unit_reads[u]) --readers_left[r];
    for (int32_t w : users[u])
      if (--indeg[w] == 0) ready.push_back(w);
  }
  int32_t units = 0;
  for (int32_t u = 0; u < ng + n; ++u) units += first_node[u] >= 0;
  DUET_ASSERT(static_cast<int32_t>(order.size()) == units,
              "[compile] the fused schedule of {} has a cycle ({} of {} steps ordered)", g_.label,
              order.size(), units);
  // ---- parallel branches (Note [Parallel waves]) ----
  // A step's wave is one more than the latest wave it reads from; the steps of one wave are
  // independent. With two threads, a plan runs wave by wave, the steps of a wave side by side
  // (each kernel on one thread), when the cost model says that beats running the steps in
  // order, each kernel on both threads: that is, when branches are many and their kernels too
  // small to split well.
  std::vector<int32_t> wave_of(ng + n, 0);
  int32_t num_waves = 0;
  for (int32_t u : order) {
    int32_t w = 0;
    for (int32_t v : unit_nodes[u])
      for (int32_t in : g_.nodes[v].inputs)
        if (is_step_node(g_.nodes[in]) && unit_of(in) != u)
          w = std::max(w, wave_of[unit_of(in)] + 1);
    wave_of[u] = w;
    num_waves = std::max(num_waves, w + 1);
  }
  bool parallel = false;
  if (opt_.parallel && !has_control && omp_get_max_threads() >= 2 && num_waves > 0) {
    // Estimated nanoseconds of each step on one thread, and how much faster it runs when its
    // kernels split over two (1: not at all). Measured on the 2-core AVX-512 machines: one core
    // multiplies at about 200 GFLOP/s from 16 x 256 x 512 up; oneDNN splits a product over two
    // threads only from about 64 MFLOP, and well (1.85x) only from about 256 MFLOP; an
    // elementwise kernel splits from 2 * kParallelGrain elements. (TT in bench/ checks it: the
    // two-tower step against the same step in order and with every wave side by side.)
    auto cost = [&](int32_t u, double* speedup) {
      double ns = 0, split_ns = 0;
      for (int32_t v : unit_nodes[u]) {
        const GraphNode& g = g_.nodes[v];
        if (g.meta.device.type != DeviceType::CPU) return -1.0;
        if (op_class(g.op) == OpClass::View) continue;
        const int64_t numel = g.meta.shape.numel();
        double c = 0;
        if (g.op == OpId::MatMul) {
          const Shape& a = g_.nodes[g.inputs[0]].meta.shape;
          const double flops = 2.0 * numel * (a.size() ? a[a.size() - 1] : 1);
          c = flops / 150.0 + 300;  // a little under the peak, and the call
          split_ns += c / (flops >= 256e6 ? 1.85 : flops >= 64e6 ? 1.5 : 1.0);
        } else {
          c = 0.1 * numel + 100;
          split_ns += numel >= 2 * kernels::kParallelGrain ? c / 1.9 : c;
        }
        ns += c;
      }
      *speedup = ns > 0 ? ns / split_ns : 1;
      return ns;
    };
    // Per wave: in order, each step split over both threads as it can (wave_serial), or the
    // steps side by side, one thread each (the longest step, or half the sum, and a fork).
    std::vector<double> wave_sum(num_waves, 0), wave_max(num_waves, 0), wave_serial(num_waves, 0);
    std::vector<int32_t> wave_count(num_waves, 0);
    bool cpu = true;
    for (int32_t u : order) {
      double speedup = 1;
      const double c = cost(u, &speedup);
      if (c < 0) cpu = false;
      wave_serial[wave_of[u]] += c / speedup;
      wave_sum[wave_of[u]] += c;
      wave_max[wave_of[u]] = std::max(wave_max[wave_of[u]], c);
      ++wave_count[wave_of[u]];
    }
    constexpr double kWaveOverheadNs = 1500;  // an OpenMP fork and join of two threads
    // DUET_PARALLEL=always (the tests use it) runs every wave of more than one step side by
    // side; =auto (default) asks the cost model, wave by wave.
    const char* env = std::getenv("DUET_PARALLEL");
    const bool always = env && std::string(env) == "always";
    double serial = 0, waved = 0;
    wave_parallel_.assign(num_waves, false);
    for (int32_t w = 0; w < num_waves; ++w) {
      const double side = std::max(wave_max[w], wave_sum[w] / 2) + kWaveOverheadNs;
      wave_parallel_[w] = wave_count[w] > 1 && (always || side < 0.85 * wave_serial[w]);
      serial += wave_serial[w];
      waved += wave_parallel_[w] ? side : wave_serial[w];
    }
    // Waves cost memory (no buffer is reused in place: steps of one wave may run together), so
    // a plan runs in waves only when they save a few percent of its time.
    parallel =
        cpu &&
        std::any_of(wave_parallel_.begin(), wave_parallel_.end(), [](bool b) { return b; }) &&
        (always || waved < 0.97 * serial);
    stats_.parallel = parallel;
    if (debug)
      fmt::print(stderr,
                 "--- parallel: {} waves, {} side by side; estimated {:.1f} us in order, {:.1f} us "
                 "in waves\n",
                 num_waves, std::count(wave_parallel_.begin(), wave_parallel_.end(), true),
                 serial / 1e3, waved / 1e3);
  }
  if (parallel)
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return wave_of[a] < wave_of[b]; });
  // The position of every value in the schedule (inputs and constants: -1): its step, or in a
  // parallel plan its wave, so that buffers of steps that may run together never share bytes.
  std::vector<int32_t> step_pos(order.size());
  for (size_t s = 0; s < order.size(); ++s)
    step_pos[s] = parallel ? wave_of[order[s]] : static_cast<int32_t>(s);
  std::vector<int32_t> pos(n, -1);
  for (size_t s = 0; s < order.size(); ++s)
    for (int32_t v : unit_nodes[order[s]]) pos[v] = step_pos[s];
  const int32_t num_steps = static_cast<int32_t>(order.size());
  const int32_t end_pos = parallel ? num_waves : num_steps;
  // Write-backs computed in place (docs/design.md, "Write-backs in place"): a value
  // made by a kernel goes straight into the captured tensor's storage when nothing reads that
  // storage after the value is computed, and the step computing it reads that storage, if at
  // all, only elementwise at the same layout (w - lr * g). Then there is no buffer and no copy.
  std::vector<int32_t> inplace(n, -1);
  inplace_writeback_.assign(g_.writebacks.size(), false);
  auto storage_of_root = [&](int32_t v) -> const StorageImpl* {
    const GraphNode& r = g_.nodes[root[v]];
    if (r.kind == NodeKind::Input && r.role == InputRole::Captured)
      return g_.captured[r.index].unsafe_impl()->storage.get();
    return nullptr;
  };
  std::unordered_map<const StorageImpl*, int32_t> last_read;
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : g_.nodes[i].inputs)
      if (const StorageImpl* st = storage_of_root(in))
        last_read[st] = std::max(last_read.count(st) ? last_read[st] : -1, pos[i]);
  for (size_t k = 0; k < g_.writebacks.size(); ++k) {
    const WriteBack& w = g_.writebacks[k];
    const GraphNode& v = g_.nodes[w.value];
    const Tensor& dst = g_.captured[w.target];
    const TensorImpl* d = dst.unsafe_impl();
    const int32_t gi = w.value < n ? group_of[w.value] : -1;
    if (v.kind != NodeKind::Op || op_class(v.op) == OpClass::View || fresh[w.value] ||
        inplace[w.value] >= 0 || !d->contiguous || d->dtype != v.meta.dtype ||
        d->shape != v.meta.shape || d->device() != v.meta.device ||
        (gi >= 0 && groups[gi].reduction >= 0))
      continue;
    const StorageImpl* st = d->storage.get();
    auto lr = last_read.find(st);
    bool ok = lr == last_read.end() || lr->second < pos[w.value] ||
              (lr->second == pos[w.value] && !parallel);
    if (!ok && parallel && lr->second == pos[w.value]) {
      // Steps of one wave run together: only the step computing the value may read there.
      ok = true;
      for (int32_t i = 0; i < n; ++i)
        if (pos[i] == pos[w.value] && unit_of(i) != unit_of(w.value))
          for (int32_t in : g_.nodes[i].inputs) ok = ok && storage_of_root(in) != st;
    }
    // What the step reads: the node's inputs, or the whole group's.
    const bool elementwise = gi >= 0 || op_class(v.op) == OpClass::Elementwise;
    std::vector<int32_t> reads(v.inputs.begin(), v.inputs.end());
    if (gi >= 0) reads = groups[gi].inputs;
    for (int32_t in : reads) {
      if (storage_of_root(in) != st) continue;
      const GraphNode& src = g_.nodes[in];
      ok = ok && elementwise && src.kind == NodeKind::Input &&
           g_.captured[src.index].unsafe_impl()->contiguous &&
           g_.captured[src.index].sizes() == d->shape &&
           g_.captured[src.index].storage_offset() == d->offset;
    }
    for (size_t j = 0; ok && j < g_.writebacks.size(); ++j)
      ok = !(stage_writeback_[j] && storage_of_root(g_.writebacks[j].value) == st);
    for (size_t j = 0; ok && j < g_.outputs.size(); ++j)
      ok = storage_of_root(g_.outputs[j]) != st;  // conservative: results alias nothing written
    if (!ok) continue;
    inplace[w.value] = w.target;
    inplace_writeback_[k] = true;
  }

  // ---- hoisting (parameter preprocessing) ----
  // A step whose inputs are all captured tensors, constants or hoisted values computes the same
  // result at every run until a captured tensor changes: it runs once, and again only when the
  // version of a storage it reads has changed (an optimizer step, a load). Its buffer is its
  // own, outside the arena. Results, in-place write-backs and random draws stay per run.
  std::vector<bool> param_only(n, false), hoisted(n, false);
  std::vector<bool> hoisted_unit(ng + n, false);
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = g_.nodes[i];
    param_only[i] = g.kind == NodeKind::Constant ||
                    (g.kind == NodeKind::Input && g.role == InputRole::Captured);
  }
  if (opt_.hoist) {
    for (int32_t s = 0; s < num_steps; ++s) {
      const int32_t u = order[s];
      bool ok = true;
      bool any_kernel = false;
      for (int32_t v : unit_nodes[u]) {
        const GraphNode& g = g_.nodes[v];
        ok = ok && g.kind == NodeKind::Op && !fresh[v] && inplace[v] < 0 && g.op != OpId::Random;
        any_kernel = any_kernel || !is_view_node(g);
        for (int32_t in : g.inputs) ok = ok && (param_only[in] || unit_of(in) == u);
      }
      if (!ok) continue;
      for (int32_t v : unit_nodes[u]) param_only[v] = true;
      // A view of parameters is static (made once below) unless no strides express it; then
      // it is a hoisted step too, so hoisted kernels never read it before it exists.
      hoisted_unit[u] = true;
      if (!any_kernel) continue;
      for (int32_t v : unit_nodes[u]) hoisted[v] = true;
      stats_.hoisted_nodes += static_cast<int64_t>(unit_nodes[u].size());
    }
    // Every hoisted step, a view copied because no strides express it included, re-runs when
    // a storage it reads changes version.
    for (int32_t i = 0; i < n; ++i)
      if (is_step_node(g_.nodes[i]) && hoisted_unit[unit_of(i)])
        for (int32_t in : g_.nodes[i].inputs)
          if (const StorageImpl* st = storage_of_root(in)) {
            auto* sp = const_cast<StorageImpl*>(st);
            if (std::none_of(hoist_versions_.begin(), hoist_versions_.end(),
                             [&](const auto& e) { return e.first == sp; }))
              hoist_versions_.push_back({sp, ~uint32_t(0)});
          }
  }

  // ---- buffers: which values need one, and their live intervals ----
  // A buffer is live from its step to the last step reading it or a view of it; write-backs
  // read after the last step.
  std::vector<int32_t> last_use(n, -1);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : g_.nodes[i].inputs) {
      const int32_t p = pos[i];
      last_use[root[in]] = std::max(last_use[root[in]], p);
      last_use[in] = std::max(last_use[in], p);
    }
  for (const WriteBack& w : g_.writebacks) last_use[root[w.value]] = end_pos;
  std::vector<int32_t> request_of(n, -1);
  auto needs_buffer = [&](int32_t v) {
    const GraphNode& g = g_.nodes[v];
    return g.kind == NodeKind::Op && op_class(g.op) != OpClass::View && materialized[v] &&
           !fresh[v] && inplace[v] < 0 && !hoisted[v];
  };
  // In place: a step writing value v at the same index it reads input `in`, which dies there.
  // No other input of the step may read that buffer through a view (a shifted slice of it
  // would see the new values).
  auto can_reuse = [&](int32_t v, int32_t in, const std::vector<int32_t>& step_inputs) {
    if (in < 0 || request_of[in] < 0 || root[in] != in) return false;
    for (int32_t x : step_inputs)
      if (x != in && root[x] == in) return false;
    const GraphNode& a = g_.nodes[v];
    const GraphNode& b = g_.nodes[in];
    return last_use[in] == pos[v] && a.meta.shape == b.meta.shape && a.meta.dtype == b.meta.dtype &&
           a.meta.device == b.meta.device;
  };
  for (int32_t s = 0; s < num_steps; ++s) {
    const int32_t u = order[s];
    const bool is_group = u < ng;
    std::vector<int32_t> made;
    if (is_group) {
      for (int32_t o : groups[u].outputs) made.push_back(o);
      if (groups[u].reduction >= 0) made.push_back(groups[u].reduction);
    } else {
      made.push_back(u - ng);
    }
    std::vector<int32_t> taken;
    for (int32_t v : made) {
      if (!needs_buffer(v)) continue;
      BufferRequest r;
      r.bytes = nbytes(g_.nodes[v].meta);
      r.first = step_pos[s];
      r.last = std::max(last_use[v], step_pos[s]);
      // Reuse in place: elementwise kernels and fused groups (not a reduction's result).
      const GraphNode& node = g_.nodes[v];
      const bool elementwise_step =
          (is_group && v != groups[u].reduction) ||
          (!is_group && op_class(node.op) == OpClass::Elementwise && node.op != OpId::Cast);
      if (opt_.plan_memory && elementwise_step && !parallel) {
        const std::vector<int32_t>& ins = is_group ? groups[u].inputs : node.inputs;
        for (int32_t in : ins)
          if (can_reuse(v, in, ins) && std::find(taken.begin(), taken.end(), in) == taken.end()) {
            r.reuse = request_of[in];
            taken.push_back(in);
            if (is_group && g_.nodes[in].op == OpId::MatMul) ++stats_.epilogues;
            break;
          }
      }
      request_of[v] = static_cast<int32_t>(requests_.size());
      requests_.push_back(r);
    }
  }
  StoragePtr arena;
  if (opt_.plan_memory) {
    memory_ = plan_memory(requests_);
    if (verify_plans()) {
      const std::string bad = check_memory_plan(requests_, memory_);
      DUET_ASSERT(bad.empty(), "[compile] memory plan of {}: {}", g_.label, bad);
    }
    stats_.arena_bytes = memory_.arena_bytes;
    stats_.buffer_bytes = memory_.arena_bytes;
    if (debug) {
      fmt::print(stderr, "--- buffers of {} (arena {} bytes)\n", g_.label, memory_.arena_bytes);
      for (int32_t i = 0; i < n; ++i)
        if (request_of[i] >= 0) {
          const BufferRequest& r = requests_[request_of[i]];
          fmt::print(stderr, "%{}: {} bytes at {}, steps {}..{}{}\n", i, r.bytes,
                     memory_.offsets[request_of[i]], r.first, r.last,
                     r.reuse >= 0 ? " (in place)" : "");
        }
    }
    if (memory_.arena_bytes > 0) {
      Device dev = Device::cpu();
      for (int32_t i = 0; i < n; ++i)
        if (request_of[i] >= 0) dev = g_.nodes[i].meta.device;
      arena = new_storage(static_cast<size_t>(memory_.arena_bytes), dev);
    }
  }

  // ---- static values and steps ----
  std::vector<bool> is_static(n, false);
  SuspendModes eager;
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = g_.nodes[i];
    if (g.kind == NodeKind::Constant) {
      vals_[i] = g.constant;
      is_static[i] = true;
    } else if (g.kind == NodeKind::Input) {
      if (g.role == InputRole::Captured) {
        vals_[i] = g_.captured[g.index];
        is_static[i] = true;
      } else {
        slot_value_[g.index] = i;
        dynamic_.push_back(i);
      }
    }
  }
  auto set_buffer = [&](int32_t v) {
    const GraphNode& g = g_.nodes[v];
    if (inplace[v] >= 0) {
      vals_[v] = g_.captured[inplace[v]];
      is_static[v] = true;
    } else if (hoisted[v]) {
      vals_[v] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
      stats_.buffer_bytes += nbytes(g.meta);
      is_static[v] = true;
    } else if (request_of[v] >= 0) {
      if (opt_.plan_memory)
        vals_[v] = arena ? tensor_in(arena, memory_.offsets[request_of[v]], g.meta)
                         : empty(g.meta.shape, g.meta.dtype, g.meta.device);
      else
        vals_[v] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
      if (!opt_.plan_memory) stats_.buffer_bytes += nbytes(g.meta);
      is_static[v] = true;
    }
    if (!is_static[v]) dynamic_.push_back(v);
  };
  for (int32_t s = 0; s < num_steps; ++s) {
    const int32_t u = order[s];
    if (u < ng) {
      FusionGroup& f = groups[u];
      auto fs = std::make_unique<FusedStep>();
      fs->kernel = std::make_shared<kernels::FusedKernel>();
      fs->kernel->program = std::move(f.program);
      fs->kernel->codegen_allowed = opt_.codegen;
      fs->inputs = f.inputs;
      fs->outputs = f.outputs;
      for (int32_t o : f.outputs) {
        fs->fresh.push_back(fresh[o]);
        set_buffer(o);
      }
      fs->reduction = f.reduction;
      if (f.reduction >= 0) {
        fs->fresh_reduction = fresh[f.reduction];
        set_buffer(f.reduction);
      }
      fs->reduce_dims = f.reduce_dims;
      fs->shape = f.shape;
      fs->device = g_.nodes[f.members[0]].meta.device;
      if (!fs->device.is_cpu()) {
        // One-element CPU constants (wrapped numbers) go to the device once (trace/fusion.h).
        fs->device_consts.resize(f.inputs.size());
        for (size_t k = 0; k < f.inputs.size(); ++k) {
          const GraphNode& in = g_.nodes[f.inputs[k]];
          if (in.kind == NodeKind::Constant && !(in.meta.device == fs->device)) {
            SuspendModes eager;
            NoGradGuard no_grad;
            fs->device_consts[k] = in.constant.to(fs->device);
          }
        }
      }
      stats_.fused_kernels += 1;
      stats_.fused_nodes += static_cast<int64_t>(f.members.size());
      (hoisted_unit[u] ? hoisted_steps_ : steps_)
          .push_back(Step{StepKind::Fused, nullptr, nullptr, static_cast<int32_t>(fused_.size()), 0,
                          0, false});
      if (!hoisted_unit[u]) step_wave_.push_back(wave_of[u]);
      fused_.push_back(std::move(fs));
      continue;
    }
    const int32_t i = u - ng;
    const GraphNode& g = g_.nodes[i];
    if (g.kind == NodeKind::Control) {
      auto c = std::make_unique<ControlStep>();
      c->cf = g.control;
      c->inputs = g.inputs;
      c->projects.assign(g.control->results.size(), -1);
      for (int32_t v : unit_nodes[u])
        if (g_.nodes[v].kind == NodeKind::Project) {
          c->projects[g_.nodes[v].index] = v;
          dynamic_.push_back(v);
        }
      const ControlFlow& cf = *g.control;
      for (size_t k = 0; k < cf.graphs.size(); ++k) {
        size_t fresh_count = cf.graphs[k].outputs.size();  // cond branches, while_loop body
        if (cf.kind == ControlKind::Scan) fresh_count = size_t(cf.num_carry);
        if (cf.kind == ControlKind::WhileLoop && k == 0) fresh_count = 0;
        c->plans.push_back(
            std::make_unique<Plan>(ensure_fresh_results(cf.graphs[k], fresh_count), opt_));
      }
      steps_.push_back(Step{StepKind::Control, nullptr, nullptr,
                            static_cast<int32_t>(controls_.size()), 0, 0, false});
      step_wave_.push_back(wave_of[u]);
      controls_.push_back(std::move(c));
      continue;
    }
    const OpDef& def = op_def(g.op);
    if (def.cls == OpClass::View && is_static[g.inputs[0]]) {
      Tensor v = def.view(vals_[g.inputs[0]], g.attrs, g.meta);
      if (v.defined()) {  // else no strides express it: a copy at every run
        vals_[i] = v;
        is_static[i] = true;
        continue;
      }
    }
    Step st{def.cls == OpClass::View ? StepKind::View : StepKind::Kernel,
            &def,
            nullptr,
            i,
            static_cast<int32_t>(args_.size()),
            static_cast<int32_t>(g.inputs.size()),
            fresh[i]};
    if (def.cls != OpClass::View) {
      st.kernel = def.kernel[static_cast<int>(g.meta.device.type)];
      DUET_CHECK_DEVICE(st.kernel, "[{}] has no kernel for device {} ({})", def.name, g.meta.device,
                        g_.label);
      set_buffer(i);
    } else if (!hoisted_unit[u]) {
      dynamic_.push_back(i);  // a hoisted view keeps its value between runs
    }
    for (int32_t in : g.inputs) args_.push_back(&vals_[in]);
    (hoisted_unit[u] ? hoisted_steps_ : steps_).push_back(st);
    if (!hoisted_unit[u]) step_wave_.push_back(wave_of[u]);
  }
  // args_ grew while steps were made: its pointers point into vals_, which did not move.
  if (parallel)
    for (size_t i = 0; i < steps_.size(); ++i)
      if (i == 0 || step_wave_[i] != step_wave_[i - 1])
        wave_begin_.push_back(static_cast<int32_t>(i));
  if (debug) fmt::print(stderr, "{}\n--- schedule\n{}\n", g_.str(), schedule_str());
}

std::string Plan::check_memory() const {
  if (!opt_.plan_memory) return "";
  return check_memory_plan(requests_, memory_);
}

std::string Plan::schedule_str() const {
  std::string s;
  for (const Step& st : steps_) {
    if (st.kind == StepKind::Fused) {
      const FusedStep& f = *fused_[st.out];
      s += fmt::format("fused {} -> {}", f.shape, f.outputs.size());
      s += "\n" + f.kernel->program.str();
    } else if (st.kind == StepKind::Control) {
      const ControlStep& c = *controls_[st.out];
      s += fmt::format("{} -> {} results, {} subplans\n", c.cf->name(), c.projects.size(),
                       c.plans.size());
    } else {
      s += fmt::format("%{} = {}\n", st.out, st.def->name);
    }
  }
  return s;
}

void Plan::run_fused(FusedStep& f) {
  const kernels::FusedProgram& p = f.kernel->program;
  kernels::DuetFusedArgs a{};
  const Shape& S = f.shape;
  const int64_t nd = S.size();
  // The split of the iteration into [outer, inner] (Note [Fused iteration]).
  int64_t split = 0;
  int64_t aligned[DUET_FUSED_MAX_INPUTS][16];
  auto align = [&](const Tensor& t, int64_t* st) {
    const TensorImpl* x = t.unsafe_impl();
    const int64_t lead = nd - x->ndim();
    for (int64_t d = 0; d < nd; ++d)
      st[d] = (d < lead || x->shape[d - lead] == 1) ? 0 : x->strides[d - lead];
  };
  DUET_ASSERT(nd <= 16, "[fused] {} dims", nd);
  auto input = [&](size_t k) -> const Tensor& {
    return k < f.device_consts.size() && f.device_consts[k].defined() ? f.device_consts[k]
                                                                      : vals_[f.inputs[k]];
  };
  for (size_t k = 0; k < f.inputs.size(); ++k) align(input(k), aligned[k]);
  if (p.reduce == kernels::FusedReduce::Inner) {
    split = nd - f.reduce_dims;
  } else if (p.reduce == kernels::FusedReduce::Outer) {
    split = f.reduce_dims;
  } else {
    // The split that the most inputs walk with one stride per side, with the longest rows.
    int best = -1;
    for (int64_t sp = 0; sp <= nd; ++sp) {  // as many dims inner as possible
      int ok = 0;
      for (size_t k = 0; k < f.inputs.size(); ++k) {
        int64_t x, y;
        ok += collapse(aligned[k], S, 0, sp, &x) && collapse(aligned[k], S, sp, nd, &y);
      }
      if (ok > best) {
        best = ok;
        split = sp;
      }
      if (ok == static_cast<int>(f.inputs.size())) break;
    }
  }
  a.outer = 1;
  a.inner = 1;
  for (int64_t d = 0; d < nd; ++d) (d < split ? a.outer : a.inner) *= S[d];
  for (size_t k = 0; k < f.inputs.size(); ++k) {
    const Tensor* t = &input(k);
    int64_t so, si;
    if (!collapse(aligned[k], S, 0, split, &so) || !collapse(aligned[k], S, split, nd, &si)) {
      // No 2-D walk reads it: a dense copy at the iteration shape for this run.
      Strides st;
      st.resize(nd);
      for (int64_t d = 0; d < nd; ++d) st[d] = aligned[k][d];
      Tensor view = make_view(*t, S, st, t->storage_offset());
      Tensor dense = empty(S, t->dtype(), t->device());
      copy_into(dense, view);
      f.tmp.push_back(dense);
      t = &f.tmp.back();
      align(*t, aligned[k]);
      collapse(aligned[k], S, 0, split, &so);
      collapse(aligned[k], S, split, nd, &si);
    }
    a.in[k] = t->unsafe_impl()->data();
    a.in_so[k] = so;
    a.in_si[k] = si;
  }
  for (size_t o = 0; o < f.outputs.size(); ++o) {
    Tensor& v = vals_[f.outputs[o]];
    if (f.fresh[o]) {
      const TensorMeta& m = g_.nodes[f.outputs[o]].meta;
      v = empty(m.shape, m.dtype, m.device);
    }
    a.out[o] = v.unsafe_impl()->data();
  }
  if (f.reduction >= 0) {
    Tensor& v = vals_[f.reduction];
    if (f.fresh_reduction) {
      const TensorMeta& m = g_.nodes[f.reduction].meta;
      v = empty(m.shape, m.dtype, m.device);
    }
    a.red_out = v.unsafe_impl()->data();
  }
  if (f.device.is_cpu()) {
    f.kernel->run(a);
    codegen_note_run(f.kernel);
  } else {
    const kernels::FusedDeviceRunner* r = kernels::fused_device_runner(f.device.type);
    DUET_ASSERT(r, "[fused] no fused runner for {}", f.device);
    if (!f.prepared) {
      r->prepare(*f.kernel, f.device, codegen::cache_dir());
      f.prepared = true;
    }
    r->run(*f.kernel, a, f.device);
  }
  if (!f.tmp.empty()) f.tmp.clear();
}

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) {
    // Busy: re-entered, or called from another thread. A spare copy of the plan runs the call;
    // spares are kept, so that threads calling one plan side by side build each copy once.
    std::unique_ptr<Plan> spare;
    {
      std::lock_guard<std::mutex> l(spares_mu_);
      if (!spares_.empty()) {
        spare = std::move(spares_.back());
        spares_.pop_back();
      }
    }
    if (!spare) spare = std::make_unique<Plan>(g_, opt_);
    std::vector<Tensor> out = spare->run(inputs);
    std::lock_guard<std::mutex> l(spares_mu_);
    spares_.push_back(std::move(spare));
    return out;
  }
  if (graph_) return run_graphed(inputs);
  return execute(inputs);
}

std::vector<Tensor> Plan::run_graphed(const std::vector<Tensor>& inputs) {
  GraphState& gs = *graph_;
  bool ok = !gs.failed;
  for (const Tensor& t : inputs) ok = ok && t.device() == gs.device;
  if (!ok || gs.runs++ == 0) return execute(inputs);  // the first run builds kernels and state
  // A captured tensor with new storage (Module::to) invalidates the graph's addresses.
  if (gs.graph) {
    for (size_t k = 0; k < g_.captured.size(); ++k)
      if (g_.captured[k].unsafe_impl()->data() != gs.addresses[k]) {
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
        g_graph_stats.last_failure = fmt::format("{}: {}", g_.label, why);
      }
      return execute(inputs);  // nothing ran during the capture
    }
    gs.graph = graph;
    gs.outputs = std::move(outs);
    gs.addresses.clear();
    for (const Tensor& c : g_.captured) gs.addresses.push_back(c.unsafe_impl()->data());
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
  }
  // What the write-backs did to the captured tensors, as execute() records it.
  for (const WriteBack& w : g_.writebacks)
    g_.captured[w.target].unsafe_impl()->storage->version_.fetch_add(1, std::memory_order_relaxed);
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

void Plan::find_epilogues() {
  step_epilogue_.assign(steps_.size(), -1);
  if (!wave_begin_.empty()) return;  // steps in order only
  std::vector<int32_t> readers(g_.nodes.size(), 0);
  for (const GraphNode& n : g_.nodes)
    for (int32_t in : n.inputs) ++readers[in];
  for (int32_t o : g_.outputs) ++readers[o];
  for (const WriteBack& w : g_.writebacks) ++readers[w.value];
  for (size_t i = 0; i + 1 < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const Step& t = steps_[i + 1];
    if (s.kind != StepKind::Kernel || (t.kind != StepKind::Fused && t.kind != StepKind::Kernel))
      continue;
    const GraphNode& mm = g_.nodes[s.out];
    if (mm.op != OpId::MatMul || mm.meta.shape.size() != 2 || readers[s.out] != 1 ||
        !kernels::gemm_epilogue(mm.meta.device.type))
      continue;
    // The bias: the add's other operand, of the product's dtype and device, along its last dim.
    auto bias_ok = [&](int32_t v) {
      const GraphNode& bias = g_.nodes[v];
      const int64_t n = mm.meta.shape[1];
      return bias.kind != NodeKind::Constant && bias.meta.dtype == mm.meta.dtype &&
             bias.meta.device == mm.meta.device && bias.meta.shape.numel() == n &&
             (bias.meta.shape.size() == 1 ||
              (bias.meta.shape.size() == 2 && bias.meta.shape[0] == 1));
    };
    Epilogue ep{};
    if (t.kind == StepKind::Kernel) {  // a lone add (a group of one op runs its eager kernel)
      const GraphNode& add = g_.nodes[t.out];
      if (add.op != OpId::Add || add.inputs.size() != 2 || add.meta.dtype != mm.meta.dtype ||
          add.meta.shape != mm.meta.shape)
        continue;
      const int km = add.inputs[0] == s.out ? 0 : add.inputs[1] == s.out ? 1 : -1;
      if (km < 0 || !bias_ok(add.inputs[1 - km])) continue;
      ep = {t.out, add.inputs[1 - km], false, t.fresh};
    } else {
      const FusedStep& f = *fused_[t.out];
      const kernels::FusedProgram& p = f.kernel->program;
      if (f.reduction >= 0 || f.outputs.size() != 1 || p.num_inputs() != 2 ||
          p.dtype != mm.meta.dtype)
        continue;
      const int km = f.inputs[0] == s.out ? 0 : f.inputs[1] == s.out ? 1 : -1;
      if (km < 0 || !bias_ok(f.inputs[1 - km])) continue;
      // add(r_mm, r_bias) in either order, then maybe relu; the last value is the output.
      const std::vector<kernels::FusedInstr>& code = p.code;
      if (code.empty() || code.size() > 2 || code[0].op != OpId::Add) continue;
      const bool operands = (code[0].src[0] == km && code[0].src[1] == 1 - km) ||
                            (code[0].src[1] == km && code[0].src[0] == 1 - km);
      const bool relu = code.size() == 2;
      if (!operands || (relu && (code[1].op != OpId::Relu || code[1].src[0] != code[0].dst)) ||
          p.outputs[0] != code.back().dst || p.out_dtypes[0] != p.dtype)
        continue;
      ep = {f.outputs[0], f.inputs[1 - km], relu, static_cast<bool>(f.fresh[0])};
    }
    step_epilogue_[i] = static_cast<int32_t>(epilogues_.size());
    epilogues_.push_back(ep);
    ++stats_.gemm_epilogues;
  }
}

void Plan::run_hoisted_if_stale() {
  if (hoisted_steps_.empty()) return;
  bool stale = !hoisted_ready_;
  for (auto& [st, version] : hoist_versions_)
    stale = stale || st->version_.load(std::memory_order_relaxed) != version;
  if (!stale) return;
  run_steps(hoisted_steps_);
  for (auto& [st, version] : hoist_versions_)
    version = st->version_.load(std::memory_order_relaxed);
  hoisted_ready_ = true;
}

void Plan::run_steps(const std::vector<Step>& steps) {
  run_steps_range(steps.data(), steps.data() + steps.size());
}

void Plan::run_steps_range(const Step* begin, const Step* end) {
  for (const Step* sp = begin; sp != end; ++sp) {
    const Step& s = *sp;
    // A matmul and the bias (+ relu) group after it, as one GEMM when the device takes it.
    if (!epilogues_.empty() && sp + 1 != end && steps_.data() <= sp &&
        sp < steps_.data() + steps_.size()) {
      const int32_t e = step_epilogue_[static_cast<size_t>(sp - steps_.data())];
      if (e >= 0) {
        const Epilogue& ep = epilogues_[e];
        TensorRefs refs(args_.data() + s.first_arg, s.num_args);
        const TensorMeta& m = g_.nodes[ep.out].meta;
        Tensor& out = vals_[ep.out];
        if (ep.fresh) out = empty(m.shape, m.dtype, m.device);
        if (kernels::gemm_epilogue(m.device.type)(refs[0], refs[1], vals_[ep.bias], ep.relu, out)) {
          ++sp;  // the next step's work is done
          continue;
        }
      }
    }
    if (s.kind == StepKind::Fused) {
      run_fused(*fused_[s.out]);
      continue;
    }
    if (s.kind == StepKind::Control) {
      run_control(*controls_[s.out]);
      continue;
    }
    const GraphNode& g = g_.nodes[s.out];
    TensorRefs refs(args_.data() + s.first_arg, s.num_args);
    if (s.kind == StepKind::View) {
      Tensor v = s.def->view(refs[0], g.attrs, g.meta);
      if (!v.defined()) v = s.def->view(refs[0].contiguous(), g.attrs, g.meta);
      vals_[s.out] = std::move(v);
      continue;
    }
    if (s.fresh) vals_[s.out] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
    s.kernel(refs, g.attrs, vals_[s.out]);
  }
}

void Plan::run_step(const Step& s) { run_steps_range(&s, &s + 1); }

void Plan::run_control(ControlStep& c) {
  const ControlFlow& cf = *c.cf;
  std::vector<Tensor> in;
  in.reserve(c.inputs.size());
  for (int32_t v : c.inputs) in.push_back(vals_[v]);
  std::vector<Tensor> out;
  // A result that is an input of the node itself (no step ran) gets a buffer of its own.
  auto own = [](const Tensor& t) {
    Tensor c = empty(t.sizes(), t.dtype(), t.device());
    copy_into(c, t);
    return c;
  };
  switch (cf.kind) {
    case ControlKind::Cond:
      out = c.plans[truth(in[0]) ? 0 : 1]->run(std::vector<Tensor>(in.begin() + 1, in.end()));
      break;
    case ControlKind::Scan: {
      const int64_t nc = cf.num_carry, nx = cf.num_xs;
      const int64_t length = in[nc].sizes()[0];
      std::vector<Tensor> args = in;  // carry..., x_t..., free...
      std::vector<Tensor> ys;
      for (size_t k = size_t(nc); k < cf.results.size(); ++k) {
        Shape s = cf.results[k].shape;
        s[0] = length;
        ys.push_back(empty(s, cf.results[k].dtype, cf.results[k].device));
      }
      for (int64_t s = 0; s < length; ++s) {
        const int64_t t = cf.reverse ? length - 1 - s : s;
        for (int64_t i = 0; i < nx; ++i) args[nc + i] = row(in[nc + i], t);
        std::vector<Tensor> r = c.plans[0]->run(args);
        for (int64_t k = 0; k < nc; ++k) args[k] = std::move(r[k]);
        for (size_t j = 0; j < ys.size(); ++j) copy_into(row(ys[j], t), r[nc + j]);
      }
      for (int64_t k = 0; k < nc; ++k) out.push_back(length > 0 ? args[k] : own(args[k]));
      for (Tensor& y : ys) out.push_back(std::move(y));
      break;
    }
    case ControlKind::WhileLoop: {
      const int64_t nc = cf.num_carry;
      std::vector<Tensor> args = in;  // state..., free...
      bool ran = false;
      while (truth(c.plans[0]->run(args)[0])) {
        std::vector<Tensor> r = c.plans[1]->run(args);
        for (int64_t k = 0; k < nc; ++k) args[k] = std::move(r[k]);
        ran = true;
      }
      for (int64_t k = 0; k < nc; ++k) out.push_back(ran ? args[k] : own(args[k]));
      break;
    }
  }
  for (size_t k = 0; k < c.projects.size(); ++k)
    if (c.projects[k] >= 0) vals_[c.projects[k]] = std::move(out[k]);
}

// Note [Parallel waves]: each wave's steps run on the OpenMP threads, one step per thread at a
// time; a kernel inside finds itself in a parallel region and stays on its thread.
void Plan::run_waves() {
  const int32_t nw = static_cast<int32_t>(wave_begin_.size());
  for (int32_t w = 0; w < nw; ++w) {
    const int32_t b = wave_begin_[w];
    const int32_t e = w + 1 < nw ? wave_begin_[w + 1] : static_cast<int32_t>(steps_.size());
    if (!wave_parallel_[step_wave_[b]]) {  // one step, or cheaper in order
      run_steps_range(steps_.data() + b, steps_.data() + e);
      continue;
    }
    std::exception_ptr error;
    std::mutex error_lock;
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
    for (int32_t i = b; i < e; ++i) {
      try {
        run_step(steps_[i]);
      } catch (...) {
        std::lock_guard<std::mutex> l(error_lock);
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }
}

std::vector<Tensor> Plan::execute(const std::vector<Tensor>& inputs) {
  DUET_ASSERT(int32_t(inputs.size()) == g_.num_runtime_inputs, "plan of {} given {} inputs",
              g_.num_runtime_inputs, inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (slot_value_[k] >= 0) vals_[slot_value_[k]] = inputs[k];
  struct Clear {  // drop per-run references (the caller's tensors) even when a kernel throws
    Plan* p;
    ~Clear() {
      for (int32_t v : p->dynamic_) p->vals_[v] = Tensor();
    }
  } clear{this};
  run_hoisted_if_stale();
  if (wave_begin_.empty())
    run_steps(steps_);
  else
    run_waves();
  std::vector<Tensor> out;
  out.reserve(g_.outputs.size());
  for (size_t k = 0; k < g_.outputs.size(); ++k) {
    const Tensor& v = vals_[g_.outputs[k]];
    if (clone_output_[k]) {
      out.push_back(v.clone());
    } else if (alias_output_[k]) {
      const TensorImpl* x = v.unsafe_impl();
      out.push_back(make_view(v, x->shape, x->strides, x->offset));
    } else {
      out.push_back(v);
    }
  }
  if (!g_.writebacks.empty()) {
    const OpDef& copy = op_def(OpId::Copy);
    std::vector<Tensor> staged(g_.writebacks.size());
    for (size_t k = 0; k < g_.writebacks.size(); ++k)
      if (stage_writeback_[k]) staged[k] = vals_[g_.writebacks[k].value].clone();
    for (size_t k = 0; k < g_.writebacks.size(); ++k) {
      const WriteBack& w = g_.writebacks[k];
      const Tensor& src = stage_writeback_[k] ? staged[k] : vals_[w.value];
      const Tensor& dst = g_.captured[w.target];
      const TensorImpl* a = src.unsafe_impl();
      const TensorImpl* b = dst.unsafe_impl();
      if (inplace_writeback_[k]) {  // computed in place
        b->storage->version_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (a->storage.get() == b->storage.get() && a->offset == b->offset &&
          a->strides == b->strides)
        continue;  // already there
      const Tensor* in[] = {&src};
      copy.kernel[static_cast<int>(b->device().type)](TensorRefs(in, 1), Attrs{}, dst);
      b->storage->version_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return out;
}

}  // namespace duet::detail
