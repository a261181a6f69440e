#include "trace/ir/passes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/dispatch.h"

namespace duet::detail {
namespace {

// A pass rebuilds the graph front to back: each old node becomes a new value (itself, rewritten,
// or an existing value it equals). Inputs keep their slots, outputs and write-backs are remapped.
struct Rebuild {
  const Graph& old;
  Graph g;
  std::vector<int32_t> map;  // old value -> new value

  explicit Rebuild(const Graph& o) : old(o), map(o.nodes.size(), -1) {
    g.captured = o.captured;
    g.scopes = o.scopes;
    g.num_runtime_inputs = o.num_runtime_inputs;
    g.label = o.label;
    g.remat = o.remat;
  }
  // The old node with its inputs remapped.
  GraphNode remapped(int32_t i) const {
    GraphNode n = old.nodes[i];
    for (int32_t& in : n.inputs) in = map[in];
    return n;
  }
  int32_t emit(GraphNode n) { return g.add(std::move(n)); }
  Graph done() {
    for (int32_t o : old.outputs) g.outputs.push_back(map[o]);
    for (const WriteBack& w : old.writebacks) g.writebacks.push_back({map[w.value], w.target});
    return std::move(g);
  }
};

// Note [Passes on symbolic graphs]
// The passes run on a graph as traced, its symbolic dims included (Note [A new size costs a
// plan] in trace/compile.cpp), so that what they decide holds at every size: two values have
// the same shape when their dims are equal as SymInts, not only at the traced call's sizes
// (x (s0, 8) and its transpose (8, s0) agree at s0 = 8); a node whose size, fill value or
// size-holding attributes are symbolic is never folded into a constant; and a node a pass makes
// of a symbolic value carries its symbolic sizes.

// Whether some dim of m is symbolic.
bool symbolic(const TensorMeta& m) {
  for (const SymInt& d : m.sym)
    if (!d.is_concrete()) return true;
  return false;
}

// same_meta, with symbolic dims compared as SymInts.
bool same_value_meta(const TensorMeta& a, const TensorMeta& b) {
  if (!same_meta(a, b)) return false;
  if (a.sym.empty() && b.sym.empty()) return true;
  for (int64_t d = 0; d < a.shape.size(); ++d) {
    const size_t k = static_cast<size_t>(d);
    const SymInt x = a.sym.empty() ? SymInt(a.shape[d]) : a.sym[k];
    const SymInt y = b.sym.empty() ? SymInt(b.shape[d]) : b.sym[k];
    if (!(x == y)) return false;
  }
  return true;
}

// The scalar a value of dtype d holds when v is stored in it.
Scalar stored_as(double v, DType d) {
  switch (d) {
    case DType::f32:
      return Scalar(static_cast<double>(static_cast<float>(v)));
    case DType::f64:
      return Scalar(v);
    case DType::b8:
      return Scalar(v != 0);
    case DType::f16:
    case DType::bf16:  // through f32, as the Cast kernels round
      return Scalar(static_cast<double>(
          low_precision_to_float(float_to_low_precision(static_cast<float>(v), d), d)));
    case DType::i8:  // the low bits, as the Cast kernels keep them
      return Scalar(static_cast<int64_t>(static_cast<int8_t>(static_cast<int64_t>(v))));
    case DType::u8:
      return Scalar(static_cast<int64_t>(static_cast<uint8_t>(static_cast<int64_t>(v))));
    case DType::i16:
      return Scalar(static_cast<int64_t>(static_cast<int16_t>(static_cast<int64_t>(v))));
    default:
      return Scalar(static_cast<int64_t>(v));
  }
}

GraphNode full_node(const TensorMeta& m, Scalar value, int32_t scope) {
  GraphNode n;
  n.kind = NodeKind::Op;
  n.op = OpId::Full;
  n.attrs.ints = SmallVec<int64_t, 6>(m.shape.data(), m.shape.size());
  n.attrs.value = value;
  n.attrs.dtype = m.dtype;
  if (symbolic(m)) {
    auto sym = std::make_shared<SymAttrs>();
    sym->ints = m.sym;
    n.attrs.sym = std::move(sym);
  }
  n.meta = m;
  n.scope = scope;
  return n;
}

// The bits of a one-element constant's element, zero-extended. Constants are told apart by their
// bits, not by ==: 0.0 == -0.0 (merging them makes x / -0.0 give +inf), a NaN equals no NaN,
// and doubles cannot tell large 64-bit integers apart.
uint64_t element_bits(const Tensor& t) {
  if (!t.device().is_cpu()) return element_bits(t.to(Device::cpu()));  // folded on a GPU
  uint64_t bits = 0;
  std::memcpy(&bits, t.raw_data(), std::min<size_t>(size_t(itemsize(t.dtype())), sizeof bits));
  return bits;
}

// Evaluates an op on constant inputs, below every mode.
Tensor evaluate(const GraphNode& n, const std::vector<Tensor>& in) {
  SuspendModes eager;
  const OpDef& def = op_def(n.op);
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : in) ptrs.push_back(&t);
  TensorRefs refs(ptrs.data(), int64_t(ptrs.size()));
  if (def.cls == OpClass::View) {
    Tensor v = def.view(in[0], n.attrs, n.meta);
    if (!v.defined()) v = def.view(in[0].contiguous(), n.attrs, n.meta);
    return v.clone();
  }
  Tensor out = empty(n.meta.shape, n.meta.dtype, n.meta.device);
  def.kernel[static_cast<int>(n.meta.device.type)](refs, n.attrs, out);
  return out;
}

}  // namespace

