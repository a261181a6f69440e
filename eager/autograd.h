// duet: the eager autograd API (tape, grad mode, grad(), gradcheck).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace duet {

/// Turns grad mode off for its lifetime (RAII), like torch::NoGradGuard: ops run without
/// recording a tape, and in-place updates of leaves that require grad are allowed.
struct NoGradGuard {
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Whether ops on tensors that require grad are recorded on this thread.
bool grad_enabled();

/// Gradients of `outputs` with respect to `inputs`, weighted by `grad_outputs` (ones for
/// one-element outputs when omitted). Does not touch .grad. An input the outputs do not
/// depend on gets zeros. With create_graph the result is itself differentiable (higher-order
/// gradients), and the graph is kept; without it the graph is freed.
std::vector<Tensor> grad(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                         std::vector<Tensor> grad_outputs = {}, bool create_graph = false);

namespace detail {
/// Fills core's autograd hook table with this engine (Note [Autograd hooks] in
/// core/autograd_hooks.h); idempotent.
void register_autograd();
/// Note [Autograd hooks]: each file that includes this header registers autograd while its
/// statics are initialized, which also links the engine into every program that includes it.
[[maybe_unused]] static const bool autograd_linked = (register_autograd(), true);
/// Queues `callback` to run once the backward() running on this thread has reached every leaf
/// (data-parallel training all-reduces the gradient buckets that no hook completed). Called
/// from a gradient hook; an Error outside a backward.
void at_backward_end(std::function<void()> callback);
/// Which backward is running on this thread (or ran last): a counter, so that a gradient hook
/// can tell a new backward from the one it was called in before (one that threw never ran its
/// at_backward_end callbacks).
uint64_t backward_id();
/// How many times a backward (the outermost one) began or ended on this thread: a tracer numbers
/// the phases of what it records with it (GraphNode::phase).
uint64_t backward_edges();
/// grad() with retain_graph chosen separately (the tracer differentiates one graph several
/// times).
std::vector<Tensor> grad(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                         std::vector<Tensor> grad_outputs, bool create_graph, bool retain_graph);
}  // namespace detail

/// Result of gradcheck: true when analytical and numerical Jacobians agree; message says where
/// they differ.
struct GradcheckResult {
  bool ok = false;
  std::string message;
  explicit operator bool() const { return ok; }
};

/// Compares the tape's gradients of fn with central finite differences, in float64. Every
/// input must be f64; those that require grad are checked, element by element, over every
/// output element: |analytical - numerical| <= atol + rtol * |numerical|.
GradcheckResult gradcheck(std::function<Tensor(const std::vector<Tensor>&)> fn,
                          std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-5,
                          double rtol = 1e-3);

}  // namespace duet
