// Composites that scan, summarize, order and classify: cumsum, var, std, amax, amin,
// max_with_indices, min_with_indices, sort, topk, one_hot and nll_loss, and argsort, the builder
// of the Argsort primitive they sort with. No kernel or gradient of their own: the gradient of
// each differentiable one is what the tape derives from its primitives (cumsum's is the reverse
// cumsum; sort's and topk's values are a gather of x by Argsort's indices, whose gradient is a
// scatter_add).
//
// Note [Argsort primitive]
// Sorting is the one thing here that composites cannot do well: ranks from comparisons of every
// pair take O(n^2) time and memory per row (2048 elements took 128 ms and 4M-element
// temporaries). Argsort is therefore a primitive, the smallest one that serves: i64 indices
// only, not differentiable, the values read by gather. The CPU kernel runs std::stable_sort per
// row (O(n log n)); the CUDA kernel gives each element its rank among its row in one thread
// (O(n) per element), which is simple and stable but quadratic in work for very long rows.
#include <algorithm>
#include <limits>

#include "core/autocast.h"
#include "core/dispatch.h"
#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"
#include "core/ops.h"

namespace duet {

namespace {
// Wrapped, deduplicated dims; empty means all (as the reductions' dims).
std::vector<int64_t> wrap_dims(const char* op, const Tensor& x, const Dims& dims) {
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    const int64_t w = detail::wrap_dim(op, d, x.dim());
    DUET_CHECK_VALUE(std::find(out.begin(), out.end(), w) == out.end(),
                     "[{}] dim {} appears more than once in {}", op, w, dims.str());
    out.push_back(w);
  }
  return out;
}
}  // namespace

// Note [Log-depth cumsum]
// cumsum along a dim of n elements is ceil(log2 n) rounds of y += y shifted by k (k = 1, 2, 4,
// ...; zeros shifted in): after the round of k, y[i] sums the 2k elements ending at i (Hillis
// and Steele's scan). Each round is a slice, a cat and an add, O(n) work, so the whole is
// O(n log n) and fuses like any elementwise chain; its gradient, derived by the tape, is the
// same rounds shifted the other way, the reverse cumsum. Each round's condition k < n is decided
// with sym_decide, so under compile a symbolic n is guarded to the range (k/2, k] rather than
// specialized to one size. cumprod is the same rounds with products, ones shifted in: its
// gradient, the tape's through the products, is exact at zeros too (a division by x would not
// be). Integers and b8 scan in i64, as PyTorch's.
namespace {
Tensor log_depth_scan(const char* op, const Tensor& x_in, int64_t dim, bool product) {
  Tensor held_x;  // Note [Autocast]
  const Tensor& x = detail::autocast_f32(x_in, held_x);
  dim = detail::wrap_dim(op, dim, x.dim());
  Tensor y = is_floating(x.dtype()) ? x : x.to(DType::i64);
  if (x.dim() == 0) return y.impl() == x.impl() ? x.clone() : y;
  const SymInt n = detail::sym_dim(y, dim);
  const Options o = Options().dtype(y.dtype()).device(y.device());
  for (int64_t k = 1; detail::sym_decide(SymInt(k), detail::SymRel::Lt, n, op); k *= 2) {
    SymDims first = detail::sym_dims(y);
    first[dim] = k;
    const Tensor shifted =
        cat({detail::full_dims(first, product ? 1 : 0, o), slice(y, dim, 0, -k)}, dim);
    y = product ? y * shifted : y + shifted;
  }
  return y.impl() == x.impl() ? x.clone() : y;
}
}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("cumsum",
                       [&]() -> Tensor { return log_depth_scan("cumsum", x, dim, false); });
}

Tensor cumprod(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("cumprod",
                       [&]() -> Tensor { return log_depth_scan("cumprod", x, dim, true); });
}

