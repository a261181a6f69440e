// duet: parameter initializers (torch.nn.init). Each writes into a tensor in place, outside
// autograd, and draws from duet's default Philox generator, so manual_seed(s) makes every
// initialization reproducible. Fans and gains follow PyTorch.
#pragma once

#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace duet::nn::init {

/// Which fan kaiming_* scales by: fan_in keeps the forward variance, fan_out the backward's.
enum class FanMode { FanIn, FanOut };

/// The nonlinearity a layer feeds, for calculate_gain (torch.nn.init's names).
enum class Nonlinearity { Linear, Conv1d, Conv2d, Conv3d, Sigmoid, Tanh, ReLU, LeakyReLU, SELU };

/// The recommended gain for a nonlinearity: 1 for linear, conv and sigmoid, 5/3 for tanh,
/// sqrt(2) for relu, sqrt(2 / (1 + param^2)) for leaky relu (param is its negative slope),
/// 3/4 for selu.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

/// (fan_in, fan_out) of a weight of shape (out, in, *receptive): in * prod(receptive) and
/// out * prod(receptive). A ValueError for a tensor of fewer than 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

/// Fills t with U(a, b). t must be floating; a <= b.
Tensor uniform_(Tensor t, double a = 0, double b = 1);
/// Fills t with N(mean, std^2). t must be floating; std >= 0.
Tensor normal_(Tensor t, double mean = 0, double std = 1);
/// Fills t with a value (any dtype; the value converts as copy_ converts).
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);

/// He et al.: U(-bound, bound) with bound = gain * sqrt(3 / fan), gain = calculate_gain
/// (nonlinearity, a). PyTorch's default Linear and Conv2d weights are a = sqrt(5).
Tensor kaiming_uniform_(Tensor t, double a = 0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
/// He et al.: N(0, std^2) with std = gain / sqrt(fan).
Tensor kaiming_normal_(Tensor t, double a = 0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
/// Glorot and Bengio: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor t, double gain = 1);
/// Glorot and Bengio: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor t, double gain = 1);

}  // namespace duet::nn::init
