// duet: the order of an Autobatch run: its graph (which ops live, what each waits for, who
// reads it), and the row order of each group's batch (Note [Longest chains first]).
#include <algorithm>
#include <climits>

#include "eager/autobatch_impl.h"

namespace duet::autobatch {

RunGraph run_graph(std::vector<PendingOp>& ops, const OpIndex& index) {
  const size_t n = ops.size();
  RunGraph g{
      std::vector<char>(n, 1), std::vector<int32_t>(n, 0), std::vector<int32_t>(n + 1, 0), {}};
  for (size_t i = n; i-- > 0;) {
    // Held by a tensor (the result, a consumer's operand) or a view of the storage.
    if (ops[i].impl.use_count() > 1 || ops[i].impl->storage.use_count() > 1) continue;
    g.live[i] = 0;
    ops[i].inputs.clear();
  }
  auto for_each_producer = [&](size_t i, auto&& f) {
    for (int32_t e = index.edge_at[i]; e < index.edge_at[i + 1]; ++e)
      f(static_cast<size_t>(index.edges[static_cast<size_t>(e)]));
  };
  for (size_t i = 0; i < n; ++i)
    if (g.live[i]) for_each_producer(i, [&](size_t p) { ++g.first_consumer[p + 1]; });
  for (size_t i = 0; i < n; ++i) g.first_consumer[i + 1] += g.first_consumer[i];
  g.consumer.resize(static_cast<size_t>(g.first_consumer[n]));
  std::vector<int32_t> fill(g.first_consumer.begin(), g.first_consumer.end() - 1);
  for (size_t i = 0; i < n; ++i)
    if (g.live[i])
      for_each_producer(i, [&](size_t p) {
        DUET_ASSERT(p < n && g.live[p], "a pending op reads a lazy tensor of no pending op");
        ++g.waiting[i];
        g.consumer[static_cast<size_t>(fill[p]++)] = static_cast<int32_t>(i);
      });
  return g;
}

// Note [Longest chains first]
// A batch's rows follow its group's order, and the groups that read it follow that order in
// turn (Autobatch::Impl::run), so where a chain of groups loses samples as it goes (the steps of
// sentences of many lengths, as padded code sorts them), a row order in which the samples that
// go on longest come first makes each step's survivors a slice of the step before, not an
// index_select (and, in the backward, a slice's gradient rather than an index_add). Two orders
// are chosen where choosing costs no gather:
//  - a group that reads no batch (the samples' first ops) takes its samples by their share of
//    the work that follows them (shares(): a sample's own ops, and a part of those that join it
//    with others, such as the sum of the losses), the largest first; ties keep their order;
//  - a pick gathers its rows in any order: it takes them by the depth of their first reader, so
//    that each step's picks (a token's embedding) are one run of its batch.
// Over B1's step (a BiLSTM over 64 sentences of 5-60 tokens), the gathers by index_select went
// from 274 to 98 and the kernels from 2,697 to 2,525.

// Each live op's share of the work that follows it: itself, and of each consumer's share a part
// for each of its pending operands. Consumers come after their producers: one pass, newest first.
std::vector<double> shares(const RunGraph& g, const OpIndex& index) {
  const size_t n = g.live.size();
  std::vector<double> w(n, 1);
  for (size_t i = n; i-- > 0;)
    for (int32_t k = g.first_consumer[i]; k < g.first_consumer[i + 1]; ++k) {
      const auto c = static_cast<size_t>(g.consumer[static_cast<size_t>(k)]);
      w[i] += w[c] / static_cast<double>(index.edge_at[c + 1] - index.edge_at[c]);
    }
  return w;
}

// A ready group in the row order its batch takes (Note [Longest chains first]).
void order_group(std::vector<int32_t>& group, bool pick, const RunGraph& g, const OpIndex& index,
                 const std::vector<double>& share) {
  bool fresh = true;
  for (size_t k = 0; fresh && k < group.size(); ++k)
    fresh = index.edge_at[static_cast<size_t>(group[k])] ==
            index.edge_at[static_cast<size_t>(group[k]) + 1];
  if (fresh)
    std::stable_sort(group.begin(), group.end(), [&](int32_t a, int32_t b) {
      return share[static_cast<size_t>(a)] > share[static_cast<size_t>(b)];
    });
  if (!pick) return;
  std::vector<std::pair<int32_t, int32_t>> by(group.size());  // (first reader's depth, op)
  for (size_t k = 0; k < group.size(); ++k) {
    const auto id = static_cast<size_t>(group[k]);
    int32_t d = INT32_MAX;
    for (int32_t c = g.first_consumer[id]; c < g.first_consumer[id + 1]; ++c)
      d = std::min(d, index.depth[static_cast<size_t>(g.consumer[static_cast<size_t>(c)])]);
    by[k] = {d, group[k]};
  }
  std::stable_sort(by.begin(), by.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = 0; k < group.size(); ++k) group[k] = by[k].second;
}

}  // namespace duet::autobatch
