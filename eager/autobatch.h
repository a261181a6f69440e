// duet: autobatching of eager per-sample code, as DyNet's (Neubig, Goldberg and Dyer, 2017).
// Inside an Autobatch scope, ops are recorded instead of run; when a value is needed, the
// pending ops run, those of one signature across samples as one batched kernel (Note
// [Autobatch] in eager/autobatch.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace duet {

/// What the last run Autobatch scope on this thread did.
struct AutobatchStats {
  int64_t ops_recorded = 0;      ///< op calls the scope saw, except views (no kernel)
  int64_t kernels_launched = 0;  ///< kernels run for them: batched ops, gathers, copies
  int64_t batches = 0;           ///< groups of more than one op run as one batched op
  int64_t batched_ops = 0;       ///< ops run inside those groups
  int64_t gathers = 0;           ///< operands copied into a batch (the others were views)
  int64_t runs = 0;              ///< times the pending ops ran (reads, in-place writes, the end)
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
/// Under an open Autobatch scope: the sum of `parts` when each is the pending result of a matrix
/// product (a weight's gradient from each use), as one product over the concatenated operands;
/// an undefined tensor otherwise (Note [Sums of products] in eager/autobatch.cpp).
Tensor sum_of_products(const std::vector<Tensor>& parts);
/// Under an open Autobatch scope: the sum of `parts` when each is the pending gradient of a
/// slice (a zero tensor with the slice's gradient scattered in) and the slices are disjoint
/// ranges of one dim, as one concatenation; an undefined tensor otherwise (Note [Sums of
/// slices] in eager/autobatch.cpp).
Tensor sum_of_slices(const std::vector<Tensor>& parts);
/// Under an open Autobatch scope: the sum of `parts` when each is the pending scatter_add of
/// rows into a zero tensor (an embedding's gradient per sample), as one scatter_add of all the
/// rows; an undefined tensor otherwise (Note [Sums of scatters] in eager/autobatch.cpp).
Tensor sum_of_scatter_adds(const std::vector<Tensor>& parts);
/// Under an open Autobatch scope: the sum of `parts` when each is the pending sum of a tensor
/// over its leading dim (among others; a bias's gradient per use), as one sum over the tensors
/// concatenated; an undefined tensor otherwise (Note [Sums of sums] in eager/autobatch.cpp).
Tensor sum_of_sums(const std::vector<Tensor>& parts);
}  // namespace detail

/// The statistics of the last Autobatch scope that ended on this thread (or of the open one).
AutobatchStats autobatch_stats();

}  // namespace duet
