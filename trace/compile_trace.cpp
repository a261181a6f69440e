// duet: tracing one signature of a compiled function: the joint graph of its forward and
// backward (CompiledCore::trace), its split into a forward and per-output backwards
// (split_joint), the guards that decide when it applies (record_guards), and the
// specializations that make a dynamic dim concrete.
#include <algorithm>
#include <set>
#include <unordered_set>

#include "core/dispatch.h"
#include "eager/autograd.h"
#include "eager/node.h"
#include "trace/arg_grads.h"
#include "trace/compile_entry.h"
#include "trace/ir/passes.h"
#include "trace/tracer.h"

namespace duet::detail {

namespace {

bool is_same_as_arg(const Tensor& t, const std::vector<Tensor>& args) {
  for (const Tensor& a : args)
    if (a.is_same(t)) return true;
  return false;
}

}  // namespace

// The values a set of roots needs, stopping at (and reporting) values in `stop`.
void ancestors(const Graph& g, const std::vector<int32_t>& roots, const std::vector<bool>& stop,
               std::vector<bool>& in, std::set<int32_t>* boundary) {
  std::vector<int32_t> stack;
  for (int32_t r : roots) {
    if (stop[r]) {
      if (boundary) boundary->insert(r);
    } else if (!in[r]) {
      in[r] = true;
      stack.push_back(r);
    }
  }
  while (!stack.empty()) {
    int32_t v = stack.back();
    stack.pop_back();
    for (int32_t i : g.nodes[v].inputs) {
      if (stop[i]) {
        if (boundary) boundary->insert(i);
      } else if (!in[i]) {
        in[i] = true;
        stack.push_back(i);
      }
    }
  }
}

// The part of `g` in `include`, with each value of `boundary` a Saved input (slots first, in
// order) and the other runtime inputs renumbered after them.
Graph extract(const Graph& g, const std::vector<bool>& include,
              const std::vector<int32_t>& boundary, const std::vector<int32_t>& roots,
              KeepWritebacks keep) {
  Graph s;
  s.label = g.label;
  s.scopes = g.scopes;
  std::vector<int32_t> map(g.nodes.size(), -1);
  std::vector<int32_t> cap_map(g.captured.size(), -1);
  for (int32_t b : boundary) {
    GraphNode n;
    n.kind = NodeKind::Input;
    n.role = InputRole::Saved;
    n.meta = g.nodes[b].meta;
    n.index = s.num_runtime_inputs++;
    map[b] = s.add(std::move(n));
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!include[i] || map[i] >= 0) continue;
    GraphNode n = g.nodes[i];
    if (n.kind == NodeKind::Input) {
      if (n.role == InputRole::Captured) {
        if (cap_map[n.index] < 0) {
          cap_map[n.index] = static_cast<int32_t>(s.captured.size());
          s.captured.push_back(g.captured[n.index]);
        }
        n.index = cap_map[n.index];
      } else {
        n.index = s.num_runtime_inputs++;
      }
    }
    for (int32_t& in : n.inputs) in = map[in];
    map[i] = s.add(std::move(n));
  }
  for (int32_t r : roots) s.outputs.push_back(map[r]);
  for (const WriteBack& w : g.writebacks) {
    if (keep == KeepWritebacks::None) break;
    if (!include[w.value] && (keep == KeepWritebacks::Computed || map[w.value] < 0)) continue;
    if (cap_map[w.target] < 0) {
      cap_map[w.target] = static_cast<int32_t>(s.captured.size());
      s.captured.push_back(g.captured[w.target]);
    }
    s.writebacks.push_back({map[w.value], cap_map[w.target]});
  }
  return s;
}

