// The composites of core/api.def from masked_fill to einsum, beyond their op rows
// (tests/op_rows_more.cpp): several results (split, chunk, sort, topk, max_with_indices), the
// creators and draws (*_like, one_hot, multinomial) and their symbolic batch under compile, NaN
// and ties in sorting, the measured cost of the O(n^2) argsort, and bad inputs raising typed
// errors that name the op.
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <numeric>
#include <set>
#include <source_location>

#include "core/ops.h"
#include "eager/autograd.h"
#include "trace/compile.h"
#include "util.h"

namespace duet::test {
namespace {

Options f64() { return Options().dtype(DType::f64); }

// The message of an error of type E from f, which must name the op: "[op] ...".
template <class E, class F>
void check_error(const char* op, F&& f,
                 std::source_location loc = std::source_location::current()) {
  INFO("the call at line " << loc.line());
  const std::string msg = error_of<E>(f);
  CHECK_MESSAGE(starts_with(msg, std::string("[") + op + "]"), msg);
}

}  // namespace

TEST_CASE("split and chunk: LibTorch's pieces, views of x, gradients through each piece") {
  Tensor x = arange(14, f64()).requires_grad_();
  Tensor m = reshape(x, {7, 2});
  auto sizes = [](const std::vector<Tensor>& parts) {
    std::vector<int64_t> s;
    for (const Tensor& p : parts) s.push_back(p.size(0));
    return s;
  };
  CHECK(sizes(split(m, 3)) == std::vector<int64_t>{3, 3, 1});
  CHECK(sizes(split(m, 7)) == std::vector<int64_t>{7});
  CHECK(sizes(split(m, 10)) == std::vector<int64_t>{7});
  CHECK(sizes(split(m, std::vector<int64_t>{0, 5, 2})) == std::vector<int64_t>{0, 5, 2});
  CHECK(sizes(chunk(m, 3)) == std::vector<int64_t>{3, 3, 1});
  CHECK(sizes(chunk(m, 4)) == std::vector<int64_t>{2, 2, 2, 1});
  CHECK(sizes(chunk(m, 7)) == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1});
  CHECK(sizes(chunk(m, 10)) == std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1});
  // torch.chunk(torch.arange(6), 4) gives 3 pieces of 2, not 4.
  CHECK(sizes(chunk(arange(6), 4)) == std::vector<int64_t>{2, 2, 2});
  CHECK(chunk(zeros({0, 3}), 3).size() == 3);
  CHECK(split(zeros({0, 3}), 2).size() == 1);
  // Pieces are views of x.
  for (const Tensor& p : split(m, 3)) CHECK(same_storage(p, m));
  // The gradient of a loss over the pieces reaches every element once.
  std::vector<Tensor> parts = split(m, 3);
  Tensor loss = sum(parts[0]) + sum(parts[1]) * 2 + sum(parts[2]) * 3;
  std::vector<double> want;
  for (int i = 0; i < 14; ++i) want.push_back(i < 6 ? 1 : i < 12 ? 2 : 3);
  CHECK(values(grad({loss}, {x})[0]) == want);
}

