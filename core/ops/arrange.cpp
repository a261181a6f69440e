// Composites that repeat, rearrange and combine tensors, as torch's: repeat, tile,
// repeat_interleave, movedim, swapaxes, swapdims, unflatten, unbind, broadcast_to, outer, bmm,
// baddbmm, diag, diag_embed, trace, diff, meshgrid, hstack and vstack. Views, expand, cat,
// where and matmul underneath: no kernel or gradient of their own. Sizes are read as SymInts
// where the result does not depend on their values (Note in core/ops/manipulate.cpp).
#include <algorithm>
#include <limits>

#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"

namespace duet {
namespace {

constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();

void check_defined(const char* op, const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", op);
}

// r itself, or a copy where it views x: these ops return new tensors, as PyTorch's do, so that
// an in-place write to the result never reaches x.
Tensor fresh(const Tensor& r, const Tensor& x) {
  return r.impl()->storage == x.impl()->storage ? r.clone() : r;
}

// Note [Repeats as an expand]
// repeat(x, r) views x as (1, s0, 1, s1, ...), expands it to (r0, s0, r1, s1, ...) and merges
// each pair: one copy, and the gradient is the expand's, a sum over the copies. repeat_interleave
// puts the repeat after the dim instead, (..., s, r, ...), so that each element's copies are
// neighbours.
Tensor repeat_as_expand(const Tensor& x, const Shape& repeats) {
  const SymDims xd = detail::sym_dims(x);
  const size_t pad = static_cast<size_t>(repeats.size()) - xd.size();
  SymDims pairs, expanded, merged;
  for (size_t i = 0; i < static_cast<size_t>(repeats.size()); ++i) {
    const SymInt s = i < pad ? SymInt(1) : xd[i - pad];
    const int64_t r = repeats[static_cast<int64_t>(i)];
    pairs.insert(pairs.end(), {SymInt(1), s});
    expanded.insert(expanded.end(), {SymInt(r), s});
    merged.push_back(s * SymInt(r));
  }
  return detail::reshape_dims(detail::expand_dims(detail::reshape_dims(x, pairs), expanded),
                              merged);
}

}  // namespace

Tensor repeat(const Tensor& x, Shape repeats, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("repeat", [&]() -> Tensor {
    check_defined("repeat", x);
    DUET_CHECK_SHAPE(repeats.size() >= x.dim(),
                     "[repeat] needs a repeat for each of the {} dims of {}, got {} ({})", x.dim(),
                     x.sizes(), repeats.size(), repeats);
    for (int64_t r : repeats)
      DUET_CHECK_VALUE(r >= 0, "[repeat] repeats must be non-negative, got {}", repeats);
    return fresh(repeat_as_expand(x, repeats), x);
  });
}

Tensor tile(const Tensor& x, Shape reps, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("tile", [&]() -> Tensor {
    check_defined("tile", x);
    Shape r;  // (fewer reps than dims: ones first, as torch.tile)
    for (int64_t i = reps.size(); i < x.dim(); ++i) r.push_back(1);
    for (int64_t v : reps) r.push_back(v);
    for (int64_t v : r) DUET_CHECK_VALUE(v >= 0, "[tile] reps must be non-negative, got {}", reps);
    return fresh(repeat_as_expand(x, r), x);
  });
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats, std::optional<int64_t> dim,
                         std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("repeat_interleave", [&]() -> Tensor {
    check_defined("repeat_interleave", x);
    DUET_CHECK_VALUE(repeats >= 0, "[repeat_interleave] repeats must be non-negative, got {}",
                     repeats);
    // No dim: the flattened x, as PyTorch's (a 0-d x is one element either way).
    const Tensor y =
        dim && x.dim() > 0 ? x : detail::reshape_dims(x, {detail::sym_numel(detail::sym_dims(x))});
    const int64_t d = dim ? detail::wrap_dim("repeat_interleave", *dim, y.dim()) : 0;
    SymDims e = detail::sym_dims(y), merged = e;
    e.insert(e.begin() + d + 1, SymInt(repeats));
    merged[static_cast<size_t>(d)] = merged[static_cast<size_t>(d)] * SymInt(repeats);
    return fresh(detail::reshape_dims(detail::expand_dims(unsqueeze(y, d + 1), e), merged), x);
  });
}

// The permutation that moves each source dim to its destination, the other dims keeping their
// order in the places left (torch.movedim).
Tensor movedim(const Tensor& x, Dims source, Dims destination, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("movedim", [&]() -> Tensor {
    check_defined("movedim", x);
    DUET_CHECK_VALUE(source.size() == destination.size(),
                     "[movedim] source {} and destination {} must name as many dims", source.str(),
                     destination.str());
    const int64_t n = x.dim();
    std::vector<int64_t> order(static_cast<size_t>(n), -1);
    std::vector<char> moved(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < source.size(); ++i) {
      const int64_t s = detail::wrap_dim("movedim", source[i], n);
      const int64_t t = detail::wrap_dim("movedim", destination[i], n);
      DUET_CHECK_VALUE(!moved[s] && order[t] < 0,
                       "[movedim] source {} and destination {} must each name a dim once",
                       source.str(), destination.str());
      moved[s] = 1;
      order[t] = s;
    }
    int64_t next = 0;
    for (int64_t& o : order) {
      if (o >= 0) continue;
      while (moved[next]) ++next;
      o = next++;
    }
    return permute(x, Dims(order));
  });
}

Tensor swapaxes(const Tensor& x, int64_t axis0, int64_t axis1, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("swapaxes", [&]() -> Tensor { return transpose(x, axis0, axis1); });
}

Tensor swapdims(const Tensor& x, int64_t dim0, int64_t dim1, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("swapdims", [&]() -> Tensor { return transpose(x, dim0, dim1); });
}

Tensor unflatten(const Tensor& x, int64_t dim, Shape sizes, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("unflatten", [&]() -> Tensor {
    check_defined("unflatten", x);
    const int64_t d = detail::wrap_dim("unflatten", dim, x.dim());
    DUET_CHECK_SHAPE(sizes.size() > 0, "[unflatten] needs at least one size, got ()");
    SymDims xd = detail::sym_dims(x);
    int64_t known = 1, unknown = -1;
    for (int64_t i = 0; i < sizes.size(); ++i) {
      DUET_CHECK_VALUE(sizes[i] >= 0 || (sizes[i] == -1 && unknown < 0),
                       "[unflatten] sizes {} may hold one -1, and no other negative size", sizes);
      if (sizes[i] == -1)
        unknown = i;
      else
        known *= sizes[i];
    }
    const int64_t n = x.size(d);
    DUET_CHECK_SHAPE(unknown >= 0 ? known > 0 && n % known == 0 : known == n,
                     "[unflatten] sizes {} do not split dim {} of size {} (input {})", sizes, d, n,
                     x.sizes());
    if (unknown >= 0) sizes[unknown] = n / known;
    SymDims out(xd.begin(), xd.begin() + d);
    for (int64_t s : sizes) out.push_back(SymInt(s));
    out.insert(out.end(), xd.begin() + d + 1, xd.end());
    return detail::reshape_dims(x, out);
  });
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("unbind", [&]() -> std::vector<Tensor> {
    check_defined("unbind", x);
    const int64_t d = detail::wrap_dim("unbind", dim, x.dim());
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < x.size(d); ++i) parts.push_back(select(x, d, i));
    return parts;
  });
}

