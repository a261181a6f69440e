// CPU kernels of the LSTM and GRU cells and their gradients (Note [LSTM cell] in
// core/ops/rnn.cpp).
//
// A row is one cell: its gates' sums, activations and the new state are computed in blocks of
// kBlock hidden units in stack buffers, with the vectorized sigmoid and tanh of the elementwise
// kernels (Eigen's packets for f32), so each element sees the math the elementwise ops would
// apply. Rows are independent and each is computed the same way wherever it lands, so the bits
// do not depend on the thread count. The threads take rows in chunks of kParallelGrain / 64 units
// (8 rows of 64), as a row of cells costs far more than its units' elements of an add: with the
// elementwise ops' grain a (64, 64) LSTM step ran on one thread, 11.3 us against 7.0 on two; at
// kParallelGrain / 16 a step of 16 to 63 rows (an Autobatch group of cells, whose rows are the
// sentences still running) ran on one thread, and B1's scope step took about 4% longer (27.9 ms
// against 26.7, medians of four runs alternating, two threads).
// Operands that are not contiguous are copied first; f16 and bf16 run in f32 (via_wide).
// lstm_step multiplies into its result's a columns with gemm_rows, on the library that matmul's
// kernel picks for the shape, and adds the biases there before the cell.
#include <algorithm>

#include "kernels/composed.h"
#include "kernels/cpu_kernels.h"
#include "kernels/loops.h"
#include "kernels/matrices.h"
#include "kernels/low_precision.h"

namespace duet::kernels {
namespace rnn_cpu {  // named: unity builds join this file with others

constexpr int64_t kBlock = 256;

// t itself when contiguous, else a contiguous copy held in `tmp`.
const Tensor& dense(const Tensor& t, Tensor& tmp) {
  if (t.is_contiguous()) return t;
  tmp = cast_to(t, t.dtype());
  return tmp;
}

// The elementwise loops take each stream as a pointer of its own (__restrict): with several
// outputs in one buffer and inputs beside it, GCC could not tell them apart and left the loops
// scalar (GRU's backward took 7 ns an element, a quarter of char_gru's compiled step).
template <class T>
void add_to(int64_t m, const T* __restrict x, const T* __restrict y, T* __restrict a) {
  for (int64_t j = 0; j < m; ++j) a[j] = x[j] + y[j];
}
template <class T>
void multiply(int64_t m, const T* __restrict x, const T* __restrict y, T* __restrict a) {
  for (int64_t j = 0; j < m; ++j) a[j] = x[j] * y[j];
}
// c' = f c + i g.
template <class T>
void lstm_state(int64_t m, const T* __restrict i, const T* __restrict f, const T* __restrict g,
                const T* __restrict c, T* __restrict cn) {
  for (int64_t j = 0; j < m; ++j) cn[j] = f[j] * c[j] + i[j] * g[j];
}
// The gradients of the summed gates (di, df, dg, dout) and of c, given tanh(c') and the
// gradients of h' and c'.
template <class T>
void lstm_grads(int64_t m, const T* __restrict i, const T* __restrict f, const T* __restrict g,
                const T* __restrict o, const T* __restrict c, const T* __restrict tc,
                const T* __restrict dh, const T* __restrict dcn, T* __restrict di, T* __restrict df,
                T* __restrict dg, T* __restrict dout, T* __restrict dc_prev) {
  for (int64_t j = 0; j < m; ++j) {
    const T dc = dcn[j] + dh[j] * o[j] * (T(1) - tc[j] * tc[j]);
    di[j] = dc * g[j] * i[j] * (T(1) - i[j]);
    df[j] = dc * c[j] * f[j] * (T(1) - f[j]);
    dg[j] = dc * i[j] * (T(1) - g[j] * g[j]);
    dout[j] = dh[j] * tc[j] * o[j] * (T(1) - o[j]);
    dc_prev[j] = dc * f[j];
  }
}

// The activated gates of units [j0, j0 + m) of one row: i, f, g, o, each m long at stride kBlock.
// gh null: gx holds the summed gates (lstm_step's a). sums, where set, gets the summed gates
// before their activation (lstm_step adds its biases, gh, into its result's a columns).
template <class T>
void gates(const T* gx, const T* gh, int64_t h, int64_t j0, int64_t m, T* act, T* sums = nullptr) {
  for (int64_t k = 0; k < 4; ++k) {
    const T* x = gx + k * h + j0;
    T* a = act + k * kBlock;
    if (gh)
      add_to(m, x, gh + k * h + j0, a);
    else
      std::copy(x, x + m, a);
    if (sums) std::copy(a, a + m, sums + k * h + j0);
    if (k == 2)
      unary_dense<T>(fn::Tanh{}, a, a, m);
    else
      unary_dense<T>(fn::Sigmoid{}, a, a, m);
  }
}

// Runs body(row, j0, m) over every block of every row, rows spread over the threads.
template <class F>
void for_blocks(int64_t rows, int64_t h, F&& body) {
  parallel_for(
      rows, std::max<int64_t>(1, kParallelGrain / 64 / std::max<int64_t>(h, 1)),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t j0 = 0; j0 < h; j0 += kBlock) body(r, j0, std::min(kBlock, h - j0));
      },
      /*align=*/1);
}

