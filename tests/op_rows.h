// duet tests: the op table as test rows, so that every op test derives from one table. One or
// more rows per primitive in core/ops.def, plus the composites. Each row says how to call the op
// through the public API, a float64 reference written independently on plain doubles, the input
// domain, the dtypes and the tolerance; the runners in test_ops.cpp and test_reduce_matmul.cpp
// derive the samples (0-d, empty, broadcast, non-contiguous, large) from the rows.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "util.h"

namespace duet::test {

/// The dtype of an elementwise result, given the (common) dtype of the inputs.
enum class ResultKind {
  Same,             ///< the input dtype
  FloatIfNotFloat,  ///< f32 for integer and bool inputs (exp, div, ...)
  Bool,             ///< b8 (comparisons)
};
DType result_dtype(ResultKind kind, DType in);

/// An elementwise op (arity 1 to 3) with broadcasting.
struct ElementwiseRow {
  const char* name;
  OpId op;         ///< the primitive the call must dispatch
  bool composite;  ///< true: built from primitives (does not count as the primitive's row)
  int arity;
  Tensor (*fn)(const std::vector<Tensor>& in);
  /// The same op with in[0] passed as an rvalue (buffer reuse); null when there is no overload.
  Tensor (*fn_rvalue)(std::vector<Tensor> in);
  /// The op with its last operand a Scalar; null when there is no overload.
  Tensor (*fn_scalar)(const std::vector<Tensor>& in, Scalar last);
  /// The op with its first operand a Scalar (binary ops); null when there is no overload.
  Tensor (*fn_lscalar)(Scalar first, const std::vector<Tensor>& rest);
  double (*ref)(const double* x);
  std::vector<Domain> domains;  ///< one per input
  std::vector<DType> dtypes;    ///< dtypes of the inputs (a where's condition is always b8)
  ResultKind result;
  double rtol32 = 1e-6, atol32 = 1e-6;  ///< for f32 results; f64 uses 1e-12, others exact
  bool cond_first = false;              ///< input 0 is a b8 condition (where)
  /// Where the gradient is checked, when `domains` reaches a point the op is not
  /// differentiable at (sqrt at 0); empty: `domains`. The gradient sweep keeps values off 0
  /// and off each other, so kinks and ties at 0 need no entry here (test_op_grads.cpp).
  std::vector<Domain> grad_domains = {};
};
const std::vector<ElementwiseRow>& elementwise_rows();
/// Whether the row's result carries a gradient: its primitive is differentiable and its result
/// is not b8 (logical_and is a product of b8 truths).
bool differentiable(const ElementwiseRow& r);
/// The rows of erf, log_sigmoid and the elementwise composites gelu and silu (op_rows_nn.cpp),
/// and of the piecewise activations (activation_rows()).
const std::vector<ElementwiseRow>& special_function_rows();
/// leaky_relu, elu, selu, celu, hardtanh, relu6, hardsigmoid, hardswish, mish
/// (op_rows_activation.cpp).
std::vector<ElementwiseRow> activation_rows();
/// reciprocal, square, clamp_min, clamp_max, lerp, addcmul, addcdiv and the logical ops
/// (op_rows_math.cpp), part of special_function_rows().
std::vector<ElementwiseRow> pointwise_rows();

/// Cast and Copy: x converted to another dtype.
struct ConversionRow {
  const char* name;
  OpId op;
  bool composite;    ///< built from primitives (does not count as the primitive's row)
  bool keeps_dtype;  ///< ignores `to` (clone, contiguous, to_device)
  Tensor (*fn)(const Tensor& x, DType to);
};
const std::vector<ConversionRow>& conversion_rows();

enum class ReduceKind { Sum, Max, Min, Mean };
/// A reduction over dims with keepdim.
struct ReduceRow {
  const char* name;
  OpId op;
  bool composite;
  Tensor (*fn)(const Tensor& x, Dims dims, bool keepdim);
  ReduceKind kind;
  std::vector<DType> dtypes;
};
const std::vector<ReduceRow>& reduce_rows();

/// A view op: the result reads input element offset + sum(index[d] * strides[d]), where the
/// offset and strides count in the input's row-major (logical) order.
struct ViewRow {
  const char* name;
  OpId op;
  bool composite;
  Tensor (*fn)(const Tensor& x);
  Shape in, out;
  int64_t offset;
  std::vector<int64_t> strides;
  bool always_view;  ///< a view for every input layout (reshape copies when no view exists)
};
const std::vector<ViewRow>& view_rows();

/// slice_scatter(base, src, dim, start, end, step): a copy of base with src written into the
/// slice that slice(base, dim, start, end, step) selects; src has the slice's shape.
struct ScatterRow {
  const char* name;
  Shape base;
  int64_t dim, start, end, step;
  Shape src;
};
const std::vector<ScatterRow>& scatter_rows();

/// A creation function (sources: Full, Arange).
struct SourceRow {
  const char* name;
  OpId op;
  Tensor (*fn)();
  Shape shape;
  DType dtype;
  std::vector<double> want;
};
const std::vector<SourceRow>& source_rows();

/// A matmul case: operand shapes and layouts (a transposed or strided layout where given).
struct MatmulRow {
  const char* name;
  Shape a, b;
  Layout la = Layout::Contiguous, lb = Layout::Contiguous;
};
const std::vector<MatmulRow>& matmul_rows();

/// Row-major values of each input of an OpRow.
using Values = std::vector<std::vector<double>>;

/// An op that is not elementwise (indexing, joining, images, normalizations, losses, random
/// draws): one call on inputs of fixed shapes, with index tensors and other constants built into
/// the call, and a float64 reference on the inputs' row-major values. The runners derive the
/// samples: every dtype, contiguous, transposed, strided, offset and expanded inputs, gradcheck
/// in float64, two backwards that agree bit for bit, and zero-size gradients.
struct OpRow {
  std::string name;
  OpId op;                    ///< the primitive the call must dispatch
  bool composite;             ///< true: built from primitives (not the primitive's own row)
  std::vector<Shape> shapes;  ///< the inputs that take random values (none for random draws)
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::function<std::vector<double>(const Values&)> ref;  ///< the result, row-major
  Shape out;
  std::vector<DType> dtypes = {DType::f32, DType::f64};  ///< of every input, in turn
  std::vector<Domain> domains = {Domain{}};              ///< per input; the last one repeats
  bool index_result = false;  ///< the result is i64 (argmax); else the inputs' dtype
  double tol32 = 1e-5;        ///< rtol and atol of f32 results; f64 1e-12; integers exact
  /// The bf16/f16 columns' rtol, as a multiple of torch.testing's: 1 for one rounding; more for a
  /// composite that rounds intermediates (a chain of products, each rounded to the low dtype).
  double low_rtol_scale = 1;
  bool grad = true;  ///< in the gradient sweep (inputs of at most 24 elements); false: forward only
};
const std::vector<OpRow>& index_rows();  ///< gather, scatter_add, cat, argmax and composites
const std::vector<OpRow>& nn_rows();     ///< softmax family, linear, layer_norm, losses, dropout
/// glu, prelu, rms_norm, group_norm, normalize, cosine_similarity, l1_loss, smooth_l1_loss,
/// huber_loss, kl_div, mse_loss's reductions (op_rows_activation.cpp), part of nn_rows().
std::vector<OpRow> norm_loss_rows();
const std::vector<OpRow>& image_rows();  ///< unfold, fold, conv2d, pooling
/// conv3d and the 3-D poolings (op_rows_volume.cpp), part of image_rows().
std::vector<OpRow> volume_rows();
const std::vector<OpRow>& random_rows();  ///< rand, randn, randint
/// masked_fill, tril, triu, split, chunk, flip, roll, pad, cumsum, var, std, amax, amin,
/// max/min_with_indices, sort, argsort, topk, nll_loss, einsum (op_rows_more.cpp)
const std::vector<OpRow>& more_rows();
/// lstm_step and its gradient (op_rows_step.cpp), part of more_rows().
std::vector<OpRow> step_rows();
/// prod, cumprod, all, any, vector_norm, norm and cdist (op_rows_math.cpp), part of more_rows().
std::vector<OpRow> math_rows();
/// repeat, tile, repeat_interleave, movedim, swapaxes, swapdims, unflatten, unbind,
/// broadcast_to, outer, bmm, baddbmm, diag, diag_embed, trace, diff, meshgrid, hstack, vstack
/// (op_rows_math.cpp), part of more_rows().
std::vector<OpRow> arrange_rows();
/// All of the above.
const std::vector<OpRow>& op_rows();

/// Random draws as kernels/random.cpp documents them, from an independent Philox4x32-10: element
/// i of a draw at generator state {seed, offset} (dist 0 uniform, 1 normal, 2 integers < high).
double ref_draw(int dist, DType dtype, int64_t high, uint64_t seed, uint64_t offset, int64_t i);
/// One Philox4x32-10 block: a 128-bit counter and a 64-bit key, as Random123 defines it.
std::vector<uint32_t> ref_philox(const std::vector<uint32_t>& counter,
                                 const std::vector<uint32_t>& key);

/// Reference matmul (torch.matmul's rules, 1-D operands included) on row-major doubles.
std::vector<double> ref_matmul(const std::vector<double>& a, const Shape& as,
                               const std::vector<double>& b, const Shape& bs, Shape* out);

/// Reference slice_scatter on row-major doubles: bounds as Python normalises them (negative
/// counts from the end, then clamped), without duet's builders.
std::vector<double> ref_slice_scatter(const std::vector<double>& base, const Shape& bs,
                                      const std::vector<double>& src, const ScatterRow& row);

/// Reference reduction: dims already wrapped (empty: all).
std::vector<double> ref_reduce(ReduceKind kind, const std::vector<double>& x, const Shape& s,
                               const std::vector<int64_t>& dims, bool keepdim, Shape* out);
/// The shape of a reduction of shape s over dims (already wrapped; empty: all).
Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim);

}  // namespace duet::test
