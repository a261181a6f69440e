// Rows of Unfold, Fold, Conv2d and its two gradients, and of the composites conv2d (with a bias),
// max_pool2d and avg_pool2d (and their 1-D forms over a height of 1), with direct
// references on plain doubles (see op_rows.h): the convolution and the pooling read the padded
// image window by window, without building columns.
#include <algorithm>
#include <cmath>

#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;

const std::vector<DType> kNumeric = {DType::f32, DType::f64, DType::i32, DType::i64};

// A window (the attributes of core/window.h) on plain ints.
struct Geom {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
  // The image row (column) that tap ki (kj) of window position oh (ow) reads.
  int64_t row(int64_t oh, int64_t ki) const { return oh * sh - ph + ki * dh; }
  int64_t col(int64_t ow, int64_t kj) const { return ow * sw - pw + kj * dw; }
};
Geom geom(const Shape& x, Size2 k, Size2 s, Size2 p, Size2 d = 1) {
  Geom g{x[0], x[1], x[2], x[3], k.h, k.w, s.h, s.w, p.h, p.w, d.h, d.w, 0, 0};
  g.ho = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  return g;
}

// A row's name for a Size2: "3", or "3x1" where the dims differ.
std::string str(Size2 v) {
  return v.h == v.w ? fmt::format("{}", v.h) : fmt::format("{}x{}", v.h, v.w);
}
// " d D" where the window is dilated (a row's name).
std::string dilation_name(Size2 d) { return d == Size2(1) ? "" : " d " + str(d); }

// The zero-padded image: x[n][c][i][j], 0 outside.
double pixel(const std::vector<double>& x, const Geom& g, int64_t n, int64_t c, int64_t i,
             int64_t j) {
  if (i < 0 || i >= g.h || j < 0 || j >= g.w) return 0;
  return x[((n * g.c + c) * g.h + i) * g.w + j];
}

// cols[n][(c, ki, kj)][(oh, ow)] = padded x[n][c][row(oh, ki)][col(ow, kj)].
std::vector<double> ref_unfold(const std::vector<double>& x, const Geom& g) {
  std::vector<double> out;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj)
          for (int64_t oh = 0; oh < g.ho; ++oh)
            for (int64_t ow = 0; ow < g.wo; ++ow)
              out.push_back(pixel(x, g, n, c, g.row(oh, ki), g.col(ow, kj)));
  return out;
}

// Unfold's adjoint: each column entry added into the pixel it reads (entries that read the
// padding dropped).
std::vector<double> ref_fold(const std::vector<double>& cols, const Geom& g) {
  std::vector<double> out(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  size_t at = 0;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj)
          for (int64_t oh = 0; oh < g.ho; ++oh)
            for (int64_t ow = 0; ow < g.wo; ++ow, ++at) {
              const int64_t i = g.row(oh, ki), j = g.col(ow, kj);
              if (i >= 0 && i < g.h && j >= 0 && j < g.w)
                out[static_cast<size_t>(((n * g.c + c) * g.h + i) * g.w + j)] += cols[at];
            }
  return out;
}

// In `groups` groups, filter o reads the input channels of its group only: its weight's
// channel c is input channel first_channel(o) + c, of the cg = C / groups its weight holds.
struct Groups {
  int64_t groups, cg, og;  // the groups, and the input and output channels of each
  int64_t first_channel(int64_t o) const { return o / og * cg; }
};
Groups groups_of(const Geom& g, int64_t o_ch, int64_t groups) {
  return {groups, g.c / groups, std::max<int64_t>(o_ch / groups, 1)};
}

// y[n][o][oh][ow] = b[o] + sum over c, ki, kj of w[o][c][ki][kj] * padded x at the window
// (channel c of o's group).
std::vector<double> ref_conv2d(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* b, const Geom& g, int64_t o_ch,
                               int64_t groups) {
  const Groups q = groups_of(g, o_ch, groups);
  std::vector<double> out;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < o_ch; ++o)
      for (int64_t oh = 0; oh < g.ho; ++oh)
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          double acc = b ? (*b)[o] : 0;
          for (int64_t c = 0; c < q.cg; ++c)
            for (int64_t ki = 0; ki < g.kh; ++ki)
              for (int64_t kj = 0; kj < g.kw; ++kj)
                acc += w[((o * q.cg + c) * g.kh + ki) * g.kw + kj] *
                       pixel(x, g, n, q.first_channel(o) + c, g.row(oh, ki), g.col(ow, kj));
          out.push_back(acc);
        }
  return out;
}

// dx[n][c][i][j] = sum of gy[n][o][oh][ow] * w[o][c][ki][kj] over the windows and taps that
// read pixel (i, j) (over the filters of c's group).
std::vector<double> ref_conv2d_input_grad(const std::vector<double>& gy,
                                          const std::vector<double>& w, const Geom& g, int64_t o_ch,
                                          int64_t groups) {
  const Groups q = groups_of(g, o_ch, groups);
  std::vector<double> out(g.n * g.c * g.h * g.w, 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < o_ch; ++o)
      for (int64_t oh = 0; oh < g.ho; ++oh)
        for (int64_t ow = 0; ow < g.wo; ++ow)
          for (int64_t c = 0; c < q.cg; ++c)
            for (int64_t ki = 0; ki < g.kh; ++ki)
              for (int64_t kj = 0; kj < g.kw; ++kj) {
                const int64_t i = g.row(oh, ki), j = g.col(ow, kj);
                if (i < 0 || i >= g.h || j < 0 || j >= g.w) continue;
                out[((n * g.c + q.first_channel(o) + c) * g.h + i) * g.w + j] +=
                    gy[((n * o_ch + o) * g.ho + oh) * g.wo + ow] *
                    w[((o * q.cg + c) * g.kh + ki) * g.kw + kj];
              }
  return out;
}

