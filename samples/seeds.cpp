// The seed examples, run eagerly: define-by-run autograd on scalars.
#include <iostream>

#include "duet.h"

int main() {
  using namespace duet;
  // c = a * b at a = 15, b = 20.
  Tensor a = scalar(15.0, Options().requires_grad());
  Tensor b = scalar(20.0, Options().requires_grad());
  Tensor c = a * b;
  c.backward();
  std::cout << "c = a * b        = " << c.item<float>() << "\n"
            << "dc/da            = " << a.grad().item<float>() << "\n"
            << "dc/db            = " << b.grad().item<float>() << "\n\n";

  // (X1 * X2 + X1) / X2 at X1 = 0.6, X2 = 0.2, in float64.
  Options f64 = Options().dtype(DType::f64).requires_grad();
  Tensor x1 = scalar(0.6, f64), x2 = scalar(0.2, f64);
  Tensor y = (x1 * x2 + x1) / x2;
  y.backward();
  std::cout << "(X1*X2 + X1)/X2 = " << y.item<double>() << "\n"
            << "dy/dX1           = " << x1.grad().item<double>() << "\n"
            << "dy/dX2           = " << x2.grad().item<double>() << "\n\n";

  // The same example define-and-run, as in TensorFlow 1.x: placeholders, gradients and an
  // intermediate node fetched by name.
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
  std::cout << "Program: Y = " << r[0].item<double>() << ", dY/dX1 = " << r[1].item<double>()
            << ", dY/dX2 = " << r[2].item<double>() << ", X1*X2 = " << r[3].item<double>()
            << "\n\n";

  // Higher order: d/dx and d2/dx2 of x^3 at x = 2, with create_graph.
  Tensor x = scalar(2.0, f64);
  Tensor cube = x * x * x;
  Tensor d1 = grad({cube}, {x}, {}, /*create_graph=*/true)[0];
  Tensor d2 = grad({d1}, {x})[0];
  std::cout << "d(x^3)/dx at 2   = " << d1.item<double>() << "\n"
            << "d2(x^3)/dx2 at 2 = " << d2.item<double>() << "\n";
  return 0;
}