TEST_CASE("split and chunk compiled: the pieces of a batch of any size") {
  auto f = compile([](Tensor x) {
    std::vector<Tensor> p = chunk(x, 2, 1);  // along the features, not the batch
    return std::make_tuple(p[0] * 2, p[1] + 1);
  });
  for (int64_t n : {3, 5, 7}) {
    Tensor x = randn({n, 5}, f64());
    auto [a, b] = f(x);
    CHECK(a.sizes() == Shape{n, 3});
    CHECK(b.sizes() == Shape{n, 2});
    CHECK(values(a) == values(slice(x, 1, 0, 3) * 2));
    CHECK(values(b) == values(slice(x, 1, 3, 5) + 1));
  }
  CHECK(f.stats().traces == 2);  // the first size, then one symbolic trace for the others
  CHECK(f.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
}

TEST_CASE("*_like: the shape, dtype and device of x; Options override the dtype") {
  Tensor x = randn({2, 3}, f64());
  check_tensor(zeros_like(x), {2, 3}, DType::f64, std::vector<double>(6, 0));
  check_tensor(ones_like(x), {2, 3}, DType::f64, std::vector<double>(6, 1));
  check_tensor(full_like(x, 2.5), {2, 3}, DType::f64, std::vector<double>(6, 2.5));
  check_tensor(empty_like(x), {2, 3}, DType::f64, std::vector<double>(6, 0));
  check_tensor(full_like(x, 7, Options().dtype(DType::i32)), {2, 3}, DType::i32,
               std::vector<double>(6, 7));
  check_tensor(ones_like(zeros({}, Options().dtype(DType::b8))), {}, DType::b8, {1});
  check_tensor(zeros_like(zeros({0, 4})), {0, 4}, DType::f32, {});
  CHECK(ones_like(x, Options().requires_grad()).requires_grad());
  CHECK(!zeros_like(x.requires_grad_()).requires_grad());  // a new tensor, not x's function
  // The draws: rand_like(x) is rand(x.sizes()) from the same generator state.
  manual_seed(7);
  Tensor r = rand_like(x);
  Tensor n = randn_like(x, Options().dtype(DType::f32));
  manual_seed(7);
  CHECK(values(r) == values(rand({2, 3}, f64())));
  CHECK(values(n) == values(randn({2, 3})));
  CHECK(n.dtype() == DType::f32);
  check_error<DTypeError>("rand_like", [] { rand_like(zeros({2}, Options().dtype(DType::i64))); });
  check_error<DTypeError>("randn_like",
                          [] { randn_like(zeros({2}), Options().dtype(DType::i32)); });
}

TEST_CASE("*_like compiled: the batch stays symbolic; a second size does not fix it") {
  // Every creator reads x's dims as SymInts. After the first size (3) traces concretely, the
  // second (5) traces once with dim 0 symbolic, and the sizes after it reuse that trace: had a
  // creator read the batch as an integer, each new size would trace again.
  auto fn = [](Tensor x) {
    Tensor a = x + zeros_like(x) + ones_like(x) * full_like(x, 0.5) + empty_like(x);
    Tensor noise = rand_like(x) + randn_like(x);
    return std::make_tuple(a, noise);
  };
  auto f = compile(fn);
  for (int64_t n : {3, 5, 8, 2}) {
    INFO("batch " << n);
    Tensor x = randn({n, 4}, f64());
    manual_seed(11);
    auto [a, noise] = f(x);
    manual_seed(11);
    auto [ea, enoise] = fn(x);
    CHECK(a.sizes() == Shape{n, 4});
    CHECK(values(a) == values(ea));
    CHECK(values(noise) == values(enoise));  // the same draws as eagerly
  }
  INFO(fmt::format("{}", fmt::join(f.stats().retrace_reasons, "; ")));
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
  CHECK(f.stats().guards.empty());
  // With the dim declared dynamic: one trace for every size.
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto g = compile([](Tensor x) { return ones_like(x) * 2 + rand_like(x) * 0; }, o);
  for (int64_t n : {4, 9}) CHECK(values(g(zeros({n, 2}))) == std::vector<double>(2 * n, 2));
  CHECK(g.stats().traces == 1);
}

TEST_CASE("masked_fill, tril, triu: dtypes, the gradient of a tensor value, errors") {
  Tensor x = make({1, 2, 3, 4}, {2, 2}, DType::i32);
  Tensor m = make({1, 0}, {2}, DType::b8);
  check_tensor(masked_fill(x, m, 2.7), {2, 2}, DType::i32, {2, 2, 2, 4});  // truncated
  check_tensor(masked_fill(make({1, 2}, {2}), m, -1), {2}, DType::f32, {-1, 2});
  Tensor xf = make({1, 2, 3, 4}, {2, 2}, DType::f64).requires_grad_();
  Tensor v = scalar(5.0, f64()).requires_grad_();
  Tensor y = masked_fill(xf, m, v);
  std::vector<Tensor> g = grad({sum(y * y)}, {xf, v});
  CHECK(values(g[0]) == std::vector<double>{0, 4, 0, 8});
  CHECK(values(g[1]) == std::vector<double>{20});  // two masked elements, 2 * 5 each
  check_error<DTypeError>("masked_fill", [&] { masked_fill(xf, make({1, 0}, {2}), 0); });
  check_error<ShapeError>("masked_fill", [&] {
    masked_fill(xf, make({1, 0, 1}, {3}, DType::b8), 0);
  });
  check_error<ShapeError>("masked_fill", [&] {
    masked_fill(make({1}, {1}), make({1, 0}, {2}, DType::b8), 0);
  });
  check_error<ShapeError>("masked_fill", [&] { masked_fill(xf, m, make({1, 2}, {2})); });
  check_error<ShapeError>("tril", [] { tril(zeros({3})); });
  check_error<ShapeError>("triu", [] { triu(zeros({})); });
  // A symbolic (rows, cols) stays symbolic: one trace for every square size after the first.
  auto f = compile([](Tensor a) { return tril(a, -1) + triu(a, 1); });
  for (int64_t n : {3, 4, 6}) {
    Tensor a = randn({n, n}, f64());
    CHECK(values(f(a)) == values(a - where(eye(n, Options().dtype(DType::b8)), a, 0.0)));
  }
  CHECK(f.stats().traces == 2);
}

TEST_CASE("flip, roll, pad: errors name the op; compiled with a symbolic batch") {
  check_error<ValueError>("flip", [] { flip(zeros({2, 3}), {0, -2}); });
  check_error<ValueError>("flip", [] { flip(zeros({2, 3}), {2}); });
  check_error<ValueError>("roll", [] { roll(zeros({2, 3}), {1, 2}, {0}); });
  check_error<ValueError>("roll", [] { roll(zeros({2, 3}), {1, 2}); });
  check_error<ValueError>("roll", [] { roll(zeros({2, 3}), 1, 3); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {1}); });
  check_error<ValueError>("pad", [] { pad(zeros({3}), {1, 1, 1, 1}); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {1, 1}, "symmetric"); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {4, 0}, "circular"); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 0}), {1, 0}, "replicate"); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {1, 0}, "replicate", 2.5); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {3, 0}, "reflect"); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {-1, 0}, "reflect"); });
  check_error<ValueError>("pad", [] { pad(zeros({2, 3}), {0, -4}); });
  // An integer x truncates a floating value, as masked_fill (and PyTorch's fill) does.
  check_tensor(pad(ones({1}, Options().dtype(DType::i32)), {1, 1}, "constant", 2.5), {3},
               DType::i32, {2, 1, 2});
  // 0-d: no dims to pad, flip or roll.
  Tensor s = scalar(2.0);
  CHECK(values(pad(s, {})) == std::vector<double>{2});
  CHECK(values(flip(s, {})) == std::vector<double>{2});
  // Padding, flipping and rolling the features of a batch of any size: one symbolic trace.
  auto f = compile([](Tensor x) {
    Tensor a = pad(flip(roll(x, 1, -1), -1), {1, 2}, "reflect");
    Tensor b = pad(x, {2, 0}, "constant", 1.5);
    return std::make_tuple(a, b);
  });
  for (int64_t n : {2, 3, 6}) {
    Tensor x = randn({n, 4}, f64());
    auto [a, b] = f(x);
    auto ea = pad(flip(roll(x, 1, -1), -1), {1, 2}, "reflect");
    CHECK(a.sizes() == Shape{n, 7});
    CHECK(values(a) == values(ea));
    CHECK(b.sizes() == Shape{n, 6});
    CHECK(values(slice(b, 1, 0, 2)) == std::vector<double>(2 * n, 1.5));
  }
  CHECK(f.stats().traces == 2);
  CHECK(f.stats().symbolic_dims == std::vector<std::string>{"arg 0 dim 0: s0"});
}

