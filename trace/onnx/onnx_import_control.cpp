// ONNX import: the mappings of control flow (If, Loop, Scan) and recurrent layers (RNN, GRU,
// LSTM) (trace/onnx/onnx_import.h), written in duet's public ops like the others.
//
// Note [Imported control flow]
// Subgraphs (If's branches, Loop's and Scan's bodies) run through run_subgraph, in a scope
// inside the node's, so they read the enclosing graphs' values by name.
// - If: when the condition is data and both branches declare outputs of one static shape and
//   type each, it becomes duet::cond (traced, both branches go into the graph). Otherwise the
//   condition is read and only the chosen branch runs: compiled, that read is a guarded data
//   read (import sets guard_data_reads), so a call with the other value traces again.
// - Loop, eagerly, unrolls: the body runs once per iteration on the values the previous one
//   carried, so carried values may change shape between iterations as ONNX allows. Traced, it
//   becomes one construct whose body is traced once, so a graph's size does not grow with the
//   trip count:
//   - scan, when the trip count M is known at trace time (or is data and the loop has scan
//     outputs: then M is read, guarded) and the condition is known to hold at every iteration
//     (no condition input, or a known true one, and a body condition computed from constants
//     and its condition input alone). Scan outputs are scan's stacked results, and gradients
//     flow;
//   - while_loop over {iteration, condition, values...} otherwise: M and the condition stay
//     data, read in the graph, so a new trip count does not trace again. while_loop has no
//     per-iteration results and no gradient: when the loop has scan outputs or its results need
//     a gradient, the while_loop only counts the iterations, the count is read (guarded), and a
//     scan of that many iterations computes the results;
//   - unrolled, as eagerly, where neither can express the body: it reads a value computed in the
//     body (a Slice whose start is the iteration number) or changes a carried value's shape.
//     The trip count and the conditions are then read, guarded when they are data. A known
//     condition is read with the modes suspended: read as a guarded value, each iteration's
//     read evaluated the graph traced so far, and the trace took time quadratic in the trips.
// - Scan unrolls: a Scan's length is a shape, and each step runs the body again.
// - RNN, GRU and LSTM unroll over the sequence with matmul and the gates' activations, one
//   direction after the other; sequence_lens masks the steps past each batch entry's length
//   (the state stops changing, Y is zero there).
#include <algorithm>
#include <cctype>
#include <functional>
#include <optional>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/ops.h"
#include "trace/control_flow.h"
#include "trace/onnx/onnx_import.h"
#include "trace/onnx/onnx_proto.h"
#include "trace/tracer.h"