// dw[o][c][ki][kj] = sum over n and the windows of gy[n][o][oh][ow] * padded x at the window
// (channel c of o's group).
std::vector<double> ref_conv2d_weight_grad(const std::vector<double>& x,
                                           const std::vector<double>& gy, const Geom& g,
                                           int64_t o_ch, int64_t groups) {
  const Groups q = groups_of(g, o_ch, groups);
  std::vector<double> out;
  for (int64_t o = 0; o < o_ch; ++o)
    for (int64_t c = 0; c < q.cg; ++c)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          double acc = 0;
          for (int64_t n = 0; n < g.n; ++n)
            for (int64_t oh = 0; oh < g.ho; ++oh)
              for (int64_t ow = 0; ow < g.wo; ++ow)
                acc += gy[((n * o_ch + o) * g.ho + oh) * g.wo + ow] *
                       pixel(x, g, n, q.first_channel(o) + c, g.row(oh, ki), g.col(ow, kj));
          out.push_back(acc);
        }
  return out;
}

// PyTorch's pooling, element by element: window positions ho x wo (ceil_mode's included), the
// padding never the max, avg's divisor the window clipped to the padded input (count_pad) or to
// the input.
struct PoolSpec {
  bool is_max = true, ceil_mode = false, count_pad = true;
  int64_t divisor = 0;  // avg's divisor_override (0: none)
};
int64_t pool_positions(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = d * (k - 1) + 1, room = n + 2 * p - span;
  int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
  if (ceil_mode && (out - 1) * s >= n + p) --out;
  return out;
}
std::vector<double> ref_pool(PoolSpec q, const std::vector<double>& x, const Geom& g) {
  std::vector<double> out;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t oh = 0; oh < g.ho; ++oh)
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          double acc = q.is_max ? -INFINITY : 0;
          for (int64_t ki = 0; ki < g.kh; ++ki)
            for (int64_t kj = 0; kj < g.kw; ++kj) {
              const int64_t i = g.row(oh, ki), j = g.col(ow, kj);
              if (i < 0 || i >= g.h || j < 0 || j >= g.w) continue;
              const double v = x[((n * g.c + c) * g.h + i) * g.w + j];
              acc = q.is_max ? std::max(acc, v) : acc + v;
            }
          if (!q.is_max && q.divisor) {
            acc /= double(q.divisor);
          } else if (!q.is_max) {
            const int64_t i0 = oh * g.sh - g.ph, j0 = ow * g.sw - g.pw;
            const int64_t i1 = std::min(i0 + g.kh, g.h + g.ph),
                          j1 = std::min(j0 + g.kw, g.w + g.pw);
            const int64_t count = q.count_pad ? (i1 - i0) * (j1 - j0)
                                              : (std::min(i1, g.h) - std::max<int64_t>(i0, 0)) *
                                                    (std::min(j1, g.w) - std::max<int64_t>(j0, 0));
            acc /= double(count);
          }
          out.push_back(acc);
        }
  return out;
}

// Adaptive pooling: cell (i, j) reads rows [i h / oh, ceil((i + 1) h / oh)), and so the columns.
std::vector<double> ref_adaptive(bool is_max, const std::vector<double>& x, const Shape& xs,
                                 Size2 o) {
  const int64_t h = xs[2], w = xs[3];
  std::vector<double> out;
  for (int64_t nc = 0; nc < xs[0] * xs[1]; ++nc)
    for (int64_t i = 0; i < o.h; ++i)
      for (int64_t j = 0; j < o.w; ++j) {
        const int64_t i0 = i * h / o.h, i1 = ((i + 1) * h + o.h - 1) / o.h;
        const int64_t j0 = j * w / o.w, j1 = ((j + 1) * w + o.w - 1) / o.w;
        double acc = is_max ? -INFINITY : 0;
        for (int64_t r = i0; r < i1; ++r)
          for (int64_t c = j0; c < j1; ++c) {
            const double v = x[(nc * h + r) * w + c];
            acc = is_max ? std::max(acc, v) : acc + v;
          }
        out.push_back(is_max ? acc : acc / double((i1 - i0) * (j1 - j0)));
      }
  return out;
}

