// ONNX export (trace/onnx/onnx.h; docs/onnx_export.md): a traced duet graph written as an ONNX
// model of opset 17 with the protobuf classes of Debian's libonnx-dev.
//
// Note [ONNX export]
// The graph is written node by node, in its (topological) order. Each duet value becomes one
// ONNX value with a name of its own, unique in the whole model (subgraphs included, as ONNX's
// single static assignment asks); the graph's inputs and outputs carry the user's names, its
// captured tensors become initializers. Every op has exactly one definition: the switch of
// Writer::emit_op, written from the op's shape rule in core/ops/. duet promotes dtypes where
// ONNX asks for equal ones, so an op's operands are cast to the dtype its rule computes in.
// Values that no output needs are left out (a compiled trace holds its backward's work too),
// but an op with an effect (a print, a collective) is always written, and so raises.
//
// Note [Symbolic sizes in ONNX]
// A dim that is symbolic in the trace is a dim_param of the graph input it comes from. A size
// an op holds as an attribute (Reshape's shape, Slice's bounds, Full's shape and value) may be
// an expression of those symbols (Attrs::sym): it is computed in the model, never baked in at
// the traced size. Each symbol is read once from its input's shape (Shape, Gather), and each
// expression is parsed from its canonical text (SymInt::str(), the form duet::save writes) into
// Add, Sub, Mul, Div and Mod nodes, once per graph that needs it.
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "trace/onnx/onnx_writer.h"