namespace duet::detail::onnx_import {

namespace {

using V = std::vector<Tensor>;

// x[i] along dim: the slice without that dim.
Tensor at(const Tensor& x, int64_t dim, int64_t i) { return squeeze(slice(x, dim, i, i + 1), dim); }

const onnx::GraphProto& graph_attr(const Node& n, const char* name) {
  const onnx::AttributeProto* a = n.attr(name);
  if (!a || a->type() != onnx::AttributeProto::GRAPH)
    n.fail(fmt::format("its attribute {} (a graph) is missing", name));
  return a->g();
}

V tensors(const std::vector<Value>& v) {
  V r;
  for (const Value& x : v) r.push_back(x.t);
  return r;
}

// The static shape and dtype of a subgraph output, or nullopt when it declares no full shape.
std::optional<std::pair<std::vector<int64_t>, DType>> static_type(const onnx::ValueInfoProto& v) {
  if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return std::nullopt;
  std::optional<DType> dt = onnx_io::dtype_of(v.type().tensor_type().elem_type());
  if (!dt) return std::nullopt;
  std::vector<int64_t> dims;
  for (const auto& d : v.type().tensor_type().shape().dim()) {
    if (!d.has_dim_value()) return std::nullopt;
    dims.push_back(d.dim_value());
  }
  return std::make_pair(dims, *dt);
}

// Per-iteration values stacked along a new dim `axis`; a scan of no iterations gives an empty
// tensor of the shape the body declares for them (an error when it declares none).
Tensor stack_steps(const Node& n, const V& steps, int64_t axis, const onnx::ValueInfoProto& decl) {
  if (!steps.empty()) return stack(steps, n.axis(axis, steps[0].dim() + 1));
  auto st = static_type(decl);
  if (!st)
    n.fail(fmt::format("it ran no iteration, and its body declares no static shape for \"{}\"",
                       decl.name()));
  std::vector<int64_t> dims = st->first;
  dims.insert(dims.begin() + n.axis(axis, static_cast<int64_t>(dims.size()) + 1), 0);
  return zeros(Shape(dims), Options().dtype(st->second));
}

// ---- If ----

// Whether both branches declare outputs of one static shape and dtype each (duet::cond's rule).
bool same_static_outputs(const onnx::GraphProto& a, const onnx::GraphProto& b) {
  if (a.output_size() != b.output_size()) return false;
  for (int i = 0; i < a.output_size(); ++i) {
    auto ta = static_type(a.output(i)), tb = static_type(b.output(i));
    if (!ta || !tb || *ta != *tb) return false;
  }
  return true;
}

V op_if(const Node& n) {
  const onnx::GraphProto& then_g = graph_attr(n, "then_branch");
  const onnx::GraphProto& else_g = graph_attr(n, "else_branch");
  if (n.in(0).numel() != 1)
    n.fail(fmt::format("its condition must hold one value, got shape {}", n.in(0).sizes()));
  if (!n.known(0) && same_static_outputs(then_g, else_g)) {
    auto branch = [&n](const onnx::GraphProto& g) {
      return [&n, &g](const V&) { return tensors(run_subgraph(n, g, {})); };
    };
    return cond(reshape(as(n.in(0), DType::b8), Shape{}), branch(then_g), branch(else_g), {});
  }
  return tensors(run_subgraph(n, n.number(0) != 0 ? then_g : else_g, {}));
}

// ---- Loop ----

// A scalar constant: made with the modes suspended, so that it is data even while tracing, as
// a known value must be (Note [Known values] in trace/onnx/onnx_import.cpp).
Tensor constant(Scalar v, DType d) {
  SuspendModes eager;
  return full(Shape{}, v, Options().dtype(d));
}

// The iteration number, exact (i64 through no double).
Tensor iteration(int64_t i) {
  SuspendModes eager;
  return reshape(i64s({i}), Shape{});
}

// A Loop node as its mappings see it: the body, its carried values and its scan outputs.
struct LoopSpec {
  const onnx::GraphProto* body = nullptr;
  size_t carried = 0, scans = 0;
};

// The dtype a body declares for one of its values (nullopt: none declared, or no duet dtype).
std::optional<DType> declared_dtype(const onnx::ValueInfoProto& v) {
  if (!v.type().has_tensor_type() || !v.type().tensor_type().has_elem_type()) return std::nullopt;
  return onnx_io::dtype_of(v.type().tensor_type().elem_type());
}

// Checks what can be checked before an iteration runs: the body's signature and the types of
// the carried values, which ONNX's type inference (and ONNX Runtime's) checks against the
// body's declared inputs.
LoopSpec loop_spec(const Node& n) {
  LoopSpec s;
  s.body = &graph_attr(n, "body");
  const onnx::GraphProto& body = *s.body;
  if (!n.has(0) && !n.has(1)) n.fail("it has neither a trip count nor a condition: it never ends");
  s.carried = n.size() > 2 ? n.size() - 2 : 0;
  if (static_cast<size_t>(body.input_size()) != 2 + s.carried)
    n.fail(
        fmt::format("its body takes {} inputs, not 2 + {} carried values (iteration number, "
                    "condition, carried values)",
                    body.input_size(), s.carried));
  if (static_cast<size_t>(body.output_size()) < 1 + s.carried)
    n.fail(fmt::format("its body computes {} outputs, fewer than 1 + {} carried values",
                       body.output_size(), s.carried));
  for (int k = 0; k < body.output_size(); ++k)
    if (body.output(k).name().empty())
      n.fail(fmt::format("its body's output {} ({}) has no name", k,
                         k == 0 ? "the condition" : "a carried value or scan output"));
  s.scans = static_cast<size_t>(body.output_size()) - 1 - s.carried;
  for (size_t k = 0; k < s.carried; ++k) {
    const onnx::ValueInfoProto& decl = body.input(static_cast<int>(2 + k));
    const std::optional<DType> want = declared_dtype(decl);
    const Tensor& v = n.in(2 + k);
    if (want && *want != v.dtype())
      throw DTypeError(fmt::format(
          "its carried value {} is {} {}, but its body declares that input (\"{}\") as {}: a "
          "loop-carried value keeps its type from one iteration to the next",
          k, v.dtype(), detail::hint_sizes(v), decl.name(), *want));
  }
  return s;
}

// The one value of v as a truth value: read with the modes suspended when v is known (data even
// inside a traced body), else a guarded data read; `what` names v in the error when it does not
// hold exactly one value.
bool truth(const Node& n, const Value& v, const std::string& what) {
  if (detail::hint_sizes(v.t).numel() != 1)
    n.fail(fmt::format("{} must hold one value, got shape {}", what, detail::hint_sizes(v.t)));
  auto read = [&v] { return v.t.to(Device::cpu()).to(DType::f64).to_vector<double>()[0] != 0; };
  if (!v.known) return read();
  SuspendModes eager;
  return read();
}

std::string body_condition(const LoopSpec& s) {
  return fmt::format("its body's condition \"{}\"", s.body->output(0).name());
}

// The trip count M (a guarded data read when M is data).
int64_t trip_count(const Node& n) {
  // Read as integers: exporters write INT64_MAX for "no bound", which a double cannot hold.
  const std::vector<int64_t> m = n.ints(0);
  if (m.size() != 1) n.fail(fmt::format("its trip count holds {} values, not one", m.size()));
  return m[0];
}

// One run of the body: {condition, carried values..., scan outputs...}, the carried values
// checked to keep their dtypes.
std::vector<Value> run_body(const Node& n, const LoopSpec& s, Value i, Value cond,
                            std::vector<Value> state) {
  std::vector<Value> in{std::move(i), std::move(cond)};
  in.insert(in.end(), state.begin(), state.end());
  std::vector<Value> out = run_subgraph(n, *s.body, std::move(in));
  for (size_t k = 0; k < s.carried; ++k)
    if (out[1 + k].t.dtype() != state[k].t.dtype())
      throw DTypeError(fmt::format(
          "its body turns carried value {} (\"{}\") from {} into {}: a loop-carried value keeps "
          "its type from one iteration to the next",
          k, s.body->output(static_cast<int>(1 + k)).name(), state[k].t.dtype(),
          out[1 + k].t.dtype()));
  return out;
}

// The Loop unrolled: the trip count and the condition are read (guarded when they are data)
// and the body runs once per iteration, on the values the previous one carried, so carried
// values may change shape between iterations.
V loop_unrolled(const Node& n, const LoopSpec& s) {
  const int64_t trips = n.has(0) ? trip_count(n) : INT64_MAX;
  bool go = !n.has(1) || truth(n, {n.in(1), n.known(1)}, "its condition");
  std::vector<Value> state;
  for (size_t i = 2; i < n.size(); ++i) state.push_back({n.in(i), n.known(i)});
  std::vector<V> ys(s.scans);
  for (int64_t i = 0; i < trips && go; ++i) {
    std::vector<Value> out =
        run_body(n, s, {iteration(i), true}, {constant(true, DType::b8), true}, state);
    if (n.has(1)) go = truth(n, out[0], body_condition(s));
    state.assign(out.begin() + 1, out.begin() + 1 + static_cast<int64_t>(s.carried));
    for (size_t k = 0; k < s.scans; ++k) ys[k].push_back(out[1 + s.carried + k].t);
  }
  V r = tensors(state);
  for (size_t k = 0; k < s.scans; ++k)
    r.push_back(stack_steps(n, ys[k], 0, s.body->output(static_cast<int>(1 + s.carried + k))));
  return r;
}

// Thrown out of a traced body when its condition depends on data, where the mapping assumed it
// does not: the loop is then mapped onto while_loop.
struct DynamicCondition {};

// The Loop as duet::scan over `trips` iterations, carrying {iteration number, values...} and
// stacking the scan outputs. With `condition_known`, the body's condition (when the node has a
// condition) must be known to hold at every iteration (computed from constants and the
// condition input, which is true while the body runs), else
// DynamicCondition; without, its value is ignored: the trip count was counted with it.
V loop_scan(const Node& n, const LoopSpec& s, int64_t trips, bool condition_known) {
  V init{iteration(0)};
  for (size_t k = 0; k < s.carried; ++k) init.push_back(n.in(2 + k));
  // Only its length is read: a scalar broadcast, no memory per iteration.
  const Tensor steps = expand(constant(false, DType::b8), Shape{trips});
  Fn step = [&n, &s, condition_known](const V& in) {
    std::vector<Value> state;
    for (size_t k = 0; k < s.carried; ++k) state.push_back({in[1 + k], false});
    std::vector<Value> out =
        run_body(n, s, {in[0], false}, {constant(true, DType::b8), true}, std::move(state));
    if (n.has(1)) {
      if (detail::hint_sizes(out[0].t).numel() != 1)
        n.fail(fmt::format("{} must hold one value, got shape {}", body_condition(s),
                           detail::hint_sizes(out[0].t)));
      if (condition_known && !(out[0].known && truth(n, out[0], body_condition(s))))
        throw DynamicCondition{};
    }
    V r{as(in[0] + 1, DType::i64)};
    for (size_t k = 1; k < out.size(); ++k) r.push_back(out[k].t);
    return r;
  };
  V r = scan(step, init, {steps});
  return V(r.begin() + 1, r.end());
}

// Thrown out of a traced body that would loop forever; op_loop raises it as the node's error
// (unrolling would not end).
struct NeverEnds {
  std::string why;
};

// Both one-element b8 tensors hold.
Tensor both(const Tensor& a, const Tensor& b) {
  return eq(as(a, DType::i32) + as(b, DType::i32), 2);
}

// The Loop as duet::while_loop over {iteration number, condition, values...}, while the
// iteration number is below M (when given) and the condition holds (when given). M and the
// condition may be data: they are read in the graph, not at trace time. Returns the final
// state; the scan outputs are not computed.
V loop_while(const Node& n, const LoopSpec& s) {
  Tensor bound;
  if (n.has(0)) {
    if (detail::hint_sizes(n.in(0)).numel() != 1)
      n.fail(fmt::format("its trip count must hold one value, got shape {}",
                         detail::hint_sizes(n.in(0))));
    bound = n.known(0) ? iteration(trip_count(n)) : reshape(as(n.in(0), DType::i64), Shape{});
  }
  Tensor go = constant(true, DType::b8);
  if (n.has(1)) {
    if (detail::hint_sizes(n.in(1)).numel() != 1)
      n.fail(fmt::format("its condition must hold one value, got shape {}",
                         detail::hint_sizes(n.in(1))));
    go = reshape(as(n.in(1), DType::b8), Shape{});
  }
  V init{iteration(0), go};
  for (size_t k = 0; k < s.carried; ++k) init.push_back(n.in(2 + k));
  Fn cond_fn = [bound](const V& st) {
    return V{bound.defined() ? both(lt(st[0], bound), st[1]) : st[1]};
  };
  Fn body_fn = [&n, &s](const V& st) {
    std::vector<Value> state;
    for (size_t k = 0; k < s.carried; ++k) state.push_back({st[2 + k], false});
    std::vector<Value> out = run_body(n, s, {st[0], false}, {st[1], false}, std::move(state));
    Tensor go = st[1];
    if (n.has(1)) {
      if (detail::hint_sizes(out[0].t).numel() != 1)
        n.fail(fmt::format("{} must hold one value, got shape {}", body_condition(s),
                           detail::hint_sizes(out[0].t)));
      // The condition input itself (true while the body runs), or a known true: for ever.
      if (!n.has(0) &&
          (out[0].t.is_same(st[1]) || (out[0].known && truth(n, out[0], body_condition(s)))))
        throw NeverEnds{fmt::format("it has no trip count, and {} is always true: it never ends",
                                    body_condition(s))};
      go = reshape(as(out[0].t, DType::b8), Shape{});
    }
    V r{as(st[0] + 1, DType::i64), go};
    for (size_t k = 0; k < s.carried; ++k) r.push_back(out[1 + k].t);
    return r;
  };
  return while_loop(cond_fn, body_fn, init);
}

// The Loop traced (Note [Imported control flow]), or nullopt where unrolling is the mapping.
std::optional<V> loop_traced(const Node& n, const LoopSpec& s) {
  if (n.has(1) && n.known(1) && !truth(n, {n.in(1), n.known(1)}, "its condition"))
    return std::nullopt;
  const bool condition_known = !n.has(1) || n.known(1);
  if (condition_known && n.has(0) && (n.known(0) || s.scans > 0)) {
    const int64_t trips = trip_count(n);  // a guarded read when M is data
    if (trips <= 0) return std::nullopt;
    try {
      return loop_scan(n, s, trips, true);
    } catch (const DynamicCondition&) {
    }
  }
  const V w = loop_while(n, s);
  V out(w.begin() + 2, w.end());
  bool grad = false;
  for (const Tensor& t : out) grad = grad || t.requires_grad();
  if (s.scans == 0 && !grad) return out;
  // Scan outputs, or a gradient (while_loop has none): count the iterations, then scan them.
  const int64_t trips = w[0].to(Device::cpu()).to_vector<int64_t>()[0];  // a guarded read
  if (trips <= 0) return std::nullopt;
  return loop_scan(n, s, trips, false);
}

// Loop(M, cond, v...): the body (iteration, cond, v...) -> (cond, v..., scan outputs...) runs
// while the iteration is below M (when given) and cond holds (when given; the body's cond is
// ignored otherwise, as the specification says). Eagerly it unrolls; traced, it becomes scan or
// while_loop where they can express it (Note [Imported control flow]).
V op_loop(const Node& n) {
  const LoopSpec s = loop_spec(n);
  if (detail::Tracer::current()) {
    try {
      if (std::optional<V> r = loop_traced(n, s)) return *r;
    } catch (const NeverEnds& e) {
      n.fail(e.why);
    } catch (const InternalError&) {
      throw;
    } catch (const Error&) {
      // A body that reads a value computed in it, or whose carried values change shape: what
      // scan and while_loop cannot express. Unrolling reports the model's own errors again.
    }
  }
  return loop_unrolled(n, s);
}

// ---- Scan ----

struct ScanResult {
  std::vector<Value> state;
  std::vector<V> ys;  // per scan output, its per-step values in step order
};

// Runs body over the steps of xs (step t reads xs[k][t] along dim 0, from the end when
// reversed[k]), carrying state.
ScanResult scan_steps(const Node& n, const onnx::GraphProto& body, std::vector<Value> state,
                      const V& xs, const std::vector<bool>& reversed) {
  const int64_t len = xs.at(0).size(0);
  for (const Tensor& x : xs)
    if (x.size(0) != len)
      n.fail(fmt::format("its scan inputs have lengths {} and {}", len, x.size(0)));
  const size_t outs = static_cast<size_t>(body.output_size());
  if (outs < state.size())
    n.fail(
        fmt::format("its body computes {} outputs, fewer than its {} states", outs, state.size()));
  ScanResult r;
  r.ys.resize(outs - state.size());
  r.state = std::move(state);
  for (int64_t t = 0; t < len; ++t) {
    std::vector<Value> in = r.state;
    for (size_t k = 0; k < xs.size(); ++k)
      in.push_back({at(xs[k], 0, reversed[k] ? len - 1 - t : t), false});
    std::vector<Value> out = run_subgraph(n, body, std::move(in));
    const size_t s = r.state.size();
    r.state.assign(out.begin(), out.begin() + static_cast<int64_t>(s));
    for (size_t k = 0; k < r.ys.size(); ++k) r.ys[k].push_back(out[s + k].t);
  }
  return r;
}

// The directions attribute `name` (0 forward, 1 reverse), one per entry, 0 when absent.
std::vector<bool> directions(const Node& n, const char* name, size_t count) {
  std::vector<int64_t> d = n.attr_ints(name);
  if (d.empty()) d.assign(count, 0);
  if (d.size() != count)
    n.fail(fmt::format("its attribute {} has {} values for {} tensors", name, d.size(), count));
  std::vector<bool> r;
  for (int64_t v : d) {
    if (v != 0 && v != 1) n.fail(fmt::format("its attribute {} holds {} (0 or 1)", name, v));
    r.push_back(v == 1);
  }
  return r;
}

// Scan 8: sequence_lens, then states and scan inputs with a batch dim first (scan dim 1); each
// batch entry is scanned on its own and the results stacked.
V op_scan8(const Node& n, const onnx::GraphProto& body) {
  const int64_t m = n.attr_i("num_scan_inputs", 0);
  if (m < 1 || static_cast<size_t>(m) + 1 > n.size())
    n.fail(fmt::format("num_scan_inputs is {} for {} inputs", m, n.size()));
  const size_t states = n.size() - 1 - static_cast<size_t>(m);
  const std::vector<bool> rev = directions(n, "directions", static_cast<size_t>(m));
  const int64_t batch = n.in(1).size(0), len = n.in(1 + states).size(1);
  if (n.has(0))
    for (int64_t l : n.ints(0))
      if (l != len)
        n.fail(fmt::format("sequence_lens holds {}: duet scans whole sequences only ({})", l, len));
  std::vector<V> finals(states), ys;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Value> state;
    V xs;
    for (size_t i = 0; i < states; ++i) state.push_back({at(n.in(1 + i), 0, b), false});
    for (size_t i = 1 + states; i < n.size(); ++i) xs.push_back(at(n.in(i), 0, b));
    ScanResult r = scan_steps(n, body, std::move(state), xs, rev);
    for (size_t i = 0; i < states; ++i) finals[i].push_back(r.state[i].t);
    ys.resize(r.ys.size());
    for (size_t k = 0; k < r.ys.size(); ++k)
      ys[k].push_back(stack_steps(n, r.ys[k], 0, body.output(static_cast<int>(states + k))));
  }
  V out;
  for (const V& f : finals) out.push_back(stack(f, 0));
  for (const V& y : ys) out.push_back(stack(y, 0));
  return out;
}

// Scan 9 and later: no batch dim; each scan input and output has its own axis and direction.
V op_scan(const Node& n) {
  const onnx::GraphProto& body = graph_attr(n, "body");
  if (n.opset() < 9) return op_scan8(n, body);
  const int64_t m = n.attr_i("num_scan_inputs", 0);
  if (m < 1 || static_cast<size_t>(m) > n.size())
    n.fail(fmt::format("num_scan_inputs is {} for {} inputs", m, n.size()));
  const size_t states = n.size() - static_cast<size_t>(m);
  std::vector<int64_t> in_axes = n.attr_ints("scan_input_axes");
  if (in_axes.empty()) in_axes.assign(static_cast<size_t>(m), 0);
  if (in_axes.size() != static_cast<size_t>(m))
    n.fail(fmt::format("scan_input_axes has {} values for {} scan inputs", in_axes.size(), m));
  std::vector<Value> state;
  for (size_t i = 0; i < states; ++i) state.push_back({n.in(i), n.known(i)});
  V xs;
  for (size_t k = 0; k < in_axes.size(); ++k) {  // each with its scan axis first
    const Tensor& x = n.in(states + k);
    const int64_t a = n.axis(in_axes[k], x.dim());
    std::vector<int64_t> p{a};
    for (int64_t d = 0; d < x.dim(); ++d)
      if (d != a) p.push_back(d);
    xs.push_back(permute(x, Dims(p)));
  }
  ScanResult r =
      scan_steps(n, body, std::move(state), xs, directions(n, "scan_input_directions", xs.size()));
  std::vector<int64_t> out_axes = n.attr_ints("scan_output_axes");
  if (out_axes.empty()) out_axes.assign(r.ys.size(), 0);
  if (out_axes.size() != r.ys.size())
    n.fail(fmt::format("scan_output_axes has {} values for {} scan outputs", out_axes.size(),
                       r.ys.size()));
  const std::vector<bool> out_rev = directions(n, "scan_output_directions", r.ys.size());
  V out = tensors(r.state);
  for (size_t k = 0; k < r.ys.size(); ++k) {
    if (out_rev[k]) std::reverse(r.ys[k].begin(), r.ys[k].end());  // prepended per step
    out.push_back(stack_steps(n, r.ys[k], out_axes[k], body.output(static_cast<int>(states + k))));
  }
  return out;
}

// ---- RNN, GRU, LSTM ----

// An activation of a recurrent layer: its name in lower case, and its alpha and beta.
struct Act {
  std::string name;
  double alpha = 0, beta = 0;
};

struct ActSpec {
  const char* name;  // lower case
  bool alpha, beta;  // whether it consumes activation_alpha / activation_beta values
  double default_alpha, default_beta;
};
constexpr ActSpec kActs[] = {
    {"relu", false, false, 0, 0},        {"tanh", false, false, 0, 0},
    {"sigmoid", false, false, 0, 0},     {"affine", true, true, 1, 0},
    {"leakyrelu", true, false, 0.01, 0}, {"thresholdedrelu", true, false, 1, 0},
    {"scaledtanh", true, true, 1, 1},    {"hardsigmoid", true, true, 0.2, 0.5},
    {"elu", true, false, 1, 0},          {"softsign", false, false, 0, 0},
    {"softplus", false, false, 0, 0},
};

// The layer's activations, `per` for each direction (defaults when the node names none). The
// alpha and beta values are consumed in order by the activations that take them.
std::vector<Act> activations(const Node& n, const std::vector<std::string>& defaults,
                             int64_t dirs) {
  std::vector<std::string> names;
  if (const onnx::AttributeProto* a = n.attr("activations"))
    names.assign(a->strings().begin(), a->strings().end());
  const size_t per = defaults.size(), all = per * static_cast<size_t>(dirs);
  if (names.empty())
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  if (names.size() == per && dirs == 2) names.insert(names.end(), names.begin(), names.end());
  if (names.size() != all)
    n.fail(fmt::format("it names {} activations, {} expected ({} per direction)", names.size(), all,
                       per));
  const std::vector<float> alphas = n.attr_floats("activation_alpha");
  const std::vector<float> betas = n.attr_floats("activation_beta");
  size_t ia = 0, ib = 0;
  std::vector<Act> r;
  for (std::string name : names) {
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    const ActSpec* spec = nullptr;
    for (const ActSpec& s : kActs)
      if (name == s.name) spec = &s;
    if (!spec) n.fail(fmt::format("duet maps no recurrent activation \"{}\"", name));
    Act a{name, spec->default_alpha, spec->default_beta};
    if (spec->alpha && ia < alphas.size()) a.alpha = alphas[ia++];
    if (spec->beta && ib < betas.size()) a.beta = betas[ib++];
    r.push_back(a);
  }
  return r;
}

Tensor apply(const Act& a, const Tensor& x) {
  const std::string& f = a.name;
  if (f == "relu") return relu(x);
  if (f == "tanh") return tanh(x);
  if (f == "sigmoid") return sigmoid(x);
  if (f == "affine") return x * a.alpha + a.beta;
  if (f == "leakyrelu") return as(where(x < 0, x * a.alpha, x), x.dtype());
  if (f == "thresholdedrelu") return as(where(x > a.alpha, x, 0.0), x.dtype());
  if (f == "scaledtanh") return tanh(x * a.beta) * a.alpha;
  if (f == "hardsigmoid") return clamp(x * a.alpha + a.beta, 0.0, 1.0);
  if (f == "elu") return as(where(x > 0, x, expm1(x) * a.alpha), x.dtype());
  if (f == "softsign") return x / (abs(x) + 1);
  return softplus(x);
}

// What RNN, GRU and LSTM share: the inputs, sequence first, and the attributes.
struct Recurrent {
  Tensor x;        // (seq, batch, input)
  Tensor w, r, b;  // (dirs, G*H, input), (dirs, G*H, H), (dirs, 2*G*H): zeros when omitted
  Tensor lens;     // (batch), undefined when omitted
  Tensor h0, c0;   // (dirs, batch, H); c0 for LSTM only
  int64_t gates = 1, hidden = 0, dirs = 1;
  bool reverse = false, batch_first = false;
  double clip = 0;  // 0: none
  std::vector<Act> acts;

