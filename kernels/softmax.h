// duet: log_softmax's kernels (Note [log_softmax] in core/ops/nn.cpp).
#pragma once

#include "core/op_table.h"

namespace duet::kernels {

/// log_softmax along attrs.dim on any device, made of the output device's kernels (max, sub,
/// eq, where, exp, sum, log) in the composite's order; its scratch is one value per row. f32
/// and f64; f16 and bf16 through via_wide. The CPU has a kernel of its own, row by row, each
/// row's steps run while it is in cache, with no scratch.
void log_softmax_composed(TensorRefs in, const Attrs& attrs, const Tensor& out);

}  // namespace duet::kernels
