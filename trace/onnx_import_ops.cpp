// ONNX import: one mapping per ONNX op of the default domain, written in duet's public ops, so
// that an imported model runs eagerly and compiled, differentiates where the ops do, and needs no
// kernel of its own. The table at the end is the only list of mapped ops (docs/onnx.md is
// generated from it). Semantics follow the ONNX operator specification, opset by opset where an
// op's attributes moved to inputs (axes, split, pads).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "core/ops.h"
#include "trace/onnx_import.h"
#include "trace/onnx_proto.h"

namespace duet::detail::onnx_import {

Tensor as(const Tensor& t, DType d) { return t.dtype() == d ? t : t.to(d); }

// Exact values: tensor() goes through double.
Tensor i64s(const std::vector<int64_t>& v, Device device) {
  Tensor t = ::duet::detail::empty(Shape{static_cast<int64_t>(v.size())}, DType::i64);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int64_t));
  return device.is_cpu() ? t : t.to(device);
}

Options like(const Tensor& t) { return Options().dtype(t.dtype()).device(t.device()); }

std::vector<int64_t> dims_of(const Tensor& t) { return t.sizes().vec(); }

int64_t prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < v.size() && i < to; ++i) p *= v[i];
  return p;
}

// x with dim a moved last, and back.
Tensor movedim_last(const Tensor& x, int64_t a) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != a) p.push_back(i);
  p.push_back(a);
  return permute(x, Dims(p));
}
Tensor movedim_first(const Tensor& x, int64_t a) {
  std::vector<int64_t> p{a};
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != a) p.push_back(i);
  return permute(x, Dims(p));
}
Tensor movedim_back(const Tensor& x, int64_t a) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < x.dim() - 1; ++i) p.push_back(i);
  p.insert(p.begin() + a, x.dim() - 1);
  return permute(x, Dims(p));
}

