// A program that includes only core headers, so that the static library gives it no autograd
// (Note [Autograd hooks] in core/autograd_hooks.h): ops run, and what needs autograd throws a
// duet::Error naming it, never calls a null hook. Its own main, without the test helpers, which
// include duet.h and so register autograd.
#include <cstdio>
#include <functional>
#include <string>

#include "core/autograd_hooks.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

// fn throws a duet::Error (not a subclass's sibling, not a crash) whose message holds `op` and
// the missing piece.
void expect_unregistered(const std::function<void()>& fn, const char* op, const char* what) {
  try {
    fn();
    expect(false, what);
  } catch (const duet::Error& e) {
    const std::string m = e.what();
    const bool ok = m.find(op) != std::string::npos &&
                    m.find("needs duet's eager autograd") != std::string::npos &&
                    m.find("eager/autograd.h") != std::string::npos;
    if (!ok) std::printf("message: %s\n", m.c_str());
    expect(ok, what);
  }
}

}  // namespace

int main() {
  using namespace duet;
  expect(!detail::autograd_registered(), "no file of this program registers autograd");
  // Without a tensor that requires grad nothing records: ops run.
  Tensor a = ones({3});
  expect((a * 2 + 1).sum().item<float>() == 9.0f, "ops run without autograd");
  Tensor x = ones({3}).requires_grad_();
  expect(x.requires_grad(), "requires_grad_ is core's");
  expect_unregistered([&] { (void)(x * 2); }, "[mul]", "an op that records throws");
  expect_unregistered([&] { a.add_(x); }, "[add]", "an in-place op that records throws");
  expect_unregistered([&] { x.backward(ones({3})); }, "[backward]", "backward() throws");
  {
    detail::GradModeScope no_grad(false);  // grad mode off: nothing to record
    expect((x * 2).sum().item<float>() == 6.0f, "ops on x run with grad mode off");
  }
  if (failures == 0) std::printf("autograd_unlinked: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
