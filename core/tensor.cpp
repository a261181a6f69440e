#include "core/tensor.h"

#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <ostream>

#include "core/check_shape.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {

void throw_undefined_tensor() { DUET_CHECK(false, "[tensor] use of an undefined Tensor"); }

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kObjectCache = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kObjectCache = false;
#else
constexpr bool kObjectCache = true;
#endif
#else
constexpr bool kObjectCache = true;
#endif

// Note [Tensor object cache]: per thread, a list of freed objects per class (0 StorageImpl,
// 1 TensorImpl, 2 AutogradMeta, 3 a tape Node with its shared_ptr control block), linked
// through their first bytes. Trivially destructible, so that an object
// freed during exit, after the thread's destructors ran, still finds it; `closed` then sends
// it to plain delete.
// Within object_cache_scope (`scopes` > 0), StorageImpls and TensorImpls (classes 0 and 1) are
// freed to and drawn from lists of their own, of up to kMaxScopeObjects each.
struct ObjectLists {
  void* head[kCachedObjectClasses];
  int count[kCachedObjectClasses];
  void* scope_head[2];
  int scope_count[2];
  int scopes;
  bool registered;
  bool closed;
};
thread_local ObjectLists tls_objects{};
constexpr int kMaxCachedObjects = 256;
constexpr int kMaxScopeObjects = 1 << 17;

// Within object_cache_scope, new StorageImpls and TensorImpls come from one region per class,
// made once per process and cut in the order asked for, when the scope's list is empty: the
// pending tensors of a step then lie in the order they are made, whatever the heap's state.
// Objects of the heap, from malloc, lie where a program's earlier work left holes: after a
// per-sample loop had churned the heap, B2's autobatched step took 23-25 ms where it took 19
// in a fresh process (recording 8.4 ms against 6.3), and 19 with the regions in either.
// A region's objects are never given back to malloc: freed, they join the freeing thread's scope
// list whatever its length (the region bounds their number), and those of a thread that exits
// are not used again. Once a region is used up, objects come from malloc as before.
struct ObjectRegion {
  std::atomic<char*> base{nullptr};  // published once bytes is set
  size_t bytes = 0;
  std::atomic<size_t> used{0};
  bool holds(const void* p) const {
    const char* b = base.load(std::memory_order_acquire);
    return b && static_cast<const char*>(p) >= b && static_cast<const char*>(p) < b + bytes;
  }
};
ObjectRegion g_object_regions[2];
std::once_flag g_object_regions_made;

void* object_region_new(int cls, size_t n) {
  std::call_once(g_object_regions_made, [] {
    for (int c = 0; c < 2; ++c) {
      const size_t bytes =
          size_t{kMaxScopeObjects} * (c == 0 ? sizeof(StorageImpl) : sizeof(TensorImpl));
      // Address space only: pages are backed as objects are first written.
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) continue;
      g_object_regions[c].bytes = bytes;
      g_object_regions[c].base.store(static_cast<char*>(p), std::memory_order_release);
    }
  });
  ObjectRegion& r = g_object_regions[cls];
  char* base = r.base.load(std::memory_order_acquire);
  if (!base || r.used.load(std::memory_order_relaxed) + n > r.bytes) return nullptr;
  const size_t at = r.used.fetch_add(n, std::memory_order_relaxed);
  return at + n <= r.bytes ? base + at : nullptr;
}

struct ObjectListsFlush {
  bool armed = false;
  ~ObjectListsFlush() {
    ObjectLists& l = tls_objects;
    l.closed = true;
    for (int c = 0; c < kCachedObjectClasses; ++c)
      while (void* p = l.head[c]) {
        l.head[c] = *static_cast<void**>(p);
        ::operator delete(p);
      }
    for (int c = 0; c < 2; ++c)
      while (void* p = l.scope_head[c]) {
        l.scope_head[c] = *static_cast<void**>(p);
        if (!g_object_regions[c].holds(p)) ::operator delete(p);
      }
  }
};
thread_local ObjectListsFlush tls_objects_flush;

}  // namespace

