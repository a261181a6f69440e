// Rows of the composites of core/api.def from masked_fill to einsum (masked_fill, tril, triu,
// split, chunk, flip, roll, pad, cumsum, var, std, amax, amin, max/min_with_indices, argsort, sort,
// topk, nll_loss, einsum) and of optimization_barrier, with references on plain doubles written
// without duet's ops (see op_rows.h). The ops returning several tensors have one row per result.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "core/ops.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;
using Vec = std::vector<double>;

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8};
const std::vector<DType> kNumeric = {DType::f32, DType::f64, DType::i32, DType::i64};
const Domain kTies{-1, 1, -2, 2, true};

int64_t wrap(int64_t dim, int64_t rank) { return dim < 0 ? dim + rank : dim; }

OpRow row(std::string name, OpId op, std::vector<Shape> shapes,
          std::function<Tensor(const Ins&)> fn, std::function<Vec(const Values&)> ref, Shape out) {
  return OpRow{std::move(name), op, true, std::move(shapes), std::move(fn), std::move(ref), out};
}

// ---- masked_fill, tril, triu ------------------------------------------------------------------

OpRow masked_fill_row(Shape xs, Shape ms, Vec mask, double value, bool tensor_value) {
  std::string name = fmt::format("masked_fill {} mask {}{}", xs.str(), ms.str(),
                                 tensor_value ? " tensor value" : "");
  std::vector<Shape> shapes = {xs};
  if (tensor_value) shapes.push_back(Shape{});
  OpRow r = row(
      name, OpId::Where, shapes,
      [=](const Ins& in) {
        Tensor m = make(mask, ms, DType::b8);
        return tensor_value ? masked_fill(in[0], m, in[1]) : masked_fill(in[0], m, value);
      },
      [=](const Values& v) {
        Vec o = v[0];
        const int64_t lead = xs.size() - ms.size();
        for (int64_t i = 0; i < xs.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, xs), q;
          for (int64_t d = 0; d < ms.size(); ++d) q.push_back(ms[d] == 1 ? 0 : p[lead + d]);
          if (mask[ravel(q, ms)] != 0) o[i] = tensor_value ? v[1][0] : value;
        }
        return o;
      },
      xs);
  r.dtypes = tensor_value ? std::vector<DType>{DType::f32, DType::f64} : kAll;
  return r;
}

OpRow triangle_row(bool lower, Shape xs, int64_t k) {
  OpRow r = row(
      fmt::format("{} {} diagonal {}", lower ? "tril" : "triu", xs.str(), k), OpId::Where, {xs},
      [=](const Ins& in) { return lower ? tril(in[0], k) : triu(in[0], k); },
      [=](const Values& v) {
        Vec o = v[0];
        for (int64_t i = 0; i < xs.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, xs);
          const int64_t off = p[xs.size() - 1] - p[xs.size() - 2];
          if (lower ? off > k : off < k) o[i] = 0;
        }
        return o;
      },
      xs);
  r.dtypes = kAll;
  return r;
}

// ---- split, chunk, flip, roll, pad ------------------------------------------------------------

// Piece `k` of a split along dim into pieces of `sizes`.
OpRow piece_row(std::string name, Shape xs, int64_t dim, std::vector<int64_t> sizes, size_t k,
                std::function<std::vector<Tensor>(const Tensor&)> fn) {
  const int64_t d = wrap(dim, xs.size());
  int64_t start = 0;
  for (size_t i = 0; i < k; ++i) start += sizes[i];
  Shape out = xs;
  out[d] = sizes[k];
  OpRow r = row(
      fmt::format("{} piece {} of {}", name, k, sizes.size()), OpId::Slice, {xs},
      [=](const Ins& in) {
        std::vector<Tensor> parts = fn(in[0]);
        REQUIRE(parts.size() == sizes.size());
        return parts[k];
      },
      [=](const Values& v) {
        Vec o;
        for (int64_t i = 0; i < out.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, out);
          p[d] += start;
          o.push_back(v[0][ravel(p, xs)]);
        }
        return o;
      },
      out);
  r.dtypes = kAll;
  return r;
}

// embedding_bag of a weight (v, d) over fixed indices in bags starting at `starts` (2-D: rows
// of `width` indices, no offsets), with, where asked, per-sample weights and a padding index.
OpRow bag_row(int64_t v, int64_t d, std::vector<int64_t> idx, std::vector<int64_t> starts,
              int64_t width, std::string mode, bool psw, std::optional<int64_t> pad) {
  const auto n = static_cast<int64_t>(idx.size());
  std::vector<Shape> shapes = {{v, d}};
  if (psw) shapes.push_back({n});
  const int64_t bags = width ? n / width : static_cast<int64_t>(starts.size());
  OpRow r = row(
      fmt::format("embedding_bag ({}, {}) {} indices, {} bags{} {}{}{}", v, d, n, bags,
                  width ? " 2-D" : "", mode, psw ? " per_sample_weights" : "",
                  pad ? fmt::format(" padding_idx {}", *pad) : ""),
      mode == "max" ? OpId::Where : OpId::ScatterAdd, shapes,
      [=](const Ins& in) {
        const std::vector<double> id(idx.begin(), idx.end()), st(starts.begin(), starts.end());
        const Tensor input = make(id, width ? Shape{n / width, width} : Shape{n}, DType::i64);
        const Tensor offsets = width ? Tensor() : make(st, {bags}, DType::i64);
        const Tensor w = psw ? in[1].reshape(input.sizes()) : Tensor();
        return embedding_bag(input, in[0], offsets, mode, w, false, pad);
      },
      [=](const Values& vals) {
        Vec o(size_t(bags * d), 0.0);
        for (int64_t b = 0; b < bags; ++b) {
          const int64_t lo = width ? b * width : starts[size_t(b)];
          const int64_t hi = width ? lo + width : b + 1 < bags ? starts[size_t(b + 1)] : n;
          int64_t count = 0;
          for (int64_t i = lo; i < hi; ++i) {
            const int64_t k = idx[size_t(i)];
            if (pad && k == *pad) continue;
            for (int64_t j = 0; j < d; ++j) {
              const double x = vals[0][size_t(k * d + j)] * (psw ? vals[1][size_t(i)] : 1.0);
              double& y = o[size_t(b * d + j)];
              y = mode != "max" ? y + x : count ? std::max(y, x) : x;
            }
            ++count;
          }
          if (mode == "mean" && count)
            for (int64_t j = 0; j < d; ++j) o[size_t(b * d + j)] /= double(count);
        }
        return o;
      },
      {bags, d});
  return r;
}

