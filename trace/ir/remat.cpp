// duet: rematerialization (the "remat" pass): a backward recomputes cheap elementwise values
// from what it saves anyway, instead of keeping them from the forward.
//
// Note [Rematerialization]
// A training step's backward reads values its forward made (GraphNode::phase: a value of an
// even phase read in the next, odd one): the activations. Eagerly, every value an op's gradient
// rule saves is kept until the backward, though many are elementwise functions of others that
// are kept anyway: tanh-GELU keeps its input, its square, a sigmoid and its result, four tensors
// where the input alone determines the rest. As torch.compile's min-cut partitioner does, this
// pass lets the backward compute such values again:
//  - a saved value is recomputable when it is made by an elementwise op or a view (never a
//    reduction, a product, a random draw or an effect); its frontier is what its recomputable
//    ancestors in its phase read: values that are not recomputable, graph inputs, constants,
//    and values the pass keeps;
//  - in topological order, a recomputable saved value is recomputed when the frontier values
//    that would be saved only for it take fewer bytes than it does (then they are kept);
//    otherwise it stays saved and is a frontier for the values after it;
//  - a value computed from captured tensors and constants alone (a parameter cast to bf16 under
//    autocast, a weight's transpose) stays saved: it does not grow with the batch, and
//    recomputing it would cost a pass over the parameter at every step. A memory budget may
//    still recompute it (remat_forced);
//  - so does a value whose recomputation no fused kernel of the backward could take in: no value
//    of its chain, nor what the chain reads, is read there by an elementwise op or a reduction
//    (under autocast, attention's output cast to bf16 for the out projection's weight gradient,
//    read by a product, from attention's f32 result, read by attention's backward): recomputed, it
//    would be a pass of its own (as torch.compile's partitioner, which recomputes what fuses);
//  - each backward phase gets copies of the recomputed values (and of their recomputable
//    ancestors), made just before their first reader there, with that phase. They read the
//    frontier through optimization_barrier after a value of the backward (Note [Optimization
//    barrier] in core/ops/view.cpp), so that no pass merges them with the forward's values and
//    the schedule cannot run them in the forward; fusion then joins them to the backward's
//    elementwise kernels, where recomputing them costs no extra pass over memory.
// The copies run the same kernels on the same inputs, so results are the same bit for bit.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "trace/ir/passes.h"

namespace duet::detail {
namespace remat_pass {

bool recomputable(const GraphNode& n) {
  if (n.kind != NodeKind::Op || has_effect(n)) return false;
  const OpClass c = op_class(n.op);
  return c == OpClass::Elementwise || c == OpClass::View;
}

// What computing n costs, roughly: a product's multiply-adds, one per element otherwise.
double flops_of(const Graph& g, const GraphNode& n) {
  if (n.kind != NodeKind::Op || op_class(n.op) == OpClass::View) return 0;
  const double out = static_cast<double>(n.meta.shape.numel());
  if (n.op == OpId::MatMul && !n.inputs.empty()) {
    const Shape& a = g.nodes[n.inputs[0]].meta.shape;
    return 2 * out * static_cast<double>(a.size() ? a[a.size() - 1] : 1);
  }
  double in = 0;
  for (int32_t i : n.inputs) in = std::max(in, static_cast<double>(g.nodes[i].meta.shape.numel()));
  return std::max(out, in);
}

// Ops the memory budget may recompute besides elementwise ones: deterministic, no effect.
bool forcible(const GraphNode& n) {
  if (n.kind != NodeKind::Op || has_effect(n) || n.op == OpId::Random) return false;
  switch (n.op) {
    case OpId::AllReduce:
    case OpId::Broadcast:
    case OpId::AllGather:
    case OpId::ReduceScatter:
    case OpId::CollectiveWait:
    case OpId::Transfer:
      return false;
    default:
      return true;
  }
}

// The largest chain of ancestors a recomputed value may bring along.
constexpr size_t kMaxRecomputed = 64;

class Remat {
 public:
  Remat(const Graph& g, const std::vector<int32_t>& forced, bool keep_parameter_values)
      : g_(g),
        n_(static_cast<int32_t>(g.nodes.size())),
        forced_(n_, false),
        keep_parameter_values_(keep_parameter_values) {
    for (int32_t f : forced) forced_[f] = true;
  }

  Graph run() {
    if (!decide()) return g_;
    Graph out = rewrite();
    for (int32_t v = 0; v < n_; ++v)
      if (recompute_[v] && saved_[v]) {
        ++out.remat.values;
        out.remat.bytes += value_bytes(g_.nodes[v]);
      }
    for (int32_t v = 0; v < n_; ++v)
      if (recompute_[v]) out.remat.flops += flops_of(g_, g_.nodes[v]);
    return out;
  }

