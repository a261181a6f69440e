// See kernels/jit.h.
#include "kernels/jit.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>

namespace duet::kernels::jit {

const char* c_type(DType d) {
  switch (d) {
    case DType::f32:
      return "float";
    case DType::f64:
      return "double";
    case DType::i32:
      return "int32_t";
    case DType::i64:
      return "int64_t";
    case DType::b8:
      return "bool";
    default:
      return nullptr;
  }
}

bool write_file_once(const std::string& path, const std::string& text) {
  if (access(path.c_str(), F_OK) == 0) return true;
  // Unique per process and call: threads of one process may write the same file at once.
  static std::atomic<uint64_t> serial{0};
  const std::string tmp = fmt::format("{}.tmp-{}-{}", path, getpid(), serial++);
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f.good()) {
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.c_str());
  return access(path.c_str(), F_OK) == 0;  // another writer's copy is as good
}

}  // namespace duet::kernels::jit
