// Structured control flow: Note [Control flow] in trace/control_flow.h.
#include "trace/control_flow.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/dispatch.h"
#include "core/ops.h"
#include "eager/autograd.h"
#include "eager/node.h"
#include "trace/tracer.h"

namespace duet {
namespace {

// "f32 (2, 3), i64 ()" for messages.
std::string metas_str(const std::vector<Tensor>& ts) {
  std::string s;
  for (const Tensor& t : ts) {
    if (!s.empty()) s += ", ";
    s += t.defined() ? fmt::format("{} {}", t.dtype(), detail::dims_str(detail::sym_dims(t)))
                     : std::string("undefined");
  }
  return s.empty() ? "nothing" : s;
}

void check_defined(const char* op, const char* what, const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i)
    DUET_CHECK_T(ts[i].defined(), ValueError, "[{}] {} {} is an undefined tensor", op, what, i);
}

void check_pred(const char* op, const Tensor& pred) {
  DUET_CHECK_T(pred.defined(), ValueError, "[{}] the predicate is an undefined tensor", op);
  DUET_CHECK_T(
      pred.dtype() == DType::b8 &&
          detail::sym_decide(detail::sym_numel(detail::sym_dims(pred)), detail::SymRel::Eq, 1, op),
      ValueError, "[{}] the predicate must be a one-element b8 tensor, got {} {}", op, pred.dtype(),
      detail::dims_str(detail::sym_dims(pred)));
}

// Whether two shapes are equal (sizes compared symbolically, with guards where needed).
bool same_dims(const SymDims& a, const SymDims& b, const char* op) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!detail::sym_decide(a[i], detail::SymRel::Eq, b[i], op)) return false;
  return true;
}

// How a construct's results differ from what they must match: not at all, in dtypes only (an
// autocast scope's product inside a branch gives the low dtype), or in count or shapes.
enum class Mismatch : uint8_t { None, DTypes, Shapes };

// Throws for a mismatch: a DTypeError when only dtypes differ, else a ShapeError, with the
// message `message()` makes (only then: a trace that matches formats nothing).
template <class F>
void check_match(Mismatch m, F&& message) {
  DUET_CHECK_T(m != Mismatch::DTypes, DTypeError, "{}", message());
  DUET_CHECK_T(m != Mismatch::Shapes, ShapeError, "{}", message());
}

// Whether got has the count, shapes and dtypes of want; else an error naming both.
void check_like(const char* op, const char* what, const std::vector<Tensor>& want,
                const std::vector<Tensor>& got, size_t count) {
  Mismatch m = got.size() >= count && want.size() >= count ? Mismatch::None : Mismatch::Shapes;
  for (size_t i = 0; m != Mismatch::Shapes && i < count; ++i) {
    if (!got[i].defined() || !same_dims(detail::sym_dims(got[i]), detail::sym_dims(want[i]), op))
      m = Mismatch::Shapes;
    else if (got[i].dtype() != want[i].dtype())
      m = Mismatch::DTypes;
  }
  check_match(m, [&] {
    return fmt::format("[{}] {}: expected {}, got {}", op, what,
                       metas_str(std::vector<Tensor>(want.begin(), want.begin() + count)),
                       metas_str(got));
  });
}

using detail::GradModeScope;

const OpDef& node_def(ControlKind k) {
  static const OpDef cond_def = detail::opaque_node_def("cond");
  static const OpDef scan_def = detail::opaque_node_def("scan");
  static const OpDef while_def = detail::opaque_node_def("while_loop");
  return k == ControlKind::Cond ? cond_def : k == ControlKind::Scan ? scan_def : while_def;
}

TensorMeta meta_of(const Tensor& t) {
  const detail::TensorImpl* x = t.impl();
  return {x->shape, x->dtype, x->device(), x->sym};
}

Tensor zeros_like(const Tensor& t) {
  return detail::full_dims(detail::sym_dims(t), 0, Options().dtype(t.dtype()).device(t.device()));
}

// A meta with a leading dim of `length` added (stacked results), or dim 0 removed (one step).
TensorMeta with_leading(TensorMeta m, const SymInt& length) {
  if (!m.sym.empty() || !length.is_concrete()) {
    SymDims s = detail::meta_dims(m);
    s.insert(s.begin(), length);
    m.sym = std::move(s);
  }
  m.shape.insert(0, detail::sym_hint(length));
  return m;
}
TensorMeta without_leading(TensorMeta m) {
  m.shape.erase(0);
  if (!m.sym.empty()) {
    m.sym.erase(m.sym.begin());
    if (detail::all_concrete(m.sym)) m.sym.clear();
  }
  return m;
}

// A leaf standing for t (same value, and a value of the same trace), for a vector-Jacobian
// product taken with respect to it.
Tensor leaf_of(const Tensor& t) {
  Tensor l = detail::detached_alias(t);
  l.requires_grad_(true);
  return l;
}

