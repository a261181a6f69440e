// Rows of the 3-D window ops (core/ops/volume.cpp): conv3d, conv_transpose3d, max_pool3d,
// avg_pool3d and the adaptive poolings, and of interpolate and upsample over sequences and
// volumes, over (N, C, D, H, W) and unbatched (C, D, H, W) volumes,
// with direct references on plain doubles that read each 3-D window whole (not as the planes and a
// depth window the ops are composed of), so that they check that composition.
#include <algorithm>
#include <cmath>
#include <string>

#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;

// A 3-D window on plain ints: per dim i (0 D, 1 H, 2 W) the input size, kernel, stride, padding,
// dilation and output size.
struct Geom3 {
  int64_t n, c;
  int64_t in[3], k[3], s[3], p[3], d[3], out[3];
  int64_t at(int i, int64_t o, int64_t tap) const { return o * s[i] - p[i] + tap * d[i]; }
};

// The output positions along a dim, as PyTorch's (ceil_mode keeps a last window only where it
// starts inside the input or its left padding).
int64_t positions(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t room = n + 2 * p - (d * (k - 1) + 1);
  int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
  if (ceil_mode && (out - 1) * s >= n + p) --out;
  return out;
}

// x (N, C, D, H, W), or unbatched (C, D, H, W) as a batch of one.
Geom3 geom3(const Shape& xs, Size3 k, Size3 s, Size3 p, Size3 d, bool ceil_mode = false) {
  const bool batched = xs.size() == 5;
  Geom3 g{batched ? xs[0] : 1, xs[batched ? 1 : 0], {}, {k.d, k.h, k.w}, {s.d, s.h, s.w},
          {p.d, p.h, p.w},     {d.d, d.h, d.w},     {}};
  for (int i = 0; i < 3; ++i) {
    g.in[i] = xs[xs.size() - 3 + static_cast<size_t>(i)];
    g.out[i] = positions(g.in[i], g.k[i], g.s[i], g.p[i], g.d[i], ceil_mode);
  }
  return g;
}
// The result's shape: (N, C', D', H', W'), or unbatched (C', D', H', W').
Shape out_shape(const Shape& xs, int64_t c, const Geom3& g) {
  if (xs.size() == 5) return {g.n, c, g.out[0], g.out[1], g.out[2]};
  return {c, g.out[0], g.out[1], g.out[2]};
}

// x[n][c][i][j][l], or null where (i, j, l) is in the padding.
const double* voxel(const std::vector<double>& x, const Geom3& g, int64_t n, int64_t c, int64_t i,
                    int64_t j, int64_t l) {
  if (i < 0 || i >= g.in[0] || j < 0 || j >= g.in[1] || l < 0 || l >= g.in[2]) return nullptr;
  return &x[static_cast<size_t>((((n * g.c + c) * g.in[0] + i) * g.in[1] + j) * g.in[2] + l)];
}

std::string str3(Size3 v) {
  return v.d == v.h && v.h == v.w ? fmt::format("{}", v.d) : fmt::format("{}x{}x{}", v.d, v.h, v.w);
}

// y[n][o][od][oh][ow] = b[o] + the sum over channel c of o's group and the taps of w[o][c][taps]
// times the zero-padded x there.
std::vector<double> ref_conv3d(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* b, const Geom3& g, int64_t o_ch,
                               int64_t groups) {
  const int64_t cg = g.c / groups, og = std::max<int64_t>(o_ch / groups, 1);
  std::vector<double> out;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < o_ch; ++o)
      for (int64_t a = 0; a < g.out[0]; ++a)
        for (int64_t e = 0; e < g.out[1]; ++e)
          for (int64_t f = 0; f < g.out[2]; ++f) {
            double acc = b ? (*b)[static_cast<size_t>(o)] : 0;
            for (int64_t c = 0; c < cg; ++c)
              for (int64_t t0 = 0; t0 < g.k[0]; ++t0)
                for (int64_t t1 = 0; t1 < g.k[1]; ++t1)
                  for (int64_t t2 = 0; t2 < g.k[2]; ++t2) {
                    const double* v = voxel(x, g, n, o / og * cg + c, g.at(0, a, t0),
                                            g.at(1, e, t1), g.at(2, f, t2));
                    if (v)
                      acc += *v * w[static_cast<size_t>(
                                      (((o * cg + c) * g.k[0] + t0) * g.k[1] + t1) * g.k[2] + t2)];
                  }
            out.push_back(acc);
          }
  return out;
}

