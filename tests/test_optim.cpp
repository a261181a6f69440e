// Optimizers (nn/optim): updates against a plain-double reference, eager against compiled
// training steps, zero_grad's buffers, set_lr under compile, skipped parameters, and errors.
#include <cmath>
#include <functional>
#include <memory>

#include "nn/optim/optim.h"
#include "nn_rows.h"
#include "util.h"

namespace duet::test {
namespace {

using optim::Adam;
using optim::AdamW;
using optim::Optimizer;
using optim::RMSprop;
using optim::SGD;

// ---- the cases: one row per optimizer and option combination ----

using Kind = OptimKind;
using Case = OptimCase;
const std::vector<OptimCase>& kCases = optimizer_cases();

// ---- the reference: the textbook update rules on plain doubles ----

struct Reference {
  Case c;
  std::vector<std::vector<double>> p, buf, m, v;  // RMSprop: v = square_avg, m = grad_avg
  int t = 0;

  Reference(const Case& c, std::vector<std::vector<double>> params) : c(c), p(std::move(params)) {
    for (const auto& x : p) {
      buf.emplace_back(x.size(), 0.0);
      m.emplace_back(x.size(), 0.0);
      v.emplace_back(x.size(), 0.0);
    }
  }

  void step(const std::vector<std::vector<double>>& grads) {
    ++t;
    for (size_t k = 0; k < p.size(); ++k) {
      for (size_t i = 0; i < p[k].size(); ++i) {
        double& w = p[k][i];
        double g = grads[k][i];
        if (c.kind == Kind::SGD) {
          double d = g + c.weight_decay * w;
          if (c.momentum != 0) {
            buf[k][i] = c.momentum * buf[k][i] + d;
            d = c.nesterov ? d + c.momentum * buf[k][i] : buf[k][i];
          }
          w -= c.lr * d;
          continue;
        }
        if (c.kind == Kind::RMSprop) {
          g += c.weight_decay * w;
          v[k][i] = c.alpha * v[k][i] + (1 - c.alpha) * g * g;
          double denom = std::sqrt(v[k][i]) + c.eps;
          if (c.centered) {
            m[k][i] = c.alpha * m[k][i] + (1 - c.alpha) * g;
            denom = std::sqrt(v[k][i] - m[k][i] * m[k][i]) + c.eps;
          }
          if (c.momentum != 0) {
            buf[k][i] = c.momentum * buf[k][i] + g / denom;
            w -= c.lr * buf[k][i];
          } else {
            w -= c.lr * g / denom;
          }
          continue;
        }
        if (c.kind == Kind::AdamW)
          w *= 1 - c.lr * c.weight_decay;
        else
          g += c.weight_decay * w;
        m[k][i] = c.beta1 * m[k][i] + (1 - c.beta1) * g;
        v[k][i] = c.beta2 * v[k][i] + (1 - c.beta2) * g * g;
        const double m_hat = m[k][i] / (1 - std::pow(c.beta1, t));
        const double v_hat = v[k][i] / (1 - std::pow(c.beta2, t));
        w -= c.lr * m_hat / (std::sqrt(v_hat) + c.eps);
      }
    }
  }
};

/// Fixed gradients for step `s` of a parameter of n elements (k-th parameter), with both signs
/// and a range of sizes.
std::vector<double> fixed_grad(int s, size_t k, size_t n) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(1.3 * i + 0.7 * s + 2.1 * k) * (1 + 0.5 * i);
  return g;
}

TEST_CASE("optim: 3 steps with fixed gradients match the reference, f64 and f32") {
  const std::vector<std::vector<double>> init = {{0.5, -1.0, 2.0, 0.0, 1.5, -0.25}, {3, -2, 0.1}};
  const std::vector<Shape> shapes = {{2, 3}, {3}};
  for (const Case& c : kCases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      const std::string dtype_str(dtype_name(dtype));
      CAPTURE(c.name);
      CAPTURE(dtype_str);
      std::vector<Tensor> params;
      for (size_t k = 0; k < init.size(); ++k)
        params.push_back(make(init[k], shapes[k], dtype).requires_grad_());
      auto opt = make_optimizer(c, params);
      // The reference starts from the values as stored (0.1 is not exact in f32).
      std::vector<std::vector<double>> start = init;
      for (auto& v : start)
        for (double& x : v) x = round_to(x, dtype);
      Reference ref(c, start);
      for (int s = 0; s < 3; ++s) {
        std::vector<std::vector<double>> grads;
        for (size_t k = 0; k < init.size(); ++k) {
          grads.push_back(fixed_grad(s, k, init[k].size()));
          params[k].set_grad(make(grads.back(), shapes[k], dtype));
        }
        // The reference sees the gradients as the optimizer does: rounded to the dtype.
        for (auto& g : grads)
          for (double& x : g) x = round_to(x, dtype);
        ref.step(grads);
        opt->step();
        for (size_t k = 0; k < init.size(); ++k) {
          CAPTURE(s);
          CAPTURE(k);
          const double tol = dtype == DType::f64 ? 1e-13 : 1e-6;
          check_tensor(params[k], shapes[k], dtype, ref.p[k], tol, tol);
        }
      }
    }
  }
}

