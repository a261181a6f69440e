// Recurrent cells: the LSTM and GRU cells as one primitive each, and their gradients.
//
// Note [LSTM cell]
// PyTorch's LSTM cell, after its two products: with a = gates_x + gates_h, cut into the gates
// i, f, g, o (H each, in that order),
//     c' = sigmoid(a_f) * c + sigmoid(a_i) * tanh(a_g),    h' = sigmoid(a_o) * tanh(c').
// Written with duet's elementwise ops that is one add, four slices and nine elementwise ops,
// each a dispatch and a tape node eagerly, a pending op under Autobatch, and about twice as
// many in the backward. A cell stepped one token at a time (per-sample code, a decoder) pays
// that per step, so the cell is one op here, as in PyTorch (its fused LSTM cell kernels) and
// cuDNN:
//     LstmCell(gates_x (..., 4H), gates_h (..., 4H), c (..., H)) -> (..., 2H): h', then c';
//     LstmCellBackward(gates_x, gates_h, c, g) -> (..., 5H): the gradient of a (that of gates_x
//     and of gates_h alike), then that of c.
// g is the gradient of the packed result: dh' then dc'. The backward recomputes the gates from
// the inputs (four elementwise functions per element) instead of saving them.
//
// Both take operands of one floating dtype with the same leading dims. The kernels compute f16
// and bf16 in f32 and round the result once, where the composite rounds after every op, so the
// low-precision values are closer to the exact ones than the composite's.
//
// Second derivatives: with create_graph the gradient rule writes the same gradient with
// elementwise ops, which the tape differentiates again; LstmCellBackward is never recorded with
// grad mode on, and is not differentiable itself (as AttentionBackward, Note [Attention]).
//
// The GRU cell is the same kind of op, where PyTorch's fused GRU cell kernels are: with gates
// r, z, n of gates_x (x_r, x_z, x_n) and gates_h (h_r, h_z, h_n), r and z the sigmoids of the
// sums, n = tanh(x_n + r * h_n) and h' = (1 - z) * n + z * h;
//     GruCell(gates_x (..., 3H), gates_h (..., 3H), h (..., H)) -> h' (..., H);
//     GruCellBackward(gates_x, gates_h, h, g) -> (..., 7H): the gradients of gates_x, gates_h
//     (whose n block is r times that of gates_x) and h.
// Its composite is seven elementwise ops and six slices, and the products stay whole: only the
// hidden one of n is scaled by r, inside the op.
#include "core/dispatch.h"
#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace rnn_rules {  // named: unity builds join this file with others

// Checks the operands of a cell op: input i ends in widths[i] * H, H the state's (input 2)
// last dim; one floating dtype, and the same leading dims. Returns H.
int64_t check_cell(const char* op, TensorRefs in, const int64_t* widths) {
  const Tensor& c = in[2];
  DUET_CHECK_SHAPE(c.dim() >= 1, "[{}] c must have a last dim of the hidden size, got {}", op,
                   c.sizes());
  const int64_t h = c.size(-1);
  const Shape lead(c.sizes().data(), c.dim() - 1);
  for (int64_t i = 0; i < in.size(); ++i) {
    const Tensor& x = in[i];
    DUET_CHECK_DTYPE(is_floating(x.dtype()) && x.dtype() == c.dtype(),
                     "[{}] operands must share a floating dtype, got {} (input {}) and {} (c)", op,
                     x.dtype(), i, c.dtype());
    Shape want = lead;
    want.push_back(widths[i] * h);
    DUET_CHECK_SHAPE(x.sizes() == want,
                     "[{}] input {} must be {} (c is {}: {} times the hidden size {}), got {}", op,
                     i, want, c.sizes(), widths[i], h, x.sizes());
  }
  return h;
}

// A cell op's result: the state's leading dims, then `width` times H, in the state's dtype.
void infer_cell(const char* op, const int64_t* widths, int64_t width, const OpDef& def,
                TensorRefs in, TensorMeta& out) {
  const int64_t h = check_cell(op, in, widths);
  out.shape = in[2].sizes();
  out.shape[out.shape.size() - 1] = width * h;
  out.dtype = in[2].dtype();
  out.device = common_device(def, in);
}

constexpr int64_t kCellWidths[] = {4, 4, 1}, kBackwardWidths[] = {4, 4, 1, 2};
constexpr int64_t kGruWidths[] = {3, 3, 1}, kGruBackwardWidths[] = {3, 3, 1, 1};

