// func::vmap and func::grad (trace/func.h, Note [vmap] in trace/func.cpp, Note [Batching rules] in
// core/ops/batching.cpp): the op families batched in one call; in_dims and out_dim; nesting,
// compile(vmap(f)) and gradients through vmap; per-sample gradients; random ops; the errors.
// test_vmap_sweep.cpp sweeps every op row against the row run per sample.
#include <doctest/doctest.h>

#include "op_rows.h"

namespace duet::test {

TEST_CASE("vmap: the op families batch in one call each, not per sample") {
  // Note [Batching rules]: elementwise ops, reductions, views and matmul have rules; an op
  // without one runs once per sample (batch_loop). A plant that drops a family's rule fails here.
  manual_seed(502);
  const Tensor x = randn({4, 3, 5}), w = randn({5, 2});
  auto f = [&](const Tensor& a) {
    Tensor h = matmul(a, w).relu().permute({1, 0}).reshape({6});
    return h.slice(0, 1, 5).sum() + a.max();
  };
  const int64_t before = detail::batch_loop_calls();
  const Tensor got = func::vmap(f)(x);
  CHECK(detail::batch_loop_calls() == before);
  std::vector<Tensor> want;
  for (int64_t b = 0; b < 4; ++b) want.push_back(f(x.select(0, b)));
  CHECK(close(got, stack(want, 0), 1e-5));
  // A shared matrix times each sample's vector (an unbatched RNN cell's products): one product
  // of the matrix and the samples' vectors as rows, and its per-sample gradients.
  const Tensor m = randn({7, 5}), vs = randn({4, 5});
  auto mv = [&](const Tensor& v) { return matmul(m, v).tanh(); };
  const Tensor mg = func::vmap(mv)(vs);
  REQUIRE(mg.sizes() == Shape{4, 7});
  for (int64_t b = 0; b < 4; ++b) CHECK(close(mg.select(0, b), mv(vs.select(0, b)), 1e-5));
  auto mloss = [](const Tensor& mm, const Tensor& v) { return matmul(mm, v).tanh().sum(); };
  const Tensor pm = func::vmap(func::grad(mloss), {std::nullopt, 0})(m, vs);
  REQUIRE(pm.sizes() == Shape{4, 7, 5});
  for (int64_t b = 0; b < 4; ++b)
    CHECK(close(pm.select(0, b), func::grad(mloss)(m, vs.select(0, b)), 1e-5));
  CHECK(detail::batch_loop_calls() == before);
  // conv2d with a shared filter: the samples' images are one batch; attention: one more
  // leading dim.
  const Tensor imgs = randn({2, 1, 3, 6, 6}), k = randn({4, 3, 3, 3});
  auto c = [&](const Tensor& a) { return conv2d(a, k); };
  const Tensor cg = func::vmap(c)(imgs);
  CHECK(close(cg, stack({c(imgs.select(0, 0)), c(imgs.select(0, 1))}, 0), 1e-4));
  const Tensor q = randn({3, 2, 5, 8});
  auto att = [](const Tensor& t) { return scaled_dot_product_attention(t, t, t, {}, 0.0, true); };
  CHECK(close(func::vmap(att)(q), att(q), 1e-5));
  CHECK(detail::batch_loop_calls() == before);
  // The fused cells, and the per-sample gradients of their gates (the backward ops batch too).
  const Tensor g4 = randn({3, 2, 8}), g3 = randn({3, 2, 6}), st = randn({3, 2, 2});
  auto lstm = [](const Tensor& x, const Tensor& c) {
    return std::get<1>(fused_lstm_cell(x, x, c));
  };
  auto gru = [](const Tensor& x, const Tensor& h) { return fused_gru_cell(x, x * 2, h); };
  CHECK(close(func::vmap(lstm)(g4, st), lstm(g4, st), 1e-6));
  CHECK(close(func::vmap(gru)(g3, st), gru(g3, st), 1e-6));
  auto gloss = [&](const Tensor& x, const Tensor& h) { return gru(x, h).pow(2).sum(); };
  const Tensor pg3 = func::vmap(func::grad(gloss))(g3, st);
  for (int64_t b = 0; b < 3; ++b)
    CHECK(close(pg3.select(0, b), func::grad(gloss)(g3.select(0, b), st.select(0, b)), 1e-5));
  CHECK(detail::batch_loop_calls() == before);
  // Per-sample gradients of a shared filter: conv2d's weight gradient has a rule too.
  auto closs = [](const Tensor& kf, const Tensor& a) {
    return conv2d(a, kf, {}, 2, 1).pow(2).sum();
  };
  const Tensor pk = func::vmap(func::grad(closs), {std::nullopt, 0})(k, imgs);
  CHECK(detail::batch_loop_calls() == before);
  REQUIRE(pk.sizes() == Shape{2, 4, 3, 3, 3});
  for (int64_t b = 0; b < 2; ++b)
    CHECK(close(pk.select(0, b), func::grad(closs)(k, imgs.select(0, b)), 1e-4));
  // Per-sample filters (an ensemble of models): one convolution in groups, over per-sample
  // images and over images every sample shares, with its per-sample gradients of filters and
  // images; and of a grouped convolution (depthwise, two filters per channel), in groups of
  // groups.
  const Tensor one = imgs.select(0, 0);
  auto per_sample_filters = [&](const Tensor& ks, int64_t stride, int64_t groups) {
    CAPTURE(groups);
    auto pc = [=](const Tensor& a, const Tensor& f) { return conv2d(a, f, {}, stride, 1, groups); };
    auto ploss = [&](const Tensor& a, const Tensor& f) { return pc(a, f).tanh().sum(); };
    const Tensor pg = func::vmap(pc)(imgs, ks), ps = func::vmap(pc, {std::nullopt, 0})(one, ks);
    const Tensor pgx = func::vmap(func::grad(ploss, 0))(imgs, ks);
    const Tensor pgw = func::vmap(func::grad(ploss, 1))(imgs, ks);
    for (int64_t b = 0; b < 2; ++b) {
      const Tensor a = imgs.select(0, b), f = ks.select(0, b);
      CHECK(close(pg.select(0, b), pc(a, f), 1e-4));
      CHECK(close(ps.select(0, b), pc(one, f), 1e-4));
      CHECK(close(pgx.select(0, b), func::grad(ploss, 0)(a, f), 1e-4));
      CHECK(close(pgw.select(0, b), func::grad(ploss, 1)(a, f), 1e-4));
    }
  };
  per_sample_filters(randn({2, 4, 3, 3, 3}), 2, 1);
  per_sample_filters(randn({2, 6, 1, 3, 3}), 1, 3);
  // No sample at all: the shapes of none, and a backward through them.
  const Tensor none = randn({0, 4, 3, 3, 3}).requires_grad_(true);
  auto conv = [](const Tensor& a, const Tensor& f) { return conv2d(a, f, {}, 2, 1); };
  const Tensor e = func::vmap(conv)(randn({0, 1, 3, 6, 6}), none);
  CHECK(e.sizes() == Shape{0, 1, 4, 3, 3});
  CHECK(func::vmap(conv, {std::nullopt, 0})(one, none).sizes() == Shape{0, 1, 4, 3, 3});
  e.sum().backward();
  CHECK(none.grad().sizes() == none.sizes());
  CHECK(detail::batch_loop_calls() == before);
}

TEST_CASE("vmap: in_dims, out_dim, shared arguments and unbatched results") {
  manual_seed(503);
  const Tensor y = randn({3, 5, 4}), v = randn({4});
  auto g = [](const Tensor& a, const Tensor& b) { return a * b + a.sum(); };
  const Tensor got = func::vmap(g, {1, std::nullopt}, 1)(y, v);
  REQUIRE(got.sizes() == Shape{3, 5, 4});
  for (int64_t b = 0; b < 5; ++b) CHECK(close(got.select(1, b), g(y.select(1, b), v), 1e-5));
  // A result that does not depend on the batch is expanded to it.
  const Tensor c = func::vmap([&](const Tensor&) { return v * 2.0; })(y);
  CHECK(c.sizes() == Shape{3, 4});
  CHECK(close(c.select(0, 2), v * 2.0, 0));
  // Several results.
  auto two = [](const Tensor& a) { return std::vector<Tensor>{a.exp(), a.sum()}; };
  const std::vector<Tensor> r = func::vmap(two)(y);
  REQUIRE(r.size() == 2);
  CHECK(r[1].sizes() == Shape{3});
  CHECK(close(r[1], y.sum({1, 2}), 1e-5));
}

TEST_CASE("vmap: 0-d samples keep their place in type promotion; a 0-d sum keeps its dtype") {
  // Note [Batching rules]: batched, a 0-d sample gets a dim, which would move it up a tier of
  // result_type (f32 samples with an f64 0-d sample are f32; an f32 batch with an f64 batch is
  // f64). Autobatch's random programs found the f64 results read as f32 samples: garbage.
  manual_seed(504);
  const Tensor x = randn({4, 3}), m = randn({4}, Options().dtype(DType::f64));
  for (auto f : {+[](const Tensor&a, const Tensor&b) { return minimum(a, b); },
                 +[](const Tensor&a, const Tensor&b) { return a + b; },
                 +[](const Tensor&a, const Tensor&b) { return lt(a, b).to(DType::f32); }}) {
    const Tensor got = func::vmap(f)(x, m);
    REQUIRE(got.dtype() == DType::f32);
    for (int64_t b = 0; b < 4; ++b) CHECK(close(got.select(0, b), f(x[b], m[b]), 0));
  }
  // where's condition does not promote; its operands do.
  auto w = [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); };
  const Tensor c = gt(randn({4}), 0.0);
  const Tensor gw = func::vmap(w)(c, x, m);
  REQUIRE(gw.dtype() == DType::f32);
  for (int64_t b = 0; b < 4; ++b) CHECK(close(gw.select(0, b), w(c[b], x[b], m[b]), 0));
  // The sum of a 0-d bool is an i64, batched too.
  const Tensor flags = gt(randn({5}), 0.0);
  const Tensor s = func::vmap([](const Tensor& t) { return sum(t); })(flags);
  CHECK(s.dtype() == DType::i64);
  CHECK(close(s, flags.to(DType::i64), 0));
}

