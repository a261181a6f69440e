// ONNX import (trace/onnx/onnx.h): a model becomes a Program whose function runs the graph's nodes
// in order, each through its mapping (trace/onnx/onnx_import_ops.cpp) onto duet ops. Run eagerly,
// those ops go on the tape; run compiled, the same function is traced once per input signature. So
// an imported model has one definition for both faces, and gradients reach its initializers.
//
// Note [Known values]: ONNX passes shapes, axes and bounds as tensors (Reshape's shape, Slice's
// starts). A value computed from constants and shapes alone is "known": its node runs on real
// data even while tracing (the modes suspended), so a mapping can read it and a traced graph
// holds only the computation on the model's inputs. A shape input computed from data (or fed as
// a graph input) is read too: import sets CompileOptions::guard_data_reads, so a compiled call
// guards the value it read and traces again when it changes.
#include "trace/onnx/onnx_import.h"

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "core/dispatch.h"
#include "eager/autograd.h"
#include "trace/onnx/onnx.h"
#include "trace/onnx/onnx_proto.h"

namespace duet {

namespace detail::onnx_import {

const Tensor& Node::in(size_t i) const {
  if (!has(i)) fail(fmt::format("input {} is missing", i));
  return in_[i].t;
}

std::vector<int64_t> Node::ints(size_t i) const {
  const Tensor& t = in(i);
  if (!is_floating(t.dtype()) && t.dtype() != DType::i64)
    return t.to(DType::i64).to(Device::cpu()).to_vector<int64_t>();
  if (is_floating(t.dtype()))
    fail(fmt::format("input {} must hold integers, got {}", i, t.dtype()));
  return t.to(Device::cpu()).to_vector<int64_t>();
}

double Node::number(size_t i) const {
  const Tensor& t = in(i);
  if (t.numel() != 1)
    fail(fmt::format("input {} must hold one number, got shape {}", i, t.sizes()));
  return t.to(Device::cpu()).to(DType::f64).to_vector<double>()[0];
}

int64_t Node::int1(size_t i) const {
  const Tensor& t = in(i);
  if (t.numel() != 1)
    fail(fmt::format("input {} must hold one integer, got shape {}", i, t.sizes()));
  return ints(i)[0];
}

const onnx::AttributeProto* Node::attr(const char* name) const {
  for (const onnx::AttributeProto& a : proto_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

const onnx::AttributeProto* Node::attr(const char* name,
                                       onnx::AttributeProto::AttributeType type) const {
  const onnx::AttributeProto* a = attr(name);
  // UNDEFINED: a model written before attributes carried their type; the field decides.
  if (a && a->type() != type && a->type() != onnx::AttributeProto::UNDEFINED)
    fail(fmt::format("attribute {} must be of type {}, got {}", name,
                     onnx::AttributeProto::AttributeType_Name(type),
                     onnx::AttributeProto::AttributeType_Name(a->type())));
  return a;
}

int64_t Node::attr_i(const char* name, int64_t fallback) const {
  const onnx::AttributeProto* a = attr(name, onnx::AttributeProto::INT);
  return a ? a->i() : fallback;
}

double Node::attr_f(const char* name, double fallback) const {
  const onnx::AttributeProto* a = attr(name, onnx::AttributeProto::FLOAT);
  return a ? a->f() : fallback;
}

std::string Node::attr_s(const char* name, const std::string& fallback) const {
  const onnx::AttributeProto* a = attr(name, onnx::AttributeProto::STRING);
  return a ? a->s() : fallback;
}

std::vector<int64_t> Node::attr_ints(const char* name) const {
  const onnx::AttributeProto* a = attr(name, onnx::AttributeProto::INTS);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}

std::vector<float> Node::attr_floats(const char* name) const {
  const onnx::AttributeProto* a = attr(name, onnx::AttributeProto::FLOATS);
  return a ? std::vector<float>(a->floats().begin(), a->floats().end()) : std::vector<float>{};
}

std::string Node::where() const {
  return fmt::format(
      "node \"{}\" ({}, opset {})",
      proto_.name().empty() ? proto_.output_size() ? proto_.output(0) : "" : proto_.name(),
      proto_.op_type(), opset_);
}

void Node::fail(const std::string& why) const {
  throw ValueError(fmt::format("[import_onnx] {}: {}", where(), why));
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->outer) {
    auto it = s->values.find(name);
    if (it != s->values.end()) return &it->second;
  }
  return nullptr;
}

int64_t Node::axis(int64_t a, int64_t rank) const {
  const int64_t r = rank == 0 ? 1 : rank;
  if (a < -r || a >= r) fail(fmt::format("axis {} is out of range for rank {}", a, rank));
  return a < 0 ? a + r : a;
}

}  // namespace detail::onnx_import

namespace {

using detail::onnx_import::Node;
using detail::onnx_import::Scope;
using detail::onnx_import::Value;
namespace io = detail::onnx_io;

// What the Program's function holds: the graph, and the initializers as tensors.
struct Imported {
  onnx::GraphProto graph;
  int opset = 0;
  std::string label;
  std::vector<std::string> inputs, outputs;
  struct Spec {
    DType dtype;
    std::vector<int64_t> dims;  // -1: a dim_param or an unknown size
    bool has_shape = false;
  };
  std::vector<Spec> specs;
  // The floating initializers (trainable), but for batch norm statistics (statistics_only).
  std::vector<std::pair<std::string, Tensor>> params;
  std::map<std::string, Tensor> consts;  // the other initializers, those statistics included
  std::vector<std::string> buffers;      // the statistics, in the model's order
};

// The element type of a graph input or output, or a DTypeError naming it.
int32_t elem_type_of(const onnx::ValueInfoProto& v, const char* what) {
  if (!v.type().has_tensor_type()) {
    const char* kind = v.type().has_sequence_type()   ? "sequence"
                       : v.type().has_optional_type() ? "optional"
                       : v.type().has_map_type()      ? "map"
                                                      : "non-tensor";
    throw DTypeError(fmt::format(
        "[import_onnx] {} \"{}\" has ONNX type {}, which duet has no dtype for: duet imports "
        "tensors of {}",
        what, v.name(), kind, detail::onnx_io::kImportedElemTypes));
  }
  return v.type().tensor_type().elem_type();
}

// The element types that node attributes name (Cast's `to`, Constant's value, ...): a
// DTypeError at import rather than at the first call.
void check_node_types(const onnx::NodeProto& n, int opset) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    const std::string what = fmt::format(
        "attribute {} of node \"{}\" ({}, opset {})", a.name(),
        n.name().empty() && n.output_size() ? n.output(0) : n.name(), n.op_type(), opset);
    if ((a.name() == "to" || a.name() == "dtype") && a.type() == onnx::AttributeProto::INT &&
        !io::dtype_of(static_cast<int32_t>(a.i())))
      io::unsupported_elem_type(static_cast<int32_t>(a.i()), what);
    if (a.type() == onnx::AttributeProto::TENSOR && !io::dtype_of(a.t().data_type()))
      io::unsupported_elem_type(a.t().data_type(), what);
  }
}

// Whether n has a subgraph (If, Loop, Scan).
bool has_subgraph(const onnx::NodeProto& n) {
  for (const onnx::AttributeProto& a : n.attribute())
    if (a.type() == onnx::AttributeProto::GRAPH || a.type() == onnx::AttributeProto::GRAPHS)
      return true;
  return false;
}

// Runs node n on the values in env (Note [Known values]). A node with a subgraph is never known
// as a whole: its subgraph may read outer values that are not; its own nodes are, one by one.
void run_node(const onnx::NodeProto& n, int opset, Scope& env) {
  namespace oi = detail::onnx_import;
  oi::ImportFn fn = oi::find_op(oi::op_key(n));
  std::vector<Value> in;
  bool known = true;
  for (const std::string& name : n.input()) {
    if (name.empty()) {
      in.emplace_back();
      continue;
    }
    const Value* v = env.find(name);
    if (!v)
      throw ValueError(
          fmt::format("[import_onnx] node \"{}\" ({}) reads \"{}\", which no earlier "
                      "node, input or initializer defines",
                      n.name(), n.op_type(), name));
    in.push_back(*v);
    known = known && v->known;
  }
  known = known && !oi::is_random(n.op_type()) && !has_subgraph(n);
  Node node(n, opset, std::move(in), &env);
  std::vector<Tensor> out;
  try {
    if (known) {
      detail::SuspendModes eager;
      NoGradGuard ng;
      oi::check_node(node);
      out = fn(node);
    } else {
      oi::check_node(node);
      out = fn(node);
    }
  } catch (const ShapeError& e) {
    throw ShapeError(fmt::format("[import_onnx] {}: {}", node.where(), e.what()));
  } catch (const DTypeError& e) {
    throw DTypeError(fmt::format("[import_onnx] {}: {}", node.where(), e.what()));
  } catch (const ValueError& e) {
    if (std::string_view(e.what()).starts_with("[import_onnx]")) throw;
    throw ValueError(fmt::format("[import_onnx] {}: {}", node.where(), e.what()));
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    // check_fits refuses the sizes it knows of before allocating; this names any other.
    throw Error(
        fmt::format("[import_onnx] {}: out of memory while running the node", node.where()));
  } catch (const std::exception& e) {
    // No mapping should get here: its checks come first (check_node). A malformed model must
    // still raise an error that names its node, never terminate the program.
    throw ValueError(fmt::format("[import_onnx] {}: the node does not fit duet's mapping ({})",
                                 node.where(), e.what()));
  }
  if (out.size() < static_cast<size_t>(n.output_size()))
    node.fail(fmt::format("duet's mapping gives {} outputs, the node lists {}", out.size(),
                          n.output_size()));
  for (int i = 0; i < n.output_size(); ++i) {
    if (n.output(i).empty()) continue;
    if (!out[static_cast<size_t>(i)].defined())
      node.fail(fmt::format("duet does not compute its output {} (\"{}\")", i, n.output(i)));
    env.values[n.output(i)] = Value{out[static_cast<size_t>(i)], known};
  }
}

// The kind of value an op of the default domain computes on when it is not a tensor: "sequence"
// for the sequence ops, "optional" for the optional ones; null for the others.
const char* non_tensor_kind(const std::string& op_key) {
  static const std::set<std::string> sequence_ops = {
      "ConcatFromSequence", "SequenceAt",    "SequenceConstruct",
      "SequenceEmpty",      "SequenceErase", "SequenceInsert",
      "SequenceLength",     "SequenceMap",   "SplitToSequence"};
  static const std::set<std::string> optional_ops = {"Optional", "OptionalGetElement",
                                                     "OptionalHasElement"};
  if (sequence_ops.count(op_key)) return "sequence";
  if (optional_ops.count(op_key)) return "optional";
  return nullptr;
}

// Every node's op, domain and element types, before anything runs; subgraphs' nodes included.
// An op on sequences or optionals is a type duet has no dtype for (a DTypeError, as for a graph
// input of such a type), rather than an op without a mapping.
void check_nodes(const onnx::GraphProto& g, int opset) {
  for (const onnx::NodeProto& n : g.node()) {
    const std::string where = fmt::format(
        "node \"{}\" ({}, opset {})", n.name().empty() && n.output_size() ? n.output(0) : n.name(),
        n.op_type(), opset);
    if (const char* kind = non_tensor_kind(detail::onnx_import::op_key(n)))
      throw DTypeError(fmt::format(
          "[import_onnx] {}: op {} computes on values of ONNX type {}, which duet has no dtype "
          "for: duet imports tensors of {}",
          where, n.op_type(), kind, detail::onnx_io::kImportedElemTypes));
    DUET_CHECK_VALUE(!detail::onnx_import::op_key(n).empty(),
                     "[import_onnx] {}: op {} of domain \"{}\" has no mapping in duet (only the "
                     "default domain's ops and ai.onnx.preview.training's optimizers do)",
                     where, n.op_type(), n.domain());
    DUET_CHECK_VALUE(detail::onnx_import::find_op(detail::onnx_import::op_key(n)),
                     "[import_onnx] {}: ONNX op {} (opset {}) has no mapping in duet", where,
                     n.op_type(), opset);
    check_node_types(n, opset);
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (a.type() == onnx::AttributeProto::GRAPH) check_nodes(a.g(), opset);
      for (const onnx::GraphProto& sub : a.graphs()) check_nodes(sub, opset);
    }
  }
}

