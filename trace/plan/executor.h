// duet: the executor. A graph becomes a flat schedule of resolved kernel calls: no op-table
// lookup, shape rule, mode stack or tape at run time.
//
// Note [Plan buffers]
// Values are of four kinds. Static ones are fixed for the plan's life and set up once:
// constants, captured tensors (read by reference: the plan holds the tensor, and its storage is
// read at every run), the buffers of intermediate results (one arena, trace/plan/memory_plan.h),
// and views of any of those. Fresh ones are allocated at every run: results whose buffer reaches an
// output (the caller keeps them, so the next run must not overwrite them). Runtime inputs and
// views of runtime inputs are bound per run. After the steps, write-backs copy the new values
// of captured tensors into their storage and bump its version, as an in-place op does.
// A plan is not re-entrant: a call that finds it busy (recursion, another thread) runs a spare
// copy of the plan instead, built on first need and kept for the next such call.
//
// Note [Schedule]
// The steps are the graph's op nodes, with each fusion group (trace/plan/fusion.h) one step that
// runs a fused kernel; a topological order of those steps is the schedule. It follows the graph's
// own order, except that (with plan_memory) a ready step that frees more bytes than it makes runs
// first. Intermediate values inside a group live in the kernel's registers only.
//
// Note [CUDA graph replay]
// A plan whose steps all run on one CUDA device (no control steps, no transfers, no result that
// is an argument or a view of one: those alias the caller's tensor) is replayed as a CUDA
// graph, so that a call costs one launch instead of one per kernel. Its first run is plain (it
// builds the fused kernels and cuBLAS's state). The second runs the schedule once while the
// device's stream is captured (Note [CUDA graph capture] in cuda/runtime.cpp). A graph bakes in
// every address it touches: the arena and the captured tensors (fixed), the inputs, and its
// results, which it writes into buffers of its own private pool. So that a replay costs no
// copies, a plan keeps up to four graphs (trace/plan/cuda_graph.cpp):
//   - inputs: a graph reads the caller's input tensors where they were at its capture, and a
//     call whose inputs are at those addresses (the same tensors, or new ones the caching
//     allocator put there) replays it as is. Once a call's inputs are elsewhere (a new batch
//     at every step), the next graph captured reads static buffers instead, which each of its
//     calls copies the inputs into (cuda_graph_stats().input_copies counts those);
//   - results: a call hands out views of the graph's result buffers, not copies. A graph
//     replays only while the caller holds none of its results (each buffer's storage is
//     referenced by the graph alone); otherwise another graph is used or captured, so a held
//     result is never overwritten. A loop that keeps the previous step's loss alternates two
//     graphs. With four graphs all held, or none fitting the inputs, the call runs kernel by
//     kernel (cuda_graph_stats().ungraphed_runs).
// A call bumps the versions of the captured tensors its graph wrote. A capture that fails (a
// host read, a copy to the host) leaves the plan running kernel by kernel, and
// cuda_graph_stats() says why. A captured tensor given new storage (Module::to) drops the
// graphs, and the next call captures again.
//
// Note [Control steps]
// A Control node (Note [Control flow nodes]) is one step, with its Project nodes: it runs a plan
// per subgraph (a cond runs one branch; a scan runs its body once per step, on views of the xs,
// and copies each y_t into the stacked results; a while_loop runs cond_fn and body in turn) and
// binds the results to the Project values for this run. Subplans return fresh tensors: a result
// that would alias an input of the subgraph gets a copy (ensure_fresh_results), so results never
// share memory with the outer plan's arena or with its inputs. A plan with control steps runs
// its steps in order (no parallel waves), and control steps are never hoisted.
#pragma once

#include <memory>
#include <string>
#include <mutex>
#include <vector>

#include "core/tensor_impl.h"
#include "kernels/fused.h"
#include "trace/ir/graph.h"
#include "trace/plan/memory_plan.h"