Graph dce(const Graph& old) {
  const size_t n = old.nodes.size();
  std::vector<bool> live(n, false);
  for (int32_t o : old.outputs) live[o] = true;
  for (const WriteBack& w : old.writebacks) live[w.value] = true;
  // Control nodes: which of their results are read (Project nodes come after their node).
  std::unordered_map<int32_t, std::vector<bool>> used;
  for (size_t i = n; i-- > 0;) {
    const GraphNode& g = old.nodes[i];
    if (g.kind == NodeKind::Input) live[i] = true;  // the calling convention
    if (has_effect(g)) live[i] = true;              // a print
    if (!live[i]) continue;
    if (g.kind == NodeKind::Project) {
      std::vector<bool>& u = used[g.inputs[0]];
      u.resize(old.nodes[g.inputs[0]].control->results.size(), false);
      u[g.index] = true;
    }
    for (int32_t in : g.inputs) live[in] = true;
  }
  Rebuild r(old);
  // Per control node: the new index of each old result (-1: dropped).
  std::unordered_map<int32_t, std::vector<int32_t>> renumber;
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    GraphNode node = r.remapped(int32_t(i));
    if (node.kind == NodeKind::Control) {
      // Results nobody reads leave the subgraphs (a scan keeps its carries: the next step
      // reads them), and DCE runs inside.
      const ControlFlow& cf = *node.control;
      const std::vector<bool>& u = used[int32_t(i)];
      auto pruned = std::make_shared<ControlFlow>(cf);
      pruned->results.clear();
      std::vector<int32_t>& map = renumber[int32_t(i)];
      std::vector<size_t> keep;
      for (size_t k = 0; k < cf.results.size(); ++k) {
        const bool needed = (k < u.size() && u[k]) || cf.kind == ControlKind::WhileLoop ||
                            (cf.kind == ControlKind::Scan && k < size_t(cf.num_carry));
        map.push_back(needed ? int32_t(keep.size()) : -1);
        if (needed) {
          keep.push_back(k);
          pruned->results.push_back(cf.results[k]);
        }
      }
      for (size_t b = 0; b < pruned->graphs.size(); ++b) {
        Graph& sub = pruned->graphs[b];
        const bool per_result = cf.kind != ControlKind::WhileLoop;
        if (per_result) {
          std::vector<int32_t> outs;
          for (size_t k : keep) outs.push_back(sub.outputs[k]);
          sub.outputs = std::move(outs);
        }
        sub = dce(sub);
      }
      node.control = std::move(pruned);
    } else if (node.kind == NodeKind::Project) {
      node.index = renumber.at(old.nodes[i].inputs[0])[node.index];
    }
    r.map[i] = r.emit(std::move(node));
  }
  return r.done();
}

