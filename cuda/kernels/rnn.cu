// CUDA kernels of LstmCell and LstmCellBackward (core/ops/rnn.cpp): PyTorch's LSTM cell on the
// gates i, f, g, o of gates_x + gates_h, one thread per (row, j) with j < H. Each thread reads
// its four gate pre-activations and c, and writes its h' and c' (forward) or its five gradients
// (backward), so no thread shares work with another and the sums have no order to fix.
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
__device__ __forceinline__ A ld(const LstmOperand& o, int64_t r, int64_t k) {
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

// The cell's activations at (r, j): the gates and the new cell state. The backward recomputes
// them rather than reading saved ones, so the forward needs no workspace.
template <class A>
struct Gates {
  A i, f, g, o, c, c2;
};
template <class T, class A>
__device__ __forceinline__ Gates<A> gates(const LstmArg& a, int64_t r, int64_t j) {
  const auto pre = [&](int k) {
    return ld<T, A>(a.gx, r, k * a.h + j) + ld<T, A>(a.gh, r, k * a.h + j);
  };
  Gates<A> s;
  s.i = sigmoid(pre(0));
  s.f = sigmoid(pre(1));
  s.g = tanh_of(pre(2));
  s.o = sigmoid(pre(3));
  s.c = ld<T, A>(a.c, r, j);
  s.c2 = s.f * s.c + s.i * s.g;
  return s;
}

template <class T, class A>
__global__ void lstm_cell_forward(LstmArg a) {
  const int64_t n = a.rows * a.h, step = int64_t(gridDim.x) * blockDim.x;
  T* out = static_cast<T*>(a.out);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t r = e / a.h, j = e % a.h;
    const Gates<A> s = gates<T, A>(a, r, j);
    T* row = out + r * 2 * a.h;
    st<T, A>(row + j, s.o * tanh_of(s.c2));
    st<T, A>(row + a.h + j, s.c2);
  }
}

template <class T, class A>
__global__ void lstm_cell_backward(LstmArg a) {
  const int64_t n = a.rows * a.h, step = int64_t(gridDim.x) * blockDim.x;
  T* out = static_cast<T*>(a.out);
  const A one = 1;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t r = e / a.h, j = e % a.h;
    const Gates<A> s = gates<T, A>(a, r, j);
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
  }
}

// Calls f(T{}, A{}): the storage type and the type the math runs in.
template <class F>
cudaError_t dispatch_lstm(DT dt, F&& f) {
  switch (dt) {
    case DT::f32:
      return f(float{}, float{});
    case DT::f64:
      return f(double{}, double{});
    case DT::f16:
      return f(__half{}, float{});
    case DT::bf16:
      return f(__nv_bfloat16{}, float{});
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace

cudaError_t launch_lstm_cell(DT dt, const LstmArg& arg, cudaStream_t s) {
  if (arg.rows * arg.h == 0) return cudaSuccess;
  return dispatch_lstm(dt, [&](auto t, auto acc) -> cudaError_t {
    using T = decltype(t);
    using A = decltype(acc);
    lstm_cell_forward<T, A><<<blocks_for(arg.rows * arg.h), kThreads, 0, s>>>(arg);
    return cudaGetLastError();
  });
}

cudaError_t launch_lstm_cell_backward(DT dt, const LstmArg& arg, cudaStream_t s) {
  if (arg.rows * arg.h == 0) return cudaSuccess;
  return dispatch_lstm(dt, [&](auto t, auto acc) -> cudaError_t {
    using T = decltype(t);
    using A = decltype(acc);
    lstm_cell_backward<T, A><<<blocks_for(arg.rows * arg.h), kThreads, 0, s>>>(arg);
    return cudaGetLastError();
  });
}

}  // namespace duet::cuda::kern
