// The 3-D window ops over volumes (N, C, D, H, W), or unbatched (C, D, H, W), as PyTorch's
// conv3d, conv_transpose3d, max_pool3d, avg_pool3d and the adaptive poolings: each composed of
// its 2-D op over the (H, W) planes and a window along D (Note [Volumes as planes], Note
// [Transposed volumes]).
#include <string>

#include "core/op_errors.h"
#include "core/ops.h"

namespace duet {
namespace {

// Note [Volumes as planes]
// A 3-D window is a 2-D window over the (H, W) planes and a 1-D window along D, and each op is
// composed that way, so that it runs on the 2-D kernels (oneDNN's convolutions on the CPU), is
// differentiated, traced, batched and fused as they are, and needs no primitive of its own:
//  - conv3d gathers the depth window into the channels: tap k of the kd taps is the strided
//    slice of the (zero-padded along D) input that output depth i reads at i sd + k dd, and the
//    kd slices stacked after the channel dim, (N, C, kd, Do, H, W), are the images (N Do,
//    C kd, H, W) whose channel c kd + k the weight (O, C / g, kd, kh, kw), read as (O, C / g kd,
//    kh, kw), multiplies: one conv2d (its groups line up, as group j's channels stay
//    consecutive), at the cost of kd copies of the input (a whole im2col of the volume would
//    make kd kh kw).
//  - max and mean pool a box, which is separable: the planes are pooled first (every depth at
//    once, as (N, C D, H, W)), then each (h, w) column along D (as (N, C Ho Wo, 1, D), a 2-D
//    pool over a height of 1). The max of maxes is the box's, and its gradient goes to the
//    first maximum in (d, h, w) order, PyTorch's. A mean's divisor is the product of the
//    window's extents along each dim (clipped to the padded input, count_include_pad, or to the
//    input), so the mean of the planes' means is the box's; a divisor_override sums both stages
//    and divides once.
//  - adaptive pooling's cells are boxes too: the adaptive 2-D pool of the planes, then along D.
// The arguments are checked here, in the 3-D words of the call, before the 2-D ops see them.

// "3", or "3x1x2" where the dims differ (a message's size).
std::string str3(Size3 v) {
  return v.d == v.h && v.h == v.w ? fmt::format("{}", v.d) : fmt::format("{}x{}x{}", v.d, v.h, v.w);
}

// x as (N, C, D, H, W) (an unbatched (C, D, H, W) gets a batch of one).
Tensor as_volume(const char* op, const Tensor& x) {
  DUET_CHECK_VALUE(x.defined(), "[{}] the input is an undefined tensor", op);
  DUET_CHECK_SHAPE(x.dim() == 5 || x.dim() == 4,
                   "[{}] input must be (N, C, D, H, W) or unbatched (C, D, H, W), got {}", op,
                   x.sizes());
  return x.dim() == 5 ? x : unsqueeze(x, 0);
}

// The 5-D result y in x's layout.
Tensor from_volume(const Tensor& y, const Tensor& x) { return x.dim() == 5 ? y : squeeze(y, 0); }

// A window of kernel k, stride s (for a pooling, 0: the kernel's), padding p and dilation d
// along each of the volume v's last three dims: positive sizes, a pooling's padding at most half
// its kernel, and the dilated kernel within the padded size.
void check_window3(const char* op, const Tensor& v, Size3 k, Size3 s, Size3 p, Size3 d, bool pool) {
  const int64_t ks[3] = {k.d, k.h, k.w}, ss[3] = {s.d, s.h, s.w}, ps[3] = {p.d, p.h, p.w},
                ds[3] = {d.d, d.h, d.w};
  int64_t reach[3] = {}, padded[3] = {};
  for (int i = 0; i < 3; ++i) {
    DUET_CHECK_VALUE(ks[i] > 0 && (ss[i] > 0 || (pool && ss[i] == 0)) && ps[i] >= 0 && ds[i] > 0,
                     "[{}] kernel_size {}, stride {}{} and dilation {} must be positive and "
                     "padding {} non-negative",
                     op, str3(k), str3(s), pool ? " (0: the kernel size)" : "", str3(d), str3(p));
    DUET_CHECK_VALUE(!pool || ps[i] <= ks[i] / 2,
                     "[{}] padding {} must be at most half the kernel_size {}", op, str3(p),
                     str3(k));
    const bool fits = !__builtin_mul_overflow(ds[i], ks[i] - 1, &reach[i]) &&
                      !__builtin_mul_overflow(ps[i], 2, &padded[i]) &&
                      !__builtin_add_overflow(padded[i], v.size(2 + i), &padded[i]);
    DUET_CHECK_VALUE(fits, "[{}] kernel_size {} dilated by {} or padding {} overflows int64", op,
                     str3(k), str3(d), str3(p));
  }
  for (int i = 0; i < 3; ++i)
    DUET_CHECK_SHAPE(reach[i] < padded[i],
                     "[{}] kernel_size {}{} is larger than the padded input {} of {}", op, str3(k),
                     d == Size3(1) ? std::string() : " dilated by " + str3(d),
                     str3(Size3{padded[0], padded[1], padded[2]}), v.sizes());
}

bool positive3(Size3 s) { return s.d > 0 && s.h > 0 && s.w > 0; }
bool non_negative3(Size3 s) { return s.d >= 0 && s.h >= 0 && s.w >= 0; }

// A stride of 0 along a dim is the kernel's there.
Size3 pool_stride3(Size3 k, Size3 s) { return {s.d ? s.d : k.d, s.h ? s.h : k.h, s.w ? s.w : k.w}; }

// The volume v's (H, W) planes through the 2-D op f (every depth as an image of its own).
template <class Planes>
Tensor over_planes(const Tensor& v, Planes f) {
  const SymDims s = detail::sym_dims(v);
  const Tensor y = f(detail::reshape_dims(v, {s[0], s[1] * s[2], s[3], s[4]}));
  return detail::reshape_dims(y, {s[0], s[1], s[2], detail::sym_dim(y, 2), detail::sym_dim(y, 3)});
}

// The volume v along D through the 2-D op f over a height of 1 (each (h, w) column a row of
// its own), back in (N, C, D', H, W) order, contiguous.
template <class Column>
Tensor along_depth(const Tensor& v, Column f) {
  const SymDims s = detail::sym_dims(v);
  const Tensor rows = detail::reshape_dims(permute(v, {0, 1, 3, 4, 2}),
                                           {s[0], s[1] * s[3] * s[4], SymInt(1), s[2]});
  const Tensor y = f(rows);
  const Tensor back = detail::reshape_dims(y, {s[0], s[1], s[3], s[4], detail::sym_dim(y, 3)});
  return permute(back, {0, 1, 4, 2, 3}).contiguous();
}

// conv3d's weight (O, C / groups, kd, kh, kw) and bias (O) against x's channels and dtype.
void check_conv3d(const Tensor& v, const Tensor& w, const Tensor& b, int64_t groups) {
  DUET_CHECK_VALUE(w.defined(), "[conv3d] the weight is an undefined tensor");
  DUET_CHECK_SHAPE(w.dim() == 5, "[conv3d] weight must be (out, in / groups, kd, kh, kw), got {}",
                   w.sizes());
  DUET_CHECK_VALUE(groups >= 1, "[conv3d] groups must be positive, got {}", groups);
  const std::string in_groups = groups == 1 ? "" : fmt::format(" in {} groups", groups);
  DUET_CHECK_SHAPE(v.size(1) == w.size(1) * groups,
                   "[conv3d] input has {} channels but the weight {}{} expects {}", v.size(1),
                   w.sizes(), in_groups, w.size(1) * groups);
  DUET_CHECK_SHAPE(w.size(0) % groups == 0,
                   "[conv3d] the weight {} has {} filters, which {} groups do not divide",
                   w.sizes(), w.size(0), groups);
  DUET_CHECK_DTYPE(v.dtype() == w.dtype(), "[conv3d] input ({}) and weight ({}) must share a dtype",
                   v.dtype(), w.dtype());
  DUET_CHECK_SHAPE(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)),
                   "[conv3d] bias must be ({}), got {}", w.size(0), b.sizes());
}

}  // namespace

