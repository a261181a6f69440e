// The 1-D window ops over sequences (N, C, L), or unbatched (C, L), as PyTorch's conv1d,
// max_pool1d, avg_pool1d and the adaptive poolings: each is its 2-D op over a height of 1
// (Note [Sequences as images]).
#include <string>

#include "core/op_errors.h"
#include "core/ops.h"

namespace duet {
namespace {

// Note [Sequences as images]
// x (N, C, L) is the image (N, C, 1, L), and a kernel, stride, padding or dilation k along L
// the 2-D one {1, k}: the 2-D op's windows then read only along the width, with the same
// values, gradients and kernels (oneDNN's convolutions on the CPU), and the ONNX exporter
// writes the 2-D node over an unsqueezed input. An unbatched (C, L) is (1, C, 1, L). The
// arguments are checked here, in the 1-D words of the call, before the 2-D op sees them.

// x as (N, C, 1, L).
Tensor as_image(const char* op, const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", op);
  DUET_CHECK_SHAPE(x.dim() == 3 || x.dim() == 2,
                   "[{}] input must be (N, C, L) or unbatched (C, L), got {}", op, x.sizes());
  return unsqueeze(x.dim() == 3 ? x : unsqueeze(x, 0), 2);
}

// The 2-D result y (N, C', 1, L') in x's layout.
Tensor from_image(const Tensor& y, const Tensor& x) {
  const Tensor r = squeeze(y, 2);
  return x.dim() == 3 ? r : squeeze(r, 0);
}

// A window of kernel k, stride s (0: the kernel's, where zero_stride), padding p and dilation d
// along x's last dim: positive sizes, and the dilated kernel within the padded length.
void check_window(const char* op, const Tensor& x, int64_t k, int64_t s, int64_t p, int64_t d,
                  bool zero_stride) {
  DUET_CHECK_VALUE(k > 0 && (s > 0 || (zero_stride && s == 0)) && p >= 0 && d > 0,
                   "[{}] kernel_size {}, stride {}{} and dilation {} must be positive and padding "
                   "{} non-negative",
                   op, k, s, zero_stride ? " (0: the kernel size)" : "", d, p);
  const int64_t len = x.size(x.dim() - 1);
  int64_t reach = 0, padded = 0;
  const bool fits = !__builtin_mul_overflow(d, k - 1, &reach) &&
                    !__builtin_mul_overflow(p, 2, &padded) &&
                    !__builtin_add_overflow(padded, len, &padded);
  DUET_CHECK_VALUE(fits, "[{}] kernel_size {} dilated by {} or padding {} overflows int64", op, k,
                   d, p);
  DUET_CHECK_SHAPE(reach < padded,
                   "[{}] kernel_size {}{} is larger than the padded input length {} of {}", op, k,
                   d == 1 ? std::string() : " dilated by " + std::to_string(d), padded, x.sizes());
}

// A pooling's padding: at most half the kernel, as PyTorch's.
void check_pool_padding(const char* op, int64_t k, int64_t p) {
  DUET_CHECK_VALUE(p <= k / 2, "[{}] padding {} must be at most half the kernel_size {}", op, p, k);
}

// conv1d's weight (O, C / groups, k) against x's channels.
void check_conv(const Tensor& x, const Tensor& w, int64_t groups) {
  DUET_CHECK_VALUE(w.defined(), "[conv1d] the weight is an undefined tensor");
  DUET_CHECK_SHAPE(w.dim() == 3, "[conv1d] weight must be (out, in / groups, k), got {}",
                   w.sizes());
  DUET_CHECK_VALUE(groups >= 1, "[conv1d] groups must be positive, got {}", groups);
  const int64_t c = x.size(x.dim() - 2);
  const std::string in_groups = groups == 1 ? "" : fmt::format(" in {} groups", groups);
  DUET_CHECK_SHAPE(c == w.size(1) * groups,
                   "[conv1d] input {} has {} channels but the weight {}{} expects {}", x.sizes(), c,
                   w.sizes(), in_groups, w.size(1) * groups);
  DUET_CHECK_SHAPE(w.size(0) % groups == 0,
                   "[conv1d] the weight {} has {} filters, which {} groups do not divide",
                   w.sizes(), w.size(0), groups);
}

}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride, int64_t padding,
              int64_t groups, int64_t dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv1d", [&]() -> Tensor {
    const Tensor img = as_image("conv1d", x);
    check_conv(x, w, groups);
    check_window("conv1d", x, w.size(2), stride, padding, dilation, false);
    return from_image(conv2d(img, unsqueeze(w, 2), b, Size2{1, stride}, Size2{0, padding}, groups,
                             Size2{1, dilation}),
                      x);
  });
}

Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride, SamePadding,
              int64_t groups, int64_t dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv1d", [&]() -> Tensor {
    DUET_CHECK_VALUE(stride == 1, "[conv1d] padding \"same\" needs stride 1, got {}", stride);
    const Tensor img = as_image("conv1d", x);
    check_conv(x, w, groups);
    DUET_CHECK_VALUE(dilation > 0, "[conv1d] dilation {} must be positive", dilation);
    return from_image(conv2d(img, unsqueeze(w, 2), b, 1, kSame, groups, Size2{1, dilation}), x);
  });
}

Tensor max_pool1d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding,
                  int64_t dilation, bool ceil_mode, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("max_pool1d", [&]() -> Tensor {
    const Tensor img = as_image("max_pool1d", x);
    check_window("max_pool1d", x, kernel, stride, padding, dilation, true);
    check_pool_padding("max_pool1d", kernel, padding);
    return from_image(max_pool2d(img, Size2{1, kernel}, Size2{1, stride ? stride : kernel},
                                 Size2{0, padding}, Size2{1, dilation}, ceil_mode),
                      x);
  });
}

Tensor avg_pool1d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool ceil_mode,
                  bool count_include_pad, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("avg_pool1d", [&]() -> Tensor {
    const Tensor img = as_image("avg_pool1d", x);
    check_window("avg_pool1d", x, kernel, stride, padding, 1, true);
    check_pool_padding("avg_pool1d", kernel, padding);
    return from_image(avg_pool2d(img, Size2{1, kernel}, Size2{1, stride ? stride : kernel},
                                 Size2{0, padding}, ceil_mode, count_include_pad),
                      x);
  });
}

namespace {
template <class Pool2>
Tensor adaptive1d(const char* op, const Tensor& x, int64_t out, Pool2 pool) {
  const Tensor img = as_image(op, x);
  DUET_CHECK_VALUE(out > 0, "[{}] output_size {} must be positive", op, out);
  DUET_CHECK_SHAPE(x.size(x.dim() - 1) > 0, "[{}] input {} is empty along L", op, x.sizes());
  return from_image(pool(img, Size2{1, out}), x);
}
}  // namespace

Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("adaptive_avg_pool1d", [&]() -> Tensor {
    return adaptive1d("adaptive_avg_pool1d", x, output_size,
                      [](const Tensor& t, Size2 o) { return adaptive_avg_pool2d(t, o); });
  });
}

Tensor adaptive_max_pool1d(const Tensor& x, int64_t output_size, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("adaptive_max_pool1d", [&]() -> Tensor {
    return adaptive1d("adaptive_max_pool1d", x, output_size,
                      [](const Tensor& t, Size2 o) { return adaptive_max_pool2d(t, o); });
  });
}

}  // namespace duet
