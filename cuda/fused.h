// duet: fused CUDA kernels. The fusion pass (trace/plan/fusion.h) groups elementwise ops, with an
// optional closing reduction, into a kernels::FusedProgram for CUDA as for the CPU. Here each
// program becomes CUDA C++ that calls the same scalar functors as every other kernel
// (kernels/functors.h), compiled at run time by NVRTC into a CUBIN for the device's
// architecture and loaded with the runtime's library API.
//
// Note [Fused CUDA kernels]
// One kernel per program, `duet_fused(DuetFusedArgs a, unsigned vmask, int vec, int nsplit)`,
// over the 2-D iteration space of Note [Fused iteration] (kernels/fused_abi.h), with grid-stride
// loops:
//   - elementwise: each thread takes V = 16 / sizeof(T) consecutive elements of a row when
//     `vec` is set (rows a multiple of V long, outputs 16-byte aligned), loading an input of
//     dtype T with one 16-byte load when its bit in `vmask` says its rows are contiguous and
//     aligned, a broadcast input once, and any other input lane by lane; else one element per
//     thread. `vec` 2 is the dense case: every input is a number (constant over the space) or
//     laid out as the output (aligned, when of dtype T), and every offset fits 32 bits; its loop
//     has no per-input layout test and no 64-bit index arithmetic (an elementwise chain over
//     whole tensors, as W2, is this case);
//   - inner reduction: one block per row (grid-stride over rows), threads striding along it,
//     then a warp-shuffle and shared-memory tree;
//   - outer reduction: 32 columns per block, its threads' rows striding down, then a
//     shared-memory fold over the rows;
//   - a reduction with too few rows (inner) or column blocks (outer) to fill the device, each
//     long enough, runs in two passes: nsplit blocks per row or column block, each folding a
//     slice into a partial in a scratch buffer, then `duet_fused_fold` (in the same source)
//     folding each result's partials in slice order. A full sum of a large tensor thus uses
//     every multiprocessor instead of one block, and still adds in a fixed order.
// The kernel declares __launch_bounds__ of the largest block its mode is launched with, from the
// block sizes that fused_launch uses too (kernels/codegen/source.h), so that no program needs
// more registers than its block may hold.
// Registers hold T as in the interpreter (Note [Fused registers]); b8 loads are 0 or 1 and b8
// stores test != 0. Add, Sub and Mul (and a sum's fold) use round-to-nearest intrinsics
// (__fadd_rn, ...), which are never contracted into a fused multiply-add, so each op rounds its
// result as its eager kernel does; inside a functor NVRTC contracts as nvcc does for the eager
// kernels (both with contraction on). Results match eager within the order of a reduction's
// sums and the last bits of a transcendental function.
//
// Note [CUDA kernel cache]
// A build is cached in memory (by key, for the process) and on disk as
// <cache_dir>/duet-cuda-<key>.cubin (or .ptx when NVRTC does not know the device's
// architecture and the driver compiles PTX), the key a hash of all that NVRTC reads
// (kernel_cache_key): the source, the embedded headers' names and texts, every option (the
// architecture, the flags, the include directories) and NVRTC's version. Files are written to a
// temporary name and renamed, so processes sharing the directory see a whole file or none; the
// generated source (.cu) stays beside it, and NVRTC's log (.log) when a build fails.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/codegen/source.h"
#include "kernels/fused.h"

namespace duet::cuda::detail {

/// Compiles CUDA source with NVRTC for sm_<arch> (90 for sm_90), as the fused kernels are
/// compiled. Returns "" on success, else NVRTC's log. Needs no GPU (the tests run it on CPU
/// machines to check every generated program compiles).
std::string nvrtc_check(const std::string& source, int arch);

/// What NVRTC made of one source: its image (CUBIN, or PTX), or its log when it failed.
struct NvrtcBuilt {
  std::string log, image;
};
/// Builds each source as a fused kernel is built for sm_<arch>, `threads` programs at once, as a
/// plan's first run does (Note [Parallel NVRTC builds] in cuda/fused.cpp). Needs no GPU.
std::vector<NvrtcBuilt> nvrtc_build_all(const std::vector<std::string>& sources, int arch,
                                        int threads);

/// Runs fn(i) for i in [0, n) on up to `threads` threads, this one among them (the side-by-side
/// builds of Note [Parallel NVRTC builds]). The first exception of fn stops the work not yet
/// started and is rethrown here once every thread is done.
void run_side_by_side(size_t n, int threads, const std::function<void(size_t)>& fn);

/// A header that generated kernels include, as NVRTC is given it (no file is read).
struct NvrtcHeader {
  std::string name, text;
};

/// The headers every fused kernel includes: "duet_fused_abi.h" and "duet_functors.h", the texts
/// of kernels/fused_abi.h and kernels/functors.h embedded at build time.
std::vector<NvrtcHeader> fused_headers();

/// The options NVRTC builds fused kernels with for a device of compute capability `arch` (90 for
/// sm_90): the target architecture, the language and math flags and the include directories.
/// `cubin` when NVRTC knows sm_<arch>; else they ask for PTX of the newest architecture below.
struct NvrtcOptions {
  std::vector<std::string> options;
  bool cubin = true;
};
NvrtcOptions nvrtc_options(int arch);

/// The key of a build in the kernel cache (Note [CUDA kernel cache]): a hash of all that NVRTC
/// reads, the source, each header's name and text and every option, and NVRTC's version. A
/// change to any of them is another key, so no stale kernel loads from the disk.
uint64_t kernel_cache_key(const std::string& source, const std::vector<NvrtcHeader>& headers,
                          const std::vector<std::string>& options);

/// How run() launches a program's kernel on a device with `sms` multiprocessors: the grid, the
/// block (of fused_block_limit(p.reduce) threads at most), and the kernel's vmask, vec and
/// nsplit arguments (Note [Fused CUDA kernels]). `none` when there is no work. With nsplit > 1
/// the kernel writes `partials` values of T to a scratch buffer, and duet_fused_fold(scratch,
/// red_out, results, nsplit, part_stride, split_stride) folds them.
struct FusedLaunch {
  unsigned grid = 1, grid_y = 1, block_x = 1, block_y = 1;
  unsigned vmask = 0;
  int vec = 0;
  int nsplit = 1;
  int64_t partials = 0, results = 0, part_stride = 0, split_stride = 0;
  bool none = false;
};
FusedLaunch fused_launch(const kernels::FusedProgram& p, const kernels::DuetFusedArgs& a, int sms);

/// Registers the fused-kernel runner for CUDA devices (kernels::set_fused_device_runner).
void register_fused_runner();

}  // namespace duet::cuda::detail
