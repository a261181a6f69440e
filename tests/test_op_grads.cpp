// The op sweep's gradient half: from every row of op_rows.h, gradcheck in float64 on samples
// derived from the row (0-d, broadcast, non-contiguous leaves, views taken inside the checked
// function), two backwards that must agree bit for bit, and zero-size inputs that must get
// gradients of the inputs' shapes. Every check on several inputs runs once with all of them
// requiring grad and once per input with that input alone requiring grad, the others detached
// (constants), so a rule's needs_grad branches are checked one by one (see requires_grad_patterns).
// Rows of ops that are not differentiable check that their results stay out of autograd. Inputs
// stay small (at most 24 elements): gradcheck runs one backward per output element and two
// forwards per input element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>

#include "grad_samples.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using L = Layout;
using Ins = std::vector<Tensor>;
using Fn = std::function<Tensor(const Ins&)>;

// What the sweep ran; each test case prints its part.
struct Counts {
  int gradchecks = 0, alone = 0, twice = 0, empty = 0, outside = 0;
};

void report(const char* what, const Counts& n) {
  std::string s = what;
  const std::pair<int, const char*> parts[] = {
      {n.gradchecks, "gradchecks"},
      {n.alone, "gradchecks with one input requiring grad"},
      {n.twice, "double backwards"},
      {n.empty, "zero-size backwards"},
      {n.outside, "results outside autograd"}};
  for (auto [count, name] : parts)
    if (count) s += fmt::format(", {} {}", count, name);
  MESSAGE(s);
}

bool differentiable(OpId op) { return detail::op_def(op).differentiable; }
bool has(const std::vector<DType>& v, DType d) {
  return std::find(v.begin(), v.end(), d) != v.end();
}
// Which rows the gradient sweep runs gradcheck on (the coverage test uses the same rules).
bool gradchecked(const ElementwiseRow& r) { return differentiable(r) && has(r.dtypes, DType::f64); }
bool gradchecked(const ReduceRow& r) { return has(r.dtypes, DType::f64); }
bool is_empty(const MatmulRow& r) { return r.a.numel() == 0 || r.b.numel() == 0; }
bool gradchecked(const MatmulRow& r) {
  return !is_empty(r) && r.a.numel() <= 24 && r.b.numel() <= 24;
}
bool is_empty(const ScatterRow& r) { return r.base.numel() == 0; }  // an empty src is fine

// n distinct values of [d.lo, d.hi] on a grid of step 1/64, shifted by a fraction of the step
// that depends on the input: values of different inputs never tie and none is 0, so abs, relu,
// maximum, minimum, max and min are checked away from their kinks and ties.
std::vector<double> smooth_values(int64_t n, const Domain& d, int input, Rng& rng) {
  const double h = 1.0 / 64, shift = h * (0.2 + 0.25 * input);
  const auto k0 = static_cast<int64_t>(std::ceil((d.lo - shift) / h));
  const auto k1 = static_cast<int64_t>(std::floor((d.hi - shift) / h));
  REQUIRE(k1 - k0 + 1 >= n);
  std::set<int64_t> used;
  std::vector<double> v;
  while (static_cast<int64_t>(v.size()) < n) {
    const int64_t k = k0 + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(k1 - k0 + 1));
    if (used.insert(k).second) v.push_back(static_cast<double>(k) * h + shift);
  }
  return v;
}

// n values in [-3, 3] that f32 holds exactly, as it does x +- 1/1024: a cast round trip through
// f32 then has exact finite differences with that eps.
constexpr double kExactEps = 1.0 / 1024;
std::vector<double> exact_values(int64_t n, Rng& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = (static_cast<double>(rng.next() % 384) - 192 + 0.5) / 64;
  return v;
}

Tensor leaf(const std::vector<double>& v, const Shape& shape, DType dt, Layout layout) {
  Tensor t = make_layout(v, shape, dt, layout);  // a view made outside autograd: still a leaf
  REQUIRE(t.is_leaf());
  t.requires_grad_();
  return t;
}

