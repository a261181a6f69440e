// duet tests: the samples of the elementwise gradient sweeps, shared by the eager sweep
// (test_op_grads.cpp) and the compiled one (test_compile_sweep.cpp).
#pragma once

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

}  // namespace duet::test
