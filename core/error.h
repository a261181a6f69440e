// duet: errors. Every misuse throws duet::Error (or a subclass) whose message starts with the
// op in brackets: "[matmul] inner dimensions differ: (2, 3) @ (4, 5)".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace duet {

/// Base of every error duet raises on misuse. The message starts with "[op]".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// Shapes that do not fit the op (broadcast, rank, inner dimensions, numel).
struct ShapeError : Error {
  using Error::Error;
};
/// A dtype the op does not accept, or dtypes that do not fit together.
struct DTypeError : Error {
  using Error::Error;
};
/// Tensors on different devices, or a device that is not available.
struct DeviceError : Error {
  using Error::Error;
};
/// A value out of range: a dim, an index, a size.
struct ValueError : Error {
  using Error::Error;
};
/// A NaN or an infinity where an op's inputs had none, found by anomaly detection
/// (core/anomaly.h).
struct AnomalyError : Error {
  using Error::Error;
};
/// A compiled function that computes other values than its eager twin, found by
/// check_against_eager (trace/check.h); the message is the check's report.
struct MismatchError : Error {
  using Error::Error;
};
/// A collective that could not complete: another rank did not take part within the timeout, or
/// the ranks called it with different shapes or dtypes (core/dist.h).
struct DistError : Error {
  using Error::Error;
};
/// An internal invariant failed: a bug in duet, not in the caller's code.
struct InternalError : Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_internal(const char* cond, const char* file, int line, std::string msg);
/// msg with where it was raised: the user's call site, and the compiled function being traced
/// (core/call_site.h).
std::string with_context(std::string msg);
}  // namespace detail

}  // namespace duet

/// User error: throws `type` (a duet::Error subclass) with an fmt-formatted message if `cond`
/// is false. The message must start with "[op]"; it ends with the user's call site, and the
/// compiled function being traced, when known (" (at model.cpp:42)").
#define DUET_CHECK_T(cond, type, ...)                                     \
  do {                                                                    \
    if (__builtin_expect(!(cond), 0))                                     \
      throw type(::duet::detail::with_context(fmt::format(__VA_ARGS__))); \
  } while (0)
#define DUET_CHECK(cond, ...) DUET_CHECK_T(cond, ::duet::Error, __VA_ARGS__)
#define DUET_CHECK_SHAPE(cond, ...) DUET_CHECK_T(cond, ::duet::ShapeError, __VA_ARGS__)
#define DUET_CHECK_DTYPE(cond, ...) DUET_CHECK_T(cond, ::duet::DTypeError, __VA_ARGS__)
#define DUET_CHECK_VALUE(cond, ...) DUET_CHECK_T(cond, ::duet::ValueError, __VA_ARGS__)
#define DUET_CHECK_DEVICE(cond, ...) DUET_CHECK_T(cond, ::duet::DeviceError, __VA_ARGS__)

/// Internal invariant (our bug, not the user's): throws duet::InternalError, never aborts.
#define DUET_ASSERT(cond, ...)                                                                \
  do {                                                                                        \
    if (__builtin_expect(!(cond), 0))                                                         \
      ::duet::detail::throw_internal(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)
