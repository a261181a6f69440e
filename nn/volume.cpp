// duet: the 3-D layers (nn/volume.h). Each forward is one op of core/ops/volume.cpp; the
// constructors check their arguments in the module's words, as the 2-D layers' do.
#include "nn/volume.h"

#include "core/op_errors.h"
#include "core/op_table.h"
#include "core/ops.h"
#include "nn/layer_params.h"

namespace duet::nn {

using layer_params::bias_note;

namespace {

// A Size3 as the module's name shows it: one int where the three dims agree.
std::string size3_str(Size3 s) {
  return s.d == s.h && s.h == s.w ? fmt::format("{}", s.d)
                                  : fmt::format("({}, {}, {})", s.d, s.h, s.w);
}
bool positive(Size3 s) { return s.d > 0 && s.h > 0 && s.w > 0; }
bool non_negative(Size3 s) { return s.d >= 0 && s.h >= 0 && s.w >= 0; }
// A stride of 0 along a dim is the kernel's there.
Size3 pool_stride(Size3 kernel, Size3 stride) {
  return {stride.d ? stride.d : kernel.d, stride.h ? stride.h : kernel.h,
          stride.w ? stride.w : kernel.w};
}
void check_pool(const char* module, const std::string& name, Size3 kernel, Size3 stride,
                Size3 padding, Size3 dilation) {
  DUET_CHECK_VALUE(
      positive(kernel) && non_negative(stride) && non_negative(padding) && positive(dilation),
      "[{}] kernel_size and dilation must be positive, stride (0: the kernel size) "
      "and padding non-negative, got {}",
      module, name);
}
// A 3-D convolution layer's checks (layer_params::check_conv_layer) on its Size3s.
void check_window_layer(const char* module, const std::string& name, int64_t in, int64_t out,
                        int64_t groups, Size3 k, Size3 s, Size3 p, Size3 d) {
  layer_params::check_conv_layer(module, name, in, out, groups,
                                 {k.d, k.h, k.w, s.d, s.h, s.w, d.d, d.h, d.w}, {p.d, p.h, p.w});
}
Size3 adaptive_size(const char* module, Size3 output) {
  DUET_CHECK_VALUE(positive(output), "[{}] output_size must be positive, got {}", module,
                   size3_str(output));
  return output;
}

}  // namespace

// ---- Conv3d ----

Conv3d::Conv3d(int64_t in, int64_t out, Size3 kernel, Size3 stride_, Size3 padding_, bool with_bias,
               int64_t groups_, Size3 dilation_, std::string padding_mode_)
    : Conv3d(in, out, kernel, stride_, padding_, with_bias, groups_, dilation_,
             std::move(padding_mode_), false) {}

Conv3d::Conv3d(int64_t in, int64_t out, Size3 kernel, Size3 stride_, SamePadding, bool with_bias,
               int64_t groups_, Size3 dilation_, std::string padding_mode_)
    : Conv3d(in, out, kernel, stride_, 0, with_bias, groups_, dilation_, std::move(padding_mode_),
             true) {}

Conv3d::Conv3d(int64_t in, int64_t out, Size3 kernel, Size3 stride_, Size3 padding_, bool with_bias,
               int64_t groups_, Size3 dilation_, std::string padding_mode_, bool same)
    : Module(fmt::format(
          "Conv3d({}, {}, kernel_size={}, stride={}, padding={}{}{}{}{})", in, out,
          size3_str(kernel), size3_str(stride_), same ? std::string("same") : size3_str(padding_),
          dilation_ != Size3(1) ? ", dilation=" + size3_str(dilation_) : "",
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
  DUET_CHECK_VALUE(!same || stride_ == Size3(1), "[Conv3d] padding \"same\" needs stride 1, got {}",
                   size3_str(stride_));
  layer_params::check_padding_mode("Conv3d", padding_mode);
  check_window_layer("Conv3d", name(), in, out, groups_, kernel, stride_, padding_, dilation_);
  weight = register_parameter(
      "weight", layer_params::zeros_param({out, in / groups_, kernel.d, kernel.h, kernel.w}));
  if (with_bias) bias = register_parameter("bias", layer_params::zeros_param({out}));
  reset_parameters();
}

void Conv3d::reset_parameters() { layer_params::default_init(weight, bias); }

// A padding_mode other than zeros pads x first (pad(), in that mode), and convolves unpadded,
// as PyTorch's Conv3d.
Tensor Conv3d::forward(const Tensor& input) {
  return duet::detail::as_op("Conv3d", [&] {
    DUET_CHECK_VALUE(input.defined(), "[Conv3d] the input is an undefined tensor");
    DUET_CHECK_SHAPE((input.dim() == 5 || input.dim() == 4) &&
                         duet::detail::size_is(input, input.dim() - 4, in_channels, "Conv3d"),
                     "[Conv3d] input must be (N, {}, D, H, W) or unbatched ({}, D, H, W), got {}",
                     in_channels, in_channels, input.sizes());
    if (padding_mode == "zeros")
      return padding_same ? conv3d(input, weight, bias, 1, kSame, groups, dilation)
                          : conv3d(input, weight, bias, stride, padding, groups, dilation);
    // The pads {left, right} of W, H, then D: "same"'s d (k - 1), half before.
    const int64_t k[3] = {kernel_size.w, kernel_size.h, kernel_size.d},
                  dil[3] = {dilation.w, dilation.h, dilation.d},
                  p[3] = {padding.w, padding.h, padding.d};
    std::vector<int64_t> pads;
    for (int i = 0; i < 3; ++i) {
      const int64_t t = dil[i] * (k[i] - 1);
      pads.push_back(padding_same ? t / 2 : p[i]);
      pads.push_back(padding_same ? t - t / 2 : p[i]);
    }
    return conv3d(pad(input, pads, padding_mode), weight, bias, stride, 0, groups, dilation);
  });
}

// ---- ConvTranspose3d ----

ConvTranspose3d::ConvTranspose3d(int64_t in, int64_t out, Size3 kernel, Size3 stride_,
                                 Size3 padding_, Size3 output_padding_, int64_t groups_,
                                 bool with_bias, Size3 dilation_)
    : Module(fmt::format(
          "ConvTranspose3d({}, {}, kernel_size={}, stride={}, padding={}{}{}{}{})", in, out,
          size3_str(kernel), size3_str(stride_), size3_str(padding_),
          output_padding_ != Size3(0) ? ", output_padding=" + size3_str(output_padding_) : "",
          groups_ != 1 ? fmt::format(", groups={}", groups_) : "",
          dilation_ != Size3(1) ? ", dilation=" + size3_str(dilation_) : "", bias_note(with_bias))),
      in_channels(in),
      out_channels(out),
      kernel_size(kernel),
      stride(stride_),
      padding(padding_),
      output_padding(output_padding_),
      groups(groups_),
      dilation(dilation_) {
  check_window_layer("ConvTranspose3d", name(), in, out, groups_, kernel, stride_, padding_,
                     dilation_);
  const Size3 op = output_padding_;
  using layer_params::output_padding_fits;
  DUET_CHECK_VALUE(output_padding_fits(op.d, stride_.d, dilation_.d) &&
                       output_padding_fits(op.h, stride_.h, dilation_.h) &&
                       output_padding_fits(op.w, stride_.w, dilation_.w),
                   "[ConvTranspose3d] output_padding must be non-negative and below the stride or "
                   "the dilation, got {}",
                   name());
  weight = register_parameter(
      "weight", layer_params::zeros_param({in, out / groups_, kernel.d, kernel.h, kernel.w}));
  if (with_bias) bias = register_parameter("bias", layer_params::zeros_param({out}));
  reset_parameters();
}

void ConvTranspose3d::reset_parameters() { layer_params::default_init(weight, bias); }

Tensor ConvTranspose3d::forward(const Tensor& x) {
  return conv_transpose3d(x, weight, bias, stride, padding, output_padding, groups, dilation);
}

// PyTorch's _output_padding: the output padding that gives output_size, where one does.
Tensor ConvTranspose3d::forward(const Tensor& x, Size3 output_size) {
  DUET_CHECK_SHAPE(x.defined() && (x.dim() == 5 || x.dim() == 4),
                   "[ConvTranspose3d] input must be (N, {}, D, H, W) or unbatched ({}, D, H, W) "
                   "for an output size, got {}",
                   in_channels, in_channels, x.defined() ? x.sizes() : Shape{});
  const int64_t first = x.dim() - 3;
  const std::string size = size3_str(output_size);
  auto extra = [&](int64_t in, int64_t want, int64_t k, int64_t s, int64_t p, int64_t d,
                   const char* dim) {
    return layer_params::output_padding_for("ConvTranspose3d", size, x, in, want, k, s, p, d, dim);
  };
  const Size3 op{
      extra(x.size(first), output_size.d, kernel_size.d, stride.d, padding.d, dilation.d, "depth"),
      extra(x.size(first + 1), output_size.h, kernel_size.h, stride.h, padding.h, dilation.h,
            "height"),
      extra(x.size(first + 2), output_size.w, kernel_size.w, stride.w, padding.w, dilation.w,
            "width")};
  return conv_transpose3d(x, weight, bias, stride, padding, op, groups, dilation);
}

// ---- Pooling ----

MaxPool3d::MaxPool3d(Size3 kernel, Size3 stride_, Size3 padding_, Size3 dilation_, bool ceil)
    : Module(fmt::format("MaxPool3d(kernel_size={}, stride={}{}{}{})", size3_str(kernel),
                         size3_str(pool_stride(kernel, stride_)),
                         padding_ != Size3(0) ? ", padding=" + size3_str(padding_) : "",
                         dilation_ != Size3(1) ? ", dilation=" + size3_str(dilation_) : "",
                         ceil ? ", ceil_mode=True" : "")),
      kernel_size(kernel),
      stride(pool_stride(kernel, stride_)),
      padding(padding_),
      dilation(dilation_),
      ceil_mode(ceil) {
  check_pool("MaxPool3d", name(), kernel, stride_, padding_, dilation_);
}

Tensor MaxPool3d::forward(const Tensor& x) {
  return max_pool3d(x, kernel_size, stride, padding, dilation, ceil_mode);
}

AvgPool3d::AvgPool3d(Size3 kernel, Size3 stride_, Size3 padding_, bool ceil, bool count_pad,
                     int64_t divisor)
    : Module(fmt::format("AvgPool3d(kernel_size={}, stride={}{}{}{}{})", size3_str(kernel),
                         size3_str(pool_stride(kernel, stride_)),
                         padding_ != Size3(0) ? ", padding=" + size3_str(padding_) : "",
                         ceil ? ", ceil_mode=True" : "",
                         count_pad ? "" : ", count_include_pad=False",
                         divisor ? fmt::format(", divisor_override={}", divisor) : "")),
      kernel_size(kernel),
      stride(pool_stride(kernel, stride_)),
      padding(padding_),
      ceil_mode(ceil),
      count_include_pad(count_pad),
      divisor_override(divisor) {
  check_pool("AvgPool3d", name(), kernel, stride_, padding_, 1);
  DUET_CHECK_VALUE(divisor >= 0, "[AvgPool3d] divisor_override must be positive (0: none), got {}",
                   divisor);
}

Tensor AvgPool3d::forward(const Tensor& x) {
  return avg_pool3d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                    divisor_override);
}

AdaptiveAvgPool3d::AdaptiveAvgPool3d(Size3 output)
    : Module(fmt::format("AdaptiveAvgPool3d(output_size={})", size3_str(output))),
      output_size(adaptive_size("AdaptiveAvgPool3d", output)) {}

Tensor AdaptiveAvgPool3d::forward(const Tensor& x) { return adaptive_avg_pool3d(x, output_size); }

AdaptiveMaxPool3d::AdaptiveMaxPool3d(Size3 output)
    : Module(fmt::format("AdaptiveMaxPool3d(output_size={})", size3_str(output))),
      output_size(adaptive_size("AdaptiveMaxPool3d", output)) {}

Tensor AdaptiveMaxPool3d::forward(const Tensor& x) { return adaptive_max_pool3d(x, output_size); }

}  // namespace duet::nn