void add_pieces(std::vector<OpRow>& r, std::string name, Shape xs, int64_t dim,
                std::vector<int64_t> sizes, std::function<std::vector<Tensor>(const Tensor&)> fn) {
  for (size_t k = 0; k < sizes.size(); ++k) r.push_back(piece_row(name, xs, dim, sizes, k, fn));
}

OpRow flip_row(Shape xs, std::vector<int64_t> dims) {
  OpRow r = row(
      fmt::format("flip {} dims {}", xs.str(), Dims(dims).str()), OpId::Gather, {xs},
      [=](const Ins& in) { return flip(in[0], Dims(dims)); },
      [=](const Values& v) {
        Vec o;
        for (int64_t i = 0; i < xs.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, xs);
          for (int64_t d : dims) {
            if (xs.size() == 0) break;  // one element
            const int64_t w = wrap(d, xs.size());
            p[w] = xs[w] - 1 - p[w];
          }
          o.push_back(v[0][ravel(p, xs)]);
        }
        return o;
      },
      xs);
  r.dtypes = kAll;
  if (dims.empty() || xs.size() == 0) r.op = OpId::Copy;  // nothing to reverse: a copy
  return r;
}

OpRow roll_row(Shape xs, std::vector<int64_t> shifts, std::vector<int64_t> dims) {
  OpRow r = row(
      fmt::format("roll {} shifts {} dims {}", xs.str(), Dims(shifts).str(), Dims(dims).str()),
      OpId::Cat, {xs}, [=](const Ins& in) { return roll(in[0], Dims(shifts), Dims(dims)); },
      [=](const Values& v) {
        Vec o(v[0].size());
        const int64_t n = xs.numel();
        for (int64_t i = 0; i < n; ++i) {
          if (dims.empty()) {  // flattened
            o[((i + shifts[0]) % n + n) % n] = v[0][i];
            continue;
          }
          std::vector<int64_t> p = unravel(i, xs);
          for (size_t k = 0; k < dims.size(); ++k) {
            const int64_t w = wrap(dims[k], xs.size());
            p[w] = ((p[w] + shifts[k]) % xs[w] + xs[w]) % xs[w];
          }
          o[ravel(p, xs)] = v[0][i];
        }
        return o;
      },
      xs);
  r.dtypes = kAll;
  if (xs.size() == 0) r.op = OpId::Copy;  // one element: a copy
  return r;
}

// mode: "constant" (value), or the modes that pad with x's own elements.
OpRow pad_row(Shape xs, std::vector<int64_t> pads, std::string mode, double value = 0) {
  Shape out = xs;
  for (size_t k = 0; k < pads.size() / 2; ++k)
    out[xs.size() - 1 - k] += pads[2 * k] + pads[2 * k + 1];
  const bool constant = mode == "constant";
  OpRow r = row(
      fmt::format("pad {} {} {}", xs.str(), Dims(pads).str(), mode), OpId::Cat, {xs},
      [=](const Ins& in) { return pad(in[0], pads, mode, value); },
      [=](const Values& v) {
        Vec o;
        for (int64_t i = 0; i < out.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, out);
          bool fill = false;
          for (size_t k = 0; k < pads.size() / 2; ++k) {
            const int64_t d = xs.size() - 1 - k, n = xs[d];
            int64_t q = p[d] - pads[2 * k];  // the position in x
            if (mode == "reflect") {
              if (q < 0) q = -q;
              if (q >= n) q = 2 * (n - 1) - q;
            } else if (mode == "replicate") {
              q = std::clamp<int64_t>(q, 0, n - 1);
            } else if (mode == "circular") {
              q = (q % n + n) % n;
            } else if (q < 0 || q >= n) {
              fill = true;
            }
            p[d] = q;
          }
          o.push_back(fill ? value : v[0][ravel(p, xs)]);
        }
        return o;
      },
      out);
  // A fill that is not an integer needs a floating x.
  r.dtypes = !constant                    ? kAll
             : value == std::floor(value) ? kNumeric
                                          : std::vector<DType>{DType::f32, DType::f64};
  return r;
}

// ---- cumsum, var, std, amax, amin, max/min with indices ----------------------------------------

