// duet: building a plan (trace/plan/executor.h): its schedule, parallel waves, write-backs computed
// in place, hoisted steps and buffers, one section of Plan::Builder each, run in that order; its
// steps are made last, in trace/plan/plan_steps.cpp.
#include <algorithm>
#include <unordered_map>

#include <omp.h>

#include "core/dispatch.h"
#include "core/tensor_impl.h"
#include "eager/autograd.h"
#include "kernels/loops.h"
#include "kernels/matrices.h"
#include "trace/plan/codegen.h"
#include "trace/plan/fusion.h"
#include "trace/ir/passes.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {

std::shared_ptr<FusionShare> make_fusion_share() { return std::make_shared<FusionShare>(); }

void Plan::build() { Builder(*this).build(); }

void Plan::Builder::build() {
  plan.vals_.assign(n, Tensor());
  plan.slot_value_.assign(graph.num_runtime_inputs, -1);
  find_roots_and_results();
  find_units();
  schedule();
  find_waves();
  choose_parallel();
  place_steps();
  find_inplace_writebacks();
  hoist();
  request_buffers();
  find_donated_regions();
  plan_arena();
  measure_memory();
  if (opt.measure_only) return;
  SuspendModes eager;  // static views, buffers and subplans are made eagerly
  make_steps();
  // plan.args_ grew while steps were made: its pointers point into plan.vals_, which did not
  // move.
  if (parallel)
    for (size_t i = 0; i < plan.steps_.size(); ++i)
      if (i == 0 || plan.step_wave_[i] != plan.step_wave_[i - 1])
        plan.wave_begin_.push_back(static_cast<int32_t>(i));
  if (debug) fmt::print(stderr, "{}\n--- schedule\n{}\n", graph.str(), plan.schedule_str());
}

// Buffer roots, and what the results and write-backs need of them.
void Plan::Builder::find_roots_and_results() {
  // The buffer each value lives in: itself, or the root of its chain of views.
  root.assign(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = graph.nodes[i];
    root[i] = is_view_node(g) ? root[g.inputs[0]] : i;
    if (g.kind == NodeKind::Op && op_class(g.op) != OpClass::View)
      stats.intermediate_bytes += meta_nbytes(g.meta);
  }
  fresh.assign(n, false);
  plan.clone_output_.assign(graph.outputs.size(), false);
  plan.alias_output_.assign(graph.outputs.size(), false);
  for (size_t k = 0; k < graph.outputs.size(); ++k) {
    const GraphNode& r = graph.nodes[root[graph.outputs[k]]];
    if (r.kind == NodeKind::Op) fresh[root[graph.outputs[k]]] = true;
    plan.clone_output_[k] = r.kind == NodeKind::Constant;
    // A captured tensor returned as a result gets a handle of its own, as a view would.
    plan.alias_output_[k] = r.kind == NodeKind::Input && r.role == InputRole::Captured;
  }
  plan.stage_writeback_.assign(graph.writebacks.size(), false);
  for (size_t k = 0; k < graph.writebacks.size(); ++k)
    plan.stage_writeback_[k] = graph.nodes[root[graph.writebacks[k].value]].kind != NodeKind::Op;
}

// ---- fusion groups and the schedule (Note [Schedule]) ----

// Note [Fusion across sizes]
// The plans of one compiled signature at different sizes of its symbols are built from one
// optimized graph, instantiated at each size (Note [A new size costs a plan] in
// trace/compile.cpp): the same nodes, with other sizes. The fusion pass decides with the
// symbolic dims (two values are of one shape when their dims are equal as SymInts), so the
// groups it finds at one size are those of every size, but where a value is empty (an empty
// value joins no group). The first plan of the graph puts its groups in the plans'
// FusionShare, and the next take them from it (their iteration shapes evaluated again) and
// run the same FusedKernel objects: a kernel whose generated code is loaded runs it at once at
// a new size. A plan with an empty value, or with a registered fusion pass on, finds its own.

