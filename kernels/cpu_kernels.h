// duet: CPU kernels, registered into the op table by register_cpu_kernels().
#pragma once

#include "core/op_table.h"

namespace duet::kernels {

/// Fills every CPU kernel slot of the table.
void register_cpu_kernels(OpDef* table);
void register_elementwise_kernels(OpDef* table);
void register_reduction_kernels(OpDef* table);
void register_matmul_kernels(OpDef* table);

/// A contiguous copy of `t` converted to `dtype`, made by calling the Cast kernel directly
/// (kernels never re-enter dispatch).
Tensor cast_to(const Tensor& t, DType dtype);

}  // namespace duet::kernels
