// Indexing and joining: Gather, ScatterAdd, Cat and Argmax, and the ops composed of them
// (index_select, embedding, stack, argmin).
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/dispatch.h"
#include "core/op_errors.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

void check_index(const char* op, const Tensor& index) {
  DUET_CHECK_DTYPE(index.dtype() == DType::i64, "[{}] index must be i64, got {} of shape {}", op,
                   index.dtype(), index.sizes());
}

// in[0]: x, in[1]: index with x's rank; attrs.dim (wrapped). out[p] = x[p with dim = index[p]].
void infer_gather(const OpDef& def, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Tensor &x = in[0], &index = in[1];
  check_index("gather", index);
  DUET_CHECK_SHAPE(index.dim() == x.dim(),
                   "[gather] index of shape {} must have the rank of the input {}", index.sizes(),
                   x.sizes());
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < std::max<int64_t>(x.dim(), 1),
                   "[gather] dim {} is out of range for shape {}", a.dim, x.sizes());
  for (int64_t d = 0; d < x.dim(); ++d)
    DUET_CHECK_SHAPE(d == a.dim || index.sizes()[d] <= x.sizes()[d],
                     "[gather] index of shape {} is larger than the input {} in dim {}",
                     index.sizes(), x.sizes(), d);
  out.shape = index.sizes();
  out.dtype = x.dtype();
  out.device = common_device(def, in);
}

// in[0]: base, in[1]: index, in[2]: src (index's shape); attrs.dim.
void infer_scatter_add(const OpDef& def, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Tensor &base = in[0], &index = in[1], &src = in[2];
  check_index("scatter_add", index);
  DUET_CHECK_SHAPE(index.sizes() == src.sizes() && index.dim() == base.dim(),
                   "[scatter_add] index {} and source {} must have one shape, of the base's "
                   "rank {}",
                   index.sizes(), src.sizes(), base.dim());
  DUET_CHECK_DTYPE(src.dtype() == base.dtype(),
                   "[scatter_add] source dtype {} differs from the base's {}", src.dtype(),
                   base.dtype());
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < std::max<int64_t>(base.dim(), 1),
                   "[scatter_add] dim {} is out of range for shape {}", a.dim, base.sizes());
  for (int64_t d = 0; d < base.dim(); ++d)
    DUET_CHECK_SHAPE(d == a.dim || index.sizes()[d] <= base.sizes()[d],
                     "[scatter_add] index of shape {} is larger than the base {} in dim {}",
                     index.sizes(), base.sizes(), d);
  out.shape = base.sizes();
  out.dtype = base.dtype();
  out.device = common_device(def, in);
}

// Variadic; attrs.dim (wrapped). Dtypes promote as in PyTorch.
void infer_cat(const OpDef& def, TensorRefs in, const Attrs& a, TensorMeta& out) {
  DUET_CHECK_VALUE(in.size() > 0, "[cat] needs at least one tensor");
  const Shape& s0 = in[0].sizes();
  DUET_CHECK_SHAPE(s0.size() > 0, "[cat] cannot join 0-d tensors; unsqueeze them or use stack");
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < s0.size(), "[cat] dim {} is out of range for shape {}",
                   a.dim, s0);
  out.shape = s0;
  out.shape[a.dim] = 0;
  for (int64_t i = 0; i < in.size(); ++i) {
    const Shape& s = in[i].sizes();
    DUET_CHECK_SHAPE(s.size() == s0.size(),
                     "[cat] tensor {} has shape {}, of another rank than tensor 0's {}", i, s, s0);
    for (int64_t d = 0; d < s.size(); ++d)
      DUET_CHECK_SHAPE(d == a.dim || s[d] == s0[d],
                       "[cat] tensor {} has shape {} but tensor 0 has {}: they may differ only "
                       "in dim {}",
                       i, s, s0, a.dim);
    out.shape[a.dim] += s[a.dim];
  }
  out.dtype = result_type(in);
  out.device = common_device(def, in);
}

// attrs.dim (wrapped), attrs.keepdim. The index of the first largest value (i64).
void infer_argmax(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Tensor& x = in[0];
  DUET_CHECK_DTYPE(x.dtype() != DType::b8, "[argmax] is not defined for b8 input of shape {}",
                   x.sizes());
  // (The builder wraps dim; a loaded program's attributes come unchecked.)
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < std::max<int64_t>(x.dim(), 1),
                   "[argmax] dim {} is out of range for shape {}", a.dim, x.sizes());
  out.shape = x.sizes();
  if (x.dim()) {
    DUET_CHECK_VALUE(x.sizes()[a.dim] > 0, "[argmax] cannot reduce over dim {} of size 0 ({})",
                     a.dim, x.sizes());
    if (a.keepdim)
      out.shape[a.dim] = 1;
    else
      out.shape.erase(a.dim);
  }
  out.dtype = DType::i64;
  out.device = x.device();
}

