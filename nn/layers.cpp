// duet: layers. Each forward is one or a few duet ops; shape and dtype errors are the ops' own.
#include "nn/layers.h"

#include <cmath>
#include <limits>

#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"
#include "nn/init.h"
#include "nn/layer_params.h"

namespace duet::nn {

using layer_params::bias_note;
using layer_params::check_conv_layer;
using layer_params::default_init;
using layer_params::zeros_param;

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

namespace {
// A Size2 as the module's name shows it: one int where both dims agree.
std::string size2_str(Size2 s) {
  return s.h == s.w ? fmt::format("{}", s.h) : fmt::format("({}, {})", s.h, s.w);
}
}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Size2 kernel, Size2 stride_, Size2 padding_, bool with_bias,
               int64_t groups_, Size2 dilation_, std::string padding_mode_)
    : Conv2d(in, out, kernel, stride_, padding_, with_bias, groups_, dilation_,
             std::move(padding_mode_), false) {}

Conv2d::Conv2d(int64_t in, int64_t out, Size2 kernel, Size2 stride_, SamePadding, bool with_bias,
               int64_t groups_, Size2 dilation_, std::string padding_mode_)
    : Conv2d(in, out, kernel, stride_, 0, with_bias, groups_, dilation_, std::move(padding_mode_),
             true) {}

Conv2d::Conv2d(int64_t in, int64_t out, Size2 kernel, Size2 stride_, Size2 padding_, bool with_bias,
               int64_t groups_, Size2 dilation_, std::string padding_mode_, bool same)
    : Module(fmt::format(
          "Conv2d({}, {}, kernel_size={}, stride={}, padding={}{}{}{}{})", in, out,
          size2_str(kernel), size2_str(stride_), same ? std::string("same") : size2_str(padding_),
          dilation_ != Size2(1) ? ", dilation=" + size2_str(dilation_) : "",
          groups_ != 1 ? fmt::format(", groups={}", groups_) : "", bias_note(with_bias),
          padding_mode_ != "zeros" ? ", padding_mode='" + padding_mode_ + "'" : "")),
      in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_),
      groups(groups_),
      dilation(dilation_),
      padding_mode(std::move(padding_mode_)),
      padding_same(same) {
  DUET_CHECK_VALUE(!same || stride_ == Size2(1), "[Conv2d] padding \"same\" needs stride 1, got {}",
                   size2_str(stride_));
  layer_params::check_padding_mode("Conv2d", padding_mode);
  check_conv_layer("Conv2d", name(), in, out, groups_,
                   {kernel.h, kernel.w, stride_.h, stride_.w, dilation_.h, dilation_.w},
                   {padding_.h, padding_.w});
  weight = register_parameter("weight", zeros_param({out, in / groups_, kernel.h, kernel.w}));
  if (with_bias) bias = register_parameter("bias", zeros_param({out}));
  reset_parameters();
}

void Conv2d::reset_parameters() { default_init(weight, bias); }

// A padding_mode other than zeros pads x first (pad(), in that mode), and convolves unpadded,
// as PyTorch's Conv2d.
Tensor Conv2d::forward(const Tensor& x) {
  const std::array<int64_t, 4> p =
      padding_same ? same_padding(kernel_size, dilation)
                   : std::array<int64_t, 4>{padding.w, padding.w, padding.h, padding.h};
  const bool even = p[0] == p[1] && p[2] == p[3];
  if (even && (padding_mode == "zeros" || (p[0] == 0 && p[2] == 0)))
    return conv2d(x, weight, bias, stride, Size2{p[2], p[0]}, groups, dilation);
  const Tensor padded =
      pad(x, {p[0], p[1], p[2], p[3]}, padding_mode == "zeros" ? "constant" : padding_mode);
  return conv2d(padded, weight, bias, stride, 0, groups, dilation);
}