// How often a name of an enclosing graph is read: as a BatchNormalization's statistics (its
// inputs 3 and 4, mean and var), and otherwise.
struct Uses {
  int stats = 0, other = 0;
};

// Adds up the reads of names g does not define in `local` (the names of the subgraphs around
// it, which hide those of the graphs outside), its subgraphs' included.
void count_uses(const onnx::GraphProto& g, const std::set<std::string>& local,
                std::map<std::string, Uses>& uses) {
  auto read = [&](const std::string& name, bool stats) {
    if (name.empty() || local.count(name)) return;
    (stats ? uses[name].stats : uses[name].other)++;
  };
  for (const onnx::NodeProto& n : g.node()) {
    const bool bn = detail::onnx_import::op_key(n) == "BatchNormalization";
    for (int i = 0; i < n.input_size(); ++i) read(n.input(i), bn && (i == 3 || i == 4));
    for (const onnx::AttributeProto& a : n.attribute()) {
      std::vector<const onnx::GraphProto*> subs;
      if (a.has_g()) subs.push_back(&a.g());
      for (const onnx::GraphProto& sub : a.graphs()) subs.push_back(&sub);
      for (const onnx::GraphProto* sub : subs) {
        std::set<std::string> inner = local;
        for (const onnx::ValueInfoProto& v : sub->input()) inner.insert(v.name());
        for (const onnx::TensorProto& t : sub->initializer()) inner.insert(t.name());
        for (const onnx::NodeProto& sn : sub->node())
          for (const std::string& o : sn.output()) inner.insert(o);
        count_uses(*sub, inner, uses);
      }
    }
  }
  for (const onnx::ValueInfoProto& v : g.output()) read(v.name(), false);
}

