#include "trace/ir/graph.h"

#include "core/dist.h"

#include <unordered_map>

#include "core/dispatch.h"
#include "core/dist.h"

namespace duet {

namespace {

const char* role_name(InputRole r) {
  switch (r) {
    case InputRole::Argument:
      return "arg";
    case InputRole::Captured:
      return "captured";
    case InputRole::Placeholder:
      return "placeholder";
    case InputRole::GradOutput:
      return "grad_output";
    case InputRole::Saved:
      return "saved";
  }
  return "?";
}

bool reads_dtype(OpId op) {
  return op == OpId::Cast || op == OpId::Full || op == OpId::Arange || op == OpId::Random;
}

std::string meta_str(const TensorMeta& m) {
  std::string s = fmt::format("{}[", dtype_name(m.dtype));
  for (int64_t i = 0; i < m.shape.size(); ++i)
    s += fmt::format("{}{}", i ? ", " : "",
                     m.sym.empty() ? std::to_string(m.shape[i]) : m.sym[i].str());
  s += "]";
  if (!m.device.is_cpu()) s += fmt::format(" {}", m.device);
  return s;
}

std::string scalar_str(const Scalar& v) {
  if (v.is_bool()) return v.to<bool>() ? "true" : "false";
  if (v.is_integral()) return std::to_string(v.to<int64_t>());
  return fmt::format("{}", v.to<double>());
}

std::string constant_str(const Tensor& t) {
  if (t.numel() == 1) {
    double v = detail::read_double(t, 0);
    return is_floating(t.dtype()) ? fmt::format("{}", v) : fmt::format("{}", int64_t(v));
  }
  return fmt::format("<{} values>", t.numel());
}

}  // namespace

std::string attrs_str(OpId op, const Attrs& a) {
  if (op == OpId::Print) return fmt::format("format=\"{}\"", detail::interned_format(a.dim));
  std::vector<std::string> parts;
  if (a.ints.size()) {
    std::string s = "[";
    const bool sym = a.sym && !a.sym->ints.empty();
    for (int64_t i = 0; i < a.ints.size(); ++i)
      s += fmt::format("{}{}", i ? ", " : "",
                       sym ? a.sym->ints[i].str() : std::to_string(a.ints[i]));
    const OpClass cls = op_class(op);
    const char* key = cls == OpClass::Reduction || op == OpId::Permute ? "dims" : "shape";
    parts.push_back(fmt::format("{}={}]", key, s));
  }
  const Attrs d{};
  if (a.dim != d.dim) parts.push_back(fmt::format("dim={}", a.dim));
  const SymAttrs* sa = a.sym.get();
  if (sa && sa->start)
    parts.push_back(fmt::format("start={}", sa->start->str()));
  else if (a.start != d.start)
    parts.push_back(fmt::format("start={}", a.start));
  if (sa && sa->end)
    parts.push_back(fmt::format("end={}", sa->end->str()));
  else if (a.end != d.end)
    parts.push_back(fmt::format("end={}", a.end));
  if (a.step != d.step) parts.push_back(fmt::format("step={}", a.step));
  if (a.keepdim) parts.push_back("keepdim");
  if (op == OpId::Transfer || !a.device.is_cpu())
    parts.push_back(fmt::format("device={}", a.device));
  if (reads_dtype(op)) parts.push_back(fmt::format("dtype={}", dtype_name(a.dtype)));
  if (op == OpId::Full)
    parts.push_back(
        fmt::format("value={}", sa && sa->value ? sa->value->str() : scalar_str(a.value)));
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? " " : "") + parts[i];
  return s;
}

const char* ControlFlow::name() const {
  switch (kind) {
    case ControlKind::Cond:
      return "cond";
    case ControlKind::Scan:
      return "scan";
    case ControlKind::WhileLoop:
      return "while_loop";
  }
  return "?";
}

int64_t Graph::num_nodes() const {
  int64_t n = 0;
  for (const GraphNode& g : nodes) {
    n += g.kind == NodeKind::Op || g.kind == NodeKind::Control;
    if (g.kind == NodeKind::Control)
      for (const Graph& sub : g.control->graphs) n += sub.num_nodes();
  }
  return n;
}

int32_t Graph::add(GraphNode n) {
  nodes.push_back(std::move(n));
  return static_cast<int32_t>(nodes.size() - 1);
}

