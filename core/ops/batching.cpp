// duet: batching rules, one per op row (OpDef::batch), for func::vmap.
//
// Note [Batching rules]
// A batching rule runs an op on every sample of a batch as one call on the batched tensors, as
// JAX's batching rules and torch.func's do. An operand is a tensor and the dim that holds its
// batch (BatchedArg), or no dim when the operand is the same for every sample (a parameter, a
// constant); at least one operand is batched. Rules follow from the op's family:
//  - elementwise ops (and where, cast, copy): the batched operands get their batch dim first and
//    1s after it up to the largest per-sample rank, so that broadcasting lines the per-sample
//    dims up from the right as it did for one sample, with the batch in front;
//  - reductions (sum, max, min, argmax): the reduced dims move up by one, and "all dims" becomes
//    every per-sample dim;
//  - views: reshape and expand get the batch size in front of their shape, permute keeps the
//    batch dim first, slice moves its dim up by one;
//  - matmul: a batched matrix times a shared one is one product over all the batch's rows;
//    otherwise the batch dim is one more leading (broadcast) dim of the product;
//  - ops along one dim (gather, scatter_add, slice_scatter, cat, argsort): every operand gets
//    the batch in front (an unbatched one is expanded, a view) and the dim moves up by one;
//  - attention and its gradient: the batch is one more leading dim of every operand;
//  - ops on a batch of images with shared filters (conv2d, its input gradient, unfold, fold):
//    the samples' images are one batch of B * N images; conv2d's weight gradient per sample is
//    one unfold of the B * N images and one batched product; per-sample filters (conv2d and its
//    input gradient) make one convolution in B times the groups;
// The result of every rule holds the batch at dim 0 (a view's at its input's). An op without a
// rule, or operands its rule does not take,
// runs once per sample and the results are stacked
// (batch_loop), with a warning naming the op the first time. Rules call ops through the
// dispatcher, so an enclosing trace records the batched calls and autograd differentiates
// them.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet::detail {

namespace {

Tensor call_on(OpId op, const std::vector<Tensor>& ts, const Attrs& a) {
  std::vector<const Tensor*> p;
  for (const Tensor& t : ts) p.push_back(&t);
  return call(op, TensorRefs(p.data(), static_cast<int64_t>(p.size())), a);
}

int64_t sample_rank(const BatchedArg& x) { return x.value.dim() - (x.bdim >= 0 ? 1 : 0); }

// The operand with its batch dim first (a view), or as it is when unbatched.
Tensor batch_first(const BatchedArg& x) {
  if (x.bdim <= 0) return x.value;
  Dims order{x.bdim};
  for (int64_t d = 0; d < x.value.dim(); ++d)
    if (d != x.bdim) order.push_back(d);
  return permute(x.value, order);
}

// x (batch first) with 1s after the batch dim, up to per-sample rank r.
Tensor pad_rank(const Tensor& x, int64_t r) {
  const int64_t have = x.dim() - 1;
  if (have >= r) return x;
  Shape s{x.sizes()[0]};
  for (int64_t i = 0; i < r - have; ++i) s.push_back(1);
  for (int64_t d = 1; d < x.dim(); ++d) s.push_back(x.sizes()[d]);
  return reshape(x, s);
}

// A symbolic attribute (a trace with symbolic sizes) is not shifted: such calls loop.
bool symbolic(const Attrs& a) { return a.sym != nullptr; }

// A batched operand whose samples have no dims gets one (the batch), which moves it up a tier
// of PyTorch's promotion (result_type: dimensioned tensors, then 0-d ones, then numbers): f32
// samples times an f64 0-d sample are f32, but an f32 batch times an f64 batch is f64. Such an
// operand is cast first to what each sample promotes to, as the sample's kernel would convert
// it; the others keep their tiers. Where's condition does not promote.
std::vector<Tensor> keep_promotion(const OpDef& def, const std::vector<BatchedArg>& in,
                                   std::vector<Tensor> ts) {
  auto moves = [](const BatchedArg& x) { return x.bdim >= 0 && sample_rank(x) == 0; };
  if (in.size() < 2 || std::none_of(in.begin(), in.end(), moves)) return ts;
  const size_t first = def.id == OpId::Where ? 1 : 0;
  std::vector<PromotionArg> args;
  for (size_t i = first; i < in.size(); ++i) {
    const TensorImpl* t = in[i].value.unsafe_impl();
    args.push_back({t->dtype, sample_rank(in[i]) == 0, t->wrapped_number});
  }
  const DType r = result_type(args.data(), static_cast<int64_t>(args.size()));
  for (size_t i = first; i < in.size(); ++i)
    if (moves(in[i]) && ts[i].dtype() != r) ts[i] = ts[i].to(r);
  return ts;
}

// Operands that broadcast against each other: elementwise ops, and matmul, whose batch dims
// broadcast as elementwise operands do (its batch is one more leading dim of the product).
BatchedArg broadcast_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                          int64_t) {
  int64_t r = 0;
  for (const BatchedArg& x : in) r = std::max(r, sample_rank(x));
  std::vector<Tensor> ts;
  for (const BatchedArg& x : in) ts.push_back(x.bdim < 0 ? x.value : pad_rank(batch_first(x), r));
  return {call_on(def.id, keep_promotion(def, in, std::move(ts)), a), 0};
}

