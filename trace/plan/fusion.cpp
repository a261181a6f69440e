// The fusion pass: see Note [Fusion rules] in trace/plan/fusion.h.
#include "trace/plan/fusion.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace duet::detail {
namespace {

constexpr int kMaxMembers = 200;  // below kernels::kFusedMaxInstrs

bool is_float(DType d) { return d == DType::f32 || d == DType::f64; }

// Whether m has the shape (and, where either is symbolic, the symbolic dims) of a group:
// groups are then the same at every size of the symbols (Note [Fusion across sizes] in
// trace/plan/plan_build.cpp).
bool same_dims(const Shape& shape, const SymDims& sym, const TensorMeta& m) {
  if (!(shape == m.shape)) return false;
  if (sym.empty() && m.sym.empty()) return true;
  for (int64_t d = 0; d < shape.size(); ++d) {
    const size_t k = static_cast<size_t>(d);
    if (!((sym.empty() ? SymInt(shape[d]) : sym[k]) ==
          (m.sym.empty() ? SymInt(m.shape[d]) : m.sym[k])))
      return false;
  }
  return true;
}

struct Group {
  std::vector<int32_t> members;
  Shape shape;
  SymDims sym;  ///< the symbolic dims of the shape (empty: concrete)
  DType dtype = DType::f32;
  Device device;
  int32_t reduction = -1;
  int32_t reduce_dims = 0;
  kernels::FusedReduce reduce = kernels::FusedReduce::None;
  bool alive = true;
  uint16_t lo_phase = 0xffff, hi_phase = 0;  ///< the members' GraphNode::phase, lowest and highest
};

// Whether one group may hold nodes of phases lo..hi: never a forward phase and its backward
// (Note [Fusion rules]).
bool phases_fit(uint16_t lo, uint16_t hi) {
  for (uint32_t p = lo; p < hi; ++p)
    if (backward_of(static_cast<uint16_t>(p), static_cast<uint16_t>(p + 1))) return false;
  return true;
}

class Fuser {
 public:
  explicit Fuser(const Graph& g) : graph_(g), n_(static_cast<int32_t>(g.nodes.size())) {
    group_of_.assign(n_, -1);
    stamp_.assign(n_, 0);
    readers_.resize(n_);
  }

  std::vector<FusionGroup> run() {
    for (int32_t v = 0; v < n_; ++v) {
      const GraphNode& node = graph_.nodes[v];
      if (node.kind != NodeKind::Op) continue;
      if (try_reduction(v)) continue;
      DType t;
      if (!compute_dtype(v, &t)) continue;
      place(v, t);
    }
    return finish();
  }

 private:
  // The dtype an elementwise node computes in, when it can be fused at all.
  bool compute_dtype(int32_t v, DType* t) const {
    const GraphNode& n = graph_.nodes[v];
    if (op_class(n.op) != OpClass::Elementwise || !kernels::fusable_op(n.op)) return false;
    // On the CPU, or on a device whose backend runs fused kernels (CUDA); every input on the
    // node's device, except one-element constants (wrapped numbers), which the executor copies
    // to the device once.
    const Device dev = n.meta.device;
    if (n.meta.shape.numel() == 0) return false;
    if (!dev.is_cpu() && !kernels::fused_device_runner(dev.type)) return false;
    bool low = is_low_precision(n.meta.dtype);
    for (int32_t in : n.inputs) {
      const GraphNode& s = graph_.nodes[in];
      low |= is_low_precision(s.meta.dtype);
      // The narrow integers (i8, u8, i16) run unfused: the fused loads read the kernels' dtypes.
      if (is_narrow_integral(s.meta.dtype)) return false;
      if (!(s.meta.device == dev) &&
          !(s.kind == NodeKind::Constant && s.meta.device.is_cpu() && s.meta.shape.numel() == 1))
        return false;
    }
    // f16 and bf16 fuse on the CPU, in f32 registers (Note [Fused registers] in
    // kernels/fused.h); the CUDA code generator does not take them yet.
    if (low && !dev.is_cpu()) return false;
    const DType out = n.meta.dtype;
    if (is_low_precision(out)) {
      if (n.op == OpId::Where && graph_.nodes[n.inputs[0]].meta.dtype != DType::b8) return false;
      if (n.op != OpId::Cast && !rounds_like_eager(n, out)) return false;
      *t = DType::f32;
      return true;
    }
    if (is_float(out)) {
      if (n.op == OpId::Where && graph_.nodes[n.inputs[0]].meta.dtype != DType::b8) return false;
      *t = out;
      return true;
    }
    if (out != DType::b8) return false;
    if (n.op == OpId::Cast) {  // to b8: only from the compute dtype itself
      *t = graph_.nodes[n.inputs[0]].meta.dtype;
      if (is_low_precision(*t)) *t = DType::f32;  // a register holds the value exactly
      return is_float(*t);
    }
    if (n.op == OpId::Where || n.op == OpId::Copy) return false;
    // A comparison computes in the inputs' result type.
    std::vector<Tensor> ins;
    for (int32_t in : n.inputs) {
      const GraphNode& s = graph_.nodes[in];
      ins.push_back(s.kind == NodeKind::Constant ? s.constant : make_meta_tensor(s.meta));
    }
    const Tensor* p[2] = {&ins[0], &ins[1]};
    *t = result_type(TensorRefs(p, 2));
    if (is_low_precision(*t)) {
      if (!rounds_like_eager(n, *t)) return false;
      *t = DType::f32;
    }
    if (is_integral(*t) && (n.op == OpId::Eq || n.op == OpId::Ne) &&
        (small_integers(n.inputs[0]) || small_integers(n.inputs[1]))) {
      *t = DType::f32;  // Note [Integer equality in registers]
      return true;
    }
    return is_float(*t);
  }

