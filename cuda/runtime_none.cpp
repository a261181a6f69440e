// duet: the CUDA runtime API in a build without nvcc: no device is ever available, and core has
// no CUDA backend registered, so Device::cuda() tensors raise "this build has no CUDA backend".
#include "cuda/cuda.h"

namespace duet::cuda {
namespace {
bool g_allow_tf32 = false;
}
bool is_available() { return false; }
int device_count() { return 0; }
void synchronize() {}
void empty_cache() {}
MemoryStats memory_stats(int) { return {}; }
int64_t cache_hits(int) { return 0; }
void reset_peak_memory_stats(int) {}
void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }
CodegenStats codegen_stats() { return {}; }
}  // namespace duet::cuda
