// Reductions: sum, max, min over any dims with keepdim; mean composed from sum; log_softmax.
#include <algorithm>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

// attrs.ints holds the dims, already wrapped and sorted by the builder; empty means all.
void infer_reduce(const OpDef& def, TensorRefs in, const Attrs& attrs, TensorMeta& out) {
  const TensorImpl* x = in[0].impl();
  int64_t nd = x->ndim();
  bool reduced[64] = {};
  DUET_CHECK_VALUE(nd <= 64, "[{}] rank {} is above the maximum of 64", def.name, nd);
  if (attrs.ints.empty()) {
    for (int64_t i = 0; i < nd; ++i) reduced[i] = true;
  } else {
    for (int64_t d : attrs.ints) {
      DUET_CHECK_VALUE(d >= 0 && d < std::max<int64_t>(nd, 1),
                       "[{}] dim {} is out of range for a tensor of shape {}", def.name, d,
                       x->shape);
      if (nd) reduced[d] = true;
    }
  }
  out.shape = Shape();
  for (int64_t i = 0; i < nd; ++i) {
    if (!reduced[i])
      out.shape.push_back(x->shape[i]);
    else if (attrs.keepdim)
      out.shape.push_back(1);
    if (reduced[i] && def.id != OpId::Sum)
      DUET_CHECK_VALUE(x->shape[i] != 0,
                       "[{}] cannot reduce over dim {} of size 0 (shape {}): the result has no "
                       "identity",
                       def.name, i, x->shape);
  }
  out.device = x->device();
  out.dtype = x->dtype;
  // Sums of integers and bools accumulate in i64, as in PyTorch.
  if (def.id == OpId::Sum && !is_floating(x->dtype)) out.dtype = DType::i64;
}

// The input's shape with the reduced dims set to 1: where keepdim=false outputs go back to.
SymDims keepdim_shape(SymDims s, const Attrs& a) {
  if (a.ints.empty())
    for (SymInt& d : s) d = 1;
  else
    for (int64_t d : a.ints)
      if (d < static_cast<int64_t>(s.size())) s[d] = 1;
  return s;
}

void grad_sum(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const SymDims in = meta_dims(c.input_meta[0]);
  gi[0] = expand_dims(reshape_dims(g, keepdim_shape(in, c.attrs)), in);
}

// Max and min: the gradient goes to the elements equal to the result, split evenly among ties.
void grad_extremum(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Tensor& x = c.inputs[0];
  const SymDims ks = keepdim_shape(sym_dims(x), c.attrs);
  Tensor mask = eq(x, reshape_dims(c.output, ks));
  Dims dims;  // the forward's dims (empty: all)
  for (int64_t d : c.attrs.ints) dims.push_back(d);
  Tensor count = sum(mask, dims, /*keepdim=*/true);
  gi[0] = where(mask, reshape_dims(g, ks) / count, 0);
}

// log_softmax along attrs.dim (Note [log_softmax] in core/ops/nn.cpp): the input's shape.
void infer_log_softmax(const OpDef&, TensorRefs in, const Attrs& attrs, TensorMeta& out) {
  const Tensor& x = in[0];
  DUET_CHECK_DTYPE(is_floating(x.dtype()), "[log_softmax] needs a floating input, got {} {}",
                   x.dtype(), x.sizes());
  DUET_CHECK_VALUE(attrs.dim >= 0 && attrs.dim < std::max<int64_t>(x.dim(), 1),
                   "[log_softmax] dim {} is out of range for an input of shape {}", attrs.dim,
                   x.sizes());
  DUET_CHECK_DTYPE(
      attrs.dtype == x.dtype() || (is_low_precision(x.dtype()) && attrs.dtype == DType::f32),
      "[log_softmax] computes {} in its own dtype or, for f16 and bf16, in f32; "
      "asked for {}",
      x.dtype(), attrs.dtype);
  out.shape = x.sizes();
  out.dtype = attrs.dtype;
  out.device = x.device();
}

// d out_i / d x_j = [i == j] - softmax_j along the dim: g - exp(out) * sum(g).
void grad_log_softmax(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const int64_t dim = c.attrs.dim;
  if (c.output.dim() == 0) {  // one element alone: out = x - x where x is finite
    gi[0] = g - exp(c.output) * g;
    return;
  }
  gi[0] = g - exp(c.output) * sum(g, Dims{dim}, /*keepdim=*/true);
}

}  // namespace

void register_reduction_rules(OpDef* t) {
  t[int(OpId::LogSoftmax)].infer = infer_log_softmax;
  set_grad(t, OpId::LogSoftmax, grad_log_softmax, kSaveOut);
  // Autocast: its public function sets the result's dtype (Note [log_softmax]).
  for (OpId op : {OpId::Sum, OpId::Max, OpId::Min}) t[int(op)].infer = infer_reduce;
  set_grad(t, OpId::Sum, grad_sum, 0);
  set_grad(t, OpId::Max, grad_extremum, kSaveIn0 | kSaveOut);
  set_grad(t, OpId::Min, grad_extremum, kSaveIn0 | kSaveOut);
  t[int(OpId::Sum)].autocast = AutocastClass::F32;  // sums run in f32 (Note [Autocast])
}

/// Wraps, deduplicates and sorts user dims into attrs.ints.
Attrs reduce_attrs(const char* op, const Tensor& x, const Dims& dims, bool keepdim) {
  Attrs a;
  a.keepdim = keepdim;
  for (int64_t d : dims) {
    int64_t w = wrap_dim(op, d, x.dim());
    for (int64_t e : a.ints)
      DUET_CHECK_VALUE(e != w, "[{}] dim {} appears more than once in {}", op, w, dims.str());
    a.ints.push_back(w);
  }
  std::sort(a.ints.begin(), a.ints.end());
  return a;
}

}  // namespace detail

namespace {
Tensor reduce(OpId op, const char* name, const Tensor& x, const Dims& dims, bool keepdim) {
  Attrs a = detail::reduce_attrs(name, x, dims, keepdim);
  const Tensor* in[] = {&x};
  return detail::call(op, TensorRefs(in, 1), a);
}
}  // namespace

Tensor sum(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return reduce(OpId::Sum, "sum", x, dims, keepdim);
}
Tensor max(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return reduce(OpId::Max, "max", x, dims, keepdim);
}
Tensor min(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return reduce(OpId::Min, "min", x, dims, keepdim);
}

Tensor mean(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_DTYPE(is_floating(x.dtype()),
                   "[mean] needs a floating input, got {} of shape {}; convert with "
                   ".to(DType::f32)",
                   x.dtype(), x.sizes());
  Attrs a = detail::reduce_attrs("mean", x, dims, keepdim);
  const SymDims xs = detail::sym_dims(x);
  SymInt count = 1;
  if (a.ints.empty() || x.dim() == 0)  // a 0-d tensor accepts dim 0 and reduces one element
    count = detail::sym_numel(xs);
  else
    for (int64_t d : a.ints) count *= xs[d];
  if (!count.is_concrete())
    return div(reduce(OpId::Sum, "mean", x, dims, keepdim),
               detail::size_scalar(count, x.dtype(), x.device()));
  // The mean of nothing is NaN, as in PyTorch (0/0).
  return div(reduce(OpId::Sum, "mean", x, dims, keepdim), static_cast<double>(count.concrete()));
}

}  // namespace duet