void* cached_object_new(int cls, size_t n) {
  if (kObjectCache) {
    ObjectLists& l = tls_objects;
    if (l.scopes > 0 && cls < 2) {
      if (void* p = l.scope_head[cls]) {
        l.scope_head[cls] = *static_cast<void**>(p);
        --l.scope_count[cls];
        return p;
      }
      if (void* p = object_region_new(cls, n)) return p;
    }
    if (void* p = l.head[cls]) {
      l.head[cls] = *static_cast<void**>(p);
      --l.count[cls];
      return p;
    }
  }
  return ::operator new(n);
}

void cached_object_delete(int cls, void* p) noexcept {
  if (kObjectCache) {
    ObjectLists& l = tls_objects;
    const bool region = cls < 2 && g_object_regions[cls].holds(p);
    const bool scope = region || (l.scopes > 0 && cls < 2 && l.scope_count[cls] < kMaxScopeObjects);
    if (region && l.closed) return;  // (never malloc's)
    if (!l.closed && (scope || l.count[cls] < kMaxCachedObjects)) {
      if (!l.registered) {
        l.registered = true;
        tls_objects_flush.armed = true;  // its destructor empties the lists when the thread exits
      }
      void*& head = scope ? l.scope_head[cls] : l.head[cls];
      *static_cast<void**>(p) = head;
      head = p;
      ++(scope ? l.scope_count[cls] : l.count[cls]);
      return;
    }
  }
  ::operator delete(p);
}

void object_cache_scope(int delta) { tls_objects.scopes += delta; }

StoragePtr new_storage(size_t nbytes, Device device) {
  Allocator* alloc = &cpu_allocator();
  if (__builtin_expect(!device.is_cpu(), 0)) {
    check_device_usable(device, "alloc");
    alloc = &device_backend(device.type)->allocator(device);
  }
  Allocator& a = *alloc;
  void* p = a.allocate(nbytes);
  StoragePtr st = StoragePtr::adopt(new StorageImpl(p, nbytes, device, &a));
  if (__builtin_expect(g_memory_profiles.load(std::memory_order_relaxed) > 0, 0))
    memory_profile_made(st.get(), static_cast<int64_t>(nbytes),
                        !device.is_cpu());  // Note [Memory profile]
  return st;
}

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

void TensorImpl::refresh_contiguous() {
  int64_t expected = 1;
  contiguous = true;
  for (int64_t i = shape.size() - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) {
      contiguous = shape.numel() == 0;
      return;
    }
    expected *= shape[i];
  }
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  check_shape("empty", shape, itemsize(dtype));  // Note [Checked sizes]
  auto* t = new TensorImpl();
  TensorImplPtr p = TensorImplPtr::adopt(t);
  t->dtype = dtype;
  t->shape = shape;
  const int64_t nd = shape.size();
  t->strides.resize(nd);
  int64_t n = 1;
  for (int64_t i = nd - 1; i >= 0; --i) {
    t->strides[i] = n;
    n *= shape[i];
  }
  if (n == 0) t->strides = contiguous_strides(shape);  // strides skip size-0 dims
  t->storage = new_storage(static_cast<size_t>(n) * itemsize(dtype), device);
  return Tensor(std::move(p));
}

Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset) {
  auto* t = new TensorImpl();
  TensorImplPtr p = TensorImplPtr::adopt(t);
  const TensorImpl* b = base.impl();
  t->dtype = b->dtype;
  t->shape = shape;
  t->strides = strides;
  t->offset = offset;
  t->storage = b->storage;
  t->is_view = true;
  // A view of a traced tensor is traced: the tracer gives view ops their own value, and
  // aliases (detach, autograd's saved tensors) keep the base's.
  t->trace = b->trace;
  t->value = b->value;
  // An alias (the same layout) keeps the base's symbolic dims; the tracer sets a view op's own.
  if (!b->sym.empty() && shape == b->shape && strides == b->strides && offset == b->offset)
    t->sym = b->sym;
  t->sym_version = b->sym_version;
  t->refresh_contiguous();
  return Tensor(std::move(p));
}