// h' and c' of units [j0, j0 + m) from their activated gates and c.
template <class T>
void cell_out(const T* act, const T* c, T* hn, T* cn, int64_t m) {
  alignas(64) T tc[kBlock];
  const T *i = act, *f = act + kBlock, *g = act + 2 * kBlock, *o = act + 3 * kBlock;
  lstm_state(m, i, f, g, c, cn);
  unary_dense<T>(fn::Tanh{}, static_cast<const T*>(cn), tc, m);
  multiply(m, o, static_cast<const T*>(tc), hn);
}

template <class T>
void forward(const T* gx, const T* gh, const T* c, T* out, int64_t rows, int64_t h) {
  for_blocks(rows, h, [&](int64_t r, int64_t j0, int64_t m) {
    alignas(64) T act[4 * kBlock];
    gates(gx + r * 4 * h, gh + r * 4 * h, h, j0, m, act);
    T* hn = out + r * 2 * h + j0;
    cell_out(static_cast<const T*>(act), c + r * h + j0, hn, hn + h, m);
  });
}

// An operand's rows: its first element and the stride from one row to the next (its last dim
// dense).
template <class T>
struct Rows {
  const T* p;
  int64_t rs;
  const T* row(int64_t r) const { return p + r * rs; }
};

// gh null: gx is lstm_step's a, and grad's row is (h', c', a) (6H), whose a columns are added to
// the gradient of a.
template <class T>
void backward(Rows<T> gx, const T* gh, Rows<T> c, Rows<T> grad, T* out, int64_t rows, int64_t h) {
  for_blocks(rows, h, [&](int64_t r, int64_t j0, int64_t m) {
    alignas(64) T act[4 * kBlock], tc[kBlock];
    gates(gx.row(r), gh ? gh + r * 4 * h : nullptr, h, j0, m, act);
    const T *i = act, *f = act + kBlock, *g = act + 2 * kBlock, *o = act + 3 * kBlock;
    const T* cr = c.row(r) + j0;
    lstm_state(m, i, f, g, cr, tc);
    unary_dense<T>(fn::Tanh{}, tc, tc, m);
    const T *dh = grad.row(r) + j0, *dcn = dh + h;
    T* da = out + r * 5 * h + j0;
    lstm_grads(m, i, f, g, o, cr, static_cast<const T*>(tc), dh, dcn, da, da + h, da + 2 * h,
               da + 3 * h, da + 4 * h);
    if (!gh)
      for (int64_t k = 0; k < 4; ++k) {
        const T* ga = dh + 2 * h + k * h;
        for (int64_t j = 0; j < m; ++j) da[k * h + j] += ga[j];
      }
  });
}