void infer_lstm_cell(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  infer_cell("lstm_cell", kCellWidths, 2, def, in, out);
}
void infer_lstm_cell_backward(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  infer_cell("lstm_cell_backward", kBackwardWidths, 5, def, in, out);
}
void infer_gru_cell(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  infer_cell("gru_cell", kGruWidths, 1, def, in, out);
}
void infer_gru_cell_backward(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  infer_cell("gru_cell_backward", kGruBackwardWidths, 7, def, in, out);
}

// The leading dims of c (symbolic where traced so), then `width` times its last dim.
void sym_cell(TensorRefs in, int64_t width, SymDims& out) {
  out = sym_dims(in[2]);
  out.back() = out.back() * SymInt(width);
}
void sym_lstm_cell(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  sym_cell(in, 2, out);
}
void sym_lstm_cell_backward(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&,
                            SymDims& out) {
  sym_cell(in, 5, out);
}
void sym_gru_cell(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  sym_cell(in, 1, out);
}
void sym_gru_cell_backward(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&,
                           SymDims& out) {
  sym_cell(in, 7, out);
}

Tensor last(const Tensor& x, int64_t start, int64_t end) { return slice(x, -1, start, end); }

// The backward op on the call's gates, state and g (in the state's dtype).
Tensor backward_call(OpId op, const GradCtx& ctx, const Tensor& g) {
  const Tensor& s = ctx.inputs[2];
  const Tensor gs = g.dtype() == s.dtype() ? g : g.to(s.dtype());
  const Tensor* in[] = {&ctx.inputs[0], &ctx.inputs[1], &s, &gs};
  return call(op, TensorRefs(in, 4), Attrs());
}

// The cell's gradient in elementwise ops (create_graph: differentiable again), from the summed
// gates a, the state c and g (dh' then dc'): the gradient of a (where `want_da`) and of c.
void cell_grads(const Tensor& a, const Tensor& c, const Tensor& g, int64_t h, bool want_da,
                Tensor& da, Tensor& dc_prev) {
  const Tensor i = sigmoid(last(a, 0, h)), f = sigmoid(last(a, h, 2 * h));
  const Tensor gg = tanh(last(a, 2 * h, 3 * h)), o = sigmoid(last(a, 3 * h, 4 * h));
  const Tensor tc = tanh(f * c + i * gg), dh = last(g, 0, h);
  const Tensor dc = last(g, h, 2 * h) + dh * o * (1 - tc * tc);
  if (want_da)
    da = cat({dc * gg * i * (1 - i), dc * c * f * (1 - f), dc * i * (1 - gg * gg),
              dh * tc * o * (1 - o)},
             -1);
  dc_prev = dc * f;
}

void composite_grads(const GradCtx& ctx, const Tensor& g, Tensor* gi, int64_t h) {
  Tensor da, dc;
  cell_grads(ctx.inputs[0] + ctx.inputs[1], ctx.inputs[2], g, h,
             ctx.needs_grad(0) || ctx.needs_grad(1), da, dc);
  for (int k : {0, 1})
    if (ctx.needs_grad(k)) gi[k] = da;
  if (ctx.needs_grad(2)) gi[2] = dc;
}

void grad_lstm_cell(const GradCtx& ctx, const Tensor& g, Tensor* gi) {
  const int64_t h = ctx.inputs[2].size(-1);
  if (grad_mode()) return composite_grads(ctx, g, gi, h);
  const Tensor r = backward_call(OpId::LstmCellBackward, ctx, g);
  if (ctx.needs_grad(0) || ctx.needs_grad(1)) {
    const Tensor da = last(r, 0, 4 * h);
    for (int k : {0, 1})
      if (ctx.needs_grad(k)) gi[k] = da;
  }
  if (ctx.needs_grad(2)) gi[2] = last(r, 4 * h, 5 * h);
}