  // An activation input, clipped when the layer clips; f: activation k of direction d on it.
  Tensor clipped(const Tensor& v) const { return clip > 0 ? clamp(v, -clip, clip) : v; }
  Tensor f(int64_t d, size_t k, const Tensor& v) const {
    return apply(acts[static_cast<size_t>(d) * (acts.size() / static_cast<size_t>(dirs)) + k],
                 clipped(v));
  }
};

// An initial state input (dirs, batch, H), or batch first (batch, dirs, H); zeros when omitted.
Tensor initial_state(const Node& n, size_t i, const Recurrent& a) {
  if (!n.has(i)) return zeros({a.dirs, a.x.size(1), a.hidden}, like(a.x));
  return a.batch_first ? transpose(n.in(i), 0, 1) : n.in(i);
}

Recurrent recurrent(const Node& n, int64_t gates, const std::vector<std::string>& default_acts) {
  Recurrent a;
  a.gates = gates;
  const std::string dir = n.attr_s("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    n.fail(fmt::format("direction \"{}\" is none of forward, reverse, bidirectional", dir));
  a.dirs = dir == "bidirectional" ? 2 : 1;
  a.reverse = dir == "reverse";
  const int64_t layout = n.attr_i("layout", 0);
  if (layout != 0 && layout != 1) n.fail(fmt::format("layout {} is neither 0 nor 1", layout));
  a.batch_first = layout == 1;
  if (n.in(0).dim() != 3) n.fail(fmt::format("X has shape {}, not 3 dims", n.in(0).sizes()));
  a.x = a.batch_first ? transpose(n.in(0), 0, 1) : n.in(0);
  a.w = n.in(1);
  a.r = n.in(2);
  if (a.r.dim() != 3 || a.w.dim() != 3 || a.w.size(0) != a.dirs || a.r.size(0) != a.dirs)
    n.fail(
        fmt::format("W {} and R {} do not fit {} direction(s)", a.w.sizes(), a.r.sizes(), a.dirs));
  a.hidden = a.r.size(2);
  if (n.attr_i("hidden_size", a.hidden) != a.hidden || a.r.size(1) != gates * a.hidden)
    n.fail(fmt::format("R has shape {}, hidden_size is {}", a.r.sizes(),
                       n.attr_i("hidden_size", a.hidden)));
  a.b = n.has(3) ? n.in(3) : zeros({a.dirs, 2 * gates * a.hidden}, like(a.x));
  if (n.has(4)) a.lens = n.in(4);
  a.h0 = initial_state(n, 5, a);
  a.clip = n.attr_f("clip", 0);
  if (n.has_attr("clip") && !(a.clip > 0))
    n.fail(fmt::format("clip is {}: a threshold must be positive", a.clip));
  a.acts = activations(n, default_acts, a.dirs);
  return a;
}