void throw_scalar_range(const char* op, const Scalar& s, DType d) {
  const std::string v = s.is_floating() ? fmt::format("{}", s.to<double>())
                        : s.is_bool()   ? std::string(s.to<bool>() ? "true" : "false")
                                        : fmt::format("{}", s.to<int64_t>());
  throw ValueError(
      ::duet::detail::with_context(fmt::format("[{}] value {} does not fit in {}", op, v, d)));
}

Tensor wrap_scalar(const Scalar& s, DType dtype, Device) {
  // A wrapped number lives on the CPU whatever the device of the tensor it goes with: kernels
  // of every device read it as a value (the dispatcher lets it mix with any device).
  Tensor t = empty(Shape{}, dtype, Device::cpu());
  switch (dtype) {
    case DType::f64:
      *static_cast<double*>(t.raw_data()) = s.to<double>();
      break;
    case DType::i64:
      *static_cast<int64_t*>(t.raw_data()) = s.to<int64_t>();
      break;
    case DType::b8:
      *static_cast<bool*>(t.raw_data()) = s.to<bool>();
      break;
    default:
      DUET_ASSERT(false, "wrapped numbers are f64, i64 or b8");
  }
  t.impl()->wrapped_number = true;
  return t;
}

// The value of a wrapped number (f64, i64 or b8, on the CPU).
static Scalar wrapped_value(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f64:
      return Scalar(*static_cast<const double*>(t.raw_data()));
    case DType::i64:
      return Scalar(*static_cast<const int64_t*>(t.raw_data()));
    case DType::b8:
      return Scalar(*static_cast<const bool*>(t.raw_data()));
    default:
      DUET_ASSERT(false, "wrapped numbers are f64, i64 or b8");
  }
  return Scalar(0);
}

double read_double(const Tensor& t, int64_t i) {
  // A device tensor (a constant the compiler folded on a GPU, a guarded value) is read through
  // a host copy: its memory is not the host's.
  if (!t.device().is_cpu()) {
    SuspendModes eager;
    return read_double(t.to(Device::cpu()), i);
  }
  // Row-major index -> storage offset.
  const TensorImpl* x = t.impl();
  int64_t off = 0;
  for (int64_t d = x->ndim() - 1; d >= 0; --d) {
    int64_t n = x->shape[d];
    off += (i % n) * x->strides[d];
    i /= n;
  }
  const char* base = static_cast<const char*>(x->data());
  switch (x->dtype) {
    case DType::f16:
    case DType::bf16:
      return low_precision_to_float(reinterpret_cast<const uint16_t*>(base)[off], x->dtype);
    case DType::i8:
      return reinterpret_cast<const int8_t*>(base)[off];
    case DType::u8:
      return reinterpret_cast<const uint8_t*>(base)[off];
    case DType::i16:
      return reinterpret_cast<const int16_t*>(base)[off];
    default:
      break;
  }
  return DUET_DISPATCH_DTYPE(x->dtype, "read", [&] {
    return static_cast<double>(reinterpret_cast<const scalar_t*>(base)[off]);
  });
}

}  // namespace detail

int64_t Tensor::size(int64_t dim, std::source_location loc) const {
  detail::SiteGuard site(loc);
  const int64_t d = detail::wrap_dim("size", dim, this->dim());
  if (__builtin_expect(!impl()->sym.empty(), 0)) detail::read_symbolic_sizes(*this, d, loc);
  return impl()->shape[d];
}

