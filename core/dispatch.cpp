#include "core/dispatch.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "core/anomaly.h"
#include "core/autocast.h"
#include "core/autograd_hooks.h"
#include "core/call_site.h"
#include "core/profiler.h"
#include "core/check_shape.h"

namespace duet {
namespace detail {

// Note [CPU scalars beside device tensors]
// Wrapped numbers (0-d CPU tensors made from C++ scalars) go anywhere. So does any 0-d CPU
// tensor read by an elementwise op, as in PyTorch: a count or a scale computed on the host (batch
// norm's n - 1, a loss's 1 / n) meets CUDA tensors as a number. The CUDA kernels read such an
// operand on the host and pass its value (cuda/kernels/elementwise.cpp, make_operand), and its
// gradient comes back to the CPU (sum_to in eager/engine.cpp). Other ops (matmul, index, cat)
// still want all their inputs on one device.
bool goes_anywhere(const OpDef& def, const TensorImpl* x) {
  const StorageImpl* st = x->storage.get();
  return x->wrapped_number || !st ||
         (def.cls == OpClass::Elementwise && x->shape.size() == 0 && st->device.is_cpu());
}

extern thread_local uint32_t tls_autocast;  // core/autocast.cpp

namespace {

constexpr int kMaxModes = 16;
thread_local DispatchMode* tls_modes[kMaxModes];
thread_local int tls_depth = 0;
thread_local bool tls_grad = true;
thread_local bool tls_autograd_claimed = false;  // claim_autograd()

bool any_requires_grad(TensorRefs in) {
  for (int64_t i = 0; i < in.size(); ++i)
    if (in[i].unsafe_impl()->requires_grad) return true;
  return false;
}

// With no mode on the stack, a traced input has escaped its trace (no tracer can give it a
// value): say so, naming the compiled function, instead of running a kernel on no data.
void check_concrete(const OpDef& def, TensorRefs in) {
  for (int64_t i = 0; i < in.size(); ++i)
    if (__builtin_expect(in[i].unsafe_impl()->trace.get() != nullptr, 0))
      throw_traced_use(in[i], def.name);
}

const char* device_type_name(DeviceType t) { return t == DeviceType::CPU ? "cpu" : "cuda"; }

// Inputs on different devices: the op names both devices. Called only when the hot path saw a
// mismatch.
[[noreturn]] void throw_mixed_devices(const OpDef& def, TensorRefs in) {
  const TensorImpl* first = nullptr;
  for (int64_t i = 0; i < in.size(); ++i) {
    const TensorImpl* x = in[i].unsafe_impl();
    if (goes_anywhere(def, x)) continue;
    if (!first) {
      first = x;
    } else if (!(x->device() == first->device())) {
      throw DeviceError(::duet::detail::with_context(fmt::format(
          "[{}] inputs are on different devices: {} (input 0) and {} (input {}); move them with "
          ".to(...)",
          def.name, first->device(), x->device(), i)));
    }
  }
  throw DeviceError(
      ::duet::detail::with_context(fmt::format("[{}] inputs are on different devices", def.name)));
}

// Whether the inputs that cannot go anywhere are all on one device.
inline bool one_device(const OpDef& def, TensorRefs in) {
  const StorageImpl* first = nullptr;
  for (int64_t i = 0; i < in.size(); ++i) {
    const TensorImpl* x = in[i].unsafe_impl();
    const StorageImpl* s = x->storage.get();
    if (goes_anywhere(def, x)) continue;
    if (!first)
      first = s;
    else if (s != first && !(s->device == first->device))
      return false;
  }
  return true;
}

KernelFn kernel_for(const OpDef& def, Device device) {
  KernelFn k = def.kernel[static_cast<int>(device.type)];
  DUET_CHECK_DEVICE(k, "[{}] has no kernel for device {}", def.name, device_type_name(device.type));
  return k;
}

// The default behaviour of a call below all modes: view, or allocate and run the kernel.
thread_local int64_t* tls_kernel_count = nullptr;  // KernelCountScope's counter, or null

Tensor execute(const OpDef& def, const OpCall& c, unsigned expiring) {
  if (__builtin_expect(tls_kernel_count != nullptr, 0) &&
      (def.cls != OpClass::View || c.inplace_out))
    ++*tls_kernel_count;
  if (def.cls == OpClass::View && !c.inplace_out) {
    Tensor v = def.view(c.inputs[0], c.attrs, c.meta);
    if (v.defined()) return v;
    // No view expresses it (reshape of a non-contiguous tensor): copy, then view.
    Tensor src = c.inputs[0].contiguous();
    v = def.view(src, c.attrs, c.meta);
    DUET_ASSERT(v.defined(), "{} of a contiguous tensor must be a view", def.name);
    return v;
  }
  if (c.inplace_out) {
    const Tensor& self = *c.inplace_out;
    kernel_for(def, self.device())(c.inputs, c.attrs, self);
    self.impl()->storage->version_.fetch_add(1, std::memory_order_relaxed);
    return self;
  }
  // Reuse the buffer of an expiring temporary (docs/design.md, "Expiring temporaries"): an
  // rvalue input with the output's exact layout that nobody else holds.
  for (unsigned m = expiring, i = 0; m; m >>= 1, ++i) {
    if (!(m & 1)) continue;
    const Tensor& t = c.inputs[i];
    TensorImpl* ti = t.unsafe_impl();
    if (t.is_unique() && ti->contiguous && ti->offset == 0 && !ti->wrapped_number &&
        !ti->requires_grad && ti->dtype == c.meta.dtype && ti->device() == c.meta.device &&
        ti->shape == c.meta.shape) {
      kernel_for(def, c.meta.device)(c.inputs, c.attrs, t);
      // Steal the handle: the caller bound this input as Tensor&& and C++ keeps the temporary
      // alive until the statement ends, so a copy would block reuse by the next op.
      return std::move(const_cast<Tensor&>(t));
    }
  }
  Tensor out = empty(c.meta.shape, c.meta.dtype, c.meta.device);
  kernel_for(def, c.meta.device)(c.inputs, c.attrs, out);
  return out;
}

Tensor run_from(int depth, const OpDef& def, const OpCall& c, unsigned expiring) {
  if (depth > 0) return tls_modes[depth - 1]->handle(c);
  return execute(def, c, expiring);
}

}  // namespace

// The profiler's event of one eager op (Note [Profiler] in core/profiler.h): shapes, bytes moved
// (each input read once, the result written once) and FLOPs. The inputs are described before
// the op runs: it may take over an expiring input's buffer.
struct ProfiledInputs {
  double start_us = 0;
  std::string shapes;
  int64_t bytes = 0;
  int64_t inner = 0;  // a product's shared dim
  int64_t first_numel = 0;
  int64_t second_numel = 0;  // conv2d's FLOPs need the second operand's size
  int64_t second_dim0 = 1;
  DeviceSpan
      span;  // the op's device time, when it runs on a device (Note [Device time in profiles])
};

static ProfiledInputs profile_inputs(TensorRefs inputs) {
  ProfiledInputs p;
  for (int64_t i = 0; i < inputs.size(); ++i) {
    const TensorImpl* x = inputs[i].unsafe_impl();
    if (i == 0) {
      p.first_numel = x->shape.numel();
      p.inner = x->ndim() ? x->shape[x->ndim() - 1] : 1;
    } else if (i == 1) {
      p.second_numel = x->shape.numel();
      p.second_dim0 = x->ndim() ? x->shape[0] : 1;
    }
    if (x->wrapped_number) continue;
    p.shapes += fmt::format("{}\"{} {}\"", p.shapes.empty() ? "" : ", ", x->dtype, x->shape);
    p.bytes += x->shape.numel() * itemsize(x->dtype);
    // The first device input decides (its backend may keep no events: then no span at all).
    if (!x->device().is_cpu() && p.span.device.is_cpu()) p.span = profile_device_begin(x->device());
  }
  p.start_us = profile_clock_us();
  return p;
}

static void profile_op(const OpDef& def, ProfiledInputs& p, const Tensor& out) {
  const double end_us = profile_clock_us();
  const TensorImpl* o = out.unsafe_impl();
  const int64_t n = o->shape.numel();
  int64_t flops = 0;
  if (def.id == OpId::MatMul)
    flops = 2 * n * p.inner;
  else if (def.id == OpId::Addmm || def.id == OpId::Addmv)
    // input + mat1 (m, k) @ mat2, input + mat (n, k) @ vec: the product's, the second input's k.
    flops = 2 * n * (p.second_dim0 ? p.second_numel / p.second_dim0 : 0);
  else if (def.id == OpId::LstmStep) {
    // x (rows, I) and h (rows, H) times 4H gates each (Note [LSTM step] in core/ops/rnn.cpp):
    // the result is (rows, 6H).
    const int64_t rows = p.inner ? p.first_numel / p.inner : 0;
    flops = rows ? 2 * (4 * n / (6 * rows)) * (p.first_numel + p.second_numel) : 0;
  } else if (def.id == OpId::Conv2d || def.id == OpId::Conv2dInputGrad)
    // 2 * (N, O, Ho, Wo) * (C, kh, kw): the output or in[0] times the weight (in[1]) over O.
    flops = 2 * (def.id == OpId::Conv2d ? n : p.first_numel) *
            (p.second_dim0 ? p.second_numel / p.second_dim0 : 0);
  else if (def.id == OpId::Conv2dWeightGrad)
    flops = 2 * p.second_numel * (o->shape.size() && o->shape[0] ? n / o->shape[0] : 0);
  else if (def.cls == OpClass::Elementwise)
    flops = n;
  else if (def.cls == OpClass::Reduction)
    flops = p.first_numel;
  const std::string args = fmt::format(
      "\"inputs\": [{}], \"output\": \"{} {}\", \"bytes\": {}, \"flops\": {}, "
      "\"site\": \"{}\"",
      p.shapes, o->dtype, o->shape, p.bytes + n * itemsize(o->dtype), flops, tls_site.str());
  profile_device_end(p.span, def.name, args);
  profile_event(def.name, "op", p.start_us, end_us, args);
}

Tensor call(OpId op, TensorRefs inputs, const Attrs& attrs, unsigned expiring) {
  const OpDef& def = op_def(op);
  // Autocast (Note [Autocast] in core/autocast.h): the inputs cast by Cast calls of their own,
  // before any mode sees the call, so that autograd and traces record the casts.
  if (__builtin_expect(tls_autocast != 0, 0) && def.autocast != AutocastClass::None) {
    std::vector<Tensor> cast;
    if (autocast_inputs(def.autocast == AutocastClass::Lower, inputs, cast)) {
      std::vector<const Tensor*> p;
      for (const Tensor& t : cast) p.push_back(&t);
      return call(op, TensorRefs(p.data(), inputs.size()), attrs, 0);
    }
  }
  // One pass over the inputs for the flags and the device check: this is the eager hot path.
  bool requires_grad = false, traced = false, mixed = false;
  const StorageImpl* first = nullptr;  // of the first input that is not a wrapped number
  for (int64_t i = 0; i < inputs.size(); ++i) {
    const TensorImpl* x = inputs[i].unsafe_impl();
    requires_grad |= x->requires_grad;
    traced |= x->trace.get() != nullptr;
    const StorageImpl* st = x->storage.get();
    if (x->wrapped_number || !st) continue;
    if (!first)
      first = st;
    else
      mixed |= st != first && !(st->device == first->device);
  }
  if (__builtin_expect(mixed, 0) && !one_device(def, inputs)) throw_mixed_devices(def, inputs);
  TensorMeta meta;
  if (__builtin_expect(traced, 0)) {
    HintReads hints;  // the symbolic rule says how the result depends on symbolic sizes
    def.infer(def, inputs, attrs, meta);
  } else {
    def.infer(def, inputs, attrs, meta);
  }
  detail::check_shape(def.name, meta.shape, itemsize(meta.dtype));  // Note [Checked sizes]
  OpCall c{op, inputs, attrs, meta, nullptr};
  if (__builtin_expect(traced, 0) && tls_depth == 0) check_concrete(def, inputs);
  // Autograd records a tape node when grad mode is on and an input requires grad, unless the
  // result cannot carry a gradient (a cast to an integer dtype, as in PyTorch). A recorded call
  // never reuses an input's buffer: the node may have saved that input.
  const bool record = tls_grad && def.differentiable && is_floating(meta.dtype) && requires_grad;
  // Anomaly mode (Note [Anomaly mode] in core/anomaly.h) reads the inputs before the op runs,
  // and keeps the op from reusing an input's buffer.
  const bool check = tls_depth == 0 && anomaly_on() && anomaly_inputs_clean(def, inputs);
  std::optional<ProfiledInputs> prof;
  if (__builtin_expect(tls_depth == 0 && profiling(), 0)) prof = profile_inputs(inputs);
  // Note [Memory profile]: the op that makes the storages allocated now.
  struct ProfiledOp {
    const char* saved = nullptr;
    bool set;
    explicit ProfiledOp(const char* name)
        : set(g_memory_profiles.load(std::memory_order_relaxed) > 0) {
      if (__builtin_expect(set, 0)) {
        saved = tls_profiled_op;
        tls_profiled_op = name;
      }
    }
    ~ProfiledOp() {
      if (__builtin_expect(set, 0)) tls_profiled_op = saved;
    }
  } profiled_op(def.name);
  Tensor out = run_from(tls_depth, def, c, (tls_depth || record || check) ? 0 : expiring);
  if (__builtin_expect(prof.has_value(), 0)) profile_op(def, *prof, out);
  if (__builtin_expect(check, 0)) anomaly_check_output(def, inputs, out);
  // Note [Autograd hooks]; a mode that claimed the call records its gradient itself.
  // Only a mode claims (claim_autograd), so with none on the stack there is nothing to reset.
  const bool claimed = tls_depth > 0 && std::exchange(tls_autograd_claimed, false);
  if (record && !claimed) autograd_hooks().record(def, inputs, attrs, out);
  return out;
}

void call_inplace(OpId op, TensorRefs inputs, const Attrs& attrs, const Tensor& self) {
  const OpDef& def = op_def(op);
  // A pending result of an Autobatch scope gets its history when its run runs: before the
  // autograd checks below, which would take it for a leaf, and before the node below takes
  // its inputs' edges (Note [Autobatch's tape]). An input may be pending when self is not: the
  // out-of-place result that a write of another dtype copies in (below).
  bool lazy = self.unsafe_impl()->storage && self.unsafe_impl()->storage->lazy;
  for (int64_t i = 0; !lazy && i < inputs.size(); ++i)
    lazy = inputs[i].unsafe_impl()->storage && inputs[i].unsafe_impl()->storage->lazy;
  if (__builtin_expect(lazy, 0)) run_lazy_work();
  if (__builtin_expect(inputs.size() > 1 && !one_device(def, inputs), 0))
    throw_mixed_devices(def, inputs);
  TensorMeta meta;
  if (__builtin_expect(tls_depth > 0, 0)) {
    HintReads hints;  // symbolic traces check the symbolic shapes in the tracer
    def.infer(def, inputs, attrs, meta);
  } else {
    def.infer(def, inputs, attrs, meta);
  }
  DUET_CHECK_SHAPE(meta.shape == hint_sizes(self),
                   "[{}_] the result of shape {} cannot be written in place into a tensor of "
                   "shape {}",
                   def.name, meta.shape, self.sizes());
  // A tensor whose elements share memory (an expanded view: stride 0 over a size above 1)
  // cannot be written in place: each write would land on one element several times, and the
  // base would hold whichever came last. PyTorch refuses these writes too.
  {
    const TensorImpl* si = self.unsafe_impl();
    for (int64_t d = 0; d < si->shape.size(); ++d)
      DUET_CHECK_VALUE(!(si->strides[d] == 0 && si->shape[d] > 1),
                       "[{}_] cannot write in place into a tensor of shape {} with strides {}: "
                       "more than one of its elements refers to one memory location (dim {} "
                       "is expanded); clone() it first",
                       def.name, si->shape, Shape(si->strides.data(), si->strides.size()), d);
  }
  // Copy converts between any dtypes (copy_); arithmetic may not narrow the kind (an f32
  // result cannot go into an i64 tensor), as in PyTorch.
  const bool is_copy = op == OpId::Copy;
  DUET_CHECK_DTYPE(is_copy || category(meta.dtype) <= category(self.dtype()),
                   "[{}_] the result of dtype {} cannot be written in place into a tensor of "
                   "dtype {}",
                   def.name, meta.dtype, self.dtype());
  DUET_CHECK_DEVICE(meta.device == self.device(),
                    "[{}_] the result on {} cannot be written in place into a tensor on {}",
                    def.name, meta.device, self.device());
  if (tls_depth == 0) {
    check_concrete(def, inputs);
    const Tensor* s[] = {&self};
    check_concrete(def, TensorRefs(s, 1));
  }
  const TensorImpl* si = self.unsafe_impl();
  const bool record = tls_grad && def.differentiable && is_floating(si->dtype) &&
                      (si->requires_grad || any_requires_grad(inputs));
  if (record) {
    DUET_CHECK(!(si->requires_grad && (!si->autograd || !si->autograd->grad_fn)),
               "[{}_] a leaf tensor that requires grad (shape {}) cannot be modified in place "
               "while grad mode is on; wrap the update in NoGradGuard (as optimizers do)",
               def.name, si->shape);
    DUET_CHECK(!si->is_view,
               "[{}_] autograd does not record in-place writes into a view (shape {}); use an "
               "out-of-place op, or clone() the view first",
               def.name, si->shape);
  }
  // When the result dtype differs from self's, or an input overlaps self with another layout,
  // compute out of place and copy: an element must never be read after it was overwritten.
  bool direct = is_copy || meta.dtype == self.dtype();
  for (int64_t i = 0; direct && i < inputs.size(); ++i) {
    const TensorImpl* a = inputs[i].unsafe_impl();
    const TensorImpl* s = self.unsafe_impl();
    if (a->storage.get() == s->storage.get() &&
        !(a->offset == s->offset && a->shape == s->shape && a->strides == s->strides))
      direct = false;
  }
  if (!direct) {
    // Self is read through an alias with its current autograd identity: the op's node may save
    // it, and a handle to self would make a cycle once self gets the Copy node as its grad_fn
    // (Note [Saved tensors]).
    Tensor self_alias = record ? autograd_hooks().alias(self) : Tensor();
    std::vector<const Tensor*> args(static_cast<size_t>(inputs.size()));
    for (int64_t i = 0; i < inputs.size(); ++i)
      args[i] = record && inputs[i].unsafe_impl() == si ? &self_alias : &inputs[i];
    Tensor tmp = call(op, TensorRefs(args.data(), inputs.size()), attrs);
    const Tensor* src[] = {&tmp};
    call_inplace(OpId::Copy, TensorRefs(src, 1), Attrs{}, self);
    return;
  }
  // In anomaly mode the values self held count as inputs: it is written over.
  const Tensor* self_ref[] = {&self};
  const bool check = tls_depth == 0 && anomaly_on() && anomaly_inputs_clean(def, inputs) &&
                     anomaly_inputs_clean(def, TensorRefs(self_ref, 1));
  OpCall c{op, inputs, attrs, meta, &self};
  // The node is prepared before the write, so that it saves self's old autograd identity and
  // version: a rule that needs self's overwritten value then fails loudly at backward time.
  std::shared_ptr<Node> node =
      record ? autograd_hooks().prepare(def, inputs, attrs, &self) : nullptr;
  std::optional<ProfiledInputs> prof;
  if (__builtin_expect(tls_depth == 0 && profiling(), 0)) prof = profile_inputs(inputs);
  run_from(tls_depth, def, c, 0);
  if (__builtin_expect(prof.has_value(), 0)) profile_op(def, *prof, self);
  if (__builtin_expect(check, 0)) anomaly_check_output(def, inputs, self);
  if (record) autograd_hooks().finish(std::move(node), self);
}

bool grad_mode() { return tls_grad; }
void set_grad_mode(bool enabled) { tls_grad = enabled; }
GradModeScope::GradModeScope(bool on) : prev_(tls_grad) { tls_grad = on; }
GradModeScope::~GradModeScope() { tls_grad = prev_; }

Tensor redispatch(const DispatchMode* self, const OpCall& c) {
  int depth = tls_depth;
  while (depth > 0 && tls_modes[depth - 1] != self) --depth;
  DUET_ASSERT(depth > 0, "redispatch from a mode that is not on the stack");
  return run_from(depth - 1, op_def(c.op), c, 0);
}

int mode_depth() { return tls_depth; }

namespace {
thread_local ValueReader* tls_reader = nullptr;
}
ValueReader* value_reader() { return tls_reader; }
ValueReaderGuard::ValueReaderGuard(ValueReader* r) : prev_(tls_reader) { tls_reader = r; }
ValueReaderGuard::~ValueReaderGuard() { tls_reader = prev_; }

namespace {
thread_local LazyRunner* tls_lazy_runner = nullptr;
}
LazyRunner* set_lazy_runner(LazyRunner* r) { return std::exchange(tls_lazy_runner, r); }
bool lazy_runner_active() { return tls_lazy_runner != nullptr; }
void claim_autograd() { tls_autograd_claimed = true; }

KernelCountScope::KernelCountScope(int64_t* count) : saved_(tls_kernel_count) {
  tls_kernel_count = count;
}
KernelCountScope::~KernelCountScope() { tls_kernel_count = saved_; }

Tensor KernelCounter::handle(const OpCall& c) {
  if (op_def(c.op).cls != OpClass::View || c.inplace_out) ++kernels;
  return redispatch(this, c);
}
void run_lazy_work() {
  if (tls_lazy_runner) tls_lazy_runner->run_lazy();
}

void force_lazy(const StorageImpl* st) {
  if (tls_lazy_runner && tls_lazy_runner->resolve(st)) return;
  run_lazy_work();
  DUET_CHECK(!st->lazy,
             "[autobatch] a tensor ({} bytes on {}) that an Autobatch scope computes lazily was "
             "read {}. Read it on the scope's thread, while the scope is open or after it closed",
             st->nbytes, st->device,
             tls_lazy_runner ? "but its scope's pending work did not compute it (an earlier run "
                               "of that work failed with an error)"
                             : "on a thread with no Autobatch scope, or after its scope's run "
                               "failed with an error");
}

static_assert(kMaxModes == 16, "SuspendModes::modes_ holds the whole stack");
SuspendModes::SuspendModes() : saved_(tls_depth) {
  std::copy(tls_modes, tls_modes + saved_, modes_);
  tls_depth = 0;
}
SuspendModes::~SuspendModes() {
  std::copy(modes_, modes_ + saved_, tls_modes);
  tls_depth = saved_;
}

void throw_traced_use(const Tensor& t, const char* what, const char* file, unsigned line) {
  const TensorImpl* x = t.unsafe_impl();
  const TraceTag& tag = *x->trace;
  const std::string site = file ? fmt::format(" at {}:{}", file_basename(file), line) : "";
  if (tag.alive)
    throw Error(fmt::format(
        "[{}] reads the values of a traced tensor (shape {}, {}) into C++{} while tracing {}. "
        "A traced function runs no kernels, so its tensors have no values yet, and a branch on "
        "data would be baked into the graph. Keep the computation in tensor ops; for "
        "data-dependent control flow use duet::cond or duet::scan (or duet::while_loop), or run "
        "this code eagerly; or compile with CompileOptions::guard_data_reads, which reads the "
        "value "
        "at trace time and traces again when it changes",
        what, x->shape, x->dtype, site, tag.name));
  const std::string msg = fmt::format(
      "[{}] a tensor (shape {}, {}) created while tracing {} was used after that trace ended{}. "
      "Tensors computed inside a compiled function exist only inside it: return them as "
      "outputs, and update captured tensors in place (w.sub_(lr * g), not w = w - lr * g)",
      what, x->shape, x->dtype, tag.name, site);
  throw Error(file ? msg : with_context(msg));  // the line of the op that used it
}

}  // namespace detail

ModeGuard::ModeGuard(DispatchMode* mode) {
  DUET_CHECK(detail::tls_depth < detail::kMaxModes, "[dispatch] more than {} nested modes",
             detail::kMaxModes);
  detail::tls_modes[detail::tls_depth++] = mode;
}
ModeGuard::~ModeGuard() { --detail::tls_depth; }

}  // namespace duet
