// duet demo: tensors and views, broadcasting, reductions, matmul, and eager autograd
// through a small convolutional classifier step.
#include <iostream>

#include "duet.h"

int main() {
  using namespace duet;
  Tensor a = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor b = tensor({10, 20, 30});
  std::cout << "a =\n" << a << "\n\n";
  std::cout << "a + b (broadcast) =\n" << a + b << "\n\n";
  std::cout << "a.T (a view, no copy) =\n" << transpose(a, 0, 1) << "\n\n";
  std::cout << "sum(a, 1) = " << sum(a, 1) << "\n";
  std::cout << "softmax(a, 1) =\n" << softmax(a, 1) << "\n\n";
  std::cout << "a @ a.T =\n" << matmul(a, transpose(a, 0, 1)) << "\n\n";

  // One eager training step of a tiny conv net on random images (Philox, seeded).
  manual_seed(0);
  Tensor images = randn({4, 1, 8, 8});
  Tensor labels = randint(3, {4});
  Tensor w1 = (randn({6, 1, 3, 3}) * 0.3).requires_grad_();
  Tensor w2 = (randn({3, 6 * 3 * 3}) * 0.1).requires_grad_();
  Tensor h = max_pool2d(relu(conv2d(images, w1, {}, 1, 1)), 2);  // (4, 6, 4, 4)
  Tensor logits = linear(reshape(avg_pool2d(h, 2, 1), {4, -1}), w2);
  Tensor loss = cross_entropy(logits, labels);
  loss.backward();
  std::cout << "labels = " << labels << "\n";
  std::cout << "loss = " << loss << "\n";
  std::cout << "|dloss/dw1| = " << sqrt(sum(w1.grad() * w1.grad())) << "\n\n";

  try {
    Tensor bad = a + tensor({1, 2});
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << "\n";
  }
  try {
    conv2d(images, randn({6, 3, 3, 3}));
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << "\n";
  }
  return 0;
}
