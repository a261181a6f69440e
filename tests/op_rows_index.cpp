// Rows of the indexing and joining ops (Gather, ScatterAdd, Cat, Argmax) and their composites
// (index_select, embedding, stack, argmin), with references on plain doubles (see op_rows.h).
#include <cmath>

#include "op_rows.h"

namespace duet::test {
namespace {

using L = Layout;
using Ins = std::vector<Tensor>;
using Idx = std::vector<double>;

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8};
const std::vector<DType> kNumeric = {DType::f32, DType::f64, DType::i32, DType::i64};
// Few distinct values, so that argmax and argmin meet ties.
const Domain kTies{-1, 1, -2, 2, true};

int64_t wrap(int64_t dim, const Shape& s) { return dim < 0 ? dim + s.size() : dim; }

Tensor ix(const Idx& v, const Shape& s, Layout l = L::Contiguous) {
  return make_layout(v, s, DType::i64, l);
}

// out[p] = x[p with dim replaced by index[p]] (a 0-d x holds one element).
std::vector<double> ref_gather(const std::vector<double>& x, const Shape& xs, int64_t dim,
                               const Idx& index, const Shape& is) {
  std::vector<double> out;
  for (int64_t i = 0; i < is.numel(); ++i) {
    if (xs.size() == 0) {
      out.push_back(x[0]);
      continue;
    }
    std::vector<int64_t> p = unravel(i, is);
    p[wrap(dim, xs)] = static_cast<int64_t>(index[i]);
    out.push_back(x[ravel(p, xs)]);
  }
  return out;
}

std::vector<double> ref_scatter_add(const std::vector<double>& base, const Shape& bs, int64_t dim,
                                    const Idx& index, const Shape& is,
                                    const std::vector<double>& src) {
  std::vector<double> out = base;
  for (int64_t i = 0; i < is.numel(); ++i) {
    if (bs.size() == 0) {
      out[0] += src[i];
      continue;
    }
    std::vector<int64_t> p = unravel(i, is);
    p[wrap(dim, bs)] = static_cast<int64_t>(index[i]);
    out[ravel(p, bs)] += src[i];
  }
  return out;
}

// Element p of the result comes from the part whose range along dim holds p[dim].
std::vector<double> ref_cat(const Values& v, const std::vector<Shape>& shapes, int64_t dim,
                            const Shape& out) {
  dim = wrap(dim, out);
  std::vector<double> r;
  for (int64_t i = 0; i < out.numel(); ++i) {
    std::vector<int64_t> p = unravel(i, out);
    size_t k = 0;
    while (p[dim] >= shapes[k][dim]) p[dim] -= shapes[k++][dim];
    r.push_back(v[k][ravel(p, shapes[k])]);
  }
  return r;
}

// The first index of the extreme along dim; NaN is the extreme (its first occurrence).
std::vector<double> ref_arg(bool largest, const std::vector<double>& x, const Shape& xs,
                            int64_t dim) {
  if (xs.size() == 0) return {0};
  dim = wrap(dim, xs);
  Shape out = xs;
  out[dim] = 1;
  std::vector<double> r;
  for (int64_t o = 0; o < out.numel(); ++o) {
    std::vector<int64_t> p = unravel(o, out);
    int64_t best = -1;
    double bv = 0;
    for (int64_t j = 0; j < xs[dim]; ++j) {
      p[dim] = j;
      const double v = x[ravel(p, xs)];
      if (std::isnan(v)) {
        best = j;
        break;
      }
      if (best < 0 || (largest ? v > bv : v < bv)) best = j, bv = v;
    }
    r.push_back(static_cast<double>(best));
  }
  return r;
}

// The entries at a 1-D index along dim.
std::vector<double> ref_index_select(const std::vector<double>& x, const Shape& xs, int64_t dim,
                                     const Idx& index, Shape* out) {
  dim = wrap(dim, xs);
  *out = xs;
  (*out)[dim] = static_cast<int64_t>(index.size());
  std::vector<double> r;
  for (int64_t i = 0; i < out->numel(); ++i) {
    std::vector<int64_t> p = unravel(i, *out);
    p[dim] = static_cast<int64_t>(index[p[dim]]);
    r.push_back(x[ravel(p, xs)]);
  }
  return r;
}

Shape with_dim(Shape s, int64_t dim, int64_t n) {
  s[wrap(dim, s)] = n;
  return s;
}
Shape without_dim(Shape s, int64_t dim) {
  if (s.size()) s.erase(wrap(dim, s));
  return s;
}

OpRow gather_row(std::string name, Shape xs, int64_t dim, Idx idx, Shape is,
                 Layout il = L::Contiguous) {
  OpRow r{name,
          OpId::Gather,
          false,
          {xs},
          [=](const Ins& in) { return gather(in[0], dim, ix(idx, is, il)); },
          [=](const Values& v) { return ref_gather(v[0], xs, dim, idx, is); },
          is};
  r.dtypes = kAll;
  return r;
}

OpRow scatter_add_row(std::string name, Shape bs, int64_t dim, Idx idx, Shape is,
                      Layout il = L::Contiguous) {
  OpRow r{name,
          OpId::ScatterAdd,
          false,
          {bs, is},
          [=](const Ins& in) { return scatter_add(in[0], dim, ix(idx, is, il), in[1]); },
          [=](const Values& v) { return ref_scatter_add(v[0], bs, dim, idx, is, v[1]); },
          bs};
  r.dtypes = kNumeric;
  return r;
}

// Whole rows added at distinct rows, the index one column broadcast along them (stride 0), as
// the backward of index_select adds its gradient (Note [Slices' gradients] in
// eager/engine.cpp): the kernel's row by row path, with src in every layout.
OpRow rows_scatter_add_row() {
  const Idx rows = {2, 0, 3};
  Idx flat;
  for (int64_t r : rows) flat.insert(flat.end(), 3, r);
  OpRow r{"scatter_add dim 0, whole rows (index_select's gradient)",
          OpId::ScatterAdd,
          false,
          {{4, 3}, {3, 3}},
          [=](const Ins& in) {
            const Tensor column = ix(rows, {3, 1});
            return scatter_add(in[0], 0, expand(column, {3, 3}), in[1]);
          },
          [=](const Values& v) {
            return ref_scatter_add(v[0], {4, 3}, 0, flat, {3, 3}, v[1]);
          },
          {4, 3}};
  r.dtypes = kNumeric;
  return r;
}

OpRow cat_row(std::string name, std::vector<Shape> shapes, int64_t dim, Shape out) {
  OpRow r{name,
          OpId::Cat,
          false,
          shapes,
          [=](const Ins& in) { return cat(in, dim); },
          [=](const Values& v) { return ref_cat(v, shapes, dim, out); },
          out};
  r.dtypes = kAll;
  return r;
}

// stack(parts, dim) is cat of the parts with a size-1 dim inserted at dim.
OpRow stack_row(std::string name, Shape part, int n, int64_t dim) {
  Shape one = part;
  const int64_t d = dim < 0 ? dim + part.size() + 1 : dim;
  one.insert(d, 1);
  Shape out = with_dim(one, d, n);
  OpRow r{name,
          OpId::Cat,
          true,
          std::vector<Shape>(static_cast<size_t>(n), part),
          [=](const Ins& in) { return stack(in, dim); },
          [=](const Values& v) {
            return ref_cat(v, std::vector<Shape>(static_cast<size_t>(n), one), d, out);
          },
          out};
  r.dtypes = kAll;
  return r;
}

OpRow arg_row(bool largest, Shape xs, int64_t dim, bool keepdim) {
  std::string name = fmt::format("{} {} dim {}{}", largest ? "argmax" : "argmin", xs.str(), dim,
                                 keepdim ? " keepdim" : "");
  Shape out = xs.size() && keepdim ? with_dim(xs, dim, 1) : without_dim(xs, dim);
  OpRow r{name,
          OpId::Argmax,
          !largest,
          {xs},
          [=](const Ins& in) {
            return largest ? argmax(in[0], dim, keepdim) : argmin(in[0], dim, keepdim);
          },
          [=](const Values& v) { return ref_arg(largest, v[0], xs, dim); },
          out};
  r.dtypes = kNumeric;
  r.domains = {kTies};
  r.index_result = true;
  return r;
}

OpRow index_select_row(std::string name, Shape xs, int64_t dim, Idx idx, Shape is = {}) {
  if (is.size() == 0 && idx.size() != 1) is = Shape{static_cast<int64_t>(idx.size())};
  Shape out;
  ref_index_select(std::vector<double>(xs.numel()), xs, dim, idx, &out);
  OpRow r{name,
          OpId::Gather,
          true,
          {xs},
          [=](const Ins& in) { return index_select(in[0], dim, ix(idx, is)); },
          [=](const Values& v) {
            Shape o;
            return ref_index_select(v[0], xs, dim, idx, &o);
          },
          out};
  r.dtypes = kAll;
  return r;
}

// embedding(weight, indices): rows of weight, indices.shape + (dim).
OpRow embedding_row(std::string name, Shape ws, Idx idx, Shape is) {
  Shape out = is;
  out.push_back(ws[1]);
  OpRow r{name,
          OpId::Gather,
          true,
          {ws},
          [=](const Ins& in) { return embedding(in[0], ix(idx, is)); },
          [=](const Values& v) {
            Shape o;
            return ref_index_select(v[0], ws, 0, idx, &o);
          },
          out};
  return r;
}

}  // namespace

