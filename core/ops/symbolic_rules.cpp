// Symbolic rules: how each op's result dims depend on its inputs' dims when some are SymInts
// (Note [Symbolic dims] in trace/compile.h). They hang off the same table entries as the shape
// rules, which validate the traced call's sizes first; the tracer checks every symbolic result
// against the shape rule's at those sizes. Unfold and Fold need concrete spatial sizes (their
// attributes), but not a concrete batch or channel count.
#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {

SymInt sym_numel(const SymDims& d) {
  SymInt n = 1;
  for (const SymInt& s : d) n *= s;
  return n;
}

bool all_concrete(const SymDims& d) {
  for (const SymInt& s : d)
    if (!s.is_concrete()) return false;
  return true;
}

SymDims meta_dims(const TensorMeta& m) {
  if (!m.sym.empty()) return m.sym;
  return SymDims(m.shape.begin(), m.shape.end());
}

int64_t sym_hint(const SymInt& s) {
  if (s.is_concrete()) return s.concrete();
  SymContext* c = sym_context();
  DUET_ASSERT(c, "the size {} is symbolic outside a symbolic trace", s.str());
  return c->hint(s);
}

Shape hint_shape(const SymDims& d) {
  Shape s;
  for (const SymInt& x : d) s.push_back(sym_hint(x));
  return s;
}

std::string dims_str(const SymDims& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + d[i].str();
  return s + ")";
}

Attrs shape_attrs(const SymDims& dims) {
  Attrs a;
  for (const SymInt& s : dims) a.ints.push_back(sym_hint(s));
  if (!all_concrete(dims)) {
    auto sym = std::make_shared<SymAttrs>();
    sym->ints = dims;
    a.sym = std::move(sym);
  }
  return a;
}

SymDims attr_dims(const Attrs& a) {
  if (a.sym && !a.sym->ints.empty()) return a.sym->ints;
  return SymDims(a.ints.begin(), a.ints.end());
}

bool same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dim() != b.dim()) return false;
  // Concrete sizes on both sides decide without guards, and without copying them as SymInts
  // (stack checks each of its operands).
  if (a.impl()->sym.empty() && b.impl()->sym.empty()) return a.impl()->shape == b.impl()->shape;
  const SymDims x = sym_dims(a), y = sym_dims(b);
  for (size_t i = 0; i < x.size(); ++i)
    if (!sym_decide(x[i], SymRel::Eq, y[i], op)) return false;
  return true;
}

bool size_is(const Tensor& t, int64_t d, const SymInt& n, const char* op) {
  const SymInt s = t.impl()->sym.empty() ? SymInt(t.impl()->shape[d]) : t.impl()->sym[d];
  return sym_decide(s, SymRel::Eq, n, op);
}

