// duet: define-and-run, TensorFlow 1.x style (docs/design.md, "Define-and-run"). A Program
// traces its builder once, at construction, with the same tracer compile() uses: placeholders
// are traced graph inputs, and grad() inside the builder records the backward like any other
// ops. run() plans the graph once per fetch list and replays it on the feeds.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "trace/ir/graph.h"

namespace duet {

/// A graph input of a Program, fed by name at run(). Only inside a Program builder. A floating
/// placeholder requires grad, so grad() may target it.
Tensor placeholder(Shape shape, DType dtype, std::string name);
/// Names the node that computes t, so that Program::run can fetch it; returns t. Outside a
/// trace it does nothing.
Tensor name(Tensor t, std::string name);

class Program;
struct CompileOptions;
namespace detail {
/// A Program that is a function of its inputs rather than one traced graph (import_onnx): fn
/// runs eagerly, or compiled through a CompiledCore with `options` (one trace per signature).
struct FunctionProgram {
  std::string label;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn;
  std::vector<std::string> inputs, outputs;
  std::vector<std::pair<std::string, Tensor>> parameters;
  /// Moves what fn reads (its parameters and constants) to a device (Program::to); it returns
  /// the moved parameters.
  std::function<std::vector<std::pair<std::string, Tensor>>(Device)> to;
  /// The state fn reads that is not trained (Program::named_buffers), as it is now; may be empty.
  std::function<std::vector<std::pair<std::string, Tensor>>()> buffers;
};
Program make_function_program(FunctionProgram f, const CompileOptions& options);
/// Whether p is a function program (import_onnx) rather than one traced or loaded graph.
bool is_function_program(const Program& p);
}  // namespace detail

class Program {
 public:
  explicit Program(std::function<std::vector<Tensor>()> build);
  ~Program();
  /// Runs the graph. Without a fetch list: the builder's outputs, in order. With one: exactly
  /// those nodes, in order (placeholder names, names given by name(), or "out0", "out1", ...).
  /// Every placeholder the fetched nodes depend on must be fed, with its shape and dtype.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds,
                          const std::vector<std::string>& fetch = {});
  /// Runs the program on its inputs (input_names() order) node by node, eagerly: every op on
  /// the tape, so backward() reaches inputs and parameters that require grad. Only a program
  /// that is a function of its inputs (import_onnx) has an eager face; a traced or loaded one
  /// raises a ValueError.
  std::vector<Tensor> eager(const std::vector<Tensor>& inputs);
  /// The traced graph, before optimization (an imported program's: that of its most recent
  /// compiled trace).
  const Graph& graph() const;
  /// The names that can be fetched.
  std::vector<std::string> names() const;
  /// The inputs a run is fed, in order: placeholder names, or a loaded function's arguments
  /// ("arg0", "arg1", ...).
  std::vector<std::string> input_names() const;
  /// Runs the program on its inputs in input_names() order; returns every output.
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  /// The outputs a run without a fetch list returns, in order ("out0", ..., and a loaded
  /// function's probes).
  std::vector<std::string> output_names() const;
  /// Moves the program to a device: its graph's values, its captured tensors (named_parameters
  /// then returns the moved copies) and the inputs it expects. A program that prints stays on
  /// the device it was traced on.
  Program& to(Device device);
  /// The tensors the graph captured (parameters, buffers, optimizer state), by name: a loaded
  /// program's own values, which a run reads and, for a training step, updates.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  /// An imported program's state that gradients do not train, by name: its batch norms' running
  /// statistics (import_onnx). None for a traced or loaded program, whose named_parameters()
  /// holds every tensor it captured.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;

  Program(Program&&) noexcept;
  Program& operator=(Program&&) noexcept;

 private:
  struct State;
  Program();
  std::vector<Tensor> run_function(const std::map<std::string, Tensor>& feeds,
                                   const std::vector<std::string>& fetch);
  friend Program load(const std::string& path);
  friend Program detail::make_function_program(detail::FunctionProgram f,
                                               const CompileOptions& options);
  friend bool detail::is_function_program(const Program& p);
  std::unique_ptr<State> s_;
};

/// Reads a program that duet::save wrote: a Program that needs none of the code that made it.
/// It runs on the interpreter where no generated kernel is cached, checks each call's inputs
/// against the saved signature (dims saved symbolic take any size that keeps the saved guards)
/// and says in words what does not fit. A file that is not a program, truncated, corrupt or
/// from a newer format raises a ValueError saying which (Note [Program files] in
/// trace/serialize.h).
Program load(const std::string& path);

}  // namespace duet
