// Prints docs/ops.md from the op table, so the op reference cannot drift from the code.
// `duet_op_docs > docs/ops.md` regenerates it; the test `op_docs_current` checks it.
#include <cstdio>

#include "duet.h"

int main() {
  using namespace duet;
  static const char* kClass[] = {"elementwise", "reduction", "view", "opaque", "source"};
  std::printf(
      "# duet op reference\n\n"
      "Generated from `core/ops.def` by `duet_op_docs` (tests/gen_op_docs.cpp); do not edit by\n"
      "hand. These are the %d primitives: each has one shape rule, one gradient rule and one\n"
      "kernel per device. Everything else in `core/ops.h` (mean, clamp, transpose, squeeze,\n"
      "unsqueeze, matmul's 1-D cases, eye, ...) is composed of them.\n\n"
      "| op | class | inputs | what it computes | CPU kernel | CUDA kernel |\n"
      "|---|---|---|---|---|---|\n",
      kNumOps);
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& d = detail::op_def(static_cast<OpId>(i));
    bool view = d.cls == OpClass::View;
    std::printf("| `%s` | %s | %d | %s | %s | %s |\n", d.name, kClass[static_cast<int>(d.cls)],
                d.arity, d.doc,
                view          ? "view (no kernel)"
                : d.kernel[0] ? "yes"
                              : "no",
                view          ? "view (no kernel)"
                : d.kernel[1] ? "yes"
                              : "no");
  }
  return 0;
}
