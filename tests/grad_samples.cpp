#include "grad_samples.h"

#include <algorithm>

namespace duet::test {
namespace {
using L = Layout;
const std::vector<Layout> kC3 = {L::Contiguous, L::Contiguous, L::Contiguous};
constexpr Inside E = Inside::Expand, T = Inside::Transpose, S = Inside::Slice, N = Inside::None;

}  // namespace

const std::vector<GradSample>& grad_samples() {
  static const std::vector<GradSample> s = {
      {"0-d", 1, {{}, {}, {}}},
      {"(3, 4)", 1, {{3, 4}, {3, 4}, {3, 4}}},
      {"broadcast (3,1) (1,4) (4)", 2, {{3, 1}, {1, 4}, {4}}},
      {"broadcast () (2,3) (1,3)", 2, {{}, {2, 3}, {1, 3}}},
      {"transposed leaves",
       1,
       {{3, 4}, {3, 4}, {3, 4}},
       {L::Transposed, L::Transposed, L::Transposed}},
      {"strided and offset leaves",
       1,
       {{3, 4}, {3, 4}, {3, 4}},
       {L::Strided, L::Offset, L::Strided}},
      {"expanded inside", 1, {{3, 4}, {3, 4}, {3, 4}}, kC3, {E, E, E}, {{1, 4}, {3, 1}, {}}},
      {"transposed and sliced inside", 1, {{2, 3}, {2, 3}, {2, 3}}, kC3, {T, S, T}},
  };
  return s;
}

const std::vector<GradSample>& empty_samples() {
  static const std::vector<GradSample> s = {
      {"empty", 1, {{2, 0, 3}, {2, 0, 3}, {2, 0, 3}}},
      {"broadcast to empty", 2, {{5, 4}, {0, 1, 4}, {4}}},
      {"expanded to empty inside", 1, {{0, 4}, {0, 4}, {0, 4}}, kC3, {E, E, N}, {{1, 4}, {0, 1}}},
  };
  return s;
}

Shape leaf_shape(const GradSample& s, int i) {
  Shape sh = s.shapes[i];
  if (s.inside[i] == Inside::Expand) return s.small[i];
  if (s.inside[i] == Inside::Transpose) std::swap(sh[sh.size() - 1], sh[sh.size() - 2]);
  if (s.inside[i] == Inside::Slice) sh[0] *= 2;
  return sh;
}

Tensor take(const Tensor& t, const GradSample& s, int i) {
  switch (s.inside[i]) {
    case Inside::Expand:
      return expand(t, s.shapes[i]);
    case Inside::Transpose:
      return transpose(t, -1, -2);
    case Inside::Slice:
      return slice(t, 0, 1, t.size(0), 2);
    default:
      return t;
  }
}

const std::vector<Domain>& grad_domains(const ElementwiseRow& row) {
  return row.grad_domains.empty() ? row.domains : row.grad_domains;
}

std::vector<std::vector<bool>> requires_grad_patterns(size_t k) {
  std::vector<std::vector<bool>> p = {std::vector<bool>(k, true)};
  for (size_t i = 0; k > 1 && i < k; ++i) {
    p.emplace_back(k, false);
    p.back()[i] = true;
  }
  return p;
}

bool every(const std::vector<bool>& pattern) {
  return std::find(pattern.begin(), pattern.end(), false) == pattern.end();
}

std::string pattern_name(const std::vector<bool>& pattern) {
  if (every(pattern)) return "every input requires grad";
  const auto i = std::find(pattern.begin(), pattern.end(), true) - pattern.begin();
  return fmt::format("only input {} of {} requires grad, the others are constants", i,
                     pattern.size());
}

std::vector<Tensor> masked(const std::vector<Tensor>& leaves, const std::vector<bool>& pattern) {
  std::vector<Tensor> x;
  for (size_t i = 0; i < leaves.size(); ++i)
    x.push_back(pattern[i] ? leaves[i] : leaves[i].detach());
  return x;
}

}  // namespace duet::test