// GRU's gradient in elementwise ops (create_graph: differentiable again). g: dh'.
void gru_composite_grads(const GradCtx& ctx, const Tensor& g, Tensor* gi, int64_t h) {
  const Tensor &gx = ctx.inputs[0], &gh = ctx.inputs[1], &hp = ctx.inputs[2];
  const Tensor r = sigmoid(last(gx, 0, h) + last(gh, 0, h));
  const Tensor z = sigmoid(last(gx, h, 2 * h) + last(gh, h, 2 * h));
  const Tensor hn = last(gh, 2 * h, 3 * h), n = tanh(last(gx, 2 * h, 3 * h) + r * hn);
  const Tensor dn = g * (1 - z) * (1 - n * n), dz = g * (hp - n) * z * (1 - z);
  const Tensor dr = dn * hn * r * (1 - r);
  if (ctx.needs_grad(0)) gi[0] = cat({dr, dz, dn}, -1);
  if (ctx.needs_grad(1)) gi[1] = cat({dr, dz, dn * r}, -1);
  if (ctx.needs_grad(2)) gi[2] = g * z;
}

void grad_gru_cell(const GradCtx& ctx, const Tensor& g, Tensor* gi) {
  const int64_t h = ctx.inputs[2].size(-1);
  if (grad_mode()) return gru_composite_grads(ctx, g, gi, h);
  const Tensor r = backward_call(OpId::GruCellBackward, ctx, g);
  for (int k = 0; k < 3; ++k)
    if (ctx.needs_grad(k)) gi[k] = last(r, 3 * k * h, k == 2 ? 7 * h : 3 * (k + 1) * h);
}

// Note [LSTM step]
// nn::LSTMCell's step with its products: LstmStep(x, h, c, w_ih, w_hh, b_ih, b_hh) computes
// a = x w_ih^T + b_ih + h w_hh^T + b_hh and the cell on it, and returns (..., 6H): h', c', then
// a, which the gradient reads (as Attention keeps its logsumexp, Note [Attention]).
// LstmStepBackward(a, c, g) -> (..., 5H): the gradient of a (plus g's own a columns, so that the
// rule is exact for any g), then c's. The products' gradients are matmuls of it.
int64_t check_step(TensorRefs in) {
  const Tensor &x = in[0], &hp = in[1], &c = in[2];
  DUET_CHECK_SHAPE(c.dim() >= 1 && x.dim() == c.dim() && hp.sizes() == c.sizes(),
                   "[lstm_step] x (..., I), h and c (..., H) must share their leading dims, got "
                   "{}, {} and {}",
                   x.sizes(), hp.sizes(), c.sizes());
  const int64_t h = c.size(-1), n_in = x.size(-1);
  for (int64_t d = 0; d + 1 < c.dim(); ++d)
    DUET_CHECK_SHAPE(x.sizes()[d] == c.sizes()[d],
                     "[lstm_step] x {} and c {} must share their leading dims", x.sizes(),
                     c.sizes());
  const Shape want[] = {Shape{4 * h, n_in}, Shape{4 * h, h}, Shape{4 * h}, Shape{4 * h}};
  const char* names[] = {"w_ih", "w_hh", "b_ih", "b_hh"};
  for (int k = 0; k < 7; ++k)
    DUET_CHECK_DTYPE(is_floating(in[k].dtype()) && in[k].dtype() == c.dtype(),
                     "[lstm_step] operands must share a floating dtype, got {} (input {}) and {} "
                     "(c)",
                     in[k].dtype(), k, c.dtype());
  for (int k = 0; k < 4; ++k)
    DUET_CHECK_SHAPE(in[3 + k].sizes() == want[k],
                     "[lstm_step] {} must be {} for x {} and hidden size {}, got {}", names[k],
                     want[k], x.sizes(), h, in[3 + k].sizes());
  return h;
}

void infer_lstm_step(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const int64_t h = check_step(in);
  out.shape = in[2].sizes();
  out.shape[out.shape.size() - 1] = 6 * h;
  out.dtype = in[2].dtype();
  out.device = common_device(def, in);
}
void sym_lstm_step(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&, SymDims& out) {
  sym_cell(in, 6, out);
}