// y = b + each input voxel spread through its filters: input voxel (i, j, l) of channel c reaches
// output (i s - p + t d, ...) of the filters of c's group, the padding cropped, the output
// padding (after the last window) zero.
std::vector<double> ref_conv_transpose3d(const std::vector<double>& x, const std::vector<double>& w,
                                         const std::vector<double>* b, const Geom3& g, int64_t o_ch,
                                         int64_t groups) {
  const int64_t cg = g.c / groups, og = o_ch / groups;
  const size_t plane = static_cast<size_t>(g.out[0] * g.out[1] * g.out[2]);
  std::vector<double> out(static_cast<size_t>(g.n * o_ch) * plane, 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t i = 0; i < g.in[0]; ++i)
        for (int64_t j = 0; j < g.in[1]; ++j)
          for (int64_t l = 0; l < g.in[2]; ++l) {
            const double v = *voxel(x, g, n, c, i, j, l);
            for (int64_t q = 0; q < og; ++q) {
              const int64_t o = c / cg * og + q;
              for (int64_t t0 = 0; t0 < g.k[0]; ++t0)
                for (int64_t t1 = 0; t1 < g.k[1]; ++t1)
                  for (int64_t t2 = 0; t2 < g.k[2]; ++t2) {
                    const int64_t a = g.at(0, i, t0), e = g.at(1, j, t1), f = g.at(2, l, t2);
                    if (a < 0 || a >= g.out[0] || e < 0 || e >= g.out[1] || f < 0 || f >= g.out[2])
                      continue;
                    out[static_cast<size_t>(n * o_ch + o) * plane +
                        static_cast<size_t>((a * g.out[1] + e) * g.out[2] + f)] +=
                        v * w[static_cast<size_t>(
                                (((c * og + q) * g.k[0] + t0) * g.k[1] + t1) * g.k[2] + t2)];
                  }
            }
          }
  if (b)
    for (size_t k = 0; k < out.size(); ++k) out[k] += (*b)[(k / plane) % static_cast<size_t>(o_ch)];
  return out;
}

OpRow conv_transpose3d_row(Shape xs, Shape ws, bool bias, Size3 s, Size3 p, Size3 op,
                           int64_t groups = 1, Size3 d = 1) {
  Geom3 g = geom3(xs, {ws[2], ws[3], ws[4]}, s, p, d);
  const int64_t ops[3] = {op.d, op.h, op.w};
  for (int i = 0; i < 3; ++i)
    g.out[i] = (g.in[i] - 1) * g.s[i] - 2 * g.p[i] + g.d[i] * (g.k[i] - 1) + ops[i] + 1;
  const int64_t o = ws[1] * groups;
  std::vector<Shape> shapes = {xs, ws};
  if (bias) shapes.push_back({o});
  OpRow r{fmt::format("conv_transpose3d x {} w {}{} s {} p {} op {}{}{}", xs.str(), ws.str(),
                      bias ? " bias" : "", str3(s), str3(p), str3(op),
                      groups > 1 ? fmt::format(" groups {}", groups) : "",
                      d == Size3(1) ? "" : " d " + str3(d)),
          OpId::Fold,
          true,
          shapes,
          [=](const Ins& in) {
            return conv_transpose3d(in[0], in[1], bias ? in[2] : Tensor(), s, p, op, groups, d);
          },
          [=](const Values& v) {
            return ref_conv_transpose3d(v[0], v[1], bias ? &v[2] : nullptr, g, o, groups);
          },
          out_shape(xs, o, g)};
  r.dtypes = {DType::f32, DType::f64};
  r.tol32 = 1e-4;
  return r;
}

struct Pool3 {
  bool is_max = true, ceil_mode = false, count_pad = true;
  int64_t divisor = 0;  // avg's divisor_override (0: none)
};