TEST_CASE("cumsum: long rows against a sequential sum, the reverse-cumsum gradient, dtypes") {
  for (int64_t n : {1, 2, 3, 31, 32, 33, 1000}) {
    INFO("n = " << n);
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = std::sin(double(i)) + 0.25;
    Tensor x = make(v, {n}, DType::f64).requires_grad_();
    std::vector<double> want(v.size());
    std::partial_sum(v.begin(), v.end(), want.begin());
    check_tensor(cumsum(x, 0), {n}, DType::f64, want, 1e-12, 1e-12);
    // d/dx_i sum_k w_k y_k = sum_{k >= i} w_k: the reverse cumsum of w.
    std::vector<double> w(v.size()), gw(v.size());
    for (int64_t i = 0; i < n; ++i) w[i] = double(i % 5) - 2;
    double acc = 0;
    for (int64_t i = n - 1; i >= 0; --i) gw[i] = acc += w[i];
    Tensor g = grad({sum(cumsum(x, 0) * make(w, {n}, DType::f64))}, {x})[0];
    check_tensor(g, {n}, DType::f64, gw, 1e-12, 1e-12);
  }
  // Integers and bools sum in i64, as in PyTorch.
  check_tensor(cumsum(make({1, 0, 1, 1}, {4}, DType::b8), 0), {4}, DType::i64, {1, 1, 2, 3});
  check_tensor(cumsum(make({5, -2, 7}, {3}, DType::i32), 0), {3}, DType::i64, {5, 3, 10});
  check_error<ValueError>("cumsum", [] { cumsum(zeros({2, 3}), 2); });
  // Compiled with the scanned dim dynamic: a size in the same power-of-two range reuses the
  // trace (its rounds are guarded, not specialized).
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([](Tensor x) { return cumsum(x, 0); }, o);
  for (int64_t n : {5, 6, 7, 8}) {
    Tensor x = randn({n, 2}, f64());
    CHECK(close(f(x), cumsum(x, 0), 1e-12));
  }
  CHECK(f.stats().traces == 1);
  const std::vector<std::string> gs = f.stats().guards;
  INFO(fmt::format("{}", fmt::join(gs, "; ")));
  CHECK(std::count(gs.begin(), gs.end(), "4 < s0 (cumsum)") == 1);
  CHECK(std::count(gs.begin(), gs.end(), "s0 <= 8 (cumsum)") == 1);
  // A size past 8 needs a fourth round: a new trace, equal to eager again.
  Tensor x9 = randn({9, 2}, f64());
  CHECK(close(f(x9), cumsum(x9, 0), 1e-12));
  CHECK(f.stats().traces == 2);
}