// One direction's step: from x_t W^T + Wb (batch, G*H) and the state {h, c}, the next state.
using Cell = std::function<std::pair<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&)>;
// The cell of direction d.
using MakeCell = std::function<Cell(int64_t d)>;

// Unrolls the layer: {Y, Y_h, Y_c} (Y_c undefined without c0), in the node's layout.
V unroll(const Recurrent& a, const MakeCell& make_cell) {
  const int64_t seq = a.x.size(0), gh = a.gates * a.hidden;
  V ys, hs, cs;
  for (int64_t d = 0; d < a.dirs; ++d) {
    const Cell cell = make_cell(d);
    const bool rev = a.reverse || d == 1;
    // Every step's input projection in one matmul.
    const Tensor xw = matmul(a.x, transpose(at(a.w, 0, d), 0, 1)) + slice(at(a.b, 0, d), 0, 0, gh);
    Tensor h = at(a.h0, 0, d), c = a.c0.defined() ? at(a.c0, 0, d) : Tensor();
    V y(static_cast<size_t>(seq));
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t t = rev ? seq - 1 - s : s;
      auto [h2, c2] = cell(at(xw, 0, t), h, c);
      Tensor yt = h2;
      if (a.lens.defined()) {  // entries whose sequence ended keep their state, and output 0
        const Tensor live = unsqueeze(lt(static_cast<double>(t), a.lens), 1);
        h2 = where(live, h2, h);
        if (c.defined()) c2 = where(live, c2, c);
        yt = as(where(live, h2, 0.0), h2.dtype());
      }
      y[static_cast<size_t>(t)] = yt;
      h = h2;
      c = c2;
    }
    ys.push_back(stack(y, 0));
    hs.push_back(h);
    if (c.defined()) cs.push_back(c);
  }
  Tensor y = stack(ys, 1), yh = stack(hs, 0);  // (seq, dirs, batch, H), (dirs, batch, H)
  Tensor yc = cs.empty() ? Tensor() : stack(cs, 0);
  if (a.batch_first) {
    y = permute(y, Dims({2, 0, 1, 3}));
    yh = transpose(yh, 0, 1);
    if (yc.defined()) yc = transpose(yc, 0, 1);
  }
  return {y, yh, yc};
}

