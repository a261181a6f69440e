// CPU kernels of unfold (im2col) and fold (col2im), the primitives under conv2d and pooling.
//
// attrs.ints (core/window.h): kernel, stride, zero padding and the spatial size of the image
// side, and the dilation where it is not 1. Unfold: [N, C, H, W] -> [N, C*kh*kw, L] with
// L = Ho*Wo, rows ordered (c, ki, kj) as PyTorch's unfold; tap (ki, kj) of window (oh, ow) reads
// pixel (oh*sh - ph + ki*dh, ow*sw - pw + kj*dw). Fold is its adjoint: it sums columns back into
// the image.
#include <cstring>

#include "core/window.h"
#include "kernels/cpu_kernels.h"
#include "kernels/low_precision.h"
#include "kernels/loops.h"

namespace duet::kernels {
namespace {

// Output columns ow whose input column ow*sw - pw + kj*dw lies in [0, w): [lo, hi), within
// [0, wo) (a padding wider than the image leaves taps that read no column at all).
inline void valid_cols(const WindowGeometry& g, int64_t kj, int64_t* lo, int64_t* hi) {
  const int64_t first = g.pw - kj * g.dw;  // iw >= 0  <=>  ow*sw >= pw - kj*dw
  *lo = first <= 0 ? 0 : std::min(g.wo, (first + g.sw - 1) / g.sw);
  const int64_t last = g.w - 1 + g.pw - kj * g.dw;  // iw <= w-1  <=>  ow*sw <= w-1+pw-kj*dw
  *hi = last < 0 ? 0 : std::min(g.wo, last / g.sw + 1);
  if (*hi < *lo) *hi = *lo;
}

template <class T>
void unfold_plane(const WindowGeometry& g, const T* x, T* cols) {
  // One (n, c) plane into its kh*kw rows of L columns; in-bounds runs are plain copies.
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      T* row = cols + (ki * g.kw + kj) * g.ho * g.wo;
      int64_t lo, hi;
      valid_cols(g, kj, &lo, &hi);
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
        T* r = row + oh * g.wo;
        if (ih < 0 || ih >= g.h) {
          std::fill(r, r + g.wo, T(0));
          continue;
        }
        std::fill(r, r + lo, T(0));
        std::fill(r + hi, r + g.wo, T(0));
        const T* src = x + ih * g.w + (lo * g.sw - g.pw + kj * g.dw);
        if (g.sw == 1)
          std::copy(src, src + (hi - lo), r + lo);
        else
          for (int64_t ow = lo; ow < hi; ++ow) r[ow] = src[(ow - lo) * g.sw];
      }
    }
}

template <class T>
void fold_plane(const WindowGeometry& g, const T* cols, T* x) {
  std::fill(x, x + g.h * g.w, T(0));
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const T* row = cols + (ki * g.kw + kj) * g.ho * g.wo;
      int64_t lo, hi;
      valid_cols(g, kj, &lo, &hi);
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.h) continue;
        T* dst = x + ih * g.w + (lo * g.sw - g.pw + kj * g.dw);
        const T* r = row + oh * g.wo;
        if (g.sw == 1)
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow - lo] = fn::wrap_add(dst[ow - lo], r[ow]);
        else
          for (int64_t ow = lo; ow < hi; ++ow)
            dst[(ow - lo) * g.sw] = fn::wrap_add(dst[(ow - lo) * g.sw], r[ow]);
      }
    }
}

// Unfold and Fold walk the same (n, c) planes; they differ only in which side is the image.
template <bool kUnfold>
void window_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  Tensor src = in[0].contiguous();
  const Shape& image = kUnfold ? src.sizes() : out.sizes();
  const WindowGeometry g = window_geometry(a);
  DUET_DISPATCH_DTYPE(out.dtype(), kUnfold ? "unfold" : "fold", [&] {
    using T = scalar_t;
    const T* ps = static_cast<const T*>(src.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    const int64_t plane = g.h * g.w, block = g.kh * g.kw * g.ho * g.wo;
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(block, 1));
    parallel_for(
        image[0] * image[1], grain,
        [&](int64_t b, int64_t e) {
          for (int64_t p = b; p < e; ++p) {
            if constexpr (kUnfold)
              unfold_plane<T>(g, ps + p * plane, po + p * block);
            else
              fold_plane<T>(g, ps + p * block, po + p * plane);
          }
        },
        1);
  });
}

}  // namespace

void register_image_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Unfold, DeviceType::CPU, via_wide<window_kernel<true>>);
  detail::register_kernel(t, OpId::Fold, DeviceType::CPU, via_wide<window_kernel<false>>);
}

}  // namespace duet::kernels
