// duet: error checking for CUDA runtime and cuBLAS calls. Every call into CUDA goes through
// DUET_CUDA_CHECK (or DUET_CUBLAS_CHECK), which turns a failure into a duet::DeviceError naming
// the call, CUDA's error name and message, and the source line.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace duet::cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);
}  // namespace duet::cuda::detail

#define DUET_CUDA_CHECK(call)                                                            \
  do {                                                                                   \
    const cudaError_t duet_cuda_err_ = (call);                                           \
    if (duet_cuda_err_ != cudaSuccess)                                                   \
      ::duet::cuda::detail::throw_cuda_error(duet_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define DUET_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                          \
    const int duet_cublas_status_ = static_cast<int>(call);                                     \
    if (duet_cublas_status_ != 0)                                                               \
      ::duet::cuda::detail::throw_cublas_error(duet_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