// attrs.dim (wrapped), attrs.keepdim: descending. x's shape, i64 (a 0-d x: index 0).
void infer_argsort(const OpDef& def, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Tensor& x = in[0];
  DUET_CHECK_VALUE(a.dim >= 0 && a.dim < std::max<int64_t>(x.dim(), 1),
                   "[{}] dim {} is out of range for shape {}", def.name, a.dim, x.sizes());
  out.shape = x.sizes();
  out.dtype = DType::i64;
  out.device = x.device();
}

// One index per row along dim (cross_entropy's pick of the target's log-probability): the
// gradient is g where the row's index is, else 0, an elementwise where that fuses with its
// neighbours; otherwise g is added into zeros at the indices. The where form gives g itself
// where scatter_add gives 0 + g, which differ only for g = -0.0.
void grad_gather(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const TensorMeta& m = c.input_meta[0];
  const Tensor& index = c.inputs[1];
  const int64_t dim = c.attrs.dim;
  const SymDims xd = meta_dims(m), id = sym_dims(index);
  bool one_per_row =
      xd.size() == id.size() && dim < static_cast<int64_t>(xd.size()) && id[dim] == SymInt(1);
  for (size_t d = 0; one_per_row && d < xd.size(); ++d)
    one_per_row = static_cast<int64_t>(d) == dim || id[d] == xd[d];
  if (one_per_row) {
    SymDims along(xd.size(), SymInt(1));
    along[dim] = xd[dim];
    const Tensor pos =
        reshape_dims(arange_dims(xd[dim], Options().dtype(index.dtype()).device(m.device)), along);
    gi[0] = where(eq(pos, index), g, 0);
    return;
  }
  // The zeros are a temporary: scatter_add adds into their buffer rather than into a copy
  // (docs/design.md, "Expiring temporaries").
  Tensor z = full_dims(xd, 0, Options().dtype(g.dtype()).device(m.device));
  Attrs a;
  a.dim = dim;
  const Tensor* in[] = {&z, &index, &g};
  gi[0] = call(OpId::ScatterAdd, TensorRefs(in, 3), a, /*expiring=*/1u);
}
void grad_scatter_add(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (c.needs_grad(0)) gi[0] = g;
  if (c.needs_grad(2)) gi[2] = gather(g, c.attrs.dim, c.inputs[1]);
}
// attrs.ints holds each input's size along dim (set by the builder).
void grad_cat(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const SymDims lens = attr_dims(c.attrs);
  SymInt at = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    if (c.needs_grad(static_cast<int64_t>(i))) {
      Attrs a;
      a.dim = c.attrs.dim;
      a.start = sym_hint(at);
      a.end = sym_hint(at + lens[i]);
      if (!at.is_concrete() || !lens[i].is_concrete()) {
        auto sym = std::make_shared<SymAttrs>();
        sym->start = at;
        sym->end = at + lens[i];
        a.sym = std::move(sym);
      }
      gi[i] = slice_with(g, a);
    }
    at += lens[i];
  }
}

}  // namespace

void register_index_rules(OpDef* t) {
  t[int(OpId::Gather)].infer = infer_gather;
  t[int(OpId::ScatterAdd)].infer = infer_scatter_add;
  t[int(OpId::Cat)].infer = infer_cat;
  t[int(OpId::Argmax)].infer = infer_argmax;
  set_grad(t, OpId::Gather, grad_gather, kSaveIn1);
  set_grad(t, OpId::ScatterAdd, grad_scatter_add, kSaveIn1);
  set_grad(t, OpId::Cat, grad_cat, 0);
  set_not_differentiable(t, OpId::Argmax);
  t[int(OpId::Argsort)].infer = infer_argsort;
  set_not_differentiable(t, OpId::Argsort);
}

}  // namespace detail

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.dim = detail::wrap_dim("gather", dim, x.dim());
  const Tensor* in[] = {&x, &index};
  return detail::call(OpId::Gather, TensorRefs(in, 2), a);
}

Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.dim = detail::wrap_dim("scatter_add", dim, base.dim());
  const Tensor* in[] = {&base, &index, &src};
  return detail::call(OpId::ScatterAdd, TensorRefs(in, 3), a);
}