// gradcheck in float64 on every requires-grad pattern of the leaves (requires_grad_patterns in
// grad_samples.h): all of them, then each alone.
void check_grad(Counts& n, const Fn& fn, const Ins& leaves, double eps = 1e-6) {
  for (const std::vector<bool>& mask : requires_grad_patterns(leaves.size())) {
    INFO(pattern_name(mask));
    GradcheckResult r = gradcheck(fn, masked(leaves, mask), eps);
    CHECK_MESSAGE(r.ok, r.message);
    ++(every(mask) ? n.gradchecks : n.alone);
  }
}

void clear_grads(const Ins& leaves) {
  for (Tensor l : leaves) l.set_grad(Tensor());
}

bool same_bits(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  return x.size() == y.size() &&
         (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
}

void check_grad_meta(const Tensor& g, const Tensor& l) {
  REQUIRE(g.defined());
  CHECK(g.sizes().str() == l.sizes().str());
  CHECK(dtype_name(g.dtype()) == dtype_name(l.dtype()));
}

// Two fresh forward and backward runs give the same gradients, bit for bit; one graph kept with
// retain_graph gives twice the gradient after two backwards (.grad accumulates).
void check_twice(Counts& n, const Fn& fn, const Ins& leaves, Rng& rng) {
  clear_grads(leaves);
  Tensor out = fn(leaves);
  // Random weights, not ones: a rule that ignores the incoming gradient is caught.
  Tensor w =
      make(random_values(out.numel(), Domain{-2, 2}, DType::f64, rng), out.sizes(), out.dtype());
  out.backward(w);
  Ins first;
  for (const Tensor& l : leaves) first.push_back(l.grad());
  clear_grads(leaves);
  fn(leaves).backward(w);
  for (size_t i = 0; i < leaves.size(); ++i) {
    INFO("leaf " << i);
    check_grad_meta(first[i], leaves[i]);
    check_grad_meta(leaves[i].grad(), leaves[i]);
    CHECK(same_bits(first[i], leaves[i].grad()));
  }
  clear_grads(leaves);
  Tensor kept = fn(leaves);
  kept.backward(w, /*retain_graph=*/true);
  std::vector<std::vector<double>> once;
  for (const Tensor& l : leaves) once.push_back(values(l.grad()));
  kept.backward(w);
  for (size_t i = 0; i < leaves.size(); ++i) {
    for (double& v : once[i]) v *= 2;  // exact
    CHECK(differences(values(leaves[i].grad()), once[i], 0, 0).empty());
  }
  ++n.twice;
}

// A zero-size result: backward still reaches every leaf that requires grad, with zeros of the
// leaf's shape, on every requires-grad pattern; a leaf detached into a constant gets no .grad.
void check_empty(Counts& n, const Fn& fn, const Ins& leaves) {
  for (const std::vector<bool>& mask : requires_grad_patterns(leaves.size())) {
    INFO(pattern_name(mask));
    clear_grads(leaves);
    Tensor out = fn(masked(leaves, mask));
    CHECK(out.requires_grad());
    sum(out).backward();
    for (size_t i = 0; i < leaves.size(); ++i) {
      INFO("leaf " << i);
      const Tensor g = leaves[i].grad();
      if (!mask[i]) {
        CHECK(!g.defined());
        continue;
      }
      check_grad_meta(g, leaves[i]);
      CHECK(differences(values(g), std::vector<double>(g.numel(), 0), 0, 0).empty());
    }
    ++n.empty;
  }
}

// A result that autograd must not track: no grad_fn, no autograd state at all.
void check_outside(Counts& n, const Tensor& out) {
  CHECK(!out.requires_grad());
  CHECK(out.is_leaf());
  CHECK(out.unsafe_impl()->autograd == nullptr);
  ++n.outside;
}

// ---- elementwise samples ------------------------------------------------------------------

// The leaves of one row on one sample, and how they become the op's inputs.
struct Case {
  const GradSample* s = nullptr;
  int first = 0;  // the sample input of leaves[0]: 1 for where, whose input 0 is its condition
  Tensor cond;    // where's condition, a constant
  Ins leaves;
  // The op's inputs made from x, whose first element is the leaf of sample input first + skip.
  Ins args(const Ins& x, int skip = 0) const {
    Ins in;
    if (cond.defined()) in.push_back(cond);
    for (size_t k = 0; k < x.size(); ++k) in.push_back(take(x[k], *s, first + skip + int(k)));
    return in;
  }
};

Case make_case(const ElementwiseRow& row, const GradSample& s, DType dt, Rng& rng) {
  Case c;
  c.s = &s;
  c.first = row.cond_first ? 1 : 0;
  for (int i = 0; i < row.arity; ++i) {
    const Shape ls = leaf_shape(s, i);
    if (row.cond_first && i == 0) {
      std::vector<double> v = random_values(ls.numel(), Domain{}, DType::b8, rng);
      c.cond = take(make_layout(v, ls, DType::b8, s.layouts[i]), s, i);
      continue;
    }
    c.leaves.push_back(
        leaf(smooth_values(ls.numel(), grad_domains(row)[i], i, rng), ls, dt, s.layouts[i]));
  }
  return c;
}

}  // namespace

