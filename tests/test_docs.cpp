// duet tests: the code blocks of the README and docs/ compile (Note [Compiled doc blocks] in
// doc_blocks.cpp). The build compiles and links them; this test checks that every ```cpp block
// in the source tree is one that was compiled, so a doc added or edited without a rebuild fails.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "util.h"

namespace duet_docs {
namespace {
struct Compiled {
  size_t blocks = 0, linked = 0;
};
std::map<std::string, Compiled>& compiled() {
  static std::map<std::string, Compiled> m;
  return m;
}
}  // namespace

// Called by each generated file (doc_blocks.cpp) before main().
// `blocks` counts the ```cpp blocks the generator found; the functions are the statement blocks
// and the renamed main()s, referenced here so that the linker resolves everything they call.
void add(const char* doc, int blocks, std::vector<void (*)()> statements,
         std::vector<int (*)()> mains) {
  Compiled& c = compiled()[doc];
  c.blocks += static_cast<size_t>(blocks);
  for (auto* f : statements) c.linked += f != nullptr;
  for (auto* f : mains) c.linked += f != nullptr;
}
}  // namespace duet_docs

namespace {
size_t cpp_blocks(const std::filesystem::path& path) {
  std::ifstream in(path);
  size_t n = 0;
  bool inside = false;
  for (std::string l; std::getline(in, l);) {
    size_t b = l.find_first_not_of(" \t");
    if (b == std::string::npos || l.compare(b, 3, "```") != 0) continue;
    if (!inside && l.compare(b, 6, "```cpp") == 0) ++n;
    inside = !inside;
  }
  return n;
}
}  // namespace

TEST_CASE("every ```cpp block of the README and docs/ is compiled") {
  namespace fs = std::filesystem;
  const fs::path src = DUET_SOURCE_DIR;
  std::vector<fs::path> docs{src / "README.md"};
  for (const auto& e : fs::directory_iterator(src / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  size_t total = 0;
  for (const fs::path& p : docs) {
    const std::string shown = fs::relative(p, src).string();
    const size_t want = cpp_blocks(p);
    const auto it = duet_docs::compiled().find(shown);
    const size_t got = it == duet_docs::compiled().end() ? 0 : it->second.blocks;
    INFO(shown, ": ", want, " ```cpp blocks in the file, ", got, " compiled");
    CHECK(got == want);
    if (it != duet_docs::compiled().end()) CHECK(it->second.linked <= it->second.blocks);
    total += got;
  }
  MESSAGE(total, " C++ blocks compiled from ", docs.size(), " markdown files");
  CHECK(total > 0);
}