// n's pre-activation, x_n + r h_n.
template <class T>
void gru_candidate(int64_t m, const T* __restrict x, const T* __restrict r, const T* __restrict y,
                   T* __restrict n) {
  for (int64_t j = 0; j < m; ++j) n[j] = x[j] + r[j] * y[j];
}
// h' = (1 - z) n + z h.
template <class T>
void gru_state(int64_t m, const T* __restrict z, const T* __restrict n, const T* __restrict h,
               T* __restrict o) {
  for (int64_t j = 0; j < m; ++j) o[j] = (T(1) - z[j]) * n[j] + z[j] * h[j];
}
// The gradients of gates_x's r, z, n, of gates_h's r, z, n, and of h, given h''s.
template <class T>
void gru_grads(int64_t m, const T* __restrict rg, const T* __restrict z, const T* __restrict n,
               const T* __restrict hn, const T* __restrict h, const T* __restrict g,
               T* __restrict dxr, T* __restrict dxz, T* __restrict dxn, T* __restrict dhr,
               T* __restrict dhz, T* __restrict dhn, T* __restrict dh) {
  for (int64_t j = 0; j < m; ++j) {
    const T dn = g[j] * (T(1) - z[j]) * (T(1) - n[j] * n[j]);
    const T dz = g[j] * (h[j] - n[j]) * z[j] * (T(1) - z[j]);
    const T dr = dn * hn[j] * rg[j] * (T(1) - rg[j]);
    dxr[j] = dr;
    dxz[j] = dz;
    dxn[j] = dn;
    dhr[j] = dr;
    dhz[j] = dz;
    dhn[j] = dn * rg[j];
    dh[j] = g[j] * z[j];
  }
}

// GRU's gates of units [j0, j0 + m) of one row: r, z, n, each m long at stride kBlock.
template <class T>
void gru_gates(const T* gx, const T* gh, int64_t h, int64_t j0, int64_t m, T* act) {
  T *r = act, *z = act + kBlock, *n = act + 2 * kBlock;
  add_to(m, gx + j0, gh + j0, r);
  add_to(m, gx + h + j0, gh + h + j0, z);
  unary_dense<T>(fn::Sigmoid{}, r, r, m);
  unary_dense<T>(fn::Sigmoid{}, z, z, m);
  gru_candidate(m, gx + 2 * h + j0, static_cast<const T*>(r), gh + 2 * h + j0, n);
  unary_dense<T>(fn::Tanh{}, n, n, m);
}

template <class T>
void gru_forward(const T* gx, const T* gh, const T* hp, T* out, int64_t rows, int64_t h) {
  for_blocks(rows, h, [&](int64_t r, int64_t j0, int64_t m) {
    alignas(64) T act[3 * kBlock];
    gru_gates(gx + r * 3 * h, gh + r * 3 * h, h, j0, m, act);
    const T *z = act + kBlock, *n = act + 2 * kBlock, *hr = hp + r * h + j0;
    T* o = out + r * h + j0;
    gru_state(m, z, n, hr, o);
  });
}

template <class T>
void gru_backward(const T* gx, const T* gh, const T* hp, const T* grad, T* out, int64_t rows,
                  int64_t h) {
  for_blocks(rows, h, [&](int64_t r, int64_t j0, int64_t m) {
    alignas(64) T act[3 * kBlock];
    const T* ghr = gh + r * 3 * h;
    gru_gates(gx + r * 3 * h, ghr, h, j0, m, act);
    const T *rg = act, *z = act + kBlock, *n = act + 2 * kBlock;
    const T *hr = hp + r * h + j0, *g = grad + r * h + j0, *hn = ghr + 2 * h + j0;
    T* d = out + r * 7 * h + j0;
    gru_grads(m, rg, z, n, hn, hr, g, d, d + h, d + 2 * h, d + 3 * h, d + 4 * h, d + 5 * h,
              d + 6 * h);
  });
}

// Runs body(T{}, p) with p the typed data of `out` (f32 or f64), or of a dense temporary copied
// into out afterwards, should out be strided.
template <class Body>
void on_dense_out(const Tensor& out, Body&& body) {
  const Tensor o =
      out.is_contiguous() ? out : detail::empty(out.sizes(), out.dtype(), out.device());
  if (out.dtype() == DType::f64)
    body(double{}, static_cast<double*>(o.raw_data()));
  else
    body(float{}, static_cast<float*>(o.raw_data()));
  if (!out.is_contiguous()) copy_into(o, out);
}

