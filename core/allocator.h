// duet: storage allocators. The CPU allocator caches freed blocks by size class so that the
// eager hot path (and a training loop) reuses memory instead of calling malloc and faulting in
// fresh pages. It reports current and peak bytes handed to tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace duet {

/// Memory counters of one allocator, in bytes.
struct MemoryStats {
  int64_t current = 0;   ///< bytes held by live storages (rounded to the size class)
  int64_t peak = 0;      ///< high-water mark of `current` since start or reset_peak()
  int64_t reserved = 0;  ///< bytes obtained from the system, including the cache
};

/// An allocator for one device type. Implementations are thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  /// Called from destructors, also while an exception unwinds: never throws (a block it cannot
  /// cache goes back to the system).
  virtual void deallocate(void* p, size_t nbytes) noexcept = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  /// Returns cached blocks to the system.
  virtual void empty_cache() = 0;
};

/// The caching allocator for CPU storage (64-byte aligned blocks).
Allocator& cpu_allocator();
/// Counters of the CPU caching allocator.
MemoryStats cpu_memory_stats();
/// Starts a new high-water mark at the current usage.
void reset_peak_memory();

/// What a device backend (CUDA) lends core, so that core does not depend on it: the allocator of
/// a device, and copies to and from it. The backend registers it once, at initialisation.
struct DeviceBackend {
  /// Throws DeviceError ("[op] cuda:1 is not usable: ...") unless `device` can be used now.
  void (*check)(Device device, const char* op) = nullptr;
  /// The caching allocator of one device (checked first).
  Allocator& (*allocator)(Device device) = nullptr;
  /// Copies nbytes of contiguous data from src on `from` to dst on `to` (either may be the CPU),
  /// ordered after earlier work on both devices. A copy to the CPU returns once the data is there.
  void (*copy)(void* dst, Device to, const void* src, Device from, size_t nbytes) = nullptr;
  // Graph capture and replay (Note [CUDA graph capture] in cuda/runtime.cpp); null where the
  // backend has none. begin_capture starts capturing the device's stream on this thread, whose
  // allocations on the device then come from a private pool, and returns that pool.
  void* (*begin_capture)(Device device) = nullptr;
  /// Ends the capture begun with `pool`: an executable graph, or null with *why set.
  void* (*end_capture)(Device device, void* pool, std::string* why) = nullptr;
  /// Replays a graph on the device's stream (asynchronously).
  void (*launch_graph)(void* graph, Device device) = nullptr;
  /// Frees a graph and its pool once the device is done with it.
  void (*destroy_graph)(void* graph, Device device) = nullptr;
  // Device time for the profiler (Note [Device time in profiles] in core/profiler.h); null
  // where the backend keeps none. record_event marks the device's stream now (null while it is
  // captured); elapsed_ms waits for `end` and gives the milliseconds from `start` to it;
  // destroy_event frees an event.
  void* (*record_event)(Device device) = nullptr;
  double (*elapsed_ms)(void* start, void* end) = nullptr;
  void (*destroy_event)(void* event) = nullptr;
};

namespace detail {
/// Registers the backend of a device type (called once, from register_backends()).
void set_device_backend(DeviceType type, const DeviceBackend& backend);
/// The backend of a non-CPU device type, or null when this build has none. Initialises the
/// library first (the op table registers the backends).
const DeviceBackend* device_backend(DeviceType type);
/// Throws DeviceError unless `device` is the CPU or a usable device of a backend in this build.
void check_device_usable(Device device, const char* op);
}  // namespace detail

}  // namespace duet
