// duet: the CUDA runtime: device discovery, one stream per device, the caching device allocator,
// and the transfers core's Tensor::to(Device) uses. Host code only (compiled by the C++
// compiler against cudart), so it may use core's C++20 headers; kernels live in cuda/kernels.
//
// Note [CUDA streams and the cache]
// Every eager kernel and transfer on a device is enqueued on that device's one stream, in
// program order. A storage freed on the host goes back to the cache at once although kernels
// reading it may still be queued: the next user of the block is enqueued on the same stream, so
// it runs after them (PyTorch's caching allocator relies on the same ordering). Memory is
// returned to the driver (empty_cache) only after synchronizing the stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/call_site.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/runtime.h"

namespace duet::cuda {
namespace detail {

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error, so that the next call does not report it
  throw DeviceError(fmt::format("[cuda] {} failed: {} ({}) at {}:{}", call, cudaGetErrorName(e),
                                cudaGetErrorString(e), duet::detail::file_basename(file), line));
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(status);
  throw DeviceError(fmt::format("[cublas] {} failed: {} ({}) at {}:{}", call,
                                cublasGetStatusName(s), cublasGetStatusString(s),
                                duet::detail::file_basename(file), line));
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

namespace {

constexpr int kMaxDevices = 64;

// What the driver said once: the device count, or why there is no usable device.
struct Discovery {
  int count = 0;
  std::string why;  // empty when count > 0
};

const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      cudaGetLastError();  // no driver, too old a driver, no device: report none
      r.count = 0;
      r.why =
          fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    } else if (r.count == 0) {
      r.why = "the driver reports no CUDA device";
    }
    r.count = std::min(r.count, kMaxDevices);
    return r;
  }();
  return d;
}

// Rounding: blocks up to 1 MiB are multiples of 512 bytes (cudaMalloc aligns to 256); larger
// ones multiples of 128 KiB (under 12.5% more than asked, far less for large tensors). Freed
// blocks are kept per rounded size: a training loop asks for the same sizes at every step.
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeFrom = size_t(1) << 20;
constexpr size_t kLargeStep = size_t(128) << 10;

size_t round_size(size_t n) {
  if (n == 0) return kSmallStep;
  const size_t step = n <= kLargeFrom ? kSmallStep : kLargeStep;
  return (n + step - 1) / step * step;
}

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(Device device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    const size_t rounded = round_size(nbytes);
    DUET_ASSERT(rounded >= nbytes, "allocation of {} bytes is too large", nbytes);
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        ++hits_;
        note_alloc(rounded);
        return p;
      }
    }
    set_device(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e == cudaErrorMemoryAllocation) {
      // Give the cache back and try once more before failing; not while this thread captures a
      // graph: giving blocks back synchronizes the stream, which would break the capture (the
      // capture then fails with the error below and the plan runs without a graph).
      cudaGetLastError();
      if (!capturing(stream(device_))) {
        empty_cache();
        e = cudaMalloc(&p, rounded);
      }
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      const MemoryStats s = stats();
      throw DeviceError(fmt::format(
          "[alloc] out of memory allocating {} bytes on {} ({} bytes held by tensors, {} "
          "reserved by duet)",
          nbytes, device_.str(), s.current, s.reserved));
    }
    DUET_CUDA_CHECK(e);
    std::lock_guard<std::mutex> g(mu_);
    reserved_ += static_cast<int64_t>(rounded);
    note_alloc(rounded);
    return p;
  }

  void deallocate(void* p, size_t nbytes) noexcept override {
    if (!p) return;
    const size_t rounded = round_size(nbytes);
    // Reused only by work on this device's stream: see Note [CUDA streams and the cache].
    std::lock_guard<std::mutex> g(mu_);
    current_ -= static_cast<int64_t>(rounded);
    if (!closed_) {
      try {
        free_[rounded].push_back(p);
        return;
      } catch (const std::bad_alloc&) {  // host memory too short to cache it: freed below
      }
    }
    // A graph's pool after the graph is gone (nothing replays into it any more), or a block
    // that could not be cached. cudaFree waits for the kernels that may still read it.
    reserved_ -= static_cast<int64_t>(rounded);
    cudaFree(p);         // never throws: this may run in a destructor
    cudaGetLastError();  // nor leaves an error for the next kernel's check to report
  }
  /// A graph's private pool when its graph is destroyed: cached blocks go back to the driver now,
  /// blocks still held by tensors when they are freed.
  void close() {
    {
      std::lock_guard<std::mutex> g(mu_);
      closed_ = true;
    }
    empty_cache();
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> g(mu_);
    return MemoryStats{current_, peak_, reserved_};
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> g(mu_);
    peak_ = current_;
  }
  void empty_cache() override {
    std::unordered_map<size_t, std::vector<void*>> blocks;
    {
      std::lock_guard<std::mutex> g(mu_);
      blocks.swap(free_);
    }
    if (blocks.empty()) return;
    // During a capture the blocks stay cached: synchronizing the stream would break it.
    if (capturing(stream(device_))) {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& [bytes, list] : blocks)
        free_[bytes].insert(free_[bytes].end(), list.begin(), list.end());
      return;
    }
    // Kernels queued before the blocks were freed may still read them.
    DUET_CUDA_CHECK(cudaStreamSynchronize(stream(device_)));
    int64_t released = 0;
    for (auto& [bytes, list] : blocks) {
      for (void* p : list) DUET_CUDA_CHECK(cudaFree(p));
      released += static_cast<int64_t>(bytes * list.size());
    }
    std::lock_guard<std::mutex> g(mu_);
    reserved_ -= released;
  }
  int64_t hits() const {
    std::lock_guard<std::mutex> g(mu_);
    return hits_;
  }

 private:
  void note_alloc(size_t rounded) {  // called with mu_ held
    current_ += static_cast<int64_t>(rounded);
    peak_ = std::max(peak_, current_);
  }

  const Device device_;
  bool closed_ = false;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  int64_t current_ = 0, peak_ = 0, reserved_ = 0, hits_ = 0;
};