// For each line of x along dim: f(values of the line) gives the line's result, of length m.
Vec along(const Vec& x, const Shape& xs, int64_t dim, int64_t m,
          const std::function<Vec(const Vec&)>& f, Shape* out_shape = nullptr) {
  if (xs.size() == 0) return f(x);
  Shape lines = xs;
  lines[dim] = 1;
  Shape out = xs;
  out[dim] = m;
  Vec o(static_cast<size_t>(out.numel()));
  for (int64_t l = 0; l < lines.numel(); ++l) {
    std::vector<int64_t> p = unravel(l, lines);
    Vec line;
    for (int64_t j = 0; j < xs[dim]; ++j) {
      p[dim] = j;
      line.push_back(x[ravel(p, xs)]);
    }
    Vec res = f(line);
    for (int64_t j = 0; j < m; ++j) {
      p[dim] = j;
      o[ravel(p, out)] = res[j];
    }
  }
  if (out_shape) *out_shape = out;
  return o;
}

OpRow cumsum_row(Shape xs, int64_t dim) {
  OpRow r = row(
      fmt::format("cumsum {} dim {}", xs.str(), dim), OpId::Add, {xs},
      [=](const Ins& in) { return cumsum(in[0], dim); },
      [=](const Values& v) {
        const int64_t d = wrap(dim, xs.size());
        return along(v[0], xs, d, xs.size() ? xs[d] : 1, [](const Vec& line) {
          Vec o;
          double s = 0;
          for (double e : line) o.push_back(s += e);
          return o;
        });
      },
      xs);
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  if (xs.size() == 0 || xs[wrap(dim, xs.size())] <= 1) r.op = OpId::Copy;  // nothing to add
  return r;
}

// var (std when `root`) over dims (all when empty).
OpRow var_row(bool root, Shape xs, std::vector<int64_t> dims, double correction, bool keepdim) {
  std::vector<int64_t> w;
  for (int64_t d : dims) w.push_back(wrap(d, xs.size()));
  if (w.empty())
    for (int64_t d = 0; d < xs.size(); ++d) w.push_back(d);
  Shape out;
  for (int64_t d = 0; d < xs.size(); ++d) {
    const bool red = std::find(w.begin(), w.end(), d) != w.end();
    if (!red)
      out.push_back(xs[d]);
    else if (keepdim)
      out.push_back(1);
  }
  OpRow r = row(
      fmt::format("{} {} dims {} correction {}{}", root ? "std" : "var", xs.str(), Dims(dims).str(),
                  correction, keepdim ? " keepdim" : ""),
      OpId::Sum, {xs},
      [=](const Ins& in) {
        return root ? duet::std(in[0], Dims(dims), correction, keepdim)
                    : var(in[0], Dims(dims), correction, keepdim);
      },
      [=](const Values& v) {
        // Group the elements by their position in the dims that stay.
        Shape kept = xs;
        for (int64_t d : w) kept[d] = 1;
        std::vector<Vec> groups(static_cast<size_t>(kept.numel()));
        for (int64_t i = 0; i < xs.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, xs);
          for (int64_t d : w) p[d] = 0;
          groups[ravel(p, kept)].push_back(v[0][i]);
        }
        Vec o;
        for (const Vec& g : groups) {
          const double m = std::accumulate(g.begin(), g.end(), 0.0) / g.size();
          double ss = 0;
          for (double e : g) ss += (e - m) * (e - m);
          const double var = ss / std::max(0.0, double(g.size()) - correction);
          o.push_back(root ? std::sqrt(var) : var);
        }
        return o;
      },
      out);
  r.tol32 = 1e-4;
  return r;
}

OpRow extreme_row(bool largest, bool indices, Shape xs, int64_t dim, bool keepdim) {
  const int64_t d = wrap(dim, xs.size());
  Shape out = xs;
  if (xs.size()) {
    if (keepdim)
      out[d] = 1;
    else
      out.erase(d);
  }
  OpRow r = row(
      fmt::format("{} {} dim {}{} {}", largest ? "max_with_indices" : "min_with_indices", xs.str(),
                  dim, keepdim ? " keepdim" : "", indices ? "indices" : "values"),
      indices ? OpId::Argmax : OpId::Gather, {xs},
      [=](const Ins& in) {
        auto [v, i] =
            largest ? max_with_indices(in[0], dim, keepdim) : min_with_indices(in[0], dim, keepdim);
        CHECK(i.dtype() == DType::i64);
        return indices ? i : v;
      },
      [=](const Values& v) {
        return along(v[0], xs, d, 1, [&](const Vec& line) {
          size_t best = 0;
          for (size_t j = 1; j < line.size(); ++j)
            if (largest ? line[j] > line[best] : line[j] < line[best]) best = j;
          return Vec{indices ? double(best) : line[best]};
        });
      },
      out);
  r.dtypes = kNumeric;
  r.index_result = indices;
  if (indices) r.domains = {kTies};
  return r;
}

