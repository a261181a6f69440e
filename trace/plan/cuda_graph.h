// duet: the process-wide counters of CUDA-graph replay, kept by the executor
// (trace/plan/cuda_graph.cpp) and read through duet::cuda_graph_stats().
#pragma once

#include <cstdint>
#include <string>

namespace duet {

/// Process-wide counters of CUDA-graph replay (Note [CUDA graph replay] in trace/plan/executor.h).
struct CudaGraphStats {
  int64_t captured = 0;      ///< plans captured as a graph
  int64_t replays = 0;       ///< graph launches
  int64_t failed = 0;        ///< captures that failed: those plans run kernel by kernel
  std::string last_failure;  ///< why the most recent capture failed ("" if none has)
  /// Replays that first copied the call's inputs into a graph's static buffers (the inputs were
  /// elsewhere than where a graph reads them); the other replays read the caller's tensors.
  int64_t input_copies = 0;
  /// Calls of a plan with graphs that ran kernel by kernel: the caller held results of each of
  /// its graphs (a graph's results are views of its buffers, which it writes at every replay).
  int64_t ungraphed_runs = 0;
};
CudaGraphStats cuda_graph_stats();

}  // namespace duet