TEST_CASE("optim: updates written out by hand") {
  // SGD with momentum 0.9, lr 0.1, constant gradient 0.5 from p = 1:
  // buf 0.5, 0.95, 1.355; p 0.95, 0.855, 0.7195.
  Tensor p = make({1.0}, {1}, DType::f64).requires_grad_();
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  const double want[] = {0.95, 0.855, 0.7195};
  for (double w : want) {
    p.set_grad(make({0.5}, {1}, DType::f64));
    sgd.step();
    check_tensor(p, {1}, DType::f64, {w}, 1e-15, 1e-15);
  }
  check_tensor(sgd.momentum_buffer(0), {1}, DType::f64, {1.355}, 1e-15, 1e-15);

  // Adam's first step moves each element by lr * g / (|g| + eps): about lr against the sign.
  Tensor q = make({1.0, -2.0}, {2}, DType::f64).requires_grad_();
  Adam adam({q}, {.lr = 0.1});
  q.set_grad(make({4.0, -0.001}, {2}, DType::f64));
  adam.step();
  check_tensor(q, {2}, DType::f64,
               {1.0 - 0.1 * 4.0 / (4.0 + 1e-8), -2.0 + 0.1 * 1e-3 / (1e-3 + 1e-8)}, 1e-15, 1e-15);
  check_tensor(adam.state(0).step, {}, DType::f64, {1});

  // AdamW's default weight decay is PyTorch's 1e-2: with a zero gradient only the decay acts.
  CHECK(optim::AdamWOptions{}.weight_decay == 1e-2);
  CHECK(optim::AdamOptions{}.weight_decay == 0);
  Tensor r = make({2.0}, {1}, DType::f64).requires_grad_();
  AdamW adamw({r}, {.lr = 0.5});
  r.set_grad(make({0.0}, {1}, DType::f64));
  adamw.step();
  check_tensor(r, {1}, DType::f64, {2.0 * (1 - 0.5 * 1e-2)}, 1e-15, 1e-15);

  // RMSprop with PyTorch's defaults (lr 0.01, alpha 0.99, eps 1e-8): the first step divides by
  // sqrt(0.01 g^2) + eps, so it moves each element by about 10 lr against the sign of g.
  const optim::RMSpropOptions d{};
  CHECK(d.lr == 0.01);
  CHECK(d.alpha == 0.99);
  CHECK(d.eps == 1e-8);
  CHECK(d.weight_decay == 0);
  CHECK(d.momentum == 0);
  CHECK_FALSE(d.centered);
  Tensor w = make({1.0, -1.0}, {2}, DType::f64).requires_grad_();
  RMSprop rms({w});
  w.set_grad(make({2.0, -0.5}, {2}, DType::f64));
  rms.step();
  const double v0 = (1 - 0.99) * 4.0, v1 = (1 - 0.99) * 0.25;
  check_tensor(
      w, {2}, DType::f64,
      {1.0 - 0.01 * 2.0 / (std::sqrt(v0) + 1e-8), -1.0 + 0.01 * 0.5 / (std::sqrt(v1) + 1e-8)},
      1e-15, 1e-15);
  check_tensor(rms.state(0).square_avg, {2}, DType::f64, {v0, v1}, 1e-15, 1e-15);
  CHECK_FALSE(rms.state(0).grad_avg.defined());
  CHECK_FALSE(rms.state(0).momentum_buffer.defined());
  // Centered, second step with the same gradient 1: v = 0.19, a = 0.19 (alpha 0.9), so the
  // denominator is sqrt(0.19 - 0.0361) + eps.
  Tensor c = make({0.0}, {1}, DType::f64).requires_grad_();
  RMSprop centered({c}, {.lr = 0.1, .alpha = 0.9, .eps = 0, .centered = true});
  c.set_grad(make({1.0}, {1}, DType::f64));
  centered.step();
  const double first = -0.1 / std::sqrt(0.1 - 0.01);
  check_tensor(c, {1}, DType::f64, {first}, 1e-15, 1e-15);
  centered.step();
  check_tensor(c, {1}, DType::f64, {first - 0.1 / std::sqrt(0.19 - 0.19 * 0.19)}, 1e-14, 1e-14);
  check_tensor(centered.state(0).grad_avg, {1}, DType::f64, {0.19}, 1e-15, 1e-15);
  check_tensor(centered.state(0).step, {}, DType::f64, {2});
}

