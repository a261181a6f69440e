// duet: the activation layers of nn/activation.h.
#include "nn/activation.h"

#include <cmath>

#include "core/ops.h"

namespace duet::nn {

LeakyReLU::LeakyReLU(double slope)
    : Module(fmt::format("LeakyReLU(negative_slope={})", slope)), negative_slope(slope) {
  DUET_CHECK_VALUE(std::isfinite(slope), "[LeakyReLU] negative_slope must be finite, got {}",
                   slope);
}
Tensor LeakyReLU::forward(const Tensor& x) { return leaky_relu(x, negative_slope); }

ELU::ELU(double alpha_) : Module(fmt::format("ELU(alpha={})", alpha_)), alpha(alpha_) {
  DUET_CHECK_VALUE(std::isfinite(alpha_), "[ELU] alpha must be finite, got {}", alpha_);
}
Tensor ELU::forward(const Tensor& x) { return elu(x, alpha); }

Tensor SELU::forward(const Tensor& x) { return selu(x); }

CELU::CELU(double alpha_) : Module(fmt::format("CELU(alpha={})", alpha_)), alpha(alpha_) {
  DUET_CHECK_VALUE(std::isfinite(alpha_) && alpha_ != 0,
                   "[CELU] alpha must be finite and nonzero, got {}", alpha_);
}
Tensor CELU::forward(const Tensor& x) { return celu(x, alpha); }

Hardtanh::Hardtanh(double lo, double hi)
    : Module(fmt::format("Hardtanh(min_val={}, max_val={})", lo, hi)), min_val(lo), max_val(hi) {
  DUET_CHECK_VALUE(lo <= hi, "[Hardtanh] min_val {} must be at most max_val {}", lo, hi);
}
Tensor Hardtanh::forward(const Tensor& x) { return hardtanh(x, min_val, max_val); }

Tensor ReLU6::forward(const Tensor& x) { return relu6(x); }
Tensor Hardsigmoid::forward(const Tensor& x) { return hardsigmoid(x); }
Tensor Hardswish::forward(const Tensor& x) { return hardswish(x); }
Tensor Mish::forward(const Tensor& x) { return mish(x); }

GLU::GLU(int64_t dim_) : Module(fmt::format("GLU(dim={})", dim_)), dim(dim_) {}
Tensor GLU::forward(const Tensor& x) { return glu(x, dim); }

PReLU::PReLU(int64_t n, double init)
    : Module(fmt::format("PReLU(num_parameters={})", n)), num_parameters(n) {
  DUET_CHECK_VALUE(n > 0 && std::isfinite(init),
                   "[PReLU] num_parameters must be positive and init finite, got {} and {}", n,
                   init);
  weight = register_parameter("weight", full({n}, init));
}
Tensor PReLU::forward(const Tensor& x) { return prelu(x, weight); }

Softmax::Softmax(int64_t dim_) : Module(fmt::format("Softmax(dim={})", dim_)), dim(dim_) {}
Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim); }

LogSoftmax::LogSoftmax(int64_t dim_) : Module(fmt::format("LogSoftmax(dim={})", dim_)), dim(dim_) {}
Tensor LogSoftmax::forward(const Tensor& x) { return log_softmax(x, dim); }

}  // namespace duet::nn