TEST_CASE("elementwise rows: gradcheck in float64 on every gradient sample and call form") {
  Counts n;
  Rng rng(21);
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (!gradchecked(row)) continue;
    for (const GradSample& s : grad_samples()) {
      if (row.arity < s.min_arity) continue;
      INFO(std::string(row.name) << ", sample " << std::string(s.name));
      Case c = make_case(row, s, DType::f64, rng);
      check_grad(
          n, [&](const Ins& x) { return row.fn(c.args(x)); }, c.leaves);
    }
    const GradSample& s = grad_samples()[1];  // (3, 4)
    INFO(std::string(row.name) << ", sample " << std::string(s.name));
    Case c = make_case(row, s, DType::f64, rng);
    const int last = row.arity - 1;
    if (row.fn_scalar) {
      INFO("a Scalar last operand");
      const Scalar v(smooth_values(1, grad_domains(row)[last], last, rng)[0]);
      check_grad(
          n, [&](const Ins& x) { return row.fn_scalar(c.args(x), v); },
          Ins(c.leaves.begin(), c.leaves.end() - 1));
    }
    if (row.fn_lscalar) {
      INFO("a Scalar first operand");
      const Scalar v(smooth_values(1, grad_domains(row)[0], 0, rng)[0]);
      check_grad(
          n, [&](const Ins& x) { return row.fn_lscalar(v, c.args(x, 1)); },
          Ins(c.leaves.begin() + 1, c.leaves.end()));
    }
    if (row.fn_rvalue) {
      // Expiring operands: recording must not reuse their buffers, which a node may have saved.
      INFO("an rvalue operand that requires grad");
      check_grad(
          n,
          [&](const Ins& x) {
            Ins in = c.args(x);
            in[0] = in[0] * 1.0;
            return row.fn_rvalue(std::move(in));
          },
          c.leaves);
      if (c.leaves.size() == 2) {
        INFO("an rvalue constant operand that nobody else holds");
        const Tensor a = take(c.leaves[0], s, 0).detach();
        check_grad(
            n,
            [&](const Ins& x) {
              Ins in = {a.clone(), take(x[0], s, 1)};
              return row.fn_rvalue(std::move(in));
            },
            Ins(c.leaves.begin() + 1, c.leaves.end()));
      }
    }
  }
  report("elementwise", n);
}

TEST_CASE("elementwise rows: two backwards agree bit for bit; zero-size inputs") {
  Counts n;
  Rng rng(22);
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (!gradchecked(row)) continue;
    for (DType dt : {DType::f32, DType::f64}) {
      for (const GradSample& s : grad_samples()) {
        if (row.arity < s.min_arity) continue;
        INFO(std::string(row.name) << " on " << dtype_name(dt) << ", " << std::string(s.name));
        Case c = make_case(row, s, dt, rng);
        check_twice(
            n, [&](const Ins& x) { return row.fn(c.args(x)); }, c.leaves, rng);
      }
      for (const GradSample& s : empty_samples()) {
        if (row.arity < s.min_arity) continue;
        INFO(std::string(row.name) << " on " << dtype_name(dt) << ", " << std::string(s.name));
        Case c = make_case(row, s, dt, rng);
        check_empty(
            n, [&](const Ins& x) { return row.fn(c.args(x)); }, c.leaves);
      }
    }
  }
  report("elementwise", n);
}