// Per device: its stream and allocator, made on first use and leaked on purpose (tensors in
// static objects may be freed after main returns, when CUDA may be torn down: they only go back
// to the cache).
struct DeviceState {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  std::atomic<CudaCachingAllocator*> allocator{nullptr};
  int64_t* index_record = nullptr;      // host address (Note [Device index checks])
  int64_t* index_record_dev = nullptr;  // the same memory as the device sees it
};
DeviceState g_devices[kMaxDevices];
std::atomic<bool> g_allow_tf32{false};

// Throws unless `device` is a usable CUDA device.
void check(Device device, const char* op) {
  const Discovery& d = discovery();
  DUET_CHECK_DEVICE(d.count > 0, "[{}] {} is not usable: no usable CUDA GPU ({})", op, device.str(),
                    d.why);
  DUET_CHECK_DEVICE(device.is_cuda() && device.index >= 0 && device.index < d.count,
                    "[{}] {} does not exist: this machine has {} CUDA device{}", op, device.str(),
                    d.count, d.count == 1 ? "" : "s");
}

DeviceState& state(Device device) {
  check(device, "cuda");
  DeviceState& s = g_devices[device.index];
  std::call_once(s.once, [&] {
    set_device(device);
    // A blocking stream: it also orders against any work on the legacy default stream.
    DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamDefault));
    void* rec = nullptr;
    DUET_CUDA_CHECK(cudaHostAlloc(&rec, 8 * sizeof(int64_t), cudaHostAllocMapped));
    std::memset(rec, 0, 8 * sizeof(int64_t));
    s.index_record = static_cast<int64_t*>(rec);
    void* dev = nullptr;
    DUET_CUDA_CHECK(cudaHostGetDevicePointer(&dev, rec, 0));
    s.index_record_dev = static_cast<int64_t*>(dev);
    s.allocator = new CudaCachingAllocator(device);
  });
  return s;
}

bool started(int index) { return g_devices[index].allocator.load() != nullptr; }

// Note [CUDA graph capture]
// A compiled plan on a CUDA device is captured once as a CUDA graph and replayed (Note [CUDA graph
// replay] in trace/plan/executor.h). While a thread captures, its allocations on that device come
// from a private pool (a caching allocator of its own, as PyTorch's graph pools): blocks freed
// during the capture may be reused later in the same capture (one stream: the graph runs its nodes
// in that order), but never by other work, because every replay writes them again. The pool goes
// back to the driver when the graph is destroyed. The capture is in relaxed mode, so the pool
// may call cudaMalloc; a call that cannot be captured (a copy to the host, a synchronization)
// fails the capture, and the plan runs without a graph.
thread_local CudaCachingAllocator* tls_pool = nullptr;
thread_local int tls_pool_device = -1;
// The capture runs on a stream of its own, which stream() returns to the capturing thread
// alone: work that other threads queue on the device's stream meanwhile runs as usual instead of
// being recorded into the graph. The capture stream first waits for the device stream's pending
// work (the inputs copied into the graph's buffers); replays run on the device stream.
thread_local cudaStream_t tls_capture_stream = nullptr;