// One function traced into a subgraph of the construct `parent` is tracing (Note [Sub-traces]).
// Its explicit inputs have the given metadata; what it reads from outside goes to `lifts`.
// Traced without a tape: the construct's own rule differentiates it.
struct SubTrace {
  Graph graph;
  std::vector<TensorMeta> results;
};
SubTrace trace_sub(detail::Tracer& parent, const std::string& what, const Fn& fn,
                   const std::vector<TensorMeta>& inputs, detail::Tracer::Lifts& lifts,
                   const char* op) {
  // Bodies are traced with grad mode off (their gradients are traced apart), from the start, so
  // that their ops are not taken for ops the function ran outside autograd (GraphNode::no_grad).
  GradModeScope no_grad(false);
  detail::Tracer sub(fmt::format("{} in {}", what, parent.graph().label), &parent, &lifts);
  std::vector<Tensor> in;
  for (const TensorMeta& m : inputs) in.push_back(sub.input(InputRole::Argument, m, false));
  std::vector<Tensor> out;
  {
    ModeGuard mode(&sub);
    out = fn(in);
  }
  check_defined(op, "result", out);
  SubTrace r;
  for (const Tensor& o : out) r.results.push_back(meta_of(o));
  sub.finish(out);
  r.graph = std::move(sub.graph());
  return r;
}

std::string metas_str(const std::vector<TensorMeta>& ms) {
  std::string s;
  for (const TensorMeta& m : ms)
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", m.dtype,
                     detail::dims_str(detail::meta_dims(m)));
  return s.empty() ? "nothing" : s;
}

// How b's first n metas differ from a's (Mismatch).
Mismatch metas_mismatch(const std::vector<TensorMeta>& a, const std::vector<TensorMeta>& b,
                        size_t n, const char* op) {
  if (a.size() < n || b.size() < n) return Mismatch::Shapes;
  Mismatch m = Mismatch::None;
  for (size_t i = 0; i < n; ++i) {
    if (!same_dims(detail::meta_dims(a[i]), detail::meta_dims(b[i]), op)) return Mismatch::Shapes;
    if (a[i].dtype != b[i].dtype) m = Mismatch::DTypes;
  }
  return m;
}

// A gradient rule of a traced construct for one of its results: the result's gradient, which
// inputs need one, and where to write them (one per input of the Control node).
using Rule = std::function<void(const Tensor& grad, const bool* needs, Tensor* grad_in)>;
// The gradient of several results at once (NodeGroup::rule): one per result, undefined where none.
using GroupRule =
    std::function<void(const std::vector<Tensor>& grads, const bool* needs, Tensor* grad_in)>;

// Puts each floating result of a traced construct on the tape, with the rule for that result,
// when grad mode is on and an input requires grad. Each result has a node of its own (a
// compiled function's outputs do too): a backward through several results of one construct runs
// the rule once per result, unless `group` takes several results' gradients at once (Note
// [Results of one construct] in eager/engine.cpp).
void attach_rules(ControlKind kind, std::vector<Tensor>& results, size_t count,
                  const std::vector<Tensor>& inputs, const std::function<Rule(size_t)>& rule,
                  GroupRule group = {}) {
  if (!detail::grad_mode()) return;
  bool any = false;
  for (const Tensor& t : inputs) any = any || t.requires_grad();
  if (!any) return;
  std::shared_ptr<detail::NodeGroup> members;
  if (group) {
    members = std::make_shared<detail::NodeGroup>();
    members->members.resize(count);
    members->rule = std::move(group);
  }
  for (size_t k = 0; k < count; ++k) {
    if (!is_floating(results[k].dtype())) continue;
    auto node = std::make_shared<detail::Node>();
    node->def = &node_def(kind);
    node->sequence = detail::next_sequence();
    node->inputs.resize(inputs.size());
    node->saved.resize(inputs.size());
    for (size_t j = 0; j < inputs.size(); ++j) detail::set_input_edge(node->inputs[j], inputs[j]);
    node->output_meta = meta_of(results[k]);
    node->backward_fn = rule(k);
    node->backward_fn_differentiable = true;
    if (members) {
      members->members[k] = node;
      node->group = members;
      node->group_index = static_cast<int32_t>(k);
    }
    detail::TensorImpl* x = results[k].unsafe_impl();
    x->requires_grad = true;
    detail::autograd_meta(*x).grad_fn = std::move(node);
  }
}

// attach_rules for a construct whose rule takes several results' gradients at once: each
// result's own rule is the group's, given that result's gradient alone.
void attach_group_rules(ControlKind kind, std::vector<Tensor>& results,
                        const std::vector<Tensor>& inputs, GroupRule group) {
  const size_t n = results.size();
  attach_rules(
      kind, results, n, inputs,
      [group, n](size_t k) -> Rule {
        return [group, n, k](const Tensor& g, const bool* needs, Tensor* grad_in) {
          std::vector<Tensor> gs(n);
          gs[k] = g;
          group(gs, needs, grad_in);
        };
      },
      group);
}

const char* kWhileGradError =
    "[while_loop] is forward only: a gradient cannot flow through it. For a loop with a gradient "
    "use scan (a fixed number of steps, one per element of xs along dim 0)";

