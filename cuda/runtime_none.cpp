// duet: the CUDA runtime API in a build without nvcc: no device is ever available.
#include "cuda/cuda.h"

namespace duet::cuda {
bool is_available() { return false; }
int device_count() { return 0; }
void synchronize() {}
void empty_cache() {}
}  // namespace duet::cuda
