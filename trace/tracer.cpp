#include "trace/tracer.h"

#include <algorithm>

#include "core/symbolic.h"
#include "eager/autograd.h"

namespace duet::detail {

namespace {
thread_local Tracer* tls_tracer = nullptr;

template <class V>
std::vector<int64_t> to_vec(const V& v) {
  return std::vector<int64_t>(v.data(), v.data() + v.size());
}
}  // namespace

Tracer::Tracer(std::string label)
    : tag_(IntrusivePtr<TraceTag>::adopt(new TraceTag(label))), prev_(tls_tracer) {
  graph_.label = std::move(label);
  tls_tracer = this;
  // Work pending in an Autobatch scope runs first: the trace reads tensors by their data.
  run_lazy_work();
}

Tracer::Tracer(std::string label, Tracer* parent, Lifts* lifts) : Tracer(std::move(label)) {
  parent_ = parent;
  lifts_ = lifts;
}

bool Tracer::is_ancestor_tag(const TraceTag* tag) const {
  for (const Tracer* p = parent_; p; p = p->parent_)
    if (p->tag_.get() == tag) return true;
  return false;
}

bool Tracer::owns_storage(const StorageImpl* st) const {
  for (const StoragePtr& s : symbolic_storages_)
    if (s.get() == st) return true;
  return false;
}

int32_t Tracer::lift(const Tensor& t) {
  const int32_t outer = parent_->value_of(t);
  auto it = std::find(lifts_->outer.begin(), lifts_->outer.end(), outer);
  const size_t pos = static_cast<size_t>(it - lifts_->outer.begin());
  if (it == lifts_->outer.end()) {
    lifts_->outer.push_back(outer);
    lifts_->tensors.push_back(t);
  }
  auto l = lifted_.find(pos);
  if (l != lifted_.end()) return l->second;
  GraphNode n;
  n.kind = NodeKind::Input;
  n.role = InputRole::Argument;
  n.meta = parent_->graph_.nodes[outer].meta;
  n.index = lifts_->first_slot + static_cast<int32_t>(pos);
  const int32_t v = graph_.add(std::move(n));
  lifted_.emplace(pos, v);
  return v;
}

std::vector<Tensor> Tracer::control(std::shared_ptr<const ControlFlow> cf,
                                    const std::vector<Tensor>& inputs) {
  GraphNode n;
  n.kind = NodeKind::Control;
  for (const Tensor& t : inputs) n.inputs.push_back(value_of(t));
  n.meta = TensorMeta{
      Shape{}, DType::f32, cf->results.empty() ? Device::cpu() : cf->results[0].device, {}};
  n.scope = scope_index();
  n.site = detail::tls_site;
  n.control = cf;
  const int32_t c = graph_.add(std::move(n));
  std::vector<Tensor> out;
  for (size_t k = 0; k < cf->results.size(); ++k) {
    GraphNode p;
    p.kind = NodeKind::Project;
    p.inputs = {c};
    p.index = static_cast<int32_t>(k);
    p.meta = cf->results[k];
    p.scope = graph_.nodes[c].scope;
    out.push_back(traced(graph_.add(std::move(p)), cf->results[k], false));
  }
  return out;
}

Tracer::~Tracer() {
  tag_->alive = false;
  tls_tracer = prev_;
}

Tracer* Tracer::current() { return tls_tracer; }

void Tracer::add_probe(std::string name, const Tensor& t) {
  DUET_CHECK_VALUE(parent_ == nullptr,
                   "[probe] \"{}\" is inside the body of a cond, scan or while_loop of {}; "
                   "probe the construct's results instead",
                   name, graph_.label);
  for (const auto& p : probes_)
    DUET_CHECK_VALUE(p.first != name, "[probe] the name \"{}\" is used twice in {}", name,
                     graph_.label);
  probes_.emplace_back(std::move(name), t);
}

namespace {
// What an error raised while tracing adds to its message (core/call_site.h): the compiled
// function (the outermost trace) and the scope the op was called in.
std::string trace_context() {
  Tracer* t = tls_tracer;
  if (!t) return "";
  Tracer* root = t->top();
  std::string s = fmt::format(" while tracing {}", root->graph().label);
  const std::string& scope = current_scope();
  if (!scope.empty()) s += fmt::format(", scope {}", scope);
  return s;
}
const bool g_hook = [] {
  detail::set_trace_context_hook(trace_context);
  return true;
}();
}  // namespace

Tracer::Layout Tracer::layout_of(const TensorImpl* x) {
  return {x->offset, x->shape, x->strides, x->dtype};
}

Tensor Tracer::traced(int32_t value, const TensorMeta& meta, bool requires_grad) {
  Tensor t = make_meta_tensor(meta);
  TensorImpl* x = t.unsafe_impl();
  symbolic_storages_.push_back(x->storage);
  x->trace = tag_;
  x->value = value;
  x->requires_grad = requires_grad;
  return t;
}

Tensor Tracer::input(InputRole role, const TensorMeta& meta, bool requires_grad, std::string name) {
  GraphNode n;
  n.kind = NodeKind::Input;
  n.role = role;
  n.meta = meta;
  n.index = graph_.num_runtime_inputs++;
  n.name = std::move(name);
  Tensor t = traced(graph_.add(std::move(n)), meta, requires_grad);
  input_storages_.push_back(t.unsafe_impl()->storage.get());
  return t;
}

Tensor Tracer::input(InputRole role, const Tensor& like, std::string name, SymDims sym) {
  const TensorImpl* l = like.impl();
  Tensor t = input(role, TensorMeta{l->shape, l->dtype, l->device(), std::move(sym)},
                   l->requires_grad, std::move(name));
  // The same layout as the real input, so that layout-dependent code (contiguous(), reshape of
  // a transposed tensor) traces as it runs eagerly; the guard includes the layout.
  TensorImpl* x = t.unsafe_impl();
  x->strides = l->strides;
  x->offset = l->offset;
  x->refresh_contiguous();
  return t;
}

int32_t Tracer::scope_index() {
  const std::string& s = current_scope();
  if (s.empty()) return -1;
  if (s == last_scope_) return last_scope_index_;
  auto it = std::find(graph_.scopes.begin(), graph_.scopes.end(), s);
  int32_t i = static_cast<int32_t>(it - graph_.scopes.begin());
  if (it == graph_.scopes.end()) graph_.scopes.push_back(s);
  last_scope_ = s;
  last_scope_index_ = i;
  return i;
}

int32_t Tracer::add_op(OpId op, const Attrs& attrs, std::vector<int32_t> inputs,
                       const TensorMeta& m) {
  GraphNode n;
  n.kind = NodeKind::Op;
  n.op = op;
  n.attrs = attrs;
  n.inputs = std::move(inputs);
  n.meta = m;
  n.scope = scope_index();
  n.site = detail::tls_site;
  n.phase = static_cast<uint16_t>(std::min<uint64_t>(backward_edges() - edges_at_start_, 0xffff));
  n.no_grad = grad_at_start_ && !detail::grad_mode();
  return graph_.add(std::move(n));
}

int32_t Tracer::capture(const Tensor& t) {
  const TensorImpl* x = t.unsafe_impl();
  auto key = std::make_tuple(static_cast<const StorageImpl*>(x->storage.get()), x->offset,
                             to_vec(x->shape), to_vec(x->strides), static_cast<int>(x->dtype), x);
  auto it = captured_.find(key);
  if (it != captured_.end()) return it->second;
  GraphNode n;
  n.kind = NodeKind::Input;
  n.role = InputRole::Captured;
  n.meta = {x->shape, x->dtype, x->device(), {}};
  n.index = static_cast<int32_t>(graph_.captured.size());
  n.scope = scope_index();
  graph_.captured.push_back(t);
  int32_t v = graph_.add(std::move(n));
  captured_.emplace(std::move(key), v);
  return v;
}

void Tracer::throw_stale_view(const char* what, const TensorImpl* x, const Layout& written) {
  throw Error(with_context(fmt::format(
      "[{}] a tensor of shape {} (strides {}, offset {}) reads memory that was written in place "
      "through another view (shape {}, strides {}, offset {}) after it was made. A compiled "
      "function follows in-place writes through the written tensor itself; use out-of-place "
      "ops for the other views, or clone() before writing",
      what, x->shape, Shape(x->strides.data(), x->strides.size()), x->offset, written.shape,
      Shape(written.strides.data(), written.strides.size()), written.offset)));
}

int32_t Tracer::value_of(const Tensor& t) {
  note_read(t);  // (ops, control flow and results read their tensors through here)
  const TensorImpl* x = t.unsafe_impl();
  const StorageImpl* st = x->storage.get();
  if (x->trace) {
    if (x->trace.get() != tag_.get()) {
      if (!x->trace->alive) throw_traced_use(t, "compile");
      if (is_ancestor_tag(x->trace.get())) return lift(t);
      throw Error(with_context(
          fmt::format("[compile] a tensor (shape {}) traced by {} was used in another trace; "
                      "pass it as an argument instead",
                      x->shape, x->trace->name)));
    }
    if (x->sym_version == st->version_.load(std::memory_order_relaxed)) return x->value;
    auto it = written_.find(st);
    DUET_ASSERT(it != written_.end(), "traced storage changed version without a recorded write");
    if (layout_of(x) == it->second.layout) return it->second.value;
    throw_stale_view("compile", x, it->second.layout);
  }
  auto it = written_.find(st);
  if (it != written_.end()) {
    if (layout_of(x) == it->second.layout) return it->second.value;
    throw_stale_view("compile", x, it->second.layout);
  }
  if (x->wrapped_number) {
    GraphNode n;
    n.kind = NodeKind::Constant;
    n.meta = {x->shape, x->dtype, x->device(), {}};
    n.constant = t;
    return graph_.add(std::move(n));
  }
  return parent_ ? lift(t) : capture(t);
}

void Tracer::set_name(const Tensor& t, const std::string& name) {
  graph_.nodes[value_of(t)].name = name;
}

TensorMeta Tracer::symbolic_meta(const OpDef& def, const OpCall& c) {
  TensorMeta m = c.meta;
  bool any = c.attrs.sym != nullptr;
  for (int64_t i = 0; i < c.inputs.size(); ++i) any = any || !c.inputs[i].impl()->sym.empty();
  if (!any) return m;
  SymContext* ctx = sym_context();
  DUET_ASSERT(ctx, "[{}] symbolic sizes outside a symbolic trace", def.name);
  if (!def.sym_infer) {
    std::vector<SymInt> used;
    for (int64_t i = 0; i < c.inputs.size(); ++i)
      for (const SymInt& d : c.inputs[i].impl()->sym)
        if (!d.is_concrete()) used.push_back(d);
    if (c.attrs.sym)
      for (const SymInt& d : c.attrs.sym->ints)
        if (!d.is_concrete()) used.push_back(d);
    ctx->specialize(used, fmt::format("{} needs concrete sizes", def.name));
  }
  SymDims out;
  def.sym_infer(def, c.inputs, c.attrs, c.meta, out);
  DUET_ASSERT(hint_shape(out) == c.meta.shape,
              "[{}] the symbolic rule gives {} but the shape rule {} at the traced sizes", def.name,
              dims_str(out), c.meta.shape);
  if (!all_concrete(out)) m.sym = std::move(out);
  return m;
}

void guard_flag(std::shared_ptr<const void> owner, const bool* flag,
                const std::function<std::string()>& what) {
  if (Tracer* t = Tracer::current()) t->note_flag(std::move(owner), flag, what);
}

void Tracer::note_flag(std::shared_ptr<const void> owner, const bool* flag,
                       const std::function<std::string()>& what) {
  Tracer* root = top();
  for (const FlagGuard& f : root->flags_)
    if (f.flag == flag) return;
  root->flags_.push_back({std::move(owner), flag, *flag, what()});
}

void Tracer::note_read(const Tensor& t) {
  Tracer* root = top();
  if (!root->captured_written_ || root->args_after_writes_) return;
  const StorageImpl* st = t.unsafe_impl()->storage.get();
  const auto& in = root->input_storages_;
  root->args_after_writes_ = std::find(in.begin(), in.end(), st) != in.end();
}

Tensor Tracer::handle(const OpCall& c) {
  const OpDef& def = op_def(c.op);
  std::vector<int32_t> ins(static_cast<size_t>(c.inputs.size()));
  for (int64_t i = 0; i < c.inputs.size(); ++i) ins[i] = value_of(c.inputs[i]);
  const TensorMeta meta = symbolic_meta(def, c);

  if (c.inplace_out) {
    const Tensor& self = *c.inplace_out;
    TensorImpl* x = self.unsafe_impl();
    if (!meta.sym.empty() || !x->sym.empty()) {
      const SymDims r = meta_dims(meta), t = sym_dims(self);
      for (size_t d = 0; d < r.size(); ++d) {
        const bool eq = sym_decide(r[d], SymRel::Eq, t[d], def.name);
        DUET_ASSERT(eq, "[{}_] result {} into {}", def.name, dims_str(r), dims_str(t));
      }
    }
    StorageImpl* st = x->storage.get();
    const bool symbolic_storage = st->data == nullptr && st->allocator == nullptr && x->trace;
    DUET_CHECK(!parent_ || owns_storage(st) || (outside_writes_ && !symbolic_storage),
               "[{}_] while tracing {}: a tensor of shape {} from outside the function is "
               "written in place. The functions of cond, scan and while_loop may write in place "
               "only tensors they create; return the new value instead",
               def.name, graph_.label, x->shape);
    int32_t v = add_op(c.op, c.attrs, std::move(ins), meta);
    if (c.meta.dtype != x->dtype) {
      Attrs a;
      a.dtype = x->dtype;
      v = add_op(OpId::Cast, a, {v}, TensorMeta{meta.shape, x->dtype, meta.device, meta.sym});
    }
    const Layout lay = layout_of(x);
    auto it = written_.find(st);
    if (it != written_.end() && !(it->second.layout == lay))
      throw_stale_view(def.name, x, it->second.layout);
    DUET_CHECK(
        std::find(input_storages_.begin(), input_storages_.end(), st) == input_storages_.end(),
        "[{}_] while tracing {}: an argument (shape {}) is written in place. A compiled "
        "function may update in place only tensors it captures (parameters, buffers); "
        "clone() the argument first, or return the new value",
        def.name, graph_.label, x->shape);
    int32_t target = -1;
    if (!symbolic_storage) {
      // A captured tensor (or a view of one) written in place: a write-back into its storage.
      Tensor alias = make_view(self, x->shape, x->strides, x->offset);
      TensorImpl* a = alias.unsafe_impl();
      a->trace.reset();
      a->value = -1;
      a->is_view = x->is_view;
      target = graph_.nodes[capture(x->trace ? alias : self)].index;
    }
    const uint32_t version = st->version_.fetch_add(1, std::memory_order_relaxed) + 1;
    written_[st] = Written{lay, v, target};
    if (target >= 0) top()->captured_written_ = true;
    if (x->trace) {
      x->value = v;
      x->sym_version = version;
    }
    return self;
  }

  if (c.op == OpId::Print) {
    // An effect: chained to the previous print, so that plans keep them in program order.
    if (last_print_ >= 0) ins.push_back(last_print_);
    last_print_ = add_op(c.op, c.attrs, std::move(ins), meta);
    return traced(last_print_, meta, false);
  }
  int32_t v = add_op(c.op, c.attrs, std::move(ins), meta);
  if (def.cls == OpClass::View) {
    Tensor out;
    {
      HintReads hints;  // strides of the traced call's sizes; the graph keeps the symbolic dims
      out = def.view(c.inputs[0], c.attrs, c.meta);
    }
    if (out.defined()) {
      TensorImpl* x = out.unsafe_impl();
      x->sym = meta.sym;
      x->trace = tag_;
      x->value = v;
      x->sym_version = x->storage->version_.load(std::memory_order_relaxed);
      return out;
    }
    // No strides express it: eager copies, so the result is a fresh contiguous tensor.
  }
  return traced(v, meta, false);
}

void Tracer::finish(const std::vector<Tensor>& outputs) {
  for (const Tensor& o : outputs) graph_.outputs.push_back(value_of(o));
  std::vector<WriteBack> wb;
  for (auto& [st, w] : written_)
    if (w.captured >= 0) wb.push_back({w.value, w.captured});
  std::sort(wb.begin(), wb.end(),
            [](const WriteBack& a, const WriteBack& b) { return a.target < b.target; });
  graph_.writebacks = std::move(wb);
}

}  // namespace duet::detail