bool detail::index_rows(const Tensor& index) {
  const TensorImpl* i = index.unsafe_impl();
  if (i->dtype != DType::i64 || i->shape.size() == 0) return false;
  for (int64_t d = 1; d < i->shape.size(); ++d)
    if (i->shape[d] != 1 && i->strides[d] != 0) return false;
  return true;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("index_select", [&]() -> Tensor {
    DUET_CHECK_DTYPE(index.dtype() == DType::i64,
                     "[index_select] index must be i64, got {} of shape {}", index.dtype(),
                     index.sizes());
    DUET_CHECK_SHAPE(index.dim() <= 1, "[index_select] index must be 1-D, got shape {}",
                     index.sizes());
    DUET_CHECK_SHAPE(x.dim() >= 1, "[index_select] input must have at least one dim, got shape {}",
                     x.sizes());
    dim = detail::wrap_dim("index_select", dim, x.dim());
    // As a gather whose index is the 1-D index broadcast along every other dim (a stride-0 view).
    const SymInt n = detail::sym_numel(detail::sym_dims(index));
    SymDims along(static_cast<size_t>(x.dim()), SymInt(1));
    along[dim] = n;
    SymDims target = detail::sym_dims(x);
    target[dim] = n;
    return gather(x, dim, detail::expand_dims(detail::reshape_dims(index, along), target));
  });
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("embedding", [&]() -> Tensor {
    DUET_CHECK_SHAPE(weight.dim() == 2, "[embedding] weight must be (num_embeddings, dim), got {}",
                     weight.sizes());
    DUET_CHECK_DTYPE(indices.dtype() == DType::i64,
                     "[embedding] indices must be i64, got {} of shape {}", indices.dtype(),
                     indices.sizes());
    Tensor rows = index_select(weight, 0, reshape(indices, {-1}));
    SymDims out = detail::sym_dims(indices);
    out.push_back(detail::sym_dim(weight, 1));
    return detail::reshape_dims(rows, out);
  });
}

// The padding row's reads pass no gradient (their values unchanged): a where over the rows, the
// padding positions' taken detached, so the default embedding stays one index_select.
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx,
                 std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("embedding", [&]() -> Tensor {
    DUET_CHECK_SHAPE(weight.dim() == 2, "[embedding] weight must be (num_embeddings, dim), got {}",
                     weight.sizes());
    const int64_t n = weight.size(0);
    DUET_CHECK_VALUE(padding_idx >= -n && padding_idx < n,
                     "[embedding] padding_idx {} is out of range for {} embeddings", padding_idx,
                     n);
    const Tensor rows = embedding(weight, indices);
    const Tensor pad = unsqueeze(eq(indices, padding_idx < 0 ? padding_idx + n : padding_idx), -1);
    return where(pad, rows.detach(), rows);
  });
}

// Note [Bags]
// embedding_bag reads the rows of its indices (embedding), scales them (a padding index's rows
// by 0, per_sample_weights), and sums each bag's rows with one scatter_add: an index's bag is
// the number of bag starts at or before it, less one (a cumsum of the starts marked by a
// scatter_add of ones, so empty bags, repeated starts, take their place). "mean" divides each
// bag's sum by its rows that are not padding (an empty bag stays 0, as PyTorch's). The offsets'
// values are checked eagerly (PyTorch checks them too); a traced call takes them as given, but
// for "max" (bag_max), whose padded layout reads them.
namespace {
// Mode "max" (Note [Bags]): each bag's rows laid out padded as (bags, longest, dim), the places
// past a bag's end and its padding rows at -inf, and max_with_indices along the bag, whose
// gradient goes to the first maximum, as PyTorch's; an empty bag is zeros. The layout reads the
// bags' bounds: `start` holds each bag's first index, and the input has n.
Tensor bag_max(const Tensor& flat, const Tensor& weight, const std::vector<int64_t>& start,
               int64_t n, std::optional<int64_t> pad) {
  const auto bags = static_cast<int64_t>(start.size());
  auto end = [&](int64_t b) { return b + 1 < bags ? start[size_t(b + 1)] : n; };
  int64_t longest = 0;
  for (int64_t b = 0; b < bags; ++b) longest = std::max(longest, end(b) - start[size_t(b)]);
  const Options w = Options().dtype(weight.dtype()).device(weight.device());
  if (longest == 0) return zeros({bags, weight.size(1)}, w);
  std::vector<double> at(size_t(bags * longest), 0), real(size_t(bags * longest), 0);
  for (int64_t b = 0; b < bags; ++b)
    for (int64_t j = 0; j < end(b) - start[size_t(b)]; ++j) {
      at[size_t(b * longest + j)] = static_cast<double>(start[size_t(b)] + j);
      real[size_t(b * longest + j)] = 1;
    }
  const Options i64 = Options().dtype(DType::i64).device(flat.device());
  const Tensor ids =
      reshape(index_select(flat, 0, tensor(at, {bags * longest}, i64)), {bags, longest});
  Tensor valid = tensor(real, {bags, longest}, i64);
  if (pad) valid = valid * ne(ids, *pad).to(DType::i64);
  const Tensor counted = gt(valid, 0);
  const Tensor vals = where(unsqueeze(counted, 2), embedding(weight, ids), -INFINITY);
  const Tensor top = std::get<0>(max_with_indices(vals, 1));
  return where(unsqueeze(gt(sum(valid, {1}), 0), 1), top, 0.0);
}
}  // namespace

