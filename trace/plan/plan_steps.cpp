// duet: the last stage of building a plan (trace/plan/plan_build.cpp runs the others): its
// steps, one per unit (a fused kernel, a control-flow node, or one op), each with the buffers its
// values were given; then the GEMMs whose bias and activation run as their epilogue.
#include <algorithm>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "eager/autograd.h"
#include "kernels/loops.h"
#include "trace/ir/passes.h"
#include "trace/plan/codegen.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {

namespace {

// The first `count` results of g, each in a buffer of its own: one that is an input, a view of
// one, or the buffer of an earlier result gets a copy (Note [Control steps]).
Graph ensure_fresh_results(Graph g, size_t count) {
  std::vector<int32_t> roots;
  for (size_t k = 0; k < count && k < g.outputs.size(); ++k) {
    const int32_t r = buffer_root(g, g.outputs[k]);
    bool copy = g.nodes[r].kind == NodeKind::Input;
    for (int32_t q : roots) copy = copy || (q == r && g.nodes[r].kind != NodeKind::Constant);
    roots.push_back(r);
    if (!copy) continue;
    GraphNode c;
    c.kind = NodeKind::Op;
    c.op = OpId::Copy;
    c.inputs = {g.outputs[k]};
    c.meta = g.nodes[g.outputs[k]].meta;
    g.outputs[k] = g.add(std::move(c));
  }
  return g;
}

/// A tensor over `storage` at a byte offset (the arena's buffers).
Tensor tensor_in(const StoragePtr& storage, int64_t byte_offset, const TensorMeta& m) {
  auto* t = new TensorImpl();
  TensorImplPtr p = TensorImplPtr::adopt(t);
  t->dtype = m.dtype;
  t->shape = m.shape;
  t->strides = contiguous_strides(m.shape);
  t->offset = byte_offset / static_cast<int64_t>(itemsize(m.dtype));
  t->storage = storage;
  return Tensor(std::move(p));
}

}  // namespace

void Plan::Builder::make_steps() {
  is_static.assign(n, false);
  plan.region_values_.assign(plan.regions_.size(), {});
  for (int32_t t : plan.region_target_)
    plan.region_storage_.push_back(graph.captured[t].unsafe_impl()->storage.get());
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = graph.nodes[i];
    if (g.kind == NodeKind::Constant) {
      plan.vals_[i] = g.constant;
      is_static[i] = true;
    } else if (g.kind == NodeKind::Input) {
      if (g.role == InputRole::Captured) {
        plan.vals_[i] = graph.captured[g.index];
        is_static[i] = true;
      } else {
        plan.slot_value_[g.index] = i;
        plan.dynamic_.push_back(i);
      }
    }
  }
  for (int32_t s = 0; s < num_steps; ++s) {
    const int32_t u = order[s];
    if (u < ng)
      make_fused_step(u);
    else if (graph.nodes[u - ng].kind == NodeKind::Control)
      make_control_step(u);
    else
      make_op_step(u);
  }
}

void Plan::Builder::count_buffer(const TensorMeta& m) {
  stats.buffer_bytes += meta_nbytes(m);
  if (!m.device.is_cpu()) stats.device_buffer_bytes += meta_nbytes(m);
}

// The tensor of value v, a step's result: its captured tensor (computed in place), a buffer of
// its own (hoisted), its place in the arena, or none yet (allocated at every run).
void Plan::Builder::set_buffer(int32_t v) {
  const GraphNode& g = graph.nodes[v];
  if (inplace[v] >= 0) {
    plan.vals_[v] = graph.captured[inplace[v]];
    is_static[v] = true;
  } else if (hoisted[v]) {
    plan.vals_[v] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
    count_buffer(g.meta);
    is_static[v] = true;
  } else if (request_of[v] >= 0 && opt.plan_memory && plan.memory_.region[request_of[v]] >= 0) {
    // In a write-back target while its old value is dead (Note [Intermediates in dead
    // write-back targets] in trace/plan/plan_build.cpp).
    const auto r = static_cast<size_t>(plan.memory_.region[request_of[v]]);
    plan.region_values_[r].push_back(v);
    const TensorImpl* d = graph.captured[plan.region_target_[r]].unsafe_impl();
    const int64_t base = d->offset * static_cast<int64_t>(itemsize(d->dtype));
    plan.vals_[v] = tensor_in(d->storage, base + plan.memory_.offsets[request_of[v]], g.meta);
    is_static[v] = true;
  } else if (request_of[v] >= 0) {
    if (opt.plan_memory)
      if (const StoragePtr& arena = arenas[plan.requests_[request_of[v]].pool])
        plan.vals_[v] = tensor_in(arena, plan.memory_.offsets[request_of[v]], g.meta);
      else
        plan.vals_[v] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
    else
      plan.vals_[v] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
    if (!opt.plan_memory) count_buffer(g.meta);
    is_static[v] = true;
  }
  if (!is_static[v]) plan.dynamic_.push_back(v);
}

