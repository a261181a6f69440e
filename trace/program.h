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
#include "trace/graph.h"

namespace duet {

/// A graph input of a Program, fed by name at run(). Only inside a Program builder. A floating
/// placeholder requires grad, so grad() may target it.
Tensor placeholder(Shape shape, DType dtype, std::string name);
/// Names the node that computes t, so that Program::run can fetch it; returns t. Outside a
/// trace it does nothing.
Tensor name(Tensor t, std::string name);

class Program {
 public:
  explicit Program(std::function<std::vector<Tensor>()> build);
  ~Program();
  /// Runs the graph. Without a fetch list: the builder's outputs, in order. With one: exactly
  /// those nodes, in order (placeholder names, names given by name(), or "out0", "out1", ...).
  /// Every placeholder the fetched nodes depend on must be fed, with its shape and dtype.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds,
                          const std::vector<std::string>& fetch = {});
  /// The traced graph, before optimization.
  const Graph& graph() const;
  /// The names that can be fetched.
  std::vector<std::string> names() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace duet