// F.interpolate, directly: output pixel (i, j) of each plane from the source rows and columns
// PyTorch's kernels compute (nearest: floor of i * in / out in float; bilinear: the four
// neighbours of ((i + 0.5) in / out - 0.5, ...) clamped at 0, or i (in - 1) / (out - 1) with
// align_corners). `scale`: the scale factor given, or 0 for a size.
struct Resample {
  std::string mode;
  bool align;
  double scale;
};
std::vector<double> ref_resample(const Resample& q, const std::vector<double>& x, const Shape& xs,
                                 Size2 o) {
  auto nearest = [&](int64_t i, int64_t in, int64_t out) {
    const float s = q.scale > 0 ? static_cast<float>(1 / q.scale) : float(in) / float(out);
    const double src = q.mode == "nearest" ? std::floor(float(i) * s)
                                           : std::floor(float((double(i) + 0.5) * double(s)));
    return std::min(static_cast<int64_t>(src), in - 1);
  };
  const bool cubic = q.mode == "bicubic";
  auto source = [&](int64_t i, int64_t in, int64_t out) {
    if (q.align) return out > 1 ? double(i) * double(in - 1) / double(out - 1) : 0.0;
    const double s = q.scale > 0 ? 1 / q.scale : double(in) / double(out);
    const double src = (double(i) + 0.5) * s - 0.5;
    return cubic ? src : std::max(src, 0.0);  // (bicubic's is not clamped at 0)
  };
  // Keys' cubic convolution (a = -0.75) of the distance between a source coordinate and a row.
  auto keys = [](double d) {
    const double a = -0.75, t = std::abs(d);
    return t <= 1 ? (a + 2) * t * t * t - (a + 3) * t * t + 1
                  : a * t * t * t - 5 * a * t * t + 8 * a * t - 4 * a;
  };
  const int64_t h = xs[2], w = xs[3];
  if (q.mode == "area") return ref_adaptive(false, x, xs, o);
  std::vector<double> out;
  for (int64_t p = 0; p < xs[0] * xs[1]; ++p)
    for (int64_t i = 0; i < o.h; ++i)
      for (int64_t j = 0; j < o.w; ++j) {
        const double* plane = x.data() + p * h * w;
        if (cubic) {  // the 4 x 4 rows and columns around the source, clamped into the image
          const double sh = source(i, h, o.h), sw = source(j, w, o.w);
          const auto fh = static_cast<int64_t>(std::floor(sh)),
                     fw = static_cast<int64_t>(std::floor(sw));
          double acc = 0;
          for (int64_t a = fh - 1; a <= fh + 2; ++a)
            for (int64_t b = fw - 1; b <= fw + 2; ++b)
              acc += keys(sh - double(a)) * keys(sw - double(b)) *
                     plane[std::clamp<int64_t>(a, 0, h - 1) * w + std::clamp<int64_t>(b, 0, w - 1)];
          out.push_back(acc);
          continue;
        }
        if (q.mode != "bilinear") {
          out.push_back(plane[nearest(i, h, o.h) * w + nearest(j, w, o.w)]);
          continue;
        }
        const double sh = source(i, h, o.h), sw = source(j, w, o.w);
        const auto h0 = static_cast<int64_t>(sh), w0 = static_cast<int64_t>(sw);
        const int64_t h1 = std::min(h0 + 1, h - 1), w1 = std::min(w0 + 1, w - 1);
        const double lh = sh - double(h0), lw = sw - double(w0);
        out.push_back((1 - lh) * ((1 - lw) * plane[h0 * w + w0] + lw * plane[h0 * w + w1]) +
                      lh * ((1 - lw) * plane[h1 * w + w0] + lw * plane[h1 * w + w1]));
      }
  return out;
}

// interpolate to a size (scale 0), or upsample by a scale factor.
OpRow resample_row(Resample q, Shape xs, Size2 size) {
  const Size2 o = q.scale > 0 ? Size2{static_cast<int64_t>(std::floor(double(xs[2]) * q.scale)),
                                      static_cast<int64_t>(std::floor(double(xs[3]) * q.scale))}
                              : size;
  OpRow r{q.scale > 0 ? fmt::format("upsample {} {} by {}{}", q.mode, xs.str(), q.scale,
                                    q.align ? " align_corners" : "")
                      : fmt::format("interpolate {} {} to {}{}", q.mode, xs.str(), str(o),
                                    q.align ? " align_corners" : ""),
          q.mode != "area"                       ? OpId::Gather
          : xs[2] % o.h == 0 && xs[3] % o.w == 0 ? OpId::Unfold
                                                 : OpId::Cat,
          true,
          {xs},
          [=](const Ins& in) {
            return q.scale > 0 ? upsample(in[0], q.scale, q.mode, q.align)
                               : interpolate(in[0], o, q.mode, q.align);
          },
          [=](const Values& v) { return ref_resample(q, v[0], xs, o); },
          {xs[0], xs[1], o.h, o.w}};
  if (q.mode == "nearest" || q.mode == "nearest-exact") r.dtypes = kNumeric;
  if (q.mode == "bicubic") r.tol32 = 1e-4;  // 16 products, weights rounded to f32
  return r;
}
Resample resize(std::string mode, bool align = false) { return {std::move(mode), align, 0}; }
Resample scaled(std::string mode, double scale, bool align = false) {
  return {std::move(mode), align, scale};
}

OpRow unfold_row(Shape xs, Size2 k, Size2 s, Size2 p, Size2 d = 1) {
  const Geom g = geom(xs, k, s, p, d);
  OpRow r{
      fmt::format("unfold {} k {} s {} p {}{}", xs.str(), str(k), str(s), str(p), dilation_name(d)),
      OpId::Unfold,
      false,
      {xs},
      [=](const Ins& in) { return unfold(in[0], k, s, p, d); },
      [=](const Values& v) { return ref_unfold(v[0], g); },
      {g.n, g.c * g.kh * g.kw, g.ho * g.wo}};
  r.dtypes = kNumeric;
  return r;
}

OpRow fold_row(Shape image, Size2 k, Size2 s, Size2 p, Size2 d = 1) {
  const Geom g = geom(image, k, s, p, d);
  OpRow r{fmt::format("fold to {} k {} s {} p {}{}", image.str(), str(k), str(s), str(p),
                      dilation_name(d)),
          OpId::Fold,
          false,
          {{g.n, g.c * g.kh * g.kw, g.ho * g.wo}},
          [=](const Ins& in) { return fold(in[0], g.h, g.w, k, s, p, d); },
          [=](const Values& v) { return ref_fold(v[0], g); },
          image};
  r.dtypes = kNumeric;
  return r;
}

