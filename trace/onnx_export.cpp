// ONNX export (trace/onnx.h; docs/onnx_export.md): a traced duet graph written as an ONNX model
// of opset 17 with the protobuf classes of Debian's libonnx-dev.
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
#include <functional>
#include <map>
#include <optional>

#include "core/ops.h"
#include "trace/control_flow.h"
#include "trace/onnx.h"
#include "trace/onnx_proto.h"

namespace duet {
namespace {

using onnx::AttributeProto;
using onnx::GraphProto;
using onnx::NodeProto;
using onnx::TensorProto;
using Names = std::vector<std::string>;
namespace io = detail::onnx_io;

constexpr int kOpset = 17;

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

// An ONNX graph being written: the model's graph, or a subgraph of If, Scan or Loop. Sizes it
// computed are kept by their text; a subgraph reads those of the graphs around it (computed
// before it, so in scope).
struct Frame {
  GraphProto* out;
  const Frame* parent = nullptr;
  std::map<std::string, std::string> sizes;
  const std::string* find_size(const std::string& text) const {
    for (const Frame* f = this; f; f = f->parent) {
      auto it = f->sizes.find(text);
      if (it != f->sizes.end()) return &it->second;
    }
    return nullptr;
  }
};

// The values of one duet graph while it is written into a frame.
struct Values {
  const Graph& g;
  Names names;                                           // by value
  std::map<int32_t, Names> results;                      // Control nodes: their tuple
  std::map<std::pair<int32_t, int>, std::string> casts;  // (value, dtype) -> the cast
};

// The sliding windows of Unfold and Fold (attrs.ints = {kh, kw, sh, sw, ph, pw, H, W}).
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, h, w, hp, wp, ho, wo;
  explicit Window(const Attrs& a)
      : kh(a.ints[0]),
        kw(a.ints[1]),
        sh(a.ints[2]),
        sw(a.ints[3]),
        ph(a.ints[4]),
        pw(a.ints[5]),
        h(a.ints[6]),
        w(a.ints[7]),
        hp(h + 2 * ph),
        wp(w + 2 * pw),
        ho((hp - kh) / sh + 1),
        wo((wp - kw) / sw + 1) {}
  // The position in the padded plane (flattened, Hp * Wp) of every window element, in
  // unfold's order: row ki * kw + kj, column oh * Wo + ow.
  std::vector<int64_t> positions() const {
    std::vector<int64_t> r;
    r.reserve(static_cast<size_t>(kh * kw * ho * wo));
    for (int64_t ki = 0; ki < kh; ++ki)
      for (int64_t kj = 0; kj < kw; ++kj)
        for (int64_t oh = 0; oh < ho; ++oh)
          for (int64_t ow = 0; ow < wo; ++ow) r.push_back((oh * sh + ki) * wp + ow * sw + kj);
    return r;
  }
};

class Writer {
 public:
  Writer(const OnnxExportOptions& options, std::string label)
      : options_(options), label_(std::move(label)) {}

  onnx::ModelProto model(const Graph& g, size_t num_outputs, const Names& inputs,
                         const Names& outputs, const Names& captured,
                         const std::vector<std::optional<TensorMeta>>& input_metas);

 private:
  // ---- nodes ----
  std::string fresh(std::string_view base) { return fmt::format("{}_{}", base, next_++); }
  std::string emit(Frame& f, const char* op, const Names& ins,
                   const std::function<void(NodeProto&)>& attrs = {}) {
    NodeProto* n = f.out->add_node();
    n->set_op_type(op);
    n->set_name(fresh(op));
    for (const std::string& i : ins) n->add_input(i);
    std::string out = fresh("t");
    n->add_output(out);
    if (attrs) attrs(*n);
    return out;
  }
  std::string constant(Frame& f, TensorProto&& t) {
    return emit(f, "Constant", {}, [&](NodeProto& n) {
      attr(n, "value", AttributeProto::TENSOR)->mutable_t()->Swap(&t);
    });
  }
  std::string constant(Frame& f, const Tensor& t) {
    TensorProto p;
    io::tensor_to_proto(t, p);
    return constant(f, std::move(p));
  }
  std::string ints(Frame& f, const std::vector<int64_t>& v) {
    return constant(f, int64_proto(v, {static_cast<int64_t>(v.size())}));
  }
  // A 0-d constant of dtype d.
  std::string scalar(Frame& f, Scalar value, DType d) {
    return constant(f, full({}, value, Options().dtype(d)));
  }
  std::string cast(Frame& f, const std::string& x, DType d) {
    return emit(f, "Cast", {x}, [&](NodeProto& n) { attr_int(n, "to", io::elem_type_of(d)); });
  }
  std::string to_scalar(Frame& f, const std::string& x) {
    return emit(f, "Reshape", {x, ints(f, {})});
  }
  // Value v as dtype d (cast once per graph).
  std::string as(Frame& f, Values& vals, int32_t v, DType d) {
    if (vals.g.nodes[static_cast<size_t>(v)].meta.dtype == d)
      return vals.names[static_cast<size_t>(v)];
    auto [it, added] = vals.casts.try_emplace({v, static_cast<int>(d)});
    if (added) it->second = cast(f, vals.names[static_cast<size_t>(v)], d);
    return it->second;
  }