// Note [Gradients a branch cannot reach]
// Eagerly, a cond runs one branch and the tape holds its ops: an operand that the branch's
// result does not depend on gets no gradient, and its producers' gradient rules do not run.
// The traced gradient is a cond of the branches' vjps, where an operand that a branch's result
// does not depend on gets zeros. Where neither branch's result depends on it (the branches
// never read it, or read it only in ops whose values they do not return, or only through
// comparisons), that zero would still flow into its producers' rules, and a rule that is NaN
// at its point (std of a single element, pow at 0) turns 0 into NaN where eager had nothing.
// So such an operand gets no gradient at all, as eagerly; so does an input of a scan (an
// initial carry, xs, a free value) that a result cannot depend on after the scan's steps, or
// at any number of steps where that number is symbolic (scan_reach: a carry result is its
// initial carry after no steps). An operand that only one
// branch's result depends on still gets zeros when the other branch runs, as in JAX's lax.cond:
// where its producers' rules are NaN at their point, the compiled gradient is NaN where eager's is
// finite (docs/eager-vs-compiled.md).

// Whether output k of a branch graph depends on each of its n inputs through ops that carry a
// gradient (a control node inside counts every input as reaching every result).
std::vector<char> reached_inputs(const Graph& g, size_t k, size_t n) {
  std::vector<char> seen(g.nodes.size(), 0), reached(n, 0);
  std::vector<int32_t> stack{g.outputs[k]};
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(v)]) continue;
    seen[static_cast<size_t>(v)] = 1;
    const GraphNode& node = g.nodes[static_cast<size_t>(v)];
    if (node.kind == NodeKind::Input) {
      if (node.role == InputRole::Argument && node.index >= 0 && size_t(node.index) < n)
        reached[static_cast<size_t>(node.index)] = 1;
      continue;
    }
    if (node.kind != NodeKind::Control &&  // (a construct's node holds no value of its own)
        (!is_floating(node.meta.dtype) || node.no_grad ||
         (node.kind == NodeKind::Op && !detail::op_def(node.op).differentiable)))
      continue;  // (no gradient flows back through it)
    for (int32_t in : node.inputs) stack.push_back(in);
  }
  return reached;
}

// ---- cond, traced ----

std::vector<Tensor> traced_cond(detail::Tracer& tr, const Tensor& pred, const Fn& true_fn,
                                const Fn& false_fn, const std::vector<Tensor>& operands) {
  detail::Tracer::Lifts lifts;
  lifts.first_slot = static_cast<int32_t>(operands.size());
  std::vector<TensorMeta> in;
  for (const Tensor& t : operands) in.push_back(meta_of(t));
  SubTrace t = trace_sub(tr, "cond true branch", true_fn, in, lifts, "cond");
  SubTrace f = trace_sub(tr, "cond false branch", false_fn, in, lifts, "cond");
  check_match(t.results.size() != f.results.size()
                  ? Mismatch::Shapes
                  : metas_mismatch(t.results, f.results, t.results.size(), "cond"),
              [&] {
                return fmt::format(
                    "[cond] the branches must return tensors of the same shapes and dtypes: the "
                    "true branch returns {}, the false branch {}",
                    metas_str(t.results), metas_str(f.results));
              });
  auto cf = std::make_shared<ControlFlow>();
  cf->kind = ControlKind::Cond;
  const int32_t nin = lifts.first_slot + static_cast<int32_t>(lifts.tensors.size());
  t.graph.num_runtime_inputs = f.graph.num_runtime_inputs = nin;
  cf->graphs = {std::move(t.graph), std::move(f.graph)};
  cf->results = t.results;
  std::vector<Tensor> inputs{pred};
  inputs.insert(inputs.end(), operands.begin(), operands.end());
  inputs.insert(inputs.end(), lifts.tensors.begin(), lifts.tensors.end());
  std::vector<Tensor> out = tr.control(cf, inputs);
  // d/d(operands, free) of the results given in gs (undefined: none): cond(pred, vjp of the
  // true branch, vjp of the false one), one for them all (Note [Results of one construct] in
  // eager/engine.cpp). Operands that neither branch's results depend on get no gradient (Note
  // [Gradients a branch cannot reach]).
  const size_t n = inputs.size() - 1;
  std::vector<std::vector<char>> reach_of(out.size());
  for (size_t k = 0; k < out.size(); ++k) {
    reach_of[k] = reached_inputs(cf->graphs[0], k, n);
    const std::vector<char> other = reached_inputs(cf->graphs[1], k, n);
    for (size_t j = 0; j < n; ++j) reach_of[k][j] = reach_of[k][j] || other[j];
  }
  GroupRule vjps = [cf, inputs, n, reach_of](const std::vector<Tensor>& gs, const bool* needs,
                                             Tensor* grad_in) {
    std::vector<size_t> ks;  // the results with a gradient
    std::vector<char> reach(n, 0);
    for (size_t k = 0; k < gs.size(); ++k)
      if (gs[k].defined()) {
        ks.push_back(k);
        for (size_t j = 0; j < n; ++j) reach[j] |= reach_of[k][j];
      }
    std::vector<size_t> want;
    for (size_t j = 0; j < n; ++j)
      if (needs[1 + j] && reach[j]) want.push_back(j);
    if (want.empty() || ks.empty()) return;
    auto vjp = [cf, ks, want, n](int b) {
      return Fn([cf, ks, want, n, b](const std::vector<Tensor>& ins) {
        std::vector<Tensor> xs(ins.begin(), ins.begin() + static_cast<std::ptrdiff_t>(n));
        std::vector<Tensor> leaves;
        for (size_t j : want) leaves.push_back(xs[j] = leaf_of(xs[j]));
        std::vector<Tensor> outs;
        {
          GradModeScope grad_on(true);
          outs = detail::call_graph(cf->graphs[b], xs);
        }
        std::vector<Tensor> roots, cots;
        for (size_t i = 0; i < ks.size(); ++i)
          if (outs[ks[i]].requires_grad()) {
            roots.push_back(outs[ks[i]]);
            cots.push_back(ins[n + i]);
          }
        if (roots.empty()) {
          std::vector<Tensor> z;
          for (const Tensor& l : leaves) z.push_back(zeros_like(l));
          return z;
        }
        return detail::grad(roots, leaves, cots, false, false);
      });
    };
    std::vector<Tensor> args(inputs.begin() + 1, inputs.end());
    for (size_t k : ks) args.push_back(gs[k]);
    std::vector<Tensor> r = cond(inputs[0], vjp(0), vjp(1), args);
    for (size_t i = 0; i < want.size(); ++i) grad_in[1 + want[i]] = r[i];
  };
  attach_group_rules(ControlKind::Cond, out, inputs, std::move(vjps));
  return out;
}

