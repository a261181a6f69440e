// libFuzzer harness of the program loader (trace/serialize.h): any bytes must decode to a
// program or raise a duet::Error, never crash, hang or leak. The fuzzer mutates whole files; the
// checksums would stop almost every mutation at the header, so the harness recomputes them
// first and the mutations reach the decoder.
#include <cstdint>
#include <string>

#include "trace/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.size() >= 32 && bytes.compare(0, 8, "DUETPROG") == 0)
    duet::detail::reseal_program(bytes);
  try {
    duet::detail::SavedProgram p = duet::detail::decode_program(bytes, "fuzz.duet");
    (void)p;
  } catch (const duet::Error&) {
  }
  return 0;
}
