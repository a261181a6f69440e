// Sources (Full, Arange) and the creation functions built on them, and Transfer (to(Device)).
#include <cstring>

#include "core/check_shape.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

// attrs.ints: shape; attrs.value: fill; attrs.dtype.
void infer_full(const OpDef&, TensorRefs, const Attrs& a, TensorMeta& out) {
  out.shape = Shape(a.ints.data(), a.ints.size());
  for (int64_t d : out.shape)
    DUET_CHECK_VALUE(d >= 0, "[full] negative size {} in shape {}", d, out.shape);
  out.dtype = a.dtype;
  out.device = a.device;
  check_fits("full", a.value, a.dtype);  // full({1}, 1LL << 40, i32) is an error, not 0
}

// attrs.end: n; attrs.dtype.
void infer_arange(const OpDef&, TensorRefs, const Attrs& a, TensorMeta& out) {
  DUET_CHECK_VALUE(a.end >= 0, "[arange] length must be non-negative, got {}", a.end);
  DUET_CHECK_DTYPE(a.dtype != DType::b8, "[arange] cannot count in b8");
  out.device = a.device;
  out.shape = Shape{a.end};
  out.dtype = a.dtype;
  DUET_CHECK_VALUE(a.end == 0 || Scalar(a.end - 1).fits(a.dtype),
                   "[arange] length {} counts up to {}, which does not fit in {}", a.end, a.end - 1,
                   a.dtype);
}

Tensor source(OpId op, Attrs a, const Options& o) {
  check_device_usable(o.device_, op_def(op).name);
  a.device = o.device_;
  Tensor t = call(op, TensorRefs(), a);
  if (o.requires_grad_) t.requires_grad_(true);
  return t;
}

// Transfer: the same values on attrs.device.
void infer_transfer(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  out.shape = in[0].sizes();
  out.dtype = in[0].dtype();
  out.device = a.device;
}
void sym_transfer(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
}
// The gradient goes back to the input's device.
void grad_transfer(const GradCtx& c, const Tensor& g, Tensor* gi) {
  gi[0] = g.to(c.input_meta[0].device);
}

}  // namespace

void register_source_rules(OpDef* t) {
  t[int(OpId::Transfer)].infer = infer_transfer;
  t[int(OpId::Transfer)].sym_infer = sym_transfer;
  set_grad(t, OpId::Transfer, grad_transfer, 0);
  t[int(OpId::Full)].infer = infer_full;
  t[int(OpId::Arange)].infer = infer_arange;
  set_not_differentiable(t, OpId::Full);
  set_not_differentiable(t, OpId::Arange);
}

}  // namespace detail

Tensor full(Shape shape, Scalar value, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.ints = detail::SmallVec<int64_t, 6>(shape.data(), shape.size());
  a.value = value;
  a.dtype = options.dtype_.value_or(value.default_dtype());
  return detail::source(OpId::Full, a, options);
}
Tensor zeros(Shape shape, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (!options.dtype_) options.dtype(DType::f32);
  return full(shape, 0, options);
}
Tensor ones(Shape shape, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (!options.dtype_) options.dtype(DType::f32);
  return full(shape, 1, options);
}
Tensor scalar(Scalar value, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  return full(Shape{}, value, options);
}

Tensor arange(int64_t n, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.end = n;
  a.dtype = options.dtype_.value_or(DType::i64);
  return detail::source(OpId::Arange, a, options);
}

Tensor eye(int64_t n, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(n >= 0, "[eye] size must be non-negative, got {}", n);
  const DType dtype = options.dtype_.value_or(DType::f32);
  Tensor i = arange(n, Options().device(options.device_));
  Tensor t = eq(unsqueeze(i, 1), unsqueeze(i, 0)).to(dtype);
  if (options.requires_grad_) t.requires_grad_(true);
  return t;
}

Tensor tensor(std::vector<double> values, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  int64_t n = static_cast<int64_t>(values.size());
  return tensor(std::move(values), Shape{n}, options);
}

Tensor tensor(std::vector<double> values, Shape shape, Options options, std::source_location loc) {
  detail::SiteGuard site(loc);
  detail::check_shape("tensor", shape, sizeof(double));  // Note [Checked sizes]
  DUET_CHECK_SHAPE(shape.numel() == static_cast<int64_t>(values.size()),
                   "[tensor] {} values do not fill shape {} ({} elements)", values.size(), shape,
                   shape.numel());
  detail::check_device_usable(options.device_, "tensor");
  const DType dtype = options.dtype_.value_or(DType::f32);
  if (dtype != DType::f64)
    for (double v : values) detail::check_fits("tensor", Scalar(v), dtype);
  Tensor f64 = detail::empty(shape, DType::f64);
  if (!values.empty()) std::memcpy(f64.raw_data(), values.data(), values.size() * sizeof(double));
  // Converted on the host, then copied to the device (one transfer of the final dtype).
  Tensor t = f64.to(dtype).to(options.device_);
  if (options.requires_grad_) t.requires_grad_(true);
  return t;
}

namespace detail {

Tensor full_dims(const SymDims& dims, Scalar value, Options options) {
  if (all_concrete(dims)) return full(hint_shape(dims), value, options);
  Attrs a = shape_attrs(dims);
  a.value = value;
  a.dtype = options.dtype_.value_or(value.default_dtype());
  return source(OpId::Full, a, options);
}

Tensor arange_dims(const SymInt& n, Options options) {
  if (n.is_concrete()) return arange(n.concrete(), options);
  Attrs a;
  a.end = sym_hint(n);
  a.dtype = options.dtype_.value_or(DType::i64);
  auto sym = std::make_shared<SymAttrs>();
  sym->end = n;
  a.sym = std::move(sym);
  return source(OpId::Arange, a, options);
}

Tensor size_scalar(const SymInt& n, DType dtype, Device device) {
  if (n.is_concrete())
    return wrap_scalar(Scalar(static_cast<double>(n.concrete())), dtype, Device::cpu());
  Attrs a;
  a.value = Scalar(static_cast<double>(sym_hint(n)));
  a.dtype = dtype;
  auto sym = std::make_shared<SymAttrs>();
  sym->value = n;
  a.sym = std::move(sym);
  return source(OpId::Full, a, Options().dtype(dtype).device(device));
}

}  // namespace detail

}  // namespace duet
