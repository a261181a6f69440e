// duet: Autobatch's picks (Note [Picks]): rows taken from per-sample inputs of different
// lengths, batched as one index_select per source.
#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>
#include <unordered_map>

#include "eager/autobatch_impl.h"

namespace duet {
using namespace autobatch;

// Note [Picks]
// Per-sample code reads rows of per-sample tensors: a BiLSTM's token k of its sentence
// (x.select(0, k), a Select of dim 0 when a gradient flows through it), a tree's leaf's row of
// its sentence's projections (index_select(xs, 0, pick), a Gather on dim 0 whose index is
// broadcast along the other dims). By the signature of step 2 of Note [Autobatch], each
// sentence length, and each token's position, would make a signature of its own: thousands of
// groups of a few ops, whose batching rule (vmap's) also gives each sample's gradient the size
// of its whole input.
// A pick's signature therefore leaves out its input's length along dim 0, a slice's or a
// select's start (kept per op, PendingOp::start) and a Gather's number of rows (an embedding's
// lookup of a sentence's words); rows (the dims after 0) must still agree, and so must the
// number of rows a slice takes. A select takes one row, without its dim 0. Its input must have at
// least two dims (a vector's slices are views of their batch, as before), and lie on the CPU, as a
// Gather's index must (its values are read when the group runs). A group of picks whose inputs all
// have one length (and one start), and whose ops take as many rows, runs by the op's own rule.
// Otherwise the group takes, for each sample, the rows it picks, in its source: the batch that
// computed the sample in this run, flattened to rows (the sample's rows start at its index
// times its length), or the input itself. The samples are ordered by source (the order in which
// sources first appear, so that runs are deterministic), and each source gives one
// index_select of its rows; the pieces are concatenated. The index_selects record the gradient:
// one scatter_add per source in the backward. Without a gradient, on the CPU, the rows are
// copied directly into the batch. Where the ops take different numbers of rows, the batch
// holds them one sample after another, by rows (Note [Groups by rows] in
// eager/autobatch_rows.cpp). An index out of range falls back to the groups by length, which
// raise the eager error.

namespace {

// The rows of a tensor: its dims after the first.
Shape rows_of(const TensorImpl* x) {
  Shape s;
  for (int64_t d = 1; d < x->shape.size(); ++d) s.push_back(x->shape[d]);
  return s;
}

// Whether index broadcasts a 1-D index along every dim of x but the first (index_select's
// Gather): i64 on the CPU, of x's rank, x's sizes after dim 0, stride 0 along them.
bool broadcast_index(const TensorImpl* x, const Tensor& index) {
  const TensorImpl* i = index.unsafe_impl();
  if (!detail::index_rows(index) || !index.device().is_cpu() || i->shape.size() != x->shape.size())
    return false;
  for (int64_t d = 1; d < x->shape.size(); ++d)
    if (i->shape[d] != x->shape[d]) return false;
  return true;
}

// The rows a pick takes: a select's one, a slice's or a Gather's dim 0.
int64_t picked(const PendingOp& o) { return o.op == OpId::Select ? 1 : o.shape()[0]; }

// Whether every op of the group picks as many rows.
bool same_length(const std::vector<PendingOp>& ops, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (picked(ops[static_cast<size_t>(id)]) != picked(ops[static_cast<size_t>(ids[0])]))
      return false;
  return true;
}

// Whether sample x's rows are each contiguous (any stride between rows).
bool rows_contiguous(const TensorImpl* x) {
  int64_t want = 1;
  for (int64_t d = x->shape.size() - 1; d >= 1; --d) {
    if (x->shape[d] != 1 && x->strides[d] != want) return false;
    want *= x->shape[d];
  }
  return true;
}

}  // namespace

namespace autobatch {

bool is_pick(const OpCall& c) {
  if ((c.op != OpId::Slice && c.op != OpId::Select && c.op != OpId::Gather) || c.inplace_out ||
      c.attrs.dim != 0 || c.attrs.sym)
    return false;
  const TensorImpl* x = c.inputs[0].unsafe_impl();
  if (x->shape.size() < 2 || !c.inputs[0].device().is_cpu() || x->wrapped_number) return false;
  return c.op != OpId::Gather ? c.attrs.step >= 1 : broadcast_index(x, c.inputs[1]);
}

}  // namespace autobatch

// Without a gradient, on the CPU: each sample's rows copied into the batch (false: a sample's
// rows are not each contiguous, and the caller takes them as tensors). at[k]: sample k's first
// pick in `rows`.
bool Autobatch::Impl::copy_picks(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                                 const std::vector<int64_t>& rows, const std::vector<int64_t>& at) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  for (int32_t id : ids)
    if (!rows_contiguous(ops[static_cast<size_t>(id)].inputs[0].unsafe_impl())) return false;
  const TensorImpl* x0 = first.inputs[0].unsafe_impl();
  const int64_t item = itemsize(x0->dtype);
  const Shape row = rows_of(x0);
  const bool same = same_length(ops, ids);
  Shape shape{same ? static_cast<int64_t>(ids.size()) : static_cast<int64_t>(rows.size())};
  if (same && first.op != OpId::Select) shape.push_back(first.shape()[0]);
  for (int64_t d = 0; d < row.size(); ++d) shape.push_back(row[d]);
  Tensor batch = detail::empty(shape, x0->dtype, Device::cpu());
  const auto bytes = static_cast<size_t>(row.numel() * item);
  auto* dst = static_cast<char*>(batch.unsafe_impl()->data());
  for (size_t k = 0; bytes && k < ids.size(); ++k) {  // (empty rows have no data to read)
    const TensorImpl* x = ops[static_cast<size_t>(ids[k])].inputs[0].unsafe_impl();
    const auto* src = static_cast<const char*>(x->data());
    for (int64_t j = at[k]; j < at[k + 1]; ++j, dst += bytes)
      std::memcpy(dst, src + rows[static_cast<size_t>(j)] * x->strides[0] * item, bytes);
  }
  ++kernels_;
  ++stats_.batches;
  stats_.batched_ops += static_cast<int64_t>(ids.size());
  count_group(first.op, static_cast<int64_t>(ids.size()));
  if (same)
    place_batch(ops, ids, {batch, 0});
  else
    place_rows(ops, ids, batch, /*keep=*/false);
  return true;
}

