// CPU kernel of Print (core/ops/debug.cpp): formats in[0] with the interned format string and
// writes the line. in[1], a trace's ordering token, is not read; the result has no elements.
#include "kernels/cpu_kernels.h"

namespace duet::kernels {
namespace {

void print_kernel(TensorRefs in, const Attrs& a, const Tensor&) {
  detail::write_print(fmt::format(fmt::runtime(detail::interned_format(a.dim)), in[0]) + "\n");
}

}  // namespace

void register_print_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Print, DeviceType::CPU, print_kernel);
}

}  // namespace duet::kernels