// ---- eager against compiled training steps ----

/// A tiny MLP of raw tensors: 8 -> 16 -> relu -> 4.
struct Mlp {
  std::vector<Tensor> params;
  Mlp(uint64_t seed, DType dtype) {
    manual_seed(seed);
    Options o = Options().dtype(dtype);
    params = {randn({16, 8}, o) * 0.3, randn({16}, o) * 0.1, randn({4, 16}, o) * 0.3,
              randn({4}, o) * 0.1};
    for (Tensor& p : params) p = p.detach().requires_grad_();
  }
  Tensor forward(const Tensor& x) const {
    return linear(relu(linear(x, params[0], params[1])), params[2], params[3]);
  }
};

/// The usual training step (zero_grad, forward, loss, backward, step), compiled or not.
Tensor train_step(Mlp& m, Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = cross_entropy(m.forward(x), y);
  loss.backward();
  opt.step();
  return loss;
}

/// The optimizer state a case keeps, for comparison (momentum buffers, moments, step counts).
std::vector<Tensor> state_of(const Case& c, const Optimizer& opt) {
  std::vector<Tensor> s;
  for (size_t i = 0; i < opt.params().size(); ++i) {
    if (c.kind == Kind::SGD) {
      const Tensor& b = static_cast<const SGD&>(opt).momentum_buffer(i);
      if (b.defined()) s.push_back(b);
    } else if (c.kind == Kind::RMSprop) {
      const optim::detail::RMSpropState& r = static_cast<const RMSprop&>(opt).state(i);
      for (const Tensor& t : {r.square_avg, r.grad_avg, r.momentum_buffer, r.step})
        if (t.defined()) s.push_back(t);
    } else {
      const optim::detail::AdamState& a = c.kind == Kind::Adam
                                              ? static_cast<const Adam&>(opt).state(i)
                                              : static_cast<const AdamW&>(opt).state(i);
      s.insert(s.end(), {a.exp_avg, a.exp_avg_sq, a.step});
    }
  }
  return s;
}

TEST_CASE("optim: 20 compiled training steps equal 20 eager steps, one trace, in place") {
  for (const Case& c : kCases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      const std::string dtype_str(dtype_name(dtype));
      CAPTURE(c.name);
      CAPTURE(dtype_str);
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-6;
      Mlp eager(7, dtype), compiled(7, dtype);
      auto eager_opt = make_optimizer(c, eager.params);
      auto compiled_opt = make_optimizer(c, compiled.params);
      manual_seed(8);
      Tensor x = randn({10, 8}, Options().dtype(dtype));
      Tensor y = randint(4, {10});
      auto step = compile([&](Tensor in, Tensor target) {
        return train_step(compiled, *compiled_opt, in, target);
      });
      std::vector<void*> storage;
      for (const Tensor& p : compiled.params) storage.push_back(p.raw_data());
      std::vector<void*> grad_storage;
      for (int i = 0; i < 20; ++i) {
        Tensor le = train_step(eager, *eager_opt, x, y);
        Tensor lc = step(x, y);
        CHECK_MESSAGE(close(le, lc, tol), "step ", i, ": ", le.item<double>(), " vs ",
                      lc.item<double>());
        if (i == 0)
          for (const Tensor& p : compiled.params) grad_storage.push_back(p.grad().raw_data());
      }
      for (size_t i = 0; i < eager.params.size(); ++i) {
        CHECK(close(eager.params[i], compiled.params[i], tol));
        CHECK(close(eager.params[i].grad(), compiled.params[i].grad(), tol));
        CHECK(compiled.params[i].raw_data() == storage[i]);  // updated in place
        CHECK(compiled.params[i].grad().raw_data() == grad_storage[i]);
      }
      std::vector<Tensor> se = state_of(c, *eager_opt), sc = state_of(c, *compiled_opt);
      REQUIRE(se.size() == sc.size());
      for (size_t i = 0; i < se.size(); ++i) CHECK(close(se[i], sc[i], tol));
      // The parameters really moved: the training did something.
      CHECK_FALSE(close(compiled.params[0], Mlp(7, dtype).params[0], 1e-4));
      CHECK(step.stats().traces == 1);
      CHECK(step.stats().hits == 19);
    }
  }
}

