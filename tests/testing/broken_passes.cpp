#include "broken_passes.h"

#include <utility>

#include "core/error.h"
#include "trace/plan/fusion.h"
#include "trace/ir/passes.h"

namespace duet::testing {
namespace {

Graph drop_negation(const Graph& g) {
  Graph r = g;
  for (GraphNode& n : r.nodes)
    if (n.kind == NodeKind::Op && n.op == OpId::Neg && is_floating(n.meta.dtype)) {
      n.op = OpId::Copy;
      n.attrs = Attrs{};
      break;
    }
  return r;
}

void swap_operands(const Graph&, std::vector<detail::FusionGroup>& groups) {
  for (detail::FusionGroup& f : groups)
    for (kernels::FusedInstr& in : f.program.code)
      if ((in.op == OpId::Sub || in.op == OpId::Div) && in.src[0] != in.src[1]) {
        std::swap(in.src[0], in.src[1]);
        return;
      }
}

}  // namespace

BrokenPass::BrokenPass(std::string name) : name_(std::move(name)) {
  detail::RegisteredPass p;
  p.name = name_;
  if (name_ == kDropNegation)
    p.graph = drop_negation;
  else if (name_ == kSwapOperands)
    p.fusion = swap_operands;
  else
    DUET_CHECK_VALUE(false,
                     "[BrokenPass] no broken pass named \"{}\" (there are \"{}\" and \"{}\")",
                     name_, kDropNegation, kSwapOperands);
  detail::register_pass(std::move(p));
}

BrokenPass::~BrokenPass() { detail::unregister_pass(name_); }

}  // namespace duet::testing
