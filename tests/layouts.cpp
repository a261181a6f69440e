#include "layouts.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>

namespace duet::test {
namespace {

using L = Layout;
// Who runs a sample: E the eager sweep, C the compiled sweep, U the CUDA sweep.
constexpr unsigned E = kEagerSweep, C = kCompiledSweep, U = kCudaSweep, All = E | C | U;

const std::vector<Sample>& table() {
  // Odd sizes (a vector tail and misaligned rows), large enough to cross the kernels' parallel
  // threshold (2 x 32768 elements).
  const Shape big{300, 257};
  static const std::vector<Sample> s = {
      {"0-d", All, 1, {{}, {}, {}}},
      {"empty", All, 1, {{2, 0, 3}, {2, 0, 3}, {2, 0, 3}}},
      {"normal", All, 1, {{3, 5}, {3, 5}, {3, 5}}},
      {"rank 3", All, 1, {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}},
      {"broadcast (3,1) (1,4) (4)", All, 2, {{3, 1}, {1, 4}, {4}}},
      {"broadcast (4) (2,3,4) ()", E | U, 2, {{4}, {2, 3, 4}, {}}},
      {"broadcast () (3,4) (1,4)", All, 2, {{}, {3, 4}, {1, 4}}},
      {"broadcast (2,1,3) (4,1) (3)", E | C, 2, {{2, 1, 3}, {4, 1}, {3}}},
      {"broadcast to empty", All, 2, {{5, 4}, {0, 1, 4}, {4}}},
      {"0-d at an offset", E | C, 1, {{}, {}, {}}, {L::Offset, L::Offset, L::Offset}},
      {"offset", All, 1, {{3, 5}, {3, 5}, {3, 5}}, {L::Offset, L::Contiguous, L::Offset}},
      {"transposed",
       All,
       1,
       {{4, 5}, {4, 5}, {4, 5}},
       {L::Transposed, L::Transposed, L::Transposed}},
      {"strided", All, 1, {{4, 5}, {4, 5}, {4, 5}}, {L::Strided, L::Strided, L::Strided}},
      {"mixed layouts",
       All,
       1,
       {{4, 5}, {4, 5}, {4, 5}},
       {L::Transposed, L::Contiguous, L::Strided}},
      {"expanded",
       All,
       1,
       {{4, 5}, {4, 5}, {4, 5}},
       {L::Contiguous, L::Contiguous, L::Contiguous},
       {{1, 5}, {4, 1}, {1, 1}}},
      {"expanded transposed",
       E | C,
       1,
       {{3, 4, 5}, {3, 4, 5}, {3, 4, 5}},
       {L::Transposed, L::Strided, L::Transposed},
       {{4, 5}, {1, 4, 5}, {3, 4, 1}}},
      {"rank 6 transposed",
       U,
       1,
       {{2, 1, 3, 2, 3, 4}, {2, 1, 3, 2, 3, 4}, {2, 1, 3, 2, 3, 4}},
       {L::Transposed, L::Strided, L::Transposed}},
      {"big", E | U, 1, {big, big, big}},
      {"big offset", E | U, 1, {big, big, big}, {L::Offset, L::Offset, L::Contiguous}},
      {"big strided", All, 1, {big, big, big}, {L::Transposed, L::Strided, L::Transposed}},
      {"big broadcast", E | U, 2, {big, {257}, {300, 1}}},
      {"big row broadcast", E, 2, {{257}, big, big}, {L::Contiguous, L::Transposed, L::Contiguous}},
  };
  return s;
}

}  // namespace

const std::vector<Sample>& samples(Sweep sweep) {
  static const std::map<unsigned, std::vector<Sample>> by_sweep = [] {
    std::map<unsigned, std::vector<Sample>> m;
    for (unsigned sw : {E, C, U})
      for (const Sample& s : table())
        if (s.sweeps & sw) m[sw].push_back(s);
    return m;
  }();
  return by_sweep.at(sweep);
}

const Sample& sample(const std::string& name) {
  for (const Sample& s : table())
    if (name == s.name) return s;
  FAIL("no sample " << name);
  return table()[0];
}

bool runs_large(int64_t elements, size_t k) {
  // Twice kernels::kParallelGrain (kernels/loops.h, not included here: it needs OpenMP's header).
  constexpr int64_t kLarge = 2 * 32768;
  static const int64_t first = [] {
    const char* env = std::getenv("DUET_LARGE_SAMPLE_DTYPES");
    return env && *env ? std::atoll(env) : std::numeric_limits<int64_t>::max();
  }();
  return elements <= kLarge || static_cast<int64_t>(k) < first;
}

bool runs_large(const Sample& s, size_t k) {
  int64_t n = 0;
  for (const Shape& shape : s.shapes) n = std::max(n, shape.numel());
  return runs_large(n, k);
}

Built build(const ElementwiseRow& row, const std::vector<DType>& dts, const Sample& s, Rng& rng) {
  Built b;
  for (int i = 0; i < row.arity; ++i) {
    const size_t k = static_cast<size_t>(row.cond_first ? i - 1 : i);
    const DType di = row.cond_first && i == 0 ? DType::b8 : dts[std::min(k, dts.size() - 1)];
    const Shape& made = s.small.empty() ? s.shapes[i] : s.small[i];
    std::vector<double> v = random_values(made.numel(), row.domains[i], di, rng);
    b.in.push_back(make_sample(v, made, s.shapes[i], di, s.layouts[i]));
    b.vals.push_back(std::move(v));
    b.shapes.push_back(s.shapes[i]);
  }
  return b;
}

std::vector<ConversionCase> conversion_cases(Sweep sweep) {
  using L = Layout;
  std::vector<ConversionCase> cases = {
      {"0-d", {}, L::Contiguous},
      {"empty", {0, 3}, L::Contiguous},
      {"normal", {3, 4}, L::Contiguous},
      {"transposed", {3, 4}, L::Transposed},
      {"strided", {3, 4}, L::Strided},
      {"offset", {3, 4}, L::Offset},
      {"expanded", {3, 4}, L::Contiguous, {1, 4}},
  };
  if (sweep == kEagerSweep) cases.push_back({"big transposed", {300, 257}, L::Transposed});
  return cases;
}

}  // namespace duet::test