namespace duet::detail {

struct FusionShare;
/// A new, empty FusionShare (PlanOptions::share).
std::shared_ptr<FusionShare> make_fusion_share();
struct ArenaShare;
/// A new ArenaShare (PlanOptions::arenas): one per compiled function.
std::shared_ptr<ArenaShare> make_arena_share();

/// Which plan-level passes run (CompileOptions::disable_passes names them).
struct PlanOptions {
  bool fuse = true;
  bool codegen = true;
  bool plan_memory = true;
  bool parallel = true;
  bool hoist = true;
  bool cuda_graph = true;
  bool donate = true;
  /// The names switched off, for registered fusion passes (Note [Registered passes]).
  std::vector<std::string> disabled;
  /// Shared by the plans of one graph at different sizes of its symbols (Note [Fusion across
  /// sizes] in trace/plan/plan_build.cpp): the fusion groups the first found, and their kernels.
  /// Null: nothing shared. The plans of a control node's subgraphs get none.
  std::shared_ptr<FusionShare> share;
  /// The arenas shared by the plans of one compiled function (Note [One arena per function] in
  /// trace/plan/plan_build.cpp). Null: the plan's own arenas.
  std::shared_ptr<ArenaShare> arenas;
  /// Plan the schedule and the memory only, for their figures (PlanStats): no arena is
  /// allocated and no step made, so the plan cannot run (CompileOptions::memory_budget's trials).
  bool measure_only = false;
  static PlanOptions from_disabled(const std::vector<std::string>& disabled);
};

/// What a plan did with its graph (CompileStats sums them).
struct PlanStats {
  int64_t fused_kernels = 0;  ///< fused groups
  int64_t fused_nodes = 0;    ///< op nodes inside them
  int64_t epilogues = 0;      ///< groups finishing a matmul's output in place
  int64_t arena_bytes = 0;    ///< the planned arena
  /// Arena bytes saved by placing intermediates in dead write-back targets (Note
  /// [Intermediates in dead write-back targets] in trace/plan/plan_build.cpp)
  int64_t donated_bytes = 0;
  int64_t buffer_bytes = 0;         ///< all buffers the plan keeps (arena or separate)
  int64_t device_buffer_bytes = 0;  ///< those of them in a device's memory (a GPU's)
  int64_t intermediate_bytes = 0;   ///< the sizes of all values the steps compute, summed
  int64_t hoisted_nodes = 0;
  bool parallel = false;
  bool cuda_graph = false;     ///< replayed as a CUDA graph (Note [CUDA graph replay])
  int64_t gemm_epilogues = 0;  ///< matmul + bias (+ relu) as one device GEMM call
  // Memory (Note [Plan memory] in trace/plan/plan_memory.cpp).
  int64_t fresh_bytes = 0;  ///< results (and saved values) allocated outside the arena per run
  int64_t saved_bytes = 0;  ///< values made before the backward and read in it (activations)
  int64_t peak_bytes = 0;   ///< arena_bytes + fresh_bytes: what one run holds at most
  int32_t peak_step = -1;   ///< the step where the arena's live buffers are largest
  std::vector<int32_t> live_at_peak;     ///< the values whose buffers are live there, largest first
  std::vector<bool> live_at_peak_saved;  ///< per value of live_at_peak: a saved activation
};

/// When set, every plan checks its memory plan's invariant as it is built and throws
/// InternalError naming the two overlapping buffers (the tests set it; it costs a sweep).
void set_verify_plans(bool on);
bool verify_plans();

class Plan {
 public:
  explicit Plan(Graph graph, PlanOptions options = {});
  ~Plan();
  /// Runs the graph on the runtime inputs (by slot) and returns its outputs.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);
  const Graph& graph() const { return graph_; }
  const PlanStats& stats() const { return stats_; }
  /// How many runs of this plan replayed its CUDA graph (0 without one).
  int64_t graph_replays() const;
  /// Bytes of the buffers the plan keeps for intermediate results.
  int64_t buffer_bytes() const { return stats_.buffer_bytes; }
  /// The memory plan's invariant (check_memory_plan): "" when it holds.
  std::string check_memory() const;
  /// The schedule as text: one line per step, fused groups with their programs.
  std::string schedule_str() const;