Tensor conv3d(const Tensor& x, const Tensor& w, const Tensor& b, Size3 stride, Size3 padding,
              int64_t groups, Size3 dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv3d", [&]() -> Tensor {
    const Tensor v = as_volume("conv3d", x);
    check_conv3d(v, w, b, groups);
    const int64_t kd = w.size(2);
    check_window3("conv3d", v, Size3{kd, w.size(3), w.size(4)}, stride, padding, dilation, false);
    // The depth taps stacked after the channels (Note [Volumes as planes]).
    const Tensor padded = padding.d ? pad(v, {0, 0, 0, 0, padding.d, padding.d}) : v;
    const int64_t depth = v.size(2) + 2 * padding.d;
    const int64_t dout = (depth - dilation.d * (kd - 1) - 1) / stride.d + 1;
    std::vector<Tensor> taps;
    for (int64_t k = 0; k < kd; ++k) {
      const int64_t first = k * dilation.d;
      taps.push_back(slice(padded, 2, first, first + stride.d * (dout - 1) + 1, stride.d));
    }
    const SymDims s = detail::sym_dims(v);
    const Tensor images =
        detail::reshape_dims(permute(stack(taps, 2), {0, 3, 1, 2, 4, 5}),
                             {s[0] * SymInt(dout), s[1] * SymInt(kd), s[3], s[4]});
    const Tensor filters = reshape(w, {w.size(0), w.size(1) * kd, w.size(3), w.size(4)});
    const Tensor y = conv2d(images, filters, b, Size2{stride.h, stride.w},
                            Size2{padding.h, padding.w}, groups, Size2{dilation.h, dilation.w});
    const Tensor vol = detail::reshape_dims(
        y, {s[0], SymInt(dout), SymInt(w.size(0)), detail::sym_dim(y, 2), detail::sym_dim(y, 3)});
    return from_volume(permute(vol, {0, 2, 1, 3, 4}).contiguous(), x);
  });
}

