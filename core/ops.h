// duet: the public ops. Each builds a call to a primitive in core/ops.def, or composes
// primitives (mean, transpose, squeeze, ...). Errors name the op: "[add] shapes (3) and (4)
// cannot broadcast". Broadcasting and type promotion follow PyTorch.
//
// Elementwise ops have overloads for rvalue tensors: the buffer of a temporary that nobody else
// holds is reused for the result, so `tanh(x * 1.5 + 0.5)` allocates one buffer, not three.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace duet {

#define DUET_DECLARE_UNARY(name) \
  Tensor name(const Tensor& x);  \
  Tensor name(Tensor&& x);
/// Elementwise math. Integer and bool inputs of the float functions give f32 results.
DUET_DECLARE_UNARY(neg)
DUET_DECLARE_UNARY(exp)
DUET_DECLARE_UNARY(log)
DUET_DECLARE_UNARY(sqrt)
DUET_DECLARE_UNARY(rsqrt)
DUET_DECLARE_UNARY(abs)
DUET_DECLARE_UNARY(sin)
DUET_DECLARE_UNARY(cos)
DUET_DECLARE_UNARY(tanh)
DUET_DECLARE_UNARY(sigmoid)
DUET_DECLARE_UNARY(relu)
#undef DUET_DECLARE_UNARY

#define DUET_DECLARE_BINARY(name)                \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(Tensor&& a, const Tensor& b);      \
  Tensor name(const Tensor& a, Tensor&& b);      \
  Tensor name(Tensor&& a, Tensor&& b);           \
  Tensor name(const Tensor& a, Scalar b);        \
  Tensor name(Tensor&& a, Scalar b);             \
  Tensor name(Scalar a, const Tensor& b);        \
  Tensor name(Scalar a, Tensor&& b);
/// Binary elementwise ops with broadcasting. div always gives a floating result.
DUET_DECLARE_BINARY(add)
DUET_DECLARE_BINARY(sub)
DUET_DECLARE_BINARY(mul)
DUET_DECLARE_BINARY(div)
DUET_DECLARE_BINARY(maximum)
DUET_DECLARE_BINARY(minimum)
/// x raised to the power p, elementwise.
DUET_DECLARE_BINARY(pow)
#undef DUET_DECLARE_BINARY

#define DUET_DECLARE_COMPARE(name)               \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(const Tensor& a, Scalar b);        \
  Tensor name(Scalar a, const Tensor& b);
/// Comparisons with broadcasting; the result is b8.
DUET_DECLARE_COMPARE(lt)
DUET_DECLARE_COMPARE(le)
DUET_DECLARE_COMPARE(gt)
DUET_DECLARE_COMPARE(ge)
DUET_DECLARE_COMPARE(eq)
DUET_DECLARE_COMPARE(ne)
#undef DUET_DECLARE_COMPARE

/// Elementwise selection: cond (b8) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
/// clamp(x, lo, hi) = minimum(maximum(x, lo), hi).
Tensor clamp(const Tensor& x, Scalar lo, Scalar hi);

/// Reductions over `dims` (all when empty). sum of integers gives i64; mean needs floats.
Tensor sum(const Tensor& x, Dims dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, Dims dims = {}, bool keepdim = false);
/// Largest / smallest values over dims (values only; NaN propagates).
Tensor max(const Tensor& x, Dims dims = {}, bool keepdim = false);
Tensor min(const Tensor& x, Dims dims = {}, bool keepdim = false);

/// torch.matmul: 1-D operands, batched and broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);

/// A view with a new shape when the strides allow, else a copy. One dim may be -1.
Tensor reshape(const Tensor& x, Shape shape);
/// Swaps two dims (a view).
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
/// Reorders dims (a view).
Tensor permute(const Tensor& x, Dims order);
/// Removes a size-1 dim (a view); a dim of another size is left as it is, as in PyTorch.
Tensor squeeze(const Tensor& x, int64_t dim);
/// Removes every size-1 dim.
Tensor squeeze(const Tensor& x);
/// Inserts a size-1 dim at `dim` (a view).
Tensor unsqueeze(const Tensor& x, int64_t dim);
/// Broadcasts to `shape` without copying; -1 keeps a dim.
Tensor expand(const Tensor& x, Shape shape);
/// Elements start, start+step, ... before end along dim (a view). Bounds clamp as in Python.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);

/// Operators: the ops add, sub, mul, div, neg, lt, le, gt, ge, eq, ne.
#define DUET_DECLARE_OPERATOR(sym)                       \
  Tensor operator sym(const Tensor& a, const Tensor& b); \
  Tensor operator sym(Tensor&& a, const Tensor& b);      \
  Tensor operator sym(const Tensor& a, Tensor&& b);      \
  Tensor operator sym(Tensor&& a, Tensor&& b);           \
  Tensor operator sym(const Tensor& a, Scalar b);        \
  Tensor operator sym(Tensor&& a, Scalar b);             \
  Tensor operator sym(Scalar a, const Tensor& b);        \
  Tensor operator sym(Scalar a, Tensor&& b);
DUET_DECLARE_OPERATOR(+)
DUET_DECLARE_OPERATOR(-)
DUET_DECLARE_OPERATOR(*)
DUET_DECLARE_OPERATOR(/)
#undef DUET_DECLARE_OPERATOR
Tensor operator-(const Tensor& x);
Tensor operator-(Tensor&& x);
#define DUET_DECLARE_CMP_OPERATOR(sym)                   \
  Tensor operator sym(const Tensor& a, const Tensor& b); \
  Tensor operator sym(const Tensor& a, Scalar b);        \
  Tensor operator sym(Scalar a, const Tensor& b);
DUET_DECLARE_CMP_OPERATOR(<)
DUET_DECLARE_CMP_OPERATOR(<=)
DUET_DECLARE_CMP_OPERATOR(>)
DUET_DECLARE_CMP_OPERATOR(>=)
DUET_DECLARE_CMP_OPERATOR(==)
DUET_DECLARE_CMP_OPERATOR(!=)
#undef DUET_DECLARE_CMP_OPERATOR

// Creation
/// A 1-D tensor of the values (f32 unless Options say otherwise).
Tensor tensor(std::vector<double> values, Options options = {});
/// A tensor of the values in row-major order; numel must match.
Tensor tensor(std::vector<double> values, Shape shape, Options options = {});
/// A 0-d tensor; its dtype follows the scalar's kind unless Options say otherwise.
Tensor scalar(Scalar value, Options options = {});
Tensor zeros(Shape shape, Options options = {});
Tensor ones(Shape shape, Options options = {});
Tensor full(Shape shape, Scalar value, Options options = {});
/// 0, 1, ..., n-1; dtype i64 unless Options say otherwise.
Tensor arange(int64_t n, Options options = {});
/// The n x n identity.
Tensor eye(int64_t n, Options options = {});

/// Threads used by CPU kernels (OpenMP) and by the BLAS.
void set_num_threads(int n);
int get_num_threads();

}  // namespace duet
