// duet: ONNX models out and in (docs/onnx.md, docs/deploy.md). export_onnx writes a traced graph
// as an ONNX model of opset 17, checked by the ONNX checker with full checking and shape
// inference; import_onnx reads an ONNX model into a Program that runs eagerly (each node one duet
// op, on the tape, so gradients reach the model's initializers) or compiled (traced once per
// input signature, as duet::compile). Both need duet built with Debian's libonnx-dev; without it
// they raise an Error that says so.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trace/compile.h"
#include "trace/program.h"

namespace duet {

struct OnnxExportOptions {
  /// The opset of the default domain the model declares. 17 is the newest opset Debian's ONNX
  /// 1.12 checker knows; it is also the only one accepted.
  int opset = 17;
  /// {argument index, dim}: dims exported as named dims (dim_param), so that the model runs at
  /// other sizes of them. A compiled function's own symbolic dims (CompileOptions::dynamic, or
  /// dims that changed between calls) are exported the same way. Every other dim is fixed.
  std::vector<std::pair<int, int>> dynamic{};
  /// Names of the graph's inputs and outputs, in order; the defaults are the program's own
  /// ("arg0", ..., "out0", ...).
  std::vector<std::string> input_names{}, output_names{};
  /// The dim_param of each symbol ("s0" -> "batch"); a symbol not named here keeps "s0", ...
  std::map<std::string, std::string> dim_names{};
  /// Names for captured tensors (a module's named_parameters()): the initializer of a tensor
  /// listed here takes its name; others are "captured0", ... (a Program's own names first).
  std::vector<std::pair<std::string, Tensor>> parameter_names{};
  /// Stored in the model's doc_string.
  std::string doc{};
};

/// Writes program p as an ONNX model: its graph with its captured values as initializers, its
/// saved symbolic dims as dim_params. Control flow (cond, scan, while_loop) becomes If, Scan and
/// Loop. An op with no ONNX form (a collective, a print, a random draw) raises a ValueError
/// naming it. The model is checked (onnx::checker, full check, strict shape inference) before it
/// is written.
void export_onnx(const Program& p, const std::string& path, const OnnxExportOptions& options = {});

namespace detail {
/// export_onnx of a compiled function (trace/onnx/onnx_export.cpp): traced as duet::save traces it.
void export_onnx_compiled(const CompileOptions& options, const std::string& label,
                          const FlatArgs& args, const TraceFn& fn, const std::string& path,
                          const OnnxExportOptions& onnx_options);
}  // namespace detail

/// Writes the compiled function f, traced for the signature of its example arguments, as an ONNX
/// model (the forward computation, as duet::save writes it). Dims that f holds symbolic, and
/// the dims options.dynamic names, become dim_params.
template <class F, class... A>
void export_onnx(Compiled<F>& f, const std::string& path, const OnnxExportOptions& options,
                 A&&... example_args) {
  f.with_flat_args(
      [&](const detail::FlatArgs& flat, const detail::TraceFn& run) {
        detail::export_onnx_compiled(f.options(), f.label(), flat, run, path, options);
        return 0;
      },
      std::forward<A>(example_args)...);
}

struct OnnxImportOptions {
  /// How the Program's compiled calls trace (CompileOptions): dims the model declares with a
  /// dim_param are not made symbolic by themselves; name them here to trace them symbolic.
  CompileOptions compile{};
  /// Floating initializers become parameters that require grad (Program::named_parameters), so
  /// that an imported model can be fine-tuned; those that only BatchNormalization's statistics
  /// inputs (mean, var) read stay constants, as a module's running statistics are buffers
  /// (Program::named_buffers). Off: every initializer is a constant.
  bool trainable = true;
};

/// Reads an ONNX model (any opset from 7 to 22 of the default domain) into a Program. Its inputs
/// are the graph inputs that are not initializers, named as in the model; its outputs are the
/// graph outputs. Calling it (Program::operator(), Program::run) runs compiled; Program::eager
/// runs it node by node. A node whose op has no mapping raises a ValueError naming the op, the
/// node and the opset; a tensor of an element type duet has no dtype for (int8, uint8, string,
/// ...), and a sequence or optional (a graph input or output, or an op such as SplitToSequence
/// or OptionalHasElement), raises a DTypeError naming it. Tensors kept in external data files
/// are read from the model's folder (Note [External data] in trace/onnx/onnx_external.cpp).
Program import_onnx(const std::string& path, const OnnxImportOptions& options = {});

}  // namespace duet
