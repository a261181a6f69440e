// duet: the public ops. Each builds a call to a primitive in core/ops.def, or composes
// primitives (mean, transpose, squeeze, ...). Errors name the op: "[add] shapes (3) and (4)
// cannot broadcast". Broadcasting and type promotion follow PyTorch.
//
// Elementwise ops have overloads for rvalue tensors: the buffer of a temporary that nobody else
// holds is reused for the result, so `tanh(x * 1.5 + 0.5)` allocates one buffer, not three.
#pragma once

#include <string_view>
#include <vector>

#include "core/call_site.h"
#include "core/tensor.h"

namespace duet {

/// Elementwise math, one function per row of core/elementwise.def (docs/ops.md says what
/// each computes). Integer and bool inputs of the float functions (exp, sin, ...) give f32
/// results; neg, abs, relu and floor keep the dtype and refuse b8.
#define DUET_UNARY(Name, name, math, doc)  \
  Tensor name(const Tensor& x, DUET_HERE); \
  Tensor name(Tensor&& x, DUET_HERE);
#include "core/elementwise.def"

#define DUET_DECLARE_BINARY(name)                           \
  Tensor name(const Tensor& a, const Tensor& b, DUET_HERE); \
  Tensor name(Tensor&& a, const Tensor& b, DUET_HERE);      \
  Tensor name(const Tensor& a, Tensor&& b, DUET_HERE);      \
  Tensor name(Tensor&& a, Tensor&& b, DUET_HERE);           \
  Tensor name(const Tensor& a, Scalar b, DUET_HERE);        \
  Tensor name(Tensor&& a, Scalar b, DUET_HERE);             \
  Tensor name(Scalar a, const Tensor& b, DUET_HERE);        \
  Tensor name(Scalar a, Tensor&& b, DUET_HERE);
/// Binary elementwise ops with broadcasting and PyTorch's type promotion, one per binary row
/// of core/elementwise.def. div always gives a floating result.
#define DUET_BINARY(Name, name, doc) DUET_DECLARE_BINARY(name)
#include "core/elementwise.def"
#undef DUET_DECLARE_BINARY

#define DUET_DECLARE_COMPARE(name)                          \
  Tensor name(const Tensor& a, const Tensor& b, DUET_HERE); \
  Tensor name(const Tensor& a, Scalar b, DUET_HERE);        \
  Tensor name(Scalar a, const Tensor& b, DUET_HERE);
/// Comparisons with broadcasting; the result is b8.
#define DUET_COMPARE(Name, name, expr, doc) DUET_DECLARE_COMPARE(name)
#include "core/elementwise.def"
#undef DUET_DECLARE_COMPARE

/// Elementwise tests of floating values, b8 results: NaN, an infinity (either sign), neither.
/// Integer and b8 tensors hold no NaN and no infinity.
Tensor isnan(const Tensor& x, DUET_HERE);
Tensor isinf(const Tensor& x, DUET_HERE);
Tensor isfinite(const Tensor& x, DUET_HERE);

/// Elementwise selection: cond (b8) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, DUET_HERE);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, DUET_HERE);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, DUET_HERE);
/// clamp(x, lo, hi): lo where x < lo, then hi where that exceeds hi, else x (two where() calls,
/// not maximum/minimum). NaN passes through (as torch.clamp); with lo > hi every element becomes
/// hi. The gradient is 1 on the closed interval [lo, hi] and 0 outside it. The bounds promote
/// like Scalar operands: an integer x with floating bounds gives a floating result.
Tensor clamp(const Tensor& x, Scalar lo, Scalar hi, DUET_HERE);

/// Reductions over `dims` (all when empty). sum of integers gives i64; mean needs floats.
Tensor sum(const Tensor& x, Dims dims = {}, bool keepdim = false, DUET_HERE);
Tensor mean(const Tensor& x, Dims dims = {}, bool keepdim = false, DUET_HERE);
/// Largest / smallest values over dims (values only; NaN propagates).
Tensor max(const Tensor& x, Dims dims = {}, bool keepdim = false, DUET_HERE);
Tensor min(const Tensor& x, Dims dims = {}, bool keepdim = false, DUET_HERE);

/// torch.matmul: 1-D operands, batched and broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b, DUET_HERE);

/// A view with a new shape when the strides allow, else a copy. One dim may be -1.
Tensor reshape(const Tensor& x, Shape shape, DUET_HERE);
/// Swaps two dims (a view).
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1, DUET_HERE);
/// Reorders dims (a view).
Tensor permute(const Tensor& x, Dims order, DUET_HERE);
/// Removes a size-1 dim (a view); a dim of another size is left as it is, as in PyTorch.
Tensor squeeze(const Tensor& x, int64_t dim, DUET_HERE);
/// Removes every size-1 dim.
Tensor squeeze(const Tensor& x, DUET_HERE);
/// Inserts a size-1 dim at `dim` (a view).
Tensor unsqueeze(const Tensor& x, int64_t dim, DUET_HERE);
/// Broadcasts to `shape` without copying; -1 keeps a dim.
Tensor expand(const Tensor& x, Shape shape, DUET_HERE);
/// Elements start, start+step, ... before end along dim (a view). Bounds clamp as in Python.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1, DUET_HERE);

