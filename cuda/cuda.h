// duet: the CUDA runtime as the public API sees it. Built with nvcc when present; without it,
// or without a usable GPU and driver, is_available() is false (never an error).
#pragma once

namespace duet::cuda {

/// True when a CUDA device and driver are usable.
bool is_available();
/// The number of usable CUDA devices (0 without a GPU).
int device_count();
/// Waits for all work on the current device (a no-op without a GPU).
void synchronize();
/// Returns cached device memory to the driver (a no-op without a GPU).
void empty_cache();

}  // namespace duet::cuda
