// Elementwise ops: shape/dtype rules and the public builders.
#include <algorithm>
#include <limits>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {

DType result_type(TensorRefs in) {
  SmallVec<PromotionArg, 4> args;
  for (int64_t i = 0; i < in.size(); ++i) {
    const TensorImpl* t = in[i].impl();
    args.push_back({t->dtype, t->shape.size() == 0, t->wrapped_number});
  }
  return result_type(args.data(), args.size());
}

DType result_type(const PromotionArg* in, int64_t n) {
  // PyTorch's three-tier promotion: dimensioned tensors, then 0-d tensors, then wrapped numbers.
  int dim_r = -1, zero_r = -1, wrap_r = -1;
  auto up = [](int cur, DType d) {
    return cur < 0 ? static_cast<int>(d) : static_cast<int>(promote_types(DType(cur), d));
  };
  for (int64_t i = 0; i < n; ++i) {
    const PromotionArg& t = in[i];
    if (t.wrapped) {
      // A Python-like number only contributes its kind: float -> default float, int -> i64.
      DType k = is_floating(t.dtype) ? DType::f32 : t.dtype;
      wrap_r = up(wrap_r, k);
    } else if (t.zero_dim) {
      zero_r = up(zero_r, t.dtype);
    } else {
      dim_r = up(dim_r, t.dtype);
    }
  }
  auto combine = [](int higher, int lower) {
    if (higher < 0) return lower;
    if (lower < 0) return higher;
    DType h = DType(higher), l = DType(lower);
    if (category(l) > category(h)) return static_cast<int>(promote_types(h, l));
    return higher;
  };
  int r = combine(dim_r, combine(zero_r, wrap_r));
  return DType(r);
}

Device common_device(const OpDef& def, TensorRefs in) {
  Device dev = Device::cpu();
  bool found = false;
  for (int64_t i = 0; i < in.size(); ++i) {
    const TensorImpl* t = in[i].impl();
    if (goes_anywhere(def, t)) continue;  // the others decide the device
    Device d = t->device();
    if (!found) {
      dev = d;
      found = true;
    } else {
      DUET_CHECK_DEVICE(d == dev, "[{}] expected all tensors on one device, got {} and {}",
                        def.name, dev.str(), d.str());
    }
  }
  return dev;
}

