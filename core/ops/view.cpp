// Views: reshape, permute, slice and expand are new metadata over the same storage. transpose,
// squeeze and unsqueeze are composed from them. Reshape copies only when no strides express it.
#include <algorithm>
#include <limits>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

// attrs.ints: the target shape with -1 already resolved.
void infer_reshape(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  out.shape = Shape(a.ints.data(), a.ints.size());
  DUET_CHECK_SHAPE(out.shape.numel() == in[0].numel(),
                   "[reshape] cannot reshape a tensor of shape {} ({} elements) to {}",
                   in[0].sizes(), in[0].numel(), out.shape);
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

// PyTorch's computeStride: a view exists when each group of old dims that maps onto a group of
// new dims is itself contiguous in memory.
Tensor view_reshape(const Tensor& x, const Attrs&, const TensorMeta& out) {
  const Shape& os = x.sizes();
  const Strides& ost = x.strides();
  const Shape& ns = out.shape;
  if (x.is_contiguous() || x.numel() == 0 || os.size() == 0) {
    return make_view(x, ns, contiguous_strides(ns), x.storage_offset());
  }
  Strides nst(ns.size());
  int64_t view_d = ns.size() - 1;
  int64_t chunk_base_stride = ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = os.size() - 1; td >= 0; --td) {
    tensor_numel *= os[td];
    if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        nst[view_d] = view_numel * chunk_base_stride;
        view_numel *= ns[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return Tensor();
      if (td > 0) {
        chunk_base_stride = ost[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return Tensor();
  return make_view(x, ns, nst, x.storage_offset());
}

// attrs.ints: the permutation, validated by the builder.
void infer_permute(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape& s = in[0].sizes();
  DUET_CHECK_VALUE(a.ints.size() == s.size(),
                   "[permute] order has {} dims but the tensor has shape {}", a.ints.size(), s);
  // One bit per dim: every tensor's rank is at most kMaxRank, 64 (Note [Checked sizes]).
  out.shape = Shape();
  uint64_t seen = 0;
  for (int64_t d : a.ints) {
    DUET_CHECK_VALUE(d >= 0 && d < s.size() && !(seen >> d & 1),
                     "[permute] order must be a permutation of 0..{}, got dim {}", s.size() - 1, d);
    seen |= uint64_t(1) << d;
    out.shape.push_back(s[d]);
  }
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

Tensor view_permute(const Tensor& x, const Attrs& a, const TensorMeta& out) {
  Strides st(a.ints.size());
  for (int64_t i = 0; i < a.ints.size(); ++i) st[i] = x.strides()[a.ints[i]];
  return make_view(x, out.shape, st, x.storage_offset());
}

// dim, start, end, step: normalized by the builder (0 <= start <= end <= size, step >= 1).
void infer_slice(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape& s = in[0].sizes();
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < s.size(), "[slice] dim {} is out of range for shape {}",
                   a.dim, s);
  DUET_CHECK_VALUE(a.step >= 1, "[slice] step must be positive, got {}", a.step);
  DUET_CHECK_VALUE(0 <= a.start && a.start <= a.end && a.end <= s[a.dim],
                   "[slice] range [{}, {}) is outside dim {} of shape {}", a.start, a.end, a.dim,
                   s);
  out.shape = s;
  // Written so that a step near INT64_MAX (Python's x[::sys.maxsize]) cannot overflow.
  out.shape[a.dim] = a.end == a.start ? 0 : (a.end - a.start - 1) / a.step + 1;
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

Tensor view_slice(const Tensor& x, const Attrs& a, const TensorMeta& out) {
  Strides st = x.strides();
  int64_t off = x.storage_offset() + a.start * st[a.dim];
  if (out.shape[a.dim] > 1) st[a.dim] *= a.step;  // with one element the step never applies
  return make_view(x, out.shape, st, out.shape.numel() ? off : x.storage_offset());
}

// Select's attributes are those of the slice start:start + 1 along dim (so that its gradient is
// slice's), normalized by the builder: 0 <= start < size.
void infer_select(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape& s = in[0].sizes();
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < s.size(), "[select] dim {} is out of range for shape {}",
                   a.dim, s);
  DUET_CHECK_VALUE(0 <= a.start && a.start < s[a.dim] && a.end == a.start + 1 && a.step == 1,
                   "[select] index {} is outside dim {} of shape {}", a.start, a.dim, s);
  out.shape = Shape();
  for (int64_t d = 0; d < s.size(); ++d)
    if (d != a.dim) out.shape.push_back(s[d]);
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

Tensor view_select(const Tensor& x, const Attrs& a, const TensorMeta& out) {
  Strides st;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != a.dim) st.push_back(x.strides()[d]);
  return make_view(x, out.shape, st, x.storage_offset() + a.start * x.strides()[a.dim]);
}

// attrs.ints: the target shape, -1 already resolved.
void infer_expand(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape& s = in[0].sizes();
  Shape target(a.ints.data(), a.ints.size());
  DUET_CHECK_SHAPE(target.size() >= s.size(),
                   "[expand] cannot expand shape {} to {} with fewer dims", s, target);
  int64_t lead = target.size() - s.size();
  for (int64_t i = 0; i < s.size(); ++i)
    DUET_CHECK_SHAPE(s[i] == target[lead + i] || s[i] == 1,
                     "[expand] cannot expand shape {} to {}: dim {} has size {}, expected 1 or {}",
                     s, target, i, s[i], target[lead + i]);
  for (int64_t i = 0; i < target.size(); ++i)
    DUET_CHECK_SHAPE(target[i] >= 0, "[expand] negative size {} in target {}", target[i], target);
  out.shape = target;
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

Tensor view_expand(const Tensor& x, const Attrs&, const TensorMeta& out) {
  const Shape& s = x.sizes();
  int64_t lead = out.shape.size() - s.size();
  Strides st(out.shape.size(), 0);
  for (int64_t i = 0; i < s.size(); ++i)
    st[lead + i] = s[i] == out.shape[lead + i] ? x.strides()[i] : 0;
  return make_view(x, out.shape, st, x.storage_offset());
}

// Note [Optimization barrier]
// optimization_barrier(x, after) is x, as a view, with `after` as a second input that it does
// not read: the value exists only once `after` does. A checkpoint's recomputation (Note
// [Checkpoint] in eager/checkpoint.cpp) starts from its inputs passed through a barrier after the
// gradient that reached it, so that in a compiled step no pass finds the recomputed ops equal to
// the forward's (CSE would keep the forward's values alive instead), sibling fusion never joins
// them to a forward kernel, and the schedule cannot run them before the backward gets there (as
// jax.lax.optimization_barrier).
void infer_barrier(const OpDef&, TensorRefs in, const Attrs&, TensorMeta& out) {
  out.shape = in[0].sizes();
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}
Tensor view_barrier(const Tensor& x, const Attrs&, const TensorMeta&) {
  return make_view(x, x.sizes(), x.strides(), x.storage_offset());
}

// in[0]: the base, in[1]: what goes into its slice (dim, start, end, step as for Slice).
void infer_slice_scatter(const OpDef& def, TensorRefs in, const Attrs& a, TensorMeta& out) {
  TensorMeta slice_meta;
  const Tensor* base[] = {&in[0]};
  infer_slice(def, TensorRefs(base, 1), a, slice_meta);
  DUET_CHECK_SHAPE(in[1].sizes() == slice_meta.shape,
                   "[slice_scatter] source of shape {} does not fit the slice {}:{}:{} of dim {} "
                   "of shape {} (expected {})",
                   in[1].sizes(), a.start, a.end, a.step, a.dim, in[0].sizes(), slice_meta.shape);
  DUET_CHECK_DTYPE(in[0].dtype() == in[1].dtype(),
                   "[slice_scatter] base and source must share a dtype, got {} and {}",
                   in[0].dtype(), in[1].dtype());
  out.shape = in[0].sizes();
  out.dtype = in[0].dtype();
  out.device = common_device(def, in);
}

// ---- gradient rules ---------------------------------------------------------------------------

void grad_reshape(const GradCtx& c, const Tensor& g, Tensor* gi) {
  gi[0] = reshape_dims(g, meta_dims(c.input_meta[0]));
}
void grad_permute(const GradCtx& c, const Tensor& g, Tensor* gi) {
  std::vector<int64_t> inv(c.attrs.ints.size());
  for (int64_t i = 0; i < c.attrs.ints.size(); ++i) inv[c.attrs.ints[i]] = i;
  gi[0] = permute(g, Dims(inv));
}
void grad_slice(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const TensorMeta& m = c.input_meta[0];
  Tensor z = full_dims(meta_dims(m), 0, Options().dtype(g.dtype()).device(m.device));
  gi[0] = slice_scatter_with(z, g, c.attrs);
}
// (Select's attributes are its slice's.)
void grad_select(const GradCtx& c, const Tensor& g, Tensor* gi) {
  grad_slice(c, unsqueeze(g, c.attrs.dim), gi);
}
void grad_expand(const GradCtx&, const Tensor& g, Tensor* gi) { gi[0] = g; }  // engine sums
void grad_barrier(const GradCtx& c, const Tensor& g, Tensor* gi) {
  gi[0] = g;
  if (c.needs_grad(1)) {  // `after` is only waited for
    const TensorMeta& m = c.input_meta[1];
    gi[1] = full_dims(meta_dims(m), 0, Options().dtype(m.dtype).device(m.device));
  }
}
void grad_slice_scatter(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Attrs& a = c.attrs;
  if (c.needs_grad(0)) {
    const TensorMeta& m = c.input_meta[1];
    Tensor z = full_dims(meta_dims(m), 0, Options().dtype(g.dtype()).device(m.device));
    gi[0] = slice_scatter_with(g, z, a);
  }
  if (c.needs_grad(1)) gi[1] = slice_with(g, a);
}

Tensor view_call(OpId op, const Tensor& x, const Attrs& a) {
  const Tensor* in[] = {&x};
  return call(op, TensorRefs(in, 1), a);
}

}  // namespace

void register_view_rules(OpDef* t) {
  t[int(OpId::Reshape)].infer = infer_reshape;
  t[int(OpId::Reshape)].view = view_reshape;
  t[int(OpId::Permute)].infer = infer_permute;
  t[int(OpId::Permute)].view = view_permute;
  t[int(OpId::Slice)].infer = infer_slice;
  t[int(OpId::Slice)].view = view_slice;
  t[int(OpId::Select)].infer = infer_select;
  t[int(OpId::Select)].view = view_select;
  t[int(OpId::Expand)].infer = infer_expand;
  t[int(OpId::Expand)].view = view_expand;
  t[int(OpId::OptimizationBarrier)].infer = infer_barrier;
  t[int(OpId::OptimizationBarrier)].view = view_barrier;
  t[int(OpId::SliceScatter)].infer = infer_slice_scatter;
  set_grad(t, OpId::Reshape, grad_reshape, 0);
  set_grad(t, OpId::Permute, grad_permute, 0);
  set_grad(t, OpId::Slice, grad_slice, 0);
  set_grad(t, OpId::Select, grad_select, 0);
  set_grad(t, OpId::Expand, grad_expand, 0);
  set_grad(t, OpId::SliceScatter, grad_slice_scatter, 0);
  set_grad(t, OpId::OptimizationBarrier, grad_barrier, 0);
}

}  // namespace detail

Tensor reshape(const Tensor& x, Shape shape, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (__builtin_expect(!x.impl()->sym.empty(), 0)) {
    // Symbolic dims: -1 becomes the symbolic count of the remaining elements.
    SymDims dims(shape.begin(), shape.end());
    int64_t infer_at = -1, known = 1;
    for (int64_t i = 0; i < shape.size(); ++i) {
      DUET_CHECK_SHAPE(shape[i] >= -1 && !(shape[i] == -1 && infer_at >= 0),
                       "[reshape] invalid target {} for a tensor of shape {}", shape,
                       detail::dims_str(x.impl()->sym));
      if (shape[i] == -1)
        infer_at = i;
      else
        known *= shape[i];
    }
    if (infer_at >= 0) {
      const SymInt n = detail::sym_numel(x.impl()->sym);
      DUET_CHECK_SHAPE(
          known != 0 && detail::sym_decide(mod(n, known), detail::SymRel::Eq, 0, "reshape"),
          "[reshape] cannot reshape a tensor of shape {} to {}", detail::dims_str(x.impl()->sym),
          shape);
      dims[infer_at] = floordiv(n, known);
    }
    return detail::reshape_dims(x, dims);
  }
  int64_t infer_at = -1, known = 1;
  for (int64_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      DUET_CHECK_SHAPE(infer_at < 0, "[reshape] only one dim may be -1, got {}", shape);
      infer_at = i;
    } else {
      DUET_CHECK_SHAPE(shape[i] >= 0, "[reshape] invalid size {} in {}", shape[i], shape);
      DUET_CHECK_VALUE(!__builtin_mul_overflow(known, shape[i], &known),
                       "[reshape] shape {} is too large: its elements overflow int64 "
                       "(Note [Checked sizes])",
                       shape);
    }
  }
  if (infer_at >= 0) {
    DUET_CHECK_SHAPE(known != 0 && x.numel() % known == 0,
                     "[reshape] cannot reshape a tensor of shape {} ({} elements) to {}", x.sizes(),
                     x.numel(), shape);
    shape[infer_at] = x.numel() / known;
  }
  Attrs a;
  a.ints = detail::SmallVec<int64_t, 6>(shape.data(), shape.size());
  return detail::view_call(OpId::Reshape, x, a);
}

Tensor permute(const Tensor& x, Dims order, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  DUET_CHECK_VALUE(order.size() == x.dim(), "[permute] order {} has {} dims but shape {} has {}",
                   order.str(), order.size(), x.sizes(), x.dim());
  for (int64_t d : order) a.ints.push_back(detail::wrap_dim("permute", d, x.dim()));
  return detail::view_call(OpId::Permute, x, a);
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1, std::source_location loc) {
  detail::SiteGuard site(loc);
  int64_t nd = x.dim();
  d0 = detail::wrap_dim("transpose", d0, nd);
  d1 = detail::wrap_dim("transpose", d1, nd);
  if (nd == 0) return x;
  std::vector<int64_t> order(nd);
  for (int64_t i = 0; i < nd; ++i) order[i] = i;
  std::swap(order[d0], order[d1]);
  return permute(x, Dims(order));
}

Tensor squeeze(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  dim = detail::wrap_dim("squeeze", dim, x.dim());
  if (x.dim() == 0) return x;
  if (x.impl()->sym.empty()) {  // (concrete sizes: the shape built inline, no SymInts)
    if (x.impl()->shape[dim] != 1) return x;
    Shape s = x.impl()->shape;
    s.erase(dim);
    return reshape(x, s);
  }
  SymDims s = detail::sym_dims(x);
  if (!detail::sym_decide(s[dim], detail::SymRel::Eq, 1, "squeeze")) return x;
  s.erase(s.begin() + dim);
  return detail::reshape_dims(x, s);
}

Tensor squeeze(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  SymDims s;
  for (const SymInt& d : detail::sym_dims(x))
    if (!detail::sym_decide(d, detail::SymRel::Eq, 1, "squeeze")) s.push_back(d);
  return static_cast<int64_t>(s.size()) == x.dim() ? x : detail::reshape_dims(x, s);
}

Tensor unsqueeze(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  dim = detail::wrap_dim("unsqueeze", dim, x.dim() + 1);
  if (x.impl()->sym.empty()) {  // (as squeeze)
    Shape s = x.impl()->shape;
    s.insert(dim, 1);
    return reshape(x, s);
  }
  SymDims s = detail::sym_dims(x);
  s.insert(s.begin() + dim, 1);
  return detail::reshape_dims(x, s);
}

Tensor expand(const Tensor& x, Shape shape, std::source_location loc) {
  detail::SiteGuard site(loc);
  if (__builtin_expect(!x.impl()->sym.empty(), 0)) {
    const int64_t lead = shape.size() - x.dim();
    DUET_CHECK_SHAPE(lead >= 0, "[expand] cannot expand shape {} to {} with fewer dims",
                     detail::dims_str(x.impl()->sym), shape);
    SymDims dims(shape.begin(), shape.end());
    for (int64_t i = 0; i < shape.size(); ++i) {
      if (shape[i] != -1) continue;
      DUET_CHECK_SHAPE(i >= lead, "[expand] -1 is not allowed for a new leading dim in {}", shape);
      dims[i] = x.impl()->sym[i - lead];
    }
    return detail::expand_dims(x, dims);
  }
  int64_t lead = shape.size() - x.dim();
  DUET_CHECK_SHAPE(lead >= 0, "[expand] cannot expand shape {} to {} with fewer dims", x.sizes(),
                   shape);
  for (int64_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != -1) continue;
    DUET_CHECK_SHAPE(i >= lead, "[expand] -1 is not allowed for a new leading dim in {}", shape);
    shape[i] = x.sizes()[i - lead];
  }
  if (shape == x.sizes()) return x;
  Attrs a;
  a.ints = detail::SmallVec<int64_t, 6>(shape.data(), shape.size());
  return detail::view_call(OpId::Expand, x, a);
}

Tensor expand_as(const Tensor& x, const Tensor& other, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::expand_dims(x, detail::sym_dims(other));
}

Tensor view(const Tensor& x, Shape shape, std::source_location loc) {
  detail::SiteGuard site(loc);
  const Shape target = shape;
  Tensor out = reshape(x, std::move(shape));
  // reshape copies when no strides express the new shape (view_reshape): a view must not, since
  // writes through it would not reach x. Traced tensors carry the strides of the traced call,
  // so the check is the same in both faces.
  DUET_CHECK_VALUE(out.numel() == 0 || out.impl()->storage == x.impl()->storage,
                   "[view] a tensor of shape {} and strides {} has no view of shape {}: its "
                   "elements are not laid out as one (use reshape, which copies, or call "
                   "contiguous() first)",
                   x.sizes(), Shape(x.strides().data(), x.strides().size()), target);
  return out;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  // The dims as SymInts, so that a symbolic batch dim stays symbolic in a compiled graph.
  const SymDims dims = detail::sym_dims(x);
  const auto rank = static_cast<int64_t>(dims.size());
  if (rank == 0) return reshape(x, Shape{1});  // as torch.flatten
  const int64_t s = start_dim < 0 ? start_dim + rank : start_dim;
  const int64_t e = end_dim < 0 ? end_dim + rank : end_dim;
  DUET_CHECK_VALUE(0 <= s && s < rank && 0 <= e && e < rank && s <= e,
                   "[flatten] start_dim {} and end_dim {} do not fit a tensor of {} dims",
                   start_dim, end_dim, rank);
  SymDims out(dims.begin(), dims.begin() + s);
  SymInt merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= dims[static_cast<size_t>(d)];
  out.push_back(merged);
  out.insert(out.end(), dims.begin() + e + 1, dims.end());
  return detail::reshape_dims(x, out);
}

Tensor t(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.dim() <= 2, "[t] expects a tensor of at most 2 dims, got shape {}",
                   detail::dims_str(detail::sym_dims(x)));
  return x.dim() < 2 ? x : transpose(x, 0, 1);
}