namespace duet::detail::onnx_export {

// ---- protobuf helpers -------------------------------------------------------------------------

AttributeProto* attr(NodeProto& n, const char* name, AttributeProto::AttributeType type) {
  AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(type);
  return a;
}
void attr_int(NodeProto& n, const char* name, int64_t v) {
  attr(n, name, AttributeProto::INT)->set_i(v);
}
void attr_ints(NodeProto& n, const char* name, const std::vector<int64_t>& v) {
  AttributeProto* a = attr(n, name, AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void attr_str(NodeProto& n, const char* name, const std::string& v) {
  attr(n, name, AttributeProto::STRING)->set_s(v);
}
void attr_graph(NodeProto& n, const char* name, GraphProto&& g) {
  attr(n, name, AttributeProto::GRAPH)->mutable_g()->Swap(&g);
}

TensorProto int64_proto(const std::vector<int64_t>& v, std::vector<int64_t> dims) {
  TensorProto t;
  t.set_data_type(TensorProto::INT64);
  for (int64_t d : dims) t.add_dims(d);
  for (int64_t x : v) t.add_int64_data(x);
  return t;
}

// The symbol id when s is exactly one symbol (a dim that can be a dim_param).
std::optional<int32_t> plain_symbol(const SymInt& s) {
  if (s.is_concrete()) return std::nullopt;
  const std::vector<int32_t> ids = s.symbols();
  if (ids.size() == 1 && s == SymInt::symbol(ids[0])) return ids[0];
  return std::nullopt;
}

TensorMeta drop_dim0(const TensorMeta& m) {
  TensorMeta r = m;
  r.shape.erase(0);
  if (!r.sym.empty()) r.sym.erase(r.sym.begin());
  return r;
}

// Which values of g its outputs need, or that have an effect (these are written so as to raise).
std::vector<char> live_values(const Graph& g) {
  std::vector<char> live(g.nodes.size(), 0);
  for (int32_t o : g.outputs) live[static_cast<size_t>(o)] = 1;
  for (size_t v = g.nodes.size(); v-- > 0;) {
    const GraphNode& n = g.nodes[v];
    if (detail::has_effect(n)) live[v] = 1;
    if (!live[v]) continue;
    for (int32_t i : n.inputs) live[static_cast<size_t>(i)] = 1;
  }
  return live;
}

NodeProto& add_node(Frame& f, const char* op, const Names& ins, const Names& outs) {
  NodeProto* n = f.out->add_node();
  n->set_op_type(op);
  for (const std::string& i : ins) n->add_input(i);
  for (const std::string& o : outs) n->add_output(o);
  return *n;
}

// ---- sizes ------------------------------------------------------------------------------------

// Writes the nodes of one size expression, parsing the text of SymInt::str(): sums of terms,
// terms products of factors, factors numbers, symbols (s3, s3**2), floordiv(a, b), mod(a, b),
// a negation or a parenthesized expression. Every value is an int64 tensor of shape (1).
class SizeParser {
 public:
  SizeParser(const std::string& text, std::function<std::string(const char*, Names)> op,
             std::function<std::string(int64_t)> number, std::function<std::string(int32_t)> sym)
      : s_(text), op_(std::move(op)), number_(std::move(number)), sym_(std::move(sym)) {}
  std::string parse() {
    std::string r = expr();
    space();
    if (i_ != s_.size()) fail();
    return r;
  }

 private:
  [[noreturn]] void fail() const {
    throw InternalError(fmt::format("[export_onnx] cannot read the size expression \"{}\"", s_));
  }
  void space() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }
  bool eat(const char* t) {
    space();
    const size_t n = std::strlen(t);
    if (s_.compare(i_, n, t) != 0) return false;
    i_ += n;
    return true;
  }
  int64_t number() {
    space();
    size_t j = i_;
    while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
    if (j == i_) fail();
    const int64_t v = std::stoll(s_.substr(i_, j - i_));
    i_ = j;
    return v;
  }
  std::string expr() {
    std::string r = term();
    for (;;) {
      if (eat("+"))
        r = op_("Add", {r, term()});
      else if (eat("-"))
        r = op_("Sub", {r, term()});
      else
        return r;
    }
  }
  std::string term() {
    std::string r = factor();
    while (eat("*")) r = op_("Mul", {r, factor()});
    return r;
  }
  std::string factor() {
    if (eat("-")) return op_("Neg", {factor()});
    if (eat("(")) {
      std::string r = expr();
      if (!eat(")")) fail();
      return r;
    }
    for (const char* f : {"floordiv(", "mod("}) {
      if (!eat(f)) continue;
      std::string a = expr();
      if (!eat(",")) fail();
      std::string b = expr();
      if (!eat(")")) fail();
      // Integer Mod (fmod = 0) takes the divisor's sign, as Python's %; a - mod(a, b) is then a
      // multiple of b, so Div (which truncates) divides it exactly: Python's //.
      std::string m = op_("Mod", {a, b});
      return f[0] == 'f' ? op_("Div", {op_("Sub", {a, m}), b}) : m;
    }
    if (eat("s")) {
      std::string r = sym_(static_cast<int32_t>(number()));
      if (eat("**")) {
        const int64_t e = number();
        const std::string base = r;
        for (int64_t k = 1; k < e; ++k) r = op_("Mul", {r, base});
      }
      return r;
    }
    return number_(number());
  }

  const std::string& s_;
  size_t i_ = 0;
  std::function<std::string(const char*, Names)> op_;
  std::function<std::string(int64_t)> number_;
  std::function<std::string(int32_t)> sym_;
};

// A symbol's size, read from its input's shape at its first use. The nodes go into the model's
// graph even when that use is in a subgraph: they come before the If, Scan or Loop being
// written, so they are in scope there and every later use shares them.
std::string Writer::symbol(int32_t id) {
  if (auto it = symbols_.find(id); it != symbols_.end()) return it->second;
  auto dim = symbol_dims_.find(id);
  if (dim == symbol_dims_.end())
    throw ValueError(fmt::format(
        "[export_onnx] {} computes a size from symbol s{}, which no input dim of the exported "
        "graph holds",
        label_, id));
  const auto [input, d] = dim->second;
  const std::string shape = emit(*top_, "Shape", {input}, [&](NodeProto& n) {
    attr_int(n, "start", d);
    attr_int(n, "end", d + 1);
  });
  return symbols_[id] = shape;
}

std::string Writer::size(Frame& f, const SymInt& s) {
  if (s.is_concrete()) return ints(f, {s.concrete()});
  const std::string text = s.str();
  if (const std::string* known = f.find_size(text)) return *known;
  SizeParser p(
      text, [&](const char* op, Names ins) { return emit(f, op, ins); },
      [&](int64_t v) { return ints(f, {v}); }, [&](int32_t id) { return symbol(id); });
  std::string r = p.parse();
  f.sizes[text] = r;
  return r;
}

std::string Writer::shape(Frame& f, const SymDims& dims) {
  std::vector<int64_t> concrete;
  for (const SymInt& d : dims)
    if (d.is_concrete()) concrete.push_back(d.concrete());
  if (concrete.size() == dims.size()) return ints(f, concrete);
  Names parts;
  for (const SymInt& d : dims) parts.push_back(size(f, d));
  return emit(f, "Concat", parts, [](NodeProto& n) { attr_int(n, "axis", 0); });
}

// Notes where each symbol can be read: the first input dim that is exactly that symbol.
void Writer::bind_symbols(const std::string& input, const TensorMeta& m) {
  for (size_t d = 0; d < m.sym.size(); ++d)
    if (const std::optional<int32_t> id = plain_symbol(m.sym[d]))
      symbol_dims_.try_emplace(*id, input, static_cast<int64_t>(d));
}

void Writer::value_info(onnx::ValueInfoProto* vi, const std::string& name,
                        const TensorMeta& m) const {
  vi->set_name(name);
  onnx::TypeProto_Tensor* t = vi->mutable_type()->mutable_tensor_type();
  t->set_elem_type(io::elem_type_of(m.dtype));
  onnx::TensorShapeProto* s = t->mutable_shape();
  for (int64_t d = 0; d < m.shape.size(); ++d) {
    onnx::TensorShapeProto_Dimension* dim = s->add_dim();
    const size_t k = static_cast<size_t>(d);
    if (m.sym.empty() || m.sym[k].is_concrete())
      dim->set_dim_value(m.shape[d]);
    else if (std::optional<int32_t> id = plain_symbol(m.sym[k]))
      dim->set_dim_param(dim_name(*id));
    // An expression of symbols stays an unknown dim: ONNX names dims, it has no arithmetic.
  }
}

// ---- ops --------------------------------------------------------------------------------------

Names Writer::emit_graph(Frame& f, const Graph& g, const Names& slots) {
  Values vals{g, Names(g.nodes.size()), {}, {}};
  const std::vector<char> live = live_values(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!live[i]) continue;
    const GraphNode& n = g.nodes[i];
    const auto v = static_cast<int32_t>(i);
    switch (n.kind) {
      case NodeKind::Input:
        if (n.role == InputRole::Captured)
          vals.names[i] = captured_.at(static_cast<size_t>(n.index));
        else if (n.role == InputRole::Argument || n.role == InputRole::Placeholder)
          vals.names[i] = slots.at(static_cast<size_t>(n.index));
        else
          throw ValueError(fmt::format(
              "[export_onnx] {} reads a gradient or a saved value: only forward graphs export",
              label_));
        break;
      case NodeKind::Constant:
        vals.names[i] = constant(f, n.constant);
        break;
      case NodeKind::Op:
        vals.names[i] = emit_op(f, vals, v);
        break;
      case NodeKind::Control:
        vals.results[v] = emit_control(f, vals, v);
        break;
      case NodeKind::Project:
        vals.names[i] = vals.results.at(n.inputs[0]).at(static_cast<size_t>(n.index));
        break;
    }
  }
  Names outs;
  for (int32_t o : g.outputs) outs.push_back(vals.names[static_cast<size_t>(o)]);
  return outs;
}

// ---- the model --------------------------------------------------------------------------------

onnx::ModelProto Writer::model(const Graph& g, size_t num_outputs, const Names& inputs,
                               const Names& outputs, const Names& captured,
                               const std::vector<std::optional<TensorMeta>>& input_metas) {
  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);
  m.set_producer_name("duet");
  m.set_doc_string(options_.doc);
  onnx::OperatorSetIdProto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  GraphProto* graph = m.mutable_graph();
  graph->set_name(label_.empty() ? "duet" : label_);
  Frame top{graph, nullptr, {}};
  top_ = &top;
  // Inputs by runtime slot, typed by their Input nodes (or the signature, for one unused).
  std::vector<std::optional<TensorMeta>> metas = input_metas;
  metas.resize(inputs.size());
  for (const GraphNode& n : g.nodes)
    if (n.kind == NodeKind::Input &&
        (n.role == InputRole::Argument || n.role == InputRole::Placeholder))
      metas.at(static_cast<size_t>(n.index)) = n.meta;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DUET_CHECK_VALUE(metas[i].has_value(), "[export_onnx] {} has no type for its input {}", label_,
                     inputs[i]);
    value_info(graph->add_input(), inputs[i], *metas[i]);
    bind_symbols(inputs[i], *metas[i]);
  }
  captured_ = captured;
  for (size_t i = 0; i < g.captured.size(); ++i) {
    TensorProto* t = graph->add_initializer();
    io::tensor_to_proto(g.captured[i], *t);
    t->set_name(captured_[i]);
  }
  Graph outs_only = g;  // the outputs beyond num_outputs (a backward's saved values) are dropped
  outs_only.outputs.resize(num_outputs);
  const Names results = emit_graph(top, outs_only, inputs);
  for (size_t i = 0; i < results.size(); ++i) {
    add_node(top, "Identity", {results[i]}, {outputs[i]}).set_name(fresh("output"));
    value_info(graph->add_output(), outputs[i], g.nodes[static_cast<size_t>(g.outputs[i])].meta);
  }
  return m;
}