Graph cse(const Graph& old) {
  Rebuild r(old);
  struct Key {
    const GraphNode* n;
    bool operator==(const Key& o) const {
      const GraphNode& a = *n;
      const GraphNode& b = *o.n;
      if (a.kind != b.kind) return false;
      if (a.kind == NodeKind::Control) return a.control == b.control && a.inputs == b.inputs;
      if (a.kind == NodeKind::Project) return a.inputs == b.inputs && a.index == b.index;
      if (a.kind == NodeKind::Constant)
        return a.meta.dtype == b.meta.dtype && a.meta.shape == b.meta.shape &&
               a.constant.unsafe_impl()->wrapped_number ==
                   b.constant.unsafe_impl()->wrapped_number &&
               element_bits(a.constant) == element_bits(b.constant);
      return a.op == b.op && a.inputs == b.inputs && a.attrs == b.attrs &&
             same_value_meta(a.meta, b.meta);  // Attrs compare Full's value by its bits
    }
  };
  struct Hash {
    size_t operator()(const Key& k) const {
      const GraphNode& a = *k.n;
      size_t h = std::hash<int>{}(int(a.kind)) * 31;
      if (a.kind == NodeKind::Constant) return h ^ std::hash<uint64_t>{}(element_bits(a.constant));
      h ^= std::hash<const void*>{}(a.control.get()) + std::hash<int32_t>{}(a.index);
      h ^= a.attrs.hash() + 0x9e3779b9 + (h << 6) + (h >> 2);
      h ^= std::hash<int>{}(int(a.op)) + 0x9e3779b9 + (h << 6) + (h >> 2);
      for (int32_t in : a.inputs) h ^= std::hash<int32_t>{}(in) + 0x9e3779b9 + (h << 6) + (h >> 2);
      return h;
    }
  };
  std::unordered_map<Key, int32_t, Hash> seen;
  std::vector<GraphNode> keep;  // stable addresses for the keys
  keep.reserve(old.nodes.size());
  for (size_t i = 0; i < old.nodes.size(); ++i) {
    GraphNode n = r.remapped(int32_t(i));
    const bool mergeable = n.kind == NodeKind::Op || n.kind == NodeKind::Control ||
                           n.kind == NodeKind::Project ||
                           (n.kind == NodeKind::Constant && n.constant.numel() == 1);
    if (!mergeable || !n.name.empty() || has_effect(n)) {
      r.map[i] = r.emit(std::move(n));
      continue;
    }
    keep.push_back(n);
    auto it = seen.find(Key{&keep.back()});
    if (it != seen.end()) {
      r.map[i] = it->second;
      continue;
    }
    int32_t v = r.emit(std::move(n));
    seen.emplace(Key{&keep.back()}, v);
    r.map[i] = v;
  }
  return r.done();
}

Graph fold(const Graph& old) {
  constexpr int64_t kMaxFolded = 4096;  // elements: larger constants would bloat the graph
  Rebuild r(old);
  // A cond whose predicate is a constant is its branch: the branch's nodes are inlined, and
  // its results stand for the Project nodes.
  std::unordered_map<int32_t, std::vector<int32_t>> inlined;
  for (size_t i = 0; i < old.nodes.size(); ++i) {
    GraphNode n = r.remapped(int32_t(i));
    double pred = 0;
    if (n.kind == NodeKind::Control && n.control->kind == ControlKind::Cond &&
        r.g.scalar_value(n.inputs[0], &pred)) {
      const Graph& b = n.control->graphs[pred != 0 ? 0 : 1];
      std::vector<int32_t> map(b.nodes.size(), -1);
      for (size_t j = 0; j < b.nodes.size(); ++j) {
        GraphNode m = b.nodes[j];
        if (m.kind == NodeKind::Input) {
          map[j] = n.inputs[1 + m.index];
          continue;
        }
        for (int32_t& in : m.inputs) in = map[in];
        m.scope = n.scope;
        map[j] = r.emit(std::move(m));
      }
      std::vector<int32_t>& res = inlined[int32_t(i)];
      for (int32_t o : b.outputs) res.push_back(map[o]);
      continue;
    }
    if (n.kind == NodeKind::Project) {
      auto it = inlined.find(old.nodes[i].inputs[0]);
      if (it != inlined.end()) {
        r.map[i] = it->second[n.index];
        continue;
      }
    }
    // Views and clones of constants cost nothing at run time (the plan makes views once), and
    // simplify turns those of filled constants into Full nodes, which later rules recognise.
    bool all_const = n.kind == NodeKind::Op && !n.inputs.empty() && !symbolic(n.meta) &&
                     !n.attrs.sym && n.meta.shape.numel() <= kMaxFolded && n.name.empty() &&
                     op_class(n.op) != OpClass::View && n.op != OpId::Copy && !has_effect(n);
    for (int32_t in : n.inputs) {
      const GraphNode& s = r.g.nodes[in];
      const bool is_full =
          s.kind == NodeKind::Op && s.op == OpId::Full && !symbolic(s.meta) && !s.attrs.sym;
      all_const = all_const && (s.kind == NodeKind::Constant || is_full);
    }
    if (!all_const) {
      r.map[i] = r.emit(std::move(n));
      continue;
    }
    std::vector<Tensor> in;
    for (int32_t v : n.inputs) {
      const GraphNode& s = r.g.nodes[v];
      in.push_back(s.kind == NodeKind::Constant ? s.constant : evaluate(s, {}));
    }
    GraphNode c;
    c.kind = NodeKind::Constant;
    c.meta = n.meta;
    c.scope = n.scope;
    // An op's result is never a wrapped number, even of numbers only (eager gives a 0-d tensor,
    // and later nodes were traced with its promotion: a 0-d f64 against a 0-d f32 gives f64).
    c.constant = evaluate(n, in);
    r.map[i] = r.emit(std::move(c));
  }
  return r.done();
}

