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
//  - cond, scan and while_loop inside the function, and in-place writes of a batched value into
//    a tensor from outside it.
// An unbatched result is expanded to the batch, as torch.func does.
#include "trace/func.h"

#include "core/dispatch.h"
#include "core/ops.h"
#include "trace/tracer.h"

namespace duet::func::detail {

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
  if (n.op == OpId::Random)
    DUET_CHECK_VALUE(randomness == Randomness::Same,
                     "[vmap] {}: a random op ({}) under vmap; pass Randomness::Same to draw the "
                     "same values for every sample (torch.func's randomness=\"same\")",
                     label, n.site ? n.site.str() : "random");
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

// The traced graph on the batched arguments (Note [vmap]).
std::vector<Tensor> run_graph(const Graph& g, const std::vector<BatchedArg>& args,
                              const Tracer::Lifts* lifts, int64_t batch, int64_t out_dim,
                              Randomness randomness, const std::string& label) {
  std::vector<BatchedArg> v(g.nodes.size());
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
      default:
        DUET_CHECK_VALUE(false,
                         "[vmap] {}: cond, scan and while_loop inside a vmapped function are not "
                         "supported",
                         label);
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
  std::vector<Tensor> out;
  for (int32_t o : g.outputs)
    out.push_back(place_result(v[static_cast<size_t>(o)], batch, out_dim));
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
  return run_graph(g, batched, &lifts, batch, out_dim, randomness, label);
}

void check_argnum(int argnum, size_t args, const std::string& label) {
  DUET_CHECK_VALUE(argnum >= 0 && static_cast<size_t>(argnum) < args,
                   "[grad] {}: argnum {} is out of range for {} arguments", label, argnum, args);
}

void check_scalar_result(const Tensor& y, const std::string& label) {
  DUET_CHECK_VALUE(y.numel() == 1 && is_floating(y.dtype()),
                   "[grad] {}: the function must return one floating-point element, got shape {} "
                   "({})",
                   label, y.sizes(), y.dtype());
  DUET_CHECK_VALUE(y.requires_grad(),
                   "[grad] {}: the result does not depend on the differentiated argument with "
                   "grad mode on",
                   label);
}

}  // namespace duet::func::detail