// PyTorch's 3-D pooling, window by window: the max of the window's voxels (the padding never
// wins), or their sum over the divisor (the window clipped to the padded input where count_pad,
// else to the input; or the override).
std::vector<double> ref_pool3d(Pool3 q, const std::vector<double>& x, const Geom3& g) {
  std::vector<double> out;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t a = 0; a < g.out[0]; ++a)
        for (int64_t e = 0; e < g.out[1]; ++e)
          for (int64_t f = 0; f < g.out[2]; ++f) {
            double acc = q.is_max ? -INFINITY : 0;
            for (int64_t t0 = 0; t0 < g.k[0]; ++t0)
              for (int64_t t1 = 0; t1 < g.k[1]; ++t1)
                for (int64_t t2 = 0; t2 < g.k[2]; ++t2) {
                  const double* v =
                      voxel(x, g, n, c, g.at(0, a, t0), g.at(1, e, t1), g.at(2, f, t2));
                  if (v) acc = q.is_max ? std::max(acc, *v) : acc + *v;
                }
            if (!q.is_max) {
              double divisor = 1;
              const int64_t pos[3] = {a, e, f};
              for (int i = 0; i < 3; ++i) {
                const int64_t start = pos[i] * g.s[i] - g.p[i];
                const int64_t end = std::min(start + g.k[i], g.in[i] + g.p[i]);
                divisor *=
                    double(q.count_pad ? end - start
                                       : std::min(end, g.in[i]) - std::max<int64_t>(start, 0));
              }
              acc /= q.divisor ? double(q.divisor) : divisor;
            }
            out.push_back(acc);
          }
  return out;
}

// Adaptive pooling: cell i of a dim of n reads [floor(i n / o), ceil((i + 1) n / o)).
std::vector<double> ref_adaptive3d(bool is_max, const std::vector<double>& x, const Geom3& g,
                                   Size3 o) {
  const int64_t os[3] = {o.d, o.h, o.w};
  auto lo = [&](int i, int64_t cell) { return cell * g.in[i] / os[i]; };
  auto hi = [&](int i, int64_t cell) { return ((cell + 1) * g.in[i] + os[i] - 1) / os[i]; };
  std::vector<double> out;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t a = 0; a < o.d; ++a)
        for (int64_t e = 0; e < o.h; ++e)
          for (int64_t f = 0; f < o.w; ++f) {
            double acc = is_max ? -INFINITY : 0;
            for (int64_t i = lo(0, a); i < hi(0, a); ++i)
              for (int64_t j = lo(1, e); j < hi(1, e); ++j)
                for (int64_t l = lo(2, f); l < hi(2, f); ++l) {
                  const double v = *voxel(x, g, n, c, i, j, l);
                  acc = is_max ? std::max(acc, v) : acc + v;
                }
            const double count =
                double((hi(0, a) - lo(0, a)) * (hi(1, e) - lo(1, e)) * (hi(2, f) - lo(2, f)));
            out.push_back(is_max ? acc : acc / count);
          }
  return out;
}

OpRow conv3d_row(Shape xs, Shape ws, bool bias, Size3 s, Size3 p, int64_t groups = 1, Size3 d = 1) {
  const Geom3 g = geom3(xs, {ws[2], ws[3], ws[4]}, s, p, d);
  const int64_t o = ws[0];
  std::vector<Shape> shapes = {xs, ws};
  if (bias) shapes.push_back({o});
  OpRow r{
      fmt::format("conv3d x {} w {}{} s {} p {}{}{}", xs.str(), ws.str(), bias ? " bias" : "",
                  str3(s), str3(p), groups > 1 ? fmt::format(" groups {}", groups) : "",
                  d == Size3(1) ? "" : " d " + str3(d)),
      OpId::Conv2d,
      true,
      shapes,
      [=](const Ins& in) { return conv3d(in[0], in[1], bias ? in[2] : Tensor(), s, p, groups, d); },
      [=](const Values& v) { return ref_conv3d(v[0], v[1], bias ? &v[2] : nullptr, g, o, groups); },
      out_shape(xs, o, g)};
  r.dtypes = {DType::f32, DType::f64, DType::i64};
  r.tol32 = 1e-4;
  return r;
}

