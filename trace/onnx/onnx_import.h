// ONNX import, internal: what an op's mapping sees of its node (trace/onnx/onnx_import.cpp runs the
// graph; trace/onnx/onnx_import_ops.cpp maps each ONNX op onto duet ops).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/options.h"
#include "core/tensor.h"

namespace duet::detail::onnx_import {

/// A value of the ONNX graph: its tensor, and whether it is known while tracing (computed from
/// constants and shapes alone, so a mapping may read its data: a Reshape's shape, a Slice's
/// starts). An omitted optional input is an undefined tensor.
struct Value {
  Tensor t;
  bool known = false;
};

/// The values a graph's nodes read by name: the graph's own, then, for a subgraph (an If
/// branch, a Loop or Scan body), those of the graphs around it, as ONNX scoping has it.
struct Scope {
  std::unordered_map<std::string, Value> values;
  const Scope* outer = nullptr;
  /// The value named `name` here or in an enclosing scope; null when none defines it.
  const Value* find(const std::string& name) const;
};

/// One node, as its mapping sees it.
class Node {
 public:
  Node(const onnx::NodeProto& proto, int opset, std::vector<Value> inputs,
       const Scope* scope = nullptr)
      : proto_(proto), opset_(opset), in_(std::move(inputs)), scope_(scope) {}
  const std::string& op() const { return proto_.op_type(); }
  int opset() const { return opset_; }
  /// The scope the node runs in (what its subgraphs see); null when not given.
  const Scope* scope() const { return scope_; }
  /// The inputs the node lists (omitted optional ones included, as undefined).
  size_t size() const { return in_.size(); }
  bool has(size_t i) const { return i < in_.size() && in_[i].t.defined(); }
  /// Input i; a ValueError naming the node when it is missing.
  const Tensor& in(size_t i) const;
  bool known(size_t i) const { return has(i) && in_[i].known; }
  /// The outputs the node lists, and whether output i is wanted (listed, not omitted).
  size_t outputs() const { return static_cast<size_t>(proto_.output_size()); }
  bool wants(size_t i) const {
    return i < outputs() && !proto_.output(static_cast<int>(i)).empty();
  }
  /// The values of input i as integers / numbers: it must be known while tracing.
  std::vector<int64_t> ints(size_t i) const;
  double number(size_t i) const;
  /// The one integer input i holds (a 0-d tensor or one of one element); a ValueError naming
  /// the node when it holds none or several.
  int64_t int1(size_t i) const;

  bool has_attr(const char* name) const { return attr(name) != nullptr; }
  /// An attribute's value, or the fallback when absent; a ValueError naming the node when the
  /// attribute has another type (an axis given as a FLOAT), as the ONNX checker raises.
  int64_t attr_i(const char* name, int64_t fallback) const;
  double attr_f(const char* name, double fallback) const;
  std::string attr_s(const char* name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const char* name) const;  ///< empty when absent
  std::vector<float> attr_floats(const char* name) const;
  const onnx::AttributeProto* attr(const char* name) const;
  /// The attribute, when present; a ValueError when its type is not `type`.
  const onnx::AttributeProto* attr(const char* name,
                                   onnx::AttributeProto::AttributeType type) const;

  /// "node "n1" (Reshape, opset 13)".
  std::string where() const;
  /// A ValueError: "[import_onnx] node "n1" (Reshape, opset 13): why".
  [[noreturn]] void fail(const std::string& why) const;
  /// An axis attribute or input wrapped into [0, rank); a ValueError when out of range.
  int64_t axis(int64_t a, int64_t rank) const;

