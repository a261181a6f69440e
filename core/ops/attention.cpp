// Attention: scaled_dot_product_attention as one primitive with fused kernels, and its gradient.
//
// Note [Attention]
// softmax(q k^T * scale + mask) v written as matmul, softmax and matmul holds the L x S scores
// and probabilities, and its gradient holds them again: at L = S = 4096 that is 64 MiB per head
// and matrix. The primitive computes the same thing one tile of keys at a time with an online
// softmax (FlashAttention's scheme), so that it holds O(L) memory:
//
//   Attention(q, k, v[, mask]) -> r (..., L, F + 1), in f32 (f64 for f64 inputs):
//     r[..., :F]  the attention output, accumulated in f32 whatever the inputs' dtype;
//     r[..., F]   each row's logsumexp of its masked, scaled scores (-inf for a row with none).
//   AttentionBackward(q, k, v, r, g[, mask]) -> (..., L*E + S*E + S*F), f32 (f64):
//     the gradients of q, k and v for the gradient g of r, row-major, one after another. g may
//     also be (..., L, F), the output columns' gradient alone, the logsumexp's then +0.0: the
//     gradient rule passes r's whole gradient, which the public function's slice makes by
//     writing the output's gradient into zeros, and a CPU plan's simplify pass takes those
//     zeros away (Note [Attention's gradient without its zeros] in trace/ir/passes.cpp).
//
// q (..., L, E), k (..., S, E) and v (..., S, F) have the same batch dims (the public function
// broadcasts them with expand, which copies nothing); the mask, b8 (true keeps a score) or of q's
// dtype (added to the scores), has q's rank and each of its dims is 1 or that dim of (..., L, S).
// attrs.keepdim: causal, keeping key j <= query i (top-left, as torch's tril); attrs.value: the
// scale, 0 for 1/sqrt(E) of the E the kernel sees (so a symbolic E needs nothing at trace time).
// A row with every score masked is NaN, as the composite's softmax is; S = 0 gives zeros.
//
// The backward recomputes each tile's probabilities from q, k and the saved logsumexp, and uses
// D = rowsum(dO * O) - g_lse: dS = P * (dO v^T - D), dq = scale dS k, dk = scale dS^T q,
// dv = P^T dO. The logsumexp column's gradient g_lse is part of r's gradient (nothing outside
// reads that column, so it is 0 in practice, but the rule is exact for any g).
//
// The result is f32 and the public function casts the output columns back to q's dtype (one
// elementwise op that fuses), so that f16 and bf16 accumulate in f32 end to end.
//
// Second derivatives: with create_graph the gradient rule writes the same gradient with the
// composite's ops, which the tape differentiates again (O(L*S) memory, as in PyTorch, whose
// fused attention backward is not differentiable either). AttentionBackward is therefore never
// recorded with grad mode on, and is not differentiable itself. A floating mask that requires
// grad, and head dims over kMaxHeadDim, go through the composite (detail::attention_composite).
#include <cmath>

#include "core/autocast.h"
#include "core/dispatch.h"
#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace attention_rules {  // named: unity builds join this file with others

constexpr const char* kSdpa = "scaled_dot_product_attention";

Shape batch_of(const Shape& s) { return Shape(s.data(), s.size() - 2); }

