// Anomaly detection (Note [Anomaly mode] in core/anomaly.h): the checks run as duet ops, with
// the mode suspended on this thread and grad mode off.
#include "core/anomaly.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/dispatch.h"
#include "core/ops.h"
#include "eager/autograd.h"

namespace duet {
namespace detail {

std::atomic<int> g_anomaly{-1};

namespace {
thread_local bool tls_busy = false;

struct Busy {
  Busy() { tls_busy = true; }
  ~Busy() { tls_busy = false; }
};

// The number of NaN and of infinite elements of t (0 and 0 for a non-floating or empty t).
struct Bad {
  int64_t nan = 0, inf = 0;
  bool any() const { return nan + inf > 0; }
};
Bad count_bad(const Tensor& t) {
  Bad b;
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return b;
  b.nan = sum(isnan(t)).item<int64_t>();
  b.inf = sum(isinf(t)).item<int64_t>();
  return b;
}

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
  Busy busy;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < in.size(); ++i)
    if (count_bad(in[i]).any()) return false;
  return true;
}

void anomaly_check_output(const OpDef& def, TensorRefs in, const Tensor& out) {
  std::string msg;
  {
    Busy busy;
    NoGradGuard no_grad;
    const Bad b = count_bad(out);
    if (!b.any()) return;
    const int64_t first =
        argmax(reshape(eq(isfinite(out), 0), {out.numel()}).to(DType::i32), 0).item<int64_t>();
    msg = fmt::format(
        "[anomaly] {} produced {} NaN and {} infinite values (the first at flat index {}) in "
        "its output of shape {} and dtype {}, from inputs without any: {}. Anomaly detection "
        "is on (duet::AnomalyMode or DUET_DETECT_ANOMALY=1)",
        def.name, b.nan, b.inf, first, out.sizes(), out.dtype(), describe_inputs(in));
  }
  throw AnomalyError(msg);
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
