// duet: the CUDA runtime as the public API sees it. Built with nvcc when present; without it,
// or without a usable GPU and driver, is_available() is false (never an error).
#pragma once

#include <cstdint>

#include "core/allocator.h"

namespace duet::cuda {

/// True when a CUDA device and driver are usable (false without a GPU, a driver, or with a
/// driver older than the runtime duet was built with).
bool is_available();
/// The number of usable CUDA devices (0 without a GPU).
int device_count();
/// Waits for all work duet queued on every CUDA device it used (a no-op without a GPU).
void synchronize();
/// Returns the cached device memory of every device to the driver (a no-op without a GPU).
void empty_cache();

/// Counters of one device's caching allocator in bytes: current (held by live tensors, rounded
/// to the block size), peak, reserved (obtained with cudaMalloc, including the cache). All zero
/// for a device duet has not used, and without a GPU.
MemoryStats memory_stats(int device = 0);
/// Allocations served from one device's cache instead of cudaMalloc, since start.
int64_t cache_hits(int device = 0);
/// Starts a new high-water mark of one device at its current usage.
void reset_peak_memory_stats(int device = 0);

/// Counters of the fused CUDA kernels that compiled functions generate and NVRTC compiles
/// (Note [CUDA kernel cache] in cuda/fused.h), since the process started.
struct CodegenStats {
  int64_t built = 0;        ///< programs NVRTC compiled
  int64_t disk_hits = 0;    ///< found in the on-disk cache
  int64_t memory_hits = 0;  ///< already loaded by this process
  double build_ms = 0;      ///< wall time spent in NVRTC (a plan's batch, built side by side,
                            ///< counts its wall time once)
};
CodegenStats codegen_stats();

/// Whether f32 matmul may use TF32 tensor cores (about 10 mantissa bits; off by default, as in
/// PyTorch's torch.backends.cuda.matmul.allow_tf32).
void set_allow_tf32(bool allow);
/// The TF32 switch (see set_allow_tf32).
bool allow_tf32();

}  // namespace duet::cuda