Tensor embedding_bag(const Tensor& input, const Tensor& weight, const Tensor& offsets,
                     std::string_view mode, const Tensor& per_sample_weights,
                     bool include_last_offset, std::optional<int64_t> padding_idx,
                     std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("embedding_bag", [&]() -> Tensor {
    const char* op = "embedding_bag";
    DUET_CHECK_VALUE(mode == "sum" || mode == "mean" || mode == "max",
                     "[{}] mode must be \"sum\", \"mean\" or \"max\", got \"{}\"", op, mode);
    DUET_CHECK_SHAPE(weight.dim() == 2 && is_floating(weight.dtype()),
                     "[{}] weight must be floating (num_embeddings, dim), got {} {}", op,
                     weight.dtype(), weight.sizes());
    DUET_CHECK_DTYPE(input.dtype() == DType::i64, "[{}] input must be i64 indices, got {}", op,
                     input.dtype());
    const bool rows_are_bags = input.dim() == 2;
    DUET_CHECK_SHAPE(rows_are_bags ? !offsets.defined() : input.dim() == 1 && offsets.defined(),
                     "[{}] expected a 1-D input with 1-D offsets, or a 2-D input (each row a bag) "
                     "without offsets; got input {} and offsets {}",
                     op, input.sizes(), offsets.defined() ? offsets.sizes().str() : "undefined");
    const Tensor flat = rows_are_bags ? reshape(input, {-1}) : input;
    const int64_t n = flat.size(0);
    Tensor starts;            // each bag's first index
    std::vector<int64_t> at;  // and its value ("max", and the checks of offsets)
    if (rows_are_bags) {
      starts = arange(input.size(0), Options().device(input.device())) * input.size(1);
      if (mode == "max")
        for (int64_t b = 0; b < input.size(0); ++b) at.push_back(b * input.size(1));
    } else {
      DUET_CHECK_SHAPE(offsets.dim() == 1 && offsets.dtype() == DType::i64 &&
                           (!include_last_offset || offsets.size(0) >= 1),
                       "[{}] offsets must be 1-D i64{}, got {} {}", op,
                       include_last_offset ? " with the end as its last entry" : "",
                       offsets.dtype(), offsets.sizes());
      starts = include_last_offset ? slice(offsets, 0, 0, offsets.size(0) - 1) : offsets;
      // (a traced call reads them only for "max", whose layout needs them)
      if (!detail::is_traced(offsets) || mode == "max") {
        at = offsets.to_vector<int64_t>();
        bool ordered = at.empty() || at[0] == 0;
        for (size_t k = 1; ordered && k < at.size(); ++k) ordered = at[k - 1] <= at[k];
        ordered =
            ordered && (at.empty() || at.back() <= n) && (!include_last_offset || at.back() == n);
        DUET_CHECK_VALUE(ordered,
                         "[{}] offsets must start at 0 and not decrease, up to the input's {} "
                         "indices{}",
                         op, n, include_last_offset ? " (the last one equal to it)" : "");
      }
    }
    const int64_t bags = starts.size(0);
    std::optional<int64_t> pad;  // padding_idx counted from the start
    if (padding_idx) {
      const int64_t v = weight.size(0);
      DUET_CHECK_VALUE(*padding_idx >= -v && *padding_idx < v,
                       "[{}] padding_idx {} is out of range for {} embeddings", op, *padding_idx,
                       v);
      pad = *padding_idx < 0 ? *padding_idx + v : *padding_idx;
    }
    if (mode == "max") {
      DUET_CHECK_VALUE(!per_sample_weights.defined(),
                       "[{}] per_sample_weights needs mode \"sum\", got \"max\"", op);
      if (include_last_offset && !at.empty()) at.pop_back();
      return bag_max(flat, weight, at, n, pad);
    }
    const Options w = Options().dtype(weight.dtype()).device(weight.device());
    // 1 for a row the bag counts, 0 for a padding index's (undefined: every row counts).
    const Tensor keep = pad ? ne(flat, *pad).to(weight.dtype()) : Tensor();
    Tensor rows = embedding(weight, flat);
    if (keep.defined()) rows = rows * unsqueeze(keep, 1);
    if (per_sample_weights.defined()) {
      DUET_CHECK_VALUE(mode == "sum", "[{}] per_sample_weights needs mode \"sum\", got \"{}\"", op,
                       mode);
      DUET_CHECK_SHAPE(per_sample_weights.dim() == input.dim() &&
                           per_sample_weights.sizes() == input.sizes() &&
                           per_sample_weights.dtype() == weight.dtype(),
                       "[{}] per_sample_weights must be the input's shape {} and the weight's "
                       "dtype {}, got {} {}",
                       op, input.sizes(), weight.dtype(), per_sample_weights.dtype(),
                       per_sample_weights.sizes());
      rows = rows * unsqueeze(reshape(per_sample_weights, {-1}), 1);
    }
    const Options i64 = Options().dtype(DType::i64).device(input.device());
    const Tensor marks =
        scatter_add(zeros({n + 1}, i64), 0, starts, ones({bags}, i64)).slice(0, 0, n);
    const Tensor bag = cumsum(marks, 0) - 1;  // (n); -1 only before a first start past 0
    Tensor out = scatter_add(zeros({bags, weight.size(1)}, w), 0,
                             expand(unsqueeze(bag, 1), {n, weight.size(1)}), rows);
    if (mode == "mean") {
      const Tensor count =
          scatter_add(zeros({bags}, w), 0, bag, keep.defined() ? keep : ones({n}, w));
      out = out / unsqueeze(clamp(count, 1, INFINITY), 1);
    }
    return out;
  });
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(!tensors.empty(), "[cat] needs at least one tensor");
  Attrs a;
  a.dim = detail::wrap_dim("cat", dim, std::max<int64_t>(tensors[0].dim(), 1));
  std::vector<const Tensor*> in;
  SymDims lens;  // sizes along dim, for the grad
  for (const Tensor& t : tensors) {
    in.push_back(&t);
    lens.push_back(t.dim() > a.dim ? detail::sym_dim(t, a.dim) : SymInt(0));
  }
  const Attrs sizes = detail::shape_attrs(lens);
  a.ints = sizes.ints;
  a.sym = sizes.sym;
  return detail::call(OpId::Cat, TensorRefs(in.data(), static_cast<int64_t>(in.size())), a);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(!tensors.empty(), "[stack] needs at least one tensor");
  dim = detail::wrap_dim("stack", dim, tensors[0].dim() + 1);
  for (size_t i = 1; i < tensors.size(); ++i)
    DUET_CHECK_SHAPE(detail::same_shape(tensors[i], tensors[0], "stack"),
                     "[stack] tensor {} has shape {} but tensor 0 has {}", i, tensors[i].sizes(),
                     tensors[0].sizes());
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(unsqueeze(t, dim));
  return cat(parts, dim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.dim = detail::wrap_dim("argmax", dim, x.dim());
  a.keepdim = keepdim;
  const Tensor* in[] = {&x};
  return detail::call(OpId::Argmax, TensorRefs(in, 1), a);
}

Tensor argmin(const Tensor& x, int64_t dim, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_DTYPE(x.dtype() != DType::b8, "[argmin] is not defined for b8 input of shape {}",
                   x.sizes());
  dim = detail::wrap_dim("argmin", dim, x.dim());
  DUET_CHECK_VALUE(x.dim() == 0 || !detail::size_is(x, dim, 0, "argmin"),
                   "[argmin] cannot reduce over dim {} of size 0 ({})", dim, x.sizes());
  // Order-reversing and overflow-free for integers too: -x - 1 wraps INT_MIN to INT_MAX.
  return argmax(is_floating(x.dtype()) ? neg(x) : neg(x) - 1, dim, keepdim);
}

}  // namespace duet
