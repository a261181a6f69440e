// Structured control flow: Note [Control flow] in trace/control_flow.h.
#include "trace/control_flow.h"

#include <fmt/format.h>

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
    s += t.defined() ? fmt::format("{} {}", t.dtype(), t.sizes()) : std::string("undefined");
  }
  return s.empty() ? "nothing" : s;
}

void check_defined(const char* op, const char* what, const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i)
    DUET_CHECK_T(ts[i].defined(), ValueError, "[{}] {} {} is an undefined tensor", op, what, i);
}

void check_pred(const char* op, const Tensor& pred) {
  DUET_CHECK_T(pred.defined(), ValueError, "[{}] the predicate is an undefined tensor", op);
  DUET_CHECK_T(pred.dtype() == DType::b8 && pred.numel() == 1, ValueError,
               "[{}] the predicate must be a one-element b8 tensor, got {} {}", op, pred.dtype(),
               pred.sizes());
}

// Whether got has the count, shapes and dtypes of want; else an error naming both.
void check_like(const char* op, const char* what, const std::vector<Tensor>& want,
                const std::vector<Tensor>& got, size_t count) {
  bool same = got.size() >= count && want.size() >= count;
  for (size_t i = 0; same && i < count; ++i)
    same =
        got[i].defined() && got[i].sizes() == want[i].sizes() && got[i].dtype() == want[i].dtype();
  DUET_CHECK_T(same, ShapeError, "[{}] {}: expected {}, got {}", op, what,
               metas_str(std::vector<Tensor>(want.begin(), want.begin() + count)), metas_str(got));
}

void no_trace(const char* op) {
  DUET_CHECK(detail::Tracer::current() == nullptr,
             "[{}] inside a compiled function is not supported yet (issue 7, in progress); "
             "call it eagerly",
             op);
}

const OpDef& while_loop_def() {
  static const OpDef def = detail::opaque_node_def("while_loop");
  return def;
}

}  // namespace

std::vector<Tensor> cond(const Tensor& pred, Fn true_fn, Fn false_fn,
                         std::vector<Tensor> operands) {
  check_pred("cond", pred);
  check_defined("cond", "operand", operands);
  DUET_CHECK_T(true_fn && false_fn, ValueError, "[cond] both branches must be callable");
  no_trace("cond");
  std::vector<Tensor> out = pred.item<bool>() ? true_fn(operands) : false_fn(operands);
  check_defined("cond", "result", out);
  return out;
}