void Plan::Builder::make_fused_step(int32_t u) {
  FusionGroup& f = groups[u];
  auto fs = std::make_unique<FusedStep>();
  if (shared_groups) {
    std::lock_guard<std::mutex> lock(opt.share->mu);
    fs->kernel = opt.share->kernels[u];
  }
  const bool made = !fs->kernel;
  if (made) {
    fs->kernel = std::make_shared<kernels::FusedKernel>();
    fs->kernel->program = std::move(f.program);
    fs->kernel->codegen_allowed = opt.codegen;
  }
  for (int32_t m : f.members)
    if (m != f.reduction) fs->instr_sites.push_back(graph.nodes[m].site);
  // The ops' call sites, in program order, each line once with its ops.
  std::vector<std::pair<std::string, std::string>> by_site;
  for (int32_t m : f.members) {
    const GraphNode& n = graph.nodes[m];
    if (n.kind != NodeKind::Op) continue;
    const std::string where = n.site ? n.site.str() : "(no call site)";
    auto it = std::find_if(by_site.begin(), by_site.end(),
                           [&](const auto& p) { return p.first == where; });
    if (it == by_site.end())
      by_site.emplace_back(where, op_name(n.op));
    else
      it->second += fmt::format(", {}", op_name(n.op));
  }
  for (const auto& [where, ops] : by_site)
    if (made)
      fs->kernel->sites +=
          fmt::format("{}{} {}", fs->kernel->sites.empty() ? "" : "; ", where, ops);
  if (made && shared_groups) {
    std::lock_guard<std::mutex> lock(opt.share->mu);
    if (!opt.share->kernels[u]) opt.share->kernels[u] = fs->kernel;
  }
  fs->inputs = f.inputs;
  fs->outputs = f.outputs;
  for (int32_t o : f.outputs) {
    fs->fresh.push_back(fresh[o]);
    set_buffer(o);
  }
  fs->reduction = f.reduction;
  if (f.reduction >= 0) {
    fs->fresh_reduction = fresh[f.reduction];
    set_buffer(f.reduction);
  }
  fs->reduce_dims = f.reduce_dims;
  fs->shape = f.shape;
  fs->device = graph.nodes[f.members[0]].meta.device;
  if (made && fs->device.is_cpu()) codegen_probe(fs->kernel);  // a shared kernel was probed
  if (!fs->device.is_cpu()) {
    // One-element CPU constants (wrapped numbers) go to the device once (trace/plan/fusion.h).
    fs->device_consts.resize(f.inputs.size());
    for (size_t k = 0; k < f.inputs.size(); ++k) {
      const GraphNode& in = graph.nodes[f.inputs[k]];
      if (in.kind == NodeKind::Constant && !(in.meta.device == fs->device)) {
        SuspendModes eager;
        NoGradGuard no_grad;
        fs->device_consts[k] = in.constant.to(fs->device);
      }
    }
  }
  stats.fused_kernels += 1;
  stats.fused_nodes += static_cast<int64_t>(f.members.size());
  (hoisted_unit[u] ? plan.hoisted_steps_ : plan.steps_)
      .push_back(Step{StepKind::Fused, nullptr, nullptr, static_cast<int32_t>(plan.fused_.size()),
                      0, 0, false});
  if (!hoisted_unit[u]) plan.step_wave_.push_back(wave_of[u]);
  plan.fused_.push_back(std::move(fs));
}

// A Control node's step: a plan per subgraph (Note [Control steps]).
void Plan::Builder::make_control_step(int32_t u) {
  const GraphNode& g = graph.nodes[u - ng];
  auto c = std::make_unique<ControlStep>();
  c->cf = g.control;
  c->inputs = g.inputs;
  c->projects.assign(g.control->results.size(), -1);
  for (int32_t v : unit_nodes[u])
    if (graph.nodes[v].kind == NodeKind::Project) {
      c->projects[graph.nodes[v].index] = v;
      plan.dynamic_.push_back(v);
    }
  const ControlFlow& cf = *g.control;
  for (size_t k = 0; k < cf.graphs.size(); ++k) {
    size_t fresh_count = cf.graphs[k].outputs.size();  // cond branches, while_loop body
    if (cf.kind == ControlKind::Scan) fresh_count = size_t(cf.num_carry);
    if (cf.kind == ControlKind::WhileLoop && k == 0) fresh_count = 0;
    PlanOptions sub = opt;
    sub.share = nullptr;   // another graph
    sub.arenas = nullptr;  // it runs while this plan holds the function's arenas
    c->plans.push_back(
        std::make_unique<Plan>(ensure_fresh_results(cf.graphs[k], fresh_count), std::move(sub)));
  }
  plan.steps_.push_back(Step{StepKind::Control, nullptr, nullptr,
                             static_cast<int32_t>(plan.controls_.size()), 0, 0, false});
  plan.step_wave_.push_back(wave_of[u]);
  plan.controls_.push_back(std::move(c));
}

