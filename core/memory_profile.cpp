// duet: MemoryProfile (core/memory_profile.h).
//
// Note [Memory profile]
// While a MemoryProfile lives, new_storage reports each storage it makes, with the op that
// dispatch is running on the thread (tls_profiled_op, set only while a profile lives) and the
// user's line (tls_site), and ~StorageImpl reports each one freed. Every live profile keeps, for
// the CPU and for the GPUs apart, the bytes held relative to its start, its high-water mark, and
// the storages live when it was reached. A storage made before the profile began and freed
// during it lowers the count (the peak is above the start).
#include "core/memory_profile.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "core/call_site.h"

namespace duet {

struct MemoryProfile::State {
  struct Made {
    int64_t bytes;
    const char* op;
    CallSite site;
  };
  // One memory: the CPU's, or the GPUs'.
  struct Account {
    int64_t current = 0, peak = 0;
    std::unordered_map<const void*, Made> live;  // made since the start, not yet freed
    std::vector<Made> at_peak;                   // `live` when the peak was reached
    bool used = false;                           // a storage was made or freed there
  };
  std::mutex mu;
  Account account[2];  // 0: the CPU, 1: the GPUs
};

namespace detail {

std::atomic<int> g_memory_profiles{0};
thread_local const char* tls_profiled_op = nullptr;

namespace {

std::mutex g_profiles_mu;
std::vector<MemoryProfile::State*>& profiles() {
  static auto* v = new std::vector<MemoryProfile::State*>;  // leaked: storages die at exit
  return *v;
}

}  // namespace

void memory_profile_made(const void* key, int64_t bytes, bool gpu) {
  const MemoryProfile::State::Made m{bytes, tls_profiled_op, tls_site};
  std::lock_guard<std::mutex> lock(g_profiles_mu);
  for (MemoryProfile::State* s : profiles()) {
    std::lock_guard<std::mutex> l(s->mu);
    MemoryProfile::State::Account& a = s->account[gpu ? 1 : 0];
    a.used = true;
    a.current += bytes;
    a.live[key] = m;
    if (a.current > a.peak) {
      a.peak = a.current;
      a.at_peak.clear();
      for (const auto& [k, v] : a.live) a.at_peak.push_back(v);
    }
  }
}

void memory_profile_freed(const void* key, int64_t bytes, bool gpu) {
  std::lock_guard<std::mutex> lock(g_profiles_mu);
  for (MemoryProfile::State* s : profiles()) {
    std::lock_guard<std::mutex> l(s->mu);
    MemoryProfile::State::Account& a = s->account[gpu ? 1 : 0];
    a.used = true;
    a.current -= bytes;
    a.live.erase(key);
  }
}

}  // namespace detail

MemoryProfile::MemoryProfile() : state_(new State) {
  std::lock_guard<std::mutex> lock(detail::g_profiles_mu);
  detail::profiles().push_back(state_);
  detail::g_memory_profiles.fetch_add(1, std::memory_order_relaxed);
}

MemoryProfile::~MemoryProfile() {
  {
    std::lock_guard<std::mutex> lock(detail::g_profiles_mu);
    auto& v = detail::profiles();
    v.erase(std::find(v.begin(), v.end(), state_));
    detail::g_memory_profiles.fetch_sub(1, std::memory_order_relaxed);
  }
  delete state_;
}

namespace {

std::vector<MemoryProfile::Buffer> buffers_of(const MemoryProfile::State::Account& a) {
  std::vector<MemoryProfile::Buffer> r;
  for (const MemoryProfile::State::Made& m : a.at_peak)
    r.push_back({m.bytes, m.op ? m.op : "", m.site.str()});
  std::stable_sort(r.begin(), r.end(),
                   [](const MemoryProfile::Buffer& x, const MemoryProfile::Buffer& y) {
                     return x.bytes > y.bytes;
                   });
  return r;
}

std::string table(const char* memory, int64_t peak,
                  const std::vector<MemoryProfile::Buffer>& live) {
  std::string s = fmt::format("memory of an eager region{}: peak {:.2f} MiB above its start\n",
                              memory, double(peak) / (1 << 20));
  s += "  buffers live at the peak, largest first:\n";
  for (size_t i = 0; i < live.size() && i < 20; ++i)
    s += fmt::format("    {:>10.1f} KiB  {}{}\n", double(live[i].bytes) / 1024,
                     live[i].op.empty() ? "(no op)" : live[i].op,
                     live[i].site.empty() ? "" : "  at " + live[i].site);
  if (live.size() > 20) s += fmt::format("    ... and {} more\n", live.size() - 20);
  return s;
}

}  // namespace

int64_t MemoryProfile::peak_bytes() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->account[0].peak;
}

std::vector<MemoryProfile::Buffer> MemoryProfile::live_at_peak() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return buffers_of(state_->account[0]);
}

int64_t MemoryProfile::cuda_peak_bytes() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->account[1].peak;
}

std::vector<MemoryProfile::Buffer> MemoryProfile::cuda_live_at_peak() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return buffers_of(state_->account[1]);
}

std::string MemoryProfile::str() const {
  bool gpu = false;
  {
    std::lock_guard<std::mutex> l(state_->mu);
    gpu = state_->account[1].used;
  }
  std::string s = table("", peak_bytes(), live_at_peak());
  if (gpu) s += table(" on the GPU", cuda_peak_bytes(), cuda_live_at_peak());
  return s;
}

}  // namespace duet
