// duet demo: tensors, views, broadcasting, reductions and matmul on the CPU.
#include <iostream>

#include "duet.h"

int main() {
  using namespace duet;
  Tensor a = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor b = tensor({10, 20, 30});
  std::cout << "a =\n" << a << "\n\n";
  std::cout << "a + b (broadcast) =\n" << a + b << "\n\n";
  std::cout << "tanh(a * 0.5) =\n" << tanh(a * 0.5) << "\n\n";
  std::cout << "a.T (a view, no copy) =\n" << transpose(a, 0, 1) << "\n\n";
  std::cout << "sum(a, 1) = " << sum(a, 1) << "\n";
  std::cout << "max(a) = " << max(a) << "\n\n";
  std::cout << "a @ a.T =\n" << matmul(a, transpose(a, 0, 1)) << "\n\n";
  std::cout << "arange(5) > 2 = " << (arange(5) > 2) << "\n\n";
  try {
    Tensor bad = a + tensor({1, 2});
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << "\n";
  }
  return 0;
}