TEST_CASE("var and std: PyTorch's correction, N <= correction, errors") {
  Tensor x = make({1, 2, 3, 4}, {4}, DType::f64);
  check_tensor(var(x), {}, DType::f64, {5.0 / 3}, 1e-15, 1e-15);
  check_tensor(var(x, {}, 0), {}, DType::f64, {1.25}, 1e-15, 1e-15);
  check_tensor(duet::std(x, {0}, 1, true), {1}, DType::f64, {std::sqrt(5.0 / 3)}, 1e-15, 1e-15);
  // One element with correction 1: 0 / 0, NaN (as torch.var); 2 elements with correction 3: inf.
  CHECK(std::isnan(values(var(make({2}, {1}, DType::f64)))[0]));
  CHECK(std::isinf(values(var(make({1, 2}, {2}, DType::f64), {}, 3))[0]));
  check_error<DTypeError>("var", [] { var(zeros({3}, Options().dtype(DType::i64))); });
  check_error<DTypeError>("std", [] { duet::std(zeros({3}, Options().dtype(DType::i32))); });
  check_error<ValueError>("var", [] { var(zeros({3}), {0}, -1); });
  check_error<ValueError>("var", [] { var(zeros({3}), {0, 0}); });
  // A symbolic count: the divisor is a tensor of the size, so one trace serves every batch.
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([](Tensor a) { return var(a, {0}); }, o);
  for (int64_t n : {3, 5, 9}) {
    Tensor a = randn({n, 3}, f64());
    CHECK(close(f(a), var(a, {0}), 1e-12));
  }
  CHECK(f.stats().traces == 1);
}