BatchedArg reduce_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                       int64_t batch) {
  if (symbolic(a)) return batch_loop(def, in, a, batch);
  const Tensor x = batch_first(in[0]);
  const int64_t n = x.dim() - 1;
  if (n == 0) {  // a reduction of one number over no dims is the number, in the op's dtype
    const Tensor* xs[] = {&x};
    TensorMeta m;
    def.infer(def, TensorRefs(xs, 1), a, m);  // (a sum of bools or integers is i64)
    return {m.dtype == x.dtype() ? x : x.to(m.dtype), 0};
  }
  Attrs b = a;
  b.ints.clear();
  if (a.ints.empty())
    for (int64_t d = 1; d <= n; ++d) b.ints.push_back(d);
  else
    for (int64_t d : a.ints) b.ints.push_back(wrap_dim(def.name, d, n) + 1);
  return {call_on(def.id, {x}, b), 0};
}

// Ops along attrs.dim over operands of one rank: every operand batched first, the dim up by one.
BatchedArg dim_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                    int64_t batch) {
  if (symbolic(a)) return batch_loop(def, in, a, batch);
  if (sample_rank(in[0]) == 0) return batch_loop(def, in, a, batch);
  std::vector<Tensor> ts;
  for (const BatchedArg& x : in) ts.push_back(batched_first(x, batch));
  Attrs b = a;
  b.dim = wrap_dim(def.name, a.dim, ts[0].dim() - 1) + 1;
  return {call_on(def.id, ts, b), 0};
}

BatchedArg view_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                     int64_t batch) {
  if (symbolic(a)) return batch_loop(def, in, a, batch);
  Attrs b = a;
  Tensor x = batch_first(in[0]);
  switch (def.id) {
    case OpId::Reshape:
    case OpId::Expand: {
      b.ints.clear();
      b.ints.push_back(batch);
      for (int64_t s : a.ints) b.ints.push_back(s);
      if (def.id == OpId::Expand) x = pad_rank(x, static_cast<int64_t>(a.ints.size()));
      break;
    }
    case OpId::Permute: {
      b.ints.clear();
      b.ints.push_back(0);
      for (int64_t d : a.ints) b.ints.push_back(wrap_dim(def.name, d, x.dim() - 1) + 1);
      break;
    }
    case OpId::Slice:
    case OpId::Select:
      b.dim = wrap_dim(def.name, a.dim, x.dim() - 1) + 1;
      break;
    default:
      return batch_loop(def, in, a, batch);
  }
  return {call_on(def.id, {x}, b), 0};
}