namespace {
// Note [Products by pairs]
// prod along one dim multiplies neighbours in pairs, halving the dim each round (a one appended
// where it is odd): ceil(log2 n) rounds of strided slices and one product, O(n) work, and its
// gradient, the tape's through the products, is exact where x holds zeros (PyTorch's special
// case of its division by x). A symbolic n cannot choose the rounds when traced: its product is
// the last element of cumprod instead. The dim stays, of size 1.
Tensor prod_along(Tensor y, int64_t d) {
  const SymInt sn = detail::sym_dim(y, d);
  const Options o = Options().dtype(y.dtype()).device(y.device());
  SymDims one = detail::sym_dims(y);
  one[d] = 1;
  if (!sn.is_concrete()) {
    if (detail::sym_decide(sn, detail::SymRel::Eq, SymInt(0), "prod"))
      return sum(y, {d}, true) * 0 + 1;
    return slice(cumprod(y, d), d, -1, std::numeric_limits<int64_t>::max());
  }
  int64_t n = sn.concrete();
  if (n == 0) return sum(y, {d}, true) * 0 + 1;  // (ones, still read from y: a zero gradient)
  while (n > 1) {
    if (n % 2) {
      y = cat({y, detail::full_dims(one, 1, o)}, d);
      ++n;
    }
    y = slice(y, d, 0, n, 2) * slice(y, d, 1, n, 2);
    n /= 2;
  }
  return y;
}
}  // namespace

Tensor prod(const Tensor& x_in, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("prod", [&]() -> Tensor {
    Tensor held_x;  // Note [Autocast]
    const Tensor& x = detail::autocast_f32(x_in, held_x);
    const std::vector<int64_t> w = wrap_dims("prod", x, dims);
    Tensor y = is_floating(x.dtype()) ? x : x.to(DType::i64);  // PyTorch: integers in i64
    // A result that views x (nothing multiplied: every reduced dim of size 1) is copied.
    auto fresh = [&](const Tensor& r) {
      return r.impl()->storage == x.impl()->storage ? r.clone() : r;
    };
    if (x.dim() == 0) return fresh(y);
    if (w.empty()) {  // every element: the flat tensor's product, shaped as the reduction's
      const SymDims xs = detail::sym_dims(y);
      y = prod_along(detail::reshape_dims(y, {detail::sym_numel(xs)}), 0);
      SymDims out;
      if (keepdim) out.assign(xs.size(), SymInt(1));
      return fresh(detail::reshape_dims(y, out));
    }
    std::vector<int64_t> desc = w;  // (squeezed from the last, so that the others keep place)
    std::sort(desc.begin(), desc.end(), std::greater<>());
    for (int64_t d : desc) y = prod_along(y, d);
    if (!keepdim)
      for (int64_t d : desc) y = squeeze(y, d);
    return fresh(y);
  });
}

// Whether every element (all) or some element (any) over dims is nonzero: b8, by a count of
// the zeros (all) or the nonzeros (any), so that an empty reduction gives true and false.
Tensor all(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("all", [&]() -> Tensor {
    DUET_CHECK_VALUE(x.defined(), "[all] the input is an undefined tensor");
    return eq(sum(eq(x, 0), dims, keepdim), 0);
  });
}

Tensor any(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("any", [&]() -> Tensor {
    DUET_CHECK_VALUE(x.defined(), "[any] the input is an undefined tensor");
    return gt(sum(ne(x, 0), dims, keepdim), 0);
  });
}

Tensor var(const Tensor& x, Dims dims, double correction, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("var", [&]() -> Tensor {
    DUET_CHECK_DTYPE(is_floating(x.dtype()),
                     "[var] needs a floating input, got {} of shape {}; convert with "
                     ".to(DType::f32)",
                     x.dtype(), detail::dims_str(detail::sym_dims(x)));
    DUET_CHECK_VALUE(std::isfinite(correction) && correction >= 0,
                     "[var] correction must be finite and non-negative, got {}", correction);
    const std::vector<int64_t> w = wrap_dims("var", x, dims);
    const SymDims xs = detail::sym_dims(x);
    SymInt count = 1;
    if (w.empty() || x.dim() == 0)
      count = detail::sym_numel(xs);
    else
      for (int64_t d : w) count *= xs[d];
    Tensor xc = x - mean(x, dims, /*keepdim=*/true);
    Tensor ss = sum(xc * xc, dims, keepdim);
    // max(0, N - correction), as PyTorch: N <= correction gives inf (or NaN for 0/0).
    if (!count.is_concrete())
      return ss / maximum(detail::size_scalar(count, x.dtype(), x.device()) - correction, 0.0);
    return ss / std::max(0.0, static_cast<double>(count.concrete()) - correction);
  });
}