Tensor broadcast_to(const Tensor& x, Shape shape, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("broadcast_to", [&]() -> Tensor { return expand(x, shape); });
}

Tensor outer(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("outer", [&]() -> Tensor {
    check_defined("outer", a);
    check_defined("outer", b);
    DUET_CHECK_SHAPE(a.dim() == 1 && b.dim() == 1, "[outer] needs two 1-D tensors, got {} and {}",
                     a.sizes(), b.sizes());
    return unsqueeze(a, 1) * unsqueeze(b, 0);
  });
}

Tensor bmm(const Tensor& a, const Tensor& b, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("bmm", [&]() -> Tensor {
    check_defined("bmm", a);
    check_defined("bmm", b);
    DUET_CHECK_SHAPE(
        a.dim() == 3 && b.dim() == 3 && detail::size_is(b, 0, detail::sym_dim(a, 0), "bmm"),
        "[bmm] needs (B, n, m) and (B, m, p) with one B (no broadcasting), got {} "
        "and {}",
        a.sizes(), b.sizes());
    return matmul(a, b);
  });
}

// beta input + alpha bmm(b1, b2); with beta 0 the input is not read (its NaN does not reach the
// result), as torch.baddbmm.
Tensor baddbmm(const Tensor& input, const Tensor& b1, const Tensor& b2, Scalar beta, Scalar alpha,
               std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("baddbmm", [&]() -> Tensor {
    check_defined("baddbmm", input);
    Tensor r = bmm(b1, b2);
    if (!(alpha == Scalar(1))) r = r * alpha;
    if (beta == Scalar(0)) return r;
    return (beta == Scalar(1) ? input : input * beta) + r;
  });
}