void detail::read_symbolic_sizes(const Tensor& t, int64_t dim, const std::source_location& loc) {
  if (HintReads::active()) return;
  SymContext* c = sym_context();
  if (!c) return;  // the trace is over: the tensor is dead and its next use says so
  const SymDims& s = t.impl()->sym;
  std::vector<SymInt> read;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d)
    if ((dim < 0 || d == dim) && !s[d].is_concrete()) read.push_back(s[d]);
  if (read.empty()) return;
  const std::string dims = dims_str(s);
  // The reader's file:line, so that the user need not search for the read.
  const std::string at = fmt::format("{}:{}", file_basename(loc.file_name()), loc.line());
  c->specialize(read, dim < 0 ? fmt::format("the sizes of a tensor of shape {} were read as "
                                            "integers (sizes(), shape() or numel() at {})",
                                            dims, at)
                              : fmt::format("size({}) at {} of a tensor of shape {} was read as "
                                            "an integer",
                                            dim, at, dims));
}

SymDims detail::sym_dims(const Tensor& t) {
  const TensorImpl* x = t.impl();
  if (!x->sym.empty()) return x->sym;
  return SymDims(x->shape.begin(), x->shape.end());
}

SymInt detail::sym_dim(const Tensor& t, int64_t d) {
  const TensorImpl* x = t.impl();
  return x->sym.empty() ? SymInt(x->shape[d]) : x->sym[static_cast<size_t>(d)];
}

namespace {
// The tensor whose data a read of t's values reads: t, or (while tracing) what the tracer
// answers (Note [Data-dependent reads] in trace/tracer.h).
Tensor readable(const char* op, const Tensor& t, std::source_location loc) {
  Tensor r = t;
  if (detail::ValueReader* reader = detail::value_reader())
    r = reader->read(t, op, loc.file_name(), loc.line());
  else if (detail::is_traced(t))
    detail::throw_traced_use(t, op, loc.file_name(), loc.line());
  // A device tensor is read through a copy to the CPU, which waits for the device's pending
  // work (as PyTorch's item() does).
  if (!r.device().is_cpu()) {
    detail::SuspendModes eager;
    struct NoGrad {  // a read is no differentiable use (core cannot see eager's NoGradGuard)
      bool prev = detail::grad_mode();
      NoGrad() { detail::set_grad_mode(false); }
      ~NoGrad() { detail::set_grad_mode(prev); }
    } no_grad;
    r = r.to(Device::cpu());
  }
  return r;
}
}  // namespace

template <class T>
T Tensor::item(std::source_location loc) const {
  detail::SiteGuard site(loc);
  const Tensor r = readable("item", *this, loc);
  DUET_CHECK_VALUE(r.numel() == 1, "[item] needs exactly one element, got shape {} ({} elements)",
                   r.sizes(), r.numel());
  detail::SuspendModes eager;  // r has data: convert it eagerly, also inside a trace
  Tensor c = r.to(detail::dtype_of<T>::value);
  return *static_cast<const T*>(c.raw_data());
}

template <class T>
std::vector<T> Tensor::to_vector(std::source_location loc) const {
  detail::SiteGuard site(loc);
  const Tensor r = readable("to_vector", *this, loc);
  detail::SuspendModes eager;
  Tensor c = r.to(detail::dtype_of<T>::value).contiguous();
  std::vector<T> v(static_cast<size_t>(r.numel()));
  if (!v.empty()) std::memcpy(v.data(), c.raw_data(), v.size() * sizeof(T));
  return v;
}

// std::vector<bool> is packed, so it gets its own copy loop.
template <>
std::vector<bool> Tensor::to_vector<bool>(std::source_location loc) const {
  detail::SiteGuard site(loc);
  const Tensor r = readable("to_vector", *this, loc);
  detail::SuspendModes eager;
  Tensor c = r.to(DType::b8).contiguous();
  const bool* p = static_cast<const bool*>(c.raw_data());
  return std::vector<bool>(p, p + r.numel());
}

#define DUET_INSTANTIATE(T)                               \
  template T Tensor::item<T>(std::source_location) const; \
  template std::vector<T> Tensor::to_vector<T>(std::source_location) const;
