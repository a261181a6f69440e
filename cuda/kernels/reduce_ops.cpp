// duet: CUDA adapters of sum, max, min and argmax (kernels in reduce.cu). The input's dims split
// into kept dims (the output, contiguous) and reduced dims, each list merged where its strides
// allow, so the kernel's offset calculator walks few dims.
#include "cuda/kernels/adapt.h"
#include "kernels/low_precision.h"
#include "kernels/softmax.h"

namespace duet::cuda::detail {
namespace {

// Appends dims (size, stride) to a list, dropping size 1 and merging with the previous dim when
// it steps through both as one.
struct DimList {
  int n = 0;
  int64_t sizes[64], strides[64];
  void push(int64_t size, int64_t stride) {
    if (size == 1) return;
    if (n > 0 && strides[n - 1] == stride * size) {
      sizes[n - 1] *= size;
      strides[n - 1] = stride;
      return;
    }
    sizes[n] = size;
    strides[n] = stride;
    ++n;
  }
  void copy_to(int* nd, int64_t* s, int64_t* st, const char* what) const {
    DUET_CHECK(n <= kern::kMaxDims,
               "[cuda] a reduction over {} non-mergeable {} dims exceeds "
               "the {} a CUDA kernel walks",
               n, what, kern::kMaxDims);
    *nd = n;
    for (int d = 0; d < n; ++d) {
      s[d] = sizes[d];
      st[d] = strides[d];
    }
  }
};

kern::ReduceArg reduce_arg(const Tensor& x, const bool* reduced, const Tensor& out) {
  DUET_ASSERT(out.is_contiguous(), "reductions write a fresh contiguous output");
  kern::ReduceArg A;
  A.in = x.raw_data();
  A.out = out.raw_data();
  DimList kept, red;
  A.nout = 1;
  A.nred = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[d]) {
      red.push(x.sizes()[d], x.strides()[d]);
      A.nred *= x.sizes()[d];
    } else {
      kept.push(x.sizes()[d], x.strides()[d]);
      A.nout *= x.sizes()[d];
    }
  }
  kept.copy_to(&A.nkept, A.kept_sizes, A.kept_strides, "kept");
  red.copy_to(&A.nreduced, A.red_sizes, A.red_strides, "reduced");
  return A;
}

template <kern::Reduce Op>
void reduce_kernel(TensorRefs in, const Attrs& attrs, const Tensor& out) {
  const Tensor& x = in[0];
  DUET_CHECK(x.dim() <= 64, "[cuda] rank {} is too large", x.dim());
  bool reduced[64] = {};
  if (attrs.ints.empty())
    for (int64_t d = 0; d < x.dim(); ++d) reduced[d] = true;
  else
    for (int64_t d : attrs.ints) reduced[d] = true;
  const kern::ReduceArg A = reduce_arg(x, reduced, out);
  if (A.nout == 0) return;
  DUET_CHECK_DTYPE(x.dtype() != DType::f16 && x.dtype() != DType::bf16,
                   "[reduce] has no CUDA kernel for dtype {}", dtype_name(x.dtype()));
  cudaStream_t s = stream_for(out);
  kern::ReduceArg B = A;
  Tensor scratch;  // freed after the launch: the caching allocator reuses it in stream order
  B.nsplit = kern::reduce_splits(A);
  if (B.nsplit > 1) {
    scratch = duet::detail::empty(Shape{B.nout * B.nsplit * kern::kReduceScratchBytes / 8},
                                  DType::i64, out.device());
    B.scratch = scratch.raw_data();
  }
  DUET_CUDA_CHECK(kern::launch_reduce(Op, to_dt(x.dtype()), to_dt(out.dtype()), B, s));
}

// The first index of the largest value along attrs.dim (NaN counts as largest).
void argmax_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor& x = in[0];
  DUET_CHECK(x.dim() <= 64, "[cuda] rank {} is too large", x.dim());
  bool reduced[64] = {};
  if (x.dim()) reduced[a.dim] = true;
  kern::ReduceArg A = reduce_arg(x, reduced, out);
  if (A.nout == 0) return;
  if (A.nred == 0) {  // nothing to compare: index 0, as the CPU kernel writes
    DUET_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.numel() * 8, stream_for(out)));
    return;
  }
  // One reduced dim: keep it even when its size is 1, so the index counts along it.
  A.nreduced = 1;
  A.red_sizes[0] = x.dim() ? x.sizes()[a.dim] : 1;
  A.red_strides[0] = x.dim() ? x.strides()[a.dim] : 0;
  DUET_CHECK_DTYPE(x.dtype() != DType::f16 && x.dtype() != DType::bf16,
                   "[argmax] has no CUDA kernel for dtype {}", dtype_name(x.dtype()));
  DUET_CUDA_CHECK(kern::launch_reduce(kern::Reduce::Argmax, to_dt(x.dtype()), kern::DT::i64, A,
                                      stream_for(out)));
}

}  // namespace

void register_reductions(OpDef* t) {
  duet::detail::register_kernel(t, OpId::LogSoftmax, DeviceType::CUDA,
                                duet::kernels::via_wide<duet::kernels::log_softmax_composed>);
  duet::detail::register_kernel(t, OpId::Sum, DeviceType::CUDA,
                                duet::kernels::via_wide<reduce_kernel<kern::Reduce::Sum>>);
  duet::detail::register_kernel(t, OpId::Max, DeviceType::CUDA,
                                duet::kernels::via_wide<reduce_kernel<kern::Reduce::Max>>);
  duet::detail::register_kernel(t, OpId::Min, DeviceType::CUDA,
                                duet::kernels::via_wide<reduce_kernel<kern::Reduce::Min>>);
  duet::detail::register_kernel(t, OpId::Argmax, DeviceType::CUDA,
                                duet::kernels::via_wide<argmax_kernel>);
}

}  // namespace duet::cuda::detail
