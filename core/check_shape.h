// duet: the check every shape passes where it enters the library (Note [Checked sizes] in
// core/types.cpp).
#pragma once

#include <cstdint>

#include "core/shape.h"

namespace duet::detail {
/// Throws a ValueError naming `op` and the shape when a size is negative, or when the elements,
/// the strides or the bytes of a tensor of this shape and an element of `itemsize` bytes would
/// not fit in int64.
void check_shape(const char* op, const Shape& shape, int64_t itemsize);
}  // namespace duet::detail
