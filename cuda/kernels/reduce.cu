// CUDA kernels of sum, max, min and argmax: each output folds its reduced elements in a warp
// (few elements), a block (many) or a thread (outputs side by side in the input), threads
// striding over the elements and combining with warp shuffles, then across warps through shared
// memory; a thread adds its floating-point share in a cascade (Note [Cascade sums] in
// kernels/functors.h). When the outputs alone would leave most of the device idle, each output's
// elements are folded in slices by blocks of their own, then the slices' partials in order (two
// passes). The semantics are the CPU's: integers and b8 sum in i64 (wrapping), max/min
// propagate NaN (fn::Maximum/Minimum), argmax keeps the first index of the largest value with
// NaN counting as largest.
#include <cfloat>
#include <climits>

#include "cuda/kernels/common.cuh"
#include "kernels/functors.h"

namespace duet::cuda::kern {
namespace {

template <class T>
__device__ __forceinline__ T shfl_down(T v, int d) {
  if constexpr (std::is_same_v<T, bool>)
    return __shfl_down_sync(0xffffffffu, static_cast<int>(v), d) != 0;
  else if constexpr (std::is_same_v<T, int64_t>)
    return static_cast<int64_t>(__shfl_down_sync(0xffffffffu, static_cast<long long>(v), d));
  else
    return __shfl_down_sync(0xffffffffu, v, d);
}

template <class T>
struct SumOp {
  using Acc = T;
  static constexpr bool kCascade = fn::is_float_v<T>;  // Note [Cascade sums]
  __device__ static Acc identity() { return T(0); }
  template <class S>
  __device__ static Acc make(S v, int64_t) {
    return static_cast<T>(v);
  }
  __device__ static Acc combine(Acc a, Acc b) { return fn::Add{}(a, b); }
  __device__ static Acc shfl(Acc a, int d) { return shfl_down(a, d); }
  __device__ static void store(void* out, int64_t o, Acc a) { static_cast<T*>(out)[o] = a; }
};

template <class T>
__device__ __forceinline__ T lowest() {
  if constexpr (std::is_same_v<T, float>)
    return -INFINITY;
  else if constexpr (std::is_same_v<T, double>)
    return -static_cast<double>(INFINITY);
  else if constexpr (std::is_same_v<T, int32_t>)
    return INT_MIN;
  else if constexpr (std::is_same_v<T, int64_t>)
    return LLONG_MIN;
  else
    return false;
}
template <class T>
__device__ __forceinline__ T highest() {
  if constexpr (std::is_same_v<T, float>)
    return INFINITY;
  else if constexpr (std::is_same_v<T, double>)
    return static_cast<double>(INFINITY);
  else if constexpr (std::is_same_v<T, int32_t>)
    return INT_MAX;
  else if constexpr (std::is_same_v<T, int64_t>)
    return LLONG_MAX;
  else
    return true;
}

template <class T, bool IsMax>
struct ExtremumOp {
  using Acc = T;
  static constexpr bool kCascade = false;  // exact in any order
  __device__ static Acc identity() { return IsMax ? lowest<T>() : highest<T>(); }
  __device__ static Acc make(T v, int64_t) { return v; }
  __device__ static Acc combine(Acc a, Acc b) {
    if constexpr (IsMax)
      return fn::Maximum{}(a, b);
    else
      return fn::Minimum{}(a, b);
  }
  __device__ static Acc shfl(Acc a, int d) { return shfl_down(a, d); }
  __device__ static void store(void* out, int64_t o, Acc a) { static_cast<T*>(out)[o] = a; }
};

template <class T>
struct ArgPair {
  T v;
  int64_t i;  // -1: empty
};
template <class T>
struct ArgmaxOp {
  using Acc = ArgPair<T>;
  static constexpr bool kCascade = false;
  __device__ static Acc identity() { return {T(0), -1}; }
  __device__ static Acc make(T v, int64_t i) { return {v, i}; }
  __device__ static bool isnan_(T v) {
    if constexpr (std::is_floating_point_v<T>)
      return v != v;
    else
      return false;
  }
  // Order-independent: NaN beats numbers, larger beats smaller, ties go to the lower index.
  __device__ static Acc combine(Acc a, Acc b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool na = isnan_(a.v), nb = isnan_(b.v);
    if (na != nb) return na ? a : b;
    if (!na && a.v != b.v) return a.v > b.v ? a : b;
    return a.i < b.i ? a : b;
  }
  __device__ static Acc shfl(Acc a, int d) { return {shfl_down(a.v, d), shfl_down(a.i, d)}; }
  __device__ static void store(void* out, int64_t o, Acc a) {
    static_cast<int64_t*>(out)[o] = a.i < 0 ? 0 : a.i;
  }
};

__device__ __forceinline__ int64_t offset_of(int64_t i, int n, const int64_t* sizes,
                                             const int64_t* strides) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= n) continue;
    const int64_t c = i % sizes[d];
    i /= sizes[d];
    off += c * strides[d];
  }
  return off;
}

