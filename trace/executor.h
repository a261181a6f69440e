// duet: the executor. A graph becomes a flat schedule of resolved kernel calls: no op-table
// lookup, shape rule, mode stack or tape at run time.
//
// Note [Plan buffers]
// Values are of four kinds. Static ones are fixed for the plan's life and set up once:
// constants, captured tensors (read by reference: the plan holds the tensor, and its storage is
// read at every run), the buffers of intermediate results (allocated once per signature), and
// views of any of those. Fresh ones are allocated at every run: results whose buffer reaches an
// output (the caller keeps them, so the next run must not overwrite them). Runtime inputs and
// views of runtime inputs are bound per run. After the steps, write-backs copy the new values
// of captured tensors into their storage and bump its version, as an in-place op does.
// A plan is not re-entrant: a call that finds it busy (recursion, another thread) runs a
// private copy of the plan instead.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "trace/graph.h"

namespace duet::detail {

class Plan {
 public:
  explicit Plan(Graph graph);
  /// Runs the graph on the runtime inputs (by slot) and returns its outputs.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);
  const Graph& graph() const { return g_; }
  /// Bytes of the buffers the plan keeps for intermediate results.
  int64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  struct Step {
    const OpDef* def;
    KernelFn kernel;  ///< null for views
    int32_t out;
    int32_t first_arg;  ///< into args_
    int32_t num_args;
    bool fresh;  ///< allocate the output at every run
  };
  void build();
  std::vector<Tensor> execute(const std::vector<Tensor>& inputs);

  Graph g_;
  std::vector<Tensor> vals_;
  std::vector<const Tensor*> args_;
  std::vector<Step> steps_;
  std::vector<int32_t> slot_value_;      ///< runtime slot -> value
  std::vector<int32_t> dynamic_;         ///< values cleared after each run
  std::vector<bool> clone_output_;       ///< outputs that would alias a constant
  std::vector<bool> alias_output_;       ///< outputs that are captured tensors or their views
  std::vector<bool> stage_writeback_;    ///< write-backs whose source may alias a written tensor
  std::vector<bool> inplace_writeback_;  ///< write-backs computed straight into their target
  int64_t buffer_bytes_ = 0;
  std::mutex busy_;
};

}  // namespace duet::detail