// Per result k of a scan (its nc carries, then its ny stacked ys) with body `body`, the inputs
// (carries, xs, free values; n in all) that k can depend on. A carry result is its initial carry
// after no steps; a carry read at a step is the previous step's carry result, or the initial
// one, so the carries a result reads close over the carries they read in turn. With a known
// number of steps the reach is that of those steps exactly, as the eager loop's tape has it: a
// scan of no steps returns its initial carries and reaches nothing else (random programs, seeds
// 535022 and 563811: the zeros of a reverse scan of no steps flowed into a var's gradient rule
// over one element, NaN). Otherwise (a symbolic length, or a reach that has not settled after
// kExactSteps distinct steps) it is that of any number of steps.
std::vector<std::vector<char>> scan_reach(const Graph& body, size_t nc, size_t ny, size_t n,
                                          std::optional<int64_t> steps) {
  using Reach = std::vector<std::vector<char>>;  // per carry or result, per input
  Reach dep(nc + ny);
  for (size_t j = 0; j < nc + ny; ++j) dep[j] = reached_inputs(body, j, n);
  // What result j of one step reaches, given what each carry it reads reached (`carry`).
  auto through = [&](size_t j, const Reach& carry) {
    std::vector<char> r(n, 0);
    for (size_t i = 0; i < n; ++i) {
      if (!dep[j][i]) continue;
      if (i >= nc) {
        r[i] = 1;
      } else {
        for (size_t q = 0; q < n; ++q) r[q] |= carry[i][q];
      }
    }
    return r;
  };
  constexpr size_t kExactSteps = 256;
  if (steps) {
    Reach carry(nc, std::vector<char>(n, 0)), ys(ny, std::vector<char>(n, 0));
    for (size_t c = 0; c < nc; ++c) carry[c][c] = 1;  // (after no steps)
    std::vector<Reach> seen{carry};
    for (int64_t t = 0; t < *steps && seen.size() <= kExactSteps; ++t) {
      for (size_t k = 0; k < ny; ++k) {
        const std::vector<char> r = through(nc + k, carry);
        for (size_t i = 0; i < n; ++i) ys[k][i] |= r[i];
      }
      Reach next(nc);
      for (size_t c = 0; c < nc; ++c) next[c] = through(c, carry);
      carry = std::move(next);
      const auto again = std::find(seen.begin(), seen.end(), carry);
      if (again != seen.end()) {
        // Periodic from here: every carry reach a later step meets has been met (so the ys
        // are complete), and the last one is the one `steps` lands on in the cycle.
        const int64_t first = again - seen.begin(), period = int64_t(seen.size()) - first;
        carry = seen[size_t(first + (*steps - first) % period)];
        break;
      }
      seen.push_back(carry);
      if (t + 1 == *steps) break;
    }
    if (seen.size() <= kExactSteps) {
      carry.insert(carry.end(), ys.begin(), ys.end());
      return carry;
    }
  }
  Reach reach(nc + ny, std::vector<char>(n, 0));
  for (size_t k = 0; k < nc + ny; ++k) {
    std::vector<char>& r = reach[k];
    std::vector<size_t> carries;  // reached, their own dependencies still to add
    auto add = [&](const std::vector<char>& d) {
      for (size_t i = 0; i < n; ++i)
        if (d[i] && !r[i]) {
          r[i] = 1;
          if (i < nc) carries.push_back(i);
        }
    };
    if (k < nc) {
      r[k] = 1;
      carries.push_back(k);
    } else {
      add(dep[k]);
    }
    while (!carries.empty()) {
      const size_t c = carries.back();
      carries.pop_back();
      add(dep[c]);
    }
  }
  return reach;
}

// ---- scan, traced ----

