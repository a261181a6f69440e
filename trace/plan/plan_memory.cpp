// duet: what a plan's memory holds, for CompileStats and Compiled::memory_report().
//
// Note [Plan memory]
// A run of a plan holds its arena (the buffers of its intermediate values, placed by the memory
// planner) and the buffers it allocates for every run outside it: its results, which include
// the values a split forward saves for its backward. peak_bytes is their sum. Within the arena,
// the step where the live buffers add up to the most is the peak step, and the values live there
// are what a user would cut to make the plan smaller (memory_report() names their ops and call
// sites). A value is saved when a node of a forward phase made it and a node of that phase's
// backward reads it (GraphNode::phase): the activations of a training step. Buffers placed in
// write-back targets (Note [Intermediates in dead write-back targets] in plan_build.cpp) take no
// arena bytes and are not counted live. The figures are the planner's: they hold on any machine,
// without running the plan.
#include <algorithm>

#include "trace/plan/plan_internal.h"

namespace duet::detail {

void Plan::Builder::measure_memory() {
  // Results allocated per run (a value that only views an input or a constant costs nothing).
  for (int32_t v = 0; v < n; ++v)
    if (fresh[v] && root[v] == v && graph.nodes[v].kind == NodeKind::Op)
      stats.fresh_bytes += meta_nbytes(graph.nodes[v].meta);
  // Saved: made before the backward (an op's buffer, not a kernel's register), read in it.
  std::vector<bool> saved(n, false);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : graph.nodes[i].inputs) {
      const int32_t r = root[in];
      const GraphNode& src = graph.nodes[r];
      if ((src.kind == NodeKind::Op || src.kind == NodeKind::Project) &&
          backward_of(src.phase, graph.nodes[i].phase) && materialized[r])
        saved[r] = true;
    }
  for (int32_t v = 0; v < n; ++v)
    if (saved[v]) stats.saved_bytes += meta_nbytes(graph.nodes[v].meta);
  stats.peak_bytes = stats.arena_bytes + stats.fresh_bytes;
  if (plan.requests_.empty()) return;
  // Live bytes per step: a chain of in-place reuses is one buffer, live from its first write
  // to its last read (as the planner sees it).
  const auto& req = plan.requests_;
  const int32_t k = static_cast<int32_t>(req.size());
  std::vector<int32_t> owner, last;
  reuse_chains(req, owner, last);
  int32_t steps = 0;
  for (int32_t i = 0; i < k; ++i) steps = std::max(steps, last[owner[i]] + 1);
  std::vector<int64_t> delta(static_cast<size_t>(steps) + 2, 0);  // live bytes, as differences
  // Buffers in write-back targets (Note [Intermediates in dead write-back targets]) cost nothing.
  auto lent = [&](int32_t i) {
    return i < static_cast<int32_t>(plan.memory_.region.size()) && plan.memory_.region[i] >= 0;
  };
  for (int32_t i = 0; i < k; ++i)
    if (owner[i] == i && !lent(i)) {
      delta[req[i].first] += req[i].bytes;
      delta[last[i] + 1] -= req[i].bytes;
    }
  int64_t live = 0, most = -1;
  for (int32_t s = 0; s <= steps; ++s) {
    live += delta[s];
    if (live > most) {
      most = live;
      stats.peak_step = s;
    }
  }
  // A chain of in-place updates is named by its member that holds the bytes at the peak (the
  // latest one written by then).
  const int32_t p = stats.peak_step;
  std::vector<int32_t> holder(k, -1);
  for (int32_t v = 0; v < n; ++v) {
    const int32_t r = request_of[v];
    if (r < 0 || lent(owner[r]) || req[owner[r]].first > p || last[owner[r]] < p ||
        req[r].first > p)
      continue;
    int32_t& h = holder[owner[r]];
    if (h < 0 || req[request_of[h]].first < req[r].first) h = v;
  }
  std::vector<std::pair<int64_t, int32_t>> at_peak;  // (bytes, value)
  for (int32_t o = 0; o < k; ++o)
    if (holder[o] >= 0) at_peak.push_back({req[o].bytes, holder[o]});
  std::stable_sort(at_peak.begin(), at_peak.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [bytes, v] : at_peak) {
    stats.live_at_peak.push_back(v);
    stats.live_at_peak_saved.push_back(saved[v]);
  }
}

}  // namespace duet::detail