TEST_CASE("max_with_indices, min_with_indices, amax: ties, NaN and the gradient") {
  Tensor x = make({1, 3, 3, 0}, {4}, DType::f64).requires_grad_();
  auto [v, i] = max_with_indices(x, 0);
  CHECK(values(v) == std::vector<double>{3});
  CHECK(values(i) == std::vector<double>{1});  // the first of the ties
  CHECK(i.dtype() == DType::i64);
  CHECK(!i.requires_grad());
  // The gradient goes to the element at the index; amax splits it among the ties (as PyTorch).
  CHECK(values(grad({v}, {x})[0]) == std::vector<double>{0, 1, 0, 0});
  CHECK(values(grad({amax(x)}, {x})[0]) == std::vector<double>{0, 0.5, 0.5, 0});
  auto [mv, mi] = min_with_indices(make({2, NAN, 1}, {3}), 0, true);
  CHECK(std::isnan(values(mv)[0]));
  CHECK(values(mi) == std::vector<double>{1});
  CHECK(mi.sizes() == Shape{1});
  check_error<ValueError>("max_with_indices", [] { max_with_indices(zeros({0, 3}), 0); });
  check_error<ValueError>("min_with_indices", [] { min_with_indices(zeros({2}), 1); });
  check_error<DTypeError>("max_with_indices",
                          [] { max_with_indices(zeros({2}, Options().dtype(DType::b8)), 0); });
}

TEST_CASE("sort, argsort, topk: NaN, stability, the gradient through gather, errors") {
  Tensor x = make({3, NAN, 1, 3, -2}, {5}, DType::f64);
  auto [v, i] = sort(x);
  CHECK(values(i) == std::vector<double>{4, 2, 0, 3, 1});  // stable; NaN last, as the largest
  auto [dv, di] = sort(x, 0, /*descending=*/true);
  CHECK(values(di) == std::vector<double>{1, 0, 3, 2, 4});  // NaN first
  CHECK(std::isnan(values(dv)[0]));
  auto [tv, ti] = topk(make({5, 1, 4, 2}, {4}), 2);
  CHECK(values(tv) == std::vector<double>{5, 4});
  CHECK(values(ti) == std::vector<double>{0, 2});
  auto [sv, si] = topk(make({5, 1, 4, 2}, {4}), 3, 0, /*largest=*/false, /*sorted=*/false);
  CHECK(values(sv) == std::vector<double>{1, 2, 4});
  // The values' gradient flows back to the elements they came from.
  Tensor y = make({0.5, -1, 2}, {3}, DType::f64).requires_grad_();
  auto [yv, yi] = sort(y);
  CHECK(!yi.requires_grad());
  CHECK(values(grad({sum(yv * make({1, 2, 3}, {3}, DType::f64))}, {y})[0]) ==
        std::vector<double>{2, 1, 3});
  check_error<ValueError>("topk", [] { topk(zeros({3}), 4); });
  check_error<ValueError>("topk", [] { topk(zeros({3}), -1); });
  check_error<ValueError>("argsort", [] { argsort(zeros({3}), 1); });
  check_error<ValueError>("sort", [] { sort(zeros({2, 3}), -3); });
  // Rows of a few hundred against std::stable_sort, integers with many ties included.
  Rng rng(3);
  for (DType dt : {DType::f32, DType::i64}) {
    std::vector<double> r = random_values(4 * 300, Domain{-9, 9, -20, 20}, dt, rng);
    Tensor big = make(r, {4, 300}, dt);
    Tensor idx = argsort(big, 1, true);
    std::vector<double> want;
    for (int row = 0; row < 4; ++row) {
      std::vector<int> o(300);
      std::iota(o.begin(), o.end(), 0);
      std::stable_sort(o.begin(), o.end(),
                       [&](int a, int b) { return r[row * 300 + a] > r[row * 300 + b]; });
      for (int k : o) want.push_back(k);
    }
    CHECK(values(idx) == want);
  }
}