// " groups G" where there are several (a row's name).
std::string groups_name(int64_t groups) {
  return groups == 1 ? "" : fmt::format(" groups {}", groups);
}

OpRow conv_row(Shape xs, Shape ws, bool bias, Size2 s, Size2 p, int64_t groups = 1, Size2 d = 1) {
  const Geom g = geom(xs, {ws[2], ws[3]}, s, p, d);
  const int64_t o = ws[0];
  std::vector<Shape> shapes = {xs, ws};
  if (bias) shapes.push_back({o});
  OpRow r{
      fmt::format("conv2d x {} w {}{} s {} p {}{}{}", xs.str(), ws.str(), bias ? " bias" : "",
                  str(s), str(p), groups_name(groups), dilation_name(d)),
      OpId::Conv2d,
      bias,  // with a bias: Conv2d and a broadcast add
      shapes,
      [=](const Ins& in) { return conv2d(in[0], in[1], bias ? in[2] : Tensor(), s, p, groups, d); },
      [=](const Values& v) { return ref_conv2d(v[0], v[1], bias ? &v[2] : nullptr, g, o, groups); },
      {g.n, o, g.ho, g.wo}};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.tol32 = 1e-4;
  return r;
}

// conv_transpose2d, directly from PyTorch's definition: input pixel (ih, iw) of channel c adds
// x * w[c][o][ki][kj] to output pixel (ih sh - ph + ki dh, iw sw - pw + kj dw) of channel
// o + (c's group) * (C_out / groups), where that lies inside the (ho, wo) output.
struct Transposed {
  Shape xs, ws;
  Size2 s, p, op, d;
  int64_t groups;
  int64_t out_h() const { return (xs[2] - 1) * s.h - 2 * p.h + d.h * (ws[2] - 1) + op.h + 1; }
  int64_t out_w() const { return (xs[3] - 1) * s.w - 2 * p.w + d.w * (ws[3] - 1) + op.w + 1; }
};
std::vector<double> ref_conv_transpose(const Transposed& t, const std::vector<double>& x,
                                       const std::vector<double>& w, const std::vector<double>* b) {
  const int64_t n_ = t.xs[0], c_ = t.xs[1], h = t.xs[2], wd = t.xs[3];
  const int64_t og = t.ws[1], kh = t.ws[2], kw = t.ws[3], cg = c_ / t.groups;
  const int64_t oc = og * t.groups, ho = t.out_h(), wo = t.out_w();
  std::vector<double> out(static_cast<size_t>(n_ * oc * ho * wo), 0.0);
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t c = 0; c < c_; ++c)
      for (int64_t o = 0; o < og; ++o)
        for (int64_t ih = 0; ih < h; ++ih)
          for (int64_t iw = 0; iw < wd; ++iw)
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t i = ih * t.s.h - t.p.h + ki * t.d.h;
                const int64_t j = iw * t.s.w - t.p.w + kj * t.d.w;
                if (i < 0 || i >= ho || j < 0 || j >= wo) continue;
                const int64_t oo = c / cg * og + o;
                out[static_cast<size_t>(((n * oc + oo) * ho + i) * wo + j)] +=
                    x[((n * c_ + c) * h + ih) * wd + iw] * w[((c * og + o) * kh + ki) * kw + kj];
              }
  if (b)
    for (size_t e = 0; e < out.size(); ++e)
      out[e] += (*b)[static_cast<size_t>(int64_t(e) / (ho * wo) % oc)];
  return out;
}

OpRow transposed_row(Transposed t, bool bias) {
  std::vector<Shape> shapes = {t.xs, t.ws};
  const int64_t oc = t.ws[1] * t.groups;
  if (bias) shapes.push_back({oc});
  OpRow r{
      fmt::format("conv_transpose2d x {} w {}{} s {} p {}{}{}{}", t.xs.str(), t.ws.str(),
                  bias ? " bias" : "", str(t.s), str(t.p),
                  t.op == Size2(0) ? "" : " output padding " + str(t.op), groups_name(t.groups),
                  dilation_name(t.d)),
      OpId::Conv2dInputGrad,
      true,
      shapes,
      [=](const Ins& in) {
        return conv_transpose2d(in[0], in[1], bias ? in[2] : Tensor(), t.s, t.p, t.op, t.groups,
                                t.d);
      },
      [=](const Values& v) { return ref_conv_transpose(t, v[0], v[1], bias ? &v[2] : nullptr); },
      {t.xs[0], oc, t.out_h(), t.out_w()}};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.tol32 = 1e-4;
  return r;
}

// conv2d_input_grad: the gradient of conv2d's input x (xs) for an output gradient.
OpRow input_grad_row(Shape xs, Shape ws, Size2 s, Size2 p, int64_t groups = 1, Size2 d = 1) {
  const Geom g = geom(xs, {ws[2], ws[3]}, s, p, d);
  const int64_t o = ws[0];
  OpRow r{fmt::format("conv2d_input_grad x {} w {} s {} p {}{}{}", xs.str(), ws.str(), str(s),
                      str(p), groups_name(groups), dilation_name(d)),
          OpId::Conv2dInputGrad,
          false,
          {{g.n, o, g.ho, g.wo}, ws},
          [=](const Ins& in) { return conv2d_input_grad(in[0], in[1], g.h, g.w, s, p, groups, d); },
          [=](const Values& v) { return ref_conv2d_input_grad(v[0], v[1], g, o, groups); },
          xs};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.tol32 = 1e-4;
  return r;
}

