// duet: the shadow-eager check (docs/debugging.md, "Eager and compiled disagree").
//
// check_against_eager(f, args...) runs a compiled function and its eager twin on the same
// inputs and state, compares what they produce, and when they differ finds the pass and the
// node that made the difference.
//
// Note [Shadow-eager check]
// 1. A fresh compiled core with f's options traces f for the arguments (f's own cache and
//    statistics are never touched). The trace names every tensor the function captures:
//    parameters, their .grad buffers, optimizer state, the random generator's {seed, offset}.
//    Their values, the arguments' values and each captured leaf's .grad (which buffer, or none)
//    are saved, and restored before every run below and at the end: neither run changes the
//    caller's state.
// 2. The eager twin runs the function on the real tensors. The compiled function runs three
//    times from the same state: its first run (fused kernels on the interpreter), its second
//    (generated code, which the check waits for; on a CUDA device the run captured as a CUDA
//    graph) and its third (the graph replayed). While the check runs, the process-wide codegen
//    threshold is 0, so that the second run has generated code. Each run's results, and the
//    captured tensors and .grad buffers after it, are compared with eager's, element by element:
//    |compiled - eager| <= atol + rtol * |eager|, NaN equal to NaN (default_tolerance()).
// 3. On a difference, the passes are switched on one at a time in pipeline order
//    (pipeline_passes() in trace/ir/passes.h, those the options disable staying off), each
//    configuration traced and run afresh. The first configuration that differs from eager names
//    the pass. When the function differs with every pass off, no pass is to blame: the trace
//    itself differs from the eager run (a C++ value read at trace time, state the trace does not
//    see, a kernel's own rounding).
// 4. The node: the traced graph is planned twice, with and without that pass, with every value
//    it computes kept as a result, and run on the same inputs. The first value in program
//    order that differs is the node the pass broke: its op, call site and scope go into the
//    report with the largest difference and where it is.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace duet {

/// |actual - expected| <= atol + rtol * |expected|, element by element.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
};
/// The check's tolerance for a dtype: f64 1e-7 and 1e-7 (rtol and atol), f32 1e-5 and 1e-5,
/// f16 1e-3 and 1e-5, bf16 1.6e-2 and 1e-5; integers and bool compare exactly. Fused kernels
/// may sum in another order than eager kernels do, so float results differ in their last bits.
Tolerance default_tolerance(DType dtype);

struct CheckOptions {
  /// Per dtype, a tolerance that replaces the default.
  std::map<DType, Tolerance> tolerances;
  /// Throw a MismatchError whose message is the report, instead of returning it.
  bool throw_on_mismatch = false;
  /// On a difference, find the pass and the node (a trace, plan and run per pass).
  bool bisect = true;
};

/// Where two tensors differ most.
struct CheckDifference {
  std::string value;       ///< what was compared: "result 0", "captured tensor 2 ..."
  std::string shape;       ///< "f32 (4, 8)"
  int64_t mismatched = 0;  ///< elements outside the tolerance (0: a shape or dtype differs)
  int64_t numel = 0;
  double max_abs_diff = 0;     ///< the largest |actual - expected|
  std::vector<int64_t> where;  ///< its index
  double expected = 0;         ///< eager's (or the reference plan's) value there
  double actual = 0;           ///< the compiled function's value there
  std::string expected_from = "eager", actual_from = "compiled";  ///< for str()
  Tolerance tolerance;
  std::string detail;  ///< what else differs ("the compiled run raised: ...")
  std::string str() const;
};

/// What check_against_eager found. Prints in words with str().
struct CheckReport {
  bool ok = true;
  std::string function;         ///< "compiled function at model.cpp:12"
  int64_t values_compared = 0;  ///< tensors compared per run (results, state after the call)
  int runs = 0;                 ///< compiled runs compared
  /// The first value that differs from eager (when !ok), and the run that showed it (1-3).
  CheckDifference difference;
  int run = 0;
  /// The pass that introduced the difference, or "" when the function differs from eager with
  /// every pass off (or no configuration reproduced it: see bisection).
  std::string pass;
  /// The bisection, a line per configuration: "fold, simplify: same as eager".
  std::vector<std::string> bisection;
  /// The bisection's finding in words: the pass, or why none is to blame.
  std::string cause;
  /// The first traced node whose value differs: -1 when not found.
  int32_t node = -1;
  std::string node_text;            ///< its line of Graph::str()
  std::string op;                   ///< its op ("neg")
  std::string site;                 ///< its call site ("model.cpp:31"), or ""
  std::string scope;                ///< its scope ("mlp/fc1"), or ""
  CheckDifference node_difference;  ///< the node's value with the pass against without it
  std::string str() const;
};

namespace detail {
struct FlatArgs;
using TraceFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
}  // namespace detail

struct CompileOptions;

namespace detail {
/// The check of Note [Shadow-eager check]: `fn` traced and compiled with `options`, against
/// `fn` run eagerly, on `args`.
CheckReport check_against_eager(const CompileOptions& options, const std::string& label,
                                const FlatArgs& args, const TraceFn& fn, const CheckOptions& check);
}  // namespace detail

}  // namespace duet
