// A small convnet on Fashion-MNIST, trained with a compiled step until it reaches a target test
// accuracy (90% by default) or runs out of epochs.
//
//   cnn [--epochs N] [--target PERCENT] [--batch B] [--lr X] [--seed S] [--data DIR]
//       [--autocast bf16|f16]   the forward pass under Autocast (docs/low-precision.md)
//       [--device cpu|cuda]     where the model and the batches live (exit status 77, skipped,
//                               for cuda without a usable GPU)
#include <chrono>
#include <cstdio>
#include <string>

#include "duet.h"
#include "side_by_side.h"

using namespace duet;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// conv 5x5 (1 -> 16) + ReLU + 2x2 max pool, conv 5x5 (16 -> 32) + ReLU + 2x2 max pool, then a
// linear classifier over the 32 x 7 x 7 features.
nn::Sequential make_model() {
  return nn::Sequential(nn::Conv2d(1, 16, 5, 1, 2), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Conv2d(16, 32, 5, 1, 2), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                        nn::Linear(32 * 7 * 7, 10));
}

double accuracy(nn::Module& model, const data::Dataset& test, Device device) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0;
  const int64_t n = test.inputs.size(0), chunk = 500;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t end = std::min(n, i + chunk);
    Tensor x = reshape(slice(test.inputs, 0, i, end), {end - i, 1, 28, 28}).to(device);
    correct +=
        sum(eq(argmax(model(x), 1), slice(test.targets, 0, i, end).to(device))).item<int64_t>();
  }
  model.train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) try {
  int epochs = 10;
  double target = 90, lr = 1e-3;
  int64_t batch = 128;
  uint64_t seed = 0;
  std::string dir = data::kFashionMnistDir, autocast, device_name = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--epochs")
      epochs = std::stoi(v);
    else if (k == "--target")
      target = std::stod(v);
    else if (k == "--batch")
      batch = std::stoll(v);
    else if (k == "--lr")
      lr = std::stod(v);
    else if (k == "--seed")
      seed = std::stoull(v);
    else if (k == "--data")
      dir = v;
    else if (k == "--autocast")
      autocast = v;
    else if (k == "--device")
      device_name = v;
    else
      DUET_CHECK_VALUE(false, "[cnn] unknown option {}", k);
  }
  DUET_CHECK_VALUE(autocast.empty() || autocast == "bf16" || autocast == "f16",
                   "[cnn] --autocast is bf16 or f16, got {}", autocast);
  const DType low = autocast == "f16" ? DType::f16 : DType::bf16;
  const Device device = samples::parse_device("cnn", device_name);
  if (!samples::device_usable("cnn", device)) return samples::kSkipped;
  data::Dataset train_set = data::load_fashion_mnist(true, dir);
  data::Dataset test_set = data::load_fashion_mnist(false, dir);
  // Standardized with the training set's mean and standard deviation, as torchvision's
  // Normalize does.
  const Tensor mu = mean(train_set.inputs),
               sd = sqrt(mean((train_set.inputs - mu) * (train_set.inputs - mu)));
  train_set.inputs = (train_set.inputs - mu) / sd;
  test_set.inputs = (test_set.inputs - mu) / sd;
  manual_seed(seed);
  nn::Sequential model = make_model();
  model.to(device);
  optim::Adam opt(model.parameters(), optim::AdamOptions{lr});
  auto step = compile([&](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss;
    {
      Autocast ac(device, low, /*enabled=*/!autocast.empty());
      loss = cross_entropy(model(reshape(x, {-1, 1, 28, 28})), y);
    }
    loss.backward();
    opt.step();
    return loss;
  });
  data::DataLoader loader(train_set.inputs, train_set.targets, batch, /*shuffle=*/true, seed);
  std::printf(
      "duet cnn: conv(1->16, 5x5) pool conv(16->32, 5x5) pool linear(1568->10), batch "
      "%lld, Adam lr %g, compiled step on %s%s%s\n",
      static_cast<long long>(batch), lr, device.str().c_str(),
      autocast.empty() ? "" : ", autocast ", autocast.c_str());
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    loader.set_epoch(epoch - 1);
    const double t0 = now_s();
    double loss_sum = 0;
    int64_t steps = 0;
    for (const data::Batch& b : loader) {
      loss_sum += step(b.inputs.to(device), b.targets.to(device)).item<float>();
      ++steps;
    }
    const double acc = accuracy(model, test_set, device);
    std::printf("epoch %d: mean loss %.4f, test accuracy %.2f %%, %.1f s\n", epoch,
                loss_sum / double(steps), acc, now_s() - t0);
    if (acc >= target) {
      std::printf("reached %.1f %% after %d epoch(s); compiled step: %d trace(s), %d hits\n",
                  target, epoch, step.stats().traces, step.stats().hits);
      return 0;
    }
  }
  std::printf("did not reach %.1f %% in %d epochs\n", target, epochs);
  return 1;
} catch (const Error& e) {
  std::fprintf(stderr, "cnn: %s\n", e.what());
  return 1;
}