  // Note [Integer equality in registers]
  // Registers hold the group's float dtype, so an integer comparison would compare rounded
  // values; but whether two integers are equal is decided exactly in f32 when one of them is
  // below 2^24 in magnitude (exact in f32): the other, if larger, rounds to at least 2^24 in
  // magnitude, since rounding is monotonic and 2^24 is an f32 value, and so still differs.
  // So eq and ne of integers join an f32 group when one operand is known to hold only such
  // values: an arange (through views) shorter than 2^24, or a constant whose values are. That is
  // cross_entropy's gradient, where(eq(arange(C), target), g, 0): with the comparison in the
  // group, no (N, C) mask is stored and read back (its own kernel took 0.2 ms a step in W8).
  bool small_integers(int32_t v) const {
    constexpr int64_t kExact = int64_t(1) << 24;
    const GraphNode* s = &graph_.nodes[v];
    while (s->kind == NodeKind::Op && op_class(s->op) == OpClass::View && !s->inputs.empty())
      s = &graph_.nodes[s->inputs[0]];
    if (!is_integral(s->meta.dtype) || !s->meta.sym.empty()) return false;
    if (s->kind == NodeKind::Op && s->op == OpId::Arange)
      return s->attrs.end <= kExact && s->meta.shape.numel() <= kExact;
    if (s->kind != NodeKind::Constant || s->constant.numel() > (int64_t(1) << 16)) return false;
    for (double x : s->constant.to(DType::f64).contiguous().to_vector<double>())
      if (!(std::fabs(x) < static_cast<double>(kExact))) return false;
    return true;
  }

  // Whether an op computing in f16 or bf16 (`low`) reads each input as a register holds it: the
  // eager kernels round a tensor input of another dtype (an i64 tensor added to a bf16 one) to
  // `low` first, and a register holds it unrounded, so such an op runs alone. 0-d inputs
  // (numbers) enter the f32 math as they are on both sides; Where's condition is b8.
  bool rounds_like_eager(const GraphNode& n, DType low) const {
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const GraphNode& s = graph_.nodes[n.inputs[j]];
      if (n.op == OpId::Where && j == 0) continue;
      if (s.meta.dtype != low && s.meta.shape.size() != 0) return false;
    }
    return true;
  }

  // Whether value u depends on group a or b (b may be -1) in the graph of steps, where a group
  // runs as one step: reaching a member of another group reaches all of that group's inputs.
  // (Paths through other groups matter: A = {a1, a2}, B = {b1, b2} with a1 -> b1 and
  // b2 -> a2 have no path between them in the graph, yet the steps A and B would form a cycle.)
  bool depends_on(int32_t u, int a, int b = -1) {
    ++cur_stamp_;
    stack_.assign(1, u);
    while (!stack_.empty()) {
      const int32_t x = stack_.back();
      stack_.pop_back();
      if (stamp_[x] == cur_stamp_) continue;
      stamp_[x] = cur_stamp_;
      const int h = group_of_[x];
      if (h >= 0 && (h == a || h == b)) return true;
      if (h >= 0) {
        if (group_stamp_[h] == cur_stamp_) continue;
        group_stamp_[h] = cur_stamp_;
        for (int32_t m : groups_[h].members)
          for (int32_t in : graph_.nodes[m].inputs) stack_.push_back(in);
      } else {
        for (int32_t in : graph_.nodes[x].inputs) stack_.push_back(in);
      }
    }
    return false;
  }

