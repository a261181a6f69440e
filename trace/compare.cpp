// duet::compare: one function's two faces side by side (trace/compare.h).
//
// Note [Comparing the faces]
// The function is traced first without running (CompiledCore::prepare), which names every
// tensor it reads or writes from outside its arguments (parameters, .grad buffers, optimizer
// state, the generator): their values are copied then, and put back between the stages and at
// the end, so each stage starts from the caller's state and the caller finds it unchanged.
//  1. Difference: one eager call and one call of a fresh compiled function (its first: trace,
//     passes, plan and run, timed as first_call_seconds), each from the saved state; the
//     results and the captured tensors after each call are compared.
//  2. Eager time and memory: warm-up calls, then timed calls; the peak is taken over one call
//     above the memory allocated before it.
//  3. Compiled time and memory: the same, on the compiled function of stage 1, after enough
//     calls for the codegen tier to build its kernels (waited for, and not timed); its peak
//     adds the buffers its plans keep between calls.
// With a GPU, each timed call waits for the work it queued there, and each face's peak on CUDA
// device 0 is taken as on the CPU, from its caching allocator; a plan's CUDA arena counts there,
// its CPU arena on the CPU.
#include "trace/compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "cuda/cuda.h"
#include "eager/autograd.h"
#include "trace/compile_entry.h"
#include "trace/plan/codegen.h"

