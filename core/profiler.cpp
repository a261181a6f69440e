// The profiler: see Note [Profiler] in core/profiler.h.
#include "core/profiler.h"

#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/error.h"

namespace duet {

namespace {
// A device's events of one profiler (Note [Device time in profiles]): `ref`, recorded before any
// span of the profiler on that device, and the host time when the device passed it.
struct DeviceRef {
  std::shared_ptr<void> event;
  double host_us = 0;
  bool named = false;  // the track's name event was written
};
struct PendingSpan {
  Device device;
  std::shared_ptr<void> start, end;
  std::string name, args;
};
}  // namespace

struct Profiler::State {
  std::ofstream out;  // the file it writes when it ends, opened when it starts
  mutable std::mutex mu;
  std::vector<std::string> events;   // one JSON object each
  std::map<int, DeviceRef> refs;     // by device index
  std::vector<PendingSpan> pending;  // device events not read yet
};

namespace detail {
namespace {

std::mutex g_mu;
std::vector<Profiler::State*>& active() {
  static auto* v = new std::vector<Profiler::State*>;  // leaked: events may come at exit
  return *v;
}

}  // namespace

std::string json_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {

std::string events_json(const std::vector<std::string>& events) {
  std::string s = "{\"traceEvents\": [\n";
  for (size_t i = 0; i < events.size(); ++i) s += (i ? ",\n" : "") + events[i];
  return s + "\n], \"displayTimeUnit\": \"ms\"}\n";
}

}  // namespace

std::atomic<int> g_profilers{-1};

double profile_clock_us() {
  static const auto t0 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void read_profile_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("DUET_PROFILE");
    int expected = -1;
    g_profilers.compare_exchange_strong(expected, 0);
    if (path && *path) {
      // A profiler for the whole process, written when it exits. This runs inside the first op
      // call, which must not fail for it: a path that cannot be written is reported, once.
      static Profiler* whole = nullptr;
      try {
        whole = new Profiler(path);
      } catch (const Error& e) {
        std::fprintf(stderr, "duet: warning: DUET_PROFILE: %s; the process is not profiled\n",
                     e.what());
        return;
      }
      std::atexit([] { delete whole; });
    }
  });
}

void profile_event(const std::string& name, const char* category, double start_us, double end_us,
                   const std::string& args) {
  const std::string e = fmt::format(
      "{{\"name\": {}, \"cat\": \"{}\", \"ph\": \"X\", \"ts\": {:.3f}, \"dur\": {:.3f}, \"pid\": "
      "1, "
      "\"tid\": {}, \"args\": {{{}}}}}",
      json_quoted(name), category, start_us, end_us - start_us,
      std::hash<std::thread::id>()(std::this_thread::get_id()) % 100000, args);
  // A counter of the CPU tensor memory at the event's end, when it changed: chrome://tracing and
  // Perfetto draw it as a track under the events.
  const int64_t bytes = cpu_memory_stats().current;
  std::lock_guard<std::mutex> lock(g_mu);
  static int64_t last_bytes = -1;
  const bool counter = bytes != last_bytes;
  last_bytes = bytes;
  const std::string c =
      counter ? fmt::format(
                    "{{\"name\": \"tensor memory\", \"cat\": \"memory\", \"ph\": \"C\", "
                    "\"ts\": {:.3f}, \"pid\": 1, \"args\": {{\"cpu_bytes\": {}}}}}",
                    end_us, bytes)
              : std::string();
  for (Profiler::State* s : active()) {
    std::lock_guard<std::mutex> l(s->mu);
    s->events.push_back(e);
    if (counter) s->events.push_back(c);
  }
}