template <class Op>
__device__ __forceinline__ typename Op::Acc warp_fold(typename Op::Acc a) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) a = Op::combine(a, Op::shfl(a, d));
  return a;
}

// One thread's fold of values given one at a time: floating-point sums add in a cascade (Note
// [Cascade sums] in kernels/functors.h), the others in any order.
template <class Op>
struct ThreadFold {
  using Acc = typename Op::Acc;
  fn::CascadeRun<Acc, fn::Add> run{Op::identity()};
  Acc acc = Op::identity();
  __device__ __forceinline__ void add(Acc v) {
    if constexpr (Op::kCascade)
      run.add(v);
    else
      acc = Op::combine(acc, v);
  }
  __device__ __forceinline__ Acc total() const {
    if constexpr (Op::kCascade)
      return run.total();
    else
      return acc;
  }
};

// Lanes [0, nlanes) fold output o's elements [lo, hi).
template <class Op, class S>
__device__ __forceinline__ typename Op::Acc partial(const ReduceArg& A, int64_t o, int64_t lo,
                                                    int64_t hi, int lane, int nlanes) {
  const S* in = static_cast<const S*>(A.in) + offset_of(o, A.nkept, A.kept_sizes, A.kept_strides);
  ThreadFold<Op> f;
  for (int64_t r = lo + lane; r < hi; r += nlanes)
    f.add(Op::make(in[offset_of(r, A.nreduced, A.red_sizes, A.red_strides)], r));
  return f.total();
}

// Folds one value per thread of the block; the result is valid in thread 0. Every thread of the
// block must call it (it synchronizes).
template <class Op>
__device__ __forceinline__ typename Op::Acc block_fold(typename Op::Acc acc) {
  __shared__ typename Op::Acc part[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  acc = warp_fold<Op>(acc);
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (warp == 0) acc = warp_fold<Op>(lane < warps ? part[lane] : Op::identity());
  __syncthreads();  // part is reused by the next call
  return acc;
}

// One warp per output (few reduced elements per output).
template <class Op, class S>
__global__ void reduce_warp(ReduceArg A) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t o = int64_t(blockIdx.x) * warps + threadIdx.x / 32; o < A.nout;
       o += int64_t(gridDim.x) * warps) {
    typename Op::Acc acc = warp_fold<Op>(partial<Op, S>(A, o, 0, A.nred, lane, 32));
    if (lane == 0) Op::store(A.out, o, acc);
  }
}

// One thread per output, when neighbouring outputs sit next to each other in the input (a
// reduction over outer dims, as the bias gradient sums over the batch): a warp's loads coalesce.
template <class Op, class S>
__global__ void reduce_thread(ReduceArg A) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < A.nout; o += step) {
    const typename Op::Acc acc = partial<Op, S>(A, o, 0, A.nred, 0, 1);
    Op::store(A.out, o, acc);
  }
}

// One block per output (many reduced elements per output).
template <class Op, class S>
__global__ void reduce_block(ReduceArg A) {
  for (int64_t o = blockIdx.x; o < A.nout; o += gridDim.x) {
    const typename Op::Acc acc =
        block_fold<Op>(partial<Op, S>(A, o, 0, A.nred, threadIdx.x, blockDim.x));
    if (threadIdx.x == 0) Op::store(A.out, o, acc);
  }
}

// Few outputs with very many elements each: nsplit blocks per output write partial results to
// the scratch buffer (in a fixed order, so sums do not depend on timing), then one block per
// output folds its partials.
template <class Op, class S>
__global__ void reduce_split(ReduceArg A) {
  const int64_t chunk = (A.nred + A.nsplit - 1) / A.nsplit;
  for (int64_t b = blockIdx.x; b < A.nout * A.nsplit; b += gridDim.x) {
    const int64_t o = b / A.nsplit, lo = (b % A.nsplit) * chunk;
    const int64_t hi = lo + chunk < A.nred ? lo + chunk : A.nred;
    const typename Op::Acc acc =
        block_fold<Op>(partial<Op, S>(A, o, lo, hi, threadIdx.x, blockDim.x));
    if (threadIdx.x == 0) static_cast<typename Op::Acc*>(A.scratch)[b] = acc;
  }
}
template <class Op>
__global__ void reduce_partials(ReduceArg A) {
  const typename Op::Acc* part = static_cast<const typename Op::Acc*>(A.scratch);
  for (int64_t o = blockIdx.x; o < A.nout; o += gridDim.x) {
    typename Op::Acc acc = Op::identity();
    for (int64_t c = threadIdx.x; c < A.nsplit; c += blockDim.x)
      acc = Op::combine(acc, part[o * A.nsplit + c]);
    acc = block_fold<Op>(acc);
    if (threadIdx.x == 0) Op::store(A.out, o, acc);
  }
}

