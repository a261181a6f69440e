// Eager autograd semantics: the tape, .grad accumulation, retain_graph, grad mode, grad() with
// create_graph, version counters, in-place ops, views, broadcasting, dtypes, errors, and the
// reuse of expiring temporaries while recording. The per-op gradients are checked by the op
// sweep (test_op_grads.cpp).
#include <pthread.h>

#include <cmath>
#include <exception>
#include <functional>
#include <thread>

#include "core/autograd_hooks.h"
#include "util.h"

namespace duet::test {
namespace {

Options f64() { return Options().dtype(DType::f64); }
Options f64_leaf() { return Options().dtype(DType::f64).requires_grad(); }
Tensor ones64(Shape s) { return ones(s, f64()); }

// Row-major values of the gradient of sum(view(x) * c) with respect to x: c's element j goes to
// the element of x that element j of the view reads (`source(j)`).
template <class F>
std::vector<double> scatter_back(int64_t n, const std::vector<double>& c, F source) {
  std::vector<double> g(static_cast<size_t>(n), 0.0);
  for (size_t j = 0; j < c.size(); ++j) g[static_cast<size_t>(source(int64_t(j)))] += c[j];
  return g;
}

std::vector<double> iota(int64_t n, double scale = 1) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * double(i + 1);
  return v;
}

}  // namespace

// Note [Autograd hooks] in core/autograd_hooks.h: a program that includes eager/autograd.h
// (here through duet.h) has registered autograd before main; tests/autograd_unlinked.cpp is one
// that has not.
TEST_CASE("eager autograd has filled core's hook table") { CHECK(detail::autograd_registered()); }

TEST_CASE("seed examples: c = a * b and (x1 * x2 + x1) / x2") {
  Tensor a = scalar(15.0, Options().requires_grad());
  Tensor b = scalar(20.0, Options().requires_grad());
  Tensor c = a * b;
  c.backward();
  CHECK(c.item<float>() == 300);
  CHECK(a.grad().item<float>() == 20);
  CHECK(b.grad().item<float>() == 15);
  CHECK(a.is_leaf());
  CHECK(!c.is_leaf());
  CHECK(c.requires_grad());

  Tensor x1 = scalar(0.6, f64_leaf()), x2 = scalar(0.2, f64_leaf());
  Tensor y = (x1 * x2 + x1) / x2;
  y.backward();
  CHECK(y.item<double>() == doctest::Approx(3.6).epsilon(1e-14));
  CHECK(x1.grad().item<double>() == doctest::Approx(6.0).epsilon(1e-14));    // (x2 + 1) / x2
  CHECK(x2.grad().item<double>() == doctest::Approx(-15.0).epsilon(1e-14));  // -x1 / x2^2
  CHECK(dtype_name(x1.grad().dtype()) == "f64");
}

TEST_CASE(".grad accumulates across backwards, and zero_() resets it in place") {
  Tensor x = tensor({1, 2, 3}, f64_leaf());
  CHECK(!x.grad().defined());
  sum(x * x).backward();
  check_tensor(x.grad(), {3}, DType::f64, {2, 4, 6});
  const void* storage = x.grad().raw_data();
  sum(x * x).backward();
  check_tensor(x.grad(), {3}, DType::f64, {4, 8, 12});
  CHECK(x.grad().raw_data() == storage);
  x.grad().zero_();
  check_tensor(x.grad(), {3}, DType::f64, {0, 0, 0});
  CHECK(x.grad().raw_data() == storage);
  sum(x * 3).backward();
  check_tensor(x.grad(), {3}, DType::f64, {3, 3, 3});
  CHECK(x.grad().raw_data() == storage);
  // The gradient of a leaf used twice in one expression is the sum of both uses.
  x.set_grad(Tensor());
  sum(x + x * x).backward();
  check_tensor(x.grad(), {3}, DType::f64, {3, 5, 7});
}

TEST_CASE("a leaf used twice: its uses are summed, then accumulated into .grad once") {
  // Accumulated use by use, two backwards would give ((3.3 + 0.1) + 3.3) + 0.1, which is
  // 6.799999999999999, not twice 3.4 (PyTorch's AccumulateGrad sums first, too).
  Tensor x = scalar(2.0, f64_leaf());
  Tensor a = x * 0.1;
  Tensor b = x * 3.3;  // recorded later, so the engine reaches it first
  Tensor y = a + b;
  y.backward({}, /*retain_graph=*/true);
  CHECK(x.grad().item<double>() == 0.1 + 3.3);
  y.backward();
  CHECK(x.grad().item<double>() == 2 * (0.1 + 3.3));
}