namespace duet {
namespace detail {
namespace comparing {

constexpr int kTimedCalls = 7;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The captured tensors' values, to put back.
struct Saved {
  std::vector<Tensor> targets, values;
  explicit Saved(const std::vector<Tensor>& captured) {
    NoGradGuard no_grad;
    for (const Tensor& t : captured) {
      targets.push_back(t);
      values.push_back(t.clone());
    }
  }
  void restore() const {
    NoGradGuard no_grad;
    for (size_t i = 0; i < targets.size(); ++i) Tensor(targets[i]).copy_(values[i]);
  }
  std::vector<Tensor> now() const {
    NoGradGuard no_grad;
    std::vector<Tensor> r;
    for (const Tensor& t : targets) r.push_back(t.clone());
    return r;
  }
};

// The largest |a - b| over floating tensors of one shape (a shape that differs: infinity).
double max_abs(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0 : INFINITY;
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return INFINITY;
  NoGradGuard no_grad;
  if (a.numel() == 0) return 0;
  if (!is_floating(a.dtype())) return sum(ne(a, b)).item<int64_t>() == 0 ? 0 : INFINITY;
  return max(abs(a.to(DType::f64) - b.to(DType::f64))).item<double>();
}

struct Timing {
  double median = 0, min = 0, max = 0;
  int64_t peak = 0, cuda_peak = 0;
};

// A call's GPU work is queued: with a GPU, a timed call waits for it.
void finish_gpu_work() {
  if (cuda::is_available()) cuda::synchronize();
}

// Warm-up, timed calls, and the peak of one call above what was allocated before it.
Timing time_face(const std::function<void()>& call, int warmup, const Saved& state) {
  state.restore();
  for (int i = 0; i < warmup; ++i) call();
  codegen::wait_idle();
  finish_gpu_work();
  std::vector<double> t;
  for (int i = 0; i < kTimedCalls; ++i) {
    const double a = now_s();
    call();
    finish_gpu_work();
    t.push_back(now_s() - a);
  }
  std::sort(t.begin(), t.end());
  Timing r{t[t.size() / 2], t.front(), t.back(), 0, 0};
  const int64_t before = cpu_memory_stats().current;
  reset_peak_memory();
  const bool gpu = cuda::is_available();
  const int64_t cuda_before = gpu ? cuda::memory_stats().current : 0;
  if (gpu) cuda::reset_peak_memory_stats();
  call();
  finish_gpu_work();
  r.peak = cpu_memory_stats().peak - before;
  if (gpu) r.cuda_peak = cuda::memory_stats().peak - cuda_before;
  state.restore();
  return r;
}

}  // namespace comparing

FacesReport compare_faces(const std::string& label, const FlatArgs& args, const TraceFn& fn) {
  using namespace comparing;
  FacesReport r;
  r.function = label;
  r.calls = kTimedCalls;
  std::vector<Tensor> captured;
  {
    CompiledCore probe(CompileOptions{}, label);
    captured = probe.prepare(args, fn).captured;
  }
  const Saved state(captured);
  // 1. One call of each face from the same state.
  const std::vector<Tensor> eager_out = fn(args.tensors);
  const std::vector<Tensor> eager_state = state.now();
  state.restore();
  CompiledCore core(CompileOptions{}, label);
  const int64_t built_before = codegen::stats().built;
  const double t = now_s();
  const std::vector<Tensor> compiled_out = core.call(args, fn);
  r.first_call_seconds = now_s() - t;
  const std::vector<Tensor> compiled_state = state.now();
  auto note = [&](double d, const std::string& what) {
    if (!(d <= r.max_abs_difference)) {
      r.max_abs_difference = d;
      r.largest_difference = what;
    }
  };
  for (size_t i = 0; i < eager_out.size() && i < compiled_out.size(); ++i)
    note(max_abs(eager_out[i], compiled_out[i]), fmt::format("result {}", i));
  for (size_t i = 0; i < eager_state.size(); ++i)
    note(max_abs(eager_state[i], compiled_state[i]),
         fmt::format("captured tensor {} {}", i, eager_state[i].sizes()));
  const CompileStats s = core.stats();
  r.trace_ms = s.trace_ms;
  r.optimize_ms = s.optimize_ms;
  r.plan_ms = s.plan_ms;
  // 2 and 3. Time and memory, each face from the saved state.
  const int warmup = std::max(3, codegen::threshold() + 1);
  const Timing e = time_face([&] { fn(args.tensors); }, warmup, state);
  const Timing c = time_face([&] { core.call(args, fn); }, warmup, state);
  r.eager_seconds = e.median;
  r.eager_min_seconds = e.min;
  r.eager_max_seconds = e.max;
  r.compiled_seconds = c.median;
  r.compiled_min_seconds = c.min;
  r.compiled_max_seconds = c.max;
  // The plans' arenas live between calls: each counts in the memory of its device.
  const CompileStats cs = core.stats();
  r.eager_peak_bytes = e.peak;
  r.compiled_peak_bytes = c.peak + cs.buffer_bytes - cs.device_buffer_bytes;
  r.eager_cuda_peak_bytes = e.cuda_peak;
  r.compiled_cuda_peak_bytes = c.cuda_peak + cs.device_buffer_bytes;
  r.traces = cs.traces;
  r.kernels_built = codegen::stats().built - built_before;
  return r;
}

}  // namespace detail

std::string FacesReport::str() const {
  auto ms = [](double s) { return fmt::format("{:.3f} ms", 1e3 * s); };
  auto mib = [](int64_t b) { return fmt::format("{:.2f} MiB", double(b) / (1 << 20)); };
  std::string s = fmt::format("{}: eager and compiled, {} timed calls each\n", function, calls);
  s += fmt::format("{:<30} {:>12} {:>12}\n", "", "eager", "compiled");
  s += fmt::format("{:<30} {:>12} {:>12}   speed-up {:.2f}x\n", "time per call (median)",
                   ms(eager_seconds), ms(compiled_seconds), eager_seconds / compiled_seconds);
  s += fmt::format("{:<30} {:>12} {:>12}\n", "  fastest", ms(eager_min_seconds),
                   ms(compiled_min_seconds));
  s += fmt::format("{:<30} {:>12} {:>12}\n", "  slowest", ms(eager_max_seconds),
                   ms(compiled_max_seconds));
  s += fmt::format(
      "{:<30} {:>12} {:>12}   (trace {:.1f} ms, passes {:.1f} ms, plan {:.1f} ms; {} trace(s))\n",
      "first call", "", ms(first_call_seconds), trace_ms, optimize_ms, plan_ms, traces);
  s += fmt::format("{:<30} {:>12} {:>12}   ({:.2f}x)\n", "peak memory of a call",
                   mib(eager_peak_bytes), mib(compiled_peak_bytes),
                   double(compiled_peak_bytes) / double(std::max<int64_t>(eager_peak_bytes, 1)));
  if (eager_cuda_peak_bytes > 0 || compiled_cuda_peak_bytes > 0)
    s += fmt::format(
        "{:<30} {:>12} {:>12}   ({:.2f}x)\n", "peak CUDA memory of a call",
        mib(eager_cuda_peak_bytes), mib(compiled_cuda_peak_bytes),
        double(compiled_cuda_peak_bytes) / double(std::max<int64_t>(eager_cuda_peak_bytes, 1)));
  s += fmt::format("{:<30} {:.3g}{}\n", "largest difference", max_abs_difference,
                   largest_difference.empty() ? "" : " (" + largest_difference + ")");
  return s;
}

namespace {
// A JSON number: null for NaN and infinities, which JSON has no spelling of.
std::string num(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }
}  // namespace

std::string FacesReport::json() const {
  return fmt::format(
      "{{\"function\": {}, \"calls\": {}, \"eager_seconds\": {}, \"eager_min_seconds\": {}, "
      "\"eager_max_seconds\": {}, \"compiled_seconds\": {}, \"compiled_min_seconds\": {}, "
      "\"compiled_max_seconds\": {}, \"first_call_seconds\": {}, \"trace_ms\": {}, "
      "\"optimize_ms\": {}, \"plan_ms\": {}, \"kernels_built\": {}, \"eager_peak_bytes\": {}, "
      "\"compiled_peak_bytes\": {}, \"eager_cuda_peak_bytes\": {}, "
      "\"compiled_cuda_peak_bytes\": {}, \"traces\": {}, \"max_abs_difference\": {}, "
      "\"largest_difference\": {}}}",
      detail::json_quoted(function), calls, num(eager_seconds), num(eager_min_seconds),
      num(eager_max_seconds), num(compiled_seconds), num(compiled_min_seconds),
      num(compiled_max_seconds), num(first_call_seconds), num(trace_ms), num(optimize_ms),
      num(plan_ms), kernels_built, eager_peak_bytes, compiled_peak_bytes, eager_cuda_peak_bytes,
      compiled_cuda_peak_bytes, traces, num(max_abs_difference),
      detail::json_quoted(largest_difference));
}

}  // namespace duet
