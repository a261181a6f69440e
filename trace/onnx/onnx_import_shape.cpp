// ONNX import, the data-movement ops: constants, shapes, reshapes, slicing, gathers, tiling,
// ranges, triangles, padding and the depth/space shuffles, each written in duet's public ops.
// Semantics follow the ONNX operator specification, opset by opset where an op's attributes
// moved to inputs (axes, split, pads).
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

// ---- constants and shapes ----

V op_constant(const Node& n) {
  const onnx::AttributeProto* a = nullptr;
  if ((a = n.attr("value")))
    return {io::tensor_from_proto(a->t(), fmt::format("the value of {}", n.where()))};
  if ((a = n.attr("value_float")))
    return {scalar(static_cast<double>(a->f()), Options().dtype(DType::f32))};
  if ((a = n.attr("value_int"))) return {scalar(a->i(), Options().dtype(DType::i64))};
  if ((a = n.attr("value_floats"))) {
    std::vector<double> v(a->floats().begin(), a->floats().end());
    return {tensor(v, Options().dtype(DType::f32))};
  }
  if ((a = n.attr("value_ints"))) return {i64s({a->ints().begin(), a->ints().end()})};
  n.fail(
      "has no value duet reads (value, value_float(s) or value_int(s); sparse and string "
      "values are not supported)");
}

V op_constant_of_shape(const Node& n) {
  std::vector<int64_t> shape = n.ints(0);
  Tensor v = scalar(0.0, Options().dtype(DType::f32));
  if (const onnx::AttributeProto* a = n.attr("value"))
    v = io::tensor_from_proto(a->t(), fmt::format("the value of {}", n.where()));
  return {expand(reshape(v, {}), Shape(shape)).contiguous()};
}

V op_shape(const Node& n) {
  std::vector<int64_t> d = dims_of(n.in(0));
  const int64_t r = static_cast<int64_t>(d.size());
  int64_t s = n.attr_i("start", 0), e = n.attr_i("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, s, r);
  return {i64s(std::vector<int64_t>(d.begin() + s, d.begin() + e))};
}

V op_size(const Node& n) { return {reshape(i64s({n.in(0).numel()}), {})}; }

V op_reshape(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<int64_t> s = n.opset() < 5 ? n.attr_ints("shape") : n.ints(1);
  const bool allowzero = n.attr_i("allowzero", 0);
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 0 && !allowzero) {
      if (static_cast<int64_t>(i) >= x.dim()) n.fail("shape has a 0 past the input's rank");
      s[i] = x.sizes()[static_cast<int64_t>(i)];
    }
  return {reshape(x, Shape(s))};
}

V op_flatten(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<int64_t> d = dims_of(x);
  int64_t a = n.attr_i("axis", 1);
  if (a < 0) a += x.dim();
  if (a < 0 || a > x.dim()) n.fail(fmt::format("axis {} is out of range for rank {}", a, x.dim()));
  return {reshape(x, {prod(d, 0, static_cast<size_t>(a)), prod(d, static_cast<size_t>(a))})};
}

std::vector<int64_t> axes_of(const Node& n, size_t input, int since) {
  if (n.opset() < since) return n.attr_ints("axes");
  return n.has(input) ? n.ints(input) : std::vector<int64_t>{};
}

V op_unsqueeze(const Node& n) {
  Tensor x = n.in(0);
  std::vector<int64_t> axes = axes_of(n, 1, 13);
  const int64_t r = x.dim() + static_cast<int64_t>(axes.size());
  for (int64_t& a : axes) a = n.axis(a, r);
  std::sort(axes.begin(), axes.end());
  for (int64_t a : axes) x = unsqueeze(x, a);
  return {x};
}

V op_squeeze(const Node& n) {
  Tensor x = n.in(0);
  std::vector<int64_t> axes = axes_of(n, 1, 13);
  if (axes.empty()) return {squeeze(x)};
  for (int64_t& a : axes) {
    a = n.axis(a, x.dim());
    if (x.sizes()[a] != 1) n.fail(fmt::format("dim {} of shape {} is not 1", a, x.sizes()));
  }
  std::sort(axes.rbegin(), axes.rend());
  for (int64_t a : axes) x = squeeze(x, a);
  return {x};
}

V op_transpose(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<int64_t> perm = n.attr_ints("perm");
  if (perm.empty())
    for (int64_t i = x.dim() - 1; i >= 0; --i) perm.push_back(i);
  return {permute(x, Dims(perm))};
}

V op_concat(const Node& n) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < n.size(); ++i)
    if (n.has(i)) ts.push_back(n.in(i));
  return {cat(ts, n.axis(n.attr_i("axis", 0), ts.at(0).dim()))};
}

