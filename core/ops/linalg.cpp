// matmul: the MatMul primitive takes torch.matmul's operands (Note [Vector operands]).
//
// Note [Vector operands]
// Operands of rank >= 2 are batches of matrices with broadcast batch dims. A 1-D operand is a
// vector: on the left a row, on the right a column, and its dim is not in the result (a matrix
// times a vector is a vector; two vectors give their dot product, 0-d). The primitive takes
// vectors itself, as PyTorch's mv and dot: per-sample code multiplies vectors one at a time,
// and a row or a column made around the product would be two more views per call, each a tape
// node eagerly and an op to record and run under Autobatch. Kernels see matrices (kernels/
// matrices.h views the vectors as rows and columns), and the gradient and batching rules put the
// vectors' dims back the same way.
#include <algorithm>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {
namespace {

void infer_matmul(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const Shape& a = in[0].sizes();
  const Shape& b = in[1].sizes();
  DUET_CHECK_SHAPE(a.size() >= 1 && b.size() >= 1,
                   "[matmul] both operands need at least one dim, got {} and {}", a, b);
  DUET_CHECK_DTYPE(in[0].dtype() == in[1].dtype(),
                   "[matmul] operands must have the same dtype, got {} {} and {} {}", in[0].dtype(),
                   a, in[1].dtype(), b);
  DUET_CHECK_DTYPE(in[0].dtype() != DType::b8, "[matmul] is not defined for b8 operands {} and {}",
                   a, b);
  // A vector on the left is a row, on the right a column (Note [Vector operands]).
  const bool av = a.size() == 1, bv = b.size() == 1;
  const int64_t k = a[a.size() - 1], k2 = b[bv ? 0 : b.size() - 2];
  DUET_CHECK_SHAPE(k == k2, "[matmul] inner dimensions differ: {} @ {}", a, b);
  if (a.size() == 2 && b.size() == 2) {
    out.shape = Shape{a[0], b[1]};
  } else {
    Shape ba(a.data(), av ? 0 : a.size() - 2), bb(b.data(), bv ? 0 : b.size() - 2);
    out.shape = broadcast_shapes(def.name, ba, bb);
    if (!av) out.shape.push_back(a[a.size() - 2]);
    if (!bv) out.shape.push_back(b[b.size() - 1]);
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
// Vectors are rows and columns again, and g gets their dims back (Note [Vector operands]).
void grad_matmul(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  const bool av = a.dim() == 1, bv = b.dim() == 1;
  if (av || bv) {
    const Tensor a2 = av ? unsqueeze(a, 0) : a, b2 = bv ? unsqueeze(b, 1) : b;
    Tensor g2 = bv ? unsqueeze(g, -1) : g;
    if (av) g2 = unsqueeze(g2, -2);
    if (c.needs_grad(0)) {
      Tensor r = matmul(g2, transpose(b2, -1, -2));
      gi[0] = av ? squeeze(r, -2) : r;
    }
    if (c.needs_grad(1)) {
      Tensor r = matmul(transpose(a2, -1, -2), g2);
      gi[1] = bv ? squeeze(r, -1) : r;
    }
    return;
  }
  if (c.needs_grad(0)) gi[0] = matmul(g, transpose(b, -1, -2));
  if (c.needs_grad(1)) {
    gi[1] = a.dim() == 2 && g.dim() == 2 && column_major(b)
                ? transpose(matmul(transpose(g, 0, 1), a), 0, 1)
                : matmul(transpose(a, -1, -2), g);
  }
}

// Note [addmv]
// addmv(input, mat, vec) = input + mat @ vec: linear() of one sample's vector with a bias, one
// op where a product and an add were two (each a tape node eagerly, an op to record and run
// under Autobatch). Its kernel stores the product and adds the input in place. Its batching
// rule makes a group of samples' vectors one addmm, (B, k) @ mat^T + input, the bias added
// inside the product; with a batched matrix or input, it is matmul's rule then the add's.
void infer_addmv(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const Tensor &input = in[0], &mat = in[1], &vec = in[2];
  DUET_CHECK_SHAPE(mat.dim() == 2 && vec.dim() == 1 && mat.sizes()[1] == vec.sizes()[0] &&
                       input.dim() == 1 && input.sizes()[0] == mat.sizes()[0],
                   "[addmv] needs input (n), mat (n, k) and vec (k), got {}, {} and {}",
                   input.sizes(), mat.sizes(), vec.sizes());
  DUET_CHECK_DTYPE(
      mat.dtype() == vec.dtype() && input.dtype() == mat.dtype() && mat.dtype() != DType::b8,
      "[addmv] input, mat and vec must share a dtype other than b8, got {}, {} and {}",
      input.dtype(), mat.dtype(), vec.dtype());
  out.shape = Shape{mat.sizes()[0]};
  out.dtype = mat.dtype();
  out.device = common_device(def, in);
}

void grad_addmv(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Tensor &mat = c.inputs[1], &vec = c.inputs[2];
  if (c.needs_grad(0)) gi[0] = g;
  if (c.needs_grad(1)) gi[1] = matmul(unsqueeze(g, 1), unsqueeze(vec, 0));
  if (c.needs_grad(2)) gi[2] = matmul(transpose(mat, 0, 1), g);
}

// Note [addmm]
// addmm(input, mat1, mat2) = input + mat1 @ mat2 with input (n) along the rows: linear()'s
// product and bias as one op, as PyTorch's linear calls addmm. Its bf16 kernel hands the bias to
// oneDNN's primitive, which adds it to the f32 sums before they are rounded, so that the layer
// rounds once and no pass over the product is left to add the bias (under autocast, W8 spent
// 0.7 ms a step on those adds); f16, and bf16 without the instructions, add it in f32 and round
// once; f32 and the others store the product and add the bias in place (the same bits as
// matmul then add); CUDA uses cuBLASLt's bias epilogue where it takes the call. Its gradient
// is matmul's, the bias's the sum of g over the rows. Its batching rule is one addmm of all the
// rows where only mat1 is batched (a vmapped linear layer), else matmul's then the add's.
void infer_addmm(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  const Tensor &input = in[0], &a = in[1], &b = in[2];
  DUET_CHECK_SHAPE(a.dim() == 2 && b.dim() == 2 && a.sizes()[1] == b.sizes()[0] &&
                       input.dim() == 1 && input.sizes()[0] == b.sizes()[1],
                   "[addmm] needs input (n), mat1 (m, k) and mat2 (k, n), got {}, {} and {}",
                   input.sizes(), a.sizes(), b.sizes());
  DUET_CHECK_DTYPE(
      a.dtype() == b.dtype() && input.dtype() == a.dtype() && a.dtype() != DType::b8,
      "[addmm] input, mat1 and mat2 must share a dtype other than b8, got {}, {} and {}",
      input.dtype(), a.dtype(), b.dtype());
  out.shape = Shape{a.sizes()[0], b.sizes()[1]};
  out.dtype = a.dtype();
  out.device = common_device(def, in);
}

void grad_addmm(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Tensor &a = c.inputs[1], &b = c.inputs[2];
  if (c.needs_grad(0)) gi[0] = sum(g, {0});
  if (c.needs_grad(1)) gi[1] = matmul(g, transpose(b, 0, 1));
  if (c.needs_grad(2))  // in mat2's layout, as matmul's gradient makes it
    gi[2] = column_major(b) ? transpose(matmul(transpose(g, 0, 1), a), 0, 1)
                            : matmul(transpose(a, 0, 1), g);
}

}  // namespace

void register_linalg_rules(OpDef* t) {
  t[int(OpId::MatMul)].infer = infer_matmul;
  set_grad(t, OpId::MatMul, grad_matmul, kSaveIn0 | kSaveIn1);
  t[int(OpId::MatMul)].autocast = AutocastClass::Lower;  // a product (Note [Autocast])
  t[int(OpId::Addmv)].infer = infer_addmv;
  set_grad(t, OpId::Addmv, grad_addmv, kSaveIn1 | kSaveIn2);
  t[int(OpId::Addmv)].autocast = AutocastClass::Lower;
  t[int(OpId::Addmm)].infer = infer_addmm;
  set_grad(t, OpId::Addmm, grad_addmm, kSaveIn1 | kSaveIn2);
  t[int(OpId::Addmm)].autocast = AutocastClass::Lower;
}

}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  const Tensor* in[] = {&a, &b};
  return detail::call(OpId::MatMul, TensorRefs(in, 2), {});
}

