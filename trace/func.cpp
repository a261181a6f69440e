// duet: func::vmap and func::grad (trace/func.h).
//
// Note [vmap]
// vmap traces the function once on one sample's shapes (the tracer, as compile does; a sub-trace
// when another trace is running, so that what the function reads from it is lifted in), and then
// runs the traced graph on the batched arguments: each op node goes through its op's batching
// rule (OpDef::batch, Note [Batching rules] in core/ops/batching.cpp) when one of its inputs is
// batched, and is called as it is otherwise (parameters, constants, sources). Every call goes
// through the dispatcher: autograd records the batched ops, so gradients flow back to the
// arguments, and an enclosing trace records them, so compile(vmap(f)) and vmap(vmap(f)) work.
// The traced function may run backward inside (grad), which the tracer records as ops like any
// other. What vmap refuses, each with a ValueError:
//  - arguments whose batch sizes differ, or no batched argument;
//  - a random op under Randomness::Error (the default, as torch.func's randomness="error");
//    Randomness::Same runs it once for every sample, Randomness::Different draws the batch's
//    shape at once (the state advance the trace recorded for one sample runs after it). The
//    advance writes the generator's state in place, which vmap's sub-trace may do (unlike the
//    bodies of cond, scan and while_loop): it runs once, in order, so compile(vmap(f)) draws
//    what vmap(f) does;
//  - in-place writes of a batched value into a tensor from outside it.
// cond, scan and while_loop inside the function batch too (Note [vmap of control flow]).
// The graph is replayed with autograd on, so what the function did outside autograd is recorded
// in it: ops traced with grad mode off (NoGradGuard) are replayed with it off, and a detach of a
// traced tensor is a view traced with it off (GraphNode::no_grad).
// An unbatched result is expanded to the batch, as torch.func does.
#include "trace/func.h"

#include <algorithm>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/ops.h"
#include "trace/control_flow.h"
#include "trace/tracer.h"

namespace duet::func::detail {

using duet::ControlFlow;
using duet::ControlKind;
using duet::Graph;
using duet::GraphNode;
using duet::InputRole;
using duet::NodeKind;
using duet::detail::Tracer;

namespace {

// The batch size and the per-sample metadata of each argument.
int64_t check_args(const std::vector<Tensor>& args, std::vector<int64_t>& dims,
                   const std::vector<std::optional<int64_t>>& in_dims, const std::string& label) {
  DUET_CHECK_VALUE(in_dims.empty() || in_dims.size() == args.size(),
                   "[vmap] {}: in_dims has {} entries for {} arguments", label, in_dims.size(),
                   args.size());
  int64_t batch = -1;
  size_t first = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::optional<int64_t> d = in_dims.empty() ? std::optional<int64_t>(0) : in_dims[i];
    if (!d) {
      dims.push_back(-1);
      continue;
    }
    const Tensor& a = args[i];
    DUET_CHECK_VALUE(a.dim() > 0, "[vmap] {}: argument {} is 0-d, so it has no dim {} to batch",
                     label, i, *d);
    dims.push_back(duet::detail::wrap_dim("vmap", *d, a.dim()));
    const int64_t b = a.sizes()[dims.back()];
    if (batch < 0) {
      batch = b;
      first = i;
    }
    DUET_CHECK_VALUE(b == batch,
                     "[vmap] {}: argument {} (shape {}) has {} samples along dim {}, argument {} "
                     "(shape {}) has {}: the batched arguments must agree",
                     label, i, a.sizes(), b, dims.back(), first, args[first].sizes(), batch);
  }
  DUET_CHECK_VALUE(batch >= 0, "[vmap] {}: no argument is batched (every in_dim is nullopt)",
                   label);
  return batch;
}

// Result v moved so that its batch is at `out_dim` (expanded to the batch when unbatched).
Tensor place_result(const BatchedArg& v, int64_t batch, int64_t out_dim) {
  Tensor x = v.value;
  int64_t from = v.bdim;
  if (from < 0) {
    Shape s{batch};
    for (int64_t d = 0; d < x.dim(); ++d) s.push_back(x.sizes()[d]);
    x = expand(unsqueeze(x, 0), s);
    from = 0;
  }
  const int64_t to = duet::detail::wrap_dim("vmap", out_dim, x.dim());
  if (from == to) return x;
  Dims order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != from) order.push_back(d);
  Dims placed;
  for (int64_t d = 0, k = 0; d < x.dim(); ++d) placed.push_back(d == to ? from : order[k++]);
  return permute(x, placed);
}