namespace {

// One dim of a broadcast: equal sizes, or one of them 1 (decided with guards when symbolic).
SymInt broadcast_dim(const SymInt& a, const SymInt& b, const char* op) {
  if (a == b) return a;
  if (a == SymInt(1)) return b;
  if (b == SymInt(1)) return a;
  // One guard, on what decided the traced sizes: equal sizes, or one of them 1.
  const int64_t ha = sym_hint(a), hb = sym_hint(b);
  if (ha == hb) {
    sym_decide(a, SymRel::Eq, b, op);
    return a.is_concrete() ? a : b;
  }
  const bool one = sym_decide(ha == 1 ? a : b, SymRel::Eq, 1, op);
  DUET_ASSERT(one, "[{}] broadcast of {} and {} accepted by the shape rule", op, a.str(), b.str());
  return ha == 1 ? b : a;
}

SymDims broadcast(const SymDims& a, const SymDims& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  SymDims out(n);
  for (size_t i = 0; i < n; ++i) {
    const SymInt da = i < n - a.size() ? SymInt(1) : a[i - (n - a.size())];
    const SymInt db = i < n - b.size() ? SymInt(1) : b[i - (n - b.size())];
    out[i] = broadcast_dim(da, db, op);
  }
  return out;
}

void require_eq(const SymInt& a, const SymInt& b, const char* op) {
  const bool eq = sym_decide(a, SymRel::Eq, b, op);
  DUET_ASSERT(eq, "[{}] sizes {} and {} accepted by the shape rule", op, a.str(), b.str());
}

void sym_elementwise(const OpDef& def, TensorRefs in, const Attrs&, const TensorMeta&,
                     SymDims& out) {
  out = sym_dims(in[0]);
  for (int64_t i = 1; i < in.size(); ++i) out = broadcast(out, sym_dims(in[i]), def.name);
}

void sym_reduce(const OpDef&, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  const SymDims x = sym_dims(in[0]);
  out.clear();
  for (size_t i = 0; i < x.size(); ++i) {
    bool reduced = a.ints.empty();
    for (int64_t d : a.ints) reduced |= d == static_cast<int64_t>(i);
    if (!reduced)
      out.push_back(x[i]);
    else if (a.keepdim)
      out.push_back(1);
  }
}

void sym_argmax(const OpDef&, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
  if (out.empty()) return;
  if (a.keepdim)
    out[a.dim] = 1;
  else
    out.erase(out.begin() + a.dim);
}

void sym_matmul(const OpDef& def, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  // A vector on the left is a row, on the right a column (Note [Vector operands] in
  // core/ops/linalg.cpp).
  const SymDims a = sym_dims(in[0]), b = sym_dims(in[1]);
  const bool av = a.size() == 1, bv = b.size() == 1;
  require_eq(a[a.size() - 1], b[bv ? 0 : b.size() - 2], def.name);
  out = broadcast(SymDims(a.begin(), av ? a.begin() : a.end() - 2),
                  SymDims(b.begin(), bv ? b.begin() : b.end() - 2), def.name);
  if (!av) out.push_back(a[a.size() - 2]);
  if (!bv) out.push_back(b[b.size() - 1]);
}

void sym_addmv(const OpDef& def, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  const SymDims input = sym_dims(in[0]), mat = sym_dims(in[1]), vec = sym_dims(in[2]);
  require_eq(mat[1], vec[0], def.name);
  require_eq(input[0], mat[0], def.name);
  out = {mat[0]};
}

void sym_addmm(const OpDef& def, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  const SymDims input = sym_dims(in[0]), a = sym_dims(in[1]), b = sym_dims(in[2]);
  require_eq(a[1], b[0], def.name);
  require_eq(input[0], b[1], def.name);
  out = {a[0], b[1]};
}

void sym_reshape(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = attr_dims(a);
  require_eq(sym_numel(sym_dims(in[0])), sym_numel(out), def.name);
}

void sym_permute(const OpDef&, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  const SymDims x = sym_dims(in[0]);
  out.clear();
  for (int64_t d : a.ints) out.push_back(x[d]);
}

SymInt slice_len(const SymInt& start, const SymInt& end, int64_t step) {
  return floordiv(end - start + SymInt(step - 1), step);
}

void sym_slice(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
  const SymInt start = a.sym && a.sym->start ? *a.sym->start : SymInt(a.start);
  const SymInt end = a.sym && a.sym->end ? *a.sym->end : SymInt(a.end);
  const bool in_range = sym_decide(end, SymRel::Le, out[a.dim], def.name);
  DUET_ASSERT(in_range, "[slice] end {} past size {} accepted by the shape rule", end.str(),
              out[a.dim].str());
  out[a.dim] = slice_len(start, end, a.step);
}

void sym_select(const OpDef&, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
  out.erase(out.begin() + a.dim);
}

void sym_slice_scatter(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta& m,
                       SymDims& out) {
  const Tensor* base[] = {&in[0]};
  SymDims part;
  sym_slice(def, TensorRefs(base, 1), a, m, part);
  const SymDims src = sym_dims(in[1]);
  for (size_t i = 0; i < part.size(); ++i) require_eq(src[i], part[i], def.name);
  out = sym_dims(in[0]);
}

void sym_expand(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  const SymDims x = sym_dims(in[0]);
  out = attr_dims(a);
  const size_t lead = out.size() - x.size();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == out[lead + i] || x[i] == SymInt(1)) continue;
    if (sym_decide(x[i], SymRel::Eq, out[lead + i], def.name)) continue;
    const bool one = sym_decide(x[i], SymRel::Eq, 1, def.name);
    DUET_ASSERT(one, "[expand] {} to {} accepted by the shape rule", dims_str(x), dims_str(out));
  }
}

void sym_source(const OpDef&, TensorRefs, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = attr_dims(a);
}

void sym_arange(const OpDef&, TensorRefs, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = {a.sym && a.sym->end ? *a.sym->end : SymInt(a.end)};
}

void sym_cat(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
  out[a.dim] = 0;
  for (int64_t i = 0; i < in.size(); ++i) {
    const SymDims s = sym_dims(in[i]);
    for (size_t d = 0; d < s.size(); ++d)
      if (static_cast<int64_t>(d) != a.dim) require_eq(s[d], out[d], def.name);
    out[a.dim] += s[a.dim];
  }
}