namespace {

// The checker with full checking: the model's structure (check_model), then strict shape
// inference with type checks, as onnx.checker.check_model(model, full_check=True) runs them.
void check(const onnx::ModelProto& m, const std::string& label) {
  try {
    onnx::checker::check_model(m);
    onnx::ModelProto inferred = m;
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(true, 1, false));
  } catch (const std::exception& e) {
    throw ValueError(
        fmt::format("[export_onnx] the ONNX checker rejects the model of {}: {}", label, e.what()));
  }
}

void write(const onnx::ModelProto& m, const std::string& path) {
  std::string bytes;
  DUET_CHECK_VALUE(m.SerializeToString(&bytes), "[export_onnx] the model for {} does not serialize",
                   path);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DUET_CHECK_VALUE(f.good(), "[export_onnx] cannot write {}: {}", path, std::strerror(errno));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  DUET_CHECK_VALUE(!f.fail(), "[export_onnx] writing {} failed: {}", path, std::strerror(errno));
}

// The user's names, when given, in place of the defaults.
Names names_or(const std::vector<std::string>& given, Names defaults, const char* what) {
  if (given.empty()) return defaults;
  DUET_CHECK_VALUE(given.size() == defaults.size(),
                   "[export_onnx] {} {} names given for {} {} ({})", given.size(), what,
                   defaults.size(), what, fmt::join(defaults, ", "));
  return given;
}