 private:
  const onnx::NodeProto& proto_;
  int opset_;
  std::vector<Value> in_;
  const Scope* scope_;
};

/// What node n's mapping assumes of it, checked before it runs (trace/onnx/onnx_import_checks.cpp):
/// the ranks of its inputs, the count and range of its attributes and of the small inputs that
/// stand for attributes (TopK's k, STFT's frame_step). A ValueError or ShapeError naming the node
/// and what was expected, so that no mapping divides by zero or indexes past an end.
void check_node(const Node& n);
/// Refuses an output of `dims` elements of dtype d that the machine cannot hold, before anything
/// is allocated: a ValueError naming the node, `what` and the size. The dims are doubles so that
/// a size computed from a huge scale is checked before it is rounded to an integer.
void check_fits(const Node& n, const std::string& what, const std::vector<double>& dims, DType d);

/// Pads b and e (negative: crops) on dim a of `shape`: a ValueError when they crop more than the
/// dim holds, or when mode "reflect" or "edge" has no element left to pad from.
void check_pad_dim(const Node& n, const Shape& shape, int64_t a, int64_t b, int64_t e,
                   const std::string& mode);

/// Runs subgraph g of node n (an If branch, a Loop or Scan body) in a scope inside n's, with g's
/// inputs bound in order to `inputs`: g's outputs, in order (trace/onnx/onnx_import.cpp).
std::vector<Value> run_subgraph(const Node& n, const onnx::GraphProto& g,
                                std::vector<Value> inputs);

/// A mapping: the node's outputs, as many as the node lists (undefined for omitted ones).
using ImportFn = std::vector<Tensor> (*)(const Node&);
struct OpEntry {
  const char* name;
  ImportFn fn;
};
/// Checks, before anything runs, that each Loop's carried values whose element types the model
/// declares (graph inputs, initializers, value_info) have the types its body declares for
/// them, as ONNX's type inference does: a DTypeError naming the node otherwise
/// (trace/onnx/onnx_import_control.cpp).
void check_loop_types(const onnx::GraphProto& g, int opset);

/// The mappings, by file: elementwise, reduction and linear-algebra ops
/// (trace/onnx/onnx_import_math.cpp); constants, shapes and indexing
/// (trace/onnx/onnx_import_shape.cpp); normalization, convolution, pooling and losses
/// (trace/onnx/onnx_import_nn.cpp); ops placed or chosen by data, signal processing and the
/// training domain's optimizers (trace/onnx/onnx_import_data.cpp); resampling and transposed
/// convolution (trace/onnx/onnx_import_image.cpp); control flow and recurrent layers
/// (trace/onnx/onnx_import_control.cpp). find_op looks in all of them.
std::vector<OpEntry> math_ops();
std::vector<OpEntry> shape_ops();
std::vector<OpEntry> nn_ops();
std::vector<OpEntry> data_ops();
std::vector<OpEntry> image_ops();
std::vector<OpEntry> control_ops();
/// The name a node's op is mapped under: the op type for the default domain, and
/// "ai.onnx.preview.training.Adam" and the like for the training domain's; "" for other domains.
std::string op_key(const onnx::NodeProto& n);
/// The mapping of an op by that name; null when duet has none.
ImportFn find_op(const std::string& op_type);

// Helpers the mapping files share (trace/onnx/onnx_import_ops.cpp).
/// t in dtype d (t itself when it is already).
Tensor as(const Tensor& t, DType d);
/// A 1-D i64 tensor of exactly these values, on `device`.
Tensor i64s(const std::vector<int64_t>& v, Device device = Device::cpu());
/// x reversed along dim.
Tensor flip(const Tensor& x, int64_t dim);
/// Options of t's dtype and device; t's sizes; the product of v[from, to).
Options like(const Tensor& t);
/// The elementwise and of two b8 tensors.
Tensor logical_and_(const Tensor& a, const Tensor& b);
std::vector<int64_t> dims_of(const Tensor& t);
int64_t prod(const std::vector<int64_t>& v, size_t from = 0, size_t to = SIZE_MAX);
/// x with dim a moved last / first; movedim_back undoes movedim_last.
Tensor movedim_last(const Tensor& x, int64_t a);
Tensor movedim_first(const Tensor& x, int64_t a);
Tensor movedim_back(const Tensor& x, int64_t a);
/// Indices with negative values counted from the end of a dim of size len, as i64.
Tensor wrap_index(const Tensor& idx, int64_t len);
/// The dtype an attribute names (a DTypeError for an element type duet has no dtype for).
DType dtype_attr(const Node& n, const char* name, DType fallback);
/// x padded by pads (every dim's before, then every dim's after; negative values crop), in mode
/// "constant" (with value), "reflect" or "edge".
Tensor pad_nd(const Node& n, Tensor x, const std::vector<int64_t>& pads, const std::string& mode,
              const Tensor& value);
/// A b8 tensor of this shape, every element v.
Tensor bools(const Shape& shape, bool v, Device d);
/// The (rows, cols) mask of the last two dims where col - row compares with k: col - row.
Tensor diagonal_offsets(int64_t rows, int64_t cols, Device d);
/// matmul, through f64 for integer operands (ONNX MatMul takes integers; duet's matmul does not).
Tensor matmul_any(const Tensor& a, const Tensor& b);
/// Every op with a mapping, sorted (docs/onnx.md).
std::vector<std::string> mapped_ops();
/// Ops whose results may not be computed at import time even from known inputs (draws).
bool is_random(const std::string& op_type);

}  // namespace duet::detail::onnx_import