// Unfold and Fold: N and C may be symbolic; the spatial sizes are attributes (H, W), so a
// symbolic one is specialized (window_attrs reads them as integers first, so none reaches here
// from the builders).
void concrete_dims(const OpDef& def, const SymDims& x, std::initializer_list<size_t> dims) {
  std::vector<SymInt> sym;
  for (size_t d : dims)
    if (!x[d].is_concrete()) sym.push_back(x[d]);
  if (!sym.empty())
    sym_context()->specialize(sym, fmt::format("{} needs concrete sizes", def.name));
}

void sym_unfold(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta& m,
                SymDims& out) {
  const SymDims x = sym_dims(in[0]);
  concrete_dims(def, x, {2, 3});
  out = {x[0], x[1] * (a.ints[0] * a.ints[1]), m.shape[2]};
}

void sym_fold(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta& m, SymDims& out) {
  const SymDims x = sym_dims(in[0]);
  concrete_dims(def, x, {2});
  const int64_t kk = a.ints[0] * a.ints[1];
  require_eq(mod(x[1], kk), 0, def.name);
  out = {x[0], floordiv(x[1], kk), m.shape[2], m.shape[3]};
}

// Conv2d and its gradients (core/ops/image.cpp): N, C and O may be symbolic; the image's H and
// W and the kernel are attributes.
// (attrs.step: the groups, which divide the channels.)
void sym_conv2d(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta& m,
                SymDims& out) {
  const SymDims x = sym_dims(in[0]), w = sym_dims(in[1]);
  concrete_dims(def, x, {2, 3});
  require_eq(x[1], w[1] * SymInt(a.step), def.name);
  out = {x[0], w[0], m.shape[2], m.shape[3]};
}

void sym_conv2d_input_grad(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta& m,
                           SymDims& out) {
  const SymDims gy = sym_dims(in[0]), w = sym_dims(in[1]);
  concrete_dims(def, gy, {2, 3});
  require_eq(gy[1], w[0], def.name);
  out = {gy[0], w[1] * SymInt(a.step), m.shape[2], m.shape[3]};
}

void sym_conv2d_weight_grad(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta& m,
                            SymDims& out) {
  const SymDims x = sym_dims(in[0]), gy = sym_dims(in[1]);
  concrete_dims(def, x, {2, 3});
  require_eq(x[0], gy[0], def.name);
  out = {gy[1], floordiv(x[1], a.step), m.shape[2], m.shape[3]};
}

void sym_gather(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[1]);
}

void sym_first(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
}

}  // namespace

void register_symbolic_rules(OpDef* t) {
  for (int i = 0; i < kNumOps; ++i) {
    OpDef& d = t[i];
    if (d.cls == OpClass::Elementwise) d.sym_infer = sym_elementwise;
  }
  for (OpId op : {OpId::Sum, OpId::Max, OpId::Min}) t[int(op)].sym_infer = sym_reduce;
  t[int(OpId::Argmax)].sym_infer = sym_argmax;
  t[int(OpId::MatMul)].sym_infer = sym_matmul;
  t[int(OpId::Addmv)].sym_infer = sym_addmv;
  t[int(OpId::Addmm)].sym_infer = sym_addmm;
  t[int(OpId::Reshape)].sym_infer = sym_reshape;
  t[int(OpId::Permute)].sym_infer = sym_permute;
  t[int(OpId::Slice)].sym_infer = sym_slice;
  t[int(OpId::Select)].sym_infer = sym_select;
  t[int(OpId::SliceScatter)].sym_infer = sym_slice_scatter;
  t[int(OpId::Expand)].sym_infer = sym_expand;
  t[int(OpId::Full)].sym_infer = sym_source;
  t[int(OpId::Random)].sym_infer = sym_source;
  t[int(OpId::Arange)].sym_infer = sym_arange;
  t[int(OpId::Cat)].sym_infer = sym_cat;
  t[int(OpId::Gather)].sym_infer = sym_gather;
  t[int(OpId::ScatterAdd)].sym_infer = sym_first;
  t[int(OpId::Argsort)].sym_infer = sym_first;
  t[int(OpId::LogSoftmax)].sym_infer = sym_first;
  t[int(OpId::OptimizationBarrier)].sym_infer = sym_first;
  t[int(OpId::Unfold)].sym_infer = sym_unfold;
  t[int(OpId::Fold)].sym_infer = sym_fold;
  t[int(OpId::Conv2d)].sym_infer = sym_conv2d;
  t[int(OpId::Conv2dInputGrad)].sym_infer = sym_conv2d_input_grad;
  t[int(OpId::Conv2dWeightGrad)].sym_infer = sym_conv2d_weight_grad;
}

SymDims sym_broadcast(const SymDims& a, const SymDims& b, const char* op) {
  return broadcast(a, b, op);
}

}  // namespace detail
}  // namespace duet