// ---- ConvTranspose2d ----

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Size2 kernel, Size2 stride_,
                                 Size2 padding_, Size2 output_padding_, int64_t groups_,
                                 bool with_bias, Size2 dilation_)
    : Module(fmt::format(
          "ConvTranspose2d({}, {}, kernel_size={}, stride={}, padding={}{}{}{}{})", in, out,
          size2_str(kernel), size2_str(stride_), size2_str(padding_),
          output_padding_ != Size2(0) ? ", output_padding=" + size2_str(output_padding_) : "",
          groups_ != 1 ? fmt::format(", groups={}", groups_) : "",
          dilation_ != Size2(1) ? ", dilation=" + size2_str(dilation_) : "", bias_note(with_bias))),
      in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_),
      output_padding(output_padding_),
      groups(groups_),
      dilation(dilation_) {
  check_conv_layer("ConvTranspose2d", name(), in, out, groups_,
                   {kernel.h, kernel.w, stride_.h, stride_.w, dilation_.h, dilation_.w},
                   {padding_.h, padding_.w});
  DUET_CHECK_VALUE(layer_params::output_padding_fits(output_padding_.h, stride_.h, dilation_.h) &&
                       layer_params::output_padding_fits(output_padding_.w, stride_.w, dilation_.w),
                   "[ConvTranspose2d] output_padding must be non-negative and below the stride or "
                   "the dilation, got {}",
                   name());
  weight = register_parameter("weight", zeros_param({in, out / groups_, kernel.h, kernel.w}));
  if (with_bias) bias = register_parameter("bias", zeros_param({out}));
  reset_parameters();
}

void ConvTranspose2d::reset_parameters() { default_init(weight, bias); }

Tensor ConvTranspose2d::forward(const Tensor& x) {
  return conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation);
}

// PyTorch's _output_padding: the output padding that gives output_size, where one does.
Tensor ConvTranspose2d::forward(const Tensor& x, Size2 output_size) {
  DUET_CHECK_SHAPE(x.defined() && x.dim() == 4,
                   "[ConvTranspose2d] input must be (N, {}, H, W) for an output size, got {}",
                   in_channels, x.defined() ? x.sizes() : Shape{});
  const std::string size = fmt::format("{}x{}", output_size.h, output_size.w);
  auto extra = [&](int64_t in, int64_t want, int64_t k, int64_t s, int64_t p, int64_t d,
                   const char* dim) {
    return layer_params::output_padding_for("ConvTranspose2d", size, x, in, want, k, s, p, d, dim);
  };
  const Size2 op{
      extra(x.size(2), output_size.h, kernel_size.h, stride.h, padding.h, dilation.h, "height"),
      extra(x.size(3), output_size.w, kernel_size.w, stride.w, padding.w, dilation.w, "width")};
  return conv_transpose2d(x, weight, bias, stride, padding, op, groups, dilation);
}

// ---- Conv1d ----

// Note [Conv1d]
// A 1-D convolution is conv1d, which is conv2d over a height of 1 (Note [Sequences as images] in
// core/ops/window1d.cpp): so it runs on the convolution kernels (oneDNN's on the CPU) and
// exports as ONNX's Conv. The module's errors name the module: its forward is an op of its own.
Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
               bool with_bias, int64_t groups_, int64_t dilation_, std::string padding_mode_)
    : Conv1d(in, out, kernel, stride_, padding_, with_bias, groups_, dilation_,
             std::move(padding_mode_), false) {}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, SamePadding,
               bool with_bias, int64_t groups_, int64_t dilation_, std::string padding_mode_)
    : Conv1d(in, out, kernel, stride_, 0, with_bias, groups_, dilation_, std::move(padding_mode_),
             true) {}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, int64_t stride_, int64_t padding_,
               bool with_bias, int64_t groups_, int64_t dilation_, std::string padding_mode_,
               bool same)
    : Module(fmt::format("Conv1d({}, {}, kernel_size={}, stride={}, padding={}{}{}{}{})", in, out,
                         kernel, stride_, same ? std::string("same") : std::to_string(padding_),
                         dilation_ != 1 ? fmt::format(", dilation={}", dilation_) : "",
                         groups_ != 1 ? fmt::format(", groups={}", groups_) : "",
                         bias_note(with_bias),
                         padding_mode_ != "zeros" ? ", padding_mode='" + padding_mode_ + "'" : "")),
      in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_),
      groups(groups_),
      dilation(dilation_),
      padding_mode(std::move(padding_mode_)),
      padding_same(same) {
  DUET_CHECK_VALUE(!same || stride_ == 1, "[Conv1d] padding \"same\" needs stride 1, got {}",
                   stride_);
  layer_params::check_padding_mode("Conv1d", padding_mode);
  check_conv_layer("Conv1d", name(), in, out, groups_, {kernel, stride_, dilation_}, {padding_});
  weight = register_parameter("weight", zeros_param({out, in / groups_, kernel}));
  if (with_bias) bias = register_parameter("bias", zeros_param({out}));
  reset_parameters();
}