DUET_INSTANTIATE(float)
DUET_INSTANTIATE(double)
DUET_INSTANTIATE(int32_t)
DUET_INSTANTIATE(int64_t)
DUET_INSTANTIATE(int8_t)
DUET_INSTANTIATE(uint8_t)
DUET_INSTANTIATE(int16_t)
template bool Tensor::item<bool>(std::source_location) const;
#undef DUET_INSTANTIATE

// to(Device) is the Transfer op (Note [Device transfers] in kernels/index.cpp): taped, with the
// gradient sent back to the source's device, and traced like any op.
Tensor Tensor::to(Device device, std::source_location loc) const {
  detail::SiteGuard site(loc);
  const Device from = this->device();
  if (device == from) return *this;
  detail::check_device_usable(device, "to");
  detail::check_device_usable(from, "to");
  Attrs a;
  a.device = device;
  const Tensor* in[] = {this};
  return detail::call(OpId::Transfer, TensorRefs(in, 1), a);
}

Tensor Tensor::to(DType dtype, std::source_location loc) const {
  detail::SiteGuard site(loc);
  if (dtype == this->dtype()) return *this;
  Attrs a;
  a.dtype = dtype;
  const Tensor* in[] = {this};
  return detail::call(OpId::Cast, TensorRefs(in, 1), a);
}

