// Gradient clipping (nn/utils.h): clip_grad_norm_ and clip_grad_value_ against hand
// computations, every norm order, skipped and missing gradients, non-finite norms, and the same
// in compiled steps (one trace, clipping on some calls and not others).
#include <cmath>
#include <limits>

#include "nn/optim/optim.h"
#include "nn/utils.h"
#include "util.h"

namespace duet::test {
namespace {

using nn::utils::clip_grad_norm_;
using nn::utils::clip_grad_value_;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Two f64 parameters with gradients g1 (2) and g2 (2, 1).
struct Pair {
  Tensor a, b;
  Pair(std::vector<double> g1, std::vector<double> g2, DType dtype = DType::f64) {
    a = zeros({2}, Options().dtype(dtype)).requires_grad_();
    b = zeros({2, 1}, Options().dtype(dtype)).requires_grad_();
    a.set_grad(make(g1, {2}, dtype));
    b.set_grad(make(g2, {2, 1}, dtype));
  }
};

TEST_CASE("clip_grad_norm_: total norms of every order and the clipped gradients, by hand") {
  // g1 = (3, -4), g2 = (12, 0.5).
  struct Row {
    double p;
    double total;  // by hand
  };
  const std::vector<Row> rows = {
      {2.0, std::sqrt(9 + 16 + 144 + 0.25)},
      {1.0, 19.5},
      {3.0, std::cbrt(27 + 64 + 1728 + 0.125)},
      {kInf, 12.0},
      {-kInf, 0.5},  // the smallest |element|
      {0.5, std::pow(std::sqrt(3.0) + 2 + std::sqrt(12.0) + std::sqrt(0.5), 2.0)},
      // Order 0 counts the nonzeros of each gradient (2 and 2), then the nonzero counts: 2
      // (PyTorch's vector_norm of the stacked per-gradient norms).
      {0.0, 2.0},
  };
  for (const Row& r : rows) {
    CAPTURE(r.p);
    for (double max_norm : {r.total / 4, r.total * 2}) {
      CAPTURE(max_norm);
      Pair g({3, -4}, {12, 0.5});
      Tensor total = clip_grad_norm_({g.a, g.b}, max_norm, r.p);
      check_tensor(total, {}, DType::f64, {r.total}, 1e-14, 1e-14);
      const double coef = std::min(max_norm / (r.total + 1e-6), 1.0);
      check_tensor(g.a.grad(), {2}, DType::f64, {3 * coef, -4 * coef}, 1e-14, 1e-14);
      check_tensor(g.b.grad(), {2, 1}, DType::f64, {12 * coef, 0.5 * coef}, 1e-14, 1e-14);
    }
  }
  // A norm exactly at max_norm is still scaled by max_norm / (max_norm + 1e-6), as in PyTorch.
  Pair g({3, -4}, {12, 0});
  clip_grad_norm_({g.a, g.b}, 13.0);
  check_tensor(g.a.grad(), {2}, DType::f64, {3 * 13 / (13 + 1e-6), -4 * 13 / (13 + 1e-6)}, 1e-15,
               1e-15);
}

TEST_CASE("clip_grad_norm_: f32, one parameter, skipped and missing gradients") {
  Pair g({0.6, 0.8}, {0, 0}, DType::f32);
  Tensor total = clip_grad_norm_(g.a, 0.5);
  check_tensor(total, {}, DType::f32, {1.0}, 1e-6, 1e-6);
  check_tensor(g.a.grad(), {2}, DType::f32, {0.3, 0.4}, 1e-6, 1e-6);
  // A parameter without .grad is skipped; the others are clipped together.
  Tensor none = zeros({3}).requires_grad_();
  Pair h({3, 4}, {0, 0}, DType::f32);
  total = clip_grad_norm_({none, h.a}, 1.0);
  check_tensor(total, {}, DType::f32, {5.0}, 1e-6, 1e-6);
  check_tensor(h.a.grad(), {2}, DType::f32, {0.6, 0.8}, 1e-6, 1e-6);
  CHECK_FALSE(none.grad().defined());
  // No gradient at all: a 0-d f32 zero, as PyTorch's torch.tensor(0.0).
  total = clip_grad_norm_({none}, 1.0);
  check_tensor(total, {}, DType::f32, {0.0});
  CHECK_FALSE(none.grad().defined());
  // The gradient buffers are scaled in place, not replaced.
  Pair k({30, 40}, {0, 0});
  void* data = k.a.grad().raw_data();
  clip_grad_norm_({k.a, k.b}, 1.0);
  CHECK(k.a.grad().raw_data() == data);
}

TEST_CASE("clip_grad_norm_: a non-finite total scales anyway, or is an error on request") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // An infinite element: the total is inf, the coefficient max_norm / inf = 0, so finite
  // elements become 0 and the infinite one NaN (inf * 0), as in PyTorch.
  Pair g({kInf, 2}, {1, 0});
  Tensor total = clip_grad_norm_({g.a, g.b}, 1.0);
  check_tensor(total, {}, DType::f64, {kInf});
  const std::vector<double> ga = values(g.a.grad());
  CHECK(std::isnan(ga[0]));
  CHECK(ga[1] == 0);
  // error_if_nonfinite: a ValueError naming the order and the value, and nothing scaled.
  for (double bad : {kInf, nan}) {
    for (double p : {2.0, kInf}) {
      CAPTURE(bad);
      CAPTURE(p);
      Pair h({bad, 2}, {1, 0});
      const std::string msg = error_of<ValueError>([&] {
        clip_grad_norm_({h.a, h.b}, 1.0, p, true);
      });
      CHECK(contains(msg, "[clip_grad_norm_] the total norm of order"));
      CHECK(contains(msg, std::isnan(bad) ? "nan" : "inf"));
      const std::vector<double> ha = values(h.a.grad());
      CHECK(ha[1] == 2);
      check_tensor(h.b.grad(), {2, 1}, DType::f64, {1, 0});
    }
  }
  // A finite total with error_if_nonfinite clips as usual.
  Pair k({3, 4}, {0, 0});
  check_tensor(clip_grad_norm_({k.a, k.b}, 1.0, 2.0, true), {}, DType::f64, {5.0}, 1e-15, 1e-15);
  check_tensor(k.a.grad(), {2}, DType::f64, {3 / (5 + 1e-6), 4 / (5 + 1e-6)}, 1e-15, 1e-15);
  // Errors for bad arguments.
  std::string msg = error_of<ValueError>([&] { clip_grad_norm_({k.a, Tensor()}, 1.0); });
  CHECK(contains(msg, "[clip_grad_norm_] parameter 1 is an undefined tensor"));
  msg = error_of<ValueError>([&] { clip_grad_norm_({k.a}, 1.0, nan); });
  CHECK(contains(msg, "[clip_grad_norm_] norm_type is NaN"));
  msg = error_of<ValueError>([&] { clip_grad_value_({Tensor()}, 1.0); });
  CHECK(contains(msg, "[clip_grad_value_] parameter 0 is an undefined tensor"));
}

TEST_CASE("clip_grad_value_: clamps every gradient into [-v, v] in place") {
  Pair g({3, -0.5}, {-7, 0.25});
  Tensor none = zeros({2}).requires_grad_();
  void* data = g.a.grad().raw_data();
  clip_grad_value_({g.a, none, g.b}, 1.0);
  check_tensor(g.a.grad(), {2}, DType::f64, {1, -0.5});
  check_tensor(g.b.grad(), {2, 1}, DType::f64, {-1, 0.25});
  CHECK(g.a.grad().raw_data() == data);
  CHECK_FALSE(none.grad().defined());
  // NaN stays NaN, infinities are clamped.
  Pair h({std::numeric_limits<double>::quiet_NaN(), -kInf}, {kInf, 0});
  clip_grad_value_(h.a, 2.0);
  clip_grad_value_(h.b, 2.0);
  const std::vector<double> ha = values(h.a.grad());
  CHECK(std::isnan(ha[0]));
  CHECK(ha[1] == -2);
  check_tensor(h.b.grad(), {2, 1}, DType::f64, {2, 0});
}

// ---- compiled ----

TEST_CASE("clip_grad_norm_ and clip_grad_value_ compiled: the hand values, one trace") {
  // loss = sum(a * c1) + sum(b * c2), so the gradients are c1 and c2: the hand computation of
  // the first test case, run by a compiled function on new values at each call.
  for (double p : {2.0, kInf, 1.0}) {
    CAPTURE(p);
    Tensor a = zeros({2}, Options().dtype(DType::f64)).requires_grad_();
    Tensor b = zeros({2, 1}, Options().dtype(DType::f64)).requires_grad_();
    // The .grad buffers are made once and zeroed in place between calls (a new .grad tensor
    // would be a new captured tensor, and a retrace).
    a.set_grad(zeros({2}, Options().dtype(DType::f64)));
    b.set_grad(zeros({2, 1}, Options().dtype(DType::f64)));
    auto f = compile([&](Tensor c1, Tensor c2) {
      Tensor loss = sum(a * c1) + sum(b * c2);
      loss.backward();
      return clip_grad_norm_({a, b}, 6.0, p);
    });
    // (3, -4), (12, 0) clips (total 13, 12 or 19 > 6); the quarter of it does not (< 6 for
    // every order here), and a third call clips again.
    for (double scale : {1.0, 0.25, 2.0}) {
      CAPTURE(scale);
      a.grad().zero_();
      b.grad().zero_();
      Tensor total = f(make({3 * scale, -4 * scale}, {2}, DType::f64),
                       make({12 * scale, 0}, {2, 1}, DType::f64));
      const double want = scale * (p == 2.0 ? 13.0 : p == 1.0 ? 19.0 : 12.0);
      check_tensor(total, {}, DType::f64, {want}, 1e-14, 1e-14);
      const double coef = std::min(6.0 / (want + 1e-6), 1.0);
      check_tensor(a.grad(), {2}, DType::f64, {3 * scale * coef, -4 * scale * coef}, 1e-14, 1e-14);
      check_tensor(b.grad(), {2, 1}, DType::f64, {12 * scale * coef, 0}, 1e-14, 1e-14);
    }
    CHECK(f.stats().traces == 1);
  }
  Tensor a = zeros({3}, Options().dtype(DType::f64)).requires_grad_();
  auto g = compile([&](Tensor c) {
    sum(a * c).backward();
    clip_grad_value_({a}, 0.5);
    return a.grad() * 1;
  });
  a.set_grad(zeros({3}, Options().dtype(DType::f64)));
  check_tensor(g(make({0.25, -3, 1}, {3}, DType::f64)), {3}, DType::f64, {0.25, -0.5, 0.5});
  a.grad().zero_();
  check_tensor(g(make({-0.75, 0.5, 0}, {3}, DType::f64)), {3}, DType::f64, {-0.5, 0.5, 0});
  check_tensor(a.grad(), {3}, DType::f64, {-0.5, 0.5, 0});
  CHECK(g.stats().traces == 1);
}

/// A tiny MLP of raw tensors: 5 -> 10 -> relu -> 2.
struct Mlp {
  std::vector<Tensor> params;
  explicit Mlp(uint64_t seed) {
    manual_seed(seed);
    Options o = Options().dtype(DType::f64);
    params = {randn({10, 5}, o) * 0.5, randn({10}, o) * 0.1, randn({2, 10}, o) * 0.5,
              randn({2}, o) * 0.1};
    for (Tensor& p : params) p = p.detach().requires_grad_();
  }
};

TEST_CASE("clip_grad_norm_ in a compiled training step equals eager, clipping or not") {
  for (double p : {2.0, kInf}) {
    CAPTURE(p);
    Mlp eager(31), compiled(31);
    optim::SGD eager_opt(eager.params, {.lr = 0.1, .momentum = 0.5});
    optim::SGD compiled_opt(compiled.params, {.lr = 0.1, .momentum = 0.5});
    const double max_norm = 0.5;
    auto train = [&](Mlp& m, optim::SGD& opt, const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      Tensor out = linear(relu(linear(x, m.params[0], m.params[1])), m.params[2], m.params[3]);
      mse_loss(out, y).backward();
      Tensor total = clip_grad_norm_(m.params, max_norm, p);
      opt.step();
      return total;
    };
    auto step = compile([&](Tensor x, Tensor y) { return train(compiled, compiled_opt, x, y); });
    manual_seed(32);
    Tensor x = randn({6, 5}, Options().dtype(DType::f64));
    Tensor y = randn({6, 2}, Options().dtype(DType::f64));
    int clipped = 0, unclipped = 0;
    for (int i = 0; i < 12; ++i) {
      CAPTURE(i);
      // Targets far off on even calls (large gradients, clipped), near the model's output on
      // odd ones (small gradients, not clipped).
      Tensor near = linear(relu(linear(x, eager.params[0], eager.params[1])), eager.params[2],
                           eager.params[3])
                        .detach() +
                    y * 0.01;
      Tensor target = i % 2 == 0 ? y * 20 : near;
      Tensor te = train(eager, eager_opt, x, target);
      Tensor tc = step(x, target);
      CHECK(close(te, tc, 1e-12));
      (te.item<double>() > max_norm ? clipped : unclipped)++;
      for (size_t k = 0; k < eager.params.size(); ++k) {
        CHECK(close(eager.params[k], compiled.params[k], 1e-12));
        CHECK(close(eager.params[k].grad(), compiled.params[k].grad(), 1e-12));
      }
    }
    // Both regimes ran through the one trace.
    CHECK(clipped > 0);
    CHECK(unclipped > 0);
    CHECK(step.stats().traces == 1);
    // After clipping, the gradients' norm is at most max_norm.
    Tensor g = clip_grad_norm_(compiled.params, 1e9, p);
    CHECK(g.item<double>() <= max_norm);
  }
}

TEST_CASE("clip_grad_norm_ with error_if_nonfinite inside a compiled function reads the norm") {
  // The check must read the norm into C++: the strict data-read error by default, and a value
  // guard with guard_data_reads, where a finite norm runs and a non-finite one raises.
  Tensor a = zeros({2}, Options().dtype(DType::f64)).requires_grad_();
  auto body = [&](Tensor c) {
    sum(a * c).backward();
    return clip_grad_norm_({a}, 1.0, 2.0, true);
  };
  auto strict = compile(body);
  a.set_grad(zeros({2}, Options().dtype(DType::f64)));
  const std::string msg = error_of<Error>([&] { strict(make({3, 4}, {2}, DType::f64)); });
  CHECK(contains(msg, "item"));
  CompileOptions o;
  o.guard_data_reads = true;
  auto guarded = compile(body, o);
  a.set_grad(zeros({2}, Options().dtype(DType::f64)));
  check_tensor(guarded(make({3, 4}, {2}, DType::f64)), {}, DType::f64, {5}, 1e-15, 1e-15);
  check_tensor(a.grad(), {2}, DType::f64, {3 / (5 + 1e-6), 4 / (5 + 1e-6)}, 1e-15, 1e-15);
  a.set_grad(zeros({2}, Options().dtype(DType::f64)));
  error_of<ValueError>([&] { guarded(make({kInf, 4}, {2}, DType::f64)); });
}

}  // namespace
}  // namespace duet::test
