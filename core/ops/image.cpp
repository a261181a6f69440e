// Images: Unfold (im2col) and Fold (col2im), each the other's gradient; Conv2d and its two
// gradients Conv2dInputGrad and Conv2dWeightGrad, each written with the others (Note [Conv2d]);
// conv2d (Conv2d plus a broadcast bias), max_pool2d and avg_pool2d composed of them.
//
// attrs.ints = {kh, kw, sh, sw, ph, pw, H, W}, and the dilation {dh, dw} where it is not 1, for
// all five (core/window.h).
#include "core/autocast.h"
#include "core/dispatch.h"
#include "core/op_table.h"
#include "core/op_errors.h"
#include "core/ops.h"
#include "core/window.h"

namespace duet {
namespace detail {
namespace {

struct Window : WindowGeometry {
  int64_t kk = 0;  ///< kh * kw: the elements of one window
  int64_t l = 0;   ///< ho * wo: the window positions
};

// " dilated by dh x dw" for a message, where the window is dilated.
std::string dilated(const Window& g) {
  return g.dh == 1 && g.dw == 1 ? "" : fmt::format(" dilated by {}x{}", g.dh, g.dw);
}

// Window sizes come from the caller (kernel, stride, padding, dilation, fold's output size), so
// every product and sum of them is checked (Note [Checked sizes] in core/types.cpp): a ValueError
// naming the op and the input shape, never a wrapped size.
Window window(const char* op, const Attrs& a, const Shape& input) {
  DUET_CHECK_VALUE(is_window_attrs(a), "[{}] expects 8 window attributes (10 with a dilation)", op);
  Window g;
  g.kh = a.ints[0], g.kw = a.ints[1], g.sh = a.ints[2], g.sw = a.ints[3];
  g.ph = a.ints[4], g.pw = a.ints[5], g.h = a.ints[6], g.w = a.ints[7];
  if (a.ints.size() == 10) {
    g.dh = a.ints[8];
    g.dw = a.ints[9];
  }
  DUET_CHECK_VALUE(g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0 && g.ph >= 0 && g.pw >= 0,
                   "[{}] kernel {}x{} and stride {}x{} must be positive and padding {}x{} "
                   "non-negative",
                   op, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw);
  DUET_CHECK_VALUE(g.dh > 0 && g.dw > 0, "[{}] dilation {}x{} must be positive", op, g.dh, g.dw);
  int64_t ph2 = 0, pw2 = 0, hp = 0, wp = 0, eh = 0, ew = 0;
  const bool fits =
      !__builtin_mul_overflow(g.ph, 2, &ph2) && !__builtin_mul_overflow(g.pw, 2, &pw2) &&
      !__builtin_add_overflow(g.h, ph2, &hp) && !__builtin_add_overflow(g.w, pw2, &wp) &&
      !__builtin_mul_overflow(g.kh, g.kw, &g.kk) && !__builtin_mul_overflow(g.dh, g.kh - 1, &eh) &&
      !__builtin_mul_overflow(g.dw, g.kw - 1, &ew);
  DUET_CHECK_VALUE(fits,
                   "[{}] input {} (size {}x{}) with kernel {}x{}{} and padding {}x{}: the padded "
                   "size or the window size overflows int64",
                   op, input, g.h, g.w, g.kh, g.kw, dilated(g), g.ph, g.pw);
  DUET_CHECK_SHAPE(hp > eh && wp > ew, "[{}] kernel {}x{}{} is larger than the padded input {}x{}",
                   op, g.kh, g.kw, dilated(g), hp, wp);
  g.ho = (hp - 1 - eh) / g.sh + 1;  // cannot overflow: hp - 1 - eh >= 0
  g.wo = (wp - 1 - ew) / g.sw + 1;
  DUET_CHECK_VALUE(!__builtin_mul_overflow(g.ho, g.wo, &g.l),
                   "[{}] input {} (size {}x{}) with kernel {}x{}, stride {}x{} and padding {}x{}: "
                   "the {}x{} window positions overflow int64",
                   op, input, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.ho, g.wo);
  return g;
}

void infer_unfold(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape& s = in[0].sizes();
  DUET_CHECK_SHAPE(s.size() == 4, "[unfold] input must be (N, C, H, W), got {}", s);
  DUET_CHECK_DTYPE(in[0].dtype() != DType::b8, "[unfold] is not defined for b8 input");
  const Window g = window("unfold", a, s);
  DUET_CHECK_SHAPE(s[2] == g.h && s[3] == g.w, "[unfold] input {} does not match size {}x{}", s,
                   g.h, g.w);
  int64_t ckk = 0;
  DUET_CHECK_VALUE(!__builtin_mul_overflow(s[1], g.kk, &ckk),
                   "[unfold] input {} with kernel {}x{}: {} channels x {} window elements "
                   "overflow int64",
                   s, g.kh, g.kw, s[1], g.kk);
  out.shape = Shape{s[0], ckk, g.l};
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

void infer_fold(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape& s = in[0].sizes();
  const Window g = window("fold", a, s);
  DUET_CHECK_SHAPE(s.size() == 3 && s[1] % g.kk == 0 && s[2] == g.l,
                   "[fold] columns must be (N, C*{}*{}, {}), got {}", g.kh, g.kw, g.l, s);
  DUET_CHECK_DTYPE(in[0].dtype() != DType::b8, "[fold] is not defined for b8 input");
  out.shape = Shape{s[0], s[1] / g.kk, g.h, g.w};
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

// Note [Conv2d]
// y = Conv2d(x, w) is bilinear: <g, y> = B(x, w, g) = sum over n, o, c, the window positions and
// the kernel offsets of g * w * (padded x at the window). Each of the three ops is the gradient
// of B in one argument, so each one's gradient rule is written with the other two:
//   Conv2d(x, w)                -> y:  dx = Conv2dInputGrad(g, w),  dw = Conv2dWeightGrad(x, g)
//   Conv2dInputGrad(gy, w)      -> dx: dgy = Conv2d(g, w),          dw = Conv2dWeightGrad(g, gy)
//   Conv2dWeightGrad(x, gy)     -> dw: dx = Conv2dInputGrad(gy, g), dgy = Conv2d(x, g)
// and the family is closed under differentiation (gradients of gradients stay in it). That is
// the one definition; how a device computes each op (oneDNN's convolutions for CPU f32, or
// unfold + matmul + fold) is the kernel's choice (kernels/conv.cpp).
// With groups g (attrs.step, as PyTorch's `groups`): the C input and O output channels split
// into g blocks, and output block i is the convolution of input block i with filters
// (O / g, C / g, kh, kw); each of the three ops is that, block by block, so the rules above hold
// with the same g.

// The common checks: 4-D operands of one non-b8 dtype. Returns the window of the image (N, C,
// H, W) side, whose H and W are the attributes.
Window conv_window(const char* op, const Shape& image, const Tensor& a, const Tensor& b,
                   const Attrs& attrs) {
  DUET_CHECK_SHAPE(a.dim() == 4 && b.dim() == 4, "[{}] expects 4-D operands, got {} and {}", op,
                   a.sizes(), b.sizes());
  DUET_CHECK_DTYPE(a.dtype() == b.dtype() && a.dtype() != DType::b8,
                   "[{}] operands must share a dtype other than b8, got {} and {}", op, a.dtype(),
                   b.dtype());
  return window(op, attrs, image);
}

// The groups of a convolution (attrs.step), checked against its input and output channels.
int64_t conv_groups(const char* op, const Attrs& a, int64_t c, int64_t o) {
  const int64_t groups = a.step;
  DUET_CHECK_VALUE(groups >= 1, "[{}] groups must be positive, got {}", op, groups);
  DUET_CHECK_SHAPE(c % groups == 0 && o % groups == 0,
                   "[{}] {} input and {} output channels do not split into {} groups", op, c, o,
                   groups);
  return groups;
}

// " in G groups" for a message, where there are several.
std::string in_groups(int64_t groups) {
  return groups == 1 ? "" : fmt::format(" in {} groups", groups);
}

// x (N, C, H, W), w (O, C / g, kh, kw) -> (N, O, Ho, Wo)
void infer_conv2d(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape &x = in[0].sizes(), &w = in[1].sizes();
  const Window g = conv_window("conv2d", x, in[0], in[1], a);
  const int64_t groups = conv_groups("conv2d", a, x[1], w[0]);
  DUET_CHECK_SHAPE(
      x[2] == g.h && x[3] == g.w && w[1] * groups == x[1] && w[2] == g.kh && w[3] == g.kw,
      "[conv2d] input {} and weight {} do not match a {}x{} kernel over {}x{}{}", x, w, g.kh, g.kw,
      g.h, g.w, in_groups(groups));
  out.shape = Shape{x[0], w[0], g.ho, g.wo};
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

// gy (N, O, Ho, Wo), w (O, C / g, kh, kw) -> (N, C, H, W)
void infer_conv2d_input_grad(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape &gy = in[0].sizes(), &w = in[1].sizes();
  DUET_CHECK_SHAPE(gy.size() == 4 && w.size() == 4,
                   "[conv2d_input_grad] expects 4-D operands, got {} and {}", gy, w);
  DUET_CHECK_VALUE(is_window_attrs(a),
                   "[conv2d_input_grad] expects 8 window attributes (10 with a dilation)");
  const int64_t c = w[1] * a.step;  // (conv_groups refuses a step below 1 first)
  const int64_t groups = conv_groups("conv2d_input_grad", a, c, w[0]);
  const Window g =
      conv_window("conv2d_input_grad", Shape{gy[0], c, a.ints[6], a.ints[7]}, in[0], in[1], a);
  DUET_CHECK_SHAPE(gy[1] == w[0] && gy[2] == g.ho && gy[3] == g.wo && w[2] == g.kh && w[3] == g.kw,
                   "[conv2d_input_grad] grad {} and weight {} do not match a {}x{} kernel over "
                   "{}x{}{}",
                   gy, w, g.kh, g.kw, g.h, g.w, in_groups(groups));
  out.shape = Shape{gy[0], c, g.h, g.w};
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

// x (N, C, H, W), gy (N, O, Ho, Wo) -> (O, C / g, kh, kw)
void infer_conv2d_weight_grad(const OpDef&, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Shape &x = in[0].sizes(), &gy = in[1].sizes();
  const Window g = conv_window("conv2d_weight_grad", x, in[0], in[1], a);
  const int64_t groups = conv_groups("conv2d_weight_grad", a, x[1], gy[1]);
  DUET_CHECK_SHAPE(x[2] == g.h && x[3] == g.w && gy[0] == x[0] && gy[2] == g.ho && gy[3] == g.wo,
                   "[conv2d_weight_grad] input {} and grad {} do not match a {}x{} kernel over "
                   "{}x{}",
                   x, gy, g.kh, g.kw, g.h, g.w);
  out.shape = Shape{gy[1], x[1] / groups, g.kh, g.kw};
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

Tensor conv_call(OpId op, const Tensor& a, const Tensor& b, const Attrs& attrs) {
  const Tensor* in[] = {&a, &b};
  return call(op, TensorRefs(in, 2), attrs);
}
void grad_conv2d(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (c.needs_grad(0)) gi[0] = conv_call(OpId::Conv2dInputGrad, g, c.inputs[1], c.attrs);
  if (c.needs_grad(1)) gi[1] = conv_call(OpId::Conv2dWeightGrad, c.inputs[0], g, c.attrs);
}
void grad_conv2d_input_grad(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (c.needs_grad(0)) gi[0] = conv_call(OpId::Conv2d, g, c.inputs[1], c.attrs);
  if (c.needs_grad(1)) gi[1] = conv_call(OpId::Conv2dWeightGrad, g, c.inputs[0], c.attrs);
}
void grad_conv2d_weight_grad(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (c.needs_grad(0)) gi[0] = conv_call(OpId::Conv2dInputGrad, c.inputs[1], g, c.attrs);
  if (c.needs_grad(1)) gi[1] = conv_call(OpId::Conv2d, c.inputs[0], g, c.attrs);
}

Tensor window_call(OpId op, const Tensor& x, const Attrs& a) {
  const Tensor* in[] = {&x};
  return call(op, TensorRefs(in, 1), a);
}
void grad_unfold(const GradCtx& c, const Tensor& g, Tensor* gi) {
  gi[0] = window_call(OpId::Fold, g, c.attrs);
}
void grad_fold(const GradCtx& c, const Tensor& g, Tensor* gi) {
  gi[0] = window_call(OpId::Unfold, g, c.attrs);
}

// A transposed convolution's output along one dim of n: the unpadded image its windows fill,
// (n - 1) s + d (k - 1) + 1, and that less 2 p plus the output padding; false on an overflow.
bool transposed_size(int64_t n, int64_t k, int64_t s, int64_t p, int64_t op, int64_t d,
                     int64_t* full, int64_t* out) {
  int64_t a = 0, b = 0, p2 = 0;
  return !__builtin_mul_overflow(n - 1, s, &a) && !__builtin_mul_overflow(d, k - 1, &b) &&
         !__builtin_add_overflow(a, b, full) && !__builtin_add_overflow(*full, 1, full) &&
         !__builtin_mul_overflow(p, 2, &p2) && !__builtin_sub_overflow(*full, p2, out) &&
         !__builtin_add_overflow(*out, op, out);
}

Attrs window_attrs(const char* op, const Tensor& x, Size2 k, Size2 s, Size2 p, Window* g = nullptr,
                   Size2 d = 1) {
  DUET_CHECK_SHAPE(x.dim() == 4, "[{}] input must be (N, C, H, W), got {}", op, x.sizes());
  Attrs a;
  // H and W only: the windows need them concrete, N and C may stay symbolic (a batch dim).
  set_window_attrs(a, k.h, k.w, s.h, s.w, p.h, p.w, x.size(2), x.size(3), d.h, d.w);
  const Window w = window(op, a, hint_sizes(x));  // validates with the caller's op name
  if (g) *g = w;
  return a;
}

}  // namespace

void register_image_rules(OpDef* t) {
  t[int(OpId::Unfold)].infer = infer_unfold;
  t[int(OpId::Fold)].infer = infer_fold;
  set_grad(t, OpId::Unfold, grad_unfold, 0);
  set_grad(t, OpId::Fold, grad_fold, 0);
  t[int(OpId::Conv2d)].infer = infer_conv2d;
  t[int(OpId::Conv2dInputGrad)].infer = infer_conv2d_input_grad;
  t[int(OpId::Conv2dWeightGrad)].infer = infer_conv2d_weight_grad;
  set_grad(t, OpId::Conv2d, grad_conv2d, kSaveIn0 | kSaveIn1);
  set_grad(t, OpId::Conv2dInputGrad, grad_conv2d_input_grad, kSaveIn0 | kSaveIn1);
  set_grad(t, OpId::Conv2dWeightGrad, grad_conv2d_weight_grad, kSaveIn0 | kSaveIn1);
  // Products: under autocast they run in the low dtype (Note [Autocast] in core/autocast.h).
  for (OpId op : {OpId::Conv2d, OpId::Conv2dInputGrad, OpId::Conv2dWeightGrad})
    t[int(op)].autocast = AutocastClass::Lower;
}

}  // namespace detail

Tensor unfold(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation,
              std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::window_call(
      OpId::Unfold, x,
      detail::window_attrs("unfold", x, kernel, stride, padding, nullptr, dilation));
}

Tensor fold(const Tensor& cols, int64_t height, int64_t width, Size2 kernel, Size2 stride,
            Size2 padding, Size2 dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  set_window_attrs(a, kernel.h, kernel.w, stride.h, stride.w, padding.h, padding.w, height, width,
                   dilation.h, dilation.w);
  return detail::window_call(OpId::Fold, cols, a);
}

// The Conv2d primitive (Note [Conv2d]) plus a broadcast bias; the kernel (kh, kw) from the
// weight. The batch size N (and the channels C) stay SymInts, so that a symbolic batch dim stays
// symbolic; H, W and the weight's sizes are read as integers (the windows need them).
Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, Size2 stride,
              Size2 padding, int64_t groups, Size2 dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv2d", [&]() -> Tensor {
    Tensor held_x;  // Note [Autocast]
    const Tensor& x = detail::autocast_lower(x_in, held_x);
    Tensor held_w;  // Note [Autocast]
    const Tensor& w = detail::autocast_lower(w_in, held_w);
    Tensor held_b;  // Note [Autocast]
    const Tensor& b = detail::autocast_lower(b_in, held_b);
    DUET_CHECK_SHAPE(x.dim() == 4, "[conv2d] input must be (N, C, H, W), got {}", x.sizes());
    DUET_CHECK_SHAPE(w.dim() == 4, "[conv2d] weight must be (out, in / groups, kh, kw), got {}",
                     w.sizes());
    DUET_CHECK_VALUE(groups >= 1, "[conv2d] groups must be positive, got {}", groups);
    DUET_CHECK_SHAPE(detail::size_is(x, 1, detail::sym_dim(w, 1) * SymInt(groups), "conv2d"),
                     "[conv2d] input has {} channels but the weight {}{} expects {}", x.sizes()[1],
                     w.sizes(), detail::in_groups(groups), w.sizes()[1] * groups);
    DUET_CHECK_DTYPE(x.dtype() == w.dtype(),
                     "[conv2d] input ({}) and weight ({}) must share a dtype", x.dtype(),
                     w.dtype());
    const int64_t o = w.size(0);
    Attrs a = detail::window_attrs("conv2d", x, Size2(w.size(2), w.size(3)), stride, padding,
                                   nullptr, dilation);
    a.step = groups;
    Tensor y = detail::conv_call(OpId::Conv2d, x, w, a);
    if (!b.defined()) return y;
    DUET_CHECK_SHAPE(b.dim() == 1 && b.size(0) == o, "[conv2d] bias must be ({}), got {}", o,
                     b.sizes());
    return y + reshape(b, {1, o, 1, 1});
  });
}

// padding "same": conv2d's own padding where the halves agree, else x zero-padded first.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Size2 stride, SamePadding,
              int64_t groups, Size2 dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv2d", [&]() -> Tensor {
    DUET_CHECK_VALUE(stride == Size2(1), "[conv2d] padding \"same\" needs stride 1, got {}x{}",
                     stride.h, stride.w);
    DUET_CHECK_SHAPE(w.dim() == 4, "[conv2d] weight must be (out, in / groups, kh, kw), got {}",
                     w.sizes());
    const std::array<int64_t, 4> p = same_padding({w.size(2), w.size(3)}, dilation);
    if (p[0] == p[1] && p[2] == p[3])
      return conv2d(x, w, b, 1, Size2{p[2], p[0]}, groups, dilation);
    return conv2d(pad(x, {p[0], p[1], p[2], p[3]}), w, b, 1, Size2(0), groups, dilation);
  });
}

