#include "trace/plan/executor.h"

#include "core/dist.h"

#include <algorithm>
#include <atomic>
#include <exception>

#include <omp.h>

#include "core/anomaly.h"
#include "core/dispatch.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "core/tensor_impl.h"
#include "eager/autograd.h"
#include "kernels/cpu_kernels.h"
#include "kernels/loops.h"
#include "trace/plan/codegen.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {

namespace {
std::atomic<bool> g_verify_plans{false};
}
void set_verify_plans(bool on) { g_verify_plans.store(on); }
bool verify_plans() { return g_verify_plans.load(std::memory_order_relaxed); }

PlanOptions PlanOptions::from_disabled(const std::vector<std::string>& disabled) {
  // DUET_DISABLE_PLAN_PASSES=fuse,plan_memory switches plan passes off everywhere (debugging).
  const char* env = std::getenv("DUET_DISABLE_PLAN_PASSES");
  const std::string extra = env ? env : "";
  auto on = [&](const char* p) {
    return std::find(disabled.begin(), disabled.end(), p) == disabled.end() &&
           extra.find(p) == std::string::npos;
  };
  PlanOptions o;
  o.fuse = on("fuse");
  o.codegen = on("codegen");
  o.plan_memory = on("plan_memory");
  o.parallel = on("parallel");
  o.hoist = on("hoist");
  o.cuda_graph = on("cuda_graph");
  o.donate = on("donate");
  o.disabled = disabled;
  return o;
}

// Copies src into dst with the Copy kernel (no dispatch, no tape).
void copy_into(const Tensor& dst, const Tensor& src) {
  const Tensor* in[] = {&src};
  op_def(OpId::Copy).kernel[static_cast<int>(dst.device().type)](TensorRefs(in, 1), Attrs{}, dst);
}

namespace {

// Row t of x along dim 0, as a view.
Tensor row(const Tensor& x, int64_t t) {
  const TensorImpl* a = x.unsafe_impl();
  Shape s(a->shape.data() + 1, a->shape.size() - 1);
  Strides st(a->strides.data() + 1, a->strides.size() - 1);
  return make_view(x, s, st, a->offset + t * a->strides[0]);
}

bool truth(const Tensor& t) { return read_double(t, 0) != 0; }

/// Collapses dims [lo, hi) of `st` (aligned to `shape`) into one stride; false when no single
/// stride walks them in row-major order.
bool collapse(const int64_t* st, const Shape& shape, int64_t lo, int64_t hi, int64_t* out) {
  int64_t stride = 0, size = 1;
  bool any = false;
  for (int64_t d = hi - 1; d >= lo; --d) {
    if (shape[d] == 1) continue;
    if (!any) {
      stride = st[d];
      size = shape[d];
      any = true;
    } else if (st[d] == stride * size) {
      size *= shape[d];
    } else {
      return false;
    }
  }
  *out = stride;
  return true;
}

}  // namespace

Plan::Plan(Graph graph, PlanOptions options)
    : graph_(copy_unviewable_views(std::move(graph), options.share.get())), opt_(options) {
  build();
  find_epilogues();
  prepare_graph_replay();
}
Plan::~Plan() = default;

std::string Plan::check_memory() const {
  if (!opt_.plan_memory) return "";
  return check_memory_plan(requests_, memory_, regions_);
}

std::string Plan::schedule_str() const {
  std::string s;
  for (const Step& st : steps_) {
    if (st.kind == StepKind::Fused) {
      const FusedStep& f = *fused_[st.out];
      s += fmt::format("fused {} -> {}", f.shape, f.outputs.size());
      s += "\n" + f.kernel->program.str();
    } else if (st.kind == StepKind::Control) {
      const ControlStep& c = *controls_[st.out];
      s += fmt::format("{} -> {} results, {} subplans\n", c.cf->name(), c.projects.size(),
                       c.plans.size());
    } else {
      s += fmt::format("%{} = {}\n", st.out, st.def->name);
    }
  }
  return s;
}