struct Graph {
  cudaGraphExec_t exec = nullptr;
  CudaCachingAllocator* pool = nullptr;
};

void* begin_capture(Device device) {
  DUET_CHECK(tls_pool == nullptr, "[cuda graph] captures do not nest");
  cudaStream_t main = stream(device);
  set_device(device);
  cudaStream_t s = nullptr;
  DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ready = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ready, main);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ready, 0);
  if (ready) cudaEventDestroy(ready);
  if (e == cudaSuccess) e = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    cudaStreamDestroy(s);
    DUET_CUDA_CHECK(e);
  }
  auto* pool = new CudaCachingAllocator(device);  // closed, not freed: see close()
  tls_pool = pool;
  tls_pool_device = device.index;
  tls_capture_stream = s;
  return pool;
}

void* end_capture(Device device, void* pool, std::string* why) {
  auto* p = static_cast<CudaCachingAllocator*>(pool);
  cudaStream_t s = tls_capture_stream;
  tls_pool = nullptr;
  tls_pool_device = -1;
  tls_capture_stream = nullptr;
  set_device(device);
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  cudaStreamDestroy(s);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess && graph) {
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
  }
  if (e != cudaSuccess || !exec) {
    if (why && why->empty())
      *why = fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    cudaGetLastError();
    try {
      p->close();
    } catch (const std::exception&) {
      cudaGetLastError();
    }
    return nullptr;
  }
  return new Graph{exec, p};
}

void launch_graph(void* graph, Device device) {
  set_device(device);
  DUET_CUDA_CHECK(cudaGraphLaunch(static_cast<Graph*>(graph)->exec, stream(device)));
}

// Called from a plan's destructor: reports nothing (a failing driver at exit is not an error).
void destroy_graph(void* graph, Device device) {
  auto* g = static_cast<Graph*>(graph);
  try {
    set_device(device);
    cudaStreamSynchronize(stream(device));  // the last replay may still run
    cudaGraphExecDestroy(g->exec);
    cudaGetLastError();  // ignored above: not left for the next kernel's check to report
    g->pool->close();
  } catch (const std::exception&) {
    cudaGetLastError();
  }
  delete g;
}

Allocator& backend_allocator(Device device) {
  if (tls_pool && tls_pool_device == device.index) return *tls_pool;
  return allocator(device);
}

// See DeviceBackend::copy. A copy to the CPU synchronizes the source's stream; a copy between
// two GPUs is queued on the destination's stream after the source's pending work, and the
// source's stream waits for it (the source block may be reused there once freed).
void copy(void* dst, Device to, const void* src, Device from, size_t nbytes) {
  if (nbytes == 0) return;
  if (from.is_cpu()) {
    set_device(to);
    // From pageable memory the call returns once the source is staged: it may be freed.
    DUET_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream(to)));
  } else if (to.is_cpu()) {
    set_device(from);
    cudaStream_t s = stream(from);
    DUET_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
    DUET_CUDA_CHECK(cudaStreamSynchronize(s));
    throw_recorded_index_error(from);
  } else if (to.index == from.index) {
    set_device(to);
    DUET_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream(to)));
  } else {
    cudaStream_t s_from = stream(from), s_to = stream(to);
    cudaEvent_t ready, done;
    set_device(from);
    DUET_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    DUET_CUDA_CHECK(cudaEventRecord(ready, s_from));
    set_device(to);
    DUET_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    DUET_CUDA_CHECK(cudaStreamWaitEvent(s_to, ready, 0));
    DUET_CUDA_CHECK(cudaMemcpyPeerAsync(dst, to.index, src, from.index, nbytes, s_to));
    DUET_CUDA_CHECK(cudaEventRecord(done, s_to));
    set_device(from);
    DUET_CUDA_CHECK(cudaStreamWaitEvent(s_from, done, 0));
    // Destroying a recorded event is safe: its resources go once the work completes.
    DUET_CUDA_CHECK(cudaEventDestroy(ready));
    DUET_CUDA_CHECK(cudaEventDestroy(done));
  }
}

}  // namespace

