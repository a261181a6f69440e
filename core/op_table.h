// duet: the one op table. Each primitive in core/ops.def has one OpDef: its name, arity, fusion
// class, shape/dtype rule, gradient rule and one kernel per device. core/ops/ fills the rules,
// kernels/ and cuda/ fill the kernels at initialisation (explicit registration).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace duet {

enum class OpId : uint16_t {
#define DUET_OP(Name, name, arity, cls, cuda, doc) Name,
#include "core/ops.def"
#undef DUET_OP
};
inline constexpr int kNumOps = 0
#define DUET_OP(Name, name, arity, cls, cuda, doc) +1
#include "core/ops.def"
#undef DUET_OP
    ;
// Nothing counts the rows by hand: test_ops fails for a primitive without test rows, and
// duet_op_docs for a docs/ops.md that does not match the table.

/// How an op fuses: elementwise maps, reductions, views (no data movement), opaque (matmul),
/// sources (no tensor inputs).
enum class OpClass : uint8_t { Elementwise, Reduction, View, Opaque, Source };

/// The arity of every op (-1: variadic), known at compile time.
inline constexpr int kOpArity[] = {
#define DUET_OP(Name, name, arity, cls, cuda, doc) arity,
#include "core/ops.def"
#undef DUET_OP
};
constexpr int op_arity(OpId op) { return kOpArity[static_cast<int>(op)]; }
/// The fusion class of every op, known at compile time.
inline constexpr OpClass kOpClass[] = {
#define DUET_OP(Name, name, arity, cls, cuda, doc) OpClass::cls,
#include "core/ops.def"
#undef DUET_OP
};
/// How many ops are elementwise: every one of them fuses, so each table derived for the fused
/// kernels holds one entry per elementwise op, and a static_assert there says so.
inline constexpr int kNumElementwise = 0
#define DUET_OP(Name, name, arity, cls, cuda, doc) +(OpClass::cls == OpClass::Elementwise)
#include "core/ops.def"
#undef DUET_OP
    ;
/// How many ops the families of core/elementwise.def declare. The elementwise ops beyond them are
/// Where, Cast and Copy.
inline constexpr int kNumFamilyOps = 0
#define DUET_UNARY(Name, name, math, doc) +1
#define DUET_BINARY(Name, name, doc) +1
#define DUET_COMPARE(Name, name, expr, doc) +1
#include "core/elementwise.def"
    ;
// The kernel tables (the fused interpreter's block_fn, the CPU and the CUDA registrations) expand
// the families and list Where, Cast and Copy by hand: together, every elementwise op.
static_assert(kNumFamilyOps + 3 == kNumElementwise,
              "an elementwise op of core/ops.def outside the families needs its entry in the "
              "kernel tables (kernels/fused.cpp, kernels/elementwise.cpp, "
              "cuda/kernels/elementwise.cpp)");
/// Whether an op fuses into a fused elementwise kernel: exactly the elementwise ops.
constexpr bool is_fusable(OpId op) {
  return kOpClass[static_cast<int>(op)] == OpClass::Elementwise;
}

/// What autocast does to an op's inputs (Note [Autocast] in core/autocast.h): None leaves them,
/// Lower casts f32/f16/bf16 inputs to the scope's low dtype (products), F32 casts f16/bf16
/// inputs to f32 (numerically sensitive ops).
enum class AutocastClass : uint8_t { None, Lower, F32 };

/// The dtype rule of a unary elementwise op (core/elementwise.def): Float computes integers and
/// b8 in f32, Same keeps the dtype and refuses b8. None: not a unary family op.
enum class UnaryMath : uint8_t { None, Float, Same };
constexpr UnaryMath unary_math(OpId op) {
  switch (op) {
#define DUET_UNARY(Name, name, math, doc) \
  case OpId::Name:                        \
    return UnaryMath::math;
#include "core/elementwise.def"
    default:
      return UnaryMath::None;
  }
}
/// Whether an op is a row of the binary family (add, ..., minimum) of core/elementwise.def.
constexpr bool is_binary_family(OpId op) {
  switch (op) {
#define DUET_BINARY(Name, name, doc) case OpId::Name:
#include "core/elementwise.def"
    return true;
    default:
      return false;
  }
}
/// Whether an op is a comparison (core/elementwise.def): b8 result, not differentiable.
constexpr bool is_compare(OpId op) {
  switch (op) {
#define DUET_COMPARE(Name, name, expr, doc) case OpId::Name:
#include "core/elementwise.def"
    return true;
    default:
      return false;
  }
}

