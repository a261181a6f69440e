// duet: the calling convention of a fused CPU kernel, shared by the interpreter (kernels/fused.cpp)
// and by the C++ that codegen (trace/plan/codegen.cpp) generates and the system compiler builds. It
// uses only C types, so the generated code includes it without the rest of duet.
//
// Note [Fused iteration]
// A fused group iterates one 2-D space [outer, inner], row-major: the group's shape coalesced to
// two dims by the executor (an operand that does not fit is made dense first). Input k is read
// at element (i, j) from in[k] + i * in_so[k] + j * in_si[k] (element strides of its own dtype;
// 0 broadcasts). Elementwise outputs are dense [outer * inner]. A reduction group also writes
// red_out: one value per row (reduce == 1, "inner": the trailing dims are reduced) or per column
// (reduce == 2, "outer": the leading dims are reduced). A kernel call covers [begin, end) of the
// work: flat elements for an elementwise group, rows for an inner reduction, columns for an
// outer one; the executor splits the work over the threads.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (cuda/fused.cpp) has no <stdint.h>, and libcu++'s <cuda/std/cstdint> costs a tenth of a
// second a build for a few typedefs: the ones generated code names, as libcu++ defines them.
typedef int int32_t;
typedef long long int64_t;
#else
#include <stdint.h>
#endif

#define DUET_FUSED_MAX_INPUTS 24
#define DUET_FUSED_MAX_OUTPUTS 12

#ifdef __cplusplus
namespace duet::kernels {
extern "C" {
#endif

typedef struct DuetFusedArgs {
  int64_t outer, inner;
  const void* in[DUET_FUSED_MAX_INPUTS];
  int64_t in_so[DUET_FUSED_MAX_INPUTS];
  int64_t in_si[DUET_FUSED_MAX_INPUTS];
  void* out[DUET_FUSED_MAX_OUTPUTS];
  void* red_out;
} DuetFusedArgs;

/// A fused kernel: computes [begin, end) of the work described by args.
typedef void (*DuetFusedFn)(const DuetFusedArgs* args, int64_t begin, int64_t end);

#ifdef __cplusplus
}  // extern "C"
}  // namespace duet::kernels
#endif
