// func::grad beyond one argument (trace/func.h), as torch.func and JAX: several argnums, an
// auxiliary result (has_aux), grad_and_value, zeros for a value that does not depend on the
// argument, grad mode on inside; vmap of functions that return tuples of them; vjp, jvp,
// jacrev, jacfwd and hessian.
#include <doctest/doctest.h>

#include "op_rows.h"

namespace duet::test {

namespace {

// A loss of three arguments whose gradients are known: sum((x w - y)^2) * s.
Tensor sq_loss(const Tensor& w, const Tensor& x, const Tensor& y) {
  Tensor e = matmul(x.reshape({1, 4}), w) - y;
  return (e * e).sum();
}

}  // namespace

TEST_CASE("grad: several argnums give one gradient each, in the order named") {
  manual_seed(611);
  const Tensor w = randn({4, 1}), x = randn({4}), y = randn({1});
  const std::vector<Tensor> g = func::grad(sq_loss, {0, 1, 2})(w, x, y);
  REQUIRE(g.size() == 3);
  // d/dw = 2 x^T e, d/dx = 2 e w^T, d/dy = -2 e, e = x w - y.
  const Tensor e = matmul(x.reshape({1, 4}), w) - y;
  CHECK(close(g[0], matmul(x.reshape({4, 1}), e) * 2.0, 1e-5));
  CHECK(close(g[1], (matmul(e, w.permute({1, 0})) * 2.0).reshape({4}), 1e-5));
  CHECK(close(g[2], (e * -2.0).reshape({1}), 1e-5));
  // Each equals the single-argnum gradient, and the order is the order named.
  const std::vector<Tensor> r = func::grad(sq_loss, {2, 0})(w, x, y);
  REQUIRE(r.size() == 2);
  CHECK(close(r[0], func::grad(sq_loss, 2)(w, x, y), 0));
  CHECK(close(r[1], func::grad(sq_loss, 0)(w, x, y), 0));
  CHECK(close(func::grad(sq_loss, std::vector<int>{1})(w, x, y).at(0), g[1], 0));
  // The arguments themselves are left alone (no .grad, no requires_grad).
  CHECK(!w.requires_grad());
  CHECK(!x.grad().defined());
}

TEST_CASE("grad: an auxiliary result comes back beside the gradient, as has_aux") {
  manual_seed(612);
  const Tensor w = randn({3}), x = randn({3});
  auto f = [](const Tensor& a, const Tensor& b) {
    Tensor pred = (a * b).sum();
    return std::tuple(pred * pred, pred);  // (value, aux)
  };
  auto [g, aux] = func::grad(f)(w, x);
  const Tensor pred = (w * x).sum();
  CHECK(close(aux, pred, 1e-6));
  CHECK(close(g, x * pred * 2.0, 1e-5));
  auto [gs, aux2] = func::grad(f, {0, 1})(w, x);
  REQUIRE(gs.size() == 2);
  CHECK(close(gs[1], w * pred * 2.0, 1e-5));
  CHECK(close(aux2, pred, 1e-6));
  // The auxiliary result may be any value, a tree of tensors or not.
  auto h = [](const Tensor& a) { return std::tuple((a * a).sum(), std::string("note")); };
  auto [gh, note] = func::grad(h)(w);
  CHECK(note == "note");
  CHECK(close(gh, w * 2.0, 1e-6));
}

TEST_CASE("grad_and_value: the gradient and the value at once, in torch.func's order") {
  manual_seed(613);
  const Tensor w = randn({4, 1}), x = randn({4}), y = randn({1});
  auto [g, v] = func::grad_and_value(sq_loss)(w, x, y);
  CHECK(close(g, func::grad(sq_loss)(w, x, y), 0));
  CHECK(close(v, sq_loss(w, x, y), 0));
  auto [gs, v2] = func::grad_and_value(sq_loss, {0, 2})(w, x, y);
  REQUIRE(gs.size() == 2);
  CHECK(close(gs[1], func::grad(sq_loss, 2)(w, x, y), 0));
  CHECK(close(v2, v, 0));
  // With an auxiliary result: (gradient, (value, aux)).
  auto f = [](const Tensor& a) { return std::tuple((a * a).sum(), a.max()); };
  auto [ga, va] = func::grad_and_value(f)(x);
  CHECK(close(ga, x * 2.0, 1e-6));
  CHECK(close(std::get<0>(va), (x * x).sum(), 0));
  CHECK(close(std::get<1>(va), x.max(), 0));
}

TEST_CASE("grad: a value that does not depend on the argument has zero gradients") {
  // As torch.func.grad and jax.grad: a constant, a path through detach() or a NoGradGuard
  // inside the function give zeros, not an error.
  const Tensor x = full({3}, 2.0), w = full({3}, 5.0);
  auto constant = [](const Tensor&) { return full({}, 1.0); };
  CHECK(close(func::grad(constant)(x), zeros({3}), 0));
  auto detached = [](const Tensor& a) { return (a.detach() * a.detach()).sum(); };
  CHECK(close(func::grad(detached)(x), zeros({3}), 0));
  auto inside = [](const Tensor& a) {
    NoGradGuard off;
    return (a * a).sum();
  };
  CHECK(close(func::grad(inside)(x), zeros({3}), 0));
  // One argnum used, one not: zeros for the second.
  auto one = [](const Tensor& a, const Tensor&) { return (a * a).sum(); };
  const std::vector<Tensor> g = func::grad(one, {0, 1})(x, w);
  CHECK(close(g[0], x * 2.0, 0));
  CHECK(close(g[1], zeros({3}), 0));
  // Grad mode off outside does not stop the gradient (torch.func.grad turns it on inside).
  NoGradGuard off;
  CHECK(close(func::grad(one)(x, w), x * 2.0, 0));
}

TEST_CASE("grad: argnums are checked; the result must be one floating-point element") {
  const Tensor x = randn({3});
  auto f = [](const Tensor& a, const Tensor& b) { return (a * b).sum(); };
  CHECK_THROWS_WITH_AS(func::grad(f, std::vector<int>{})(x, x),
                       doctest::Contains("argnums is empty"), ValueError);
  CHECK_THROWS_WITH_AS(func::grad(f, {1, 1})(x, x), doctest::Contains("names argument 1 twice"),
                       ValueError);
  CHECK_THROWS_WITH_AS(func::grad(f, {0, 2})(x, x),
                       doctest::Contains("argnum 2 is out of range for 2 arguments"), ValueError);
  CHECK_THROWS_WITH_AS(func::grad_and_value(f, 3)(x, x),
                       doctest::Contains("argnum 3 is out of range"), ValueError);
  auto vec = [](const Tensor& a, const Tensor& b) { return a * b; };
  CHECK_THROWS_WITH_AS(func::grad_and_value(vec)(x, x),
                       doctest::Contains("one floating-point element, got shape (3)"), ValueError);
  auto ints = [](const Tensor& a) { return a.sum().to(DType::i64); };
  CHECK_THROWS_WITH_AS(func::grad(ints)(x), doctest::Contains("one floating-point element"),
                       ValueError);
}

TEST_CASE("vmap: per-sample gradients and values, of several arguments, with tuples") {
  manual_seed(614);
  const Tensor w = randn({4, 1}), xs = randn({6, 4}), ys = randn({6, 1});
  // vmap(grad_and_value(loss)): each sample's gradient and loss.
  auto [g, v] = func::vmap(func::grad_and_value(sq_loss), {std::nullopt, 0, 0})(w, xs, ys);
  REQUIRE(g.sizes() == Shape{6, 4, 1});
  REQUIRE(v.sizes() == Shape{6});
  // vmap(grad(loss, {0, 1})): the weight's and the input's per-sample gradients.
  const std::vector<Tensor> gs =
      func::vmap(func::grad(sq_loss, {0, 1}), {std::nullopt, 0, 0})(w, xs, ys);
  REQUIRE(gs.size() == 2);
  for (int64_t b = 0; b < 6; ++b) {
    const Tensor x = xs.select(0, b), y = ys.select(0, b);
    CHECK(close(g.select(0, b), func::grad(sq_loss)(w, x, y), 1e-5));
    CHECK(close(v.select(0, b), sq_loss(w, x, y), 1e-5));
    CHECK(close(gs[0].select(0, b), func::grad(sq_loss, 0)(w, x, y), 1e-5));
    CHECK(close(gs[1].select(0, b), func::grad(sq_loss, 1)(w, x, y), 1e-5));
  }
  // A function returning a tuple of a tensor and a vector: the structure comes back.
  auto parts = [](const Tensor& a) {
    return std::tuple(a.sum(), std::vector<Tensor>{a * 2.0, a.max(), a + 1.0});
  };
  auto [total, rest] = func::vmap(parts)(xs);
  CHECK(close(total, xs.sum(1), 1e-5));
  REQUIRE(rest.size() == 3);
  CHECK(close(rest[0], xs * 2.0, 0));
  CHECK(close(rest[1], xs.amax({1}), 0));
  CHECK(close(rest[2], xs + 1.0, 0));
  // Compiled, the same per-sample gradients and values.
  auto compiled = compile([&](const Tensor& ws, const Tensor& a, const Tensor& b) {
    auto [cg, cv] = func::vmap(func::grad_and_value(sq_loss), {std::nullopt, 0, 0})(ws, a, b);
    return std::vector<Tensor>{cg, cv};
  });
  const std::vector<Tensor> c = compiled(w, xs, ys);
  CHECK(close(c.at(0), g, 1e-6));
  CHECK(close(c.at(1), v, 1e-6));
}

TEST_CASE("vjp: the result and its vector-Jacobian product, called again and under vmap") {
  manual_seed(616);
  const Tensor w = randn({3, 4}), x = randn({4});
  auto f = [](const Tensor& m, const Tensor& a) { return matmul(m, a).tanh(); };
  auto [y, vjp_fn] = func::vjp(f, w, x);
  CHECK(close(y, f(w, x), 0));
  const Tensor v = randn({3});
  const std::vector<Tensor> g = vjp_fn(v);
  REQUIRE(g.size() == 2);
  // v^T J for each argument: the Jacobians' rows weighted by v.
  const Tensor jw = func::jacrev(f, 0)(w, x), jx = func::jacrev(f, 1)(w, x);
  CHECK(close(g[0], (jw * v.reshape({3, 1, 1})).sum(0), 1e-6));
  CHECK(close(g[1], (jx * v.reshape({3, 1})).sum(0), 1e-6));
  // Called again with another cotangent; under vmap, one Jacobian row per cotangent.
  CHECK(close(vjp_fn(v * 2.0)[1], g[1] * 2.0, 1e-6));
  const std::vector<Tensor> rows = func::vmap(vjp_fn)(eye(3));
  CHECK(close(rows.at(1), jx, 1e-6));
  CHECK(close(rows.at(0), jw, 1e-6));
  // An argument the result does not depend on: zeros. A cotangent of another shape: an error.
  auto [y2, only_x] = func::vjp([](const Tensor& a, const Tensor&) { return a * 3.0; }, x, w);
  CHECK(close(only_x(ones({4}))[1], zeros({3, 4}), 0));
  CHECK(close(only_x(ones({4}))[0], full({4}, 3.0), 0));
  CHECK_THROWS_WITH_AS(vjp_fn(ones({4})),
                       doctest::Contains("the cotangent must have the result's shape (3), got (4)"),
                       ShapeError);
}

TEST_CASE("jacrev and hessian: Jacobians of result.shape + argument.shape, batched by vmap") {
  manual_seed(615);
  const Tensor w = randn({3, 4}), x = randn({4});
  auto f = [](const Tensor& m, const Tensor& a) { return matmul(m, a).tanh(); };
  // d tanh(w x) / dx = (1 - tanh^2) w; d / dw: row i is (1 - y_i^2) x in row i, zeros elsewhere.
  const Tensor y = f(w, x), dy = 1.0 - y * y;
  const Tensor jx = func::jacrev(f, 1)(w, x);
  REQUIRE(jx.sizes() == Shape{3, 4});
  CHECK(close(jx, dy.unsqueeze(1) * w, 1e-6));
  const Tensor jw = func::jacrev(f)(w, x);
  REQUIRE(jw.sizes() == Shape{3, 3, 4});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t r = 0; r < 3; ++r)
      CHECK(close(jw.select(0, i).select(0, r), r == i ? x * dy.select(0, i) : zeros({4}), 1e-6));
  // A scalar result: the Jacobian is the gradient.
  auto g = [](const Tensor& a) { return (a * a * a).sum(); };
  CHECK(close(func::jacrev(g)(x), func::grad(g)(x), 0));
  // The Hessian of sum(x^3) is diag(6 x); of a quadratic form x^T A x, A + A^T.
  const Tensor h = func::hessian(g)(x);
  REQUIRE(h.sizes() == Shape{4, 4});
  CHECK(close(h, eye(4) * (x * 6.0).unsqueeze(1), 1e-5));
  const Tensor a = randn({4, 4});
  auto quad = [&](const Tensor& v) { return (v * matmul(a, v)).sum(); };
  CHECK(close(func::hessian(quad)(x), a + a.permute({1, 0}), 1e-5));
  // Compiled, the same Hessian.
  auto compiled = compile([&](const Tensor& v) { return func::hessian(quad)(v); });
  CHECK(close(compiled(x), func::hessian(quad)(x), 1e-6));
  // A result that does not depend on the argument: zeros. An integer result: an error.
  CHECK(close(
      func::jacrev([](const Tensor& v) { return full({2}, 1.0) + 0.0 * v.sum().detach(); })(x),
      zeros({2, 4}), 0));
  CHECK_THROWS_WITH_AS(func::jacrev([](const Tensor& v) { return v.to(DType::i64); })(x),
                       doctest::Contains("must return a floating-point tensor, got i64"),
                       ValueError);
  CHECK_THROWS_WITH_AS(func::jacrev(f, 2)(w, x), doctest::Contains("argnum 2 is out of range"),
                       ValueError);
}

