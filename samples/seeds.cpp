// The seed examples: PyTorch's a * b backward, TensorFlow 1's placeholder graph, the seed's
// DynamicModel (a data-dependent branch, trained eagerly and compiled), and what a plain C++ `if`
// on a tensor's value does under compile. Every number is checked: the program exits with 1 if
// one is off, so CI runs it as a test.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "duet.h"

using namespace duet;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("CHECK FAILED: %s\n", what.c_str());
    ++failures;
  }
}

bool near(double a, double b, double tol = 1e-9) { return std::abs(a - b) <= tol; }

// The seed's model: linear1 = Linear(10, 5), linear2 = Linear(5, 1); if mean(x) > 0.5 then
// x = linear1(x), else x = relu(linear1(x)); return linear2(x). The branch is a duet::cond, so
// one compiled graph holds both paths.
struct DynamicModel : nn::Module {
  nn::Linear linear1{10, 5}, linear2{5, 1};
  DynamicModel() {
    register_module("linear1", linear1);
    register_module("linear2", linear2);
  }
  Tensor forward(const Tensor& x) override {
    nn::Linear l1 = linear1;
    Tensor h = cond(
        mean(x) > 0.5,
        [l1](const std::vector<Tensor>& in) mutable { return std::vector<Tensor>{l1(in[0])}; },
        [l1](const std::vector<Tensor>& in) mutable {
          return std::vector<Tensor>{relu(l1(in[0]))};
        },
        {x})[0];
    return linear2(h);
  }
};

}  // namespace

int main() try {
  // 1. PyTorch: c = a * b at a = 15, b = 20, then c.backward().
  Tensor a = scalar(15.0, Options().requires_grad());
  Tensor b = scalar(20.0, Options().requires_grad());
  Tensor c = a * b;
  c.backward();
  std::printf("PyTorch seed: c = a * b = %g, dc/da = %g, dc/db = %g\n", c.item<float>(),
              a.grad().item<float>(), b.grad().item<float>());
  check(c.item<float>() == 300 && a.grad().item<float>() == 20 && b.grad().item<float>() == 15,
        "a * b and its gradients");

  // 2. TensorFlow 1.x: placeholders, a graph built once, gradients and an intermediate fetched by
  // name through Program::run. Y = (X1 * X2 + X1) / X2 at X1 = 0.6, X2 = 0.2, in float64.
  Program prog([] {
    Tensor X1 = placeholder({}, DType::f64, "X1"), X2 = placeholder({}, DType::f64, "X2");
    Tensor prod = name(X1 * X2, "X1*X2");
    Tensor Y = (prod + X1) / X2;
    std::vector<Tensor> g = grad({Y}, {X1, X2});
    return std::vector<Tensor>{Y, g[0], g[1]};
  });
  std::vector<Tensor> r = prog.run({{"X1", scalar(0.6, Options().dtype(DType::f64))},
                                    {"X2", scalar(0.2, Options().dtype(DType::f64))}},
                                   {"out0", "out1", "out2", "X1*X2"});
  std::printf("TensorFlow seed: Y = %g, dY/dX1 = %g, dY/dX2 = %g, X1*X2 = %g\n",
              r[0].item<double>(), r[1].item<double>(), r[2].item<double>(), r[3].item<double>());
  check(near(r[0].item<double>(), 3.6) && near(r[1].item<double>(), 6) &&
            near(r[2].item<double>(), -15) && near(r[3].item<double>(), 0.12),
        "the placeholder graph");

  // 3. The DynamicModel, trained with Adam and MSE for 10 epochs on seeded random batches whose
  // means lie on both sides of 0.5, eagerly and compiled, from the same initialization.
  manual_seed(0);
  std::vector<Tensor> xs, ys;
  for (int k = 0; k < 4; ++k) {
    Tensor x = rand({32, 10}) + (k % 2 ? 0.25 : -0.25);  // batch means near 0.75 and 0.25
    xs.push_back(x);
    ys.push_back(sum(x * x, {1}, /*keepdim=*/true) * 0.2 - 0.5 + randn({32, 1}) * 0.05);
  }
  manual_seed(1);
  DynamicModel eager_model;
  manual_seed(1);
  DynamicModel compiled_model;
  optim::Adam eager_opt(eager_model.parameters(), optim::AdamOptions{0.01});
  optim::Adam compiled_opt(compiled_model.parameters(), optim::AdamOptions{0.01});
  auto step = [](DynamicModel& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = mse_loss(m(x), y);
    loss.backward();
    opt.step();
    return loss;
  };
  auto compiled_step = compile(
      [&](const Tensor& x, const Tensor& y) { return step(compiled_model, compiled_opt, x, y); });
  std::printf("\nDynamicModel, Adam + MSE, mean loss per epoch:\nepoch   eager      compiled\n");
  double worst = 0;
  for (int epoch = 1; epoch <= 10; ++epoch) {
    double le = 0, lc = 0;
    for (size_t k = 0; k < xs.size(); ++k) {
      const double e = step(eager_model, eager_opt, xs[k], ys[k]).item<float>();
      const double cl = compiled_step(xs[k], ys[k]).item<float>();
      worst = std::max(worst, std::abs(e - cl) / std::max(std::abs(e), 1e-12));
      le += e / double(xs.size());
      lc += cl / double(xs.size());
    }
    std::printf("%5d   %.6f   %.6f\n", epoch, le, lc);
  }
  std::printf("largest relative difference of a step's loss: %.2g; compiled: %d trace, %d hits\n",
              worst, compiled_step.stats().traces, compiled_step.stats().hits);
  check(worst <= 1e-5, "eager and compiled DynamicModel losses agree");
  check(compiled_step.stats().traces == 1, "one trace holds both branches");

  // 4. A plain C++ `if` on a tensor's value inside a compiled function: a clear error.
  auto plain_if = compile([&](const Tensor& x) {
    if (mean(x).item<float>() > 0.5) return eager_model.linear1(x);
    return relu(eager_model.linear1(x));
  });
  try {
    plain_if(xs[0]);
    check(false, "a C++ if on a traced value raises");
  } catch (const Error& e) {
    std::printf("\nA C++ if on a tensor under compile:\n  %s\n", e.what());
  }

  // 5. Higher order: d/dx and d2/dx2 of x^3 at x = 2, with create_graph.
  Tensor x = scalar(2.0, Options().dtype(DType::f64).requires_grad());
  Tensor cube = x * x * x;
  Tensor d1 = grad({cube}, {x}, {}, /*create_graph=*/true)[0];
  Tensor d2 = grad({d1}, {x})[0];
  std::printf("\nd(x^3)/dx at 2 = %g, d2(x^3)/dx2 at 2 = %g\n", d1.item<double>(),
              d2.item<double>());
  check(near(d1.item<double>(), 12) && near(d2.item<double>(), 12), "higher-order gradients");

  std::printf(failures ? "\n%d check(s) failed\n" : "\nall checks passed\n", failures);
  return failures ? 1 : 0;
} catch (const Error& e) {
  std::printf("seeds: %s\n", e.what());
  return 1;
}