// The initializers of g that only BatchNormalization's statistics read: buffers, not
// parameters. Gradients do not train running statistics; they are constants of the model, as
// nn::BatchNorm2d's running_mean and running_var are buffers.
std::set<std::string> statistics_only(const onnx::GraphProto& g) {
  std::map<std::string, Uses> uses;
  count_uses(g, {}, uses);
  std::set<std::string> r;
  for (const onnx::TensorProto& t : g.initializer()) {
    auto it = uses.find(t.name());
    if (it != uses.end() && it->second.stats > 0 && it->second.other == 0) r.insert(t.name());
  }
  return r;
}

std::vector<Tensor> run_graph(const Imported& m, const std::vector<Tensor>& in) {
  DUET_CHECK_VALUE(in.size() == m.inputs.size(), "[{}] takes {} inputs ({}), got {}", m.label,
                   m.inputs.size(), fmt::join(m.inputs, ", "), in.size());
  Scope env;
  for (const auto& [name, t] : m.consts) env.values[name] = Value{t, true};
  for (const auto& [name, t] : m.params) env.values[name] = Value{t, false};
  for (size_t i = 0; i < in.size(); ++i) {
    const Imported::Spec& s = m.specs[i];
    const Tensor& t = in[i];
    DUET_CHECK_VALUE(t.defined(), "[{}] input \"{}\" is an undefined tensor", m.label, m.inputs[i]);
    auto want = [&] {
      std::string d;
      for (size_t k = 0; k < s.dims.size(); ++k)
        d += fmt::format("{}{}", k ? ", " : "", s.dims[k] < 0 ? "?" : std::to_string(s.dims[k]));
      return fmt::format("{} ({})", s.dtype, d);
    };
    DUET_CHECK_DTYPE(t.dtype() == s.dtype, "[{}] input \"{}\" expects {}, got {} {}", m.label,
                     m.inputs[i], want(), t.dtype(), detail::hint_sizes(t));
    if (s.has_shape) {
      // The sizes as traced (hints): reading sizes() would make a symbolic dim concrete.
      const Shape& got = detail::hint_sizes(t);
      bool fits = t.dim() == static_cast<int64_t>(s.dims.size());
      for (size_t k = 0; fits && k < s.dims.size(); ++k)
        fits = s.dims[k] < 0 || s.dims[k] == got[static_cast<int64_t>(k)];
      DUET_CHECK_SHAPE(fits, "[{}] input \"{}\" expects {}, got shape {}", m.label, m.inputs[i],
                       want(), got);
    }
    env.values[m.inputs[i]] = Value{t, false};
  }
  for (const onnx::NodeProto& n : m.graph.node()) run_node(n, m.opset, env);
  std::vector<Tensor> out;
  for (const std::string& name : m.outputs) {
    const Value* v = env.find(name);
    DUET_CHECK_VALUE(v, "[{}] no node computes the graph output \"{}\"", m.label, name);
    out.push_back(v->t);
  }
  return out;
}

}  // namespace