// The fusion groups, and the units they and the other step nodes make.
void Plan::Builder::find_units() {
  if (opt.fuse) {
    bool shareable = opt.share != nullptr;
    for (const RegisteredPass& p : registered_passes())
      if (p.fusion &&
          std::find(opt.disabled.begin(), opt.disabled.end(), p.name) == opt.disabled.end())
        shareable = false;
    for (int32_t i = 0; i < n && shareable; ++i)
      shareable = graph.nodes[i].kind != NodeKind::Op || graph.nodes[i].meta.shape.numel() != 0;
    if (shareable) {
      std::lock_guard<std::mutex> lock(opt.share->mu);
      if (opt.share->found) {
        groups = opt.share->groups;
        for (FusionGroup& f : groups) f.shape = graph.nodes[f.members.front()].meta.shape;
        shared_groups = true;
      }
    }
    if (!shared_groups) {
      groups = find_fusion_groups(graph);
      for (const RegisteredPass& p : registered_passes())  // Note [Registered passes]
        if (p.fusion &&
            std::find(opt.disabled.begin(), opt.disabled.end(), p.name) == opt.disabled.end())
          p.fusion(graph, groups);
      if (shareable) {
        std::lock_guard<std::mutex> lock(opt.share->mu);
        if (!opt.share->found) {
          opt.share->groups = groups;
          opt.share->kernels.assign(groups.size(), nullptr);
          opt.share->found = true;
          shared_groups = true;
        }
      }
    }
  }
  group_of.assign(n, -1);
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int32_t m : groups[gi].members) group_of[m] = static_cast<int32_t>(gi);
  // Step units: each group, and each op node outside groups. Kahn's algorithm over them.
  ng = static_cast<int32_t>(groups.size());
  first_node.assign(ng + n, -1);
  unit_nodes.assign(ng + n, {});
  for (int32_t i = 0; i < n; ++i)
    if (is_step_node(graph.nodes[i])) {
      has_control = has_control || graph.nodes[i].kind == NodeKind::Control;
      const int32_t u = unit_of(i);
      if (first_node[u] < 0) first_node[u] = i;
      unit_nodes[u].push_back(i);
    }
  // Values a group keeps in registers need no buffer.
  materialized.assign(n, true);
  for (const FusionGroup& f : groups) {
    for (int32_t m : f.members) materialized[m] = false;
    for (int32_t o : f.outputs) materialized[o] = true;
    if (f.reduction >= 0) materialized[f.reduction] = true;
  }
}

int32_t Plan::Builder::unit_of(int32_t v) const {
  if (group_of[v] >= 0) return group_of[v];
  // A Control node and its Project nodes are one unit.
  const int32_t owner = graph.nodes[v].kind == NodeKind::Project ? graph.nodes[v].inputs[0] : v;
  return ng + owner;
}

// Note [Write-backs wait for their readers]
// A step that computes the new value of a captured tensor (an optimizer's update of a parameter)
// can write it into the tensor's storage in place only once every other step reading the old
// value has run; else the new value waits in the arena until the end of the run. The schedule
// therefore orders those readers before it, as the program did: in a training step, the
// parameter's gradient products before its update. With that, an update can run as soon as its
// gradient is ready, and the gradient's buffer (fused into the update, with its accumulation
// into .grad) dies there, instead of every gradient of the step living until the optimizer's
// steps at the end (the Fashion-MNIST step held both weight gradients, 7 MiB, at once). Tiny
// steps (scalars: an optimizer's bias corrections) run as soon as they are ready, as views do,
// so that they never hold back the steps that free memory.
constexpr int64_t kTinyStepBytes = 4 << 10;

// Per unit: the units it waits for; with `war`, also the readers of the captured tensors it
// writes back (Note [Write-backs wait for their readers]).
std::vector<std::vector<int32_t>> Plan::Builder::unit_deps(bool war) const {
  std::vector<std::vector<int32_t>> deps(ng + n);
  std::unordered_map<const StorageImpl*, std::vector<int32_t>> readers;
  for (int32_t u = 0; u < ng + n; ++u)
    for (int32_t v : unit_nodes[u])
      for (int32_t in : graph.nodes[v].inputs) {
        if (is_step_node(graph.nodes[in]) && unit_of(in) != u) deps[u].push_back(unit_of(in));
        if (const StorageImpl* st = war ? storage_of_root(in) : nullptr) readers[st].push_back(u);
      }
  for (const WriteBack& w : war ? graph.writebacks : std::vector<WriteBack>{}) {
    if (!is_step_node(graph.nodes[w.value])) continue;
    const int32_t writer = unit_of(w.value);
    const auto it = readers.find(graph.captured[w.target].unsafe_impl()->storage.get());
    if (it == readers.end()) continue;
    for (int32_t r : it->second)
      if (r != writer) deps[writer].push_back(r);
  }
  for (auto& d : deps) {
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
  }
  return deps;
}