void Conv1d::reset_parameters() { default_init(weight, bias); }

// A padding_mode other than zeros pads x first (pad(), in that mode), as Conv2d's.
Tensor Conv1d::forward(const Tensor& input) {
  return duet::detail::as_op("Conv1d", [&] {
    DUET_CHECK_VALUE(input.defined(), "[Conv1d] the input is an undefined tensor");
    DUET_CHECK_SHAPE((input.dim() == 3 || input.dim() == 2) &&
                         duet::detail::size_is(input, input.dim() - 2, in_channels, "Conv1d"),
                     "[Conv1d] input must be (N, {}, L) or unbatched ({}, L), got {}", in_channels,
                     in_channels, input.sizes());
    if (padding_mode == "zeros")
      return padding_same ? conv1d(input, weight, bias, 1, kSame, groups, dilation)
                          : conv1d(input, weight, bias, stride, padding, groups, dilation);
    const std::array<int64_t, 4> same = same_padding({1, kernel_size}, {1, dilation});
    const Tensor padded = pad(
        input, {padding_same ? same[0] : padding, padding_same ? same[1] : padding}, padding_mode);
    return conv1d(padded, weight, bias, stride, 0, groups, dilation);
  });
}

// ---- Pooling ----

namespace {
// A stride of 0 along a dim is the kernel's there.
Size2 pool_stride(Size2 kernel, Size2 stride) {
  return {stride.h ? stride.h : kernel.h, stride.w ? stride.w : kernel.w};
}
void check_pool(const char* module, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation) {
  DUET_CHECK_VALUE(kernel.h > 0 && kernel.w > 0 && stride.h >= 0 && stride.w >= 0 &&
                       padding.h >= 0 && padding.w >= 0 && dilation.h > 0 && dilation.w > 0,
                   "[{}] kernel_size and dilation must be positive, stride (0: the kernel size) "
                   "and padding non-negative, got kernel_size {}, stride {}, padding {} and "
                   "dilation {}",
                   module, size2_str(kernel), size2_str(stride), size2_str(padding),
                   size2_str(dilation));
}
void check_pool1d(const char* module, const std::string& name, int64_t kernel, int64_t stride,
                  int64_t padding, int64_t dilation) {
  DUET_CHECK_VALUE(kernel > 0 && stride >= 0 && padding >= 0 && dilation > 0,
                   "[{}] kernel_size and dilation must be positive, stride (0: the kernel size) "
                   "and padding non-negative, got {}",
                   module, name);
}
}  // namespace