// conv2d_weight_grad: the gradient of conv2d's weight (ws) for an output gradient.
OpRow weight_grad_row(Shape xs, Shape ws, Size2 s, Size2 p, int64_t groups = 1, Size2 d = 1) {
  const Size2 k{ws[2], ws[3]};
  const Geom g = geom(xs, k, s, p, d);
  const int64_t o = ws[0];
  OpRow r{fmt::format("conv2d_weight_grad x {} w {} s {} p {}{}{}", xs.str(), ws.str(), str(s),
                      str(p), groups_name(groups), dilation_name(d)),
          OpId::Conv2dWeightGrad,
          false,
          {xs, {g.n, o, g.ho, g.wo}},
          [=](const Ins& in) { return conv2d_weight_grad(in[0], in[1], k, s, p, groups, d); },
          [=](const Values& v) { return ref_conv2d_weight_grad(v[0], v[1], g, o, groups); },
          ws};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.tol32 = 1e-4;
  return r;
}

// stride 0: the kernel size, as the builders default.
OpRow pool_row(PoolSpec q, Shape xs, Size2 k, Size2 s0, Size2 p = 0, Size2 d = 1) {
  const Size2 s{s0.h ? s0.h : k.h, s0.w ? s0.w : k.w};
  Geom g = geom(xs, k, s, p, d);
  g.ho = pool_positions(g.h, g.kh, g.sh, g.ph, g.dh, q.ceil_mode);
  g.wo = pool_positions(g.w, g.kw, g.sw, g.pw, g.dw, q.ceil_mode);
  OpRow r{fmt::format("{} {} k {} s {}{}{}{}{}{}", q.is_max ? "max_pool2d" : "avg_pool2d", xs.str(),
                      str(k), str(s0), p == Size2(0) ? "" : " p " + str(p), dilation_name(d),
                      q.ceil_mode ? " ceil" : "", q.count_pad ? "" : " without the padding",
                      q.divisor ? fmt::format(" divisor {}", q.divisor) : ""),
          OpId::Unfold,
          true,
          {xs},
          [=](const Ins& in) {
            return q.is_max ? max_pool2d(in[0], k, s0, p, d, q.ceil_mode)
                            : avg_pool2d(in[0], k, s0, p, q.ceil_mode, q.count_pad, q.divisor);
          },
          [=](const Values& v) { return ref_pool(q, v[0], g); },
          {g.n, g.c, g.ho, g.wo}};
  if (q.is_max) r.dtypes = kNumeric;
  return r;
}
OpRow pool_row(bool is_max, Shape xs, Size2 k, Size2 s) {
  return pool_row(PoolSpec{is_max}, xs, k, s);
}
PoolSpec max_ceil() { return {true, true, true}; }
PoolSpec avg(bool ceil_mode, bool count_pad) { return {false, ceil_mode, count_pad}; }

// Adaptive pooling into o cells: one pooling where o divides the image (Unfold), slices and their
// reductions joined (Cat) where it does not.
OpRow adaptive_row(bool is_max, Shape xs, Size2 o) {
  const bool even = xs[2] % o.h == 0 && xs[3] % o.w == 0;
  OpRow r{fmt::format("adaptive_{}_pool2d {} to {}", is_max ? "max" : "avg", xs.str(), str(o)),
          even ? OpId::Unfold : OpId::Cat,
          true,
          {xs},
          [=](const Ins& in) {
            return is_max ? adaptive_max_pool2d(in[0], o) : adaptive_avg_pool2d(in[0], o);
          },
          [=](const Values& v) { return ref_adaptive(is_max, v[0], xs, o); },
          {xs[0], xs[1], o.h, o.w}};
  if (is_max) r.dtypes = kNumeric;
  return r;
}

// ---- 1-D: the 2-D references over a height of 1 (Note [Sequences as images] in
// core/ops/window1d.cpp); x (N, C, L), or unbatched (C, L) ----

Shape as_image(const Shape& xs) {
  return xs.size() == 3 ? Shape{xs[0], xs[1], 1, xs[2]} : Shape{1, xs[0], 1, xs[1]};
}
// (N, C', L') or unbatched (C', L').
Shape seq_out(const Shape& xs, int64_t c, int64_t l) {
  return xs.size() == 3 ? Shape{xs[0], c, l} : Shape{c, l};
}

OpRow conv1d_row(Shape xs, Shape ws, bool bias, int64_t s, int64_t p, int64_t groups = 1,
                 int64_t d = 1) {
  const Geom g = geom(as_image(xs), {1, ws[2]}, {1, s}, {0, p}, {1, d});
  const int64_t o = ws[0];
  std::vector<Shape> shapes = {xs, ws};
  if (bias) shapes.push_back({o});
  OpRow r{
      fmt::format("conv1d x {} w {}{} s {} p {}{}{}", xs.str(), ws.str(), bias ? " bias" : "", s, p,
                  groups_name(groups), dilation_name(d)),
      OpId::Conv2d,
      true,
      shapes,
      [=](const Ins& in) { return conv1d(in[0], in[1], bias ? in[2] : Tensor(), s, p, groups, d); },
      [=](const Values& v) {  // w (O, C / groups, k) holds the values of (.., 1, k)
        return ref_conv2d(v[0], v[1], bias ? &v[2] : nullptr, g, o, groups);
      },
      seq_out(xs, o, g.wo)};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.tol32 = 1e-4;
  return r;
}

