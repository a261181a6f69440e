// CUDA kernels of LstmCell, GruCell and their gradients (core/ops/rnn.cpp): PyTorch's LSTM cell on
// the gates i, f, g, o of gates_x + gates_h, and its GRU cell on the gates r, z, n of gates_x and
// gates_h, one thread per (row, j) with j < H. Each thread reads its gate pre-activations and its
// unit of the state (c or h), and writes its unit of the result (h' and c' for the LSTM, h' for
// the GRU) or its gradients (five for the LSTM, seven for the GRU), so no thread shares work
// with another and the sums have no order to fix.
//
// The math is the elementwise functors' (kernels/functors.h), as on the CPU, in f32 for f16 and
// bf16 (loaded as floats, rounded once when stored) and in f64 for f64.
#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class A>
__device__ __forceinline__ A sigmoid(A x) {
  return duet::fn::Sigmoid{}(x);
}
template <class A>
__device__ __forceinline__ A tanh_of(A x) {
  return duet::fn::Tanh{}(x);
}

// Element (r, k) of an operand, as the accumulation type A.
template <class T, class A>
__device__ __forceinline__ A ld(const CellOperand& o, int64_t r, int64_t k) {
  const T v = static_cast<const T*>(o.data)[r * o.rs + k * o.cs];
  if constexpr (is_low_v<T>)
    return static_cast<A>(low_to_float(v));
  else
    return static_cast<A>(v);
}

template <class T, class A>
__device__ __forceinline__ void st(T* p, A v) {
  if constexpr (is_low_v<T>)
    *p = float_to_low<T>(static_cast<float>(v));
  else
    *p = static_cast<T>(v);
}

// Calls f(r, j) for every unit, r < rows and j < H, striding over the grid.
template <class F>
__device__ __forceinline__ void each_unit(const CellArg& a, F f) {
  const int64_t n = a.rows * a.h, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step)
    f(e / a.h, e % a.h);
}

// ---- LSTM ----

// The cell's activations at (r, j): the gates and the new cell state. The backward recomputes
// them rather than reading saved ones, so the forward needs no workspace.
template <class A>
struct LstmGates {
  A i, f, g, o, c, c2;
};
template <class T, class A>
__device__ __forceinline__ LstmGates<A> lstm_gates(const CellArg& a, int64_t r, int64_t j) {
  const auto pre = [&](int k) {
    return ld<T, A>(a.gx, r, k * a.h + j) + ld<T, A>(a.gh, r, k * a.h + j);
  };
  LstmGates<A> s;
  s.i = sigmoid(pre(0));
  s.f = sigmoid(pre(1));
  s.g = tanh_of(pre(2));
  s.o = sigmoid(pre(3));
  s.c = ld<T, A>(a.state, r, j);
  s.c2 = s.f * s.c + s.i * s.g;
  return s;
}

template <class T, class A>
__global__ void lstm_cell_forward(CellArg a) {
  T* out = static_cast<T*>(a.out);
  each_unit(a, [&](int64_t r, int64_t j) {
    const LstmGates<A> s = lstm_gates<T, A>(a, r, j);
    T* row = out + r * 2 * a.h;
    st<T, A>(row + j, s.o * tanh_of(s.c2));
    st<T, A>(row + a.h + j, s.c2);
  });
}

template <class T, class A>
__global__ void lstm_cell_backward(CellArg a) {
  T* out = static_cast<T*>(a.out);
  const A one = 1;
  each_unit(a, [&](int64_t r, int64_t j) {
    const LstmGates<A> s = lstm_gates<T, A>(a, r, j);
    const A tc = tanh_of(s.c2);
    const A dh = ld<T, A>(a.g, r, j), dcin = ld<T, A>(a.g, r, a.h + j);
    // The gradient reaching c' directly and through h' = o * tanh(c').
    const A dc = dcin + dh * s.o * (one - tc * tc);
    T* row = out + r * 5 * a.h;
    st<T, A>(row + j, dc * s.g * s.i * (one - s.i));
    st<T, A>(row + a.h + j, dc * s.c * s.f * (one - s.f));
    st<T, A>(row + 2 * a.h + j, dc * s.i * (one - s.g * s.g));
    st<T, A>(row + 3 * a.h + j, dh * tc * s.o * (one - s.o));
    st<T, A>(row + 4 * a.h + j, dc * s.f);
  });
}