TEST_CASE("a backward inside a gradient hook leaves the records of the one it runs in alone") {
  // Note [Backward bookkeeping]: the outer backward finds its records through the nodes; the
  // inner one, which walks the same nodes (s, sin, x * x) while the outer has reached them, must
  // keep its records elsewhere.
  Tensor x = scalar(0.7, f64_leaf()), u = scalar(2.0, f64_leaf());
  Tensor s = sum(sin(x * x));
  Tensor loss = s + u * 5;  // u's product is recorded last, so the engine reaches it first
  Tensor inner;
  u.register_post_accumulate_grad_hook([&](const Tensor&) {
    inner = detail::grad({s}, {x}, {}, /*create_graph=*/false, /*retain_graph=*/true)[0];
  });
  loss.backward();
  const double want = std::cos(0.7 * 0.7) * 2 * 0.7;
  REQUIRE(inner.defined());
  CHECK(inner.item<double>() == doctest::Approx(want).epsilon(1e-12));
  CHECK(x.grad().item<double>() == doctest::Approx(want).epsilon(1e-12));
  CHECK(u.grad().item<double>() == 5);
}

TEST_CASE("a second backward needs retain_graph") {
  Tensor a = scalar(15.0, Options().requires_grad());
  Tensor b = scalar(20.0, Options().requires_grad());
  Tensor c = a * b;
  c.backward();
  std::string msg = error_of([&] { c.backward(); });
  CHECK(starts_with(msg, "[backward]"));
  CHECK(contains(msg, "retain_graph"));
  CHECK(a.grad().item<float>() == 20);  // the failed backward changed nothing

  Tensor d = a * b;
  a.grad().zero_();
  b.grad().zero_();
  d.backward({}, /*retain_graph=*/true);
  d.backward({}, /*retain_graph=*/true);
  d.backward();
  CHECK(a.grad().item<float>() == 60);
  CHECK(b.grad().item<float>() == 45);
  CHECK(starts_with(error_of([&] { d.backward(); }), "[backward]"));
}

TEST_CASE("NoGradGuard turns recording off for its scope and this thread") {
  Tensor x = tensor({1, 2}, f64_leaf());
  CHECK(grad_enabled());
  {
    NoGradGuard no_grad;
    CHECK(!grad_enabled());
    Tensor y = x * 2;
    CHECK(!y.requires_grad());
    CHECK(y.is_leaf());
    {
      NoGradGuard nested;
      CHECK(!grad_enabled());
    }
    CHECK(!grad_enabled());
    bool other_thread = false;
    std::thread t([&] { other_thread = grad_enabled(); });
    t.join();
    CHECK(other_thread);  // grad mode is per thread
  }
  CHECK(grad_enabled());
  CHECK((x * 2).requires_grad());
}

TEST_CASE("a tape node is made only when an input requires grad") {
  Tensor a = tensor({1, 2}), b = tensor({3, 4});
  for (const Tensor& r : {a + b, exp(a), sum(a), transpose(reshape(a, {1, 2}), 0, 1),
                          matmul(reshape(a, {1, 2}), reshape(b, {2, 1}))}) {
    CHECK(!r.requires_grad());
    CHECK(r.is_leaf());
    CHECK(r.unsafe_impl()->autograd == nullptr);
  }
  b.requires_grad_();
  Tensor d = a + b;
  CHECK(d.requires_grad());
  CHECK(!d.is_leaf());
  CHECK(a.unsafe_impl()->autograd == nullptr);  // an input that does not require grad is untouched
  // Comparisons and casts to integers end the graph, as in PyTorch.
  for (const Tensor& r : {b > a, eq(b, d), b.to(DType::i64), d.to(DType::b8)}) {
    CHECK(!r.requires_grad());
    CHECK(r.unsafe_impl()->autograd == nullptr);
  }
  // A cast between floating dtypes is differentiable.
  CHECK(b.to(DType::f64).requires_grad());
  // Only leaves change their flag; detach() makes a leaf.
  CHECK(starts_with(error_of([&] { d.requires_grad_(false); }), "[requires_grad_]"));
  Tensor e = d.detach();
  CHECK(e.is_leaf());
  CHECK(!e.requires_grad());
}

TEST_CASE("grad() with create_graph: second and third derivatives against closed forms") {
  const std::vector<double> xs = {-1.5, 0.5, 2};
  Tensor x = tensor(xs, f64_leaf());
  // x^3: 3x^2, 6x, 6.
  Tensor y = x * x * x;
  Tensor d1 = grad({y}, {x}, {ones64({3})}, /*create_graph=*/true)[0];
  CHECK(d1.requires_grad());
  Tensor d2 = grad({d1}, {x}, {ones64({3})}, /*create_graph=*/true)[0];
  Tensor d3 = grad({d2}, {x}, {ones64({3})})[0];
  std::vector<double> w1, w2;
  for (double v : xs) w1.push_back(3 * v * v), w2.push_back(6 * v);
  check_tensor(d1, {3}, DType::f64, w1, 1e-14, 1e-14);
  check_tensor(d2, {3}, DType::f64, w2, 1e-14, 1e-14);
  check_tensor(d3, {3}, DType::f64, {6, 6, 6}, 1e-14, 1e-14);
  CHECK(!x.grad().defined());  // grad() does not touch .grad

  // tanh: 1 - t^2 and -2t(1 - t^2), the second through the saved output.
  Tensor t1 = grad({tanh(x)}, {x}, {ones64({3})}, true)[0];
  Tensor t2 = grad({t1}, {x}, {ones64({3})})[0];
  w1.clear(), w2.clear();
  for (double v : xs) {
    const double t = std::tanh(v);
    w1.push_back(1 - t * t), w2.push_back(-2 * t * (1 - t * t));
  }
  check_tensor(t1, {3}, DType::f64, w1, 1e-14, 1e-14);
  check_tensor(t2, {3}, DType::f64, w2, 1e-13, 1e-14);
}

