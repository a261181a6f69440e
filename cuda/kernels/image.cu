// CUDA kernels of unfold (im2col) and fold (col2im), kernels/image.cpp's geometry. Unfold runs
// one thread per column element; fold one thread per image element, gathering the columns that
// cover it (no atomics, so the sum order is fixed).
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

// out[n, (c, ki, kj), (oh, ow)] = x[n, c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw] (0 outside).
template <class T>
__global__ void unfold_kernel(WindowArg A) {
  const int64_t L = A.ho * A.wo, rows = A.c * A.kh * A.kw, total = A.n * rows * L;
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  const T* x = static_cast<const T*>(A.in);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += grid) {
    const int64_t l = i % L, row = (i / L) % rows, n = i / (L * rows);
    const int64_t ow = l % A.wo, oh = l / A.wo;
    const int64_t kj = row % A.kw, ki = (row / A.kw) % A.kh, c = row / (A.kw * A.kh);
    const int64_t ih = oh * A.sh - A.ph + ki * A.dh, iw = ow * A.sw - A.pw + kj * A.dw;
    T v = T(0);
    if (ih >= 0 && ih < A.h && iw >= 0 && iw < A.w)
      v = x[n * A.in_strides[0] + c * A.in_strides[1] + ih * A.in_strides[2] +
            iw * A.in_strides[3]];
    static_cast<T*>(A.out)[i] = v;
  }
}

// out[n, c, ih, iw] = sum over (ki, kj) with ih = oh*sh - ph + ki*dh, iw = ow*sw - pw + kj*dw.
template <class T>
__global__ void fold_kernel(WindowArg A) {
  const int64_t total = A.n * A.c * A.h * A.w;
  const int64_t grid = int64_t(gridDim.x) * blockDim.x;
  const T* cols = static_cast<const T*>(A.in);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += grid) {
    const int64_t iw = i % A.w, ih = (i / A.w) % A.h, c = (i / (A.w * A.h)) % A.c;
    const int64_t n = i / (A.w * A.h * A.c);
    T acc = T(0);
    for (int64_t ki = 0; ki < A.kh; ++ki) {
      const int64_t th = ih + A.ph - ki * A.dh;
      if (th < 0 || th % A.sh) continue;
      const int64_t oh = th / A.sh;
      if (oh >= A.ho) continue;
      for (int64_t kj = 0; kj < A.kw; ++kj) {
        const int64_t tw = iw + A.pw - kj * A.dw;
        if (tw < 0 || tw % A.sw) continue;
        const int64_t ow = tw / A.sw;
        if (ow >= A.wo) continue;
        const int64_t row = (c * A.kh + ki) * A.kw + kj;
        acc = fn::wrap_add(
            acc,
            cols[n * A.in_strides[0] + row * A.in_strides[1] + (oh * A.wo + ow) * A.in_strides[2]]);
      }
    }
    static_cast<T*>(A.out)[i] = acc;
  }
}

template <bool kUnfold>
cudaError_t run(DT dt, const WindowArg& A, cudaStream_t s) {
  const int64_t total = kUnfold ? A.n * A.c * A.kh * A.kw * A.ho * A.wo : A.n * A.c * A.h * A.w;
  if (total == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    if constexpr (kUnfold)
      unfold_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(A);
    else
      fold_kernel<T><<<blocks_for(total), kThreads, 0, s>>>(A);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_unfold(DT dt, const WindowArg& A, cudaStream_t s) { return run<true>(dt, A, s); }
cudaError_t launch_fold(DT dt, const WindowArg& A, cudaStream_t s) { return run<false>(dt, A, s); }

}  // namespace duet::cuda::kern
