// Prints docs/ops.md from the op table, so the op reference cannot drift from the code.
// `duet_op_docs > docs/ops.md` regenerates it; the test `op_docs_current` checks it.
//
// The CUDA column is ops.def's declared cuda column, not the kernels this build registered, so
// the reference is the same in every build (CPU-only and sanitizer builds check it too). In a
// build with the CUDA backend, this program first checks the declaration against the
// registered CUDA kernels, and fails (printing nothing on stdout) when they disagree.
#include <cstdio>

#include "duet.h"

namespace {

/// The number of ops whose declared CUDA kernel disagrees with this build, each reported on
/// stderr.
int check_cuda_declarations() {
  using namespace duet;
  int bad = 0;
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& d = detail::op_def(static_cast<OpId>(i));
    if (d.cls == OpClass::View && d.cuda_kernel) {
      std::fprintf(stderr, "core/ops.def: view op %s declares a CUDA kernel (views have none)\n",
                   d.name);
      ++bad;
    }
#ifdef DUET_WITH_CUDA
    bool registered = d.kernel[static_cast<int>(DeviceType::CUDA)] != nullptr;
    if (registered != d.cuda_kernel) {
      std::fprintf(stderr, "core/ops.def: op %s declares cuda %s, but this build registers %s\n",
                   d.name, d.cuda_kernel ? "true" : "false",
                   registered ? "a CUDA kernel for it" : "no CUDA kernel for it");
      ++bad;
    }
#endif
  }
  return bad;
}

}  // namespace

int main() {
  using namespace duet;
  if (int bad = check_cuda_declarations()) {
    std::fprintf(stderr, "%d op(s) with a wrong cuda column in core/ops.def\n", bad);
    return 1;
  }
  static const char* kClass[] = {"elementwise", "reduction", "view", "opaque", "source"};
  std::printf(
      "# duet op reference\n\n"
      "Generated from `core/ops.def` by `duet_op_docs` (tools/gen_op_docs.cpp); do not edit by\n"
      "hand. These are the %d primitives: each has one shape rule, one gradient rule and one\n"
      "kernel per device. Everything else in `core/ops.h` (mean, clamp, transpose, squeeze,\n"
      "unsqueeze, matmul's 1-D cases, eye, ...) is composed of them.\n\n"
      "The CUDA column is the `cuda` column of `core/ops.def`, so this page is the same in\n"
      "every build; a build with the CUDA backend checks it against the kernels that\n"
      "`cuda/kernels/` registers. How to add an op: [contributing](contributing.md).\n\n"
      "| op | class | inputs | what it computes | CPU kernel | CUDA kernel |\n"
      "|---|---|---|---|---|---|\n",
      kNumOps);
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& d = detail::op_def(static_cast<OpId>(i));
    bool view = d.cls == OpClass::View;
    bool cpu = d.kernel[static_cast<int>(DeviceType::CPU)] != nullptr;
    std::printf("| `%s` | %s | %d | %s | %s | %s |\n", d.name, kClass[static_cast<int>(d.cls)],
                d.arity, d.doc,
                view  ? "view (no kernel)"
                : cpu ? "yes"
                      : "no",
                view            ? "view (no kernel)"
                : d.cuda_kernel ? "yes"
                                : "no");
  }
  return 0;
}