void Plan::run_fused(FusedStep& f) {
  const kernels::FusedProgram& p = f.kernel->program;
  kernels::DuetFusedArgs a{};
  const Shape& S = f.shape;
  const int64_t nd = S.size();
  // The split of the iteration into [outer, inner] (Note [Fused iteration]).
  int64_t split = 0;
  int64_t aligned[DUET_FUSED_MAX_INPUTS][16];
  auto align = [&](const Tensor& t, int64_t* st) {
    const TensorImpl* x = t.unsafe_impl();
    const int64_t lead = nd - x->ndim();
    for (int64_t d = 0; d < nd; ++d)
      st[d] = (d < lead || x->shape[d - lead] == 1) ? 0 : x->strides[d - lead];
  };
  DUET_ASSERT(nd <= 16, "[fused] {} dims", nd);
  auto input = [&](size_t k) -> const Tensor& {
    return k < f.device_consts.size() && f.device_consts[k].defined() ? f.device_consts[k]
                                                                      : vals_[f.inputs[k]];
  };
  for (size_t k = 0; k < f.inputs.size(); ++k) align(input(k), aligned[k]);
  if (p.reduce == kernels::FusedReduce::Inner) {
    split = nd - f.reduce_dims;
  } else if (p.reduce == kernels::FusedReduce::Outer) {
    split = f.reduce_dims;
  } else {
    // The split that the most inputs walk with one stride per side, with the longest rows.
    int best = -1;
    for (int64_t sp = 0; sp <= nd; ++sp) {  // as many dims inner as possible
      int ok = 0;
      for (size_t k = 0; k < f.inputs.size(); ++k) {
        int64_t x, y;
        ok += collapse(aligned[k], S, 0, sp, &x) && collapse(aligned[k], S, sp, nd, &y);
      }
      if (ok > best) {
        best = ok;
        split = sp;
      }
      if (ok == static_cast<int>(f.inputs.size())) break;
    }
  }
  a.outer = 1;
  a.inner = 1;
  for (int64_t d = 0; d < nd; ++d) (d < split ? a.outer : a.inner) *= S[d];
  for (size_t k = 0; k < f.inputs.size(); ++k) {
    const Tensor* t = &input(k);
    int64_t so, si;
    if (!collapse(aligned[k], S, 0, split, &so) || !collapse(aligned[k], S, split, nd, &si)) {
      // No 2-D walk reads it: a dense copy at the iteration shape for this run.
      Strides st;
      st.resize(nd);
      for (int64_t d = 0; d < nd; ++d) st[d] = aligned[k][d];
      Tensor view = make_view(*t, S, st, t->storage_offset());
      Tensor dense = empty(S, t->dtype(), t->device());
      copy_into(dense, view);
      f.tmp.push_back(dense);
      t = &f.tmp.back();
      align(*t, aligned[k]);
      collapse(aligned[k], S, 0, split, &so);
      collapse(aligned[k], S, split, nd, &si);
    }
    a.in[k] = t->unsafe_impl()->data();
    a.in_so[k] = so;
    a.in_si[k] = si;
  }
  for (size_t o = 0; o < f.outputs.size(); ++o) {
    Tensor& v = vals_[f.outputs[o]];
    if (f.fresh[o]) {
      const TensorMeta& m = graph_.nodes[f.outputs[o]].meta;
      v = empty(m.shape, m.dtype, m.device);
    }
    a.out[o] = v.unsafe_impl()->data();
  }
  if (f.reduction >= 0) {
    Tensor& v = vals_[f.reduction];
    if (f.fresh_reduction) {
      const TensorMeta& m = graph_.nodes[f.reduction].meta;
      v = empty(m.shape, m.dtype, m.device);
    }
    a.red_out = v.unsafe_impl()->data();
  }
  if (f.device.is_cpu()) {
    f.kernel->run(a);
    codegen_note_run(f.kernel);
  } else {
    const kernels::FusedDeviceRunner* r = kernels::fused_device_runner(f.device.type);
    DUET_ASSERT(r, "[fused] no fused runner for {}", f.device);
    if (!f.prepared) {
      kernels::FusedKernel* k = f.kernel.get();
      r->prepare(&k, 1, f.device, codegen::cache_dir());
      f.prepared = true;
    }
    r->run(*f.kernel, a, f.device);
  }
  if (!f.tmp.empty()) f.tmp.clear();
}

