// Deploys a compiled MLP of Fashion-MNIST's shape (784 -> 128 -> 10, softmax) with a symbolic
// batch three ways (docs/deploy.md): saved as mlp.duet for duet::load and duet-run, exported as
// mlp.onnx for ONNX Runtime, and imported back from mlp.onnx. It writes a batch of inputs as
// x.npy and the compiled function's outputs as out.npy, to compare against:
//   ./build/samples/deploy && ./build/tools/duet-run mlp.duet --input x.npy --bench 1000
#include <cstdio>

#include "duet.h"

using namespace duet;

int main() {
  manual_seed(0);
  nn::Linear fc1(784, 128), fc2(128, 10);
  CompileOptions o;
  o.dynamic = {{0, 0}};  // the batch stays symbolic in the files
  auto forward = compile([&](Tensor x) { return softmax(fc2(relu(fc1(x))), 1); }, o);
  save(forward, "mlp.duet", randn({256, 784}));
  const Tensor x = rand({4, 784});
  const Tensor want = forward(x);
  data::write_npy("x.npy", x);
  data::write_npy("out.npy", want);
  Program p = load("mlp.duet");
  const double diff = max(abs(p({x})[0] - want)).item<double>();
  std::printf(
      "wrote mlp.duet (inputs: %s) and x.npy (4, 784); loaded, it differs from the "
      "compiled function by %g\n",
      fmt::format("{}", fmt::join(p.input_names(), ", ")).c_str(), diff);
  double onnx_diff = 0;
#ifdef DUET_WITH_ONNX
  export_onnx(forward, "mlp.onnx", {}, randn({256, 784}));  // checked by the ONNX checker
  Program back = import_onnx("mlp.onnx");
  onnx_diff = max(abs(back({x})[0] - want)).item<double>();
  std::printf(
      "wrote mlp.onnx (opset 17, input arg0 of shape (s0, 784)); imported back and compiled, it "
      "differs by %g\n",
      onnx_diff);
#endif
  return diff < 1e-6 && onnx_diff < 1e-6 ? 0 : 1;
}
