// Composites that mask, cut, reorder and pad (masked_fill, tril, triu, split, chunk, flip, roll,
// pad) and the *_like creators: no kernel or gradient of their own. Sizes are read as SymInts
// wherever the result does not depend on their values, so that a symbolic (batch) dim stays
// symbolic under compile; the ops whose structure depends on a size (split's number of pieces,
// roll's shift modulo the size) read it as an integer, which specializes it.
#include <algorithm>
#include <limits>

#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"
#include "core/ops.h"

namespace duet {

namespace {
constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();

// The 0-d fill of masked_fill and the triangles, converted to x's dtype as a wrapped number
// of x's kind (f64, i64 or b8: it goes with x on any device and keeps x's dtype in where's
// promotion); an integer x truncates a floating value, as PyTorch does.
Tensor fill_of(const Tensor& x, Scalar value) {
  const DType kind = is_floating(x.dtype())   ? DType::f64
                     : x.dtype() == DType::b8 ? DType::b8
                                              : DType::i64;
  if (kind == DType::i64) value = Scalar(value.to<int64_t>());
  return detail::wrap_scalar(value, kind, Device::cpu());
}

Tensor triangle(const char* op, const Tensor& x, int64_t diagonal, bool lower) {
  return detail::as_op(op, [&]() -> Tensor {
    const SymDims d = detail::sym_dims(x);
    DUET_CHECK_SHAPE(x.dim() >= 2, "[{}] needs at least 2 dims (..., rows, cols), got shape {}", op,
                     detail::dims_str(d));
    const Options io = Options().dtype(DType::i64).device(x.device());
    Tensor row = unsqueeze(detail::arange_dims(d[d.size() - 2], io), 1);
    Tensor col = unsqueeze(detail::arange_dims(d.back(), io), 0);
    Tensor off = col - row;  // j - i
    Tensor keep = lower ? le(off, diagonal) : ge(off, diagonal);
    return where(keep, x, fill_of(x, 0));
  });
}

Tensor masked(const char* op, const Tensor& x, const Tensor& mask, const Tensor& fill) {
  DUET_CHECK_DTYPE(mask.dtype() == DType::b8, "[{}] mask must be b8, got {} of shape {}", op,
                   mask.dtype(), detail::dims_str(detail::sym_dims(mask)));
  return detail::as_op(op, [&]() -> Tensor {
    // The mask broadcasts to x's shape, never x to the mask's (an error of expand otherwise).
    return where(detail::expand_dims(mask, detail::sym_dims(x)), fill, x);
  });
}

// The size of dim d of x as an integer (specializing a symbolic one; see the top).
int64_t size_of(const Tensor& x, int64_t d) { return x.size(d); }
}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value, std::source_location loc) {
  detail::SiteGuard site(loc);
  return masked("masked_fill", x, mask, fill_of(x, value));
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value,
                   std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_SHAPE(value.dim() == 0,
                   "[masked_fill] value must be a 0-d tensor, got shape {} (input {} of dtype {})",
                   detail::dims_str(detail::sym_dims(value)), detail::dims_str(detail::sym_dims(x)),
                   x.dtype());
  return masked("masked_fill", x, mask, value.dtype() == x.dtype() ? value : value.to(x.dtype()));
}

Tensor tril(const Tensor& x, int64_t diagonal, std::source_location loc) {
  detail::SiteGuard site(loc);
  return triangle("tril", x, diagonal, /*lower=*/true);
}

Tensor triu(const Tensor& x, int64_t diagonal, std::source_location loc) {
  detail::SiteGuard site(loc);
  return triangle("triu", x, diagonal, /*lower=*/false);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim,
                          std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_SHAPE(x.dim() >= 1, "[split] cannot split a 0-d tensor");
  dim = detail::wrap_dim("split", dim, x.dim());
  const int64_t n = size_of(x, dim);
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    DUET_CHECK_VALUE(s >= 0, "[split] split sizes must be non-negative, got {} in {}", s,
                     Dims(split_sizes).str());
    total += s;
  }
  DUET_CHECK_VALUE(total == n,
                   "[split] split sizes {} add up to {}, but dim {} of shape {} has size {}",
                   Dims(split_sizes).str(), total, dim, x.sizes(), n);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : split_sizes) {
    out.push_back(slice(x, dim, at, at + s));
    at += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim,
                          std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_SHAPE(x.dim() >= 1, "[split] cannot split a 0-d tensor");
  dim = detail::wrap_dim("split", dim, x.dim());
  const int64_t n = size_of(x, dim);
  DUET_CHECK_VALUE(split_size > 0 || (split_size == 0 && n == 0),
                   "[split] split_size must be positive (0 only for a dim of size 0), got {} for "
                   "dim {} of shape {}",
                   split_size, dim, x.sizes());
  // As torch.split: ceil(n / split_size) pieces, at least one.
  const int64_t pieces =
      split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < pieces; ++i) sizes.push_back(std::min(split_size, n - i * split_size));
  if (n == 0) sizes = {0};
  return split(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  DUET_CHECK_SHAPE(x.dim() >= 1, "[chunk] cannot chunk a 0-d tensor");
  DUET_CHECK_VALUE(chunks > 0, "[chunk] chunks must be positive, got {} (input of shape {})",
                   chunks, x.sizes());
  dim = detail::wrap_dim("chunk", dim, x.dim());
  const int64_t n = size_of(x, dim);
  // As torch.chunk: pieces of ceil(n / chunks); an empty dim gives `chunks` empty pieces.
  if (n == 0) return split(x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), dim);
  return split(x, (n + chunks - 1) / chunks, dim);
}