// ---- GRU ----

// The cell's activations at (r, j): the gates, the hidden part of n's pre-activation (which the
// reset gate scales) and h, recomputed by the backward as the LSTM's.
template <class A>
struct GruGates {
  A r, z, n, gn, h;
};
template <class T, class A>
__device__ __forceinline__ GruGates<A> gru_gates(const CellArg& a, int64_t r, int64_t j) {
  const auto x = [&](int k) { return ld<T, A>(a.gx, r, k * a.h + j); };
  const auto hid = [&](int k) { return ld<T, A>(a.gh, r, k * a.h + j); };
  GruGates<A> s;
  s.r = sigmoid(x(0) + hid(0));
  s.z = sigmoid(x(1) + hid(1));
  s.gn = hid(2);
  s.n = tanh_of(x(2) + s.r * s.gn);
  s.h = ld<T, A>(a.state, r, j);
  return s;
}

template <class T, class A>
__global__ void gru_cell_forward(CellArg a) {
  T* out = static_cast<T*>(a.out);
  const A one = 1;
  each_unit(a, [&](int64_t r, int64_t j) {
    const GruGates<A> s = gru_gates<T, A>(a, r, j);
    st<T, A>(out + r * a.h + j, (one - s.z) * s.n + s.z * s.h);
  });
}

template <class T, class A>
__global__ void gru_cell_backward(CellArg a) {
  T* out = static_cast<T*>(a.out);
  const A one = 1;
  each_unit(a, [&](int64_t r, int64_t j) {
    const GruGates<A> s = gru_gates<T, A>(a, r, j);
    const A g = ld<T, A>(a.g, r, j);
    // The gradients of n's, z's and r's pre-activations.
    const A dn = g * (one - s.z) * (one - s.n * s.n);
    const A dz = g * (s.h - s.n) * s.z * (one - s.z);
    const A dr = dn * s.gn * s.r * (one - s.r);
    T* row = out + r * 7 * a.h;
    st<T, A>(row + j, dr);  // gates_x
    st<T, A>(row + a.h + j, dz);
    st<T, A>(row + 2 * a.h + j, dn);
    st<T, A>(row + 3 * a.h + j, dr);  // gates_h
    st<T, A>(row + 4 * a.h + j, dz);
    st<T, A>(row + 5 * a.h + j, dn * s.r);
    st<T, A>(row + 6 * a.h + j, g * s.z);  // h
  });
}

// Launches the kernel pick(T{}, A{}) returns over the rows * H units.
template <class Pick>
cudaError_t launch_cell(DT dt, const CellArg& arg, cudaStream_t s, Pick pick) {
  if (arg.rows * arg.h == 0) return cudaSuccess;
  return dispatch_floating(dt, [&](auto t, auto acc) -> cudaError_t {
    const auto kernel = pick(t, acc);
    kernel<<<blocks_for(arg.rows * arg.h), kThreads, 0, s>>>(arg);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_lstm_cell(DT dt, const CellArg& arg, cudaStream_t s) {
  return launch_cell(
      dt, arg, s, [](auto t, auto acc) { return lstm_cell_forward<decltype(t), decltype(acc)>; });
}

cudaError_t launch_lstm_cell_backward(DT dt, const CellArg& arg, cudaStream_t s) {
  return launch_cell(
      dt, arg, s, [](auto t, auto acc) { return lstm_cell_backward<decltype(t), decltype(acc)>; });
}

cudaError_t launch_gru_cell(DT dt, const CellArg& arg, cudaStream_t s) {
  return launch_cell(dt, arg, s,
                     [](auto t, auto acc) { return gru_cell_forward<decltype(t), decltype(acc)>; });
}

cudaError_t launch_gru_cell_backward(DT dt, const CellArg& arg, cudaStream_t s) {
  return launch_cell(
      dt, arg, s, [](auto t, auto acc) { return gru_cell_backward<decltype(t), decltype(acc)>; });
}

}  // namespace duet::cuda::kern
