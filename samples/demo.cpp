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

  // The same kind of model as a compiled training step: forward, backward and the SGD update
  // traced once into one graph, then replayed. Eager and compiled give the same losses.
  manual_seed(1);
  Tensor x = randn({32, 20});
  Tensor y = randint(5, {32});
  auto make_params = [] {
    manual_seed(2);
    std::vector<Tensor> p = {randn({64, 20}) * 0.2, zeros({64}), randn({5, 64}) * 0.2, zeros({5})};
    for (Tensor& t : p) t = t.detach().requires_grad_();
    return p;
  };
  std::vector<Tensor> pe = make_params(), pc = make_params();
  auto train_step = [](std::vector<Tensor>& p, const Tensor& in, const Tensor& target) {
    {
      NoGradGuard ng;
      for (Tensor& t : p)
        if (t.grad().defined()) t.grad().zero_();
    }
    Tensor logits = linear(relu(linear(in, p[0], p[1])), p[2], p[3]);
    Tensor l = cross_entropy(logits, target);
    l.backward();
    NoGradGuard ng;
    for (Tensor& t : p) t.sub_(t.grad() * 0.5);
    return l;
  };
  auto step = compile([&](Tensor in, Tensor target) { return train_step(pc, in, target); });
  std::cout << "step  eager loss  compiled loss\n";
  for (int i = 0; i < 5; ++i) {
    Tensor le = train_step(pe, x, y);
    Tensor lc = step(x, y);
    std::cout << fmt::format("{:4d}  {:10.6f}  {:13.6f}\n", i, le.item<float>(), lc.item<float>());
  }
  std::cout << fmt::format("compiled: {} trace, {} hits, {} nodes traced, {} after the passes\n\n",
                           step.stats().traces, step.stats().hits, step.stats().nodes_before,
                           step.stats().nodes_after);

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
  try {  // a branch on data inside a compiled function
    auto f = compile([](Tensor t) { return sum(t).item<float>() > 0 ? t : -t; });
    f(a);
  } catch (const Error& e) {
    std::cout << "error: " << e.what() << "\n";
  }
  return 0;
}