// matmul: a batched left operand times a shared matrix is one product of all the batch's rows
// (B x ... x n, k) @ (k, m), as PyTorch folds it; a shared matrix times a batched column (a
// matrix times a vector, per sample: (n, k) @ (k, 1)) is one product of the columns as rows and
// the matrix transposed, (B, k) @ (k, n), each sample's result a row; otherwise the batch is
// one more leading (broadcast) dim of the product, as for elementwise operands.
// A vector operand (Note [Vector operands] in core/ops/linalg.cpp) is a row or a column again
// for those rules, and the result loses its dim after; a shared matrix times batched vectors is
// the vectors as rows times the matrix transposed at once.
BatchedArg matmul_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                       int64_t batch) {
  const bool av = sample_rank(in[0]) == 1, bv = sample_rank(in[1]) == 1;
  if (av || bv) {
    if (!av && in[0].bdim < 0 && in[0].value.dim() == 2 && in[1].bdim >= 0 && !symbolic(a))
      return {call_on(def.id, {batch_first(in[1]), transpose(in[0].value, 0, 1)}, a), 0};
    std::vector<BatchedArg> m = in;
    if (av)
      m[0] = in[0].bdim < 0 ? BatchedArg{unsqueeze(in[0].value, 0), -1}
                            : BatchedArg{unsqueeze(batch_first(in[0]), 1), 0};
    if (bv)
      m[1] = in[1].bdim < 0 ? BatchedArg{unsqueeze(in[1].value, 1), -1}
                            : BatchedArg{unsqueeze(batch_first(in[1]), 2), 0};
    const BatchedArg r = matmul_rule(def, m, a, batch);
    Tensor y = batch_first(r);
    if (bv) y = squeeze(y, -1);
    if (av) y = squeeze(y, bv ? -1 : -2);
    return {y, r.bdim < 0 ? -1 : 0};
  }
  if (in[0].bdim < 0 && in[0].value.dim() == 2 && in[1].bdim >= 0 && in[1].value.dim() == 3 &&
      !symbolic(a)) {
    const Tensor x = batch_first(in[1]);  // (B, k, 1)
    if (x.sizes()[2] == 1) {              // (the transpose is a view: the GEMM reads it transposed)
      const Tensor y = call_on(def.id, {squeeze(x, 2), transpose(in[0].value, 0, 1)}, a);
      return {unsqueeze(y, 2), 0};  // (B, n, 1)
    }
  }
  if (in[0].bdim < 0 || in[1].bdim >= 0 || in[1].value.dim() != 2 || symbolic(a))
    return broadcast_rule(def, in, a, batch);
  const Tensor x = batch_first(in[0]);
  const int64_t k = x.sizes()[x.dim() - 1];
  int64_t rows = 1;  // (the leading dims' product: with k = 0, numel / k says nothing)
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.sizes()[d];
  const Tensor y = call_on(def.id, {reshape(x, Shape{rows, k}), in[1].value}, a);
  Shape out = x.sizes();
  out[out.size() - 1] = in[1].value.sizes()[1];
  return {reshape(y, out), 0};
}

// addmv and addmm (Notes [addmv] and [addmm] in core/ops/linalg.cpp): matmul's rule, then the
// add's. A linear layer of a batch of samples is one addmm of all their rows, its bias added
// inside the product: an addmv of batched vectors by a shared matrix and bias (per-sample
// code: each sample's vector, as B1's cells step), and an addmm of batched rows by them (a
// vmapped layer).
BatchedArg input_plus_product_rule(const OpDef& def, const std::vector<BatchedArg>& in,
                                   const Attrs& a, int64_t batch) {
  if (def.id == OpId::Addmv && in[0].bdim < 0 && in[1].bdim < 0 && in[2].bdim >= 0 &&
      !symbolic(a))  // (B, k) @ mat^T + input: (B, n)
    return {
        call_on(OpId::Addmm, {in[0].value, batch_first(in[2]), transpose(in[1].value, 0, 1)}, a),
        0};
  if (def.id == OpId::Addmm && in[0].bdim < 0 && in[1].bdim >= 0 && in[2].bdim < 0 &&
      !symbolic(a)) {
    const Tensor x = batch_first(in[1]);  // (B, m, k)
    const Tensor y = call_on(
        def.id,
        {in[0].value, reshape(x, Shape{x.sizes()[0] * x.sizes()[1], x.sizes()[2]}), in[2].value},
        a);
    return {reshape(y, Shape{x.sizes()[0], x.sizes()[1], in[2].value.sizes()[1]}), 0};
  }
  const BatchedArg p = in[1].bdim < 0 && in[2].bdim < 0  // (only the input batched)
                           ? BatchedArg{call_on(OpId::MatMul, {in[1].value, in[2].value}, a), -1}
                           : matmul_rule(op_def(OpId::MatMul), {in[1], in[2]}, a, batch);
  return broadcast_rule(op_def(OpId::Add), {in[0], p}, Attrs{}, batch);
}

