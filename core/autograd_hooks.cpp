// duet: the autograd hook table (Note [Autograd hooks] in core/autograd_hooks.h), and the core
// functions that call through it.
#include "core/autograd_hooks.h"

namespace duet {
namespace detail {
namespace {

// The table before eager registers: each entry names what the program lacks.
[[noreturn]] void throw_unregistered(const char* op, const char* what) {
  throw Error(with_context(fmt::format(
      "[{}] {} needs duet's eager autograd (eager/), which is not linked into this program: "
      "include \"eager/autograd.h\" (or \"duet.h\") in one of its files, which registers it "
      "(Note [Autograd hooks] in core/autograd_hooks.h)",
      op, what)));
}

void missing_record(const OpDef& def, TensorRefs, const Attrs&, const Tensor&) {
  throw_unregistered(def.name, "recording this call on the autograd tape (an input requires grad)");
}
std::shared_ptr<Node> missing_prepare(const OpDef& def, TensorRefs, const Attrs&, const Tensor*) {
  throw_unregistered(def.name, "recording this call on the autograd tape (an input requires grad)");
}
void missing_finish(std::shared_ptr<Node>, const Tensor&) {
  throw_unregistered("autograd", "attaching a tape node");
}
Tensor missing_alias(const Tensor&) {
  throw_unregistered("autograd", "saving the target of an in-place write");
}
std::string missing_stale_input_message(const Node&, int64_t) {
  throw_unregistered("backward", "reading a gradient rule's saved input");
}
void missing_backward(const Tensor&, const Tensor&, bool) {
  throw_unregistered("backward", "backward()");
}

constexpr AutogradHooks kUnregistered{&missing_record,
                                      &missing_prepare,
                                      &missing_finish,
                                      &missing_alias,
                                      &missing_stale_input_message,
                                      &missing_backward};

}  // namespace

constinit std::atomic<const AutogradHooks*> g_autograd_hooks{&kUnregistered};

void set_autograd_hooks(const AutogradHooks* hooks) {
  g_autograd_hooks.store(hooks ? hooks : &kUnregistered, std::memory_order_relaxed);
}

bool autograd_registered() {
  return g_autograd_hooks.load(std::memory_order_relaxed) != &kUnregistered;
}

void throw_stale_input(const Node& node, int64_t i) {
  throw Error(with_context(autograd_hooks().stale_input_message(node, i)));
}

}  // namespace detail

void Tensor::backward(Tensor grad_output, bool retain_graph, std::source_location loc) const {
  detail::SiteGuard site(loc);
  detail::autograd_hooks().backward(*this, grad_output, retain_graph);
}

}  // namespace duet