std::vector<Tensor> traced_scan(detail::Tracer& tr, const Fn& fn, const std::vector<Tensor>& init,
                                const std::vector<Tensor>& xs, bool reverse) {
  const size_t nc = init.size(), nx = xs.size();
  detail::Tracer::Lifts lifts;
  lifts.first_slot = static_cast<int32_t>(nc + nx);
  std::vector<TensorMeta> in;
  for (const Tensor& c : init) in.push_back(meta_of(c));
  for (const Tensor& x : xs) {
    in.push_back(without_leading(meta_of(x)));
  }
  SubTrace b = trace_sub(tr, "scan body", fn, in, lifts, "scan");
  std::vector<TensorMeta> carry_in(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(nc));
  check_match(metas_mismatch(carry_in, b.results, nc, "scan"), [&] {
    return fmt::format(
        "[scan] the body must return the carry first, with its shapes and dtypes: "
        "expected {}, got {}",
        metas_str(carry_in), metas_str(b.results));
  });
  const SymInt length = detail::sym_dim(xs[0], 0);
  auto cf = std::make_shared<ControlFlow>();
  cf->kind = ControlKind::Scan;
  cf->num_carry = static_cast<int32_t>(nc);
  cf->num_xs = static_cast<int32_t>(nx);
  cf->reverse = reverse;
  b.graph.num_runtime_inputs = lifts.first_slot + static_cast<int32_t>(lifts.tensors.size());
  const size_t ny = b.results.size() - nc;
  for (size_t k = 0; k < b.results.size(); ++k) {
    cf->results.push_back(k >= nc ? with_leading(b.results[k], length) : b.results[k]);
  }
  std::vector<Tensor> inputs = init;
  inputs.insert(inputs.end(), xs.begin(), xs.end());
  inputs.insert(inputs.end(), lifts.tensors.begin(), lifts.tensors.end());
  bool needs_grad = false;
  for (const Tensor& t : inputs) needs_grad = needs_grad || t.requires_grad();
  needs_grad = needs_grad && detail::grad_mode();
  // The backward reads the carry each step started from: the body also stacks its carry inputs
  // (DCE drops them again when no backward reads them).
  if (needs_grad)
    for (size_t k = 0; k < nc; ++k) {
      b.graph.outputs.push_back(static_cast<int32_t>(k));  // the carry inputs are values 0..nc-1
      cf->results.push_back(with_leading(in[k], length));
    }
  cf->graphs = {std::move(b.graph)};
  std::vector<Tensor> all = tr.control(cf, inputs);
  std::vector<Tensor> out(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(nc + ny));
  if (!needs_grad) return out;
  std::vector<Tensor> history(all.begin() + static_cast<std::ptrdiff_t>(nc + ny), all.end());
  // Inputs that result k cannot depend on get no gradient from it (Note [Gradients a branch
  // cannot reach]).
  const std::vector<std::vector<char>> reach_of =
      scan_reach(cf->graphs[0], nc, ny, inputs.size(), length.maybe_concrete());
  // The gradient of the results given in gs (undefined: none), as one reverse scan (Note
  // [Results of one construct] in eager/engine.cpp).
  GroupRule vjp = [cf, inputs, history, nc, nx, reach_of](const std::vector<Tensor>& gs,
                                                          const bool* needs, Tensor* grad_in) {
    std::vector<size_t> ys;  // the stacked results with a gradient
    std::vector<char> reach(inputs.size(), 0);
    for (size_t k = 0; k < gs.size(); ++k) {
      if (!gs[k].defined()) continue;
      if (k >= nc) ys.push_back(k);
      for (size_t i = 0; i < inputs.size(); ++i) reach[i] |= reach_of[k][i];
    }
    const size_t nf = inputs.size() - nc - nx;
    // The body without the stacked carries.
    auto body = std::make_shared<Graph>(cf->graphs[0]);
    body->outputs.resize(gs.size());
    std::vector<size_t> fc, want_x, want_f;  // float carries, needed xs and free
    for (size_t j = 0; j < nc; ++j)
      if (is_floating(inputs[j].dtype())) fc.push_back(j);
    for (size_t i = 0; i < nx; ++i)
      if (needs[nc + i] && reach[nc + i]) want_x.push_back(i);
    for (size_t j = 0; j < nf; ++j)
      if (needs[nc + nx + j] && reach[nc + nx + j]) want_f.push_back(j);
    std::vector<Tensor> free(inputs.begin() + static_cast<std::ptrdiff_t>(nc + nx), inputs.end());
    // Carry of the backward scan: d(carry), then the free values' gradients so far.
    std::vector<Tensor> carry;
    for (size_t j : fc) carry.push_back(gs[j].defined() ? gs[j] : zeros_like(inputs[j]));
    for (size_t j : want_f) carry.push_back(zeros_like(free[j]));
    // Scanned: the carry each step started from, the xs, and d(ys) of each stacked result.
    std::vector<Tensor> bxs = history;
    bxs.insert(bxs.end(), inputs.begin() + static_cast<std::ptrdiff_t>(nc),
               inputs.begin() + static_cast<std::ptrdiff_t>(nc + nx));
    for (size_t k : ys) bxs.push_back(gs[k]);
    Fn step = [body, free, fc, want_x, want_f, nc, nx, ys](const std::vector<Tensor>& in) {
      size_t p = 0;
      std::vector<Tensor> dc(in.begin(), in.begin() + fc.size());
      p += fc.size();
      std::vector<Tensor> df(in.begin() + p, in.begin() + p + want_f.size());
      p += want_f.size();
      std::vector<Tensor> args(in.begin() + p, in.begin() + p + nc + nx);
      p += nc + nx;
      std::vector<Tensor> fr = free;
      std::vector<Tensor> leaves;
      for (size_t j : fc) leaves.push_back(args[j] = leaf_of(args[j]));
      for (size_t i : want_x) leaves.push_back(args[nc + i] = leaf_of(args[nc + i]));
      for (size_t j : want_f) leaves.push_back(fr[j] = leaf_of(fr[j]));
      args.insert(args.end(), fr.begin(), fr.end());
      std::vector<Tensor> outs;
      {
        GradModeScope grad_on(true);
        outs = detail::call_graph(*body, args);
      }
      std::vector<Tensor> roots, cots;
      for (size_t i = 0; i < fc.size(); ++i)
        if (outs[fc[i]].requires_grad()) {
          roots.push_back(outs[fc[i]]);
          cots.push_back(dc[i]);
        }
      for (size_t i = 0; i < ys.size(); ++i)
        if (outs[ys[i]].requires_grad()) {
          roots.push_back(outs[ys[i]]);
          cots.push_back(in[p + i]);
        }
      std::vector<Tensor> gr;
      if (roots.empty()) {
        for (const Tensor& l : leaves) gr.push_back(zeros_like(l));
      } else {
        gr = detail::grad(roots, leaves, cots, false, false);
      }
      // New carry: d(carry in), the free gradients summed; then d(x_t).
      std::vector<Tensor> r(gr.begin(), gr.begin() + fc.size());
      for (size_t i = 0; i < want_f.size(); ++i)
        r.push_back(df[i] + gr[fc.size() + want_x.size() + i]);
      for (size_t i = 0; i < want_x.size(); ++i) r.push_back(gr[fc.size() + i]);
      return r;
    };
    std::vector<Tensor> r = detail::scan_impl(step, carry, bxs, !cf->reverse);
    for (size_t i = 0; i < fc.size(); ++i)
      if (needs[fc[i]] && reach[fc[i]]) grad_in[fc[i]] = r[i];
    for (size_t i = 0; i < want_f.size(); ++i) grad_in[nc + nx + want_f[i]] = r[fc.size() + i];
    for (size_t i = 0; i < want_x.size(); ++i)
      grad_in[nc + want_x[i]] = r[fc.size() + want_f.size() + i];
  };
  attach_group_rules(ControlKind::Scan, out, inputs, std::move(vjp));
  return out;
}