namespace {
// Python's rules: negative bounds count from the end, then clamp to [0, n].
Attrs slice_attrs(const char* op, const Tensor& x, int64_t dim, int64_t start, int64_t end,
                  int64_t step) {
  DUET_CHECK_VALUE(x.dim() > 0, "[{}] cannot slice a 0-d tensor", op);
  dim = detail::wrap_dim(op, dim, x.dim());
  DUET_CHECK_VALUE(step >= 1, "[{}] step must be positive, got {}", op, step);
  Attrs a;
  a.dim = dim;
  a.step = step;
  const SymInt n = detail::sym_dim(x, dim);
  if (!n.is_concrete()) {
    // Python's rules on a symbolic size: each comparison with n is decided at the traced sizes
    // and guarded.
    using detail::SymRel;
    auto bound = [&](int64_t v, const SymInt& lo) -> SymInt {
      // "To the end" (INT64_MAX and the like) needs no guard: no size reaches 2^62.
      if (v >= (int64_t(1) << 62)) return n;
      SymInt b = v < 0 ? n + SymInt(v) : SymInt(v);
      if (detail::sym_decide(b, SymRel::Lt, lo, op)) b = lo;
      if (detail::sym_decide(n, SymRel::Lt, b, op)) b = n;
      return b;
    };
    const SymInt s = bound(start, 0);
    const SymInt e = bound(end, s);
    auto sym = std::make_shared<SymAttrs>();
    sym->start = s;
    sym->end = e;
    a.start = detail::sym_hint(s);
    a.end = detail::sym_hint(e);
    a.sym = std::move(sym);
    return a;
  }
  const int64_t nc = n.concrete();
  if (start < 0) start += nc;
  if (end < 0) end += nc;
  start = std::clamp<int64_t>(start, 0, nc);
  end = std::clamp<int64_t>(end, start, nc);
  a.start = start;
  a.end = end;
  return a;
}
}  // namespace

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step,
             std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::view_call(OpId::Slice, x, slice_attrs("slice", x, dim, start, end, step));
}

