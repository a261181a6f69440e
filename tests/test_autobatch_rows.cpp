// Autobatch's groups by rows (Note [Rows] in core/ops/rows.cpp, Note [Groups by rows] in
// eager/autobatch_rows.cpp): per-sample tensors of different lengths along dim 0 run as one
// call on their rows. A table of per-sample functions, each run in a scope against the same
// function run eagerly: results, the gradients of the samples and of the shared parameters,
// and the groups its op ran in.
#include <doctest/doctest.h>

#include <functional>

#include "util.h"

namespace duet::test {
namespace {

struct RowCase {
  const char* name;
  const char* op;  // an op whose calls run in `groups` groups (by_op), or null
  int64_t groups;
  std::function<Tensor(const Tensor& x, size_t i)> f;
};

struct RowRun {
  std::vector<Tensor> out, grads;  // each sample's result; each x's gradient, then the shared
  AutobatchStats stats;
};

RowRun run_case(const RowCase& c, const std::vector<Tensor>& xs, const std::vector<Tensor>& shared,
                bool batched) {
  RowRun r;
  std::vector<Tensor> x;
  for (const Tensor& t : xs) x.push_back(t.detach().requires_grad_(true));
  for (const Tensor& p : shared)
    if (p.grad().defined()) p.grad().zero_();
  {
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    Tensor total;
    for (size_t i = 0; i < x.size(); ++i) {
      Tensor y = c.f(x[i], i);
      r.out.push_back(y);
      Tensor l = is_floating(y.dtype()) ? sum(y * y) : sum(y.to(DType::f32));
      total = total.defined() ? total + l : l;
    }
    if (total.requires_grad()) total.backward();
  }
  if (batched) r.stats = autobatch_stats();
  for (const Tensor& t : x) r.grads.push_back(t.grad().defined() ? t.grad() : zeros_like(t));
  for (const Tensor& p : shared)
    r.grads.push_back(p.grad().defined() ? p.grad().clone() : zeros_like(p));
  return r;
}

int64_t groups_of(const AutobatchStats& s, const char* op) {
  for (const AutobatchOpStats& o : s.by_op)
    if (o.op == op) return o.groups;
  return 0;
}

TEST_CASE("autobatch: ops on rows of different lengths run as one call") {
  manual_seed(5);
  const int64_t lens[] = {3, 1, 5, 2, 5, 0, 4};
  std::vector<Tensor> xs, idx, mask, cols;
  for (int64_t n : lens) {
    xs.push_back(randn({n, 3}));
    cols.push_back(randn({3, n}));  // (its transpose: rows that are not contiguous)
    std::vector<double> at;
    for (int64_t j = 0; j < n; ++j) at.push_back(static_cast<double>((j * 7 + n) % 3));
    idx.push_back(tensor(at, Options().dtype(DType::i64)).reshape({n, 1}));
    mask.push_back(randn({n}) > 0.0);
  }
  Tensor w = randn({3, 4}).requires_grad_(true), b = randn({4}).requires_grad_(true);
  Tensor v = randn({3}).requires_grad_(true);
  const std::vector<Tensor> shared{w, b, v};
  nn::Embedding emb(10, 3);
  const std::vector<RowCase> cases{
      {"matmul then a bias", "matmul", 1,
       [&](const Tensor& x, size_t) { return matmul(x, w) + b; }},
      {"matmul by a vector", "matmul", 1, [&](const Tensor& x, size_t) { return matmul(x, v); }},
      {"linear", "addmm", 1, [&](const Tensor& x, size_t) { return linear(x, w.t(), b); }},
      {"addmm with rows", "addmm", 1, [&](const Tensor& x, size_t) { return addmm(b, x, w); }},
      {"elementwise with numbers", "exp", 1,
       [&](const Tensor& x, size_t) { return exp(x) * 0.5 + x; }},
      // (The loss, sum(y * y), adds a group of mul and of sum; a sample of one row reads the
      // shared row as a row of its own, which is another signature, and so is an empty
      // sample's reshape.)
      {"a row broadcast along the rows", "mul", 3,
       [&](const Tensor& x, size_t) {
         return x * v.reshape({1, 3});
       }},
      {"rows that are not contiguous", "exp", 1,
       [&](const Tensor& x, size_t i) { return exp(cols[i].t()) * x + sin(x.t()).t(); }},
      {"where", "where", 1,
       [&](const Tensor& x, size_t i) {
         return where(mask[i].reshape({-1, 1}), x, x * 0.1);
       }},
      {"log_softmax", "log_softmax", 1, [&](const Tensor& x, size_t) { return log_softmax(x, 1); }},
      {"gather along dim 1", "gather", 1,
       [&](const Tensor& x, size_t i) { return gather(exp(x), 1, idx[i]); }},
      {"sum over dim 1", "sum", 2, [&](const Tensor& x, size_t) { return sum(x * v, {1}); }},
      {"max over dim 1", "max", 1, [&](const Tensor& x, size_t) { return max(x + 1.0, {-1}); }},
      {"sum of all", "sum", 2, [&](const Tensor& x, size_t) { return sum(tanh(x)); }},
      {"sum over dim 0, kept", "sum", 2,
       [&](const Tensor& x, size_t) { return sum(tanh(x), {0}, true); }},
      {"mean (a sum of all, divided)", "sum", 2,
       [&](const Tensor& x, size_t) { return mean(x * v); }},
      {"a sum of bools", "sum", 1, [&](const Tensor& x, size_t) { return sum(x > 0.0); }},
      {"reshape keeping the rows", "reshape", 2,
       [&](const Tensor& x, size_t) {
         return exp(reshape(x * v, {x.sizes()[0], 3, 1}));
       }},
      {"slice along dim 1", "slice", 1,
       [&](const Tensor& x, size_t) { return tanh(slice(x * v, 1, 1, 3)); }},
      {"cat along dim 1", "cat", 1,
       [&](const Tensor& x, size_t) {
         return cat({x, exp(x)}, 1);
       }},
      // (More operands than RowsUse has bits for: grouped by shape.)
      {"cat along dim 1, of 40 operands", nullptr, 0,
       [&](const Tensor& x, size_t) { return cat(std::vector<Tensor>(40, x * v), 1); }},
      {"cat along dim 0, of any count", "cat", 1,
       [&](const Tensor& x, size_t i) {
         std::vector<Tensor> parts{x * v};
         for (size_t k = 0; k < i % 3; ++k) parts.push_back(exp(x.slice(0, 0, 1)));
         return cat(parts, 0);
       }},
      {"addmv with rows", "addmv", 1,
       [&](const Tensor& x, size_t) { return addmv(sum(x, {1}), x, v); }},
      {"an embedding of words of any count", "gather", 1,
       [&](const Tensor& x, size_t i) {
         return emb(idx[i].reshape({-1}) + static_cast<int64_t>(i)) * x;
       }},
      // Read by an op grouped by shape, as samples of the batch by rows.
      {"rows read by shape", nullptr, 0,
       [&](const Tensor& x, size_t) {
         const Tensor y = exp(x) * v;
         return matmul(y.t(), y);
       }},
      // An operand that differs per sample (not by rows): the group runs by length.
      {"a bias of its own", nullptr, 0,
       [&](const Tensor& x, size_t i) { return x + xs[(i + 1) % xs.size()].sum({0}); }},
  };
  for (const RowCase& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    bool eager_error = false;
    RowRun want;
    try {
      want = run_case(c, xs, shared, false);
    } catch (const Error&) {
      eager_error = true;  // (an empty sample's max)
    }
    if (eager_error) {
      CHECK_THROWS_AS(run_case(c, xs, shared, true), Error);
      continue;
    }
    const RowRun got = run_case(c, xs, shared, true);
    REQUIRE(got.out.size() == want.out.size());
    for (size_t i = 0; i < got.out.size(); ++i) {
      CAPTURE(i);
      CHECK(got.out[i].sizes() == want.out[i].sizes());
      CHECK(got.out[i].dtype() == want.out[i].dtype());
      CHECK(close(got.out[i].to(DType::f64), want.out[i].to(DType::f64), 1e-5));
    }
    for (size_t i = 0; i < got.grads.size(); ++i) CHECK(close(got.grads[i], want.grads[i], 1e-4));
    if (c.op) CHECK(groups_of(got.stats, c.op) == c.groups);
  }
}

TEST_CASE("autobatch: rows without a gradient are copied into one batch") {
  std::vector<Tensor> xs, got;
  for (int64_t n : {2, 6, 3}) xs.push_back(randn({n, 4}));
  const Tensor w = randn({4, 2});
  {
    NoGradGuard no_grad;
    Autobatch scope;
    for (const Tensor& x : xs) got.push_back(log_softmax(matmul(x, w), 1));
  }
  for (size_t i = 0; i < xs.size(); ++i)
    CHECK(close(got[i], log_softmax(matmul(xs[i], w), 1), 1e-6));
  CHECK(groups_of(autobatch_stats(), "matmul") == 1);
  CHECK(groups_of(autobatch_stats(), "log_softmax") == 1);
}

}  // namespace
}  // namespace duet::test