TEST_CASE("Hessian-vector products through matmul") {
  // f(x) = x^T A x: grad (A + A^T) x, Hessian-vector product (A + A^T) v.
  const std::vector<double> av = {1, 2, -1, 0.5, 3, 2, -2, 1, 0.25}, xv = {0.5, -1, 2},
                            vv = {1, -2, 0.5};
  Tensor A = tensor(av, Shape{3, 3}, f64()), v = tensor(vv, f64());
  Tensor x = tensor(xv, f64_leaf());
  Tensor f = matmul(x, matmul(A, x));
  Tensor g = grad({f}, {x}, {}, /*create_graph=*/true)[0];
  Tensor hv = grad({sum(g * v)}, {x})[0];
  std::vector<double> wg(3, 0), wh(3, 0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      wg[i] += (av[i * 3 + j] + av[j * 3 + i]) * xv[j];
      wh[i] += (av[i * 3 + j] + av[j * 3 + i]) * vv[j];
    }
  check_tensor(g, {3}, DType::f64, wg, 1e-14, 1e-14);
  check_tensor(hv, {3}, DType::f64, wh, 1e-14, 1e-14);

  // f(x) = sum(tanh(W x)): H v = W^T diag(-2 t (1 - t^2)) W v with t = tanh(W x).
  const std::vector<double> wv = {0.5, -1, 0.25, 1.5, 0.75, -0.5};
  Tensor W = tensor(wv, Shape{2, 3}, f64());
  Tensor h = grad({sum(tanh(matmul(W, x)))}, {x}, {}, true)[0];
  Tensor hv2 = grad({h}, {x}, {v})[0];
  std::vector<double> want(3, 0);
  for (int r = 0; r < 2; ++r) {
    double wx = 0, wvv = 0;
    for (int j = 0; j < 3; ++j) wx += wv[r * 3 + j] * xv[j], wvv += wv[r * 3 + j] * vv[j];
    const double t = std::tanh(wx), s = -2 * t * (1 - t * t);
    for (int i = 0; i < 3; ++i) want[i] += wv[r * 3 + i] * s * wvv;
  }
  check_tensor(hv2, {3}, DType::f64, want, 1e-13, 1e-14);
}

TEST_CASE("grad(): zeros for unreachable inputs; gradients with respect to intermediates") {
  Tensor x = tensor({1, 2}, f64_leaf()), u = tensor({3, 4, 5}, f64_leaf());
  Tensor y = sum(x * x);
  std::vector<Tensor> g = grad({y}, {x, u});
  check_tensor(g[0], {2}, DType::f64, {2, 4});
  check_tensor(g[1], {3}, DType::f64, {0, 0, 0});
  // With respect to a non-leaf: h = 3x, y = sum(h * h), dy/dh = 2h, dy/dx = 18x.
  Tensor h = x * 3;
  Tensor z = sum(h * h) + sum(u);
  g = grad({z}, {h, x, u});
  check_tensor(g[0], {2}, DType::f64, {6, 12});
  check_tensor(g[1], {2}, DType::f64, {18, 36});
  check_tensor(g[2], {3}, DType::f64, {1, 1, 1});
  // An intermediate the output does not depend on (h's graph was freed: a new one).
  Tensor other = u * 2;
  h = x * 3;
  g = grad({sum(h)}, {other, x});
  check_tensor(g[0], {3}, DType::f64, {0, 0, 0});
  check_tensor(g[1], {2}, DType::f64, {3, 3});
  CHECK(!x.grad().defined());
  // An input passed twice gets its gradient twice, leaf or not.
  g = grad({sum(x * x)}, {x, x});
  check_tensor(g[0], {2}, DType::f64, {2, 4});
  check_tensor(g[1], {2}, DType::f64, {2, 4});
  Tensor h3 = x * 3;
  g = grad({sum(h3 * h3)}, {h3, x, h3});
  check_tensor(g[0], {2}, DType::f64, {6, 12});
  check_tensor(g[2], {2}, DType::f64, {6, 12});
  CHECK(starts_with(error_of([&] { grad({sum(h)}, {tensor({1.0})}); }), "[grad]"));
}