void Plan::prepare_device_kernels() {
  device_kernels_ready_ = true;
  // Each device's unprepared steps in one call: the first such step names the device.
  for (const auto& first : fused_) {
    if (first->device.is_cpu() || first->prepared) continue;
    const Device d = first->device;
    std::vector<kernels::FusedKernel*> ks;
    for (const auto& f : fused_)
      if (f->device == d && !f->prepared) ks.push_back(f->kernel.get());
    const kernels::FusedDeviceRunner* r = kernels::fused_device_runner(d.type);
    DUET_ASSERT(r, "[fused] no fused runner for {}", d);
    r->prepare(ks.data(), ks.size(), d, codegen::cache_dir());
    for (const auto& f : fused_)
      if (f->device == d) f->prepared = true;
  }
}

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) {
  if (__builtin_expect(!profiling(), 1)) return run_unprofiled(inputs);
  // One event for the call, enclosing its steps' events.
  const double t0 = profile_clock_us();
  std::vector<Tensor> out = run_unprofiled(inputs);
  profile_event(fmt::format("plan of {}", graph_.label), "compiled", t0, profile_clock_us(),
                fmt::format("\"steps\": {}, \"cuda_graph\": {}", steps_.size(),
                            cuda_graph_ ? "true" : "false"));
  return out;
}

std::vector<Tensor> Plan::run_unprofiled(const std::vector<Tensor>& inputs) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  // The function's shared arenas too (Note [One arena per function] in plan_build.cpp).
  std::unique_lock<std::mutex> arenas;
  if (lock.owns_lock() && shares_arena_) {
    arenas = std::unique_lock<std::mutex>(opt_.arenas->busy, std::try_to_lock);
    if (!arenas.owns_lock()) lock.unlock();
  }
  if (!lock.owns_lock()) {
    // Busy: re-entered, or called from another thread. A spare copy of the plan runs the call;
    // spares are kept, so that threads calling one plan side by side build each copy once.
    std::unique_ptr<Plan> spare;
    {
      std::lock_guard<std::mutex> l(spares_mu_);
      if (!spares_.empty()) {
        spare = std::move(spares_.back());
        spares_.pop_back();
      }
    }
    if (!spare) {
      PlanOptions own = opt_;
      own.arenas = nullptr;  // a spare runs beside the plans that share the function's arenas
      spare = std::make_unique<Plan>(graph_, own);
    }
    std::vector<Tensor> out = spare->run(inputs);
    std::lock_guard<std::mutex> l(spares_mu_);
    spares_.push_back(std::move(spare));
    return out;
  }
  // A graph replays no host steps: while anomaly detection or a profiler is on, the plan runs
  // step by step (each kernel then has its device time, Note [Device time in profiles]).
  if (cuda_graph_ && !anomaly_on() && !profiling()) return run_graphed(inputs);
  return execute(inputs);
}

void Plan::run_hoisted_if_stale() {
  if (hoisted_steps_.empty()) return;
  bool stale = !hoisted_ready_;
  for (auto& [st, version] : hoist_versions_)
    stale = stale || st->version_.load(std::memory_order_relaxed) != version;
  if (!stale) return;
  // A hoisted view that no strides express is a fresh copy at each run, at a new address. A
  // CUDA graph captured earlier reads the old one: the new values go into the old buffer.
  std::vector<Tensor> before;
  for (const Step& st : hoisted_steps_)
    if (st.kind == StepKind::View) before.push_back(vals_[st.out]);
  run_steps(hoisted_steps_);
  size_t k = 0;
  for (const Step& st : hoisted_steps_) {
    if (st.kind != StepKind::View) continue;
    Tensor& now = vals_[st.out];
    const Tensor& old = before[k++];
    if (old.defined() && now.defined() && !old.is_same(now) &&
        old.unsafe_impl()->data() != now.unsafe_impl()->data() && old.sizes() == now.sizes() &&
        old.dtype() == now.dtype() && old.device() == now.device()) {
      copy_into(old, now);
      now = old;
    }
  }
  for (auto& [st, version] : hoist_versions_)
    version = st->version_.load(std::memory_order_relaxed);
  hoisted_ready_ = true;
}

void Plan::run_steps(const std::vector<Step>& steps) {
  run_steps_range(steps.data(), steps.data() + steps.size());
}

