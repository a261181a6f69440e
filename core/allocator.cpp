#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/op_table.h"

namespace duet {
namespace {

// Size classes: multiples of 64 bytes up to 1 KiB, then four classes per power of two up to
// 256 KiB, so a small block is at most 25% larger than asked. Larger blocks are multiples of
// 16 KiB (at most 6.25% larger, far less for the megabytes of weights and activations), kept
// in free lists per exact size: a training loop asks for the same sizes at every step.
constexpr int kSmallClasses = 16;  // 64 .. 1024
constexpr size_t kLargeFrom = size_t(256) << 10;
constexpr size_t kLargeStep = size_t(16) << 10;
constexpr int kMaxClass = kSmallClasses + 4 * 8;  // 1 KiB .. 256 KiB
constexpr int kLarge = -1;                        // the class of every large block
// A small class keeps at most this many freed blocks; the rest go back to malloc. A per-sample
// loop frees a hundred thousand small tensors per step: kept, they were reused scattered over the
// heap, and the next step ran a third slower (Autobatch's B2 step after a loop step: 41.5 ->
// 56.8 ms; capped, 48.0), and the loop itself ran slower too (B1: 328 -> 295 ms per step).
constexpr size_t kMaxCachedSmall = 1024;

int size_class(size_t n, size_t* rounded) {
  if (n <= 1024) {
    size_t c = n == 0 ? 1 : (n + 63) / 64;
    *rounded = c * 64;
    return static_cast<int>(c - 1);
  }
  if (n > kLargeFrom) {
    *rounded = (n + kLargeStep - 1) / kLargeStep * kLargeStep;
    return kLarge;
  }
  int log2 = 63 - __builtin_clzll(n - 1);  // 2^log2 < n <= 2^(log2+1)
  size_t quarter = size_t(1) << (log2 - 2);
  size_t k = (n - (size_t(1) << log2) + quarter - 1) / quarter;  // 1..4
  *rounded = (size_t(1) << log2) + k * quarter;
  return kSmallClasses + (log2 - 10) * 4 + static_cast<int>(k - 1);
}

class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) __builtin_ia32_pause();
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

class CpuCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t rounded;
    const int c = size_class(nbytes, &rounded);
    DUET_ASSERT(rounded >= nbytes, "allocation of {} bytes is too large", nbytes);
    void* p = nullptr;
    {
      std::lock_guard<SpinLock> hold(lock_);
      if (std::vector<void*>* fl = cached(c, rounded); fl && !fl->empty()) {
        p = fl->back();
        fl->pop_back();
      }
      current_ += static_cast<int64_t>(rounded);
      peak_ = std::max(peak_, current_);
      if (!p) reserved_ += static_cast<int64_t>(rounded);
    }
    if (!p) {
      p = std::aligned_alloc(64, rounded);
      if (!p) {
        // Give the cache back and try once more before failing.
        empty_cache();
        p = std::aligned_alloc(64, rounded);
        if (!p) {
          lock_.lock();
          current_ -= static_cast<int64_t>(rounded);
          reserved_ -= static_cast<int64_t>(rounded);
          lock_.unlock();
          throw Error(::duet::detail::with_context(
              fmt::format("[alloc] out of memory allocating {} bytes on cpu", nbytes)));
        }
      }
    }
    return p;
  }

  // Called from destructors, also while an exception unwinds: it must not throw. Keeping the
  // block may allocate (a free list's first block of a large size, a list that grows); when
  // memory is that short, the block goes back to the system instead (a throw here ended the
  // program through std::terminate, holding the lock).
  void deallocate(void* p, size_t nbytes) noexcept override {
    if (!p) return;
    size_t rounded;
    const int c = size_class(nbytes, &rounded);
    bool keep = false;
    {
      std::lock_guard<SpinLock> hold(lock_);
      try {
        std::vector<void*>& fl = c == kLarge ? large_[rounded] : free_[c];
        if (c == kLarge || fl.size() < kMaxCachedSmall) {
          fl.push_back(p);
          keep = true;
        }
      } catch (const std::bad_alloc&) {
      }
      current_ -= static_cast<int64_t>(rounded);
      if (!keep) reserved_ -= static_cast<int64_t>(rounded);
    }
    if (!keep) std::free(p);
  }

  MemoryStats stats() const override {
    lock_.lock();
    MemoryStats s{current_, peak_, reserved_};
    lock_.unlock();
    return s;
  }
  void reset_peak() override {
    lock_.lock();
    peak_ = current_;
    lock_.unlock();
  }
  void empty_cache() override {
    lock_.lock();
    for (int c = 0; c < kMaxClass; ++c) {
      for (void* p : free_[c]) std::free(p);
      reserved_ -= static_cast<int64_t>(free_[c].size()) * class_bytes(c);
      free_[c].clear();
    }
    for (auto& [bytes, fl] : large_) {
      for (void* p : fl) std::free(p);
      reserved_ -= static_cast<int64_t>(fl.size() * bytes);
    }
    large_.clear();
    lock_.unlock();
  }

 private:
  static int64_t class_bytes(int c) {
    if (c < kSmallClasses) return (c + 1) * 64;
    int j = c - kSmallClasses;
    int log2 = 10 + j / 4;
    int k = j % 4 + 1;
    return (int64_t(1) << log2) + k * (int64_t(1) << (log2 - 2));
  }

  // The free list of a class, or of a large size. Called with lock_ held.
  // The free list of a size, or null where none was made (looked up, never inserted).
  std::vector<void*>* cached(int c, size_t rounded) {
    if (c != kLarge) return &free_[c];
    auto it = large_.find(rounded);
    return it == large_.end() ? nullptr : &it->second;
  }

  mutable SpinLock lock_;
  std::vector<void*> free_[kMaxClass];
  std::unordered_map<size_t, std::vector<void*>> large_;
  int64_t current_ = 0, peak_ = 0, reserved_ = 0;
};

}  // namespace

Allocator& cpu_allocator() {
  // Leaked on purpose: tensors held in static objects may be freed after main returns.
  static auto* a = new CpuCachingAllocator();
  return *a;
}
MemoryStats cpu_memory_stats() { return cpu_allocator().stats(); }
void reset_peak_memory() { cpu_allocator().reset_peak(); }

namespace detail {
namespace {
DeviceBackend g_backends[kNumDeviceTypes];
}

void set_device_backend(DeviceType type, const DeviceBackend& backend) {
  g_backends[static_cast<int>(type)] = backend;
}

const DeviceBackend* device_backend(DeviceType type) {
  op_table();  // the first use of the library registers its backends
  const DeviceBackend& b = g_backends[static_cast<int>(type)];
  return b.allocator ? &b : nullptr;
}

void check_device_usable(Device device, const char* op) {
  if (device.is_cpu()) return;
  const DeviceBackend* b = device_backend(device.type);
  DUET_CHECK_DEVICE(b,
                    "[{}] {}: this build has no CUDA backend (nvcc was not found when it was "
                    "configured)",
                    op, device.str());
  b->check(device, op);
}
}  // namespace detail

}  // namespace duet