// The order of the units: Kahn's algorithm, choosing among the ready units by memory.
void Plan::Builder::schedule() {
  // Memory-aware choice (with plan_memory): of the ready steps, the one that frees the most
  // bytes net (the buffers it reads for the last time, less the buffers it makes) runs first
  // when that is positive; else the one first in the graph. In a backward pass this runs a
  // weight gradient (which frees the activation it reads) before the input gradient beside it.
  // Views and tiny steps cost nothing and run as soon as they can, so that their readers are
  // ready to choose.
  std::vector<int64_t> made_bytes(ng + n, 0);
  std::vector<std::vector<int32_t>> unit_reads(ng + n);
  std::vector<int32_t> readers_left(n, 0);
  std::vector<bool> kept(n, false);  // results and write-backs: live to the end anyway
  for (int32_t o : graph.outputs) kept[root[o]] = true;
  for (const WriteBack& w : graph.writebacks) kept[root[w.value]] = true;
  std::vector<bool> view_unit(ng + n, false), free_unit(ng + n, false);
  for (int32_t u = ng; u < ng + n; ++u)
    view_unit[u] = first_node[u] >= 0 && is_view_node(graph.nodes[u - ng]);
  for (int32_t u = 0; u < ng + n; ++u) {
    if (view_unit[u]) continue;  // its readers read the buffer
    bool effect = false;
    for (int32_t v : unit_nodes[u]) {
      const GraphNode& g = graph.nodes[v];
      effect = effect || has_effect(g);
      if (!is_view_node(g) && g.kind != NodeKind::Control && materialized[v] && !kept[v])
        made_bytes[u] += meta_nbytes(g.meta);
      for (int32_t in : g.inputs) {
        const int32_t r = root[in];
        const NodeKind rk = graph.nodes[r].kind;
        if ((rk == NodeKind::Op || rk == NodeKind::Project) && !kept[r] && unit_of(r) != u)
          unit_reads[u].push_back(r);
      }
    }
    free_unit[u] = first_node[u] >= 0 && !effect && made_bytes[u] <= kTinyStepBytes &&
                   graph.nodes[first_node[u]].kind != NodeKind::Control;
    std::sort(unit_reads[u].begin(), unit_reads[u].end());
    unit_reads[u].erase(std::unique(unit_reads[u].begin(), unit_reads[u].end()),
                        unit_reads[u].end());
    for (int32_t r : unit_reads[u]) ++readers_left[r];
  }
  for (int32_t u = 0; u < ng + n; ++u) free_unit[u] = free_unit[u] || view_unit[u];
  auto net_freed = [&](int32_t u) {
    int64_t freed = -made_bytes[u];
    for (int32_t r : unit_reads[u])
      if (readers_left[r] == 1) freed += meta_nbytes(graph.nodes[r].meta);
    return freed;
  };
  int32_t units = 0;
  for (int32_t u = 0; u < ng + n; ++u) units += first_node[u] >= 0;
  const std::vector<int32_t> readers = readers_left;
  // A write-back that must wait for a reader which depends on it (a cycle) drops that order.
  for (bool war : {true, false}) {
    const std::vector<std::vector<int32_t>> deps = unit_deps(war && opt.plan_memory);
    std::vector<int32_t> indeg(ng + n, 0);
    std::vector<std::vector<int32_t>> users(ng + n);
    for (int32_t u = 0; u < ng + n; ++u) {
      indeg[u] = static_cast<int32_t>(deps[u].size());
      for (int32_t d : deps[u]) users[d].push_back(u);
    }
    readers_left = readers;
    order.clear();
    std::vector<int32_t> ready;
    for (int32_t u = 0; u < ng + n; ++u)
      if (first_node[u] >= 0 && indeg[u] == 0) ready.push_back(u);
    while (!ready.empty()) {
      size_t pick = 0;
      int64_t best_freed = 0;
      for (size_t k = 0; k < ready.size(); ++k) {
        if (opt.plan_memory && free_unit[ready[k]]) {  // lets its readers become ready
          pick = k;
          break;
        }
        const int64_t f = opt.plan_memory ? std::max<int64_t>(net_freed(ready[k]), 0) : 0;
        if (f > best_freed || (f == best_freed && first_node[ready[k]] < first_node[ready[pick]])) {
          pick = k;
          best_freed = f;
        }
      }
      const int32_t u = ready[pick];
      ready[pick] = ready.back();
      ready.pop_back();
      order.push_back(u);
      for (int32_t r : unit_reads[u]) --readers_left[r];
      for (int32_t w : users[u])
        if (--indeg[w] == 0) ready.push_back(w);
    }
    if (static_cast<int32_t>(order.size()) == units) return;
  }
  DUET_ASSERT(false, "[compile] the fused schedule of {} has a cycle ({} of {} steps ordered)",
              graph.label, order.size(), units);
}

// The position of every value in the schedule (inputs and constants: -1): its step, or in a
// parallel plan its wave, so that buffers of steps that may run together never share bytes.
void Plan::Builder::place_steps() {
  step_pos.assign(order.size(), 0);
  for (size_t s = 0; s < order.size(); ++s)
    step_pos[s] = parallel ? wave_of[order[s]] : static_cast<int32_t>(s);
  pos.assign(n, -1);
  for (size_t s = 0; s < order.size(); ++s)
    for (int32_t v : unit_nodes[order[s]]) pos[v] = step_pos[s];
  num_steps = static_cast<int32_t>(order.size());
  end_pos = parallel ? num_waves : num_steps;
}

