// duet: row rules, one per op row (OpDef::rows), for Autobatch's groups by rows.
//
// Note [Rows]
// Per-sample code makes tensors of per-sample lengths: a sentence's states (n, hidden), its
// tags' scores (n, tags), a tree's leaves' projections. The ops that follow (the tagger's
// product, its bias, log_softmax, the picked scores, the masks) compute each row of their
// result from the same row of some operands and from operands that every row shares (a weight,
// a bias, a number). Samples of different lengths then run as one call on their rows
// concatenated along dim 0, where a signature by shape (step 2 of Note [Autobatch] in
// eager/autobatch.cpp) would make a group per length.
// A row rule says, for one call, which operands give the result its rows (RowsUse::operands):
// those whose dim 0 is the result's and that the op reads row by row. Every other operand must
// be one tensor for the whole group, or the group runs by length instead. The rules follow
// from the op's family:
//  - elementwise ops (and where, cast, copy): an operand of the result's rank whose dim 0 is
//    the result's; the others broadcast along the rows (lower rank, or dim 0 of size 1);
//  - reductions over dims other than 0, and ops along a dim other than 0 (log_softmax, gather,
//    cat, argmax, argsort, scatter_add, slice_scatter): every operand, all of one dim 0;
//  - matmul of a matrix (n, k) by a shared matrix or vector, addmv of a matrix (n, k) (and
//    an input (n)) by a shared vector, and addmm of a matrix (n, k) by a shared matrix (and
//    bias);
//  - the views that keep dim 0 and each row's elements (a reshape of the other dims, a slice
//    or a select along another dim);
//  - a sum over dim 0 (and any others) sums each sample's rows: RowsUse::summed, whose result is
//    one value per sample, as a group by shape makes;
//  - cat along dim 0 joins its operands' rows, however many (RowsUse::joined): a sentence's
//    states stacked into its rows.
// Row rules read shapes and attributes only. Symbolic attributes (a trace's) have none.
#include "core/dispatch.h"
#include "core/ops.h"

namespace duet::detail {

namespace {

int64_t rank(const Tensor& x) { return x.unsafe_impl()->shape.size(); }

// x's dim 0 is the result's: not a wrapped number, and neither is a scalar.
bool along_rows(const Tensor& x, const TensorMeta& out) {
  const TensorImpl* t = x.unsafe_impl();
  return !t->wrapped_number && t->shape.size() > 0 && out.shape.size() > 0 &&
         t->shape[0] == out.shape[0];
}

// The operands in `mask`, or not by rows unless each of them is along the rows.
RowsUse these(TensorRefs in, const TensorMeta& out, uint32_t mask, bool summed = false) {
  for (int64_t i = 0; i < in.size(); ++i)
    if ((mask >> i & 1) && !along_rows(in[i], out)) return {};
  return {mask, summed};
}

// An operand of the result's rank gives rows; the others broadcast along them (of lower rank,
// or of size 1 at dim 0, as broadcasting allowed).
RowsUse elementwise_rows(TensorRefs in, const Attrs&, const TensorMeta& out) {
  RowsUse u;
  for (int64_t i = 0; i < in.size(); ++i)
    if (rank(in[i]) == out.shape.size() && along_rows(in[i], out)) u.operands |= 1u << i;
  return u;
}

// Ops along attrs.dim: by rows where that dim is not 0, every operand of the result's dim 0.
RowsUse along_dim_rows(TensorRefs in, const Attrs& a, const TensorMeta& out) {
  // (RowsUse::operands has a bit per operand: a cat of more operands groups by shape.)
  if (in.size() == 0 || in.size() > 31 || rank(in[0]) < 2 || a.dim == 0 || a.dim == -rank(in[0]))
    return {};
  return these(in, out, (1u << in.size()) - 1);
}

// Reductions: by rows over dims other than 0; a sum over dim 0 sums each sample's rows.
RowsUse reduce_rows(TensorRefs in, const Attrs& a, const TensorMeta& out, bool sum) {
  const int64_t r = rank(in[0]);
  if (r == 0) return {};
  bool over0 = a.ints.empty();
  for (int64_t d : a.ints) over0 = over0 || d == 0 || d == -r;
  if (!over0) return these(in, out, 1);
  if (!sum) return {};  // (max and min over dim 0 pick a row per sample)
  return {1, true};
}
RowsUse sum_rows(TensorRefs in, const Attrs& a, const TensorMeta& out) {
  return reduce_rows(in, a, out, true);
}
RowsUse extreme_rows(TensorRefs in, const Attrs& a, const TensorMeta& out) {
  return reduce_rows(in, a, out, false);
}

// cat along dim 0 joins its operands' rows (of rank 2 or more: a vector's elements are not
// rows to join); along another dim, it is by rows.
RowsUse cat_rows(TensorRefs in, const Attrs& a, const TensorMeta& out) {
  if (a.dim != 0) return along_dim_rows(in, a, out);
  for (int64_t i = 0; i < in.size(); ++i) {
    const TensorImpl* x = in[i].unsafe_impl();
    if (x->wrapped_number || x->shape.size() < 2 || x->shape.size() != out.shape.size() ||
        x->dtype != out.dtype)
      return {};
  }
  return {1, false, true};
}

// A matrix (n, k) times a shared matrix or vector.
RowsUse matmul_rows(TensorRefs in, const Attrs&, const TensorMeta& out) {
  if (rank(in[0]) != 2) return {};
  return these(in, out, 1);
}

// input (n) + mat (n, k) @ vec, vec shared; an input of size 1 broadcasts.
RowsUse addmv_rows(TensorRefs in, const Attrs&, const TensorMeta& out) {
  return these(in, out, along_rows(in[0], out) ? 3u : 2u);
}

// input (n) + mat1 (m, k) @ mat2, the input and mat2 shared.
RowsUse addmm_rows(TensorRefs in, const Attrs&, const TensorMeta& out) {
  return these(in, out, 2u);
}

// A reshape that keeps dim 0 (each row keeps its elements, in order).
RowsUse reshape_rows(TensorRefs in, const Attrs& a, const TensorMeta& out) {
  if (rank(in[0]) == 0 || a.ints.empty() || a.ints[0] != out.shape[0] || in[0].numel() == 0)
    return {};
  return these(in, out, 1);
}

// A slice or a select along a dim other than 0.
RowsUse slice_rows(TensorRefs in, const Attrs& a, const TensorMeta& out) {
  if (rank(in[0]) < 2 || a.dim == 0 || a.dim == -rank(in[0])) return {};
  return these(in, out, 1);
}

}  // namespace

void register_row_rules(OpDef* t) {
  for (int i = 0; i < kNumOps; ++i)
    if (t[i].cls == OpClass::Elementwise) t[i].rows = elementwise_rows;
  t[int(OpId::Sum)].rows = sum_rows;
  for (OpId op : {OpId::Max, OpId::Min}) t[int(op)].rows = extreme_rows;
  for (OpId op : {OpId::Argmax, OpId::Gather, OpId::ScatterAdd, OpId::SliceScatter, OpId::Argsort,
                  OpId::LogSoftmax})
    t[int(op)].rows = along_dim_rows;
  t[int(OpId::Cat)].rows = cat_rows;
  t[int(OpId::MatMul)].rows = matmul_rows;
  t[int(OpId::Addmv)].rows = addmv_rows;
  t[int(OpId::Addmm)].rows = addmm_rows;
  t[int(OpId::Reshape)].rows = reshape_rows;
  t[int(OpId::Slice)].rows = slice_rows;
  t[int(OpId::Select)].rows = slice_rows;
}

}  // namespace duet::detail