BatchedArg run_op(const GraphNode& n, const std::vector<BatchedArg>& in, int64_t batch,
                  Randomness randomness, const std::string& label) {
  const OpDef& def = duet::detail::op_def(n.op);
  // Traced with grad mode off (NoGradGuard, a detach): so replayed, and gradients stop here.
  duet::detail::GradModeScope grad(duet::detail::grad_mode() && !n.no_grad);
  if (n.op == OpId::Random) {
    DUET_CHECK_VALUE(randomness != Randomness::Error,
                     "[vmap] {}: a random op ({}) under vmap; pass Randomness::Same to draw the "
                     "same values for every sample (torch.func's randomness=\"same\"), or "
                     "Randomness::Different to draw for each",
                     label, n.site ? n.site.str() : "random");
    if (randomness == Randomness::Different) {
      // One draw of the batch's shape (what a loop over the samples would draw, as one call),
      // from the generator of the state's device, which moves on by as much.
      const Attrs& a = n.attrs;
      Shape s{batch};
      for (int64_t d : a.ints) s.push_back(d);
      const Options o = Options().dtype(a.dtype).device(in.at(0).value.device());
      return {a.dim == 0 ? rand(s, o) : a.dim == 1 ? randn(s, o) : randint(a.end, s, o), 0};
    }
  }
  bool batched = false;
  for (const BatchedArg& x : in) batched = batched || x.bdim >= 0;
  if (!batched) {
    std::vector<const Tensor*> p;
    for (const BatchedArg& x : in) p.push_back(&x.value);
    return {duet::detail::call(n.op, TensorRefs(p.data(), static_cast<int64_t>(p.size())), n.attrs),
            -1};
  }
  const BatchFn rule = def.batch ? def.batch : duet::detail::batch_loop;
  return rule(def, in, n.attrs, batch);
}

std::vector<BatchedArg> run_values(const Graph& g, const std::vector<BatchedArg>& args,
                                   const Tracer::Lifts* lifts, int64_t batch, Randomness randomness,
                                   const std::string& label);

// x with its batch first, expanded to the batch when unbatched.
Tensor batch_first(const BatchedArg& x, int64_t batch) { return place_result(x, batch, 0); }

// A per-sample predicate (one element) of the batch, as (B, 1, ..., 1) with `rank` 1s.
Tensor batch_mask(const BatchedArg& pred, int64_t batch, int64_t rank) {
  Shape s{batch};
  for (int64_t d = 0; d < rank; ++d) s.push_back(1);
  return reshape(batch_first(pred, batch), s);
}

// Per sample, a where b: where(mask, a, b) with the batch first.
BatchedArg select_samples(const BatchedArg& pred, const BatchedArg& a, const BatchedArg& b,
                          int64_t batch) {
  const Tensor ta = batch_first(a, batch), tb = batch_first(b, batch);
  return {where(batch_mask(pred, batch, ta.dim() - 1), ta, tb), 0};
}

// Whether a predicate with no batch holds: read on the host, unless a trace is running (then
// both ways are taken, as for a batched one).
std::optional<bool> host_predicate(const BatchedArg& pred) {
  if (pred.bdim >= 0 || Tracer::current()) return std::nullopt;
  return pred.value.item<bool>();
}

