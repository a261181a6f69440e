// matmul: the MatMul primitive takes operands of rank >= 2 with broadcast batch dims; 1-D
// operands (torch.matmul's rules) are composed around it with unsqueeze and squeeze.
#include <algorithm>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

void infer_matmul(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const Shape& a = in[0].sizes();
  const Shape& b = in[1].sizes();
  DUET_CHECK_SHAPE(a.size() >= 2 && b.size() >= 2,
                   "[matmul] the primitive needs operands of rank >= 2, got {} and {}", a, b);
  DUET_CHECK_DTYPE(in[0].dtype() == in[1].dtype(),
                   "[matmul] operands must have the same dtype, got {} {} and {} {}", in[0].dtype(),
                   a, in[1].dtype(), b);
  DUET_CHECK_DTYPE(in[0].dtype() != DType::b8, "[matmul] is not defined for b8 operands {} and {}",
                   a, b);
  int64_t m = a[a.size() - 2], k = a[a.size() - 1];
  int64_t k2 = b[b.size() - 2], n = b[b.size() - 1];
  DUET_CHECK_SHAPE(k == k2, "[matmul] inner dimensions differ: {} @ {}", a, b);
  if (a.size() == 2 && b.size() == 2) {
    out.shape = Shape{m, n};
  } else {
    Shape ba(a.data(), a.size() - 2), bb(b.data(), b.size() - 2);
    out.shape = broadcast_shapes(def.name, ba, bb);
    out.shape.push_back(m);
    out.shape.push_back(n);
  }
  out.dtype = in[0].dtype();
  out.device = common_device(def, in);
}

// Whether a 2-D tensor is a transposed view of a contiguous matrix (column-major).
bool column_major(const Tensor& t) {
  if (t.dim() != 2 || t.is_contiguous()) return false;
  detail::HintReads hints;  // strides follow the traced sizes; the layout is what is asked
  return t.strides()[0] == 1 && t.strides()[1] == t.sizes()[0];
}

// Batch dims broadcast in the forward are summed back by the engine. The gradient of a 2-D
// right operand is made in that operand's layout: for linear()'s transposed weight view,
// (g^T a)^T rather than a^T g, so that it arrives contiguous in the weight's own (out, in)
// layout and accumulating it into .grad reads it in order (BLAS takes the transposes as flags).
void grad_matmul(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (c.needs_grad(0)) gi[0] = matmul(g, transpose(c.inputs[1], -1, -2));
  if (c.needs_grad(1)) {
    const Tensor& a = c.inputs[0];
    gi[1] = a.dim() == 2 && g.dim() == 2 && column_major(c.inputs[1])
                ? transpose(matmul(transpose(g, 0, 1), a), 0, 1)
                : matmul(transpose(a, -1, -2), g);
  }
}

}  // namespace

void register_linalg_rules(OpDef* t) {
  t[int(OpId::MatMul)].infer = infer_matmul;
  set_grad(t, OpId::MatMul, grad_matmul, kSaveIn0 | kSaveIn1);
  t[int(OpId::MatMul)].autocast = AutocastClass::Lower;  // a product (Note [Autocast])
}

}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_SHAPE(a.dim() >= 1 && b.dim() >= 1,
                   "[matmul] both operands need at least one dim, got {} and {}", a.sizes(),
                   b.sizes());
  if (a.dim() >= 2 && b.dim() >= 2) {
    const Tensor* in[] = {&a, &b};
    return detail::call(OpId::MatMul, TensorRefs(in, 2), {});
  }
  // 1-D operands: a vector on the left is a row, on the right a column; the added dim is
  // removed from the result. (The inner sizes compared as SymInts: reading them as integers
  // would specialize a symbolic batch dim of either operand.)
  DUET_CHECK_SHAPE(detail::size_is(a, a.dim() - 1,
                                   detail::sym_dim(b, std::max<int64_t>(b.dim() - 2, 0)), "matmul"),
                   "[matmul] inner dimensions differ: {} @ {}", a.sizes(), b.sizes());
  Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;
  Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  Tensor r = matmul(a2, b2);
  if (b.dim() == 1) r = squeeze(r, -1);
  if (a.dim() == 1) r = squeeze(r, -2 + (b.dim() == 1 ? 1 : 0));
  return r;
}

}  // namespace duet