bool Graph::scalar_value(int32_t v, double* out) const {
  const GraphNode& n = nodes[v];
  if (n.kind == NodeKind::Constant && n.constant.numel() == 1) {
    *out = detail::read_double(n.constant, 0);
    return true;
  }
  // A fill computed from symbolic sizes (mean's count) is known at the traced call only.
  if (n.kind == NodeKind::Op && n.op == OpId::Full && !(n.attrs.sym && n.attrs.sym->value)) {
    *out = n.attrs.value.to<double>();
    return true;
  }
  return false;
}

namespace {

std::string results_str(const ControlFlow& cf) {
  std::string s = "(";
  for (size_t i = 0; i < cf.results.size(); ++i) s += (i ? ", " : "") + meta_str(cf.results[i]);
  return s + ")";
}

const char* subgraph_name(const ControlFlow& cf, size_t k) {
  switch (cf.kind) {
    case ControlKind::Cond:
      return k == 0 ? "true" : "false";
    case ControlKind::Scan:
      return "body";
    case ControlKind::WhileLoop:
      return k == 0 ? "cond" : "body";
  }
  return "?";
}

void graph_str(const Graph& g, const std::string& pad, std::string& s) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const GraphNode& n = g.nodes[i];
    s += pad + detail::node_str(g, int32_t(i)) + "\n";
    if (n.kind == NodeKind::Control)
      for (size_t k = 0; k < n.control->graphs.size(); ++k) {
        s += fmt::format("{}  {}:\n", pad, subgraph_name(*n.control, k));
        graph_str(n.control->graphs[k], pad + "    ", s);
      }
  }
  s += pad + "return";
  for (size_t i = 0; i < g.outputs.size(); ++i)
    s += fmt::format("{} %{}", i ? "," : "", g.outputs[i]);
  s += "\n";
  for (const WriteBack& w : g.writebacks)
    s += fmt::format("{}write %{} -> captured {}\n", pad, w.value, w.target);
}

}  // namespace

bool detail::has_effect(const GraphNode& n) {
  if (n.kind == NodeKind::Op) return n.op == OpId::Print || dist::detail::is_collective(n.op);
  if (n.kind != NodeKind::Control) return false;
  for (const Graph& sub : n.control->graphs)
    for (const GraphNode& m : sub.nodes)
      if (has_effect(m)) return true;
  return false;
}

std::string detail::node_str(const Graph& g, int32_t v) {
  const GraphNode& n = g.nodes[v];
  std::string rhs, meta = meta_str(n.meta);
  auto args = [&] {
    std::string a;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      a += fmt::format("{}%{}", k ? ", " : "", n.inputs[k]);
    return a;
  };
  switch (n.kind) {
    case NodeKind::Input:
      rhs = fmt::format("{} {}", role_name(n.role), n.index);
      break;
    case NodeKind::Constant:
      rhs = fmt::format("constant {}", constant_str(n.constant));
      break;
    case NodeKind::Op: {
      rhs = fmt::format("{}({})", op_name(n.op), args());
      std::string a = attrs_str(n.op, n.attrs);
      if (!a.empty()) rhs += " {" + a + "}";
      break;
    }
    case NodeKind::Control: {
      const ControlFlow& cf = *n.control;
      rhs = fmt::format("{}({})", cf.name(), args());
      if (cf.kind == ControlKind::Scan)
        rhs += fmt::format(" {{carry={} xs={}{}}}", cf.num_carry, cf.num_xs,
                           cf.reverse ? " reverse" : "");
      meta = results_str(cf);
      break;
    }
    case NodeKind::Project:
      rhs = fmt::format("project(%{})[{}]", n.inputs[0], n.index);
      break;
  }
  std::string s = fmt::format("%{} = {} : {}", v, rhs, meta);
  if (!n.name.empty()) s += fmt::format("  \"{}\"", n.name);
  if (n.scope >= 0 && n.scope < int32_t(g.scopes.size()))
    s += fmt::format("  @{}", g.scopes[n.scope]);
  if (n.site) s += fmt::format("  at {}", n.site.str());
  return s;
}

std::string Graph::str() const {
  std::string s;
  if (!label.empty()) s += fmt::format("# {}\n", label);
  graph_str(*this, "  ", s);
  return s;
}