/// The attributes of one op call. One struct for every op keeps dispatch free of allocation
/// and makes attributes hashable and comparable for the graph passes. Unused fields stay at
/// their defaults; each op documents which fields it reads in core/ops/.
struct Attrs {
  detail::SmallVec<int64_t, 6> ints;  ///< shape (Reshape, Expand, Full), dims (reductions, Permute)
  int64_t dim = 0, start = 0, end = 0, step = 1;  ///< Slice; Arange uses end
  bool keepdim = false;                           ///< reductions
  DType dtype = DType::f32;                       ///< Cast, Full, Arange
  Device device;                                  ///< Transfer: the target; Full, Arange: where
  Scalar value;                                   ///< Full
  /// The symbolic versions of the size-holding fields, when a trace has symbolic dims (null
  /// otherwise); the fields above then hold their values at the trace's sizes.
  std::shared_ptr<const SymAttrs> sym;
  friend bool operator==(const Attrs& a, const Attrs& b);
  size_t hash() const;
};

/// Output metadata computed by an op's shape rule.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  /// In a trace with symbolic dims: every dim as a SymInt (shape then holds the traced call's
  /// sizes). Empty when every dim is concrete.
  SymDims sym;
};

/// A non-owning list of input tensors (no reference-count traffic on the hot path).
class TensorRefs {
 public:
  TensorRefs() = default;
  TensorRefs(const Tensor* const* p, int64_t n) : p_(p), n_(n) {}
  const Tensor& operator[](int64_t i) const { return *p_[i]; }
  int64_t size() const { return n_; }

 private:
  const Tensor* const* p_ = nullptr;
  int64_t n_ = 0;
};

/// Shape/dtype rule: validates the inputs (throwing duet::Error in the "[op] ..." form) and
/// writes the output metadata.
struct OpDef;
using InferFn = void (*)(const OpDef& def, TensorRefs in, const Attrs& attrs, TensorMeta& out);
/// Kernel: computes `out` (allocated by the caller, possibly strided, possibly one of the
/// inputs) from the inputs.
using KernelFn = void (*)(TensorRefs in, const Attrs& attrs, const Tensor& out);
/// View rule: a view of in[0] with the output metadata, or an undefined tensor when the
/// storage cannot express it (then dispatch copies).
using ViewFn = Tensor (*)(const Tensor& in, const Attrs& attrs, const TensorMeta& out);
/// Symbolic rule (Note [Symbolic dims] in trace/compile.h): the result's dims as SymInts, from
/// the inputs' dims (detail::sym_dims) and the symbolic attributes, after the shape rule has
/// validated the traced call's sizes and written `out`. Decisions that depend on a symbolic
/// size go through detail::sym_decide (which records guards). An op without one needs concrete
/// sizes: tracing it on a traced tensor specializes those sizes.
using SymInferFn = void (*)(const OpDef& def, TensorRefs in, const Attrs& attrs,
                            const TensorMeta& out, SymDims& out_sym);

namespace detail {
/// Throws the error for a gradient rule reading input i of `node` after that input was modified
/// in place; autograd words it (Note [Autograd hooks] in core/autograd_hooks.h).
[[noreturn]] void throw_stale_input(const Node& node, int64_t i);
}  // namespace detail

/// The inputs a gradient rule reads. One written in place after the op saved it is stale:
/// reading it throws, naming the op, while a rule that does not read it still runs, so that
/// y.mul_(2) stays differentiable (Note [Saved tensors] in eager/node.h). Rules read an input
/// only in the branch that needs it.
class SavedInputs {
 public:
  SavedInputs(TensorRefs values, uint32_t stale, const detail::Node* node)
      : values_(values), stale_(stale), node_(node) {}
  const Tensor& operator[](int64_t i) const {
    if (i < 32 && (stale_ >> i & 1)) detail::throw_stale_input(*node_, i);
    return values_[i];
  }
  int64_t size() const { return values_.size(); }

 private:
  TensorRefs values_;
  uint32_t stale_;  ///< bit i: saved input i was written in place (only saved inputs, i < 7)
  const detail::Node* node_;
};