// padding "same": conv3d's own padding where the halves agree, else x zero-padded first.
Tensor conv3d(const Tensor& x, const Tensor& w, const Tensor& b, Size3 stride, SamePadding,
              int64_t groups, Size3 dilation, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv3d", [&]() -> Tensor {
    DUET_CHECK_VALUE(stride == Size3(1), "[conv3d] padding \"same\" needs stride 1, got {}",
                     str3(stride));
    DUET_CHECK_SHAPE(w.defined() && w.dim() == 5,
                     "[conv3d] weight must be (out, in / groups, kd, kh, kw), got {}",
                     w.defined() ? w.sizes().str() : std::string("an undefined tensor"));
    DUET_CHECK_VALUE(dilation.d > 0 && dilation.h > 0 && dilation.w > 0,
                     "[conv3d] dilation {} must be positive", str3(dilation));
    const int64_t t[3] = {dilation.d * (w.size(2) - 1), dilation.h * (w.size(3) - 1),
                          dilation.w * (w.size(4) - 1)};
    if (t[0] % 2 == 0 && t[1] % 2 == 0 && t[2] % 2 == 0)
      return conv3d(x, w, b, 1, Size3{t[0] / 2, t[1] / 2, t[2] / 2}, groups, dilation);
    const Tensor v = as_volume("conv3d", x);
    const Tensor padded =
        pad(v, {t[2] / 2, t[2] - t[2] / 2, t[1] / 2, t[1] - t[1] / 2, t[0] / 2, t[0] - t[0] / 2});
    return from_volume(conv3d(padded, w, b, 1, 0, groups, dilation), x);
  });
}