TEST_CASE(
    "version counters: an in-place write to a saved tensor fails at backward, naming the op") {
  Tensor x = tensor({0.5, -1}, f64_leaf());
  Tensor y = tanh(x);  // tanh saves its output
  y.add_(1);
  std::string msg = error_of([&] { sum(y).backward(); });
  CHECK(starts_with(msg, "[backward]"));
  CHECK(contains(msg, "tanh"));
  CHECK(contains(msg, "modified in place"));

  // Views share the version counter with their base: writing the base after a view was saved.
  Tensor base = x * 1;
  Tensor z = sin(transpose(reshape(base, {1, 2}), 0, 1));  // sin saves its input, a view
  base.mul_(2);
  CHECK(contains(error_of([&] { sum(z).backward(); }), "sin"));
  // A leaf's base written under NoGradGuard, and a write through detach(): same storage.
  Tensor l = tensor({1, 2, 3, 4}, f64_leaf());
  Tensor lz = log(slice(l, 0, 0, 4, 2));
  {
    NoGradGuard no_grad;
    l.add_(1);
  }
  CHECK(contains(error_of([&] { sum(lz).backward(); }), "log"));
  Tensor l2 = tensor({1, 2}, f64_leaf());
  Tensor lz2 = l2 * l2;
  l2.detach().mul_(3);
  CHECK(contains(error_of([&] { sum(lz2).backward(); }), "mul"));
  // A write to a saved value the rule does not read is fine: y * c needs only c for y's gradient.
  Tensor c = tensor({2, -3}, f64());
  Tensor h = x * 2;
  Tensor hz = h * c;
  h.add_(100);
  sum(hz).backward();
  check_tensor(x.grad(), {2}, DType::f64, {4, -6});
}

TEST_CASE("in-place ops: leaves need NoGradGuard; non-leaves are recorded") {
  Tensor x = tensor({1, 2, 3}, f64_leaf());
  std::string msg = error_of([&] { x.add_(1); });
  CHECK(starts_with(msg, "[add_]"));
  CHECK(contains(msg, "NoGradGuard"));
  check_tensor(x, {3}, DType::f64, {1, 2, 3});
  {
    NoGradGuard no_grad;
    x.mul_(2);
  }
  check_tensor(x, {3}, DType::f64, {2, 4, 6});
  CHECK(x.is_leaf());
  CHECK(x.requires_grad());

  // (x * 2).add_(1), then d/dx sum((2x + 1)^2) = 4(2x + 1).
  Tensor y = x * 2;
  y.add_(1);
  CHECK(!y.is_leaf());
  sum(y * y).backward();
  check_tensor(x.grad(), {3}, DType::f64, {20, 36, 52});
  // mul_ and div_ by constants: the rules need only the constants, not the overwritten value.
  x.set_grad(Tensor());
  Tensor m = x * 2;
  m.mul_(3);
  m.div_(tensor({2, 4, 8}, f64()));
  sum(m).backward();
  check_tensor(x.grad(), {3}, DType::f64, {3, 1.5, 0.75});
  // mul_ by a tensor that requires grad needs the overwritten value for its gradient: loud.
  Tensor w = tensor({1, 1, 1}, f64_leaf());
  Tensor m2 = x * 2;
  m2.mul_(w);
  CHECK(contains(error_of([&] { sum(m2).backward(); }), "mul"));
  // A result of another dtype goes through a copy: f32 * f64 written into the f32 tensor.
  Tensor xf = tensor({1, 2, 3}, Options().requires_grad());
  Tensor yf = xf * 2;
  yf.mul_(tensor({0.5, 1, 2}, f64()));
  sum(yf).backward();
  check_tensor(xf.grad(), {3}, DType::f32, {1, 2, 4});
  {
    // Without a backward the graph is freed with its tensors: no reference cycle through the
    // tensor written in place (LeakSanitizer checks in the sanitizer build).
    Tensor y2 = xf * 2;
    y2.mul_(tensor({0.5, 1, 2}, f64()));
    y2 = Tensor();
  }
  // Writing a tensor that requires grad into one that does not: the target joins the graph.
  Tensor out = zeros({2, 3}, f64());
  out.copy_(x * 1);  // broadcast (3) -> (2, 3)
  CHECK(out.requires_grad());
  x.set_grad(Tensor());
  sum(out).backward();
  check_tensor(x.grad(), {3}, DType::f64, {2, 2, 2});
  // In-place writes into views are not recorded.
  Tensor v = slice(x * 1, 0, 0, 2);
  CHECK(starts_with(error_of([&] { v.add_(1); }), "[add_]"));
}