// ---- write-backs computed in place ----
// Write-backs computed in place (docs/design.md, "Write-backs in place"): a value
// made by a kernel goes straight into the captured tensor's storage when nothing reads that
// storage after the value is computed, and the step computing it reads that storage, if at
// all, only elementwise at the same layout (w - lr * g). Then there is no buffer and no copy.

// The storage of the captured tensor v is a view of, or null.
const StorageImpl* Plan::Builder::storage_of_root(int32_t v) const {
  const GraphNode& r = graph.nodes[root[v]];
  if (r.kind == NodeKind::Input && r.role == InputRole::Captured)
    return graph.captured[r.index].unsafe_impl()->storage.get();
  return nullptr;
}

void Plan::Builder::find_inplace_writebacks() {
  inplace.assign(n, -1);
  plan.inplace_writeback_.assign(graph.writebacks.size(), false);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : graph.nodes[i].inputs)
      if (const StorageImpl* st = storage_of_root(in))
        last_read[st] = std::max(last_read.count(st) ? last_read[st] : -1, pos[i]);
  for (size_t k = 0; k < graph.writebacks.size(); ++k) {
    if (!can_write_back_in_place(k)) continue;
    const WriteBack& w = graph.writebacks[k];
    inplace[w.value] = w.target;
    plan.inplace_writeback_[k] = true;
  }
  find_products_into_targets();
}

// Note [Products computed into write-back targets]
// A training step's weight gradient is a product that one fused group reads, the optimizer's
// update, which also accumulates it into .grad and writes .grad back in place, at the same
// index. Nothing reads the old .grad (zero_grad zeroed it, so the trace adds a constant zero):
// the product can be computed into .grad's storage itself, and the group then reads and writes
// each element there. The gradient then needs no buffer of its own (in eager it is a
// temporary as large as the weight). Conditions: the product is an op outside groups, read by
// this one group only and through no view, of the group's shape, dtype and device, and nothing
// reads the target's storage from the product's step on.
void Plan::Builder::find_products_into_targets() {
  std::vector<int32_t> reader_unit(n, -2);  // per value: -2 none, -1 several or a view, else unit
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : graph.nodes[i].inputs) {
      const int32_t u = is_view_node(graph.nodes[i]) ? -1 : unit_of(i);
      reader_unit[in] = reader_unit[in] == -2 || reader_unit[in] == u ? u : -1;
    }
  std::vector<bool> written(n, false);
  for (const WriteBack& w : graph.writebacks) written[root[w.value]] = true;
  for (int32_t gi = 0; gi < ng; ++gi) {
    const FusionGroup& grp = groups[gi];
    if (grp.reduction >= 0) continue;
    for (int32_t o : grp.outputs) {
      if (inplace[o] < 0) continue;
      const TensorMeta& m = graph.nodes[o].meta;
      const StorageImpl* st = graph.captured[inplace[o]].unsafe_impl()->storage.get();
      for (int32_t v : grp.inputs) {
        const GraphNode& p = graph.nodes[v];
        if (p.kind != NodeKind::Op || op_class(p.op) == OpClass::View || group_of[v] >= 0 ||
            fresh[v] || inplace[v] >= 0 || written[v] || !materialized[v] || reader_unit[v] != gi ||
            !same_meta(p.meta, m) || !p.meta.sym.empty())
          continue;
        const auto lr = last_read.find(st);
        if (lr != last_read.end() && lr->second >= pos[v]) continue;
        inplace[v] = inplace[o];
        if (debug) fmt::print(stderr, "--- %{} computed into the storage %{} writes back\n", v, o);
        break;
      }
    }
  }
}