V op_split(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", 0), x.dim());
  const int64_t len = x.sizes()[a];
  std::vector<int64_t> parts =
      n.opset() < 13 ? n.attr_ints("split") : (n.has(1) ? n.ints(1) : std::vector<int64_t>{});
  if (parts.empty()) {
    const int64_t k =
        n.has_attr("num_outputs") ? n.attr_i("num_outputs", 1) : static_cast<int64_t>(n.outputs());
    if (k <= 0) n.fail(fmt::format("num_outputs must be positive, got {}", k));
    const int64_t each = (len + k - 1) / k;
    for (int64_t i = 0, left = len; i < k; ++i, left -= each) parts.push_back(std::min(each, left));
  }
  V out;
  int64_t at = 0;
  for (int64_t p : parts) {
    out.push_back(slice(x, a, at, at + p));
    at += p;
  }
  if (at != len) n.fail(fmt::format("the parts sum to {}, not the size {} of axis {}", at, len, a));
  return out;
}

V op_slice(const Node& n) {
  Tensor x = n.in(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (n.opset() < 10) {
    starts = n.attr_ints("starts");
    ends = n.attr_ints("ends");
    axes = n.attr_ints("axes");
  } else {
    starts = n.ints(1);
    ends = n.ints(2);
    if (n.has(3)) axes = n.ints(3);
    if (n.has(4)) steps = n.ints(4);
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  steps.resize(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size())
    n.fail("starts, ends, axes and steps differ in length");
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t a = n.axis(axes[i], x.dim()), len = x.sizes()[a], st = steps[i];
    if (st == 0) n.fail("a step is 0");
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += len;
    if (e < 0) e += len;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, len);
      e = std::clamp<int64_t>(e, 0, len);
      x = slice(x, a, s, std::max(s, e), st);
    } else {
      s = std::clamp<int64_t>(s, 0, len - 1);
      e = std::clamp<int64_t>(e, -1, len - 1);
      std::vector<int64_t> idx;
      for (int64_t k = s; k > e; k += st) idx.push_back(k);
      x = index_select(x, a, i64s(idx, x.device()));
    }
  }
  return {x};
}

V op_gather(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", 0), x.dim());
  const Tensor idx = wrap_index(n.in(1), x.sizes()[a]);
  std::vector<int64_t> shape = dims_of(x);
  std::vector<int64_t> out(shape.begin(), shape.begin() + a);
  for (int64_t d : dims_of(idx)) out.push_back(d);
  out.insert(out.end(), shape.begin() + a + 1, shape.end());
  return {reshape(index_select(x, a, reshape(idx, {idx.numel()})), Shape(out))};
}

V op_gather_elements(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", 0), x.dim());
  return {gather(x, a, wrap_index(n.in(1), x.sizes()[a]))};
}

std::vector<int64_t> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  return ::duet::detail::broadcast_shapes("Expand", Shape(a), Shape(b)).vec();
}

V op_expand(const Node& n) {
  const Tensor& x = n.in(0);
  return {expand(x, Shape(broadcast(dims_of(x), n.ints(1)))).contiguous()};
}

V op_tile(const Node& n) {
  const Tensor& x = n.in(0);
  const std::vector<int64_t> r = n.ints(1);
  if (static_cast<int64_t>(r.size()) != x.dim()) n.fail("repeats must have one value per dim");
  return {tile(x, Shape(r))};
}

V op_range(const Node& n) {
  const Tensor& s = n.in(0);
  const double start = n.number(0), limit = n.number(1), delta = n.number(2);
  const int64_t count =
      std::max<int64_t>(static_cast<int64_t>(std::ceil((limit - start) / delta)), 0);
  Tensor i = arange(count, Options().dtype(DType::f64).device(s.device()));
  return {as(i * delta + start, s.dtype())};
}

V op_trilu(const Node& n) {
  const Tensor& x = n.in(0);
  if (x.dim() < 2) n.fail(fmt::format("needs a rank of 2 or more, got shape {}", x.sizes()));
  const int64_t k = n.has(1) ? static_cast<int64_t>(n.number(1)) : 0;
  Tensor off = diagonal_offsets(x.sizes()[x.dim() - 2], x.sizes()[x.dim() - 1], x.device());
  Tensor keep = n.attr_i("upper", 1) ? ge(off, k) : le(off, k);
  return {where(keep, x, full({}, 0, like(x)))};
}

V op_eye_like(const Node& n) {
  const Tensor& x = n.in(0);
  if (x.dim() != 2) n.fail(fmt::format("needs a 2-D input, got shape {}", x.sizes()));
  Tensor off = diagonal_offsets(x.sizes()[0], x.sizes()[1], x.device());
  return {as(eq(off, n.attr_i("k", 0)), dtype_attr(n, "dtype", x.dtype()))};
}