TEST_CASE("rows of ops that are not differentiable: results stay out of autograd") {
  Counts n;
  Rng rng(23);
  for (const ElementwiseRow& row : elementwise_rows()) {
    if (differentiable(row)) continue;
    INFO(std::string(row.name));
    for (DType dt : {DType::f32, DType::f64}) {
      Case c = make_case(row, grad_samples()[1], dt, rng);
      check_outside(n, row.fn(c.args(c.leaves)));
      if (row.fn_scalar) check_outside(n, row.fn_scalar(c.args({c.leaves[0]}), 0.5));
      if (row.fn_lscalar) check_outside(n, row.fn_lscalar(0.5, c.args({c.leaves[1]}, 1)));
    }
  }
  // Conversions to dtypes that cannot carry gradients end the graph, as in PyTorch.
  for (const ConversionRow& row : conversion_rows()) {
    if (row.keeps_dtype) continue;
    Tensor x = leaf(exact_values(6, rng), {2, 3}, DType::f64, L::Transposed);
    for (DType to : {DType::i32, DType::i64, DType::b8}) {
      INFO(std::string(row.name) << " to " << dtype_name(to));
      check_outside(n, row.fn(x, to));
    }
  }
  for (const SourceRow& row : source_rows()) {
    INFO(std::string(row.name));
    check_outside(n, row.fn());
  }
  report("not differentiable", n);
}

// ---- conversions, reductions, views, matmul, slice_scatter -----------------------------------

TEST_CASE("conversion rows: gradients through casts and copies") {
  struct ConvCase {
    const char* name;
    Shape shape;
    Layout layout;
    Shape small = {};  // leaf shape, expanded inside the function
  };
  const std::vector<ConvCase> cases = {
      {"0-d", {}, L::Contiguous},
      {"(3, 4)", {3, 4}, L::Contiguous},
      {"transposed", {3, 4}, L::Transposed},
      {"strided", {3, 4}, L::Strided},
      {"expanded", {3, 4}, L::Contiguous, {1, 4}},
      {"empty", {0, 3}, L::Contiguous},
  };
  Counts n;
  Rng rng(24);
  for (const ConversionRow& row : conversion_rows()) {
    for (const ConvCase& c : cases) {
      const Shape& ls = c.small.size() ? c.small : c.shape;
      for (DType dt : {DType::f64, DType::f32}) {
        INFO(std::string(row.name) << " from " << dtype_name(dt) << ", " << std::string(c.name));
        // Through f32 and back (Cast and Copy both ways); clone and contiguous keep the dtype.
        const DType to = row.keeps_dtype ? dt : dt == DType::f64 ? DType::f32 : DType::f64;
        Fn fn = [&](const Ins& x) {
          Tensor y = row.fn(c.small.size() ? expand(x[0], c.shape) : x[0], to);
          return y.to(dt);
        };
        Ins x = {leaf(exact_values(ls.numel(), rng), ls, dt, c.layout)};
        if (c.shape.numel() == 0) {
          check_empty(n, fn, x);
          continue;
        }
        if (dt == DType::f64) check_grad(n, fn, x, kExactEps);
        check_twice(n, fn, x, rng);
      }
    }
  }
  report("conversions", n);
}