bool Plan::Builder::can_write_back_in_place(size_t k) {
  const WriteBack& w = graph.writebacks[k];
  const GraphNode& v = graph.nodes[w.value];
  const Tensor& dst = graph.captured[w.target];
  const TensorImpl* d = dst.unsafe_impl();
  const int32_t gi = w.value < n ? group_of[w.value] : -1;
  if (v.kind != NodeKind::Op || op_class(v.op) == OpClass::View || fresh[w.value] ||
      inplace[w.value] >= 0 || !d->contiguous || d->dtype != v.meta.dtype ||
      d->shape != v.meta.shape || d->device() != v.meta.device ||
      (gi >= 0 && groups[gi].reduction >= 0))
    return false;
  const StorageImpl* st = d->storage.get();
  auto lr = last_read.find(st);
  bool ok = lr == last_read.end() || lr->second < pos[w.value] ||
            (lr->second == pos[w.value] && !parallel);
  if (!ok && parallel && lr->second == pos[w.value]) {
    // Steps of one wave run together: only the step computing the value may read there.
    ok = true;
    for (int32_t i = 0; i < n; ++i)
      if (pos[i] == pos[w.value] && unit_of(i) != unit_of(w.value))
        for (int32_t in : graph.nodes[i].inputs) ok = ok && storage_of_root(in) != st;
  }
  // What the step reads: the node's inputs, or the whole group's.
  const bool elementwise = gi >= 0 || op_class(v.op) == OpClass::Elementwise;
  std::vector<int32_t> reads(v.inputs.begin(), v.inputs.end());
  if (gi >= 0) reads = groups[gi].inputs;
  for (int32_t in : reads) {
    if (storage_of_root(in) != st) continue;
    const GraphNode& src = graph.nodes[in];
    ok = ok && elementwise && src.kind == NodeKind::Input &&
         graph.captured[src.index].unsafe_impl()->contiguous &&
         graph.captured[src.index].sizes() == d->shape &&
         graph.captured[src.index].storage_offset() == d->offset;
  }
  for (size_t j = 0; ok && j < graph.writebacks.size(); ++j)
    ok = !(plan.stage_writeback_[j] && storage_of_root(graph.writebacks[j].value) == st);
  for (size_t j = 0; ok && j < graph.outputs.size(); ++j)
    ok = storage_of_root(graph.outputs[j]) != st;  // conservative: results alias nothing written
  return ok;
}

// ---- hoisting (parameter preprocessing) ----
// A step whose inputs are all captured tensors, constants or hoisted values computes the same
// result at every run until a captured tensor changes: it runs once, and again only when the
// version of a storage it reads has changed (an optimizer step, a load). Its buffer is its
// own, outside the arena. Results, in-place write-backs and random draws stay per run.
//
// A captured tensor that the plan itself writes back (the parameters of a compiled training
// step) changes at every run, so a step reading it would run at every run all the same, and a
// hoisted buffer would only hold memory between runs: such steps stay in the schedule and their
// buffers in the arena, freed at their last use. (A training step under autocast kept a bf16
// copy of every weight between its calls so, tests/test_fusion.cpp's "hoisting: a training
// step ...".)
//
// A step that reads no parameter and makes more than kHoistedSourceBytes (zeros for a scatter's
// or a slice's gradient to write into) is not hoisted either: making it again costs one pass,
// keeping it costs its bytes for the function's life.
constexpr int64_t kHoistedSourceBytes = 64 << 10;

void Plan::Builder::hoist() {
  std::vector<bool> param_only(n, false);
  hoisted.assign(n, false);
  hoisted_unit.assign(ng + n, false);
  std::vector<const StorageImpl*> written;
  for (const WriteBack& w : graph.writebacks)  // target: an index into graph.captured
    written.push_back(graph.captured[static_cast<size_t>(w.target)].unsafe_impl()->storage.get());
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = graph.nodes[i];
    param_only[i] =
        g.kind == NodeKind::Constant ||
        (g.kind == NodeKind::Input && g.role == InputRole::Captured &&
         std::find(written.begin(), written.end(), storage_of_root(i)) == written.end());
  }
  if (!opt.hoist) return;
  for (int32_t s = 0; s < num_steps; ++s) {
    const int32_t u = order[s];
    bool ok = true;
    bool any_kernel = false, reads_params = false;
    int64_t bytes = 0;
    for (int32_t v : unit_nodes[u]) {
      const GraphNode& g = graph.nodes[v];
      ok = ok && g.kind == NodeKind::Op && !fresh[v] && inplace[v] < 0 && g.op != OpId::Random &&
           !has_effect(g);
      any_kernel = any_kernel || !is_view_node(g);
      if (!is_view_node(g)) bytes += meta_nbytes(g.meta);
      for (int32_t in : g.inputs) {
        ok = ok && (param_only[in] || unit_of(in) == u);
        reads_params = reads_params || unit_of(in) != u;
      }
    }
    if (!reads_params && bytes > kHoistedSourceBytes) ok = false;
    if (!ok) continue;
    for (int32_t v : unit_nodes[u]) param_only[v] = true;
    // A view of parameters is static (made once below) unless no strides express it; then
    // it is a hoisted step too, so hoisted kernels never read it before it exists.
    hoisted_unit[u] = true;
    if (!any_kernel) continue;
    for (int32_t v : unit_nodes[u]) hoisted[v] = true;
    stats.hoisted_nodes += static_cast<int64_t>(unit_nodes[u].size());
  }
  // Every hoisted step, a view copied because no strides express it included, re-runs when
  // a storage it reads changes version.
  for (int32_t i = 0; i < n; ++i)
    if (is_step_node(graph.nodes[i]) && hoisted_unit[unit_of(i)])
      for (int32_t in : graph.nodes[i].inputs)
        if (const StorageImpl* st = storage_of_root(in)) {
          auto* sp = const_cast<StorageImpl*>(st);
          if (std::none_of(plan.hoist_versions_.begin(), plan.hoist_versions_.end(),
                           [&](const auto& e) { return e.first == sp; }))
            plan.hoist_versions_.push_back({sp, ~uint32_t(0)});
        }
}