// log_softmax along attrs.dim, one up for the batch; a 0-d sample is a row of one.
BatchedArg log_softmax_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                            int64_t) {
  const Tensor x = batch_first(in[0]);
  Attrs b = a;
  b.dim = a.dim + 1;
  if (x.dim() == 1) return {squeeze(call_on(def.id, {unsqueeze(x, 1)}, b), 1), 0};
  return {call_on(def.id, {x}, b), 0};
}

// Ops whose operands share their leading dims (attention, the LSTM and GRU cells, and their
// gradients): every operand gets the batch in front, one more leading dim.
BatchedArg leading_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                        int64_t batch) {
  std::vector<Tensor> ts;
  for (const BatchedArg& x : in) ts.push_back(batched_first(x, batch));
  return {call_on(def.id, ts, a), 0};
}

// lstm_step: x, h and c batch at their leading dims under shared weights. Per-sample weights (an
// ensemble, or an Autobatch group too small to split by weight) make batched products, the cell
// on their sum, and the result's three parts joined (Note [LSTM step] in core/ops/rnn.cpp).
BatchedArg lstm_step_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                          int64_t batch) {
  bool shared = true;
  for (size_t i = 3; i < in.size(); ++i) shared = shared && in[i].bdim < 0;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < in.size(); ++i)
    ts.push_back(i < 3 || !shared ? batched_first(in[i], batch) : in[i].value);
  if (shared || symbolic(a)) return {call_on(def.id, ts, a), 0};
  const Tensor& c = ts[2];
  const int64_t h = c.size(-1);
  SymDims lead = sym_dims(c);  // each sample's rows, symbolic where traced so
  lead.pop_back();
  lead.erase(lead.begin());
  const SymInt n = sym_numel(lead);
  auto product = [&](int x, int w, int b) {  // (B, rows, 4H)
    const Tensor rows =
        reshape_dims(ts[static_cast<size_t>(x)], SymDims{SymInt(batch), n, SymInt(ts[x].size(-1))});
    return call_on(OpId::Add,
                   {call_on(OpId::MatMul, {rows, transpose(ts[w], 1, 2)}, Attrs{}),
                    unsqueeze(ts[static_cast<size_t>(b)], 1)},
                   Attrs{});
  };
  const Tensor gx = product(0, 3, 5), gh = product(1, 4, 6);
  const Tensor cell = call_on(
      OpId::LstmCell, {gx, gh, reshape_dims(c, SymDims{SymInt(batch), n, SymInt(h)})}, Attrs{});
  SymDims out = sym_dims(c);
  out.back() = SymInt(6 * h);
  return {reshape_dims(cat({cell, call_on(OpId::Add, {gx, gh}, Attrs{})}, -1), out), 0};
}