std::string Graph::dot() const {
  std::string s = "digraph duet {\n  rankdir=TB;\n  node [fontname=\"monospace\" fontsize=10];\n";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& n = nodes[i];
    std::string label, shape = "box", style;
    switch (n.kind) {
      case NodeKind::Input:
        label = fmt::format("{} {}", role_name(n.role), n.index);
        shape = "ellipse";
        style = " style=filled fillcolor=\"#dde8f8\"";
        break;
      case NodeKind::Constant:
        label = fmt::format("constant {}", constant_str(n.constant));
        shape = "plaintext";
        break;
      case NodeKind::Op: {
        label = std::string(op_name(n.op));
        std::string a = attrs_str(n.op, n.attrs);
        if (!a.empty()) label += "\\n" + a;
        if (op_class(n.op) == OpClass::Opaque) style = " style=filled fillcolor=\"#f8e8c8\"";
        break;
      }
      case NodeKind::Control:
        label = fmt::format("{} ({} nodes inside)", n.control->name(), [&] {
          int64_t k = 0;
          for (const Graph& sub : n.control->graphs) k += sub.num_nodes();
          return k;
        }());
        shape = "box3d";
        style = " style=filled fillcolor=\"#e0f0d8\"";
        break;
      case NodeKind::Project:
        label = fmt::format("project [{}]", n.index);
        shape = "cds";
        break;
    }
    label = fmt::format("%{} {}\\n{}", i, label,
                        n.kind == NodeKind::Control ? results_str(*n.control) : meta_str(n.meta));
    if (!n.name.empty()) label += fmt::format("\\n\\\"{}\\\"", n.name);
    if (n.scope >= 0) label += fmt::format("\\n@{}", scopes[n.scope]);
    if (n.site) label += fmt::format("\\nat {}", n.site.str());
    s += fmt::format("  n{} [label=\"{}\" shape={}{}];\n", i, label, shape, style);
    for (int32_t in : n.inputs) s += fmt::format("  n{} -> n{};\n", in, i);
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    s += fmt::format("  out{0} [label=\"out{0}\" shape=doubleoctagon];\n  n{1} -> out{0};\n", i,
                     outputs[i]);
  for (size_t i = 0; i < writebacks.size(); ++i)
    s += fmt::format(
        "  wb{0} [label=\"write captured {1}\" shape=house];\n  n{2} -> wb{0} [style=dashed];\n", i,
        writebacks[i].target, writebacks[i].value);
  return s + "}\n";
}