// Note [Fills as operands]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A filled constant of an elementwise op's whole shape, read as one of its operands, is the
// same operand as a 0-d fill of that value: broadcasting gives every element the same value.
// The training step makes such operands: zero_grad() zeroes each .grad in place, so backward's
// accumulation reads add(full(0, [64, 64]), g), and mse_loss's gradient scales by a full of
// the batch's shape. As a full-size fill, the operand is a buffer written with the value at
// every call and read as one more stream by the fused kernel; as a 0-d fill it is one element,
// broadcast in registers. The rule keeps types and values exactly: every operand has the op's
// dtype (so promotion, which treats 0-d tensors apart, cannot change), another operand has the
// op's shape (so the result's shape cannot change), and the op computes with the same numbers.
// Note [Sums of slice writes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The gradient of a tensor read slice by slice (a packed query-key-value weight, a product's
// result split into query, key and value) is the sum of each slice's gradient written into
// zeros of the whole: for k slices, k fills, k slice_scatters and k - 1 adds, each a pass over
// the whole. When the slices are disjoint, each element of the sum is one slice's value plus
// zeros: x + 0.0, which is x except at x = -0.0 (IEEE: -0.0 + 0.0 is +0.0). So the sum is the
// writes of x + 0.0 into one fill, and where they cover the whole along their dim, the
// concatenation of the x + 0.0 (the adds fuse with the slices' producers, or run over the
// slices alone): one pass over the whole. Results are the same bits, -0.0 included. The rule
// takes concrete sizes, step 1 and floating dtypes only, and slices along one dim.
namespace {

// The rewrites of simplify, one method per rule; Simplifier::run rebuilds the graph through them.
struct Simplifier {
  const Graph& old;
  Rebuild r;
  std::vector<int32_t> uses;  // of each old value (outputs and write-backs count)

  explicit Simplifier(const Graph& g) : old(g), r(g), uses(g.nodes.size(), 0) {
    for (const GraphNode& n : old.nodes)
      for (int32_t in : n.inputs) ++uses[in];
    for (int32_t o : old.outputs) ++uses[o];
    for (const WriteBack& w : old.writebacks) ++uses[w.value];
  }

  const GraphNode& node(int32_t v) const { return r.g.nodes[v]; }
  bool is_scalar(int32_t v, double want) const {
    double x;
    return r.g.scalar_value(v, &x) && x == want;
  }
  // Whether v is a zero that adding (sub: subtracting) leaves every value of dtype d as it is.
  // In IEEE arithmetic that takes the zero of the right sign: -0.0 + +0.0 is +0.0, so x + 0.0
  // is not x at x = -0.0, and x - -0.0 = x + 0.0 is not either; x + -0.0 and x - 0.0 are x
  // (NaN and infinities included).
  bool is_identity_zero(int32_t v, DType d, bool sub) const {
    double x;
    return r.g.scalar_value(v, &x) && x == 0 && (!is_floating(d) || std::signbit(x) != sub);
  }

