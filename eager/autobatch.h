// duet: autobatching of eager per-sample code, as DyNet's (Neubig, Goldberg and Dyer, 2017).
// Inside an Autobatch scope, ops are recorded instead of run; when a value is needed, the
// pending ops run, those of one signature across samples as one batched kernel (Note
// [Autobatch] in eager/autobatch.cpp).
#pragma once

#include <memory>

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace duet {

/// How one op's recorded calls ran in a scope: in how many groups (batched calls, or calls run
/// alone), for how many calls.
struct AutobatchOpStats {
  std::string op;      ///< the op's name, as docs/ops.md lists it
  int64_t groups = 0;  ///< calls run: one per batch, one per call run alone
  int64_t ops = 0;     ///< recorded calls they ran
};

/// What the last run Autobatch scope on this thread did.
struct AutobatchStats {
  int64_t ops_recorded = 0;      ///< op calls the scope saw, except views (no kernel); a
                                 ///< backward walks the batched tape, and is not recorded
  int64_t kernels_launched = 0;  ///< kernels run: batched ops, gathers, copies, the backward
  int64_t batches = 0;           ///< groups of more than one op run as one batched op
  int64_t batched_ops = 0;       ///< ops run inside those groups
  int64_t gathers = 0;           ///< operands copied into a batch (the others were views)
  int64_t pieces = 0;     ///< slices, index_selects and expands that gathered a differentiated
                          ///< group's operands from parts of batches: each a tape node
  int64_t runs = 0;       ///< times the pending ops ran (reads, in-place writes, the end)
  int64_t row_gates = 0;  ///< batched operands whose backward sets the rows of samples off its
                          ///< path to zero (docs/func.md: runs that a read starts)
  /// Per op, the most groups first: where calls did not batch. An op with about as many groups
  /// as calls ran per sample, as its samples' signatures differ (shapes, attributes) or its
  /// calls became ready one at a time (docs/func.md, "Why a scope is slow").
  std::vector<AutobatchOpStats> by_op;
};

/// DyNet-style autobatching for its lifetime (RAII), as an eager scope:
///
///     { duet::Autobatch scope;
///       for (auto& tree : batch) loss = loss + model(tree);   // recorded, per sample
///       loss.backward(); }                                      // batched forward and backward
///
/// Ops are recorded lazily and run when a value is read (item(), to_vector(), data_ptr(),
/// printing), before an in-place write, at flush(), or when the scope ends. Ops of one
/// signature (op, attributes, operand shapes and dtypes, device) whose operands are ready run as
/// one call through the op's batching rule (the rules func::vmap uses). Results equal the
/// unbatched eager run within float tolerance. Autograd records per sample as usual, so a
/// backward() inside the scope is batched the same way. A scope inside another is part of it;
/// a scope opened while a trace runs (inside compile) does nothing.
class Autobatch {
 public:
  Autobatch();
  /// Runs what is pending, and throws the error that run raises (unless the scope ends because
  /// of another exception). Tensors a failed run did not compute raise an Error when read.
  /// A holder whose destructor is noexcept (std::optional, std::unique_ptr) turns that error
  /// into std::terminate: call flush() before such a holder lets the scope go.
  ~Autobatch() noexcept(false);
  Autobatch(const Autobatch&) = delete;
  Autobatch& operator=(const Autobatch&) = delete;
  /// Runs the pending ops now (errors propagate).
  void flush();

  struct Impl;  ///< internal (eager/autobatch.cpp)

 private:
  Impl* impl_ = nullptr;
};

namespace detail {
/// Opened by a backward (or grad()) on the thread of an Autobatch scope whose mode is the
/// innermost: runs what is pending, so that the roots have their history, then sets the scope's
/// mode aside while the backward walks the tape, whose ops are batched already (Note
/// [Autobatch's tape] in eager/autobatch.cpp). The backward's kernels count in the scope's
/// statistics. Does nothing elsewhere.
class AutobatchBackward {
 public:
  // roots: the backward's roots (Note [Groups on the loss's path] in eager/autobatch.cpp).
  explicit AutobatchBackward(const std::vector<Tensor>& roots);
  ~AutobatchBackward();
  AutobatchBackward(const AutobatchBackward&) = delete;
  AutobatchBackward& operator=(const AutobatchBackward&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};
}  // namespace detail

/// The statistics of the last Autobatch scope that ended on this thread (or of the open one).
AutobatchStats autobatch_stats();

}  // namespace duet
