// duet: library initialisation. The op table calls register_backends() once, on first use, so
// there is no static-initialisation order to get wrong.
#include <omp.h>

#include "core/ops.h"
#include "kernels/cpu_kernels.h"

namespace duet {
namespace detail {

#ifdef DUET_WITH_CUDA
}  // namespace detail
namespace cuda::detail {
void register_cuda_kernels(OpDef* table);  // cuda/kernels/register.cpp
void register_runtime();                   // cuda/runtime.cpp
}  // namespace cuda::detail
namespace detail {
#endif

void register_backends(OpDef* table) {
  kernels::register_cpu_kernels(table);
#ifdef DUET_WITH_CUDA
  cuda::detail::register_runtime();
  cuda::detail::register_cuda_kernels(table);
#endif
}

}  // namespace detail

void set_num_threads(int n) {
  DUET_CHECK_VALUE(n >= 1, "[set_num_threads] needs at least one thread, got {}", n);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace duet
