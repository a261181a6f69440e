// Prints docs/ops.md from the op declarations, so the op reference cannot drift from the code:
// the public ops from the rows of core/elementwise.def and core/api.def (signatures, methods and
// docs), then the primitives from the op table (core/ops.def). `duet_op_docs > docs/ops.md`
// regenerates it; the test `op_docs_current` checks it.
//
// The CUDA column is ops.def's declared cuda column, not the kernels this build registered, so
// the reference is the same in every build (CPU-only and sanitizer builds check it too). In a
// build with the CUDA backend, this program first checks the declaration against the
// registered CUDA kernels, and fails (printing nothing on stdout) when they disagree.
#include <cstdio>
#include <string>
#include <vector>

#include "duet.h"

namespace {

/// A row of core/api.def as text (a section heading when `section` is set).
struct ApiRow {
  const char* section;
  const char* kind;
  const char* ret;
  const char* name;
  const char* params;
  const char* args;
  const char* doc;
};

const ApiRow kApiRows[] = {
#define DUET_API_SECTION(title) {title, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
#define DUET_API(kind, ret, name, params, args, doc) \
  {nullptr, #kind, #ret, #name, #params, #args, doc},
#include "core/api.def"
};

/// "(a, b)" -> "a, b".
std::string unparen(const char* s) {
  std::string t(s);
  if (t.size() >= 2 && t.front() == '(' && t.back() == ')') t = t.substr(1, t.size() - 2);
  return t;
}

/// "x.sum(dims, keepdim)" for the arguments "(x, dims, keepdim)" of `name`.
std::string method_call(const std::string& name, const char* args) {
  std::string a = unparen(args);
  size_t comma = a.find(',');
  if (comma == std::string::npos) return a + "." + name + "()";
  size_t rest = a.find_first_not_of(' ', comma + 1);
  return a.substr(0, comma) + "." + name + "(" + a.substr(rest) + ")";
}

/// The operator of a binary elementwise op, as a table cell ("" when it has none).
const char* operator_of(const std::string& name) {
  static const char* const kOps[][2] = {{"add", "`a + b`"}, {"sub", "`a - b`"}, {"mul", "`a * b`"},
                                        {"div", "`a / b`"}, {"lt", "`a < b`"},  {"le", "`a <= b`"},
                                        {"gt", "`a > b`"},  {"ge", "`a >= b`"}, {"eq", "`a == b`"},
                                        {"ne", "`a != b`"}};
  for (const auto& o : kOps)
    if (name == o[0]) return o[1];
  return "";
}

/// The public ops: sections of core/api.def, each row group (a row and the rows with an empty
/// doc after it) as a heading, its signatures and methods, and its doc.
void print_public_ops() {
  std::printf(
      "## Elementwise ops\n\n"
      "One row each in `core/elementwise.def`; every one is also a primitive (below). Unary ops\n"
      "take `(const Tensor& x)`; binary ops and comparisons take two tensors, or a tensor and a\n"
      "`Scalar` on either side, broadcast with PyTorch's type promotion. Each is also a method.\n\n"
      "| function | method | operator | what it computes |\n|---|---|---|---|\n");
#define DUET_UNARY(Name, name, math, doc)                         \
  std::printf("| `" #name "(x)` | `x." #name "()` | %s | %s |\n", \
              #name == std::string("neg") ? "`-x`" : "", doc);
#define DUET_BINARY(Name, name, doc) \
  std::printf("| `" #name "(a, b)` | `a." #name "(b)` | %s | %s |\n", operator_of(#name), doc);
#define DUET_COMPARE(Name, name, expr, doc) DUET_BINARY(Name, name, doc)
#include "core/elementwise.def"
  std::printf("\n");
  const size_t n = sizeof(kApiRows) / sizeof(kApiRows[0]);
  for (size_t i = 0; i < n;) {
    const ApiRow& r = kApiRows[i];
    if (r.section) {
      std::printf("## %s\n\n", r.section);
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < n && !kApiRows[end].section && kApiRows[end].doc[0] == '\0') ++end;
    std::vector<std::string> names;
    for (size_t j = i; j < end; ++j)
      if (names.empty() || names.back() != kApiRows[j].name) names.push_back(kApiRows[j].name);
    std::string heading;
    for (const std::string& nm : names) heading += (heading.empty() ? "" : ", ") + nm;
    std::printf("### %s\n\n", heading.c_str());
    for (size_t j = i; j < end; ++j) {
      const ApiRow& o = kApiRows[j];
      std::printf("`%s %s%s`", unparen(o.ret).c_str(), o.name, o.params);
      if (std::string(o.kind) == "Method")
        std::printf(" · method `%s`", method_call(o.name, o.args).c_str());
      std::printf("%s\n", j + 1 < end ? "<br>" : "");
    }
    std::printf("\n%s\n\n", r.doc);
    i = end;
  }
}

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
      "Generated by `duet_op_docs` (tools/gen_op_docs.cpp) from the op declarations; do not\n"
      "edit by hand. Every public op is declared once, as a row of `core/elementwise.def` or\n"
      "`core/api.def`: the row gives the free function `duet::name(...)`, its Tensor method\n"
      "when LibTorch has one of that name and argument order (`x.sum()`, `x.reshape({2, -1})`,\n"
      "`a.matmul(b)`), and its entry here. Every function and method also takes the caller's\n"
      "`std::source_location` as a defaulted last argument (the `*_like` creators through their\n"
      "`Located` first argument), which errors report.\n\n"
      "The public ops are composed of %d primitives, listed at the end: each has one shape\n"
      "rule, one gradient rule and one kernel per device, so every public op is\n"
      "differentiable (unless its entry says otherwise), traced and fused like them. How to add\n"
      "an op: [contributing](contributing.md).\n\n",
      kNumOps);
  print_public_ops();
  std::printf(
      "## Primitives\n\n"
      "The rows of `core/ops.def`. The CUDA column is the `cuda` column there, so this page is\n"
      "the same in every build; a build with the CUDA backend checks it against the kernels\n"
      "that `cuda/kernels/` registers. The autocast column is the op's class inside an\n"
      "`Autocast` scope ([low precision](low-precision.md)): *low* casts its inputs to the\n"
      "scope's low dtype, *f32* casts f16 and bf16 inputs to f32. The vmap column says how\n"
      "`func::vmap` batches the op ([function transforms](func.md)): *rule*, one call on the\n"
      "batch; *loop*, once per sample. The rows column says whether `Autobatch` runs calls on\n"
      "rows of different lengths along dim 0 as one call ([per-sample code](func.md)).\n\n"
      "| op | class | inputs | what it computes | CPU kernel | CUDA kernel | autocast | vmap | "
      "rows |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < kNumOps; ++i) {
    const OpDef& d = detail::op_def(static_cast<OpId>(i));
    bool view = d.cls == OpClass::View;
    bool cpu = d.kernel[static_cast<int>(DeviceType::CPU)] != nullptr;
    std::printf("| `%s` | %s | %d | %s | %s | %s | %s | %s | %s |\n", d.name,
                kClass[static_cast<int>(d.cls)], d.arity, d.doc,
                view  ? "view (no kernel)"
                : cpu ? "yes"
                      : "no",
                view            ? "view (no kernel)"
                : d.cuda_kernel ? "yes"
                                : "no",
                d.autocast == AutocastClass::Lower ? "low"
                : d.autocast == AutocastClass::F32 ? "f32"
                                                   : "",
                d.batch ? "rule" : "loop", d.rows ? "yes" : "");
  }
  return 0;
}