  // permute(x, identity) = x; permute(permute(x, a), b) = permute(x, a[b]).
  int32_t simplify_permute(GraphNode& n) {
    bool identity = true;
    for (int64_t d = 0; d < n.attrs.ints.size(); ++d) identity &= n.attrs.ints[d] == d;
    if (identity) return n.inputs[0];
    const GraphNode& p = node(n.inputs[0]);
    if (p.kind != NodeKind::Op || p.op != OpId::Permute) return -1;
    SmallVec<int64_t, 6> q(n.attrs.ints.size());
    bool id2 = true;
    for (int64_t d = 0; d < q.size(); ++d) {
      q[d] = p.attrs.ints[n.attrs.ints[d]];
      id2 &= q[d] == d;
    }
    if (id2) return p.inputs[0];
    n.attrs.ints = q;
    n.inputs = {p.inputs[0]};
    return -1;
  }

  // reshape(reshape(x)) = reshape(x); a reshape to x's own shape is x.
  int32_t simplify_reshape(GraphNode& n) {
    const GraphNode& p = node(n.inputs[0]);
    int32_t src = n.inputs[0];
    if (p.kind == NodeKind::Op && p.op == OpId::Reshape) src = p.inputs[0];
    if (same_value_meta(node(src).meta, n.meta)) return src;
    n.inputs = {src};
    return -1;
  }

  // The transpose of a 2-D product read only transposed: permute(matmul(a, b)) =
  // matmul(permute(b), permute(a)), so the product is computed in the layout it is read in.
  // A linear layer's weight gradient (x^T dy)^T then arrives contiguous in the weight's (out,
  // in) layout: BLAS takes the operands' transposes as flags, and the update and the write-back
  // into .grad read it in order instead of striding across it.
  int32_t transposed_product(const GraphNode& n, int32_t old_in) {
    const GraphNode& m = node(n.inputs[0]);
    if (uses[old_in] != 1 || m.kind != NodeKind::Op || m.op != OpId::MatMul ||
        n.attrs.ints.size() != 2 || n.attrs.ints[0] != 1 || !m.name.empty() ||
        node(m.inputs[0]).meta.shape.size() != 2 || node(m.inputs[1]).meta.shape.size() != 2)
      return -1;
    auto transpose = [&](int32_t v) {
      GraphNode t;
      t.kind = NodeKind::Op;
      t.op = OpId::Permute;
      t.inputs = {v};
      t.attrs.ints = {1, 0};
      t.scope = n.scope;
      t.meta = node(v).meta;
      t.meta.shape = Shape{t.meta.shape[1], t.meta.shape[0]};
      if (!t.meta.sym.empty()) std::swap(t.meta.sym[0], t.meta.sym[1]);
      const int32_t same = simplify_permute(t);
      return same >= 0 ? same : r.emit(std::move(t));
    };
    GraphNode p = m;
    const int32_t a = m.inputs[0], b = m.inputs[1];
    p.inputs = {transpose(b), transpose(a)};
    p.meta = n.meta;
    p.scope = n.scope;
    return r.emit(std::move(p));
  }

  // A fill of an elementwise op's whole shape read as an operand: a 0-d fill of the same value
  // and dtype gives the same values (Note [Fills as operands]).
  void shrink_fills(GraphNode& n) {
    if (n.inputs.size() < 2 || op_class(n.op) != OpClass::Elementwise || symbolic(n.meta)) return;
    const DType d = n.meta.dtype;
    bool full_shaped = false;
    for (int32_t v : n.inputs) {
      const GraphNode& s = node(v);
      if (s.meta.dtype != d) return;
      full_shaped |=
          !(s.kind == NodeKind::Op && s.op == OpId::Full) && s.meta.shape == n.meta.shape;
    }
    if (!full_shaped) return;
    for (int32_t& v : n.inputs) {
      const GraphNode& s = node(v);
      if (s.kind != NodeKind::Op || s.op != OpId::Full || s.attrs.sym || symbolic(s.meta) ||
          s.meta.shape.numel() <= 1)
        continue;
      TensorMeta m = s.meta;
      m.shape = Shape{};
      m.sym.clear();
      v = r.emit(full_node(m, s.attrs.value, s.scope));
    }
  }