  bool compatible(int gi, int32_t v, DType t) const {
    const Group& gr = groups_[gi];
    const GraphNode& n = graph_.nodes[v];
    return gr.alive && gr.reduction < 0 && gr.dtype == t && same_dims(gr.shape, gr.sym, n.meta) &&
           gr.device == n.meta.device && int(gr.members.size()) < kMaxMembers &&
           phases_fit(std::min(gr.lo_phase, n.phase), std::max(gr.hi_phase, n.phase));
  }

  // Whether v can join group gi: no input of v outside the group depends on it.
  bool can_join(int gi, int32_t v) {
    for (int32_t in : graph_.nodes[v].inputs)
      if (group_of_[in] != gi && depends_on(in, gi)) return false;
    return true;
  }

  void add(int gi, int32_t v) {
    Group& gr = groups_[gi];
    gr.members.push_back(v);
    gr.lo_phase = std::min(gr.lo_phase, graph_.nodes[v].phase);
    gr.hi_phase = std::max(gr.hi_phase, graph_.nodes[v].phase);
    group_of_[v] = gi;
    for (int32_t in : graph_.nodes[v].inputs)
      if (group_of_[in] != gi) readers_[in].push_back(gi);
  }

  void place(int32_t v, DType t) {
    const GraphNode& n = graph_.nodes[v];
    // Producer groups first, then siblings (groups that read one of v's inputs).
    std::vector<int> cands;
    for (int32_t in : n.inputs)
      if (group_of_[in] >= 0) cands.push_back(group_of_[in]);
    const size_t producers = cands.size();
    // Not through a captured tensor (a parameter): its readers are far apart (the forward, the
    // gradient, the optimizer's update), and joining them would keep an optimizer's value live
    // from the forward on, for one read of the parameter saved.
    // Nor through a constant (or a fill): reading it once saves nothing, and the sibling would
    // run where the other group runs (relu's masks of every layer in one kernel, each then kept
    // until its layer's gradient).
    for (int32_t in : n.inputs) {
      const GraphNode& src = graph_.nodes[in];
      if (src.kind == NodeKind::Input && src.role == InputRole::Captured) continue;
      if (src.kind == NodeKind::Constant || (src.kind == NodeKind::Op && src.op == OpId::Full))
        continue;
      for (auto it = readers_[in].rbegin(); it != readers_[in].rend(); ++it) cands.push_back(*it);
    }
    int chosen = -1;
    for (int gi : cands)
      if (compatible(gi, v, t) && can_join(gi, v)) {
        chosen = gi;
        break;
      }
    if (chosen < 0) {
      Group gr;
      gr.shape = n.meta.shape;
      gr.sym = n.meta.sym;
      gr.dtype = t;
      gr.device = n.meta.device;
      groups_.push_back(gr);
      group_stamp_.push_back(0);
      chosen = static_cast<int>(groups_.size()) - 1;
    }
    add(chosen, v);
    // Other producer groups merge in when that makes no cycle.
    for (size_t k = 0; k < producers; ++k) {
      const int other = cands[k];
      if (other == chosen || !groups_[other].alive) continue;
      try_merge(chosen, other);
    }
  }

  void try_merge(int a, int b) {
    Group& ga = groups_[a];
    Group& gb = groups_[b];
    if (gb.reduction >= 0 || ga.reduction >= 0 || gb.dtype != ga.dtype ||
        !same_dims(ga.shape, ga.sym, TensorMeta{gb.shape, gb.dtype, gb.device, gb.sym}) ||
        !(gb.device == ga.device) || int(ga.members.size() + gb.members.size()) > kMaxMembers ||
        !phases_fit(std::min(ga.lo_phase, gb.lo_phase), std::max(ga.hi_phase, gb.hi_phase)))
      return;
    for (const Group* gr : {&ga, &gb})
      for (int32_t m : gr->members)
        for (int32_t in : graph_.nodes[m].inputs)
          if (group_of_[in] != a && group_of_[in] != b && depends_on(in, a, b)) return;
    for (int32_t m : gb.members) {
      group_of_[m] = a;
      ga.members.push_back(m);
    }
    ga.lo_phase = std::min(ga.lo_phase, gb.lo_phase);
    ga.hi_phase = std::max(ga.hi_phase, gb.hi_phase);
    std::sort(ga.members.begin(), ga.members.end());
    gb.members.clear();
    gb.alive = false;
    for (auto& r : readers_)
      for (int& gi : r)
        if (gi == b) gi = a;
  }

