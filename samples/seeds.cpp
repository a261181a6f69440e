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

  // Higher order: d/dx and d2/dx2 of x^3 at x = 2, with create_graph.
  Tensor x = scalar(2.0, f64);
  Tensor cube = x * x * x;
  Tensor d1 = grad({cube}, {x}, {}, /*create_graph=*/true)[0];
  Tensor d2 = grad({d1}, {x})[0];
  std::cout << "d(x^3)/dx at 2   = " << d1.item<double>() << "\n"
            << "d2(x^3)/dx2 at 2 = " << d2.item<double>() << "\n";
  return 0;
}
