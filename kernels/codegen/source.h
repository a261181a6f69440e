// duet: the two code generators of fused kernels, side by side. Each writes the source of one
// kernel for a fused program (kernels/fused.h) from the same expression table
// (kernels/codegen/exprs.h): trace/plan/codegen.cpp compiles the C++ one with the system compiler,
// cuda/fused.cpp the CUDA one with NVRTC.
#pragma once

#include <string>

#include "kernels/fused.h"

namespace duet::detail {
/// The C++ source of a program's kernel: `extern "C" void duet_fused(const DuetFusedArgs*,
/// int64_t begin, int64_t end)`, computing what interpret_fused computes (elementwise results
/// bit for bit). It includes "duet_fused_abi.h" and "duet_functors.h" (the embedded headers).
std::string generate_fused_source(const kernels::FusedProgram& p);
/// The #include lines every generated CPU kernel starts with (a batch of kernels built as one
/// translation unit starts with them once; trace/plan/codegen.cpp).
const char* fused_source_includes();
}  // namespace duet::detail

namespace duet::cuda::detail {
/// The CUDA source of a program's kernel (Note [Fused CUDA kernels] in cuda/fused.h).
std::string fused_source(const kernels::FusedProgram& p);

// The blocks of the fused CUDA kernels, in threads, read by both the generator and the launcher
// (fused_launch in cuda/fused.h). Each kernel declares the largest block its mode is launched
// with as __launch_bounds__, so that ptxas keeps its registers within what a block that large
// may hold (64 a thread at 1024 threads): without it, a register-heavy f64 program compiled to
// more and its launch failed with "too many resources requested for launch".
inline constexpr unsigned kFusedElementwiseBlock = 256;  ///< elementwise: one row of threads
inline constexpr unsigned kFusedInnerMaxBlock = 512;     ///< inner reduction: 32 up to this
inline constexpr unsigned kFusedOuterColumns = 32;       ///< outer reduction: block_x, a warp
inline constexpr unsigned kFusedOuterRows = 32;          ///< its block_y when columns are few
inline constexpr unsigned kFusedOuterRowsMany = 8;       ///< and when they are many
inline constexpr unsigned kFusedFoldBlock = 256;         ///< a split reduction's second pass
static_assert(kFusedInnerMaxBlock % 32 == 0 && kFusedInnerMaxBlock <= 1024 &&
                  kFusedOuterColumns == 32 && kFusedOuterRowsMany <= kFusedOuterRows &&
                  kFusedOuterColumns * kFusedOuterRows <= 1024,
              "fused CUDA blocks: whole warps (a warp per row of an outer block), 1024 at most");

/// The largest block a program's kernel is launched with in mode `r`: its __launch_bounds__.
constexpr unsigned fused_block_limit(kernels::FusedReduce r) {
  switch (r) {
    case kernels::FusedReduce::None:
      return kFusedElementwiseBlock;
    case kernels::FusedReduce::Inner:
      return kFusedInnerMaxBlock;
    case kernels::FusedReduce::Outer:
      return kFusedOuterColumns * kFusedOuterRows;
  }
  return 0;
}
}  // namespace duet::cuda::detail