MaxPool2d::MaxPool2d(Size2 kernel, Size2 stride_, Size2 padding_, Size2 dilation_, bool ceil)
    : Module(fmt::format("MaxPool2d(kernel_size={}, stride={}{}{}{})", size2_str(kernel),
                         size2_str(pool_stride(kernel, stride_)),
                         padding_ != Size2(0) ? ", padding=" + size2_str(padding_) : "",
                         dilation_ != Size2(1) ? ", dilation=" + size2_str(dilation_) : "",
                         ceil ? ", ceil_mode=True" : "")),
      kernel_size(kernel),
      stride(pool_stride(kernel, stride_)),
      padding(padding_),
      dilation(dilation_),
      ceil_mode(ceil) {
  check_pool("MaxPool2d", kernel, stride_, padding_, dilation_);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

AvgPool2d::AvgPool2d(Size2 kernel, Size2 stride_, Size2 padding_, bool ceil, bool count_pad,
                     int64_t divisor)
    : Module(fmt::format("AvgPool2d(kernel_size={}, stride={}{}{}{}{})", size2_str(kernel),
                         size2_str(pool_stride(kernel, stride_)),
                         padding_ != Size2(0) ? ", padding=" + size2_str(padding_) : "",
                         ceil ? ", ceil_mode=True" : "",
                         count_pad ? "" : ", count_include_pad=False",
                         divisor ? fmt::format(", divisor_override={}", divisor) : "")),
      kernel_size(kernel),
      stride(pool_stride(kernel, stride_)),
      padding(padding_),
      ceil_mode(ceil),
      count_include_pad(count_pad),
      divisor_override(divisor) {
  check_pool("AvgPool2d", kernel, stride_, padding_, 1);
  DUET_CHECK_VALUE(divisor >= 0, "[AvgPool2d] divisor_override must be positive (0: none), got {}",
                   divisor);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                    divisor_override);
}

// The 1-D poolings: their 2-D checks along L (a height of 1).
MaxPool1d::MaxPool1d(int64_t kernel, int64_t stride_, int64_t padding_, int64_t dilation_,
                     bool ceil)
    : Module(fmt::format("MaxPool1d(kernel_size={}, stride={}{}{}{})", kernel,
                         stride_ ? stride_ : kernel,
                         padding_ ? fmt::format(", padding={}", padding_) : "",
                         dilation_ != 1 ? fmt::format(", dilation={}", dilation_) : "",
                         ceil ? ", ceil_mode=True" : "")),
      kernel_size(kernel),
      stride(stride_ ? stride_ : kernel),
      padding(padding_),
      dilation(dilation_),
      ceil_mode(ceil) {
  check_pool1d("MaxPool1d", name(), kernel, stride_, padding_, dilation_);
}

Tensor MaxPool1d::forward(const Tensor& x) {
  return max_pool1d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

AvgPool1d::AvgPool1d(int64_t kernel, int64_t stride_, int64_t padding_, bool ceil, bool count_pad)
    : Module(fmt::format(
          "AvgPool1d(kernel_size={}, stride={}{}{}{})", kernel, stride_ ? stride_ : kernel,
          padding_ ? fmt::format(", padding={}", padding_) : "", ceil ? ", ceil_mode=True" : "",
          count_pad ? "" : ", count_include_pad=False")),
      kernel_size(kernel),
      stride(stride_ ? stride_ : kernel),
      padding(padding_),
      ceil_mode(ceil),
      count_include_pad(count_pad) {
  check_pool1d("AvgPool1d", name(), kernel, stride_, padding_, 1);
}

Tensor AvgPool1d::forward(const Tensor& x) {
  return avg_pool1d(x, kernel_size, stride, padding, ceil_mode, count_include_pad);
}

namespace {
// An adaptive pooling's output size, checked positive.
Size2 adaptive_size(const char* module, Size2 output) {
  DUET_CHECK_VALUE(output.h > 0 && output.w > 0, "[{}] output_size must be positive, got {}",
                   module, size2_str(output));
  return output;
}
}  // namespace

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output)
    : Module(fmt::format("AdaptiveAvgPool2d(output_size={})", size2_str(output))),
      output_size(adaptive_size("AdaptiveAvgPool2d", output)) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }

AdaptiveMaxPool2d::AdaptiveMaxPool2d(Size2 output)
    : Module(fmt::format("AdaptiveMaxPool2d(output_size={})", size2_str(output))),
      output_size(adaptive_size("AdaptiveMaxPool2d", output)) {}

Tensor AdaptiveMaxPool2d::forward(const Tensor& x) { return adaptive_max_pool2d(x, output_size); }

AdaptiveAvgPool1d::AdaptiveAvgPool1d(int64_t output)
    : Module(fmt::format("AdaptiveAvgPool1d(output_size={})", output)),
      output_size(adaptive_size("AdaptiveAvgPool1d", Size2{1, output}).w) {}

Tensor AdaptiveAvgPool1d::forward(const Tensor& x) { return adaptive_avg_pool1d(x, output_size); }