// while_loop of the batch while a trace runs (compile(vmap(f))), where no predicate can be read
// on the host: one while_loop construct, on the state with the batch first, whose predicate is
// that any sample's holds and whose body moves only the samples whose predicate holds.
template <class Run>
std::vector<BatchedArg> traced_while(const ControlFlow& cf, const std::vector<BatchedArg>& state,
                                     const std::vector<BatchedArg>& free, int64_t batch,
                                     const Run& run) {
  auto args = [&](const std::vector<Tensor>& st) {
    std::vector<BatchedArg> a;
    for (const Tensor& t : st) a.push_back({t, 0});
    a.insert(a.end(), free.begin(), free.end());
    return a;
  };
  auto holds = [&](const std::vector<Tensor>& st) { return run(cf.graphs[0], args(st)).at(0); };
  std::vector<Tensor> init;
  for (const BatchedArg& x : state) init.push_back(batch_first(x, batch).contiguous());
  const std::vector<Tensor> out = duet::while_loop(
      [&](const std::vector<Tensor>& st) -> std::vector<Tensor> {
        return {gt(batch_first(holds(st), batch).to(DType::i64).sum(), 0)};
      },
      [&](const std::vector<Tensor>& st) {
        const BatchedArg p = holds(st);
        const std::vector<BatchedArg> next = run(cf.graphs[1], args(st));
        std::vector<Tensor> moved;
        for (size_t k = 0; k < st.size(); ++k)
          moved.push_back(select_samples(p, next[k], {st[k], 0}, batch).value.contiguous());
        return moved;
      },
      init);
  std::vector<BatchedArg> r;
  for (const Tensor& t : out) r.push_back({t, 0});
  return r;
}

// Note [vmap of control flow]
// cond, scan and while_loop run on the batch as JAX's batching rules run them:
//  - scan: the body runs once per step on the whole batch (its subgraph through run_values),
//    the xs sliced at the step along their per-sample dim 0 and the ys stacked along it;
//  - cond: with a batched predicate both branches run on the batch and each sample takes its
//    branch's results (where); an unbatched one picks its branch;
//  - while_loop: with a batched predicate the body runs while any sample's predicate holds, and
//    a sample whose predicate failed keeps its state (where). Under a trace (compile(vmap(f)))
//    that loop is itself one while_loop construct (traced_while), as no predicate can be read.
std::vector<BatchedArg> run_control(const ControlFlow& cf, const std::vector<BatchedArg>& in,
                                    int64_t batch, Randomness randomness,
                                    const std::string& label) {
  auto run = [&](const Graph& sub, const std::vector<BatchedArg>& a) {
    return run_values(sub, a, nullptr, batch, randomness, label);
  };
  const auto nc = static_cast<size_t>(cf.num_carry);
  if (cf.kind == ControlKind::Cond) {
    const std::vector<BatchedArg> rest(in.begin() + 1, in.end());
    if (std::optional<bool> p = host_predicate(in[0])) return run(cf.graphs[*p ? 0 : 1], rest);
    const std::vector<BatchedArg> t = run(cf.graphs[0], rest), f = run(cf.graphs[1], rest);
    std::vector<BatchedArg> out;
    for (size_t k = 0; k < t.size(); ++k) out.push_back(select_samples(in[0], t[k], f[k], batch));
    return out;
  }
  if (cf.kind == ControlKind::WhileLoop) {
    std::vector<BatchedArg> state(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(nc));
    const std::vector<BatchedArg> free(in.begin() + static_cast<std::ptrdiff_t>(nc), in.end());
    if (Tracer::current()) return traced_while(cf, state, free, batch, run);
    for (;;) {
      std::vector<BatchedArg> a = state;
      a.insert(a.end(), free.begin(), free.end());
      const BatchedArg p = run(cf.graphs[0], a).at(0);
      if (std::optional<bool> h = host_predicate(p)) {
        if (!*h) return state;
        state = run(cf.graphs[1], a);
        continue;
      }
      if (!(batch_first(p, batch).to(DType::i64).sum().item<int64_t>() > 0)) return state;
      const std::vector<BatchedArg> next = run(cf.graphs[1], a);
      for (size_t k = 0; k < nc; ++k) state[k] = select_samples(p, next[k], state[k], batch);
    }
  }
  // scan
  const auto nx = static_cast<size_t>(cf.num_xs);
  std::vector<BatchedArg> carry(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(nc));
  const std::vector<BatchedArg> free(in.begin() + static_cast<std::ptrdiff_t>(nc + nx), in.end());
  std::vector<BatchedArg> xs;  // batch first when batched: the steps along dim 1
  for (size_t k = 0; k < nx; ++k)
    xs.push_back(in[nc + k].bdim < 0 ? in[nc + k] : BatchedArg{batch_first(in[nc + k], batch), 0});
  const int64_t length = nx == 0 ? 0 : xs[0].value.sizes()[xs[0].bdim < 0 ? 0 : 1];
  std::vector<std::vector<BatchedArg>> ys(cf.results.size() - nc);
  for (int64_t s = 0; s < length; ++s) {
    const int64_t t = cf.reverse ? length - 1 - s : s;
    std::vector<BatchedArg> a = carry;
    for (const BatchedArg& x : xs)
      a.push_back(x.bdim < 0 ? BatchedArg{select(x.value, 0, t), -1}
                             : BatchedArg{select(x.value, 1, t), 0});
    a.insert(a.end(), free.begin(), free.end());
    const std::vector<BatchedArg> out = run(cf.graphs[0], a);
    carry.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(nc));
    for (size_t k = 0; k < ys.size(); ++k) ys[k].push_back(out[nc + k]);
  }
  std::vector<BatchedArg> out = carry;
  for (size_t k = 0; k < ys.size(); ++k) {
    const TensorMeta& m = cf.results[nc + k];
    if (ys[k].empty()) {  // no steps: the per-sample stack is empty
      out.push_back({zeros(m.shape, Options().dtype(m.dtype).device(m.device)), -1});
      continue;
    }
    if (cf.reverse) std::reverse(ys[k].begin(), ys[k].end());
    bool any = false;
    for (const BatchedArg& y : ys[k]) any = any || y.bdim >= 0;
    std::vector<Tensor> parts;
    for (const BatchedArg& y : ys[k]) parts.push_back(any ? batch_first(y, batch) : y.value);
    out.push_back({stack(parts, any ? 1 : 0), any ? 0 : -1});
  }
  return out;
}

