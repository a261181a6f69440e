// ONNX import, the neural-network ops: normalizations, convolution, pooling and the losses, each
// written in duet's public ops (Conv as duet's conv2d or an unfold + matmul, pools over the
// windows of an unfold). Semantics follow the ONNX operator specification, opset by opset.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "core/ops.h"
#include "trace/onnx/onnx_import.h"
#include "trace/onnx/onnx_proto.h"

namespace duet::detail::onnx_import {

namespace {

using V = std::vector<Tensor>;
namespace io = onnx_io;

// ---- normalization ----

V op_layer_norm(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", -1), x.dim());
  const double eps = n.attr_f("epsilon", 1e-5);
  std::vector<int64_t> axes;
  for (int64_t i = a; i < x.dim(); ++i) axes.push_back(i);
  Tensor mu = mean(x, Dims(axes), true);
  Tensor c = x - mu;
  Tensor inv = rsqrt(mean(c * c, Dims(axes), true) + eps);
  Tensor y = c * inv * n.in(1);
  if (n.has(2)) y = y + n.in(2);
  return {y, mu, inv};
}

// A per-channel vector (C) shaped to broadcast along dim 1 of a rank-r tensor.
Tensor channel(const Tensor& v, int64_t r) {
  std::vector<int64_t> s(static_cast<size_t>(r), 1);
  s[1] = v.numel();
  return reshape(v, Shape(s));
}

V op_batch_norm(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t r = x.dim();
  const double eps = n.attr_f("epsilon", 1e-5);
  Tensor scale = channel(n.in(1), r), bias = channel(n.in(2), r);
  const bool training = n.attr_i("training_mode", 0) != 0;
  if (!training) {
    Tensor y = (x - channel(n.in(3), r)) * rsqrt(channel(n.in(4), r) + eps) * scale + bias;
    return {y};
  }
  std::vector<int64_t> axes{0};
  for (int64_t i = 2; i < r; ++i) axes.push_back(i);
  Tensor mu = mean(x, Dims(axes), true);
  Tensor var = mean((x - mu) * (x - mu), Dims(axes), true);
  Tensor y = (x - mu) * rsqrt(var + eps) * scale + bias;
  const double m = n.attr_f("momentum", 0.9);
  Tensor rm = n.in(3) * m + reshape(mu, {-1}) * (1 - m);
  Tensor rv = n.in(4) * m + reshape(var, {-1}) * (1 - m);
  return {y, rm, rv};
}

V op_instance_norm(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<int64_t> axes;
  for (int64_t i = 2; i < x.dim(); ++i) axes.push_back(i);
  Tensor mu = mean(x, Dims(axes), true);
  Tensor var = mean((x - mu) * (x - mu), Dims(axes), true);
  Tensor y = (x - mu) * rsqrt(var + n.attr_f("epsilon", 1e-5));
  return {y * channel(n.in(1), x.dim()) + channel(n.in(2), x.dim())};
}

V op_mvn(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<int64_t> axes = n.attr_ints("axes");
  if (axes.empty()) axes = {0, 2, 3};
  for (int64_t& a : axes) a = n.axis(a, x.dim());
  Tensor mu = mean(x, Dims(axes), true);
  Tensor var = mean(x * x, Dims(axes), true) - mu * mu;
  return {(x - mu) / (sqrt(var) + 1e-9)};
}

V op_lrn(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t size = n.attr_i("size", 1);
  const double alpha = n.attr_f("alpha", 1e-4), beta = n.attr_f("beta", 0.75),
               bias = n.attr_f("bias", 1.0);
  // The window, cut to the channels: beyond them it sums only zeros (a size of 2^31 included).
  const int64_t C = x.sizes()[1], lo = std::min((size - 1) / 2, C),
                hi = std::min(size - 1 - (size - 1) / 2, C);
  std::vector<int64_t> pads(static_cast<size_t>(2 * x.dim()), 0);
  pads[1] = lo;
  pads[static_cast<size_t>(x.dim() + 1)] = hi;
  Tensor sq = pad_nd(n, x * x, pads, "constant", full({}, 0, like(x)));
  Tensor s = slice(sq, 1, 0, C);
  for (int64_t k = 1; k <= lo + hi; ++k) s = s + slice(sq, 1, k, k + C);
  return {x / pow(s * (alpha / static_cast<double>(size)) + bias, beta)};
}

// ---- convolution and pooling ----

// The windows of a conv or pool node: kernel, strides, dilations and the pads of each spatial
// dim, with auto_pad resolved, and the output sizes.
struct Window {
  std::vector<int64_t> kernel, strides, dilations, pad_begin, pad_end, out;
};

Window window(const Node& n, const Tensor& x, std::vector<int64_t> kernel, bool ceil_mode) {
  const size_t D = kernel.size();
  Window w;
  w.kernel = kernel;
  w.strides = n.attr_ints("strides");
  w.dilations = n.attr_ints("dilations");
  w.strides.resize(D, 1);
  w.dilations.resize(D, 1);
  std::vector<int64_t> pads = n.attr_ints("pads");
  pads.resize(2 * D, 0);
  const std::string autopad = n.attr_s("auto_pad", "NOTSET");
  for (size_t i = 0; i < D; ++i) {
    const int64_t in = x.sizes()[static_cast<int64_t>(i) + 2];
    const int64_t span = w.dilations[i] * (kernel[i] - 1) + 1;
    int64_t b = pads[i], e = pads[i + D];
    if (autopad == "SAME_UPPER" || autopad == "SAME_LOWER") {
      const int64_t out = (in + w.strides[i] - 1) / w.strides[i];
      const int64_t total = std::max<int64_t>((out - 1) * w.strides[i] + span - in, 0);
      b = autopad == "SAME_UPPER" ? total / 2 : total - total / 2;
      e = total - b;
    } else if (autopad == "VALID") {
      b = e = 0;
    }
    const int64_t room = in + b + e - span;
    if (room < 0) n.fail(fmt::format("the window ({}) is larger than the padded input", span));
    int64_t out = (ceil_mode ? (room + w.strides[i] - 1) / w.strides[i] : room / w.strides[i]) + 1;
    // A last window must start inside the input or its left padding (as the spec's ceil mode).
    if (ceil_mode && (out - 1) * w.strides[i] >= in + b) --out;
    w.pad_begin.push_back(b);
    w.pad_end.push_back(e);
    w.out.push_back(out);
  }
  return w;
}

// x padded for the window (with `value`, and on the right as far as the last window reaches),
// then one strided slice per kernel offset, stacked in front: (K, N, C, out...).
Tensor windows(const Node& n, const Tensor& x, const Window& w, double value) {
  const size_t D = w.kernel.size();
  std::vector<int64_t> pads(static_cast<size_t>(2 * x.dim()), 0);
  for (size_t i = 0; i < D; ++i) {
    const int64_t in = x.sizes()[static_cast<int64_t>(i) + 2];
    const int64_t need = (w.out[i] - 1) * w.strides[i] + w.dilations[i] * (w.kernel[i] - 1) + 1;
    pads[i + 2] = w.pad_begin[i];
    pads[i + 2 + static_cast<size_t>(x.dim())] =
        std::max<int64_t>(need - in - w.pad_begin[i], w.pad_end[i]);
  }
  Tensor p = pad_nd(n, x, pads, "constant", full({}, value, like(x)));
  const int64_t K = prod(w.kernel);
  std::vector<Tensor> parts;
  for (int64_t k = 0; k < K; ++k) {
    Tensor s = p;
    int64_t rest = k;
    for (size_t i = D; i-- > 0;) {
      const int64_t ki = rest % w.kernel[i];
      rest /= w.kernel[i];
      const int64_t start = ki * w.dilations[i];
      s = slice(s, static_cast<int64_t>(i) + 2, start, start + (w.out[i] - 1) * w.strides[i] + 1,
                w.strides[i]);
    }
    parts.push_back(s);
  }
  return stack(parts, 0);
}

std::vector<int64_t> spatial_kernel(const Node& n, const Tensor& x, const Tensor* weight) {
  std::vector<int64_t> k = n.attr_ints("kernel_shape");
  if (k.empty() && weight)
    for (int64_t i = 2; i < weight->dim(); ++i) k.push_back(weight->sizes()[i]);
  if (k.empty()) n.fail("kernel_shape is missing");
  if (static_cast<int64_t>(k.size()) != x.dim() - 2)
    n.fail(fmt::format("a kernel of {} dims for an input of rank {}", k.size(), x.dim()));
  return k;
}

// Whether a Conv is one of duet's conv2d: two spatial dims, the same padding before and after
// along each (a stride, a padding and a dilation per dim), floating.
bool is_conv2d(const Window& w, const Tensor& x) {
  return w.kernel.size() == 2 && w.pad_end == w.pad_begin && is_floating(x.dtype());
}

V op_conv(const Node& n) {
  const Tensor &x = n.in(0), &wt = n.in(1);
  const std::vector<int64_t> k = spatial_kernel(n, x, &wt);
  const Window w = window(n, x, k, false);
  const int64_t N = x.sizes()[0], C = x.sizes()[1], M = wt.sizes()[0];
  const int64_t G = n.attr_i("group", 1), K = prod(k), L = prod(w.out);
  if (C % G || M % G || wt.sizes()[1] != C / G)
    n.fail(fmt::format("input channels {}, weight {} and group {} do not fit", C, wt.sizes(), G));
  // (The kernels' convolutions, oneDNN's on the CPU, rather than the windows' products below.)
  if (is_conv2d(w, x) && wt.dtype() == x.dtype())
    return {conv2d(x, wt, n.has(2) ? n.in(2) : Tensor(), {w.strides[0], w.strides[1]},
                   {w.pad_begin[0], w.pad_begin[1]}, G, {w.dilations[0], w.dilations[1]})};
  Tensor s = windows(n, x, w, 0.0);  // (K, N, C, out...)
  s = reshape(s, {K, N, G, C / G, L});
  s = reshape(permute(s, {1, 2, 3, 0, 4}), {N, G, (C / G) * K, L});
  Tensor wm = reshape(wt, {G, M / G, (C / G) * K});
  Tensor y = matmul_any(wm, s);  // (N, G, M/G, L)
  std::vector<int64_t> out{N, M};
  out.insert(out.end(), w.out.begin(), w.out.end());
  y = reshape(y, Shape(out));
  if (n.has(2)) y = y + channel(n.in(2), y.dim());
  return {y};
}

// a // b for non-negative i64 a.
Tensor floor_div(const Tensor& a, int64_t b) {
  return as(floor(as(a, DType::f64) / b), DType::i64);
}

// MaxPool's Indices: for each output, the flat position (in x as 1-D, spatial dims row-major,
// or column-major with storage_order 1) of the element the window's maximum came from.
Tensor pool_indices(const Node& n, const Tensor& x, const Window& w, const Tensor& stacked) {
  const int64_t D = static_cast<int64_t>(w.kernel.size());
  Tensor k = argmax(stacked, 0);  // (N, C, out...): the window offset of the maximum
  const bool col = n.attr_i("storage_order", 0);
  Tensor spatial = full({}, 0, Options().dtype(DType::i64).device(x.device()));
  int64_t inner = 1;  // elements per step along the dim being added (column-major)
  for (int64_t i = 0; i < D; ++i) {
    const int64_t after = prod(w.kernel, static_cast<size_t>(i + 1));
    Tensor ki = floor_div(k, after) - floor_div(k, after * w.kernel[static_cast<size_t>(i)]) *
                                          w.kernel[static_cast<size_t>(i)];
    std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
    shape[static_cast<size_t>(i + 2)] = w.out[static_cast<size_t>(i)];
    Tensor o =
        reshape(arange(w.out[static_cast<size_t>(i)], Options().device(x.device())), Shape(shape));
    Tensor h = o * w.strides[static_cast<size_t>(i)] - w.pad_begin[static_cast<size_t>(i)] +
               ki * w.dilations[static_cast<size_t>(i)];
    const int64_t len = x.sizes()[i + 2];
    if (col) {
      spatial = spatial + h * inner;
      inner *= len;
    } else {
      spatial = spatial * len + h;
    }
  }
  std::vector<int64_t> nc(static_cast<size_t>(x.dim()), 1);
  nc[0] = x.sizes()[0];
  nc[1] = x.sizes()[1];
  Tensor plane = reshape(arange(nc[0] * nc[1], Options().device(x.device())), Shape(nc));
  return plane * prod(dims_of(x), 2) + spatial;
}

// Whether max_pool2d (avg_pool2d: undilated) computes a pooling node: two spatial dims, the
// same padding before and after each, at most half the kernel (PyTorch's bound); its output
// sizes follow the same rules as window()'s, ceil_mode's included. (One Unfold, where the
// windows below are one slice per kernel offset.)
bool is_pool2d(const Window& w, bool dilated_ok) {
  if (w.kernel.size() != 2 || w.pad_end != w.pad_begin) return false;
  for (size_t i = 0; i < 2; ++i)
    if (w.pad_begin[i] > w.kernel[i] / 2 || (!dilated_ok && w.dilations[i] != 1)) return false;
  return true;
}

V op_max_pool(const Node& n) {
  const Tensor& x = n.in(0);
  const bool ceil_mode = n.attr_i("ceil_mode", 0);
  const Window w = window(n, x, spatial_kernel(n, x, nullptr), ceil_mode);
  if (is_pool2d(w, true) && !n.wants(1) && x.dtype() != DType::b8)
    return {max_pool2d(x, {w.kernel[0], w.kernel[1]}, {w.strides[0], w.strides[1]},
                       {w.pad_begin[0], w.pad_begin[1]}, {w.dilations[0], w.dilations[1]},
                       ceil_mode)};
  const double lowest = is_floating(x.dtype())
                            ? -INFINITY
                            : static_cast<double>(detail::integral_range(x.dtype()).least);
  Tensor stacked = windows(n, x, w, lowest);
  Tensor y = max(stacked, Dims{0});
  if (!n.wants(1)) return {y};
  return {y, pool_indices(n, x, w, stacked)};
}

V op_avg_pool(const Node& n) {
  const Tensor& x = n.in(0);
  const bool ceil_mode = n.attr_i("ceil_mode", 0);
  const Window w = window(n, x, spatial_kernel(n, x, nullptr), ceil_mode);
  if (is_pool2d(w, false) && is_floating(x.dtype()))
    return {avg_pool2d(x, {w.kernel[0], w.kernel[1]}, {w.strides[0], w.strides[1]},
                       {w.pad_begin[0], w.pad_begin[1]}, ceil_mode,
                       n.attr_i("count_include_pad", 0) != 0)};
  Tensor total = sum(windows(n, x, w, 0.0), Dims{0});
  // The divisor: the window's elements inside the input (and its pads, when counted). A window
  // reaching past the pads (ceil mode) never counts what lies beyond them.
  std::vector<int64_t> one_shape(static_cast<size_t>(x.dim()), 1);
  for (int64_t i = 2; i < x.dim(); ++i) one_shape[static_cast<size_t>(i)] = x.sizes()[i];
  Tensor ones = full(Shape(one_shape), 1, like(x));
  if (n.attr_i("count_include_pad", 0)) {
    std::vector<int64_t> pads(static_cast<size_t>(2 * x.dim()), 0);
    for (size_t i = 0; i < w.kernel.size(); ++i) {
      pads[i + 2] = w.pad_begin[i];
      pads[i + 2 + static_cast<size_t>(x.dim())] = w.pad_end[i];
    }
    ones = pad_nd(n, ones, pads, "constant", full({}, 1, like(x)));
    Window inner = w;
    for (size_t i = 0; i < w.kernel.size(); ++i) inner.pad_begin[i] = inner.pad_end[i] = 0;
    return {total / sum(windows(n, ones, inner, 0.0), Dims{0})};
  }
  return {total / sum(windows(n, ones, w, 0.0), Dims{0})};
}

template <bool is_max>
V op_global_pool(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<int64_t> axes;
  for (int64_t i = 2; i < x.dim(); ++i) axes.push_back(i);
  return {is_max ? max(x, Dims(axes), true) : mean(x, Dims(axes), true)};
}

// ---- losses ----

// NegativeLogLikelihoodLoss of log-probabilities (N, C, d...) against targets (N, d...).
Tensor nll(const Node& n, const Tensor& logp, const Tensor& target, const Tensor* weight) {
  const std::string red = n.attr_s("reduction", "mean");
  Tensor t = as(target, DType::i64);
  Tensor valid = bools(t.sizes(), true, t.device());
  if (n.has_attr("ignore_index")) {
    valid = ne(t, n.attr_i("ignore_index", 0));
    t = where(valid, t, full({}, 0, like(t)));
  }
  Tensor picked = squeeze(gather(logp, 1, unsqueeze(t, 1)), 1);
  Tensor w = as(valid, logp.dtype());
  if (weight) w = w * reshape(index_select(*weight, 0, reshape(t, {-1})), t.sizes());
  Tensor loss = neg(picked) * w;
  if (red == "none") return loss;
  if (red == "sum") return sum(loss);
  if (red != "mean") n.fail(fmt::format("reduction \"{}\" (none, sum, mean)", red));
  return sum(loss) / sum(w);
}

V op_nll_loss(const Node& n) {
  const Tensor* w = n.has(2) ? &n.in(2) : nullptr;
  return {nll(n, n.in(0), n.in(1), w)};
}

V op_softmax_ce(const Node& n) {
  Tensor logp = log_softmax(n.in(0), 1);
  const Tensor* w = n.has(2) ? &n.in(2) : nullptr;
  return {nll(n, logp, n.in(1), w), logp};
}

}  // namespace

// Every op this file maps.
std::vector<OpEntry> nn_ops() {
  return {
      {"AveragePool", op_avg_pool},
      {"BatchNormalization", op_batch_norm},
      {"Conv", op_conv},
      {"GlobalAveragePool", op_global_pool<false>},
      {"GlobalMaxPool", op_global_pool<true>},
      {"InstanceNormalization", op_instance_norm},
      {"LRN", op_lrn},
      {"LayerNormalization", op_layer_norm},
      {"MaxPool", op_max_pool},
      {"MeanVarianceNormalization", op_mvn},
      {"NegativeLogLikelihoodLoss", op_nll_loss},
      {"SoftmaxCrossEntropyLoss", op_softmax_ce},
  };
}

}  // namespace duet::detail::onnx_import