// The shape rule's checks of q, k, v and the mask, on the traced call's sizes.
void check_qkv(const char* op, TensorRefs in, int64_t n_in) {
  DUET_CHECK_VALUE(in.size() == n_in || in.size() == n_in + 1,
                   "[{}] takes {} tensors and an optional mask, got {}", op, n_in, in.size());
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  DUET_CHECK_DTYPE(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
                   "[{}] query, key and value must share a floating dtype, got {}, {} and {}", op,
                   q.dtype(), k.dtype(), v.dtype());
  const Shape &qs = q.sizes(), &ks = k.sizes(), &vs = v.sizes();
  DUET_CHECK_SHAPE(qs.size() >= 2 && ks.size() == qs.size() && vs.size() == qs.size() &&
                       batch_of(qs) == batch_of(ks) && batch_of(qs) == batch_of(vs) &&
                       qs[qs.size() - 1] == ks[ks.size() - 1] &&
                       ks[ks.size() - 2] == vs[vs.size() - 2],
                   "[{}] expects query (..., L, E), key (..., S, E) and value (..., S, F) with the "
                   "same batch dims, got {}, {} and {}",
                   op, qs, ks, vs);
  if (in.size() == n_in + 1) {
    const Tensor& m = in[n_in];
    DUET_CHECK_DTYPE(m.dtype() == DType::b8 || m.dtype() == q.dtype(),
                     "[{}] mask must be b8 or the query's dtype {}, got {} of shape {}", op,
                     q.dtype(), m.dtype(), m.sizes());
    Shape full = batch_of(qs);
    full.push_back(qs[qs.size() - 2]);
    full.push_back(ks[ks.size() - 2]);
    bool fits = m.dim() == q.dim();
    for (int64_t d = 0; fits && d < full.size(); ++d)
      fits = m.sizes()[d] == 1 || m.sizes()[d] == full[d];
    DUET_CHECK_SHAPE(fits, "[{}] mask {} must have {} dims, each 1 or that of {}", op, m.sizes(),
                     full.size(), full);
  }
}

DType accumulation_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

void infer_attention(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  check_qkv("attention", in, 3);
  out.shape = in[0].sizes();
  out.shape[out.shape.size() - 1] = in[2].sizes()[in[2].dim() - 1] + 1;
  out.dtype = accumulation_dtype(in[0].dtype());
  out.device = common_device(def, in);
}

void sym_attention(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  out = sym_dims(in[0]);
  out.back() = sym_dims(in[2]).back() + SymInt(1);
}

void infer_attention_backward(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  DUET_CHECK_VALUE(in.size() == 5 || in.size() == 6,
                   "[attention_backward] takes q, k, v, attention's result, its gradient and an "
                   "optional mask, got {} tensors",
                   in.size());
  const Tensor* qkvm[] = {&in[0], &in[1], &in[2], in.size() == 6 ? &in[5] : nullptr};
  check_qkv("attention_backward", TensorRefs(qkvm, in.size() == 6 ? 4 : 3), 3);
  const Shape& qs = in[0].sizes();
  Shape r = qs;
  r[r.size() - 1] = in[2].sizes()[in[2].dim() - 1] + 1;
  const DType acc = accumulation_dtype(in[0].dtype());
  Shape output_only = r;  // the gradient may leave out the logsumexp's column (Note [Attention])
  output_only[output_only.size() - 1] -= 1;
  for (int i : {3, 4})
    DUET_CHECK_SHAPE(
        (in[i].sizes() == r || (i == 4 && in[i].sizes() == output_only)) && in[i].dtype() == acc,
        "[attention_backward] input {} must be attention's result {} {}{}, got {} {}", i, r, acc,
        i == 4 ? " (or its output columns)" : "", in[i].sizes(), in[i].dtype());
  const int64_t l = qs[qs.size() - 2], e = qs[qs.size() - 1], s = in[1].sizes()[qs.size() - 2],
                f = in[2].sizes()[qs.size() - 1];
  out.shape = batch_of(qs);
  out.shape.push_back(l * e + s * e + s * f);
  out.dtype = acc;
  out.device = common_device(def, in);
}

void sym_attention_backward(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&,
                            SymDims& out) {
  const SymDims q = sym_dims(in[0]), k = sym_dims(in[1]), v = sym_dims(in[2]);
  const SymInt &l = q[q.size() - 2], &e = q.back(), &s = k[k.size() - 2], &f = v.back();
  out.assign(q.begin(), q.end() - 2);
  out.push_back(l * e + s * e + s * f);
}

// x * the call's scale (attrs.value; 0: 1/sqrt(E), a tensor of the size when E is symbolic).
Tensor scaled(Tensor x, const Attrs& a, const SymInt& e, DType dtype, Device device) {
  const double sc = a.value.to<double>();
  if (sc > 0) return std::move(x) * sc;
  if (e.is_concrete()) return std::move(x) * (1 / std::sqrt(static_cast<double>(e.concrete())));
  return std::move(x) * rsqrt(size_scalar(e, dtype, device));
}

