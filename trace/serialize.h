// duet: the file format of saved programs (duet::save, duet::load; docs/deploy.md).
//
// Note [Program files]
// A file is a 32-byte header and a payload:
//   bytes 0-7    magic "DUETPROG"
//   bytes 8-11   format version (little-endian u32; this build writes and reads kFormatVersion)
//   bytes 12-15  reserved, 0
//   bytes 16-23  payload size in bytes (u64)
//   bytes 24-27  CRC-32 of the payload (zlib's)
//   bytes 28-31  CRC-32 of bytes 0-27
// The payload holds, in order: the function's label; its inputs (name, dtype, device, and per
// dim a size or a symbol); the number of symbols, the sizes they had when saved, and the guards
// on them (relations of size expressions, as text); the output names; the graph (Note [Graph
// IR]) as traced, symbolic dims and all, with its captured tensors' values and names. Numbers
// are little-endian, strings and arrays are length-prefixed, size expressions are the text
// SymInt::str() prints, parsed back on load. The reader checks every length against what is
// left, every enum against its range, every op name against the op table, and every node
// input against the nodes before it; then Graph::verify() checks each op's shape rule. A file
// that is not a program, is truncated, fails its checksums, comes from a newer format, or does
// not decode raises a duet::ValueError saying which; nothing in it can crash the reader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace/ir/graph.h"

namespace duet::detail {

inline constexpr uint32_t kFormatVersion = 1;

/// One input of a saved program: its name and what a call must give.
struct SavedInput {
  std::string name;
  DType dtype = DType::f32;
  Device device;
  std::vector<int64_t> sizes;  ///< at the save
  std::vector<int32_t> syms;   ///< per dim: its symbol, or -1 for a fixed size
};

/// A relation between size expressions that the graph assumes (a guard of its trace).
struct SavedGuard {
  SymInt a;
  SymRel rel = SymRel::Eq;
  SymInt b;
  std::string why;
};

struct SavedProgram {
  std::string label;  ///< "compiled function at model.cpp:12"
  std::vector<SavedInput> inputs;
  int32_t num_symbols = 0;
  std::vector<int64_t> hints;  ///< the symbols' sizes at the save
  std::vector<SavedGuard> guards;
  std::vector<std::string> outputs;         ///< output names, one per graph output
  std::vector<std::string> captured_names;  ///< one per graph.captured
  Graph graph;  ///< runtime input i is inputs[i]; symbolic dims as traced
};

/// The file's bytes.
std::string encode_program(const SavedProgram& p);
/// Decodes a file's bytes; `path` names it in errors.
SavedProgram decode_program(const std::string& bytes, const std::string& path);

/// Rewrites the payload size and both checksums in the header of a program file's bytes (which
/// must start with the magic and hold a whole header), so that changed bytes reach the decoder:
/// the fuzz target and the tests of bad files use it.
void reseal_program(std::string& bytes);

/// The text of SymInt::str() back as a SymInt; nullopt when it is not one.
std::optional<SymInt> parse_sym(const std::string& text);

}  // namespace duet::detail