OpRow amax_row(bool largest, Shape xs, std::vector<int64_t> dims, bool keepdim) {
  OpRow r = var_row(false, xs, dims, 0, keepdim);  // for its output shape and grouping
  const Shape out = r.out;
  r.name = fmt::format("{} {} dims {}{}", largest ? "amax" : "amin", xs.str(), Dims(dims).str(),
                       keepdim ? " keepdim" : "");
  r.op = largest ? OpId::Max : OpId::Min;
  r.fn = [=](const Ins& in) {
    return largest ? amax(in[0], Dims(dims), keepdim) : amin(in[0], Dims(dims), keepdim);
  };
  std::vector<int64_t> w;
  for (int64_t d : dims) w.push_back(wrap(d, xs.size()));
  if (w.empty())
    for (int64_t d = 0; d < xs.size(); ++d) w.push_back(d);
  r.ref = [=](const Values& v) {
    Shape kept = xs;
    for (int64_t d : w) kept[d] = 1;
    Vec o(static_cast<size_t>(kept.numel()), largest ? -INFINITY : INFINITY);
    for (int64_t i = 0; i < xs.numel(); ++i) {
      std::vector<int64_t> p = unravel(i, xs);
      for (int64_t d : w) p[d] = 0;
      double& m = o[ravel(p, kept)];
      m = largest ? std::max(m, v[0][i]) : std::min(m, v[0][i]);
    }
    return o;
  };
  r.dtypes = kNumeric;
  r.tol32 = 1e-5;
  return r;
}

// ---- sorting ----------------------------------------------------------------------------------

// The stable order of a line (ascending or descending).
std::vector<size_t> order_of(const Vec& line, bool descending) {
  std::vector<size_t> o(line.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](size_t a, size_t b) {
    return descending ? line[a] > line[b] : line[a] < line[b];
  });
  return o;
}

// what: 0 sort values, 1 sort indices (argsort), 2 topk values, 3 topk indices.
OpRow sort_row(int what, Shape xs, int64_t dim, bool descending, int64_t k = 0) {
  const int64_t d = wrap(dim, xs.size());
  const bool top = what >= 2, indices = what % 2 == 1;
  const int64_t n = xs.size() ? xs[d] : 1, m = top ? k : n;
  Shape out = xs;
  if (xs.size()) out[d] = m;
  const char* names[] = {"sort values", "argsort", "topk values", "topk indices"};
  OpRow r = row(
      fmt::format("{} {} dim {}{}{}", names[what], xs.str(), dim, descending ? " descending" : "",
                  top ? fmt::format(" k {}", k) : ""),
      indices ? OpId::Argsort : OpId::Gather, {xs},
      [=](const Ins& in) {
        if (what == 1) return argsort(in[0], dim, descending);
        auto [v, i] = top ? topk(in[0], k, dim, descending) : sort(in[0], dim, descending);
        CHECK(i.dtype() == DType::i64);
        return indices ? i : v;
      },
      [=](const Values& v) {
        return along(v[0], xs, d, m, [&](const Vec& line) {
          std::vector<size_t> o = order_of(line, descending);
          Vec res;
          for (int64_t j = 0; j < m; ++j) res.push_back(indices ? double(o[j]) : line[o[j]]);
          return res;
        });
      },
      out);
  r.dtypes = indices ? kAll : kNumeric;
  r.index_result = indices;
  if (indices) r.domains = {kTies};  // ties: the order must be stable
  r.composite = what != 1;           // argsort is the Argsort primitive's own row
  return r;
}

// ---- nll_loss -----------------------------------------------------------------------------------

// weighted: a second input, one weight per class (positive), scales each target's loss and the
// mean's denominator.
OpRow nll_row(Shape ls, Vec target, Shape ts, std::string reduction, int64_t ignore = -100,
              bool weighted = false) {
  Shape out = reduction == "none" ? ts : Shape{};
  const int64_t classes = ls.size() == 1 ? ls[0] : ls[1];
  std::vector<Shape> shapes = {ls};
  if (weighted) shapes.push_back({classes});
  OpRow r = row(
      fmt::format("nll_loss {} target {} {} {}{}{}", ls.str(), ts.str(), fmt::join(target, ","),
                  reduction, ignore != -100 ? " ignore_index" : "", weighted ? " weight" : ""),
      OpId::Gather, shapes,
      [=](const Ins& in) {
        const Tensor t = make(target, ts, DType::i64);
        return weighted ? nll_loss(in[0], t, in[1], reduction, ignore)
                        : nll_loss(in[0], t, reduction, ignore);
      },
      [=](const Values& v) {
        Vec each;
        double total = 0, count = 0;
        for (int64_t i = 0; i < ts.numel(); ++i) {
          std::vector<int64_t> p = unravel(i, ts);
          const int64_t t = static_cast<int64_t>(target[i]);
          double loss = 0;
          if (t != ignore) {
            std::vector<int64_t> q = p;
            q.insert(q.begin() + (ls.size() == 1 ? 0 : 1), t);
            const double w = weighted ? v[1][static_cast<size_t>(t)] : 1.0;
            loss = -v[0][ravel(q, ls)] * w;
            count += w;
          }
          each.push_back(loss);
          total += loss;
        }
        if (reduction == "none") return each;
        return Vec{reduction == "sum" ? total : total / count};
      },
      out);
  if (weighted) r.domains = {Domain{}, Domain{0.1, 2}};
  // Weighted, each term is a product rounded to the low dtype, and terms of both signs cancel in
  // the sum: its error scales with the terms (up to 4 here), not with the result (a draw of
  // f16 inputs summed to 0.53 with an error of 1.8e-3).
  if (weighted) r.low_rtol_scale = 4;
  return r;
}

// ---- einsum -------------------------------------------------------------------------------------

