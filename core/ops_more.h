// duet: the ops a PyTorch user reaches for beyond the primitives' own: masking, triangles,
// splitting, flipping, rolling, padding, the *_like creators, scans, statistics, sorting,
// one_hot, nll_loss, multinomial and einsum. Every one is a composite of the public ops in
// core/ops.h (so differentiable, compiled and fused like them); core/ops.h includes this header.
// Names and arguments follow LibTorch's C++ API, with duet's Options, Shape and Dims.
#pragma once

#include <string_view>
#include <tuple>
#include <vector>

#include "core/call_site.h"
#include "core/tensor.h"

namespace duet {

// Masking and triangles
/// x with `value` where mask (b8, broadcast to x's shape) is true; x's dtype is kept (an
/// integer x truncates a floating value, as in PyTorch). The gradient flows to x where the mask
/// is false.
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value, DUET_HERE);
/// masked_fill with a 0-d tensor value (converted to x's dtype); the gradient flows to value
/// too, summed over the masked elements.
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value, DUET_HERE);
/// The lower (tril) or upper (triu) triangle of the last two dims, the rest zeroed: element
/// (i, j) is kept when j - i <= diagonal (tril) or j - i >= diagonal (triu). Built from arange
/// comparisons of the sizes, so symbolic sizes stay symbolic under compile.
Tensor tril(const Tensor& x, int64_t diagonal = 0, DUET_HERE);
Tensor triu(const Tensor& x, int64_t diagonal = 0, DUET_HERE);

// Splitting, flipping, rolling, padding
/// Views of x along dim in pieces of split_size, the last one smaller when split_size does not
/// divide the size (torch.split); a dim of size 0 gives one empty piece. The number of pieces
/// depends on the size, so a symbolic size of dim is specialized under compile.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0, DUET_HERE);
/// Views of x along dim with the given sizes, which must add up to the dim's size.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim = 0,
                          DUET_HERE);
/// torch.chunk: split with pieces of ceil(size / chunks), so possibly fewer than `chunks`
/// pieces; a dim of size 0 gives `chunks` empty pieces.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0, DUET_HERE);
/// x with the order of the elements along each of dims reversed (a copy, as torch.flip).
Tensor flip(const Tensor& x, Dims dims, DUET_HERE);
/// x shifted cyclically by shifts[i] along dims[i] (positive towards higher indices); with no
/// dims, x is rolled as if flattened (one shift). Needs the rolled dims' sizes, so a symbolic
/// size of a rolled dim is specialized under compile.
Tensor roll(const Tensor& x, Dims shifts, Dims dims = {}, DUET_HERE);
/// torch.nn.functional.pad: pads = {left, right} of the last dim, then of the one before it,
/// and so on (at most two per dim). mode "constant" pads with value (negative pads crop);
/// "reflect" mirrors x without repeating the edge (each pad below the dim's size, no negative
/// pads). Any other mode is a ValueError.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, std::string_view mode = "constant",
           Scalar value = 0, DUET_HERE);

// Creation like another tensor: x's shape (symbolic dims stay symbolic under compile), dtype and
// device, unless Options say another dtype, or a device other than the CPU.
//
// Note [Like creators take a Located]
// x is a Located (core/call_site.h), which carries the call site as the operators' first
// operand does, instead of a const Tensor& and DUET_HERE. Code that has its own helper of the
// same name (a file-local `Tensor zeros_like(const Tensor&)`, common before these existed)
// keeps calling its helper: the helper binds x directly, while these need a conversion to
// Located, so the helper is the better match instead of the call being ambiguous (argument-
// dependent lookup finds these through Tensor's namespace).
Tensor zeros_like(Located x, Options options = {});
Tensor ones_like(Located x, Options options = {});
Tensor full_like(Located x, Scalar value, Options options = {});
/// duet never hands out uninitialized memory: empty_like is zeros_like.
Tensor empty_like(Located x, Options options = {});
/// Uniform [0, 1) and standard normal draws of x's shape, from the device's default generator
/// as rand and randn (core/ops/random.cpp); the dtype must be floating.
Tensor rand_like(Located x, Options options = {});
Tensor randn_like(Located x, Options options = {});

