// duet: what both run-time code generators share: the CPU tier (trace/plan/codegen.cpp, C++ built
// by the system compiler) and the CUDA one (cuda/fused.cpp, NVRTC). The C type of a dtype in
// generated code, the hash that keys their caches, and the write that makes a cache entry
// appear whole or not at all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace duet::kernels::jit {

/// "float", "double", "int32_t", "int64_t" or "bool"; null for a dtype generated code does not
/// hold (f16, bf16).
const char* c_type(DType d);

/// 64-bit FNV-1a of s, continuing from h (chain calls to hash several parts).
inline uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// Writes `text` to `path` unless it exists, through a temporary file and a rename, so that a
/// reader in another process sees the whole file or none. False when it could not.
bool write_file_once(const std::string& path, const std::string& text);

/// The comment a generated kernel's source file ends with: the call sites of the ops it
/// computes (FusedKernel::sites), or "" without them.
inline std::string sites_comment(const std::string& sites) {
  if (sites.empty()) return "";
  return "\n// duet: computes the ops called at " + sites + "\n";
}

}  // namespace duet::kernels::jit