// ---- buffers: which values need one, and their live intervals ----

bool Plan::Builder::needs_buffer(int32_t v) const {
  const GraphNode& g = graph.nodes[v];
  return g.kind == NodeKind::Op && op_class(g.op) != OpClass::View && materialized[v] &&
         !fresh[v] && inplace[v] < 0 && !hoisted[v];
}

// In place: a step writing value v at the same index it reads input `in`, which dies there.
// `in` is a buffer, or a reshape of one (a buffer is contiguous, so a reshape reads its
// elements in the same order: the gradient of a Linear's 3-D input arrives as a reshape of a
// 2-D product), or an optimization_barrier of those (a recomputed value, Note
// [Rematerialization], read by the backward's kernels). Another input of the step may read that
// buffer only so too: element i of it at index i, which a kernel loads before it stores element
// i (a shifted slice would see the new values). Returns the buffer reused, or -1.
int32_t Plan::Builder::reusable(int32_t v, int32_t in,
                                const std::vector<int32_t>& step_inputs) const {
  if (in < 0) return -1;
  const int32_t base = root[in];
  // Whether x reads base's elements in their order, at the step's index.
  auto same_elements = [&](int32_t x) {
    for (; x != base; x = graph.nodes[x].inputs[0])
      if (graph.nodes[x].op != OpId::Reshape && graph.nodes[x].op != OpId::OptimizationBarrier)
        return false;
    return graph.nodes[base].meta.shape.numel() == graph.nodes[v].meta.shape.numel();
  };
  if (!same_elements(in) || request_of[base] < 0) return -1;
  for (int32_t x : step_inputs)
    if (x != in && root[x] == base && !same_elements(x)) return -1;
  const GraphNode& a = graph.nodes[v];
  const GraphNode& b = graph.nodes[in];
  const GraphNode& c = graph.nodes[base];
  // (same_elements: the buffer has as many elements as v.)
  const bool ok = last_use[base] == pos[v] && a.meta.shape == b.meta.shape &&
                  a.meta.dtype == c.meta.dtype && a.meta.device == c.meta.device;
  return ok ? base : -1;
}

// A buffer is live from its step to the last step reading it or a view of it; write-backs
// read after the last step.
void Plan::Builder::request_buffers() {
  last_use.assign(n, -1);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : graph.nodes[i].inputs) {
      const int32_t p = pos[i];
      last_use[root[in]] = std::max(last_use[root[in]], p);
      last_use[in] = std::max(last_use[in], p);
    }
  for (const WriteBack& w : graph.writebacks) last_use[root[w.value]] = end_pos;
  request_of.assign(n, -1);
  for (int32_t s = 0; s < num_steps; ++s) {
    const int32_t u = order[s];
    const bool is_group = u < ng;
    std::vector<int32_t> made;
    if (is_group) {
      for (int32_t o : groups[u].outputs) made.push_back(o);
      if (groups[u].reduction >= 0) made.push_back(groups[u].reduction);
    } else {
      made.push_back(u - ng);
    }
    std::vector<int32_t> taken;
    for (int32_t v : made) {
      if (!needs_buffer(v)) continue;
      BufferRequest r;
      r.bytes = meta_nbytes(graph.nodes[v].meta);
      // One arena per device: a CPU buffer of a plan that also runs on a GPU must not be
      // placed in device memory, nor the other way round.
      const Device dev = graph.nodes[v].meta.device;
      r.pool = static_cast<int32_t>(std::find(pool_devices.begin(), pool_devices.end(), dev) -
                                    pool_devices.begin());
      if (r.pool == static_cast<int32_t>(pool_devices.size())) pool_devices.push_back(dev);
      r.first = step_pos[s];
      r.last = std::max(last_use[v], step_pos[s]);
      // Reuse in place: elementwise kernels and fused groups (not a reduction's result).
      const GraphNode& node = graph.nodes[v];
      const bool elementwise_step =
          (is_group && v != groups[u].reduction) ||
          (!is_group && op_class(node.op) == OpClass::Elementwise && node.op != OpId::Cast);
      if (opt.plan_memory && elementwise_step && !parallel) {
        const std::vector<int32_t>& ins = is_group ? groups[u].inputs : node.inputs;
        for (int32_t in : ins) {
          const int32_t base = reusable(v, in, ins);
          if (base >= 0 && std::find(taken.begin(), taken.end(), base) == taken.end()) {
            r.reuse = request_of[base];
            taken.push_back(base);
            if (is_group && graph.nodes[base].op == OpId::MatMul) ++stats.epilogues;
            break;
          }
        }
      }
      request_of[v] = static_cast<int32_t>(plan.requests_.size());
      plan.requests_.push_back(r);
    }
  }
}

