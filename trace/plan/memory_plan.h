// duet: the memory planner (the "plan_memory" pass). Every intermediate buffer of a plan gets an
// offset in one arena, from its live interval over the final schedule: a buffer is live from the
// step that writes it to the last step that reads it (directly or through a view). Buffers whose
// intervals do not overlap may share bytes. A step that may write its result over an input that
// dies there (an elementwise op or a fused group reading it at the same index) inherits that
// input's bytes: the planner merges the two into one buffer, so a matmul's output is finished in
// place by its epilogue and a chain of updates needs one buffer.
//
// The planner simulates an allocator over the schedule: at each step the buffers that died
// before it go back to a free list (neighbouring holes merge), and new ones take the best-fitting
// hole, or grow the arena. Offsets are 64-byte aligned.
//
// A plan whose buffers live on several devices (a function that moves data between the CPU and
// a GPU) has one arena per device: each request names its pool, and pools are planned apart.
//
// Donated regions are bytes outside the arena that hold nothing for some steps: a write-back
// target whose old value is dead before the plan writes its new one (Note [Intermediates in dead
// write-back targets] in trace/plan/plan_build.cpp). A buffer whose whole life falls inside a
// region's window may be placed there instead of in the arena; the planner prefers a region to
// the arena, and of regions the one whose window closes first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace duet::detail {

struct BufferRequest {
  int64_t bytes = 0;
  int32_t first = 0;  ///< the step that writes it
  int32_t last = 0;   ///< the last step that reads it (>= first)
  /// Another request whose bytes this one reuses in place (that one's last == this one's
  /// first, same byte size), or -1.
  int32_t reuse = -1;
  /// The arena it lives in (one per device); a request reused in place is in the same pool.
  int32_t pool = 0;
};

/// Bytes outside the arena, free from step `from` to step `until` (both included).
struct DonatedRegion {
  int64_t bytes = 0;
  int32_t from = 0;
  int32_t until = -1;
  int32_t pool = 0;  ///< the device's pool its buffers would otherwise be in
};

struct MemoryPlan {
  std::vector<int64_t> offsets;     ///< per request, in its pool's arena or in its region
  std::vector<int32_t> region;      ///< per request: its donated region, or -1 (the arena)
  std::vector<int64_t> pool_bytes;  ///< per pool: its arena's size
  int64_t arena_bytes = 0;          ///< all pools together
};

/// `lendable`, when not empty: per request, whether it may go in a region (chains: their first).
MemoryPlan plan_memory(const std::vector<BufferRequest>& requests,
                       const std::vector<DonatedRegion>& regions = {},
                       const std::vector<bool>& lendable = {});

/// Chains of in-place reuse: per request, the first request of its chain (owner), and per owner
/// the last step any request of its chain is read (last).
void reuse_chains(const std::vector<BufferRequest>& requests, std::vector<int32_t>& owner,
                  std::vector<int32_t>& last);

/// The step where the buffers in the arena (not in regions) add up to the most, and the
/// requests live there (chains of in-place reuse: their first).
std::vector<int32_t> live_at_arena_peak(const std::vector<BufferRequest>& requests,
                                        const MemoryPlan& plan);

/// The planner's invariant: no two buffers of one pool (or one region) live at the same step
/// overlap, except a buffer and the one it reuses in place, and a buffer in a region lives
/// within its window. Returns "" or a description of the first violation.
std::string check_memory_plan(const std::vector<BufferRequest>& requests, const MemoryPlan& plan,
                              const std::vector<DonatedRegion>& regions = {});

}  // namespace duet::detail
