// Collectives: AllReduce, Broadcast, AllGather and ReduceScatter, their shape, symbolic and
// gradient rules, and the public functions of core/dist.h (Note [Collectives are ops]). The
// primitives work along dim 0 of contiguous buffers; another dim is a transpose around them.
#include "core/dispatch.h"
#include "core/dist.h"
#include "core/ops.h"
#include "core/symbolic.h"

namespace duet {
namespace detail {
namespace {

// attrs.dim: the reduction (0 sum, 1 max); attrs.start: broadcast's root; attrs.end: the world
// size the call was made in (a saved program checks it against the world it runs in).
void infer_collective(const OpDef& def, TensorRefs in, const Attrs& a, TensorMeta& out) {
  const Tensor& x = in[0];
  const int64_t w = a.end;
  DUET_CHECK_VALUE(w >= 1, "[{}] a world of {} ranks", def.name, w);
  const bool reduces = def.id == OpId::AllReduce || def.id == OpId::ReduceScatter;
  if (reduces) {
    DUET_CHECK_VALUE(a.dim == 0 || a.dim == 1, "[{}] reduction {} is not sum (0) or max (1)",
                     def.name, a.dim);
    DUET_CHECK_DTYPE(!(x.dtype() == DType::b8 && a.dim == 0),
                     "[{}] cannot sum b8 values over ranks (shape {}): cast to an integer dtype, "
                     "or reduce with max",
                     def.name, x.sizes());
  }
  out.shape = x.sizes();
  if (def.id == OpId::Broadcast)
    DUET_CHECK_VALUE(a.start >= 0 && a.start < w,
                     "[{}] root {} is not a rank of a world of {} (shape {}, {})", def.name,
                     a.start, w, x.sizes(), x.dtype());
  if (def.id == OpId::AllGather || def.id == OpId::ReduceScatter) {
    DUET_CHECK_SHAPE(x.dim() >= 1, "[{}] needs a tensor with a dim to join along, got a 0-d {}",
                     def.name, x.dtype());
    if (def.id == OpId::AllGather) {
      out.shape[0] *= w;
    } else {
      DUET_CHECK_SHAPE(x.sizes()[0] % w == 0,
                       "[{}] dim of size {} (shape {}) does not split into {} equal parts, one "
                       "per rank",
                       def.name, x.sizes()[0], x.sizes(), w);
      out.shape[0] /= w;
    }
  }
  out.dtype = x.dtype();
  out.device = x.device();
}

void infer_wait(const OpDef& def, TensorRefs in, const Attrs&, TensorMeta& out) {
  out.shape = in[0].sizes();
  out.dtype = in[0].dtype();
  out.device = in[0].device();
}

void sym_collective(const OpDef& def, TensorRefs in, const Attrs& a, const TensorMeta&,
                    SymDims& out) {
  out = sym_dims(in[0]);
  if (def.id == OpId::AllGather) out[0] = out[0] * SymInt(a.end);
  if (def.id == OpId::ReduceScatter) {
    const bool divides = sym_decide(mod(out[0], SymInt(a.end)), SymRel::Eq, SymInt(0), def.name);
    DUET_ASSERT(divides, "[{}] size {} accepted by the shape rule", def.name, out[0].str());
    out[0] = floordiv(out[0], SymInt(a.end));
  }
}

dist::ReduceOp reduce_of(const Attrs& a) {
  return a.dim == 1 ? dist::ReduceOp::Max : dist::ReduceOp::Sum;
}

// Along dim 0, as the primitives are.
Tensor gather0(const Tensor& x) { return dist::all_gather(x, 0); }

// The gradient of a max over ranks goes to the ranks that hold the max, split evenly between
// ties: sum over ranks of grad, times (x == max) / (number of ranks at the max).
void grad_all_reduce(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (reduce_of(c.attrs) == dist::ReduceOp::Sum) {
    gi[0] = dist::all_reduce(g);
    return;
  }
  const Tensor mask = eq(c.inputs[0], c.output).to(g.dtype());
  gi[0] = dist::all_reduce(g) * mask / dist::all_reduce(mask);
}

// Only the root's input reaches the outputs, on every rank.
void grad_broadcast(const GradCtx& c, const Tensor& g, Tensor* gi) {
  const Tensor s = dist::all_reduce(g);
  if (dist::rank() == c.attrs.start)
    gi[0] = s;
  else
    gi[0] = full_dims(sym_dims(s), 0, Options().dtype(s.dtype()).device(s.device()));
}

void grad_all_gather(const GradCtx&, const Tensor& g, Tensor* gi) {
  gi[0] = dist::reduce_scatter(g, dist::ReduceOp::Sum, 0);
}

void grad_wait(const GradCtx&, const Tensor& g, Tensor* gi) { gi[0] = g; }

void grad_reduce_scatter(const GradCtx& c, const Tensor& g, Tensor* gi) {
  if (reduce_of(c.attrs) == dist::ReduceOp::Sum) {
    gi[0] = gather0(g);
    return;
  }
  const Tensor mask = eq(c.inputs[0], gather0(c.output)).to(g.dtype());
  gi[0] = gather0(g) * mask / gather0(dist::reduce_scatter(mask, dist::ReduceOp::Sum, 0));
}

int64_t checked_world(const char* op) {
  DUET_CHECK(dist::is_initialized(), "[{}] no process group: call duet::dist::init() first", op);
  return dist::world_size();
}

Tensor call_collective(OpId op, const Tensor& x, Attrs a) {
  const Tensor* in[] = {&x};
  return call(op, TensorRefs(in, 1), a);
}

}  // namespace

void register_collective_rules(OpDef* t) {
  for (OpId op : {OpId::AllReduce, OpId::Broadcast, OpId::AllGather, OpId::ReduceScatter}) {
    t[int(op)].infer = infer_collective;
    t[int(op)].sym_infer = sym_collective;
  }
  set_grad(t, OpId::AllReduce, grad_all_reduce, kSaveIn0 | kSaveOut);
  set_grad(t, OpId::Broadcast, grad_broadcast, 0);
  set_grad(t, OpId::AllGather, grad_all_gather, 0);
  set_grad(t, OpId::ReduceScatter, grad_reduce_scatter, kSaveIn0 | kSaveOut);
  t[int(OpId::CollectiveWait)].infer = infer_wait;
  t[int(OpId::CollectiveWait)].sym_infer = sym_collective;
  set_grad(t, OpId::CollectiveWait, grad_wait, 0);
}

}  // namespace detail

namespace dist {

Tensor all_reduce(const Tensor& x, ReduceOp op, std::source_location loc) {
  duet::detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.defined(), "[all_reduce] an undefined tensor");
  Attrs a;
  a.end = duet::detail::checked_world("all_reduce");
  if (op == ReduceOp::Mean) {
    DUET_CHECK_DTYPE(is_floating(x.dtype()), "[all_reduce] mean needs a floating tensor, got {} {}",
                     x.dtype(), x.sizes());
    return duet::detail::call_collective(OpId::AllReduce, x, a) / static_cast<double>(a.end);
  }
  a.dim = op == ReduceOp::Max ? 1 : 0;
  return duet::detail::call_collective(OpId::AllReduce, x, a);
}

namespace detail {

Tensor all_reduce_start(const Tensor& x, ReduceOp op) {
  DUET_CHECK_VALUE(x.defined(), "[all_reduce] an undefined tensor");
  DUET_CHECK_VALUE(op != ReduceOp::Mean,
                   "[all_reduce] a started all-reduce sums or takes the max; divide after wait()");
  Attrs a;
  a.end = duet::detail::checked_world("all_reduce");
  a.dim = op == ReduceOp::Max ? 1 : 0;
  a.keepdim = true;
  return duet::detail::call_collective(OpId::AllReduce, x, a);
}

Tensor wait(const Tensor& started) {
  DUET_CHECK_VALUE(started.defined(), "[collective_wait] an undefined tensor");
  return duet::detail::call_collective(OpId::CollectiveWait, started, Attrs{});
}

}  // namespace detail

Tensor broadcast(const Tensor& x, int root, std::source_location loc) {
  duet::detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.defined(), "[broadcast] an undefined tensor");
  Attrs a;
  a.end = duet::detail::checked_world("broadcast");
  a.start = root;
  return duet::detail::call_collective(OpId::Broadcast, x, a);
}