// Runs the step at sp (and the one after it, when a GEMM epilogue does its work); returns the
// last step it ran.
const Plan::Step* Plan::run_one(const Step* sp, const Step* end) {
  const Step& s = *sp;
  // An error a kernel raises names the line that made the step's node (core/call_site.h).
  detail::SiteGuard site(step_site(s));
  // A matmul and the bias (+ relu) group after it, as one GEMM when the device takes it.
  if (!epilogues_.empty() && sp + 1 != end && steps_.data() <= sp &&
      sp < steps_.data() + steps_.size()) {
    const int32_t e = step_epilogue_[static_cast<size_t>(sp - steps_.data())];
    if (e >= 0) {
      const Epilogue& ep = epilogues_[e];
      TensorRefs refs(args_.data() + s.first_arg, s.num_args);
      const TensorMeta& m = graph_.nodes[ep.out].meta;
      Tensor& out = vals_[ep.out];
      if (ep.fresh) out = empty(m.shape, m.dtype, m.device);
      if (kernels::gemm_epilogue(m.device.type)(refs[0], refs[1], vals_[ep.bias], ep.relu, out)) {
        return sp + 1;  // the next step's work is done
      }
    }
  }
  if (s.kind == StepKind::Fused) {
    run_fused(*fused_[s.out]);
    return sp;
  }
  if (s.kind == StepKind::Control) {
    run_control(*controls_[s.out]);
    return sp;
  }
  const GraphNode& g = graph_.nodes[s.out];
  TensorRefs refs(args_.data() + s.first_arg, s.num_args);
  if (s.kind == StepKind::View) {
    Tensor v = s.def->view(refs[0], g.attrs, g.meta);
    if (!v.defined()) v = s.def->view(refs[0].contiguous(), g.attrs, g.meta);
    vals_[s.out] = std::move(v);
    return sp;
  }
  if (s.fresh) vals_[s.out] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
  s.kernel(refs, g.attrs, vals_[s.out]);
  return sp;
}

// The profiler's name of a step (Note [Profiler] in core/profiler.h): its op, or a fused
// group's ops in program order ("fused(mul, tanh, sum)").
std::string Plan::step_name(const Step& s) const {
  if (s.kind == StepKind::Fused) {
    const kernels::FusedProgram& p = fused_[s.out]->kernel->program;
    std::string ops;
    for (const kernels::FusedInstr& in : p.code)
      if (in.op != OpId::Copy) ops += fmt::format("{}{}", ops.empty() ? "" : ", ", op_name(in.op));
    if (p.reduce != kernels::FusedReduce::None)
      ops += fmt::format("{}{}", ops.empty() ? "" : ", ", op_name(p.reduce_op));
    return fmt::format("fused({})", ops);
  }
  if (s.kind == StepKind::Control) return "control flow";
  return std::string(s.def->name);
}

// Whether no tensor of ts holds a NaN or an infinity.
static bool all_finite(const std::vector<Tensor>& ts) {
  std::vector<const Tensor*> p;
  for (const Tensor& t : ts) p.push_back(&t);
  return anomaly_all_finite(TensorRefs(p.data(), static_cast<int64_t>(p.size())));
}

// The values a step reads and writes (Note [Anomaly mode in plans]).
void Plan::step_values(const Step& s, std::vector<Tensor>& in, std::vector<Tensor>& out) const {
  in.clear();
  out.clear();
  if (s.kind == StepKind::Fused) {
    const FusedStep& f = *fused_[s.out];
    for (size_t k = 0; k < f.inputs.size(); ++k)
      in.push_back(k < f.device_consts.size() && f.device_consts[k].defined() ? f.device_consts[k]
                                                                              : vals_[f.inputs[k]]);
    for (int32_t o : f.outputs) out.push_back(vals_[o]);
    if (f.reduction >= 0) out.push_back(vals_[f.reduction]);
  } else if (s.kind != StepKind::Control) {
    for (int32_t k = 0; k < s.num_args; ++k) in.push_back(*args_[s.first_arg + k]);
    out.push_back(vals_[s.out]);
  }
}

