// duet: parameter initializers. Draws are ordinary rand/randn calls on the default generator,
// written into the tensor with copy_ under NoGradGuard: the tensor keeps its handle, storage,
// requires_grad and leaf status, so layers, users and optimizers holding it see the new values.
#include "nn/init.h"

#include <cmath>

#include "core/ops.h"
#include "eager/autograd.h"

namespace duet::nn::init {
namespace {

// The dtype to draw in: the tensor's own (f16 and bf16 draw in f32 and round, as PyTorch's).
DType draw_dtype(const char* op, const Tensor& t) {
  DUET_CHECK_DTYPE(is_floating(t.dtype()), "[{}] needs a floating tensor, got {} of shape {}", op,
                   t.dtype(), t.sizes());
  return t.dtype();
}

int64_t fan(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return mode == FanMode::FanIn ? fan_in : fan_out;
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv1d:
    case Nonlinearity::Conv2d:
    case Nonlinearity::Conv3d:
    case Nonlinearity::Sigmoid:
      return 1;
    case Nonlinearity::Tanh:
      return 5.0 / 3;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU:
      return std::sqrt(2.0 / (1 + param * param));
    case Nonlinearity::SELU:
      return 3.0 / 4;
  }
  DUET_ASSERT(false, "unknown nonlinearity {}", static_cast<int>(nonlinearity));
  return 1;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  DUET_CHECK_VALUE(t.dim() >= 2,
                   "[init] fan in and fan out cannot be computed for a tensor with fewer than 2 "
                   "dims, got shape {}",
                   t.sizes());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor uniform_(Tensor t, double a, double b) {
  DUET_CHECK_VALUE(a <= b, "[uniform_] needs a <= b, got a = {} and b = {}", a, b);
  const DType dt = draw_dtype("uniform_", t);
  NoGradGuard no_grad;
  t.copy_(rand(t.sizes(), Options().dtype(dt).device(t.device())) * (b - a) + a);
  return t;
}

Tensor normal_(Tensor t, double mean, double std) {
  DUET_CHECK_VALUE(std >= 0, "[normal_] needs std >= 0, got {}", std);
  const DType dt = draw_dtype("normal_", t);
  NoGradGuard no_grad;
  t.copy_(randn(t.sizes(), Options().dtype(dt).device(t.device())) * std + mean);
  return t;
}

Tensor constant_(Tensor t, double value) {
  NoGradGuard no_grad;
  t.copy_(scalar(value, Options().dtype(DType::f64).device(t.device())));
  return t;
}

Tensor zeros_(Tensor t) {
  NoGradGuard no_grad;
  t.zero_();
  return t;
}

Tensor ones_(Tensor t) { return constant_(std::move(t), 1); }

// As PyTorch, a zero-element tensor is left as it is (its fan may be 0).
Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (t.numel() == 0) return t;
  const double stddev =
      calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode)));
  const double bound = std::sqrt(3.0) * stddev;
  return uniform_(std::move(t), -bound, bound);
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (t.numel() == 0) return t;
  const double stddev =
      calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode)));
  return normal_(std::move(t), 0, stddev);
}

Tensor xavier_uniform_(Tensor t, double gain) {
  if (t.numel() == 0) return t;
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const double stddev = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  const double bound = std::sqrt(3.0) * stddev;
  return uniform_(std::move(t), -bound, bound);
}

Tensor xavier_normal_(Tensor t, double gain) {
  if (t.numel() == 0) return t;
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(std::move(t), 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace duet::nn::init