TEST_CASE("vmap: detach and NoGradGuard inside the function stop gradients through it") {
  // Note [vmap]: the traced graph is replayed with autograd on; a detach was an alias in it, and
  // ops under NoGradGuard were plain ops, so gradients flowed through both (found by random
  // programs under vmap).
  const Tensor xs = tensor({0.7, -1.3, 2.1}, Options().dtype(DType::f64));
  auto detached = [](const Tensor& x) { return (x * 0.25) / (abs(x) + 0.5).detach(); };
  auto no_grad = [](const Tensor& x) {
    Tensor s;
    {
      NoGradGuard ng;
      s = abs(x) + 0.5;
    }
    return x * s;
  };
  for (auto f : {+detached, +no_grad}) {
    Tensor xb = xs.clone().requires_grad_(true);
    sum(sin(func::vmap(f)(xb))).backward();
    for (int64_t k = 0; k < 3; ++k) {
      Tensor x = xs[k].detach().requires_grad_(true);
      sum(sin(f(x))).backward();
      CHECK(close(xb.grad()[k], x.grad(), 1e-12));
    }
  }
}

TEST_CASE("vmap: nested, compiled and differentiated") {
  manual_seed(504);
  const Tensor z = randn({2, 3, 4});
  auto inner = [](const Tensor& a) { return (a.exp() * a).sum(); };
  CHECK(close(func::vmap(func::vmap(inner))(z), (z.exp() * z).sum(2), 1e-5));
  // compile(vmap(f)) equals vmap(f); a parameter read inside is shared.
  const Tensor w = randn({4, 2});
  auto f = [&](const Tensor& a) { return matmul(a, w).tanh(); };
  auto cf = compile([&](const Tensor& a) { return func::vmap(f)(a); });
  CHECK(close(cf(z), func::vmap(f)(z), 1e-6));
  CHECK(close(cf(z), matmul(z, w).tanh(), 1e-6));
  // Gradients flow through vmap to its arguments.
  Tensor xa = z.detach();
  xa.requires_grad_();
  func::vmap(inner)(xa).sum().backward();
  Tensor xb = z.detach();
  xb.requires_grad_();
  (xb.exp() * xb).sum().backward();
  CHECK(close(xa.grad(), xb.grad(), 1e-5));
}

