// duet::nn::DistributedDataParallel: data-parallel training over duet::dist (core/dist.h), as
// torch's DistributedDataParallel. docs/distributed.md is the guide.
//
// Note [Gradient buckets]
// The parameters are grouped into buckets of about bucket_cap_mb (the first of
// first_bucket_cap_mb), in reverse order of parameters(), the order backward tends to finish
// them; one dtype and device per bucket). Each
// parameter gets a post-accumulate-grad hook (Tensor::register_post_accumulate_grad_hook): when
// the last gradient of a bucket is complete, the bucket's gradients are flattened into one
// buffer and its all-reduce is started, while the backward goes on with the rest. At the end of
// the backward each bucket is waited for, divided by the world size (the mean over ranks), and
// copied back into each .grad. A bucket that no hook completed (a parameter unused in this
// step) is started at the end of the backward, its missing gradients taken as zeros, so that
// every rank calls the same all-reduces in the same order. The hooks run inside backward(), so a
// compiled step traces them: its graph holds each bucket's all-reduce where that bucket's gradients
// are complete.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/module.h"

namespace duet::nn {

struct DistributedDataParallelOptions {
  /// The size of a gradient bucket, in MiB (torch's default 25).
  double bucket_cap_mb = 25;
  /// The size of the first bucket (the last parameters), in MiB, as torch's 1: a small first
  /// bucket starts communicating early in the backward.
  double first_bucket_cap_mb = 1;
  /// Copy rank 0's parameters and buffers to every rank at construction, so all start equal.
  bool broadcast_parameters = true;
  /// Start each bucket's all-reduce when backward completes the bucket and wait for them all at
  /// the end of backward, so that communication overlaps the rest of backward (Note
  /// [Overlapped collectives] in core/dist.h). false: each all-reduce completes at once.
  bool overlap = true;
};

class DistributedDataParallel {
 public:
  /// Wraps `module` (kept by reference: it must outlive this object). Needs dist::init().
  explicit DistributedDataParallel(Module& module, DistributedDataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Module& module() { return module_; }
  /// The buckets, as indices into module().parameters(), in the order they are reduced when
  /// backward completes them in that order.
  const std::vector<std::vector<int64_t>>& buckets() const { return buckets_; }
  /// All-reduces started by this object's hooks so far: one per bucket per synchronized eager
  /// backward, or per trace of a compiled step (its replays run the traced all-reduces).
  int64_t reductions() const { return reductions_; }

  /// While a NoSync lives, backward() only accumulates gradients locally (gradient
  /// accumulation); the first backward after it all-reduces the accumulated sums.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d) : d_(d), prev_(d.sync_) { d.sync_ = false; }
    ~NoSync() { d_.sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& d_;
    bool prev_;
  };
  /// torch's `with ddp.no_sync():` as a guard: `auto guard = ddp.no_sync();`.
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

 private:
  void on_grad(int64_t param);
  void reduce(size_t bucket);
  void copy_back(size_t bucket);
  void finish_backward();

  Module& module_;
  DistributedDataParallelOptions options_;
  std::vector<Tensor> params_;
  std::vector<int64_t> hooks_;
  std::vector<std::vector<int64_t>> buckets_;
  std::vector<int64_t> bucket_of_;  // per parameter
  std::vector<int64_t> ready_;      // per bucket: gradients complete in this backward
  std::vector<bool> reduced_;       // per bucket: all-reduce started in this backward
  std::vector<Tensor> started_;     // per bucket: the started all-reduce (until the wait)
  bool in_backward_ = false;
  uint64_t backward_ = 0;  // detail::backward_id() of the backward in progress
  bool sync_ = true;
  int64_t reductions_ = 0;
};

}  // namespace duet::nn
