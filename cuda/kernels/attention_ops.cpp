// duet: CUDA adapters of Attention and AttentionBackward (kernels in attention.cu), following
// kernels/attention.cpp: the operands' strides over the batch dims and their last two dims, a
// size-1 dim against a larger one read with stride 0.
#include "core/ops.h"
#include "cuda/kernels/adapt.h"
#include "cuda/runtime.h"

namespace duet::cuda::detail {
namespace {

kern::AttnOperand attn_operand(const Tensor& t, const Shape& batch, int64_t rows, int64_t cols) {
  kern::AttnOperand o;
  o.data = t.raw_data();
  const Shape& s = t.sizes();
  const Strides& st = t.strides();
  auto stride = [&](int64_t d, int64_t want) { return s[d] == 1 && want != 1 ? 0 : st[d]; };
  const int64_t nd = t.dim();
  for (int64_t d = 0; d < batch.size(); ++d) o.batch[d] = stride(d, batch[d]);
  o.rs = stride(nd - 2, rows);
  o.cs = stride(nd - 1, cols);
  return o;
}

// The sizes, scale and operands both passes share (mask at input mask_at, when given).
kern::AttnArg attn_arg(const char* op, TensorRefs in, int64_t mask_at, const Attrs& a) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  const int64_t nd = q.dim();
  const Shape batch(q.sizes().data(), nd - 2);
  DUET_CHECK_SHAPE(batch.size() <= kern::kMaxDims - 2,
                   "[{}] on CUDA takes at most {} batch dims, got query {}", op, kern::kMaxDims - 2,
                   q.sizes());
  kern::AttnArg A;
  A.nbatch = static_cast<int>(batch.size());
  A.nb = 1;
  for (int64_t d = 0; d < batch.size(); ++d) {
    A.batch_sizes[d] = batch[d];
    A.nb *= batch[d];
  }
  A.l = q.sizes()[nd - 2];
  A.e = q.sizes()[nd - 1];
  A.s = k.sizes()[nd - 2];
  A.f = v.sizes()[nd - 1];
  DUET_CHECK_SHAPE(A.e <= duet::detail::kMaxHeadDim && A.f <= duet::detail::kMaxHeadDim,
                   "[{}] on CUDA takes head dims up to {}, got query {} and value {}", op,
                   duet::detail::kMaxHeadDim, q.sizes(), v.sizes());
  const double sc = a.value.to<double>();
  A.scale = sc > 0 ? sc : 1 / std::sqrt(static_cast<double>(A.e));
  A.causal = a.keepdim;
  A.q = attn_operand(q, batch, A.l, A.e);
  A.k = attn_operand(k, batch, A.s, A.e);
  A.v = attn_operand(v, batch, A.s, A.f);
  if (in.size() > mask_at) {
    const Tensor& m = in[mask_at];
    A.mask = m.dtype() == DType::b8 ? 1 : 2;
    A.m = attn_operand(m, batch, A.l, A.s);
  }
  return A;
}

void attention_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  kern::AttnArg A = attn_arg("attention", in, 3, a);
  const Shape batch(in[0].sizes().data(), in[0].dim() - 2);
  A.r = attn_operand(out, batch, A.l, A.f + 1);
  A.out = out.raw_data();
  DUET_CUDA_CHECK(kern::launch_attention(to_dt(in[0].dtype()), A, stream_for(out)));
}

void attention_backward_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  kern::AttnArg A = attn_arg("attention_backward", in, 5, a);
  const Shape batch(in[0].sizes().data(), in[0].dim() - 2);
  A.r = attn_operand(in[3], batch, A.l, A.f + 1);
  // (The F-column gradient, Note [Attention], is the CPU plan's alone: simplify makes it there.)
  DUET_CHECK_SHAPE(in[4].size(-1) == A.f + 1,
                   "[attention_backward] on CUDA takes the gradient of attention's whole result "
                   "(..., L, {}), got {}",
                   A.f + 1, in[4].sizes());
  A.g = attn_operand(in[4], batch, A.l, A.f + 1);
  Tensor dense =
      out.is_contiguous() ? out : duet::detail::empty(out.sizes(), out.dtype(), out.device());
  const Tensor d = duet::detail::empty(Shape{A.nb * A.l}, out.dtype(), out.device());
  cudaStream_t s = stream_for(out);
  if (A.s == 0 || A.l == 0)  // no keys or no queries: every gradient is 0
    DUET_CUDA_CHECK(cudaMemsetAsync(
        dense.raw_data(), 0, static_cast<size_t>(dense.numel()) * itemsize(dense.dtype()), s));
  A.out = dense.raw_data();
  A.scratch = d.raw_data();
  DUET_CUDA_CHECK(kern::launch_attention_backward(to_dt(in[0].dtype()), A, s));
  if (!dense.is_same(out)) copy_into(dense, out);
}

}  // namespace

void register_attention(OpDef* t) {
  duet::detail::register_kernel(t, OpId::Attention, DeviceType::CUDA, attention_kernel);
  duet::detail::register_kernel(t, OpId::AttentionBackward, DeviceType::CUDA,
                                attention_backward_kernel);
}

}  // namespace duet::cuda::detail
