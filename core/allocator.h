// duet: storage allocators. The CPU allocator caches freed blocks by size class so that the
// eager hot path (and a training loop) reuses memory instead of calling malloc and faulting in
// fresh pages. It reports current and peak bytes handed to tensors.
#pragma once

#include <cstddef>
#include <cstdint>

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
  virtual void deallocate(void* p, size_t nbytes) = 0;
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

}  // namespace duet
