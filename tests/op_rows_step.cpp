// Op rows of lstm_step and its gradient (Note [LSTM step] in core/ops/rnn.cpp): the reference is
// PyTorch's LSTM cell with its products, in doubles.
#include <algorithm>
#include <cmath>

#include "core/ops.h"
#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;
using Vec = std::vector<double>;

double sigmoid_of(double x) { return 1 / (1 + std::exp(-x)); }

Shape with_last(Shape s, int64_t n) {
  s.push_back(n);
  return s;
}

// The sizes of one row: I, H and the rows of x, h and c (v[0], v[1], v[2]).
struct Dims {
  int64_t in, h, rows;
};

// a = x w_ih^T + b_ih + h w_hh^T + b_hh, row by row (rows x 4H).
Vec summed_gates(const Values& v, const Dims& d) {
  Vec a(static_cast<size_t>(d.rows * 4 * d.h));
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t u = 0; u < 4 * d.h; ++u) {
      double s = v[5][static_cast<size_t>(u)] + v[6][static_cast<size_t>(u)];
      for (int64_t k = 0; k < d.in; ++k)
        s += v[0][static_cast<size_t>(r * d.in + k)] * v[3][static_cast<size_t>(u * d.in + k)];
      for (int64_t k = 0; k < d.h; ++k)
        s += v[1][static_cast<size_t>(r * d.h + k)] * v[4][static_cast<size_t>(u * d.h + k)];
      a[static_cast<size_t>(r * 4 * d.h + u)] = s;
    }
  return a;
}

// Forward: h' then c' per row. Backward (g = v[7], the gradient of h' then c'): the gradients of
// x, h, c, w_ih, w_hh, b_ih and b_hh, flat, one after another.
Vec ref_step(const Values& v, const Dims& d, bool backward) {
  const Vec a = summed_gates(v, d);
  const int64_t h = d.h;
  Vec fwd(static_cast<size_t>(d.rows * 2 * h)), da(static_cast<size_t>(d.rows * 4 * h)),
      dc(static_cast<size_t>(d.rows * h));
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t j = 0; j < h; ++j) {
      auto at = [&](int64_t k) { return a[static_cast<size_t>(r * 4 * h + k * h + j)]; };
      const double i = sigmoid_of(at(0)), f = sigmoid_of(at(1)), g = std::tanh(at(2)),
                   o = sigmoid_of(at(3)), c = v[2][static_cast<size_t>(r * h + j)];
      const double cn = f * c + i * g, tc = std::tanh(cn);
      fwd[static_cast<size_t>(r * 2 * h + j)] = o * tc;
      fwd[static_cast<size_t>(r * 2 * h + h + j)] = cn;
      if (!backward) continue;
      const double dh = v[7][static_cast<size_t>(r * 2 * h + j)];
      const double dcn = v[7][static_cast<size_t>(r * 2 * h + h + j)] + dh * o * (1 - tc * tc);
      const double gates[] = {dcn * g * i * (1 - i), dcn * c * f * (1 - f), dcn * i * (1 - g * g),
                              dh * tc * o * (1 - o)};
      for (int64_t k = 0; k < 4; ++k) da[static_cast<size_t>(r * 4 * h + k * h + j)] = gates[k];
      dc[static_cast<size_t>(r * h + j)] = dcn * f;
    }
  if (!backward) return fwd;
  Vec out;
  // dx = da w_ih, dh = da w_hh; dw_ih = da^T x, dw_hh = da^T h; db = the sum of da's rows.
  for (int p : {0, 1}) {
    const int64_t n = p == 0 ? d.in : h;
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t k = 0; k < n; ++k) {
        double s = 0;
        for (int64_t u = 0; u < 4 * h; ++u)
          s += da[static_cast<size_t>(r * 4 * h + u)] * v[3 + p][static_cast<size_t>(u * n + k)];
        out.push_back(s);
      }
  }
  out.insert(out.end(), dc.begin(), dc.end());
  for (int p : {0, 1}) {
    const int64_t n = p == 0 ? d.in : h;
    for (int64_t u = 0; u < 4 * h; ++u)
      for (int64_t k = 0; k < n; ++k) {
        double s = 0;
        for (int64_t r = 0; r < d.rows; ++r)
          s += da[static_cast<size_t>(r * 4 * h + u)] * v[p][static_cast<size_t>(r * n + k)];
        out.push_back(s);
      }
  }
  for (int p = 0; p < 2; ++p)
    for (int64_t u = 0; u < 4 * h; ++u) {
      double s = 0;
      for (int64_t r = 0; r < d.rows; ++r) s += da[static_cast<size_t>(r * 4 * h + u)];
      out.push_back(s);
    }
  return out;
}

