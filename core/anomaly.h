// duet: anomaly detection, the NaN and Inf hunt of the eager face (Note [Anomaly mode]).
//
// Note [Anomaly mode]
// With anomaly detection on, every eager op checks its floating outputs: the first op whose
// output holds a NaN or an Inf that none of its inputs held raises AnomalyError, naming the op,
// how many values went bad and where the first one is, and its inputs' shapes and dtypes. In
// backward, the error also names the forward op whose gradient rule produced the value, as
// PyTorch's anomaly mode does. Sources (full, arange, random draws) make what they are asked
// for and are not checked. Each check reads the values (a device sync on CUDA), so the mode is
// for hunting, not for training runs; off, it costs one relaxed atomic load per op.
//
// It is process-wide, like torch.autograd.set_detect_anomaly: AnomalyMode turns it on for its
// scope, and DUET_DETECT_ANOMALY=1 in the environment turns it on from the start.
#pragma once

#include <atomic>
#include <string>

#include "core/op_table.h"

namespace duet {

/// Turns anomaly detection on (or, with on = false, off) until the guard goes out of scope,
/// then restores what was set before. Process-wide: nest guards on one thread.
class AnomalyMode {
 public:
  explicit AnomalyMode(bool on = true);
  ~AnomalyMode();
  AnomalyMode(const AnomalyMode&) = delete;
  AnomalyMode& operator=(const AnomalyMode&) = delete;

 private:
  int prev_;
};

/// Whether anomaly detection is on (AnomalyMode, or DUET_DETECT_ANOMALY=1).
bool anomaly_enabled();

namespace detail {
/// -1 until DUET_DETECT_ANOMALY has been read, then 0 (off) or 1 (on).
extern std::atomic<int> g_anomaly;
/// Reads DUET_DETECT_ANOMALY into g_anomaly (the first time only) and returns it.
int anomaly_from_env();
/// True while this thread runs an anomaly check (its own ops are not checked).
bool anomaly_busy();
/// Whether the ops of this thread check their outputs now.
inline bool anomaly_on() {
  int v = g_anomaly.load(std::memory_order_relaxed);
  if (__builtin_expect(v < 0, 0)) v = anomaly_from_env();
  return __builtin_expect(v > 0, 0) && !anomaly_busy();
}
/// Whether the op's output is to be checked: no input holds a NaN or an infinity (false for
/// sources and views, which are not checked).
bool anomaly_inputs_clean(const OpDef& def, TensorRefs in);
/// Throws AnomalyError when `out` holds a NaN or an infinity.
void anomaly_check_output(const OpDef& def, TensorRefs in, const Tensor& out);
/// While it lives, this thread's ops check nothing (a compiled plan's rerun of a fused group).
struct AnomalyPause {
  AnomalyPause();
  ~AnomalyPause();
  AnomalyPause(const AnomalyPause&) = delete;
  AnomalyPause& operator=(const AnomalyPause&) = delete;
  bool prev;
};
/// Whether none of the tensors holds a NaN or an infinity (the checks of compiled plans).
bool anomaly_all_finite(TensorRefs in);
/// The message of a value that went bad: "produced 1 NaN and 0 infinite values (the first at
/// flat index 3) in its output of shape (4) and dtype f32"; "" when `out` is finite.
std::string anomaly_describe(const Tensor& out);
}  // namespace detail

}  // namespace duet