// narrow is slice with PyTorch's bound checks (its bounds do not clamp). With a symbolic size
// the checks are decided at the traced size and guarded, as select's are.
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length,
              std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.dim() > 0, "[narrow] cannot narrow a 0-d {} tensor", x.dtype());
  dim = detail::wrap_dim("narrow", dim, x.dim());
  const SymInt n = detail::sym_dim(x, dim);
  using detail::SymRel;
  const bool start_fits = start >= 0 ? detail::sym_decide(SymInt(start), SymRel::Le, n, "narrow")
                                     : detail::sym_decide(SymInt(-start), SymRel::Le, n, "narrow");
  DUET_CHECK_VALUE(start_fits && length >= 0,
                   "[narrow] start {} and length {} do not fit dim {} of size {} (shape {}): "
                   "expected a start in [-{}, {}] and a non-negative length",
                   start, length, dim, n.str(), x.sizes(), n.str(), n.str());
  const bool end_fits = start >= 0
                            ? detail::sym_decide(SymInt(start + length), SymRel::Le, n, "narrow")
                            : length <= -start;
  DUET_CHECK_VALUE(end_fits, "[narrow] start {} + length {} exceeds dim {} of size {} (shape {})",
                   start, length, dim, n.str(), x.sizes());
  // (a negative start's slice that ends at the end runs to it, not to 0)
  const int64_t end =
      start < 0 && start + length == 0 ? std::numeric_limits<int64_t>::max() : start + length;
  return slice(x, dim, start, end, 1, loc);
}

