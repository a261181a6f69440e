// libFuzzer harness of the program loader (trace/serialize.h): any bytes must decode to a
// program or raise a duet::Error, never crash, hang or leak. The fuzzer mutates whole files; the
// checksums would stop almost every mutation at the header, so the harness recomputes them
// first and the mutations reach the decoder.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "trace/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.size() >= 32 && bytes.compare(0, 8, "DUETPROG") == 0) {
    const uint64_t payload = bytes.size() - 32;
    std::memcpy(bytes.data() + 16, &payload, 8);
    const uint32_t pc = static_cast<uint32_t>(crc32(
        crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data() + 32), uInt(payload)));
    std::memcpy(bytes.data() + 24, &pc, 4);
    const uint32_t hc = static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), 28));
    std::memcpy(bytes.data() + 28, &hc, 4);
  }
  try {
    duet::detail::SavedProgram p = duet::detail::decode_program(bytes, "fuzz.duet");
    (void)p;
  } catch (const duet::Error&) {
  }
  return 0;
}