TEST_CASE("grad: the gradient as a function; per-sample gradients are vmap(grad(loss))") {
  manual_seed(505);
  auto loss = [](const Tensor& w, const Tensor& x, const Tensor& y) {
    Tensor e = matmul(x.reshape({1, 4}), w) - y;
    return (e * e).sum();
  };
  const Tensor w = randn({4, 1}), x = randn({6, 4}), y = randn({6, 1});
  const Tensor per = func::vmap(func::grad(loss), {std::nullopt, 0, 0})(w, x, y);
  REQUIRE(per.sizes() == Shape{6, 4, 1});
  for (int64_t b = 0; b < 6; ++b) {
    // d/dw (x w - y)^2 = 2 x^T (x w - y)
    const Tensor xb = x.select(0, b).reshape({1, 4});
    const Tensor want = matmul(xb.permute({1, 0}), matmul(xb, w) - y.select(0, b)) * 2.0;
    CHECK(close(per.select(0, b), want, 1e-5));
  }
  // grad of grad: d2/dx2 of x^3 summed is 6x.
  auto cube = [](const Tensor& a) { return (a * a * a).sum(); };
  const Tensor a = randn({5});
  auto first = func::grad(cube);
  auto second = func::grad([&](const Tensor& t) { return first(t).sum(); });
  CHECK(close(second(a), a * 6.0, 1e-5));
  // Errors: a result that is not one element, an argnum out of range.
  CHECK_THROWS_WITH_AS(func::grad([](const Tensor& t) { return t * 2.0; })(a),
                       doctest::Contains("one floating-point element"), ValueError);
  CHECK_THROWS_WITH_AS(func::grad(cube, 2)(a), doctest::Contains("argnum 2 is out of range"),
                       ValueError);
}