// RNN: h = f(x W^T + h R^T + Wb + Rb).
V op_rnn(const Node& n) {
  const Recurrent a = recurrent(n, 1, {"Tanh"});
  return unroll(a, [&a](int64_t d) -> Cell {
    const Tensor rt = transpose(at(a.r, 0, d), 0, 1);
    const Tensor rb = slice(at(a.b, 0, d), 0, a.hidden, 2 * a.hidden);
    return [&a, d, rt, rb](const Tensor& xw, const Tensor& h, const Tensor&) {
      return std::make_pair(a.f(d, 0, xw + matmul(h, rt) + rb), Tensor());
    };
  });
}

// GRU, gates z, r, h: z, r = f(...); h~ = g(x Wh^T + (r * h) Rh^T + Rbh + Wbh), or with
// linear_before_reset g(x Wh^T + r * (h Rh^T + Rbh) + Wbh); h' = (1 - z) * h~ + z * h.
V op_gru(const Node& n) {
  const Recurrent a = recurrent(n, 3, {"Sigmoid", "Tanh"});
  const bool linear = n.attr_i("linear_before_reset", 0) != 0;
  const int64_t hs = a.hidden;
  return unroll(a, [&a, linear, hs](int64_t d) -> Cell {
    const Tensor r = at(a.r, 0, d), rb = slice(at(a.b, 0, d), 0, 3 * hs, 6 * hs);
    const Tensor rt_zr = transpose(slice(r, 0, 0, 2 * hs), 0, 1);
    const Tensor rt_h = transpose(slice(r, 0, 2 * hs, 3 * hs), 0, 1);
    const Tensor rb_zr = slice(rb, 0, 0, 2 * hs), rb_h = slice(rb, 0, 2 * hs, 3 * hs);
    return [&a, d, linear, hs, rt_zr, rt_h, rb_zr, rb_h](const Tensor& xw, const Tensor& h,
                                                         const Tensor&) {
      const Tensor zr = slice(xw, 1, 0, 2 * hs) + matmul(h, rt_zr) + rb_zr;
      const Tensor z = a.f(d, 0, slice(zr, 1, 0, hs)), r = a.f(d, 0, slice(zr, 1, hs, 2 * hs));
      const Tensor xh = slice(xw, 1, 2 * hs, 3 * hs);
      const Tensor ht = linear ? a.f(d, 1, xh + r * (matmul(h, rt_h) + rb_h))
                               : a.f(d, 1, xh + matmul(r * h, rt_h) + rb_h);
      return std::make_pair((1 - z) * ht + z * h, Tensor());
    };
  });
}