  // ---- sizes (Note [Symbolic sizes in ONNX]) ----
  std::string size(Frame& f, const SymInt& s);
  std::string shape(Frame& f, const SymDims& dims);
  std::string symbol(int32_t id);
  std::string dim_name(int32_t id) const {
    const std::string s = fmt::format("s{}", id);
    auto it = options_.dim_names.find(s);
    return it == options_.dim_names.end() ? s : it->second;
  }
  void bind_symbols(const std::string& input, const TensorMeta& m);
  void value_info(onnx::ValueInfoProto* vi, const std::string& name, const TensorMeta& m) const;

  // ---- graphs ----
  Names emit_graph(Frame& f, const Graph& g, const Names& slots);
  std::string emit_op(Frame& f, Values& vals, int32_t v);
  std::string emit_reduce(Frame& f, Values& vals, const GraphNode& n);
  std::string emit_unfold(Frame& f, const std::string& x, const GraphNode& n);
  std::string emit_fold(Frame& f, const std::string& x, const GraphNode& n);
  std::string emit_slice_scatter(Frame& f, Values& vals, const GraphNode& n);
  std::string emit_full(Frame& f, const GraphNode& n);
  std::string emit_arange(Frame& f, const GraphNode& n);
  Names emit_control(Frame& f, Values& vals, int32_t v);
  Names emit_cond(Frame& f, const ControlFlow& c, const Names& ins);
  Names emit_scan(Frame& f, const ControlFlow& c, const Names& ins,
                  const std::vector<TensorMeta>& in_metas);
  Names emit_loop(Frame& f, const ControlFlow& c, const Names& ins);
  Names subgraph_outputs(Frame& f, const Names& outs, const std::vector<TensorMeta>& metas);
  [[noreturn]] void no_form(const GraphNode& n) const {
    const std::string site = n.site ? fmt::format(" (at {})", n.site.str()) : "";
    throw ValueError(
        fmt::format("[export_onnx] op {}{} of {} has no ONNX form", op_name(n.op), site, label_));
  }