// One op where it can be (Note [addmv]); otherwise its composite, as PyTorch computes it.
Tensor addmv(const Tensor& input, const Tensor& mat, const Tensor& vec, double beta, double alpha,
             std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(input.defined() && mat.defined() && vec.defined(),
                   "[addmv] input, mat and vec must be defined tensors");
  DUET_CHECK_SHAPE(mat.dim() == 2 && vec.dim() == 1,
                   "[addmv] needs mat (n, k) and vec (k), got {} and {}", mat.sizes(), vec.sizes());
  if (beta == 1 && alpha == 1 && input.dim() == 1 && input.dtype() == mat.dtype() &&
      detail::size_is(input, 0, detail::sym_dim(mat, 0), "addmv")) {
    const Tensor* in[] = {&input, &mat, &vec};
    return detail::call(OpId::Addmv, TensorRefs(in, 3), {});
  }
  Tensor product = matmul(mat, vec);
  if (alpha != 1) product = product * alpha;
  DUET_CHECK_SHAPE(
      input.dim() <= 1 &&
          (input.dim() == 0 || input.sizes()[0] == 1 || input.sizes()[0] == product.sizes()[0]),
      "[addmv] input {} does not broadcast to ({})", input.sizes(), product.sizes()[0]);
  if (beta == 0)  // zeros in the input's place: no value of it (NaN) reaches the result, and
                  // its gradient is zero, as PyTorch's is
    return masked_fill(input, ones({}, Options().dtype(DType::b8).device(input.device())), 0) +
           product;
  return (beta == 1 ? input : input * beta) + product;
}

