// The profiler: see Note [Profiler] in core/profiler.h.
#include "core/profiler.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/allocator.h"

namespace duet {

struct Profiler::State {
  mutable std::mutex mu;
  std::vector<std::string> events;  // one JSON object each
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
      // A profiler for the whole process, written when it exits.
      static Profiler* whole = new Profiler(path);
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

}  // namespace detail

Profiler::Profiler(std::string path) : state_(new State), path_(std::move(path)) {
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
    std::ofstream f(path_);
    f << json();
    if (!f)
      std::fprintf(stderr, "duet: warning: could not write the profile to %s\n", path_.c_str());
  }
  delete state_;
}

std::string Profiler::json() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return detail::events_json(state_->events);
}

size_t Profiler::size() const {
  std::lock_guard<std::mutex> l(state_->mu);
  return state_->events.size();
}

}  // namespace duet