// Note [Anomaly mode in plans]
// With anomaly detection on (Note [Anomaly mode] in core/anomaly.h), a compiled plan checks
// each step whose inputs are finite: the first whose outputs hold a NaN or an infinity raises
// AnomalyError naming the step and the compiled function. A fused group is then run again op
// by op, eagerly, on its inputs, to name the primitive that made the value. The mode is read
// at every call, so turning it on affects functions already compiled and cached; plans that
// replay CUDA graphs run step by step while it is on (the checks read values on the host).
void Plan::check_step(const Step& s, const std::vector<Tensor>& in) const {
  std::vector<Tensor> ins, outs;
  step_values(s, ins, outs);
  std::string what;
  for (const Tensor& o : outs) {
    if (o.defined()) what = anomaly_describe(o);
    if (!what.empty()) break;
  }
  if (what.empty()) return;
  std::string culprit;
  if (s.kind == StepKind::Fused) culprit = fused_culprit(*fused_[s.out], in);
  auto shapes = [](const std::vector<Tensor>& ts) {
    std::string r;
    for (const Tensor& t : ts)
      r += fmt::format("{}{} {}", r.empty() ? "" : ", ", t.sizes(), t.dtype());
    return r.empty() ? std::string("none") : r;
  };
  throw AnomalyError(::duet::detail::with_context(fmt::format(
      "[anomaly] {} {}, from inputs without any: {}; in {} (a step of its plan){}. Anomaly "
      "detection is on (duet::AnomalyMode or DUET_DETECT_ANOMALY=1)",
      step_name(s), what, shapes(in), graph_.label, culprit)));
}

// The primitive of a fused group that made the first NaN or infinity: the group's program run
// again op by op, eagerly, on the same inputs.
std::string Plan::fused_culprit(const FusedStep& f, const std::vector<Tensor>& in) const {
  const kernels::FusedProgram& p = f.kernel->program;
  SuspendModes eager;
  NoGradGuard no_grad;
  AnomalyPause pause;  // the rerun's own ops are not checked
  try {
    // As the kernel computes: every register in the group's dtype T (a comparison's result is
    // 0 or 1 in T; where reads its condition as != 0).
    std::vector<Tensor> reg(static_cast<size_t>(p.num_regs));
    for (size_t k = 0; k < in.size() && k < reg.size(); ++k) {
      if (!in[k].defined()) return "";
      reg[k] = in[k].to(p.dtype);
    }
    for (size_t n = 0; n < p.code.size(); ++n) {
      const kernels::FusedInstr& ins = p.code[n];
      std::vector<Tensor> src;
      for (int k = 0; k < 3 && ins.src[k] >= 0; ++k) src.push_back(reg[ins.src[k]]);
      Tensor r;
      if (ins.op == OpId::Copy) {
        r = src[0];
      } else if (ins.op == OpId::Cast) {
        r = ins.to == DType::b8 ? ne(src[0], 0.0) : src[0].to(ins.to);
      } else {
        std::vector<Tensor> args = src;
        if (ins.op == OpId::Where) args[0] = ne(src[0], 0.0);
        std::vector<const Tensor*> ptrs;
        for (const Tensor& t : args) ptrs.push_back(&t);
        r = call(ins.op, TensorRefs(ptrs.data(), static_cast<int64_t>(ptrs.size())), Attrs{});
      }
      if (r.dtype() != p.dtype) r = r.to(p.dtype);
      if (all_finite(src) && !all_finite({r})) {
        const CallSite site = n < f.instr_sites.size() ? f.instr_sites[n] : CallSite{};
        return fmt::format("; run op by op, the group's op {} of {} ({}{}) made it", n + 1,
                           p.code.size(), op_name(ins.op),
                           site ? fmt::format(", called at {}", site.str()) : "");
      }
      reg[ins.dst] = std::move(r);
    }
  } catch (const std::exception&) {
    return "";  // the rerun could not name it; the step's report stands
  }
  if (p.reduce != kernels::FusedReduce::None)
    return fmt::format("; run op by op, its ops are finite: the {} over them made it",
                       op_name(p.reduce_op));
  return "";
}