TEST_CASE("optim: the step count is a tensor, so a compiled Adam step keeps counting") {
  Mlp m(3, DType::f64);
  Adam opt(m.params, {.lr = 0.01});
  manual_seed(4);
  Tensor x = randn({6, 8}, Options().dtype(DType::f64));
  Tensor y = randint(4, {6});
  auto step = compile([&](Tensor in, Tensor target) { return train_step(m, opt, in, target); });
  for (int i = 0; i < 5; ++i) step(x, y);
  for (size_t i = 0; i < m.params.size(); ++i) check_tensor(opt.state(i).step, {}, DType::f64, {5});
}

// ---- zero_grad, set_lr, skipped parameters ----

TEST_CASE("optim: zero_grad zeroes the same buffers and leaves missing gradients missing") {
  Tensor a = make({1, 2, 3}, {3}, DType::f32).requires_grad_();
  Tensor b = make({4, 5}, {2}, DType::f32).requires_grad_();
  SGD opt({a, b}, {.lr = 0.1});
  sum(a * a).backward();
  Tensor g = a.grad();
  REQUIRE(g.defined());
  check_tensor(g, {3}, DType::f32, {2, 4, 6});
  void* data = g.raw_data();
  opt.zero_grad();
  CHECK(a.grad().raw_data() == data);
  CHECK(a.grad().is_same(g));
  check_tensor(a.grad(), {3}, DType::f32, {0, 0, 0});
  CHECK_FALSE(b.grad().defined());
  // The next backward accumulates into the same buffer.
  sum(a * 3).backward();
  CHECK(a.grad().raw_data() == data);
  check_tensor(a.grad(), {3}, DType::f32, {3, 3, 3});
}

TEST_CASE("optim: step skips parameters without a gradient, and their state stays put") {
  Tensor a = make({1, -1}, {2}, DType::f64).requires_grad_();
  Tensor b = make({5, 6}, {2}, DType::f64).requires_grad_();
  for (const Case& c : kCases) {
    CAPTURE(c.name);
    Tensor pa = a.detach().clone().requires_grad_(), pb = b.detach().clone().requires_grad_();
    auto opt = make_optimizer(c, {pa, pb});
    for (int s = 0; s < 2; ++s) {
      pa.set_grad(make(fixed_grad(s, 0, 2), {2}, DType::f64));
      opt->step();
    }
    check_tensor(pb, {2}, DType::f64, {5, 6});
    CHECK_FALSE(pb.grad().defined());
    if (c.kind == Kind::RMSprop) {
      check_tensor(static_cast<RMSprop&>(*opt).state(1).step, {}, DType::f64, {0});
      check_tensor(static_cast<RMSprop&>(*opt).state(1).square_avg, {2}, DType::f64, {0, 0});
    } else if (c.kind != Kind::SGD) {
      const auto& st = c.kind == Kind::Adam ? static_cast<Adam&>(*opt).state(1)
                                            : static_cast<AdamW&>(*opt).state(1);
      check_tensor(st.step, {}, DType::f64, {0});
    }
    // b's first gradient gives b its first update: the reference's first step.
    pb.set_grad(make({0.3, -0.7}, {2}, DType::f64));
    opt->step();
    Reference ref(c, {{5, 6}});
    ref.step({{0.3, -0.7}});
    check_tensor(pb, {2}, DType::f64, ref.p[0], 1e-14, 1e-14);
  }
}

TEST_CASE("optim: set_lr takes effect in a compiled step without a retrace") {
  for (const Case& c : kCases) {
    CAPTURE(c.name);
    Mlp eager(11, DType::f64), compiled(11, DType::f64);
    auto eager_opt = make_optimizer(c, eager.params);
    auto compiled_opt = make_optimizer(c, compiled.params);
    manual_seed(12);
    Tensor x = randn({5, 8}, Options().dtype(DType::f64));
    Tensor y = randint(4, {5});
    auto step = compile(
        [&](Tensor in, Tensor target) { return train_step(compiled, *compiled_opt, in, target); });
    for (double lr : {c.lr, 0.0, 3 * c.lr, 0.5 * c.lr}) {
      eager_opt->set_lr(lr);
      compiled_opt->set_lr(lr);
      CHECK(compiled_opt->lr() == lr);
      std::vector<Tensor> before;
      for (const Tensor& p : compiled.params) before.push_back(p.detach().clone());
      for (int i = 0; i < 3; ++i) {
        train_step(eager, *eager_opt, x, y);
        step(x, y);
      }
      for (size_t i = 0; i < eager.params.size(); ++i) {
        CHECK(close(eager.params[i], compiled.params[i], 1e-11));
        // lr 0 freezes the parameters (AdamW's decay is scaled by lr too).
        if (lr == 0) CHECK(bitwise_equal(compiled.params[i], before[i]));
      }
    }
    CHECK(step.stats().traces == 1);
    CHECK(step.stats().hits == 11);
  }
}

