// ONNX import: what each mapping assumes of its node, checked in one place before it runs
// (check_node, called by the graph runner in trace/onnx/onnx_import.cpp). A mapping indexes its
// inputs' dims, divides by strides and groups, and reads the one value of small inputs that stand
// for attributes (TopK's k); a malformed model must get an error that names the node and what was
// expected, as the ONNX checker and ONNX Runtime give, rather than a division by zero, a read past
// an end or a silently wrong result. The checks read the small inputs they need (a Range's bounds,
// a Split's sizes) as the mappings do. What depends on sizes a mapping computes is checked there,
// with the helpers at the end: check_fits, the one refusal of sizes the machine cannot hold, and
// check_pad_dim.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "trace/onnx/onnx_import.h"

namespace duet::detail::onnx_import {

namespace {

// Input i must be present with a rank of at least r.
void rank_at_least(const Node& n, size_t i, int64_t r, const char* layout) {
  const Tensor& x = n.in(i);
  if (x.dim() < r)
    throw ShapeError(fmt::format("input {} must have rank {} or more ({}), got shape {}", i, r,
                                 layout, x.sizes()));
}

// Attribute `name`, when given, must hold `count` values (any count when 0), each >= lowest.
void ints_at_least(const Node& n, const char* name, size_t count, int64_t lowest) {
  if (!n.has_attr(name)) return;
  const std::vector<int64_t> v = n.attr_ints(name);
  if (count && v.size() != count)
    n.fail(fmt::format("{} must hold {} values for {} spatial dims, got {}", name, count,
                       n.in(0).dim() - 2, v.size()));
  for (int64_t x : v)
    if (x < lowest)
      n.fail(fmt::format("{} must be {} or more, got [{}]", name, lowest, fmt::join(v, ", ")));
}

// Input i, when present and not empty, must hold one value.
void one_value(const Node& n, size_t i, const char* what) {
  if (!n.has(i)) return;
  const Tensor& t = n.in(i);
  if (t.numel() != 1)
    n.fail(fmt::format("input {} ({}) must hold one value, got shape {}", i, what, t.sizes()));
}

// Conv, ConvTranspose, MaxPool, AveragePool: x (N, C, D1...), and per spatial dim a kernel,
// a stride and a dilation of at least 1; pads, when given, twice as many.
void check_window(const Node& n, bool kernel_required) {
  rank_at_least(n, 0, 3, "N, C and spatial dims");
  const auto D = static_cast<size_t>(n.in(0).dim() - 2);
  if (kernel_required && !n.has_attr("kernel_shape")) n.fail("kernel_shape is missing");
  ints_at_least(n, "kernel_shape", D, 1);
  ints_at_least(n, "strides", D, 1);
  ints_at_least(n, "dilations", D, 1);
  ints_at_least(n, "pads", 2 * D, INT64_MIN);
}

void check_conv(const Node& n) {
  check_window(n, false);
  const Tensor &x = n.in(0), &w = n.in(1);
  if (w.dim() != x.dim())
    throw ShapeError(
        fmt::format("the weight {} must have the rank of the input {}", w.sizes(), x.sizes()));
  const int64_t g = n.attr_i("group", 1);
  if (g < 1) n.fail(fmt::format("group must be 1 or more, got {}", g));
}

void check_conv_transpose(const Node& n) {
  check_conv(n);
  const auto D = static_cast<size_t>(n.in(0).dim() - 2);
  ints_at_least(n, "output_padding", D, 0);
  const std::vector<int64_t> shape = n.attr_ints("output_shape");
  if (!shape.empty() && shape.size() != D && shape.size() != D + 2)
    n.fail(fmt::format("output_shape must hold {} values (or {} with N and C), got [{}]", D, D + 2,
                       fmt::join(shape, ", ")));
}

void check_pool(const Node& n) { check_window(n, true); }

void check_global_pool(const Node& n) { rank_at_least(n, 0, 3, "N, C and spatial dims"); }

void check_batch_norm(const Node& n) { rank_at_least(n, 0, 2, "N, C, ..."); }

void check_instance_norm(const Node& n) { rank_at_least(n, 0, 3, "N, C and spatial dims"); }

void check_lrn(const Node& n) {
  rank_at_least(n, 0, 2, "N, C, ...");
  const int64_t size = n.attr_i("size", 1);
  if (size < 1) n.fail(fmt::format("size must be 1 or more, got {}", size));
}

void check_concat(const Node& n) {
  bool any = false;
  for (size_t i = 0; i < n.size(); ++i)
    if (n.has(i)) any = true, rank_at_least(n, i, 1, "a dim to join along");
  if (!any) n.fail("needs at least one input");
}

// Ops that index the dim their axis names (Gather, TopK, CumSum, Slice, ...): a rank of 1 or
// more, where Node::axis would take a 0-d input's axis 0 as valid.
void check_has_dims(const Node& n) { rank_at_least(n, 0, 1, "a dim to work along"); }

// Squeeze with axes; Compress and Unique with an axis: the same, when the axes are given.
void check_axes_given(const Node& n) {
  const bool given = n.op() == "Squeeze" ? n.has_attr("axes") || (n.has(1) && n.in(1).numel())
                                         : n.has_attr("axis");
  if (given) check_has_dims(n);
}

// DepthToSpace, SpaceToDepth: x (N, C, H, W) and a blocksize that divides what it splits.
void check_blocks(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t b = n.attr_i("blocksize", 1);
  if (x.dim() != 4 || b < 1)
    n.fail(fmt::format("needs a 4-D input and a positive blocksize, got shape {} and {}", x.sizes(),
                       b));
  const int64_t C = x.sizes()[1], H = x.sizes()[2], W = x.sizes()[3];
  const bool fits =
      n.op() == "DepthToSpace" ? b <= C / b && C % (b * b) == 0 : H % b == 0 && W % b == 0;
  if (!fits)
    throw ShapeError(fmt::format(
        "blocksize {} does not divide {} of shape {}", b,
        n.op() == "DepthToSpace" ? "the channels (by its square)" : "the height and width",
        x.sizes()));
}

void check_reverse_sequence(const Node& n) { rank_at_least(n, 0, 2, "time and batch dims"); }

void check_topk(const Node& n) {
  check_has_dims(n);
  if (n.opset() >= 10) one_value(n, 1, "k");
}

// Range: start, limit and delta, one value each, finite, delta not 0; a count that fits.
void check_range(const Node& n) {
  one_value(n, 0, "start");
  one_value(n, 1, "limit");
  one_value(n, 2, "delta");
  const double start = n.number(0), limit = n.number(1), delta = n.number(2);
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta))
    n.fail(fmt::format("start {}, limit {} and delta {} must be finite, delta not 0", start, limit,
                       delta));
  check_fits(n, "the range", {std::max(std::ceil((limit - start) / delta), 0.0)}, n.in(0).dtype());
}

