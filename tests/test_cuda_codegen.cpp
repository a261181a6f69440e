// The fused CUDA kernels' source generator (cuda/fused.h), checked without a GPU: NVRTC needs no
// device, so every generated program must compile for sm_90 here, on the CPU machines of CI.
// The programs: one per compute dtype and reduction mode using every fusable op and every input
// dtype, and the fused groups that the fusion pass finds in the random programs of the fusion
// mix. (Running the kernels, and comparing them with eager, is test_cuda_compile's, on a GPU.)
#include <chrono>
#include <set>

#include "cuda/fused.h"
#include "random_program.h"
#include "trace/compile.h"
#include "trace/fusion.h"
#include "util.h"

namespace duet::test {
namespace {

using kernels::FusedInstr;
using kernels::FusedProgram;
using kernels::FusedReduce;

std::string check_program(const FusedProgram& p) {
  const std::string src = cuda::detail::fused_source(p);
  const std::string log = cuda::detail::nvrtc_check(src, 90);
  return log.empty() ? "" : log + "\nprogram:\n" + p.str() + "\nsource:\n" + src;
}

// Every fusable op, reading inputs of every dtype, with T and b8 outputs.
FusedProgram every_op(DType t, FusedReduce reduce, OpId reduce_op) {
  FusedProgram p;
  p.dtype = t;
  p.in_dtypes = {t,          t,          DType::b8,
                 DType::i32, DType::i64, t == DType::f32 ? DType::f64 : DType::f32};
  int16_t next = static_cast<int16_t>(p.in_dtypes.size());
  auto emit = [&](OpId op, std::initializer_list<int16_t> src, DType to = DType::f32) {
    FusedInstr in;
    in.op = op;
    in.dst = next++;
    int k = 0;
    for (int16_t s : src) in.src[k++] = s;
    in.to = to;
    p.code.push_back(in);
    return in.dst;
  };
  int16_t acc = 0;
  for (OpId op : {OpId::Neg, OpId::Exp, OpId::Log, OpId::Sqrt, OpId::Rsqrt, OpId::Abs, OpId::Sin,
                  OpId::Cos, OpId::Tanh, OpId::Sigmoid, OpId::Relu, OpId::Erf, OpId::LogSigmoid})
    acc = emit(OpId::Add, {acc, emit(op, {1})});
  for (OpId op :
       {OpId::Add, OpId::Sub, OpId::Mul, OpId::Div, OpId::Pow, OpId::Maximum, OpId::Minimum})
    acc = emit(op, {acc, int16_t(3)});
  int16_t flag = 2;
  for (OpId op : {OpId::Lt, OpId::Le, OpId::Gt, OpId::Ge, OpId::Eq, OpId::Ne})
    flag = emit(OpId::Where, {flag, emit(op, {acc, int16_t(4)}), emit(op, {int16_t(5), acc})});
  const int16_t as_b8 = emit(OpId::Cast, {acc}, DType::b8);
  const int16_t as_t = emit(OpId::Cast, {as_b8}, t);
  const int16_t copy = emit(OpId::Copy, {as_t});
  const int16_t last = emit(OpId::Where, {flag, acc, copy});
  p.outputs = {last, as_b8};
  p.out_dtypes = {t, DType::b8};
  p.reduce = reduce;
  p.reduce_op = reduce_op;
  p.reduce_src = reduce == FusedReduce::None ? int16_t(-1) : last;
  p.num_regs = next;
  return p;
}

}  // namespace

TEST_CASE("cuda codegen: every fusable op, dtype and reduction compiles with NVRTC") {
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  for (DType t : {DType::f32, DType::f64}) {
    for (auto [reduce, op] :
         {std::pair{FusedReduce::None, OpId::Sum}, std::pair{FusedReduce::Inner, OpId::Sum},
          std::pair{FusedReduce::Inner, OpId::Max}, std::pair{FusedReduce::Outer, OpId::Min},
          std::pair{FusedReduce::Outer, OpId::Sum}}) {
      INFO(dtype_name(t) << " reduce " << int(reduce) << " " << op_name(op));
      const FusedProgram p = every_op(t, reduce, op);
      CHECK(check_program(p) == "");
      ++n;
    }
  }
  // A program with no elementwise output (only the reduction) and one with a single input.
  FusedProgram q = every_op(DType::f32, FusedReduce::Inner, OpId::Sum);
  q.outputs.clear();
  q.out_dtypes.clear();
  CHECK(check_program(q) == "");
  MESSAGE(
      fmt::format("{} programs compiled in {:.1f} s", n + 1,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
}

TEST_CASE("cuda codegen: the fused groups of random fusion programs compile with NVRTC") {
  const auto t0 = std::chrono::steady_clock::now();
  std::set<std::string> seen;
  int groups = 0;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    Program p;
    p.seed = seed;
    Generator gen(p, seed, Mix::Fusion);
    gen.make_inputs();
    if (!gen.make_steps(gen.random_length()).empty()) continue;
    gen.choose_outputs();
    auto f = compile([&p](std::vector<Tensor> xs) { return run_program(p, xs); });
    const std::vector<Tensor> xs = build_inputs(p, gen.first_values(), false);
    try {
      f(xs);
    } catch (const Error&) {
      continue;  // a program the compiled face rejects is test_compile_random's business
    }
    for (const detail::FusionGroup& g : detail::find_fusion_groups(f.graph())) {
      ++groups;
      const std::string src = cuda::detail::fused_source(g.program);
      if (!seen.insert(src).second) continue;
      INFO("seed " << seed << "\n" << program_text(p));
      CHECK(check_program(g.program) == "");
    }
  }
  CHECK(seen.size() >= 15);
  MESSAGE(
      fmt::format("{} fused groups, {} distinct kernels compiled in {:.1f} s", groups, seen.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
}

}  // namespace duet::test