CompiledCore::Entry* CompiledCore::trace_specializing(const FlatArgs& args, const TraceFn& fn,
                                                      const std::vector<TensorSig>& sig,
                                                      std::set<std::pair<size_t, int64_t>>& dynamic,
                                                      std::vector<int64_t>& hints) {
  for (;;) {
    const std::vector<std::vector<int32_t>> dim_sym = assign_symbols(sig, dynamic, hints);
    try {
      return trace(args, fn, dim_sym, hints);
    } catch (const SpecializeRequest& r) {
      // Library or user code needed concrete sizes: those dims become concrete, and the
      // function is traced again.
      std::string dims;
      for (auto it = dynamic.begin(); it != dynamic.end();) {
        const int32_t id = dim_sym[it->first][static_cast<size_t>(it->second)];
        if (std::find(r.symbols.begin(), r.symbols.end(), id) == r.symbols.end()) {
          ++it;
          continue;
        }
        specialized_[*it] = r.why;
        dims += fmt::format("{}{} dim {}", dims.empty() ? "" : ", ", args.labels[it->first],
                            it->second);
        it = dynamic.erase(it);
      }
      DUET_ASSERT(!dims.empty(), "a specialization of no dynamic dim: {}", r.why);
      stats_.retrace_reasons.push_back(fmt::format("{} made concrete: {}", dims, r.why));
    }
  }
}

CompiledCore::Entry* CompiledCore::trace(const FlatArgs& args, const TraceFn& fn,
                                         const std::vector<std::vector<int32_t>>& dim_sym,
                                         const std::vector<int64_t>& hints) {
  ++stats_.traces;
  auto t0 = std::chrono::steady_clock::now();
  auto e = std::make_unique<Entry>();
  TraceSyms syms;
  syms.hints = hints;
  Tracer tr(label_);
  if (options_.guard_data_reads)
    tr.guard_reads([&args, &hints](const Graph& g, int32_t v) {
      return evaluate_value(g, v, args.tensors, hints);
    });
  std::vector<Tensor> outs;
  Gradients grads;
  {
    std::vector<Tensor> sym;
    for (size_t i = 0; i < args.tensors.size(); ++i)
      sym.push_back(tr.input(InputRole::Argument, args.tensors[i], {},
                             symbolic_dims(args.tensors[i], dim_sym, i)));
    SymContextGuard sym_scope(dim_sym.empty() ? nullptr : &syms);
    ModeGuard mode(&tr);
    outs = fn(bind_arg_grads(args, sym));
    for (size_t i = 0; i < outs.size(); ++i)
      DUET_CHECK(outs[i].defined(), "[compile] {} returned an undefined tensor as output {}",
                 label_, i);
    // Probes are results too, after the function's own (take_probes moves them out).
    for (const auto& [name, t] : tr.probes()) {
      e->probe_names.push_back(name);
      outs.push_back(t);
    }
    // Then the .grad values of the arguments a backward reached.
    e->arg_grads = collect_arg_grads(args, sym, label_, outs);
    // A tensor returned without being read by an op (a parameter returned as it is) is captured
    // now, so that it is among the sources below and its gradient reaches it.
    for (const Tensor& o : outs)
      if (!o.unsafe_impl()->trace) tr.value_of(o);
    bool any = false;
    for (const Tensor& o : outs) any |= o.requires_grad();
    if (grad_mode() && any) differentiate(tr, sym, outs, *e, grads);
  }
  std::vector<Tensor> all = outs;
  for (const auto& gs : grads.grads) all.insert(all.end(), gs.begin(), gs.end());
  all.insert(all.end(), grads.joint.begin(), grads.joint.end());
  tr.finish(all);
  Graph joint = std::move(tr.graph());
  joint.verify();
  stats_.trace_ms = ms_since(t0);
  for (const Tensor& c : joint.captured) {
    e->captured_flags.push_back({c, c.requires_grad()});
    e->captured_storage.push_back(storage_serial(c));
    e->captured_hooks.push_back(hooks_key(c));
  }
  {
    std::unordered_set<const detail::TensorImpl*> captured;
    for (const Tensor& c : joint.captured) captured.insert(c.unsafe_impl());
    for (const Tensor& c : joint.captured)
      if (const Tensor g = c.grad(); g.defined() && captured.count(g.unsafe_impl()))
        e->grad_buffers.push_back({c, g});
  }
  for (const WriteBack& w : joint.writebacks)
    e->written.push_back(joint.captured[static_cast<size_t>(w.target)]);
  e->reads_args_after_writes = tr.reads_arguments_after_writes();
  e->flags = tr.flags();
  e->num_outputs = outs.size();
  record_guards(args, dim_sym, hints, syms, tr.value_guards(), *e);
  split_joint(joint, tr.value_guards(), grads, *e);
  entries_.push_back(std::move(e));
  return entries_.back().get();
}