// Thread per output with too few outputs to fill the device (a bias gradient of 1024 features
// over a large batch): slice c = blockIdx.y of every output's elements is folded into partial
// c * nout + o, then one thread per output folds its nsplit partials in slice order. Both
// passes keep a warp's accesses side by side.
template <class Op, class S>
__global__ void reduce_thread_split(ReduceArg A) {
  const int64_t chunk = (A.nred + A.nsplit - 1) / A.nsplit, lo = int64_t(blockIdx.y) * chunk;
  const int64_t hi = lo + chunk < A.nred ? lo + chunk : A.nred;
  auto* part = static_cast<typename Op::Acc*>(A.scratch) + int64_t(blockIdx.y) * A.nout;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < A.nout; o += step)
    part[o] = partial<Op, S>(A, o, lo, hi, 0, 1);
}
template <class Op>
__global__ void reduce_thread_partials(ReduceArg A) {
  const auto* part = static_cast<const typename Op::Acc*>(A.scratch);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < A.nout; o += step) {
    ThreadFold<Op> f;
    for (int64_t c = 0; c < A.nsplit; ++c) f.add(part[c * A.nout + o]);
    Op::store(A.out, o, f.total());
  }
}

// Neighbouring outputs side by side in the input and many elements each: a thread per output.
bool thread_per_output(const ReduceArg& A) {
  return A.nkept > 0 && A.kept_strides[A.nkept - 1] == 1 && A.nout >= 1024 &&
         (A.nreduced == 0 || A.red_strides[A.nreduced - 1] != 1);
}

template <class Op, class S>
cudaError_t run(const ReduceArg& A, cudaStream_t s) {
  static_assert(sizeof(typename Op::Acc) <= kReduceScratchBytes, "scratch too small");
  if (A.nout == 0) return cudaSuccess;
  const unsigned outs = static_cast<unsigned>(A.nout < 65536 ? A.nout : 65536);
  const bool by_thread = thread_per_output(A);
  if (A.nsplit > 1 && A.scratch && by_thread) {
    reduce_thread_split<Op, S>
        <<<dim3(blocks_for(A.nout), static_cast<unsigned>(A.nsplit)), kThreads, 0, s>>>(A);
    reduce_thread_partials<Op><<<blocks_for(A.nout), kThreads, 0, s>>>(A);
  } else if (A.nsplit > 1 && A.scratch) {
    const int64_t nb = A.nout * A.nsplit;
    reduce_split<Op, S><<<static_cast<unsigned>(nb < 65536 ? nb : 65536), kThreads, 0, s>>>(A);
    reduce_partials<Op><<<outs, kThreads, 0, s>>>(A);
  } else if (by_thread) {
    reduce_thread<Op, S><<<blocks_for(A.nout), kThreads, 0, s>>>(A);
  } else if (A.nred > 256) {
    reduce_block<Op, S><<<outs, kThreads, 0, s>>>(A);
  } else {
    reduce_warp<Op, S><<<blocks_for(A.nout * 32), kThreads, 0, s>>>(A);
  }
  return cudaGetLastError();
}

}  // namespace

int64_t reduce_splits(const ReduceArg& A) {
  if (thread_per_output(A)) {
    // Fewer than 64 blocks of outputs: slices of at least 64 elements, up to 256 blocks in all.
    const int64_t blocks = (A.nout + kThreads - 1) / kThreads;
    if (blocks >= 64 || A.nred < 128) return 1;
    const int64_t by_size = A.nred / 64, by_blocks = (256 + blocks - 1) / blocks;
    const int64_t n = by_size < by_blocks ? by_size : by_blocks;
    return n < 2 ? 1 : n;
  }
  if (A.nred < (int64_t(1) << 16) || A.nout > 64) return 1;
  const int64_t by_size = A.nred / 16384, by_blocks = 1024 / A.nout;
  const int64_t n = by_size < by_blocks ? by_size : by_blocks;
  return n < 2 ? 1 : n;
}

cudaError_t launch_reduce(Reduce op, DT in, DT out, const ReduceArg& A, cudaStream_t s) {
  if (op == Reduce::Sum) {
    return dispatch_dt(in, [&](auto zi) -> cudaError_t {
      using S = decltype(zi);
      if (out == DT::i64 && !std::is_floating_point_v<S>) return run<SumOp<int64_t>, S>(A, s);
      if constexpr (std::is_floating_point_v<S>) {
        if ((out == DT::f32) == std::is_same_v<S, float>) return run<SumOp<S>, S>(A, s);
      }
      return cudaErrorNotSupported;
    });
  }
  if (in != out && op != Reduce::Argmax) return cudaErrorNotSupported;
  return dispatch_dt(in, [&](auto zi) -> cudaError_t {
    using S = decltype(zi);
    switch (op) {
      case Reduce::Max:
        return run<ExtremumOp<S, true>, S>(A, s);
      case Reduce::Min:
        return run<ExtremumOp<S, false>, S>(A, s);
      case Reduce::Argmax:
        return run<ArgmaxOp<S>, S>(A, s);
      default:
        return cudaErrorNotSupported;
    }
  });
}

}  // namespace duet::cuda::kern