Tensor conv2d_input_grad(const Tensor& grad, const Tensor& w, int64_t height, int64_t width,
                         Size2 stride, Size2 padding, int64_t groups, Size2 dilation,
                         std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_SHAPE(w.dim() == 4,
                   "[conv2d_input_grad] weight must be (out, in / groups, kh, kw), got {}",
                   w.sizes());
  Attrs a;
  set_window_attrs(a, w.size(2), w.size(3), stride.h, stride.w, padding.h, padding.w, height, width,
                   dilation.h, dilation.w);
  a.step = groups;
  return detail::conv_call(OpId::Conv2dInputGrad, grad, w, a);
}

Tensor conv2d_weight_grad(const Tensor& x, const Tensor& grad, Size2 kernel, Size2 stride,
                          Size2 padding, int64_t groups, Size2 dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a =
      detail::window_attrs("conv2d_weight_grad", x, kernel, stride, padding, nullptr, dilation);
  a.step = groups;
  return detail::conv_call(OpId::Conv2dWeightGrad, x, grad, a);
}

// Note [Transposed convolution]
// conv_transpose2d is conv2d's input gradient taken as an op of its own (PyTorch's
// conv_transpose2d): x (N, C_in, H, W) spreads through w (C_in, C_out / groups, kh, kw) into
// (N, C_out, Ho, Wo) with Ho = (H - 1) sh - 2 ph + dh (kh - 1) + oph + 1. It is Conv2dInputGrad
// of an image of Ho x Wo, whose windows fit H positions as long as the output padding is below
// the stride. PyTorch also allows an output padding below the dilation instead: the conv2d over
// such an image has more window positions than x, so the input gradient is taken over the image
// unpadded, H positions exactly, and the rows (columns) the output keeps are sliced from it,
// zeros appended where the output padding reaches past it.
Tensor conv_transpose2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, Size2 stride,
                        Size2 padding, Size2 output_padding, int64_t groups, Size2 dilation,
                        std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv_transpose2d", [&]() -> Tensor {
    Tensor held_x;  // Note [Autocast]
    const Tensor& x = detail::autocast_lower(x_in, held_x);
    Tensor held_w;  // Note [Autocast]
    const Tensor& w = detail::autocast_lower(w_in, held_w);
    Tensor held_b;  // Note [Autocast]
    const Tensor& b = detail::autocast_lower(b_in, held_b);
    const char* op = "conv_transpose2d";
    DUET_CHECK_SHAPE(x.dim() == 4, "[{}] input must be (N, C_in, H, W), got {}", op, x.sizes());
    DUET_CHECK_SHAPE(w.dim() == 4, "[{}] weight must be (in, out / groups, kh, kw), got {}", op,
                     w.sizes());
    DUET_CHECK_VALUE(groups >= 1, "[{}] groups must be positive, got {}", op, groups);
    DUET_CHECK_SHAPE(detail::size_is(x, 1, detail::sym_dim(w, 0), op),
                     "[{}] input has {} channels but the weight {} expects {}", op, x.sizes()[1],
                     w.sizes(), w.sizes()[0]);
    DUET_CHECK_DTYPE(x.dtype() == w.dtype(), "[{}] input ({}) and weight ({}) must share a dtype",
                     op, x.dtype(), w.dtype());
    const Size2 k{w.size(2), w.size(3)}, op_pad = output_padding;
    DUET_CHECK_VALUE(stride.h > 0 && stride.w > 0 && dilation.h > 0 && dilation.w > 0 &&
                         padding.h >= 0 && padding.w >= 0 && op_pad.h >= 0 && op_pad.w >= 0,
                     "[{}] stride {}x{} and dilation {}x{} must be positive, padding {}x{} and "
                     "output padding {}x{} non-negative",
                     op, stride.h, stride.w, dilation.h, dilation.w, padding.h, padding.w, op_pad.h,
                     op_pad.w);
    DUET_CHECK_VALUE((op_pad.h < stride.h || op_pad.h < dilation.h) &&
                         (op_pad.w < stride.w || op_pad.w < dilation.w),
                     "[{}] output padding {}x{} must be below the stride {}x{} or the dilation "
                     "{}x{}",
                     op, op_pad.h, op_pad.w, stride.h, stride.w, dilation.h, dilation.w);
    DUET_CHECK_SHAPE(x.size(2) > 0 && x.size(3) > 0, "[{}] input {} has an empty image", op,
                     x.sizes());
    // The unpadded image the windows fill exactly, (H - 1) s + d (k - 1) + 1, and the output.
    int64_t full_h = 0, full_w = 0, ho = 0, wo = 0;
    const bool fits = detail::transposed_size(x.size(2), k.h, stride.h, padding.h, op_pad.h,
                                              dilation.h, &full_h, &ho) &&
                      detail::transposed_size(x.size(3), k.w, stride.w, padding.w, op_pad.w,
                                              dilation.w, &full_w, &wo);
    DUET_CHECK_VALUE(fits,
                     "[{}] input {} with kernel {}x{}, stride {}x{} and dilation {}x{}: the "
                     "output size overflows int64",
                     op, x.sizes(), k.h, k.w, stride.h, stride.w, dilation.h, dilation.w);
    DUET_CHECK_SHAPE(ho > 0 && wo > 0,
                     "[{}] input {} with kernel {}x{}, stride {}x{} and padding {}x{} gives an "
                     "empty {}x{} output",
                     op, x.sizes(), k.h, k.w, stride.h, stride.w, padding.h, padding.w, ho, wo);
    Tensor y;
    if (op_pad.h < stride.h && op_pad.w < stride.w) {
      y = conv2d_input_grad(x, w, ho, wo, stride, padding, groups, dilation);
    } else {
      y = conv2d_input_grad(x, w, full_h, full_w, stride, 0, groups, dilation);
      y = pad(y, {-padding.w, op_pad.w - padding.w, -padding.h, op_pad.h - padding.h});
    }
    if (!b.defined()) return y;
    const int64_t o = w.size(1) * groups;
    DUET_CHECK_SHAPE(b.dim() == 1 && b.size(0) == o, "[{}] bias must be ({}), got {}", op, o,
                     b.sizes());
    return y + reshape(b, {1, o, 1, 1});
  });
}

