// duet: the 3-D layers (torch.nn's Conv3d, ConvTranspose3d and 3-D poolings), over volumes x (N, C,
// D, H, W) or unbatched (C, D, H, W): each forward one op of core/ops/volume.cpp (Note [Volumes as
// planes] there). Sizes are Size3s: one int for all three dims, or {d, h, w}.
#pragma once

#include <string>

#include "nn/module.h"

namespace duet::nn {

/// 3-D convolution over x (N, C, D, H, W) or unbatched (C, D, H, W), as torch.nn.Conv3d: a kernel
/// of kd x kh x kw, stride and padding (the padding zeros or padding_mode's), `groups` groups of
/// channels, the taps `dilation` apart. weight (out, in / groups, kd, kh, kw) and bias (out) start
/// as PyTorch's: U(-1/sqrt(fan_in), ..), fan_in = in / groups * kd * kh * kw.
class Conv3d : public Module {
 public:
  Conv3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Size3 stride = 1,
         Size3 padding = 0, bool bias = true, int64_t groups = 1, Size3 dilation = 1,
         std::string padding_mode = "zeros");
  /// padding kSame: PyTorch's padding="same" (stride 1; an output as large as the input).
  Conv3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Size3 stride,
         SamePadding padding, bool bias = true, int64_t groups = 1, Size3 dilation = 1,
         std::string padding_mode = "zeros");
  Tensor forward(const Tensor& x) override;
  void reset_parameters();

  int64_t in_channels, out_channels;
  Size3 kernel_size, stride, padding;
  int64_t groups = 1;
  Size3 dilation = 1;
  /// "zeros", or "reflect", "replicate" or "circular": x padded by pad() in that mode first.
  std::string padding_mode = "zeros";
  bool padding_same = false;  ///< kSame: padding unused, the pads follow from the kernel
  Tensor weight, bias;        ///< bias is undefined when constructed with bias = false

 private:
  Conv3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Size3 stride, Size3 padding,
         bool bias, int64_t groups, Size3 dilation, std::string padding_mode, bool same);
};

/// 3-D transposed convolution, as torch.nn.ConvTranspose3d (same argument order; no
/// padding_mode): x (N, in, D, H, W) -> (N, out, (D - 1) sd - 2 pd + dd (kd - 1) + opd + 1, ...).
/// weight (in, out / groups, kd, kh, kw) and bias (out) start as PyTorch's: U(-1/sqrt(fan_in), ..),
/// fan_in = out / groups * kd * kh * kw.
class ConvTranspose3d : public Module {
 public:
  ConvTranspose3d(int64_t in_channels, int64_t out_channels, Size3 kernel_size, Size3 stride = 1,
                  Size3 padding = 0, Size3 output_padding = 0, int64_t groups = 1, bool bias = true,
                  Size3 dilation = 1);
  Tensor forward(const Tensor& x) override;
  /// The output (od, oh, ow) rather than the output_padding, as PyTorch's forward(x, output_size):
  /// each between the size of no output padding and that plus stride - 1.
  Tensor forward(const Tensor& x, Size3 output_size);
  void reset_parameters();

  int64_t in_channels, out_channels;
  Size3 kernel_size, stride, padding, output_padding;
  int64_t groups = 1;
  Size3 dilation = 1;
  Tensor weight, bias;  ///< bias is undefined when constructed with bias = false
};

/// The max over kd x kh x kw windows, as torch.nn.MaxPool3d (max_pool3d); a stride of 0 is the
/// kernel size.
class MaxPool3d : public Module {
 public:
  explicit MaxPool3d(Size3 kernel_size, Size3 stride = 0, Size3 padding = 0, Size3 dilation = 1,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  Size3 kernel_size, stride, padding, dilation;  ///< stride as resolved: never 0
  bool ceil_mode;
};

/// The mean over kd x kh x kw windows, as torch.nn.AvgPool3d (avg_pool3d).
class AvgPool3d : public Module {
 public:
  explicit AvgPool3d(Size3 kernel_size, Size3 stride = 0, Size3 padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true, int64_t divisor_override = 0);
  Tensor forward(const Tensor& x) override;
  Size3 kernel_size, stride, padding;  ///< stride as resolved: never 0
  bool ceil_mode, count_include_pad;
  int64_t divisor_override;  ///< above 0: every window's divisor (0: none)
};

/// x averaged into output_size (od, oh, ow) cells, as torch.nn.AdaptiveAvgPool3d
/// (adaptive_avg_pool3d); AdaptiveAvgPool3d(1) is a global average pooling.
class AdaptiveAvgPool3d : public Module {
 public:
  explicit AdaptiveAvgPool3d(Size3 output_size);
  Tensor forward(const Tensor& x) override;
  Size3 output_size;
};

/// The max over AdaptiveAvgPool3d's cells, as torch.nn.AdaptiveMaxPool3d (no indices).
class AdaptiveMaxPool3d : public Module {
 public:
  explicit AdaptiveMaxPool3d(Size3 output_size);
  Tensor forward(const Tensor& x) override;
  Size3 output_size;
};

}  // namespace duet::nn