TEST_CASE("gradients through views: transpose, strided slice, expand, reshape, permute") {
  // The gradient of sum(view(x) * c) puts c's elements where the view reads them.
  Tensor x = tensor(iota(6), Shape{2, 3}, f64_leaf());
  auto check_view = [&](const Tensor& leaf, const Tensor& view, auto source) {
    std::vector<double> c = iota(view.numel(), 0.5);
    Tensor g = grad({sum(view * tensor(c, view.shape(), f64()))}, {leaf})[0];
    check_tensor(g, leaf.shape(), DType::f64, scatter_back(leaf.numel(), c, source));
  };
  check_view(x, transpose(x, 0, 1), [](int64_t j) { return (j % 2) * 3 + j / 2; });
  check_view(x, slice(x, 1, 0, 3, 2), [](int64_t j) { return (j / 2) * 3 + (j % 2) * 2; });
  check_view(x, slice(x, -1, 1, 3), [](int64_t j) { return (j / 2) * 3 + 1 + j % 2; });
  Tensor row = tensor({1, 2, 3}, Shape{1, 3}, f64_leaf());
  check_view(row, expand(row, {4, 3}), [](int64_t j) { return j % 3; });
  Tensor s = scalar(2.0, f64_leaf());
  check_view(s, expand(s, {2, 2}), [](int64_t) { return int64_t(0); });
  // A reshape of a non-contiguous tensor copies; its gradient still reaches x.
  Tensor flat = reshape(transpose(x, 0, 1), {6});
  CHECK(flat.is_contiguous());
  check_view(x, flat, [](int64_t j) { return (j % 2) * 3 + j / 2; });
  Tensor x3 = tensor(iota(24), Shape{2, 3, 4}, f64_leaf());
  // permute (2, 0, 1): view[a][b][c] = x3[b][c][a], view shape (4, 2, 3).
  check_view(x3, permute(x3, {2, 0, 1}), [](int64_t j) {
    const int64_t a = j / 6, b = (j / 3) % 2, c = j % 3;
    return b * 12 + c * 4 + a;
  });
  // Views of views: every other column of the transpose, squeezed and unsqueezed.
  check_view(x3, unsqueeze(slice(transpose(x3, 1, 2), 1, 1, 4, 2), 0), [](int64_t j) {
    const int64_t a = j / 6, b = (j / 3) % 2, c = j % 3;  // view (1, 2, 2, 3) -> x3[a][c][1+2b]
    return a * 12 + c * 4 + 1 + 2 * b;
  });
}

TEST_CASE("a tensor read row by row: the rows' gradients add into one buffer, as summed") {
  // Note [Slices' gradients] in eager/engine.cpp: slices and index_selects that read no row
  // twice add their gradients into one buffer of the whole; grad() takes the general path
  // (zeros, scatter, add per read), and the sums agree bit for bit. An index_select that reads
  // a row twice takes the general path too.
  manual_seed(1);
  Tensor w = randn({40, 3}).requires_grad_(true);
  const Tensor c = randn({3, 3});  // each read's gradient differs by position
  auto loss = [&](int64_t reads) {
    const Tensor x = tanh(w);  // a non-leaf whole, read many times
    Tensor total = sum(x) * 0.5;
    for (int64_t k = 0; k < reads; ++k) {
      const Tensor rows = tensor({double(k % 7), double(k % 7 + 3), double(39 - k % 5)},
                                 Options().dtype(DType::i64));  // increasing
      const double a = double(k % 11);
      const std::vector<double> order = k % 3 == 0   ? std::vector<double>{a + 1, a, a}
                                        : k % 3 == 1 ? std::vector<double>{a, a, a + 2}
                                                     : std::vector<double>{a + 2, a, a + 1};
      const Tensor back = tensor(order, Options().dtype(DType::i64));  // a row twice; unordered
      total = total + sum(exp(index_select(x, 0, rows)) * double(k + 1)) +
              sum(index_select(x, 0, back) * c) + sum(slice(x, 0, k % 9, k % 9 + 4) * 3.0);
    }
    return total;
  };
  // backward() adds into the buffers; grad() collects its results apart, by the general path.
  Tensor general;
  auto kernels = [&](bool backward) {
    Tensor l = loss(30);
    detail::KernelCounter count;
    {
      ModeGuard counting(&count);
      if (backward)
        l.backward();
      else
        general = grad({l}, {w})[0];
    }
    return count.kernels;
  };
  const int64_t fast_kernels = kernels(true);
  const int64_t general_kernels = kernels(false);
  CHECK(bitwise_equal(w.grad(), general));
  // One scatter per read into the buffer: no zeros and no add of the whole per read.
  CHECK(fast_kernels + 40 <= general_kernels);
}

TEST_CASE("broadcasting: gradients are summed back to each input's shape") {
  const std::vector<double> av = {1, 2, 3}, bv = {0.5, -1, 2, 4};
  Tensor a = tensor(av, Shape{3, 1}, f64_leaf()), b = tensor(bv, f64_leaf());
  const std::vector<double> c = iota(12, 0.25);
  Tensor ct = tensor(c, Shape{3, 4}, f64());
  std::vector<Tensor> g = grad({sum((a + b) * ct)}, {a, b});
  std::vector<double> wa(3, 0), wb(4, 0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) wa[i] += c[i * 4 + j], wb[j] += c[i * 4 + j];
  check_tensor(g[0], {3, 1}, DType::f64, wa);
  check_tensor(g[1], {4}, DType::f64, wb);
  g = grad({sum(a * b * ct)}, {a, b});
  wa.assign(3, 0), wb.assign(4, 0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) wa[i] += c[i * 4 + j] * bv[j], wb[j] += c[i * 4 + j] * av[i];
  check_tensor(g[0], {3, 1}, DType::f64, wa, 1e-15, 1e-15);
  check_tensor(g[1], {4}, DType::f64, wb, 1e-15, 1e-15);
  // A 0-d operand gets the sum; a (1, 4) operand of a (2, 3, 4) result sums over two dims.
  Tensor s = scalar(3.0, f64_leaf());
  Tensor r = tensor({1, 2, 3, 4}, Shape{1, 4}, f64_leaf());
  g = grad({sum((s * r + ones64({2, 3, 4})) * 2)}, {s, r});
  check_tensor(g[0], {}, DType::f64, {120});
  check_tensor(g[1], {1, 4}, DType::f64, {36, 36, 36, 36});
}

