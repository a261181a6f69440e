// duet: the CUDA runtime as duet's own CUDA code sees it (kernels, the allocator, transfers).
// Only built with nvcc present (DUET_WITH_CUDA); cuda/cuda.h is the public API.
#pragma once

#include <cuda_runtime.h>

#include "core/allocator.h"
#include "core/device.h"

namespace duet::cuda::detail {

/// The stream duet's work on `device` runs on (one per device, created on first use). Eager
/// kernels and transfers are enqueued on it in order; reading data on the host synchronizes it.
cudaStream_t stream(Device device);
/// Makes `device` current for the calling thread (cudaSetDevice when it changes).
void set_device(Device device);
/// The caching allocator of one device (stats: current, peak, reserved, cache hits).
Allocator& allocator(Device device);
/// Cache hits of a device's allocator since start.
int64_t cache_hits(Device device);
/// Whether TF32 tensor cores may be used for f32 matmul (off by default; cuda::set_allow_tf32).
bool allow_tf32();
/// Whether work on stream s is being captured into a CUDA graph.
bool capturing(cudaStream_t s);
/// The index-error record of `device` (Note [Device index checks] in cuda/runtime.cpp): five
/// i64 in host-mapped memory, {set, index, size, dim, op}, that gather and scatter_add write.
int64_t* index_error_record(Device device);
/// Throws the ValueError that a kernel on `device` recorded since the last check, and clears the
/// record. Called once the device's stream has been synchronized.
void throw_recorded_index_error(Device device);
/// Lends core this backend (allocator, transfers): called once from register_backends().
void register_runtime();

}  // namespace duet::cuda::detail
