// duet: errors of composite ops in the name the user called. A composite (embedding, conv2d,
// softmax, linear, the losses) is written in primitives; an error raised inside one would name
// the primitive ("[gather] index 4 is out of range ..."), which the user never called. as_op
// runs the composite's body and renames such an error: "[embedding] index 4 is out of range
// for dim 0 of size 4 (from gather)". The type of the error is kept.
#pragma once

#include <string>
#include <string_view>

#include "core/call_site.h"
#include "core/error.h"

namespace duet::detail {

/// `msg` ("[prim] text") as "[op] text (from prim)"; unchanged when it already names op.
inline std::string renamed_error(const char* op, std::string_view msg) {
  const std::string head = std::string("[") + op + "]";
  if (msg.substr(0, head.size()) == head || msg.empty() || msg[0] != '[') return std::string(msg);
  const size_t close = msg.find(']');
  if (close == std::string_view::npos) return std::string(msg);
  std::string_view prim = msg.substr(1, close - 1), rest = msg.substr(close + 1);
  while (!rest.empty() && rest[0] == ' ') rest.remove_prefix(1);
  // Renamed already by an inner composite (embedding calls index_select): keep its primitive.
  if (rest.find(" (from ") != std::string_view::npos) return head + " " + std::string(rest);
  // The primitive goes before where the error was raised (core/call_site.h), which ends it.
  const std::string ctx = error_context();
  std::string_view tail;
  if (!ctx.empty() && rest.size() >= ctx.size() &&
      rest.substr(rest.size() - ctx.size()) == std::string_view(ctx)) {
    tail = rest.substr(rest.size() - ctx.size());
    rest.remove_suffix(ctx.size());
  }
  return head + " " + std::string(rest) + " (from " + std::string(prim) + ")" + std::string(tail);
}

/// Runs body(); an Error it raises comes out renamed to `op` (see above), of the same type.
template <class F>
auto as_op(const char* op, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const ShapeError& e) {
    throw ShapeError(renamed_error(op, e.what()));
  } catch (const DTypeError& e) {
    throw DTypeError(renamed_error(op, e.what()));
  } catch (const DeviceError& e) {
    throw DeviceError(renamed_error(op, e.what()));
  } catch (const ValueError& e) {
    throw ValueError(renamed_error(op, e.what()));
  } catch (const AnomalyError& e) {
    throw AnomalyError(renamed_error(op, e.what()));
  } catch (const InternalError&) {
    throw;  // duet's own bug: its place matters more than the user's call
  } catch (const Error& e) {
    throw Error(renamed_error(op, e.what()));
  }
}

}  // namespace duet::detail