// Note [Transposed volumes]
// conv_transpose3d spreads each voxel through the kernel, as conv_transpose2d does a pixel. Its
// (H, W) part is one conv_transpose2d over every depth's plane at once, with the kd depth taps
// folded into the output channels (the weight (C_in, C_out / g, kd, kh, kw) read as (C_in,
// C_out / g kd, kh, kw): output channel o kd + k, and the groups line up as in conv3d). The taps
// are then laid along D by fold, the adjoint of conv3d's depth gather: tap k of input depth i
// lands at depth i sd + k dd - pd, overlaps summed, what falls in the padding dropped, and the
// output padding (after the last window) left zero.
Tensor conv_transpose3d(const Tensor& x, const Tensor& w, const Tensor& b, Size3 stride,
                        Size3 padding, Size3 output_padding, int64_t groups, Size3 dilation,
                        std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("conv_transpose3d", [&]() -> Tensor {
    const char* op = "conv_transpose3d";
    const Tensor v = as_volume(op, x);
    DUET_CHECK_VALUE(w.defined(), "[{}] the weight is an undefined tensor", op);
    DUET_CHECK_SHAPE(w.dim() == 5, "[{}] weight must be (in, out / groups, kd, kh, kw), got {}", op,
                     w.sizes());
    DUET_CHECK_VALUE(groups >= 1, "[{}] groups must be positive, got {}", op, groups);
    DUET_CHECK_SHAPE(v.size(1) == w.size(0),
                     "[{}] input has {} channels but the weight {} expects {}", op, v.size(1),
                     w.sizes(), w.size(0));
    DUET_CHECK_SHAPE(w.size(0) % groups == 0,
                     "[{}] the weight {} has {} input channels, which {} groups do not divide", op,
                     w.sizes(), w.size(0), groups);
    DUET_CHECK_DTYPE(v.dtype() == w.dtype(), "[{}] input ({}) and weight ({}) must share a dtype",
                     op, v.dtype(), w.dtype());
    const Size3 opad = output_padding;
    DUET_CHECK_VALUE(
        positive3(stride) && positive3(dilation) && non_negative3(padding) && non_negative3(opad),
        "[{}] stride {} and dilation {} must be positive, padding {} and output "
        "padding {} non-negative",
        op, str3(stride), str3(dilation), str3(padding), str3(opad));
    DUET_CHECK_VALUE((opad.d < stride.d || opad.d < dilation.d) &&
                         (opad.h < stride.h || opad.h < dilation.h) &&
                         (opad.w < stride.w || opad.w < dilation.w),
                     "[{}] output padding {} must be below the stride {} or the dilation {}", op,
                     str3(opad), str3(stride), str3(dilation));
    DUET_CHECK_SHAPE(v.size(2) > 0 && v.size(3) > 0 && v.size(4) > 0,
                     "[{}] input {} has an empty volume", op, x.sizes());
    const int64_t kd = w.size(2), depth = v.size(2);
    // The output depth, (D - 1) sd + dd (kd - 1) + 1 - 2 pd + opd.
    int64_t a = 0, c = 0, full = 0, p2 = 0, dout = 0;
    const bool fits =
        !__builtin_mul_overflow(depth - 1, stride.d, &a) &&
        !__builtin_mul_overflow(dilation.d, kd - 1, &c) && !__builtin_add_overflow(a, c, &full) &&
        !__builtin_add_overflow(full, 1 + opad.d, &full) &&
        !__builtin_mul_overflow(padding.d, 2, &p2) && !__builtin_sub_overflow(full, p2, &dout);
    DUET_CHECK_VALUE(fits, "[{}] input {} with kernel depth {}: the output size overflows int64",
                     op, x.sizes(), kd);
    DUET_CHECK_SHAPE(dout > 0,
                     "[{}] input {} with kernel {}, stride {} and padding {} gives an empty "
                     "depth {}",
                     op, x.sizes(), str3(Size3{kd, w.size(3), w.size(4)}), str3(stride),
                     str3(padding), dout);
    const SymDims s = detail::sym_dims(v);
    const Tensor planes =
        detail::reshape_dims(permute(v, {0, 2, 1, 3, 4}), {s[0] * s[2], s[1], s[3], s[4]});
    const Tensor filters = reshape(w, {w.size(0), w.size(1) * kd, w.size(3), w.size(4)});
    const Tensor r = conv_transpose2d(planes, filters, {}, Size2{stride.h, stride.w},
                                      Size2{padding.h, padding.w}, Size2{opad.h, opad.w}, groups,
                                      Size2{dilation.h, dilation.w});
    const int64_t o = w.size(1) * groups, ho = r.size(2), wo = r.size(3);
    // The columns fold reads: (N, C_out Ho Wo kd, D), a row per (channel, pixel, tap).
    Tensor cols = detail::reshape_dims(
        permute(
            detail::reshape_dims(r, {s[0], s[2], SymInt(o), SymInt(kd), SymInt(ho), SymInt(wo)}),
            {0, 2, 4, 5, 3, 1}),
        {s[0], SymInt(o * ho * wo * kd), s[2]});
    // An output padding of a stride or more (below the dilation) adds window positions that no
    // input depth fills.
    const int64_t positions = (dout + 2 * padding.d - c - 1) / stride.d + 1;
    if (positions > depth) cols = pad(cols, {0, positions - depth});
    const Tensor y = fold(cols, 1, dout, Size2{1, kd}, Size2{1, stride.d}, Size2{0, padding.d},
                          Size2{1, dilation.d});
    Tensor vol =
        permute(detail::reshape_dims(y, {s[0], SymInt(o), SymInt(ho), SymInt(wo), SymInt(dout)}),
                {0, 1, 4, 2, 3})
            .contiguous();
    if (b.defined()) {
      DUET_CHECK_SHAPE(b.dim() == 1 && b.size(0) == o, "[{}] bias must be ({}), got {}", op, o,
                       b.sizes());
      vol = vol + reshape(b, {1, o, 1, 1, 1});
    }
    return from_volume(vol, x);
  });
}

