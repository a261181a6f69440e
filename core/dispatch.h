// duet: dispatch. Every op call goes: shape rule -> modes (tracer, ...) -> kernel.
//
// Note [Dispatch modes]
// A thread-local stack of DispatchModes intercepts op calls, as JAX's interpreters do. With an
// empty stack (plain eager) the call runs the device kernel directly. The tracer (trace/) pushes
// a mode that records a graph node instead of running a kernel. A mode that wants the normal
// behaviour calls redispatch(), which runs the modes below it and then the kernel.
#pragma once

#include "core/op_table.h"

namespace duet {

/// One op call as the modes see it.
struct OpCall {
  OpId op;
  TensorRefs inputs;
  const Attrs& attrs;
  const TensorMeta& meta;     ///< output metadata from the op's shape rule
  const Tensor* inplace_out;  ///< the tensor an in-place op writes into, else null
};

/// An interception point on the dispatch path (see Note [Dispatch modes]).
class DispatchMode {
 public:
  virtual ~DispatchMode() = default;
  /// Produces the result of `call`.
  virtual Tensor handle(const OpCall& call) = 0;
};

/// Pushes a mode for the lifetime of the guard (RAII).
class ModeGuard {
 public:
  explicit ModeGuard(DispatchMode* mode);
  ~ModeGuard();
  ModeGuard(const ModeGuard&) = delete;
  ModeGuard& operator=(const ModeGuard&) = delete;
};

namespace detail {
/// A mode that counts the kernels of the ops called under it (a view runs none) and runs them:
/// an Autobatch scope's statistics, and the benchmarks' and tests' counts of eager kernels.
class KernelCounter final : public DispatchMode {
 public:
  Tensor handle(const OpCall& c) override;
  int64_t kernels = 0;
};
/// Counts the kernels this thread runs (each op but a view; an in-place op counts) into
/// `*count` for its lifetime, as KernelCounter does, but with no mode on the stack: the ops
/// keep eager's fast path (an Autobatch scope's runs and backward count so).
class KernelCountScope {
 public:
  explicit KernelCountScope(int64_t* count);
  ~KernelCountScope();
  KernelCountScope(const KernelCountScope&) = delete;
  KernelCountScope& operator=(const KernelCountScope&) = delete;

 private:
  int64_t* saved_;
};
/// Calls op with its inputs. Bit i of `expiring` says input i is an rvalue the caller will drop:
/// its buffer may be reused for the output when nothing else holds it.
Tensor call(OpId op, TensorRefs inputs, const Attrs& attrs, unsigned expiring = 0);
/// Calls op writing its result into `self` (in-place; the result must broadcast to self).
void call_inplace(OpId op, TensorRefs inputs, const Attrs& attrs, const Tensor& self);
/// Runs `call` as if `self` and every mode above it were not on the stack.
Tensor redispatch(const DispatchMode* self, const OpCall& call);
/// The number of modes on this thread's stack.
int mode_depth();
/// Takes every mode off this thread's stack for its lifetime, so that ops run eagerly on real
/// data (the tracer makes real buffers with it, such as a missing .grad).
class SuspendModes {
 public:
  SuspendModes();
  ~SuspendModes();
  SuspendModes(const SuspendModes&) = delete;
  SuspendModes& operator=(const SuspendModes&) = delete;

 private:
  int saved_;
  DispatchMode* modes_[16];  // the stack's slots, which modes pushed meanwhile overwrite
};
/// True for a tensor that stands for a traced value and has no data (see TraceTag).
inline bool is_traced(const Tensor& t) { return t.unsafe_impl()->trace.get() != nullptr; }
/// Throws the error for data being read from a traced tensor: during its trace (item(),
/// to_vector() in a traced function), or after it (an escaped tensor). `what` names the reader;
/// file and line name the caller's call site when known (file may be null).
[[noreturn]] void throw_traced_use(const Tensor& t, const char* what, const char* file = nullptr,
                                   unsigned line = 0);
/// Reads values into C++ (item(), to_vector()) while a trace runs on this thread: the tracer
/// answers with the tensor to read, or the error for a data-dependent read (Note [Data-dependent
/// reads] in trace/tracer.h).
class ValueReader {
 public:
  virtual ~ValueReader() = default;
  /// The tensor whose data `what` reads in place of t: t itself when its data is current, or
  /// t's value computed from the traced call's data. file and line name the caller's site.
  virtual Tensor read(const Tensor& t, const char* what, const char* file, unsigned line) = 0;
};
/// The innermost reader on this thread, or null outside a trace.
ValueReader* value_reader();
/// Makes `r` the reader for its lifetime (RAII); the previous one comes back after.
class ValueReaderGuard {
 public:
  explicit ValueReaderGuard(ValueReader* r);
  ~ValueReaderGuard();
  ValueReaderGuard(const ValueReaderGuard&) = delete;
  ValueReaderGuard& operator=(const ValueReaderGuard&) = delete;

 private:
  ValueReader* prev_;
};
/// What computes lazy storages on this thread (an Autobatch scope, eager/autobatch.h): a read of
/// a lazy storage's data (TensorImpl::data) calls run(), which runs the pending work.
class LazyRunner {
 public:
  virtual ~LazyRunner() = default;
  virtual void run_lazy() = 0;
  /// Gives `st` its value now if it is computed but not yet placed (a run in progress places
  /// the samples of its differentiated batches only when read); true when it did.
  virtual bool resolve(const StorageImpl* st) {
    (void)st;
    return false;
  }
};
/// Makes `r` this thread's runner (null: none); returns the previous one.
LazyRunner* set_lazy_runner(LazyRunner* r);
/// Runs this thread's pending lazy work, if any (a trace starts from computed tensors).
void run_lazy_work();
/// Whether ops on this thread may be recorded lazily (an Autobatch scope is open).
bool lazy_runner_active();
/// Called by a mode's handle() for the call it handles: the mode records the call's gradient
/// itself, so the dispatcher makes no tape node for it (an Autobatch scope differentiates the
/// batched ops it runs, Note [Autobatch's tape] in eager/autobatch.cpp).
void claim_autograd();
/// Grad mode of this thread (NoGradGuard turns it off).
bool grad_mode();
void set_grad_mode(bool enabled);
/// Sets grad mode for its lifetime (RAII), either way (NoGradGuard only turns it off).
struct GradModeScope {
  explicit GradModeScope(bool on);
  ~GradModeScope();
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool prev_;
};
}  // namespace detail

}  // namespace duet
