// duet: eager beside compiled for a user's own function (duet::compare).
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "trace/compile.h"

namespace duet {

/// What compiling a function buys, measured on one set of arguments (duet::compare).
struct FacesReport {
  std::string function;  ///< "the compared function"
  int calls = 0;         ///< timed calls per face, after warm-up
  /// Seconds per call, median of the timed calls, and their spread.
  double eager_seconds = 0, compiled_seconds = 0;
  double eager_min_seconds = 0, eager_max_seconds = 0;
  double compiled_min_seconds = 0, compiled_max_seconds = 0;
  /// The first compiled call, whole (trace, passes, plan, first run), and its parts in ms.
  double first_call_seconds = 0;
  double trace_ms = 0, optimize_ms = 0, plan_ms = 0;
  int64_t kernels_built = 0;  ///< fused kernels the codegen tier built during the comparison
  /// The most memory one call holds beyond what was allocated before it; compiled, with the
  /// buffers its plans keep between calls (their arena).
  int64_t eager_peak_bytes = 0, compiled_peak_bytes = 0;
  /// The same in CUDA device 0's memory, from its caching allocator (cuda::memory_stats); 0
  /// when the function allocates nothing there, and without a GPU.
  int64_t eager_cuda_peak_bytes = 0, compiled_cuda_peak_bytes = 0;
  int64_t traces = 0;
  /// The largest |compiled - eager| over the results and every tensor the function updates (its
  /// parameters, their .grad, an optimizer's state), each face run once from the same state;
  /// what differs most, in words.
  double max_abs_difference = 0;
  std::string largest_difference;
  /// A table: time per call (median and spread), the first call, peak memory, the difference.
  std::string str() const;
  /// The same figures as one JSON object.
  std::string json() const;
};

namespace detail {
FacesReport compare_faces(const std::string& label, const FlatArgs& args, const TraceFn& fn);
}  // namespace detail

/// Runs fn(args...) eagerly and compiled on the same arguments and reports what compiling buys:
/// time per call (median and spread after warm-up), the first compiled call, each face's peak
/// memory, the largest difference of results and of the state fn updates, and the traces. A
/// training step (zero_grad, backward, step) is the usual fn. The state fn reads and writes
/// (parameters, gradients, optimizer state, the random generator) is as before when compare
/// returns. Arguments as for compile().
template <class F, class... A>
requires std::is_invocable_v < std::decay_t<F>
&, A&... > FacesReport compare(F&& fn, A&&... args) {
  auto c = compile(std::forward<F>(fn));
  return c.with_flat_args(
      [&](const detail::FlatArgs& flat, const detail::TraceFn& run) {
        return detail::compare_faces("the compared function", flat, run);
      },
      std::forward<A>(args)...);
}

}  // namespace duet