// Scans and statistics
/// Running sum along dim (integers and bools sum in i64, as in PyTorch). A log-depth scan of
/// shifted adds (ceil(log2 n) steps), differentiable: the gradient is the reverse cumsum.
Tensor cumsum(const Tensor& x, int64_t dim, DUET_HERE);
/// Variance over dims (all when empty) with PyTorch's correction: the sum of squared
/// deviations divided by max(0, N - correction) (1: Bessel's, 0: the population variance).
/// Needs a floating input.
Tensor var(const Tensor& x, Dims dims = {}, double correction = 1, bool keepdim = false, DUET_HERE);
/// sqrt(var(...)).
Tensor std(const Tensor& x, Dims dims = {}, double correction = 1, bool keepdim = false, DUET_HERE);
/// Largest / smallest values over dims (all when empty); the gradient is split evenly among
/// ties, as torch.amax. The same as max(x, dims, keepdim) and min(x, dims, keepdim).
Tensor amax(const Tensor& x, Dims dims = {}, bool keepdim = false, DUET_HERE);
Tensor amin(const Tensor& x, Dims dims = {}, bool keepdim = false, DUET_HERE);
/// torch.max(x, dim, keepdim) and torch.min(x, dim, keepdim): the values and the i64 indices of
/// the first extreme along dim (NaN counts as the extreme). Named apart from duet's max(x, dim),
/// which returns the values only. The gradient goes to the element at the index.
std::tuple<Tensor, Tensor> max_with_indices(const Tensor& x, int64_t dim, bool keepdim = false,
                                            DUET_HERE);
std::tuple<Tensor, Tensor> min_with_indices(const Tensor& x, int64_t dim, bool keepdim = false,
                                            DUET_HERE);

// Sorting
/// The i64 indices that sort x along dim, stable (equal elements keep their order); NaN sorts
/// as the largest value. Not differentiable. Composed of comparisons of every pair along dim,
/// so it takes O(n^2) time and memory per row: meant for rows of up to a few thousand.
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, DUET_HERE);
/// The sorted values (gather(x, dim, indices): the gradient flows through gather) and the
/// indices of argsort.
std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false,
                                DUET_HERE);
/// The k largest (or smallest) values along dim and their indices, sorted (`sorted` = false
/// is accepted and gives them sorted too); k must be at most the dim's size.
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                bool sorted = true, DUET_HERE);

// Classification helpers
/// i64 indices (any shape) as one-hot rows: indices.shape + (num_classes), i64. num_classes -1
/// takes max(indices) + 1 (which reads the values). An index outside [0, num_classes) is a
/// ValueError. Not differentiable.
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1, DUET_HERE);
/// torch.nn.functional.nll_loss: -log_probs[n, target[n]] for log_probs (N, C, d1, ...) with
/// target (N, d1, ...), or (C) with a 0-d target; reduction "mean" (over the targets not equal
/// to ignore_index), "sum" or "none".
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, std::string_view reduction = "mean",
                int64_t ignore_index = -100, DUET_HERE);
/// num_samples i64 category indices per row of probs (1-D, or 2-D rows), drawn with
/// probabilities proportional to the (non-negative) weights, from the default generator as
/// rand: with replacement by inverting the cumulative sum, without by the Gumbel top-k trick
/// (num_samples at most the number of categories).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false, DUET_HERE);

// Contractions
/// Einstein summation over 1 or more operands: "ij,jk->ik", "bij,bjk->bik", "i,j->ij", "ij->ji",
/// "i,i->", "bhqd,bhkd->bhqk", "ij->" and the implicit form ("ij,jk": output letters in
/// alphabetical order). Letters of one operand that appear nowhere else are summed first;
/// operands then contract pairwise, left to right, each pair as one batched matmul (permute,
/// reshape, matmul), so the result is differentiable and compiled like them. Sizes of a letter
/// must agree (no broadcasting). Ellipsis ("...") and a letter repeated within one operand (a
/// diagonal, "ii->i") are ValueErrors.
Tensor einsum(std::string_view equation, const std::vector<Tensor>& tensors, DUET_HERE);

}  // namespace duet
