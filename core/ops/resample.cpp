// Resampling sequences, images and volumes: interpolate to a size and upsample by a scale
// factor, as PyTorch's F.interpolate, in the modes "nearest", "nearest-exact", "linear",
// "bilinear", "bicubic", "trilinear" and "area". Composites of index_select and elementwise
// products, one spatial dim at a time, or of the adaptive average poolings (Note [Resampling]).
#include <algorithm>
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
// - "linear", "bilinear" and "trilinear": src = (i + 0.5) * scale - 0.5 clamped at 0, or
//   i * (in - 1) / (out - 1) with align_corners; the rows i0 = floor(src) and i0 + 1 (i0 at the
//   last row), weighted 1 - l and l, l = src - i0. The last dim first, then each before it: per
//   output element of an image the sum h0 (w0 x00 + w1 x01) + h1 (w0 x10 + w1 x11), PyTorch's
//   bilinear formula, and a volume's trilinear value likewise (its weights are the products of
//   the dims');
// - "bicubic": src as bilinear's but not clamped at 0; the rows floor(src) - 1 .. floor(src) + 2,
//   each clamped into the image, weighted by Keys' cubic convolution with a = -0.75 at their
//   distances from src (PyTorch's upsample_bicubic2d), width then height;
// - "area": the mean over the cells of the adaptive average pooling of the input's dims
//   (PyTorch's area mode is that pooling).
// The indices and weights depend on the sizes only, so they are constants of a trace.

// "(N, C, L)", "(N, C, H, W)" or "(N, C, D, H, W)": the input of `spatial` dims.
const char* layout(int64_t spatial) {
  return spatial == 1 ? "(N, C, L)" : spatial == 2 ? "(N, C, H, W)" : "(N, C, D, H, W)";
}

enum class Mode { Nearest, NearestExact, Linear, Bicubic, Area };

// The mode, and the spatial dims it is for: PyTorch's "linear", "bilinear" and "trilinear" are
// one interpolation over the 1, 2 and 3 dims of (N, C, L), (N, C, H, W) and (N, C, D, H, W)
// inputs, and "bicubic" is for images; the others resample any of the three.
Mode parse_mode(const char* op, const Tensor& x, std::string_view mode, bool align_corners,
                int64_t spatial) {
  const bool known = mode == "nearest" || mode == "nearest-exact" || mode == "linear" ||
                     mode == "bilinear" || mode == "bicubic" || mode == "trilinear" ||
                     mode == "area";
  DUET_CHECK_VALUE(known,
                   "[{}] mode must be \"nearest\", \"nearest-exact\", \"linear\", \"bilinear\", "
                   "\"bicubic\", \"trilinear\" or \"area\", got \"{}\"",
                   op, mode);
  const int64_t dims = mode == "linear"                          ? 1
                       : mode == "bilinear" || mode == "bicubic" ? 2
                       : mode == "trilinear"                     ? 3
                                                                 : spatial;
  DUET_CHECK_SHAPE(dims == spatial, "[{}] mode \"{}\" needs {} input, got {}", op, mode,
                   layout(dims), x.sizes());
  const Mode m = mode == "nearest"         ? Mode::Nearest
                 : mode == "nearest-exact" ? Mode::NearestExact
                 : mode == "bicubic"       ? Mode::Bicubic
                 : mode == "area"          ? Mode::Area
                                           : Mode::Linear;
  DUET_CHECK_VALUE(!align_corners || m == Mode::Linear || m == Mode::Bicubic,
                   "[{}] align_corners is for the interpolating modes \"linear\", \"bilinear\", "
                   "\"bicubic\" and \"trilinear\", not \"{}\"",
                   op, mode);
  return m;
}

// One dim's taps: output position i reads source rows index[k][i] weighted by weight[k][i], for
// each tap k (nearest has one and no weights).
struct Taps {
  std::vector<std::vector<double>> index, weight;
  explicit Taps(size_t n) : index(n), weight(n) {}
};

// Keys' cubic convolution kernel with a = -0.75 (PyTorch's), at distance t in [0, 2).
double cubic(double t) {
  constexpr double a = -0.75;
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
}

// One dim's source rows, and their weights, as PyTorch's kernels compute them: the coordinates
// scale by 1 / scale_factor where the caller gave one, else by in / out (nearest's in float
// arithmetic).
Taps taps(Mode m, int64_t in, int64_t out, std::optional<double> scale_factor, bool align_corners) {
  const bool nearest = m == Mode::Nearest || m == Mode::NearestExact;
  Taps t(nearest ? 1 : m == Mode::Linear ? 2 : 4);
  const double scale = scale_factor ? 1 / *scale_factor : double(in) / double(out);
  const float nearest_scale =
      scale_factor ? static_cast<float>(1 / *scale_factor) : float(in) / float(out);
  auto clamped = [&](int64_t r) { return double(std::clamp<int64_t>(r, 0, in - 1)); };
  for (int64_t i = 0; i < out; ++i) {
    if (nearest) {
      const float src =
          m == Mode::Nearest
              ? std::floor(static_cast<float>(i) * nearest_scale)
              : std::floor(static_cast<float>((double(i) + 0.5) * double(nearest_scale)));
      t.index[0].push_back(double(std::min(static_cast<int64_t>(src), in - 1)));
      continue;
    }
    double src;
    if (align_corners)
      src = out > 1 ? double(i) * double(in - 1) / double(out - 1) : 0;
    else
      src = (double(i) + 0.5) * scale - 0.5;
    if (m == Mode::Linear) {
      src = std::max(src, 0.0);
      const auto r0 = std::min(static_cast<int64_t>(src), in - 1);
      const double l = src - double(r0);
      t.index[0].push_back(double(r0));
      t.index[1].push_back(double(r0 < in - 1 ? r0 + 1 : r0));
      t.weight[0].push_back(1 - l);
      t.weight[1].push_back(l);
      continue;
    }
    const double f = std::floor(src), l = src - f;
    const auto r = static_cast<int64_t>(f);
    const double w[4] = {cubic(l + 1), cubic(l), cubic(1 - l), cubic(2 - l)};
    for (int k = 0; k < 4; ++k) {
      t.index[size_t(k)].push_back(clamped(r - 1 + k));
      t.weight[size_t(k)].push_back(w[k]);
    }
  }
  return t;
}