TEST_CASE("mixed dtypes: each leaf gets its gradient in its own dtype") {
  Tensor a = tensor({1, 2, 3}, Options().requires_grad());
  Tensor b = tensor({0.5, 0.25, 2}, f64_leaf());
  Tensor y = a * b;
  CHECK(dtype_name(y.dtype()) == "f64");
  sum(y).backward();
  check_tensor(a.grad(), {3}, DType::f32, {0.5, 0.25, 2});
  check_tensor(b.grad(), {3}, DType::f64, {1, 2, 3});
  // A 0-d f64 operand does not promote an f32 tensor; its gradient is still f64.
  Tensor s = scalar(2.0, f64_leaf());
  Tensor z = s * a;
  CHECK(dtype_name(z.dtype()) == "f32");
  sum(z).backward();
  check_tensor(s.grad(), {}, DType::f64, {6});
  check_tensor(a.grad(), {3}, DType::f32, {2.5, 2.25, 4});
  // A grad_output of another dtype is converted to the output's dtype.
  Tensor m = tensor({1, 2, 3, 4}, Shape{2, 2}, Options().requires_grad());
  matmul(m, m).backward(ones64({2, 2}));
  check_tensor(m.grad(), {2, 2}, DType::f32, {7, 11, 9, 13});
}

TEST_CASE("autograd errors name the op and the problem") {
  Tensor i = tensor({1, 2}, Options().dtype(DType::i64));
  std::string msg = error_of<DTypeError>([&] { i.requires_grad_(); });
  CHECK(starts_with(msg, "[requires_grad_]"));
  CHECK(contains(msg, "i64"));
  msg = error_of([&] { sum(tensor({1, 2})).backward(); });
  CHECK(starts_with(msg, "[backward]"));
  CHECK(contains(msg, "does not require grad"));
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3}, f64_leaf());
  msg = error_of([&] { (x * 2).backward(); });
  CHECK(starts_with(msg, "[backward]"));
  CHECK(contains(msg, "(2, 3)"));
  msg = error_of([&] { (x * 2).backward(ones64({3})); });
  CHECK(starts_with(msg, "[backward]"));
  CHECK(contains(msg, "(3)"));
  msg = error_of([&] { x.set_grad(ones64({3})); });
  CHECK(starts_with(msg, "[set_grad]"));
  CHECK(starts_with(error_of([&] { grad({sum(x)}, {x}, {ones64({}), ones64({})}); }), "[grad]"));
  CHECK(!x.grad().defined());
}

TEST_CASE("expiring temporaries: buffer reuse never overwrites what a node saved") {
  Rng rng(31);
  const int64_t n = 1000;
  std::vector<double> v = random_values(n, Domain{-2, 2}, DType::f32, rng);
  Tensor x = make(v, {n});
  x.requires_grad_();
  // Every op records, so none may write into its expiring input.
  Tensor y = tanh(x * 1.5 + 0.5);
  sum(y).backward();
  std::vector<double> want(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double t = std::tanh(1.5 * v[i] + 0.5);
    want[i] = 1.5 * (1 - t * t);
  }
  check_tensor(x.grad(), {n}, DType::f32, want, 1e-5, 1e-6);
  CHECK(differences(values(x), v, 0, 0).empty());
  // y = x * c with c an expiring temporary outside autograd: mul saves c.
  std::vector<double> av = random_values(n, Domain{-2, 2}, DType::f32, rng);
  std::vector<double> bv = random_values(n, Domain{-2, 2}, DType::f32, rng);
  Tensor a = make(av, {n}), b = make(bv, {n});
  for (int form = 0; form < 3; ++form) {
    x.set_grad(Tensor());
    Tensor z = form == 0 ? x * (a + b) : form == 1 ? (a + b) * x : exp(a - b) * 1.0 * x;
    sum(z * 2.0).backward();
    for (size_t i = 0; i < v.size(); ++i) {
      const double c = form < 2 ? float(av[i] + bv[i]) : std::exp(float(av[i] - bv[i]));
      want[i] = 2 * c;
    }
    INFO("form " << form);
    check_tensor(x.grad(), {n}, DType::f32, want, 1e-6, 1e-6);
  }
  // A saved output is not reused by a later op outside autograd either: a fresh handle to its
  // storage that nobody else holds still shares the storage with the node.
  x.set_grad(Tensor());
  Tensor t = exp(x);
  Tensor loss = sum(t);
  Tensor alone = t.detach();
  t = Tensor();
  {
    NoGradGuard no_grad;
    Tensor u = std::move(alone) * 2.0;
  }
  loss.backward();
  for (size_t i = 0; i < v.size(); ++i) want[i] = std::exp(v[i]);
  check_tensor(x.grad(), {n}, DType::f32, want, 1e-6, 1e-6);
}