// LSTM, gates i, o, f, c, peepholes P (i, o, f): i = f(... + Pi * c), f = f(... + Pf * c) (or
// 1 - i with input_forget), c' = f * c + i * g(...), o = f(... + Po * c'), h' = o * h(c').
V op_lstm(const Node& n) {
  Recurrent a = recurrent(n, 4, {"Sigmoid", "Tanh", "Tanh"});
  a.c0 = initial_state(n, 6, a);
  const Tensor p = n.has(7) ? n.in(7) : zeros({a.dirs, 3 * a.hidden}, like(a.x));
  const bool couple = n.attr_i("input_forget", 0) != 0;
  const int64_t hs = a.hidden;
  V out = unroll(a, [&a, &p, couple, hs](int64_t d) -> Cell {
    const Tensor rt = transpose(at(a.r, 0, d), 0, 1);
    const Tensor rb = slice(at(a.b, 0, d), 0, 4 * hs, 8 * hs), pd = at(p, 0, d);
    const Tensor pi = slice(pd, 0, 0, hs), po = slice(pd, 0, hs, 2 * hs);
    const Tensor pf = slice(pd, 0, 2 * hs, 3 * hs);
    return [&a, d, couple, hs, rt, rb, pi, po, pf](const Tensor& xw, const Tensor& h,
                                                   const Tensor& c) {
      const Tensor g = xw + matmul(h, rt) + rb;
      auto gate = [&](int64_t k) { return slice(g, 1, k * hs, (k + 1) * hs); };
      const Tensor i = a.f(d, 0, gate(0) + pi * c);
      const Tensor f = couple ? 1 - i : a.f(d, 0, gate(2) + pf * c);
      const Tensor c2 = f * c + i * a.f(d, 1, gate(3));
      const Tensor o = a.f(d, 0, gate(1) + po * c2);
      return std::make_pair(o * apply(a.acts[static_cast<size_t>(d) * 3 + 2], c2), c2);
    };
  });
  return out;
}

}  // namespace

