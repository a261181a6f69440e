// duet: call sites. Every public op takes the caller's std::source_location as a defaulted last
// argument and opens a SiteGuard for the length of the call; the outermost guard wins, so the
// primitives a composite calls, and the checks they make, see the line the user wrote. Errors
// raised through the DUET_CHECK macros end with it, the tracer records it on each node
// (GraphNode::site), a plan's steps set it again from their nodes while they run, and the
// profiler writes it into each event. See Note [Call sites].
//
// Note [Call sites]
// Binary operators cannot take a defaulted argument, so their first operand is a Located: a
// tensor reference with a std::source_location, made by an implicit conversion whose own
// defaulted argument is evaluated where the conversion happens, in the user's expression. An
// rvalue operand stays an rvalue (its buffer can still be reused). The second operand keeps its
// plain type, so overload resolution is unchanged: one user-defined conversion, on the left.
// Unary minus takes a Located too. The cost is one thread-local compare per call, and two writes
// at the outermost one.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>

/// The defaulted last parameter of every public op: the caller's place.
#define DUET_HERE std::source_location loc = std::source_location::current()

namespace duet {

class Tensor;

/// Where an op was called: a file (as the compiler spelled it) and a line. Empty when unknown.
struct CallSite {
  const char* file = nullptr;
  uint32_t line = 0;
  explicit operator bool() const { return file != nullptr; }
  /// "model.cpp:42" (the file's base name), or "" when empty.
  std::string str() const;
};

/// An operand of an operator, with the place of the expression it appears in (Note [Call
/// sites]). Converts implicitly from any tensor; `expiring` says it was an rvalue.
struct Located {
  const Tensor& tensor;
  bool expiring;
  std::source_location loc;
  Located(const Tensor& t, std::source_location l = std::source_location::current())
      : tensor(t), expiring(false), loc(l) {}
  Located(Tensor&& t, std::source_location l = std::source_location::current())
      : tensor(t), expiring(true), loc(l) {}
};

namespace detail {

/// The call site of the public op running on this thread (the outermost one).
extern thread_local constinit CallSite tls_site;

/// The base name of a path: "a/b/model.cpp" -> "model.cpp".
const char* file_basename(const char* path);

/// Sets the thread's call site for its lifetime, unless an outer call already set one.
class SiteGuard {
 public:
  explicit SiteGuard(const std::source_location& loc) noexcept : set_(tls_site.file == nullptr) {
    if (set_) tls_site = CallSite{loc.file_name(), loc.line()};
  }
  /// A site already known (a plan step's node): replaces the thread's site while it lives.
  explicit SiteGuard(const CallSite& site) noexcept : set_(true), saved_(tls_site) {
    tls_site = site;
  }
  ~SiteGuard() {
    if (set_) tls_site = saved_;
  }
  SiteGuard(const SiteGuard&) = delete;
  SiteGuard& operator=(const SiteGuard&) = delete;

 private:
  bool set_;
  CallSite saved_{};
};

/// What an error raised now should add to its message: " (at model.cpp:42)" for the current
/// call site, and the context the tracer adds while tracing (" while tracing compiled function
/// at step.cpp:10, scope encoder/layer1"); "" when neither is known.
std::string error_context();
/// `msg` with error_context() appended (unless it is empty or msg already ends with it).
std::string with_context(std::string msg);
/// The tracer's part of error_context (trace/tracer.cpp sets it): "" when not tracing.
using ContextHook = std::string (*)();
void set_trace_context_hook(ContextHook hook);

}  // namespace detail
}  // namespace duet