  // A Sum, Max or Min over the trailing or the leading dims of a group member closes the group.
  // One of f16 or bf16 values (an f32 group's member of that dtype) accumulates in f32 and
  // rounds once, as the eager reduction does (FusedProgram::red_round).
  bool try_reduction(int32_t v) {
    const GraphNode& n = graph_.nodes[v];
    if (n.op != OpId::Sum && n.op != OpId::Max && n.op != OpId::Min) return false;
    const int32_t in = n.inputs[0];
    const int gi = group_of_[in];
    if (gi < 0) return false;
    Group& gr = groups_[gi];
    const bool low = is_low_precision(n.meta.dtype) && gr.dtype == DType::f32 &&
                     graph_.nodes[in].meta.dtype == n.meta.dtype;
    if (!gr.alive || gr.reduction >= 0 || !(low || n.meta.dtype == gr.dtype) ||
        !(low || is_float(n.meta.dtype)) || n.meta.device != gr.device ||
        !phases_fit(std::min(gr.lo_phase, n.phase), std::max(gr.hi_phase, n.phase)))
      return false;
    const int64_t nd = gr.shape.size();
    std::vector<int64_t> dims(n.attrs.ints.begin(), n.attrs.ints.end());
    if (dims.empty())
      for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
    if (nd == 0 || dims.empty()) return false;
    const int64_t k = static_cast<int64_t>(dims.size());
    bool lead = true, trail = true;
    for (int64_t i = 0; i < k; ++i) {
      lead = lead && dims[i] == i;
      trail = trail && dims[i] == nd - k + i;
    }
    if (!lead && !trail) return false;
    gr.reduce = trail ? kernels::FusedReduce::Inner : kernels::FusedReduce::Outer;
    gr.reduce_dims = static_cast<int32_t>(k);
    gr.reduction = v;
    gr.members.push_back(v);
    gr.lo_phase = std::min(gr.lo_phase, n.phase);
    gr.hi_phase = std::max(gr.hi_phase, n.phase);
    group_of_[v] = gi;
    return true;
  }

  std::vector<FusionGroup> finish() {
    // A group whose program would pass the kernel's limits (inputs, outputs, registers) splits
    // in two, by member order, until every part fits: a run of consecutive members of a group
    // that makes no cycle makes none either. (Siblings gather many independent updates, as an
    // optimizer's over all parameters, into one group.) A group with a reduction that does not
    // fit runs op by op.
    for (;;) {
      const std::vector<bool> needed = needed_values();
      std::vector<FusionGroup> out;
      bool split = false;
      for (size_t gi = 0; gi < groups_.size(); ++gi) {
        Group& gr = groups_[gi];
        if (!gr.alive) continue;
        const size_t elementwise = gr.members.size() - (gr.reduction >= 0 ? 1 : 0);
        if (elementwise < 2 && gr.reduction < 0) continue;  // one op: the eager kernel runs it
        FusionGroup f;
        if (build(gr, static_cast<int>(gi), needed, f)) {
          out.push_back(std::move(f));
        } else if (gr.reduction < 0 && gr.members.size() >= 4) {
          split_in_two(static_cast<int>(gi));
          split = true;
        }
      }
      if (!split) return out;
    }
  }

  // Who reads each value outside its group, and so what a group must store.
  std::vector<bool> needed_values() const {
    std::vector<bool> needed(n_, false);
    for (int32_t o : graph_.outputs) needed[o] = true;
    for (const WriteBack& w : graph_.writebacks) needed[w.value] = true;
    for (int32_t v = 0; v < n_; ++v)
      for (int32_t in : graph_.nodes[v].inputs)
        if (group_of_[in] < 0 || group_of_[in] != group_of_[v]) needed[in] = true;
    return needed;
  }