// The joint graph (docs/design.md, "Backward through compiled outputs"): each output that
// requires grad is differentiated with respect to every argument and captured tensor that
// requires grad, with its gradient a graph input.
void CompiledCore::differentiate(Tracer& tr, const std::vector<Tensor>& sym,
                                 const std::vector<Tensor>& outs, Entry& e, Gradients& grads) {
  std::vector<Tensor> wrt;
  for (size_t i = 0; i < sym.size(); ++i)
    if (sym[i].requires_grad()) {
      wrt.push_back(sym[i]);
      e.wrt.push_back({int(i), Tensor()});
    }
  for (const Tensor& c : tr.graph().captured)
    if (c.requires_grad()) {
      wrt.push_back(c);
      e.wrt.push_back({-1, c});
    }
  std::vector<Tensor> gouts;  // the differentiated outputs' gradients, graph inputs
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].requires_grad() || is_same_as_arg(outs[i], sym)) continue;
    const TensorImpl* o = outs[i].unsafe_impl();
    Tensor g =
        tr.input(InputRole::GradOutput, TensorMeta{o->shape, o->dtype, o->device(), o->sym}, false);
    try {
      grads.grads.push_back(detail::grad({outs[i]}, wrt, {g}, false, /*retain_graph=*/true));
    } catch (const Error& err) {
      // This output cannot be differentiated: the function already ran backward through
      // it (a training step), or its backward fails as it would eagerly (a value it saved
      // was overwritten in place, a while_loop). It is returned with a tape node that
      // raises the same error when a backward reaches it, as eager would; the other outputs
      // keep their compiled backward.
      e.failed.push_back({i, err.what()});
      continue;
    }
    grads.diff_outputs.push_back(i);
    grads.gout_values.push_back(g.unsafe_impl()->value);
    gouts.push_back(g);
  }
  // Note [One backward for several outputs] in trace/compile.cpp.
  if (grads.diff_outputs.size() >= 2 && e.failed.empty()) {
    std::vector<Tensor> douts;
    for (size_t i : grads.diff_outputs) douts.push_back(outs[i]);
    try {
      grads.joint = detail::grad(douts, wrt, gouts, false, /*retain_graph=*/true);
    } catch (const Error&) {
      grads.joint.clear();  // each output keeps a backward of its own
    }
  }
  if (grads.grads.empty() && e.failed.empty()) e.wrt.clear();
}

// What a trace assumed, on its entry and (for the most recent trace) in stats_: its symbolic
// dims, their guards, and the values it read into C++.
void CompiledCore::record_guards(const FlatArgs& args,
                                 const std::vector<std::vector<int32_t>>& dim_sym,
                                 const std::vector<int64_t>& hints, TraceSyms& syms,
                                 const std::vector<ValueGuard>& value_guards, Entry& e) {
  e.dim_sym = dim_sym;
  e.num_symbols = static_cast<int32_t>(hints.size());
  e.guards = std::move(syms.guards);
  stats_.symbolic_dims.clear();
  for (size_t i = 0; i < e.dim_sym.size(); ++i)
    for (size_t d = 0; d < e.dim_sym[i].size(); ++d)
      if (e.dim_sym[i][d] >= 0)
        stats_.symbolic_dims.push_back(
            fmt::format("{} dim {}: s{}", args.labels[i], d, e.dim_sym[i][d]));
  stats_.guards.clear();
  for (const SymGuard& g : e.guards) stats_.guards.push_back(g.str());
  stats_.value_guards.clear();
  for (const ValueGuard& g : value_guards) {
    e.value_guards.push_back({g.expected, g.why});
    stats_.value_guards.push_back(g.why);
  }
}

