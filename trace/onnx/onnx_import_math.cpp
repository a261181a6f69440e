// ONNX import, the arithmetic ops: elementwise math, comparisons and logic, casts, reductions,
// softmax-like ops, cumulative sums and linear algebra (MatMul, Gemm, Einsum), each written in
// duet's public ops. Semantics follow the ONNX operator specification, opset by opset.
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
UNARY(op_tan, tan(x))
UNARY(op_atan, atan(x))
UNARY(op_asin, asin(x))
UNARY(op_acos, acos(x))
UNARY(op_sinh, sinh(x))
UNARY(op_cosh, cosh(x))
UNARY(op_asinh, asinh(x))
UNARY(op_acosh, acosh(x))
UNARY(op_atanh, atanh(x))
UNARY(op_tanh, tanh(x))
UNARY(op_sigmoid, sigmoid(x))
UNARY(op_relu, relu(x))
UNARY(op_floor, floor(x))
UNARY(op_ceil, ceil(x))
UNARY(op_erf, erf(x))
UNARY(op_reciprocal, 1 / x)
UNARY(op_identity, x)
UNARY(op_softsign, x / (abs(x) + 1))
UNARY(op_isnan, isnan(x))
UNARY(op_not, eq(as(x, DType::i32), 0))
UNARY(op_softplus, softplus(x))
UNARY(op_hardswish, x* clamp(x / 6 + 0.5, 0.0, 1.0))
UNARY(op_sign, sign(x))
UNARY(op_round, round(x))  // (halves to even, as ONNX's)
#undef UNARY

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
  const double lowest = static_cast<double>(::duet::detail::integral_range(a.dtype()).least);
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
    case Red::Prod:  // (duet's prod multiplies integers in i64; ONNX keeps the dtype)
      return prod(x, dims, keep).to(x.dtype());
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
std::vector<OpEntry> math_ops() {
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
      {"Cast", op_cast},
      {"CastLike", op_cast_like},
      {"Ceil", op_ceil},
      {"Celu", op_celu},
      {"Clip", op_clip},
      {"Cos", op_cos},
      {"Cosh", op_cosh},
      {"CumSum", op_cumsum},
      {"Div", op_div},
      {"Einsum", op_einsum},
      {"Elu", op_elu},
      {"Equal", op_equal},
      {"Erf", op_erf},
      {"Exp", op_exp},
      {"Floor", op_floor},
      {"Gelu", op_gelu},
      {"Gemm", op_gemm},
      {"Greater", op_greater},
      {"GreaterOrEqual", op_greater_equal},
      {"HardSigmoid", op_hard_sigmoid},
      {"HardSwish", op_hardswish},
      {"Hardmax", op_softmax_like<hardmax>},
      {"Identity", op_identity},
      {"IsInf", op_isinf},
      {"IsNaN", op_isnan},
      {"LeakyRelu", op_leaky_relu},
      {"Less", op_less},
      {"LessOrEqual", op_less_equal},
      {"Log", op_log},
      {"LogSoftmax", op_softmax_like<log_softmax_>},
      {"MatMul", op_matmul},
      {"Max", op_max},
      {"Mean", op_mean},
      {"Min", op_min},
      {"Mod", op_mod},
      {"Mul", op_mul},
      {"Neg", op_neg},
      {"Not", op_not},
      {"Or", op_or},
      {"PRelu", op_prelu},
      {"Pow", op_pow},
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
      {"Round", op_round},
      {"Selu", op_selu},
      {"Shrink", op_shrink},
      {"Sigmoid", op_sigmoid},
      {"Sign", op_sign},
      {"Sin", op_sin},
      {"Sinh", op_sinh},
      {"Softmax", op_softmax_like<softmax_>},
      {"Softplus", op_softplus},
      {"Softsign", op_softsign},
      {"Sqrt", op_sqrt},
      {"Sub", op_sub},
      {"Sum", op_sum},
      {"Tan", op_tan},
      {"Tanh", op_tanh},
      {"ThresholdedRelu", op_thresholded_relu},
      {"Where", op_where},
      {"Xor", op_xor},
  };
}

}  // namespace duet::detail::onnx_import