// Split: sizes of 0 or more; num_outputs (opset 18), when given, the count of outputs listed.
void check_split(const Node& n) {
  check_has_dims(n);
  const std::vector<int64_t> parts =
      n.opset() < 13 ? n.attr_ints("split") : (n.has(1) ? n.ints(1) : std::vector<int64_t>{});
  for (int64_t p : parts)
    if (p < 0)
      n.fail(fmt::format("split sizes must be 0 or more, got [{}]", fmt::join(parts, ", ")));
  if (!n.has_attr("num_outputs")) return;
  const int64_t k = n.attr_i("num_outputs", 1);
  if (k != static_cast<int64_t>(n.outputs()))
    n.fail(fmt::format("num_outputs is {}, but the node lists {} outputs", k, n.outputs()));
}

// Unsqueeze: no axis named twice (after negative axes are counted from the end).
void check_unsqueeze(const Node& n) {
  const std::vector<int64_t> axes =
      n.opset() < 13 ? n.attr_ints("axes") : (n.has(1) ? n.ints(1) : std::vector<int64_t>{});
  const int64_t r = n.in(0).dim() + static_cast<int64_t>(axes.size());
  std::set<int64_t> seen;
  for (int64_t a : axes)
    if (!seen.insert(n.axis(a, r)).second)
      n.fail(fmt::format("axes [{}] name one axis twice", fmt::join(axes, ", ")));
}

