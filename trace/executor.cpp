#include "trace/executor.h"

#include <unordered_map>

#include "core/dispatch.h"

namespace duet::detail {

Plan::Plan(Graph graph) : g_(std::move(graph)) { build(); }

void Plan::build() {
  const int32_t n = static_cast<int32_t>(g_.nodes.size());
  vals_.assign(n, Tensor());
  slot_value_.assign(g_.num_runtime_inputs, -1);
  // The buffer each value lives in: itself, or the root of its chain of views.
  std::vector<int32_t> root(n);
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = g_.nodes[i];
    root[i] = g.kind == NodeKind::Op && op_class(g.op) == OpClass::View ? root[g.inputs[0]] : i;
  }
  std::vector<bool> fresh(n, false);
  clone_output_.assign(g_.outputs.size(), false);
  alias_output_.assign(g_.outputs.size(), false);
  for (size_t k = 0; k < g_.outputs.size(); ++k) {
    const GraphNode& r = g_.nodes[root[g_.outputs[k]]];
    if (r.kind == NodeKind::Op) fresh[root[g_.outputs[k]]] = true;
    clone_output_[k] = r.kind == NodeKind::Constant;
    // A captured tensor returned as a result gets a handle of its own, as a view would.
    alias_output_[k] = r.kind == NodeKind::Input && r.role == InputRole::Captured;
  }
  stage_writeback_.assign(g_.writebacks.size(), false);
  for (size_t k = 0; k < g_.writebacks.size(); ++k)
    stage_writeback_[k] = g_.nodes[root[g_.writebacks[k].value]].kind != NodeKind::Op;

  // Write-backs computed in place (DESIGN.md: "where the planner can prove it safe"): a value
  // made by a kernel goes straight into the captured tensor's storage when nothing reads that
  // storage after the value is computed, and the kernel itself reads it, if at all, only
  // elementwise at the same layout (w - lr * g). Then there is no buffer and no copy.
  std::vector<int32_t> inplace(n, -1);
  inplace_writeback_.assign(g_.writebacks.size(), false);
  auto storage_of_root = [&](int32_t v) -> const StorageImpl* {
    const GraphNode& r = g_.nodes[root[v]];
    if (r.kind == NodeKind::Input && r.role == InputRole::Captured)
      return g_.captured[r.index].unsafe_impl()->storage.get();
    return nullptr;
  };
  std::unordered_map<const StorageImpl*, int32_t> last_read;
  for (int32_t i = 0; i < n; ++i)
    for (int32_t in : g_.nodes[i].inputs)
      if (const StorageImpl* st = storage_of_root(in)) last_read[st] = i;
  for (size_t k = 0; k < g_.writebacks.size(); ++k) {
    const WriteBack& w = g_.writebacks[k];
    const GraphNode& v = g_.nodes[w.value];
    const Tensor& dst = g_.captured[w.target];
    const TensorImpl* d = dst.unsafe_impl();
    if (v.kind != NodeKind::Op || op_class(v.op) == OpClass::View || fresh[w.value] ||
        inplace[w.value] >= 0 || !d->contiguous || d->dtype != v.meta.dtype ||
        d->shape != v.meta.shape || d->device() != v.meta.device)
      continue;
    const StorageImpl* st = d->storage.get();
    auto lr = last_read.find(st);
    bool ok = lr == last_read.end() || lr->second <= w.value;
    for (int32_t in : v.inputs) {
      if (storage_of_root(in) != st) continue;
      const GraphNode& src = g_.nodes[in];
      ok = ok && op_class(v.op) == OpClass::Elementwise && src.kind == NodeKind::Input &&
           g_.captured[src.index].unsafe_impl()->contiguous &&
           g_.captured[src.index].sizes() == d->shape &&
           g_.captured[src.index].storage_offset() == d->offset;
    }
    for (size_t j = 0; ok && j < g_.writebacks.size(); ++j)
      ok = !(stage_writeback_[j] && storage_of_root(g_.writebacks[j].value) == st);
    for (size_t j = 0; ok && j < g_.outputs.size(); ++j)
      ok = storage_of_root(g_.outputs[j]) != st;  // conservative: results alias nothing written
    if (!ok) continue;
    inplace[w.value] = w.target;
    inplace_writeback_[k] = true;
  }

