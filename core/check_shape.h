// duet: the check every shape passes where it enters the library (Note [Checked sizes] in
// core/types.cpp).
#pragma once

#include <cstdint>

#include "core/shape.h"

namespace duet::detail {
/// The maximum rank of a tensor (docs/design.md, "The hot path"). Kernels and shape rules keep
/// per-dim state in fixed arrays and 64-bit masks of this size.
inline constexpr int64_t kMaxRank = 64;

/// Throws a ValueError naming `op` and the shape when the rank is above kMaxRank, when a size is
/// negative, or when the elements, the strides or the bytes of a tensor of this shape and an
/// element of `itemsize` bytes would not fit in int64.
void check_shape(const char* op, const Shape& shape, int64_t itemsize);
}  // namespace duet::detail
