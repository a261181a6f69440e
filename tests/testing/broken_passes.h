// duet_testing: deliberately broken passes, to prove that check_against_eager (trace/check.h)
// names a pass that computes wrong values, and the node it broke. Tests and
// samples/debugging.cpp link it; nothing in duet itself does.
#pragma once

#include <string>

namespace duet::testing {

/// A graph pass that forgets a sign: the first negation of a floating value in the graph
/// becomes a copy of its operand (a simplification rule that dropped a minus).
inline constexpr const char* kDropNegation = "testing.drop_negation";
/// A fusion pass that swaps the operands of the first sub or div in a fused kernel (a fusion
/// that wires its registers in the wrong order).
inline constexpr const char* kSwapOperands = "testing.swap_operands";

/// Adds one of the broken passes above to the pipeline while it lives (plans built meanwhile
/// use it). Another name is a duet::ValueError.
class [[nodiscard]] BrokenPass {
 public:
  explicit BrokenPass(std::string name);
  ~BrokenPass();
  BrokenPass(const BrokenPass&) = delete;
  BrokenPass& operator=(const BrokenPass&) = delete;

 private:
  std::string name_;
};

}  // namespace duet::testing
