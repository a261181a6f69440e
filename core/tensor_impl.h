// duet: the objects behind a Tensor handle. Internal: users see duet::Tensor.
//
// Note [Tensor layout]
// A tensor is (storage, offset, shape, strides, dtype). Shape and strides are inline up to rank
// 6 and strides count elements, so views (reshape, permute, slice, expand) are new TensorImpls
// over the same storage, without copies. One atomic reference count per object; a Tensor handle
// is one pointer.
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/allocator.h"
#include "core/device.h"
#include "core/symbolic.h"
#include "core/dtype.h"
#include "core/memory_profile.h"
#include "core/shape.h"

namespace duet {
class Tensor;
}

namespace duet::detail {

/// Intrusive reference-counted pointer: T has `std::atomic<int32_t> refcount_` and is freed
/// with delete when it reaches zero.
template <class T>
class IntrusivePtr {
 public:
  IntrusivePtr() = default;
  /// Adopts a pointer whose count is already 1 (a fresh object).
  static IntrusivePtr adopt(T* p) {
    IntrusivePtr r;
    r.p_ = p;
    return r;
  }
  IntrusivePtr(const IntrusivePtr& o) : p_(o.p_) { retain(); }
  IntrusivePtr(IntrusivePtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  IntrusivePtr& operator=(const IntrusivePtr& o) {
    if (p_ != o.p_) {
      o.retain();
      release();
      p_ = o.p_;
    }
    return *this;
  }
  IntrusivePtr& operator=(IntrusivePtr&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~IntrusivePtr() { release(); }

  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  /// The number of handles to the object (1 means this is the only one).
  int32_t use_count() const { return p_ ? p_->refcount_.load(std::memory_order_acquire) : 0; }
  void reset() {
    release();
    p_ = nullptr;
  }
  friend bool operator==(const IntrusivePtr& a, const IntrusivePtr& b) { return a.p_ == b.p_; }

 private:
  void retain() const {
    if (p_) p_->refcount_.fetch_add(1, std::memory_order_relaxed);
  }
  // A count of 1 seen by a holder means no other handle exists, and none can appear (copies
  // come from handles), so the object dies without a locked decrement (as c10's intrusive_ptr).
  void release() {
    if (p_ && (p_->refcount_.load(std::memory_order_acquire) == 1 ||
               p_->refcount_.fetch_sub(1, std::memory_order_acq_rel) == 1))
      delete p_;
  }
  T* p_ = nullptr;
};

// Note [Tensor object cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every eager op makes a TensorImpl and a StorageImpl and frees the ones it replaces: with
// malloc and free, a tenth of an op on a small tensor. Each thread keeps a short list of freed
// objects per class and reuses them (a few loads and stores); a list holds at most 256, and is
// emptied when its thread exits. An object freed on another thread joins that thread's list.
// An Autobatch scope makes a hundred thousand pending tensors per step (eager/autobatch.cpp)
// and frees them together when its run ends. Those StorageImpls and TensorImpls (and only
// those: object_cache_scope marks where they are made and freed) go to lists of their own, of
// up to 2^17 each (at most 35 MB a thread), from which the next step's are made: B1 78 -> 70 ms
// a step, B2 26 -> 24, and a loop step in between no longer leaves the next one malloc's
// scattered blocks (B2: 34 -> 30 ms). The short lists stay short: a per-sample loop that drew
// from long ones got its objects scattered over the heap, and ran a third slower.
// When a scope's list is empty, its objects are cut from a region of their own (one per class
// and process, 2^17 objects), in the order made, rather than from malloc: a heap churned by
// earlier work (a per-sample loop) otherwise scattered them, and B2's step took a fifth longer.
// A region's objects never go back to malloc (core/tensor.cpp).
// object_cache_scope(+1) and (-1) bracket such a stretch on the calling thread.
// The sanitizer builds use plain new and delete, so that a use after free is caught.
inline constexpr int kCachedObjectClasses = 4;
void* cached_object_new(int cls, size_t n);
void cached_object_delete(int cls, void* p) noexcept;
/// Marks (+1) and ends (-1) a stretch of code on this thread whose StorageImpls and TensorImpls
/// go to and come from the long lists of Note [Tensor object cache].
void object_cache_scope(int delta);
/// object_cache_scope(+1) for its lifetime.
struct ObjectCacheScope {
  ObjectCacheScope() { object_cache_scope(+1); }
  ~ObjectCacheScope() { object_cache_scope(-1); }
  ObjectCacheScope(const ObjectCacheScope&) = delete;
  ObjectCacheScope& operator=(const ObjectCacheScope&) = delete;
};

/// An allocator of single objects from class Cls's cache, for std::allocate_shared (the tape's
/// nodes): every allocation through one rebound type has one size.
template <class T, int Cls>
struct CachedObjectAllocator {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = CachedObjectAllocator<U, Cls>;
  };
  CachedObjectAllocator() = default;
  template <class U>
  CachedObjectAllocator(const CachedObjectAllocator<U, Cls>&) {}
  T* allocate(size_t n) {
    if (n == 1) return static_cast<T*>(cached_object_new(Cls, sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n == 1)
      cached_object_delete(Cls, p);
    else
      ::operator delete(p);
  }
  template <class U>
  bool operator==(const CachedObjectAllocator<U, Cls>&) const {
    return true;
  }
};

/// The serial number of the newest storage made (StorageImpl::serial).
inline std::atomic<uint64_t> g_storage_serial{0};

/// A block of device memory shared by a tensor and its views.
struct StorageImpl {
  static void* operator new(size_t n) { return cached_object_new(0, n); }
  static void operator delete(void* p) noexcept { cached_object_delete(0, p); }
  std::atomic<int32_t> refcount_{1};
  /// Bumped by every in-place write; autograd compares it with the version it saved.
  std::atomic<uint32_t> version_{0};
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  /// A storage whose value an Autobatch scope has not computed yet (data is null until it
  /// runs; Note [Autobatch] in eager/autobatch.cpp). Reading its data runs the scope's pending
  /// work first.
  bool lazy = false;
  /// A lazy storage's op in its scope's pending list.
  int32_t lazy_op = -1;
  /// Frees `data` when the storage dies; null for memory duet does not own.
  Allocator* allocator = nullptr;
  /// The storage whose memory `data` points into, held alive (an Autobatch result: one sample of
  /// a batched kernel's output); null when this storage owns its memory or borrows it.
  IntrusivePtr<StorageImpl> base;
  /// Increasing in the order storages are made: a storage with a serial above a number read
  /// earlier was made since (a checkpoint tells the values its region computed by it).
  uint64_t serial;

  StorageImpl(void* d, size_t n, Device dev, Allocator* a)
      : data(d),
        nbytes(n),
        device(dev),
        allocator(a),
        serial(g_storage_serial.fetch_add(1, std::memory_order_relaxed) + 1) {}
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl() {
    if (__builtin_expect(g_memory_profiles.load(std::memory_order_relaxed) > 0, 0) && allocator)
      memory_profile_freed(this, static_cast<int64_t>(nbytes), !device.is_cpu());
    if (allocator) allocator->deallocate(data, nbytes);
  }
};
using StoragePtr = IntrusivePtr<StorageImpl>;

/// Computes a lazy storage (StorageImpl::lazy): runs this thread's Autobatch scope, or throws
/// the Error that says why it cannot (another thread's scope, or a scope whose run failed).
void force_lazy(const StorageImpl* st);

/// Allocates storage for nbytes on a device through its caching allocator.
StoragePtr new_storage(size_t nbytes, Device device);

struct Node;  // eager/node.h: one recorded op on the autograd tape
struct AutogradMeta;

/// The trace that traced tensors belong to (trace/tracer.h). A traced tensor has no data:
/// it stands for an SSA value of a graph being traced. The tag outlives the trace, so that a
/// traced tensor used after its trace closed (an escaped tensor) can name its compiled
/// function in the error.
struct TraceTag {
  std::atomic<int32_t> refcount_{1};
  bool alive = true;
  std::string name;  ///< "compiled function at file.cpp:12", "Program"
  explicit TraceTag(std::string n) : name(std::move(n)) {}
};

/// A tensor's metadata plus its storage. See Note [Tensor layout].
struct TensorImpl {
  static void* operator new(size_t n) { return cached_object_new(1, n); }
  static void operator delete(void* p) noexcept { cached_object_delete(1, p); }
  std::atomic<int32_t> refcount_{1};
  DType dtype = DType::f32;
  bool contiguous = true;        ///< row-major dense, cached from shape and strides
  bool wrapped_number = false;   ///< a 0-d tensor made from a C++ Scalar: promotes like a Scalar
  bool requires_grad = false;    ///< a leaf marked by requires_grad_(), or an output with grad_fn
  bool is_view = false;          ///< made by a view op from another tensor's storage
  int32_t value = -1;            ///< traced tensors: the SSA value in the trace's graph
  uint32_t sym_version = 0;      ///< traced tensors: the storage version `value` holds
  IntrusivePtr<TraceTag> trace;  ///< non-null for traced tensors (see TraceTag)
  int64_t offset = 0;            ///< in elements, into storage
  Shape shape;
  Strides strides;
  StoragePtr storage;
  /// Traced tensors of a trace with symbolic dims: every dim as a SymInt (shape holds the
  /// traced call's sizes); empty otherwise. Reading shape through Tensor's accessors then
  /// specializes (Note [Symbolic dims] in trace/compile.h).
  SymDims sym;
  std::unique_ptr<AutogradMeta> autograd;  ///< .grad and grad_fn; null until autograd needs it

  TensorImpl();
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  int64_t numel() const { return shape.numel(); }
  int64_t ndim() const { return shape.size(); }
  Device device() const { return storage ? storage->device : Device::cpu(); }
  void* data() const {
    if (__builtin_expect(storage->lazy, 0)) force_lazy(storage.get());
    return static_cast<char*>(storage->data) + offset * itemsize(dtype);
  }
  /// Recomputes `contiguous` after shape or strides changed.
  void refresh_contiguous();
};
using TensorImplPtr = IntrusivePtr<TensorImpl>;

/// Autograd state of a tensor: the accumulated gradient of a leaf, and the node that made a
/// non-leaf.
struct AutogradMeta {
  static void* operator new(size_t n) { return cached_object_new(2, n); }
  static void operator delete(void* p) noexcept { cached_object_delete(2, p); }
  TensorImplPtr grad;
  std::shared_ptr<Node> grad_fn;
  /// Tensor::register_post_accumulate_grad_hook's hooks, by handle.
  std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> post_accumulate_hooks;
};

/// The tensor's AutogradMeta, created on first use.
inline AutogradMeta& autograd_meta(TensorImpl& t) {
  if (!t.autograd) t.autograd = std::make_unique<AutogradMeta>();
  return *t.autograd;
}

}  // namespace duet::detail
