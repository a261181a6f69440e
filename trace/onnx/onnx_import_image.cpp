// ONNX import: the mappings of resampling and transposed convolution (trace/onnx/onnx_import.h).
//
// Resize and Upsample are separable: along each resized axis, every output position is a
// weighted sum of a few input positions ("taps"), and since the sizes are known while tracing,
// the taps are computed here on the host (a small 1-D problem) and applied with index_select and
// a multiply by a weight vector. The N-D result is the 1-D resize applied axis after axis, which
// is what the ONNX reference computes (it interpolates the innermost axis first; linear maps
// commute, so the order does not matter).
#include <algorithm>
#include <cmath>

#include "core/ops.h"
#include "trace/onnx/onnx_import.h"

namespace duet::detail::onnx_import {

namespace {

using V = std::vector<Tensor>;

// The values of input i as doubles (scales, roi): like Node::number, for a vector. A value
// computed from data is guarded by the compiled call (Note [Known values]).
std::vector<double> numbers(const Node& n, size_t i) {
  return n.in(i).to(Device::cpu()).to(DType::f64).to_vector<double>();
}

// A 1-D vector of values along dim `a` of a rank-r tensor (sizes 1 elsewhere), in dtype d.
Tensor along(const std::vector<double>& v, int64_t a, int64_t r, DType d, Device dev) {
  std::vector<int64_t> s(static_cast<size_t>(r), 1);
  s[static_cast<size_t>(a)] = static_cast<int64_t>(v.size());
  return reshape(tensor(v, Options().dtype(d).device(dev)), Shape(s));
}

// ---- Resize, Upsample ----

// What a Resize node asks for, resolved from its attributes (opset by opset).
struct ResizeSpec {
  std::string mode;       // nearest, linear, cubic
  std::string transform;  // coordinate_transformation_mode
  std::string nearest;    // nearest_mode; "simple" is opset 10's and Upsample's
  double cubic_a = -0.75, extrapolation = 0.0;
  bool exclude_outside = false, antialias = false;
};

// Per output position of one axis: `n` taps (input index, weight), row-major, and whether the
// position lies outside the roi (tf_crop_and_resize: it takes the extrapolation value).
struct Taps {
  int64_t n = 0;
  std::vector<int64_t> idx;
  std::vector<double> w;
  std::vector<bool> outside;
};

// The source coordinate of output position x along an axis of `in` elements resized by `scale`
// to `out` elements (ONNX's coordinate_transformation_mode). The reference uses scale * in, not
// the rounded out, as the resized length; with sizes given they agree.
double source_coord(const Node& n, const ResizeSpec& s, double x, double scale, int64_t in,
                    int64_t out, double roi0, double roi1) {
  const double len = scale * static_cast<double>(in);
  const std::string& t = s.transform;
  if (t == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (t == "asymmetric") return x / scale;
  if (t == "pytorch_half_pixel") return len == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (t == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (t == "align_corners") return len == 1 ? 0.0 : x * static_cast<double>(in - 1) / (len - 1);
  if (t == "half_pixel_symmetric") {
    // Centres the implicit roi of the rounded output on the input's centre.
    const double adjust = static_cast<double>(out) / len;
    const double offset = static_cast<double>(in) / 2 * (1 - adjust);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (t == "tf_crop_and_resize") {
    const double span = (roi1 - roi0) * static_cast<double>(in - 1);
    return roi0 * static_cast<double>(in - 1) + (len == 1 ? span / 2 : x * span / (len - 1));
  }
  n.fail(fmt::format("coordinate_transformation_mode \"{}\" is not supported", t));
}

// The cubic convolution kernel of Keys with parameter A, at distance x.
double cubic_kernel(double x, double A) {
  x = std::abs(x);
  if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
  if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
  return 0;
}

// The weights of the taps at floor(x) - k + 1 ... for a source coordinate with fractional part
// `ratio` in (0, 1] (1 when the coordinate is an integer: the taps then lean left).
std::vector<double> coeffs(const ResizeSpec& s, double ratio, double scale) {
  if (s.mode == "nearest") {
    const bool whole = ratio == 1;
    std::string m = s.nearest;
    if (m == "simple") m = scale < 1 ? "ceil" : "floor";  // ONNX Runtime's opset-10 rule
    if (whole || m == "ceil") return {0, 1};
    if (m == "floor") return {1, 0};
    if (m == "round_prefer_floor") return {double(ratio <= 0.5), double(ratio > 0.5)};
    return {double(ratio < 0.5), double(ratio >= 0.5)};  // round_prefer_ceil
  }
  if (!s.antialias) {
    if (s.mode == "linear") return {1 - ratio, ratio};
    return {cubic_kernel(ratio + 1, s.cubic_a), cubic_kernel(ratio, s.cubic_a),
            cubic_kernel(1 - ratio, s.cubic_a), cubic_kernel(2 - ratio, s.cubic_a)};
  }
  // Antialiasing (downsampling only): the kernel is stretched by 1/scale, so it spans more
  // taps, and the weights are normalized to sum to 1.
  const double sc = std::min(scale, 1.0);
  const double reach = s.mode == "linear" ? 1 : 2;
  const int64_t start = static_cast<int64_t>(std::floor(-reach / sc)) + 1;
  std::vector<double> c;
  double total = 0;
  for (int64_t i = start; i < 2 - start; ++i) {
    const double d = sc * (static_cast<double>(i) - ratio);
    c.push_back(s.mode == "linear" ? std::clamp(1 - std::abs(d), 0.0, 1.0)
                                   : cubic_kernel(d, s.cubic_a));
    total += c.back();
  }
  for (double& v : c) v /= total;
  return c;
}

// The taps of one axis, as the ONNX reference picks them: the k input positions nearest the
// source coordinate (ties to the left) on the input padded by ceil(k/2) edge copies, each
// reading the nearest real element.
Taps axis_taps(const Node& n, const ResizeSpec& s, int64_t in, int64_t out, double scale,
               double roi0, double roi1) {
  Taps t;
  for (int64_t o = 0; o < out; ++o) {
    const double x = source_coord(n, s, static_cast<double>(o), scale, in, out, roi0, roi1);
    const double fl = std::floor(x);
    std::vector<double> c = coeffs(s, x == fl ? 1.0 : x - fl, scale);
    const auto k = static_cast<int64_t>(c.size());
    t.n = k;
    const int64_t pad = (k + 1) / 2;
    // The k nearest integers to x form the window starting at ceil(x) - k/2 (k is even),
    // kept inside the padded range [-pad, in + pad).
    int64_t first = static_cast<int64_t>(std::ceil(x)) - k / 2;
    first = std::clamp<int64_t>(first, -pad, in + pad - k);
    if (s.exclude_outside) {  // taps off the input weigh 0, and the rest are renormalized
      double total = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = first + j;
        if (p < 0 || p >= in) c[static_cast<size_t>(j)] = 0;
        total += c[static_cast<size_t>(j)];
      }
      for (double& v : c) v /= total;
    }
    for (int64_t j = 0; j < k; ++j) {
      t.idx.push_back(std::clamp<int64_t>(first + j, 0, in - 1));
      t.w.push_back(c[static_cast<size_t>(j)]);
    }
    t.outside.push_back(s.transform == "tf_crop_and_resize" &&
                        (x < 0 || x > static_cast<double>(in - 1)));
  }
  return t;
}

// x resized along axis a by the taps: sum over j of x[idx_j] * w_j, with the positions outside
// the roi set to the extrapolation value. A tap of weights all 0 is skipped, and one of weights
// all 1 needs no multiply (nearest mode keeps integer dtypes exact).
Tensor apply_taps(const Tensor& x, int64_t a, const Taps& t, double extrapolation) {
  const auto out = static_cast<int64_t>(t.outside.size());
  const DType wd = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  Tensor y;
  for (int64_t j = 0; j < t.n; ++j) {
    std::vector<int64_t> idx;
    std::vector<double> w;
    bool zero = true, one = true;
    for (int64_t o = 0; o < out; ++o) {
      idx.push_back(t.idx[static_cast<size_t>(o * t.n + j)]);
      w.push_back(t.w[static_cast<size_t>(o * t.n + j)]);
      zero = zero && w.back() == 0;
      one = one && w.back() == 1;
    }
    if (zero) continue;
    Tensor term = index_select(x, a, i64s(idx, x.device()));
    if (!one) term = term * along(w, a, x.dim(), wd, x.device());
    y = y.defined() ? y + term : term;
  }
  if (!y.defined()) {  // every weight 0: only possible when every position is outside
    std::vector<int64_t> s = x.sizes().vec();
    s[static_cast<size_t>(a)] = out;
    y = full(Shape(s), 0, Options().dtype(x.dtype()).device(x.device()));
  }
  if (std::find(t.outside.begin(), t.outside.end(), true) != t.outside.end()) {
    std::vector<double> mask(t.outside.begin(), t.outside.end());
    Tensor m = along(mask, a, x.dim(), DType::f32, x.device()) > 0.5;
    y = where(m, full({}, extrapolation, Options().dtype(y.dtype()).device(y.device())), y);
  }
  return y;
}

// Whether the taps copy the input unchanged: same length, nothing outside, and each output
// position o weighs input o by 1 and every other input by 0.
bool identity(const Taps& t, int64_t in) {
  if (static_cast<int64_t>(t.outside.size()) != in) return false;
  for (int64_t o = 0; o < in; ++o) {
    if (t.outside[static_cast<size_t>(o)]) return false;
    double self = 0;
    for (int64_t j = 0; j < t.n; ++j) {
      const auto k = static_cast<size_t>(o * t.n + j);
      if (t.idx[k] == o)
        self += t.w[k];
      else if (t.w[k] != 0)
        return false;
    }
    if (self != 1) return false;
  }
  return true;
}

// Resizes x: per axis a scale (and, with sizes, the size) and a roi [start, end].
Tensor resize(const Node& n, const Tensor& x, const ResizeSpec& s,
              const std::vector<double>& scales, const std::vector<int64_t>& sizes,
              const std::vector<double>& roi) {
  const int64_t r = x.dim();
  Tensor y = x;
  for (int64_t a = 0; a < r; ++a) {
    const auto i = static_cast<size_t>(a);
    const int64_t in = x.sizes()[a], out = sizes[i];
    if (in == 0 || out == 0) n.fail(fmt::format("axis {} resizes {} to {}", a, in, out));
    if (!(scales[i] > 0)) n.fail(fmt::format("the scale of axis {} is {}", a, scales[i]));
    const Taps t = axis_taps(n, s, in, out, scales[i], roi[i], roi[i + static_cast<size_t>(r)]);
    if (!identity(t, in)) y = apply_taps(y, a, t, s.extrapolation);
  }
  if (y.dtype() != x.dtype()) y = as(y, x.dtype());
  return y;
}

void check_choice(const Node& n, const char* what, const std::string& v,
                  std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a) return;
  n.fail(fmt::format("{} \"{}\" is not supported", what, v));
}

ResizeSpec resize_spec(const Node& n) {
  ResizeSpec s;
  s.mode = n.attr_s("mode", "nearest");
  check_choice(n, "mode", s.mode, {"nearest", "linear", "cubic"});
  const bool legacy = n.op() == "Upsample" || n.opset() < 11;
  if (legacy) {
    // Upsample and opset-10 Resize: asymmetric coordinates; nearest rounds down when
    // upsampling and up when downsampling (as ONNX Runtime); no cubic.
    if (s.mode == "cubic") n.fail("mode \"cubic\" needs Resize of opset 11 or later");
    s.transform = "asymmetric";
    s.nearest = "simple";
    return s;
  }
  s.transform = n.attr_s("coordinate_transformation_mode", "half_pixel");
  check_choice(n, "coordinate_transformation_mode", s.transform,
               {"half_pixel", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn",
                "align_corners", "half_pixel_symmetric", "tf_crop_and_resize"});
  s.nearest = n.attr_s("nearest_mode", "round_prefer_floor");
  check_choice(n, "nearest_mode", s.nearest,
               {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"});
  s.cubic_a = n.attr_f("cubic_coeff_a", -0.75);
  s.exclude_outside = n.attr_i("exclude_outside", 0) != 0;
  s.extrapolation = n.attr_f("extrapolation_value", 0.0);
  s.antialias = n.attr_i("antialias", 0) != 0;
  if (s.antialias && s.mode == "nearest") n.fail("antialias needs mode linear or cubic");
  return s;
}

// The per-axis values of a Resize input that names only `axes` (opset 18): the others get
// `fill`. `per` is the count of values per axis (2 for roi: starts, then ends).
std::vector<double> on_axes(const Node& n, const std::vector<double>& v,
                            const std::vector<int64_t>& axes, int64_t r, int per, double fill0,
                            double fill1) {
  const size_t k = axes.size();
  if (v.size() != per * k) n.fail(fmt::format("{} values for {} axes", v.size(), k));
  std::vector<double> all(static_cast<size_t>(per * r));
  for (int64_t a = 0; a < r; ++a) {
    all[static_cast<size_t>(a)] = fill0;
    if (per == 2) all[static_cast<size_t>(a + r)] = fill1;
  }
  for (size_t i = 0; i < k; ++i) {
    all[static_cast<size_t>(axes[i])] = v[i];
    if (per == 2) all[static_cast<size_t>(axes[i] + r)] = v[i + k];
  }
  return all;
}

V op_resize(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t r = x.dim();
  const ResizeSpec s = resize_spec(n);
  // Inputs: opset 10 (X, scales); Upsample-9 (X, scales); Upsample-7 scales attribute;
  // opset 11+ (X, roi, scales, sizes), where empty tensors stand for omitted inputs.
  const bool legacy = n.op() == "Upsample" || n.opset() < 11;
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (n.op() == "Upsample" && n.opset() < 9) {
    for (float f : n.attr_floats("scales")) scales.push_back(f);
  } else if (legacy) {
    scales = numbers(n, 1);
  } else {
    if (n.has(1) && n.in(1).numel()) roi = numbers(n, 1);
    if (n.has(2) && n.in(2).numel()) scales = numbers(n, 2);
    if (n.has(3) && n.in(3).numel()) sizes = n.ints(3);
  }
  if (scales.empty() == sizes.empty()) n.fail("exactly one of scales and sizes must be given");
  std::vector<int64_t> axes;
  for (int64_t a : n.attr_ints("axes")) axes.push_back(n.axis(a, r));
  const bool all_axes = axes.empty();
  if (all_axes)
    for (int64_t a = 0; a < r; ++a) axes.push_back(a);
  if (!scales.empty() && !all_axes) scales = on_axes(n, scales, axes, r, 1, 1.0, 0.0);
  if (roi.empty())
    roi = on_axes(n, {}, {}, r, 2, 0.0, 1.0);
  else if (!all_axes)
    roi = on_axes(n, roi, axes, r, 2, 0.0, 1.0);
  if (static_cast<int64_t>(roi.size()) != 2 * r) n.fail("roi must hold 2 values per axis");
  std::vector<int64_t> shape = x.sizes().vec();
  if (!sizes.empty()) {
    if (sizes.size() != axes.size()) n.fail("sizes must hold one value per axis");
    // keep_aspect_ratio_policy (opset 18): one scale for all the axes, the smallest or the
    // largest, and sizes rounded half up from it.
    const std::string policy = n.attr_s("keep_aspect_ratio_policy", "stretch");
    check_choice(n, "keep_aspect_ratio_policy", policy, {"stretch", "not_larger", "not_smaller"});
    scales.assign(static_cast<size_t>(r), 1.0);
    double common = policy == "not_larger" ? INFINITY : 0;
    for (size_t i = 0; i < axes.size(); ++i) {
      const double sc = static_cast<double>(sizes[i]) / static_cast<double>(shape[axes[i]]);
      scales[static_cast<size_t>(axes[i])] = sc;
      common = policy == "not_larger" ? std::min(common, sc) : std::max(common, sc);
    }
    for (size_t i = 0; i < axes.size(); ++i) {
      const auto a = static_cast<size_t>(axes[i]);
      if (policy == "stretch") {
        shape[a] = sizes[i];
      } else {
        scales[a] = common;
        shape[a] = static_cast<int64_t>(common * static_cast<double>(shape[a]) + 0.5);
      }
    }
  } else {
    if (static_cast<int64_t>(scales.size()) != r) n.fail("scales must hold one value per axis");
    std::vector<double> want(static_cast<size_t>(r));
    for (int64_t a = 0; a < r; ++a)
      want[static_cast<size_t>(a)] = std::floor(scales[a] * static_cast<double>(shape[a]));
    check_fits(n, "the output", want, x.dtype());
    for (int64_t a = 0; a < r; ++a) shape[a] = static_cast<int64_t>(want[static_cast<size_t>(a)]);
  }
  // The sizes, before the taps of each axis are computed for them on the host.
  check_fits(n, "the output", std::vector<double>(shape.begin(), shape.end()), x.dtype());
  return {resize(n, x, s, scales, shape, roi)};
}

// ---- ConvTranspose ----

// x with s - 1 zeros inserted between neighbours along dim a (a transposed convolution's
// stride): (..., in, ...) -> (..., (in - 1) * s + 1, ...).
Tensor dilate(const Tensor& x, int64_t a, int64_t s) {
  if (s == 1) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  const int64_t in = shape[static_cast<size_t>(a)];
  Tensor e = unsqueeze(x, a + 1);  // (..., in, 1, ...)
  std::vector<int64_t> zs = e.sizes().vec();
  zs[static_cast<size_t>(a + 1)] = s - 1;
  e = cat({e, full(Shape(zs), 0, Options().dtype(x.dtype()).device(x.device()))}, a + 1);
  shape[static_cast<size_t>(a)] = in * s;
  return slice(reshape(e, Shape(shape)), a, 0, (in - 1) * s + 1);
}

// The pads (begin, end per spatial dim) and output sizes of a ConvTranspose node: output_shape,
// when given, decides the pads (auto_pad SAME_UPPER puts the odd one at the end, else at the
// start), and SAME_* without it asks for in * stride.
struct TransposedWindow {
  std::vector<int64_t> kernel, strides, dilations, out_pad, begin, end, out;
};

TransposedWindow transposed_window(const Node& n, const Tensor& x, const Tensor& w) {
  const auto D = static_cast<size_t>(x.dim() - 2);
  TransposedWindow t;
  t.kernel = n.attr_ints("kernel_shape");
  if (t.kernel.empty())
    for (int64_t i = 2; i < w.dim(); ++i) t.kernel.push_back(w.sizes()[i]);
  t.strides = n.attr_ints("strides");
  t.dilations = n.attr_ints("dilations");
  t.out_pad = n.attr_ints("output_padding");
  std::vector<int64_t> pads = n.attr_ints("pads"), shape = n.attr_ints("output_shape");
  t.strides.resize(D, 1);
  t.dilations.resize(D, 1);
  t.out_pad.resize(D, 0);
  pads.resize(2 * D, 0);
  if (t.kernel.size() != D || w.dim() != x.dim())
    n.fail(fmt::format("a kernel {} for an input of rank {}", w.sizes(), x.dim()));
  for (size_t i = 0; i < D; ++i)
    if (t.kernel[i] != w.sizes()[static_cast<int64_t>(i) + 2])
      n.fail(fmt::format("kernel_shape does not match the weight {}", w.sizes()));
  if (shape.size() == D + 2) shape.erase(shape.begin(), shape.begin() + 2);  // N, C given too
  const std::string autopad = n.attr_s("auto_pad", "NOTSET");
  check_choice(n, "auto_pad", autopad, {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"});
  for (size_t i = 0; i < D; ++i) {
    const int64_t in = x.sizes()[static_cast<int64_t>(i) + 2];
    const int64_t full_len =
        t.strides[i] * (in - 1) + t.out_pad[i] + (t.kernel[i] - 1) * t.dilations[i] + 1;
    int64_t b = pads[i], e = pads[i + D];
    if (autopad == "VALID") b = e = 0;
    int64_t want = -1;
    if (!shape.empty())
      want = shape.at(i);
    else if (autopad == "SAME_UPPER" || autopad == "SAME_LOWER")
      want = in * t.strides[i];
    if (want >= 0) {
      // The halves round down, also for total < 0 (an output longer than the full one, its
      // extra positions zero): floor division, as the reference.
      const int64_t total = full_len - want;
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      b = autopad == "SAME_UPPER" ? half : total - half;
      e = total - b;
    }
    if (full_len - b - e <= 0) n.fail(fmt::format("the output of spatial dim {} is empty", i));
    t.begin.push_back(b);
    t.end.push_back(e);
    t.out.push_back(full_len - b - e);
  }
  return t;
}

bool is_conv_transpose2d(const TransposedWindow& t) {
  if (t.kernel.size() != 2 || t.begin != t.end) return false;
  for (size_t i = 0; i < 2; ++i)
    if (t.begin[i] < 0 || t.out_pad[i] < 0 ||
        (t.out_pad[i] >= t.strides[i] && t.out_pad[i] >= t.dilations[i]))
      return false;
  return true;
}

// A transposed convolution is the convolution (stride 1) of the input dilated by the strides
// and padded by dilation * (kernel - 1) - pad on each side (output_padding more at the end),
// with the kernel flipped and its in/out channels swapped. Each kernel offset is a slice of the
// padded input; the (channel, offset) sums are one batched matmul per group, as in op_conv.
V op_conv_transpose(const Node& n) {
  const Tensor &x = n.in(0), &w = n.in(1);
  if (x.dim() < 3) n.fail(fmt::format("the input has rank {}, not N, C and spatial dims", x.dim()));
  const TransposedWindow t = transposed_window(n, x, w);
  const int64_t D = x.dim() - 2, N = x.sizes()[0], C = x.sizes()[1], G = n.attr_i("group", 1);
  if (G < 1 || C % G || w.sizes()[0] != C)
    n.fail(fmt::format("input channels {}, weight {} and group {} do not fit", C, w.sizes(), G));
  const int64_t Cg = C / G, Mg = w.sizes()[1], M = Mg * G;
  // (The kernels' transposed convolutions, oneDNN's on the CPU, where conv_transpose2d
  // expresses the node: two spatial dims, the same padding before and after each, an output
  // padding below the stride or the dilation.)
  if (is_conv_transpose2d(t) && is_floating(x.dtype()) && w.dtype() == x.dtype())
    return {conv_transpose2d(x, w, n.has(2) ? n.in(2) : Tensor(), {t.strides[0], t.strides[1]},
                             {t.begin[0], t.begin[1]}, {t.out_pad[0], t.out_pad[1]}, G,
                             {t.dilations[0], t.dilations[1]})};
  Tensor p = x;
  std::vector<int64_t> pads(static_cast<size_t>(2 * x.dim()), 0);
  for (int64_t i = 0; i < D; ++i) {
    const auto u = static_cast<size_t>(i);
    p = dilate(p, i + 2, t.strides[u]);
    const int64_t reach = t.dilations[u] * (t.kernel[u] - 1);
    pads[u + 2] = reach - t.begin[u];
    pads[u + 2 + static_cast<size_t>(x.dim())] = reach - t.end[u] + t.out_pad[u];
  }
  p = pad_nd(n, p, pads, "constant", full({}, 0, Options().dtype(x.dtype()).device(x.device())));
  int64_t K = 1, L = 1;
  for (int64_t i = 0; i < D; ++i) K *= t.kernel[static_cast<size_t>(i)];
  for (int64_t o : t.out) L *= o;
  std::vector<Tensor> parts;  // one strided view per kernel offset, row-major over the kernel
  for (int64_t k = 0; k < K; ++k) {
    Tensor s = p;
    int64_t rest = k;
    for (int64_t i = D; i-- > 0;) {
      const auto u = static_cast<size_t>(i);
      const int64_t start = (rest % t.kernel[u]) * t.dilations[u];
      rest /= t.kernel[u];
      s = slice(s, i + 2, start, start + t.out[u]);
    }
    parts.push_back(s);
  }
  Tensor cols = reshape(stack(parts, 0), {K, N, G, Cg, L});
  cols = reshape(permute(cols, {1, 2, 3, 0, 4}), {N, G, Cg * K, L});
  // The weight (C, M/G, k...) flipped in space, as (G, M/G, C/G * K).
  Tensor wf = w;
  for (int64_t i = 0; i < D; ++i) wf = flip(wf, i + 2);
  wf = reshape(permute(reshape(wf, {G, Cg, Mg, K}), {0, 2, 1, 3}), {G, Mg, Cg * K});
  const bool fl = is_floating(x.dtype());
  Tensor y =
      fl ? matmul(wf, cols) : as(matmul(as(wf, DType::f64), as(cols, DType::f64)), x.dtype());
  std::vector<int64_t> out{N, M};
  out.insert(out.end(), t.out.begin(), t.out.end());
  y = reshape(y, Shape(out));
  if (n.has(2)) {
    std::vector<int64_t> bs(static_cast<size_t>(y.dim()), 1);
    bs[1] = M;
    y = y + reshape(n.in(2), Shape(bs));
  }
  return {y};
}

// ---- GridSample ----
//
// The sampling positions are data (the grid), so they are computed with duet ops: per spatial
// axis, the source coordinate of each output position and its taps (index and weight); a tap
// combination (one tap per axis) reads the input flattened over its spatial dims with gather.

// v reflected at the borders lo and hi until it lies between them (PyTorch's grid_sample).
Tensor reflect(const Tensor& v, double lo, double hi) {
  const double span = hi - lo;
  if (span <= 0) return v * 0 + lo;
  // dx: how far v lies past the nearer border; k whole spans of it fold back and forth, and the
  // remainder r is measured from that border after an even k, from the other after an odd one.
  Tensor below = v < lo;
  Tensor dx = where(below, lo - v, v - hi);
  Tensor k = floor(dx / span);
  Tensor r = dx - k * span;
  Tensor odd = (k - floor(k / 2) * 2) > 0.5;
  Tensor from_lo = where(odd, hi - r, lo + r), from_hi = where(odd, lo + r, hi - r);
  return where(below, from_lo, where(v > hi, from_hi, v));
}

// Rounds halves to even (std::nearbyint), as PyTorch's nearest grid sampling.
Tensor round_even(const Tensor& x) {
  Tensor r = floor(x + 0.5);
  Tensor tie_odd = logical_and_((r - x) == 0.5, (r - floor(r / 2) * 2) > 0.5);
  return where(tie_odd, r - 1, r);
}

struct GridTap {
  Tensor index;   // i64, the position read along the axis
  Tensor weight;  // undefined for 1
  Tensor valid;   // b8, undefined when always (padding_mode zeros reads 0 outside)
};

struct GridSampleSpec {
  std::string mode, padding;
  bool align = false;
};

// The tap at integer position i (a float tensor) of an axis of `len` elements.
GridTap grid_tap(const GridSampleSpec& s, const Tensor& i, int64_t len, double lo, double hi,
                 Tensor weight) {
  const double last = static_cast<double>(len - 1);
  GridTap t;
  t.weight = std::move(weight);
  if (s.padding == "zeros") t.valid = logical_and_(i >= 0, i <= last);
  Tensor at = s.padding == "reflection" ? floor(reflect(i, lo, hi) + 0.5) : i;
  t.index = as(clamp(at, 0.0, last), DType::i64);
  return t;
}

// The taps of one spatial axis for normalized coordinates g (in [-1, 1] across the axis).
std::vector<GridTap> grid_axis_taps(const GridSampleSpec& s, const Tensor& g, int64_t len) {
  const auto L = static_cast<double>(len);
  // The borders: the centres of the end elements with align_corners, else their outer edges.
  const double lo = s.align ? 0 : -0.5, hi = s.align ? L - 1 : L - 0.5;
  Tensor x = s.align ? (g + 1) / 2 * (L - 1) : ((g + 1) * L - 1) / 2;
  if (s.mode == "nearest") x = round_even(x);
  // A coordinate beyond the borders moves onto them (border) or is mirrored (reflection).
  Tensor outside = as(x >= lo, DType::i32) + as(x <= hi, DType::i32) < 2;
  if (s.padding == "border") x = where(outside, clamp(x, 0.0, L - 1), x);
  if (s.padding == "reflection") x = where(outside, reflect(x, lo, hi), x);
  if (s.mode == "nearest") return {grid_tap(s, x, len, lo, hi, {})};
  Tensor x0 = floor(x), t = x - x0;
  std::vector<GridTap> taps;
  if (s.mode == "linear") {
    taps.push_back(grid_tap(s, x0, len, lo, hi, 1 - t));
    taps.push_back(grid_tap(s, x0 + 1, len, lo, hi, t));
    return taps;
  }
  // Cubic convolution (Keys, A = -0.75) on the taps x0 - 1 ... x0 + 2.
  const double A = -0.75;
  auto near = [&](const Tensor& d) { return ((d * (A + 2) - (A + 3)) * d) * d + 1; };
  auto far = [&](const Tensor& d) { return ((d * A - 5 * A) * d + 8 * A) * d - 4 * A; };
  const Tensor w[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
  for (int j = 0; j < 4; ++j) taps.push_back(grid_tap(s, x0 + (j - 1), len, lo, hi, w[j]));
  return taps;
}

V op_grid_sample(const Node& n) {
  const Tensor &x = n.in(0), &grid = n.in(1);
  const int64_t D = x.dim() - 2;
  if (D < 1 || grid.dim() != x.dim() || grid.sizes()[x.dim() - 1] != D ||
      grid.sizes()[0] != x.sizes()[0])
    n.fail(fmt::format("input {} and grid {} do not fit (N, C, D1...Dn) and (N, d1...dn, n)",
                       x.sizes(), grid.sizes()));
  GridSampleSpec s;
  s.mode = n.attr_s("mode", n.opset() < 20 ? "bilinear" : "linear");
  if (s.mode == "bilinear") s.mode = "linear";
  if (s.mode == "bicubic") s.mode = "cubic";
  check_choice(n, "mode", s.mode, {"nearest", "linear", "cubic"});
  s.padding = n.attr_s("padding_mode", "zeros");
  check_choice(n, "padding_mode", s.padding, {"zeros", "border", "reflection"});
  s.align = n.attr_i("align_corners", 0) != 0;
  const int64_t N = x.sizes()[0], C = x.sizes()[1];
  int64_t P = 1, Lx = 1;
  for (int64_t i = 1; i < grid.dim() - 1; ++i) P *= grid.sizes()[i];
  for (int64_t i = 2; i < x.dim(); ++i) Lx *= x.sizes()[i];
  const Tensor g =
      reshape(as(grid, is_floating(grid.dtype()) ? grid.dtype() : DType::f32), {N, 1, P, D});
  // Per spatial axis d, its taps; the grid lists the coordinates innermost axis first.
  std::vector<std::vector<GridTap>> axes;
  for (int64_t d = 0; d < D; ++d)
    axes.push_back(
        grid_axis_taps(s, reshape(slice(g, 3, D - 1 - d, D - d), {N, 1, P}), x.sizes()[d + 2]));
  const Tensor flat = reshape(x, {N, C, Lx});
  Tensor y;
  const auto T = static_cast<int64_t>(axes[0].size());
  int64_t combos = 1;
  for (int64_t d = 0; d < D; ++d) combos *= T;
  for (int64_t c = 0; c < combos; ++c) {  // one tap per axis: c's digits in base T
    Tensor index, weight, valid;
    int64_t rest = c, stride = 1;
    for (int64_t d = D; d-- > 0;) {
      const GridTap& t = axes[static_cast<size_t>(d)][static_cast<size_t>(rest % T)];
      rest /= T;
      index = index.defined() ? index + t.index * stride : t.index * stride;
      stride *= x.sizes()[d + 2];
      if (t.weight.defined()) weight = weight.defined() ? weight * t.weight : t.weight;
      if (t.valid.defined()) valid = valid.defined() ? logical_and_(valid, t.valid) : t.valid;
    }
    Tensor v = gather(flat, 2, expand(index, {N, C, P}).contiguous());
    if (weight.defined()) v = v * as(weight, v.dtype());
    if (valid.defined())
      v = where(valid, v, full({}, 0, Options().dtype(v.dtype()).device(v.device())));
    y = y.defined() ? y + v : v;
  }
  std::vector<int64_t> out{N, C};
  for (int64_t i = 1; i < grid.dim() - 1; ++i) out.push_back(grid.sizes()[i]);
  return {reshape(as(y, x.dtype()), Shape(out))};
}

// ---- MaxUnpool ----

// Each x value goes to its index (flat over N, C and the spatial dims of the inferred output
// (in - 1) * stride + kernel - pads); that tensor then sits in the leading corner of
// output_shape, when given, as the ONNX reference does. An index written more than once (from
// overlapping pool windows, where the values agree) gets their mean.
V op_max_unpool(const Node& n) {
  const Tensor &x = n.in(0), &idx = n.in(1);
  if (x.dim() < 3 || idx.sizes() != x.sizes())
    n.fail(fmt::format("input {} and indices {} must have one shape (N, C, D1...)", x.sizes(),
                       idx.sizes()));
  const auto D = static_cast<size_t>(x.dim() - 2);
  std::vector<int64_t> kernel = n.attr_ints("kernel_shape"), strides = n.attr_ints("strides"),
                       pads = n.attr_ints("pads");
  if (kernel.size() != D) n.fail("kernel_shape must hold one value per spatial dim");
  strides.resize(D, 1);
  pads.resize(2 * D, 0);
  std::vector<int64_t> inferred{x.sizes()[0], x.sizes()[1]};
  for (size_t i = 0; i < D; ++i)
    inferred.push_back((x.sizes()[static_cast<int64_t>(i) + 2] - 1) * strides[i] + kernel[i] -
                       pads[i] - pads[i + D]);
  int64_t total = 1;
  for (int64_t d : inferred) total *= d;
  const Options o = Options().dtype(x.dtype()).device(x.device());
  const Tensor flat_idx = reshape(as(idx, DType::i64), {x.numel()});
  Tensor y = scatter_add(full({total}, 0, o), 0, flat_idx, reshape(x, {x.numel()}));
  Tensor hits = scatter_add(full({total}, 0, o), 0, flat_idx, full({x.numel()}, 1, o));
  y = reshape(where(hits > 1, y / clamp(hits, 1, INFINITY), y), Shape(inferred));
  if (n.has(2)) {
    const std::vector<int64_t> shape = n.ints(2);
    if (shape.size() != inferred.size()) n.fail("output_shape must hold one value per dim");
    std::vector<int64_t> p(2 * inferred.size(), 0);
    for (size_t i = 0; i < inferred.size(); ++i) p[i + inferred.size()] = shape[i] - inferred[i];
    y = pad_nd(n, y, p, "constant", full({}, 0, o));
  }
  return {as(y, x.dtype())};
}

// ---- RoiAlign ----

// One axis of RoiAlign's bilinear samples: per roi (R), bin (P) and sample in the bin (S), the
// two taps (index, weight), as the reference computes them: a sample more than one element
// outside the map weighs 0, one between -1 and 0 reads element 0, one past the last element
// reads the last.
struct RoiAxis {
  Tensor low, high, w_low, w_high, valid;  // (R, P, S)
};

RoiAxis roi_axis(const Tensor& start, const Tensor& extent, int64_t bins, int64_t samples,
                 int64_t len) {
  std::vector<double> g;  // p + (i + 0.5) / S, in bins
  for (int64_t p = 0; p < bins; ++p)
    for (int64_t i = 0; i < samples; ++i)
      g.push_back(static_cast<double>(p) +
                  (static_cast<double>(i) + 0.5) / static_cast<double>(samples));
  const Tensor grid =
      reshape(tensor(g, Options().dtype(start.dtype()).device(start.device())), {1, bins, samples});
  const Tensor c =
      reshape(start, {-1, 1, 1}) + grid * reshape(extent / static_cast<double>(bins), {-1, 1, 1});
  const auto last = static_cast<double>(len - 1);
  RoiAxis a;
  a.valid = logical_and_(c >= -1.0, c <= static_cast<double>(len));
  Tensor y = clamp(c, 0.0, INFINITY);
  Tensor low = floor(y);
  Tensor at_end = low >= last;  // both taps on the last element
  low = where(at_end, full({}, last, Options().dtype(low.dtype()).device(low.device())), low);
  y = where(at_end, low, y);
  const Tensor l = y - low;
  a.low = as(low, DType::i64);
  a.high = as(where(at_end, low, low + 1), DType::i64);
  a.w_low = 1 - l;
  a.w_high = l;
  return a;
}

V op_roi_align(const Node& n) {
  const Tensor &x = n.in(0), &rois = n.in(1), &batch = n.in(2);
  if (x.dim() != 4 || rois.dim() != 2 || rois.sizes()[1] != 4 || batch.dim() != 1 ||
      batch.sizes()[0] != rois.sizes()[0])
    n.fail(
        fmt::format("input {}, rois {} and batch_indices {} do not fit (N, C, H, W), (R, 4), (R)",
                    x.sizes(), rois.sizes(), batch.sizes()));
  const std::string mode = n.attr_s("mode", "avg");
  check_choice(n, "mode", mode, {"avg", "max"});
  const std::string ctm = n.attr_s("coordinate_transformation_mode",
                                   n.opset() < 16 ? "output_half_pixel" : "half_pixel");
  check_choice(n, "coordinate_transformation_mode", ctm, {"half_pixel", "output_half_pixel"});
  const int64_t PH = n.attr_i("output_height", 1), PW = n.attr_i("output_width", 1);
  const int64_t S = n.attr_i("sampling_ratio", 0);
  // sampling_ratio 0 samples ceil(roi size / bins) points per bin: a count that depends on the
  // rois' values, so the shapes would too.
  if (S <= 0) n.fail("sampling_ratio 0 (adaptive, from the rois' values) is not supported");
  const double scale = n.attr_f("spatial_scale", 1.0), offset = ctm == "half_pixel" ? 0.5 : 0.0;
  const int64_t R = rois.sizes()[0], C = x.sizes()[1], H = x.sizes()[2], W = x.sizes()[3];
  if (PH < 1 || PW < 1) n.fail(fmt::format("an output of {} x {} bins", PH, PW));
  check_fits(n, "the samples", {1.0 * R, 1.0 * C, 1.0 * PH * S, 1.0 * PW * S}, x.dtype());
  const Tensor r = as(rois, is_floating(x.dtype()) ? x.dtype() : DType::f32);
  auto col = [&](int64_t j) { return reshape(slice(r, 1, j, j + 1), {R}) * scale - offset; };
  Tensor x0 = col(0), y0 = col(1), w = col(2) - x0, h = col(3) - y0;
  if (offset == 0) w = clamp(w, 1.0, INFINITY), h = clamp(h, 1.0, INFINITY);  // malformed: 1x1
  const RoiAxis ay = roi_axis(y0, h, PH, S, H), ax = roi_axis(x0, w, PW, S, W);
  // (R, PH, S, 1, 1) and (R, 1, 1, PW, S) meet in (R, PH, S, PW, S), flattened to Q.
  auto ys = [](const Tensor& t) { return unsqueeze(unsqueeze(t, 3), 4); };
  auto xs = [](const Tensor& t) { return unsqueeze(unsqueeze(t, 1), 2); };
  const Tensor valid = logical_and_(ys(ay.valid), xs(ax.valid));
  const int64_t Q = PH * S * PW * S;
  const Tensor xr = index_select(reshape(x, {x.sizes()[0], C, H * W}), 0,
                                 reshape(as(batch, DType::i64), {R}));  // (R, C, H*W)
  std::vector<Tensor> taps;
  for (const auto& [iy, wy] : {std::pair{ay.low, ay.w_low}, std::pair{ay.high, ay.w_high}}) {
    for (const auto& [ix, wx] : {std::pair{ax.low, ax.w_low}, std::pair{ax.high, ax.w_high}}) {
      const Tensor pos = reshape(ys(iy) * W + xs(ix), {R, 1, Q});
      const Tensor wt = where(valid, ys(wy) * xs(wx), 0.0);
      const Tensor v = gather(xr, 2, expand(pos, {R, C, Q}).contiguous());
      taps.push_back(v * as(reshape(wt, {R, 1, Q}), v.dtype()));
    }
  }
  Tensor y;
  if (mode == "avg") {
    y = reshape(taps[0] + taps[1] + taps[2] + taps[3], {R, C, PH, S, PW, S});
    y = sum(y, Dims{3, 5}) / static_cast<double>(S * S);
  } else {  // the reference's max: of the weighted taps, over the samples
    y = reshape(max(stack(taps, 0), Dims{0}), {R, C, PH, S, PW, S});
    y = max(y, Dims{3, 5});
  }
  return {as(y, x.dtype())};
}

}  // namespace

std::vector<OpEntry> image_ops() {
  return {
      {"Resize", op_resize},
      {"Upsample", op_resize},
      {"ConvTranspose", op_conv_transpose},
      {"GridSample", op_grid_sample},
      {"MaxUnpool", op_max_unpool},
      {"RoiAlign", op_roi_align},
  };
}

}  // namespace duet::detail::onnx_import