namespace {

// ONNX element types by value name, as a graph and the graphs around it declare them.
using Declared = std::unordered_map<std::string, int32_t>;

void declare(Declared& d, const onnx::ValueInfoProto& v) {
  if (v.type().has_tensor_type() && v.type().tensor_type().has_elem_type())
    d[v.name()] = v.type().tensor_type().elem_type();
}

void check_loops(const onnx::GraphProto& g, Declared declared, int opset) {
  for (const onnx::ValueInfoProto& v : g.input()) declare(declared, v);
  for (const onnx::ValueInfoProto& v : g.value_info()) declare(declared, v);
  for (const onnx::TensorProto& t : g.initializer()) declared[t.name()] = t.data_type();
  for (const onnx::NodeProto& n : g.node()) {
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (a.type() == onnx::AttributeProto::GRAPH) check_loops(a.g(), declared, opset);
      for (const onnx::GraphProto& sub : a.graphs()) check_loops(sub, declared, opset);
      if (n.op_type() != "Loop" || a.name() != "body" || a.type() != onnx::AttributeProto::GRAPH)
        continue;
      for (int k = 2; k < n.input_size() && k < a.g().input_size(); ++k) {
        const onnx::ValueInfoProto& decl = a.g().input(k);
        auto outer = declared.find(n.input(k));
        if (outer == declared.end() || !decl.type().has_tensor_type()) continue;
        const std::optional<DType> got = onnx_io::dtype_of(outer->second);
        const std::optional<DType> want = onnx_io::dtype_of(decl.type().tensor_type().elem_type());
        if (got && want && *got != *want)
          throw DTypeError(fmt::format(
              "[import_onnx] node \"{}\" (Loop, opset {}): its carried value {} (\"{}\") is "
              "declared {}, but its body declares that input (\"{}\") as {}: a loop-carried "
              "value keeps its type from one iteration to the next",
              n.name().empty() && n.output_size() ? n.output(0) : n.name(), opset, k - 2,
              n.input(k), *got, decl.name(), *want));
      }
    }
  }
}

}  // namespace

void check_loop_types(const onnx::GraphProto& g, int opset) { check_loops(g, {}, opset); }

std::vector<OpEntry> control_ops() {
  return {
      {"GRU", op_gru},   {"If", op_if},   {"LSTM", op_lstm},
      {"Loop", op_loop}, {"RNN", op_rnn}, {"Scan", op_scan},
  };
}

}  // namespace duet::detail::onnx_import
