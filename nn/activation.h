// duet: the activation layers beyond nn/layers.h's (torch.nn's LeakyReLU to LogSoftmax), each a
// Module over one duet op (core/ops/activations.cpp, softmax, log_softmax), with PyTorch's
// argument names, defaults and printed names. Arguments out of range raise a duet::Error that
// names the layer; bad inputs raise the op's.
#pragma once

#include <string>

#include "nn/module.h"

namespace duet::nn {

/// leaky_relu: x where x > 0, negative_slope * x elsewhere.
class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01);
  Tensor forward(const Tensor& x) override;
  double negative_slope;
};

/// elu: x where x > 0, alpha (e^x - 1) elsewhere.
class ELU : public Module {
 public:
  explicit ELU(double alpha = 1);
  Tensor forward(const Tensor& x) override;
  double alpha;
};

/// selu: PyTorch's scaled ELU.
class SELU : public Module {
 public:
  SELU() : Module("SELU()") {}
  Tensor forward(const Tensor& x) override;
};

/// celu: x where x > 0, alpha (e^(x / alpha) - 1) elsewhere.
class CELU : public Module {
 public:
  explicit CELU(double alpha = 1);
  Tensor forward(const Tensor& x) override;
  double alpha;
};

/// hardtanh: x clamped to [min_val, max_val].
class Hardtanh : public Module {
 public:
  explicit Hardtanh(double min_val = -1, double max_val = 1);
  Tensor forward(const Tensor& x) override;
  double min_val, max_val;
};

/// relu6: x clamped to [0, 6].
class ReLU6 : public Module {
 public:
  ReLU6() : Module("ReLU6()") {}
  Tensor forward(const Tensor& x) override;
};

/// hardsigmoid: relu6(x + 3) / 6.
class Hardsigmoid : public Module {
 public:
  Hardsigmoid() : Module("Hardsigmoid()") {}
  Tensor forward(const Tensor& x) override;
};

/// hardswish: x hardsigmoid(x).
class Hardswish : public Module {
 public:
  Hardswish() : Module("Hardswish()") {}
  Tensor forward(const Tensor& x) override;
};

/// mish: x tanh(softplus(x)).
class Mish : public Module {
 public:
  Mish() : Module("Mish()") {}
  Tensor forward(const Tensor& x) override;
};

/// glu: the first half of x along dim times the sigmoid of the second.
class GLU : public Module {
 public:
  explicit GLU(int64_t dim = -1);
  Tensor forward(const Tensor& x) override;
  int64_t dim;
};

/// prelu with a learned weight: one slope (num_parameters 1) or one per channel (dim 1 of the
/// input), each starting at `init`, as torch.nn.PReLU.
class PReLU : public Module {
 public:
  explicit PReLU(int64_t num_parameters = 1, double init = 0.25);
  Tensor forward(const Tensor& x) override;
  int64_t num_parameters;
  Tensor weight;  ///< (num_parameters)
};

/// softmax along dim (PyTorch's implicit dim is deprecated; here dim is required).
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim);
  Tensor forward(const Tensor& x) override;
  int64_t dim;
};

/// log_softmax along dim.
class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim);
  Tensor forward(const Tensor& x) override;
  int64_t dim;
};

}  // namespace duet::nn