// The traced graph on the batched arguments (Note [vmap]): the batched value of each output.
std::vector<BatchedArg> run_values(const Graph& g, const std::vector<BatchedArg>& args,
                                   const Tracer::Lifts* lifts, int64_t batch, Randomness randomness,
                                   const std::string& label) {
  std::vector<BatchedArg> v(g.nodes.size());
  std::unordered_map<size_t, std::vector<BatchedArg>> tuples;  // of Control nodes
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const GraphNode& n = g.nodes[i];
    switch (n.kind) {
      case NodeKind::Input:
        if (n.role == InputRole::Captured)
          v[i] = {g.captured[static_cast<size_t>(n.index)], -1};
        else if (n.index < static_cast<int32_t>(args.size()))
          v[i] = args[static_cast<size_t>(n.index)];
        else
          v[i] = {lifts->tensors.at(static_cast<size_t>(n.index - lifts->first_slot)), -1};
        break;
      case NodeKind::Constant:
        v[i] = {n.constant, -1};
        break;
      case NodeKind::Op: {
        std::vector<BatchedArg> in;
        for (int32_t x : n.inputs) in.push_back(v[static_cast<size_t>(x)]);
        v[i] = run_op(n, in, batch, randomness, label);
        break;
      }
      case NodeKind::Control: {
        std::vector<BatchedArg> in;
        for (int32_t x : n.inputs) in.push_back(v[static_cast<size_t>(x)]);
        tuples[i] = run_control(*n.control, in, batch, randomness, label);
        break;
      }
      case NodeKind::Project:
        v[i] = tuples.at(static_cast<size_t>(n.inputs[0])).at(static_cast<size_t>(n.index));
        break;
    }
  }
  for (const duet::WriteBack& w : g.writebacks) {
    const BatchedArg& x = v[static_cast<size_t>(w.value)];
    DUET_CHECK_VALUE(x.bdim < 0,
                     "[vmap] {}: the function writes a per-sample value into a tensor from "
                     "outside it (shape {}) in place",
                     label, g.captured[static_cast<size_t>(w.target)].sizes());
    NoGradGuard ng;
    Tensor(g.captured[static_cast<size_t>(w.target)]).copy_(x.value);
  }
  std::vector<BatchedArg> out;
  for (int32_t o : g.outputs) out.push_back(v[static_cast<size_t>(o)]);
  return out;
}

}  // namespace

