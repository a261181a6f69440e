// duet: what the convolution and linear layers share (nn/layers.cpp, nn/volume.cpp): their
// parameters made and drawn as PyTorch's, the note a module's name gives a missing bias, and
// the padding modes a convolution takes.
// Internal to nn.
#pragma once

#include <cmath>
#include <string>

#include "core/op_errors.h"
#include "core/ops.h"
#include "nn/init.h"

namespace duet::nn::layer_params {

// Parameters are created as zeros and then drawn by an initializer.
inline Tensor zeros_param(Shape shape) { return zeros(std::move(shape)); }

// PyTorch's default for Linear and the convolutions: kaiming_uniform(a = sqrt(5)) on the weight,
// which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
inline void default_init(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
    init::uniform_(bias, -bound, bound);
  }
}

inline const char* bias_note(bool bias) { return bias ? "" : ", bias=false"; }

// A convolution's padding_mode: "zeros", or one of pad()'s modes that the layer pads x with first.
inline void check_padding_mode(const char* module, const std::string& mode) {
  DUET_CHECK_VALUE(
      mode == "zeros" || mode == "reflect" || mode == "replicate" || mode == "circular",
      "[{}] padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got '{}'", module,
      mode);
}

}  // namespace duet::nn::layer_params