namespace {
// x (..., n) laid along the diagonal `offset` of (..., m, m), m = n + |offset|, zeros elsewhere:
// a where over the identity's pattern (so a NaN stays on the diagonal), padded to its place.
Tensor embed_last(const Tensor& x, int64_t offset) {
  const int64_t n = x.size(-1), k = std::abs(offset);
  const Options io = Options().dtype(DType::i64).device(x.device());
  const Tensor eye_mask =
      eq(unsqueeze(detail::arange_dims(n, io), 1), unsqueeze(detail::arange_dims(n, io), 0));
  const Tensor d = where(eye_mask, unsqueeze(x, -1), 0);
  if (k == 0) return d;
  // (pads: the last dim's left and right, then the rows' top and bottom)
  return offset > 0 ? pad(d, {k, 0, 0, k}) : pad(d, {0, k, k, 0});
}

// The diagonal `offset` of the matrices in dims d1 and d2 of x, as a new tensor (..., L) with
// those dims removed: the (..., L, L) block that holds it, flattened, every (L + 1)-th element.
Tensor diagonal_of(const Tensor& x, int64_t offset, int64_t d1, int64_t d2) {
  Tensor y = movedim(x, {d1, d2}, {-2, -1});
  if (offset >= 0)
    y = slice(y, -1, offset, kToEnd);
  else
    y = slice(y, -2, -offset, kToEnd);
  const int64_t len = std::max<int64_t>(0, std::min(y.size(-2), y.size(-1)));
  y = slice(slice(y, -2, 0, len), -1, 0, len);
  SymDims flat = detail::sym_dims(y);
  flat.pop_back();
  flat.back() = SymInt(len * len);
  return slice(detail::reshape_dims(y, flat), -1, 0, kToEnd, len + 1);
}
}  // namespace

Tensor diag(const Tensor& x, int64_t diagonal, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("diag", [&]() -> Tensor {
    check_defined("diag", x);
    DUET_CHECK_SHAPE(x.dim() == 1 || x.dim() == 2,
                     "[diag] needs a vector (a matrix is made of it) or a matrix (its diagonal "
                     "is taken), got {}",
                     x.sizes());
    if (x.dim() == 1) return embed_last(x, diagonal);
    return fresh(diagonal_of(x, diagonal, 0, 1), x);
  });
}

Tensor diag_embed(const Tensor& x, int64_t offset, int64_t dim1, int64_t dim2,
                  std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("diag_embed", [&]() -> Tensor {
    check_defined("diag_embed", x);
    DUET_CHECK_SHAPE(x.dim() >= 1, "[diag_embed] needs at least one dim, got a 0-d input");
    const int64_t n = x.dim() + 1;
    const int64_t a = detail::wrap_dim("diag_embed", dim1, n);
    const int64_t b = detail::wrap_dim("diag_embed", dim2, n);
    DUET_CHECK_VALUE(a != b, "[diag_embed] dim1 and dim2 must differ, got {} and {}", dim1, dim2);
    return movedim(embed_last(x, offset), {-2, -1}, {a, b});
  });
}

