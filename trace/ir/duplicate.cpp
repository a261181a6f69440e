// duet: producer duplication (the "duplicate" pass): a large elementwise value made from small
// inputs, which several kernels read, is computed again in each of them instead of stored once.
//
// Note [Duplicated producers]
// Fusion keeps a value in registers only when every reader is in its group; a value read by two
// groups is stored by one and loaded by the other. Where that value is a broadcast of small
// inputs, the store and the load cost far more than computing it again: cross_entropy's
// gradient where(eq(arange(C), target), g, 0) is an (N, C) mask of N targets, read by the
// row sum of log_softmax's gradient and by the gradient itself. Stored, it was 4 MB written and
// read back per W8 step (N = 1024, C = 1024); computed in both groups, it is read from 16 KB.
// As XLA's fusion duplicates cheap producers, this pass gives every reader after the first its
// own copy of such a value, made just before that reader, in the reader's phase:
//  - the value is elementwise (no effect, no random draw), not a result or a write-back, and of
//    at least kMinElements elements; every reader is an elementwise op or a reduction (what a
//    fused kernel takes) in the value's phase;
//  - with its elementwise ancestors in that phase (at most kMaxChain nodes: the chain), it reads
//    at most an eighth of its own bytes from outside the chain (the frontier).
// The copies run the same kernels on the same inputs, so results are the same bit for bit. The
// pass runs after cse, which would merge the copies again.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "trace/ir/passes.h"

namespace duet::detail {
namespace {

constexpr int64_t kMinElements = 4096;
constexpr size_t kMaxChain = 8;

bool elementwise(const GraphNode& n) {
  return n.kind == NodeKind::Op && !has_effect(n) && op_class(n.op) == OpClass::Elementwise;
}

class Duplicate {
 public:
  explicit Duplicate(const Graph& g) : g_(g), n_(static_cast<int32_t>(g.nodes.size())) {}

  Graph run() {
    readers_.assign(n_, {});
    pinned_.assign(n_, false);
    for (int32_t i = 0; i < n_; ++i)
      for (int32_t in : g_.nodes[i].inputs) readers_[in].push_back(i);
    for (int32_t o : g_.outputs) pinned_[o] = true;
    for (const WriteBack& w : g_.writebacks) pinned_[w.value] = true;
    chain_of_.assign(n_, {});
    bool any = false;
    for (int32_t v = 0; v < n_; ++v) any |= decide(v);
    return any ? rewrite() : g_;
  }

 private:
  // Whether v is duplicated for its readers after the first (chain_of_[v] then holds its chain,
  // in topological order, v last).
  bool decide(int32_t v) {
    const GraphNode& n = g_.nodes[v];
    if (!elementwise(n) || pinned_[v] || n.meta.shape.numel() < kMinElements) return false;
    std::vector<int32_t> distinct;
    for (int32_t r : readers_[v])
      if (distinct.empty() || distinct.back() != r) distinct.push_back(r);
    if (distinct.size() < 2) return false;
    for (int32_t r : distinct) {
      const GraphNode& rn = g_.nodes[r];
      if (!fused_kernel_takes(rn) || rn.phase != n.phase || !(rn.meta.device == n.meta.device))
        return false;
    }
    // The chain: v and its elementwise ancestors of its phase; the frontier: what it reads.
    std::vector<int32_t> chain, stack{v};
    std::unordered_set<int32_t> seen;
    int64_t frontier = 0;
    while (!stack.empty()) {
      const int32_t x = stack.back();
      stack.pop_back();
      if (!seen.insert(x).second) continue;
      const GraphNode& xn = g_.nodes[x];
      if (x != v && (!elementwise(xn) || xn.phase != n.phase || pinned_[x])) {
        if (xn.kind != NodeKind::Constant) frontier += value_bytes(xn);
        continue;
      }
      chain.push_back(x);
      if (chain.size() > kMaxChain) return false;
      for (int32_t in : xn.inputs) stack.push_back(in);
    }
    if (frontier * 8 > value_bytes(n)) return false;
    std::sort(chain.begin(), chain.end());  // node order is topological
    chain_of_[v] = std::move(chain);
    return true;
  }

  Graph rewrite() {
    Graph out = g_;
    out.nodes.clear();
    map_.assign(n_, -1);
    std::vector<int32_t> first_reader(n_, -1);
    for (int32_t i = 0; i < n_; ++i) {
      GraphNode n = g_.nodes[i];
      for (int32_t& in : n.inputs) {
        const int32_t orig = in;
        in = map_[orig];
        if (chain_of_[orig].empty()) continue;
        if (first_reader[orig] < 0) first_reader[orig] = i;
        if (first_reader[orig] != i) in = copy_for(orig, i, out);
      }
      map_[i] = out.add(std::move(n));
    }
    for (int32_t& o : out.outputs) o = map_[o];
    for (WriteBack& w : out.writebacks) w.value = map_[w.value];
    return out;
  }

  // v's chain copied for reader r, made now (once per reader).
  int32_t copy_for(int32_t v, int32_t r, Graph& out) {
    const int64_t key = (int64_t(v) << 32) | uint32_t(r);
    if (auto it = copies_.find(key); it != copies_.end()) return it->second;
    std::unordered_map<int32_t, int32_t> local;
    for (int32_t c : chain_of_[v]) {
      GraphNode n = g_.nodes[c];
      for (int32_t& in : n.inputs) {
        auto it = local.find(in);
        in = it != local.end() ? it->second : map_[in];
      }
      local[c] = out.add(std::move(n));
    }
    return copies_[key] = local.at(v);
  }

  const Graph& g_;
  const int32_t n_;
  std::vector<std::vector<int32_t>> readers_, chain_of_;
  std::vector<bool> pinned_;
  std::vector<int32_t> map_;
  std::unordered_map<int64_t, int32_t> copies_;
};

}  // namespace

Graph duplicate(const Graph& g) { return Duplicate(g).run(); }

}  // namespace duet::detail