namespace {

using detail::same_meta;

// The subgraphs of control node i against its inputs and results (Note [Control flow nodes]).
void verify_control(const Graph& outer, int32_t i) {
  const GraphNode& node = outer.nodes[i];
  const ControlFlow& cf = *node.control;
  const int32_t lead = cf.num_leading();
  const int32_t nin = int32_t(node.inputs.size()) - lead;
  // The counts first, so that nothing below indexes past them.
  DUET_ASSERT(nin >= 0 && cf.num_carry >= 0 && cf.num_xs >= 0 &&
                  (cf.kind != ControlKind::Scan || cf.num_carry + cf.num_xs <= nin) &&
                  (cf.kind != ControlKind::WhileLoop || cf.num_carry <= nin) &&
                  (cf.kind == ControlKind::Cond || int64_t(cf.results.size()) >= cf.num_carry),
              "graph %{}: {} has {} inputs for {} carries and {} scanned tensors, and {} results",
              i, cf.name(), nin, cf.num_carry, cf.num_xs, cf.results.size());
  std::vector<TensorMeta> in;  // what each subgraph's runtime input slot holds
  for (int32_t k = 0; k < nin; ++k) in.push_back(outer.nodes[node.inputs[lead + k]].meta);
  if (cf.kind == ControlKind::Scan)
    for (int32_t k = cf.num_carry; k < cf.num_carry + cf.num_xs; ++k) {
      DUET_ASSERT(in[k].shape.size() >= 1, "graph %{}: scan xs {} is 0-d", i, k - cf.num_carry);
      in[k].shape.erase(0);
    }
  for (size_t s = 0; s < cf.graphs.size(); ++s) {
    const Graph& sub = cf.graphs[s];
    sub.verify();
    DUET_ASSERT(sub.captured.empty() && sub.writebacks.empty() && sub.num_runtime_inputs == nin,
                "graph %{}: {} subgraph {} takes {} inputs (captured {}), the node gives {}", i,
                cf.name(), s, sub.num_runtime_inputs, sub.captured.size(), nin);
    for (const GraphNode& n : sub.nodes)
      if (n.kind == NodeKind::Input)
        DUET_ASSERT(n.role != InputRole::Captured && n.index >= 0 && n.index < nin &&
                        same_meta(n.meta, in[n.index]),
                    "graph %{}: {} subgraph {} input {} is {}, the node gives {}", i, cf.name(), s,
                    n.index, meta_str(n.meta),
                    n.index >= 0 && n.index < nin ? meta_str(in[n.index]) : "no such input");
  }
  auto out_meta = [&](const Graph& sub, size_t k) { return sub.nodes[sub.outputs[k]].meta; };
  auto check_out = [&](const Graph& sub, size_t k, const TensorMeta& want) {
    DUET_ASSERT(k < sub.outputs.size() && same_meta(out_meta(sub, k), want),
                "graph %{}: {} result {} should be {}", i, cf.name(), k, meta_str(want));
  };
  switch (cf.kind) {
    case ControlKind::Cond:
      DUET_ASSERT(cf.graphs.size() == 2, "graph %{}: cond needs two branches", i);
      for (const Graph& b : cf.graphs) {
        DUET_ASSERT(b.outputs.size() == cf.results.size(), "graph %{}: cond branch results", i);
        for (size_t k = 0; k < cf.results.size(); ++k) check_out(b, k, cf.results[k]);
      }
      break;
    case ControlKind::Scan: {
      DUET_ASSERT(cf.graphs.size() == 1 && cf.num_xs >= 1, "graph %{}: scan needs a body", i);
      const Graph& b = cf.graphs[0];
      DUET_ASSERT(b.outputs.size() == cf.results.size(), "graph %{}: scan body results", i);
      for (int32_t k = 0; k < cf.num_carry; ++k) {
        check_out(b, k, in[k]);
        DUET_ASSERT(same_meta(cf.results[k], in[k]), "graph %{}: scan carry {}", i, k);
      }
      for (size_t k = cf.num_carry; k < cf.results.size(); ++k) {
        TensorMeta y = cf.results[k];
        DUET_ASSERT(y.shape.size() >= 1, "graph %{}: scan ys {} is 0-d", i, k);
        y.shape.erase(0);
        check_out(b, k, y);
      }
      break;
    }
    case ControlKind::WhileLoop:
      DUET_ASSERT(cf.graphs.size() == 2 && cf.graphs[0].outputs.size() == 1 &&
                      out_meta(cf.graphs[0], 0).dtype == DType::b8,
                  "graph %{}: while_loop needs a b8 cond_fn and a body", i);
      for (int32_t k = 0; k < cf.num_carry; ++k) {
        check_out(cf.graphs[1], k, in[k]);
        DUET_ASSERT(same_meta(cf.results[k], in[k]), "graph %{}: while_loop state {}", i, k);
      }
      break;
  }
}

}  // namespace