// Note [Device index checks]
// gather and scatter_add read their indices on the device. Reading them back on the host before
// each launch would stall the host at every call and cannot be captured in a CUDA graph (a
// compiled step with cross_entropy would never become one). Instead each kernel checks the
// indices it reads, skips an element whose index is out of range (gather writes 0 there), and
// records the first such index in a small record of host-mapped memory of the device (the
// kernels write it directly; the same address in every replay of a graph). Whatever reads data
// on the host synchronizes the stream first (a copy to the CPU, item(), cuda::synchronize()),
// then looks at the record: a set record becomes the ValueError the CPU kernel raises, with a
// note that it surfaced at a synchronization, and the record is cleared. As with PyTorch's
// device-side asserts, the error shows at the first host read after the op, not at the op.
int64_t* index_error_record(Device device) { return state(device).index_record_dev; }

void throw_recorded_index_error(Device device) {
  if (!started(device.index)) return;
  volatile int64_t* r = g_devices[device.index].index_record;
  if (r[0] == 0) return;
  const int64_t j = r[1], size = r[2], dim = r[3], op = r[4];
  r[0] = 0;
  throw ValueError(fmt::format(
      "[{}] index {} is out of range for dim {} of size {} (on {}: CUDA checks indices on the "
      "device, and the error shows at the first synchronization after the op)",
      op == 1 ? "gather" : "scatter_add", j, dim, size, device.str()));
}

cudaStream_t stream(Device device) {
  if (tls_capture_stream && tls_pool_device == device.index) return tls_capture_stream;
  return state(device).stream;
}

void set_device(Device device) {
  thread_local int current = -1;
  if (current == device.index) return;
  DUET_CUDA_CHECK(cudaSetDevice(device.index));
  current = device.index;
}

Allocator& allocator(Device device) { return *state(device).allocator.load(); }

int64_t cache_hits(Device device) { return state(device).allocator.load()->hits(); }

bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace {

void* record_event(Device device) {
  const cudaStream_t s = stream(device);
  if (capturing(s)) return nullptr;
  set_device(device);
  cudaEvent_t e;
  DUET_CUDA_CHECK(cudaEventCreate(&e));
  DUET_CUDA_CHECK(cudaEventRecord(e, s));
  return e;
}

double elapsed_ms(void* start, void* end) {
  DUET_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  DUET_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void destroy_event(void* event) {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));  // never throws: runs in destructors
  cudaGetLastError();
}

}  // namespace

// Called once from register_backends() (kernels/backends.cpp): lends core this backend.
void register_runtime() {
  DeviceBackend b;
  b.check = &check;
  b.allocator = &backend_allocator;
  b.copy = &copy;
  b.begin_capture = &begin_capture;
  b.end_capture = &end_capture;
  b.launch_graph = &launch_graph;
  b.destroy_graph = &destroy_graph;
  b.record_event = &record_event;
  b.elapsed_ms = &elapsed_ms;
  b.destroy_event = &destroy_event;
  ::duet::detail::set_device_backend(DeviceType::CUDA, b);
}

}  // namespace detail

int device_count() { return detail::discovery().count; }

bool is_available() { return device_count() > 0; }

void synchronize() {
  for (int i = 0; i < device_count(); ++i) {
    if (!detail::started(i)) continue;
    detail::set_device(Device::cuda(i));
    DUET_CUDA_CHECK(cudaDeviceSynchronize());
    detail::throw_recorded_index_error(Device::cuda(i));
  }
}

void empty_cache() {
  for (int i = 0; i < device_count(); ++i)
    if (detail::started(i)) detail::allocator(Device::cuda(i)).empty_cache();
}

MemoryStats memory_stats(int device) {
  if (device < 0 || device >= device_count() || !detail::started(device)) return {};
  return detail::allocator(Device::cuda(device)).stats();
}

int64_t cache_hits(int device) {
  if (device < 0 || device >= device_count() || !detail::started(device)) return 0;
  return detail::cache_hits(Device::cuda(device));
}

void reset_peak_memory_stats(int device) {
  if (device < 0 || device >= device_count() || !detail::started(device)) return;
  detail::allocator(Device::cuda(device)).reset_peak();
}

void set_allow_tf32(bool allow) { detail::g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return detail::allow_tf32(); }

}  // namespace duet::cuda