TEST_CASE("gradcheck: agrees on correct gradients, reports wrong ones, checks its inputs") {
  Tensor x = tensor({0.5, -1.25, 2}, f64_leaf());
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return exp(in[0]) * in[0]; }, {x}));
  // x * detach(x) hides one path from the tape: the analytical gradient is half the truth.
  GradcheckResult r =
      gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0].detach(); }, {x});
  CHECK(!r.ok);
  CHECK(starts_with(r.message, "gradcheck: input 0"));
  // An f32 output: the check reads it through f64 (values and eps exact in f32).
  Tensor e = tensor({0.5, -1.25, 2.75}, f64_leaf());
  CHECK(gradcheck([](const std::vector<Tensor>& in) { return in[0].to(DType::f32) * 2; }, {e},
                  1.0 / 1024));
  CHECK(starts_with(error_of<DTypeError>([] {
                      gradcheck([](const std::vector<Tensor>& in) { return in[0]; },
                                {tensor({1.0}, Options().requires_grad())});
                    }),
                    "[gradcheck]"));
  CHECK(starts_with(error_of([] {
                      gradcheck([](const std::vector<Tensor>& in) { return in[0]; }, {ones64({2})});
                    }),
                    "[gradcheck]"));
}

TEST_CASE("pow with a Scalar exponent keeps the precision of its input") {
  const std::vector<double> xs = {0.7, 1.9, 3.1};
  Tensor x = tensor(xs, f64_leaf());
  for (double e : {1.0 / 3, -0.1, 2.5}) {
    INFO("exponent " << e);
    Tensor g = grad({sum(pow(x, e))}, {x})[0];
    std::vector<double> want;
    for (double v : xs) want.push_back(e * std::pow(v, e - 1));
    check_tensor(g, {3}, DType::f64, want, 1e-14, 0);
  }
}

}  // namespace duet::test

// ---- Reproducers: deep tapes, views of tensors written in place, escaped traced tensors,
// in-place writes through expanded views. Each failed (crashed, or was silently wrong) before.

namespace duet::test {

namespace {

// Runs fn on a thread whose stack holds `bytes`, and rethrows what it threw.
void on_stack_of(size_t bytes, const std::function<void()>& fn) {
  struct Call {
    const std::function<void()>* fn;
    std::exception_ptr error;
  } call{&fn, nullptr};
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, bytes) == 0);
  pthread_t thread;
  const int made = pthread_create(
      &thread, &attr,
      [](void* p) -> void* {
        Call* c = static_cast<Call*>(p);
        try {
          (*c->fn)();
        } catch (...) {
          c->error = std::current_exception();
        }
        return nullptr;
      },
      &call);
  pthread_attr_destroy(&attr);
  REQUIRE(made == 0);
  pthread_join(thread, nullptr);
  if (call.error) std::rethrow_exception(call.error);
}

}  // namespace

TEST_CASE("deep tapes: a 100,000-op chain is released and differentiated without recursion") {
  // Before: destroying y recursed once per node (a stack overflow at 300,000 nodes on the main
  // thread's 8 MiB, and at 100,000 under ASan), and backward() over 1M ops crashed the same way.
  // On a stack of 512 KiB, a recursion of even 6 bytes a node overflows long before 100,000.
  constexpr int kDepth = 100000;
  on_stack_of(512 << 10, [] {
    Tensor x = ones({1}, Options().requires_grad());
    {
      Tensor y = x;
      for (int i = 0; i < kDepth; ++i) y = y + 1;
      CHECK(y.item<float>() == doctest::Approx(kDepth + 1));
    }  // y and its whole tape die here
    Tensor y = x * 1;
    for (int i = 0; i < kDepth; ++i) y = y + 1;
    y.backward();
    CHECK(x.grad().item<float>() == 1);
    y = Tensor();  // the released tape is freed too
    // A deep chain that keeps its saved tensors (mul saves both inputs) dies without backward.
    Tensor z = x * 1;
    for (int i = 0; i < kDepth; ++i) z = z * 1.0;
    z = Tensor();
  });
}