// select is one view op, as PyTorch's: index `index` of dim `dim`, that dim dropped (its
// attributes are those of the slice index:index + 1, whose gradient rule it shares). One op
// rather than a slice and a reshape, since per-sample code selects a row per token: each view
// is a tape node eagerly and a pending op under Autobatch. With a symbolic size the bound check
// is decided at the traced size and guarded, as slice's bounds are; a negative index of a
// symbolic size is the slice to its end, reshaped.
namespace {
// The Select of index (in range, >= 0) along dim.
Tensor select_at(const Tensor& x, int64_t dim, int64_t index) {
  Attrs a;
  a.dim = dim;
  a.start = index;
  a.end = index + 1;
  return detail::view_call(OpId::Select, x, a);
}
}  // namespace

Tensor select(const Tensor& x, int64_t dim, int64_t index, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.dim() > 0, "[select] cannot select index {} of a 0-d {} tensor", index,
                   x.dtype());
  dim = detail::wrap_dim("select", dim, x.dim());
  constexpr const char* kOutOfRange =
      "[select] index {} is out of range for dim {} of size {} (shape {}, {}): expected an index "
      "in [-{}, {})";
  if (__builtin_expect(x.impl()->sym.empty(), 1)) {  // concrete sizes: no SymDims to make
    const int64_t n = x.sizes()[dim];
    DUET_CHECK_VALUE(index >= -n && index < n, kOutOfRange, index, dim, n, x.sizes(), x.dtype(), n,
                     n);
    return select_at(x, dim, index < 0 ? index + n : index);
  }
  const SymDims dims = detail::sym_dims(x);
  const SymInt& n = dims[static_cast<size_t>(dim)];
  using detail::SymRel;
  const bool in_range = index >= 0 ? detail::sym_decide(SymInt(index), SymRel::Lt, n, "select")
                                   : detail::sym_decide(SymInt(-index), SymRel::Le, n, "select");
  DUET_CHECK_VALUE(in_range, kOutOfRange, index, dim, n.str(), detail::dims_str(dims), x.dtype(),
                   n.str(), n.str());
  if (index >= 0 || n.is_concrete())
    return select_at(x, dim, index < 0 ? index + n.concrete() : index);
  // -1 selects the last element: its slice runs to the end, not to 0.
  const int64_t end = index == -1 ? std::numeric_limits<int64_t>::max() : index + 1;
  Tensor s = slice(x, dim, index, end, 1, loc);
  SymDims out = detail::sym_dims(s);
  out.erase(out.begin() + dim);
  return detail::reshape_dims(s, out);
}

