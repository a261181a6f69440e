// duet: the parts of a plan (trace/executor.h) that building it (trace/plan_build.cpp), running
// it (trace/executor.cpp) and replaying it as a CUDA graph (trace/cuda_graph.cpp) share. Private
// to those three files.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "kernels/fused.h"
#include "trace/executor.h"
#include "trace/fusion.h"

namespace duet::detail {

/// The fusion groups and kernels that the plans of one graph share across sizes (Note [Fusion
/// across sizes] in trace/plan_build.cpp). Plans may be built on several threads at once (a
/// spare copy of a busy plan): mu guards the rest.
struct FusionShare {
  std::mutex mu;
  bool found = false;
  std::vector<FusionGroup> groups;  ///< as the first plan found them (its sizes in `shape`)
  std::vector<std::shared_ptr<kernels::FusedKernel>> kernels;  ///< per group, once made
};

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

}  // namespace duet::detail