void export_graph(const Graph& g, size_t num_outputs, const Names& inputs, const Names& outputs,
                  const Names& captured, const std::vector<std::optional<TensorMeta>>& metas,
                  const std::string& label, const std::string& path,
                  const OnnxExportOptions& options) {
  DUET_CHECK_VALUE(options.opset == kOpset,
                   "[export_onnx] opset {} asked; duet exports opset 17, the newest Debian's "
                   "ONNX 1.12 checker knows",
                   options.opset);
  // Captured tensors the options name (by identity: the very tensor, not an equal one).
  Names initializers = captured;
  for (size_t i = 0; i < g.captured.size(); ++i)
    for (const auto& [name, t] : options.parameter_names)
      if (t.defined() && t.unsafe_impl() == g.captured[i].unsafe_impl()) initializers[i] = name;
  Writer w(options, label);
  const onnx::ModelProto m =
      w.model(g, num_outputs, names_or(options.input_names, inputs, "input"),
              names_or(options.output_names, outputs, "output"), initializers, metas);
  check(m, label);
  write(m, path);
}

}  // namespace

}  // namespace duet::detail::onnx_export

namespace duet {

using detail::onnx_export::export_graph;
using detail::onnx_export::Names;

void export_onnx(const Program& p, const std::string& path, const OnnxExportOptions& options) {
  DUET_CHECK_VALUE(!detail::is_function_program(p),
                   "[export_onnx] this program was imported from ONNX (import_onnx): export the "
                   "model it was read from, or compile a function that calls it");
  const Graph& g = p.graph();
  // A traced or loaded graph has its dims already: only those it holds symbolic can be dynamic.
  for (const auto& [arg, dim] : options.dynamic) {
    bool symbolic = false;
    for (const GraphNode& n : g.nodes)
      if (n.kind == NodeKind::Input && n.role == InputRole::Placeholder && n.index == arg)
        symbolic = dim >= 0 && static_cast<size_t>(dim) < n.meta.sym.size() &&
                   !n.meta.sym[static_cast<size_t>(dim)].is_concrete();
    DUET_CHECK_VALUE(symbolic,
                     "[export_onnx] input {} dim {} of {} is fixed in its graph: a Program's "
                     "dims are those it was traced or saved with (export a compiled function "
                     "with OnnxExportOptions::dynamic, or save it with CompileOptions::dynamic)",
                     arg, dim, g.label);
  }
  Names captured;
  for (const auto& [name, t] : p.named_parameters()) captured.push_back(name);
  export_graph(g, g.outputs.size(), p.input_names(), p.output_names(), captured, {},
               g.label.empty() ? "Program" : g.label, path, options);
}

void detail::export_onnx_compiled(const CompileOptions& options, const std::string& label,
                                  const FlatArgs& args, const TraceFn& fn, const std::string& path,
                                  const OnnxExportOptions& onnx_options) {
  CompileOptions traced = options;
  traced.dynamic.insert(traced.dynamic.end(), onnx_options.dynamic.begin(),
                        onnx_options.dynamic.end());
  CompiledCore core(traced, label);
  CompiledCore::Prepared p = core.prepare(args, fn);
  DUET_CHECK_VALUE(
      !p.value_guards,
      "[export_onnx] {} reads tensor data into C++ (CompileOptions::guard_data_reads), "
      "so its graph holds for the values it read only. Use cond or scan for "
      "data-dependent control flow",
      label);
  for (const auto& [arg, dim] : onnx_options.dynamic) {
    const auto a = static_cast<size_t>(arg), d = static_cast<size_t>(dim);
    DUET_CHECK_VALUE(a < p.dim_sym.size() && d < p.dim_sym[a].size() && p.dim_sym[a][d] >= 0,
                     "[export_onnx] {} could not keep arg {} dim {} symbolic: {}", label, arg, dim,
                     fmt::join(core.explain().specializations, "; "));
  }
  Names inputs, outputs, captured;
  std::vector<std::optional<TensorMeta>> metas;
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const Tensor& t = args.tensors[i];
    inputs.push_back(fmt::format("arg{}", i));
    TensorMeta m{t.sizes(), t.dtype(), t.device(), {}};
    if (i < p.dim_sym.size())
      for (size_t d = 0; d < p.dim_sym[i].size(); ++d)
        m.sym.push_back(p.dim_sym[i][d] >= 0 ? SymInt::symbol(p.dim_sym[i][d])
                                             : SymInt(t.sizes()[static_cast<int64_t>(d)]));
    metas.push_back(std::move(m));
  }
  const size_t results = p.num_outputs - p.probe_names.size();
  for (size_t i = 0; i < results; ++i) outputs.push_back(fmt::format("out{}", i));
  for (const std::string& n : p.probe_names) outputs.push_back(n);
  for (size_t i = 0; i < p.symbolic.captured.size(); ++i)
    captured.push_back(fmt::format("captured{}", i));
  export_graph(p.symbolic, p.num_outputs, inputs, outputs, captured, metas, label, path,
               onnx_options);
}

}  // namespace duet