  // Writes of disjoint slices along one dim into a +0.0 fill (Note [Sums of slice writes]).
  struct SliceWrite {
    int32_t src;
    int64_t start, end;
  };
  // Whether v is such writes (none: the fill itself), along *dim; appends them to *w.
  bool slice_writes(int32_t v, int64_t* dim, std::vector<SliceWrite>* w) const {
    const GraphNode& s = node(v);
    if (s.kind != NodeKind::Op || s.attrs.sym || symbolic(s.meta)) return false;
    if (s.op == OpId::Full) {
      double x;
      return r.g.scalar_value(v, &x) && x == 0 && !std::signbit(x);
    }
    if (s.op != OpId::SliceScatter || s.attrs.step != 1 || !slice_writes(s.inputs[0], dim, w))
      return false;
    const GraphNode& src = node(s.inputs[1]);
    if (src.meta.dtype != s.meta.dtype || !(src.meta.device == s.meta.device) ||
        (!w->empty() && *dim != s.attrs.dim))
      return false;
    for (const SliceWrite& o : *w)
      if (s.attrs.start < o.end && o.start < s.attrs.end) return false;
    *dim = s.attrs.dim;
    w->push_back({s.inputs[1], s.attrs.start, s.attrs.end});
    return true;
  }

  // add(a, b) of two sets of disjoint slice writes into zeros: the writes of x + 0.0 into one
  // fill, or, where they cover the whole dim, their concatenation (Note [Sums of slice writes]).
  int32_t sum_of_slice_writes(const GraphNode& n) {
    if (n.inputs.size() != 2 || symbolic(n.meta) || !is_floating(n.meta.dtype)) return -1;
    int64_t dim = -1, dim_b = -1;
    std::vector<SliceWrite> w, wb;
    if (!slice_writes(n.inputs[0], &dim, &w) || !slice_writes(n.inputs[1], &dim_b, &wb) ||
        w.empty() || wb.empty() || dim != dim_b ||
        !same_value_meta(node(n.inputs[0]).meta, n.meta) ||
        !same_value_meta(node(n.inputs[1]).meta, n.meta))
      return -1;
    for (const SliceWrite& b : wb) {
      for (const SliceWrite& a : w)
        if (b.start < a.end && a.start < b.end) return -1;
      w.push_back(b);
    }
    std::sort(w.begin(), w.end(),
              [](const SliceWrite& a, const SliceWrite& b) { return a.start < b.start; });
    // New nodes belong where the add was: its phase (Note [Fusion rules]), scope and line.
    auto emit = [&](GraphNode g) {
      g.scope = n.scope;
      g.site = n.site;
      g.phase = n.phase;
      g.no_grad = n.no_grad;
      return r.emit(std::move(g));
    };
    // Each value as the sum has it: x + 0.0, once (a write made by this rule already is).
    TensorMeta zero_meta{Shape{}, n.meta.dtype, n.meta.device, {}};
    const int32_t zero = emit(full_node(zero_meta, Scalar(0.0), n.scope));
    for (SliceWrite& x : w) {
      const GraphNode& src = node(x.src);
      if (src.kind == NodeKind::Op && src.op == OpId::Add && src.inputs.size() == 2 &&
          node(src.inputs[1]).kind == NodeKind::Op && node(src.inputs[1]).op == OpId::Full &&
          node(src.inputs[1]).meta.shape.numel() == 1 && is_scalar(src.inputs[1], 0) &&
          !std::signbit(node(src.inputs[1]).attrs.value.to<double>()))
        continue;
      GraphNode a;
      a.kind = NodeKind::Op;
      a.op = OpId::Add;
      a.inputs = {x.src, zero};
      a.meta = src.meta;
      x.src = emit(std::move(a));
    }
    bool whole = w.front().start == 0 && w.back().end == n.meta.shape[dim];
    for (size_t k = 1; k < w.size(); ++k) whole &= w[k].start == w[k - 1].end;
    if (whole) {
      GraphNode c;
      c.kind = NodeKind::Op;
      c.op = OpId::Cat;
      c.attrs.dim = dim;
      for (const SliceWrite& x : w) {
        c.inputs.push_back(x.src);
        c.attrs.ints.push_back(x.end - x.start);
      }
      c.meta = n.meta;
      return emit(std::move(c));
    }
    int32_t cur = emit(full_node(n.meta, Scalar(0.0), n.scope));
    for (const SliceWrite& x : w) {
      GraphNode ss;
      ss.kind = NodeKind::Op;
      ss.op = OpId::SliceScatter;
      ss.inputs = {cur, x.src};
      ss.attrs.dim = dim;
      ss.attrs.start = x.start;
      ss.attrs.end = x.end;
      ss.attrs.step = 1;
      ss.meta = n.meta;
      cur = emit(std::move(ss));
    }
    return cur;
  }