// ---- while_loop, traced ----

std::vector<Tensor> traced_while(detail::Tracer& tr, const Fn& cond_fn, const Fn& body_fn,
                                 const std::vector<Tensor>& init) {
  detail::Tracer::Lifts lifts;
  lifts.first_slot = static_cast<int32_t>(init.size());
  std::vector<TensorMeta> in;
  for (const Tensor& t : init) in.push_back(meta_of(t));
  SubTrace c = trace_sub(tr, "while_loop cond_fn", cond_fn, in, lifts, "while_loop");
  DUET_CHECK_T(c.results.size() == 1 && c.results[0].dtype == DType::b8 &&
                   detail::sym_decide(detail::sym_numel(detail::meta_dims(c.results[0])),
                                      detail::SymRel::Eq, 1, "while_loop"),
               ValueError,
               "[while_loop] cond_fn must return one one-element b8 tensor, returned {}",
               metas_str(c.results));
  SubTrace b = trace_sub(tr, "while_loop body", body_fn, in, lifts, "while_loop");
  check_match(b.results.size() != in.size()
                  ? Mismatch::Shapes
                  : metas_mismatch(in, b.results, in.size(), "while_loop"),
              [&] {
                return fmt::format(
                    "[while_loop] body_fn must keep the state's shapes and dtypes: expected {}, "
                    "got {}",
                    metas_str(in), metas_str(b.results));
              });
  auto cf = std::make_shared<ControlFlow>();
  cf->kind = ControlKind::WhileLoop;
  cf->num_carry = static_cast<int32_t>(init.size());
  const int32_t nin = lifts.first_slot + static_cast<int32_t>(lifts.tensors.size());
  c.graph.num_runtime_inputs = b.graph.num_runtime_inputs = nin;
  cf->graphs = {std::move(c.graph), std::move(b.graph)};
  cf->results = in;
  std::vector<Tensor> inputs = init;
  inputs.insert(inputs.end(), lifts.tensors.begin(), lifts.tensors.end());
  std::vector<Tensor> out = tr.control(cf, inputs);
  attach_rules(ControlKind::WhileLoop, out, out.size(), inputs, [](size_t) -> Rule {
    return [](const Tensor&, const bool*, Tensor*) { throw Error(kWhileGradError); };
  });
  return out;
}

// Note [Control flow returns new tensors]
// A traced cond, scan or while_loop gives results of its own, values computed from its operands.
// Eagerly, a construct could hand back an operand as it is: a carry a scan of no steps (or its
// body) passes through, an operand a branch returns, the state of a loop that ran no iteration.
// The result then shared memory with the operand, so a later in-place write to one reached the
// other, and the two faces differed: a program whose argument was the buffer it updates read the
// update through such a result eagerly and the value before it compiled (the random programs,
// seed 221656). So is a tensor from outside that a branch returns (a parameter). A result whose
// storage is older than the construct (StorageImpl::serial, read as it began) is cloned, so the
// eager results are new tensors too, as JAX's are and as torch.cond requires.
uint64_t storages_so_far() { return detail::g_storage_serial.load(std::memory_order_relaxed); }
void unalias(std::vector<Tensor>& out, uint64_t began) {
  for (Tensor& r : out) {
    const detail::StorageImpl* s = r.defined() ? r.unsafe_impl()->storage.get() : nullptr;
    if (s && s->serial <= began) r = r.clone();
  }
}

}  // namespace

