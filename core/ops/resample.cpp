// Resampling images: interpolate to a size and upsample by a scale factor, as PyTorch's
// F.interpolate, in the modes "nearest", "nearest-exact" and "bilinear". Composites of
// index_select and elementwise products, one image dim at a time (Note [Resampling]).
#include <cmath>
#include <optional>
#include <string>

#include "core/op_errors.h"
#include "core/ops.h"

namespace duet {
namespace {

// Note [Resampling]
// Output position i of a dim of `in` elements resized to `out` reads the source coordinate
// PyTorch's kernels compute, with `scale` in / out (or 1 / scale_factor where the caller gave
// one):
// - "nearest": floor(i * scale), and "nearest-exact": floor((i + 0.5) * scale), both in float
//   arithmetic as PyTorch's, clamped to in - 1; one index_select per dim;
// - "bilinear": src = (i + 0.5) * scale - 0.5 clamped at 0, or i * (in - 1) / (out - 1) with
//   align_corners; the rows i0 = floor(src) and i0 + 1 (i0 at the last row), weighted 1 - l and
//   l, l = src - i0. Along the width, then along the height: per output element the sum
//   h0 (w0 x00 + w1 x01) + h1 (w0 x10 + w1 x11), PyTorch's bilinear formula.
// The indices and weights depend on the sizes only, so they are constants of a trace.
enum class Mode { Nearest, NearestExact, Bilinear };

Mode parse_mode(const char* op, std::string_view mode, bool align_corners) {
  const bool known = mode == "nearest" || mode == "nearest-exact" || mode == "bilinear";
  DUET_CHECK_VALUE(known,
                   "[{}] mode must be \"nearest\", \"nearest-exact\" or \"bilinear\", got \"{}\"",
                   op, mode);
  const Mode m = mode == "nearest"         ? Mode::Nearest
                 : mode == "nearest-exact" ? Mode::NearestExact
                                           : Mode::Bilinear;
  DUET_CHECK_VALUE(!align_corners || m == Mode::Bilinear,
                   "[{}] align_corners is for the interpolating mode \"bilinear\", not \"{}\"", op,
                   mode);
  return m;
}

struct Taps {
  std::vector<double> i0, i1, w0, w1;  // bilinear; nearest uses i0 only
};

// One dim's source rows, and their weights for bilinear, as PyTorch's kernels compute them: the
// coordinates scale by 1 / scale_factor where the caller gave one, else by in / out (nearest's
// in float arithmetic).
Taps taps(Mode m, int64_t in, int64_t out, std::optional<double> scale_factor, bool align_corners) {
  Taps t;
  const double scale = scale_factor ? 1 / *scale_factor : double(in) / double(out);
  const float nearest_scale =
      scale_factor ? static_cast<float>(1 / *scale_factor) : float(in) / float(out);
  for (int64_t i = 0; i < out; ++i) {
    if (m != Mode::Bilinear) {
      const float src =
          m == Mode::Nearest
              ? std::floor(static_cast<float>(i) * nearest_scale)
              : std::floor(static_cast<float>((double(i) + 0.5) * double(nearest_scale)));
      t.i0.push_back(double(std::min(static_cast<int64_t>(src), in - 1)));
      continue;
    }
    double src;
    if (align_corners)
      src = out > 1 ? double(i) * double(in - 1) / double(out - 1) : 0;
    else
      src = std::max((double(i) + 0.5) * scale - 0.5, 0.0);
    const auto r0 = std::min(static_cast<int64_t>(src), in - 1);
    const double l = src - double(r0);
    t.i0.push_back(double(r0));
    t.i1.push_back(double(r0 < in - 1 ? r0 + 1 : r0));
    t.w0.push_back(1 - l);
    t.w1.push_back(l);
  }
  return t;
}

// x resampled along dim (2 or 3) by the taps.
Tensor along(const Tensor& x, int64_t dim, Mode m, const Taps& t) {
  const Options idx = Options().dtype(DType::i64).device(x.device());
  const Tensor r0 = index_select(x, dim, tensor(t.i0, idx));
  if (m != Mode::Bilinear) return r0;
  const Tensor r1 = index_select(x, dim, tensor(t.i1, idx));
  const Options w = Options().dtype(x.dtype()).device(x.device());
  const Shape ws = dim == 2 ? Shape{int64_t(t.w0.size()), 1} : Shape{int64_t(t.w0.size())};
  return r0 * tensor(t.w0, ws, w) + r1 * tensor(t.w1, ws, w);
}

Tensor resample(const char* op, const Tensor& x, Size2 size, std::optional<double> scale_factor,
                std::string_view mode, bool align_corners) {
  const Mode m = parse_mode(op, mode, align_corners);
  DUET_CHECK_SHAPE(x.dim() == 4, "[{}] input must be (N, C, H, W), got {}", op, x.sizes());
  DUET_CHECK_DTYPE(m != Mode::Bilinear || is_floating(x.dtype()),
                   "[{}] mode \"bilinear\" needs a floating input, got {}", op, x.dtype());
  DUET_CHECK_DTYPE(x.dtype() != DType::b8, "[{}] is not defined for b8 input", op);
  const int64_t h = x.size(2), w = x.size(3);
  DUET_CHECK_SHAPE(h > 0 && w > 0, "[{}] input {} has an empty image", op, x.sizes());
  DUET_CHECK_VALUE(size.h > 0 && size.w > 0, "[{}] output size {}x{} must be positive", op, size.h,
                   size.w);
  const Taps th = taps(m, h, size.h, scale_factor, align_corners);
  const Taps tw = taps(m, w, size.w, scale_factor, align_corners);
  return along(along(x, 3, m, tw), 2, m, th);
}

}  // namespace

Tensor interpolate(const Tensor& x, Size2 size, std::string_view mode, bool align_corners,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("interpolate", [&]() -> Tensor {
    return resample("interpolate", x, size, std::nullopt, mode, align_corners);
  });
}

Tensor upsample(const Tensor& x, double scale_factor, std::string_view mode, bool align_corners,
                std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("upsample", [&]() -> Tensor {
    DUET_CHECK_VALUE(std::isfinite(scale_factor) && scale_factor > 0,
                     "[upsample] scale_factor must be positive and finite, got {}", scale_factor);
    DUET_CHECK_SHAPE(x.dim() == 4, "[upsample] input must be (N, C, H, W), got {}", x.sizes());
    // The output size floor(in * scale), as PyTorch's; the coordinates scale by 1 / scale.
    const double oh = std::floor(double(x.size(2)) * scale_factor);
    const double ow = std::floor(double(x.size(3)) * scale_factor);
    DUET_CHECK_VALUE(oh < 9.0e18 && ow < 9.0e18, "[upsample] input {} scaled by {} overflows int64",
                     x.sizes(), scale_factor);
    return resample("upsample", x, {static_cast<int64_t>(oh), static_cast<int64_t>(ow)},
                    scale_factor, mode, align_corners);
  });
}

}  // namespace duet