OpRow pool1d_row(PoolSpec q, Shape xs, int64_t k, int64_t s0, int64_t p = 0, int64_t d = 1) {
  const int64_t s = s0 ? s0 : k;
  Geom g = geom(as_image(xs), {1, k}, {1, s}, {0, p}, {1, d});
  g.wo = pool_positions(g.w, g.kw, g.sw, g.pw, g.dw, q.ceil_mode);
  OpRow r{fmt::format("{} {} k {} s {}{}{}{}{}", q.is_max ? "max_pool1d" : "avg_pool1d", xs.str(),
                      k, s0, p ? fmt::format(" p {}", p) : "", dilation_name(d),
                      q.ceil_mode ? " ceil" : "", q.count_pad ? "" : " without the padding"),
          OpId::Unfold,
          true,
          {xs},
          [=](const Ins& in) {
            return q.is_max ? max_pool1d(in[0], k, s0, p, d, q.ceil_mode)
                            : avg_pool1d(in[0], k, s0, p, q.ceil_mode, q.count_pad);
          },
          [=](const Values& v) { return ref_pool(q, v[0], g); },
          seq_out(xs, g.c, g.wo)};
  if (q.is_max) r.dtypes = kNumeric;
  return r;
}

OpRow adaptive1d_row(bool is_max, Shape xs, int64_t o) {
  const Shape xi = as_image(xs);
  OpRow r{fmt::format("adaptive_{}_pool1d {} to {}", is_max ? "max" : "avg", xs.str(), o),
          xi[3] % o == 0 ? OpId::Unfold : OpId::Cat,
          true,
          {xs},
          [=](const Ins& in) {
            return is_max ? adaptive_max_pool1d(in[0], o) : adaptive_avg_pool1d(in[0], o);
          },
          [=](const Values& v) {
            return ref_adaptive(is_max, v[0], xi, {1, o});
          },
          seq_out(xs, xi[1], o)};
  if (is_max) r.dtypes = kNumeric;
  return r;
}

// The 1-D rows: strides, paddings, dilations, groups, ceil_mode, unbatched inputs.
std::vector<OpRow> sequence_rows() {
  return {
      conv1d_row({2, 2, 5}, {3, 2, 2}, true, 1, 0),
      conv1d_row({1, 2, 6}, {2, 2, 3}, false, 2, 1),
      conv1d_row({1, 4, 5}, {2, 2, 2}, true, 1, 1, 2),
      conv1d_row({1, 2, 7}, {2, 1, 2}, false, 2, 1, 2, 3),
      conv1d_row({3, 6}, {2, 3, 3}, true, 1, 1),
      conv1d_row({0, 2, 4}, {3, 2, 2}, true, 1, 0),
      pool1d_row(PoolSpec{}, {2, 2, 5}, 2, 0),
      pool1d_row(PoolSpec{}, {1, 2, 7}, 3, 2, 1, 2),
      pool1d_row(max_ceil(), {1, 1, 8}, 3, 2, 1),
      pool1d_row(PoolSpec{}, {3, 6}, 2, 1),
      pool1d_row(avg(false, true), {2, 2, 6}, 3, 2, 1),
      pool1d_row(avg(true, false), {1, 2, 6}, 3, 2, 1),
      pool1d_row(avg(false, true), {3, 5}, 2, 0),
      adaptive1d_row(false, {1, 2, 7}, 3),
      adaptive1d_row(false, {2, 2, 6}, 2),
      adaptive1d_row(true, {1, 2, 7}, 4),
      adaptive1d_row(true, {3, 6}, 3),
  };
}

}  // namespace