  // Note [Attention's gradient without its zeros]
  // Attention's result has the logsumexp as one more column, which the public function slices
  // away, so a backward writes the output's gradient into zeros of the whole result
  // (slice_scatter into a +0.0 fill) for the AttentionBackward node: a fill and a copy, 0.18 ms
  // a W8 step. That node also takes the output's gradient alone, the logsumexp's then +0.0 (Note
  // [Attention] in core/ops/attention.cpp), so on the CPU it reads it directly, with the same
  // arithmetic: the same bits. (The CUDA kernel takes the whole gradient only.)
  void attention_gradient_without_zeros(GraphNode& n) {
    if (!n.meta.device.is_cpu() || n.inputs.size() < 5 || symbolic(n.meta)) return;
    const GraphNode& g = node(n.inputs[4]);
    if (g.kind != NodeKind::Op || g.op != OpId::SliceScatter || g.attrs.sym || symbolic(g.meta) ||
        g.attrs.step != 1 || g.attrs.start != 0 || g.meta.shape.size() == 0)
      return;
    const int64_t last = g.meta.shape.size() - 1;
    double z;
    if ((g.attrs.dim != last && g.attrs.dim != -1) || g.attrs.end != g.meta.shape[last] - 1 ||
        !r.g.scalar_value(g.inputs[0], &z) || z != 0 || std::signbit(z) ||
        node(g.inputs[1]).meta.dtype != g.meta.dtype)
      return;
    n.inputs[4] = g.inputs[1];
  }

  // An existing value equal to node i (rebuilt as n), or -1; n may be rewritten in place.
  int32_t rewrite(GraphNode& n, size_t i) {
    int32_t same = -1;
    const auto& in = n.inputs;
    auto fits = [&](int32_t v) { return same_value_meta(node(v).meta, n.meta); };
    switch (n.op) {
      case OpId::Add:
        if (is_identity_zero(in[1], n.meta.dtype, false) && fits(in[0]))
          same = in[0];
        else if (is_identity_zero(in[0], n.meta.dtype, false) && fits(in[1]))
          same = in[1];
        else
          same = sum_of_slice_writes(n);
        break;
      case OpId::Sub:
        if (is_identity_zero(in[1], n.meta.dtype, true) && fits(in[0])) same = in[0];
        break;
      case OpId::Mul:
        if (is_scalar(in[1], 1) && fits(in[0]))
          same = in[0];
        else if (is_scalar(in[0], 1) && fits(in[1]))
          same = in[1];
        break;
      case OpId::Div:
        if (is_scalar(in[1], 1) && fits(in[0])) same = in[0];
        break;
      case OpId::Neg:
        if (node(in[0]).kind == NodeKind::Op && node(in[0]).op == OpId::Neg)
          same = node(in[0]).inputs[0];
        break;
      case OpId::Where:
        if (in[1] == in[2] && fits(in[1])) same = in[1];
        break;
      case OpId::AttentionBackward:
        attention_gradient_without_zeros(n);
        break;
      case OpId::Cast:
      case OpId::Copy:
      case OpId::Reshape:
      case OpId::Permute:
      case OpId::Expand: {
        double v;
        if (r.g.scalar_value(in[0], &v) && n.meta.shape.numel() > 0) {
          // A filled constant converted, cloned or reshaped is a filled constant.
          const DType from = node(in[0]).meta.dtype;
          n = full_node(n.meta, stored_as(stored_as(v, from).to<double>(), n.meta.dtype), n.scope);
          break;
        }
        if (n.op == OpId::Permute) {
          same = simplify_permute(n);
          if (same < 0 && n.inputs[0] == r.map[old.nodes[i].inputs[0]])
            same = transposed_product(n, old.nodes[i].inputs[0]);
          break;
        }
        if (n.op == OpId::Reshape) {
          same = simplify_reshape(n);
          break;
        }
        if (fits(in[0]) && n.op != OpId::Copy) same = in[0];
        // A clone of a fresh op result is that result: values in the graph are immutable.
        if (n.op == OpId::Copy && fits(in[0]) && node(in[0]).kind == NodeKind::Op &&
            op_class(node(in[0]).op) != OpClass::View)
          same = in[0];
        break;
      }
      default:
        break;
    }
    return same;
  }