void Plan::run_steps_range(const Step* begin, const Step* end) {
  const bool check = anomaly_on(), prof = profiling();
  if (__builtin_expect(!prof && !check, 1)) {
    for (const Step* sp = begin; sp != end; ++sp) {
      sp = run_one(sp, end);
      // Started collectives move data only inside the transport's calls.
      if (__builtin_expect(dist::detail::g_started.load(std::memory_order_relaxed) > 0, 0))
        dist::detail::progress();
    }
    return;
  }
  // Anomaly checks (Note [Anomaly mode in plans]) and profile events (Note [Profiler]), step
  // by step; either or both.
  std::vector<Tensor> ins, outs;
  for (const Step* sp = begin; sp != end; ++sp) {
    bool clean = false;
    if (check) {
      step_values(*sp, ins, outs);
      clean = sp->kind != StepKind::View && sp->kind != StepKind::Control && all_finite(ins);
    }
    const double t0 = prof ? profile_clock_us() : 0;
    // The step's device time (Note [Device time in profiles]), where it runs on a device.
    DeviceSpan span;
    if (prof && (sp->kind == StepKind::Kernel || sp->kind == StepKind::Fused)) {
      const Device d =
          sp->kind == StepKind::Fused ? fused_[sp->out]->device : graph_.nodes[sp->out].meta.device;
      if (!d.is_cpu()) span = profile_device_begin(d);
    }
    const Step* last = run_one(sp, end);
    if (prof) {
      std::string shape;
      if (sp->kind == StepKind::Fused)
        shape = fmt::format("{}", fused_[sp->out]->shape);
      else if (sp->kind != StepKind::Control)
        shape = fmt::format("{}", graph_.nodes[sp->out].meta.shape);
      const std::string name = step_name(*sp) + (last != sp ? " + epilogue" : "");
      const std::string args = fmt::format("\"plan\": \"{}\", \"shape\": \"{}\", \"site\": \"{}\"",
                                           graph_.label, shape, step_site(*sp).str());
      profile_device_end(span, name, args);
      profile_event(name, "step", t0, profile_clock_us(), args);
    }
    if (clean) {
      // A GEMM epilogue ran two steps: the second's outputs are the pair's.
      if (last != sp) step_values(*last, ins, outs);
      check_step(*last, ins);
    }
    sp = last;
  }
}

void Plan::run_step(const Step& s) { run_steps_range(&s, &s + 1); }

CallSite Plan::step_site(const Step& s) const {
  if (s.kind == StepKind::Fused) {
    const FusedStep& f = *fused_[s.out];
    const int32_t v = f.outputs.empty() ? f.reduction : f.outputs.back();
    return v >= 0 ? graph_.nodes[v].site : CallSite{};
  }
  return s.out >= 0 && s.out < int32_t(graph_.nodes.size()) ? graph_.nodes[s.out].site : CallSite{};
}

void Plan::run_control(ControlStep& c) {
  const ControlFlow& cf = *c.cf;
  std::vector<Tensor> in;
  in.reserve(c.inputs.size());
  for (int32_t v : c.inputs) in.push_back(vals_[v]);
  std::vector<Tensor> out;
  // A result that is an input of the node itself (no step ran) gets a buffer of its own.
  auto own = [](const Tensor& t) {
    Tensor c = empty(t.sizes(), t.dtype(), t.device());
    copy_into(c, t);
    return c;
  };
  switch (cf.kind) {
    case ControlKind::Cond:
      out = c.plans[truth(in[0]) ? 0 : 1]->run(std::vector<Tensor>(in.begin() + 1, in.end()));
      break;
    case ControlKind::Scan: {
      const int64_t nc = cf.num_carry, nx = cf.num_xs;
      const int64_t length = in[nc].sizes()[0];
      std::vector<Tensor> args = in;  // carry..., x_t..., free...
      std::vector<Tensor> ys;
      for (size_t k = size_t(nc); k < cf.results.size(); ++k) {
        Shape s = cf.results[k].shape;
        s[0] = length;
        ys.push_back(empty(s, cf.results[k].dtype, cf.results[k].device));
      }
      for (int64_t s = 0; s < length; ++s) {
        const int64_t t = cf.reverse ? length - 1 - s : s;
        for (int64_t i = 0; i < nx; ++i) args[nc + i] = row(in[nc + i], t);
        std::vector<Tensor> r = c.plans[0]->run(args);
        for (int64_t k = 0; k < nc; ++k) args[k] = std::move(r[k]);
        for (size_t j = 0; j < ys.size(); ++j) copy_into(row(ys[j], t), r[nc + j]);
      }
      for (int64_t k = 0; k < nc; ++k) out.push_back(length > 0 ? args[k] : own(args[k]));
      for (Tensor& y : ys) out.push_back(std::move(y));
      break;
    }
    case ControlKind::WhileLoop: {
      const int64_t nc = cf.num_carry;
      std::vector<Tensor> args = in;  // state..., free...
      bool ran = false;
      while (truth(c.plans[0]->run(args)[0])) {
        std::vector<Tensor> r = c.plans[1]->run(args);
        for (int64_t k = 0; k < nc; ++k) args[k] = std::move(r[k]);
        ran = true;
      }
      for (int64_t k = 0; k < nc; ++k) out.push_back(ran ? args[k] : own(args[k]));
      break;
    }
  }
  for (size_t k = 0; k < c.projects.size(); ++k)
    if (c.projects[k] >= 0) vals_[c.projects[k]] = std::move(out[k]);
}