const std::vector<OpRow>& index_rows() {
  static const std::vector<OpRow> rows = [] {
    std::vector<OpRow> r = {
        gather_row("gather dim 0", {3, 4}, 0, {2, 0, 1, 1, 0, 0, 2, 1}, {2, 4}),
        gather_row("gather dim 1, narrower index", {3, 4}, 1, {3, 3, 0, 1, 2, 1}, {2, 3}),
        gather_row("gather dim -1, rank 3", {2, 3, 4}, -1,
                   {0, 3, 1, 3, 2, 2, 1, 0, 0, 1, 3, 3, 2, 0, 1, 1, 2, 3, 0, 0}, {2, 2, 5}),
        gather_row("gather dim 1, transposed index", {2, 4}, 1, {3, 0, 2, 2, 1, 0}, {2, 3},
                   L::Transposed),
        gather_row("gather 0-d", {}, 0, {0}, {}),
        gather_row("gather empty index", {3, 4}, 0, {}, {0, 4}),
        gather_row("gather from an empty dim", {2, 0}, 1, {}, {2, 0}),
        scatter_add_row("scatter_add dim 0, repeated indices", {3, 4}, 0, {2, 0, 2, 2, 2, 0, 1, 2},
                        {2, 4}),
        scatter_add_row("scatter_add dim 1, narrower", {3, 4}, 1, {3, 3, 0, 1, 1, 1}, {3, 2}),
        scatter_add_row("scatter_add dim -1, rank 3", {2, 2, 3}, -1, {2, 0, 2, 1, 1, 1, 0, 0},
                        {2, 2, 2}),
        scatter_add_row("scatter_add transposed index", {2, 4}, 1, {0, 3, 3, 0, 1, 1}, {2, 3},
                        L::Transposed),
        scatter_add_row("scatter_add 0-d", {}, 0, {0}, {}),
        rows_scatter_add_row(),
        scatter_add_row("scatter_add empty index", {3, 4}, 0, {}, {0, 4}),
        scatter_add_row("scatter_add into an empty base", {0, 3}, 0, {}, {0, 2}),
        cat_row("cat dim 0", {{2, 3}, {1, 3}, {3, 3}}, 0, {6, 3}),
        cat_row("cat dim 1", {{2, 1}, {2, 3}}, 1, {2, 4}),
        cat_row("cat dim -1, rank 3", {{2, 2, 1}, {2, 2, 2}, {2, 2, 1}}, -1, {2, 2, 4}),
        cat_row("cat 1-D", {{3}, {2}}, 0, {5}),
        cat_row("cat with an empty part", {{2, 0}, {2, 3}, {2, 0}}, 1, {2, 3}),
        cat_row("cat of empty parts", {{0, 3}, {0, 3}}, 0, {0, 3}),
        cat_row("cat of one tensor", {{2, 3}}, 1, {2, 3}),
        stack_row("stack 0-d", {}, 3, 0),
        stack_row("stack dim 1", {2, 3}, 2, 1),
        stack_row("stack dim -1", {3, 2}, 3, -1),
        stack_row("stack empty", {0, 2}, 2, 0),
        arg_row(true, {3, 4}, 0, false),
        arg_row(true, {3, 4}, 1, true),
        arg_row(true, {2, 3, 4}, -2, false),
        arg_row(true, {5}, 0, false),
        arg_row(true, {}, 0, false),
        arg_row(true, {}, -1, true),
        arg_row(true, {0, 3}, 1, false),
        arg_row(false, {3, 4}, 1, false),
        arg_row(false, {2, 3, 4}, 0, true),
        arg_row(false, {}, 0, false),
        index_select_row("index_select dim 0, repeated", {3, 4}, 0, {2, 0, 2}),
        index_select_row("index_select dim -1, rank 3", {2, 3, 2}, -1, {1, 0, 1, 1}),
        index_select_row("index_select 1-D", {5}, 0, {4, 4, 1}),
        index_select_row("index_select 0-d index", {3, 2}, 1, {1}, {}),
        index_select_row("index_select empty index", {3, 2}, 0, {}, {0}),
        embedding_row("embedding (2, 3) indices, repeated", {5, 3}, {4, 0, 4, 2, 4, 1}, {2, 3}),
        embedding_row("embedding 0-d index", {4, 2}, {3}, {}),
        embedding_row("embedding empty indices", {4, 2}, {}, {0}),
    };
    // An expanded (stride-0) index.
    OpRow g = gather_row("gather expanded index", {3, 4}, 0, {2, 0, 1, 2}, {3, 4});
    g.fn = [](const Ins& in) { return gather(in[0], 0, expand(ix({2, 0, 1, 2}, {1, 4}), {3, 4})); };
    g.ref = [](const Values& v) {
      return ref_gather(v[0], {3, 4}, 0, {2, 0, 1, 2, 2, 0, 1, 2, 2, 0, 1, 2}, {3, 4});
    };
    r.push_back(g);
    // Large enough to cross the kernels' parallel threshold; forward only.
    Idx big(300 * 257);
    Rng rng(5);
    for (double& v : big) v = double(rng.next() % 257);
    for (OpRow row : {gather_row("gather big", {300, 257}, 1, big, {300, 257}),
                      arg_row(true, {300, 257, 2}, -1, false),
                      cat_row("cat big", {{300, 257}, {300, 100}}, 1, {300, 357})}) {
      row.dtypes = {DType::f32, DType::i32};
      row.grad = false;
      r.push_back(row);
    }
    return r;
  }();
  return rows;
}

}  // namespace duet::test
