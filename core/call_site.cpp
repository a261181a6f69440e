// duet: call sites (core/call_site.h).
#include "core/call_site.h"

#include <atomic>
#include <cstring>

#include <fmt/format.h>

namespace duet {

std::string CallSite::str() const {
  if (!file) return "";
  return fmt::format("{}:{}", detail::file_basename(file), line);
}

namespace detail {

thread_local constinit CallSite tls_site{};

namespace {
std::atomic<ContextHook> g_trace_hook{nullptr};
}  // namespace

const char* file_basename(const char* path) {
  if (!path) return "";
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void set_trace_context_hook(ContextHook hook) { g_trace_hook.store(hook); }

std::string error_context() {
  std::string s;
  if (tls_site) s = fmt::format(" (at {})", tls_site.str());
  if (ContextHook h = g_trace_hook.load(std::memory_order_relaxed)) s += h();
  return s;
}

std::string with_context(std::string msg) {
  const std::string ctx = error_context();
  if (ctx.empty() ||
      (msg.size() >= ctx.size() && msg.compare(msg.size() - ctx.size(), ctx.size(), ctx) == 0))
    return msg;
  return msg + ctx;
}

}  // namespace detail
}  // namespace duet
