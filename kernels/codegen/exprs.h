// duet: how each fusable op reads in generated code, the one table both code generators share
// (kernels/codegen/cpu.cpp and kernels/codegen/cuda.cpp). An entry is a pattern over the op's
// operands {0}, {1}, {2}. Both generators define the helpers the patterns call, over a register
// of type T (an Eigen packet of T on the CPU, a T on CUDA):
//   apply1<F>(x), apply2<F>(a, b)   the functor F of kernels/functors.h
//   cmp_lt, cmp_le, cmp_eq, cmp_ne  comparisons giving T(1) or T(0) (ordered ones: NaN gives 0)
//   pwhere(c, a, b)                 c != 0 ? a : b
// The family rows of core/elementwise.def give most entries; Cast has none, since its code
// depends on the target dtype, and each generator writes it.
#pragma once

#include <iterator>

#include "core/error.h"
#include "core/op_table.h"
#include "kernels/fused.h"

namespace duet::detail {

struct OpExpr {
  OpId op;
  const char* pattern;
};

inline constexpr OpExpr kOpExprs[] = {
#define DUET_UNARY(Name, name, math, doc) {OpId::Name, "apply1<duet::fn::" #Name ">({0})"},
#define DUET_BINARY(Name, name, doc) {OpId::Name, "apply2<duet::fn::" #Name ">({0}, {1})"},
#define DUET_COMPARE(Name, name, expr, doc) {OpId::Name, expr},
#include "core/elementwise.def"
    {OpId::Where, "pwhere({0}, {1}, {2})"},
    {OpId::Copy, "{0}"},
};

/// The pattern of a fusable op, or null (Cast, and ops that do not fuse).
constexpr const char* op_expr(OpId op) {
  for (const OpExpr& e : kOpExprs)
    if (e.op == op) return e.pattern;
  return nullptr;
}

/// What both generators check first: the program computes in f32 or f64 and fits the kernel's
/// argument block. `who` names the generator in the error ("codegen", "fused").
inline void check_generatable(const kernels::FusedProgram& p, const char* who) {
  DUET_CHECK_T(p.dtype == DType::f32 || p.dtype == DType::f64, DTypeError,
               "[{}] fused programs compute in f32 or f64, not {}", who, dtype_name(p.dtype));
  DUET_ASSERT(p.num_inputs() <= DUET_FUSED_MAX_INPUTS &&
              static_cast<int>(p.outputs.size()) <= DUET_FUSED_MAX_OUTPUTS);
  DUET_ASSERT(p.out_dtypes.size() == p.outputs.size());
  DUET_ASSERT(p.num_regs >= p.num_inputs());
}

constexpr bool every_fusable_op_has_an_expr() {
  for (int i = 0; i < kNumOps; ++i)
    if (is_fusable(OpId(i)) && OpId(i) != OpId::Cast && !op_expr(OpId(i))) return false;
  return true;
}
// An elementwise row of core/ops.def outside the families needs its own entry here.
static_assert(std::size(kOpExprs) == kNumElementwise - 1,
              "kOpExprs: one entry per elementwise op of core/ops.def but Cast");
static_assert(every_fusable_op_has_an_expr(),
              "kOpExprs: an elementwise op of core/ops.def has no generated code");

}  // namespace duet::detail