/// A copy of base with src written into base's slice (as slice() selects it); the gradient of
/// slice. src must have the slice's shape and base's dtype.
Tensor slice_scatter(const Tensor& base, const Tensor& src, int64_t dim, int64_t start, int64_t end,
                     int64_t step = 1, DUET_HERE);

// Indexing and joining
/// out[p] = x[p with `dim` replaced by index[p]]; index is i64 of x's rank (torch.gather).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, DUET_HERE);
/// A copy of base with src[p] added at [p with `dim` replaced by index[p]] (the adjoint of
/// gather; repeated indices accumulate).
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src,
                   DUET_HERE);
/// The entries of x at a 1-D i64 index along dim.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, DUET_HERE);
/// Rows of weight (num_embeddings, dim) for i64 indices of any shape: indices.shape + (dim).
Tensor embedding(const Tensor& weight, const Tensor& indices, DUET_HERE);
/// Joins tensors along an existing dim; dtypes promote.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0, DUET_HERE);
/// Joins equal-shaped tensors along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0, DUET_HERE);
/// Index (i64) of the first largest / smallest value along dim; NaN counts as the extreme.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false, DUET_HERE);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false, DUET_HERE);

// Math composites and special functions
/// Numerically stable softmax, log_softmax and logsumexp along dim (an empty dim gives an empty
/// result, and logsumexp -inf, as in PyTorch).
Tensor softmax(const Tensor& x, int64_t dim, DUET_HERE);
Tensor log_softmax(const Tensor& x, int64_t dim, DUET_HERE);
Tensor logsumexp(const Tensor& x, int64_t dim, DUET_HERE);
/// x * Phi(x) with the exact erf (PyTorch's default gelu).
Tensor gelu(const Tensor& x, DUET_HERE);
/// gelu with PyTorch's `approximate`: "none" is the erf form above, "tanh" is
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any other string is a ValueError.
Tensor gelu(const Tensor& x, std::string_view approximate, DUET_HERE);
/// x * sigmoid(x).
Tensor silu(const Tensor& x, DUET_HERE);
/// log(1 + e^(beta * x)) / beta, and x itself where beta * x > threshold (PyTorch's softplus,
/// with its defaults). beta must be finite and nonzero.
Tensor softplus(const Tensor& x, double beta = 1, double threshold = 20, DUET_HERE);

// Neural-network ops
/// x @ weight^T + bias, with weight (out, in).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, DUET_HERE);
/// 2-D convolution: x (N, C, H, W), w (O, C, k, k), bias (O); square stride and zero padding.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = {}, int64_t stride = 1,
              int64_t padding = 0, DUET_HERE);
/// conv2d's gradient of its input (PyTorch's torch.nn.grad.conv2d_input): the (N, C, height,
/// width) gradient of x for the output gradient `grad` (N, O, Ho, Wo) of conv2d(x, w, {},
/// stride, padding).
Tensor conv2d_input_grad(const Tensor& grad, const Tensor& w, int64_t height, int64_t width,
                         int64_t stride = 1, int64_t padding = 0, DUET_HERE);