std::vector<Tensor> cond(const Tensor& pred, Fn true_fn, Fn false_fn,
                         std::vector<Tensor> operands) {
  check_pred("cond", pred);
  check_defined("cond", "operand", operands);
  DUET_CHECK_T(true_fn && false_fn, ValueError, "[cond] both branches must be callable");
  if (detail::Tracer* tr = detail::Tracer::current())
    return traced_cond(*tr, pred, true_fn, false_fn, operands);
  const uint64_t began = storages_so_far();
  std::vector<Tensor> out = pred.item<bool>() ? true_fn(operands) : false_fn(operands);
  check_defined("cond", "result", out);
  unalias(out, began);  // Note [Control flow returns new tensors]
  return out;
}

std::vector<Tensor> scan(Fn fn, std::vector<Tensor> init_carry, std::vector<Tensor> xs) {
  return detail::scan_impl(fn, std::move(init_carry), std::move(xs), false);
}

std::vector<Tensor> detail::scan_impl(const Fn& fn, std::vector<Tensor> init_carry,
                                      std::vector<Tensor> xs, bool reverse) {
  DUET_CHECK_T(fn, ValueError, "[scan] the body must be callable");
  check_defined("scan", "carry", init_carry);
  check_defined("scan", "xs", xs);
  DUET_CHECK_T(!xs.empty(), ValueError,
               "[scan] needs at least one tensor in xs to scan along (its dim 0 is the length)");
  for (const Tensor& x : xs)
    DUET_CHECK_T(x.dim() >= 1 && detail::sym_decide(detail::sym_dim(x, 0), detail::SymRel::Eq,
                                                    detail::sym_dim(xs[0], 0), "scan"),
                 ShapeError,
                 "[scan] every xs tensor is scanned along dim 0, so they need one length; got {}",
                 metas_str(xs));
  if (Tracer* tr = Tracer::current()) return traced_scan(*tr, fn, init_carry, xs, reverse);
  const uint64_t began = storages_so_far();
  const int64_t length = xs[0].sizes()[0];
  const size_t nc = init_carry.size();
  std::vector<Tensor> carry = init_carry;
  std::vector<std::vector<Tensor>> ys;  // per output, per step (in the order run)
  for (int64_t s = 0; s < length; ++s) {
    const int64_t t = reverse ? length - 1 - s : s;
    std::vector<Tensor> in = carry;
    for (const Tensor& x : xs) in.push_back(squeeze(slice(x, 0, t, t + 1), 0));
    std::vector<Tensor> out = fn(in);
    check_defined("scan", "result", out);
    check_like("scan", fmt::format("step {} must return the carry first", t).c_str(), init_carry,
               out, nc);
    if (s == 0) ys.resize(out.size() - nc);
    DUET_CHECK_T(out.size() - nc == ys.size(), ShapeError,
                 "[scan] step {} returned {} per-step results, the first step returned {}", t,
                 out.size() - nc, ys.size());
    for (size_t i = 0; i < ys.size(); ++i) {
      const Tensor& y = out[nc + i];
      DUET_CHECK_T(s == 0 || (y.sizes() == ys[i][0].sizes() && y.dtype() == ys[i][0].dtype()),
                   ShapeError,
                   "[scan] per-step result {} was {} {} at the first step and is {} {} at step {}",
                   i, ys[i][0].dtype(), ys[i][0].sizes(), y.dtype(), y.sizes(), t);
      ys[i].push_back(y);
    }
    carry.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(nc));
  }
  std::vector<Tensor> result = carry;
  unalias(result, began);  // Note [Control flow returns new tensors]
  if (length > 0) {
    for (std::vector<Tensor>& y : ys) {
      if (reverse) std::reverse(y.begin(), y.end());
      result.push_back(stack(y, 0));
    }
    return result;
  }
  // No step ran: the shapes of the per-step results come from tracing the body once, with no
  // kernel run, and the stacked results are empty along dim 0.
  std::vector<TensorMeta> metas;
  {
    Tracer tr("scan body (length 0)");
    std::vector<Tensor> in;
    for (const Tensor& c : carry) in.push_back(tr.input(InputRole::Argument, c));
    for (const Tensor& x : xs) {
      Shape s;
      for (int64_t d = 1; d < x.dim(); ++d) s.push_back(x.sizes()[d]);
      in.push_back(tr.input(InputRole::Argument, TensorMeta{s, x.dtype(), x.device(), {}}, false));
    }
    ModeGuard mode(&tr);
    std::vector<Tensor> out = fn(in);
    check_defined("scan", "result", out);
    check_like("scan", "the body must return the carry first", init_carry, out, nc);
    for (size_t i = nc; i < out.size(); ++i) {
      Shape s{0};
      for (int64_t d : out[i].sizes()) s.push_back(d);
      metas.push_back({s, out[i].dtype(), out[i].device(), {}});
    }
  }
  for (const TensorMeta& m : metas) result.push_back(empty(m.shape, m.dtype, m.device));
  return result;
}