Tensor std(const Tensor& x, Dims dims, double correction, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("std", [&]() -> Tensor { return sqrt(var(x, dims, correction, keepdim)); });
}

Tensor amax(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("amax", [&]() -> Tensor { return max(x, dims, keepdim); });
}

Tensor amin(const Tensor& x, Dims dims, bool keepdim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("amin", [&]() -> Tensor { return min(x, dims, keepdim); });
}

namespace {
std::tuple<Tensor, Tensor> extreme_with_indices(const char* op, const Tensor& x, int64_t dim,
                                                bool keepdim, bool largest) {
  return detail::as_op(op, [&]() -> std::tuple<Tensor, Tensor> {
    dim = detail::wrap_dim(op, dim, x.dim());
    Tensor idx = largest ? argmax(x, dim, /*keepdim=*/true) : argmin(x, dim, /*keepdim=*/true);
    Tensor values = gather(x, dim, idx);
    if (keepdim || x.dim() == 0) return {values, idx};
    return {squeeze(values, dim), squeeze(idx, dim)};
  });
}
}  // namespace

std::tuple<Tensor, Tensor> max_with_indices(const Tensor& x, int64_t dim, bool keepdim,
                                            std::source_location loc) {
  detail::SiteGuard site(loc);
  return extreme_with_indices("max_with_indices", x, dim, keepdim, /*largest=*/true);
}

std::tuple<Tensor, Tensor> min_with_indices(const Tensor& x, int64_t dim, bool keepdim,
                                            std::source_location loc) {
  detail::SiteGuard site(loc);
  return extreme_with_indices("min_with_indices", x, dim, keepdim, /*largest=*/false);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending, std::source_location loc) {
  detail::SiteGuard site(loc);
  Attrs a;
  a.dim = detail::wrap_dim("argsort", dim, x.dim());
  a.keepdim = descending;
  const Tensor* in[] = {&x};
  return detail::call(OpId::Argsort, TensorRefs(in, 1), a);
}

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending,
                                std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("sort", [&]() -> std::tuple<Tensor, Tensor> {
    Tensor idx = argsort(x, dim, descending);
    return {gather(x, detail::wrap_dim("sort", dim, x.dim()), idx), idx};
  });
}

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted,
                                std::source_location loc) {
  detail::SiteGuard site(loc);
  (void)sorted;  // the k values always come sorted, which `sorted = false` allows
  return detail::as_op("topk", [&]() -> std::tuple<Tensor, Tensor> {
    dim = detail::wrap_dim("topk", dim, x.dim());
    const SymInt n = x.dim() ? detail::sym_dim(x, dim) : SymInt(1);
    DUET_CHECK_VALUE(k >= 0 && detail::sym_decide(SymInt(k), detail::SymRel::Le, n, "topk"),
                     "[topk] k = {} is out of range for dim {} of size {} (shape {})", k, dim,
                     n.str(), detail::dims_str(detail::sym_dims(x)));
    Tensor idx = argsort(x, dim, /*descending=*/largest);
    if (x.dim()) idx = slice(idx, dim, 0, k);
    return {gather(x, dim, idx), idx};
  });
}

Tensor one_hot(const Tensor& indices, int64_t num_classes, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_DTYPE(indices.dtype() == DType::i64,
                   "[one_hot] indices must be i64, got {} of shape {}", indices.dtype(),
                   detail::dims_str(detail::sym_dims(indices)));
  return detail::as_op("one_hot", [&]() -> Tensor {
    if (num_classes == -1) {
      DUET_CHECK_VALUE(indices.numel() > 0,
                       "[one_hot] cannot infer num_classes from empty indices of shape {}",
                       indices.sizes());
      num_classes = max(indices).item<int64_t>() + 1;
    }
    DUET_CHECK_VALUE(num_classes >= 0, "[one_hot] num_classes must be -1 or non-negative, got {}",
                     num_classes);
    SymDims out = detail::sym_dims(indices);
    out.push_back(num_classes);
    const Options io = Options().dtype(DType::i64).device(indices.device());
    Tensor at = unsqueeze(indices, -1);
    // scatter_add checks every index against num_classes (a ValueError naming one_hot).
    return scatter_add(detail::full_dims(out, 0, io), -1, at, ones_like(at));
  });
}