Tensor Tensor::contiguous(std::source_location loc) const {
  detail::SiteGuard site(loc);
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone(std::source_location loc) const {
  detail::SiteGuard site(loc);
  const Tensor* in[] = {this};
  return detail::call(OpId::Copy, TensorRefs(in, 1), Attrs{});
}

Tensor Tensor::detach() const {
  const detail::TensorImpl* x = impl();
  // Traced: a view recorded with grad mode off, so that the graph holds the cut (vmap replays
  // the graph with autograd on: Note [vmap] in trace/func.cpp).
  if (x->trace && x->trace->alive) {
    detail::GradModeScope off(false);
    Dims order;
    for (int64_t d = 0; d < x->shape.size(); ++d) order.push_back(d);
    Tensor v = duet::permute(*this, order);
    v.impl()->wrapped_number = x->wrapped_number;
    return v;
  }
  return detail::detached_alias(*this);
}

Tensor detail::detached_alias(const Tensor& t) {
  const detail::TensorImpl* x = t.impl();
  // A new leaf over the same storage (and version counter), outside autograd.
  Tensor v = detail::make_view(t, x->shape, x->strides, x->offset);
  v.impl()->wrapped_number = x->wrapped_number;
  v.impl()->is_view = false;
  return v;
}

namespace {
// An in-place method's work, with the caller's line as its call site (core/call_site.h).
Tensor& inplace(OpId op, Tensor& self, const Tensor& other, const std::source_location& loc) {
  detail::SiteGuard site(loc);
  const Tensor* in[] = {&self, &other};
  detail::call_inplace(op, TensorRefs(in, 2), Attrs{}, self);
  return self;
}
Tensor wrap_for(const Scalar& s) {
  DType d = s.is_floating() ? DType::f64 : s.is_integral() ? DType::i64 : DType::b8;
  return detail::wrap_scalar(s, d, Device::cpu());
}
}  // namespace

Tensor& Tensor::add_(const Tensor& o, std::source_location loc) {
  return inplace(OpId::Add, *this, o, loc);
}
Tensor& Tensor::add_(Scalar o, std::source_location loc) {
  return inplace(OpId::Add, *this, wrap_for(o), loc);
}
Tensor& Tensor::sub_(const Tensor& o, std::source_location loc) {
  return inplace(OpId::Sub, *this, o, loc);
}
Tensor& Tensor::sub_(Scalar o, std::source_location loc) {
  return inplace(OpId::Sub, *this, wrap_for(o), loc);
}
Tensor& Tensor::mul_(const Tensor& o, std::source_location loc) {
  return inplace(OpId::Mul, *this, o, loc);
}
Tensor& Tensor::mul_(Scalar o, std::source_location loc) {
  return inplace(OpId::Mul, *this, wrap_for(o), loc);
}
Tensor& Tensor::div_(const Tensor& o, std::source_location loc) {
  return inplace(OpId::Div, *this, o, loc);
}
Tensor& Tensor::div_(Scalar o, std::source_location loc) {
  return inplace(OpId::Div, *this, wrap_for(o), loc);
}

Tensor& Tensor::copy_(const Tensor& src, std::source_location loc) {
  detail::SiteGuard site(loc);
  // From another device: moved to this one first. A wrapped number (a Scalar, always on the
  // CPU) becomes a 0-d tensor made on this device (a fill, no transfer), since the copy reads
  // it through an expanded view, which no longer counts as a wrapped number.
  if (!(src.device() == device())) {
    if (src.impl()->wrapped_number)
      return copy_(
          full(Shape{}, detail::wrapped_value(src), Options().dtype(src.dtype()).device(device())));
    return copy_(src.to(device()));
  }
  Tensor s;
  if (impl()->sym.empty() && src.impl()->sym.empty()) {
    DUET_CHECK_SHAPE(detail::broadcast_shapes("copy_", src.sizes(), sizes()) == sizes(),
                     "[copy_] a source of shape {} cannot be broadcast to the shape {} it is "
                     "copied into",
                     src.sizes(), sizes());
    s = duet::expand(src, sizes());
  } else {
    // Symbolic dims (Note [Symbolic dims]): checked at the hints, and each dim where the
    // source's size is not the target's symbol decided with a guard.
    const SymDims to = detail::sym_dims(*this), from = detail::sym_dims(src);
    {
      detail::HintReads hints;
      DUET_CHECK_SHAPE(detail::broadcast_shapes("copy_", src.sizes(), sizes()) == sizes(),
                       "[copy_] a source of shape {} cannot be broadcast to the shape {} it is "
                       "copied into",
                       detail::dims_str(from), detail::dims_str(to));
    }
    const size_t lead = to.size() - from.size();
    for (size_t i = 0; i < from.size(); ++i) {
      const SymInt& f = from[i];
      const SymInt& t = to[lead + i];
      if (f == t || f == SymInt(1)) continue;
      if (detail::sym_hint(f) == detail::sym_hint(t))
        detail::sym_decide(f, detail::SymRel::Eq, t, "copy_");
      else
        detail::sym_decide(f, detail::SymRel::Eq, SymInt(1), "copy_");
    }
    s = detail::expand_dims(src, to);
  }
  const Tensor* in[] = {&s};
  detail::call_inplace(OpId::Copy, TensorRefs(in, 1), Attrs{}, *this);
  return *this;
}

Tensor& Tensor::zero_(std::source_location loc) {
  detail::SiteGuard site(loc);
  return copy_(detail::wrap_scalar(Scalar(0), DType::i64, Device::cpu()));
}

template <class T>
T* Tensor::data_ptr(std::source_location loc) const {
  detail::SiteGuard site(loc);
  if (detail::is_traced(*this)) detail::throw_traced_use(*this, "data_ptr");
  DUET_CHECK_DTYPE(dtype() == detail::dtype_of<T>::value,
                   "[data_ptr] tensor has dtype {}, asked for {}", dtype(),
                   detail::dtype_of<T>::value);
  return static_cast<T*>(raw_data());
}
template float* Tensor::data_ptr<float>(std::source_location) const;
template double* Tensor::data_ptr<double>(std::source_location) const;
template int32_t* Tensor::data_ptr<int32_t>(std::source_location) const;
template int64_t* Tensor::data_ptr<int64_t>(std::source_location) const;
template bool* Tensor::data_ptr<bool>(std::source_location) const;
template int8_t* Tensor::data_ptr<int8_t>(std::source_location) const;
template uint8_t* Tensor::data_ptr<uint8_t>(std::source_location) const;
template int16_t* Tensor::data_ptr<int16_t>(std::source_location) const;

bool Tensor::requires_grad() const { return impl()->requires_grad; }

bool Tensor::is_leaf() const {
  const detail::TensorImpl* t = impl();
  // A pending result of an Autobatch scope that needs a gradient gets its history when its run
  // runs (Note [Autobatch's tape] in eager/autobatch_tape.cpp).
  if (t->requires_grad && t->storage && t->storage->lazy) detail::run_lazy_work();
  return !t->autograd || !t->autograd->grad_fn;
}

Tensor& Tensor::requires_grad_(bool r) {
  detail::TensorImpl* t = impl();
  DUET_CHECK(is_leaf(),
             "[requires_grad_] can only change the flag of a leaf tensor; this tensor of shape {} "
             "was computed by an op (use detach() for a leaf)",
             t->shape);
  DUET_CHECK_DTYPE(!r || is_floating(t->dtype),
                   "[requires_grad_] only floating tensors can require gradients, got {} of shape "
                   "{}",
                   t->dtype, t->shape);
  t->requires_grad = r;
  // Created now, not by the first backward: another thread's backward may fill .grad while
  // this thread's ops read the leaf's autograd state.
  if (r) detail::autograd_meta(*t);
  return *this;
}

namespace detail {
thread_local std::vector<const TensorImpl*>* tls_materialized = nullptr;

void materialize_grad(TensorImpl* t) {
  // Only a trace (its ValueReader set) makes the buffer: an Autobatch scope or a kernel counter
  // is a mode too, but runs eagerly, where a leaf the backward has not reached has no .grad.
  if (mode_depth() == 0 || value_reader() == nullptr || t->trace || !t->requires_grad ||
      (t->autograd && t->autograd->grad) || (t->autograd && t->autograd->grad_fn))
    return;
  // docs/design.md, "Missing .grad": while tracing, a captured leaf's missing gradient is a real
  // zero buffer, which the trace captures like any tensor. The graph then reads and writes the
  // same buffer at every call, so the first call's trace serves every later call.
  SuspendModes eager;
  const bool prev = grad_mode();
  set_grad_mode(false);
  Tensor z = zeros(t->shape, Options().dtype(t->dtype).device(t->device()));
  set_grad_mode(prev);
  autograd_meta(*t).grad = z.impl_ptr();
  if (tls_materialized) tls_materialized->push_back(t);
}
}  // namespace detail

Tensor Tensor::grad() const {
  detail::TensorImpl* t = impl();
  detail::materialize_grad(t);
  return t->autograd ? Tensor(t->autograd->grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  detail::TensorImpl* t = impl();
  if (g.defined()) {
    DUET_CHECK_DTYPE(g.dtype() == t->dtype,
                     "[set_grad] gradient of shape {} {} does not match the tensor's {} {}: "
                     "expected dtype {}",
                     g.sizes(), g.dtype(), t->shape, t->dtype, t->dtype);
    DUET_CHECK_SHAPE(g.sizes() == t->shape,
                     "[set_grad] gradient of shape {} {} does not match the tensor's {} {}",
                     g.sizes(), g.dtype(), t->shape, t->dtype);
  }
  detail::autograd_meta(*t).grad = g.impl_ptr();
}

int64_t Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) {
  detail::TensorImpl* t = impl();
  DUET_CHECK_VALUE(is_leaf() && requires_grad(),
                   "[register_post_accumulate_grad_hook] needs a leaf that requires grad, got "
                   "a {} {} {}",
                   is_leaf() ? "leaf" : "non-leaf", t->shape, t->dtype);
  DUET_CHECK_VALUE(hook != nullptr, "[register_post_accumulate_grad_hook] an empty hook");
  static std::atomic<int64_t> next{1};
  const int64_t h = next.fetch_add(1);
  detail::autograd_meta(*t).post_accumulate_hooks.emplace_back(h, std::move(hook));
  return h;
}

void Tensor::remove_post_accumulate_grad_hook(int64_t handle) {
  detail::TensorImpl* t = impl();
  if (!t->autograd) return;
  auto& hooks = t->autograd->post_accumulate_hooks;
  std::erase_if(hooks, [&](const auto& h) { return h.first == handle; });
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace duet
