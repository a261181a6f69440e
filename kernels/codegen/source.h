// duet: the two code generators of fused kernels, side by side. Each writes the source of one
// kernel for a fused program (kernels/fused.h) from the same expression table
// (kernels/codegen/exprs.h): trace/codegen.cpp compiles the C++ one with the system compiler,
// cuda/fused.cpp the CUDA one with NVRTC.
#pragma once

#include <string>

#include "kernels/fused.h"

namespace duet::detail {
/// The C++ source of a program's kernel: `extern "C" void duet_fused(const DuetFusedArgs*,
/// int64_t begin, int64_t end)`, computing what interpret_fused computes (elementwise results
/// bit for bit). It includes "duet_fused_abi.h" and "duet_functors.h" (the embedded headers).
std::string generate_fused_source(const kernels::FusedProgram& p);
}  // namespace duet::detail

namespace duet::cuda::detail {
/// The CUDA source of a program's kernel (Note [Fused CUDA kernels] in cuda/fused.h).
std::string fused_source(const kernels::FusedProgram& p);
}  // namespace duet::cuda::detail