std::vector<Shape> step_shapes(const Shape& lead, int64_t in, int64_t h) {
  return {with_last(lead, in), with_last(lead, h), with_last(lead, h), Shape{4 * h, in},
          Shape{4 * h, h},     Shape{4 * h},       Shape{4 * h}};
}

// lstm_step on x (lead..., I), h and c (lead..., H) and the weights; the value is h' then c'.
// Rows whose inputs exceed the gradient sweep's 24 elements are forward only.
OpRow step_row(Shape lead, int64_t in, int64_t h) {
  const Dims d{in, h, lead.numel()};
  OpRow r{fmt::format("lstm_step {} input {} hidden {}", lead.str(), in, h),
          OpId::LstmStep,
          false,
          step_shapes(lead, in, h),
          [](const Ins& x) {
            auto [hn, cn] = lstm_step(x[0], x[1], x[2], x[3], x[4], x[5], x[6]);
            return cat({hn, cn}, -1);
          },
          [d](const Values& v) { return ref_step(v, d, false); },
          with_last(lead, 2 * h)};
  r.domains = {Domain{-1, 1}};
  r.grad = 4 * h * std::max(in, h) <= 24 && lead.numel() * std::max(in, h) <= 24;
  return r;
}

// lstm_step_backward and the products' gradients, through the gradient of lstm_step with respect
// to its seven operands given the result's gradient (input 7): all of them, flat.
OpRow step_backward_row(Shape lead, int64_t in, int64_t h) {
  const Dims d{in, h, lead.numel()};
  std::vector<Shape> shapes = step_shapes(lead, in, h);
  shapes.push_back(with_last(lead, 2 * h));
  const int64_t n = d.rows * (in + 2 * h) + 4 * h * (in + h) + 8 * h;
  OpRow r{fmt::format("lstm_step_backward (grad of lstm_step) {} input {} hidden {}", lead.str(),
                      in, h),
          OpId::LstmStepBackward,
          false,
          shapes,
          [](const Ins& x) {
            std::vector<Tensor> v;
            for (int k = 0; k < 7; ++k) v.push_back(x[k].detach().requires_grad_(true));
            auto [hn, cn] = lstm_step(v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
            std::vector<Tensor> gs = grad({cat({hn, cn}, -1)}, v, {x[7]});
            std::vector<Tensor> flat;
            for (const Tensor& g : gs) flat.push_back(reshape(g, {-1}));
            return cat(flat, 0);
          },
          [d](const Values& v) { return ref_step(v, d, true); },
          Shape{n}};
  r.domains = {Domain{-1, 1}};
  // The gradients of x and h sum 4H products each: f32 rounding grows with the square root of the
  // count, and two orders of the sums (a batch against one sample) differ by that much where the
  // terms cancel. The default is for sums of up to 64 terms.
  r.tol32 = 1e-5 * std::max(1.0, std::sqrt(4.0 * static_cast<double>(h) / 64));
  r.grad = false;  // second derivatives go through elementwise ops (Note [LSTM step])
  return r;
}

}  // namespace

std::vector<OpRow> step_rows() {
  return {
      step_row({2}, 2, 1),
      step_row({}, 3, 2),
      step_row({2, 3}, 4, 5),
      step_row({0}, 2, 2),
      step_row({3}, 5, 300),  // past one block of 256 units
      // Products on oneDNN's matmul primitive, the second accumulating into the first (Note
      // [Products read transposed] in kernels/matmul.cpp).
      step_row({20}, 64, 64),
      step_backward_row({2}, 2, 1),
      step_backward_row({3, 2}, 3, 4),
      step_backward_row({}, 4, 3),
      step_backward_row({2}, 3, 300),
  };
}

}  // namespace duet::test
