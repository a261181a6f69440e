// duet: the memory of an eager region (duet::MemoryProfile; Note [Memory profile]).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace duet {

/// Records every tensor storage made and freed while it lives (RAII), with the op that made it
/// and the user's line, for the table a compiled function's memory_report() gives: the peak
/// above what was allocated when it began, and the buffers live there, largest first. The CPU's
/// storages and the GPUs' are counted apart, each with its own peak. Profiles are process-wide
/// and may nest.
class MemoryProfile {
 public:
  MemoryProfile();
  ~MemoryProfile();
  MemoryProfile(const MemoryProfile&) = delete;
  MemoryProfile& operator=(const MemoryProfile&) = delete;

  /// One storage live at the peak.
  struct Buffer {
    int64_t bytes = 0;
    std::string op;    ///< the op whose result it was ("matmul"), or "" (made outside an op)
    std::string site;  ///< the user's line ("model.cpp:12"), or ""
  };
  /// The most bytes held at once since it began, above what was held when it began (CPU).
  int64_t peak_bytes() const;
  /// The storages made since it began that were live at the peak, largest first (CPU).
  std::vector<Buffer> live_at_peak() const;
  /// The same for the storages in GPU memory (all CUDA devices together).
  int64_t cuda_peak_bytes() const;
  std::vector<Buffer> cuda_live_at_peak() const;
  /// A table: the peak, then the buffers live there with their ops and lines; the same for the
  /// GPU when the region made storages there.
  std::string str() const;

  struct State;  // core/memory_profile.cpp

 private:
  State* state_;
};

namespace detail {
/// Live MemoryProfiles: storages report to them while there is one (one relaxed load each).
extern std::atomic<int> g_memory_profiles;
/// The op being called on this thread while a MemoryProfile lives (dispatch sets it), else null.
extern thread_local const char* tls_profiled_op;
/// A storage of `bytes` at `key` made or freed, on the CPU or (`gpu`) a GPU, for the live
/// profiles.
void memory_profile_made(const void* key, int64_t bytes, bool gpu);
void memory_profile_freed(const void* key, int64_t bytes, bool gpu);
}  // namespace detail

}  // namespace duet