Tensor all_gather(const Tensor& x, int64_t dim, std::source_location loc) {
  duet::detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.defined(), "[all_gather] an undefined tensor");
  Attrs a;
  a.end = duet::detail::checked_world("all_gather");
  DUET_CHECK_SHAPE(x.dim() >= 1,
                   "[all_gather] needs a tensor with a dim to join along, got a 0-d {}", x.dtype());
  const int64_t d = duet::detail::wrap_dim("all_gather", dim, x.dim());
  if (d == 0) return duet::detail::call_collective(OpId::AllGather, x, a);
  return transpose(duet::detail::call_collective(OpId::AllGather, transpose(x, 0, d), a), 0, d);
}

Tensor reduce_scatter(const Tensor& x, ReduceOp op, int64_t dim, std::source_location loc) {
  duet::detail::SiteGuard site(loc);
  DUET_CHECK_VALUE(x.defined(), "[reduce_scatter] an undefined tensor");
  Attrs a;
  a.end = duet::detail::checked_world("reduce_scatter");
  DUET_CHECK_SHAPE(x.dim() >= 1,
                   "[reduce_scatter] needs a tensor with a dim to split, got a 0-d {}", x.dtype());
  DUET_CHECK_DTYPE(op != ReduceOp::Mean || is_floating(x.dtype()),
                   "[reduce_scatter] mean needs a floating tensor, got {} {}", x.dtype(),
                   x.sizes());
  a.dim = op == ReduceOp::Max ? 1 : 0;
  const int64_t d = duet::detail::wrap_dim("reduce_scatter", dim, x.dim());
  Tensor y =
      d == 0 ? duet::detail::call_collective(OpId::ReduceScatter, x, a)
             : transpose(duet::detail::call_collective(OpId::ReduceScatter, transpose(x, 0, d), a),
                         0, d);
  if (op == ReduceOp::Mean) y = y / static_cast<double>(a.end);
  return y;
}

}  // namespace dist
}  // namespace duet
