// DistributedDataParallel (nn/parallel.h, Note [Gradient buckets]).
#include "nn/parallel.h"

#include "core/dist.h"
#include "core/ops.h"
#include "eager/autograd.h"

namespace duet::nn {

DistributedDataParallel::DistributedDataParallel(Module& module,
                                                 DistributedDataParallelOptions options)
    : module_(module), options_(options), params_(module.parameters()) {
  DUET_CHECK(dist::is_initialized(),
             "[DistributedDataParallel] no process group: call duet::dist::init() first");
  DUET_CHECK_VALUE(options.bucket_cap_mb > 0,
                   "[DistributedDataParallel] bucket_cap_mb must be positive, got {}",
                   options.bucket_cap_mb);
  if (options.broadcast_parameters) {
    NoGradGuard ng;
    for (Tensor& t : params_) t.detach().copy_(dist::broadcast(t.detach(), 0));
    for (Tensor& t : module.buffers()) t.copy_(dist::broadcast(t, 0));
  }
  // Buckets in reverse parameter order, one dtype and device each (Note [Gradient buckets]).
  DUET_CHECK_VALUE(options.first_bucket_cap_mb > 0,
                   "[DistributedDataParallel] first_bucket_cap_mb must be positive, got {}",
                   options.first_bucket_cap_mb);
  auto cap = [&] {
    return (buckets_.size() <= 1 ? options.first_bucket_cap_mb : options.bucket_cap_mb) * 1024 *
           1024;
  };
  bucket_of_.assign(params_.size(), -1);
  double bytes = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const Tensor& p = params_[static_cast<size_t>(i)];
    if (!p.requires_grad()) continue;
    const double b = static_cast<double>(p.numel()) * itemsize(p.dtype());
    const bool fits = !buckets_.empty() && bytes + b <= cap() && [&] {
      const Tensor& q = params_[static_cast<size_t>(buckets_.back().front())];
      return q.dtype() == p.dtype() && q.device() == p.device();
    }();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(i);
    bytes += b;
    bucket_of_[static_cast<size_t>(i)] = static_cast<int64_t>(buckets_.size()) - 1;
  }
  ready_.assign(buckets_.size(), 0);
  reduced_.assign(buckets_.size(), false);
  started_.assign(buckets_.size(), Tensor());
  for (size_t i = 0; i < params_.size(); ++i)
    if (bucket_of_[i] >= 0)
      hooks_.push_back(params_[i].register_post_accumulate_grad_hook(
          [this, i](const Tensor&) { on_grad(static_cast<int64_t>(i)); }));
    else
      hooks_.push_back(0);
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (hooks_[i]) params_[i].remove_post_accumulate_grad_hook(hooks_[i]);
}

void DistributedDataParallel::on_grad(int64_t param) {
  if (!sync_) return;
  if (in_backward_ && backward_ != detail::backward_id()) {
    // The backward this object was in threw before its end: forget its buckets (waiting for
    // the all-reduces it started, which the other ranks started too) and begin afresh.
    for (Tensor& t : started_)
      if (t.defined()) (void)dist::detail::wait(t);
    std::fill(started_.begin(), started_.end(), Tensor());
    std::fill(ready_.begin(), ready_.end(), 0);
    std::fill(reduced_.begin(), reduced_.end(), false);
    in_backward_ = false;
  }
  if (!in_backward_) {
    in_backward_ = true;
    backward_ = detail::backward_id();
    detail::at_backward_end([this] { finish_backward(); });
  }
  const auto b = static_cast<size_t>(bucket_of_[static_cast<size_t>(param)]);
  if (++ready_[b] == static_cast<int64_t>(buckets_[b].size())) reduce(b);
}

void DistributedDataParallel::reduce(size_t b) {
  NoGradGuard ng;
  std::vector<Tensor> flat;
  for (int64_t i : buckets_[b]) {
    const Tensor& p = params_[static_cast<size_t>(i)];
    Tensor g = p.grad();
    flat.push_back(g.defined() ? reshape(g, {g.numel()})
                               : zeros({p.numel()}, Options().dtype(p.dtype()).device(p.device())));
  }
  started_[b] = dist::detail::all_reduce_start(flat.size() == 1 ? flat[0] : cat(flat, 0));
  reduced_[b] = true;
  ++reductions_;
  if (!options_.overlap) copy_back(b);
}

// The bucket's sum over ranks, once complete, divided into the mean and copied into each .grad.
void DistributedDataParallel::copy_back(size_t b) {
  NoGradGuard ng;
  const Tensor mean = dist::detail::wait(started_[b]) / static_cast<double>(dist::world_size());
  started_[b] = Tensor();
  int64_t at = 0;
  for (int64_t i : buckets_[b]) {
    Tensor& p = params_[static_cast<size_t>(i)];
    const Tensor part = reshape(slice(mean, 0, at, at + p.numel()), p.sizes());
    at += p.numel();
    Tensor g = p.grad();
    if (g.defined())
      g.copy_(part);
    else
      p.set_grad(part.clone());
  }
}

void DistributedDataParallel::finish_backward() {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!reduced_[b]) reduce(b);
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (started_[b].defined()) copy_back(b);
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(reduced_.begin(), reduced_.end(), false);
  in_backward_ = false;
}

}  // namespace duet::nn
