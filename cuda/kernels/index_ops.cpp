// duet: CUDA adapters of gather, scatter_add, argsort, cat, unfold and fold (kernels in index.cu
// and image.cu), following kernels/index.cpp and kernels/image.cpp.
#include "core/window.h"
#include "kernels/composed.h"
#include "kernels/low_precision.h"
#include "cuda/kernels/adapt.h"
#include "cuda/runtime.h"

namespace duet::cuda::detail {
namespace {

int64_t size_along(const Tensor& x, int64_t dim) { return x.dim() ? x.sizes()[dim] : 1; }
int64_t stride_along(const Tensor& x, int64_t dim) { return x.dim() ? x.strides()[dim] : 0; }

// x viewed at the index's shape with stride 0 along dim (kernels/index.cpp's base_view).
Tensor base_view(const Tensor& x, const Tensor& index, int64_t dim) {
  Strides st = x.strides();
  if (x.dim()) st[dim] = 0;
  return duet::detail::make_view(x, index.sizes(), st, x.storage_offset());
}

// Index values are data: the kernels check them as they read them and record the first one out
// of range on the device; the error is raised at the next host synchronization (Note [Device
// index checks] in cuda/runtime.cpp). No host sync here, so a compiled step with gather and
// scatter_add (cross_entropy and its gradient) is captured as a CUDA graph.
kern::IndexCheck index_check(const Tensor& t, int64_t size, int64_t dim, int64_t op) {
  return {index_error_record(t.device()), size, dim, op};
}

void gather_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor &x = in[0], &index = in[1];
  if (out.numel() == 0) return;
  const Tensor xv = base_view(x, index, a.dim);
  const kern::Loop L = make_loop(out, {&index, &xv}, {DType::i64, x.dtype()});
  DUET_CUDA_CHECK(kern::launch_gather(to_dt(out.dtype()), L, stride_along(x, a.dim),
                                      index_check(out, size_along(x, a.dim), a.dim, 1),
                                      stream_for(out)));
}

void scatter_add_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor &base = in[0], &index = in[1], &src = in[2];
  copy_into(base, out);
  if (index.numel() == 0) return;
  const Tensor ov = base_view(out, index, a.dim);
  Tensor ts;
  const Tensor& sv = in_dtype(src, out.dtype(), ts);
  const kern::Loop L = make_loop(ov, {&index, &sv}, {DType::i64, out.dtype()});
  DUET_CUDA_CHECK(kern::launch_scatter_add(to_dt(out.dtype()), L, stride_along(out, a.dim),
                                           index_check(out, size_along(out, a.dim), a.dim, 2),
                                           stream_for(out)));
}

// attrs.dim, attrs.keepdim (descending); out is fresh and contiguous, of x's shape.
void argsort_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor& x = in[0];
  if (out.numel() == 0) return;
  DUET_CHECK_DTYPE(x.dtype() != DType::f16 && x.dtype() != DType::bf16,
                   "[argsort] has no CUDA kernel for dtype {}", dtype_name(x.dtype()));
  const Tensor xrow = base_view(x, x, a.dim), orow = base_view(out, out, a.dim);
  const kern::Loop L = make_loop(out, {&x, &xrow, &orow}, {x.dtype(), x.dtype(), DType::i64});
  DUET_CUDA_CHECK(kern::launch_argsort(to_dt(x.dtype()), L, size_along(x, a.dim),
                                       stride_along(x, a.dim), stride_along(out, a.dim), a.keepdim,
                                       stream_for(out)));
}

// attrs.ints: the window (core/window.h).
template <bool kUnfold>
void window_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "unfold and fold write a fresh contiguous output");
  const Tensor& src = in[0];
  const Shape& image = kUnfold ? src.sizes() : out.sizes();
  kern::WindowArg A;
  A.in = src.raw_data();
  A.out = out.raw_data();
  A.n = image[0];
  A.c = image[1];
  const WindowGeometry g = window_geometry(a);
  A.h = g.h;
  A.w = g.w;
  A.kh = g.kh;
  A.kw = g.kw;
  A.sh = g.sh;
  A.sw = g.sw;
  A.ph = g.ph;
  A.pw = g.pw;
  A.dh = g.dh;
  A.dw = g.dw;
  A.ho = g.ho;
  A.wo = g.wo;
  for (int64_t d = 0; d < src.dim() && d < 4; ++d) A.in_strides[d] = src.strides()[d];
  DUET_CHECK_DTYPE(out.dtype() != DType::f16 && out.dtype() != DType::bf16,
                   "[{}] has no CUDA kernel for dtype {}", kUnfold ? "unfold" : "fold",
                   dtype_name(out.dtype()));
  cudaStream_t s = stream_for(out);
  if constexpr (kUnfold)
    DUET_CUDA_CHECK(kern::launch_unfold(to_dt(out.dtype()), A, s));
  else
    DUET_CUDA_CHECK(kern::launch_fold(to_dt(out.dtype()), A, s));
}

}  // namespace

void register_index(OpDef* t) {
  auto reg = [&](OpId op, KernelFn k) {
    duet::detail::register_kernel(t, op, DeviceType::CUDA, k);
  };
  reg(OpId::Gather, duet::kernels::via_wide<gather_kernel>);
  reg(OpId::ScatterAdd, duet::kernels::via_wide<scatter_add_kernel>);
  reg(OpId::Argsort, duet::kernels::via_wide<argsort_kernel>);
  reg(OpId::Cat, duet::kernels::cat_kernel);
  reg(OpId::Transfer, duet::kernels::transfer_kernel);
  reg(OpId::AllReduce, duet::kernels::collective_kernel<OpId::AllReduce>);
  reg(OpId::Broadcast, duet::kernels::collective_kernel<OpId::Broadcast>);
  reg(OpId::AllGather, duet::kernels::collective_kernel<OpId::AllGather>);
  reg(OpId::ReduceScatter, duet::kernels::collective_kernel<OpId::ReduceScatter>);
  reg(OpId::CollectiveWait, duet::kernels::collective_wait_kernel);
  reg(OpId::Unfold, duet::kernels::via_wide<window_kernel<true>>);
  reg(OpId::Fold, duet::kernels::via_wide<window_kernel<false>>);
  // Conv2d and its gradients: unfold, fold and cuBLAS GEMMs on temporaries (kernels/conv.cpp).
  reg(OpId::Conv2d, duet::kernels::via_wide<duet::kernels::conv2d_composed_kernel>);
  reg(OpId::Conv2dInputGrad,
      duet::kernels::via_wide<duet::kernels::conv2d_input_grad_composed_kernel>);
  reg(OpId::Conv2dWeightGrad,
      duet::kernels::via_wide<duet::kernels::conv2d_weight_grad_composed_kernel>);
}

}  // namespace duet::cuda::detail