// Ops over a batch of images (N, ...) with shared filters (conv2d and its input gradient,
// unfold, fold): the samples' images become one batch of B * N.
BatchedArg images_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                       int64_t batch) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].bdim >= 0) return batch_loop(def, in, a, batch);
  if (in[0].bdim < 0 || symbolic(a)) return batch_loop(def, in, a, batch);
  const Tensor x = batch_first(in[0]);
  Shape flat{batch * x.sizes()[1]};
  for (int64_t d = 2; d < x.dim(); ++d) flat.push_back(x.sizes()[d]);
  std::vector<Tensor> ts{reshape(x, flat)};
  for (size_t i = 1; i < in.size(); ++i) ts.push_back(in[i].value);
  const Tensor y = call_on(def.id, ts, a);
  Shape out{batch, x.sizes()[1]};
  for (int64_t d = 1; d < y.dim(); ++d) out.push_back(y.sizes()[d]);
  return {reshape(y, out), 0};
}

// Per-sample filters (an ensemble of models, torch.func's way): conv2d, or its input gradient,
// of B samples each with its own filters (O, C/G, kh, kw) in G groups is one convolution in
// B * G groups, over the images with the samples' channels side by side (N, B * C, H, W) and
// the filters stacked (B * O, C/G, kh, kw); its result (N, B * O, ...), seen as (B, N, O, ...).
// Unbatched images are read by every sample: without groups, they are the product's own input
// (the filters stacked along O alone, no copy of the images).
BatchedArg grouped_images(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                          int64_t batch) {
  const Tensor w = batch_first(in[1]);  // (B, O, C/G, kh, kw)
  const Shape& ws = w.sizes();
  if (batch == 0) {  // no sample: the images through zero filters, shaped as one sample's
    const Tensor xb = batched_first(in[0], 0);
    const Shape& xs = xb.sizes();
    const Tensor f =
        zeros({ws[1], ws[2], ws[3], ws[4]}, Options().dtype(w.dtype()).device(w.device()));
    const Tensor y = call_on(def.id, {reshape(xb, {0, xs[2], xs[3], xs[4]}), f}, a);
    const Shape& ys = y.sizes();
    return {reshape(y, {0, xs[1], ys[1], ys[2], ys[3]}) + sum(w) * 0.0, 0};  // (w's history)
  }
  const Tensor w2 = reshape(w, {batch * ws[1], ws[2], ws[3], ws[4]});
  Attrs b = a;
  Tensor x;
  if (in[0].bdim < 0 && a.step == 1 && def.id == OpId::Conv2d) {
    x = in[0].value;  // (N, C, H, W), each output block of O reading all of it
  } else {
    const Tensor xb = batched_first(in[0], batch);  // (B, N, C, H, W)
    const Shape& xs = xb.sizes();
    x = reshape(permute(xb, {1, 0, 2, 3, 4}), {xs[1], batch * xs[2], xs[3], xs[4]});
    b.step = a.step * batch;
  }
  const Tensor y = call_on(def.id, {x, w2}, b);  // (N, B * O or B * C, ...)
  const Shape& ys = y.sizes();
  return {permute(reshape(y, {ys[0], batch, ys[1] / batch, ys[2], ys[3]}), {1, 0, 2, 3, 4}), 0};
}

// conv2d and its input gradient: the images rule with shared filters, the groups above with
// per-sample ones.
BatchedArg conv_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                     int64_t batch) {
  if (in[1].bdim < 0) return images_rule(def, in, a, batch);
  if (symbolic(a)) return batch_loop(def, in, a, batch);
  return grouped_images(def, in, a, batch);
}

// conv2d's weight gradient per sample, dw_b = sum over n of gy_b,n (O, L) cols_b,n^T (L, C*kk),
// with cols the unfolded images: one unfold of all B * N images and one batched product, per
// group of channels (G groups: output block g reads the rows of input block g).
BatchedArg weight_grad_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                            int64_t batch) {
  if (symbolic(a)) return batch_loop(def, in, a, batch);
  const Tensor x = batched_first(in[0], batch), gy = batched_first(in[1], batch);  // (B, N, ...)
  const Shape &xs = x.sizes(), &gs = gy.sizes();
  const int64_t n = xs[1], c = xs[2], o = gs[2], l = gs[3] * gs[4], kk = a.ints[0] * a.ints[1];
  const int64_t g = a.step, cg = c / g, og = o / g;
  Attrs windows = a;
  windows.step = 1;  // (unfold's attributes: the window alone)
  const Tensor cols = call_on(OpId::Unfold, {reshape(x, {batch * n, c, xs[3], xs[4]})}, windows);
  // (B, G, O/G, N * L) times (B, G, N * L, C/G * kk)
  const Tensor lhs =
      reshape(permute(reshape(gy, {batch, n, g, og, l}), {0, 2, 3, 1, 4}), {batch, g, og, n * l});
  const Tensor rhs = reshape(permute(reshape(cols, {batch, n, g, cg * kk, l}), {0, 2, 1, 4, 3}),
                             {batch, g, n * l, cg * kk});
  return {reshape(matmul(lhs, rhs), {batch, o, cg, a.ints[0], a.ints[1]}), 0};
}