TEST_CASE("reduce rows: gradcheck over dims sets and keepdim; ties across expanded copies") {
  struct GradReduceCase {
    const char* name;
    Shape shape;
    Layout layout;
    std::vector<std::vector<int64_t>> dims;
    Shape small = {};  // leaf shape, expanded inside (max and min then tie across the copies)
  };
  const std::vector<GradReduceCase> cases = {
      {"0-d", {}, L::Contiguous, {{}, {0}, {-1}}},
      {"rank 1", {5}, L::Contiguous, {{}, {0}}},
      {"rank 3", {2, 3, 2}, L::Contiguous, {{}, {0}, {1}, {-1}, {0, 2}, {0, 1, 2}}},
      {"transposed", {3, 4}, L::Transposed, {{}, {0}, {1}}},
      {"strided", {3, 4}, L::Strided, {{0}, {1}}},
      {"expanded rows", {3, 4}, L::Contiguous, {{}, {0}, {1}}, {1, 4}},
      {"expanded columns", {3, 4}, L::Contiguous, {{0}, {1}}, {3, 1}},
      {"empty", {2, 0, 3}, L::Contiguous, {{}, {0}, {1}, {2}, {0, 2}}},
      {"expanded to empty", {0, 4}, L::Contiguous, {{}, {0}, {1}}, {1, 4}},
  };
  Counts n;
  Rng rng(25);
  for (const ReduceRow& row : reduce_rows()) {
    REQUIRE(gradchecked(row));
    const bool extremum = row.kind == ReduceKind::Max || row.kind == ReduceKind::Min;
    for (const GradReduceCase& c : cases) {
      const Shape& ls = c.small.size() ? c.small : c.shape;
      for (const auto& dims : c.dims) {
        bool reduces_empty = dims.empty() && c.shape.numel() == 0;
        for (int64_t d : dims)
          if (c.shape.size()) reduces_empty |= c.shape[d < 0 ? d + c.shape.size() : d] == 0;
        if (extremum && reduces_empty) continue;  // an error (test_reduce_matmul.cpp)
        for (bool keepdim : {false, true}) {
          INFO(std::string(row.name) << ", " << std::string(c.name) << ", dims " << Dims(dims).str()
                                     << std::string(keepdim ? ", keepdim" : ""));
          Fn fn = [&](const Ins& x) {
            return row.fn(c.small.size() ? expand(x[0], c.shape) : x[0], Dims(dims), keepdim);
          };
          for (DType dt : {DType::f64, DType::f32}) {
            Ins x = {leaf(smooth_values(ls.numel(), Domain{-3, 3}, 0, rng), ls, dt, c.layout)};
            if (c.shape.numel() == 0) {
              check_empty(n, fn, x);
              continue;
            }
            if (dt == DType::f64) check_grad(n, fn, x);
            check_twice(n, fn, x, rng);
          }
        }
      }
    }
  }
  report("reductions", n);
}

TEST_CASE("view rows: gradcheck on contiguous, transposed and strided leaves") {
  Counts n;
  Rng rng(26);
  for (const ViewRow& row : view_rows()) {
    for (Layout layout : {L::Contiguous, L::Transposed, L::Strided}) {
      if ((layout == L::Transposed && row.in.size() < 2) ||
          (layout == L::Strided && row.in.size() < 1))
        continue;
      for (DType dt : {DType::f64, DType::f32}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", " << std::string(layout_name(layout)));
        Fn fn = [&](const Ins& x) { return row.fn(x[0]); };
        Ins x = {leaf(smooth_values(row.in.numel(), Domain{-3, 3}, 0, rng), row.in, dt, layout)};
        if (row.in.numel() == 0 || row.out.numel() == 0) {
          check_empty(n, fn, x);
          continue;
        }
        if (dt == DType::f64) check_grad(n, fn, x);
        check_twice(n, fn, x, rng);
      }
    }
  }
  report("views", n);
}

TEST_CASE("matmul rows: gradcheck on small operands; zero-size operands") {
  Counts n;
  Rng rng(27);
  for (const MatmulRow& row : matmul_rows()) {
    if (!is_empty(row) && !gradchecked(row)) continue;  // too big for finite differences
    for (DType dt : {DType::f64, DType::f32}) {
      INFO("matmul " << std::string(row.name) << " on " << dtype_name(dt));
      Ins x = {leaf(smooth_values(row.a.numel(), Domain{-1, 1}, 0, rng), row.a, dt, row.la),
               leaf(smooth_values(row.b.numel(), Domain{-1, 1}, 1, rng), row.b, dt, row.lb)};
      Fn fn = [](const Ins& x) { return matmul(x[0], x[1]); };
      if (is_empty(row)) {
        check_empty(n, fn, x);
        continue;
      }
      if (dt == DType::f64) check_grad(n, fn, x);
      check_twice(n, fn, x, rng);
    }
  }
  report("matmul", n);
}