namespace {

using V = std::vector<Tensor>;
namespace io = onnx_io;

Tensor trunc(const Tensor& q) { return where(q < 0, neg(floor(neg(q))), floor(q)); }

Tensor logical_and_(const Tensor& a, const Tensor& b) {
  return eq(as(a, DType::i32) + as(b, DType::i32), 2);
}

Tensor bools(const Shape& shape, bool v, Device d) {
  return full(shape, v, Options().dtype(DType::b8).device(d));
}

// ---- elementwise ----

#define UNARY(Name, expr)      \
  V Name(const Node& n) {      \
    const Tensor& x = n.in(0); \
    return {expr};             \
  }

UNARY(op_abs, abs(x))
UNARY(op_neg, neg(x))
UNARY(op_exp, exp(x))
UNARY(op_log, log(x))
UNARY(op_sqrt, sqrt(x))
UNARY(op_sin, sin(x))
UNARY(op_cos, cos(x))
UNARY(op_tan, sin(x) / cos(x))
UNARY(op_atan, atan(x))
UNARY(op_asin, atan(x / sqrt((1 - x * x))))
UNARY(op_acos, M_PI / 2 - atan(x / sqrt((1 - x * x))))
UNARY(op_sinh, (exp(x) - exp(neg(x))) / 2)
UNARY(op_cosh, (exp(x) + exp(neg(x))) / 2)
UNARY(op_asinh, log(x + sqrt(x * x + 1)))
UNARY(op_acosh, log(x + sqrt(x * x - 1)))
UNARY(op_atanh, log((1 + x) / (1 - x)) / 2)
UNARY(op_tanh, tanh(x))
UNARY(op_sigmoid, sigmoid(x))
UNARY(op_relu, relu(x))
UNARY(op_floor, floor(x))
UNARY(op_ceil, neg(floor(neg(x))))
UNARY(op_erf, erf(x))
UNARY(op_reciprocal, 1 / x)
UNARY(op_identity, x)
UNARY(op_softsign, x / (abs(x) + 1))
UNARY(op_isnan, isnan(x))
UNARY(op_not, eq(as(x, DType::i32), 0))
UNARY(op_softplus, softplus(x))
UNARY(op_hardswish, x* clamp(x / 6 + 0.5, 0.0, 1.0))
#undef UNARY

V op_sign(const Node& n) {
  const Tensor& x = n.in(0);
  return {as(as(gt(x, 0), x.dtype()) - as(lt(x, 0), x.dtype()), x.dtype())};
}

V op_round(const Node& n) {  // halves to even
  const Tensor& x = n.in(0);
  Tensor r = floor(x + 0.5);
  Tensor half = eq(r - x, 0.5);
  Tensor odd = ne(r - floor(r / 2) * 2, 0);
  return {where(logical_and_(half, odd), r - 1, r)};
}

V op_isinf(const Node& n) {
  const Tensor& x = n.in(0);
  const bool pos = n.attr_i("detect_positive", 1), negv = n.attr_i("detect_negative", 1);
  Tensor inf = isinf(x);
  if (pos && negv) return {inf};
  if (pos) return {logical_and_(inf, gt(x, 0))};
  if (negv) return {logical_and_(inf, lt(x, 0))};
  return {bools(x.sizes(), false, x.device())};
}

V op_elu(const Node& n) {
  const Tensor& x = n.in(0);
  return {where(x > 0, x, expm1(x) * n.attr_f("alpha", 1.0))};
}

V op_selu(const Node& n) {
  const Tensor& x = n.in(0);
  const double a = n.attr_f("alpha", 1.67326319217681884765625);
  const double g = n.attr_f("gamma", 1.05070102214813232421875);
  return {where(x > 0, x, expm1(x) * a) * g};
}

V op_celu(const Node& n) {
  const Tensor& x = n.in(0);
  const double a = n.attr_f("alpha", 1.0);
  return {where(x > 0, x, expm1(x / a) * a)};
}

V op_leaky_relu(const Node& n) {
  const Tensor& x = n.in(0);
  return {where(x < 0, x * n.attr_f("alpha", 0.01), x)};
}

V op_prelu(const Node& n) {
  const Tensor& x = n.in(0);
  return {where(x < 0, x * n.in(1), x)};
}

V op_thresholded_relu(const Node& n) {
  const Tensor& x = n.in(0);
  return {where(x > n.attr_f("alpha", 1.0), x, 0.0)};
}

V op_hard_sigmoid(const Node& n) {
  const Tensor& x = n.in(0);
  return {clamp(x * n.attr_f("alpha", 0.2) + n.attr_f("beta", 0.5), 0.0, 1.0)};
}

V op_shrink(const Node& n) {
  const Tensor& x = n.in(0);
  const double b = n.attr_f("bias", 0.0), l = n.attr_f("lambd", 0.5);
  return {as(where(x < -l, x + b, where(x > l, x - b, 0.0)), x.dtype())};
}

V op_gelu(const Node& n) {
  const Tensor& x = n.in(0);
  const std::string approximate = n.attr_s("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    n.fail(fmt::format("approximate \"{}\" (none or tanh)", approximate));
  return {gelu(x, approximate)};
}

// Add, Sub, Mul keep their operands' dtype (ONNX requires them equal).
#define ARITH(Name, fn)                     \
  V Name(const Node& n) {                   \
    const Tensor& a = n.in(0);              \
    return {as(fn(a, n.in(1)), a.dtype())}; \
  }
ARITH(op_add, add)
ARITH(op_sub, sub)
ARITH(op_mul, mul)
#undef ARITH

V op_div(const Node& n) {
  const Tensor &a = n.in(0), &b = n.in(1);
  if (is_floating(a.dtype())) return {div(a, b)};
  // Integers divide through f64 and truncate; by 0, the ONNX reference (NumPy's division, then
  // a cast of the infinity or NaN) gives the dtype's lowest value.
  Tensor q = as(trunc(div(as(a, DType::f64), as(b, DType::f64))), a.dtype());
  const double lowest = a.dtype() == DType::i32 ? INT32_MIN : static_cast<double>(INT64_MIN);
  return {where(eq(b, 0), full({}, lowest, like(q)), q)};
}

V op_pow(const Node& n) {
  const Tensor &a = n.in(0), &b = n.in(1);
  if (is_floating(a.dtype())) return {as(pow(a, as(b, a.dtype())), a.dtype())};
  Tensor r = pow(as(a, DType::f64), as(b, DType::f64));
  return {as(floor(r + 0.5), a.dtype())};
}

V op_mod(const Node& n) {
  const Tensor &a = n.in(0), &b = n.in(1);
  const DType d = a.dtype();
  Tensor x = as(a, DType::f64), y = as(b, DType::f64);
  Tensor q = x / y;
  Tensor r = n.attr_i("fmod", 0) ? x - y * trunc(q) : x - y * floor(q);
  // An integer modulo 0 is 0, as the ONNX reference's (NumPy's) mod and fmod.
  if (!is_floating(d)) r = where(eq(y, 0), full({}, 0, like(r)), r);
  return {as(r, d)};
}