// x resampled along `dim` (a spatial dim) by the taps.
Tensor along(const Tensor& x, int64_t dim, const Taps& t) {
  const Options idx = Options().dtype(DType::i64).device(x.device());
  const Options w = Options().dtype(x.dtype()).device(x.device());
  Tensor r;
  for (size_t k = 0; k < t.index.size(); ++k) {
    const Tensor rows = index_select(x, dim, tensor(t.index[k], idx));
    if (t.weight[k].empty()) return rows;  // nearest
    // The weights along dim, broadcast over the dims after it.
    Shape ws{int64_t(t.weight[k].size())};
    for (int64_t d = dim + 1; d < x.dim(); ++d) ws.push_back(1);
    const Tensor term = rows * tensor(t.weight[k], ws, w);
    r = r.defined() ? r + term : term;
  }
  return r;
}

// x (N, C, spatial...) resampled to `size` (one per spatial dim), each dim alone, the last first.
Tensor resample(const char* op, const Tensor& x, const std::vector<int64_t>& size,
                std::optional<double> scale_factor, std::string_view mode, bool align_corners) {
  const auto spatial = static_cast<int64_t>(size.size());
  DUET_CHECK_SHAPE(x.dim() == spatial + 2, "[{}] input must be {}, got {}", op, layout(spatial),
                   x.sizes());
  const Mode m = parse_mode(op, x, mode, align_corners, spatial);
  DUET_CHECK_DTYPE(m == Mode::Nearest || m == Mode::NearestExact || is_floating(x.dtype()),
                   "[{}] mode \"{}\" needs a floating input, got {}", op, mode, x.dtype());
  DUET_CHECK_DTYPE(x.dtype() != DType::b8, "[{}] is not defined for b8 input", op);
  bool empty = false, positive = true;
  for (int64_t d = 0; d < spatial; ++d) {
    empty = empty || x.size(2 + d) == 0;
    positive = positive && size[size_t(d)] > 0;
  }
  DUET_CHECK_SHAPE(!empty, "[{}] input {} has an empty {}", op, x.sizes(),
                   spatial == 1   ? "sequence"
                   : spatial == 2 ? "image"
                                  : "volume");
  DUET_CHECK_VALUE(positive, "[{}] output size {} must be positive", op,
                   fmt::format("{}", fmt::join(size, "x")));
  if (m == Mode::Area) {
    if (spatial == 1) return adaptive_avg_pool1d(x, size[0]);
    if (spatial == 2) return adaptive_avg_pool2d(x, Size2{size[0], size[1]});
    return adaptive_avg_pool3d(x, Size3{size[0], size[1], size[2]});
  }
  Tensor r = x;
  for (int64_t d = spatial - 1; d >= 0; --d)
    r = along(r, 2 + d, taps(m, x.size(2 + d), size[size_t(d)], scale_factor, align_corners));
  return r;
}

}  // namespace

Tensor interpolate(const Tensor& x, Size2 size, std::string_view mode, bool align_corners,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("interpolate", [&]() -> Tensor {
    return resample("interpolate", x, {size.h, size.w}, std::nullopt, mode, align_corners);
  });
}

Tensor interpolate(const Tensor& x, Size3 size, std::string_view mode, bool align_corners,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("interpolate", [&]() -> Tensor {
    return resample("interpolate", x, {size.d, size.h, size.w}, std::nullopt, mode, align_corners);
  });
}

Tensor interpolate(const Tensor& x, int64_t size, std::string_view mode, bool align_corners,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("interpolate", [&]() -> Tensor {
    DUET_CHECK_SHAPE(x.dim() >= 3 && x.dim() <= 5,
                     "[interpolate] input must be (N, C, L), (N, C, H, W) or (N, C, D, H, W), got "
                     "{}",
                     x.sizes());
    return resample("interpolate", x, std::vector<int64_t>(size_t(x.dim() - 2), size), std::nullopt,
                    mode, align_corners);
  });
}

Tensor upsample(const Tensor& x, double scale_factor, std::string_view mode, bool align_corners,
                std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("upsample", [&]() -> Tensor {
    DUET_CHECK_VALUE(std::isfinite(scale_factor) && scale_factor > 0,
                     "[upsample] scale_factor must be positive and finite, got {}", scale_factor);
    DUET_CHECK_SHAPE(x.dim() >= 3 && x.dim() <= 5,
                     "[upsample] input must be (N, C, L), (N, C, H, W) or (N, C, D, H, W), got {}",
                     x.sizes());
    // The output size floor(in * scale), as PyTorch's; the coordinates scale by 1 / scale.
    std::vector<int64_t> size;
    for (int64_t d = 2; d < x.dim(); ++d) {
      const double o = std::floor(double(x.size(d)) * scale_factor);
      DUET_CHECK_VALUE(o < 9.0e18, "[upsample] input {} scaled by {} overflows int64", x.sizes(),
                       scale_factor);
      size.push_back(static_cast<int64_t>(o));
    }
    return resample("upsample", x, size, scale_factor, mode, align_corners);
  });
}

}  // namespace duet