std::vector<Tensor> vmap_call(const std::function<std::vector<Tensor>(std::vector<Tensor>)>& fn,
                              const std::vector<Tensor>& args,
                              const std::vector<std::optional<int64_t>>& in_dims, int64_t out_dim,
                              Randomness randomness, const std::string& label) {
  std::vector<int64_t> dims;
  const int64_t batch = check_args(args, dims, in_dims, label);
  // One sample's shapes, traced (Note [vmap]).
  Tracer* outer = Tracer::current();
  Tracer::Lifts lifts;
  lifts.first_slot = static_cast<int32_t>(args.size());  // lifted values follow the arguments
  std::unique_ptr<Tracer> tr =
      outer ? std::make_unique<Tracer>(label, outer, &lifts) : std::make_unique<Tracer>(label);
  tr->allow_outside_writes();  // a draw's state advance, applied by run_values
  std::vector<Tensor> samples;
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& a = args[i];
    Shape s = a.sizes();
    if (dims[i] >= 0) s.erase(dims[i]);
    samples.push_back(tr->input(InputRole::Argument, TensorMeta{s, a.dtype(), a.device(), {}},
                                a.requires_grad()));
  }
  std::vector<Tensor> outs;
  {
    ModeGuard mode(tr.get());
    outs = fn(samples);
    for (const Tensor& o : outs)
      if (!o.unsafe_impl()->trace) tr->value_of(o);
  }
  tr->finish(outs);
  const Graph g = std::move(tr->graph());
  tr.reset();
  std::vector<BatchedArg> batched;
  for (size_t i = 0; i < args.size(); ++i) batched.push_back({args[i], dims[i]});
  std::vector<Tensor> out;
  for (const BatchedArg& r : run_values(g, batched, &lifts, batch, randomness, label))
    out.push_back(place_result(r, batch, out_dim));
  return out;
}

namespace {
// The transform a label names ("jacrev at file:line" -> "jacrev"), for its errors.
std::string transform_of(const std::string& label) { return label.substr(0, label.find(' ')); }
}  // namespace

void check_argnum(int argnum, size_t args, const std::string& label) {
  DUET_CHECK_VALUE(argnum >= 0 && static_cast<size_t>(argnum) < args,
                   "[{}] {}: argnum {} is out of range for {} arguments", transform_of(label),
                   label, argnum, args);
}

void check_argnums(const std::vector<int>& argnums, size_t args, const std::string& label) {
  DUET_CHECK_VALUE(!argnums.empty(), "[{}] {}: argnums is empty; name at least one argument",
                   transform_of(label), label);
  for (size_t i = 0; i < argnums.size(); ++i) {
    check_argnum(argnums[i], args, label);
    for (size_t j = 0; j < i; ++j)
      DUET_CHECK_VALUE(argnums[j] != argnums[i], "[{}] {}: argnums names argument {} twice",
                       transform_of(label), label, argnums[i]);
  }
}

void check_scalar_result(const Tensor& y, const std::string& label) {
  DUET_CHECK_VALUE(y.defined() && y.numel() == 1 && is_floating(y.dtype()),
                   "[grad] {}: the function must return one floating-point element, got shape {} "
                   "({})",
                   label, y.defined() ? y.sizes() : Shape{}, y.defined() ? y.dtype() : DType::f32);
}

void check_jacobian_result(const char* op, const Tensor& y, const std::string& label) {
  DUET_CHECK_VALUE(y.defined() && is_floating(y.dtype()),
                   "[{}] {}: the function must return a floating-point tensor, got {}", op, label,
                   y.defined() ? fmt::format("{}", y.dtype()) : std::string("an undefined one"));
}

