// duet: what the convolution and linear layers share (nn/layers.cpp, nn/volume.cpp): their
// parameters made and drawn as PyTorch's, the note a module's name gives a missing bias, and
// the convolutions' checks (padding modes, sizes, groups, output padding).
// Internal to nn.
#pragma once

#include <cmath>
#include <initializer_list>
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

// The checks every convolution layer makes: positive channels and groups, a positive kernel,
// stride and dilation and a non-negative padding (their sizes along every dim, in `positive` and
// `non_negative`), and channels that the groups divide.
inline void check_conv_layer(const char* module, const std::string& name, int64_t in, int64_t out,
                             int64_t groups, std::initializer_list<int64_t> positive,
                             std::initializer_list<int64_t> non_negative) {
  bool ok = in > 0 && out > 0 && groups > 0;
  for (int64_t v : positive) ok = ok && v > 0;
  for (int64_t v : non_negative) ok = ok && v >= 0;
  DUET_CHECK_VALUE(ok,
                   "[{}] channels, kernel_size, stride, dilation and groups must be positive and "
                   "padding non-negative, got {}",
                   module, name);
  DUET_CHECK_VALUE(in % groups == 0 && out % groups == 0,
                   "[{}] in_channels ({}) and out_channels ({}) must be divisible by groups ({})",
                   module, in, out, groups);
}

// A transposed convolution's output padding along a dim: non-negative, below the stride or the
// dilation.
inline bool output_padding_fits(int64_t op, int64_t stride, int64_t dilation) {
  return op >= 0 && (op < stride || op < dilation);
}

// PyTorch's _output_padding along one dim (`dim`, of input size `in`): the output padding that
// gives the output size `want`, where one does; `size` is the whole output size as the message
// names it.
inline int64_t output_padding_for(const char* module, const std::string& size, const Tensor& x,
                                  int64_t in, int64_t want, int64_t k, int64_t s, int64_t p,
                                  int64_t d, const char* dim) {
  const int64_t least = (in - 1) * s - 2 * p + d * (k - 1) + 1;
  DUET_CHECK_VALUE(want >= least && want <= least + s - 1,
                   "[{}] output size {}: its {} {} is not between {} and {} (for the input {})",
                   module, size, dim, want, least, least + s - 1, x.sizes());
  return want - least;
}

}  // namespace duet::nn::layer_params
