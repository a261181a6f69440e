// duet: the public ops. Each builds a call to a primitive in core/ops.def, or composes
// primitives (mean, transpose, squeeze, ...). Errors name the op: "[add] shapes (3) and (4)
// cannot broadcast". Broadcasting and type promotion follow PyTorch.
//
// Every op is declared once, as a row: the elementwise ops in core/elementwise.def, the others in
// core/api.def, whose docs say what each computes (docs/ops.md lists them all). Those that are
// also Tensor methods are declared in core/tensor.h; this header declares the rest, and the
// operators.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "core/call_site.h"
#include "core/loss_options.h"
#include "core/tensor.h"

namespace duet {

// The elementwise ops and the kind-Method rows of core/api.def are declared in core/tensor.h,
// before class Tensor, whose methods call them. Here: the other rows of core/api.def.
#define DUET_API_DECLARE_Method(ret, name, params)
#define DUET_API_DECLARE_Free(ret, name, params) \
  DUET_API_STRIP ret name(DUET_API_STRIP params, DUET_HERE);
#define DUET_API_DECLARE_Like(ret, name, params) DUET_API_STRIP ret name params;
#define DUET_API(kind, ret, name, params, args, doc) DUET_API_DECLARE_##kind(ret, name, params)
#include "core/api.def"
#undef DUET_API_DECLARE_Method
#undef DUET_API_DECLARE_Free
#undef DUET_API_DECLARE_Like

/// Reseeds the default generator of every device (the CPU and each CUDA device): the same
/// seed gives the same numbers, and the same uniform bits on every device.
void manual_seed(uint64_t seed);

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
/// attention_weights' checks of the scale and the mask (errors name `op`).
void check_attention_options(const char* op, const Tensor& q, const Tensor& attn_mask,
                             bool is_causal, double scale);
/// scaled_dot_product_attention as matmul, softmax and matmul (the primitive's reference, and
/// its path where the fused kernels do not apply: Note [Attention] in core/ops/attention.cpp).
Tensor attention_composite(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& attn_mask, bool is_causal, double scale);
/// Class-index targets' negative log-likelihoods: -log_probs[.., target, ..] along `cdim`, 0
/// where the target is ignore_index, each times its class's weight where `weight` is given; and
/// those weights (1 where not given, 0 where ignored), the weighted mean's denominators.
/// nll_loss's and cross_entropy's (the targets' shape checked by the caller).
std::pair<Tensor, Tensor> class_nll(const Tensor& log_probs, const Tensor& target,
                                    const Tensor& weight, int64_t ignore_index, int64_t cdim);
/// The largest head dim (E and F) the fused attention kernels take.
inline constexpr int64_t kMaxHeadDim = 256;
/// A 0-d tensor of `dtype` holding the size n: a wrapped number when n is concrete (it goes with
/// tensors on any device), else a Full on `device` whose value is symbolic.
Tensor size_scalar(const SymInt& n, DType dtype, Device device = Device::cpu());
/// slice and slice_scatter with the attributes of a recorded Slice (gradient rules).
Tensor slice_with(const Tensor& x, const Attrs& a);
Tensor slice_scatter_with(const Tensor& base, const Tensor& src, const Attrs& a);
/// The default generators' state tensors (Note [Default generators] in core/ops/random.cpp): the
/// CPU's, then each device's made so far. Draws advance them in place.
std::vector<Tensor> generator_states();
/// x, as a view that exists only once `after` does (Note [Optimization barrier] in
/// core/ops/view.cpp): where a checkpoint's recomputation starts.
Tensor optimization_barrier(const Tensor& x, const Tensor& after);
/// Whether a Gather's index (along dim 0) has index_select's form: one i64 index along dim 0,
/// broadcast (stride 0) along every other dim.
bool index_rows(const Tensor& index);
}  // namespace detail

/// Threads used by CPU kernels (OpenMP) and by the BLAS.
void set_num_threads(int n);
int get_num_threads();

}  // namespace duet
