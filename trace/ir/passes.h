// duet: graph passes. Each is a named function from a graph to an equivalent graph, and each can
// be switched off with CompileOptions::disable_passes, so the benchmark shows what each buys.
//
//   dce       removes nodes that no output or write-back needs
//   cse       merges nodes with the same op, attributes and inputs
//   fold      evaluates ops whose inputs are all constants (small results only)
//   simplify  algebraic identities: x*1, x/1, x+0, x-0, -(-x), where(c, x, x), permutes and
//             reshapes of permutes and reshapes, identity expand/permute/reshape/cast, clone of a
//             fresh value, and casts, copies and expands of a filled constant
//   remat     a backward recomputes cheap elementwise values from what it saves anyway
//             (Note [Rematerialization] in trace/ir/remat.cpp)
//
// Every pass keeps graph inputs (their slots are the calling convention) and value metadata.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "trace/ir/graph.h"

namespace duet::detail {

struct FusionGroup;

/// The bytes of a node's value.
inline int64_t value_bytes(const GraphNode& n) {
  return n.meta.shape.numel() * int64_t(itemsize(n.meta.dtype));
}
/// Whether a fused kernel can take the op (an elementwise op or a reduction, without effect):
/// what the remat and duplicate passes count on to absorb a recomputation.
inline bool fused_kernel_takes(const GraphNode& n) {
  return n.kind == NodeKind::Op && !has_effect(n) &&
         (op_class(n.op) == OpClass::Elementwise || op_class(n.op) == OpClass::Reduction);
}

Graph dce(const Graph& g);
Graph cse(const Graph& g);
Graph fold(const Graph& g);
Graph simplify(const Graph& g);
Graph remat(const Graph& g);
/// Producer duplication (Note [Duplicated producers] in trace/ir/duplicate.cpp).
Graph duplicate(const Graph& g);
/// remat, with these ops (not elementwise: products, reductions) recomputable too, and each
/// named in Graph::remat.forced (CompileOptions::memory_budget).
Graph remat_forced(const Graph& g, const std::vector<int32_t>& forced);
/// The forward ops whose recomputation would lower what the backward keeps from the forward
/// (beyond `forced`), cheapest per byte first.
std::vector<int32_t> remat_candidates(const Graph& g, const std::vector<int32_t>& forced);

/// The standard pipeline, skipping the passes named in `disabled`. Unknown names are an Error
/// listing the known ones.
Graph optimize(const Graph& g, const std::vector<std::string>& disabled);

/// Checks pass names: the standard ones (pipeline_passes()) and the registered ones.
void check_pass_names(const std::vector<std::string>& names);

// Note [Registered passes]
// Code outside the pipeline can add a pass to it: a graph pass (a function from a graph to an
// equivalent graph, run after the standard graph passes, in the order registered) or a fusion
// pass (a function that rewrites the fusion groups a plan found, before their kernels are
// built). A registered pass has a name, is switched off by CompileOptions::disable_passes like
// any other, and takes part in check_against_eager's bisection. It applies to plans built
// after it is registered. The testing library (tests/testing/) registers deliberately broken
// passes this way, to prove that the shadow-eager check names them.
struct RegisteredPass {
  std::string name;
  std::function<Graph(const Graph&)> graph;                             ///< a graph pass, or
  std::function<void(const Graph&, std::vector<FusionGroup>&)> fusion;  ///< a fusion pass
};
/// Adds a pass; a name already in the pipeline is a ValueError.
void register_pass(RegisteredPass pass);
/// Removes a registered pass (nothing when none has that name).
void unregister_pass(const std::string& name);
/// The registered passes, in order (a copy).
std::vector<RegisteredPass> registered_passes();
/// Every pass of the pipeline in the order it runs: the graph passes (fold, simplify, cse,
/// dce, remat), registered graph passes, fuse, registered fusion passes, codegen, plan_memory,
/// hoist, parallel and cuda_graph.
std::vector<std::string> pipeline_passes();

}  // namespace duet::detail