/// What a gradient rule sees of one recorded call.
struct GradCtx {
  const Attrs& attrs;
  SavedInputs inputs;            ///< the inputs the op saves (see OpDef::save); others undefined
  const Tensor& output;          ///< the output, when the op saves it; else undefined
  const TensorMeta* input_meta;  ///< shape, dtype and device of every input
  const bool* needs;             ///< needs[i]: input i needs a gradient
  bool needs_grad(int64_t i) const { return needs[i]; }
};
/// Gradient rule, written in duet ops (so it is taped with create_graph, and traced): writes
/// the gradient of each input that needs one into grad_in[i]. It may leave a broadcast shape or
/// another dtype: the engine sums a gradient back to its input's shape and converts the dtype.
using GradFn = void (*)(const GradCtx& ctx, const Tensor& grad, Tensor* grad_in);

/// OpDef::save bits: which values a gradient rule reads.
inline constexpr uint8_t kSaveIn0 = 1, kSaveIn1 = 2, kSaveIn2 = 4, kSaveIn3 = 8, kSaveIn4 = 16,
                         kSaveOut = 0x80;

/// One operand of a batching rule: a tensor and its dim that holds the batch (-1: none, the
/// operand is the same for every sample).
struct BatchedArg {
  Tensor value;
  int64_t bdim = -1;
};
namespace detail {
/// x with its batch first, as `batch` samples (a view): an unbatched operand expanded.
Tensor batched_first(const BatchedArg& x, int64_t batch);
}  // namespace detail
/// Batching rule (func::vmap; Note [Batching rules] in core/ops/batching.cpp): the op applied
/// to every sample of its operands at once, `batch` samples, some operand batched. The result
/// names its batch dim.
using BatchFn = BatchedArg (*)(const OpDef& def, const std::vector<BatchedArg>& in,
                               const Attrs& attrs, int64_t batch);
/// What a row rule says of one call (Note [Rows] in core/ops/batching.cpp).
struct RowsUse {
  uint32_t operands = 0;  ///< bit i: operand i's rows are the result's (0: the call is not by rows)
  bool summed = false;    ///< the result sums those rows (a sum over dim 0), instead
  bool joined = false;    ///< the result is every operand's rows, one after another (cat along
                          ///< dim 0): `operands` is 1, and every operand gives rows
  /// Whether operand i is in `operands` (a call of more operands than its bits has none there).
  bool has(int64_t i) const { return i < 32 && (operands >> i & 1); }
  bool operator==(const RowsUse&) const = default;
};
/// Row rule: whether, and through which operands, the call computes its result row by row
/// along dim 0, so that samples of different lengths along it run as one call on their rows.
using RowsFn = RowsUse (*)(TensorRefs in, const Attrs& attrs, const TensorMeta& out);

struct OpDef {
  OpId id;
  const char* name;
  int arity;
  OpClass cls;
  const char* doc;  ///< one line for the op reference (docs/ops.md)
  /// ops.def's cuda column: the op has a CUDA kernel (cuda/kernels/). Declared, so known in
  /// every build; kernel[CUDA] is what this build registered (tools/gen_op_docs.cpp compares).
  bool cuda_kernel = false;
  InferFn infer = nullptr;
  ViewFn view = nullptr;
  GradFn grad = nullptr;
  SymInferFn sym_infer = nullptr;
  uint8_t save = 0;            ///< kSave* bits: what the gradient rule reads
  bool differentiable = true;  ///< false: outputs never require grad (comparisons, sources)
  AutocastClass autocast = AutocastClass::None;  ///< set with the op's rules (core/ops/)
  BatchFn batch = nullptr;  ///< null: vmap runs the op once per sample (batch_loop)
  RowsFn rows = nullptr;    ///< null: never by rows (Autobatch groups its calls by shape)
  KernelFn kernel[kNumDeviceTypes] = {};
};