void Graph::verify() const {
  detail::HintReads hints;  // the shape rules check the sizes the metas hold
  const int32_t n = static_cast<int32_t>(nodes.size());
  std::vector<bool> slot_seen(static_cast<size_t>(num_runtime_inputs), false);
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = nodes[i];
    switch (g.kind) {
      case NodeKind::Input:
        if (g.role == InputRole::Captured) {
          DUET_ASSERT(g.index >= 0 && g.index < int32_t(captured.size()),
                      "graph %{}: captured index {} of {}", i, g.index, captured.size());
          const Tensor& c = captured[g.index];
          DUET_ASSERT(c.sizes() == g.meta.shape && c.dtype() == g.meta.dtype,
                      "graph %{}: captured tensor {} {} but the node says {}", i, c.sizes(),
                      c.dtype(), meta_str(g.meta));
        } else {
          DUET_ASSERT(g.index >= 0 && g.index < num_runtime_inputs && !slot_seen[g.index],
                      "graph %{}: runtime input slot {} (of {}) out of range or repeated", i,
                      g.index, num_runtime_inputs);
          slot_seen[g.index] = true;
        }
        break;
      case NodeKind::Constant:
        DUET_ASSERT(g.constant.defined() && g.constant.sizes() == g.meta.shape &&
                        g.constant.dtype() == g.meta.dtype,
                    "graph %{}: constant does not match its metadata", i);
        break;
      case NodeKind::Op: {
        const OpDef& def = detail::op_def(g.op);
        DUET_ASSERT(def.arity < 0 || int(g.inputs.size()) == def.arity,
                    "graph %{}: {} has {} inputs, its arity is {}", i, def.name, g.inputs.size(),
                    def.arity);
        // Re-run the shape rule on placeholder tensors of the inputs' metadata.
        std::vector<Tensor> ins;
        ins.reserve(g.inputs.size());
        for (int32_t in : g.inputs) {
          DUET_ASSERT(in >= 0 && in < i, "graph %{}: input %{} is not defined before it", i, in);
          const GraphNode& src = nodes[in];
          Tensor t =
              src.kind == NodeKind::Constant ? src.constant : detail::make_meta_tensor(src.meta);
          ins.push_back(t);
        }
        std::vector<const Tensor*> ptrs;
        for (const Tensor& t : ins) ptrs.push_back(&t);
        TensorMeta m;
        def.infer(def, TensorRefs(ptrs.data(), int64_t(ptrs.size())), g.attrs, m);
        DUET_ASSERT(m.shape == g.meta.shape && m.dtype == g.meta.dtype,
                    "graph %{}: {} gives {} {} but the node says {}", i, def.name, m.shape, m.dtype,
                    meta_str(g.meta));
        break;
      }
      case NodeKind::Control:
        for (int32_t in : g.inputs)
          DUET_ASSERT(in >= 0 && in < i, "graph %{}: input %{} is not defined before it", i, in);
        verify_control(*this, i);
        break;
      case NodeKind::Project: {
        DUET_ASSERT(g.inputs.size() == 1 && g.inputs[0] >= 0 && g.inputs[0] < i &&
                        nodes[g.inputs[0]].kind == NodeKind::Control,
                    "graph %{}: a project must read an earlier control node", i);
        const ControlFlow& cf = *nodes[g.inputs[0]].control;
        DUET_ASSERT(g.index >= 0 && g.index < int32_t(cf.results.size()) &&
                        same_meta(cf.results[g.index], g.meta),
                    "graph %{}: project [{}] of a {} with results {} says {}", i, g.index,
                    cf.name(), results_str(cf), meta_str(g.meta));
        break;
      }
    }
  }
  for (int32_t o : outputs) DUET_ASSERT(o >= 0 && o < n, "graph output %{} out of range", o);
  for (const WriteBack& w : writebacks) {
    DUET_ASSERT(w.value >= 0 && w.value < n && w.target >= 0 && w.target < int32_t(captured.size()),
                "graph write-back %{} -> captured {} out of range", w.value, w.target);
    DUET_ASSERT(nodes[w.value].meta.shape == captured[w.target].sizes() &&
                    nodes[w.value].meta.dtype == captured[w.target].dtype(),
                "graph write-back %{} does not match captured {}", w.value, w.target);
  }
}

// ---- scopes ----

namespace {
thread_local std::string tls_scope;
thread_local std::vector<size_t> tls_scope_marks;
}  // namespace

Scope::Scope(std::string name) {
  tls_scope_marks.push_back(tls_scope.size());
  tls_scope += (tls_scope.empty() ? "" : "/") + name;
}
Scope::~Scope() {
  tls_scope.resize(tls_scope_marks.back());
  tls_scope_marks.pop_back();
}
Scope scope(std::string name) { return Scope(std::move(name)); }

const std::string& detail::current_scope() { return tls_scope; }

Tensor detail::make_meta_tensor(const TensorMeta& m) {
  auto* t = new TensorImpl();
  TensorImplPtr p = TensorImplPtr::adopt(t);
  t->dtype = m.dtype;
  t->shape = m.shape;
  t->sym = m.sym;
  t->strides = contiguous_strides(m.shape);
  t->storage = StoragePtr::adopt(new StorageImpl(nullptr, 0, m.device, nullptr));
  return Tensor(std::move(p));
}

}  // namespace duet