namespace duet::detail {

namespace {
std::string call_site(const char* file, unsigned line) {
  return file ? fmt::format(" at {}:{}", file_basename(file), line) : "";
}
}  // namespace

std::string show_value(const Tensor& value) {
  if (value.numel() != 1) return fmt::format("the values of a tensor of shape {}", value.sizes());
  const double d = read_double(value, 0);
  return value.dtype() == DType::b8 ? (d != 0 ? "true" : "false") : fmt::format("{}", d);
}

Tensor Tracer::read(const Tensor& t, const char* what, const char* file, unsigned line) {
  Tracer* root = top();
  const TensorImpl* x = t.unsafe_impl();
  const std::string site = call_site(file, line);
  if (x->trace) {
    if (!x->trace->alive || !root->evaluate_) throw_traced_use(t, what, file, line);
    if (x->trace.get() != root->tag_.get())
      throw Error(with_context(fmt::format(
          "[{}] reads the values of a tensor (shape {}, {}) computed inside {}{}. With "
          "CompileOptions::guard_data_reads a compiled function may read values computed "
          "outside cond, scan and while_loop bodies; inside a body, branch with a nested "
          "duet::cond instead",
          what, x->shape, x->dtype, x->trace->name, site)));
  } else {
    if (!root->written_.count(x->storage.get())) return t;
    if (!root->evaluate_)
      throw Error(with_context(fmt::format(
          "[{}] reads a tensor (shape {}, {}){} that {} wrote in place earlier in this trace. "
          "A traced function runs no kernels: the write happens only when the compiled function "
          "runs, so the data there now is stale. Read the value before the write, return it as "
          "an output, or compile with CompileOptions::guard_data_reads to read it at trace time "
          "and retrace when it changes",
          what, x->shape, x->dtype, site, root->graph_.label)));
  }
  const int32_t v = root->value_of(t);
  for (const ValueGuard& g : root->value_guards_)
    if (g.value == v) return g.expected;
  Tensor value;
  {
    SuspendModes eager;
    SymContextGuard no_symbols(nullptr);
    NoGradGuard no_grad;
    value = root->evaluate_(root->graph_, v).contiguous().clone();
  }
  root->value_guards_.push_back(
      {v, value, fmt::format("{}(){} read {}", what, site, show_value(value))});
  return value;
}

}  // namespace duet::detail