TEST_CASE("vmap: random ops are an error by default; Randomness::Same draws once") {
  auto noisy = [](const Tensor& a) { return a + rand({3}); };
  const Tensor x = zeros({4, 3});
  CHECK_THROWS_WITH_AS(func::vmap(noisy)(x), doctest::Contains("Randomness::Same"), ValueError);
  manual_seed(506);
  const Tensor got = func::vmap(noisy, {}, 0, func::Randomness::Same)(x);
  manual_seed(506);
  const Tensor once = rand({3});
  for (int64_t b = 0; b < 4; ++b) CHECK(close(got.select(0, b), once, 0));
  // The generator moved on, as after one draw.
  CHECK(!close(rand({3}), once, 0));
}

TEST_CASE("vmap: Randomness::Different draws for each sample") {
  auto noisy = [](const Tensor& a) { return a + rand({3}); };
  const Tensor x = zeros({4, 3});
  manual_seed(507);
  const Tensor got = func::vmap(noisy, {}, 0, func::Randomness::Different)(x);
  const Tensor after = rand({2});
  manual_seed(507);
  const Tensor all = rand({4, 3});  // one draw of the batch's shape
  CHECK(close(got, all, 0));
  CHECK(!close(got.select(0, 0), got.select(0, 1), 0));
  CHECK(!close(rand({2}), after, 1e-3));  // vmap moved the generator on further
  // Dropout in a vmapped function: a mask per sample.
  auto drop = [](const Tensor& a) { return dropout(a, 0.5, true); };
  const Tensor d = func::vmap(drop, {}, 0, func::Randomness::Different)(ones({8, 16}));
  CHECK(!close(d.select(0, 0), d.select(0, 1), 0));
}

TEST_CASE("vmap: random ops under compile draw what eager vmap draws") {
  // The traced draw advances the generator's state in place, a write from vmap's sub-trace into a
  // tensor from outside it (Tracer::allow_outside_writes).
  auto noisy = [](const Tensor& a) { return a + rand({3}); };
  const Tensor x = zeros({4, 3});
  for (func::Randomness mode : {func::Randomness::Same, func::Randomness::Different}) {
    CAPTURE(static_cast<int>(mode));
    auto v = func::vmap(noisy, {}, 0, mode);
    auto f = compile([v](const Tensor& a) { return v(a); });
    manual_seed(508);
    const Tensor e1 = v(x), e2 = v(x), e_next = rand({5});
    manual_seed(508);
    const Tensor c1 = f(x), c2 = f(x), c_next = rand({5});
    CHECK(f.stats().traces == 1);
    CHECK(bitwise_equal(c1, e1));
    CHECK(bitwise_equal(c2, e2));
    CHECK(!bitwise_equal(c1, c2));         // each call draws anew
    CHECK(bitwise_equal(c_next, e_next));  // and moves the generator on as eager vmap does
  }
  // The functions of cond, scan and while_loop still may not write outside tensors.
  auto f = compile([](const Tensor& a) {
    return cond(
        sum(a) > 0,
        [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[0] + rand({3})}; },
        [](const std::vector<Tensor>& t) { return t; }, {a})[0];
  });
  CHECK_THROWS_WITH_AS(f(ones({3})), doctest::Contains("from outside the function"), Error);
}