TEST_CASE("jvp: the result and its Jacobian-vector product, of several arguments, under vmap") {
  manual_seed(617);
  const Tensor w = randn({3, 4}, Options().dtype(DType::f64)),
               x = randn({4}, Options().dtype(DType::f64));
  const Tensor vw = randn({3, 4}, Options().dtype(DType::f64)),
               vx = randn({4}, Options().dtype(DType::f64));
  auto f = [](const Tensor& m, const Tensor& a) { return matmul(m, a).tanh() * a.sum(); };
  auto [y, jv] = func::jvp(f, {w, x}, {vw, vx});
  CHECK(close(y, f(w, x), 0));
  REQUIRE(jv.sizes() == Shape{3});
  // Against the Jacobians contracted with the tangents: J_w vw + J_x vx.
  const Tensor jw = func::jacrev(f, 0)(w, x), jx = func::jacrev(f, 1)(w, x);
  const Tensor want = (jw * vw.unsqueeze(0)).sum({1, 2}) + (jx * vx.unsqueeze(0)).sum(1);
  CHECK(close(jv, want, 1e-12));
  // Linear in the tangents: a tangent for x alone, and twice it.
  auto [y1, jx_vx] = func::jvp(f, {w, x}, {zeros_like(vw), vx});
  CHECK(close(jx_vx, matmul(jx, vx), 1e-12));
  CHECK(close(std::get<1>(func::jvp(f, {w, x}, {zeros_like(vw), vx * 2.0})), jx_vx * 2.0, 1e-12));
  // Under vmap, one product per tangent: the columns of J_x.
  auto column = [&](const Tensor& t) {
    return std::get<1>(func::jvp(f, {w, x}, {zeros_like(w), t}));
  };
  CHECK(close(func::vmap(column)(eye(4, Options().dtype(DType::f64))), jx.permute({1, 0}), 1e-12));
  // A result that does not depend on an argument: that tangent adds nothing; on none: zeros.
  auto only_a = [](const Tensor& a, const Tensor&) { return a * 3.0; };
  CHECK(close(std::get<1>(func::jvp(only_a, {x, w}, {vx, vw})), vx * 3.0, 0));
  auto constant = [](const Tensor& a) { return full({2}, 1.0) + 0.0 * a.sum().detach(); };
  CHECK(close(std::get<1>(func::jvp(constant, {x}, {vx})), zeros({2}), 0));
  // An auxiliary result, as has_aux: (y, J v, aux).
  auto f_aux = [&](const Tensor& m, const Tensor& a) { return std::tuple(f(m, a), a.max()); };
  auto [ya, jva, aux] = func::jvp(f_aux, {w, x}, {vw, vx});
  CHECK(close(ya, y, 0));
  CHECK(close(jva, jv, 1e-12));
  CHECK(close(aux, x.max(), 0));
  auto [yv, vjp_aux, auxv] = func::vjp(f_aux, w, x);
  const Tensor cot = randn({3}, Options().dtype(DType::f64));
  CHECK(close(vjp_aux(cot)[1], (jx * cot.unsqueeze(1)).sum(0), 1e-12));
  CHECK(close(auxv, x.max(), 0));
  // A tangent of another shape, an integer argument: errors naming jvp.
  CHECK_THROWS_WITH_AS(
      func::jvp(f, {w, x}, {vw, ones({3})}),
      doctest::Contains("[jvp] tangent 1 must have its argument's shape (4), got (3)"), ShapeError);
  CHECK_THROWS_WITH_AS(func::jvp([](const Tensor& a) { return a * 2.0; },
                                 {full({2}, 1, Options().dtype(DType::i64))}, {ones({2})}),
                       doctest::Contains("[jvp] argument 0 and its tangent must be floating-point"),
                       DTypeError);
}

