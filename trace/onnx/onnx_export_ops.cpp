// ONNX export, every op's ONNX form (Writer::emit_op and the emitters it calls) and control flow
// (cond -> If, scan -> Scan, while_loop -> Loop). Note [ONNX export] in onnx_export.cpp.
#include "trace/onnx/onnx_writer.h"

namespace duet::detail::onnx_export {

namespace {
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

// The ops whose ONNX form is the node of the same meaning on the result's dtype, or null.
const char* same_unary(OpId op) {
  static constexpr std::pair<OpId, const char*> kSame[] = {
      {OpId::Neg, "Neg"},     {OpId::Exp, "Exp"},     {OpId::Log, "Log"},
      {OpId::Sqrt, "Sqrt"},   {OpId::Abs, "Abs"},     {OpId::Sin, "Sin"},
      {OpId::Cos, "Cos"},     {OpId::Tan, "Tan"},     {OpId::Asin, "Asin"},
      {OpId::Acos, "Acos"},   {OpId::Atan, "Atan"},   {OpId::Sinh, "Sinh"},
      {OpId::Cosh, "Cosh"},   {OpId::Tanh, "Tanh"},   {OpId::Asinh, "Asinh"},
      {OpId::Acosh, "Acosh"}, {OpId::Atanh, "Atanh"}, {OpId::Sigmoid, "Sigmoid"},
      {OpId::Relu, "Relu"},   {OpId::Erf, "Erf"},     {OpId::Sign, "Sign"}};
  for (const auto& [id, name] : kSame)
    if (id == op) return name;
  return nullptr;
}

}  // namespace

// The unary and binary arithmetic ops, in the dtype their result has (emit_op's families), and
// LstmCell and GruCell, which fuse a few of them.
std::string Writer::emit_arithmetic(Frame& f, Values& vals, const GraphNode& n) {
  const TensorMeta& out = n.meta;
  const auto arg = [&](size_t i, DType d) { return as(f, vals, n.inputs[i], d); };
  const auto unary = [&](const char* op) { return emit(f, op, {arg(0, out.dtype)}); };
  const auto binary = [&](const char* op) {
    return emit(f, op, {arg(0, out.dtype), arg(1, out.dtype)});
  };
  const auto one = [&] { return scalar(f, 1, out.dtype); };
  // A cell's gates (core/ops/rnn.cpp): Split without sizes cuts x into as many equal parts as it
  // has outputs, one per name, along the last axis, whether H is a number or a symbol.
  const auto gates = [&](const std::string& x, std::initializer_list<const char*> names) {
    Names parts;
    for (const char* name : names) parts.push_back(fresh(name));
    NodeProto& split = add_node(f, "Split", {x}, parts);
    split.set_name(fresh("Split"));
    attr_int(split, "axis", -1);
    return parts;
  };
  if (const char* op = same_unary(n.op)) return unary(op);
  switch (n.op) {
    case OpId::Expm1:
      return emit(f, "Sub", {unary("Exp"), one()});
    case OpId::Log1p:
      return emit(f, "Log", {emit(f, "Add", {arg(0, out.dtype), one()})});
    case OpId::Exp2:
      return emit(f, "Pow", {scalar(f, 2, out.dtype), arg(0, out.dtype)});
    case OpId::Log2:
      return emit(f, "Div", {unary("Log"), scalar(f, 0.69314718055994530942, out.dtype)});
    case OpId::Log10:
      return emit(f, "Div", {unary("Log"), scalar(f, 2.30258509299404568402, out.dtype)});
    case OpId::Rsqrt:
      return emit(f, "Reciprocal", {unary("Sqrt")});
    // ONNX's Floor takes floating types only; an integer is its own floor.
    case OpId::Floor:
      return unary(is_floating(out.dtype) ? "Floor" : "Identity");
    case OpId::Ceil:
      return unary(is_floating(out.dtype) ? "Ceil" : "Identity");
    case OpId::Round:  // (ONNX's Round takes halves to even, as torch.round)
      return unary(is_floating(out.dtype) ? "Round" : "Identity");
    case OpId::Trunc: {  // no Trunc in ONNX: the ceiling below 0, the floor from 0
      if (!is_floating(out.dtype)) return unary("Identity");
      const std::string x = arg(0, out.dtype);
      return emit(f, "Where",
                  {emit(f, "Less", {x, scalar(f, 0, out.dtype)}), emit(f, "Ceil", {x}),
                   emit(f, "Floor", {x})});
    }
    // log(sigmoid(x)) = -softplus(-x), finite for any finite x as duet's kernel.
    case OpId::LogSigmoid:
      return emit(f, "Neg", {emit(f, "Softplus", {emit(f, "Neg", {arg(0, out.dtype)})})});
    // Opset 17 has no Gelu: x s with s = Sigmoid(k (x + c x^3)), and the derivative
    // s + x s (1 - s) k (1 + 3c x^2) (Note [GELU's tanh form as one op] in kernels/functors.h).
    case OpId::GeluTanh:
    case OpId::GeluTanhGrad: {
      const std::string x = arg(0, out.dtype);
      const auto mul = [&](const std::string& a, const std::string& b) {
        return emit(f, "Mul", {a, b});
      };
      const auto num = [&](double v) { return scalar(f, v, out.dtype); };
      const std::string xx = mul(x, x), k = num(1.5957691216057307118);
      const std::string u = mul(emit(f, "Add", {x, mul(mul(xx, x), num(0.044715))}), k);
      const std::string s = emit(f, "Sigmoid", {u});
      if (n.op == OpId::GeluTanh) return mul(x, s);
      const std::string du = mul(emit(f, "Add", {one(), mul(xx, num(0.134145))}), k);
      const std::string ds = mul(s, emit(f, "Sub", {one(), s}));
      return emit(f, "Add", {s, mul(mul(x, ds), du)});
    }
    // ONNX's arithmetic takes no bool: b8 sums and maxima are disjunctions, products and minima
    // conjunctions (duet's b8 arithmetic).
    case OpId::Add:
      return binary(out.dtype == DType::b8 ? "Or" : "Add");
    case OpId::Sub:
      return binary("Sub");
    case OpId::Mul:
      return binary(out.dtype == DType::b8 ? "And" : "Mul");
    case OpId::Div:
      return binary("Div");  // integers were promoted to a float result
    case OpId::Pow:
      return binary("Pow");
    case OpId::Maximum:
      return binary(out.dtype == DType::b8 ? "Or" : "Max");
    case OpId::Minimum:
      return binary(out.dtype == DType::b8 ? "And" : "Min");
    case OpId::LstmCell:
    case OpId::LstmStep: {
      // The composite it fuses, in its result's dtype, on the summed gates i, f, g and o;
      // lstm_step's are its products (Note [LSTM step] in core/ops/rnn.cpp), which it returns too.
      const bool step = n.op == OpId::LstmStep;
      const auto product = [&](int x, int w, int b) {
        const std::string wt = emit(f, "Transpose", {arg(w, out.dtype)}, [](NodeProto& p) {
          attr_ints(p, "perm", {1, 0});
        });
        return emit(f, "Add", {emit(f, "MatMul", {arg(x, out.dtype), wt}), arg(b, out.dtype)});
      };
      const std::string sum =
          step ? emit(f, "Add", {product(0, 3, 5), product(1, 4, 6)}) : binary("Add");
      const Names gate = gates(sum, {"gate_i", "gate_f", "gate_g", "gate_o"});
      const std::string i = emit(f, "Sigmoid", {gate[0]}), forget = emit(f, "Sigmoid", {gate[1]});
      const std::string g = emit(f, "Tanh", {gate[2]}), o = emit(f, "Sigmoid", {gate[3]});
      const std::string c =
          emit(f, "Add", {emit(f, "Mul", {forget, arg(2, out.dtype)}), emit(f, "Mul", {i, g})});
      const std::string h = emit(f, "Mul", {o, emit(f, "Tanh", {c})});
      if (step)
        return emit(f, "Concat", {h, c, sum}, [](NodeProto& p) { attr_int(p, "axis", -1); });
      return emit(f, "Concat", {h, c}, [](NodeProto& p) { attr_int(p, "axis", -1); });
    }
    case OpId::GruCell: {
      // The composite it fuses, in its result's dtype: the gates r, z and n of gates_x and of
      // gates_h apart, as r scales n's hidden part before the sum.
      const Names x = gates(arg(0, out.dtype), {"gate_x_r", "gate_x_z", "gate_x_n"});
      const Names hid = gates(arg(1, out.dtype), {"gate_h_r", "gate_h_z", "gate_h_n"});
      const std::string r = emit(f, "Sigmoid", {emit(f, "Add", {x[0], hid[0]})});
      const std::string z = emit(f, "Sigmoid", {emit(f, "Add", {x[1], hid[1]})});
      const std::string cand =
          emit(f, "Tanh", {emit(f, "Add", {x[2], emit(f, "Mul", {r, hid[2]})})});
      const std::string keep = emit(f, "Mul", {z, arg(2, out.dtype)});
      return emit(f, "Add", {emit(f, "Mul", {emit(f, "Sub", {one(), z}), cand}), keep});
    }
    default:
      throw InternalError(fmt::format("[export_onnx] {} is not an arithmetic op", op_name(n.op)));
  }
}

// The one definition of every op's ONNX form (Note [ONNX export]).
std::string Writer::emit_op(Frame& f, Values& vals, int32_t v) {
  const GraphNode& n = vals.g.nodes[static_cast<size_t>(v)];
  const TensorMeta& out = n.meta;
  const auto in = [&](size_t i) { return vals.names[static_cast<size_t>(n.inputs[i])]; };
  // Operand i in the dtype the op computes in (its result's, for the arithmetic families).
  const auto arg = [&](size_t i, DType d) { return as(f, vals, n.inputs[i], d); };
  switch (n.op) {
    // Every unary and binary row of the elementwise family, and the cells that fuse them.
#define DUET_UNARY(Name, name, math, doc) case OpId::Name:
#define DUET_BINARY(Name, name, doc) case OpId::Name:
#include "core/elementwise.def"
    case OpId::LstmCell:
    case OpId::LstmStep:
    case OpId::GruCell:
      return emit_arithmetic(f, vals, n);
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
    case OpId::LogSoftmax:
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
    case OpId::Conv2d:
    case OpId::Conv2dInputGrad:
      return emit_conv(f, in(0), in(1), n);
    case OpId::Attention:
      return emit_attention(f, vals, n);
    // Gradients: training graphs, which an inference model does not hold.
    case OpId::Conv2dWeightGrad:
    case OpId::AttentionBackward:
    case OpId::LstmCellBackward:
    case OpId::LstmStepBackward:
    case OpId::GruCellBackward:
      no_form(n);
    case OpId::MatMul:
      return emit(f, "MatMul", {in(0), in(1)});
    case OpId::Addmv:  // (Note [addmv] in core/ops/linalg.cpp)
      return emit(f, "Add", {emit(f, "MatMul", {in(1), in(2)}), in(0)});
    case OpId::Addmm:  // (Note [addmm] in core/ops/linalg.cpp): C broadcasts along the rows
      return emit(f, "Gemm", {in(1), in(2), in(0)});
    case OpId::Reshape:
    case OpId::OptimizationBarrier:
    case OpId::Permute:
    case OpId::Slice:
    case OpId::Select:
    case OpId::Expand:
      return emit_view(f, in(0), n);
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

// The views: each a copy in ONNX, whose values are immutable.
std::string Writer::emit_view(Frame& f, const std::string& x, const GraphNode& n) {
  switch (n.op) {
    case OpId::Reshape:
      return reshape(f, x, shape(f, detail::attr_dims(n.attrs)));
    case OpId::OptimizationBarrier:  // an order, which ONNX runtimes choose themselves
      return emit(f, "Identity", {x});
    case OpId::Permute: {
      // A 0-d tensor's permutation is empty, which an attribute of ints cannot hold.
      if (n.attrs.ints.size() == 0) return emit(f, "Identity", {x});
      const std::vector<int64_t> perm(n.attrs.ints.begin(), n.attrs.ints.end());
      return emit(f, "Transpose", {x}, [&](NodeProto& p) { attr_ints(p, "perm", perm); });
    }
    case OpId::Slice: {
      const SymAttrs* s = n.attrs.sym.get();
      const std::string start = size(f, s && s->start ? *s->start : SymInt(n.attrs.start));
      const std::string end = size(f, s && s->end ? *s->end : SymInt(n.attrs.end));
      return emit(f, "Slice", {x, start, end, ints(f, {n.attrs.dim}), ints(f, {n.attrs.step})});
    }
    case OpId::Select:  // a 0-d index drops the axis
      return emit(f, "Gather", {x, scalar(f, n.attrs.start, DType::i64)},
                  [&](NodeProto& p) { attr_int(p, "axis", n.attrs.dim); });
    case OpId::Expand:
      return emit(f, "Expand", {x, shape(f, detail::attr_dims(n.attrs))});
    default:
      throw InternalError(fmt::format("[export_onnx] {} is not a view", op_name(n.op)));
  }
}

std::string Writer::emit_reduce(Frame& f, Values& vals, const GraphNode& n) {
  const TensorMeta& x = vals.g.nodes[static_cast<size_t>(n.inputs[0])].meta;
  if (n.op == OpId::LogSoftmax) {  // (Note [log_softmax] in core/ops/nn.cpp)
    // In f32 for f16 and bf16, as the kernel computes; a 0-d input is x - x (0, or NaN).
    const DType out = n.meta.dtype, wide = is_low_precision(out) ? DType::f32 : out;
    const std::string xs = as(f, vals, n.inputs[0], wide);
    const std::string r =
        x.shape.size() == 0
            ? emit(f, "Sub", {xs, xs})
            : emit(f, "LogSoftmax", {xs}, [&](NodeProto& p) { attr_int(p, "axis", n.attrs.dim); });
    return wide == out ? r : cast(f, r, out);
  }
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
// conv2d as ONNX's Conv, the same cross-correlation (floating dtypes only; its output size is
// floor((H + 2p - d (k - 1) - 1) / s) + 1, as duet's); conv2d's input gradient, which
// conv_transpose2d is (Note [Transposed convolution] in core/ops/image.cpp), as ConvTranspose,
// with the same weight layout (C_in, C_out / group, kh, kw): the image's size beyond what the
// windows reach, (ho - 1) s - 2 p + d (k - 1) + 1, is its output padding.
std::string Writer::emit_conv(Frame& f, const std::string& x, const std::string& w,
                              const GraphNode& n) {
  if (!is_floating(n.meta.dtype)) no_form(n);
  const bool transposed = n.op == OpId::Conv2dInputGrad;
  const Window g(n.attrs);
  return emit(f, transposed ? "ConvTranspose" : "Conv", {x, w}, [&](NodeProto& p) {
    attr_ints(p, "kernel_shape", {g.kh, g.kw});
    attr_ints(p, "strides", {g.sh, g.sw});
    attr_ints(p, "pads", {g.ph, g.pw, g.ph, g.pw});
    if (g.dh != 1 || g.dw != 1) attr_ints(p, "dilations", {g.dh, g.dw});
    if (n.attrs.step != 1) attr_int(p, "group", n.attrs.step);
    if (!transposed) return;
    const int64_t oph = g.h - ((g.ho - 1) * g.sh - 2 * g.ph + g.span_h());
    const int64_t opw = g.w - ((g.wo - 1) * g.sw - 2 * g.pw + g.span_w());
    if (oph != 0 || opw != 0) attr_ints(p, "output_padding", {oph, opw});
  });
}

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
  return reshape(f, cols, shape(f, detail::meta_dims(n.meta)));
}

// col2im, unfold's adjoint: every column element added into its place in a zero padded plane
// (ScatterElements with reduction add sums the overlaps), then the padding cut off.
std::string Writer::emit_fold(Frame& f, const std::string& x, const GraphNode& n) {
  const Window w(n.attrs);
  const SymDims od = detail::meta_dims(n.meta);  // (N, C, H, W)
  const int64_t per_channel = w.kh * w.kw * w.ho * w.wo;
  const std::string cols = reshape(f, x, shape(f, {od[0], od[1], per_channel}));
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
  const std::string planes = reshape(f, sums, shape(f, {od[0], od[1], w.hp, w.wp}));
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
      emit(f, "Expand", {reshape(f, idx, ints(f, along)), emit(f, "Shape", {src})});
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

// Attention (Note [Attention] in core/ops/attention.cpp) as the composite it fuses, in its
// result's dtype: the scores, their softmax times v, and the rows' logsumexp as the last column.
std::string Writer::emit_attention(Frame& f, Values& vals, const GraphNode& n) {
  const DType d = n.meta.dtype;
  const auto arg = [&](size_t i, DType t) { return as(f, vals, n.inputs[i], t); };
  const SymDims qd = detail::meta_dims(vals.g.nodes[static_cast<size_t>(n.inputs[0])].meta);
  const SymDims kd = detail::meta_dims(vals.g.nodes[static_cast<size_t>(n.inputs[1])].meta);
  const int64_t rank = static_cast<int64_t>(qd.size());
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[static_cast<size_t>(i)] = i;
  std::swap(perm[static_cast<size_t>(rank - 1)], perm[static_cast<size_t>(rank - 2)]);
  const std::string kt =
      emit(f, "Transpose", {arg(1, d)}, [&](NodeProto& p) { attr_ints(p, "perm", perm); });
  std::string s = emit(f, "MatMul", {arg(0, d), kt});
  const double given = n.attrs.value.to<double>();
  const SymInt& e = qd.back();
  const std::string scale =
      given > 0 ? scalar(f, given, d)
      : e.is_concrete()
          ? scalar(f, 1 / std::sqrt(static_cast<double>(e.concrete())), d)
          : emit(f, "Reciprocal", {emit(f, "Sqrt", {cast(f, to_scalar(f, size(f, e)), d)})});
  s = emit(f, "Mul", {s, scale});
  const std::string ninf = scalar(f, -INFINITY, d);
  if (n.attrs.keepdim) {  // causal: keys j <= query i
    const auto range = [&](const SymInt& len) {
      return emit(f, "Range",
                  {scalar(f, 0, DType::i64), to_scalar(f, size(f, len)), scalar(f, 1, DType::i64)});
    };
    const std::string rows = emit(f, "Unsqueeze", {range(qd[qd.size() - 2]), ints(f, {1})});
    s = emit(f, "Where", {emit(f, "GreaterOrEqual", {rows, range(kd[kd.size() - 2])}), s, ninf});
  } else if (n.inputs.size() == 4) {
    const DType md = vals.g.nodes[static_cast<size_t>(n.inputs[3])].meta.dtype;
    s = md == DType::b8 ? emit(f, "Where", {arg(3, DType::b8), s, ninf})
                        : emit(f, "Add", {s, arg(3, d)});
  }
  const std::string p = emit(f, "Softmax", {s}, [](NodeProto& q) { attr_int(q, "axis", -1); });
  const std::string lse = emit(f, "ReduceLogSumExp", {s}, [](NodeProto& q) {
    attr_ints(q, "axes", {-1});
    attr_int(q, "keepdims", 1);
  });
  return emit(f, "Concat", {emit(f, "MatMul", {p, arg(2, d)}), lse},
              [](NodeProto& q) { attr_int(q, "axis", -1); });
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

}  // namespace duet::detail::onnx_export