namespace {

// An event on `device` now, freed by the backend when the last holder lets go; null where the
// backend keeps none (or its stream is being captured).
std::shared_ptr<void> device_event(const DeviceBackend& b, Device device) {
  void* e = b.record_event(device);
  if (!e) return nullptr;
  void (*destroy)(void*) = b.destroy_event;
  return std::shared_ptr<void>(e, [destroy](void* p) { destroy(p); });
}

const DeviceBackend* timing_backend(Device device) {
  if (device.is_cpu()) return nullptr;
  const DeviceBackend* b = device_backend(device.type);
  return b && b->record_event && b->elapsed_ms && b->destroy_event ? b : nullptr;
}

// The pending device spans of s as events, on one track per device (called with s->mu held).
void read_device_events(Profiler::State& s) {
  for (const PendingSpan& p : s.pending) {
    const DeviceBackend* b = timing_backend(p.device);
    DeviceRef& ref = s.refs[p.device.index];
    if (!b || !ref.event) continue;
    const int64_t tid = 900000 + p.device.index;
    if (!ref.named) {
      s.events.push_back(
          fmt::format("{{\"name\": \"thread_name\", \"cat\": \"__metadata\", \"ph\": \"M\", "
                      "\"pid\": 1, \"tid\": {}, "
                      "\"args\": {{\"name\": \"{}\"}}}}",
                      tid, p.device.str()));
      ref.named = true;
    }
    double ts = 0, dur = 0;
    try {
      ts = ref.host_us + 1000 * b->elapsed_ms(ref.event.get(), p.start.get());
      dur = 1000 * b->elapsed_ms(p.start.get(), p.end.get());
    } catch (const Error&) {
      continue;  // the device failed (or is gone, at exit): no time to show
    }
    s.events.push_back(
        fmt::format("{{\"name\": {}, \"cat\": \"device\", \"ph\": \"X\", \"ts\": {:.3f}, \"dur\": "
                    "{:.3f}, \"pid\": 1, \"tid\": {}, \"args\": {{{}}}}}",
                    json_quoted(p.name), ts, dur, tid, p.args));
  }
  s.pending.clear();
}

}  // namespace

DeviceSpan profile_device_begin(Device device) {
  DeviceSpan span{device, nullptr};
  const DeviceBackend* b = timing_backend(device);
  if (!b) return span;
  std::lock_guard<std::mutex> lock(g_mu);
  // Each active profiler's first span on this device waits for a reference event.
  std::shared_ptr<void> ref;
  double host_us = 0;
  for (Profiler::State* s : active()) {
    std::lock_guard<std::mutex> l(s->mu);
    DeviceRef& r = s->refs[device.index];
    if (r.event) continue;
    if (!ref) {
      ref = device_event(*b, device);
      if (!ref) return span;
      b->elapsed_ms(ref.get(), ref.get());  // waits until the device passed it
      host_us = profile_clock_us();
    }
    r.event = ref;
    r.host_us = host_us;
  }
  span.start = device_event(*b, device);
  return span;
}

void profile_device_end(DeviceSpan& span, const std::string& name, const std::string& args) {
  if (!span.start) return;
  const DeviceBackend* b = timing_backend(span.device);
  std::shared_ptr<void> end = device_event(*b, span.device);
  if (!end) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (Profiler::State* s : active()) {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->refs[span.device.index].event)
      s->pending.push_back(PendingSpan{span.device, span.start, end, name, args});
  }
}

}  // namespace detail

Profiler::Profiler(std::string path) : state_(nullptr), path_(std::move(path)) {
  // The file is opened now, so that a path that cannot be written fails before the work it
  // would profile, not after it.
  auto state = std::make_unique<State>();
  if (!path_.empty()) {
    state->out.open(path_);
    DUET_CHECK(state->out.is_open(), "[Profiler] cannot open '{}' for writing: {}", path_,
               std::strerror(errno));
  }
  state_ = state.release();
  detail::profiling();  // reads DUET_PROFILE first, so that the count starts from it
  std::lock_guard<std::mutex> lock(detail::g_mu);
  detail::active().push_back(state_);
  detail::g_profilers.fetch_add(1, std::memory_order_relaxed);
}

Profiler::~Profiler() {
  {
    std::lock_guard<std::mutex> lock(detail::g_mu);
    auto& a = detail::active();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] == state_) {
        a.erase(a.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    detail::g_profilers.fetch_sub(1, std::memory_order_relaxed);
  }
  if (!path_.empty()) {
    std::ofstream& f = state_->out;
    f << json();
    f.close();
    if (!f)  // (a destructor must not throw: a full disk, say, is reported)
      std::fprintf(stderr, "duet: warning: could not write the profile to %s\n", path_.c_str());
  }
  delete state_;
}

std::string Profiler::json() const {
  std::lock_guard<std::mutex> l(state_->mu);
  detail::read_device_events(*state_);
  return detail::events_json(state_->events);
}

size_t Profiler::size() const {
  std::lock_guard<std::mutex> l(state_->mu);
  detail::read_device_events(*state_);
  return state_->events.size();
}

}  // namespace duet