// padding "same" (stride 1): the output as large as the input, the pads d (k - 1), half before.
OpRow conv3d_same_row(Shape xs, Shape ws, Size3 d) {
  Geom3 g = geom3(xs, {ws[2], ws[3], ws[4]}, 1, 0, d);
  const int64_t ks[3] = {ws[2], ws[3], ws[4]}, ds[3] = {d.d, d.h, d.w};
  for (int i = 0; i < 3; ++i) {  // the left pad; the output keeps the input's size
    g.p[i] = ds[i] * (ks[i] - 1) / 2;
    g.out[i] = g.in[i];
  }
  OpRow r{fmt::format("conv3d same x {} w {} d {}", xs.str(), ws.str(), str3(d)),
          OpId::Conv2d,
          true,
          {xs, ws},
          [=](const Ins& in) { return conv3d(in[0], in[1], Tensor(), 1, kSame, 1, d); },
          [=](const Values& v) { return ref_conv3d(v[0], v[1], nullptr, g, ws[0], 1); },
          out_shape(xs, ws[0], g)};
  r.tol32 = 1e-4;
  return r;
}

OpRow pool3d_row(Pool3 q, Shape xs, Size3 k, Size3 s0, Size3 p = 0, Size3 d = 1) {
  const Size3 s{s0.d ? s0.d : k.d, s0.h ? s0.h : k.h, s0.w ? s0.w : k.w};
  const Geom3 g = geom3(xs, k, s, p, d, q.ceil_mode);
  OpRow r{fmt::format("{} {} k {} s {}{}{}{}{}{}", q.is_max ? "max_pool3d" : "avg_pool3d", xs.str(),
                      str3(k), str3(s0), p == Size3(0) ? "" : " p " + str3(p),
                      d == Size3(1) ? "" : " d " + str3(d), q.ceil_mode ? " ceil" : "",
                      q.count_pad ? "" : " without the padding",
                      q.divisor ? fmt::format(" divisor {}", q.divisor) : ""),
          OpId::Unfold,
          true,
          {xs},
          [=](const Ins& in) {
            return q.is_max ? max_pool3d(in[0], k, s0, p, d, q.ceil_mode)
                            : avg_pool3d(in[0], k, s0, p, q.ceil_mode, q.count_pad, q.divisor);
          },
          [=](const Values& v) { return ref_pool3d(q, v[0], g); },
          out_shape(xs, g.c, g)};
  if (q.is_max) r.dtypes = {DType::f32, DType::f64, DType::i32, DType::i64};
  return r;
}

OpRow adaptive3d_row(bool is_max, Shape xs, Size3 o) {
  Geom3 g = geom3(xs, 1, 1, 0, 1);
  g.out[0] = o.d, g.out[1] = o.h, g.out[2] = o.w;
  const bool even = g.in[0] % o.d == 0 && g.in[1] % o.h == 0 && g.in[2] % o.w == 0;
  OpRow r{fmt::format("adaptive_{}_pool3d {} to {}", is_max ? "max" : "avg", xs.str(), str3(o)),
          even ? OpId::Unfold : OpId::Cat,
          true,
          {xs},
          [=](const Ins& in) {
            return is_max ? adaptive_max_pool3d(in[0], o) : adaptive_avg_pool3d(in[0], o);
          },
          [=](const Values& v) { return ref_adaptive3d(is_max, v[0], g, o); },
          out_shape(xs, g.c, g)};
  if (is_max) r.dtypes = {DType::f32, DType::f64, DType::i32, DType::i64};
  return r;
}