/// conv2d's gradient of its weight (torch.nn.grad.conv2d_weight): the (O, C, k, k) gradient of
/// w for the output gradient `grad` (N, O, Ho, Wo) of conv2d(x, w, {}, stride, padding).
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& grad, int64_t kernel, int64_t stride = 1,
                          int64_t padding = 0, DUET_HERE);
/// Max / average over k x k windows; stride 0 means stride = kernel.
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, DUET_HERE);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = 0, DUET_HERE);
/// im2col: (N, C, H, W) -> (N, C*k*k, L), rows ordered (c, ki, kj) as torch's unfold.
Tensor unfold(const Tensor& x, int64_t kernel, int64_t stride = 1, int64_t padding = 0, DUET_HERE);
/// col2im, the adjoint of unfold: (N, C*k*k, L) -> (N, C, height, width), overlaps summed.
Tensor fold(const Tensor& cols, int64_t height, int64_t width, int64_t kernel, int64_t stride = 1,
            int64_t padding = 0, DUET_HERE);
/// Normalizes over the trailing `normalized` dims, then scales and shifts.
Tensor layer_norm(const Tensor& x, Shape normalized, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5, DUET_HERE);
/// torch.nn.functional.scaled_dot_product_attention: softmax(q k^T * scale + mask) v, for
/// q (..., L, E), k (..., S, E) and v (..., S, Ev), batch dims broadcast as in matmul; the
/// result is (..., L, Ev). scale 0 means 1/sqrt(E). attn_mask broadcasts to (..., L, S): a b8
/// mask keeps the scores where it is true (the others become -inf), a floating mask (q's dtype)
/// is added to them. is_causal keeps j <= i (the top-left triangle, as torch's tril), built
/// from arange comparisons of the sizes, so a symbolic L or S stays symbolic under compile; it
/// cannot be combined with attn_mask. A row whose scores are all masked is NaN, as in PyTorch.
/// A composite of matmul, where and softmax: differentiable, compiled and fused like them.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = {}, bool is_causal = false,
                                    double scale = 0, DUET_HERE);
/// Zeroes elements with probability p and scales the rest by 1/(1-p) when training.
Tensor dropout(const Tensor& x, double p, bool training, DUET_HERE);
/// Losses reduce by the mean, as PyTorch's default.
Tensor mse_loss(const Tensor& pred, const Tensor& target, DUET_HERE);
/// Softmax cross-entropy of logits (N, C) against i64 class indices (N).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, DUET_HERE);
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets, DUET_HERE);

// Randomness: Philox, with explicit state (see core/ops/random.cpp)
/// Uniform [0, 1), standard normal, and integers in [0, high) (i64 unless Options say; high
/// must be exact in the dtype: at most 2^31 for i32, 2^24 for f32, 2^53 for f64).
Tensor rand(Shape shape, Options options = {}, DUET_HERE);
Tensor randn(Shape shape, Options options = {}, DUET_HERE);
Tensor randint(int64_t high, Shape shape, Options options = {}, DUET_HERE);
/// Reseeds the default generator of every device (the CPU and each CUDA device): the same
/// seed gives the same numbers, and the same uniform bits on every device.
void manual_seed(uint64_t seed);

/// Prints t's values at run time in both faces, in program order, as jax.debug.print does:
/// fmt::format(format, t) and a newline ("{}" prints as `std::cout << t`; "h = {}" adds a
/// label). Under compile it is an op of the graph, so each call of the compiled function
/// prints the values of that call; a print inside a cond, scan or while_loop body prints each
/// time the body runs. A CUDA tensor is copied to the host first.
void print(const Tensor& t, std::string format = "{}", DUET_HERE);