Tensor trace(const Tensor& x, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("trace", [&]() -> Tensor {
    check_defined("trace", x);
    DUET_CHECK_SHAPE(x.dim() == 2, "[trace] needs a matrix, got {}", x.sizes());
    return sum(diagonal_of(x, 0, 0, 1));
  });
}

// n rounds of neighbours' differences along dim, after prepend and append are joined to x
// (torch.diff); b8 differences are inequalities, as PyTorch's logical_xor of them.
Tensor diff(const Tensor& x, int64_t n, int64_t dim, const Tensor& prepend, const Tensor& append,
            std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("diff", [&]() -> Tensor {
    check_defined("diff", x);
    DUET_CHECK_SHAPE(x.dim() >= 1, "[diff] needs at least one dim, got a 0-d input");
    DUET_CHECK_VALUE(n >= 0, "[diff] n must be non-negative, got {}", n);
    const int64_t d = detail::wrap_dim("diff", dim, x.dim());
    std::vector<Tensor> parts;
    for (const Tensor* t : {&prepend, &x, &append})
      if (t->defined()) parts.push_back(*t);
    Tensor y = parts.size() == 1 ? x : cat(parts, d);
    for (int64_t i = 0; i < n && y.size(d) > 0; ++i) {
      const Tensor hi = slice(y, d, 1, kToEnd), lo = slice(y, d, 0, -1);
      y = y.dtype() == DType::b8 ? ne(hi, lo) : hi - lo;
    }
    return fresh(y, x);
  });
}

Tensor diff(const Tensor& x, int64_t n, int64_t dim, std::source_location loc) {
  return diff(x, n, dim, Tensor(), Tensor(), loc);
}

std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, std::string_view indexing,
                             std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("meshgrid", [&]() -> std::vector<Tensor> {
    DUET_CHECK_VALUE(indexing == "ij" || indexing == "xy",
                     "[meshgrid] indexing must be \"ij\" or \"xy\", got \"{}\"", indexing);
    DUET_CHECK_VALUE(!tensors.empty(), "[meshgrid] needs at least one tensor");
    SymDims shape;
    for (size_t i = 0; i < tensors.size(); ++i) {
      check_defined("meshgrid", tensors[i]);
      DUET_CHECK_SHAPE(tensors[i].dim() <= 1, "[meshgrid] needs 0-d or 1-D tensors, got {} ({})",
                       tensors[i].sizes(), i);
      shape.push_back(detail::sym_numel(detail::sym_dims(tensors[i])));
    }
    // "xy": the first two dims swapped (Cartesian indexing), as numpy's and torch's.
    const bool xy = indexing == "xy" && tensors.size() >= 2;
    if (xy) std::swap(shape[0], shape[1]);
    std::vector<Tensor> out;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t at = xy && i < 2 ? 1 - i : i;
      SymDims one(shape.size(), SymInt(1));
      one[at] = shape[at];
      out.push_back(detail::expand_dims(detail::reshape_dims(tensors[i], one), shape));
    }
    return out;
  });
}

// torch.hstack: 1-D tensors joined end to end, others along dim 1; torch.vstack: rows, a 1-D
// tensor as one row (atleast_2d).
Tensor hstack(const std::vector<Tensor>& tensors, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("hstack", [&]() -> Tensor {
    DUET_CHECK_VALUE(!tensors.empty(), "[hstack] needs at least one tensor");
    std::vector<Tensor> parts;
    for (const Tensor& t : tensors) {
      check_defined("hstack", t);
      parts.push_back(t.dim() == 0 ? reshape(t, {1}) : t);
    }
    return cat(parts, parts[0].dim() == 1 ? 0 : 1);
  });
}

Tensor vstack(const std::vector<Tensor>& tensors, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("vstack", [&]() -> Tensor {
    DUET_CHECK_VALUE(!tensors.empty(), "[vstack] needs at least one tensor");
    std::vector<Tensor> parts;
    for (const Tensor& t : tensors) {
      check_defined("vstack", t);
      parts.push_back(t.dim() >= 2 ? t : reshape(t, {1, t.numel()}));
    }
    return cat(parts, 0);
  });
}

}  // namespace duet