// F.interpolate of 1-D sequences and 3-D volumes, directly: each output element the sum over
// its source taps along every dim of the product of their weights times x there (nearest: one
// tap, floor(i * in / out) in float; linear: the two neighbours of (i + 0.5) in / out - 0.5
// clamped at 0, or of i (in - 1) / (out - 1) with align_corners). `scale`: the scale factor
// given (its inverse maps the coordinates), or 0 for a size.
struct Resample3 {
  std::string mode;
  bool align;
  double scale;
};
std::vector<double> ref_resample_nd(const Resample3& q, const std::vector<double>& x,
                                    const Shape& xs, const std::vector<int64_t>& out) {
  const size_t spatial = out.size();
  // Per dim, per output position: the (source, weight) taps.
  std::vector<std::vector<std::vector<std::pair<int64_t, double>>>> taps(spatial);
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t in = xs[2 + d];
    for (int64_t i = 0; i < out[d]; ++i) {
      std::vector<std::pair<int64_t, double>> t;
      if (q.mode == "nearest") {
        const float s = q.scale > 0 ? static_cast<float>(1 / q.scale) : float(in) / float(out[d]);
        t.push_back({std::min(static_cast<int64_t>(std::floor(float(i) * s)), in - 1), 1.0});
      } else {
        double src;
        if (q.align)
          src = out[d] > 1 ? double(i) * double(in - 1) / double(out[d] - 1) : 0.0;
        else
          src = std::max(
              (double(i) + 0.5) * (q.scale > 0 ? 1 / q.scale : double(in) / double(out[d])) - 0.5,
              0.0);
        const auto r0 = static_cast<int64_t>(src);
        const int64_t r1 = std::min(r0 + 1, in - 1);
        t.push_back({r0, 1 - (src - double(r0))});
        t.push_back({r1, src - double(r0)});
      }
      taps[d].push_back(t);
    }
  }
  int64_t planes = xs[0] * xs[1], in_plane = 1, out_plane = 1;
  for (size_t d = 0; d < spatial; ++d) in_plane *= xs[2 + d], out_plane *= out[d];
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o = 0; o < out_plane; ++o) {
      // The output position's index along each dim.
      std::vector<int64_t> at(spatial);
      for (int64_t rest = o, d = int64_t(spatial) - 1; d >= 0; --d) {
        at[size_t(d)] = rest % out[size_t(d)];
        rest /= out[size_t(d)];
      }
      // The sum over every combination of taps (one per dim).
      double acc = 0;
      std::vector<size_t> pick(spatial, 0);
      while (true) {
        double w = 1;
        int64_t src = 0;
        for (size_t d = 0; d < spatial; ++d) {
          const auto& [row, weight] = taps[d][size_t(at[d])][pick[d]];
          w *= weight;
          src = src * xs[2 + d] + row;
        }
        acc += w * x[size_t(p * in_plane + src)];
        size_t d = spatial;
        while (d > 0 && ++pick[d - 1] == taps[d - 1][size_t(at[d - 1])].size()) pick[--d] = 0;
        if (d == 0) break;
      }
      y.push_back(acc);
    }
  return y;
}

OpRow resample_nd_row(Resample3 q, Shape xs, std::vector<int64_t> size) {
  std::vector<int64_t> out = size;
  if (q.scale > 0) out.resize(xs.size() - 2);
  if (q.scale > 0)
    for (size_t d = 0; d < out.size(); ++d)
      out[d] = static_cast<int64_t>(std::floor(double(xs[2 + d]) * q.scale));
  Shape os{xs[0], xs[1]};
  for (int64_t o : out) os.push_back(o);
  OpRow r{q.scale > 0 ? fmt::format("upsample {} {} by {}{}", q.mode, xs.str(), q.scale,
                                    q.align ? " align_corners" : "")
                      : fmt::format("interpolate {} {} to {}{}", q.mode, xs.str(),
                                    fmt::join(out, "x"), q.align ? " align_corners" : ""),
          OpId::Gather,
          true,
          {xs},
          [=](const Ins& in) {
            if (q.scale > 0) return upsample(in[0], q.scale, q.mode, q.align);
            if (size.size() == 3)
              return interpolate(in[0], Size3{size[0], size[1], size[2]}, q.mode, q.align);
            return interpolate(in[0], size[0], q.mode, q.align);
          },
          [=](const Values& v) { return ref_resample_nd(q, v[0], xs, out); },
          os};
  if (q.mode == "nearest") r.dtypes = {DType::f32, DType::f64, DType::i32, DType::i64};
  return r;
}

Pool3 avg3(bool ceil_mode, bool count_pad, int64_t divisor = 0) {
  return {false, ceil_mode, count_pad, divisor};
}

}  // namespace