AdaptiveMaxPool1d::AdaptiveMaxPool1d(int64_t output)
    : Module(fmt::format("AdaptiveMaxPool1d(output_size={})", output)),
      output_size(adaptive_size("AdaptiveMaxPool1d", Size2{1, output}).w) {}

Tensor AdaptiveMaxPool1d::forward(const Tensor& x) { return adaptive_max_pool1d(x, output_size); }

// ---- Upsample ----

namespace {
void check_upsample_mode(const std::string& mode, bool align) {
  const bool interpolating =
      mode == "linear" || mode == "bilinear" || mode == "bicubic" || mode == "trilinear";
  DUET_CHECK_VALUE(interpolating || mode == "nearest" || mode == "nearest-exact" || mode == "area",
                   "[Upsample] mode must be \"nearest\", \"nearest-exact\", \"linear\", "
                   "\"bilinear\", \"bicubic\", \"trilinear\" or \"area\", got \"{}\"",
                   mode);
  DUET_CHECK_VALUE(!align || interpolating,
                   "[Upsample] align_corners is for modes \"linear\", \"bilinear\", \"bicubic\" "
                   "and \"trilinear\", not \"{}\"",
                   mode);
}
}  // namespace

Upsample::Upsample(double scale, std::string mode_, bool align)
    : Module(fmt::format("Upsample(scale_factor={}, mode='{}'{})", scale, mode_,
                         align ? ", align_corners=True" : "")),
      scale_factor(scale),
      mode(std::move(mode_)),
      align_corners(align) {
  DUET_CHECK_VALUE(std::isfinite(scale) && scale > 0,
                   "[Upsample] scale_factor must be positive and finite, got {}", scale);
  check_upsample_mode(mode, align);
}

Upsample::Upsample(Size2 size_, std::string mode_, bool align)
    : Module(fmt::format("Upsample(size={}, mode='{}'{})", size2_str(size_), mode_,
                         align ? ", align_corners=True" : "")),
      size(size_),
      mode(std::move(mode_)),
      align_corners(align) {
  DUET_CHECK_VALUE(size_.h > 0 && size_.w > 0, "[Upsample] size must be positive, got {}",
                   size2_str(size_));
  check_upsample_mode(mode, align);
}

Upsample::Upsample(Size3 size_, std::string mode_, bool align)
    : Module(fmt::format("Upsample(size=({}, {}, {}), mode='{}'{})", size_.d, size_.h, size_.w,
                         mode_, align ? ", align_corners=True" : "")),
      volume_size(size_),
      mode(std::move(mode_)),
      align_corners(align) {
  DUET_CHECK_VALUE(size_.d > 0 && size_.h > 0 && size_.w > 0,
                   "[Upsample] size must be positive, got ({}, {}, {})", size_.d, size_.h, size_.w);
  check_upsample_mode(mode, align);
}

Tensor Upsample::forward(const Tensor& x) {
  if (scale_factor > 0) return upsample(x, scale_factor, mode, align_corners);
  return volume_size.d > 0 ? interpolate(x, volume_size, mode, align_corners)
                           : interpolate(x, size, mode, align_corners);
}

// ---- Embedding ----

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad)
    : Module(fmt::format("Embedding({}, {}{})", num, dim,
                         pad ? fmt::format(", padding_idx={}", *pad < 0 ? *pad + num : *pad) : "")),
      num_embeddings(num),
      embedding_dim(dim) {
  DUET_CHECK_VALUE(num > 0 && dim > 0,
                   "[Embedding] num_embeddings and embedding_dim must be positive, got "
                   "Embedding({}, {})",
                   num, dim);
  DUET_CHECK_VALUE(!pad || (*pad >= -num && *pad < num),
                   "[Embedding] padding_idx {} is out of range for {} embeddings", pad.value_or(0),
                   num);
  if (pad) padding_idx = *pad < 0 ? *pad + num : *pad;  // PyTorch's, counted from the start
  weight = register_parameter("weight", init::normal_(zeros_param({num, dim})));
  if (padding_idx) init::zeros_(weight[*padding_idx]);
}