// A group of picks (Note [Picks]).
void Autobatch::Impl::run_picks(std::vector<PendingOp>& ops, const Attrs& attrs,
                                std::vector<int32_t> ids) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  const bool slice = first.op != OpId::Gather;  // a slice or a select: rows from o.start
  auto length = [&](int32_t id) {
    return ops[static_cast<size_t>(id)].inputs[0].unsafe_impl()->shape[0];
  };
  // By length, start and picks: each part runs by the op's rule, with the slice's own
  // attributes.
  auto by_length = [&] {
    std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<int32_t>> parts;
    for (int32_t id : ids) {
      const PendingOp& o = ops[static_cast<size_t>(id)];
      parts[{length(id), o.start, picked(o)}].push_back(id);
    }
    for (const auto& [where, part] : parts) {
      Attrs a = attrs;
      if (slice) {
        a.start = std::get<1>(where);
        a.end = std::get<1>(where) + attrs.end;
      }
      run_group(ops, a, part);
    }
  };
  const bool same = same_length(ops, ids);
  bool uniform = same;
  for (int32_t id : ids)
    uniform = uniform && length(id) == length(ids[0]) &&
              ops[static_cast<size_t>(id)].start == first.start;
  if (uniform) return by_length();
  // Each sample's rows in its input, in group order: sample k's from at[k] to at[k + 1].
  std::vector<int64_t> rows, at{0};
  for (int32_t id : ids) {
    const PendingOp& o = ops[static_cast<size_t>(id)];
    const int64_t len = picked(o);
    if (slice) {
      for (int64_t j = 0; j < len; ++j) rows.push_back(o.start + j * attrs.step);
    } else {
      const TensorImpl* index = o.inputs[1].unsafe_impl();
      const auto* in = static_cast<const int64_t*>(index->data());
      for (int64_t j = 0; j < len; ++j) {
        const int64_t r = in[j * index->strides[0]];
        if (r < 0 || r >= length(id)) return by_length();  // the eager error, from its sample
        rows.push_back(r);
      }
    }
    at.push_back(static_cast<int64_t>(rows.size()));
  }
  bool grad = false;
  for (int32_t id : ids) grad |= ops[static_cast<size_t>(id)].grad;
  if (!grad && copy_picks(ops, ids, rows, at)) return;
  // Each sample's source (its batch in this run, with its history, or its input) and the row
  // at which the sample starts there; sources numbered as they first appear.
  detail::SiteGuard site(first.site);
  GradModeScope tape(grad);
  std::unordered_map<const TensorImpl*, int32_t> source_of;
  std::vector<Tensor> sources;
  std::vector<int32_t> source(ids.size());
  std::vector<int64_t> base(ids.size(), 0);
  for (size_t k = 0; k < ids.size(); ++k) {
    const PendingOp& o = ops[static_cast<size_t>(ids[k])];
    const PendingOp* b = grad ? batch_source(ops, o, 0) : nullptr;
    const Tensor s = b ? b->batch->value : grad ? gated(o.inputs[0], ids[k]) : o.inputs[0];
    // (A sample of a batch by rows starts at its index, Note [Rows].)
    if (b && b->index >= 0) base[k] = b->rows >= 0 ? b->index : b->index * length(ids[k]);
    auto [it, fresh] = source_of.emplace(s.unsafe_impl(), static_cast<int32_t>(sources.size()));
    if (fresh) sources.push_back(s);
    source[k] = it->second;
  }
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return source[a] < source[b]; });
  const Shape row = rows_of(first.inputs[0].unsafe_impl());
  Shape flat{-1};
  for (int64_t d = 0; d < row.size(); ++d) flat.push_back(row[d]);
  std::vector<Tensor> pieces;
  std::vector<int32_t> sorted;
  sorted.reserve(ids.size());
  for (size_t k = 0; k < order.size();) {
    const int32_t s = source[order[k]];
    size_t e = k;
    std::vector<int64_t> at_rows;
    for (; e < order.size() && source[order[e]] == s; ++e) {
      const size_t i = order[e];
      sorted.push_back(ids[i]);
      for (int64_t j = at[i]; j < at[i + 1]; ++j)
        at_rows.push_back(base[i] + rows[static_cast<size_t>(j)]);
    }
    pieces.push_back(index_select(reshape(sources[static_cast<size_t>(s)], flat), 0,
                                  index_tensor(at_rows, Device::cpu())));
    k = e;
  }
  if (pieces.size() > 1) ++stats_.gathers;
  Tensor all = pieces.size() == 1 ? pieces[0] : cat(pieces, 0);
  ++stats_.batches;
  stats_.batched_ops += static_cast<int64_t>(ids.size());
  count_group(first.op, static_cast<int64_t>(ids.size()));
  if (!same) return place_rows(ops, sorted, all, /*keep=*/grad);  // (Note [Rows])
  Shape shape{static_cast<int64_t>(ids.size())};
  if (first.op != OpId::Select) shape.push_back(first.shape()[0]);
  for (int64_t d = 0; d < row.size(); ++d) shape.push_back(row[d]);
  place_batch(ops, sorted, {reshape(all, shape), 0}, /*keep=*/grad);
}

}  // namespace duet
