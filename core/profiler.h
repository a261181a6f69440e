// duet: the profiler (Note [Profiler]).
//
// Note [Profiler]
// While a duet::Profiler lives (or for the whole process with DUET_PROFILE=file.json), every
// eager op and every call of a compiled function records a Chrome-trace "complete" event: its
// name, its start and duration in microseconds of wall time on the calling thread, and as
// arguments its inputs' and output's shapes and dtype, the bytes it moves (each input read
// once, the output written once: an add of n f32 values moves 12n bytes) and its FLOPs (2mnk
// for a product, one per output element for elementwise ops). A compiled call's event encloses
// one event per step of its plan (a kernel, a fused group, a view), so eager and compiled runs
// of the same code read side by side in chrome://tracing or Perfetto. After an event, a counter
// event ("tensor memory", category "memory") gives the CPU tensor memory when it changed, drawn
// as a track. Off, it costs one relaxed atomic load per op.
//
// Note [Device time in profiles]
// Host times of work on a GPU measure its launches. So an op or a plan's step that runs on a
// device whose backend keeps events also records an event on the device's stream before and
// after it, and the profile gains a "device" event on a track of that device ("cuda:0"): the
// kernels' time, placed on the host clock through a reference event that the first such span
// waits for. The events are read when the profile is (json(), or when it is written), so the
// device is not waited for op by op. A compiled call under a profiler runs its plan step by
// step rather than as its CUDA graph, so that each kernel has its own device event.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/device.h"

namespace duet {

/// Records what runs while it lives (Note [Profiler]) and, when `path` is given, writes the
/// Chrome-trace JSON there when it goes out of scope. The file is opened when the profiler is
/// made: a path that cannot be written throws duet::Error then, before the profiled work.
/// Process-wide; profilers may nest, and each sees the events of its own lifetime.
class Profiler {
 public:
  explicit Profiler(std::string path = "");
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  /// The events so far, as Chrome-trace JSON ({"traceEvents": [...]}).
  std::string json() const;
  /// How many events it holds.
  size_t size() const;
  /// Its events (core/profiler.cpp); public only so that the recorder can reach it.
  struct State;

 private:
  State* state_;
  std::string path_;
};

namespace detail {
/// Active profilers (DUET_PROFILE counts as one); -1 until DUET_PROFILE was read.
extern std::atomic<int> g_profilers;
void read_profile_env();
inline bool profiling() {
  int n = g_profilers.load(std::memory_order_relaxed);
  if (__builtin_expect(n < 0, 0)) {
    read_profile_env();
    n = g_profilers.load(std::memory_order_relaxed);
  }
  return n > 0;
}
/// s as a JSON string: quoted, with quotes, backslashes and control characters escaped.
std::string json_quoted(const std::string& s);
/// Microseconds on the profiler's clock.
double profile_clock_us();
/// Adds one complete event to every active profiler: `args` is a JSON object's inside
/// ("\"shapes\": ..., \"bytes\": 12") or empty.
void profile_event(const std::string& name, const char* category, double start_us, double end_us,
                   const std::string& args);

/// Device work between begin and end (Note [Device time in profiles]): an event on `device`'s
/// stream, or none on the CPU and where the backend keeps no events (end then does nothing).
struct DeviceSpan {
  Device device;
  std::shared_ptr<void> start;
};
DeviceSpan profile_device_begin(Device device);
/// Ends `span` with a second event and gives every active profiler a device event to read later.
void profile_device_end(DeviceSpan& span, const std::string& name, const std::string& args);
}  // namespace detail

}  // namespace duet