TEST_CASE("a view taken before an in-place write to its base differentiates through the write") {
  // Before: the view kept the base's old history, so x.grad was [1, 0] instead of [5, 0] and
  // [1, 1] instead of [2, 4], with no error. PyTorch regenerates the view's history.
  {
    Tensor x = tensor({1.0, 2.0}, f64_leaf());
    Tensor a = x * 1;
    Tensor v = slice(a, 0, 0, 1);
    a.mul_(5);
    sum(v * 1).backward();
    CHECK(values(x.grad()) == std::vector<double>{5, 0});
    CHECK(values(v) == std::vector<double>{5});
  }
  {
    // a.mul_(a) overwrites the value its own gradient needs: the backward through the view
    // now reaches that node and raises, as a backward through a does (it gave [1, 1] silently).
    Tensor x = tensor({1.0, 2.0}, f64_leaf());
    Tensor a = x * 1;
    Tensor v = reshape(a, {2, 1});
    a.mul_(a);
    try {
      sum(v * 1).backward();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK_MESSAGE(contains(e.what(), "saved by mul was modified in place"), e.what());
    }
    // The same with a factor the rule can keep: a = x * x through a view, d/dx = 2x.
    Tensor b = x * 1;
    Tensor u = reshape(b, {2, 1});
    b.add_(x);
    b.mul_(tensor({0.5, 0.5}, f64()));  // b = x
    b.mul_(x.detach());                 // b = x * x0 (x0 constant)
    sum(u * 1).backward();
    CHECK(values(x.grad()) == std::vector<double>{1, 2});
  }
  {  // a view of a view, two writes, and the view as the root of backward
    Tensor x = tensor({1.0, 2.0, 3.0, 4.0}, f64_leaf());
    Tensor a = x * 1;
    Tensor v = slice(reshape(a, {2, 2}), 0, 1, 2);  // the second row: x[2], x[3]
    a.mul_(2);
    a.add_(x);  // a = 3x
    sum(v).backward();
    CHECK(values(x.grad()) == std::vector<double>{0, 0, 3, 3});
    Tensor w = reshape(x * 1, {4});
    Tensor b = x * 1;
    Tensor u = slice(b, 0, 0, 1);
    b.mul_(3);  // du/dx0 = 3
    CHECK(values(grad({sum(u)}, {x})[0]) == std::vector<double>{3, 0, 0, 0});
    (void)w;
  }
  {  // a reshape that copied is no view of its base: it keeps its history
    Tensor x = ones({2, 2}, f64_leaf());
    Tensor a = x * 1;
    Tensor v = reshape(transpose(a, 0, 1), {4});  // not contiguous: a copy
    a.mul_(10);
    sum(v).backward();
    CHECK(values(x.grad()) == std::vector<double>{1, 1, 1, 1});
  }
  {  // views taken after the write, and eager against gradcheck
    auto fn = [](const std::vector<Tensor>& in) {
      Tensor a = in[0] * 1;
      Tensor v = slice(a, 0, 1, 3);
      a.add_(in[1]);
      a.mul_(3);
      Tensor u = slice(a, 0, 0, 2);
      return sum(v * u);
    };
    Tensor x = tensor({0.5, -1.5, 2.0}, f64_leaf());
    Tensor s = tensor({3.0, 0.25, -2.0}, f64_leaf());
    GradcheckResult r = gradcheck(fn, {x, s});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("escaped traced tensors: backward() and grad() raise instead of doing nothing") {
  // Before: leak.backward() did nothing, and grad({leak}, {x}) returned 0 instead of 2.
  Tensor leak;
  Tensor x = ones({1}, Options().requires_grad());
  auto f = compile([&](Tensor a) {
    leak = sum(a * 2);
    return a + 1;
  });
  f(x);
  REQUIRE(leak.defined());
  auto escaped = [](const std::function<void()>& call, const char* op) {
    try {
      call();
      FAIL("no error");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK_MESSAGE(starts_with(m, std::string("[") + op + "]"), m);
      CHECK_MESSAGE(contains(m, "used after that trace ended"), m);
    }
  };
  escaped([&] { leak.backward(); }, "backward");
  escaped([&] { grad({leak}, {x}); }, "grad");
  escaped([&] { grad({sum(x * 2)}, {x}, {leak}); }, "grad");
  escaped([&] { ones({1}).backward(leak); }, "backward");
}

TEST_CASE("in-place writes into an expanded tensor are refused") {
  // Before: expand(b, {4, 3}).add_(1) added 1 four times to each element of b (b == 4).
  for (bool grad_on : {false, true}) {
    Tensor b = zeros({1, 3});
    detail::GradModeScope mode(grad_on);
    Tensor e = expand(b, {4, 3});
    CHECK_THROWS_AS(e.add_(1), ValueError);
    CHECK_THROWS_AS(e.mul_(ones({4, 3})), ValueError);
    CHECK_THROWS_AS(e.copy_(ones({4, 3})), ValueError);
    CHECK_THROWS_AS(e.zero_(), ValueError);
    CHECK(values(b) == std::vector<double>{0, 0, 0});
    try {
      e.add_(1);
    } catch (const Error& err) {
      CHECK_MESSAGE(contains(err.what(),
                             "[add_] cannot write in place into a tensor of shape "
                             "(4, 3) with strides (0, 1)"),
                    err.what());
    }
  }
  // A size-1 dim with stride 0, and an expanded tensor read (not written), are fine.
  Tensor b = zeros({1, 3});
  Tensor one = expand(b, {1, 3});
  one.add_(1);
  Tensor t = zeros({4, 3});
  t.add_(expand(ones({1, 3}), {4, 3}));
  CHECK(values(b) == std::vector<double>{1, 1, 1});
  CHECK(values(sum(t)) == std::vector<double>{12});
}

}  // namespace duet::test