// x[..., start:end] for bounds that may be symbolic.
Tensor slice_last(const Tensor& x, const SymInt& start, const SymInt& end) {
  Attrs a;
  a.dim = x.dim() - 1;
  a.start = sym_hint(start);
  a.end = sym_hint(end);
  if (!start.is_concrete() || !end.is_concrete()) {
    auto sym = std::make_shared<SymAttrs>();
    sym->start = start;
    sym->end = end;
    a.sym = std::move(sym);
  }
  return slice_with(x, a);
}

// The gradient in the composite's ops (create_graph: differentiable again). g is r's gradient.
void composite_grads(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const bool has_mask = c.inputs.size() == 4;
  const Tensor mask = has_mask ? c.inputs[3] : Tensor();
  const SymInt f = sym_dims(v).back(), e = sym_dims(q).back();
  const Tensor p =
      attention_weights(kSdpa, q, k, mask, c.attrs.keepdim, c.attrs.value.to<double>());
  const Tensor go = slice_last(g, 0, f).to(q.dtype());
  const Tensor glse = slice_last(g, f, f + SymInt(1)).to(q.dtype());
  if (c.needs_grad(2)) gi[2] = matmul(transpose(p, -1, -2), go);
  if (!c.needs_grad(0) && !c.needs_grad(1) && !(has_mask && c.needs_grad(3))) return;
  const Tensor d = sum(go * matmul(p, v), {-1}, /*keepdim=*/true) - glse;
  const Tensor ds = p * (matmul(go, transpose(v, -1, -2)) - d);
  if (has_mask && c.needs_grad(3)) gi[3] = ds;
  const Tensor dss = scaled(ds, c.attrs, e, q.dtype(), q.device());
  if (c.needs_grad(0)) gi[0] = matmul(dss, k);
  if (c.needs_grad(1)) gi[1] = matmul(transpose(dss, -1, -2), q);
}

void grad_attention(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const bool has_mask = c.inputs.size() == 4;
  if (grad_mode() || (has_mask && c.needs_grad(3))) return composite_grads(c, g, gi);
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const Tensor* in[] = {&q, &k, &v, &c.output, &g, has_mask ? &c.inputs[3] : nullptr};
  const Tensor flat = call(OpId::AttentionBackward, TensorRefs(in, has_mask ? 6 : 5), c.attrs);
  const SymDims qd = sym_dims(q), kd = sym_dims(k), vd = sym_dims(v);
  const SymInt &l = qd[qd.size() - 2], &e = qd.back(), &s = kd[kd.size() - 2], &f = vd.back();
  const SymInt ends[] = {l * e, l * e + s * e, l * e + s * e + s * f};
  const SymDims* dims[] = {&qd, &kd, &vd};
  for (int i = 0; i < 3; ++i)
    if (c.needs_grad(i))
      gi[i] = reshape_dims(slice_last(flat, i ? ends[i - 1] : SymInt(0), ends[i]), *dims[i]);
}

}  // namespace attention_rules

using namespace attention_rules;

void register_attention_rules(OpDef* t) {
  t[int(OpId::Attention)].infer = infer_attention;
  t[int(OpId::Attention)].sym_infer = sym_attention;
  set_grad(t, OpId::Attention, grad_attention,
           kSaveIn0 | kSaveIn1 | kSaveIn2 | kSaveIn3 | kSaveOut);
  t[int(OpId::Attention)].autocast = AutocastClass::Lower;  // a product (Note [Autocast])
  t[int(OpId::AttentionBackward)].infer = infer_attention_backward;
  t[int(OpId::AttentionBackward)].sym_infer = sym_attention_backward;
  set_not_differentiable(t, OpId::AttentionBackward);  // Note [Attention]: never with grad mode
}

Tensor attention_composite(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& attn_mask, bool is_causal, double scale) {
  return matmul(attention_weights(op, q, k, attn_mask, is_causal, scale), v);
}

