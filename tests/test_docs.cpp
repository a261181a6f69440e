// duet tests: the code blocks of the README and docs/ compile (Note [Compiled doc blocks] in
// doc_blocks.cpp). The build compiles and links them; this test checks that every ```cpp block
// in the source tree is one that was compiled, so a doc added or edited without a rebuild fails.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "util.h"

namespace duet_docs {
struct Run {
  int line;
  void (*fn)();
  const char* not_run;
};
namespace {
struct Compiled {
  size_t blocks = 0, linked = 0;
  std::vector<Run> runs;
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
         std::vector<int (*)()> mains, std::vector<Run> runs) {
  Compiled& c = compiled()[doc];
  c.blocks += static_cast<size_t>(blocks);
  c.runs.insert(c.runs.end(), runs.begin(), runs.end());
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

TEST_CASE("every ```cpp block with a compiled-with prelude runs without an error") {
  // Statement blocks with a hidden prelude are complete examples: each runs here, in the order
  // of its file, and an example that throws fails with its file and line. Those marked
  // `// not run:` say why.
  // In a folder of their own: the examples write files (mlp.onnx, saved programs).
  namespace fs = std::filesystem;
  const fs::path here = fs::current_path();
  const fs::path dir = fs::temp_directory_path() / ("duet_docs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::current_path(dir);
  size_t ran = 0;
  for (const auto& [doc, c] : duet_docs::compiled()) {
    for (const duet_docs::Run& r : c.runs) {
      const std::string where = doc + ":" + std::to_string(r.line);
      if (r.not_run && *r.not_run) {
        MESSAGE(where, " not run: ", std::string(r.not_run));
        continue;
      }
      duet::manual_seed(0);
      try {
        r.fn();
        ++ran;
      } catch (const std::exception& e) {
        FAIL_CHECK(where, ": the example threw: ", std::string(e.what()));
      }
    }
  }
  fs::current_path(here);
  fs::remove_all(dir);
  MESSAGE(ran, " doc examples ran");
  CHECK(ran > 0);
}