namespace {

// nll_loss with an optional weight per class (undefined: 1 for every class).
Tensor nll_of(const Tensor& log_probs_in, const Tensor& target, const Tensor& weight,
              std::string_view reduction, int64_t ignore_index) {
  Tensor held_log_probs;  // Note [Autocast]
  const Tensor& log_probs = detail::autocast_f32(log_probs_in, held_log_probs);
  DUET_CHECK_VALUE(reduction == "mean" || reduction == "sum" || reduction == "none",
                   "[nll_loss] reduction must be \"mean\", \"sum\" or \"none\", got \"{}\"",
                   reduction);
  DUET_CHECK_DTYPE(is_floating(log_probs.dtype()), "[nll_loss] log_probs must be floating, got {}",
                   log_probs.dtype());
  DUET_CHECK_DTYPE(target.dtype() == DType::i64,
                   "[nll_loss] target must be i64 class indices, got {} of shape {}",
                   target.dtype(), detail::dims_str(detail::sym_dims(target)));
  const SymDims ls = detail::sym_dims(log_probs);
  bool fits = (log_probs.dim() == 1 && target.dim() == 0) ||
              (log_probs.dim() >= 2 && target.dim() == log_probs.dim() - 1);
  for (int64_t d = 0; fits && log_probs.dim() >= 2 && d < target.dim(); ++d)
    fits = detail::size_is(target, d, ls[d == 0 ? 0 : d + 1], "nll_loss");
  DUET_CHECK_SHAPE(fits,
                   "[nll_loss] expected log_probs (N, C, d1, ...) with target (N, d1, ...), or "
                   "(C) with a 0-d target; got {} and {}",
                   detail::dims_str(ls), detail::dims_str(detail::sym_dims(target)));
  const int64_t cdim = log_probs.dim() == 1 ? 0 : 1;
  if (weight.defined()) {
    DUET_CHECK_SHAPE(weight.dim() == 1 && detail::size_is(weight, 0, ls[cdim], "nll_loss"),
                     "[nll_loss] weight must be 1-D with one element per class: log_probs {} "
                     "have {} classes, weight has shape {}",
                     detail::dims_str(ls), ls[cdim].str(), weight.sizes());
    DUET_CHECK_DTYPE(is_floating(weight.dtype()), "[nll_loss] weight must be floating, got {}",
                     weight.dtype());
  }
  const auto [loss, wt] = detail::class_nll(log_probs, target, weight, ignore_index, cdim);
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  return sum(loss) / sum(wt);
}

}  // namespace

std::pair<Tensor, Tensor> detail::class_nll(const Tensor& log_probs, const Tensor& target,
                                            const Tensor& weight, int64_t ignore_index,
                                            int64_t cdim) {
  Tensor valid = ne(target, ignore_index);
  Tensor safe = where(valid, target, 0);  // an ignored target reads class 0, then is zeroed
  Tensor picked = squeeze(gather(log_probs, cdim, unsqueeze(safe, cdim)), cdim);
  Tensor loss = where(valid, neg(picked), 0.0);
  Tensor wt = valid.to(log_probs.dtype());
  if (weight.defined()) {
    wt = wt * detail::reshape_dims(index_select(weight.to(log_probs.dtype()), 0, flatten(safe)),
                                   detail::sym_dims(target));
    loss = loss * wt;
  }
  return {loss, wt};
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, std::string_view reduction,
                int64_t ignore_index, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("nll_loss", [&]() -> Tensor {
    return nll_of(log_probs, target, Tensor(), reduction, ignore_index);
  });
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                std::string_view reduction, int64_t ignore_index, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("nll_loss", [&]() -> Tensor {
    return nll_of(log_probs, target, weight, reduction, ignore_index);
  });
}

}  // namespace duet
