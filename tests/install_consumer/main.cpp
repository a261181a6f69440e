// Built against an installed duet by tests/install_consumer/run.sh: an eager op, a compiled
// function and a backward, each checked. Exits with 1 when a value is off, CPU only.
#include <cmath>
#include <cstdio>

#include "duet.h"

using namespace duet;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "install_consumer: %s is wrong\n", what);
    ++failures;
  }
}

}  // namespace

int main() try {
  // Eager: (2, 3) @ ones(3, 2) sums each row: [[6, 6], [15, 15]].
  Tensor x = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor y = matmul(x, ones({3, 2}));
  check(sum(y).item<float>() == 42 && y.shape() == Shape{2, 2}, "matmul");

  // Compiled: traced once, replayed, and equal to the eager result.
  auto f = compile([](Tensor a, Tensor b) { return tanh(a * 1.5 + 0.5) * sigmoid(b); });
  Tensor a = randn({8, 16}), b = randn({8, 16});
  Tensor want = tanh(a * 1.5 + 0.5) * sigmoid(b);
  Tensor got = f(a, b);
  got = f(a, b);
  check(max(abs(got - want)).item<float>() <= 1e-6f, "compiled function's result");
  check(f.stats().traces == 1, "compiled function's trace count");

  // Backward: d/dw sum(w * w * 3) = 6 w, eagerly and through a compiled step.
  Tensor w = tensor({1, -2, 3}, Shape{3}, Options().requires_grad());
  sum(w * w * 3).backward();
  check(max(abs(w.grad() - w.detach() * 6)).item<float>() == 0, "eager gradient");
  Tensor v = tensor({0.5, 2, -1}, Shape{3}, Options().requires_grad());
  auto step = compile([&](const Tensor& s) {
    Tensor loss = sum(v * v * s);
    loss.backward();
    return loss;
  });
  Tensor loss = step(scalar(3.0));
  check(std::abs(loss.item<float>() - 15.75f) < 1e-5f, "compiled loss");
  check(max(abs(v.grad() - v.detach() * 6)).item<float>() == 0, "compiled gradient");

  if (failures == 0) std::printf("install_consumer: eager, compiled and backward agree\n");
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "install_consumer: %s\n", e.what());
  return 1;
}