// ---- errors ----

TEST_CASE("optim: invalid options and parameters are errors naming the optimizer and value") {
  Tensor p = zeros({2}).requires_grad_();
  struct Row {
    std::function<void()> make;
    std::vector<std::string> want;
  };
  const std::vector<Row> rows = {
      {[&] { SGD({p}, {.lr = -0.1}); }, {"[SGD]", "learning rate -0.1"}},
      {[&] { Adam({p}, {.lr = -2}); }, {"[Adam]", "learning rate -2"}},
      {[&] { AdamW({p}, {.lr = -0.5}); }, {"[AdamW]", "learning rate -0.5"}},
      {[&] { SGD({p}, {.momentum = -0.9}); }, {"[SGD]", "momentum -0.9"}},
      {[&] { SGD({p}, {.weight_decay = -1}); }, {"[SGD]", "weight_decay -1"}},
      {[&] { SGD({p}, {.nesterov = true}); }, {"[SGD]", "nesterov", "momentum 0"}},
      {[&] {
         Adam({p}, {.betas = {1.0, 0.999}});
       },
       {"[Adam]", "beta1 1", "[0, 1)"}},
      {[&] {
         Adam({p}, {.betas = {-0.1, 0.999}});
       },
       {"[Adam]", "beta1 -0.1"}},
      {[&] {
         AdamW({p}, {.betas = {0.9, 1.5}});
       },
       {"[AdamW]", "beta2 1.5"}},
      {[&] { Adam({p}, {.eps = -1e-08}); }, {"[Adam]", "eps -1e-08"}},
      {[&] { AdamW({p}, {.weight_decay = -0.01}); }, {"[AdamW]", "weight_decay -0.01"}},
      {[&] { RMSprop({p}, {.lr = -1}); }, {"[RMSprop]", "learning rate -1"}},
      {[&] { RMSprop({p}, {.alpha = -0.5}); }, {"[RMSprop]", "alpha -0.5"}},
      {[&] { RMSprop({p}, {.eps = -1}); }, {"[RMSprop]", "eps -1"}},
      {[&] { RMSprop({p}, {.weight_decay = -2}); }, {"[RMSprop]", "weight_decay -2"}},
      {[&] { RMSprop({p}, {.momentum = -0.1}); }, {"[RMSprop]", "momentum -0.1"}},
      {[&] { RMSprop({}, {}); }, {"[RMSprop]", "empty parameter list"}},
      {[&] { SGD({}, {}); }, {"[SGD]", "empty parameter list"}},
      {[&] { Adam({}, {}); }, {"[Adam]", "empty parameter list"}},
      {[&] {
         SGD({p, zeros({3})}, {});
       },
       {"[SGD]", "parameter 1", "(3)", "does not require grad"}},
      {[&] { Adam({p * 2}, {}); }, {"[Adam]", "parameter 0", "not a leaf"}},
      {[&] {
         AdamW({p, p}, {});
       },
       {"[AdamW]", "parameters 0 and 1 are the same tensor"}},
      {[&] { SGD({Tensor()}, {}); }, {"[SGD]", "undefined"}},
      {[&] { SGD({p}, {}).set_lr(-3); }, {"[SGD]", "learning rate -3"}},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(i);
    const std::string msg = error_of<ValueError>(rows[i].make);
    for (const std::string& w : rows[i].want)
      CHECK_MESSAGE(msg.find(w) != std::string::npos, "\"", w, "\" not in: ", msg);
  }
  // A failed set_lr leaves the learning rate as it was.
  SGD opt({p}, {.lr = 0.2});
  CHECK_THROWS_AS(opt.set_lr(-1), Error);
  CHECK(opt.lr() == 0.2);
}

}  // namespace
}  // namespace duet::test