  /// The bytes of the values the backward would still read from the forward.
  int64_t kept_bytes() {
    decide();
    int64_t b = 0;
    for (int32_t v = 0; v < n_; ++v)
      if (saved_[v] && !recompute_[v]) b += value_bytes(g_.nodes[v]);
    return b;
  }

 private:
  // Marks the saved values to recompute; false when there are none.
  bool decide() {
    saved_.assign(n_, false);
    for (int32_t i = 0; i < n_; ++i)
      for (int32_t in : g_.nodes[i].inputs)
        if (backward_of(g_.nodes[in].phase, g_.nodes[i].phase) &&
            (g_.nodes[in].kind == NodeKind::Op || g_.nodes[in].kind == NodeKind::Project))
          saved_[in] = true;
    // The values that an op a fused kernel takes reads in a backward.
    std::vector<bool> fused_read(n_, false);
    for (int32_t i = 0; i < n_; ++i) {
      const GraphNode& r = g_.nodes[i];
      if (!fused_kernel_takes(r)) continue;
      for (int32_t in : r.inputs)
        if (backward_of(g_.nodes[in].phase, r.phase)) fused_read[in] = true;
    }
    keep_.assign(n_, false);
    recompute_.assign(n_, false);
    bool any = false;
    for (int32_t v = 0; v < n_; ++v) {
      if (!saved_[v]) continue;
      std::vector<int32_t> chain, frontier;
      if (!can_recompute(v) || !walk(v, chain, frontier)) {
        keep_[v] = true;
        continue;
      }
      if (keep_parameter_values_ && !read_fused(chain, fused_read) &&
          !read_fused(frontier, fused_read)) {
        keep_[v] = true;  // its recomputation would be a kernel of its own
        continue;
      }
      if (keep_parameter_values_ && from_captured_only(frontier)) {
        keep_[v] = true;
        continue;
      }
      int64_t extra = 0;
      for (int32_t f : frontier)
        if (!keep_[f] &&
            (g_.nodes[f].kind == NodeKind::Op || g_.nodes[f].kind == NodeKind::Project))
          extra += value_bytes(g_.nodes[f]);
      if (extra >= value_bytes(g_.nodes[v])) {
        keep_[v] = true;
        continue;
      }
      for (int32_t f : frontier) keep_[f] = true;
      for (int32_t c : chain) recompute_[c] = true;
      any = true;
    }
    return any;
  }

  // The recomputable ancestors of v in v's phase (chain, v included) and what they read from
  // outside it (frontier). False when the chain would be too long.
  bool walk(int32_t v, std::vector<int32_t>& chain, std::vector<int32_t>& frontier) {
    const uint16_t phase = g_.nodes[v].phase;
    std::vector<int32_t> stack{v};
    std::unordered_set<int32_t> seen;
    while (!stack.empty()) {
      const int32_t x = stack.back();
      stack.pop_back();
      if (!seen.insert(x).second) continue;
      const GraphNode& n = g_.nodes[x];
      const bool inside = x == v || (!keep_[x] && can_recompute(x) && n.phase == phase);
      if (!inside) {
        if (n.kind != NodeKind::Constant) frontier.push_back(x);
        continue;
      }
      chain.push_back(x);
      if (chain.size() > kMaxRecomputed) return false;
      for (int32_t in : n.inputs) stack.push_back(in);
    }
    return true;
  }

  // Whether a fused kernel of the backward reads one of these values (a chain's, or its
  // frontier's), so that the chain's recomputation can join it (Note [Fusion rules]: a group
  // takes the ops that read its inputs).
  bool read_fused(const std::vector<int32_t>& values, const std::vector<bool>& fused_read) const {
    for (int32_t f : values)
      if (fused_read[f]) return true;
    return false;
  }

  // Whether a chain's frontier holds captured tensors alone (constants are not in it).
  bool from_captured_only(const std::vector<int32_t>& frontier) const {
    for (int32_t f : frontier) {
      const GraphNode& n = g_.nodes[f];
      if (n.kind != NodeKind::Input || n.role != InputRole::Captured) return false;
    }
    return true;
  }

  bool can_recompute(int32_t v) const {
    return recomputable(g_.nodes[v]) || (forced_[v] && forcible(g_.nodes[v]));
  }

