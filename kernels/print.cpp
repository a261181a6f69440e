// CPU kernel of Print (core/ops/debug.cpp): formats in[0] with the interned format string and
// writes the line. in[1], a trace's ordering token, is not read; the result has no elements.
#include "kernels/cpu_kernels.h"

namespace duet::kernels {
namespace {

void print_kernel(TensorRefs in, const Attrs& a, const Tensor&) {
  const std::string& format = detail::interned_format(a.dim);
  std::string line;
  try {  // the shape rule checked the format; a fmt error must still not escape as one
    line = fmt::format(fmt::runtime(format), in[0]);
  } catch (const fmt::format_error& e) {
    throw ValueError(
        fmt::format("[print] the format \"{}\" does not format one tensor ({})", format, e.what()));
  }
  detail::write_print(line + "\n");
}

}  // namespace

void register_print_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Print, DeviceType::CPU, print_kernel);
}

}  // namespace duet::kernels
