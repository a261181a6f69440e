// duet: the ONNX writer's internals (Note [ONNX export] in trace/onnx/onnx_export.cpp), shared by
// the files that write a model: onnx_export.cpp (sizes, graphs, the model and the entry points)
// and onnx_export_ops.cpp (every op's ONNX form, and control flow).
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/window.h"
#include "trace/control_flow.h"
#include "trace/onnx/onnx.h"
#include "trace/onnx/onnx_proto.h"

namespace duet::detail::onnx_export {

using onnx::AttributeProto;
using onnx::GraphProto;
using onnx::NodeProto;
using onnx::TensorProto;
using Names = std::vector<std::string>;
namespace io = detail::onnx_io;

/// The opset duet writes.
constexpr int kOpset = 17;

AttributeProto* attr(NodeProto& n, const char* name, AttributeProto::AttributeType type);
void attr_int(NodeProto& n, const char* name, int64_t v);
void attr_ints(NodeProto& n, const char* name, const std::vector<int64_t>& v);
void attr_str(NodeProto& n, const char* name, const std::string& v);
void attr_graph(NodeProto& n, const char* name, GraphProto&& g);
/// An INT64 tensor of these values and dims.
TensorProto int64_proto(const std::vector<int64_t>& v, std::vector<int64_t> dims);
/// The symbol id when s is exactly one symbol (a dim that can be a dim_param).
std::optional<int32_t> plain_symbol(const SymInt& s);
/// m without its first dim (a scan's slice).
TensorMeta drop_dim0(const TensorMeta& m);
/// Which values of g its outputs need, or that have an effect (these are written so as to raise).
std::vector<char> live_values(const Graph& g);
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

// The sliding windows of Unfold and Fold (attrs.ints: core/window.h).
struct Window : WindowGeometry {
  int64_t hp, wp;  // the padded plane
  explicit Window(const Attrs& a)
      : WindowGeometry(window_geometry(a)), hp(h + 2 * ph), wp(w + 2 * pw) {}
  // The position in the padded plane (flattened, Hp * Wp) of every window element, in
  // unfold's order: row ki * kw + kj, column oh * Wo + ow.
  std::vector<int64_t> positions() const {
    std::vector<int64_t> r;
    r.reserve(static_cast<size_t>(kh * kw * ho * wo));
    for (int64_t ki = 0; ki < kh; ++ki)
      for (int64_t kj = 0; kj < kw; ++kj)
        for (int64_t oh = 0; oh < ho; ++oh)
          for (int64_t ow = 0; ow < wo; ++ow)
            r.push_back((oh * sh + ki * dh) * wp + ow * sw + kj * dw);
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
  // x reshaped to dims, a 0 in dims meaning a dim of size 0 (allowzero), not "as in x": duet's
  // sizes are exact, and an empty tensor's are 0.
  std::string reshape(Frame& f, const std::string& x, const std::string& dims) {
    return emit(f, "Reshape", {x, dims}, [](NodeProto& n) { attr_int(n, "allowzero", 1); });
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
  std::string emit_arithmetic(Frame& f, Values& vals, const GraphNode& n);
  std::string emit_reduce(Frame& f, Values& vals, const GraphNode& n);
  std::string emit_view(Frame& f, const std::string& x, const GraphNode& n);
  std::string emit_conv(Frame& f, const std::string& x, const std::string& w, const GraphNode& n);
  std::string emit_unfold(Frame& f, const std::string& x, const GraphNode& n);
  std::string emit_fold(Frame& f, const std::string& x, const GraphNode& n);
  std::string emit_slice_scatter(Frame& f, Values& vals, const GraphNode& n);
  std::string emit_full(Frame& f, const GraphNode& n);
  std::string emit_arange(Frame& f, const GraphNode& n);
  std::string emit_attention(Frame& f, Values& vals, const GraphNode& n);
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

/// A node with these inputs and outputs, named by the caller.
NodeProto& add_node(Frame& f, const char* op, const Names& ins, const Names& outs);

}  // namespace duet::detail::onnx_export