// Every cell kernel: the operands made dense, then `run` on typed pointers into `out`.
template <class Run>
void run_cell(TensorRefs in, const Tensor& out, Run&& run) {
  Tensor tmp[4];
  const Tensor* d[4] = {};
  for (int64_t k = 0; k < in.size(); ++k) d[k] = &dense(in[k], tmp[k]);
  const Tensor& c = in[2];
  const int64_t h = c.sizes()[c.dim() - 1];
  const int64_t rows = h == 0 ? 0 : c.numel() / h;
  on_dense_out(out, [&](auto zero, auto* o) {
    if (rows > 0) run(d, o, rows, h, zero);
  });
}

template <class T>
const T* data(const Tensor* t) {
  return static_cast<const T*>(t->raw_data());
}

void lstm_cell_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  run_cell(in, out, [](const Tensor* const* d, auto* o, int64_t rows, int64_t h, auto zero) {
    using T = decltype(zero);
    forward<T>(data<T>(d[0]), data<T>(d[1]), data<T>(d[2]), o, rows, h);
  });
}

void lstm_cell_backward_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  run_cell(in, out, [](const Tensor* const* d, auto* o, int64_t rows, int64_t h, auto zero) {
    using T = decltype(zero);
    backward<T>({data<T>(d[0]), 4 * h}, data<T>(d[1]), {data<T>(d[2]), h}, {data<T>(d[3]), 2 * h},
                o, rows, h);
  });
}

// lstm_step (Note [LSTM step] in core/ops/rnn.cpp): both products summed into the result's a
// columns (one GEMM, then a second accumulating into it), the biases added there, and the cell
// on them, without a temporary. x, h and c are read in place at their row strides (h and c are
// usually the previous step's result, 6H apart).
template <class T>
void step_forward(Rows<T> x, Rows<T> hp, Rows<T> c, const T* wi, const T* wh, const T* b, T* out,
                  int64_t rows, int64_t n_in, int64_t h) {
  const int64_t ld = 6 * h;
  gemm_rows(false, true, rows, 4 * h, n_in, x.p, x.rs, wi, n_in, T(0), out + 2 * h, ld);
  gemm_rows(false, true, rows, 4 * h, h, hp.p, hp.rs, wh, h, T(1), out + 2 * h, ld);
  for_blocks(rows, h, [&](int64_t r, int64_t j0, int64_t m) {
    alignas(64) T act[4 * kBlock];
    T* row = out + r * ld;
    gates(static_cast<const T*>(row + 2 * h), b, h, j0, m, act, row + 2 * h);  // a += b
    cell_out(static_cast<const T*>(act), c.row(r) + j0, row + j0, row + h + j0, m);
  });
}

// The stride from one of t's rows (its leading dims flattened) to the next where they step
// through memory as one dim, each at least a row apart, and its last dim is dense; -1 otherwise.
int64_t row_stride(const Tensor& t) {
  const Shape& s = t.sizes();
  const Strides& st = t.strides();
  const int64_t last = t.dim() - 1;
  if (last < 0 || (s[last] > 1 && st[last] != 1)) return -1;
  int64_t rs = s[last], next = -1, rows = 1;
  for (int64_t d = last - 1; d >= 0; --d) {
    rows *= s[d];
    if (s[d] == 1) continue;
    if (next < 0)
      rs = st[d];
    else if (st[d] != next)
      return -1;
    next = st[d] * s[d];
  }
  return rows > 1 && rs < s[last] ? -1 : rs;
}

// t's rows in place where row_stride finds them, else those of a dense copy held in tmp.
template <class T>
Rows<T> rows_of(const Tensor& t, Tensor& tmp) {
  const int64_t rs = row_stride(t);
  if (rs >= 0) return {static_cast<const T*>(t.raw_data()), rs};
  tmp = cast_to(t, t.dtype());
  return {static_cast<const T*>(tmp.raw_data()), t.sizes()[t.dim() - 1]};
}

