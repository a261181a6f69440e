// duet: the parts of a plan (trace/plan/executor.h) that building it (trace/plan/plan_build.cpp and
// trace/plan/plan_steps.cpp),
// running it (trace/plan/executor.cpp) and replaying it as a CUDA graph (trace/plan/cuda_graph.cpp)
// share. Private to those three files.
#pragma once

#include <memory>
#include <unordered_map>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "kernels/fused.h"
#include "trace/plan/executor.h"
#include "trace/plan/fusion.h"

namespace duet::detail {

/// Bytes of a value of this meta.
inline int64_t meta_nbytes(const TensorMeta& m) {
  return m.shape.numel() * int64_t(itemsize(m.dtype));
}

/// A view that no strides over its input's buffer express, and what it reads instead (Note
/// [Copies for views no strides express] in trace/plan/view_copies.cpp): a copy of its input,
/// or, when `op` >= 0, that elementwise op computed on the views `chain` (from the op up to the
/// view's input) of the op's own input.
struct ViewFix {
  int32_t view = -1;
  int32_t op = -1;
  std::vector<int32_t> chain;
};

/// The fusion groups and kernels that the plans of one graph share across sizes (Note [Fusion
/// across sizes] in trace/plan/plan_build.cpp). Plans may be built on several threads at once (a
/// spare copy of a busy plan): mu guards the rest.
struct FusionShare {
  std::mutex mu;
  bool found = false;
  std::vector<FusionGroup> groups;  ///< as the first plan found them (its sizes in `shape`)
  std::vector<std::shared_ptr<kernels::FusedKernel>> kernels;  ///< per group, once made
  bool copies_found = false;
  std::vector<ViewFix> view_fixes;  ///< what copy_unviewable_views decided
};

/// g with an explicit copy before each view that no strides over its input's buffer express
/// (Note [Copies for views no strides express] in trace/plan/view_copies.cpp); `share` (may be
/// null) makes the plans of one graph at other sizes copy at the same views.
Graph copy_unviewable_views(Graph g, FusionShare* share);

/// The arenas of the plans of one compiled function, one per device (Note [One arena per
/// function] in trace/plan/plan_build.cpp). `busy` is held by the plan running on them.
struct ArenaShare {
  std::mutex busy;
  std::mutex mu;  ///< guards `storages` (plans are built on several threads)
  std::vector<std::pair<Device, StoragePtr>> storages;
};

/// The share's arena on `device`, at least `bytes` large (made or grown here).
StoragePtr shared_arena(ArenaShare& share, Device device, size_t bytes);

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
  /// Per instruction of the program (one per member but the reduction): its node's call site.
  std::vector<CallSite> instr_sites;
};

/// One control-flow node as the plan runs it (Note [Control steps]).
struct Plan::ControlStep {
  std::shared_ptr<const ControlFlow> cf;
  std::vector<std::unique_ptr<Plan>> plans;  ///< per subgraph
  std::vector<int32_t> inputs;               ///< the node's input values
  std::vector<int32_t> projects;             ///< per result: its Project value, or -1
};

/// Where a graph reads a runtime input: its first element and its strides.
struct InputKey {
  const void* data = nullptr;
  Strides strides;
};

/// A plan's CUDA graphs (Note [CUDA graph replay]).
struct Plan::GraphState {
  /// One captured graph. It reads the caller's inputs where they were at its capture (`reads`),
  /// or static buffers of its own that each call copies into (`inputs`, when defined), and
  /// writes its results into buffers of its own, which calls hand out.
  struct Slot {
    void* graph = nullptr;        ///< the backend's executable graph
    bool copies = false;          ///< reads static buffers (`inputs`) that calls copy into
    std::vector<Tensor> inputs;   ///< the static input buffers, when it copies
    std::vector<InputKey> reads;  ///< where it reads the caller's inputs, when it does not
    std::vector<Tensor> outputs;  ///< the results, in the graph's private pool
  };
  Device device;
  const DeviceBackend* backend = nullptr;
  int64_t runs = 0;
  std::vector<Slot> slots;
  std::vector<const void*> addresses;  ///< data of each captured tensor at the captures
  bool failed = false;
  void clear();
  ~GraphState();
};

/// Copies src into dst with the Copy kernel (no dispatch, no tape).
void copy_into(const Tensor& dst, const Tensor& src);