Tensor Embedding::forward(const Tensor& indices) {
  return padding_idx ? embedding(weight, indices, *padding_idx) : embedding(weight, indices);
}

EmbeddingBag::EmbeddingBag(int64_t num, int64_t dim, std::string m, bool last,
                           std::optional<int64_t> pad)
    : Module(fmt::format("EmbeddingBag({}, {}, mode='{}'{})", num, dim, m,
                         pad ? fmt::format(", padding_idx={}", *pad < 0 ? *pad + num : *pad) : "")),
      num_embeddings(num),
      embedding_dim(dim),
      mode(std::move(m)),
      include_last_offset(last) {
  DUET_CHECK_VALUE(num > 0 && dim > 0,
                   "[EmbeddingBag] num_embeddings and embedding_dim must be positive, got "
                   "EmbeddingBag({}, {})",
                   num, dim);
  DUET_CHECK_VALUE(mode == "sum" || mode == "mean" || mode == "max",
                   "[EmbeddingBag] mode must be \"sum\", \"mean\" or \"max\", got \"{}\"", mode);
  DUET_CHECK_VALUE(!pad || (*pad >= -num && *pad < num),
                   "[EmbeddingBag] padding_idx {} is out of range for {} embeddings",
                   pad.value_or(0), num);
  if (pad) padding_idx = *pad < 0 ? *pad + num : *pad;
  weight = register_parameter("weight", init::normal_(zeros_param({num, dim})));
  if (padding_idx) init::zeros_(weight[*padding_idx]);
}

Tensor EmbeddingBag::forward(const Tensor& input) { return forward(input, Tensor(), Tensor()); }
Tensor EmbeddingBag::forward(const Tensor& input, const Tensor& offsets,
                             const Tensor& per_sample_weights) {
  return embedding_bag(input, weight, offsets, mode, per_sample_weights, include_last_offset,
                       padding_idx);
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine, bool with_bias)
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
    if (with_bias) bias = register_parameter("bias", zeros(shape));
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
  return duet::detail::as_op("Flatten", [&] { return flatten(x, start_dim, end_dim); });
}

// ---- Activations ----

Tensor Identity::forward(const Tensor& x) { return x; }
Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
GELU::GELU(std::string approximate_)
    : Module(approximate_ == "none" ? std::string("GELU()")
                                    : fmt::format("GELU(approximate='{}')", approximate_)),
      approximate(std::move(approximate_)) {
  DUET_CHECK_VALUE(approximate == "none" || approximate == "tanh",
                   "[GELU] approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
}
Tensor GELU::forward(const Tensor& x) {
  return approximate == "none" ? gelu(x) : gelu(x, approximate);
}
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Softplus::Softplus(double beta_, double threshold_)
    : Module(fmt::format("Softplus(beta={}, threshold={})", beta_, threshold_)),
      beta(beta_),
      threshold(threshold_) {}
Tensor Softplus::forward(const Tensor& x) { return softplus(x, beta, threshold); }

// ---- MultiheadAttention ----

MultiheadAttention::MultiheadAttention(int64_t e, int64_t heads, bool with_bias, double p)
    : Module(fmt::format("MultiheadAttention(embed_dim={}, num_heads={}{}{})", e, heads,
                         p != 0 ? fmt::format(", dropout={}", p) : "", bias_note(with_bias))),
      embed_dim(e),
      num_heads(heads),
      head_dim(heads > 0 ? e / heads : 0),
      dropout(p),
      out_proj(std::max<int64_t>(e, 1), std::max<int64_t>(e, 1), with_bias) {
  DUET_CHECK_VALUE(e > 0 && heads > 0 && e % heads == 0,
                   "[MultiheadAttention] embed_dim and num_heads must be positive and num_heads "
                   "must divide embed_dim, got {}",
                   name());
  DUET_CHECK_VALUE(p >= 0 && p <= 1, "[MultiheadAttention] dropout must be in [0, 1], got {}", p);
  in_proj_weight = register_parameter("in_proj_weight", zeros_param({3 * e, e}));
  if (with_bias) in_proj_bias = register_parameter("in_proj_bias", zeros_param({3 * e}));
  out_proj = register_module("out_proj", out_proj);
  reset_parameters();
}

// As torch.nn.MultiheadAttention._reset_parameters: xavier_uniform_ on the stacked projections,
// zero biases; out_proj keeps Linear's weight initialization with its bias zeroed.
void MultiheadAttention::reset_parameters() {
  init::xavier_uniform_(in_proj_weight);
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj.bias.defined()) init::zeros_(out_proj.bias);
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  return attend(x, x, x, {}, false, {}, false).first;
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& attn_mask, bool is_causal,
                                   const Tensor& key_padding_mask) {
  return attend(query, key, value, attn_mask, is_causal, key_padding_mask, false).first;
}