const std::vector<OpRow>& image_rows() {
  static const std::vector<OpRow> rows = [] {
    std::vector<OpRow> r = {
        unfold_row({1, 2, 2, 3}, 2, 1, 0),
        unfold_row({2, 1, 4, 2}, 2, 2, 0),
        unfold_row({1, 1, 3, 3}, 2, 2, 1),
        unfold_row({1, 1, 2, 4}, 2, 1, 0),
        unfold_row({2, 2, 2, 2}, 1, 1, 0),
        unfold_row({0, 2, 3, 3}, 2, 1, 0),
        fold_row({1, 2, 2, 3}, 2, 1, 0),
        fold_row({2, 1, 4, 2}, 2, 2, 0),
        fold_row({1, 1, 3, 3}, 2, 2, 1),
        fold_row({1, 1, 2, 4}, 2, 1, 0),
        fold_row({1, 1, 3, 3}, 3, 1, 0),
        fold_row({0, 2, 3, 3}, 2, 1, 0),
        // Dilated, and with strides and paddings that differ per dim (torch's tuples).
        unfold_row({1, 1, 4, 4}, 2, 1, 0, 2),
        unfold_row({1, 1, 3, 5}, {2, 3}, {1, 2}, {1, 0}, {1, 2}),
        // A padding wider than the image: taps that read no column (the CPU kernels once wrote
        // past their row there).
        unfold_row({1, 1, 5, 1}, 5, 1, 2),
        unfold_row({1, 1, 2, 1}, {1, 5}, {1, 2}, {0, 2}),
        fold_row({1, 1, 1, 1}, {1, 5}, 1, {0, 2}),
        fold_row({1, 1, 4, 4}, 2, 1, 0, 2),
        fold_row({1, 1, 3, 5}, {2, 3}, {1, 2}, {1, 0}, {1, 2}),
        conv_row({2, 1, 3, 3}, {2, 1, 2, 2}, true, 1, 0),
        conv_row({1, 2, 3, 3}, {3, 2, 2, 2}, false, 2, 1),
        conv_row({1, 1, 4, 4}, {2, 1, 3, 3}, true, 1, 1),
        conv_row({2, 3, 2, 2}, {2, 3, 1, 1}, true, 1, 0),
        conv_row({1, 1, 3, 3}, {1, 1, 3, 3}, false, 2, 2),
        conv_row({1, 2, 2, 4}, {2, 2, 2, 2}, true, 1, 0),
        conv_row({2, 2, 3, 2}, {1, 2, 2, 2}, true, 3, 1),
        conv_row({0, 2, 3, 3}, {3, 2, 2, 2}, true, 1, 0),
        conv_row({1, 2, 3, 3}, {0, 2, 2, 2}, false, 1, 0),
        // In groups: two groups of two channels, one filter each; depthwise (a filter per
        // channel); and two filters per channel, strided.
        conv_row({1, 4, 2, 2}, {2, 2, 2, 2}, true, 1, 1, 2),
        conv_row({1, 3, 2, 3}, {3, 1, 2, 2}, false, 1, 1, 3),
        conv_row({2, 2, 3, 2}, {4, 1, 2, 2}, true, 2, 0, 2),
        // Kernels of other heights than widths (as torch.nn.Conv2d's (1, 3) and (3, 1)).
        conv_row({1, 2, 3, 4}, {2, 2, 1, 3}, true, 1, 1),
        conv_row({1, 2, 4, 3}, {2, 1, 3, 1}, false, 2, 0, 2),
        // Dilated (torch's `dilation`), and strides and paddings per dim.
        conv_row({1, 1, 4, 5}, {2, 1, 2, 2}, true, 1, 1, 1, 2),
        conv_row({1, 2, 3, 4}, {2, 1, 2, 3}, false, {2, 1}, {1, 0}, 2, {2, 1}),
        conv_row({1, 1, 3, 4}, {1, 1, 2, 2}, true, {1, 2}, {0, 1}),
        input_grad_row({2, 1, 3, 3}, {2, 1, 2, 2}, 1, 0),
        input_grad_row({1, 2, 3, 3}, {3, 2, 2, 2}, 2, 1),
        input_grad_row({1, 1, 4, 4}, {1, 1, 3, 3}, 1, 1),
        input_grad_row({2, 2, 3, 2}, {1, 2, 2, 2}, 3, 1),
        input_grad_row({0, 2, 3, 3}, {3, 2, 2, 2}, 1, 0),
        input_grad_row({1, 4, 2, 2}, {2, 2, 2, 2}, 1, 1, 2),
        input_grad_row({1, 3, 3, 3}, {3, 1, 2, 2}, 2, 1, 3),
        input_grad_row({1, 2, 3, 4}, {2, 2, 1, 3}, 1, 0),
        input_grad_row({1, 1, 3, 4}, {2, 1, 2, 2}, 1, 1, 1, 2),
        input_grad_row({1, 2, 3, 4}, {2, 1, 2, 3}, {2, 1}, {1, 0}, 2, {2, 1}),
        weight_grad_row({2, 1, 3, 3}, {2, 1, 2, 2}, 1, 0),
        weight_grad_row({1, 2, 3, 3}, {3, 2, 2, 2}, 2, 1),
        weight_grad_row({1, 1, 4, 4}, {1, 1, 3, 3}, 1, 1),
        weight_grad_row({2, 2, 3, 2}, {1, 2, 2, 2}, 3, 1),
        weight_grad_row({0, 2, 3, 3}, {3, 2, 2, 2}, 1, 0),
        weight_grad_row({1, 4, 2, 2}, {2, 2, 2, 2}, 1, 1, 2),
        weight_grad_row({1, 3, 2, 3}, {3, 1, 2, 2}, 2, 1, 3),
        weight_grad_row({1, 1, 3, 4}, {2, 1, 2, 2}, 1, 1, 1, 2),
        weight_grad_row({1, 2, 3, 4}, {2, 1, 2, 3}, {2, 1}, {1, 0}, 2, {2, 1}),
        // Transposed: strides, paddings, output paddings below the stride, and one below only
        // the dilation (the input gradient of an unpadded image, cropped and zero-extended).
        transposed_row({{1, 2, 2, 2}, {2, 3, 2, 2}, 1, 0, 0, 1, 1}, true),
        transposed_row({{1, 1, 2, 3}, {1, 2, 3, 3}, 2, 1, 1, 1, 1}, false),
        transposed_row({{1, 2, 2, 2}, {2, 1, 3, 2}, {2, 1}, {1, 0}, {1, 0}, {1, 2}, 2}, true),
        transposed_row({{1, 1, 3, 2}, {1, 1, 2, 2}, 1, 1, {1, 0}, {2, 1}, 1}, false),
        transposed_row({{2, 1, 2, 2}, {1, 2, 2, 1}, {1, 2}, {0, 1}, {1, 1}, {2, 2}, 1}, true),
        transposed_row({{0, 2, 2, 2}, {2, 1, 2, 2}, 2, 0, 0, 1, 2}, false),
        resample_row(resize("nearest"), {1, 2, 3, 4}, {5, 7}),
        resample_row(resize("nearest"), {1, 1, 4, 4}, {2, 3}),
        resample_row(resize("nearest-exact"), {1, 1, 3, 5}, {4, 3}),
        resample_row(resize("bilinear"), {1, 2, 3, 4}, {5, 6}),
        resample_row(resize("bilinear"), {1, 1, 5, 4}, {2, 3}),
        resample_row(resize("bilinear", true), {1, 1, 3, 3}, {4, 5}),
        resample_row(resize("bilinear", true), {1, 1, 3, 2}, {1, 3}),
        resample_row(scaled("nearest", 2), {1, 2, 2, 3}, 0),
        resample_row(scaled("bilinear", 1.5), {1, 1, 3, 4}, 0),
        resample_row(scaled("nearest-exact", 0.5), {1, 1, 4, 5}, 0),
        // Bicubic (taps clamped into the image, weights past 1 and below 0) and area (the
        // adaptive average pooling), by size and by scale.
        resample_row(resize("bicubic"), {1, 2, 3, 4}, {5, 6}),
        resample_row(resize("bicubic"), {1, 1, 5, 4}, {2, 3}),
        resample_row(resize("bicubic", true), {1, 1, 3, 3}, {4, 5}),
        resample_row(resize("bicubic", true), {1, 1, 3, 2}, {1, 3}),
        resample_row(scaled("bicubic", 1.5), {1, 1, 3, 4}, 0),
        resample_row(scaled("bicubic", 2, true), {1, 1, 2, 3}, 0),
        resample_row(resize("area"), {1, 2, 4, 3}, {2, 3}),
        resample_row(resize("area"), {1, 1, 5, 4}, {3, 3}),
        resample_row(scaled("area", 0.5), {1, 1, 4, 5}, 0),
        pool_row(true, {1, 1, 4, 4}, 2, 0),
        pool_row(true, {2, 1, 3, 3}, 2, 1),
        pool_row(true, {1, 1, 3, 5}, 3, 2),
        pool_row(true, {1, 1, 3, 3}, 3, 0),
        pool_row(true, {0, 2, 4, 4}, 2, 0),
        pool_row(false, {1, 1, 4, 4}, 2, 0),
        pool_row(false, {2, 1, 3, 3}, 2, 1),
        pool_row(false, {1, 1, 3, 5}, 3, 2),
        pool_row(false, {0, 2, 4, 4}, 2, 0),
        // Paddings, dilations, ceil_mode, and the padding outside avg's divisor.
        pool_row(PoolSpec{}, {1, 1, 4, 4}, 3, 2, 1),
        pool_row(PoolSpec{}, {1, 1, 5, 4}, {2, 3}, {1, 2}, {1, 1}),
        pool_row(PoolSpec{}, {1, 1, 4, 5}, 2, 1, 1, 2),
        pool_row(max_ceil(), {1, 1, 5, 3}, 2, 0),
        pool_row(max_ceil(), {1, 1, 5, 4}, 3, 2, 1),
        pool_row(max_ceil(), {1, 1, 6, 4}, 2, {3, 2}, 1, {2, 1}),
        pool_row(avg(false, true), {1, 1, 4, 4}, 3, 2, 1),
        pool_row(avg(false, false), {1, 1, 4, 4}, 3, 2, 1),
        pool_row(avg(false, false), {1, 1, 3, 5}, {2, 3}, 1, {1, 1}),
        pool_row(avg(true, true), {1, 1, 3, 5}, 2, 0),
        pool_row(avg(true, true), {1, 1, 5, 4}, 3, 2, 1),
        pool_row(avg(true, false), {1, 1, 4, 5}, 3, 2, 1),
        pool_row(avg(true, false), {0, 2, 5, 5}, 2, 0),
        pool_row(avg(false, true), {1, 1, 5, 1}, 5, 1, 2),  // (the fuzzer's ONNX AveragePool)
        adaptive_row(false, {1, 1, 4, 6}, {2, 3}),
        adaptive_row(false, {1, 1, 3, 7}, {3, 4}),
        adaptive_row(false, {1, 1, 3, 4}, {2, 2}),
        adaptive_row(false, {1, 2, 3, 3}, 1),
        adaptive_row(true, {1, 1, 4, 6}, {2, 3}),
        adaptive_row(true, {1, 1, 3, 7}, {3, 4}),
        adaptive_row(true, {1, 1, 4, 3}, {4, 2}),
        // avg_pool2d's divisor_override: every window's sum over one divisor.
        pool_row(PoolSpec{false, false, true, 3}, {1, 1, 4, 4}, 3, 2, 1),
        pool_row(PoolSpec{false, true, false, 5}, {1, 2, 3, 3}, 2, 0),
    };
    for (OpRow& seq : sequence_rows()) r.push_back(std::move(seq));
    for (OpRow& vol : volume_rows()) r.push_back(std::move(vol));
    // Larger images, forward only: many (n, c) planes, across the kernels' parallel grain.
    for (OpRow big :
         {unfold_row({4, 16, 20, 20}, 3, 1, 1), fold_row({4, 16, 20, 20}, 3, 2, 1),
          conv_row({2, 3, 9, 9}, {4, 3, 3, 3}, true, 2, 1),
          conv_row({2, 3, 9, 9}, {4, 3, 3, 3}, true, 1, 2, 1, 2),
          unfold_row({2, 4, 12, 12}, 3, {1, 2}, 2, {2, 3}),
          input_grad_row({2, 3, 9, 9}, {4, 3, 3, 3}, 2, 1),
          weight_grad_row({2, 3, 9, 9}, {4, 3, 3, 3}, 2, 1), pool_row(true, {2, 8, 16, 16}, 2, 0),
          pool_row(max_ceil(), {2, 8, 15, 15}, 3, 2, 1),
          pool_row(avg(true, false), {2, 8, 15, 15}, 3, 2, 1),
          adaptive_row(false, {2, 8, 15, 13}, {7, 5})}) {
      big.grad = false;
      r.push_back(big);
    }
    return r;
  }();
  return rows;
}

}  // namespace duet::test