// Max, Min, Sum, Mean: any number of broadcast operands.
template <Tensor (*fn)(const Tensor&, const Tensor&, std::source_location)>
Tensor fold(const Node& n) {
  Tensor r = n.in(0);
  for (size_t i = 1; i < n.size(); ++i) r = fn(r, n.in(i), std::source_location::current());
  return as(r, n.in(0).dtype());
}
V op_max(const Node& n) { return {fold<maximum>(n)}; }
V op_min(const Node& n) { return {fold<minimum>(n)}; }
V op_sum(const Node& n) { return {fold<add>(n)}; }
V op_mean(const Node& n) { return {fold<add>(n) / static_cast<double>(n.size())}; }

#define COMPARE(Name, fn) \
  V Name(const Node& n) { return {fn(n.in(0), n.in(1))}; }
COMPARE(op_equal, eq)
COMPARE(op_less, lt)
COMPARE(op_greater, gt)
COMPARE(op_less_equal, le)
COMPARE(op_greater_equal, ge)
#undef COMPARE

V op_and(const Node& n) { return {eq(as(n.in(0), DType::i32) + as(n.in(1), DType::i32), 2)}; }
V op_or(const Node& n) { return {gt(as(n.in(0), DType::i32) + as(n.in(1), DType::i32), 0)}; }
V op_xor(const Node& n) { return {ne(n.in(0), n.in(1))}; }

V op_where(const Node& n) { return {where(n.in(0), n.in(1), n.in(2))}; }

}  // namespace

DType dtype_attr(const Node& n, const char* name, DType fallback) {
  if (!n.has_attr(name)) return fallback;
  const int32_t e = static_cast<int32_t>(n.attr_i(name, 0));
  std::optional<DType> d = io::dtype_of(e);
  if (!d) io::unsupported_elem_type(e, fmt::format("attribute {} of {}", name, n.where()));
  return *d;
}

namespace {

V op_cast(const Node& n) { return {as(n.in(0), dtype_attr(n, "to", n.in(0).dtype()))}; }
V op_cast_like(const Node& n) { return {as(n.in(0), n.in(1).dtype())}; }

V op_clip(const Node& n) {
  Tensor x = n.in(0);
  const DType d = x.dtype();
  if (n.opset() < 11) {
    if (n.has_attr("min")) x = maximum(x, full({}, n.attr_f("min", 0), like(x)));
    if (n.has_attr("max")) x = minimum(x, full({}, n.attr_f("max", 0), like(x)));
    return {x};
  }
  if (n.has(1)) x = where(lt(x, n.in(1)), as(n.in(1), d), x);
  if (n.has(2)) x = where(gt(x, n.in(2)), as(n.in(2), d), x);
  return {as(x, d)};
}

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

}  // namespace

// A gather of the indices n-1, ..., 0.
Tensor flip(const Tensor& x, int64_t dim) {
  const int64_t len = x.sizes()[dim];
  std::vector<int64_t> idx(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) idx[static_cast<size_t>(i)] = len - 1 - i;
  return index_select(x, dim, i64s(idx, x.device()));
}

namespace {

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

}  // namespace

Tensor wrap_index(const Tensor& idx, int64_t len) {
  Tensor i = as(idx, DType::i64);
  return where(lt(i, 0), i + len, i);
}

namespace {

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
  std::vector<int64_t> r = n.ints(1), d = dims_of(x);
  if (static_cast<int64_t>(r.size()) != x.dim()) n.fail("repeats must have one value per dim");
  std::vector<int64_t> split, big, out;
  for (size_t i = 0; i < d.size(); ++i) {
    split.insert(split.end(), {1, d[i]});
    big.insert(big.end(), {r[i], d[i]});
    out.push_back(r[i] * d[i]);
  }
  return {reshape(expand(reshape(x, Shape(split)), Shape(big)).contiguous(), Shape(out))};
}

V op_range(const Node& n) {
  const Tensor& s = n.in(0);
  const double start = n.number(0), limit = n.number(1), delta = n.number(2);
  const int64_t count =
      std::max<int64_t>(static_cast<int64_t>(std::ceil((limit - start) / delta)), 0);
  Tensor i = arange(count, Options().dtype(DType::f64).device(s.device()));
  return {as(i * delta + start, s.dtype())};
}

