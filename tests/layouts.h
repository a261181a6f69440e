// duet tests: the input layouts of the elementwise sweeps (0-d, empty, broadcast, offset,
// transposed, strided, expanded, large), one table shared by the eager sweep (test_ops.cpp), the
// compiled sweep (test_compile_sweep.cpp) and the CUDA sweep (test_cuda_ops.cpp). Each sample
// says which of the sweeps run it, and build() makes a row's inputs from it.
#pragma once

#include <string>
#include <vector>

#include "op_rows.h"

namespace duet::test {

/// The sweeps that run the samples of this table, a bit each.
enum Sweep : unsigned {
  kEagerSweep = 1u << 0,     ///< test_ops.cpp: eager against the float64 reference
  kCompiledSweep = 1u << 1,  ///< test_compile_sweep.cpp: compiled against eager
  kCudaSweep = 1u << 2,      ///< test_cuda_ops.cpp: CUDA against the CPU
};

/// One way to build the inputs of an elementwise row. Shapes and layouts are per input (the
/// first `arity` are used); with `small`, inputs are made at those shapes, then expanded to
/// `shapes` (stride-0 views).
struct Sample {
  const char* name;
  unsigned sweeps;  ///< the Sweep bits of the sweeps that run it
  int min_arity;
  std::vector<Shape> shapes;
  std::vector<Layout> layouts = {Layout::Contiguous, Layout::Contiguous, Layout::Contiguous};
  std::vector<Shape> small = {};
};

/// The samples that `sweep` runs, in the table's order.
const std::vector<Sample>& samples(Sweep sweep);
/// The sample called `name` (fails the test case when there is none).
const Sample& sample(const std::string& name);

/// Whether a sweep runs an input of `elements` elements at the k-th dtype (or dtype pair) it tries
/// for a row. Every dtype runs, except where DUET_LARGE_SAMPLE_DTYPES=n (the sanitized suite sets
/// 2): a large input, above the kernels' parallel threshold (2 x kernels::kParallelGrain), then
/// runs at the first n only. Its threaded walks are the same code at every dtype; the Release
/// suite runs them all.
bool runs_large(int64_t elements, size_t k);
/// The same for a sample, by its largest input.
bool runs_large(const Sample& s, size_t k);

/// One layout of a conversion row's input (cast, copy): with `small`, the input is made at that
/// shape, then expanded to `shape`.
struct ConversionCase {
  const char* name;
  Shape shape;
  Layout layout;
  Shape small = {};
};
/// The layouts of the conversion sweeps: eager (test_ops.cpp) also runs a large transposed
/// input, the compiled sweep (test_compile_sweep.cpp) the others only.
std::vector<ConversionCase> conversion_cases(Sweep sweep);

/// A row's inputs and their logical values, broadcast to the input's shape.
struct Built {
  std::vector<Tensor> in;
  std::vector<std::vector<double>> vals;
  std::vector<Shape> shapes;
};

/// The inputs of `row` for sample `s`: dts holds the dtype of each value input (one for all, or
/// one per input); a where's condition is b8.
Built build(const ElementwiseRow& row, const std::vector<DType>& dts, const Sample& s, Rng& rng);

}  // namespace duet::test