Tensor Tensor::operator[](int64_t index) const {
  return duet::select(*this, 0, index, std::source_location::current());
}

Tensor slice_scatter(const Tensor& base, const Tensor& src, int64_t dim, int64_t start, int64_t end,
                     int64_t step, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a = slice_attrs("slice_scatter", base, dim, start, end, step);
  const Tensor* in[] = {&base, &src};
  return detail::call(OpId::SliceScatter, TensorRefs(in, 2), a);
}

namespace detail {

Tensor reshape_dims(const Tensor& x, const SymDims& dims) {
  if (all_concrete(dims)) {
    Shape s;
    for (const SymInt& d : dims) s.push_back(d.concrete());
    if (x.impl()->sym.empty()) return reshape(x, s);
  }
  return view_call(OpId::Reshape, x, shape_attrs(dims));
}

Tensor expand_dims(const Tensor& x, const SymDims& dims) {
  if (all_concrete(dims) && x.impl()->sym.empty()) return expand(x, hint_shape(dims));
  if (sym_dims(x) == dims) return x;
  return view_call(OpId::Expand, x, shape_attrs(dims));
}

Tensor slice_with(const Tensor& x, const Attrs& a) { return view_call(OpId::Slice, x, a); }

Tensor optimization_barrier(const Tensor& x, const Tensor& after) {
  const Tensor* in[] = {&x, &after};
  return call(OpId::OptimizationBarrier, TensorRefs(in, 2), Attrs{});
}

Tensor slice_scatter_with(const Tensor& base, const Tensor& src, const Attrs& a) {
  const Tensor* in[] = {&base, &src};
  return call(OpId::SliceScatter, TensorRefs(in, 2), a);
}

}  // namespace detail

}  // namespace duet