std::vector<Tensor> while_loop(Fn cond_fn, Fn body_fn, std::vector<Tensor> init) {
  DUET_CHECK_T(cond_fn && body_fn, ValueError, "[while_loop] cond_fn and body_fn must be callable");
  check_defined("while_loop", "initial value", init);
  if (detail::Tracer* tr = detail::Tracer::current())
    return traced_while(*tr, cond_fn, body_fn, init);
  bool needs_grad = false;
  for (const Tensor& t : init) needs_grad = needs_grad || t.requires_grad();
  needs_grad = needs_grad && detail::grad_mode();
  std::vector<Tensor> state = init;
  const uint64_t began = storages_so_far();
  {
    NoGradGuard ng;  // forward only: no tape across the iterations
    for (int64_t it = 0;; ++it) {
      std::vector<Tensor> c = cond_fn(state);
      DUET_CHECK_T(c.size() == 1, ValueError,
                   "[while_loop] cond_fn must return one tensor, returned {}", metas_str(c));
      check_pred("while_loop", c[0]);
      if (!c[0].item<bool>()) break;
      std::vector<Tensor> next = body_fn(state);
      check_defined("while_loop", "result", next);
      check_like(
          "while_loop",
          fmt::format("body_fn must keep the state's shapes and dtypes (iteration {})", it).c_str(),
          init, next, init.size());
      DUET_CHECK_T(next.size() == init.size(), ShapeError,
                   "[while_loop] body_fn returned {} tensors for a state of {}", next.size(),
                   init.size());
      state = std::move(next);
    }
    unalias(state, began);  // Note [Control flow returns new tensors]
  }
  if (!needs_grad) return state;
  // Each result gets a tape node whose backward is the error: a gradient never silently stops
  // at the loop (grad() would otherwise return zeros for the inputs).
  std::vector<Tensor> out;
  for (const Tensor& s : state) {
    const detail::TensorImpl* x = s.unsafe_impl();
    Tensor o = detail::make_view(s, x->shape, x->strides, x->offset);  // a handle of its own
    o.unsafe_impl()->is_view = false;
    out.push_back(std::move(o));
  }
  attach_rules(ControlKind::WhileLoop, out, out.size(), init, [](size_t) -> Rule {
    return [](const Tensor&, const bool*, Tensor*) { throw Error(kWhileGradError); };
  });
  return out;
}

std::vector<Tensor> detail::call_graph(const Graph& g, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> vals(g.nodes.size());
  std::vector<std::vector<Tensor>> tuples(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const GraphNode& n = g.nodes[i];
    std::vector<Tensor> in;
    for (int32_t v : n.inputs) in.push_back(vals[v]);
    switch (n.kind) {
      case NodeKind::Input:
        vals[i] = n.role == InputRole::Captured ? g.captured[n.index] : inputs[n.index];
        break;
      case NodeKind::Constant:
        vals[i] = n.constant;
        break;
      case NodeKind::Op: {
        // A gradient replays the function to differentiate it: its prints printed when it ran.
        // Their tokens are read by prints only.
        if (n.op == OpId::Print) break;
        std::vector<const Tensor*> ptrs;
        for (const Tensor& t : in) ptrs.push_back(&t);
        vals[i] = call(n.op, TensorRefs(ptrs.data(), static_cast<int64_t>(ptrs.size())), n.attrs);
        break;
      }
      case NodeKind::Control: {
        // The construct again, its functions replaying its subgraphs; free values are explicit.
        std::shared_ptr<const ControlFlow> cf = n.control;
        const size_t lead = static_cast<size_t>(cf->num_leading());
        auto sub = [cf](size_t k, std::vector<Tensor> extra) {
          return Fn([cf, k, extra](const std::vector<Tensor>& ins) {
            std::vector<Tensor> all = ins;
            all.insert(all.end(), extra.begin(), extra.end());
            return call_graph(cf->graphs[k], all);
          });
        };
        switch (cf->kind) {
          case ControlKind::Cond:
            tuples[i] =
                cond(in[0], sub(0, {}), sub(1, {}),
                     std::vector<Tensor>(in.begin() + static_cast<std::ptrdiff_t>(lead), in.end()));
            break;
          case ControlKind::Scan: {
            const auto c = in.begin(), x = c + cf->num_carry, f = x + cf->num_xs;
            tuples[i] =
                scan_impl(sub(0, std::vector<Tensor>(f, in.end())), std::vector<Tensor>(c, x),
                          std::vector<Tensor>(x, f), cf->reverse);
            break;
          }
          case ControlKind::WhileLoop: {
            const auto f = in.begin() + cf->num_carry;
            std::vector<Tensor> free(f, in.end());
            tuples[i] = while_loop(sub(0, free), sub(1, free), std::vector<Tensor>(in.begin(), f));
            break;
          }
        }
        break;
      }
      case NodeKind::Project:
        DUET_ASSERT(size_t(n.index) < tuples[n.inputs[0]].size(),
                    "project [{}] of a construct with {} results", n.index,
                    tuples[n.inputs[0]].size());
        vals[i] = tuples[n.inputs[0]][n.index];
        break;
    }
  }
  std::vector<Tensor> out;
  for (int32_t o : g.outputs) out.push_back(vals[o]);
  return out;
}

}  // namespace duet
