// CUDA kernels of where, cast/copy (any dtype to any dtype, any layouts), full and arange.
#include "cuda/kernels/common.cuh"

namespace duet::cuda::kern {
namespace {

struct Select {
  template <class T>
  __device__ T operator()(bool c, T a, T b) const {
    return c ? a : b;
  }
};

template <class T>
inline constexpr bool is_narrow_int_v =
    std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t> || std::is_same_v<T, int16_t>;

// A float to a narrow integer as the CPU kernel converts it: truncated to i64, then its low bits;
// NaN and values beyond i64 give 0.
template <class D>
__device__ D narrow_from_float(double x) {
  const bool fits = x > -9223372036854775808.0 && x < 9223372036854775808.0;
  return static_cast<D>(fits ? static_cast<int64_t>(x) : int64_t(0));
}

// Any dtype to any dtype. f16 and bf16 go through f32 (as Eigen's conversions on the CPU do:
// one rounding from f32, or a double or an integer converted to f32 first).
template <class D>
struct Convert {
  template <class S>
  __device__ D operator()(S v) const {
    if constexpr (is_low_v<S>) {
      const float f = low_to_float(v);
      if constexpr (is_low_v<D>)
        return float_to_low<D>(f);
      else if constexpr (std::is_same_v<D, bool>)
        return f != 0.0f;
      else if constexpr (is_narrow_int_v<D>)
        return narrow_from_float<D>(f);
      else
        return static_cast<D>(f);
    } else if constexpr (is_narrow_int_v<D> && std::is_floating_point_v<S>) {
      return narrow_from_float<D>(static_cast<double>(v));
    } else if constexpr (is_low_v<D>) {
      return float_to_low<D>(static_cast<float>(v));
    } else if constexpr (std::is_same_v<D, bool>) {
      return v != S(0);
    } else {
      return static_cast<D>(v);
    }
  }
};

template <class T>
__global__ void fill_kernel(T* out, int64_t n, T v) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) out[i] = v;
}
template <class T>
__global__ void arange_kernel(T* out, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = static_cast<T>(i);
}

}  // namespace

cudaError_t launch_where(DT dt, const Loop& L, cudaStream_t s) {
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    return run_elementwise<Select, T, bool, T, T>(L, Select{}, s);
  });
}

cudaError_t launch_convert(DT to, DT from, const Loop& L, cudaStream_t s) {
  return dispatch_dt_all(to, [&](auto d) -> cudaError_t {
    using D = decltype(d);
    return dispatch_dt_all(from, [&](auto v) -> cudaError_t {
      using S = decltype(v);
      return run_elementwise<Convert<D>, D, S>(L, Convert<D>{}, s);
    });
  });
}

cudaError_t launch_full(DT dt, void* out, int64_t n, const unsigned char* value, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    T v;
    memcpy(&v, value, sizeof(T));
    fill_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(out), n, v);
    return cudaGetLastError();
  });
}

cudaError_t launch_arange(DT dt, void* out, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    arange_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(out), n);
    return cudaGetLastError();
  });
}

}  // namespace duet::cuda::kern