// Note [Parallel waves]: each wave's steps run on the OpenMP threads, one step per thread at a
// time; a kernel inside finds itself in a parallel region and stays on its thread.
void Plan::run_waves() {
  const int32_t nw = static_cast<int32_t>(wave_begin_.size());
  for (int32_t w = 0; w < nw; ++w) {
    const int32_t b = wave_begin_[w];
    const int32_t e = w + 1 < nw ? wave_begin_[w + 1] : static_cast<int32_t>(steps_.size());
    if (!wave_parallel_[step_wave_[b]]) {  // one step, or cheaper in order
      run_steps_range(steps_.data() + b, steps_.data() + e);
      continue;
    }
    std::exception_ptr error;
    std::mutex error_lock;
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
    for (int32_t i = b; i < e; ++i) {
      try {
        run_step(steps_[i]);
      } catch (...) {
        std::lock_guard<std::mutex> l(error_lock);
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }
}

void Plan::check_regions() {
  for (size_t g = 0; g < regions_.size(); ++g) {
    const Tensor& target = graph_.captured[region_target_[g]];
    const StorageImpl* st = target.unsafe_impl()->storage.get();
    DUET_CHECK_VALUE(st == region_storage_[g],
                     "[compile] plan of {}: captured tensor {} (shape {}, {}) was given new "
                     "storage after the plan was built (Module::to?); compile the function again",
                     graph_.label, region_target_[g], target.sizes(), target.dtype());
    for (int32_t v : slot_value_)
      if (v >= 0 && vals_[v].defined() && vals_[v].unsafe_impl()->storage.get() == st)
        vals_[v] = vals_[v].clone();
  }
}

std::vector<Tensor> Plan::execute(const std::vector<Tensor>& inputs) {
  DUET_ASSERT(int32_t(inputs.size()) == graph_.num_runtime_inputs, "plan of {} given {} inputs",
              graph_.num_runtime_inputs, inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (slot_value_[k] >= 0) vals_[slot_value_[k]] = inputs[k];
  if (!regions_.empty()) check_regions();
  if (!device_kernels_ready_) prepare_device_kernels();
  struct Clear {  // drop per-run references (the caller's tensors) even when a kernel throws
    Plan* p;
    ~Clear() {
      for (int32_t v : p->dynamic_) p->vals_[v] = Tensor();
    }
  } clear{this};
  run_hoisted_if_stale();
  if (wave_begin_.empty())
    run_steps(steps_);
  else
    run_waves();
  std::vector<Tensor> out;
  out.reserve(graph_.outputs.size());
  for (size_t k = 0; k < graph_.outputs.size(); ++k) {
    const Tensor& v = vals_[graph_.outputs[k]];
    if (clone_output_[k]) {
      out.push_back(v.clone());
    } else if (alias_output_[k]) {
      const TensorImpl* x = v.unsafe_impl();
      out.push_back(make_view(v, x->shape, x->strides, x->offset));
    } else {
      out.push_back(v);
    }
  }
  if (!graph_.writebacks.empty()) {
    const OpDef& copy = op_def(OpId::Copy);
    std::vector<Tensor> staged(graph_.writebacks.size());
    for (size_t k = 0; k < graph_.writebacks.size(); ++k)
      if (stage_writeback_[k]) staged[k] = vals_[graph_.writebacks[k].value].clone();
    for (size_t k = 0; k < graph_.writebacks.size(); ++k) {
      const WriteBack& w = graph_.writebacks[k];
      const Tensor& src = stage_writeback_[k] ? staged[k] : vals_[w.value];
      const Tensor& dst = graph_.captured[w.target];
      const TensorImpl* a = src.unsafe_impl();
      const TensorImpl* b = dst.unsafe_impl();
      if (inplace_writeback_[k]) {  // computed in place
        b->storage->version_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (a->storage.get() == b->storage.get() && a->offset == b->offset &&
          a->strides == b->strides)
        continue;  // already there
      const Tensor* in[] = {&src};
      copy.kernel[static_cast<int>(b->device().type)](TensorRefs(in, 1), Attrs{}, dst);
      b->storage->version_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return out;
}

}  // namespace duet::detail