// Pad: 2 pads per dim, or with axes (input 3, opset 18) per axis named; before opset 11 the
// pads are an attribute.
void check_pad(const Node& n) {
  const size_t pads = n.opset() < 11 ? n.attr_ints("pads").size() : n.ints(1).size();
  const size_t axes = n.has(3) ? n.ints(3).size() : static_cast<size_t>(n.in(0).dim());
  if (pads != 2 * axes)
    n.fail(fmt::format("pads must hold 2 values per {} ({}), got {}",
                       n.has(3) ? "axis of input 3" : "dim of input 0", axes, pads));
}

// STFT: signal (batch, length, 1 or 2), frame_step (one value, 1 or more), window (1-D),
// frame_length (one value).
void check_stft(const Node& n) {
  const Tensor& x = n.in(0);
  if (x.dim() != 3 || (x.sizes()[2] != 1 && x.sizes()[2] != 2))
    throw ShapeError(
        fmt::format("the signal must be (batch, length, 1 or 2), got shape {}", x.sizes()));
  if (n.int1(1) < 1) n.fail(fmt::format("frame_step must be 1 or more, got {}", n.int1(1)));
  if (n.has(2) && n.in(2).numel() && n.in(2).dim() != 1)
    throw ShapeError(fmt::format("the window must be 1-D, got shape {}", n.in(2).sizes()));
  if (n.has(3) && n.in(3).numel()) one_value(n, 3, "frame_length");
}

// DFT: signal (..., length, 1 or 2); dft_length and (opset 20) axis, one value each.
void check_dft(const Node& n) {
  const Tensor& x = n.in(0);
  if (x.dim() < 2 || (x.sizes()[x.dim() - 1] != 1 && x.sizes()[x.dim() - 1] != 2))
    throw ShapeError(
        fmt::format("the signal must be (..., length, 1 or 2), got shape {}", x.sizes()));
  if (n.has(1) && n.in(1).numel() && n.int1(1) < 1)
    n.fail(fmt::format("dft_length must be 1 or more, got {}", n.int1(1)));
  if (n.opset() >= 20) one_value(n, 2, "axis");
}

// GatherND, ScatterND: indices (..., k) of rank 1 or more, whose first batch_dims dims are data's
// and whose k names at most the dims of data after them.
void check_nd(const Node& n) {
  const Tensor &x = n.in(0), &idx = n.in(1);
  const int64_t b = n.attr_i("batch_dims", 0);
  if (idx.dim() < 1 || b < 0 || b >= std::min(x.dim(), idx.dim()) ||
      b + idx.sizes()[idx.dim() - 1] > x.dim())
    throw ShapeError(fmt::format(
        "indices {} do not index data {} with batch_dims {} (indices of rank 1 or more, whose "
        "last dim names at most the data's dims after the batch dims)",
        idx.sizes(), x.sizes(), b));
  for (int64_t i = 0; i < b; ++i)
    if (x.sizes()[i] != idx.sizes()[i])
      throw ShapeError(
          fmt::format("the batch dims of data {} and indices {} differ", x.sizes(), idx.sizes()));
}

// NonMaxSuppression: boxes (batch, boxes, 4), scores (batch, classes, boxes); one value each
// for max_output_boxes_per_class, iou_threshold and score_threshold.
void check_nms(const Node& n) {
  const Tensor &b = n.in(0), &s = n.in(1);
  if (b.dim() != 3 || b.sizes()[2] != 4 || s.dim() != 3 || s.sizes()[0] != b.sizes()[0] ||
      s.sizes()[2] != b.sizes()[1])
    throw ShapeError(
        fmt::format("boxes must be (batch, boxes, 4) and scores (batch, classes, "
                    "boxes), got {} and {}",
                    b.sizes(), s.sizes()));
  const char* names[] = {"max_output_boxes_per_class", "iou_threshold", "score_threshold"};
  for (size_t i = 2; i < 5; ++i)
    if (n.has(i) && n.in(i).numel()) one_value(n, i, names[i - 2]);
}