TEST_CASE("argsort: the Argsort primitive's cost, measured; long rows sorted") {
  // Note [Argsort primitive]: composed of pairwise comparisons, argsort took 0.15 ms at 256
  // elements, 18 ms at 1024 and 128 ms at 2048 (O(n^2)). The primitive's times are reported,
  // not asserted (a shared machine); the check is that every size comes out sorted.
  for (int64_t n : {2048, 65536, 1 << 20}) {
    Tensor x = randn({n});
    argsort(x);  // warm
    const auto t0 = std::chrono::steady_clock::now();
    Tensor i = argsort(x);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(fmt::format("argsort of {} f32 elements: {:.2f} ms", n, ms));
    std::vector<double> s = values(gather(x, 0, i));
    CHECK(std::is_sorted(s.begin(), s.end()));
  }
  // Many short rows, along a non-contiguous dim.
  Tensor m = randn({300, 5});
  Tensor idx = argsort(transpose(m, 0, 1), 1, true);
  std::vector<double> v = values(gather(transpose(m, 0, 1), 1, idx));
  for (int r = 0; r < 5; ++r)
    CHECK(std::is_sorted(v.begin() + r * 300, v.begin() + (r + 1) * 300, std::greater<double>()));
}

TEST_CASE("one_hot: classes, num_classes -1, out of range, not differentiable") {
  Tensor idx = make({2, 0, 1, 2}, {2, 2}, DType::i64);
  Tensor oh = one_hot(idx, 4);
  check_tensor(oh, {2, 2, 4}, DType::i64, {0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  check_tensor(one_hot(idx), {2, 2, 3}, DType::i64, {0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1});
  check_tensor(one_hot(make({1}, {}, DType::i64), 2), {2}, DType::i64, {0, 1});
  check_tensor(one_hot(zeros({0}, Options().dtype(DType::i64)), 3), {0, 3}, DType::i64, {});
  check_error<ValueError>("one_hot", [&] { one_hot(idx, 2); });
  check_error<ValueError>("one_hot", [] { one_hot(make({-1}, {1}, DType::i64), 3); });
  check_error<ValueError>("one_hot", [] { one_hot(zeros({0}, Options().dtype(DType::i64))); });
  check_error<DTypeError>("one_hot", [] { one_hot(zeros({2}), 3); });
  CHECK(!oh.requires_grad());
  // Compiled over a batch of any size.
  auto f = compile([](Tensor t) { return one_hot(t, 5); });
  for (int64_t n : {2, 3, 7}) {
    Tensor t = randint(5, {n});
    CHECK(values(f(t)) == values(one_hot(t, 5)));
  }
  CHECK(f.stats().traces == 2);
}

TEST_CASE("nll_loss: the cross_entropy identity, reductions, errors") {
  Tensor logits = randn({4, 5}, f64()).requires_grad_();
  Tensor t = make({1, 4, 0, 2}, {4}, DType::i64);
  Tensor a = nll_loss(log_softmax(logits, 1), t);
  Tensor b = cross_entropy(logits, t);
  CHECK(close(a, b, 1e-12));
  CHECK(close(grad({a}, {logits})[0], grad({b}, {logits})[0], 1e-12));
  check_error<ValueError>("nll_loss", [&] { nll_loss(logits, t, "avg"); });
  check_error<DTypeError>("nll_loss", [&] { nll_loss(logits, t.to(DType::i32)); });
  check_error<ShapeError>("nll_loss", [&] { nll_loss(logits, make({1, 2}, {2}, DType::i64)); });
  check_error<ValueError>("nll_loss", [&] {
    nll_loss(logits, make({1, 2, 5, 0}, {4}, DType::i64));
  });
}

TEST_CASE("multinomial: frequencies, no repeats without replacement, compiled as eagerly") {
  manual_seed(2);
  Tensor p = make({0.1, 0.0, 0.6, 0.3}, {4}, DType::f64);
  const int64_t n = 20000;
  std::vector<double> draws = values(multinomial(p, n, /*replacement=*/true));
  std::vector<double> freq(4, 0);
  for (double d : draws) freq[static_cast<size_t>(d)] += 1.0 / n;
  CHECK(freq[1] == 0);  // weight 0: never
  CHECK(std::abs(freq[0] - 0.1) < 0.01);
  CHECK(std::abs(freq[2] - 0.6) < 0.015);
  CHECK(std::abs(freq[3] - 0.3) < 0.015);
  // Without replacement: distinct categories, the zero-weight one last, rows independent.
  Tensor rows = make({1, 0, 2, 3, 5, 1, 1, 0}, {2, 4}, DType::f32);
  for (int k = 0; k < 20; ++k) {
    std::vector<double> s = values(multinomial(rows, 3));
    CHECK(std::set<double>(s.begin(), s.begin() + 3).size() == 3);
    CHECK(std::set<double>(s.begin() + 3, s.end()).size() == 3);
    CHECK(std::count(s.begin(), s.begin() + 3, 1.0) == 0);
    CHECK(std::count(s.begin() + 3, s.end(), 3.0) == 0);
  }
  // The first draw without replacement follows the weights.
  std::vector<double> first(4, 0);
  for (int k = 0; k < 3000; ++k) first[size_t(values(multinomial(p, 1))[0])] += 1.0 / 3000;
  CHECK(std::abs(first[2] - 0.6) < 0.04);
  check_error<ValueError>("multinomial", [&] { multinomial(p, 5); });
  check_error<ValueError>("multinomial", [&] { multinomial(p, 0, true); });
  check_error<ShapeError>("multinomial", [] { multinomial(ones({2, 2, 2}), 1); });
  check_error<DTypeError>("multinomial",
                          [] { multinomial(ones({2}, Options().dtype(DType::i64)), 1); });
  check_error<ValueError>("multinomial", [] { multinomial(ones({3, 0}), 1, true); });
  // Compiled: the same draws as eagerly from the same state, over a batch of any size.
  auto fn = [](Tensor w) { return std::make_tuple(multinomial(w, 2, true), multinomial(w, 2)); };
  auto f = compile(fn);
  for (int64_t b : {2, 3, 5}) {
    Tensor w = rand({b, 6}) + 0.1;
    manual_seed(9);
    auto [x, y] = f(w);
    manual_seed(9);
    auto [ex, ey] = fn(w);
    CHECK(values(x) == values(ex));
    CHECK(values(y) == values(ey));
  }
  CHECK(f.stats().traces == 2);
}

TEST_CASE("einsum: against matmul, sizes that disagree, unsupported equations") {
  Tensor a = randn({2, 3, 4}, f64()), b = randn({2, 4, 5}, f64());
  CHECK(close(einsum("bij,bjk->bik", {a, b}), matmul(a, b), 1e-12));
  CHECK(close(einsum("bij -> bji", {a}), transpose(a, 1, 2), 0));
  Tensor q = randn({2, 3, 4, 8}, f64()), k = randn({2, 3, 5, 8}, f64());
  CHECK(close(einsum("bhqd,bhkd->bhqk", {q, k}), matmul(q, transpose(k, -1, -2)), 1e-12));
  check_error<ShapeError>("einsum", [&] { einsum("ij,jk->ik", {a, b}); });
  check_error<ShapeError>("einsum", [&] { einsum("bij,bjk->bik", {a, transpose(b, 1, 2)}); });
  check_error<ValueError>("einsum", [&] { einsum("ii->i", {zeros({3, 3})}); });
  check_error<ValueError>("einsum", [&] { einsum("...ij->...ji", {a}); });
  check_error<ValueError>("einsum", [&] { einsum("ij,jk->ik", {zeros({2, 3})}); });
  check_error<ValueError>("einsum", [&] { einsum("ij->ik", {zeros({2, 3})}); });
  check_error<ValueError>("einsum", [&] { einsum("ij->ii", {zeros({2, 3})}); });
  check_error<ValueError>("einsum", [&] { einsum("i1->i", {zeros({2, 3})}); });
  // A batch of any size under compile, forward and backward.
  Tensor w = randn({4, 6}, f64()).requires_grad_();
  auto f = compile([&](Tensor x) {
    Tensor y = einsum("bi,ij->bj", {x, w});
    return std::make_tuple(y, grad({sum(y * y)}, {w})[0]);
  });
  for (int64_t n : {2, 3, 7}) {
    Tensor x = randn({n, 4}, f64());
    auto [y, g] = f(x);
    Tensor ey = matmul(x, w);
    CHECK(close(y, ey, 1e-12));
    CHECK(close(g, grad({sum(ey * ey)}, {w})[0], 1e-10));
  }
  CHECK(f.stats().traces == 2);
}

}  // namespace duet::test
