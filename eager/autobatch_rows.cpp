// duet: Autobatch's groups by rows (Note [Rows] in core/ops/rows.cpp): ops on per-sample rows
// of different lengths, run as one call on their rows concatenated.
#include <algorithm>
#include <bit>
#include <map>
#include <unordered_map>

#include "eager/autobatch_impl.h"

namespace duet {
using namespace autobatch;

// Note [Groups by rows]
// A signature by rows (step 2 of Note [Autobatch], with the row rule's operands' dim 0 left
// out) holds calls of several lengths. Its group, once ready:
//  - runs by its op's batching rule, one group per length, when its samples have one length
//    (the rule stacks them, as for any signature), or when an operand that is not by rows
//    differs between samples (a per-sample bias). A signature whose calls all had one length
//    (SigKey::mixed, kept as they are recorded) goes to the rule at once;
//  - otherwise concatenates each operand by rows along dim 0 (gather_rows), calls the op once
//    on the concatenations and the shared operands, and gives each op its rows of the result:
//    its storage points there, or, when a gradient flows, its batch (PendingOp::batch) is the
//    result and PendingOp::rows says which rows are its (index .. index + rows);
//  - a sum over dim 0 (RowsUse::summed) sums the concatenation over its other reduced dims,
//    then adds each sample's rows into its own row of a batch (scatter_add by sample), which
//    holds one result per sample, as a group by shape would.
// gather_rows takes each sample's rows where they lie: a batch by rows (its rows), a batch by
// shape (flattened to rows: sample k of length n is rows k * n .. k * n + n), a value its group
// computed once, or the operand itself. With a gradient, runs of consecutive rows of one
// source are slices of it, and where the runs are many, each source gives one index_select and
// one more puts the concatenation in the group's order (as Note [Pieces by source] in
// eager/autobatch_tape.cpp). Without one, on the CPU, the rows are copied into the batch.

namespace {

// The rows of a batch: its value, or a batch by shape with its samples' dims flattened into its
// first (sample k's rows then follow sample k - 1's).
Tensor rows_of_batch(const Tensor& v, bool by_rows) {
  if (by_rows || v.dim() < 2) return v;
  Shape s{-1};
  for (int64_t d = 2; d < v.dim(); ++d) s.push_back(v.sizes()[d]);
  return reshape(v, s);
}

}  // namespace

// The rows of the items (operand .second of op .first), one after another along dim 0 (Note
// [Groups by rows]).
Tensor Autobatch::Impl::gather_rows(std::vector<PendingOp>& ops,
                                    const std::vector<std::pair<int32_t, uint32_t>>& items,
                                    bool grad) {
  const size_t n = items.size();
  auto operand = [&](size_t k) -> const Tensor& {
    return ops[static_cast<size_t>(items[k].first)].inputs[items[k].second];
  };
  const TensorImpl* x0 = operand(0).unsafe_impl();
  if (!grad && x0->device().is_cpu()) {  // copied, one item after another
    bool contiguous = true;
    int64_t total = 0;
    for (size_t k = 0; k < n; ++k) {
      const TensorImpl* x = operand(k).unsafe_impl();
      contiguous = contiguous && x->contiguous;
      total += x->shape[0];
    }
    if (contiguous) {
      Shape shape{total};
      for (int64_t d = 1; d < x0->shape.size(); ++d) shape.push_back(x0->shape[d]);
      Tensor batch = detail::empty(shape, x0->dtype, Device::cpu());
      auto* dst = static_cast<char*>(batch.unsafe_impl()->data());
      for (size_t k = 0; k < n; ++k) {
        const TensorImpl* x = operand(k).unsafe_impl();
        const auto bytes = static_cast<size_t>(x->shape.numel() * itemsize(x->dtype));
        if (bytes) std::memcpy(dst, x->data(), bytes);  // (no data to read when empty)
        dst += bytes;
      }
      ++kernels_;
      ++stats_.gathers;
      return batch;
    }
  }
  // Each sample's source (a tensor of rows), its first row there and its length.
  std::vector<Tensor> sources;
  std::unordered_map<const void*, size_t> source_at;  // by batch or tensor
  std::vector<size_t> from(n);
  std::vector<int64_t> first(n), len(n);
  for (size_t k = 0; k < n; ++k) {
    const PendingOp& o = ops[static_cast<size_t>(items[k].first)];
    const PendingOp* src = grad ? batch_source(ops, o, items[k].second) : nullptr;
    const Tensor& x = operand(k);
    len[k] = x.unsafe_impl()->shape[0];
    // (A tensor from outside the run comes through its gate, each reader registered; a reader
    // that records no gradient gets it detached, a source of its own.)
    const Tensor in = src || !grad ? Tensor() : gated(x, items[k].first);
    const void* key = src    ? static_cast<const void*>(src->batch)
                      : grad ? static_cast<const void*>(in.unsafe_impl())
                             : static_cast<const void*>(x.unsafe_impl());
    auto [it, fresh] = source_at.emplace(key, sources.size());
    if (fresh) {
      if (!src || src->index < 0)
        sources.push_back(src ? src->batch->value : grad ? in : x);
      else
        sources.push_back(rows_of_batch(src->batch->value, src->rows >= 0));
    }
    from[k] = it->second;
    first[k] = !src || src->index < 0 ? 0 : src->rows >= 0 ? src->index : src->index * len[k];
  }
  // Runs of consecutive rows of one source, each a slice.
  std::vector<size_t> starts;
  for (size_t k = 0; k < n; ++k)
    if (k == 0 || from[k] != from[k - 1] || first[k] != first[k - 1] + len[k - 1])
      starts.push_back(k);
  starts.push_back(n);
  const size_t runs = starts.size() - 1;
  std::vector<Tensor> pieces;
  if (runs > 3 && sources.size() + 2 < runs) {
    // By source: one index_select each, then one into the group's order.
    std::vector<std::vector<int64_t>> at(sources.size());
    std::vector<int64_t> where(sources.size() + 1, 0), order;
    for (size_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < len[k]; ++j) at[from[k]].push_back(first[k] + j);
    for (size_t s = 0; s < sources.size(); ++s) {
      where[s + 1] = where[s] + static_cast<int64_t>(at[s].size());
      pieces.push_back(index_select(sources[s], 0, index_tensor(at[s], sources[s].device())));
      ++stats_.pieces;
    }
    std::vector<int64_t> next(where.begin(), where.end() - 1);
    for (size_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < len[k]; ++j) order.push_back(next[from[k]]++);
    ++stats_.gathers;
    const Tensor all = pieces.size() == 1 ? pieces[0] : cat(pieces, 0);
    return index_select(all, 0, index_tensor(order, all.device()));
  }
  for (size_t r = 0; r < runs; ++r) {
    const size_t a = starts[r], b = starts[r + 1];
    const Tensor& s = sources[from[a]];
    const int64_t lo = first[a], hi = first[b - 1] + len[b - 1];
    if (lo == 0 && hi == s.sizes()[0]) {
      pieces.push_back(s);
    } else {
      pieces.push_back(slice(s, 0, lo, hi));
      ++stats_.pieces;
    }
  }
  if (pieces.size() == 1) return pieces[0];
  ++stats_.gathers;
  return cat(pieces, 0);
}

// Each op gets its rows of r, the group's result by rows (Note [Groups by rows]).
void Autobatch::Impl::place_rows(std::vector<PendingOp>& ops, const std::vector<int32_t>& ids,
                                 Tensor r, bool keep) {
  if (!r.is_contiguous()) r = r.contiguous();
  const TensorImpl* ri = r.unsafe_impl();
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  DUET_ASSERT(ri->dtype == first.dtype(),
              "[autobatch] {} by rows gave {} where its shape rule said {}",
              detail::op_def(first.op).name, ri->dtype, first.dtype());
  const Batch* held = keep ? hold(r) : nullptr;
  const bool view = detail::op_def(first.op).cls == OpClass::View;
  const StoragePtr root = owner_of(ri);
  const int64_t step = ri->strides[0] * itemsize(ri->dtype);
  auto* base = static_cast<char*>(ri->shape.numel() ? ri->data() : nullptr);
  int64_t at = 0;
  for (int32_t id : ids) {
    PendingOp& o = ops[static_cast<size_t>(id)];
    const int64_t len = o.shape()[0];
    if (held) {  // placed when read (Note [Placed when read] in eager/autobatch_tape.cpp)
      o.batch = held;
      o.index = at;
      o.rows = len;
    } else if (!view && aliases_operand(o, root.get())) {  // a copy, as eager makes one
      place(o, slice(r, 0, at, at + len).clone());
    } else {
      fill(o.out(), base ? base + at * step : nullptr, root);
    }
    at += len;
  }
  DUET_ASSERT(at == ri->shape[0], "[autobatch] {} by rows gave {} rows where its samples hold {}",
              detail::op_def(first.op).name, ri->shape[0], at);
}

// A group by rows (Note [Groups by rows]).
void Autobatch::Impl::run_rows(std::vector<PendingOp>& ops, const SigKey& key,
                               const std::vector<int32_t>& ids) {
  const PendingOp& first = ops[static_cast<size_t>(ids[0])];
  const auto r0 = static_cast<size_t>(std::countr_zero(key.rows.operands));
  auto length = [&](int32_t id) {
    return ops[static_cast<size_t>(id)].inputs[r0].unsafe_impl()->shape[0];
  };
  auto by_length = [&] {
    std::map<int64_t, std::vector<int32_t>> parts;
    for (int32_t id : ids) parts[length(id)].push_back(id);
    for (const auto& [len, part] : parts) run_group(ops, key.attrs_of_length(len), part);
  };
  bool grad = false;
  for (int32_t id : ids) grad |= ops[static_cast<size_t>(id)].grad;
  if (key.rows.joined) {  // (a join's samples may join different numbers of operands)
    std::vector<std::pair<int32_t, uint32_t>> items;
    for (int32_t id : ids)
      for (size_t p = 0; p < ops[static_cast<size_t>(id)].inputs.size(); ++p)
        items.emplace_back(id, static_cast<uint32_t>(p));
    detail::SiteGuard at(first.site);
    GradModeScope tape(grad);
    ++stats_.batches;
    stats_.batched_ops += static_cast<int64_t>(ids.size());
    count_group(first.op, static_cast<int64_t>(ids.size()));
    return place_rows(ops, ids, gather_rows(ops, items, grad), grad);
  }
  bool uniform = true;
  for (int32_t id : ids) uniform = uniform && length(id) == length(ids[0]);
  if (uniform) return run_group(ops, key.attrs_of_length(length(ids[0])), ids);
  // The other operands: one tensor for the whole group, or the group runs by length.
  std::vector<Tensor> in;
  for (size_t p = 0; p < first.inputs.size(); ++p) {
    if (key.rows.has(static_cast<int64_t>(p))) {
      in.emplace_back();
      continue;
    }
    if (!shared_operand(ops, ids, p)) return by_length();
    bool needs = false;
    for (int32_t id : ids)
      needs |= grad && ops[static_cast<size_t>(id)].inputs[p].unsafe_impl()->requires_grad;
    in.push_back(needs ? shared_gated(ops, ids, p) : first.inputs[p]);
  }
  const OpDef& def = detail::op_def(first.op);
  detail::SiteGuard at(first.site);  // an error names its first sample's line
  GradModeScope tape(grad);
  for (size_t p = 0; p < first.inputs.size(); ++p) {
    if (!key.rows.has(static_cast<int64_t>(p))) continue;
    std::vector<std::pair<int32_t, uint32_t>> items;
    std::vector<int32_t> row_ops;  // (Note [Row gates] in eager/autobatch_reach.cpp)
    for (int32_t id : ids) {
      items.emplace_back(id, static_cast<uint32_t>(p));
      const int64_t n = ops[static_cast<size_t>(id)].inputs[p].unsafe_impl()->shape[0];
      if (grad) row_ops.insert(row_ops.end(), static_cast<size_t>(n), id);
    }
    in[p] = gather_rows(ops, items, grad);
    if (grad) in[p] = row_gated(in[p], std::move(row_ops));
  }
  ++stats_.batches;
  stats_.batched_ops += static_cast<int64_t>(ids.size());
  count_group(first.op, static_cast<int64_t>(ids.size()));
  std::vector<const Tensor*> ptrs;
  for (const Tensor& x : in) ptrs.push_back(&x);
  if (!key.rows.summed) {
    Tensor r = detail::call(def.id, TensorRefs(ptrs.data(), static_cast<int64_t>(ptrs.size())),
                            key.attrs_of_length(in[r0].sizes()[0]));
    // A result that shares memory with an operand (which eager copies) is copied once.
    const StorageImpl* root = root_of(r.unsafe_impl());
    bool shares = false;
    for (const Tensor& x : in) shares = shares || root_of(x.unsafe_impl()) == root;
    if (shares && def.cls != OpClass::View && grad) r = r.clone();
    return place_rows(ops, ids, r, grad);
  }
  // A sum over dim 0: over the other reduced dims first, then each sample's rows into its row.
  const Tensor& x = in[0];
  Dims others;
  for (int64_t d = 1; d < x.dim(); ++d) {
    bool reduced = key.attrs.ints.empty();
    for (int64_t e : key.attrs.ints) reduced = reduced || e == d || e == d - x.dim();
    if (reduced) others.push_back(d);
  }
  Tensor y = x;
  if (!others.empty()) {
    Attrs a = key.attrs;
    a.ints.clear();
    for (int64_t d : others) a.ints.push_back(d);
    const Tensor* xs[] = {&x};
    y = detail::call(OpId::Sum, TensorRefs(xs, 1), a);
  }
  if (y.dtype() != first.dtype()) y = y.to(first.dtype());
  std::vector<int64_t> sample;
  for (size_t k = 0; k < ids.size(); ++k)
    sample.insert(sample.end(), static_cast<size_t>(length(ids[k])), static_cast<int64_t>(k));
  Shape one{y.sizes()[0]}, each{static_cast<int64_t>(ids.size())};
  for (int64_t d = 1; d < y.dim(); ++d) {
    one.push_back(1);
    each.push_back(y.sizes()[d]);
  }
  const Tensor index = expand(reshape(index_tensor(sample, y.device()), one), y.sizes());
  Tensor s = scatter_add(zeros(each, Options().dtype(y.dtype()).device(y.device())), 0, index, y);
  if (key.attrs.keepdim) s = unsqueeze(s, 1);
  place_batch(ops, ids, {s, 0}, /*keep=*/grad, /*defer=*/grad);
}

}  // namespace duet