// Note [Intermediates in dead write-back targets]
// A write-back target whose old value nothing reads after some step holds nothing from then
// until the plan writes its new value there. A training step's .grad is the usual one: zero_grad
// zeroed it, the trace added the zero as a constant, and the backward computes the gradient
// into it (Note [Products computed into write-back targets]); until then, its bytes are dead.
// The gradients of the first layers are computed last, so their .grad buffers are free for
// nearly the whole step, while the activations that the arena holds are largest. The memory
// planner may place intermediates there (a DonatedRegion per target, trace/plan/memory_plan.h),
// as XLA places temporaries in donated argument buffers; the arena shrinks by what moved. The
// window of a target runs from the step after the last read of its old value (through the
// captured tensor or a view of it) to the step before the first one writing it in place, or to
// the last step when its write-back is a copy after the steps. A target qualifies when it is
// contiguous, 64-byte aligned, the only captured tensor on its storage, and no result aliases
// it. Mid-call, the target holds other values: another thread reading that .grad during the
// call sees them, as it would see a half-accumulated gradient eagerly; disable_passes =
// {"donate"} turns this off. A plan checks at each run that the targets still have the storage
// it planned in (Module::to gives a tensor a new one) and places those values again if not, and
// an argument sharing a target's storage is copied before the steps (execute()). Serial plans
// only: steps of one wave may run together, and control steps read captured tensors in their
// subplans. Plans that the memory planner made larger this way (best fit is not monotone)
// plan without the regions.
void Plan::Builder::find_donated_regions() {
  if (!opt.plan_memory || !opt.donate || has_control || graph.writebacks.empty()) return;
  std::unordered_map<const StorageImpl*, int32_t> captured_on;  // storage -> captured tensors
  for (const Tensor& c : graph.captured) ++captured_on[c.unsafe_impl()->storage.get()];
  std::vector<int32_t> first_write(graph.captured.size(), end_pos);
  for (int32_t v = 0; v < n; ++v)
    if (inplace[v] >= 0) first_write[inplace[v]] = std::min(first_write[inplace[v]], pos[v]);
  std::unordered_map<const StorageImpl*, bool> aliased;  // a result or staged write-back is on it
  for (int32_t o : graph.outputs)
    if (const StorageImpl* st = storage_of_root(o)) aliased[st] = true;
  for (size_t k = 0; k < graph.writebacks.size(); ++k)
    if (plan.stage_writeback_[k])
      if (const StorageImpl* st = storage_of_root(graph.writebacks[k].value)) aliased[st] = true;
  std::vector<bool> done(graph.captured.size(), false);
  for (const WriteBack& w : graph.writebacks) {
    const auto t = static_cast<size_t>(w.target);
    if (done[t]) continue;
    done[t] = true;
    const TensorImpl* d = graph.captured[t].unsafe_impl();
    const StorageImpl* st = d->storage.get();
    const int64_t bytes = d->shape.numel() * static_cast<int64_t>(itemsize(d->dtype));
    const int64_t base = d->offset * static_cast<int64_t>(itemsize(d->dtype));
    const auto lr = last_read.find(st);
    DonatedRegion r;
    r.bytes = bytes;
    r.from = lr == last_read.end() ? 0 : lr->second + 1;
    r.until = first_write[t] - 1;
    const auto pool = std::find(pool_devices.begin(), pool_devices.end(), d->device());
    if (!d->contiguous || bytes < 4096 || base % 64 != 0 || captured_on[st] != 1 ||
        aliased.count(st) || r.until < r.from || pool == pool_devices.end() ||
        reinterpret_cast<uintptr_t>(st->data) % 64 != 0)
      continue;
    r.pool = static_cast<int32_t>(pool - pool_devices.begin());
    regions.push_back(r);
    region_target.push_back(w.target);
    if (debug)
      fmt::print(stderr, "--- captured {} ({} bytes) holds intermediates from step {} to {}\n",
                 w.target, bytes, r.from, r.until);
  }
}

constexpr int kLendingRounds = 8;

