// duet: the generated-C++ tier of fused CPU kernels (kernels/fused.h), the second tier of a JIT.
// A fused kernel that has run threshold() times gets C++ generated for its program; one
// background thread compiles it with the system compiler, loads it and swaps it in
// (FusedKernel::compiled). The interpreter runs the kernel until then, and for good when the
// build fails. Nothing here runs during compile(): the trace and the plan never wait for it.
// The compiler and flags are those duet's own kernels were built with (the build type's flags,
// -march=native with DUET_NATIVE), so both tiers compute alike; $DUET_CODEGEN_CXX names another
// compiler.
//
// Note [Codegen cache]
// A build is cached on disk as <cache_dir>/duet-fused-<key>.so, the key a hash of the generated
// source, the embedded headers it includes, the compiler (its path and `--version`) and the
// flags. A hit is only a dlopen. The compiler writes a temporary file that is renamed into
// place, so processes sharing the directory see a whole library or none. The generated source
// (.cpp) stays next to it, and the compiler's output (.log) when the build failed. Every file
// duet writes there starts with "duet-", and clear_cache() removes only those.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/codegen/source.h"
#include "kernels/fused.h"

namespace duet::codegen {

/// Switches the codegen tier on or off for kernels that reach the threshold from now on.
/// Default: on, unless the environment sets DUET_CODEGEN=0.
void set_enabled(bool on);
bool enabled();

/// Runs after which a fused kernel is queued for codegen (0 or more; default 3, or
/// $DUET_CODEGEN_THRESHOLD).
void set_threshold(int runs);
int threshold();

/// The directory of the on-disk cache (Note [Codegen cache]); "" restores the default:
/// $DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet/kernels, else $HOME/.cache/duet/kernels, else a
/// directory under /tmp. Created when the first build needs it.
void set_cache_dir(std::string dir);
std::string cache_dir();
/// Removes duet's files from the cache directory. Libraries already loaded stay loaded; a build
/// in flight may still add its own (wait_idle() first for an empty directory).
void clear_cache();

/// Blocks until the queue is empty and no build is running (for tests and benchmarks).
void wait_idle();

/// Counters since the process started.
struct CodegenStats {
  int64_t queued = 0;      ///< kernels queued
  int64_t built = 0;       ///< libraries the compiler built
  int64_t cache_hits = 0;  ///< libraries found in the disk cache
  int64_t failed = 0;      ///< programs whose source, build or load failed (each reported once)
  int64_t loaded = 0;      ///< kernels whose generated code was swapped in
  double build_ms = 0;     ///< wall time spent in the compiler
};
CodegenStats stats();

}  // namespace duet::codegen

namespace duet::detail {

/// Loads k's generated code now when the disk cache holds it (Note [Codegen warm start] in
/// trace/plan/codegen.cpp); otherwise does nothing. Called as a plan's CPU kernels are made.
void codegen_probe(const std::shared_ptr<kernels::FusedKernel>& k);

/// The slow path of codegen_note_run: queues k when codegen is on and allowed for it and k has
/// run often enough.
void codegen_consider(const std::shared_ptr<kernels::FusedKernel>& k);

/// Called by the executor after each run of a fused kernel. One atomic load once k is queued.
inline void codegen_note_run(const std::shared_ptr<kernels::FusedKernel>& k) {
  if (!k->codegen_requested.load(std::memory_order_relaxed)) codegen_consider(k);
}

}  // namespace duet::detail