// The (rows, cols) mask of the last two dims where col - row compares with k.
Tensor diagonal_offsets(int64_t rows, int64_t cols, Device d) {
  Tensor r = reshape(arange(rows, Options().device(d)), {rows, 1});
  Tensor c = reshape(arange(cols, Options().device(d)), {1, cols});
  return c - r;
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

}  // namespace

Tensor pad_nd(const Node& n, Tensor x, const std::vector<int64_t>& pads, const std::string& mode,
              const Tensor& value) {
  const int64_t r = x.dim();
  for (int64_t a = 0; a < r; ++a) {
    int64_t b = pads[static_cast<size_t>(a)], e = pads[static_cast<size_t>(a + r)];
    const int64_t len = x.sizes()[a];
    check_pad_dim(n, x.sizes(), a, b, e, mode);
    if (b < 0) x = slice(x, a, -b, len), b = 0;
    if (e < 0) x = slice(x, a, 0, x.sizes()[a] + e), e = 0;
    if (b == 0 && e == 0) continue;
    const int64_t m = x.sizes()[a];
    if (mode == "constant") {
      std::vector<Tensor> parts;
      std::vector<int64_t> s = dims_of(x);
      auto block = [&](int64_t k) {
        s[static_cast<size_t>(a)] = k;
        return expand(reshape(as(value, x.dtype()), {}), Shape(s)).contiguous();
      };
      if (b) parts.push_back(block(b));
      parts.push_back(x);
      if (e) parts.push_back(block(e));
      x = cat(parts, a);
      continue;
    }
    std::vector<int64_t> idx;
    for (int64_t k = -b; k < m + e; ++k) {
      int64_t j = k;
      if (mode == "edge") {
        j = std::clamp<int64_t>(k, 0, m - 1);
      } else if (mode == "reflect") {
        if (m == 1) j = 0;
        while (j < 0 || j >= m) j = j < 0 ? -j : 2 * (m - 1) - j;
      } else {
        n.fail(fmt::format("pad mode \"{}\" is not supported (constant, reflect, edge)", mode));
      }
      idx.push_back(j);
    }
    x = index_select(x, a, i64s(idx, x.device()));
  }
  return x;
}

namespace {

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

// ---- reductions ----

// The axes a Reduce* node reduces (all when none), or none at all (noop_with_empty_axes).
struct ReduceAxes {
  std::vector<int64_t> axes;
  bool noop = false;
};

ReduceAxes reduce_axes(const Node& n, int input_since) {
  const Tensor& x = n.in(0);
  ReduceAxes r;
  r.axes = n.opset() < input_since ? n.attr_ints("axes")
                                   : (n.has(1) ? n.ints(1) : std::vector<int64_t>{});
  if (r.axes.empty()) {
    if (n.attr_i("noop_with_empty_axes", 0)) r.noop = true;
    for (int64_t i = 0; i < x.dim(); ++i) r.axes.push_back(i);
  }
  for (int64_t& a : r.axes) a = n.axis(a, x.dim());
  std::sort(r.axes.begin(), r.axes.end());
  r.axes.erase(std::unique(r.axes.begin(), r.axes.end()), r.axes.end());
  return r;
}

std::vector<int64_t> reduced_shape(const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < x.dim(); ++i) {
    const bool red = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!red)
      out.push_back(x.sizes()[i]);
    else if (keep)
      out.push_back(1);
  }
  return out;
}