void infer_lstm_step_backward(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const Tensor &a = in[0], &c = in[1], &g = in[2];
  DUET_CHECK_SHAPE(c.dim() >= 1, "[lstm_step_backward] c must be (..., H), got {}", c.sizes());
  const int64_t h = c.size(-1);
  Shape wa = c.sizes(), wg = c.sizes();
  wa[wa.size() - 1] = 4 * h;
  wg[wg.size() - 1] = 6 * h;
  DUET_CHECK_SHAPE(a.sizes() == wa && g.sizes() == wg,
                   "[lstm_step_backward] a must be {} and g {} for c {}, got {} and {}", wa, wg,
                   c.sizes(), a.sizes(), g.sizes());
  for (int k = 0; k < 3; ++k)
    DUET_CHECK_DTYPE(is_floating(in[k].dtype()) && in[k].dtype() == c.dtype(),
                     "[lstm_step_backward] operands must share a floating dtype, got {} (input "
                     "{}) and {} (c)",
                     in[k].dtype(), k, c.dtype());
  out.shape = c.sizes();
  out.shape[out.shape.size() - 1] = 5 * h;
  out.dtype = c.dtype();
  out.device = common_device(def, in);
}
void sym_lstm_step_backward(const OpDef&, TensorRefs in, const Attrs&, const TensorMeta&,
                            SymDims& out) {
  out = sym_dims(in[1]);
  out.back() = out.back() * SymInt(5);
}

void grad_lstm_step(const GradCtx& ctx, const Tensor& g_in, Tensor* gi) {
  const Tensor &x = ctx.inputs[0], &hp = ctx.inputs[1], &c = ctx.inputs[2];
  const Tensor &w_ih = ctx.inputs[3], &w_hh = ctx.inputs[4];
  const int64_t h = c.size(-1);
  const Tensor g = g_in.dtype() == c.dtype() ? g_in : g_in.to(c.dtype());
  const Tensor a = last(ctx.output, 2 * h, 6 * h);
  Tensor da, dc;
  if (grad_mode()) {
    cell_grads(a, c, g, h, true, da, dc);
    da = da + last(g, 2 * h, 6 * h);
  } else {
    const Tensor* in[] = {&a, &c, &g};
    const Tensor r = call(OpId::LstmStepBackward, TensorRefs(in, 3), Attrs());
    da = last(r, 0, 4 * h);
    dc = last(r, 4 * h, 5 * h);
  }
  if (ctx.needs_grad(0)) gi[0] = matmul(da, w_ih);
  if (ctx.needs_grad(1)) gi[1] = matmul(da, w_hh);
  if (ctx.needs_grad(2)) gi[2] = dc;
  // The rows, flattened by their count (symbolic where traced so; -1 cannot size empty rows).
  SymDims lead = sym_dims(c);
  lead.pop_back();
  const SymInt n = sym_numel(lead);
  auto flat = [&](const Tensor& t, int64_t w) { return reshape_dims(t, SymDims{n, SymInt(w)}); };
  const Tensor rows = flat(da, 4 * h);
  if (ctx.needs_grad(3)) gi[3] = matmul(transpose(rows, 0, 1), flat(x, x.size(-1)));
  if (ctx.needs_grad(4)) gi[4] = matmul(transpose(rows, 0, 1), flat(hp, h));
  if (ctx.needs_grad(5) || ctx.needs_grad(6)) {
    const Tensor db = sum(rows, {0});
    for (int k : {5, 6})
      if (ctx.needs_grad(k)) gi[k] = db;
  }
}

}  // namespace rnn_rules

void register_rnn_rules(OpDef* t) {
  using namespace rnn_rules;
  t[int(OpId::LstmCell)].infer = infer_lstm_cell;
  t[int(OpId::LstmCell)].sym_infer = sym_lstm_cell;
  set_grad(t, OpId::LstmCell, grad_lstm_cell, kSaveIn0 | kSaveIn1 | kSaveIn2);
  t[int(OpId::LstmCellBackward)].infer = infer_lstm_cell_backward;
  t[int(OpId::LstmCellBackward)].sym_infer = sym_lstm_cell_backward;
  set_not_differentiable(t, OpId::LstmCellBackward);  // Note [LSTM cell]: never with grad mode
  t[int(OpId::GruCell)].infer = infer_gru_cell;
  t[int(OpId::GruCell)].sym_infer = sym_gru_cell;
  set_grad(t, OpId::GruCell, grad_gru_cell, kSaveIn0 | kSaveIn1 | kSaveIn2);
  t[int(OpId::GruCellBackward)].infer = infer_gru_cell_backward;
  t[int(OpId::GruCellBackward)].sym_infer = sym_gru_cell_backward;
  set_not_differentiable(t, OpId::GruCellBackward);
  t[int(OpId::LstmStep)].infer = infer_lstm_step;
  t[int(OpId::LstmStep)].sym_infer = sym_lstm_step;
  set_grad(t, OpId::LstmStep, grad_lstm_step,
           kSaveIn0 | kSaveIn1 | kSaveIn2 | kSaveIn3 | kSaveIn4 | kSaveOut);
  t[int(OpId::LstmStepBackward)].infer = infer_lstm_step_backward;
  t[int(OpId::LstmStepBackward)].sym_infer = sym_lstm_step_backward;
  set_not_differentiable(t, OpId::LstmStepBackward);  // Note [LSTM step]: never with grad mode
}

}  // namespace detail

