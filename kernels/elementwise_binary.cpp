// CPU kernels of the binary and comparison elementwise families (core/elementwise.def).
#include "kernels/elementwise_loops.h"

namespace duet::kernels {

void register_binary_kernels(OpDef* t) {
  auto reg = [&](OpId op, KernelFn k) { detail::register_kernel(t, op, DeviceType::CPU, k); };
#define DUET_BINARY(Name, name, doc) reg(OpId::Name, ew::binary_kernel<fn::Name, false>);
#define DUET_COMPARE(Name, name, expr, doc) reg(OpId::Name, ew::binary_kernel<fn::Name, true>);
#include "core/elementwise.def"
}

}  // namespace duet::kernels