namespace detail {
namespace {

// Note [Pooling windows]
// max_pool2d and avg_pool2d are Unfold's windows reduced over dim 2, as PyTorch defines them:
// - the padding (at most half the kernel) reads as -inf (max) or 0 (avg);
// - ceil_mode rounds the window positions up, as long as the last window starts inside the
//   input or its top/left padding (PyTorch's pooling_output_shape). That last window may reach
//   past the bottom/right padding; the input is padded by that much more (`extra`);
// - avg_pool2d divides each window's sum by the elements it counts: the whole window where the
//   padding counts (count_include_pad), but never the extra of ceil_mode; only the input's
//   elements otherwise. Where every window counts kh * kw, it is a mean, as before there were
//   paddings in pooling.
// A pooling without padding nor ceil_mode is the one Unfold it always was.
struct Pool {
  Window g;        ///< the window over the input padded by (ph, pw) on each side
  int64_t ho, wo;  ///< the window positions (ceil_mode's may exceed g's by one)
  int64_t eh, ew;  ///< ceil_mode's extra padding after the bottom and right padding
};

// The positions along one dim of size n with ceil_mode: one more than the floor where the
// window would start inside n + p. `floor_out` is the floor's count, `span` the window's.
int64_t ceil_positions(int64_t n, int64_t p, int64_t s, int64_t span, int64_t floor_out) {
  if ((n + 2 * p - span) % s == 0) return floor_out;  // n + 2p: checked by window()
  int64_t start = 0;
  if (__builtin_mul_overflow(floor_out, s, &start) || start >= n + p) return floor_out;
  return floor_out + 1;
}

Pool pool_geometry(const char* op, const Tensor& x, Size2 k, Size2 s, Size2 p, Size2 d,
                   bool ceil_mode) {
  Pool r;
  window_attrs(op, x, k, Size2(s.h ? s.h : k.h, s.w ? s.w : k.w), p, &r.g, d);
  DUET_CHECK_VALUE(p.h <= r.g.kh / 2 && p.w <= r.g.kw / 2,
                   "[{}] padding {}x{} must be at most half the kernel {}x{}", op, p.h, p.w, r.g.kh,
                   r.g.kw);
  r.ho = ceil_mode ? ceil_positions(r.g.h, r.g.ph, r.g.sh, r.g.span_h(), r.g.ho) : r.g.ho;
  r.wo = ceil_mode ? ceil_positions(r.g.w, r.g.pw, r.g.sw, r.g.span_w(), r.g.wo) : r.g.wo;
  // The last window's end past the padded input: below one stride, so no overflow.
  r.eh = (r.ho - 1) * r.g.sh + r.g.span_h() - (r.g.h + 2 * r.g.ph);
  r.ew = (r.wo - 1) * r.g.sw + r.g.span_w() - (r.g.w + 2 * r.g.pw);
  r.eh = std::max<int64_t>(r.eh, 0);
  r.ew = std::max<int64_t>(r.ew, 0);
  return r;
}

// The windows of each channel, (N, C, kh * kw, ho * wo), the padding read as `fill`; the caller
// reduces dim 2. One Unfold where its zero padding is the fill and no extra is needed.
Tensor pool_windows(const Tensor& x, const Pool& q, Scalar fill, bool zero_fill) {
  const Window& g = q.g;
  const Size2 k{g.kh, g.kw}, s{g.sh, g.sw}, d{g.dh, g.dw};
  const bool padded = g.ph > 0 || g.pw > 0 || q.eh > 0 || q.ew > 0;
  Tensor cols;
  if (!padded || (zero_fill && q.eh == 0 && q.ew == 0)) {
    cols = window_call(OpId::Unfold, x,
                       window_attrs("unfold", x, k, s, Size2{g.ph, g.pw}, nullptr, d));
  } else {
    const Tensor xp = pad(x, {g.pw, g.pw + q.ew, g.ph, g.ph + q.eh}, "constant", fill);
    cols = window_call(OpId::Unfold, xp, window_attrs("unfold", xp, k, s, 0, nullptr, d));
  }
  const SymDims xs = sym_dims(x);                                // N and C may be symbolic
  return reshape_dims(cols, {xs[0], xs[1], g.kk, q.ho * q.wo});  // not -1: N may be 0
}

// avg_pool2d's count of window elements along one dim, for each position (Note [Pooling
// windows]).
std::vector<double> pool_counts(int64_t n, int64_t k, int64_t s, int64_t p, int64_t out,
                                bool count_pad) {
  std::vector<double> c(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * s - p, end = std::min(start + k, n + p);
    c[static_cast<size_t>(i)] =
        double(count_pad ? end - start : std::min(end, n) - std::max<int64_t>(start, 0));
  }
  return c;
}

// The lowest value of x's dtype: max_pool2d's padding.
Scalar lowest(DType t) {
  if (is_floating(t)) return Scalar(-INFINITY);
  return Scalar(integral_range(t).least);
}

}  // namespace
}  // namespace detail

Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation,
                  bool ceil_mode, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("max_pool2d", [&]() -> Tensor {
    DUET_CHECK_DTYPE(x.dtype() != DType::b8, "[max_pool2d] is not defined for b8 input");
    const detail::Pool q =
        detail::pool_geometry("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode);
    Tensor win = detail::pool_windows(x, q, detail::lowest(x.dtype()), false);
    const SymDims xs = detail::sym_dims(x);
    return detail::reshape_dims(max(win, 2), {xs[0], xs[1], q.ho, q.wo});
  });
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, bool ceil_mode,
                  bool count_include_pad, int64_t divisor_override, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("avg_pool2d", [&]() -> Tensor {
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[avg_pool2d] needs a floating input, got {}",
                     x.dtype());
    DUET_CHECK_VALUE(divisor_override >= 0,
                     "[avg_pool2d] divisor_override {} must be positive (0: none)",
                     divisor_override);
    const detail::Pool q =
        detail::pool_geometry("avg_pool2d", x, kernel, stride, padding, 1, ceil_mode);
    const detail::Window& g = q.g;
    Tensor win = detail::pool_windows(x, q, 0, true);
    const SymDims xs = detail::sym_dims(x);
    if (divisor_override > 0)
      return detail::reshape_dims(sum(win, 2) / Scalar(double(divisor_override)),
                                  {xs[0], xs[1], q.ho, q.wo});
    const bool pads = g.ph > 0 || g.pw > 0;
    if (q.eh == 0 && q.ew == 0 && (count_include_pad || !pads))
      return detail::reshape_dims(mean(win, 2), {xs[0], xs[1], q.ho, q.wo});
    const std::vector<double> rows =
        detail::pool_counts(g.h, g.kh, g.sh, g.ph, q.ho, count_include_pad);
    const std::vector<double> cols =
        detail::pool_counts(g.w, g.kw, g.sw, g.pw, q.wo, count_include_pad);
    std::vector<double> counts;
    counts.reserve(rows.size() * cols.size());
    for (double r : rows)
      for (double c : cols) counts.push_back(r * c);
    const Tensor divisor = tensor(std::move(counts), Options().dtype(x.dtype()).device(x.device()));
    return detail::reshape_dims(sum(win, 2) / divisor, {xs[0], xs[1], q.ho, q.wo});
  });
}