void lstm_step_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const Tensor& c = in[2];
  const int64_t h = c.sizes()[c.dim() - 1], n_in = in[0].sizes()[in[0].dim() - 1];
  const int64_t rows = h == 0 ? 0 : c.numel() / h;
  if (rows == 0) return;
  on_dense_out(out, [&](auto zero, auto* o) {
    using T = decltype(zero);
    Tensor tmp[7];
    const Rows<T> x = rows_of<T>(in[0], tmp[0]), hp = rows_of<T>(in[1], tmp[1]),
                  cs = rows_of<T>(c, tmp[2]);
    const T* w[4];  // w_ih, w_hh, b_ih, b_hh, dense
    for (int k = 0; k < 4; ++k) w[k] = data<T>(&dense(in[3 + k], tmp[3 + k]));
    thread_local std::vector<T> b;  // the biases' sum
    b.resize(static_cast<size_t>(4 * h));
    add_to(4 * h, w[2], w[3], b.data());
    step_forward<T>(x, hp, cs, w[0], w[1], static_cast<const T*>(b.data()), o, rows, n_in, h);
  });
}

// a, c and g read in place at their row strides (a is the columns of lstm_step's result).
void lstm_step_backward_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const Tensor& c = in[1];
  const int64_t h = c.sizes()[c.dim() - 1];
  const int64_t rows = h == 0 ? 0 : c.numel() / h;
  if (rows == 0) return;
  on_dense_out(out, [&](auto zero, auto* o) {
    using T = decltype(zero);
    Tensor tmp[3];
    backward<T>(rows_of<T>(in[0], tmp[0]), nullptr, rows_of<T>(c, tmp[1]),
                rows_of<T>(in[2], tmp[2]), o, rows, h);
  });
}

}  // namespace rnn_cpu

// ---- lstm_step composed of other kernels (any device) -----------------------------------------

namespace {

// t as (rows, cols) on its device: itself when contiguous, else a contiguous copy.
Tensor as_rows(const Tensor& t, int64_t rows, int64_t cols) {
  Tensor d = t;
  if (!t.is_contiguous()) {
    d = detail::empty(t.sizes(), t.dtype(), t.device());
    copy_on_device(t, d);
  }
  return detail::make_view(d, Shape{rows, cols}, Strides{cols, 1}, d.storage_offset());
}
// Columns [from, from + n) of the (rows, width) matrix m.
Tensor columns(const Tensor& m, int64_t from, int64_t n) {
  return detail::make_view(m, Shape{m.sizes()[0], n}, Strides{m.strides()[0], m.strides()[1]},
                           m.storage_offset() + from * m.strides()[1]);
}
// The contiguous output as (rows, width), or a temporary that `finish` copies into it.
struct RowsOut {
  const Tensor& out;
  Tensor dense, m;
  RowsOut(const Tensor& o, int64_t rows, int64_t width)
      : out(o), dense(o.is_contiguous() ? o : detail::empty(o.sizes(), o.dtype(), o.device())) {
    m = detail::make_view(dense, Shape{rows, width}, Strides{width, 1}, dense.storage_offset());
  }
  void finish() {
    if (!dense.is_same(out)) copy_on_device(dense, out);
  }
};

}  // namespace