Tensor max_pool3d(const Tensor& x, Size3 kernel, Size3 stride, Size3 padding, Size3 dilation,
                  bool ceil_mode, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("max_pool3d", [&]() -> Tensor {
    const Tensor v = as_volume("max_pool3d", x);
    DUET_CHECK_DTYPE(v.dtype() != DType::b8, "[max_pool3d] is not defined for b8 input");
    check_window3("max_pool3d", v, kernel, stride, padding, dilation, true);
    const Size3 s = pool_stride3(kernel, stride);
    const Tensor planes = over_planes(v, [&](const Tensor& t) {
      return max_pool2d(t, Size2{kernel.h, kernel.w}, Size2{s.h, s.w}, Size2{padding.h, padding.w},
                        Size2{dilation.h, dilation.w}, ceil_mode);
    });
    return from_volume(along_depth(planes,
                                   [&](const Tensor& t) {
                                     return max_pool2d(t, Size2{1, kernel.d}, Size2{1, s.d},
                                                       Size2{0, padding.d}, Size2{1, dilation.d},
                                                       ceil_mode);
                                   }),
                       x);
  });
}

Tensor avg_pool3d(const Tensor& x, Size3 kernel, Size3 stride, Size3 padding, bool ceil_mode,
                  bool count_include_pad, int64_t divisor_override, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("avg_pool3d", [&]() -> Tensor {
    const Tensor v = as_volume("avg_pool3d", x);
    DUET_CHECK_DTYPE(is_floating(v.dtype()), "[avg_pool3d] needs a floating input, got {}",
                     v.dtype());
    DUET_CHECK_VALUE(divisor_override >= 0,
                     "[avg_pool3d] divisor_override {} must be positive (0: none)",
                     divisor_override);
    check_window3("avg_pool3d", v, kernel, stride, padding, 1, true);
    const Size3 s = pool_stride3(kernel, stride);
    // Each stage a mean with its own extents' divisor, or (divisor_override) a sum.
    const int64_t stage = divisor_override > 0 ? 1 : 0;
    const Tensor planes = over_planes(v, [&](const Tensor& t) {
      return avg_pool2d(t, Size2{kernel.h, kernel.w}, Size2{s.h, s.w}, Size2{padding.h, padding.w},
                        ceil_mode, count_include_pad, stage);
    });
    const Tensor y = along_depth(planes, [&](const Tensor& t) {
      return avg_pool2d(t, Size2{1, kernel.d}, Size2{1, s.d}, Size2{0, padding.d}, ceil_mode,
                        count_include_pad, stage);
    });
    return from_volume(divisor_override > 0 ? y / Scalar(double(divisor_override)) : y, x);
  });
}

namespace {
// An adaptive pooling to `out` cells along D, H and W: the planes, then along D.
template <class Pool2>
Tensor adaptive3d(const char* op, const Tensor& x, Size3 out, Pool2 pool) {
  const Tensor v = as_volume(op, x);
  DUET_CHECK_VALUE(out.d > 0 && out.h > 0 && out.w > 0, "[{}] output_size {} must be positive", op,
                   str3(out));
  DUET_CHECK_SHAPE(v.size(2) > 0 && v.size(3) > 0 && v.size(4) > 0,
                   "[{}] input {} has an empty volume", op, x.sizes());
  const Tensor planes = over_planes(v, [&](const Tensor& t) {
    return pool(t, Size2{out.h, out.w});
  });
  return from_volume(along_depth(planes,
                                 [&](const Tensor& t) {
                                   return pool(t, Size2{1, out.d});
                                 }),
                     x);
}
}  // namespace

Tensor adaptive_avg_pool3d(const Tensor& x, Size3 output_size, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("adaptive_avg_pool3d", [&]() -> Tensor {
    DUET_CHECK_DTYPE(!x.defined() || is_floating(x.dtype()),
                     "[adaptive_avg_pool3d] needs a floating input, got {}", x.dtype());
    return adaptive3d("adaptive_avg_pool3d", x, output_size,
                      [](const Tensor& t, Size2 o) { return adaptive_avg_pool2d(t, o); });
  });
}

Tensor adaptive_max_pool3d(const Tensor& x, Size3 output_size, std::source_location loc) {
  detail::SiteGuard site(loc);
  return detail::as_op("adaptive_max_pool3d", [&]() -> Tensor {
    DUET_CHECK_DTYPE(!x.defined() || x.dtype() != DType::b8,
                     "[adaptive_max_pool3d] is not defined for b8 input");
    return adaptive3d("adaptive_max_pool3d", x, output_size,
                      [](const Tensor& t, Size2 o) { return adaptive_max_pool2d(t, o); });
  });
}

}  // namespace duet