TEST_CASE("scatter rows: gradients of slice_scatter for the base and the source") {
  Counts n;
  Rng rng(28);
  for (const ScatterRow& row : scatter_rows()) {
    for (auto [lb, ls] : std::vector<std::pair<Layout, Layout>>{{L::Contiguous, L::Contiguous},
                                                                {L::Transposed, L::Strided}}) {
      for (DType dt : {DType::f64, DType::f32}) {
        INFO(std::string(row.name)
             << " on " << dtype_name(dt) << ", base " << std::string(layout_name(lb)));
        Ins x = {leaf(smooth_values(row.base.numel(), Domain{-3, 3}, 0, rng), row.base, dt, lb),
                 leaf(smooth_values(row.src.numel(), Domain{-3, 3}, 1, rng), row.src, dt, ls)};
        Fn fn = [&](const Ins& x) {
          return slice_scatter(x[0], x[1], row.dim, row.start, row.end, row.step);
        };
        if (is_empty(row)) {
          check_empty(n, fn, x);
          continue;
        }
        if (dt == DType::f64) check_grad(n, fn, x);
        check_twice(n, fn, x, rng);
      }
    }
  }
  report("slice_scatter", n);
}

// ---- op rows: indexing, joining, images, normalizations, losses, dropout ----------------------

namespace {
bool gradchecked(const OpRow& r) {
  return r.grad && !r.index_result && !r.shapes.empty() && r.out.numel() > 0;
}
// Leaves of rank >= 2 with dim 0 above 1 can be made with dim 0 of size 1 and expanded inside.
bool expandable(const Shape& s) { return s.size() >= 2 && s[0] > 1; }
}  // namespace

TEST_CASE("op rows: gradcheck on contiguous, transposed, strided and expanded leaves") {
  Counts n, outside;
  Rng rng(29);
  enum class V { Contiguous, Transposed, Strided, Expanded };
  for (const OpRow& row : op_rows()) {
    INFO(row.name);
    auto leaves = [&](DType dt, V v) {
      Ins x;
      for (size_t i = 0; i < row.shapes.size(); ++i) {
        Shape s = row.shapes[i];
        if (v == V::Expanded && expandable(s)) s[0] = 1;
        const Layout l = s.numel() == 0       ? L::Contiguous  // no layout to speak of
                         : v == V::Transposed ? L::Transposed
                         : v == V::Strided    ? L::Strided
                                              : L::Contiguous;
        const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
        x.push_back(leaf(smooth_values(s.numel(), d, int(i), rng), s, dt, l));
      }
      return x;
    };
    if (!row.grad) continue;  // a large row, for the forward sweep only
    if (row.index_result || row.shapes.empty()) {
      check_outside(outside, row.fn(leaves(DType::f64, V::Contiguous)));
      continue;
    }
    for (const Shape& s : row.shapes) REQUIRE(s.numel() <= 24);
    for (V v : {V::Contiguous, V::Transposed, V::Strided, V::Expanded}) {
      bool changes = v == V::Contiguous;
      for (const Shape& s : row.shapes)
        changes |= (v == V::Transposed && s.size() >= 2) || (v == V::Strided && s.size() >= 1) ||
                   (v == V::Expanded && expandable(s));
      if (!changes) continue;
      INFO("variant " << int(v));
      Fn fn = [&](const Ins& x) {
        Ins in = x;
        for (size_t i = 0; v == V::Expanded && i < in.size(); ++i)
          if (expandable(row.shapes[i])) in[i] = expand(x[i], row.shapes[i]);
        return row.fn(in);
      };
      for (DType dt : {DType::f64, DType::f32}) {
        Ins x = leaves(dt, v);
        if (row.out.numel() == 0) {
          check_empty(n, fn, x);
          continue;
        }
        if (dt == DType::f64) check_grad(n, fn, x);
        check_twice(n, fn, x, rng);
      }
    }
  }
  report("op rows", n);
  report("op rows not differentiable", outside);
}