/// Whether a graph node becomes (part of) a step: an op, a control construct or a projection.
inline bool is_step_node(const GraphNode& g) {
  return g.kind == NodeKind::Op || g.kind == NodeKind::Control || g.kind == NodeKind::Project;
}

/// The state of one Plan::build. A value is a node of the graph; a unit is a step to be: each
/// fusion group (units [0, ng)), and each op node outside groups (unit ng + its node), a Control
/// node with its Project nodes being one unit.
struct Plan::Builder {
  Plan& plan;
  const Graph& graph;
  const PlanOptions& opt;
  PlanStats& stats;
  const bool debug = std::getenv("DUET_DEBUG_PLAN") != nullptr;  // print what is decided
  const int32_t n;                                               // values

  std::vector<int32_t> root;  ///< per value: the buffer it lives in (itself, or its views' root)
  std::vector<bool> fresh;    ///< per value: allocated at every run (it reaches a result)
  std::vector<FusionGroup> groups;
  bool shared_groups = false;     ///< groups are opt.share's (Note [Fusion across sizes])
  std::vector<int32_t> group_of;  ///< per value: its group, or -1
  int32_t ng = 0;                 ///< groups
  bool has_control = false;
  std::vector<int32_t> first_node;               ///< per unit: its first node, or -1 (no unit)
  std::vector<std::vector<int32_t>> unit_nodes;  ///< per unit: its nodes
  std::vector<bool> materialized;                ///< per value: not kept in a kernel's registers
  std::vector<int32_t> order;                    ///< the schedule: units in the order they run
  std::vector<int32_t> wave_of;                  ///< per unit (Note [Parallel waves])
  int32_t num_waves = 0;
  bool parallel = false;
  std::vector<int32_t> step_pos;  ///< per step of the schedule: its step, or its wave
  std::vector<int32_t> pos;       ///< per value: its step's step_pos (inputs, constants: -1)
  int32_t num_steps = 0;
  int32_t end_pos = 0;           ///< where write-backs read: after the last step_pos
  std::vector<int32_t> inplace;  ///< per value: the captured tensor it is computed into, or -1
  /// Per captured storage: the last step_pos reading it (its tensor or a view of it).
  std::unordered_map<const StorageImpl*, int32_t> last_read;
  std::vector<bool> hoisted;         ///< per value: computed by a hoisted kernel
  std::vector<bool> hoisted_unit;    ///< per unit: hoisted (a static view's too)
  std::vector<int32_t> last_use;     ///< per value: the last step_pos reading it or a view of it
  std::vector<int32_t> request_of;   ///< per value: its buffer in plan.requests_, or -1
  std::vector<Device> pool_devices;  ///< per memory pool: its device (one arena each)
  std::vector<StoragePtr> arenas;    ///< per memory pool
  std::vector<bool> is_static;       ///< per value: its tensor is set up once, for the plan's life
  std::vector<DonatedRegion> regions;  ///< write-back targets lent to intermediates
  std::vector<int32_t> region_target;  ///< per region: its captured tensor

  explicit Builder(Plan& p)
      : plan(p),
        graph(p.graph_),
        opt(p.opt_),
        stats(p.stats_),
        n(static_cast<int32_t>(p.graph_.nodes.size())) {}

  void build();
  void find_roots_and_results();
  void find_units();
  int32_t unit_of(int32_t v) const;
  std::vector<std::vector<int32_t>> unit_deps(bool war) const;
  void schedule();
  void find_waves();
  double step_cost(int32_t u, double* speedup) const;
  bool sums_by_threads(int32_t u) const;
  void choose_parallel();
  void place_steps();
  const StorageImpl* storage_of_root(int32_t v) const;
  bool can_write_back_in_place(size_t k);
  void find_inplace_writebacks();
  void find_products_into_targets();
  void hoist();
  bool needs_buffer(int32_t v) const;
  int32_t reusable(int32_t v, int32_t in, const std::vector<int32_t>& step_inputs) const;
  void request_buffers();
  void find_donated_regions();
  void plan_arena();
  void measure_memory();
  void count_buffer(const TensorMeta& m);  // a buffer kept outside the arena, in the stats
  void set_buffer(int32_t v);
  void make_fused_step(int32_t u);
  void make_control_step(int32_t u);
  void make_op_step(int32_t u);
  void make_steps();
};

}  // namespace duet::detail