 private:
  enum class StepKind : uint8_t { Kernel, View, Fused, Control };
  struct Step {
    StepKind kind;
    const OpDef* def;
    KernelFn kernel;    ///< Kernel steps
    int32_t out;        ///< the value it computes (Fused: the group index)
    int32_t first_arg;  ///< into args_
    int32_t num_args;
    bool fresh;  ///< allocate the output at every run
  };
  struct FusedStep;
  struct ControlStep;
  struct GraphState;
  /// A matmul step and the step after it that adds a bias (an add, or a fused group adding it
  /// and maybe taking a relu), run as
  /// one device GEMM with an epilogue (Note [cuBLASLt epilogues] in cuda/kernels/matmul_ops.cpp).
  struct Epilogue {
    int32_t out;   ///< the value it computes (the group's output, or the add's)
    int32_t bias;  ///< the bias value
    bool relu;
    bool fresh;  ///< out is allocated at every run
  };
  void find_epilogues();
  std::vector<Epilogue> epilogues_;
  std::vector<int32_t> step_epilogue_;  ///< per step of steps_: index into epilogues_, or -1
  std::vector<Tensor> run_graphed(const std::vector<Tensor>& inputs);
  int64_t graph_replays_ = 0;  ///< under the CUDA-graph counters' lock (trace/plan/cuda_graph.cpp)
  void run_hoisted_if_stale();
  std::vector<Tensor> run_unprofiled(const std::vector<Tensor>& inputs);
  const Step* run_one(const Step* sp, const Step* end);
  std::string step_name(const Step& s) const;
  void step_values(const Step& s, std::vector<Tensor>& in, std::vector<Tensor>& out) const;
  void check_step(const Step& s, const std::vector<Tensor>& in) const;
  std::string fused_culprit(const FusedStep& f, const std::vector<Tensor>& in) const;
  struct Builder;  ///< the state of one build() (trace/plan/plan_build.cpp)
  void build();
  /// Sets cuda_graph_ up when the plan qualifies for replay (trace/plan/cuda_graph.cpp).
  void prepare_graph_replay();
  void run_control(ControlStep& c);
  std::vector<Tensor> execute(const std::vector<Tensor>& inputs);
  void run_fused(FusedStep& f);
  /// At the first run: every device kernel of the plan made ready in one call to its runner, so
  /// that those to build are built side by side (Note [Parallel NVRTC builds] in cuda/fused.cpp).
  void prepare_device_kernels();
  void run_steps(const std::vector<Step>& steps);
  void run_steps_range(const Step* begin, const Step* end);
  void run_step(const Step& s);
  /// The call site of a step's node (a fused group's last output), or none.
  CallSite step_site(const Step& s) const;
  void run_waves();

  Graph graph_;
  PlanOptions opt_;
  PlanStats stats_;
  std::vector<Tensor> vals_;
  std::vector<const Tensor*> args_;
  std::vector<Step> steps_;
  std::vector<Step> hoisted_steps_;  ///< run at the first run, and when a storage they read
                                     ///< changed version
  std::vector<int32_t> step_wave_;   ///< per step: its wave (Note [Parallel waves])
  std::vector<int32_t> wave_begin_;  ///< parallel plans: the first step of each wave
  std::vector<bool> wave_parallel_;  ///< per wave: its steps run side by side
  std::vector<std::pair<StorageImpl*, uint32_t>> hoist_versions_;
  bool hoisted_ready_ = false;         ///< the hoisted steps ran at least once
  bool device_kernels_ready_ = false;  ///< prepare_device_kernels() ran
  std::vector<std::unique_ptr<FusedStep>> fused_;
  std::vector<std::unique_ptr<ControlStep>> controls_;
  std::vector<int32_t> slot_value_;      ///< runtime slot -> value
  std::vector<int32_t> dynamic_;         ///< values cleared after each run
  std::vector<bool> clone_output_;       ///< outputs that would alias a constant
  std::vector<bool> alias_output_;       ///< outputs that are captured tensors or their views
  std::vector<bool> stage_writeback_;    ///< write-backs whose source may alias a written tensor
  std::vector<bool> inplace_writeback_;  ///< write-backs computed straight into their target
  std::vector<BufferRequest> requests_;  ///< the memory plan's input, kept for check_memory()
  MemoryPlan memory_;
  /// Write-back targets that hold intermediates while their old value is dead (Note
  /// [Intermediates in dead write-back targets] in trace/plan/plan_build.cpp): per region, its
  /// captured tensor, the storage its values were placed in, and those values.
  std::vector<DonatedRegion> regions_;
  std::vector<int32_t> region_target_;
  std::vector<const StorageImpl*> region_storage_;
  std::vector<std::vector<int32_t>> region_values_;
  /// Places the values of region g in its target's storage as it is now.
  void place_in_region(size_t g);
  /// Before a run, with the inputs bound: an argument sharing storage with a region's target is
  /// copied (the steps would overwrite what it reads), and a target given new storage is an
  /// error.
  void check_regions();
  std::unique_ptr<GraphState> cuda_graph_;  ///< CUDA-graph replay, when the plan qualifies
  std::mutex busy_;                         ///< held by the run in progress
  bool shares_arena_ = false;               ///< its arenas are its function's (PlanOptions::arenas)
  std::mutex spares_mu_;
  std::vector<std::unique_ptr<Plan>> spares_;  ///< copies for calls that find the plan busy
};

}  // namespace duet::detail