  std::vector<bool> is_static(n, false);
  SuspendModes eager;
  for (int32_t i = 0; i < n; ++i) {
    const GraphNode& g = g_.nodes[i];
    switch (g.kind) {
      case NodeKind::Constant:
        vals_[i] = g.constant;
        is_static[i] = true;
        break;
      case NodeKind::Input:
        if (g.role == InputRole::Captured) {
          vals_[i] = g_.captured[g.index];
          is_static[i] = true;
        } else {
          slot_value_[g.index] = i;
          dynamic_.push_back(i);
        }
        break;
      case NodeKind::Op: {
        const OpDef& def = op_def(g.op);
        if (def.cls == OpClass::View && is_static[g.inputs[0]]) {
          Tensor v = def.view(vals_[g.inputs[0]], g.attrs, g.meta);
          if (v.defined()) {  // else no strides express it: a copy at every run
            vals_[i] = v;
            is_static[i] = true;
            break;
          }
        }
        Step s{&def,
               nullptr,
               i,
               static_cast<int32_t>(args_.size()),
               static_cast<int32_t>(g.inputs.size()),
               fresh[i]};
        if (def.cls != OpClass::View) {
          s.kernel = def.kernel[static_cast<int>(g.meta.device.type)];
          DUET_CHECK_DEVICE(s.kernel, "[{}] has no kernel for device {} ({})", def.name,
                            g.meta.device, g_.label);
          if (inplace[i] >= 0) {
            vals_[i] = g_.captured[inplace[i]];
            is_static[i] = true;
          } else if (!fresh[i]) {
            vals_[i] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
            buffer_bytes_ += g.meta.shape.numel() * int64_t(itemsize(g.meta.dtype));
            is_static[i] = true;
          }
        }
        if (!is_static[i]) dynamic_.push_back(i);
        for (int32_t in : g.inputs) args_.push_back(&vals_[in]);
        steps_.push_back(s);
        break;
      }
    }
  }
}

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) {
    Plan copy(g_);  // busy: re-entered or called from another thread
    return copy.execute(inputs);
  }
  return execute(inputs);
}

std::vector<Tensor> Plan::execute(const std::vector<Tensor>& inputs) {
  DUET_ASSERT(int32_t(inputs.size()) == g_.num_runtime_inputs, "plan of {} given {} inputs",
              g_.num_runtime_inputs, inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (slot_value_[k] >= 0) vals_[slot_value_[k]] = inputs[k];
  struct Clear {  // drop per-run references (the caller's tensors) even when a kernel throws
    Plan* p;
    ~Clear() {
      for (int32_t v : p->dynamic_) p->vals_[v] = Tensor();
    }
  } clear{this};
  for (const Step& s : steps_) {
    const GraphNode& g = g_.nodes[s.out];
    TensorRefs refs(args_.data() + s.first_arg, s.num_args);
    if (!s.kernel) {
      Tensor v = s.def->view(refs[0], g.attrs, g.meta);
      if (!v.defined()) v = s.def->view(refs[0].contiguous(), g.attrs, g.meta);
      vals_[s.out] = std::move(v);
      continue;
    }
    if (s.fresh) vals_[s.out] = empty(g.meta.shape, g.meta.dtype, g.meta.device);
    s.kernel(refs, g.attrs, vals_[s.out]);
  }
  std::vector<Tensor> out;
  out.reserve(g_.outputs.size());
  for (size_t k = 0; k < g_.outputs.size(); ++k) {
    const Tensor& v = vals_[g_.outputs[k]];
    if (clone_output_[k]) {
      out.push_back(v.clone());
    } else if (alias_output_[k]) {
      const TensorImpl* x = v.unsafe_impl();
      out.push_back(make_view(v, x->shape, x->strides, x->offset));
    } else {
      out.push_back(v);
    }
  }
  if (!g_.writebacks.empty()) {
    const OpDef& copy = op_def(OpId::Copy);
    std::vector<Tensor> staged(g_.writebacks.size());
    for (size_t k = 0; k < g_.writebacks.size(); ++k)
      if (stage_writeback_[k]) staged[k] = vals_[g_.writebacks[k].value].clone();
    for (size_t k = 0; k < g_.writebacks.size(); ++k) {
      const WriteBack& w = g_.writebacks[k];
      const Tensor& src = stage_writeback_[k] ? staged[k] : vals_[w.value];
      const Tensor& dst = g_.captured[w.target];
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
