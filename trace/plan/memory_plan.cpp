// The memory planner: see trace/plan/memory_plan.h.
#include "trace/plan/memory_plan.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace duet::detail {
namespace {

constexpr int64_t kAlign = 64;
int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/// The free bytes of an arena or a region: offset -> size, neighbours merged.
struct Holes {
  std::map<int64_t, int64_t> free;
  void release(int64_t off, int64_t size) {
    auto it = free.emplace(off, size).first;
    auto next = std::next(it);
    if (next != free.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free.erase(next);
    }
    if (it != free.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free.erase(it);
      }
    }
  }
  /// The smallest hole of at least `size` bytes, or end().
  std::map<int64_t, int64_t>::iterator best_fit(int64_t size) {
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->second >= size && (best == free.end() || it->second < best->second)) best = it;
    return best;
  }
  /// Takes `size` bytes from the front of hole `it`; returns their offset.
  int64_t take(std::map<int64_t, int64_t>::iterator it, int64_t size) {
    const int64_t off = it->first, rest = it->second - size;
    free.erase(it);
    if (rest > 0) free.emplace(off + size, rest);
    return off;
  }
};

}  // namespace

void reuse_chains(const std::vector<BufferRequest>& req, std::vector<int32_t>& owner,
                  std::vector<int32_t>& last) {
  const auto n = static_cast<int32_t>(req.size());
  owner.assign(n, 0);
  last.assign(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    owner[i] = req[i].reuse >= 0 ? owner[req[i].reuse] : i;
    last[owner[i]] = std::max(req[i].last, req[i].reuse >= 0 ? last[owner[i]] : req[i].last);
  }
}

MemoryPlan plan_memory(const std::vector<BufferRequest>& req,
                       const std::vector<DonatedRegion>& regions,
                       const std::vector<bool>& lendable) {
  const int32_t n = static_cast<int32_t>(req.size());
  MemoryPlan plan;
  plan.offsets.assign(n, -1);
  plan.region.assign(n, -1);
  // Chains of in-place reuse become one buffer, live from the first write to the last read.
  std::vector<int32_t> owner, last;
  reuse_chains(req, owner, last);
  int32_t pools = 0;
  for (const BufferRequest& r : req) pools = std::max(pools, r.pool + 1);
  plan.pool_bytes.assign(pools, 0);
  std::vector<Holes> in_region(regions.size());
  for (size_t d = 0; d < regions.size(); ++d)
    if (regions[d].bytes >= kAlign)
      in_region[d].free.emplace(0, regions[d].bytes / kAlign * kAlign);
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
    Holes holes;
    size_t e = 0;
    for (int32_t r : by_start) {
      // Free what died before this buffer's first step.
      while (e < by_end.size() && last[by_end[e]] < req[r].first) {
        const int32_t d = by_end[e++];
        if (plan.offsets[d] < 0) continue;
        Holes& h = plan.region[d] >= 0 ? in_region[plan.region[d]] : holes;
        h.release(plan.offsets[d], align_up(req[d].bytes));
      }
      const int64_t size = align_up(req[r].bytes);
      // A donated region whose window holds the buffer's life: the one closing first.
      int32_t pick = -1;
      for (size_t d = 0; (lendable.empty() || lendable[r]) && d < regions.size(); ++d) {
        const DonatedRegion& g = regions[d];
        if (g.pool != pool || g.from > req[r].first || g.until < last[r] ||
            (pick >= 0 && regions[pick].until <= g.until) ||
            in_region[d].best_fit(size) == in_region[d].free.end())
          continue;
        pick = static_cast<int32_t>(d);
      }
      if (pick >= 0) {
        Holes& h = in_region[pick];
        plan.offsets[r] = h.take(h.best_fit(size), size);
        plan.region[r] = pick;
        continue;
      }
      if (auto best = holes.best_fit(size); best != holes.free.end()) {
        plan.offsets[r] = holes.take(best, size);
      } else {
        // Grow the arena; a hole at its end is extended rather than left behind.
        int64_t off = arena;
        if (!holes.free.empty()) {
          auto lastHole = std::prev(holes.free.end());
          if (lastHole->first + lastHole->second == arena) {
            off = lastHole->first;
            holes.free.erase(lastHole);
          }
        }
        plan.offsets[r] = off;
        arena = off + size;
      }
    }
    plan.arena_bytes += arena;
  }
  for (int32_t i = 0; i < n; ++i)
    if (owner[i] != i) {
      plan.offsets[i] = plan.offsets[owner[i]];
      plan.region[i] = plan.region[owner[i]];
    } else if (plan.offsets[i] < 0) {
      plan.offsets[i] = 0;  // empty buffers
    }
  return plan;
}

std::vector<int32_t> live_at_arena_peak(const std::vector<BufferRequest>& req,
                                        const MemoryPlan& plan) {
  const int32_t n = static_cast<int32_t>(req.size());
  std::vector<int32_t> owner, last;
  reuse_chains(req, owner, last);
  int32_t steps = 0;
  for (const BufferRequest& r : req) steps = std::max(steps, r.last + 1);
  std::vector<int64_t> delta(static_cast<size_t>(steps) + 1, 0);
  for (int32_t i = 0; i < n; ++i)
    if (owner[i] == i && plan.region[i] < 0) {
      delta[req[i].first] += align_up(req[i].bytes);
      delta[last[i] + 1] -= align_up(req[i].bytes);
    }
  int64_t live = 0, most = -1;
  int32_t peak = 0;
  for (int32_t s = 0; s < steps; ++s) {
    live += delta[s];
    if (live > most) {
      most = live;
      peak = s;
    }
  }
  std::vector<int32_t> at;
  for (int32_t i = 0; i < n; ++i)
    if (owner[i] == i && plan.region[i] < 0 && req[i].bytes > 0 && req[i].first <= peak &&
        last[i] >= peak)
      at.push_back(i);
  return at;
}

std::string check_memory_plan(const std::vector<BufferRequest>& req, const MemoryPlan& plan,
                              const std::vector<DonatedRegion>& regions) {
  const int32_t n = static_cast<int32_t>(req.size());
  std::vector<int32_t> owner, last;
  reuse_chains(req, owner, last);
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return req[a].first < req[b].first; });
  auto region_of = [&](int32_t i) {
    return i < static_cast<int32_t>(plan.region.size()) ? plan.region[i] : -1;
  };
  std::vector<int32_t> active;
  for (int32_t i : order) {
    if (req[i].bytes == 0) continue;
    const int32_t g = region_of(i);
    int64_t room = 0;
    if (g >= 0) {
      const DonatedRegion& d = regions.at(static_cast<size_t>(g));
      room = d.bytes;
      if (req[i].first < d.from || req[i].last > d.until)
        return fmt::format(
            "buffer {} (steps {}..{}) is in donated region {} outside its window "
            "{}..{}",
            i, req[i].first, req[i].last, g, d.from, d.until);
    } else if (req[i].pool < static_cast<int32_t>(plan.pool_bytes.size())) {
      room = plan.pool_bytes[req[i].pool];
    }
    if (plan.offsets[i] < 0 || plan.offsets[i] % kAlign || plan.offsets[i] + req[i].bytes > room)
      return fmt::format("buffer {} at offset {} ({} bytes) is outside its {} of {} bytes", i,
                         plan.offsets[i], req[i].bytes, g >= 0 ? "region" : "arena", room);
    std::erase_if(active, [&](int32_t a) { return req[a].last < req[i].first; });
    for (int32_t a : active) {
      if (owner[a] == owner[i] || req[a].pool != req[i].pool || region_of(a) != g) continue;
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
