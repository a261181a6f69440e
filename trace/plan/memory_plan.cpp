// The memory planner: see trace/plan/memory_plan.h.
#include "trace/plan/memory_plan.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace duet::detail {
namespace {

constexpr int64_t kAlign = 64;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferRequest>& req) {
  const int32_t n = static_cast<int32_t>(req.size());
  MemoryPlan plan;
  plan.offsets.assign(n, -1);
  // Chains of in-place reuse become one buffer, live from the first write to the last read.
  std::vector<int32_t> owner(n);
  std::vector<int32_t> last(n);
  for (int32_t i = 0; i < n; ++i) {
    owner[i] = req[i].reuse >= 0 ? owner[req[i].reuse] : i;
    last[owner[i]] = std::max(req[i].last, req[i].reuse >= 0 ? last[owner[i]] : req[i].last);
  }
  int32_t pools = 0;
  for (const BufferRequest& r : req) pools = std::max(pools, r.pool + 1);
  plan.pool_bytes.assign(pools, 0);
  for (int32_t pool = 0; pool < pools; ++pool) {
    int64_t& arena = plan.pool_bytes[pool];
    // Events in schedule order: allocations at `first`, frees after `last`.
    std::vector<int32_t> roots;
    for (int32_t i = 0; i < n; ++i)
      if (owner[i] == i && req[i].bytes > 0 && req[i].pool == pool) roots.push_back(i);
    std::vector<int32_t> by_start = roots, by_end = roots;
    std::stable_sort(by_start.begin(), by_start.end(),
                     [&](int32_t a, int32_t b) { return req[a].first < req[b].first; });
    std::stable_sort(by_end.begin(), by_end.end(),
                     [&](int32_t a, int32_t b) { return last[a] < last[b]; });
    std::map<int64_t, int64_t> holes;  // offset -> size
    auto release = [&](int64_t off, int64_t size) {
      auto it = holes.emplace(off, size).first;
      auto next = std::next(it);
      if (next != holes.end() && it->first + it->second == next->first) {
        it->second += next->second;
        holes.erase(next);
      }
      if (it != holes.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second == it->first) {
          prev->second += it->second;
          holes.erase(it);
        }
      }
    };
    size_t e = 0;
    for (int32_t r : by_start) {
      // Free what died before this buffer's first step.
      while (e < by_end.size() && last[by_end[e]] < req[r].first) {
        const int32_t d = by_end[e++];
        if (plan.offsets[d] >= 0) release(plan.offsets[d], align_up(req[d].bytes));
      }
      const int64_t size = align_up(req[r].bytes);
      auto best = holes.end();
      for (auto it = holes.begin(); it != holes.end(); ++it)
        if (it->second >= size && (best == holes.end() || it->second < best->second)) best = it;
      if (best != holes.end()) {
        plan.offsets[r] = best->first;
        const int64_t rest = best->second - size, off = best->first + size;
        holes.erase(best);
        if (rest > 0) holes.emplace(off, rest);
      } else {
        // Grow the arena; a hole at its end is extended rather than left behind.
        int64_t off = arena;
        if (!holes.empty()) {
          auto lastHole = std::prev(holes.end());
          if (lastHole->first + lastHole->second == arena) {
            off = lastHole->first;
            holes.erase(lastHole);
          }
        }
        plan.offsets[r] = off;
        arena = off + size;
      }
    }
    plan.arena_bytes += arena;
  }
  for (int32_t i = 0; i < n; ++i)
    if (owner[i] != i)
      plan.offsets[i] = plan.offsets[owner[i]];
    else if (plan.offsets[i] < 0)
      plan.offsets[i] = 0;  // empty buffers
  return plan;
}

std::string check_memory_plan(const std::vector<BufferRequest>& req, const MemoryPlan& plan) {
  const int32_t n = static_cast<int32_t>(req.size());
  std::vector<int32_t> owner(n);
  for (int32_t i = 0; i < n; ++i) owner[i] = req[i].reuse >= 0 ? owner[req[i].reuse] : i;
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return req[a].first < req[b].first; });
  std::vector<int32_t> active;
  for (int32_t i : order) {
    if (req[i].bytes == 0) continue;
    const int64_t arena = req[i].pool < static_cast<int32_t>(plan.pool_bytes.size())
                              ? plan.pool_bytes[req[i].pool]
                              : 0;
    if (plan.offsets[i] < 0 || plan.offsets[i] % kAlign || plan.offsets[i] + req[i].bytes > arena)
      return fmt::format("buffer {} at offset {} ({} bytes) is outside the arena of {} bytes", i,
                         plan.offsets[i], req[i].bytes, arena);
    std::erase_if(active, [&](int32_t a) { return req[a].last < req[i].first; });
    for (int32_t a : active) {
      if (owner[a] == owner[i] || req[a].pool != req[i].pool) continue;
      const bool overlap = plan.offsets[a] < plan.offsets[i] + req[i].bytes &&
                           plan.offsets[i] < plan.offsets[a] + req[a].bytes;
      if (overlap)
        return fmt::format(
            "buffers {} (steps {}..{}, bytes {}..{}) and {} (steps {}..{}, bytes {}..{}) are live "
            "together and overlap",
            a, req[a].first, req[a].last, plan.offsets[a], plan.offsets[a] + req[a].bytes, i,
            req[i].first, req[i].last, plan.offsets[i], plan.offsets[i] + req[i].bytes);
    }
    active.push_back(i);
  }
  return "";
}

}  // namespace duet::detail
