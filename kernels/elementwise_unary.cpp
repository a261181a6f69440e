// CPU kernels of the unary elementwise family (core/elementwise.def).
#include "kernels/elementwise_loops.h"

namespace duet::kernels {

void register_unary_kernels(OpDef* t) {
  auto reg = [&](OpId op, KernelFn k) { detail::register_kernel(t, op, DeviceType::CPU, k); };
#define DUET_UNARY(Name, name, math, doc) \
  reg(OpId::Name, ew::unary_kernel<fn::Name, UnaryMath::math == UnaryMath::Float>);
#include "core/elementwise.def"
}

}  // namespace duet::kernels