TEST_CASE("vmap: cond, scan and while_loop batch (Note [vmap of control flow])") {
  manual_seed(508);
  const Tensor x = randn({5, 4, 3});  // 5 samples of 4 steps of 3
  // scan: a running sum and a per-step result, against the loop over samples.
  auto cumulative = [](const Tensor& s) {
    auto body = [](const std::vector<Tensor>& in) {
      Tensor c = in[0] + in[1];
      return std::vector<Tensor>{c, c.tanh()};
    };
    std::vector<Tensor> r = scan(body, {zeros({3})}, {s});
    return r[0] + r[1].sum(0);
  };
  // cond on a per-sample predicate: each sample takes its branch.
  auto branch = [](const Tensor& s) {
    return cond(
        s.sum() > 0, [](const std::vector<Tensor>& o) { return std::vector<Tensor>{o[0] * 2}; },
        [](const std::vector<Tensor>& o) { return std::vector<Tensor>{-o[0]}; }, {s})[0];
  };
  // while_loop with a per-sample trip count: halve until below 1.
  auto halve = [](const Tensor& s) {
    return while_loop(
        [](const std::vector<Tensor>& st) { return std::vector<Tensor>{st[0].abs().sum() > 1}; },
        [](const std::vector<Tensor>& st) { return std::vector<Tensor>{st[0] * 0.5}; }, {s})[0];
  };
  const std::vector<std::function<Tensor(const Tensor&)>> fns{cumulative, branch, halve};
  const int64_t before = detail::batch_loop_calls();
  for (const auto& f : fns) {
    const Tensor got = func::vmap(f)(x);
    std::vector<Tensor> want;
    for (int64_t b = 0; b < 5; ++b) want.push_back(f(x.select(0, b)));
    CHECK(close(got, stack(want, 0), 1e-5));
  }
  CHECK(detail::batch_loop_calls() == before);
  // The batch along another dim, compiled, and with gradients through the scan.
  const Tensor xt = x.permute({1, 0, 2}).contiguous();  // (4, 5, 3): samples along dim 1
  auto compiled = compile([&](const Tensor& a) { return func::vmap(cumulative, {1})(a); });
  CHECK(close(compiled(xt), func::vmap(cumulative)(x), 1e-5));
  // A per-sample while_loop under compile: one while_loop construct of the batch, not a host
  // read of "does any sample go on" (which a trace cannot make; found by random programs).
  auto compiled_halve = compile([&](const Tensor& a) { return func::vmap(halve)(a); });
  CHECK(close(compiled_halve(x), func::vmap(halve)(x), 1e-6));
  CHECK(close(compiled_halve(x * 3.0), func::vmap(halve)(x * 3.0), 1e-6));  // other trip counts
  Tensor xg = x.clone().requires_grad_();
  func::vmap(cumulative)(xg).sum().backward();
  Tensor xl = x.clone().requires_grad_();
  for (int64_t b = 0; b < 5; ++b) cumulative(xl.select(0, b)).sum().backward();
  CHECK(close(xg.grad(), xl.grad(), 1e-5));
}

TEST_CASE("vmap: its errors name the arguments") {
  auto g = [](const Tensor& a, const Tensor& b) { return a + b; };
  CHECK_THROWS_WITH_AS(func::vmap(g)(zeros({2, 3}), zeros({3, 3})),
                       doctest::Contains("argument 1 (shape (3, 3)) has 3 samples along dim 0"),
                       ValueError);
  CHECK_THROWS_WITH_AS(func::vmap(g, {std::nullopt, std::nullopt})(zeros({2}), zeros({2})),
                       doctest::Contains("no argument is batched"), ValueError);
  CHECK_THROWS_WITH_AS(func::vmap(g, {0})(zeros({2}), zeros({2})),
                       doctest::Contains("in_dims has 1 entries for 2 arguments"), ValueError);
  CHECK_THROWS_WITH_AS(func::vmap(g)(zeros({}), zeros({2})), doctest::Contains("is 0-d"),
                       ValueError);
}

}  // namespace duet::test