enum class Red { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

Tensor reduce_with(Red kind, const Tensor& x, const std::vector<int64_t>& axes, bool keep) {
  const Dims dims(axes);
  if (x.dim() == 0) return x;
  switch (kind) {
    case Red::Sum:
      return sum(x, dims, keep);
    case Red::Mean:
      return mean(x, dims, keep);
    case Red::Max:
      return max(x, dims, keep);
    case Red::Min:
      return min(x, dims, keep);
    case Red::L1:
      return sum(abs(x), dims, keep);
    case Red::L2:
      return sqrt(sum(x * x, dims, keep));
    case Red::LogSum:
      return log(sum(x, dims, keep));
    case Red::SumSquare:
      return sum(x * x, dims, keep);
    case Red::LogSumExp: {
      Tensor m = max(x, dims, true);
      m = where(isfinite(m), m, full({}, 0, like(m)));
      Tensor r = log(sum(exp(x - m), dims, true)) + m;
      return keep ? r : reshape(r, Shape(reduced_shape(x, axes, false)));
    }
    case Red::Prod: {
      // The reduced dims last, flattened, then multiplied one slice at a time.
      std::vector<int64_t> order, kept;
      for (int64_t i = 0; i < x.dim(); ++i)
        if (std::find(axes.begin(), axes.end(), i) == axes.end()) order.push_back(i);
      for (int64_t i : order) kept.push_back(x.sizes()[i]);
      order.insert(order.end(), axes.begin(), axes.end());
      std::vector<int64_t> flat = kept;
      flat.push_back(-1);
      Tensor t = reshape(permute(x, Dims(order)).contiguous(), Shape(flat));
      const int64_t k = t.sizes()[t.dim() - 1];
      Tensor r = full(Shape(kept), 1, like(x));
      for (int64_t i = 0; i < k; ++i) r = r * squeeze(slice(t, -1, i, i + 1), t.dim() - 1);
      return reshape(r, Shape(reduced_shape(x, axes, keep)));
    }
  }
  return x;
}

// The value of a reduction over no elements.
double empty_value(Red kind) {
  switch (kind) {
    case Red::Max:
    case Red::LogSumExp:
    case Red::LogSum:
      return -INFINITY;
    case Red::Min:
      return INFINITY;
    case Red::Prod:
      return 1;
    default:
      return 0;
  }
}

template <Red kind, int input_since>
V op_reduce(const Node& n) {
  const Tensor& x = n.in(0);
  ReduceAxes r = reduce_axes(n, input_since);
  if (r.noop) return {x};
  const bool keep = n.attr_i("keepdims", 1);
  bool empty = false;
  for (int64_t a : r.axes) empty = empty || x.sizes()[a] == 0;
  if (empty) {
    const double v = kind == Red::Mean ? NAN : empty_value(kind);
    return {full(Shape(reduced_shape(x, r.axes, keep)), v, like(x))};
  }
  return {as(reduce_with(kind, x, r.axes, keep), x.dtype())};
}

template <bool is_max>
V op_arg(const Node& n) {
  Tensor x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", 0), x.dim());
  const bool keep = n.attr_i("keepdims", 1);
  const bool last = n.attr_i("select_last_index", 0);
  if (last) x = flip(x, a);
  Tensor i = is_max ? argmax(x, a, keep) : argmin(x, a, keep);
  if (last) i = (x.sizes()[a] - 1) - i;
  return {i};
}

// Softmax-like ops: along axis from opset 13; before, over the dims from axis on, flattened.
template <Tensor (*fn)(const Tensor&, int64_t, std::source_location)>
V op_softmax_like(const Node& n) {
  const Tensor& x = n.in(0);
  if (n.opset() >= 13)
    return {fn(x, n.axis(n.attr_i("axis", -1), x.dim()), std::source_location::current())};
  const int64_t a = n.axis(n.attr_i("axis", 1), x.dim());
  std::vector<int64_t> d = dims_of(x);
  Tensor t = reshape(x, {prod(d, 0, static_cast<size_t>(a)), prod(d, static_cast<size_t>(a))});
  return {reshape(fn(t, 1, std::source_location::current()), Shape(d))};
}

Tensor hardmax(const Tensor& x, int64_t dim, std::source_location) {
  Tensor i = argmax(x, dim, true);
  Tensor pos = arange(x.sizes()[dim], Options().device(x.device()));
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(dim)] = x.sizes()[dim];
  return as(eq(i, reshape(pos, Shape(shape))), x.dtype());
}
Tensor softmax_(const Tensor& x, int64_t d, std::source_location) { return softmax(x, d); }
Tensor log_softmax_(const Tensor& x, int64_t d, std::source_location) { return log_softmax(x, d); }

V op_cumsum(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(static_cast<int64_t>(n.number(1)), x.dim());
  const int64_t len = x.sizes()[a];
  // out[i] = sum over j of x[j] * (j <= i), with the comparison flipped or strict as asked.
  Tensor off = diagonal_offsets(len, len, x.device());  // [i][j] = j - i
  const bool excl = n.attr_i("exclusive", 0), rev = n.attr_i("reverse", 0);
  Tensor keep = rev ? (excl ? gt(off, 0) : ge(off, 0)) : (excl ? lt(off, 0) : le(off, 0));
  Tensor t = unsqueeze(movedim_last(x, a), -2);  // (..., 1, len)
  Tensor r = sum(t * as(keep, x.dtype()), Dims{-1});
  return {as(movedim_back(r, a), x.dtype())};
}