TEST_CASE("jacfwd: the Jacobian column by column equals jacrev's; forward over reverse Hessians") {
  manual_seed(619);
  const Tensor w = randn({3, 4}, Options().dtype(DType::f64)),
               x = randn({4}, Options().dtype(DType::f64));
  auto f = [](const Tensor& m, const Tensor& a) { return matmul(m, a).tanh(); };
  const Tensor jx = func::jacfwd(f, 1)(w, x), jw = func::jacfwd(f)(w, x);
  REQUIRE(jx.sizes() == Shape{3, 4});
  REQUIRE(jw.sizes() == Shape{3, 3, 4});
  CHECK(close(jx, func::jacrev(f, 1)(w, x), 1e-12));
  CHECK(close(jw, func::jacrev(f, 0)(w, x), 1e-12));
  // A matrix result of a matrix argument: result.shape + argument.shape.
  auto g = [](const Tensor& m) { return matmul(m, m.permute({1, 0})); };
  const Tensor jm = func::jacfwd(g)(w);
  REQUIRE(jm.sizes() == Shape{3, 3, 3, 4});
  CHECK(close(jm, func::jacrev(g)(w), 1e-12));
  // Forward over reverse, as torch.func.hessian: the Hessian of sum(x^3) is diag(6 x).
  auto cube = [](const Tensor& a) { return (a * a * a).sum(); };
  const Tensor h = func::jacfwd(func::jacrev(cube))(x);
  CHECK(close(h, eye(4, Options().dtype(DType::f64)) * (x * 6.0).unsqueeze(1), 1e-12));
  CHECK(close(h, func::hessian(cube)(x), 1e-12));
  // Compiled, the same Jacobian.
  auto compiled = compile([&](const Tensor& a) { return func::jacfwd(f, 1)(w, a); });
  CHECK(close(compiled(x), jx, 1e-12));
  CHECK_THROWS_WITH_AS(func::jacfwd(f, 2)(w, x), doctest::Contains("argnum 2 is out of range"),
                       ValueError);
  // Several argnums: one Jacobian each, in the order named, both ways.
  for (const std::vector<Tensor>& js :
       {func::jacfwd(f, std::vector<int>{1, 0})(w, x), func::jacrev(f, {1, 0})(w, x)}) {
    REQUIRE(js.size() == 2);
    CHECK(close(js[0], jx, 1e-12));
    CHECK(close(js[1], jw, 1e-12));
  }
  // An auxiliary result, as has_aux: (Jacobian, aux), the Jacobian of the value alone.
  auto with_aux = [](const Tensor& m, const Tensor& a) {
    return std::tuple(matmul(m, a).tanh(), a.sum() * 2.0);
  };
  auto [jr, aux_r] = func::jacrev(with_aux, 1)(w, x);
  auto [jf, aux_f] = func::jacfwd(with_aux, 1)(w, x);
  CHECK(close(jr, jx, 1e-12));
  CHECK(close(jf, jx, 1e-12));
  CHECK(close(aux_r, x.sum() * 2.0, 0));
  CHECK(close(aux_f, x.sum() * 2.0, 0));
  auto [jrs, aux_rs] = func::jacrev(with_aux, {0, 1})(w, x);
  auto [jfs, aux_fs] = func::jacfwd(with_aux, std::vector<int>{0, 1})(w, x);
  REQUIRE(jrs.size() == 2);
  REQUIRE(jfs.size() == 2);
  CHECK(close(jrs[0], jw, 1e-12));
  CHECK(close(jfs[1], jx, 1e-12));
  CHECK(close(aux_rs, aux_fs, 0));
  // hessian passes the aux through: the Hessian of sum(x^3), and the aux.
  auto cube_aux = [](const Tensor& a) { return std::tuple((a * a * a).sum(), a.max()); };
  auto [hx, top] = func::hessian(cube_aux)(x);
  CHECK(close(hx, eye(4, Options().dtype(DType::f64)) * (x * 6.0).unsqueeze(1), 1e-12));
  CHECK(close(top, x.max(), 0));
  CHECK_THROWS_WITH_AS(func::jacrev(f, {0, 0})(w, x),
                       doctest::Contains("argnums names argument 0 twice"), ValueError);
  CHECK_THROWS_WITH_AS(func::jacrev(f, 5)(w, x), doctest::Contains("[jacrev] jacrev at "),
                       ValueError);
  CHECK_THROWS_WITH_AS(func::jacfwd([](const Tensor& a) { return a * 2.0; })(
                           full({2}, 1, Options().dtype(DType::i64))),
                       doctest::Contains("[jacfwd] argument 0 must be floating-point"), DTypeError);
}

}  // namespace duet::test