// in[0] itself, once in[1] is ready: the result is batched as in[0] is.
BatchedArg barrier_rule(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                        int64_t) {
  return {call_on(def.id, {in[0].value, in[1].value}, a), in[0].bdim};
}

}  // namespace

// Every operand batched, batch first: an unbatched one expanded (a view).
Tensor batched_first(const BatchedArg& x, int64_t batch) {
  if (x.bdim >= 0) return batch_first(x);
  Shape s{batch};
  for (int64_t d = 0; d < x.value.dim(); ++d) s.push_back(x.value.sizes()[d]);
  return expand(unsqueeze(x.value, 0), s);
}

namespace {
std::atomic<int64_t> g_batch_loops{0};
}  // namespace

int64_t batch_loop_calls() { return g_batch_loops.load(); }

BatchedArg batch_loop(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& a,
                      int64_t batch) {
  g_batch_loops.fetch_add(1);
  {
    static std::mutex mu;
    static std::set<OpId> warned;
    std::lock_guard<std::mutex> l(mu);
    if (warned.insert(def.id).second)
      fmt::print(stderr,
                 "duet: warning: [vmap] {} has no batching rule for these operands: it runs once "
                 "per sample\n",
                 def.name);
  }
  std::vector<Tensor> outs;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> ts;
    for (const BatchedArg& x : in) ts.push_back(x.bdim < 0 ? x.value : select(x.value, x.bdim, b));
    outs.push_back(call_on(def.id, ts, a));
  }
  return {stack(outs, 0), 0};
}

void register_batching_rules(OpDef* t) {
  for (int i = 0; i < kNumOps; ++i)
    if (t[i].cls == OpClass::Elementwise) t[i].batch = broadcast_rule;
  for (OpId op : {OpId::Sum, OpId::Max, OpId::Min}) t[int(op)].batch = reduce_rule;
  for (OpId op :
       {OpId::Argmax, OpId::Gather, OpId::ScatterAdd, OpId::SliceScatter, OpId::Cat, OpId::Argsort})
    t[int(op)].batch = dim_rule;
  t[int(OpId::MatMul)].batch = matmul_rule;
  for (OpId op : {OpId::Addmv, OpId::Addmm}) t[int(op)].batch = input_plus_product_rule;
  t[int(OpId::LogSoftmax)].batch = log_softmax_rule;
  for (OpId op : {OpId::Reshape, OpId::Permute, OpId::Slice, OpId::Select, OpId::Expand})
    t[int(op)].batch = view_rule;
  t[int(OpId::OptimizationBarrier)].batch = barrier_rule;
  for (OpId op : {OpId::Attention, OpId::AttentionBackward, OpId::LstmCell, OpId::LstmCellBackward,
                  OpId::LstmStepBackward, OpId::GruCell, OpId::GruCellBackward})
    t[int(op)].batch = leading_rule;
  t[int(OpId::LstmStep)].batch = lstm_step_rule;
  for (OpId op : {OpId::Conv2d, OpId::Conv2dInputGrad}) t[int(op)].batch = conv_rule;
  for (OpId op : {OpId::Unfold, OpId::Fold}) t[int(op)].batch = images_rule;
  t[int(OpId::Conv2dWeightGrad)].batch = weight_grad_rule;
}

}  // namespace duet::detail