namespace {

// Note [Adaptive pooling]
// Output position i of a dim of size n pooled to `out` reads [floor(i n / out), ceil((i + 1) n /
// out)), as PyTorch's adaptive pooling. Where out divides n, that is a pooling with kernel and
// stride n / out; otherwise the windows differ in size, and each dim is reduced alone, one
// window at a time (a max of maxes, or a mean of means of equal counts, is the window's).
template <class Pool1, class Reduce>
Tensor adaptive_pool(const char* op, const Tensor& x, Size2 out, Pool1 pool, Reduce reduce) {
  DUET_CHECK_SHAPE(x.dim() == 4, "[{}] input must be (N, C, H, W), got {}", op, x.sizes());
  const int64_t h = x.size(2), w = x.size(3);
  DUET_CHECK_VALUE(out.h > 0 && out.w > 0, "[{}] output size {}x{} must be positive", op, out.h,
                   out.w);
  DUET_CHECK_SHAPE(h > 0 && w > 0, "[{}] input {} has an empty image", op, x.sizes());
  if (h % out.h == 0 && w % out.w == 0) return pool(x, Size2{h / out.h, w / out.w});
  auto along = [&](const Tensor& t, int64_t dim, int64_t n, int64_t o) {
    if (n % o == 0) return pool(t, dim == 2 ? Size2{n / o, 1} : Size2{1, n / o});
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < o; ++i) {
      const int64_t start = i * n / o, end = ((i + 1) * n + o - 1) / o;
      parts.push_back(reduce(slice(t, dim, start, end), dim));
    }
    return cat(parts, dim);
  };
  return along(along(x, 3, w, out.w), 2, h, out.h);
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("adaptive_avg_pool2d", [&]() -> Tensor {
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[adaptive_avg_pool2d] needs a floating input, got {}",
                     x.dtype());
    return adaptive_pool(
        "adaptive_avg_pool2d", x, output_size,
        [](const Tensor& t, Size2 k) { return avg_pool2d(t, k); },
        [](const Tensor& t, int64_t dim) { return mean(t, Dims{dim}, true); });
  });
}

Tensor adaptive_max_pool2d(const Tensor& x, Size2 output_size, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("adaptive_max_pool2d", [&]() -> Tensor {
    return adaptive_pool(
        "adaptive_max_pool2d", x, output_size,
        [](const Tensor& t, Size2 k) { return max_pool2d(t, k); },
        [](const Tensor& t, int64_t dim) { return max(t, Dims{dim}, true); });
  });
}

}  // namespace duet
