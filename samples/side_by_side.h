// What the training samples (char_gru, transformer, and cnn's --device) share: their options,
// --steps N, --seed S and --device cpu|cuda, and the run of an eager step and a compiled step side
// by side on the same batches, with the check that the two losses agree.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "duet.h"

namespace samples {

/// The value of --device: cpu or cuda; anything else is an error naming the sample.
inline duet::Device parse_device(const char* name, const std::string& v) {
  DUET_CHECK_VALUE(v == "cpu" || v == "cuda", "[{}] --device is cpu or cuda, got {}", name, v);
  return v == "cpu" ? duet::Device::cpu() : duet::Device::cuda();
}

struct Args {
  int64_t steps;
  uint64_t seed = 0;
  duet::Device device = duet::Device::cpu();  ///< where the models and batches live
};

/// --steps N (at least 1; default `steps`), --seed S (default 0) and --device cpu|cuda (default
/// cpu); anything else is an error naming the sample.
inline Args parse_args(const char* name, int argc, char** argv, int64_t steps) {
  Args a{steps};
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    DUET_CHECK_VALUE(i + 1 < argc && (k == "--steps" || k == "--seed" || k == "--device"),
                     "[{}] the options are --steps N, --seed S and --device cpu|cuda, got {}", name,
                     k);
    const std::string v = argv[++i];
    if (k == "--steps") {
      a.steps = std::stoll(v);
    } else if (k == "--seed") {
      a.seed = std::stoull(v);
    } else {
      a.device = parse_device(name, v);
    }
  }
  DUET_CHECK_VALUE(a.steps >= 1, "[{}] --steps must be at least 1, got {}", name, a.steps);
  return a;
}

/// The exit status of a sample asked for a device this machine cannot give (--device cuda
/// without a usable GPU): 77, which the test runner reports as skipped.
inline constexpr int kSkipped = 77;

/// Whether `device` is usable here; if not, says so (naming the sample) for the caller to exit
/// with kSkipped.
inline bool device_usable(const char* name, duet::Device device) {
  if (device.is_cpu() || duet::cuda::is_available()) return true;
  std::printf("%s: --device cuda, but no usable CUDA GPU here: skipped\n", name);
  return false;
}

struct SideBySide {
  double worst = 0;  ///< the largest relative difference of a loss over the checked steps
  double later = 0;  ///< the same over the steps after them
  double eager_s = 0, compiled_s = 0;
  double last = 0;  ///< the eager loss of the last step
};

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Runs eager(s) and compiled(s), each returning step s's loss, for s in [0, steps), and prints
/// both losses and their relative difference for the first 5 steps and every 10th.
template <class Eager, class Compiled>
SideBySide side_by_side(int64_t steps, int64_t checked, Eager eager, Compiled compiled) {
  SideBySide r;
  std::printf("\n step      eager   compiled   relative difference\n");
  for (int64_t s = 0; s < steps; ++s) {
    double t = now_s();
    const double e = eager(s).template item<float>();
    r.eager_s += now_s() - t;
    t = now_s();
    const double c = compiled(s).template item<float>();
    r.compiled_s += now_s() - t;
    const double d = std::abs(e - c) / std::abs(e);
    double& largest = s < checked ? r.worst : r.later;
    largest = std::max(largest, d);
    r.last = e;
    if (s < 5 || (s + 1) % 10 == 0 || s + 1 == steps)
      std::printf("%5lld   %8.5f   %8.5f   %.1e\n", static_cast<long long>(s + 1), e, c, d);
  }
  return r;
}

/// Prints how far the losses were apart and checks it against `tolerance`: 1 when they were
/// further apart (with a CHECK FAILED line), else 0.
inline int check_agreement(const SideBySide& r, int64_t steps, int64_t checked, double tolerance) {
  std::printf(
      "largest relative difference of a step's loss: %.1e over steps 1 to %lld "
      "(tolerance %.0e)\n",
      r.worst, static_cast<long long>(std::min(steps, checked)), tolerance);
  if (steps > checked) std::printf("later steps, not checked: %.1e\n", r.later);
  if (r.worst <= tolerance) return 0;
  std::printf("CHECK FAILED: the eager and compiled losses differ by more than %.0e\n", tolerance);
  return 1;
}

}  // namespace samples
