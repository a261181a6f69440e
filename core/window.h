// duet: the window of the image ops (Unfold, Fold, Conv2d and its two gradients), as their
// attributes hold it, for the shape rules, the kernels of every device and the exporters.
//
// attrs.ints = {kh, kw, sh, sw, ph, pw, H, W}: the kernel, the stride, the zero padding on each
// side and the spatial size of the image side; then {dh, dw}, the dilation (PyTorch's
// `dilation`: a kernel tap ki reads row ki * dh of its window), only where it is not 1 along
// both dims. So an undilated window has the attributes it had before there was dilation: one
// form per window, for the graph passes' equality and the saved graphs of earlier versions.
#pragma once

#include <cstdint>

#include "core/op_table.h"

namespace duet {

struct WindowGeometry {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, h = 0, w = 0, dh = 1, dw = 1;
  int64_t ho = 0, wo = 0;  ///< the window positions along each dim
  /// The rows and columns one window spans: dh * (kh - 1) + 1, and dw * (kw - 1) + 1.
  int64_t span_h() const { return dh * (kh - 1) + 1; }
  int64_t span_w() const { return dw * (kw - 1) + 1; }
};

/// Whether attrs.ints holds a window (8 attributes, or 10 with the dilation).
inline bool is_window_attrs(const Attrs& a) { return a.ints.size() == 8 || a.ints.size() == 10; }

/// The window of attributes the op's shape rule has checked (core/ops/image.cpp), so no size
/// here overflows.
inline WindowGeometry window_geometry(const Attrs& a) {
  WindowGeometry g;
  g.kh = a.ints[0];
  g.kw = a.ints[1];
  g.sh = a.ints[2];
  g.sw = a.ints[3];
  g.ph = a.ints[4];
  g.pw = a.ints[5];
  g.h = a.ints[6];
  g.w = a.ints[7];
  if (a.ints.size() == 10) {
    g.dh = a.ints[8];
    g.dw = a.ints[9];
  }
  g.ho = (g.h + 2 * g.ph - g.span_h()) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.span_w()) / g.sw + 1;
  return g;
}

/// The attributes of a window: the dilation appended only where it is not 1 (above).
inline void set_window_attrs(Attrs& a, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                             int64_t pw, int64_t h, int64_t w, int64_t dh = 1, int64_t dw = 1) {
  a.ints = {kh, kw, sh, sw, ph, pw, h, w};
  if (dh != 1 || dw != 1) {
    a.ints.push_back(dh);
    a.ints.push_back(dw);
  }
}

}  // namespace duet