namespace {

void infer_unary(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const TensorImpl* x = in[0].impl();
  out.shape = x->shape;
  out.device = x->device();
  DType d = x->dtype;
  if (unary_math(def.id) == UnaryMath::Float) {
    out.dtype = is_floating(d) ? d : DType::f32;
    return;
  }
  DUET_CHECK_DTYPE(d != DType::b8, "[{}] is not defined for b8 tensors of shape {}", def.name,
                   x->shape);
  out.dtype = d;
}

// A wrapped number (a C++ Scalar operand) must fit the dtype the op computes in: i32 + 2^40 is a
// ValueError, as in PyTorch, never a silently wrapped value. A float Scalar promotes to a float
// dtype and i64 holds every integer Scalar, so only an i32 result needs the check, which the
// callers run on the wrapped-number path only. Comparisons widen instead (compare() below).
void check_wrapped_fit(const OpDef& def, TensorRefs in, DType d) {
  for (int64_t i = 0; i < in.size(); ++i) {
    const TensorImpl* t = in[i].impl();
    if (t->wrapped_number && t->dtype == DType::i64 && t->storage && t->storage->data)
      check_fits(def.name, Scalar(*static_cast<const int64_t*>(t->data())), d);
  }
}

void infer_binary(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const TensorImpl* a = in[0].impl();
  const TensorImpl* b = in[1].impl();
  bool wrapped = false;
  // Fast path: the eager hot loop (same shape, same dtype, same device).
  if (a->dtype == b->dtype && !a->wrapped_number && !b->wrapped_number && a->shape == b->shape &&
      a->device() == b->device()) {
    out.shape = a->shape;
    out.dtype = a->dtype;
    out.device = a->device();
  } else {
    out.shape = broadcast_shapes(def.name, a->shape, b->shape);
    out.dtype = result_type(in);
    out.device = common_device(def, in);
    wrapped = a->wrapped_number || b->wrapped_number;
  }
  if (is_compare(def.id)) {
    out.dtype = DType::b8;
    return;
  }
  switch (def.id) {
    case OpId::Div:
      if (!is_floating(out.dtype)) out.dtype = DType::f32;
      break;
    case OpId::Sub:
      DUET_CHECK_DTYPE(out.dtype != DType::b8,
                       "[sub] subtraction of b8 tensors (shapes {} and {}) is not supported; use "
                       "ne() or where() instead",
                       a->shape, b->shape);
      break;
    case OpId::Pow:
      DUET_CHECK_DTYPE(out.dtype != DType::b8,
                       "[pow] is not defined for a b8 base and exponent (shapes {} and {})",
                       a->shape, b->shape);
      break;
    default:
      break;
  }
  if (__builtin_expect(wrapped, 0) && detail::is_narrower_than_i64(out.dtype))
    check_wrapped_fit(def, in, out.dtype);
}

void infer_where(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const TensorImpl* c = in[0].impl();
  DUET_CHECK_DTYPE(c->dtype == DType::b8, "[where] condition must be b8, got {} of shape {}",
                   c->dtype, c->shape);
  out.shape =
      broadcast_shapes("where", broadcast_shapes("where", c->shape, in[1].sizes()), in[2].sizes());
  const Tensor* ab[] = {&in[1], &in[2]};
  out.dtype = result_type(TensorRefs(ab, 2));
  out.device = common_device(def, in);
  if (detail::is_narrower_than_i64(out.dtype)) check_wrapped_fit(def, TensorRefs(ab, 2), out.dtype);
}

void infer_cast(const OpDef&, TensorRefs in, const Attrs& attrs, TensorMeta& out) {
  out.shape = in[0].sizes();
  out.dtype = attrs.dtype;
  out.device = in[0].device();
}

void infer_copy(const OpDef&, TensorRefs in, const Attrs&, TensorMeta& out) {
  out.shape = in[0].sizes();
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

// ---- gradient rules (duet ops, so they are taped with create_graph and traced) --------------
// Kinks follow PyTorch: relu'(0) = 0, abs'(0) = 0, and maximum/minimum split ties evenly.

// DUET_GRAD(Name, saves) defines the rule of the family row Name (core/elementwise.def) and what
// it reads (kSave* bits); register_elementwise_rules registers one per row.
#define DUET_GRAD(Name, saves)            \
  constexpr uint8_t kSaves##Name = saves; \
  void grad_##Name(const GradCtx& c, const Tensor& g, Tensor* gi)
DUET_GRAD(Neg, 0) { gi[0] = neg(g); }
DUET_GRAD(Exp, kSaveOut) { gi[0] = g * c.output; }
DUET_GRAD(Expm1, kSaveOut) { gi[0] = g * (c.output + 1); }
DUET_GRAD(Exp2, kSaveOut) { gi[0] = g * c.output * 0.69314718055994530942; }  // ln 2
DUET_GRAD(Log, kSaveIn0) { gi[0] = g / c.inputs[0]; }
DUET_GRAD(Log1p, kSaveIn0) { gi[0] = g / (c.inputs[0] + 1); }
DUET_GRAD(Log2, kSaveIn0) { gi[0] = g / (c.inputs[0] * 0.69314718055994530942); }
DUET_GRAD(Log10, kSaveIn0) { gi[0] = g / (c.inputs[0] * 2.30258509299404568402); }  // ln 10
DUET_GRAD(Sqrt, kSaveOut) { gi[0] = g * 0.5 / c.output; }
DUET_GRAD(Rsqrt, kSaveOut) { gi[0] = g * (c.output * c.output * c.output) * -0.5; }
DUET_GRAD(Abs, kSaveIn0) {
  const Tensor& x = c.inputs[0];
  gi[0] = g * (gt(x, 0).to(g.dtype()) - lt(x, 0).to(g.dtype()));
}
DUET_GRAD(Sin, kSaveIn0) { gi[0] = g * cos(c.inputs[0]); }
DUET_GRAD(Cos, kSaveIn0) { gi[0] = neg(g * sin(c.inputs[0])); }
DUET_GRAD(Tan, kSaveOut) { gi[0] = g * (c.output * c.output + 1); }
DUET_GRAD(Asin, kSaveIn0) { gi[0] = g * rsqrt(1 - c.inputs[0] * c.inputs[0]); }
DUET_GRAD(Acos, kSaveIn0) { gi[0] = neg(g * rsqrt(1 - c.inputs[0] * c.inputs[0])); }
DUET_GRAD(Atan, kSaveIn0) { gi[0] = g / (c.inputs[0] * c.inputs[0] + 1); }
DUET_GRAD(Sinh, kSaveIn0) { gi[0] = g * cosh(c.inputs[0]); }
DUET_GRAD(Cosh, kSaveIn0) { gi[0] = g * sinh(c.inputs[0]); }
DUET_GRAD(Tanh, kSaveOut) { gi[0] = g * (1 - c.output * c.output); }
DUET_GRAD(Asinh, kSaveIn0) { gi[0] = g * rsqrt(c.inputs[0] * c.inputs[0] + 1); }
DUET_GRAD(Acosh, kSaveIn0) { gi[0] = g * rsqrt(c.inputs[0] * c.inputs[0] - 1); }
DUET_GRAD(Atanh, kSaveIn0) { gi[0] = g / (1 - c.inputs[0] * c.inputs[0]); }
DUET_GRAD(Sigmoid, kSaveOut) { gi[0] = g * c.output * (1 - c.output); }
DUET_GRAD(Relu, kSaveOut) { gi[0] = g * gt(c.output, 0); }
// The rounding ops and sign: zero almost everywhere, as in PyTorch: a zero tensor of g's dims.
Tensor zero_gradient(const Tensor& g) {
  return full_dims(sym_dims(g), 0, Options().dtype(g.dtype()).device(g.device()));
}
DUET_GRAD(Floor, 0) { gi[0] = zero_gradient(g); }
DUET_GRAD(Ceil, 0) { gi[0] = zero_gradient(g); }
DUET_GRAD(Round, 0) { gi[0] = zero_gradient(g); }
DUET_GRAD(Trunc, 0) { gi[0] = zero_gradient(g); }
DUET_GRAD(Sign, 0) { gi[0] = zero_gradient(g); }
DUET_GRAD(Erf, kSaveIn0) {
  const Tensor& x = c.inputs[0];
  gi[0] = g * exp(neg(x * x)) * 1.12837916709551257390;  // 2 / sqrt(pi)
}
DUET_GRAD(LogSigmoid, kSaveIn0) { gi[0] = g * sigmoid(neg(c.inputs[0])); }
// Note [GELU's tanh form as one op] in kernels/functors.h: the derivative is an op of its own;
// its own derivative (for a second backward) is composed: with k = 2 sqrt(2/pi), c = 0.044715,
// u = k (x + c x^3), s = sigmoid(u), u' = k (1 + 3c x^2) and t = s (1 - s) u', gelu' = s + x t
// and gelu'' = 2t + x (t (1 - 2s) u' + s (1 - s) 6ck x).
DUET_GRAD(GeluTanh, kSaveIn0) { gi[0] = g * gelu_tanh_grad(c.inputs[0]); }
DUET_GRAD(GeluTanhGrad, kSaveIn0) {
  const Tensor& x = c.inputs[0];
  constexpr double k = 1.5957691216057307118, c3 = 0.044715;
  const Tensor s = sigmoid((x + x * x * x * c3) * k), ds = s * (1 - s);
  const Tensor du = (1 + x * x * (3 * c3)) * k, t = ds * du;
  gi[0] = g * (2 * t + x * (t * (1 - 2 * s) * du + ds * x * (6 * c3 * k)));
}
DUET_GRAD(Add, 0) {
  gi[0] = g;
  gi[1] = g;
}
DUET_GRAD(Sub, 0) {
  gi[0] = g;
  if (c.needs_grad(1)) gi[1] = neg(g);
}
DUET_GRAD(Mul, kSaveIn0 | kSaveIn1) {
  if (c.needs_grad(0)) gi[0] = g * c.inputs[1];
  if (c.needs_grad(1)) gi[1] = g * c.inputs[0];
}
// a is read only for b's gradient: a.div_(2) stays differentiable.
DUET_GRAD(Div, kSaveIn0 | kSaveIn1) {
  const Tensor& b = c.inputs[1];
  if (c.needs_grad(0)) gi[0] = g / b;
  if (c.needs_grad(1)) gi[1] = neg(g * c.inputs[0]) / (b * b);
}
DUET_GRAD(Pow, kSaveIn0 | kSaveIn1) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  if (c.needs_grad(0)) {
    // b - 1 against a 0-d one in the gradient's dtype: a wrapped number minus the Scalar 1 would
    // promote to the default f32 and round pow(x, 1.0 / 3)'s exponent. x^0 is constant, so its
    // gradient is 0 also at x = 0, where b * a^(b - 1) is 0 * inf (as PyTorch).
    Tensor one = ones({}, Options().dtype(g.dtype()).device(g.device()));
    gi[0] = where(eq(b, 0), 0, g * b * pow(a, b - one));
  }
  // d/db a^b = a^b log a, taken as 0 where a == 0 and b >= 0 (PyTorch's convention).
  if (c.needs_grad(1)) gi[1] = where(eq(a, 0) * ge(b, 0), 0, g * pow(a, b) * log(a));
}
void grad_extremum(const GradCtx& c, const Tensor& g, Tensor* gi, bool is_max) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  Tensor half = eq(a, b).to(g.dtype()) * 0.5;
  Tensor a_wins = (is_max ? gt(a, b) : lt(a, b)).to(g.dtype());
  if (c.needs_grad(0)) gi[0] = g * (a_wins + half);
  if (c.needs_grad(1)) gi[1] = g * ((is_max ? lt(a, b) : gt(a, b)).to(g.dtype()) + half);
}
DUET_GRAD(Maximum, kSaveIn0 | kSaveIn1) { grad_extremum(c, g, gi, true); }
DUET_GRAD(Minimum, kSaveIn0 | kSaveIn1) { grad_extremum(c, g, gi, false); }
DUET_GRAD(Where, kSaveIn0) {
  const Tensor& cond = c.inputs[0];
  if (c.needs_grad(1)) gi[1] = where(cond, g, 0);
  if (c.needs_grad(2)) gi[2] = where(cond, 0, g);
}
DUET_GRAD(Identity, 0) { gi[0] = g; }  // Cast and Copy: the engine converts the dtype back
#undef DUET_GRAD

}  // namespace