  const OnnxExportOptions& options_;
  std::string label_;
  int64_t next_ = 0;
  Frame* top_ = nullptr;                                            // the model's graph
  std::map<int32_t, std::pair<std::string, int64_t>> symbol_dims_;  // symbol id -> (input, dim)
  std::map<int32_t, std::string> symbols_;  // symbol id -> its size, an int64 (1) tensor
  Names captured_;
};

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

const char* compare_op(OpId op) {
  switch (op) {
    case OpId::Lt:
      return "Less";
    case OpId::Le:
      return "LessOrEqual";
    case OpId::Gt:
      return "Greater";
    case OpId::Ge:
      return "GreaterOrEqual";
    default:
      return "Equal";  // Eq, and Ne as Not(Equal)
  }
}

// The one definition of every op's ONNX form (Note [ONNX export]).
std::string Writer::emit_op(Frame& f, Values& vals, int32_t v) {
  const GraphNode& n = vals.g.nodes[static_cast<size_t>(v)];
  const TensorMeta& out = n.meta;
  const auto in = [&](size_t i) { return vals.names[static_cast<size_t>(n.inputs[i])]; };
  // Operand i in the dtype the op computes in (its result's, for the arithmetic families).
  const auto arg = [&](size_t i, DType d) { return as(f, vals, n.inputs[i], d); };
  const auto unary = [&](const char* op) { return emit(f, op, {arg(0, out.dtype)}); };
  const auto binary = [&](const char* op) {
    return emit(f, op, {arg(0, out.dtype), arg(1, out.dtype)});
  };
  const auto one = [&] { return scalar(f, 1, out.dtype); };
  switch (n.op) {
    case OpId::Neg:
      return unary("Neg");
    case OpId::Exp:
      return unary("Exp");
    case OpId::Expm1:
      return emit(f, "Sub", {unary("Exp"), one()});
    case OpId::Log:
      return unary("Log");
    case OpId::Log1p:
      return emit(f, "Log", {emit(f, "Add", {arg(0, out.dtype), one()})});
    case OpId::Sqrt:
      return unary("Sqrt");
    case OpId::Rsqrt:
      return emit(f, "Reciprocal", {unary("Sqrt")});
    case OpId::Abs:
      return unary("Abs");
    case OpId::Sin:
      return unary("Sin");
    case OpId::Cos:
      return unary("Cos");
    case OpId::Atan:
      return unary("Atan");
    case OpId::Tanh:
      return unary("Tanh");
    case OpId::Sigmoid:
      return unary("Sigmoid");
    case OpId::Relu:
      return unary("Relu");
    // ONNX's Floor takes floating types only; an integer is its own floor.
    case OpId::Floor:
      return unary(is_floating(out.dtype) ? "Floor" : "Identity");
    case OpId::Erf:
      return unary("Erf");
    // log(sigmoid(x)) = -softplus(-x), finite for any finite x as duet's kernel.
    case OpId::LogSigmoid:
      return emit(f, "Neg", {emit(f, "Softplus", {emit(f, "Neg", {arg(0, out.dtype)})})});
    case OpId::Add:
      return binary("Add");
    case OpId::Sub:
      return binary("Sub");
    case OpId::Mul:
      return binary("Mul");
    case OpId::Div:
      return binary("Div");  // integers were promoted to a float result
    case OpId::Pow:
      return binary("Pow");
    case OpId::Maximum:
      return binary("Max");
    case OpId::Minimum:
      return binary("Min");
    case OpId::Lt:
    case OpId::Le:
    case OpId::Gt:
    case OpId::Ge:
    case OpId::Eq:
    case OpId::Ne: {
      // Compared in the promoted dtype; ONNX orders no bools, so those compare as int32.
      const Tensor a = detail::make_meta_tensor(vals.g.nodes[n.inputs[0]].meta);
      const Tensor b = detail::make_meta_tensor(vals.g.nodes[n.inputs[1]].meta);
      const GraphNode &na = vals.g.nodes[n.inputs[0]], &nb = vals.g.nodes[n.inputs[1]];
      const Tensor* ops[] = {na.kind == NodeKind::Constant ? &na.constant : &a,
                             nb.kind == NodeKind::Constant ? &nb.constant : &b};
      DType t = detail::result_type(TensorRefs(ops, 2));
      if (t == DType::b8 && n.op != OpId::Eq && n.op != OpId::Ne) t = DType::i32;
      const std::string r = emit(f, compare_op(n.op), {arg(0, t), arg(1, t)});
      return n.op == OpId::Ne ? emit(f, "Not", {r}) : r;
    }
    case OpId::Where:
      return emit(f, "Where", {arg(0, DType::b8), arg(1, out.dtype), arg(2, out.dtype)});
    case OpId::Cast:
      return cast(f, in(0), out.dtype);
    case OpId::Copy:
      return emit(f, "Identity", {in(0)});
    case OpId::Sum:
    case OpId::Max:
    case OpId::Min:
      return emit_reduce(f, vals, n);
    case OpId::SliceScatter:
      return emit_slice_scatter(f, vals, n);
    case OpId::Gather:
      return emit(f, "GatherElements", {in(0), arg(1, DType::i64)},
                  [&](NodeProto& p) { attr_int(p, "axis", n.attrs.dim); });
    case OpId::ScatterAdd:
      return emit(f, "ScatterElements", {in(0), arg(1, DType::i64), in(2)}, [&](NodeProto& p) {
        attr_int(p, "axis", n.attrs.dim);
        attr_str(p, "reduction", "add");
      });
    case OpId::Cat: {
      Names parts;
      for (size_t i = 0; i < n.inputs.size(); ++i) parts.push_back(arg(i, out.dtype));
      return emit(f, "Concat", parts, [&](NodeProto& p) { attr_int(p, "axis", n.attrs.dim); });
    }
    case OpId::Argmax:
      if (out.shape.size() == 0 && vals.g.nodes[n.inputs[0]].meta.shape.size() == 0)
        return scalar(f, 0, DType::i64);  // the index of a 0-d tensor's one value
      return emit(f, "ArgMax", {in(0)}, [&](NodeProto& p) {
        attr_int(p, "axis", n.attrs.dim);
        attr_int(p, "keepdims", n.attrs.keepdim ? 1 : 0);
      });
    case OpId::Unfold:
      return emit_unfold(f, in(0), n);
    case OpId::Fold:
      return emit_fold(f, in(0), n);
    case OpId::Conv2d: {
      // ONNX's Conv is the same cross-correlation (floating dtypes only); its output size is
      // floor((H + 2p - k) / s) + 1, as duet's.
      if (!is_floating(n.meta.dtype)) no_form(n);
      const Window w(n.attrs);
      return emit(f, "Conv", {in(0), in(1)}, [&](NodeProto& p) {
        attr_ints(p, "kernel_shape", {w.kh, w.kw});
        attr_ints(p, "strides", {w.sh, w.sw});
        attr_ints(p, "pads", {w.ph, w.pw, w.ph, w.pw});
      });
    }
    // conv2d's gradients: training graphs, which an inference model does not hold.
    case OpId::Conv2dInputGrad:
    case OpId::Conv2dWeightGrad:
      no_form(n);
    case OpId::MatMul:
      return emit(f, "MatMul", {in(0), in(1)});
    case OpId::Reshape:
      return emit(f, "Reshape", {in(0), shape(f, detail::attr_dims(n.attrs))});
    case OpId::Permute: {
      const std::vector<int64_t> perm(n.attrs.ints.begin(), n.attrs.ints.end());
      return emit(f, "Transpose", {in(0)}, [&](NodeProto& p) { attr_ints(p, "perm", perm); });
    }
    case OpId::Slice: {
      const SymAttrs* s = n.attrs.sym.get();
      const std::string start = size(f, s && s->start ? *s->start : SymInt(n.attrs.start));
      const std::string end = size(f, s && s->end ? *s->end : SymInt(n.attrs.end));
      return emit(f, "Slice", {in(0), start, end, ints(f, {n.attrs.dim}), ints(f, {n.attrs.step})});
    }
    case OpId::Expand:
      return emit(f, "Expand", {in(0), shape(f, detail::attr_dims(n.attrs))});
    case OpId::Full:
      return emit_full(f, n);
    case OpId::Arange:
      return emit_arange(f, n);
    // Effects and state that a model file cannot hold: random draws (Philox state), device
    // moves, prints and the collectives of a multi-process job.
    // Stable, NaN-last order: ONNX's TopK leaves the order of ties open.
    case OpId::Argsort:
    case OpId::Random:
    case OpId::Transfer:
    case OpId::Print:
    case OpId::AllReduce:
    case OpId::Broadcast:
    case OpId::AllGather:
    case OpId::ReduceScatter:
    case OpId::CollectiveWait:
      no_form(n);
  }
  no_form(n);
}

std::string Writer::emit_reduce(Frame& f, Values& vals, const GraphNode& n) {
  const TensorMeta& x = vals.g.nodes[static_cast<size_t>(n.inputs[0])].meta;
  // Sum accumulates integers in i64 (its result's dtype); ONNX has no ReduceMax of bools.
  const DType compute = n.op == OpId::Sum           ? n.meta.dtype
                        : n.meta.dtype == DType::b8 ? DType::i32
                                                    : n.meta.dtype;
  const std::string xs = as(f, vals, n.inputs[0], compute);
  // A 0-d tensor reduces to itself (the rule accepts dim 0 for it; ONNX has no axis there).
  if (x.shape.size() == 0)
    return compute == n.meta.dtype ? emit(f, "Identity", {xs}) : cast(f, xs, n.meta.dtype);
  const std::vector<int64_t> axes(n.attrs.ints.begin(), n.attrs.ints.end());
  const int64_t keep = n.attrs.keepdim ? 1 : 0;
  std::string r;
  if (n.op == OpId::Sum) {
    // Opset 13 took ReduceSum's axes as an input; none given reduces every dim.
    Names ins{xs};
    if (!axes.empty()) ins.push_back(ints(f, axes));
    r = emit(f, "ReduceSum", ins, [&](NodeProto& p) { attr_int(p, "keepdims", keep); });
  } else {
    r = emit(f, n.op == OpId::Max ? "ReduceMax" : "ReduceMin", {xs}, [&](NodeProto& p) {
      if (!axes.empty()) attr_ints(p, "axes", axes);  // an attribute until opset 18
      attr_int(p, "keepdims", keep);
    });
  }
  return compute == n.meta.dtype ? r : cast(f, r, n.meta.dtype);
}

// im2col as a Gather of the padded plane: exact for any values (a convolution with one-hot
// weights would turn an infinity into NaNs of its neighbours) and for any channel count.
std::string Writer::emit_unfold(Frame& f, const std::string& x, const GraphNode& n) {
  const Window w(n.attrs);
  std::string padded = x;
  if (w.ph || w.pw) padded = emit(f, "Pad", {x, ints(f, {0, 0, w.ph, w.pw, 0, 0, w.ph, w.pw})});
  // (N, C, Hp * Wp): a 0 in Reshape's shape keeps that dim of the input.
  const std::string plane = emit(f, "Reshape", {padded, ints(f, {0, 0, w.hp * w.wp})});
  const std::string index = constant(f, int64_proto(w.positions(), {w.kh * w.kw, w.ho * w.wo}));
  const std::string cols = emit(f, "Gather", {plane, index}, [](NodeProto& p) {
    attr_int(p, "axis", 2);  // (N, C, kh * kw, L)
  });
  return emit(f, "Reshape", {cols, shape(f, detail::meta_dims(n.meta))});
}

// col2im, unfold's adjoint: every column element added into its place in a zero padded plane
// (ScatterElements with reduction add sums the overlaps), then the padding cut off.
std::string Writer::emit_fold(Frame& f, const std::string& x, const GraphNode& n) {
  const Window w(n.attrs);
  const SymDims od = detail::meta_dims(n.meta);  // (N, C, H, W)
  const int64_t per_channel = w.kh * w.kw * w.ho * w.wo;
  const std::string cols = emit(f, "Reshape", {x, shape(f, {od[0], od[1], per_channel})});
  const std::string index = emit(
      f, "Expand",
      {constant(f, int64_proto(w.positions(), {1, 1, per_channel})), emit(f, "Shape", {cols})});
  const std::string zeros =
      emit(f, "ConstantOfShape", {shape(f, {od[0], od[1], w.hp * w.wp})}, [&](NodeProto& p) {
        TensorProto z;
        io::tensor_to_proto(full({1}, 0, Options().dtype(n.meta.dtype)), z);
        attr(p, "value", AttributeProto::TENSOR)->mutable_t()->Swap(&z);
      });
  const std::string sums = emit(f, "ScatterElements", {zeros, index, cols}, [](NodeProto& p) {
    attr_int(p, "axis", 2);
    attr_str(p, "reduction", "add");
  });
  const std::string planes = emit(f, "Reshape", {sums, shape(f, {od[0], od[1], w.hp, w.wp})});
  if (!w.ph && !w.pw) return planes;
  return emit(f, "Slice",
              {planes, ints(f, {w.ph, w.pw}), ints(f, {w.ph + w.h, w.pw + w.w}), ints(f, {2, 3})});
}

// A copy of the base with the source written into start:end:step along dim: the slice's
// indices (Range), shaped to broadcast along that dim, expanded to the source's shape, then
// ScatterElements.
std::string Writer::emit_slice_scatter(Frame& f, Values& vals, const GraphNode& n) {
  const Attrs& a = n.attrs;
  const SymAttrs* s = a.sym.get();
  const std::string start = to_scalar(f, size(f, s && s->start ? *s->start : SymInt(a.start)));
  const std::string end = to_scalar(f, size(f, s && s->end ? *s->end : SymInt(a.end)));
  const std::string idx = emit(f, "Range", {start, end, scalar(f, a.step, DType::i64)});
  std::vector<int64_t> along(n.meta.shape.size(), 1);
  along[static_cast<size_t>(a.dim)] = -1;
  const std::string src = vals.names[static_cast<size_t>(n.inputs[1])];
  const std::string index =
      emit(f, "Expand", {emit(f, "Reshape", {idx, ints(f, along)}), emit(f, "Shape", {src})});
  return emit(f, "ScatterElements", {vals.names[static_cast<size_t>(n.inputs[0])], index, src},
              [&](NodeProto& p) { attr_int(p, "axis", a.dim); });
}

std::string Writer::emit_full(Frame& f, const GraphNode& n) {
  const std::string dims = shape(f, detail::attr_dims(n.attrs));
  const DType d = n.meta.dtype;
  if (n.attrs.sym && n.attrs.sym->value) {
    // A value that is a size (mean's count): computed, then broadcast.
    const std::string v = cast(f, to_scalar(f, size(f, *n.attrs.sym->value)), d);
    return emit(f, "Expand", {v, dims});
  }
  return emit(f, "ConstantOfShape", {dims}, [&](NodeProto& p) {
    TensorProto value;
    io::tensor_to_proto(full({1}, n.attrs.value, Options().dtype(d)), value);
    attr(p, "value", AttributeProto::TENSOR)->mutable_t()->Swap(&value);
  });
}

std::string Writer::emit_arange(Frame& f, const GraphNode& n) {
  const DType d = n.meta.dtype;
  const SymAttrs* s = n.attrs.sym.get();
  const std::string end =
      s && s->end ? cast(f, to_scalar(f, size(f, *s->end)), d) : scalar(f, n.attrs.end, d);
  return emit(f, "Range", {scalar(f, 0, d), end, scalar(f, 1, d)});
}

// ---- control flow -----------------------------------------------------------------------------

// A subgraph's results as its outputs: each through an Identity, since an output must be made
// in its own graph (a branch may return an outer value unchanged).
Names Writer::subgraph_outputs(Frame& f, const Names& outs, const std::vector<TensorMeta>& metas) {
  Names r;
  for (size_t i = 0; i < outs.size(); ++i) {
    r.push_back(emit(f, "Identity", {outs[i]}));
    value_info(f.out->add_output(), r.back(), metas[i]);
  }
  return r;
}

Names Writer::emit_control(Frame& f, Values& vals, int32_t v) {
  const GraphNode& n = vals.g.nodes[static_cast<size_t>(v)];
  const ControlFlow& c = *n.control;
  Names ins;
  std::vector<TensorMeta> metas;
  for (int32_t i : n.inputs) {
    ins.push_back(vals.names[static_cast<size_t>(i)]);
    metas.push_back(vals.g.nodes[static_cast<size_t>(i)].meta);
  }
  switch (c.kind) {
    case ControlKind::Cond:
      ins[0] = as(f, vals, n.inputs[0], DType::b8);
      return emit_cond(f, c, ins);
    case ControlKind::Scan:
      return emit_scan(f, c, ins, metas);
    case ControlKind::WhileLoop:
      return emit_loop(f, c, ins);
  }
  throw InternalError("[export_onnx] unknown control-flow construct");
}

NodeProto& add_node(Frame& f, const char* op, const Names& ins, const Names& outs) {
  NodeProto* n = f.out->add_node();
  n->set_op_type(op);
  for (const std::string& i : ins) n->add_input(i);
  for (const std::string& o : outs) n->add_output(o);
  return *n;
}

// cond -> If: each branch a graph without inputs that reads the operands and free values from
// the enclosing graph by name.
Names Writer::emit_cond(Frame& f, const ControlFlow& c, const Names& ins) {
  const Names operands(ins.begin() + 1, ins.end());
  GraphProto branches[2];
  for (int b = 0; b < 2; ++b) {
    branches[b].set_name(fresh(b == 0 ? "then" : "else"));
    Frame sub{&branches[b], &f, {}};
    subgraph_outputs(sub, emit_graph(sub, c.graphs[static_cast<size_t>(b)], operands), c.results);
  }
  Names outs;
  for (size_t i = 0; i < c.results.size(); ++i) outs.push_back(fresh("if"));
  NodeProto& node = add_node(f, "If", {ins[0]}, outs);
  node.set_name(fresh("If"));
  attr_graph(node, "then_branch", std::move(branches[0]));
  attr_graph(node, "else_branch", std::move(branches[1]));
  return outs;
}

// scan -> Scan: the body takes the carries and one step of each scanned input as its inputs,
// and reads free values from the enclosing graph. A reverse scan reads its inputs and stacks
// its outputs from the end, so that ys stay stacked by index.
Names Writer::emit_scan(Frame& f, const ControlFlow& c, const Names& ins,
                        const std::vector<TensorMeta>& in_metas) {
  const auto carries = static_cast<size_t>(c.num_carry), xs = static_cast<size_t>(c.num_xs);
  GraphProto body;
  body.set_name(fresh("scan_body"));
  Frame sub{&body, &f, {}};
  Names slots;
  for (size_t i = 0; i < carries + xs; ++i) {
    slots.push_back(fresh(i < carries ? "carry" : "x"));
    value_info(body.add_input(), slots.back(), i < carries ? in_metas[i] : drop_dim0(in_metas[i]));
  }
  for (size_t i = carries + xs; i < ins.size(); ++i) slots.push_back(ins[i]);
  std::vector<TensorMeta> metas;
  for (size_t i = 0; i < c.results.size(); ++i)
    metas.push_back(i < carries ? c.results[i] : drop_dim0(c.results[i]));
  subgraph_outputs(sub, emit_graph(sub, c.graphs[0], slots), metas);
  Names outs;
  for (size_t i = 0; i < c.results.size(); ++i) outs.push_back(fresh("scan"));
  NodeProto& node = add_node(f, "Scan", Names(ins.begin(), ins.begin() + carries + xs), outs);
  node.set_name(fresh("Scan"));
  attr_graph(node, "body", std::move(body));
  attr_int(node, "num_scan_inputs", c.num_xs);
  if (c.reverse) {
    attr_ints(node, "scan_input_directions", std::vector<int64_t>(xs, 1));
    attr_ints(node, "scan_output_directions", std::vector<int64_t>(c.results.size() - carries, 1));
  }
  return outs;
}

// while_loop -> Loop without a trip count: the condition is computed once before the loop
// from the initial state, and again in the body from the state it computed.
Names Writer::emit_loop(Frame& f, const ControlFlow& c, const Names& ins) {
  const auto n = static_cast<size_t>(c.num_carry);
  const Names free(ins.begin() + static_cast<std::ptrdiff_t>(n), ins.end());
  const auto with_free = [&](Names state) {
    state.insert(state.end(), free.begin(), free.end());
    return state;
  };
  const std::string first = to_scalar(f, emit_graph(f, c.graphs[0], ins)[0]);
  GraphProto body;
  body.set_name(fresh("loop_body"));
  Frame sub{&body, &f, {}};
  TensorMeta iter{Shape{}, DType::i64, Device::cpu(), {}},
      flag{Shape{}, DType::b8, Device::cpu(), {}};
  value_info(body.add_input(), fresh("iter"), iter);
  value_info(body.add_input(), fresh("cond_in"), flag);
  Names state;
  for (size_t i = 0; i < n; ++i) {
    state.push_back(fresh("state"));
    value_info(body.add_input(), state.back(), c.results[i]);
  }
  const Names next = emit_graph(sub, c.graphs[1], with_free(state));
  Names outs{to_scalar(sub, emit_graph(sub, c.graphs[0], with_free(next))[0])};
  outs.insert(outs.end(), next.begin(), next.end());
  std::vector<TensorMeta> metas{flag};
  metas.insert(metas.end(), c.results.begin(), c.results.end());
  subgraph_outputs(sub, outs, metas);
  Names results;
  for (size_t i = 0; i < n; ++i) results.push_back(fresh("loop"));
  Names loop_ins{"", first};
  loop_ins.insert(loop_ins.end(), ins.begin(), ins.begin() + static_cast<std::ptrdiff_t>(n));
  NodeProto& node = add_node(f, "Loop", loop_ins, results);
  node.set_name(fresh("Loop"));
  attr_graph(node, "body", std::move(body));
  return results;
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