// Note [jvp by two vjps] in trace/func.cpp: jvp differentiates each op's gradient rule again,
// with respect to the incoming gradient. On every differentiable row, in float64: the product
// with random tangents for all floating inputs equals J v assembled row by row from reverse mode.
TEST_CASE("op rows: jvp equals the Jacobian times the tangents, from the vjp differentiated") {
  Rng rng(31);
  int checked = 0;
  for (const OpRow& row : op_rows()) {
    if (!gradchecked(row)) continue;
    INFO(row.name);
    Ins x;
    std::vector<int> floating;
    for (size_t i = 0; i < row.shapes.size(); ++i) {
      const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
      x.push_back(leaf(smooth_values(row.shapes[i].numel(), d, int(i), rng), row.shapes[i],
                       DType::f64, L::Contiguous));
      if (is_floating(x.back().dtype())) floating.push_back(int(i));
    }
    if (floating.empty()) continue;
    Ins xs, vs;
    for (int i : floating) {
      x[size_t(i)] = x[size_t(i)].detach().requires_grad_();
      xs.push_back(x[size_t(i)]);
      vs.push_back(randn(x[size_t(i)].sizes(), Options().dtype(DType::f64)));
    }
    const Tensor y = row.fn(x);
    if (!is_floating(y.dtype()) || !y.requires_grad()) continue;
    const Tensor jv = func::detail::jvp_product(y, xs, vs);
    REQUIRE(jv.sizes() == y.sizes());
    // Row k of J v: the gradient of y's element k (a one-hot cotangent) dotted with the tangents.
    std::vector<double> want;
    for (int64_t k = 0; k < y.numel(); ++k) {
      const Tensor e = one_hot(full({}, k, Options().dtype(DType::i64)), y.numel()).to(DType::f64);
      const Ins g = detail::grad({y}, xs, {e.reshape(y.sizes())}, /*create_graph=*/false,
                                 /*retain_graph=*/true);
      double sum = 0;
      for (size_t i = 0; i < xs.size(); ++i)
        if (g[i].defined()) sum += (g[i] * vs[i]).sum().item<double>();
      want.push_back(sum);
    }
    CHECK_MESSAGE(differences(values(jv), want, 1e-10, 1e-10).empty(),
                  differences(values(jv), want, 1e-10, 1e-10));
    ++checked;
  }
  MESSAGE(checked << " op rows: jvp against reverse mode");
  CHECK(checked > 50);
}

TEST_CASE("every differentiable op is gradchecked by some row of the sweep") {
  std::vector<int> rows(kNumOps, 0);
  for (const auto& r : elementwise_rows())
    if (gradchecked(r)) ++rows[int(r.op)];
  for (const auto& r : conversion_rows()) ++rows[int(r.op)];
  for (const auto& r : reduce_rows())
    if (gradchecked(r)) ++rows[int(r.op)];
  for (const auto& r : view_rows())
    if (r.in.numel() && r.out.numel()) ++rows[int(r.op)];
  for (const auto& r : matmul_rows())
    if (gradchecked(r)) ++rows[int(OpId::MatMul)];
  for (const auto& r : scatter_rows())
    if (!is_empty(r)) ++rows[int(OpId::SliceScatter)];
  for (const auto& r : op_rows())
    if (!r.composite && gradchecked(r)) ++rows[int(r.op)];
  for (int i = 0; i < kNumOps; ++i)
    if (differentiable(OpId(i)))
      CHECK_MESSAGE(rows[i] > 0, op_name(OpId(i)) << " is differentiable but never gradchecked");
}

TEST_CASE("every differentiable op of several inputs is gradchecked with each input alone") {
  // Rows whose gradcheck has two or more leaves, so check_grad also runs each leaf alone.
  std::vector<int> rows(kNumOps, 0);
  for (const auto& r : elementwise_rows())
    if (gradchecked(r) && r.arity - (r.cond_first ? 1 : 0) >= 2) ++rows[int(r.op)];
  for (const auto& r : matmul_rows())
    if (gradchecked(r)) ++rows[int(OpId::MatMul)];
  for (const auto& r : scatter_rows())
    if (!is_empty(r)) ++rows[int(OpId::SliceScatter)];
  for (const auto& r : op_rows())
    if (!r.composite && gradchecked(r) && r.shapes.size() >= 2) ++rows[int(r.op)];
  for (int i = 0; i < kNumOps; ++i) {
    const auto& def = detail::op_def(OpId(i));
    // Gather's second input is its index: one differentiable input.
    const bool several = (def.arity >= 2 || def.arity < 0) && OpId(i) != OpId::Gather;
    if (differentiable(OpId(i)) && several)
      CHECK_MESSAGE(rows[i] > 0, op_name(OpId(i)) << " takes several inputs but no row gradchecks "
                                                     "each of them alone");
  }
}