  void split_in_two(int gi) {
    std::vector<int32_t> members = groups_[gi].members;
    std::sort(members.begin(), members.end());
    const size_t half = members.size() / 2;
    Group second = groups_[gi];
    second.members.assign(members.begin() + half, members.end());
    groups_[gi].members.assign(members.begin(), members.begin() + half);
    groups_.push_back(std::move(second));
    group_stamp_.push_back(0);
    for (int32_t m : groups_.back().members) group_of_[m] = static_cast<int>(groups_.size()) - 1;
  }

  bool build(const Group& gr, int gi, const std::vector<bool>& needed, FusionGroup& f) {
    f.members = gr.members;
    f.shape = gr.shape;
    f.reduction = gr.reduction;
    f.reduce_dims = gr.reduce_dims;
    kernels::FusedProgram& p = f.program;
    p.dtype = gr.dtype;
    p.reduce = gr.reduce;
    std::unordered_map<int32_t, int16_t> reg;
    for (int32_t m : gr.members)
      for (int32_t in : graph_.nodes[m].inputs)
        if (group_of_[in] != gi && !reg.count(in)) {
          reg[in] = static_cast<int16_t>(f.inputs.size());
          const GraphNode& node = graph_.nodes[in];
          if (node.kind == NodeKind::Constant && node.constant.numel() == 1 && f.inputs.size() < 32)
            p.scalar_inputs |= 1u << f.inputs.size();
          f.inputs.push_back(in);
          p.in_dtypes.push_back(node.meta.dtype);
        }
    if (f.inputs.size() > DUET_FUSED_MAX_INPUTS) return false;
    // Last use of each member inside the group, for register reuse.
    std::unordered_map<int32_t, size_t> last;
    for (size_t i = 0; i < gr.members.size(); ++i)
      for (int32_t in : graph_.nodes[gr.members[i]].inputs) last[in] = i;
    std::vector<int16_t> free_regs;
    int16_t next = static_cast<int16_t>(f.inputs.size());
    for (size_t i = 0; i < gr.members.size(); ++i) {
      const int32_t m = gr.members[i];
      const GraphNode& node = graph_.nodes[m];
      if (m == gr.reduction) {
        p.reduce_op = node.op;
        p.reduce_src = reg.at(node.inputs[0]);
        if (is_low_precision(node.meta.dtype)) p.red_round = node.meta.dtype;
        break;
      }
      kernels::FusedInstr ins;
      ins.op = node.op;
      for (size_t j = 0; j < node.inputs.size(); ++j) ins.src[j] = reg.at(node.inputs[j]);
      if (node.op == OpId::Cast) ins.to = node.meta.dtype == DType::b8 ? DType::b8 : gr.dtype;
      if (is_low_precision(node.meta.dtype)) ins.round = node.meta.dtype;
      // Inputs dead after this instruction give their registers back (never an input
      // register, an output, or the reduced value).
      const bool keep =
          needed[m] || (gr.reduction >= 0 && graph_.nodes[gr.reduction].inputs[0] == m);
      for (int32_t in : node.inputs) {
        auto it = reg.find(in);
        if (group_of_[in] == gi && last[in] == i && !needed[in] &&
            !(gr.reduction >= 0 && graph_.nodes[gr.reduction].inputs[0] == in) &&
            std::find(free_regs.begin(), free_regs.end(), it->second) == free_regs.end())
          free_regs.push_back(it->second);
      }
      int16_t r;
      if (!keep && !free_regs.empty()) {
        r = free_regs.back();
        free_regs.pop_back();
      } else {
        r = next++;
      }
      ins.dst = r;
      reg[m] = r;
      p.code.push_back(ins);
      if (needed[m]) {
        f.outputs.push_back(m);
        p.outputs.push_back(r);
        p.out_dtypes.push_back(node.meta.dtype);
      }
    }
    p.num_regs = next;
    if (f.outputs.size() > DUET_FUSED_MAX_OUTPUTS || p.num_regs > kernels::kFusedMaxRegs)
      return false;
    return true;
  }

  const Graph& graph_;
  const int32_t n_;
  std::vector<Group> groups_;
  std::vector<int> group_of_;
  std::vector<std::vector<int>> readers_;  ///< value -> groups that read it from outside
  std::vector<uint32_t> stamp_, group_stamp_;
  std::vector<int32_t> stack_;
  uint32_t cur_stamp_ = 0;
};

}  // namespace

std::vector<FusionGroup> find_fusion_groups(const Graph& g) { return Fuser(g).run(); }

}  // namespace duet::detail