namespace attention_rules {

// Whether the fused primitive takes this call (Note [Attention]).
bool fused_takes(const Tensor& q, const Tensor& v, const Tensor& mask) {
  const auto e = sym_dims(q).back().maybe_concrete(), f = sym_dims(v).back().maybe_concrete();
  if (!f || *f > kMaxHeadDim || (e && *e > kMaxHeadDim)) return false;
  return !(mask.defined() && mask.dtype() != DType::b8 && mask.requires_grad());
}

SymDims with_last2(SymDims d, const SymInt& a, const SymInt& b) {
  d.push_back(a);
  d.push_back(b);
  return d;
}

// The primitive on q, k, v (and the mask) broadcast to common batch dims; its output columns in
// q's dtype.
Tensor attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                       bool is_causal, double scale) {
  const SymDims qd = sym_dims(q), kd = sym_dims(k), vd = sym_dims(v);
  const auto batch_dims = [](const SymDims& d) { return SymDims(d.begin(), d.end() - 2); };
  SymDims batch =
      sym_broadcast(sym_broadcast(batch_dims(qd), batch_dims(kd), kSdpa), batch_dims(vd), kSdpa);
  Tensor mask = attn_mask;
  if (mask.defined()) {
    SymDims md = sym_dims(mask);
    if (md.size() > 2) batch = sym_broadcast(batch, batch_dims(md), kSdpa);
    SymDims full(batch.size() + 2 - std::min(md.size(), batch.size() + 2), SymInt(1));
    full.insert(full.end(), md.begin(), md.end());
    mask = reshape_dims(mask, full);
  }
  const SymInt &l = qd[qd.size() - 2], &s = kd[kd.size() - 2], &e = qd.back(), &f = vd.back();
  const Tensor qe = expand_dims(q, with_last2(batch, l, e));
  const Tensor ke = expand_dims(k, with_last2(batch, s, e));
  const Tensor ve = expand_dims(v, with_last2(batch, s, f));
  Attrs a;
  a.keepdim = is_causal;
  a.value = scale;
  const Tensor* in[] = {&qe, &ke, &ve, &mask};
  const Tensor r = call(OpId::Attention, TensorRefs(in, mask.defined() ? 4 : 3), a);
  const Tensor out = slice_last(r, 0, f);
  return out.dtype() == q.dtype() ? out : out.to(q.dtype());
}

}  // namespace attention_rules
}  // namespace detail

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const Tensor& attn_mask, bool is_causal, double scale,
                                    std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op(detail::attention_rules::kSdpa, [&]() -> Tensor {
    Tensor held_q;
    const Tensor& q = detail::autocast_lower(q_in, held_q);
    Tensor held_k;
    const Tensor& k = detail::autocast_lower(k_in, held_k);
    Tensor held_v;
    const Tensor& v = detail::autocast_lower(v_in, held_v);
    const char* op = detail::attention_rules::kSdpa;
    DUET_CHECK_DTYPE(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
                     "[{}] query, key and value must share a floating dtype, got {}, {} and {}", op,
                     q.dtype(), k.dtype(), v.dtype());
    DUET_CHECK_SHAPE(
        q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2,
        "[{}] query, key and value need at least 2 dims (..., L, E), got {}, {} and {}", op,
        q.sizes(), k.sizes(), v.sizes());
    const SymDims qd = detail::sym_dims(q), kd = detail::sym_dims(k);
    DUET_CHECK_SHAPE(detail::size_is(k, k.dim() - 1, qd.back(), op) &&
                         detail::size_is(v, v.dim() - 2, kd[kd.size() - 2], op),
                     "[{}] query {} (..., L, E), key {} (..., S, E) and value {} (..., S, Ev) do "
                     "not fit",
                     op, q.sizes(), k.sizes(), v.sizes());
    if (!detail::attention_rules::fused_takes(q, v, attn_mask))
      return detail::attention_composite(op, q, k, v, attn_mask, is_causal, scale);
    // The composite's checks of the scale and the mask (attention_weights), then the primitive.
    detail::check_attention_options(op, q, attn_mask, is_causal, scale);
    return detail::attention_rules::attention_fused(q, k, v, attn_mask, is_causal, scale);
  });
}

}  // namespace duet