namespace detail {
/// PyTorch's result_type: the dtype inputs promote to. Tensors with dims outrank 0-d tensors,
/// which outrank wrapped numbers (Scalars), except when a lower rank brings a higher category.
DType result_type(TensorRefs in);
/// What result_type reads of an operand: its dtype, whether it has no dims, whether it is a
/// wrapped number.
struct PromotionArg {
  DType dtype;
  bool zero_dim, wrapped;
};
/// result_type of operands given by what it reads of them (a batching rule's per-sample view).
DType result_type(const PromotionArg* in, int64_t n);
/// Checks that the inputs share a device (wrapped numbers go anywhere) and returns it.
Device common_device(const OpDef& def, TensorRefs in);
/// Whether input x of op def goes with tensors of any device: a wrapped number, or a 0-d CPU
/// tensor read by an elementwise op (Note [CPU scalars beside device tensors] in
/// core/dispatch.cpp).
bool goes_anywhere(const OpDef& def, const TensorImpl* x);
/// The table, built on first use: core's rules, then every backend's kernels.
OpDef* op_table();
inline const OpDef& op_def(OpId id) { return op_table()[static_cast<int>(id)]; }
/// Registers one backend kernel (called from kernels/ and cuda/ during initialisation).
void register_kernel(OpDef* table, OpId id, DeviceType device, KernelFn fn);
/// Defined by the library's initialisation (kernels/backends.cpp): fills the kernel slots of
/// every backend.
void register_backends(OpDef* table);
/// Filled by core/ops/*: shape rules and view rules.
void register_elementwise_rules(OpDef* table);
void register_reduction_rules(OpDef* table);
void register_linalg_rules(OpDef* table);
void register_view_rules(OpDef* table);
void register_source_rules(OpDef* table);
void register_index_rules(OpDef* table);
void register_image_rules(OpDef* table);
void register_attention_rules(OpDef* table);
void register_rnn_rules(OpDef* table);
void register_random_rules(OpDef* table);
void register_debug_rules(OpDef* table);
void register_collective_rules(OpDef* table);
void register_batching_rules(OpDef* table);
void register_row_rules(OpDef* table);  // core/ops/rows.cpp
/// The op once per sample of the batched operands, the results stacked at dim 0: what vmap does
/// for an op without a batching rule.
BatchedArg batch_loop(const OpDef& def, const std::vector<BatchedArg>& in, const Attrs& attrs,
                      int64_t batch);
/// How many times batch_loop ran, in this process (the tests check which ops batch in one call).
int64_t batch_loop_calls();
/// Why `format` cannot be duet::print's format (fmt's message: a bad field, a second field, a
/// spec a string does not take), or "" when it formats one tensor.
std::string print_format_error(const std::string& format);
/// duet::print's format strings, interned: Print's attrs.dim is the index.
int64_t intern_format(const std::string& format);
const std::string& interned_format(int64_t id);
/// Where duet::print writes a line (default: stdout, flushed). Returns the previous writer.
using PrintSink = void (*)(const std::string& line);
PrintSink set_print_sink(PrintSink sink);
void write_print(const std::string& line);
void register_symbolic_rules(OpDef* table);
// Symbolic dims (core/ops/symbolic_rules.cpp; Note [Symbolic dims] in trace/compile.h).
/// The product of the dims.
SymInt sym_numel(const SymDims& d);
/// The dims a and b broadcast to (guards when symbolic); errors name `op`.
SymDims sym_broadcast(const SymDims& a, const SymDims& b, const char* op);
/// Whether every dim is concrete.
bool all_concrete(const SymDims& d);
/// The dims of a meta as SymInts (its sym, or its concrete shape).
SymDims meta_dims(const TensorMeta& m);
/// The value of s at the traced call's sizes (s itself when concrete).
int64_t sym_hint(const SymInt& s);
/// The dims at the traced call's sizes.
Shape hint_shape(const SymDims& d);
/// "(s0, 16)".
std::string dims_str(const SymDims& d);
/// Attrs whose ints hold a shape given as SymInts (Reshape, Expand, Full, Random).
Attrs shape_attrs(const SymDims& dims);
/// The shape an Attrs holds (its symbolic ints when it has them).
SymDims attr_dims(const Attrs& a);
/// Whether a and b have the same shape, sizes compared with sym_decide (guards when symbolic):
/// for library checks on tensors whose dims may be symbolic.
bool same_shape(const Tensor& a, const Tensor& b, const char* op);
/// Whether dim d of t has size n (decided as same_shape does).
bool size_is(const Tensor& t, int64_t d, const SymInt& n, const char* op);
/// Registers a gradient rule and what it saves.
inline void set_grad(OpDef* t, OpId id, GradFn fn, uint8_t save) {
  t[static_cast<int>(id)].grad = fn;
  t[static_cast<int>(id)].save = save;
}
/// Marks an op as not differentiable: its outputs never require grad.
inline void set_not_differentiable(OpDef* t, OpId id) {
  t[static_cast<int>(id)].differentiable = false;
}
}  // namespace detail

/// The op's name as in ops.def ("add").
std::string_view op_name(OpId id);
OpClass op_class(OpId id);

}  // namespace duet
