// Note [Argument gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Eagerly, loss.backward() fills x.grad of every leaf that requires grad, arguments included:
// it creates x.grad, or adds into the buffer already there. A compiled function does the same.
//  - An argument's .grad is an input of the trace, when the argument has one: with_arg_grads
//    appends it to the call's tensors, so whether it exists is part of the signature (a fresh
//    leaf and a leaf with a .grad are two entries), and code that reads x.grad() inside the
//    function reads its value, as eagerly.
//  - While tracing, a backward that reaches an argument accumulates into the traced .grad out of
//    place (an argument may not be written in place): the accumulated value is a new traced
//    value (eager/engine.cpp, accumulate).
//  - At the end of the trace each argument whose .grad changed has its new value appended to
//    the results (collect_arg_grads); after every call write_arg_grads copies it into the
//    argument's .grad buffer, or gives the argument that result as its new .grad. So the
//    buffer a caller or an optimizer holds stays the one that is updated, as eagerly.
// A non-leaf argument that requires grad stays an error when a backward reaches it: eagerly the
// gradient would flow on into the graph that made it, which lies outside the trace.
#include "trace/arg_grads.h"

#include <fmt/format.h>

#include "eager/autograd.h"

namespace duet::detail {

namespace {
bool takes_grad(const Tensor& t) { return t.requires_grad() && t.is_leaf(); }
}  // namespace

bool with_arg_grads(const FlatArgs& args, FlatArgs& aug) {
  bool any = false;
  for (const Tensor& t : args.tensors) any = any || (takes_grad(t) && t.grad().defined());
  if (!any) return false;
  aug = args;
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const Tensor& t = args.tensors[i];
    if (!takes_grad(t)) continue;
    Tensor g = t.grad();
    if (!g.defined()) continue;
    aug.tensors.push_back(g);
    aug.labels.add_grad_of(i);
    aug.grad_of.push_back(i);
  }
  return true;
}

std::vector<Tensor> bind_arg_grads(const FlatArgs& args, const std::vector<Tensor>& sym) {
  const size_t n = sym.size() - args.grad_of.size();
  for (size_t k = 0; k < args.grad_of.size(); ++k) {
    Tensor a = sym[args.grad_of[k]];
    a.set_grad(sym[n + k]);
  }
  return std::vector<Tensor>(sym.begin(), sym.begin() + static_cast<std::ptrdiff_t>(n));
}

std::vector<size_t> collect_arg_grads(const FlatArgs& args, const std::vector<Tensor>& sym,
                                      const std::string& label, std::vector<Tensor>& outs) {
  const size_t n = sym.size() - args.grad_of.size();
  std::vector<size_t> changed;
  for (size_t i = 0; i < n; ++i) {
    if (!sym[i].requires_grad()) continue;
    const Tensor g = sym[i].grad();
    if (!g.defined()) continue;
    bool bound_unchanged = false;
    for (size_t k = 0; k < args.grad_of.size(); ++k)
      if (args.grad_of[k] == i) bound_unchanged = g.is_same(sym[n + k]);
    if (bound_unchanged) continue;
    DUET_CHECK(args.tensors[i].is_leaf(),
               "[backward] reached {} of {} (shape {}, {}), which requires grad but is not a "
               "leaf: its gradient would flow on into the graph that computed it, outside the "
               "compiled function. Pass a leaf (x.detach().requires_grad_()), return "
               "duet::grad(loss, {{x}}) from the function, or call backward() on its output "
               "outside it",
               args.labels[i], label, args.tensors[i].sizes(), args.tensors[i].dtype());
    for (size_t j : changed)
      DUET_CHECK(!args.tensors[j].is_same(args.tensors[i]),
                 "[backward] reached {} and {} of {}, which are the same tensor: pass it once "
                 "to the compiled function, so that its .grad gets both gradients",
                 args.labels[j], args.labels[i], label);
    outs.push_back(g);
    changed.push_back(i);
  }
  return changed;
}

void write_arg_grads(const std::vector<size_t>& arg_grads, const FlatArgs& args,
                     std::vector<Tensor>& outs) {
  if (arg_grads.empty()) return;
  const size_t first = outs.size() - arg_grads.size();
  NoGradGuard no_grad;
  for (size_t k = 0; k < arg_grads.size(); ++k) {
    Tensor arg = args.tensors[arg_grads[k]];
    Tensor& g = outs[first + k];
    if (Tensor cur = arg.grad(); cur.defined())
      cur.copy_(g);
    else
      arg.set_grad(g);
  }
  outs.resize(first);
}

}  // namespace duet::detail
