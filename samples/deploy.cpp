// Saves a compiled MLP of Fashion-MNIST's shape (784 -> 128 -> 10) with a symbolic batch, and a
// batch of inputs as .npy, for duet-run (docs/deploy.md):
//   ./build/samples/deploy && ./build/tools/duet-run mlp.duet --input x.npy --bench 1000
#include <cstdio>

#include "duet.h"

using namespace duet;

int main() {
  manual_seed(0);
  nn::Linear fc1(784, 128), fc2(128, 10);
  CompileOptions o;
  o.dynamic = {{0, 0}};  // the batch stays symbolic in the file
  auto forward = compile([&](Tensor x) { return softmax(fc2(relu(fc1(x))), 1); }, o);
  save(forward, "mlp.duet", randn({256, 784}));
  const Tensor x = rand({4, 784});
  data::write_npy("x.npy", x);
  Program p = load("mlp.duet");
  const double diff = max(abs(p({x})[0] - forward(x))).item<double>();
  std::printf(
      "wrote mlp.duet (inputs: %s) and x.npy (4, 784); loaded, it differs from the "
      "compiled function by %g\n",
      fmt::format("{}", fmt::join(p.input_names(), ", ")).c_str(), diff);
  return diff < 1e-6 ? 0 : 1;
}
