// duet: layers. Each forward is one or a few duet ops; shape and dtype errors are the ops' own.
#include "nn/layers.h"

#include <cmath>

#include "core/ops.h"
#include "nn/init.h"

namespace duet::nn {
namespace {

// Parameters are created as zeros and then drawn by an initializer.
Tensor zeros_param(Shape shape) { return zeros(std::move(shape)); }

// PyTorch's default for Linear and Conv2d: kaiming_uniform(a = sqrt(5)) on the weight, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
void default_init(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
    init::uniform_(bias, -bound, bound);
  }
}

const char* bias_note(bool bias) { return bias ? "" : ", bias=false"; }

}  // namespace

// ---- Linear ----

Linear::Linear(int64_t in, int64_t out, bool with_bias)
    : Module(fmt::format("Linear({}, {}{})", in, out, bias_note(with_bias))),
      in_features(in),
      out_features(out) {
  DUET_CHECK_VALUE(in > 0 && out > 0,
                   "[Linear] in_features and out_features must be positive, got "
                   "Linear({}, {})",
                   in, out);
  weight = register_parameter("weight", zeros_param({out, in}));
  if (with_bias) bias = register_parameter("bias", zeros_param({out}));
  reset_parameters();
}

void Linear::reset_parameters() { default_init(weight, bias); }

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

// ---- Conv2d ----

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
               bool with_bias)
    : Module(fmt::format("Conv2d({}, {}, kernel_size={}, stride={}, padding={}{})", in, out, kernel,
                         stride_, padding_, bias_note(with_bias))),
      in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_) {
  DUET_CHECK_VALUE(in > 0 && out > 0 && kernel > 0 && stride_ > 0 && padding_ >= 0,
                   "[Conv2d] channels, kernel_size and stride must be positive and padding "
                   "non-negative, got {}",
                   name());
  weight = register_parameter("weight", zeros_param({out, in, kernel, kernel}));
  if (with_bias) bias = register_parameter("bias", zeros_param({out}));
  reset_parameters();
}

void Conv2d::reset_parameters() { default_init(weight, bias); }

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride, padding); }

// ---- Pooling ----

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride_)
    : Module(
          fmt::format("MaxPool2d(kernel_size={}, stride={})", kernel, stride_ ? stride_ : kernel)),
      kernel_size(kernel),
      stride(stride_) {
  DUET_CHECK_VALUE(kernel > 0 && stride_ >= 0,
                   "[MaxPool2d] kernel_size must be positive and stride non-negative (0: the "
                   "kernel size), got kernel_size {} and stride {}",
                   kernel, stride_);
}

Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel_size, stride); }

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride_)
    : Module(
          fmt::format("AvgPool2d(kernel_size={}, stride={})", kernel, stride_ ? stride_ : kernel)),
      kernel_size(kernel),
      stride(stride_) {
  DUET_CHECK_VALUE(kernel > 0 && stride_ >= 0,
                   "[AvgPool2d] kernel_size must be positive and stride non-negative (0: the "
                   "kernel size), got kernel_size {} and stride {}",
                   kernel, stride_);
}

Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, kernel_size, stride); }

// ---- Embedding ----

Embedding::Embedding(int64_t num, int64_t dim)
    : Module(fmt::format("Embedding({}, {})", num, dim)), num_embeddings(num), embedding_dim(dim) {
  DUET_CHECK_VALUE(num > 0 && dim > 0,
                   "[Embedding] num_embeddings and embedding_dim must be positive, got "
                   "Embedding({}, {})",
                   num, dim);
  weight = register_parameter("weight", init::normal_(zeros_param({num, dim})));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

// ---- LayerNorm ----

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine)
    : Module(fmt::format("LayerNorm({}, eps={}, elementwise_affine={})", shape, eps_, affine)),
      normalized_shape(shape),
      eps(eps_) {
  bool positive = shape.size() > 0;
  for (int64_t d : shape) positive = positive && d > 0;
  DUET_CHECK_VALUE(positive && eps_ >= 0,
                   "[LayerNorm] normalized_shape must have at least one dim, all positive, and "
                   "eps must be non-negative, got {}",
                   name());
  if (affine) {
    weight = register_parameter("weight", ones(shape));
    bias = register_parameter("bias", zeros(shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, normalized_shape, weight, bias, eps);
}

// ---- Dropout ----

Dropout::Dropout(double p_) : Module(fmt::format("Dropout(p={})", p_)), p(p_) {
  DUET_CHECK_VALUE(p_ >= 0 && p_ < 1, "[Dropout] p must be in [0, 1), got {}", p_);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }

// ---- Flatten ----

Flatten::Flatten(int64_t start, int64_t end)
    : Module(fmt::format("Flatten(start_dim={}, end_dim={})", start, end)),
      start_dim(start),
      end_dim(end) {
  // Dims of the same sign can be compared before the rank is known.
  DUET_CHECK_VALUE((start < 0) != (end < 0) || start <= end,
                   "[Flatten] start_dim {} comes after end_dim {}", start, end);
}

Tensor Flatten::forward(const Tensor& x) {
  // The dims as SymInts, so that a symbolic batch dim stays symbolic in a compiled graph.
  const SymDims dims = duet::detail::sym_dims(x);
  const auto rank = static_cast<int64_t>(dims.size());
  if (rank == 0) return reshape(x, Shape{1});  // as torch.flatten
  const int64_t s = start_dim < 0 ? start_dim + rank : start_dim;
  const int64_t e = end_dim < 0 ? end_dim + rank : end_dim;
  DUET_CHECK_VALUE(0 <= s && s < rank && 0 <= e && e < rank && s <= e,
                   "[Flatten] start_dim {} and end_dim {} do not fit an input of {} dims",
                   start_dim, end_dim, rank);
  SymDims out(dims.begin(), dims.begin() + s);
  SymInt merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= dims[static_cast<size_t>(d)];
  out.push_back(merged);
  out.insert(out.end(), dims.begin() + e + 1, dims.end());
  return duet::detail::reshape_dims(x, out);
}

// ---- Activations ----

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Softplus::Softplus(double beta_, double threshold_)
    : Module(fmt::format("Softplus(beta={}, threshold={})", beta_, threshold_)),
      beta(beta_),
      threshold(threshold_) {}
Tensor Softplus::forward(const Tensor& x) { return softplus(x, beta, threshold); }

// ---- Sequential ----

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (size_t i = 0; i < num_children(); ++i) y = child(i).forward(y);
  return y;
}

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  DUET_CHECK_VALUE(i < size(), "[Sequential] index {} is out of range for {} modules", i, size());
  return children()[i];
}

}  // namespace duet::nn