  // The graph with the backward's reads of recomputed values going to copies.
  Graph rewrite() {
    Graph out = g_;
    out.nodes.clear();
    map_.assign(n_, -1);
    for (int32_t i = 0; i < n_; ++i) {
      GraphNode n = g_.nodes[i];
      const bool backward = n.phase % 2 == 1;
      for (int32_t& in : n.inputs) {
        if (backward && recompute_[in] && backward_of(g_.nodes[in].phase, n.phase))
          in = copy_of(in, n.phase, out);
        else
          in = map_[in];
      }
      map_[i] = out.add(std::move(n));
      if (backward) last_backward_ = map_[i];
    }
    for (int32_t& o : out.outputs) o = map_[o];
    for (WriteBack& w : out.writebacks) w.value = map_[w.value];
    return out;
  }

  // The copy of recomputed value v for backward phase `phase`, made now (with the copies of its
  // recomputed inputs) unless it exists.
  int32_t copy_of(int32_t v, uint16_t phase, Graph& out) {
    auto key = std::make_pair(v, phase);
    if (auto it = copies_.find(key); it != copies_.end()) return it->second;
    GraphNode n = g_.nodes[v];
    for (int32_t& in : n.inputs) {
      if (recompute_[in] && g_.nodes[in].phase == g_.nodes[v].phase)
        in = copy_of(in, phase, out);
      else if (g_.nodes[in].kind == NodeKind::Constant)
        in = map_[in];
      else
        in = barrier_of(in, phase, out);
    }
    n.phase = phase;
    const int32_t c = out.add(std::move(n));
    copies_[key] = c;
    return c;
  }

  // Frontier value f as the backward phase reads it: through a barrier after the backward's
  // latest value, once per phase.
  int32_t barrier_of(int32_t f, uint16_t phase, Graph& out) {
    if (last_backward_ < 0) return map_[f];
    auto key = std::make_pair(f, phase);
    if (auto it = barriers_.find(key); it != barriers_.end()) return it->second;
    GraphNode b;
    b.kind = NodeKind::Op;
    b.op = OpId::OptimizationBarrier;
    b.inputs = {map_[f], last_backward_};
    b.meta = g_.nodes[f].meta;
    b.scope = g_.nodes[f].scope;
    b.site = g_.nodes[f].site;
    b.phase = phase;
    const int32_t r = out.add(std::move(b));
    barriers_[key] = r;
    return r;
  }

  struct PairHash {
    size_t operator()(const std::pair<int32_t, uint16_t>& p) const {
      return std::hash<int64_t>()((int64_t(p.first) << 16) | p.second);
    }
  };

  const Graph& g_;
  const int32_t n_;
  std::vector<bool> forced_;
  const bool keep_parameter_values_;
  std::vector<bool> saved_, keep_, recompute_;
  std::vector<int32_t> map_;
  int32_t last_backward_ = -1;
  std::unordered_map<std::pair<int32_t, uint16_t>, int32_t, PairHash> copies_, barriers_;
};

}  // namespace remat_pass

Graph remat(const Graph& g) { return remat_pass::Remat(g, {}, true).run(); }

Graph remat_forced(const Graph& g, const std::vector<int32_t>& forced) {
  Graph out = remat_pass::Remat(g, forced, false).run();
  for (int32_t f : forced)
    out.remat.forced.push_back(fmt::format("{} ({:.3g} MFLOP)", node_str(g, f),
                                           remat_pass::flops_of(g, g.nodes[f]) / 1e6));
  return out;
}

std::vector<int32_t> remat_candidates(const Graph& g, const std::vector<int32_t>& forced) {
  using namespace remat_pass;
  const int64_t before = Remat(g, forced, false).kept_bytes();
  struct Option {
    double cost_per_byte;
    int32_t v;
  };
  std::vector<Option> options;
  std::vector<bool> is_forced(g.nodes.size(), false);
  for (int32_t f : forced) is_forced[f] = true;
  for (int32_t v = 0; v < static_cast<int32_t>(g.nodes.size()); ++v) {
    const GraphNode& n = g.nodes[v];
    if (is_forced[v] || n.phase % 2 || recomputable(n) || !forcible(n)) continue;
    std::vector<int32_t> more = forced;
    more.push_back(v);
    const int64_t freed = before - Remat(g, more, false).kept_bytes();
    if (freed > 0) options.push_back({flops_of(g, n) / static_cast<double>(freed), v});
  }
  std::stable_sort(options.begin(), options.end(), [](const Option& a, const Option& b) {
    return a.cost_per_byte < b.cost_per_byte;
  });
  std::vector<int32_t> r;
  for (const Option& o : options) r.push_back(o.v);
  return r;
}

}  // namespace duet::detail
