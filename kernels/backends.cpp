// duet: library initialisation. The op table calls register_backends() once, on first use, so
// there is no static-initialisation order to get wrong.
#include <omp.h>

#include "core/ops.h"
#include "kernels/cpu_kernels.h"

namespace duet {
namespace detail {

void register_backends(OpDef* table) { kernels::register_cpu_kernels(table); }

}  // namespace detail

void set_num_threads(int n) {
  DUET_CHECK_VALUE(n >= 1, "[set_num_threads] needs at least one thread, got {}", n);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace duet