  Graph run() {
    for (size_t i = 0; i < old.nodes.size(); ++i) {
      GraphNode n = r.remapped(int32_t(i));
      int32_t same = -1;
      if (n.kind == NodeKind::Op && n.name.empty()) {
        shrink_fills(n);
        same = rewrite(n, i);
      }
      r.map[i] = same >= 0 ? same : r.emit(std::move(n));
    }
    return r.done();
  }
};

}  // namespace

Graph simplify(const Graph& old) { return Simplifier(old).run(); }

namespace {

const char* const kGraphPasses[] = {"fold", "simplify", "cse", "dce", "remat", "duplicate"};
const char* const kPlanPasses[] = {"codegen",  "plan_memory", "hoist",
                                   "parallel", "cuda_graph",  "donate"};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<RegisteredPass>& registry() {
  static std::vector<RegisteredPass> r;
  return r;
}

}  // namespace

std::vector<std::string> pipeline_passes() {
  std::vector<std::string> r(std::begin(kGraphPasses), std::end(kGraphPasses));
  const std::vector<RegisteredPass> extra = registered_passes();
  for (const RegisteredPass& p : extra)
    if (p.graph) r.push_back(p.name);
  r.push_back("fuse");
  for (const RegisteredPass& p : extra)
    if (p.fusion) r.push_back(p.name);
  r.insert(r.end(), std::begin(kPlanPasses), std::end(kPlanPasses));
  return r;
}

void register_pass(RegisteredPass pass) {
  DUET_CHECK_VALUE(!pass.name.empty() && (bool(pass.graph) != bool(pass.fusion)),
                   "[register_pass] a pass needs a name and exactly one of a graph function and "
                   "a fusion function (got \"{}\")",
                   pass.name);
  const std::vector<std::string> names = pipeline_passes();
  DUET_CHECK_VALUE(std::find(names.begin(), names.end(), pass.name) == names.end(),
                   "[register_pass] a pass named \"{}\" is already in the pipeline", pass.name);
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(std::move(pass));
}

void unregister_pass(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  r.erase(
      std::remove_if(r.begin(), r.end(), [&](const RegisteredPass& p) { return p.name == name; }),
      r.end());
}

std::vector<RegisteredPass> registered_passes() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry();
}

void check_pass_names(const std::vector<std::string>& names) {
  const std::vector<std::string> known = pipeline_passes();
  for (const std::string& s : names) {
    if (std::find(known.begin(), known.end(), s) != known.end()) continue;
    std::string list;
    for (size_t i = 0; i < known.size(); ++i)
      list += fmt::format("{}{}", i == 0 ? "" : i + 1 == known.size() ? " and " : ", ", known[i]);
    DUET_CHECK_VALUE(false, "[compile] unknown pass \"{}\" in disable_passes; the passes are {}", s,
                     list);
  }
}

Graph optimize(const Graph& g, const std::vector<std::string>& disabled) {
  auto on = [&](const std::string& p) {
    return std::find(disabled.begin(), disabled.end(), p) == disabled.end();
  };
  Graph cur = g;
  // The functions of control-flow nodes first: a subgraph is a graph like any other.
  for (GraphNode& n : cur.nodes)
    if (n.kind == NodeKind::Control) {
      auto cf = std::make_shared<ControlFlow>(*n.control);
      for (Graph& sub : cf->graphs) sub = optimize(sub, disabled);
      n.control = std::move(cf);
    }
  for (int round = 0; round < 2; ++round) {
    if (on("fold")) cur = fold(cur);
    if (on("simplify")) cur = simplify(cur);
    if (on("cse")) cur = cse(cur);
    // Dead nodes are dropped between rounds so later rounds see single uses.
    if (on("dce")) cur = dce(cur);
  }
  if (on("remat")) {
    cur = remat(cur);
    if (on("dce")) cur = dce(cur);  // forward values only the backward read
  }
  if (on("duplicate")) cur = duplicate(cur);  // after cse, which would merge the copies
  for (const RegisteredPass& p : registered_passes())
    if (p.graph && on(p.name)) cur = p.graph(cur);
  return cur;
}

}  // namespace duet::detail