std::vector<OpRow> volume_rows() {
  const Pool3 max3{}, max3_ceil{true, true, true, 0};
  return {
      conv3d_row({1, 1, 2, 3, 4}, {2, 1, 2, 2, 2}, true, 1, 0),
      conv3d_row({1, 2, 3, 2, 2}, {2, 2, 2, 1, 2}, false, {2, 1, 1}, {1, 0, 1}),
      conv3d_row({1, 2, 2, 2, 3}, {2, 1, 1, 2, 2}, true, 1, {0, 1, 0}, 2),
      conv3d_row({1, 1, 4, 2, 3}, {1, 1, 2, 1, 2}, false, 1, 0, 1, {2, 1, 2}),
      conv3d_row({2, 2, 2, 3}, {3, 2, 1, 2, 2}, true, 1, 1),  // unbatched
      conv3d_row({0, 2, 3, 3, 3}, {1, 2, 2, 2, 2}, true, 1, 0),
      conv3d_same_row({1, 1, 3, 2, 4}, {1, 1, 3, 1, 3}, 1),  // even pads: conv3d's own
      conv3d_same_row({1, 1, 4, 3, 2}, {2, 1, 3, 2, 1}, 1),  // odd: x padded first
      conv3d_same_row({1, 1, 4, 2, 3}, {1, 1, 2, 1, 2}, {2, 1, 2}),
      conv_transpose3d_row({1, 2, 2, 2, 3}, {2, 1, 2, 2, 2}, true, 1, 0, 0),
      conv_transpose3d_row({1, 1, 2, 3, 2}, {1, 2, 2, 2, 2}, false, {2, 1, 2}, {1, 0, 0},
                           {1, 0, 1}),
      conv_transpose3d_row({1, 2, 2, 2, 2}, {2, 1, 2, 2, 1}, true, 1, {0, 1, 0}, 0, 2),
      // An output padding at the stride (below the dilation): a depth no input reaches.
      conv_transpose3d_row({1, 1, 3, 2, 2}, {1, 1, 2, 2, 1}, false, 1, 0, {1, 0, 0}, 1, {2, 1, 1}),
      conv_transpose3d_row({2, 2, 2, 3}, {2, 1, 1, 2, 2}, true, {1, 2, 1}, 0, {0, 1, 0}),
      pool3d_row(max3, {1, 1, 3, 2, 4}, 2, 0),
      pool3d_row(max3, {1, 2, 3, 2, 2}, {2, 1, 2}, {1, 1, 2}, {1, 0, 1}),
      pool3d_row(max3_ceil, {1, 1, 4, 3, 2}, {2, 2, 1}, {2, 2, 1}, {1, 1, 0}),
      pool3d_row(max3, {1, 1, 4, 2, 3}, 2, 1, 0, {2, 1, 2}),
      pool3d_row(max3, {2, 3, 2, 2}, 2, 1),  // unbatched
      pool3d_row(avg3(false, true), {1, 1, 3, 2, 4}, 2, 0),
      pool3d_row(avg3(false, false), {1, 2, 3, 2, 2}, {3, 1, 2}, {2, 1, 1}, {1, 0, 1}),
      pool3d_row(avg3(true, true), {1, 1, 4, 3, 2}, 2, 2, 1),
      pool3d_row(avg3(true, false), {1, 1, 3, 4, 2}, 2, {2, 3, 1}, 1),
      pool3d_row(avg3(false, true, 3), {1, 1, 2, 3, 4}, 2, 1, {1, 0, 1}),
      // Sequences and volumes resampled (the images' rows are in op_rows_image.cpp).
      resample_nd_row({"linear", false, 0}, {2, 2, 5}, {8}),
      resample_nd_row({"linear", true, 0}, {1, 2, 6}, {4}),
      resample_nd_row({"linear", false, 1.5}, {1, 3, 4}, {}),
      resample_nd_row({"nearest", false, 0}, {2, 2, 3}, {7}),
      resample_nd_row({"trilinear", false, 0}, {1, 1, 2, 3, 4}, {3, 5, 2}),
      resample_nd_row({"trilinear", true, 0}, {1, 2, 2, 3, 2}, {4, 2, 3}),
      resample_nd_row({"trilinear", false, 2}, {1, 1, 2, 2, 3}, {}),
      resample_nd_row({"nearest", false, 1.5}, {1, 2, 2, 3, 2}, {}),
      adaptive3d_row(false, {1, 1, 2, 3, 4}, {1, 3, 2}),
      adaptive3d_row(false, {1, 2, 3, 2, 2}, {2, 1, 2}),
      adaptive3d_row(true, {1, 1, 3, 2, 4}, {2, 2, 3}),
      adaptive3d_row(true, {2, 3, 2, 2}, {2, 3, 1}),  // unbatched
  };
}

}  // namespace duet::test