std::vector<Tensor> scan(Fn fn, std::vector<Tensor> init_carry, std::vector<Tensor> xs) {
  DUET_CHECK_T(fn, ValueError, "[scan] the body must be callable");
  check_defined("scan", "carry", init_carry);
  check_defined("scan", "xs", xs);
  DUET_CHECK_T(!xs.empty(), ValueError,
               "[scan] needs at least one tensor in xs to scan along (its dim 0 is the length)");
  for (const Tensor& x : xs)
    DUET_CHECK_T(x.dim() >= 1 && x.sizes()[0] == xs[0].sizes()[0], ShapeError,
                 "[scan] every xs tensor is scanned along dim 0, so they need one length; got {}",
                 metas_str(xs));
  no_trace("scan");
  const int64_t length = xs[0].sizes()[0];
  const size_t nc = init_carry.size();
  std::vector<Tensor> carry = init_carry;
  std::vector<std::vector<Tensor>> ys;  // per output, per step
  auto step_in = [&](const std::vector<Tensor>& xt) {
    std::vector<Tensor> in = carry;
    in.insert(in.end(), xt.begin(), xt.end());
    return in;
  };
  for (int64_t t = 0; t < length; ++t) {
    std::vector<Tensor> xt;
    for (const Tensor& x : xs) xt.push_back(squeeze(slice(x, 0, t, t + 1), 0));
    std::vector<Tensor> out = fn(step_in(xt));
    check_defined("scan", "result", out);
    check_like("scan", fmt::format("step {} must return the carry first", t).c_str(), init_carry,
               out, nc);
    if (t == 0) ys.resize(out.size() - nc);
    DUET_CHECK_T(out.size() - nc == ys.size(), ShapeError,
                 "[scan] step {} returned {} per-step results, step 0 returned {}", t,
                 out.size() - nc, ys.size());
    for (size_t i = 0; i < ys.size(); ++i) {
      const Tensor& y = out[nc + i];
      DUET_CHECK_T(t == 0 || (y.sizes() == ys[i][0].sizes() && y.dtype() == ys[i][0].dtype()),
                   ShapeError,
                   "[scan] per-step result {} was {} {} at step 0 and is {} {} at step {}", i,
                   ys[i][0].dtype(), ys[i][0].sizes(), y.dtype(), y.sizes(), t);
      ys[i].push_back(y);
    }
    carry.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(nc));
  }
  std::vector<Tensor> result = carry;
  if (length > 0) {
    for (const std::vector<Tensor>& y : ys) result.push_back(stack(y, 0));
    return result;
  }
  // No step ran: the shapes of the per-step results come from tracing the body once, with no
  // kernel run, and the stacked results are empty along dim 0.
  std::vector<TensorMeta> metas;
  {
    detail::Tracer tr("scan body (length 0)");
    std::vector<Tensor> in;
    for (const Tensor& c : carry) in.push_back(tr.input(InputRole::Argument, c));
    for (const Tensor& x : xs) {
      Shape s;
      for (int64_t d = 1; d < x.dim(); ++d) s.push_back(x.sizes()[d]);
      in.push_back(tr.input(InputRole::Argument, TensorMeta{s, x.dtype(), x.device()}, false));
    }
    ModeGuard mode(&tr);
    std::vector<Tensor> out = fn(in);
    check_defined("scan", "result", out);
    check_like("scan", "the body must return the carry first", init_carry, out, nc);
    for (size_t i = nc; i < out.size(); ++i) {
      Shape s{0};
      for (int64_t d : out[i].sizes()) s.push_back(d);
      metas.push_back({s, out[i].dtype(), out[i].device()});
    }
  }
  for (const TensorMeta& m : metas) result.push_back(detail::empty(m.shape, m.dtype, m.device));
  return result;
}

std::vector<Tensor> while_loop(Fn cond_fn, Fn body_fn, std::vector<Tensor> init) {
  DUET_CHECK_T(cond_fn && body_fn, ValueError, "[while_loop] cond_fn and body_fn must be callable");
  check_defined("while_loop", "initial value", init);
  no_trace("while_loop");
  bool needs_grad = false;
  for (const Tensor& t : init) needs_grad = needs_grad || t.requires_grad();
  needs_grad = needs_grad && detail::grad_mode();
  std::vector<Tensor> state = init;
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
  }
  if (!needs_grad) return state;
  // Each result gets a tape node whose backward is the error: a gradient never silently stops
  // at the loop (grad() would otherwise return zeros for the inputs).
  std::vector<Tensor> out;
  for (const Tensor& s : state) {
    const detail::TensorImpl* x = s.unsafe_impl();
    Tensor o = detail::make_view(s, x->shape, x->strides, x->offset);  // a handle of its own
    o.unsafe_impl()->is_view = false;
    if (is_floating(o.dtype())) {
      auto node = std::make_shared<detail::Node>();
      node->def = &while_loop_def();
      node->sequence = detail::next_sequence();
      node->inputs.resize(init.size());
      node->saved.resize(init.size());
      for (size_t j = 0; j < init.size(); ++j) detail::set_input_edge(node->inputs[j], init[j]);
      node->output_meta = {x->shape, x->dtype, x->device()};
      node->backward_fn = [](const Tensor&, const bool*, Tensor*) {
        throw Error(
            "[while_loop] is forward only: a gradient cannot flow through it. For a loop with a "
            "gradient use scan (a fixed number of steps, one per element of xs along dim 0)");
      };
      o.unsafe_impl()->requires_grad = true;
      detail::autograd_meta(*o.unsafe_impl()).grad_fn = std::move(node);
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace duet