// An op node's step: a kernel, or a view (none when the view is static: made here, once).
void Plan::Builder::make_op_step(int32_t u) {
  const int32_t i = u - ng;
  const GraphNode& g = graph.nodes[i];
  const OpDef& def = op_def(g.op);
  if (def.cls == OpClass::View && is_static[g.inputs[0]]) {
    Tensor v = def.view(plan.vals_[g.inputs[0]], g.attrs, g.meta);
    if (v.defined()) {  // else no strides express it: a copy at every run
      plan.vals_[i] = v;
      is_static[i] = true;
      return;
    }
  }
  Step st{def.cls == OpClass::View ? StepKind::View : StepKind::Kernel,
          &def,
          nullptr,
          i,
          static_cast<int32_t>(plan.args_.size()),
          static_cast<int32_t>(g.inputs.size()),
          fresh[i]};
  if (def.cls != OpClass::View) {
    st.kernel = def.kernel[static_cast<int>(g.meta.device.type)];
    DUET_CHECK_DEVICE(st.kernel, "[{}] has no kernel for device {} ({})", def.name, g.meta.device,
                      graph.label);
    set_buffer(i);
  } else if (!hoisted_unit[u]) {
    plan.dynamic_.push_back(i);  // a hoisted view keeps its value between runs
  }
  for (int32_t in : g.inputs) plan.args_.push_back(&plan.vals_[in]);
  (hoisted_unit[u] ? plan.hoisted_steps_ : plan.steps_).push_back(st);
  if (!hoisted_unit[u]) plan.step_wave_.push_back(wave_of[u]);
}

void Plan::find_epilogues() {
  step_epilogue_.assign(steps_.size(), -1);
  if (!wave_begin_.empty()) return;  // steps in order only
  std::vector<int32_t> readers(graph_.nodes.size(), 0);
  for (const GraphNode& n : graph_.nodes)
    for (int32_t in : n.inputs) ++readers[in];
  for (int32_t o : graph_.outputs) ++readers[o];
  for (const WriteBack& w : graph_.writebacks) ++readers[w.value];
  for (size_t i = 0; i + 1 < steps_.size(); ++i) {
    const Step& s = steps_[i];
    const Step& t = steps_[i + 1];
    if (s.kind != StepKind::Kernel || (t.kind != StepKind::Fused && t.kind != StepKind::Kernel))
      continue;
    const GraphNode& mm = graph_.nodes[s.out];
    if (mm.op != OpId::MatMul || mm.meta.shape.size() != 2 || readers[s.out] != 1 ||
        !kernels::gemm_epilogue(mm.meta.device.type))
      continue;
    // The bias: the add's other operand, of the product's dtype and device, along its last dim.
    auto bias_ok = [&](int32_t v) {
      const GraphNode& bias = graph_.nodes[v];
      const int64_t n = mm.meta.shape[1];
      return bias.kind != NodeKind::Constant && bias.meta.dtype == mm.meta.dtype &&
             bias.meta.device == mm.meta.device && bias.meta.shape.numel() == n &&
             (bias.meta.shape.size() == 1 ||
              (bias.meta.shape.size() == 2 && bias.meta.shape[0] == 1));
    };
    Epilogue ep{};
    if (t.kind == StepKind::Kernel) {  // a lone add (a group of one op runs its eager kernel)
      const GraphNode& add = graph_.nodes[t.out];
      if (add.op != OpId::Add || add.inputs.size() != 2 || add.meta.dtype != mm.meta.dtype ||
          add.meta.shape != mm.meta.shape)
        continue;
      const int km = add.inputs[0] == s.out ? 0 : add.inputs[1] == s.out ? 1 : -1;
      if (km < 0 || !bias_ok(add.inputs[1 - km])) continue;
      ep = {t.out, add.inputs[1 - km], false, t.fresh};
    } else {
      const FusedStep& f = *fused_[t.out];
      const kernels::FusedProgram& p = f.kernel->program;
      if (f.reduction >= 0 || f.outputs.size() != 1 || p.num_inputs() != 2 ||
          p.dtype != mm.meta.dtype)
        continue;
      const int km = f.inputs[0] == s.out ? 0 : f.inputs[1] == s.out ? 1 : -1;
      if (km < 0 || !bias_ok(f.inputs[1 - km])) continue;
      // add(r_mm, r_bias) in either order, then maybe relu; the last value is the output.
      const std::vector<kernels::FusedInstr>& code = p.code;
      if (code.empty() || code.size() > 2 || code[0].op != OpId::Add) continue;
      const bool operands = (code[0].src[0] == km && code[0].src[1] == 1 - km) ||
                            (code[0].src[1] == km && code[0].src[0] == 1 - km);
      const bool relu = code.size() == 2;
      if (!operands || (relu && (code[1].op != OpId::Relu || code[1].src[0] != code[0].dst)) ||
          p.outputs[0] != code.back().dst || p.out_dtypes[0] != p.dtype)
        continue;
      ep = {f.outputs[0], f.inputs[1 - km], relu, static_cast<bool>(f.fresh[0])};
    }
    step_epilogue_[i] = static_cast<int32_t>(epilogues_.size());
    epilogues_.push_back(ep);
    ++stats_.gemm_epilogues;
  }
}

}  // namespace duet::detail
