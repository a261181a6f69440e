// The fuzz build's op table has no kernels: the loader decodes and checks graphs (shape rules
// only), it never runs one.
#include "core/op_table.h"

namespace duet::detail {
void register_backends(OpDef*) {}
}  // namespace duet::detail