// ---- linear algebra ----

Tensor matmul_any(const Tensor& a, const Tensor& b) {
  if (is_floating(a.dtype())) return matmul(a, b);
  return as(matmul(as(a, DType::f64), as(b, DType::f64)), a.dtype());
}

V op_matmul(const Node& n) { return {matmul_any(n.in(0), n.in(1))}; }

V op_gemm(const Node& n) {
  Tensor a = n.in(0), b = n.in(1);
  if (n.attr_i("transA", 0)) a = transpose(a, 0, 1);
  if (n.attr_i("transB", 0)) b = transpose(b, 0, 1);
  Tensor y = matmul_any(a, b);
  const double alpha = n.attr_f("alpha", 1.0), beta = n.attr_f("beta", 1.0);
  if (alpha != 1.0) y = y * alpha;
  if (n.has(2)) y = beta != 1.0 ? y + n.in(2) * beta : y + n.in(2);
  return {as(y, n.in(0).dtype())};
}

V op_einsum(const Node& n);

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

V op_conv(const Node& n) {
  const Tensor &x = n.in(0), &wt = n.in(1);
  const std::vector<int64_t> k = spatial_kernel(n, x, &wt);
  const Window w = window(n, x, k, false);
  const int64_t N = x.sizes()[0], C = x.sizes()[1], M = wt.sizes()[0];
  const int64_t G = n.attr_i("group", 1), K = prod(k), L = prod(w.out);
  if (C % G || M % G || wt.sizes()[1] != C / G)
    n.fail(fmt::format("input channels {}, weight {} and group {} do not fit", C, wt.sizes(), G));
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

V op_max_pool(const Node& n) {
  const Tensor& x = n.in(0);
  const Window w = window(n, x, spatial_kernel(n, x, nullptr), n.attr_i("ceil_mode", 0));
  const double lowest = is_floating(x.dtype()) ? -INFINITY : -9.2e18;
  Tensor stacked = windows(n, x, w, lowest);
  Tensor y = max(stacked, Dims{0});
  if (!n.wants(1)) return {y};
  return {y, pool_indices(n, x, w, stacked)};
}

V op_avg_pool(const Node& n) {
  const Tensor& x = n.in(0);
  const Window w = window(n, x, spatial_kernel(n, x, nullptr), n.attr_i("ceil_mode", 0));
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

namespace {

// Einsum by broadcasting: each operand's labels laid out in one order (the output's labels
// first), multiplied, and the other labels summed. A label repeated in an operand takes its
// diagonal first; "..." stands for the same broadcast dims in every operand.
V op_einsum(const Node& n) {
  std::string eq_s;
  for (char c : n.attr_s("equation", ""))
    if (c != ' ') eq_s += c;
  const size_t arrow = eq_s.find("->");
  std::string lhs = eq_s.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t at = 0;;) {
    const size_t comma = lhs.find(',', at);
    terms.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (terms.size() != n.size())
    n.fail(fmt::format("\"{}\" names {} operands, the node has {}", eq_s, terms.size(), n.size()));
  // "..." becomes the digits '0'.. for the broadcast dims, right-aligned across operands.
  int64_t ell = 0;
  for (size_t i = 0; i < terms.size(); ++i)
    if (terms[i].find("...") != std::string::npos)
      ell = std::max<int64_t>(ell, n.in(i).dim() - static_cast<int64_t>(terms[i].size() - 3));
  auto expand_ell = [&](const std::string& t, int64_t rank) {
    const size_t at = t.find("...");
    if (at == std::string::npos) return t;
    const int64_t k = rank < 0 ? ell : rank - static_cast<int64_t>(t.size() - 3);
    std::string digits;
    for (int64_t i = ell - k; i < ell; ++i) digits += static_cast<char>('0' + i);
    return t.substr(0, at) + digits + t.substr(at + 3);
  };
  for (size_t i = 0; i < terms.size(); ++i) terms[i] = expand_ell(terms[i], n.in(i).dim());
  std::string out;
  if (arrow != std::string::npos) {
    out = expand_ell(eq_s.substr(arrow + 2), -1);
  } else {  // implicit: the labels seen once, sorted, after the broadcast dims
    std::map<char, int> count;
    for (const std::string& t : terms)
      for (char c : t) ++count[c];
    for (int64_t i = 0; i < ell; ++i) out += static_cast<char>('0' + i);
    for (auto [c, k] : count)
      if (k == 1 && !std::isdigit(static_cast<unsigned char>(c))) out += c;
  }
  std::string order = out;
  for (const std::string& t : terms)
    for (char c : t)
      if (order.find(c) == std::string::npos) order += c;
  std::map<char, int64_t> size;
  Tensor product;
  for (size_t i = 0; i < terms.size(); ++i) {
    Tensor x = n.in(i);
    std::string t = terms[i];
    if (static_cast<int64_t>(t.size()) != x.dim())
      n.fail(fmt::format("operand {} has rank {}, \"{}\" names {} dims", i, x.dim(), t, t.size()));
    for (size_t a = 0; a < t.size(); ++a) {  // diagonals of repeated labels
      const size_t b = t.find(t[a], a + 1);
      if (b == std::string::npos) continue;
      const int64_t len = x.sizes()[static_cast<int64_t>(a)];
      std::vector<int64_t> sa(static_cast<size_t>(x.dim()), 1), sb = sa;
      sa[a] = len;
      sb[b] = len;
      Tensor r = arange(len, Options().device(x.device()));
      Tensor eye = eq(reshape(r, Shape(sa)), reshape(r, Shape(sb)));
      x = sum(x * as(eye, x.dtype()), Dims{static_cast<int64_t>(b)});
      t.erase(b, 1);
      --a;
    }
    std::vector<int64_t> perm, shape;
    for (char c : order) {
      const size_t at = t.find(c);
      if (at == std::string::npos) continue;
      perm.push_back(static_cast<int64_t>(at));
    }
    x = permute(x, Dims(perm));
    for (char c : order) {
      const size_t at = t.find(c);
      shape.push_back(
          at == std::string::npos
              ? 1
              : x.sizes()[static_cast<int64_t>(
                    std::find(perm.begin(), perm.end(), static_cast<int64_t>(at)) - perm.begin())]);
    }
    x = reshape(x, Shape(shape));
    product = product.defined() ? product * x : x;
  }
  std::vector<int64_t> summed;
  for (size_t i = out.size(); i < order.size(); ++i) summed.push_back(static_cast<int64_t>(i));
  Tensor r = summed.empty() ? product : sum(product, Dims(summed));
  return {as(r, n.in(0).dtype())};
}

}  // namespace

// Every op this file maps.
std::vector<OpEntry> core_ops() {
  return {
      {"Abs", op_abs},
      {"Acos", op_acos},
      {"Acosh", op_acosh},
      {"Add", op_add},
      {"And", op_and},
      {"ArgMax", op_arg<true>},
      {"ArgMin", op_arg<false>},
      {"Asin", op_asin},
      {"Asinh", op_asinh},
      {"Atan", op_atan},
      {"Atanh", op_atanh},
      {"AveragePool", op_avg_pool},
      {"BatchNormalization", op_batch_norm},
      {"Cast", op_cast},
      {"CastLike", op_cast_like},
      {"Ceil", op_ceil},
      {"Celu", op_celu},
      {"Clip", op_clip},
      {"Concat", op_concat},
      {"Constant", op_constant},
      {"ConstantOfShape", op_constant_of_shape},
      {"Conv", op_conv},
      {"Cos", op_cos},
      {"Cosh", op_cosh},
      {"CumSum", op_cumsum},
      {"DepthToSpace", op_depth_to_space},
      {"Div", op_div},
      {"Dropout", op_dropout},
      {"Einsum", op_einsum},
      {"Elu", op_elu},
      {"Equal", op_equal},
      {"Erf", op_erf},
      {"Exp", op_exp},
      {"Expand", op_expand},
      {"EyeLike", op_eye_like},
      {"Flatten", op_flatten},
      {"Floor", op_floor},
      {"Gather", op_gather},
      {"GatherElements", op_gather_elements},
      {"Gelu", op_gelu},
      {"Gemm", op_gemm},
      {"GlobalAveragePool", op_global_pool<false>},
      {"GlobalMaxPool", op_global_pool<true>},
      {"Greater", op_greater},
      {"GreaterOrEqual", op_greater_equal},
      {"HardSigmoid", op_hard_sigmoid},
      {"HardSwish", op_hardswish},
      {"Hardmax", op_softmax_like<hardmax>},
      {"Identity", op_identity},
      {"InstanceNormalization", op_instance_norm},
      {"IsInf", op_isinf},
      {"IsNaN", op_isnan},
      {"LRN", op_lrn},
      {"LayerNormalization", op_layer_norm},
      {"LeakyRelu", op_leaky_relu},
      {"Less", op_less},
      {"LessOrEqual", op_less_equal},
      {"Log", op_log},
      {"LogSoftmax", op_softmax_like<log_softmax_>},
      {"MatMul", op_matmul},
      {"Max", op_max},
      {"MaxPool", op_max_pool},
      {"Mean", op_mean},
      {"MeanVarianceNormalization", op_mvn},
      {"Min", op_min},
      {"Mod", op_mod},
      {"Mul", op_mul},
      {"Neg", op_neg},
      {"NegativeLogLikelihoodLoss", op_nll_loss},
      {"Not", op_not},
      {"OneHot", op_one_hot},
      {"Or", op_or},
      {"PRelu", op_prelu},
      {"Pad", op_pad},
      {"Pow", op_pow},
      {"Range", op_range},
      {"Reciprocal", op_reciprocal},
      {"ReduceL1", op_reduce<Red::L1, 18>},
      {"ReduceL2", op_reduce<Red::L2, 18>},
      {"ReduceLogSum", op_reduce<Red::LogSum, 18>},
      {"ReduceLogSumExp", op_reduce<Red::LogSumExp, 18>},
      {"ReduceMax", op_reduce<Red::Max, 18>},
      {"ReduceMean", op_reduce<Red::Mean, 18>},
      {"ReduceMin", op_reduce<Red::Min, 18>},
      {"ReduceProd", op_reduce<Red::Prod, 18>},
      {"ReduceSum", op_reduce<Red::Sum, 13>},
      {"ReduceSumSquare", op_reduce<Red::SumSquare, 18>},
      {"Relu", op_relu},
      {"Reshape", op_reshape},
      {"Round", op_round},
      {"Selu", op_selu},
      {"Shape", op_shape},
      {"Shrink", op_shrink},
      {"Sigmoid", op_sigmoid},
      {"Sign", op_sign},
      {"Sin", op_sin},
      {"Sinh", op_sinh},
      {"Size", op_size},
      {"Slice", op_slice},
      {"Softmax", op_softmax_like<softmax_>},
      {"SoftmaxCrossEntropyLoss", op_softmax_ce},
      {"Softplus", op_softplus},
      {"Softsign", op_softsign},
      {"SpaceToDepth", op_space_to_depth},
      {"Split", op_split},
      {"Sqrt", op_sqrt},
      {"Squeeze", op_squeeze},
      {"Sub", op_sub},
      {"Sum", op_sum},
      {"Tan", op_tan},
      {"Tanh", op_tanh},
      {"ThresholdedRelu", op_thresholded_relu},
      {"Tile", op_tile},
      {"Transpose", op_transpose},
      {"Trilu", op_trilu},
      {"Unsqueeze", op_unsqueeze},
      {"Where", op_where},
      {"Xor", op_xor},
  };
}

namespace {
// Every mapped op, by name. An op absent here raises the "no mapping" error at import.
const std::map<std::string, ImportFn>& table() {
  static const std::map<std::string, ImportFn> t = [] {
    std::map<std::string, ImportFn> r;
    for (auto* part : {core_ops, data_ops, image_ops, control_ops})
      for (const OpEntry& e : part())
        if (!r.emplace(e.name, e.fn).second)
          throw InternalError(fmt::format("[import_onnx] {} is mapped twice", e.name));
    return r;
  }();
  return t;
}
}  // namespace

std::string op_key(const onnx::NodeProto& n) {
  if (n.domain().empty() || n.domain() == "ai.onnx") return n.op_type();
  if (n.domain() == "ai.onnx.preview.training") return n.domain() + "." + n.op_type();
  return "";
}

ImportFn find_op(const std::string& op_type) {
  auto it = table().find(op_type);
  return it == table().end() ? nullptr : it->second;
}

std::vector<std::string> mapped_ops() {
  std::vector<std::string> r;
  for (const auto& [name, fn] : table()) r.push_back(name);
  return r;
}

bool is_random(const std::string& op_type) {
  return op_type == "Dropout" || op_type.starts_with("Random") || op_type == "Bernoulli" ||
         op_type == "Multinomial";
}

}  // namespace duet::detail::onnx_import