// The sum over every assignment of the letters of the products of the operands' elements.
Vec ref_einsum(const std::string& lhs, const std::string& outl, const Values& v,
               const std::vector<Shape>& shapes, Shape* out_shape) {
  std::vector<std::string> ins(1);
  for (char c : lhs) {
    if (c == ',')
      ins.emplace_back();
    else
      ins.back().push_back(c);
  }
  std::string letters;
  std::vector<int64_t> size;
  for (size_t i = 0; i < ins.size(); ++i)
    for (size_t k = 0; k < ins[i].size(); ++k)
      if (letters.find(ins[i][k]) == std::string::npos) {
        letters += ins[i][k];
        size.push_back(shapes[i][k]);
      }
  Shape out;
  for (char c : outl) out.push_back(size[letters.find(c)]);
  Shape all;
  for (int64_t s : size) all.push_back(s);
  Vec o(static_cast<size_t>(out.numel()), 0.0);
  for (int64_t a = 0; a < all.numel(); ++a) {
    std::vector<int64_t> p = unravel(a, all);
    double prod = 1;
    for (size_t i = 0; i < ins.size(); ++i) {
      std::vector<int64_t> q;
      for (char c : ins[i]) q.push_back(p[letters.find(c)]);
      prod *= v[i][ravel(q, shapes[i])];
    }
    std::vector<int64_t> q;
    for (char c : outl) q.push_back(p[letters.find(c)]);
    o[ravel(q, out)] += prod;
  }
  if (out_shape) *out_shape = out;
  return o;
}

OpRow einsum_row(std::string eq, std::vector<Shape> shapes, OpId op = OpId::MatMul) {
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::string outl;
  if (arrow != std::string::npos) {
    outl = eq.substr(arrow + 2);
  } else {
    for (char c : lhs)
      if (c != ',' && std::count(lhs.begin(), lhs.end(), c) == 1) outl += c;
    std::sort(outl.begin(), outl.end());
  }
  Shape out;
  Values zeros;
  for (const Shape& s : shapes) zeros.push_back(Vec(static_cast<size_t>(s.numel())));
  ref_einsum(lhs, outl, zeros, shapes, &out);
  OpRow r = row(
      fmt::format("einsum \"{}\"", eq), op, shapes, [=](const Ins& in) { return einsum(eq, in); },
      [=](const Values& v) { return ref_einsum(lhs, outl, v, shapes, nullptr); }, out);
  r.tol32 = 1e-5;
  // A chain of n products rounds n - 1 intermediates to the low dtype (as PyTorch's einsum
  // does), and each later product carries that error on; with cancelling sums it exceeds one
  // rounding's rtol (a 3-operand chain in f16 measured 3x).
  r.low_rtol_scale = shapes.size() > 2 ? 4.0 * static_cast<double>(shapes.size() - 2) : 1.0;
  // A chain of n products rounds n - 1 intermediates to the low dtype (as PyTorch's einsum
  // does), and each later product carries that error on; with cancelling sums it exceeds one
  // rounding's rtol (a 3-operand chain in f16 measured 3x).
  r.low_rtol_scale = shapes.size() > 2 ? 4.0 * static_cast<double>(shapes.size() - 2) : 1.0;
  return r;
}

}  // namespace

// ---- optimization_barrier -----------------------------------------------------------------------

// x itself, after a second input of any shape that it does not read.
OpRow barrier_row(Shape xs, Shape after) {
  OpRow r = row(
      fmt::format("optimization_barrier {} after {}", xs.str(), after.str()),
      OpId::OptimizationBarrier, {xs, after},
      [](const Ins& in) { return detail::optimization_barrier(in[0], in[1]); },
      [](const Values& v) { return v[0]; }, xs);
  r.composite = false;
  r.dtypes = kAll;
  return r;
}

// ---- fused_lstm_cell and its gradient ---------------------------------------------------------

double sigmoid_of(double x) { return 1 / (1 + std::exp(-x)); }