void make_leaves(std::vector<Tensor>& xs, const std::vector<int>& ks) {
  for (int k : ks) {
    Tensor& x = xs[static_cast<size_t>(k)];
    if (!x.requires_grad()) {
      x = x.detach();
      x.requires_grad_();
    }
  }
}

namespace {
// The gradients of y weighted by v (ones for an undefined v) with respect to xs, differentiable
// again; where y does not depend on them (a constant, or computed under a NoGradGuard inside
// f), zeros, as torch.func's and JAX's.
std::vector<Tensor> grads_or_zeros(const Tensor& y, const std::vector<Tensor>& xs,
                                   const Tensor& v) {
  duet::detail::GradModeScope grad_on(true);
  if (y.requires_grad())
    return duet::grad({y}, xs, v.defined() ? std::vector<Tensor>{v} : std::vector<Tensor>{},
                      /*create_graph=*/true);
  std::vector<Tensor> zeros;
  for (const Tensor& x : xs) zeros.push_back(zeros_like(x));
  return zeros;
}
}  // namespace

std::vector<Tensor> vjp_grads(const Tensor& y, const std::vector<Tensor>& xs, const Tensor& v) {
  DUET_CHECK_SHAPE(v.defined() && v.sizes() == y.sizes(),
                   "[vjp] the cotangent must have the result's shape {}, got {}", y.sizes(),
                   v.defined() ? v.sizes().str() : std::string("an undefined tensor"));
  DUET_CHECK_DTYPE(is_floating(v.dtype()), "[vjp] the cotangent must be floating-point, got {}",
                   v.dtype());
  return grads_or_zeros(y, xs, v);
}

void check_tangents(const std::vector<Tensor>& xs, const std::vector<Tensor>& vs) {
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor &x = xs[i], &v = vs[i];
    DUET_CHECK_SHAPE(x.defined() && v.defined() && v.sizes() == x.sizes(),
                     "[jvp] tangent {} must have its argument's shape {}, got {}", i,
                     x.defined() ? x.sizes().str() : std::string("(undefined)"),
                     v.defined() ? v.sizes().str() : std::string("an undefined tensor"));
    DUET_CHECK_DTYPE(is_floating(x.dtype()) && is_floating(v.dtype()),
                     "[jvp] argument {} and its tangent must be floating-point, got {} and {}", i,
                     x.dtype(), v.dtype());
  }
}

// Note [jvp by two vjps]
// duet differentiates in reverse only, so jvp transposes the vector-Jacobian product, as
// torch.autograd.functional.jvp does: g(u) = J^T u is linear in the cotangent u, so the gradient
// of sum(g(u) * v) with respect to u is J v, whatever u is (zeros here). The first product is
// taken with create_graph, which tapes it as duet ops (gradient rules are written in duet ops),
// so the second differentiates it like any other function; that second derivative is why the
// cost is about two backward passes, where forward mode would be one. An argument whose
// gradient does not depend on u (y does not depend on it) adds nothing, and a y that depends on
// no argument has a product of zeros.
Tensor jvp_product(const Tensor& y, const std::vector<Tensor>& xs, const std::vector<Tensor>& vs) {
  duet::detail::GradModeScope grad_on(true);
  Tensor u = zeros_like(y).requires_grad_();
  const std::vector<Tensor> g = grads_or_zeros(y, xs, u);
  Tensor s;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!g[i].requires_grad()) continue;
    Tensor term = (g[i] * vs[i]).sum();
    s = s.defined() ? s + term : term;
  }
  if (!s.defined()) return zeros_like(y);
  return grads_or_zeros(s, {u}, Tensor())[0];
}

std::vector<Tensor> value_grads(const Tensor& y, const std::vector<Tensor>& xs,
                                const std::string& label) {
  check_scalar_result(y, label);
  return grads_or_zeros(y, xs, Tensor());
}

}  // namespace duet::func::detail