// With plan_memory, the buffers' places in one arena per device (trace/plan/memory_plan.h), and the
// arenas.
void Plan::Builder::plan_arena() {
  if (!opt.plan_memory) return;
  plan.memory_ = plan_memory(plan.requests_);
  if (!regions.empty()) {
    // Which buffers go in the regions: any, as they come; or, over a few rounds, those live
    // at the arena's peak, adding the buffers of each round's new peak. The smallest arena wins.
    MemoryPlan lent = plan_memory(plan.requests_, regions);
    std::vector<bool> lendable(plan.requests_.size(), false);
    MemoryPlan round = plan.memory_;
    for (int k = 0; k < kLendingRounds; ++k) {
      bool more = false;
      for (int32_t i : live_at_arena_peak(plan.requests_, round))
        if (!lendable[i]) more = lendable[i] = true;
      if (!more) break;
      round = plan_memory(plan.requests_, regions, lendable);
      if (debug)
        fmt::print(stderr, "--- lending round {}: arena {} bytes (lent as they come {}, none {})\n",
                   k, round.arena_bytes, lent.arena_bytes, plan.memory_.arena_bytes);
      if (round.arena_bytes < lent.arena_bytes) lent = round;
    }
    if (lent.arena_bytes < plan.memory_.arena_bytes) {
      stats.donated_bytes = plan.memory_.arena_bytes - lent.arena_bytes;
      plan.memory_ = std::move(lent);
    } else {
      regions.clear();
      region_target.clear();
    }
  }
  if (verify_plans()) {
    const std::string bad = check_memory_plan(plan.requests_, plan.memory_, regions);
    DUET_ASSERT(bad.empty(), "[compile] memory plan of {}: {}", graph.label, bad);
  }
  stats.arena_bytes = plan.memory_.arena_bytes;
  stats.buffer_bytes = plan.memory_.arena_bytes;
  for (size_t p = 0; p < pool_devices.size(); ++p)
    if (!pool_devices[p].is_cpu()) stats.device_buffer_bytes += plan.memory_.pool_bytes[p];
  if (debug) {
    fmt::print(stderr, "--- buffers of {} (arena {} bytes)\n", graph.label,
               plan.memory_.arena_bytes);
    for (int32_t i = 0; i < n; ++i)
      if (request_of[i] >= 0) {
        const BufferRequest& r = plan.requests_[request_of[i]];
        const int32_t g = plan.memory_.region[request_of[i]];
        fmt::print(stderr, "%{}: {} bytes at {}{}, steps {}..{}{}\n", i, r.bytes,
                   plan.memory_.offsets[request_of[i]],
                   g >= 0 ? fmt::format(" of captured {}", region_target[g]) : "", r.first, r.last,
                   r.reuse >= 0 ? " (in place)" : "");
      }
  }
  plan.regions_ = regions;
  plan.region_target_ = region_target;
  if (opt.measure_only) return;
  arenas.assign(pool_devices.size(), StoragePtr());
  for (size_t p = 0; p < pool_devices.size(); ++p) {
    const auto bytes = static_cast<size_t>(plan.memory_.pool_bytes[p]);
    if (bytes == 0) continue;
    arenas[p] = opt.arenas ? shared_arena(*opt.arenas, pool_devices[p], bytes)
                           : new_storage(bytes, pool_devices[p]);
  }
  plan.shares_arena_ = opt.arenas != nullptr;
}

// Note [One arena per function]
// A compiled function keeps a plan per signature (a new batch size, the short last batch of an
// epoch) and per symbolic size, and each plan used to keep an arena of its own: the
// Fashion-MNIST step kept 10.6 MiB for batch 256 and 8.4 MiB for the last batch of 96. The
// plans of one function (forward, backward, guard, at every size) now share one arena per
// device, as large as the largest of them needs; a plan runs on it while it holds the share's
// `busy` lock. A call that finds the arenas busy (another thread running one of the function's
// plans, or a plan run from inside another) runs a spare copy of its plan with arenas of its
// own, as a call that finds the plan itself busy does. A plan built when the shared arena is too
// small gets a larger one, which later plans share; the plans built before keep the old one.
// Results, saved values and hoisted buffers are never in the arena, so what one plan leaves
// there is dead when the next one runs.
StoragePtr shared_arena(ArenaShare& share, Device device, size_t bytes) {
  std::lock_guard<std::mutex> l(share.mu);
  for (auto& [d, st] : share.storages)
    if (d == device) {
      if (st->nbytes < bytes) st = new_storage(bytes, device);
      return st;
    }
  share.storages.emplace_back(device, new_storage(bytes, device));
  return share.storages.back().second;
}

std::shared_ptr<ArenaShare> make_arena_share() { return std::make_shared<ArenaShare>(); }

}  // namespace duet::detail