Tensor flip(const Tensor& x, Dims dims, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("flip", [&]() -> Tensor {
    std::vector<int64_t> seen;
    for (int64_t d : dims) {
      const int64_t w = detail::wrap_dim("flip", d, x.dim());
      DUET_CHECK_VALUE(std::find(seen.begin(), seen.end(), w) == seen.end(),
                       "[flip] dim {} appears more than once in {}", w, dims.str());
      seen.push_back(w);
    }
    if (x.dim() == 0) return x.clone();  // one element: nothing to reverse
    Tensor y = x;
    const SymDims s = detail::sym_dims(x);
    for (int64_t d : seen) {
      // Index n - 1 - i along d: an arange of the (possibly symbolic) size.
      const Options io = Options().dtype(DType::i64).device(x.device());
      Tensor rev =
          detail::size_scalar(s[d] - SymInt(1), DType::i64) - detail::arange_dims(s[d], io);
      y = index_select(y, d, rev);
    }
    return seen.empty() ? x.clone() : y;
  });
}

Tensor roll(const Tensor& x, Dims shifts, Dims dims, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("roll", [&]() -> Tensor {
    if (dims.empty()) {
      DUET_CHECK_VALUE(shifts.size() == 1,
                       "[roll] without dims, shifts must hold one shift (x is rolled flattened), "
                       "got {}",
                       shifts.str());
      const SymDims s = detail::sym_dims(x);
      Tensor flat = detail::reshape_dims(x, {detail::sym_numel(s)});
      return detail::reshape_dims(roll(flat, shifts, Dims{0}), s);
    }
    DUET_CHECK_VALUE(shifts.size() == dims.size(),
                     "[roll] shifts {} and dims {} must have the same length", shifts.str(),
                     dims.str());
    Tensor y = x;
    for (int64_t i = 0; i < dims.size(); ++i) {
      const int64_t d = detail::wrap_dim("roll", dims[i], x.dim());
      if (x.dim() == 0) continue;
      const int64_t n = size_of(x, d);
      if (n == 0) continue;
      const int64_t k = ((shifts[i] % n) + n) % n;
      if (k == 0) continue;
      // The last k elements move to the front.
      y = cat({slice(y, d, n - k, n), slice(y, d, 0, n - k)}, d);
    }
    return y.impl() == x.impl() ? x.clone() : y;
  });
}