// One op where it can be (Note [addmm]); otherwise its composite, as PyTorch computes it.
Tensor addmm(const Tensor& input, const Tensor& mat1, const Tensor& mat2, double beta, double alpha,
             std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(input.defined() && mat1.defined() && mat2.defined(),
                   "[addmm] input, mat1 and mat2 must be defined tensors");
  DUET_CHECK_SHAPE(mat1.dim() == 2 && mat2.dim() == 2,
                   "[addmm] needs mat1 (m, k) and mat2 (k, n), got {} and {}", mat1.sizes(),
                   mat2.sizes());
  DUET_CHECK_DTYPE(
      mat1.dtype() == mat2.dtype() && input.dtype() == mat1.dtype() && mat1.dtype() != DType::b8,
      "[addmm] input, mat1 and mat2 must share a dtype other than b8, got {}, {} and {}",
      input.dtype(), mat1.dtype(), mat2.dtype());
  if (beta == 1 && alpha == 1 && input.dim() == 1 &&
      detail::size_is(input, 0, detail::sym_dim(mat2, 1), "addmm")) {
    const Tensor* in[] = {&input, &mat1, &mat2};
    return detail::call(OpId::Addmm, TensorRefs(in, 3), {});
  }
  Tensor product = matmul(mat1, mat2);
  if (alpha != 1) product = product * alpha;
  bool fits = input.dim() <= 2;  // each of its dims 1 or the product's, counted from the right
  for (int64_t d = 1; fits && d <= input.dim(); ++d) {
    const int64_t s = input.sizes()[input.dim() - d];
    fits = s == 1 || s == product.sizes()[2 - d];
  }
  DUET_CHECK_SHAPE(fits, "[addmm] input {} does not broadcast to {}", input.sizes(),
                   product.sizes());
  if (beta == 0)  // zeros in the input's place, as in addmv
    return masked_fill(input, ones({}, Options().dtype(DType::b8).device(input.device())), 0) +
           product;
  return (beta == 1 ? input : input * beta) + product;
}

}  // namespace duet