V op_one_hot(const Node& n) {
  const Tensor& idx = n.in(0);
  const int64_t depth = static_cast<int64_t>(n.number(1));
  if (depth <= 0) n.fail(fmt::format("depth must be positive, got {}", depth));
  const Tensor& values = n.in(2);
  const int64_t a = n.axis(n.attr_i("axis", -1), idx.dim() + 1);
  Tensor i = as(idx, DType::i64);
  i = where(lt(i, 0), i + depth, i);
  std::vector<int64_t> shape(static_cast<size_t>(idx.dim() + 1), 1);
  shape[static_cast<size_t>(a)] = depth;
  Tensor hot =
      eq(unsqueeze(i, a), reshape(arange(depth, Options().device(idx.device())), Shape(shape)));
  return {where(hot, slice(values, 0, 1, 2), slice(values, 0, 0, 1))};
}

V op_dropout(const Node& n) {
  const Tensor& x = n.in(0);
  double ratio = n.opset() < 12 ? n.attr_f("ratio", 0.5) : (n.has(1) ? n.number(1) : 0.5);
  const bool training = n.opset() < 12 ? false : (n.has(2) && n.number(2) != 0);
  Tensor y = training && ratio > 0 ? dropout(x, ratio, true) : x;
  Tensor mask = training && ratio > 0 ? ne(y, 0) : bools(x.sizes(), true, x.device());
  return {y, mask};
}

V op_pad(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t r = x.dim();
  std::vector<int64_t> pads;
  Tensor value = full({}, 0, like(x));
  if (n.opset() < 11) {
    pads = n.attr_ints("pads");
    value = full({}, n.attr_f("value", 0.0), like(x));
  } else {
    pads = n.ints(1);
    if (n.has(2)) value = n.in(2);
  }
  if (n.has(3)) {  // axes (opset 18): pads names those axes only
    std::vector<int64_t> axes = n.ints(3), all(static_cast<size_t>(2 * r), 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = n.axis(axes[i], r);
      all[static_cast<size_t>(a)] = pads[i];
      all[static_cast<size_t>(a + r)] = pads[i + axes.size()];
    }
    pads = all;
  }
  if (static_cast<int64_t>(pads.size()) != 2 * r) n.fail("pads must hold 2 values per dim");
  return {pad_nd(n, x, pads, n.attr_s("mode", "constant"), value)};
}

V op_depth_to_space(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t b = n.attr_i("blocksize", 1);
  if (b <= 0 || x.dim() != 4)
    n.fail(fmt::format("needs a 4-D input and a positive blocksize, got shape {} and {}", x.sizes(),
                       b));
  std::vector<int64_t> d = dims_of(x);
  const int64_t N = d[0], C = d[1], H = d[2], W = d[3];
  Tensor t = n.attr_s("mode", "DCR") == "DCR"
                 ? permute(reshape(x, {N, b, b, C / (b * b), H, W}), {0, 3, 4, 1, 5, 2})
                 : permute(reshape(x, {N, C / (b * b), b, b, H, W}), {0, 1, 4, 2, 5, 3});
  return {reshape(t, {N, C / (b * b), H * b, W * b})};
}

V op_space_to_depth(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t b = n.attr_i("blocksize", 1);
  if (b <= 0 || x.dim() != 4)
    n.fail(fmt::format("needs a 4-D input and a positive blocksize, got shape {} and {}", x.sizes(),
                       b));
  std::vector<int64_t> d = dims_of(x);
  const int64_t N = d[0], C = d[1], H = d[2], W = d[3];
  Tensor t = permute(reshape(x, {N, C, H / b, b, W / b, b}), {0, 3, 5, 1, 2, 4});
  return {reshape(t, {N, C * b * b, H / b, W / b})};
}

}  // namespace

// Every op this file maps.
std::vector<OpEntry> shape_ops() {
  return {
      {"Concat", op_concat},
      {"Constant", op_constant},
      {"ConstantOfShape", op_constant_of_shape},
      {"DepthToSpace", op_depth_to_space},
      {"Dropout", op_dropout},
      {"Expand", op_expand},
      {"EyeLike", op_eye_like},
      {"Flatten", op_flatten},
      {"Gather", op_gather},
      {"GatherElements", op_gather_elements},
      {"OneHot", op_one_hot},
      {"Pad", op_pad},
      {"Range", op_range},
      {"Reshape", op_reshape},
      {"Shape", op_shape},
      {"Size", op_size},
      {"Slice", op_slice},
      {"SpaceToDepth", op_space_to_depth},
      {"Split", op_split},
      {"Squeeze", op_squeeze},
      {"Tile", op_tile},
      {"Transpose", op_transpose},
      {"Trilu", op_trilu},
      {"Unsqueeze", op_unsqueeze},
  };
}

}  // namespace duet::detail::onnx_import