namespace {
// A cell op on gates_x and gates_h (..., gates * H) and the state s (..., H), checked as the
// public function `op` (naming the state `state`) and promoted to one floating dtype: mixed
// floating dtypes (autocast's bf16 gates beside an f32 state) promote, as the elementwise ops
// of the cell would.
Tensor call_cell(const char* op, const char* state, OpId id, int64_t gates, const Tensor& gates_x,
                 const Tensor& gates_h, const Tensor& s) {
  DUET_CHECK_VALUE(gates_x.defined() && gates_h.defined() && s.defined(),
                   "[{}] gates_x, gates_h and {} must be defined tensors", op, state);
  const Tensor* all[] = {&gates_x, &gates_h, &s};
  const DType dt = detail::result_type(TensorRefs(all, 3));
  DUET_CHECK_DTYPE(is_floating(dt), "[{}] needs floating operands, got {}, {} and {}", op,
                   gates_x.dtype(), gates_h.dtype(), s.dtype());
  DUET_CHECK_SHAPE(s.dim() >= 1, "[{}] {} must be (..., H), got {}", op, state, s.sizes());
  SymDims gd = detail::sym_dims(s);
  gd.back() = gd.back() * SymInt(gates);
  for (const Tensor* x : {&gates_x, &gates_h}) {
    bool fits = x->dim() == s.dim();
    for (int64_t d = 0; fits && d < s.dim(); ++d)
      fits = detail::size_is(*x, d, gd[static_cast<size_t>(d)], op);
    DUET_CHECK_SHAPE(
        fits, "[{}] gates_x and gates_h must be (..., {}H) for {} (..., H) {}, got {} and {}", op,
        gates, state, s.sizes(), gates_x.sizes(), gates_h.sizes());
  }
  const Tensor gx = gates_x.to(dt), gh = gates_h.to(dt), sc = s.to(dt);
  const Tensor* in[] = {&gx, &gh, &sc};
  return detail::call(id, TensorRefs(in, 3), Attrs());
}
}  // namespace

std::tuple<Tensor, Tensor> fused_lstm_cell(const Tensor& gates_x, const Tensor& gates_h,
                                           const Tensor& c, std::source_location loc) {
  detail::SiteGuard site(loc);
  Tensor h_next, c_next;
  detail::as_op("fused_lstm_cell", [&]() -> Tensor {
    const Tensor r = call_cell("fused_lstm_cell", "c", OpId::LstmCell, 4, gates_x, gates_h, c);
    const int64_t h = c.size(-1);
    h_next = slice(r, -1, 0, h);
    c_next = slice(r, -1, h, 2 * h);
    return r;
  });
  return {h_next, c_next};
}

std::tuple<Tensor, Tensor> lstm_step(const Tensor& x, const Tensor& h, const Tensor& c,
                                     const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                                     const Tensor& b_hh, std::source_location loc) {
  detail::SiteGuard site(loc);
  Tensor h_next, c_next;
  detail::as_op("lstm_step", [&]() -> Tensor {
    const Tensor* in[] = {&x, &h, &c, &w_ih, &w_hh, &b_ih, &b_hh};
    for (int k = 0; k < 7; ++k)
      DUET_CHECK_VALUE(in[k]->defined(), "[lstm_step] input {} is an undefined tensor", k);
    const Tensor r = detail::call(OpId::LstmStep, TensorRefs(in, 7), Attrs());
    const int64_t hs = c.size(-1);
    h_next = slice(r, -1, 0, hs);
    c_next = slice(r, -1, hs, 2 * hs);
    return r;
  });
  return {h_next, c_next};
}

Tensor fused_gru_cell(const Tensor& gates_x, const Tensor& gates_h, const Tensor& h,
                      std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("fused_gru_cell", [&]() -> Tensor {
    return call_cell("fused_gru_cell", "h", OpId::GruCell, 3, gates_x, gates_h, h);
  });
}

}  // namespace duet