void register_elementwise_rules(OpDef* t) {
#define DUET_UNARY(Name, name, math, doc)             \
  set_grad(t, OpId::Name, grad_##Name, kSaves##Name); \
  t[int(OpId::Name)].infer = infer_unary;
#define DUET_BINARY(Name, name, doc)                  \
  set_grad(t, OpId::Name, grad_##Name, kSaves##Name); \
  t[int(OpId::Name)].infer = infer_binary;
#define DUET_COMPARE(Name, name, expr, doc) \
  set_not_differentiable(t, OpId::Name);    \
  t[int(OpId::Name)].infer = infer_binary;
#include "core/elementwise.def"
  set_grad(t, OpId::Where, grad_Where, kSavesWhere);
  set_grad(t, OpId::Cast, grad_Identity, kSavesIdentity);
  set_grad(t, OpId::Copy, grad_Identity, kSavesIdentity);
  t[int(OpId::Where)].infer = infer_where;
  t[int(OpId::Cast)].infer = infer_cast;
  t[int(OpId::Copy)].infer = infer_copy;
  // Under autocast these run in f32, as on PyTorch's autocast lists (Note [Autocast] in
  // core/autocast.h).
  for (OpId op : {OpId::Exp, OpId::Expm1, OpId::Log, OpId::Log1p, OpId::Rsqrt, OpId::Pow})
    t[int(op)].autocast = AutocastClass::F32;
}

}  // namespace detail

// ---- builders -------------------------------------------------------------------------------

namespace {

const Attrs kNoAttrs{};

Tensor unary(OpId op, const Tensor& x, unsigned expiring) {
  const Tensor* in[] = {&x};
  return detail::call(op, TensorRefs(in, 1), kNoAttrs, expiring);
}
Tensor binary(OpId op, const Tensor& a, const Tensor& b, unsigned expiring) {
  const Tensor* in[] = {&a, &b};
  return detail::call(op, TensorRefs(in, 2), kNoAttrs, expiring);
}
// A Scalar operand becomes a 0-d "wrapped number" on the tensor's device: it promotes like a
// Scalar and a traced graph sees it as a constant.
Tensor wrap(const Scalar& s, const Tensor& like) {
  DType d = s.is_floating() ? DType::f64 : s.is_integral() ? DType::i64 : DType::b8;
  return detail::wrap_scalar(s, d, like.device());
}

}  // namespace

#define DUET_UNARY(Name, name, math, doc)                  \
  Tensor name(const Tensor& x, std::source_location loc) { \
    detail::SiteGuard site(loc);                           \
    return unary(OpId::Name, x, 0);                        \
  }                                                        \
  Tensor name(Tensor&& x, std::source_location loc) {      \
    detail::SiteGuard site(loc);                           \
    return unary(OpId::Name, x, 1);                        \
  }
#include "core/elementwise.def"

#define DUET_SITED(sig, body)    \
  Tensor sig {                   \
    detail::SiteGuard site(loc); \
    return body;                 \
  }
#define DUET_DEFINE_BINARY(name, Op)                                                            \
  DUET_SITED(name(const Tensor& a, const Tensor& b, std::source_location loc),                  \
             binary(OpId::Op, a, b, 0))                                                         \
  DUET_SITED(name(Tensor&& a, const Tensor& b, std::source_location loc),                       \
             binary(OpId::Op, a, b, 1))                                                         \
  DUET_SITED(name(const Tensor& a, Tensor&& b, std::source_location loc),                       \
             binary(OpId::Op, a, b, 2))                                                         \
  DUET_SITED(name(Tensor&& a, Tensor&& b, std::source_location loc), binary(OpId::Op, a, b, 3)) \
  DUET_SITED(name(const Tensor& a, Scalar b, std::source_location loc),                         \
             binary(OpId::Op, a, wrap(b, a), 0))                                                \
  DUET_SITED(name(Tensor&& a, Scalar b, std::source_location loc),                              \
             binary(OpId::Op, a, wrap(b, a), 1))                                                \
  DUET_SITED(name(Scalar a, const Tensor& b, std::source_location loc),                         \
             binary(OpId::Op, wrap(a, b), b, 0))                                                \
  DUET_SITED(name(Scalar a, Tensor&& b, std::source_location loc),                              \
             binary(OpId::Op, wrap(a, b), b, 2))
#define DUET_BINARY(Name, name, doc) DUET_DEFINE_BINARY(name, Name)
#include "core/elementwise.def"
#undef DUET_DEFINE_BINARY

namespace {
// A comparison with an integer Scalar outside the range of an i32 (or narrower) tensor has an
// exact answer: the tensor is widened to i64 first (PyTorch promotes the same way for a float
// Scalar, which already promotes to f32 here). In range, it is the plain call.
Tensor compare(OpId op, const Tensor& t, const Scalar& s, bool scalar_first) {
  Tensor w = wrap(s, t);
  if (__builtin_expect(
          detail::is_narrower_than_i64(t.dtype()) && s.is_integral() && !s.fits(t.dtype()), 0)) {
    Tensor wide = t.to(DType::i64);
    return scalar_first ? binary(op, w, wide, 0) : binary(op, wide, w, 0);
  }
  return scalar_first ? binary(op, w, t, 0) : binary(op, t, w, 0);
}
}  // namespace

#define DUET_DEFINE_COMPARE(name, Op)                                          \
  DUET_SITED(name(const Tensor& a, const Tensor& b, std::source_location loc), \
             binary(OpId::Op, a, b, 0))                                        \
  DUET_SITED(name(const Tensor& a, Scalar b, std::source_location loc),        \
             compare(OpId::Op, a, b, false))                                   \
  DUET_SITED(name(Scalar a, const Tensor& b, std::source_location loc),        \
             compare(OpId::Op, b, a, true))
#define DUET_COMPARE(Name, name, expr, doc) DUET_DEFINE_COMPARE(name, Name)
#include "core/elementwise.def"
#undef DUET_DEFINE_COMPARE
#undef DUET_SITED

// An operator's Located operand (Note [Call sites]): the expiring flag picks the overload that
// may reuse its buffer. The tensor was an rvalue the caller gave away, so moving from it is what
// the plain overloads did.
namespace {
Tensor&& moved(const Located& x) { return std::move(const_cast<Tensor&>(x.tensor)); }
}  // namespace
#define DUET_DEFINE_OPERATOR(sym, fn)                                                          \
  Tensor operator sym(Located a, const Tensor& b) {                                            \
    return a.expiring ? fn(moved(a), b, a.loc) : fn(a.tensor, b, a.loc);                       \
  }                                                                                            \
  Tensor operator sym(Located a, Tensor&& b) {                                                 \
    return a.expiring ? fn(moved(a), std::move(b), a.loc) : fn(a.tensor, std::move(b), a.loc); \
  }                                                                                            \
  Tensor operator sym(Located a, Scalar b) {                                                   \
    return a.expiring ? fn(moved(a), b, a.loc) : fn(a.tensor, b, a.loc);                       \
  }                                                                                            \
  Tensor operator sym(Scalar a, Located b) {                                                   \
    return b.expiring ? fn(a, moved(b), b.loc) : fn(a, b.tensor, b.loc);                       \
  }
DUET_DEFINE_OPERATOR(+, add)
DUET_DEFINE_OPERATOR(-, sub)
DUET_DEFINE_OPERATOR(*, mul)
DUET_DEFINE_OPERATOR(/, div)
#undef DUET_DEFINE_OPERATOR
Tensor operator-(Located x) { return x.expiring ? neg(moved(x), x.loc) : neg(x.tensor, x.loc); }
#define DUET_DEFINE_CMP_OPERATOR(sym, fn)                                            \
  Tensor operator sym(Located a, const Tensor& b) { return fn(a.tensor, b, a.loc); } \
  Tensor operator sym(Located a, Scalar b) { return fn(a.tensor, b, a.loc); }        \
  Tensor operator sym(Scalar a, Located b) { return fn(a, b.tensor, b.loc); }
DUET_DEFINE_CMP_OPERATOR(<, lt)
DUET_DEFINE_CMP_OPERATOR(<=, le)
DUET_DEFINE_CMP_OPERATOR(>, gt)
DUET_DEFINE_CMP_OPERATOR(>=, ge)
DUET_DEFINE_CMP_OPERATOR(==, eq)
DUET_DEFINE_CMP_OPERATOR(!=, ne)
#undef DUET_DEFINE_CMP_OPERATOR

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  const Tensor* in[] = {&cond, &a, &b};
  return detail::call(OpId::Where, TensorRefs(in, 3), kNoAttrs);
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return where(cond, a, wrap(b, a));
}
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return where(cond, wrap(a, b), b);
}

// Composites of comparisons, so they fuse: NaN is the one value unequal to itself, and |x| < inf
// is false for NaN (an ordered comparison) and for both infinities.
Tensor isnan(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return ne(x, x);
}
Tensor isinf(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (!is_floating(x.dtype())) return ne(x, x);
  return eq(abs(x), std::numeric_limits<double>::infinity());
}
Tensor isfinite(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (!is_floating(x.dtype())) return eq(x, x);
  return lt(abs(x), std::numeric_limits<double>::infinity());
}

}  // namespace duet
