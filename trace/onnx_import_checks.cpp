// ONNX import: what each mapping assumes of its node, checked in one place before it runs
// (check_node, called by the graph runner in trace/onnx_import.cpp). A mapping indexes its
// inputs' dims, divides by strides and groups, and reads the one value of small inputs that stand
// for attributes (TopK's k); a malformed model must get an error that names the node and what was
// expected, as the ONNX checker and ONNX Runtime give, rather than a division by zero, a read past
// an end or a silently wrong result. Checks that need an input's values beyond its shape (a Range's
// delta, a Split's sizes) stay in the mappings, which read those values; check_fits is the one
// refusal of sizes the machine cannot hold.
#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <set>

#include "trace/onnx_import.h"

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
    n.fail(
        fmt::format("{} must hold {} values, one per spatial dim, got {}", name, count, v.size()));
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
  for (size_t i = 0; i < n.size(); ++i)
    if (n.has(i)) return;
  n.fail("needs at least one input");
}

void check_topk(const Node& n) {
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

// Pad (opset 18, with axes): 2 pads per axis named.
void check_pad(const Node& n) {
  if (n.opset() < 11 || !n.has(3)) return;
  const size_t pads = n.ints(1).size(), axes = n.ints(3).size();
  if (pads != 2 * axes)
    n.fail(fmt::format("pads must hold 2 values per axis of input 3 ({}), got {}", axes, pads));
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

// Mod of floats must ask for fmod (the C remainder), as the ONNX specification says.
void check_mod(const Node& n) {
  if (is_floating(n.in(0).dtype()) && n.attr_i("fmod", 0) == 0)
    n.fail(fmt::format("fmod must be 1 for {} inputs", n.in(0).dtype()));
}

const std::map<std::string, void (*)(const Node&)>& checks() {
  static const std::map<std::string, void (*)(const Node&)> table = {
      {"AveragePool", check_pool},
      {"BatchNormalization", check_batch_norm},
      {"Concat", check_concat},
      {"Conv", check_conv},
      {"ConvTranspose", check_conv_transpose},
      {"DFT", check_dft},
      {"GlobalAveragePool", check_global_pool},
      {"GlobalMaxPool", check_global_pool},
      {"InstanceNormalization", check_instance_norm},
      {"LRN", check_lrn},
      {"MaxPool", check_pool},
      {"Mod", check_mod},
      {"Pad", check_pad},
      {"Range", check_range},
      {"STFT", check_stft},
      {"Split", check_split},
      {"TopK", check_topk},
      {"Unsqueeze", check_unsqueeze},
  };
  return table;
}

}  // namespace

void check_node(const Node& n) {
  auto it = checks().find(n.op());
  if (it != checks().end()) it->second(n);
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
