// Anomaly detection (Note [Anomaly mode] in core/anomaly.h): the checks run as duet ops, with
// the mode suspended on this thread and grad mode off.
#include "core/anomaly.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/dispatch.h"
#include "core/ops.h"

namespace duet {
namespace detail {

std::atomic<int> g_anomaly{-1};

namespace {
thread_local bool tls_busy = false;

// Where t holds a NaN or an infinity (b8), or undefined for a tensor that cannot (not floating,
// or empty).
Tensor non_finite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return Tensor();
  return eq(isfinite(t), 0);
}
int64_t count(const Tensor& mask) { return mask.defined() ? sum(mask).item<int64_t>() : 0; }

std::string describe_inputs(TensorRefs in) {
  std::string s;
  for (int64_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    const TensorImpl* x = in[i].unsafe_impl();
    s += x->wrapped_number ? fmt::format("a number ({})", x->dtype)
                           : fmt::format("{} {}", x->shape, x->dtype);
  }
  return s.empty() ? "none" : s;
}

}  // namespace

int anomaly_from_env() {
  const char* e = std::getenv("DUET_DETECT_ANOMALY");
  const int v = e && *e && std::strcmp(e, "0") != 0 ? 1 : 0;
  int expected = -1;
  g_anomaly.compare_exchange_strong(expected, v, std::memory_order_relaxed);
  return g_anomaly.load(std::memory_order_relaxed);
}

bool anomaly_busy() { return tls_busy; }

bool anomaly_inputs_clean(const OpDef& def, TensorRefs in) {
  if (def.cls == OpClass::Source || def.cls == OpClass::View) return false;
  AnomalyPause busy;
  GradModeScope no_grad(false);
  for (int64_t i = 0; i < in.size(); ++i)
    if (count(non_finite(in[i])) > 0) return false;
  return true;
}

void anomaly_check_output(const OpDef& def, TensorRefs in, const Tensor& out) {
  std::string msg;
  {
    AnomalyPause busy;
    GradModeScope no_grad(false);
    const Tensor bad = non_finite(out);
    const int64_t n = count(bad);
    if (n == 0) return;
    const int64_t nan = sum(isnan(out)).item<int64_t>();
    const int64_t first = argmax(reshape(bad, {out.numel()}).to(DType::i32), 0).item<int64_t>();
    msg = fmt::format(
        "[anomaly] {} produced {} NaN and {} infinite values (the first at flat index {}) in "
        "its output of shape {} and dtype {}, from inputs without any: {}. Anomaly detection "
        "is on (duet::AnomalyMode or DUET_DETECT_ANOMALY=1)",
        def.name, nan, n - nan, first, out.sizes(), out.dtype(), describe_inputs(in));
  }
  throw AnomalyError(::duet::detail::with_context(msg));
}

AnomalyPause::AnomalyPause() : prev(tls_busy) { tls_busy = true; }
AnomalyPause::~AnomalyPause() { tls_busy = prev; }

bool anomaly_all_finite(TensorRefs in) {
  AnomalyPause busy;
  GradModeScope no_grad(false);
  for (int64_t i = 0; i < in.size(); ++i)
    if (count(non_finite(in[i])) > 0) return false;
  return true;
}

std::string anomaly_describe(const Tensor& out) {
  AnomalyPause busy;
  GradModeScope no_grad(false);
  const Tensor bad = non_finite(out);
  const int64_t n = count(bad);
  if (n == 0) return "";
  const int64_t nan = sum(isnan(out)).item<int64_t>();
  const int64_t first = argmax(reshape(bad, {out.numel()}).to(DType::i32), 0).item<int64_t>();
  return fmt::format(
      "produced {} NaN and {} infinite values (the first at flat index {}) in its output of "
      "shape {} and dtype {}",
      nan, n - nan, first, out.sizes(), out.dtype());
}

}  // namespace detail

AnomalyMode::AnomalyMode(bool on) : prev_(detail::g_anomaly.load()) {
  if (prev_ < 0) prev_ = detail::anomaly_from_env();
  detail::g_anomaly.store(on ? 1 : 0);
}
AnomalyMode::~AnomalyMode() { detail::g_anomaly.store(prev_); }

bool anomaly_enabled() {
  int v = detail::g_anomaly.load(std::memory_order_relaxed);
  return (v < 0 ? detail::anomaly_from_env() : v) > 0;
}

}  // namespace duet
