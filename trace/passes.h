// duet: graph passes. Each is a named function from a graph to an equivalent graph, and each can
// be switched off with CompileOptions::disable_passes, so the benchmark shows what each buys.
//
//   dce       removes nodes that no output or write-back needs
//   cse       merges nodes with the same op, attributes and inputs
//   fold      evaluates ops whose inputs are all constants (small results only)
//   simplify  algebraic identities: x*1, x/1, x+0, x-0, -(-x), where(c, x, x), permutes and
//             reshapes of permutes and reshapes, identity expand/permute/reshape/cast, clone of a
//             fresh value, and casts, copies and expands of a filled constant
//
// Every pass keeps graph inputs (their slots are the calling convention) and value metadata.
#pragma once

#include <string>
#include <vector>

#include "trace/graph.h"

namespace duet::detail {

Graph dce(const Graph& g);
Graph cse(const Graph& g);
Graph fold(const Graph& g);
Graph simplify(const Graph& g);

/// The standard pipeline, skipping the passes named in `disabled`. Unknown names are an Error
/// listing the known ones.
Graph optimize(const Graph& g, const std::vector<std::string>& disabled);

/// Checks pass names ("dce", "cse", "fold", "simplify", and the later "fuse", "plan_memory",
/// "parallel").
void check_pass_names(const std::vector<std::string>& names);

}  // namespace duet::detail
