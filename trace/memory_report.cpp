// duet: a compiled function's memory, per plan and at its peak (Compiled::memory_report(),
// CompileStats::plans; Note [Plan memory] in trace/plan/plan_memory.cpp).
#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "trace/compile_entry.h"
#include "trace/ir/passes.h"

namespace duet {
namespace detail {

namespace {

int64_t nbytes(const TensorMeta& m) { return m.shape.numel() * int64_t(itemsize(m.dtype)); }

PlanMemoryStats of_plan(const Plan& p, std::string name) {
  const PlanStats& s = p.stats();
  return {std::move(name), s.arena_bytes, s.saved_bytes, s.peak_bytes, s.donated_bytes};
}

}  // namespace

std::vector<PlanMemoryStats> plan_memory_stats(const Plans& p, size_t num_outputs) {
  std::vector<PlanMemoryStats> r;
  if (p.guard) r.push_back(of_plan(*p.guard, "guards"));
  const Graph& fg = p.forward->graph();
  PlanMemoryStats f = of_plan(*p.forward, !p.backward.empty()      ? "forward"
                                          : has_backward_phase(fg) ? "step"
                                                                   : "forward");
  for (size_t k = num_outputs; k < fg.outputs.size(); ++k)
    f.saved_bytes += nbytes(fg.nodes[fg.outputs[k]].meta);
  r.push_back(f);
  for (size_t k = 0; k < p.backward.size(); ++k)
    r.push_back(of_plan(*p.backward[k], fmt::format("backward {}", k)));
  return r;
}

MemoryReport CompiledCore::memory_report() const {
  std::lock_guard<std::mutex> lock(mu_);
  DUET_CHECK(last_ && last_->last_plans,
             "[memory_report] {} has not been called yet, so it has no plans", label_);
  const Entry& e = *last_;
  const Plans& p = *e.last_plans;
  MemoryReport r;
  r.function = label_;
  r.plans = plan_memory_stats(p, e.num_outputs);
  std::vector<const Plan*> plans;
  if (p.guard) plans.push_back(p.guard.get());
  plans.push_back(p.forward.get());
  for (const auto& b : p.backward) plans.push_back(b.get());
  const Plan* largest = plans[0];
  for (size_t k = 0; k < plans.size(); ++k) {
    const PlanStats& s = plans[k]->stats();
    r.peak_bytes = std::max(r.peak_bytes, s.peak_bytes);
    r.arena_bytes = std::max(r.arena_bytes, s.arena_bytes);
    r.intermediate_bytes += s.intermediate_bytes;
    r.saved_bytes += r.plans[k].saved_bytes;
    r.donated_bytes = std::max(r.donated_bytes, s.donated_bytes);
    if (s.arena_bytes > largest->stats().arena_bytes) {
      largest = plans[k];
      r.peak_plan = r.plans[k].plan;
    }
  }
  if (r.peak_plan.empty()) r.peak_plan = r.plans[0].plan;
  const Graph& g = largest->graph();
  const PlanStats& ls = largest->stats();
  for (size_t i = 0; i < ls.live_at_peak.size(); ++i) {
    const int32_t v = ls.live_at_peak[i];
    const GraphNode& n = g.nodes[v];
    MemoryReport::Buffer b;
    b.bytes = nbytes(n.meta);
    b.value = node_str(g, v);
    b.op = n.kind == NodeKind::Op ? std::string(op_name(n.op)) : "";
    b.site = n.site.str();
    b.scope = n.scope >= 0 ? g.scopes[n.scope] : "";
    b.saved = ls.live_at_peak_saved[i];
    r.live_at_peak.push_back(std::move(b));
  }
  return r;
}

std::string human_bytes(int64_t b);

// Note [Memory budget]
// With CompileOptions::memory_budget, the forward plan of a signature is planned first as the
// passes left it (the remat pass has made the backward recompute cheap elementwise values). If
// its peak (arena and results: PlanStats::peak_bytes) is over the budget, it is planned with its
// steps in order (steps side by side reuse no buffer in place), then the backward recomputes
// forward ops too. In each round, the ops whose recomputation frees the most of
// what the backward keeps per unit of work (remat_candidates, the cheapest kCandidates) are
// tried: the graph is rewritten from the passes' graph with the op recomputed besides those
// chosen before (remat_forced), and a trial plan, which plans the schedule and the memory but
// allocates nothing, measures the peak. The one with the lowest peak joins the chosen ones (a
// recomputation that chains into another recomputed value brings the whole chain back at once,
// so what the backward keeps is no measure of the peak; the trials are). The first graph that
// fits is planned for real; the same kernels run on the same inputs, so results are the same
// bit for bit. When no trial lowers the peak, the budget cannot be met: a ValueError names the
// smallest peak reached. A compiled forward whose backward runs apart (split graphs) keeps its
// saved values as results, which recomputation inside the plan cannot lower.
constexpr int kMaxBudgetRounds = 64;
constexpr size_t kCandidates = 12;
constexpr int kStalledRounds = 4;

std::unique_ptr<Plan> plan_within_budget(Graph g, PlanOptions o, int64_t budget) {
  o.share = nullptr;  // each size may recompute other ops: its graph is its own
  PlanOptions trial = o;
  trial.measure_only = true;
  trial.arenas = nullptr;
  auto peak_of = [&](const Graph& h) { return Plan(h, trial).stats().peak_bytes; };
  int64_t best = peak_of(g);
  if (best <= budget) return std::make_unique<Plan>(std::move(g), o);
  // Steps side by side reuse no buffer in place (Note [Parallel waves]): over its budget, a
  // plan runs its steps in order before it recomputes anything.
  if (o.parallel) {
    o.parallel = trial.parallel = false;
    best = peak_of(g);
    if (best <= budget) return std::make_unique<Plan>(std::move(g), o);
  }
  std::vector<int32_t> forced;
  int stalled = 0;  // rounds in a row that found no lower peak
  for (int round = 0; round < kMaxBudgetRounds && stalled < kStalledRounds; ++round) {
    const std::vector<int32_t> candidates = remat_candidates(g, forced);
    int32_t chosen = -1;
    int64_t chosen_peak = 0;
    Graph chosen_graph;
    for (size_t k = 0; k < candidates.size() && k < kCandidates; ++k) {
      std::vector<int32_t> trial_forced = forced;
      trial_forced.push_back(candidates[k]);
      Graph h = dce(remat_forced(g, trial_forced));
      const int64_t peak = peak_of(h);
      if (chosen < 0 || peak < chosen_peak) {
        chosen = candidates[k];
        chosen_peak = peak;
        chosen_graph = std::move(h);
      }
    }
    if (chosen < 0) break;
    // The best trial is taken even when it is no lower: the next recomputation may need it
    // (every other block's activation recomputed lowers the peak only once both neighbours are).
    forced.push_back(chosen);
    stalled = chosen_peak < best ? 0 : stalled + 1;
    best = std::min(best, chosen_peak);
    if (chosen_peak <= budget) return std::make_unique<Plan>(std::move(chosen_graph), o);
  }
  throw ValueError(::duet::detail::with_context(fmt::format(
      "[compile] memory_budget of {} bytes ({}) cannot be met by {}: the smallest peak the "
      "planner reached is {} bytes ({}), recomputing {} ops in the backward. Raise the budget, "
      "use a smaller batch, or checkpoint the model's blocks (duet::checkpoint)",
      budget, human_bytes(budget), g.label, best, human_bytes(best), forced.size())));
}

std::string human_bytes(int64_t b) {
  const double v = static_cast<double>(b);
  if (b < 1024) return fmt::format("{} B", b);
  if (b < (1 << 20)) return fmt::format("{:.1f} KiB", v / 1024);
  if (b < (int64_t(1) << 30)) return fmt::format("{:.2f} MiB", v / (1 << 20));
  return fmt::format("{:.2f} GiB", v / (1 << 30));
}

}  // namespace detail

std::string MemoryReport::str() const {
  using detail::human_bytes;
  std::string s = fmt::format("memory of {}\n", function);
  s += fmt::format("  peak {} (arena {}, against {} if every intermediate value had a buffer)\n",
                   human_bytes(peak_bytes), human_bytes(arena_bytes),
                   human_bytes(intermediate_bytes));
  s += fmt::format("  saved activations {}\n", human_bytes(saved_bytes));
  if (donated_bytes > 0)
    s += fmt::format(
        "  arena {} smaller with intermediates placed in write-back targets (.grad) before "
        "they are written\n",
        human_bytes(donated_bytes));
  s += fmt::format("  {:<12} {:>12} {:>12} {:>12}\n", "plan", "arena", "saved", "peak");
  for (const PlanMemoryStats& p : plans)
    s += fmt::format("  {:<12} {:>12} {:>12} {:>12}\n", p.plan, human_bytes(p.arena_bytes),
                     human_bytes(p.saved_bytes), human_bytes(p.peak_bytes));
  s += fmt::format("  buffers live at the peak of the {} plan, largest first:\n", peak_plan);
  size_t shown = 0;
  for (const Buffer& b : live_at_peak) {
    if (++shown > 20) {
      s += fmt::format("    ... and {} more\n", live_at_peak.size() - 20);
      break;
    }
    s += fmt::format("    {:>10}  {}{}\n", human_bytes(b.bytes), b.value,
                     b.saved ? "  (saved for the backward)" : "");
  }
  return s;
}

}  // namespace duet