std::pair<Tensor, Tensor> MultiheadAttention::forward_with_weights(
    const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask,
    bool is_causal, const Tensor& key_padding_mask) {
  return attend(query, key, value, attn_mask, is_causal, key_padding_mask, true);
}

// Note [Attention masks]
// torch.nn.MultiheadAttention's masks: a b8 attn_mask or key_padding_mask is true where
// attending is not allowed, a floating one is added to the scores. scaled_dot_product_attention
// takes a b8 mask true where attending is allowed, or a floating one, broadcast to (N, H, L, S):
// a b8 mask is flipped, a key padding mask (N, S) becomes (N, 1, 1, S), and two masks become one:
// both b8, the keys allowed by both; otherwise each as floats (a b8 one 0 where allowed, -inf
// where not) added, as PyTorch merges them. A row with no allowed key is NaN, as PyTorch's.
namespace {
Tensor as_float_mask(const Tensor& allowed_or_added, DType dtype) {
  if (allowed_or_added.dtype() != DType::b8) return allowed_or_added;
  return where(allowed_or_added, zeros_like(allowed_or_added, Options().dtype(dtype)),
               -std::numeric_limits<double>::infinity());
}
}  // namespace

// The query, key and value projections are three products with row blocks of in_proj_weight
// (views), not one product split afterwards: the gradient of a block is then the block's own
// (E, E) product, where splitting a (N, L, 3E) result would send three zero-padded copies of it
// back through the split.
std::pair<Tensor, Tensor> MultiheadAttention::attend(const Tensor& query, const Tensor& key,
                                                     const Tensor& value, const Tensor& attn_mask,
                                                     bool is_causal, const Tensor& key_padding_mask,
                                                     bool weights) {
  const char* op = "MultiheadAttention";
  for (const Tensor* t : {&query, &key, &value})
    DUET_CHECK_SHAPE(t->dim() == 3 && duet::detail::size_is(*t, 2, embed_dim, op),
                     "[{}] query, key and value must be (N, L, {}) (batch_first), got {}, {} and "
                     "{}",
                     op, embed_dim, query.sizes(), key.sizes(), value.sizes());
  DUET_CHECK_VALUE(!(is_causal && attn_mask.defined()),
                   "[{}] is_causal cannot be combined with an attn_mask (mask {})", op,
                   attn_mask.sizes());
  const SymDims qd = duet::detail::sym_dims(query), kd = duet::detail::sym_dims(key);
  const SymInt n = qd[0], l = qd[1], s = kd[1];
  auto project = [&](const Tensor& x, int64_t block, const SymInt& len) {
    const int64_t e = embed_dim;
    Tensor w = slice(in_proj_weight, 0, block * e, (block + 1) * e);
    Tensor b =
        in_proj_bias.defined() ? slice(in_proj_bias, 0, block * e, (block + 1) * e) : Tensor();
    // (N, len, E) -> (N, len, H, D) -> (N, H, len, D), a view.
    return transpose(duet::detail::reshape_dims(linear(x, w, b), {n, len, num_heads, head_dim}), 1,
                     2);
  };
  Tensor q = project(query, 0, l), k = project(key, 1, s), v = project(value, 2, s);

  Tensor mask = attn_mask;
  if (mask.defined()) {
    DUET_CHECK_DTYPE(mask.dtype() == DType::b8 || mask.dtype() == query.dtype(),
                     "[{}] attn_mask must be b8 or the query's dtype {}, got {} of shape {}", op,
                     query.dtype(), mask.dtype(), mask.sizes());
    DUET_CHECK_SHAPE(mask.dim() == 2 || mask.dim() == 3,
                     "[{}] attn_mask must be (L, S) or (N * num_heads, L, S), got {}", op,
                     mask.sizes());
    if (mask.dim() == 3) mask = duet::detail::reshape_dims(mask, {n, num_heads, l, s});
    // (Note [Attention masks])
    if (mask.dtype() == DType::b8) mask = eq(mask, 0);
  }
  if (key_padding_mask.defined()) {
    const Tensor& kpm = key_padding_mask;
    DUET_CHECK_DTYPE(kpm.dtype() == DType::b8 || kpm.dtype() == query.dtype(),
                     "[{}] key_padding_mask must be b8 or the query's dtype {}, got {}", op,
                     query.dtype(), kpm.dtype());
    DUET_CHECK_SHAPE(kpm.dim() == 2 && duet::detail::size_is(kpm, 0, n, op) &&
                         duet::detail::size_is(kpm, 1, s, op),
                     "[{}] key_padding_mask must be (N, S) = {}, got {}", op,
                     duet::detail::dims_str({n, s}), kpm.sizes());
    // With is_causal, the causal mask (key j <= query i, from the top left, as the fused path's)
    // joins the keys' instead (PyTorch's is_causal with both masks given).
    if (is_causal) {
      const Options io = Options().dtype(DType::i64).device(query.device());
      mask = ge(unsqueeze(duet::detail::arange_dims(l, io), 1),
                unsqueeze(duet::detail::arange_dims(s, io), 0));
      is_causal = false;
    }
    Tensor keys = duet::detail::reshape_dims(kpm.dtype() == DType::b8 ? eq(kpm, 0) : kpm,
                                             {n, SymInt(1), SymInt(1), s});
    if (!mask.defined())
      mask = keys;
    else if (mask.dtype() == DType::b8 && keys.dtype() == DType::b8)
      mask = where(mask, keys, false);
    else
      mask = as_float_mask(mask, query.dtype()) + as_float_mask(keys, query.dtype());
  }
  Tensor out;
  Tensor avg;
  const bool drop = is_training() && dropout > 0;
  if (!weights && !drop) {
    out = scaled_dot_product_attention(q, k, v, mask, is_causal);
  } else {  // (the fused kernel keeps no weights to drop)
    Tensor p = duet::detail::attention_weights(op, q, k, mask, is_causal, 0);
    if (drop) p = duet::dropout(p, dropout, true);
    out = matmul(p, v);
    if (weights) avg = mean(p, {1});
  }
  // (N, H, L, D) -> (N, L, H, D) -> (N, L, E).
  out = duet::detail::reshape_dims(transpose(out, 1, 2), {n, l, embed_dim});
  return {out_proj(out), avg};
}

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

// ---- ModuleList, ModuleDict ----

namespace duet::nn {

void ModuleList::extend(const ModuleList& other) {
  const size_t n = other.size();  // other may be this list
  for (size_t i = 0; i < n; ++i) push_back(other.ptr(i));
}

const std::shared_ptr<Module>& ModuleList::ptr(size_t i) const {
  DUET_CHECK_VALUE(i < size(), "[ModuleList] index {} is out of range for {} modules", i, size());
  return child_ptr(i);
}

ModuleDict::ModuleDict(const std::vector<Item>& items) : ModuleDict() {
  for (const auto& [key, module] : items) insert(key, module);
}

std::shared_ptr<Module> ModuleDict::operator[](const std::string& key) const {
  std::shared_ptr<Module> m = child_named(key);
  if (!m) {
    std::string known;
    for (const std::string& k : keys()) known += (known.empty() ? "'" : ", '") + k + "'";
    DUET_CHECK_VALUE(false, "[ModuleDict] no module under key '{}' (keys: {})", key,
                     known.empty() ? std::string("none") : known);
  }
  return m;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, module] : named_children()) out.push_back(key);
  return out;
}

}  // namespace duet::nn