namespace detail::onnx_import {

std::vector<Value> run_subgraph(const Node& n, const onnx::GraphProto& g,
                                std::vector<Value> inputs) {
  if (static_cast<size_t>(g.input_size()) != inputs.size())
    n.fail(fmt::format("its subgraph \"{}\" takes {} inputs, the op binds {}", g.name(),
                       g.input_size(), inputs.size()));
  Scope env;
  env.outer = n.scope();
  for (const onnx::TensorProto& t : g.initializer())
    env.values[t.name()] =
        Value{io::tensor_from_proto(t, fmt::format("initializer \"{}\"", t.name())), true};
  for (size_t i = 0; i < inputs.size(); ++i)
    env.values[g.input(static_cast<int>(i)).name()] = std::move(inputs[i]);
  for (const onnx::NodeProto& node : g.node()) run_node(node, n.opset(), env);
  std::vector<Value> out;
  for (const onnx::ValueInfoProto& o : g.output()) {
    const Value* v = env.find(o.name());
    if (!v)
      n.fail(fmt::format("no node of its subgraph \"{}\" computes \"{}\"", g.name(), o.name()));
    out.push_back(*v);
  }
  return out;
}

}  // namespace detail::onnx_import

Program import_onnx(const std::string& path, const OnnxImportOptions& options) {
  auto m = std::make_shared<Imported>();
  onnx::ModelProto model = io::read_model(path);
  for (const onnx::OperatorSetIdProto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") m->opset = static_cast<int>(o.version());
  m->graph = std::move(*model.mutable_graph());
  const onnx::GraphProto& g = m->graph;
  m->label = fmt::format("ONNX model {}", std::filesystem::path(path).filename().string());

  std::set<std::string> initialized;
  const std::set<std::string> buffers = statistics_only(g);
  for (const onnx::TensorProto& t : g.initializer()) {
    initialized.insert(t.name());
    Tensor v = io::tensor_from_proto(t, fmt::format("initializer \"{}\"", t.name()));
    if (buffers.count(t.name())) m->buffers.push_back(t.name());
    if (options.trainable && is_floating(v.dtype()) && !buffers.count(t.name())) {
      v.requires_grad_(true);
      m->params.emplace_back(t.name(), v);
    } else {
      m->consts[t.name()] = v;
    }
  }
  for (const onnx::ValueInfoProto& v : g.input()) {
    if (initialized.count(v.name())) continue;  // an initializer listed as an input (IR < 4)
    const int32_t e = elem_type_of(v, "input");
    std::optional<DType> dt = io::dtype_of(e);
    if (!dt) io::unsupported_elem_type(e, fmt::format("input \"{}\"", v.name()));
    Imported::Spec s{*dt, {}, v.type().tensor_type().has_shape()};
    for (const onnx::TensorShapeProto::Dimension& d : v.type().tensor_type().shape().dim())
      s.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    m->inputs.push_back(v.name());
    m->specs.push_back(std::move(s));
  }
  for (const onnx::ValueInfoProto& v : g.output()) {
    const int32_t e = elem_type_of(v, "output");
    if (!io::dtype_of(e)) io::unsupported_elem_type(e, fmt::format("output \"{}\"", v.name()));
    m->outputs.push_back(v.name());
  }

  check_nodes(g, m->opset);
  detail::onnx_import::check_loop_types(g, m->opset);

  detail::FunctionProgram f;
  f.label = m->label;
  f.inputs = m->inputs;
  f.outputs = m->outputs;
  f.parameters = m->params;
  f.fn = [m](const std::vector<Tensor>& in) { return run_graph(*m, in); };
  f.to = [m](Device d) {
    NoGradGuard ng;
    for (auto& [name, t] : m->params) t = t.detach().to(d).requires_grad_(t.requires_grad());
    for (auto& [name, t] : m->consts) t = t.to(d);
    return m->params;
  };
  f.buffers = [m] {
    std::vector<std::pair<std::string, Tensor>> r;
    for (const std::string& name : m->buffers) r.emplace_back(name, m->consts.at(name));
    return r;
  };
  CompileOptions co = options.compile;
  co.guard_data_reads = true;
  return detail::make_function_program(std::move(f), co);
}

}  // namespace duet
