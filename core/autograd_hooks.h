// duet: what core needs of autograd, as a table of functions that eager/ fills in.
//
// Note [Autograd hooks]
// ~~~~~~~~~~~~~~~~~~~~~
// Layers depend only on those below them (core -> kernels -> cuda -> eager -> trace -> nn), yet
// core needs autograd in three places: dispatch records calls on eager's tape, a gradient
// rule's SavedInputs reports a saved input written in place (the message reads the tape node),
// and Tensor::backward, a core method, runs eager's engine. Core declares what it needs as
// this table of function pointers and defines every function it declares; eager/engine.cpp
// fills the table in (register_autograd()). Core calls through autograd_hooks(), which is never
// null: until eager registers, each entry throws a duet::Error naming what is missing.
//
// Registration. duet is a static library: a registrar in an eager file that nothing references
// would be dropped by the linker. So every file that includes eager/autograd.h (duet.h does)
// calls detail::register_autograd() during its static initialization, as <iostream> sets up
// std::cout: the reference links the engine into the program, and the hooks are set before that
// file's own static objects are made. A program that includes only core headers links no
// autograd; an op that would record, or a backward(), then throws the Error.
//
// Cost. A recorded out-of-place call makes one indirect call (record); an in-place call two
// (prepare before the write, finish after it). The table is constant and reached through one
// relaxed atomic load: no locks, no allocation.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/op_table.h"

namespace duet::detail {

struct AutogradHooks {
  /// Records an out-of-place call of `def` on the tape: a node with edges to the inputs'
  /// history, the saved inputs and their versions, becomes out's grad_fn.
  void (*record)(const OpDef& def, TensorRefs inputs, const Attrs& attrs, const Tensor& out);
  /// The halves of record for an in-place call: prepare() makes the node before the write (so
  /// that it saves `inplace_self`'s old autograd identity and version), finish() attaches it
  /// to the tensor written.
  std::shared_ptr<Node> (*prepare)(const OpDef& def, TensorRefs inputs, const Attrs& attrs,
                                   const Tensor* inplace_self);
  void (*finish)(std::shared_ptr<Node> node, const Tensor& out);
  /// An alias of t over the same storage with t's current autograd identity (requires_grad,
  /// grad_fn) but a TensorImpl of its own: how a node saves the target of an in-place op.
  Tensor (*alias)(const Tensor& t);
  /// The message of the error for a gradient rule reading saved input i of `node` after that
  /// input was modified in place (throw_stale_input throws it).
  std::string (*stale_input_message)(const Node& node, int64_t i);
  /// Tensor::backward, inside the caller's SiteGuard.
  void (*backward)(const Tensor& root, const Tensor& grad_output, bool retain_graph);
};

/// The table in use: eager's once registered, else one whose entries throw (never null).
extern std::atomic<const AutogradHooks*> g_autograd_hooks;
inline const AutogradHooks& autograd_hooks() {
  // Relaxed: every table is a constant, initialized before the program runs.
  return *g_autograd_hooks.load(std::memory_order_relaxed);
}
/// Installs `hooks`, which must live as long as the program (a constant); null restores the
/// table whose entries throw.
void set_autograd_hooks(const AutogradHooks* hooks);
/// Whether autograd has registered its hooks.
bool autograd_registered();

}  // namespace duet::detail