namespace {
// Note [Padding modes]
// The pads of one dim made of y's own elements, as torch.nn.functional.pad's modes:
// - reflect mirrors without the edge: y[left], ..., y[1] before, y[n-2], ... after (each pad
//   below n);
// - replicate repeats the edge element (n at least 1);
// - circular wraps around: y[n-left], ..., y[n-1] before, y[0], ..., y[right-1] after (each pad
//   at most n).
// The parts, for cat along d: before, y, after.
std::vector<Tensor> copied_pads(const Tensor& y, int64_t d, int64_t left, int64_t right,
                                std::string_view mode, const Tensor& x) {
  const SymInt n = detail::sym_dim(y, d);
  const SymInt most(std::max(left, right));
  const bool fits = mode == "reflect" ? detail::sym_decide(most, detail::SymRel::Lt, n, "pad")
                    : mode == "circular"
                        ? detail::sym_decide(most, detail::SymRel::Le, n, "pad")
                        : detail::sym_decide(SymInt(0), detail::SymRel::Lt, n, "pad");
  const char* rule = mode == "reflect"    ? "each pad below the dim's size"
                     : mode == "circular" ? "each pad at most the dim's size"
                                          : "a dim that is not empty";
  DUET_CHECK_VALUE(fits, "[pad] {} padding ({}, {}) of dim {} needs {}, got size {} (input {})",
                   mode, left, right, d, rule, n.str(), detail::dims_str(detail::sym_dims(x)));
  std::vector<Tensor> parts;
  auto repeated = [&](const Tensor& edge, int64_t count) {
    SymDims block = detail::sym_dims(edge);
    block[d] = count;
    return detail::expand_dims(edge, block);
  };
  if (left > 0) {
    if (mode == "reflect") parts.push_back(flip(slice(y, d, 1, left + 1), Dims{d}));
    if (mode == "replicate") parts.push_back(repeated(slice(y, d, 0, 1), left));
    if (mode == "circular") parts.push_back(slice(y, d, -left, kToEnd));
  }
  parts.push_back(y);
  if (right > 0) {
    if (mode == "reflect") parts.push_back(flip(slice(y, d, -1 - right, -1), Dims{d}));
    if (mode == "replicate") parts.push_back(repeated(slice(y, d, -1, kToEnd), right));
    if (mode == "circular") parts.push_back(slice(y, d, 0, right));
  }
  return parts;
}
}  // namespace

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, std::string_view mode, Scalar value,
           std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("pad", [&]() -> Tensor {
    // reflect, replicate and circular pad with x's own elements (Note [Padding modes]).
    const bool reflect = mode == "reflect", replicate = mode == "replicate",
               circular = mode == "circular", copies = reflect || replicate || circular;
    DUET_CHECK_VALUE(mode == "constant" || copies,
                     "[pad] mode must be \"constant\", \"reflect\", \"replicate\" or "
                     "\"circular\", got \"{}\"",
                     mode);
    DUET_CHECK_VALUE(pads.size() % 2 == 0 && static_cast<int64_t>(pads.size()) <= 2 * x.dim(),
                     "[pad] pads {} must hold a (left, right) pair per padded dim, at most {} "
                     "values for shape {}",
                     Dims(pads).str(), 2 * x.dim(), detail::dims_str(detail::sym_dims(x)));
    DUET_CHECK_VALUE(!copies || !value.is_floating() || value.to<double>() == 0,
                     "[pad] {} mode takes no value, got {}", mode, value.to<double>());
    Tensor y = x;
    for (size_t p = 0; p < pads.size() / 2; ++p) {
      const int64_t d = x.dim() - 1 - static_cast<int64_t>(p);
      int64_t left = pads[2 * p], right = pads[2 * p + 1];
      if (copies) {
        DUET_CHECK_VALUE(left >= 0 && right >= 0, "[pad] {} padding must be non-negative, got {}",
                         mode, Dims(pads).str());
        if (left == 0 && right == 0) continue;
        y = cat(copied_pads(y, d, left, right, mode, x), d);
        continue;
      }
      // Negative pads crop, the others add a block of value.
      if (left < 0) y = slice(y, d, -left, kToEnd);
      if (right < 0) {
        const SymInt n = detail::sym_dim(y, d);
        DUET_CHECK_VALUE(detail::sym_decide(SymInt(-right), detail::SymRel::Le, n, "pad"),
                         "[pad] padding {} crops more than dim {} holds", Dims(pads).str(), d);
        y = slice(y, d, 0, -right == 0 ? kToEnd : right);
      }
      if (left <= 0 && right <= 0) continue;
      // The fill in x's dtype: an integer x truncates a floating value (as masked_fill).
      if (!is_floating(x.dtype()) && x.dtype() != DType::b8) value = Scalar(value.to<int64_t>());
      const Options o = Options().dtype(x.dtype()).device(x.device());
      std::vector<Tensor> parts;
      SymDims block = detail::sym_dims(y);
      if (left > 0) {
        block[d] = left;
        parts.push_back(detail::full_dims(block, value, o));
      }
      parts.push_back(y);
      if (right > 0) {
        block[d] = right;
        parts.push_back(detail::full_dims(block, value, o));
      }
      y = cat(parts, d);
    }
    return y;
  });
}

namespace {
// The options of a *_like creation: x's dtype and device unless the Options say otherwise (a
// device other than the CPU: Options cannot say "the CPU" apart from its default).
Options like_options(const Tensor& x, const Options& o) {
  Options r;
  r.dtype(o.dtype_.value_or(x.dtype()));
  r.device(o.device_.is_cpu() ? x.device() : o.device_);
  r.requires_grad(o.requires_grad_);
  return r;
}
}  // namespace

Tensor full_like(Located x, Scalar value, Options options) {
  detail::SiteGuard site(x.loc);
  return detail::as_op("full_like", [&]() -> Tensor {
    return detail::full_dims(detail::sym_dims(x.tensor), value, like_options(x.tensor, options));
  });
}
Tensor zeros_like(Located x, Options options) {
  detail::SiteGuard site(x.loc);
  return detail::as_op("zeros_like", [&]() -> Tensor {
    return detail::full_dims(detail::sym_dims(x.tensor), 0, like_options(x.tensor, options));
  });
}
Tensor ones_like(Located x, Options options) {
  detail::SiteGuard site(x.loc);
  return detail::as_op("ones_like", [&]() -> Tensor {
    return detail::full_dims(detail::sym_dims(x.tensor), 1, like_options(x.tensor, options));
  });
}
Tensor empty_like(Located x, Options options) {
  detail::SiteGuard site(x.loc);
  return detail::as_op("empty_like", [&]() -> Tensor {
    return detail::full_dims(detail::sym_dims(x.tensor), 0, like_options(x.tensor, options));
  });
}

}  // namespace duet
