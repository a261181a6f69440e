// duet tests: the samples of the elementwise gradient sweeps, shared by the eager sweep
// (test_op_grads.cpp) and the compiled one (test_compile_sweep.cpp).
#pragma once

#include <string>
#include <vector>

#include "op_rows.h"

namespace duet::test {

// How a leaf becomes the op's input inside the checked function (so the view is differentiated
// too): expanded from a smaller shape, transposed, or every other row of a taller leaf.
enum class Inside { None, Expand, Transpose, Slice };

struct GradSample {
  const char* name;
  int min_arity;
  std::vector<Shape> shapes;  ///< what the op sees
  std::vector<Layout> layouts = {Layout::Contiguous, Layout::Contiguous, Layout::Contiguous};
  std::vector<Inside> inside = {Inside::None, Inside::None, Inside::None};
  std::vector<Shape> small = {{}, {}, {}};  ///< the leaves' shapes for Inside::Expand
};

/// Samples with elements: 0-d, broadcast, strided leaves, views inside.
const std::vector<GradSample>& grad_samples();
/// Samples with zero elements.
const std::vector<GradSample>& empty_samples();
/// The shape of leaf i, before take() turns it into the op's input.
Shape leaf_shape(const GradSample& s, int i);
/// Where a row's gradient is checked: its grad_domains, else its domains.
const std::vector<Domain>& grad_domains(const ElementwiseRow& row);
/// Leaf i as the op's input (expanded, transposed or sliced, as the sample says).
Tensor take(const Tensor& t, const GradSample& s, int i);

/// Which of k leaves require grad, check by check: all of them, then, when k > 1, each one alone
/// with the others detached into constants. The engine asks a rule only for the gradients of
/// inputs that require grad (needs_grad(i)) and rules branch on it (cat's slice offsets, matmul's
/// layout of b's gradient, where's and scatter_add's skipped condition and index), so a rule
/// whose gradient for one input depends on which others need one (an offset advanced only past
/// inputs that need a gradient) passes with every input and fails with one alone.
std::vector<std::vector<bool>> requires_grad_patterns(size_t k);
/// Whether a pattern has every leaf requiring grad.
bool every(const std::vector<bool>& pattern);
/// The pattern in words, for test messages.
std::string pattern_name(const std::vector<bool>& pattern);
/// The leaves with those outside the pattern detached (constants over the same storage).
std::vector<Tensor> masked(const std::vector<Tensor>& leaves, const std::vector<bool>& pattern);

}  // namespace duet::test