// ---- conventions where the derivative does not exist ----------------------------------------

TEST_CASE("gradients at kinks and ties follow PyTorch") {
  const Options f64 = Options().dtype(DType::f64).requires_grad();  // leaves
  auto grad_of = [](const Tensor& y, const Tensor& x) {
    return grad({y}, {x}, {ones(y.sizes(), Options().dtype(y.dtype()))})[0];
  };
  Tensor x = tensor({-1, 0, 2}, f64);
  check_tensor(grad_of(relu(x), x), {3}, DType::f64, {0, 0, 1});  // relu'(0) = 0
  check_tensor(grad_of(abs(x), x), {3}, DType::f64, {-1, 0, 1});  // abs'(0) = 0
  // maximum and minimum split the gradient evenly between equal operands.
  Tensor a = tensor({1, 2, 3}, f64), b = tensor({1, 0, 3}, f64);
  auto both = [&](const Tensor& y) {
    return grad({y}, {a, b}, {ones({3}, Options().dtype(DType::f64))});
  };
  std::vector<Tensor> g = both(maximum(a, b));
  check_tensor(g[0], {3}, DType::f64, {0.5, 1, 0.5});
  check_tensor(g[1], {3}, DType::f64, {0.5, 0, 0.5});
  g = both(minimum(a, b));
  check_tensor(g[0], {3}, DType::f64, {0.5, 0, 0.5});
  check_tensor(g[1], {3}, DType::f64, {0.5, 1, 0.5});
  g = both(maximum(a, a));
  check_tensor(g[0], {3}, DType::f64, {1, 1, 1});
  // max and min reductions split it evenly among the elements equal to the result.
  Tensor r = tensor({1, 5, 5, 4, 4, 4}, Shape{2, 3}, f64);
  check_tensor(grad_of(max(r), r), {2, 3}, DType::f64, {0, 0.5, 0.5, 0, 0, 0});
  check_tensor(grad_of(max(r, 1), r), {2, 3}, DType::f64, {0, 0.5, 0.5, 1.0 / 3, 1.0 / 3, 1.0 / 3});
  check_tensor(grad_of(min(r, 1, true), r), {2, 3}, DType::f64,
               {1, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3});
  check_tensor(grad_of(min(r, 0), r), {2, 3}, DType::f64, {1, 0, 0, 0, 1, 1});
  // pow at 0: x^0 is constant (gradient 0), x^2 has gradient 0, and d/dy 0^y = 0 for y >= 0.
  Tensor z = tensor({0, 0, 2}, f64), e = tensor({0, 2, 0}, f64);
  g = grad({pow(z, e)}, {z, e}, {ones({3}, Options().dtype(DType::f64))});
  check_tensor(g[0], {3}, DType::f64, {0, 0, 0});
  check_tensor(g[1], {3}, DType::f64, {0, 0, std::log(2.0)});
  check_tensor(grad_of(pow(z, 0), z), {3}, DType::f64, {0, 0, 0});
  check_tensor(grad_of(pow(z, 0.0), z), {3}, DType::f64, {0, 0, 0});
  // clamp passes the whole gradient on the closed interval [lo, hi], bounds included; NaN stays.
  Tensor c = tensor({-2, -1, 0.5, 2, 3}, f64);
  check_tensor(grad_of(clamp(c, -1, 2), c), {5}, DType::f64, {0, 1, 1, 1, 0});
  check_tensor(clamp(tensor({NAN, 5}), -1, 2), {2}, DType::f32, {NAN, 2});
}

}  // namespace duet::test