// Split: the forward part is what the results and write-backs need (and every input but the
// gradients); each backward reads the forward values it uses as saved inputs.
void CompiledCore::split_joint(const Graph& joint, const std::vector<ValueGuard>& value_guards,
                               const Gradients& grads, Entry& e) {
  const size_t n = joint.nodes.size();
  const size_t num_outputs = e.num_outputs;
  std::vector<bool> fwd(n, false), none(n, false);
  std::vector<int32_t> fwd_roots(joint.outputs.begin(), joint.outputs.begin() + num_outputs);
  for (const WriteBack& w : joint.writebacks) fwd_roots.push_back(w.value);
  for (const ValueGuard& g : value_guards) fwd_roots.push_back(g.value);
  // Prints are forward roots (nothing reads them), unless they need a gradient.
  std::vector<bool> after_grad(n, false);
  for (size_t i = 0; i < n; ++i) {
    const GraphNode& g = joint.nodes[i];
    after_grad[i] = g.kind == NodeKind::Input && g.role == InputRole::GradOutput;
    for (int32_t in : g.inputs) after_grad[i] = after_grad[i] || after_grad[in];
  }
  for (size_t i = 0; i < n; ++i)
    if ((joint.nodes[i].kind == NodeKind::Input && joint.nodes[i].role != InputRole::GradOutput) ||
        (has_effect(joint.nodes[i]) && !after_grad[i]))
      fwd_roots.push_back(int32_t(i));
  ancestors(joint, fwd_roots, none, fwd, nullptr);
  // Every result of a construct the forward runs is a forward value: the backward reads some
  // (a scan's stacked carries) as saved values, never the construct's tuple itself.
  for (size_t i = 0; i < n; ++i)
    if (joint.nodes[i].kind == NodeKind::Project && fwd[joint.nodes[i].inputs[0]]) fwd[i] = true;
  // One backward per differentiated output, then the joint one, if any.
  const size_t num_grads = grads.grads.size() + (grads.joint.empty() ? 0 : 1);
  std::vector<std::set<int32_t>> saved_per(num_grads);
  std::vector<std::vector<bool>> bwd_sets;
  std::set<int32_t> saved_all;
  size_t pos = num_outputs;
  std::vector<std::vector<int32_t>> bwd_roots(num_grads);
  for (size_t k = 0; k < num_grads; ++k) {
    const bool is_joint = k == grads.grads.size();
    const size_t count = is_joint ? grads.joint.size() : grads.grads[k].size();
    bwd_roots[k].assign(joint.outputs.begin() + pos, joint.outputs.begin() + pos + count);
    pos += count;
    std::vector<bool> in(n, false);
    ancestors(joint, bwd_roots[k], fwd, in, &saved_per[k]);
    // The gradient is an input of the plan even when no result reads it (all of them zeros):
    // the tape node always passes it (the joint backward's, every output's).
    if (is_joint)
      for (int32_t v : grads.gout_values) in[v] = true;
    else
      in[grads.gout_values[k]] = true;
    saved_all.insert(saved_per[k].begin(), saved_per[k].end());
    bwd_sets.push_back(std::move(in));
  }
  std::vector<int32_t> saved_vec(saved_all.begin(), saved_all.end());
  std::vector<int32_t> fwd_out(joint.outputs.begin(), joint.outputs.begin() + num_outputs);
  fwd_out.insert(fwd_out.end(), saved_vec.begin(), saved_vec.end());

  for (const ValueGuard& g : value_guards) fwd_out.push_back(g.value);
  if (value_guards.empty()) {
    e.traced_forward = extract(joint, fwd, {}, fwd_out);
  } else {
    split_guards(extract(joint, fwd, {}, fwd_out), value_guards.size(), e.traced_guard,
                 e.traced_forward);
  }
  for (size_t k = 0; k < num_grads; ++k) {
    std::vector<int32_t> boundary(saved_per[k].begin(), saved_per[k].end());
    e.traced_backward.push_back(extract(joint, bwd_sets[k], boundary, bwd_roots[k]));
    Entry::Backward b;
    b.joint = k == grads.grads.size();
    b.output = b.joint ? 0 : grads.diff_outputs[k];
    for (int32_t v : boundary)
      b.saved.push_back(
          size_t(std::lower_bound(saved_vec.begin(), saved_vec.end(), v) - saved_vec.begin()));
    e.backward.push_back(std::move(b));
  }
}

}  // namespace duet::detail