/// Operators: the ops add, sub, mul, div, neg, lt, le, gt, ge, eq, ne.
// Operators take their first tensor operand as a Located, which carries the place of the
// expression (Note [Call sites] in core/call_site.h); an rvalue operand stays an rvalue.
#define DUET_DECLARE_OPERATOR(sym)                 \
  Tensor operator sym(Located a, const Tensor& b); \
  Tensor operator sym(Located a, Tensor&& b);      \
  Tensor operator sym(Located a, Scalar b);        \
  Tensor operator sym(Scalar a, Located b);
DUET_DECLARE_OPERATOR(+)
DUET_DECLARE_OPERATOR(-)
DUET_DECLARE_OPERATOR(*)
DUET_DECLARE_OPERATOR(/)
#undef DUET_DECLARE_OPERATOR
Tensor operator-(Located x);
#define DUET_DECLARE_CMP_OPERATOR(sym)             \
  Tensor operator sym(Located a, const Tensor& b); \
  Tensor operator sym(Located a, Scalar b);        \
  Tensor operator sym(Scalar a, Located b);
DUET_DECLARE_CMP_OPERATOR(<)
DUET_DECLARE_CMP_OPERATOR(<=)
DUET_DECLARE_CMP_OPERATOR(>)
DUET_DECLARE_CMP_OPERATOR(>=)
DUET_DECLARE_CMP_OPERATOR(==)
DUET_DECLARE_CMP_OPERATOR(!=)
#undef DUET_DECLARE_CMP_OPERATOR

// Creation
/// A 1-D tensor of the values (f32 unless Options say otherwise).
Tensor tensor(std::vector<double> values, Options options = {}, DUET_HERE);
/// A tensor of the values in row-major order; numel must match.
Tensor tensor(std::vector<double> values, Shape shape, Options options = {}, DUET_HERE);
/// A 0-d tensor; its dtype follows the scalar's kind unless Options say otherwise.
Tensor scalar(Scalar value, Options options = {}, DUET_HERE);
Tensor zeros(Shape shape, Options options = {}, DUET_HERE);
Tensor ones(Shape shape, Options options = {}, DUET_HERE);
Tensor full(Shape shape, Scalar value, Options options = {}, DUET_HERE);
/// 0, 1, ..., n-1; dtype i64 unless Options say otherwise.
Tensor arange(int64_t n, Options options = {}, DUET_HERE);
/// The n x n identity.
Tensor eye(int64_t n, Options options = {}, DUET_HERE);

struct Attrs;
namespace detail {
// Builders taking sizes as SymInts: what library code uses to make a shape from the shape of a
// traced tensor that may have symbolic dims (Note [Symbolic dims] in trace/compile.h). With
// concrete dims they are reshape, expand and full.
Tensor reshape_dims(const Tensor& x, const SymDims& dims);
Tensor expand_dims(const Tensor& x, const SymDims& dims);
Tensor full_dims(const SymDims& dims, Scalar value, Options options);
/// arange(n) for a size n that may be symbolic (an Arange whose length follows the symbol).
Tensor arange_dims(const SymInt& n, Options options);
/// The attention weights of scaled_dot_product_attention, softmax(q k^T * scale + mask) over
/// (..., L, S), with its checks of q, k and the mask; errors name `op`. For layers that return
/// the weights (nn::MultiheadAttention).
Tensor attention_weights(const char* op, const Tensor& q, const Tensor& k, const Tensor& attn_mask,
                         bool is_causal, double scale);
/// A 0-d tensor of `dtype` holding the size n: a wrapped number when n is concrete (it goes with
/// tensors on any device), else a Full on `device` whose value is symbolic.
Tensor size_scalar(const SymInt& n, DType dtype, Device device = Device::cpu());
/// slice and slice_scatter with the attributes of a recorded Slice (gradient rules).
Tensor slice_with(const Tensor& x, const Attrs& a);
Tensor slice_scatter_with(const Tensor& base, const Tensor& src, const Attrs& a);
}  // namespace detail

/// Threads used by CPU kernels (OpenMP) and by the BLAS.
void set_num_threads(int n);
int get_num_threads();

}  // namespace duet

// The composites a PyTorch user reaches for next (masked_fill, split, pad, sort, einsum, ...).
#include "core/ops_more.h"