void lstm_step_composed_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const Tensor& c = in[2];
  const int64_t h = c.sizes()[c.dim() - 1], n_in = in[0].sizes()[in[0].dim() - 1];
  const int64_t rows = h == 0 ? 0 : c.numel() / h;
  if (out.numel() == 0) return;
  const Tensor x = as_rows(in[0], rows, n_in), hp = as_rows(in[1], rows, h);
  const Tensor cs = as_rows(c, rows, h);
  auto transposed = [](const Tensor& w) {
    return detail::make_view(w, Shape{w.sizes()[1], w.sizes()[0]},
                             Strides{w.strides()[1], w.strides()[0]}, w.storage_offset());
  };
  const Tensor wi = transposed(in[3]), wh = transposed(in[4]);
  auto make = [&](int64_t cols) {
    return detail::empty(Shape{rows, cols}, out.dtype(), out.device());
  };
  const Tensor gx = make(4 * h), gh = make(4 * h), cell = make(2 * h), a = make(4 * h);
  run_kernel(OpId::Addmm, {&in[5], &x, &wi}, Attrs{}, gx);
  run_kernel(OpId::Addmm, {&in[6], &hp, &wh}, Attrs{}, gh);
  run_kernel(OpId::LstmCell, {&gx, &gh, &cs}, Attrs{}, cell);
  run_kernel(OpId::Add, {&gx, &gh}, Attrs{}, a);
  RowsOut o(out, rows, 6 * h);
  copy_on_device(cell, columns(o.m, 0, 2 * h));
  copy_on_device(a, columns(o.m, 2 * h, 4 * h));
  o.finish();
}

void lstm_step_backward_composed_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  const Tensor& c = in[1];
  const int64_t h = c.sizes()[c.dim() - 1];
  const int64_t rows = h == 0 ? 0 : c.numel() / h;
  if (out.numel() == 0) return;
  const Tensor a = as_rows(in[0], rows, 4 * h), cs = as_rows(c, rows, h);
  const Tensor g = as_rows(in[2], rows, 6 * h), g2 = columns(g, 0, 2 * h);
  const Tensor ga = columns(g, 2 * h, 4 * h);
  auto make = [&](int64_t cols) {
    return detail::empty(Shape{rows, cols}, out.dtype(), out.device());
  };
  const Tensor zero = make(4 * h), r = make(5 * h), da = make(4 * h);
  Attrs fill;
  fill.value = 0.0;
  run_kernel(OpId::Full, {}, fill, zero);
  run_kernel(OpId::LstmCellBackward, {&a, &zero, &cs, &g2}, Attrs{}, r);
  const Tensor r_da = columns(r, 0, 4 * h);
  run_kernel(OpId::Add, {&r_da, &ga}, Attrs{}, da);  // g's own a columns (Note [LSTM step])
  RowsOut o(out, rows, 5 * h);
  copy_on_device(da, columns(o.m, 0, 4 * h));
  copy_on_device(columns(r, 4 * h, h), columns(o.m, 4 * h, h));
  o.finish();
}

namespace rnn_cpu {

void gru_cell_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  run_cell(in, out, [](const Tensor* const* d, auto* o, int64_t rows, int64_t h, auto zero) {
    using T = decltype(zero);
    gru_forward<T>(data<T>(d[0]), data<T>(d[1]), data<T>(d[2]), o, rows, h);
  });
}

void gru_cell_backward_kernel(TensorRefs in, const Attrs&, const Tensor& out) {
  run_cell(in, out, [](const Tensor* const* d, auto* o, int64_t rows, int64_t h, auto zero) {
    using T = decltype(zero);
    gru_backward<T>(data<T>(d[0]), data<T>(d[1]), data<T>(d[2]), data<T>(d[3]), o, rows, h);
  });
}

}  // namespace rnn_cpu

void register_rnn_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::LstmCell, DeviceType::CPU, via_wide<rnn_cpu::lstm_cell_kernel>);
  detail::register_kernel(t, OpId::LstmCellBackward, DeviceType::CPU,
                          via_wide<rnn_cpu::lstm_cell_backward_kernel>);
  detail::register_kernel(t, OpId::LstmStep, DeviceType::CPU, via_wide<rnn_cpu::lstm_step_kernel>);
  detail::register_kernel(t, OpId::LstmStepBackward, DeviceType::CPU,
                          via_wide<rnn_cpu::lstm_step_backward_kernel>);
  detail::register_kernel(t, OpId::GruCell, DeviceType::CPU, via_wide<rnn_cpu::gru_cell_kernel>);
  detail::register_kernel(t, OpId::GruCellBackward, DeviceType::CPU,
                          via_wide<rnn_cpu::gru_cell_backward_kernel>);
}

}  // namespace duet::kernels