// PyTorch's LSTM cell in doubles, row by row: h' then c' (forward), or the gradient of the
// summed gates then of c, given the result's gradient v[3] (backward).
Vec ref_lstm(const Values& v, int64_t h, bool backward) {
  const int64_t rows = h ? static_cast<int64_t>(v[2].size()) / h : 0;
  Vec out(static_cast<size_t>(rows * (backward ? 5 : 2) * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < h; ++j) {
      auto a = [&](int64_t k) {
        const auto at = static_cast<size_t>(r * 4 * h + k * h + j);
        return v[0][at] + v[1][at];
      };
      const double i = sigmoid_of(a(0)), f = sigmoid_of(a(1)), g = std::tanh(a(2)),
                   o = sigmoid_of(a(3)), c = v[2][static_cast<size_t>(r * h + j)];
      const double cn = f * c + i * g, tc = std::tanh(cn);
      double* y = &out[static_cast<size_t>(r * (backward ? 5 : 2) * h + j)];
      if (!backward) {
        y[0] = o * tc;
        y[h] = cn;
        continue;
      }
      const double dh = v[3][static_cast<size_t>(r * 2 * h + j)];
      const double dc = v[3][static_cast<size_t>(r * 2 * h + h + j)] + dh * o * (1 - tc * tc);
      y[0] = dc * g * i * (1 - i);
      y[h] = dc * c * f * (1 - f);
      y[2 * h] = dc * i * (1 - g * g);
      y[3 * h] = dh * tc * o * (1 - o);
      y[4 * h] = dc * f;
    }
  return out;
}

Shape with_last(Shape s, int64_t n) {
  s.push_back(n);
  return s;
}

// fused_lstm_cell on gates (lead..., 4H) and c (lead..., H); the row's value is h' then c'. Rows
// too large for the gradient sweep (inputs of at most 24 elements) are forward only; the
// backward rows cover their gradients.
OpRow lstm_row(Shape lead, int64_t h) {
  OpRow r = row(
      fmt::format("fused_lstm_cell {} hidden {}", lead.str(), h), OpId::LstmCell,
      {with_last(lead, 4 * h), with_last(lead, 4 * h), with_last(lead, h)},
      [](const Ins& in) {
        auto [hn, cn] = fused_lstm_cell(in[0], in[1], in[2]);
        return cat({hn, cn}, -1);
      },
      [h](const Values& v) { return ref_lstm(v, h, false); }, with_last(lead, 2 * h));
  r.composite = false;
  r.domains = {Domain{-3, 3}};
  r.grad = lead.numel() * 4 * h <= 24;
  return r;
}

// lstm_cell_backward, reached through the gradient of fused_lstm_cell with respect to its three
// operands, given the result's gradient (the fourth input).
OpRow lstm_backward_row(Shape lead, int64_t h) {
  OpRow r = row(
      fmt::format("lstm_cell_backward (grad of fused_lstm_cell) {} hidden {}", lead.str(), h),
      OpId::LstmCellBackward,
      {with_last(lead, 4 * h), with_last(lead, 4 * h), with_last(lead, h), with_last(lead, 2 * h)},
      [](const Ins& in) {
        std::vector<Tensor> x;
        for (int k = 0; k < 3; ++k) x.push_back(in[k].detach().requires_grad_(true));
        auto [hn, cn] = fused_lstm_cell(x[0], x[1], x[2]);
        std::vector<Tensor> gs = grad({cat({hn, cn}, -1)}, {x[0], x[2]}, {in[3]});
        return cat({gs[0], gs[1]}, -1);
      },
      [h](const Values& v) { return ref_lstm(v, h, true); }, with_last(lead, 5 * h));
  r.composite = false;
  r.domains = {Domain{-3, 3}};
  r.grad = false;  // second derivatives go through elementwise ops (Note [LSTM cell])
  return r;
}

// PyTorch's GRU cell in doubles, row by row: h' (forward), or the gradients of gates_x,
// gates_h and h given h''s gradient v[3] (backward).
Vec ref_gru(const Values& v, int64_t h, bool backward) {
  const int64_t rows = h ? static_cast<int64_t>(v[2].size()) / h : 0;
  Vec out(static_cast<size_t>(rows * (backward ? 7 : 1) * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < h; ++j) {
      auto gx = [&](int64_t k) { return v[0][static_cast<size_t>(r * 3 * h + k * h + j)]; };
      auto gh = [&](int64_t k) { return v[1][static_cast<size_t>(r * 3 * h + k * h + j)]; };
      const double rg = sigmoid_of(gx(0) + gh(0)), z = sigmoid_of(gx(1) + gh(1));
      const double n = std::tanh(gx(2) + rg * gh(2)), hp = v[2][static_cast<size_t>(r * h + j)];
      if (!backward) {
        out[static_cast<size_t>(r * h + j)] = (1 - z) * n + z * hp;
        continue;
      }
      const double g = v[3][static_cast<size_t>(r * h + j)];
      const double dn = g * (1 - z) * (1 - n * n), dz = g * (hp - n) * z * (1 - z);
      const double dr = dn * gh(2) * rg * (1 - rg);
      double* y = &out[static_cast<size_t>(r * 7 * h + j)];
      const double d[] = {dr, dz, dn, dr, dz, dn * rg, g * z};
      for (int64_t k = 0; k < 7; ++k) y[k * h] = d[k];
    }
  return out;
}

// fused_gru_cell on gates (lead..., 3H) and h (lead..., H); forward only where too large for
// the gradient sweep.
OpRow gru_row(Shape lead, int64_t h) {
  OpRow r = row(
      fmt::format("fused_gru_cell {} hidden {}", lead.str(), h), OpId::GruCell,
      {with_last(lead, 3 * h), with_last(lead, 3 * h), with_last(lead, h)},
      [](const Ins& in) { return fused_gru_cell(in[0], in[1], in[2]); },
      [h](const Values& v) { return ref_gru(v, h, false); }, with_last(lead, h));
  r.composite = false;
  r.domains = {Domain{-3, 3}};
  r.grad = lead.numel() * 3 * h <= 24;
  return r;
}

// gru_cell_backward through the gradient of fused_gru_cell, given h''s gradient (input 4).
OpRow gru_backward_row(Shape lead, int64_t h) {
  OpRow r = row(
      fmt::format("gru_cell_backward (grad of fused_gru_cell) {} hidden {}", lead.str(), h),
      OpId::GruCellBackward,
      {with_last(lead, 3 * h), with_last(lead, 3 * h), with_last(lead, h), with_last(lead, h)},
      [](const Ins& in) {
        std::vector<Tensor> x;
        for (int k = 0; k < 3; ++k) x.push_back(in[k].detach().requires_grad_(true));
        std::vector<Tensor> gs = grad({fused_gru_cell(x[0], x[1], x[2])}, x, {in[3]});
        return cat({gs[0], gs[1], gs[2]}, -1);
      },
      [h](const Values& v) { return ref_gru(v, h, true); }, with_last(lead, 7 * h));
  r.composite = false;
  r.domains = {Domain{-3, 3}};
  r.grad = false;  // second derivatives go through elementwise ops (Note [LSTM cell])
  return r;
}

const std::vector<OpRow>& more_rows() {
  static const std::vector<OpRow> rows = [] {
    std::vector<OpRow> r = {
        masked_fill_row({3, 4}, {1, 4}, {1, 0, 1, 0}, 3, false),
        masked_fill_row({2, 3}, {2, 3}, {0, 1, 1, 0, 0, 1}, -1, false),
        masked_fill_row({}, {}, {1}, 2, false),
        masked_fill_row({0, 3}, {3}, {1, 0, 1}, 2, false),
        masked_fill_row({3, 2}, {3, 1}, {1, 0, 1}, 0, true),
        masked_fill_row({}, {}, {1}, 0, true),
        triangle_row(true, {3, 4}, 0),
        triangle_row(true, {2, 3, 4}, 1),
        triangle_row(true, {4, 3}, -1),
        triangle_row(true, {0, 3}, 0),
        triangle_row(false, {3, 4}, 0),
        triangle_row(false, {2, 4, 3}, -1),
        triangle_row(false, {3, 3}, 2),
        flip_row({2, 3, 4}, {0, 2}),
        flip_row({5}, {-1}),
        flip_row({3, 2}, {}),
        flip_row({}, {0}),
        flip_row({0, 3}, {0, 1}),
        roll_row({3, 4}, {1, -1}, {0, 1}),
        roll_row({2, 3}, {5}, {}),
        roll_row({4, 2}, {-6}, {0}),
        roll_row({}, {3}, {}),
        roll_row({0, 2}, {1}, {1}),
        pad_row({2, 3}, {1, 2}, "constant", 0.5),
        pad_row({2, 3}, {1, 0, 2, 1}, "constant"),
        pad_row({3, 4}, {-1, 1, 0, -2}, "constant", 2),
        pad_row({0, 2}, {1, 1}, "constant"),
        pad_row({2, 4}, {2, 1}, "reflect"),
        pad_row({1, 3, 3}, {1, 1, 2, 0}, "reflect"),
        pad_row({5}, {4, 4}, "reflect"),
        pad_row({2, 3}, {2, 1}, "replicate"),
        pad_row({1, 2, 3}, {0, 3, 2, 1}, "replicate"),
        pad_row({1}, {2, 3}, "replicate"),
        pad_row({2, 4}, {4, 1}, "circular"),
        pad_row({1, 3, 2}, {1, 2, 3, 0}, "circular"),
        pad_row({0, 3}, {1, 2}, "circular"),
        cumsum_row({3, 5}, 1),
        cumsum_row({4, 3}, 0),
        cumsum_row({7}, 0),
        cumsum_row({2, 2, 5}, -1),
        cumsum_row({}, 0),
        cumsum_row({0, 3}, 0),
        cumsum_row({2, 0}, 1),
        var_row(false, {3, 4}, {1}, 1, false),
        var_row(false, {3, 4}, {}, 0, true),
        var_row(false, {2, 3, 4}, {0, -1}, 1, true),
        var_row(false, {5}, {0}, 2.5, false),
        var_row(true, {4, 5}, {1}, 1, false),
        var_row(true, {2, 6}, {}, 0, false),
        amax_row(true, {3, 4}, {1}, false),
        amax_row(true, {2, 3, 4}, {0, 2}, true),
        amax_row(true, {5}, {}, false),
        amax_row(false, {3, 4}, {0}, true),
        amax_row(false, {}, {}, false),
        extreme_row(true, false, {3, 4}, 1, false),
        extreme_row(true, true, {3, 4}, 1, false),
        extreme_row(true, false, {2, 3, 2}, 0, true),
        extreme_row(true, true, {2, 3, 2}, 0, true),
        extreme_row(false, false, {4, 3}, -1, false),
        extreme_row(false, true, {4, 3}, -1, false),
        extreme_row(true, false, {}, 0, false),
        extreme_row(false, true, {}, 0, true),
        sort_row(0, {3, 5}, -1, false),
        sort_row(0, {4, 3}, 0, true),
        sort_row(0, {2, 2, 3}, 1, false),
        sort_row(0, {}, 0, false),
        sort_row(0, {0, 3}, 1, false),
        sort_row(1, {3, 5}, -1, false),
        sort_row(1, {4, 3}, 0, true),
        sort_row(1, {7}, 0, true),
        sort_row(1, {}, 0, false),
        sort_row(2, {3, 5}, 1, true, 2),
        sort_row(2, {5, 3}, 0, false, 3),
        sort_row(2, {6}, 0, true, 6),
        sort_row(2, {2, 4}, 1, true, 0),
        sort_row(3, {3, 5}, 1, true, 2),
        sort_row(3, {5, 3}, 0, false, 3),
        nll_row({3, 4}, {2, 0, 3}, {3}, "mean"),
        nll_row({3, 4}, {2, 0, 3}, {3}, "sum"),
        nll_row({3, 4}, {2, 0, 3}, {3}, "none"),
        nll_row({3, 4}, {2, -100, 1}, {3}, "mean"),
        nll_row({3, 4}, {2, 5, 1}, {3}, "none", 5),
        nll_row({2, 3, 2}, {0, 2, 1, 1}, {2, 2}, "mean"),
        nll_row({4}, {3}, {}, "none"),
        nll_row({0, 4}, {}, {0}, "sum"),
        nll_row({3, 4}, {2, 0, 3}, {3}, "mean", -100, true),
        nll_row({3, 4}, {2, 1, 3}, {3}, "none", 1, true),
        nll_row({2, 3, 2}, {0, 2, 1, 1}, {2, 2}, "sum", -100, true),
        einsum_row("ij,jk->ik", {{2, 3}, {3, 4}}),
        einsum_row("bij,bjk->bik", {{2, 2, 3}, {2, 3, 2}}),
        einsum_row("i,j->ij", {{3}, {4}}),
        einsum_row("ij->ji", {{3, 4}}, OpId::Permute),
        einsum_row("i,i->", {{5}, {5}}),
        einsum_row("bhqd,bhkd->bhqk", {{1, 2, 3, 2}, {1, 2, 2, 2}}),
        einsum_row("ij->", {{3, 4}}, OpId::Sum),
        einsum_row("ijk->j", {{2, 3, 2}}, OpId::Sum),
        einsum_row("ij,jk,kl->il", {{2, 3}, {3, 2}, {2, 2}}),
        einsum_row("ij,jk", {{2, 3}, {3, 2}}),
        einsum_row("ij,ij->i", {{3, 4}, {3, 4}}),
        einsum_row("bi,bj->bij", {{2, 3}, {2, 2}}),
        einsum_row("ij,kj->ik", {{0, 3}, {2, 3}}),
        einsum_row("ij,j->i", {{3, 4}, {4}}),
        barrier_row({3, 4}, {2}),
        barrier_row({}, {3, 1}),
        barrier_row({0, 2}, {}),
        lstm_row({2}, 2),
        lstm_row({}, 3),
        lstm_row({2, 3}, 5),
        lstm_row({0}, 2),
        lstm_row({3}, 300),  // past one block of 256 units
        lstm_backward_row({2}, 2),
        lstm_backward_row({3, 2}, 4),
        lstm_backward_row({2}, 300),
        gru_row({2}, 2),
        gru_row({}, 3),
        gru_row({2, 3}, 5),
        gru_row({0}, 2),
        gru_row({3}, 300),
        gru_backward_row({2}, 2),
        gru_backward_row({3, 2}, 4),
        gru_backward_row({2}, 300),
    };
    for (OpRow& s : step_rows()) r.push_back(std::move(s));
    r.push_back(bag_row(5, 3, {0, 2, 2, 4, 1, 3, 0}, {0, 2, 2, 5}, 0, "sum", true, {}));
    r.push_back(bag_row(5, 3, {0, 2, 2, 4, 1, 3, 0}, {0, 3}, 0, "mean", false, 2));
    r.push_back(bag_row(4, 2, {3, 1, 0, 1, 2, 2}, {}, 3, "mean", false, {}));
    r.push_back(bag_row(4, 2, {3, 1, 0, 1, 2, 2}, {}, 2, "sum", true, 1));
    r.push_back(bag_row(5, 3, {0, 2, 2, 4, 1, 3, 0}, {0, 2, 2, 5}, 0, "max", false, 4));
    r.push_back(bag_row(4, 2, {3, 1, 0, 1, 2, 2}, {}, 3, "max", false, {}));
    add_pieces(r, "split (5, 3) size 2", {5, 3}, 0, {2, 2, 1},
               [](const Tensor& x) { return split(x, 2, 0); });
    add_pieces(r, "split (2, 4) sizes {1, 3} dim 1", {2, 4}, 1, {1, 3}, [](const Tensor& x) {
      return split(x, std::vector<int64_t>{1, 3}, 1);
    });
    add_pieces(r, "split (2, 4) size 4 dim -1", {2, 4}, -1, {4},
               [](const Tensor& x) { return split(x, 4, -1); });
    add_pieces(r, "split (0, 2) size 3", {0, 2}, 0, {0},
               [](const Tensor& x) { return split(x, 3, 0); });
    add_pieces(r, "chunk (7, 2) into 3", {7, 2}, 0, {3, 3, 1},
               [](const Tensor& x) { return chunk(x, 3, 0); });
    add_pieces(r, "chunk (2, 6) into 4 dim 1", {2, 6}, 1, {2, 2, 2},
               [](const Tensor& x) { return chunk(x, 4, 1); });
    add_pieces(r, "chunk (0, 2) into 2", {0, 2}, 0, {0, 0},
               [](const Tensor& x) { return chunk(x, 2, 0); });
    // narrow(x, dim, start, length) is the piece [start, start + length).
    r.push_back(piece_row("narrow (5, 3) dim 0 start 1 length 3", {5, 3}, 0, {1, 3, 1}, 1,
                          [](const Tensor& x) {
                            return std::vector<Tensor>{x, narrow(x, 0, 1, 3), x};
                          }));
    r.push_back(piece_row("narrow (2, 6) dim -1 start -2 length 2", {2, 6}, -1, {4, 2}, 1,
                          [](const Tensor& x) {
                            return std::vector<Tensor>{x, x.narrow(-1, -2, 2)};
                          }));
    for (OpRow& m : math_rows()) r.push_back(std::move(m));
    for (OpRow& m : arrange_rows()) r.push_back(std::move(m));
    return r;
  }();
  return rows;
}

}  // namespace duet::test