// Mod of floats must ask for fmod (the C remainder), as the ONNX specification says.
void check_mod(const Node& n) {
  if (is_floating(n.in(0).dtype()) && n.attr_i("fmod", 0) == 0)
    n.fail(fmt::format("fmod must be 1 for {} inputs", n.in(0).dtype()));
}

const std::map<std::string, void (*)(const Node&)>& checks() {
  static const std::map<std::string, void (*)(const Node&)> table = {
      {"ArgMax", check_has_dims},
      {"ArgMin", check_has_dims},
      {"AveragePool", check_pool},
      {"BatchNormalization", check_batch_norm},
      {"Compress", check_axes_given},
      {"Concat", check_concat},
      {"Conv", check_conv},
      {"ConvTranspose", check_conv_transpose},
      {"CumSum", check_has_dims},
      {"DFT", check_dft},
      {"DepthToSpace", check_blocks},
      {"Gather", check_has_dims},
      {"GatherElements", check_has_dims},
      {"GatherND", check_nd},
      {"GlobalAveragePool", check_global_pool},
      {"GlobalMaxPool", check_global_pool},
      {"Hardmax", check_has_dims},
      {"InstanceNormalization", check_instance_norm},
      {"LRN", check_lrn},
      {"LogSoftmax", check_has_dims},
      {"MaxPool", check_pool},
      {"Mod", check_mod},
      {"NonMaxSuppression", check_nms},
      {"Pad", check_pad},
      {"Range", check_range},
      {"ReverseSequence", check_reverse_sequence},
      {"STFT", check_stft},
      {"Scatter", check_has_dims},
      {"ScatterElements", check_has_dims},
      {"ScatterND", check_nd},
      {"Slice", check_has_dims},
      {"Softmax", check_has_dims},
      {"SpaceToDepth", check_blocks},
      {"Split", check_split},
      {"Squeeze", check_axes_given},
      {"TopK", check_topk},
      {"Unique", check_axes_given},
      {"Unsqueeze", check_unsqueeze},
  };
  return table;
}

}  // namespace

void check_node(const Node& n) {
  auto it = checks().find(n.op());
  if (it != checks().end()) it->second(n);
}

void check_pad_dim(const Node& n, const Shape& shape, int64_t a, int64_t b, int64_t e,
                   const std::string& mode) {
  const int64_t len = shape[a];
  if (len + b + e < 0 || -b > len || -e > len)
    n.fail(fmt::format("pads {} and {} on dim {} of shape {} crop more than the dim holds", b, e, a,
                       shape));
  if (mode != "constant" && (b > 0 || e > 0) &&
      len + std::min<int64_t>(b, 0) + std::min<int64_t>(e, 0) == 0)
    n.fail(fmt::format("pad mode \"{}\" has no elements to pad from on dim {} of shape {}", mode, a,
                       shape));
}

void check_fits(const Node& n, const std::string& what, const std::vector<double>& dims, DType d) {
  static const double machine =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  double bytes = static_cast<double>(itemsize(d));
  for (double x : dims) {
    if (!std::isfinite(x) || x < 0)
      n.fail(fmt::format("{} has a size of {} ({}), which is no size", what, x,
                         fmt::join(dims, ", ")));
    bytes *= x;
  }
  if (bytes > machine)
    n.fail(
        fmt::format("{} of shape ({}) and dtype {} would take {:.3g} bytes, more than this "
                    "machine's memory ({:.3g} bytes)",
                    what, fmt::join(dims, ", "), d, bytes, machine));
}

}  // namespace duet::detail::onnx_import
