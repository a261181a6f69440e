// duet: fused CPU kernels. A fused group (trace/plan/fusion.cpp finds them) is a small register
// program over the elementwise ops of core/ops.def, optionally ending in one reduction. Two
// tiers run it, like a JIT: the interpreter here, which walks the program block by block over
// L1-sized blocks with the eager kernels' packet functors, and the C++ that trace/plan/codegen.cpp
// generates for a group that runs often, compiled in the background and swapped in.
//
// Note [Fused registers]
// Registers hold values of the group's compute dtype T (f32 or f64). Registers
// 0 .. num_inputs-1 are the inputs, converted to T as they are loaded (as the eager kernels
// convert an operand to their compute dtype). A b8 value lives in a register as 0 or 1:
// comparisons write 1 or 0, where() tests != 0, a cast to b8 writes (x != 0), a cast to T
// keeps the value, and an output of dtype b8 stores (x != 0). Every instruction reads and
// writes whole registers, so the result of each element is what the eager op computes.
//
// f16 and bf16 values live in f32 registers (a group with them computes in f32). An
// instruction whose op result is f16 or bf16 (FusedInstr::round) rounds its register to that
// dtype after computing, as the eager kernel rounds what it stores (Note [Low precision] in
// kernels/low_precision.h): so a fused bf16 chain equals the eager ops bit for bit.
// A reduction of such values accumulates them in f32 and rounds the result once into a
// red_out of their dtype (FusedProgram::red_round), as the eager reduction does. Inputs of
// those dtypes are converted as they are loaded, outputs as they are stored. The interpreter and
// the C++ generator run such programs; the CUDA generator does not take them yet (the fusion
// pass keeps f16 and bf16 ops on CUDA unfused).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/op_table.h"
#include "kernels/fused_abi.h"

namespace duet::kernels {

/// One instruction: dst = op(src[0], src[1], src[2]) on registers.
struct FusedInstr {
  OpId op{};
  int16_t dst = -1;
  int16_t src[3] = {-1, -1, -1};
  DType to = DType::f32;  ///< Cast: the target dtype (T or b8)
  /// f16 or bf16: the op's result has that dtype, and the register is rounded to it after the
  /// instruction (Note [Fused registers]); otherwise (f32, the default) no rounding.
  DType round = DType::f32;
};

enum class FusedReduce : uint8_t { None = 0, Inner = 1, Outer = 2 };

/// A fused group's program. Values stay in registers unless they are outputs.
struct FusedProgram {
  DType dtype = DType::f32;       ///< T, the compute dtype
  std::vector<DType> in_dtypes;   ///< per input: the dtype it is loaded from
  std::vector<FusedInstr> code;   ///< in order; registers >= in_dtypes.size() are temporaries
  int num_regs = 0;               ///< registers used (inputs included)
  std::vector<int16_t> outputs;   ///< registers stored to DuetFusedArgs::out[k], in order
  std::vector<DType> out_dtypes;  ///< per output: T or b8
  FusedReduce reduce = FusedReduce::None;
  OpId reduce_op = OpId::Sum;  ///< Sum, Max or Min
  int16_t reduce_src = -1;     ///< the register reduced into DuetFusedArgs::red_out
  /// f16 or bf16: the reduced value (of a register that holds that dtype's values) is rounded
  /// once to it and stored in it, as the eager reduction accumulates in f32 and rounds once;
  /// otherwise (f32, the default) red_out has dtype T.
  DType red_round = DType::f32;
  /// Bit k: input k is one number for the whole space (a one-element constant of the graph),
  /// which the CUDA generator loads once, knowing it when it writes the kernel.
  uint32_t scalar_inputs = 0;

  int num_inputs() const { return static_cast<int>(in_dtypes.size()); }
  /// Whether an input, an output or an instruction's result is f16 or bf16.
  bool has_low_precision() const;
  /// Readable text, one instruction per line ("r3 = mul(r0, r1)").
  std::string str() const;
  /// A stable hash of the program (the codegen cache key includes it).
  uint64_t hash() const;
};

/// Limits of one program (the fusion pass starts a new group past them).
inline constexpr int kFusedMaxRegs = 256;
inline constexpr int kFusedMaxInstrs = 256;

/// Whether a program can use these ops and dtypes (T f32 or f64; an op the interpreter knows).
bool fusable_op(OpId op);

/// The interpreter: runs [begin, end) of the work (Note [Fused iteration]) on this thread.
void interpret_fused(const FusedProgram& p, const DuetFusedArgs& a, int64_t begin, int64_t end);

/// Whether generated code may run a call: every input of the compute dtype is contiguous along
/// the row or broadcast (Note [Generated layouts] in kernels/codegen/cpu.cpp). The interpreter
/// runs the others.
bool generated_layout(const FusedProgram& p, const DuetFusedArgs& a);

/// A fused kernel as the executor holds it: the program, and the generated code once ready.
struct FusedKernel {
  FusedProgram program;
  std::atomic<DuetFusedFn> compiled{nullptr};  ///< set by codegen when its build is loaded
  std::atomic<int64_t> runs{0};
  std::atomic<bool> codegen_requested{false};
  bool codegen_allowed = true;  ///< false when the "codegen" pass is disabled for its plan
  /// The device backend's compiled kernel (a cudaKernel_t for CUDA), set by its prepare().
  std::atomic<const void*> device_code{nullptr};
  /// Where the group's ops were called ("model.cpp:12 mul, add; model.cpp:13 tanh"): a comment
  /// in the generated source written beside the build, outside the cache key, so that the same
  /// program from two places is one build (the first writes the file).
  std::string sites;

  /// Runs the whole work, split over the threads, with the fastest tier available.
  void run(const DuetFusedArgs& a);
  /// The amount of work units (elements, rows or columns) of a call.
  int64_t work(const DuetFusedArgs& a) const;
};

/// What a device backend lends the executor to run fused groups on its devices (the CUDA
/// backend registers one, cuda/fused.cpp: kernels generated from the same functors and
/// compiled at run time). prepare() makes the device_code of each of n kernels ready (finding
/// it in the caches under cache_dir, or building those missing, side by side); run() launches
/// one on the device's stream, asynchronously.
struct FusedDeviceRunner {
  void (*prepare)(FusedKernel* const* ks, size_t n, Device device,
                  const std::string& cache_dir) = nullptr;
  void (*run)(FusedKernel& k, const DuetFusedArgs& a, Device device) = nullptr;
};
void set_fused_device_runner(DeviceType type, const FusedDeviceRunner& runner);

/// out = a @ b + bias, or relu of it, in one call (2-D a and b, bias along the last dim): a
/// device backend's fused GEMM epilogue (CUDA: cuBLASLt, Note [cuBLASLt epilogues] in
/// cuda/kernels/matmul_ops.cpp). Returns false, having done nothing, where it cannot.
using GemmEpilogueFn = bool (*)(const Tensor& a, const Tensor& b, const Tensor& bias, bool relu,
                                const Tensor& out);
void set_gemm_epilogue(DeviceType type, GemmEpilogueFn fn);
/// The epilogue of a device type, or null.
GemmEpilogueFn gemm_epilogue(DeviceType type);
/// The runner of a device type, or null (then the fusion pass leaves that device's ops alone).
const FusedDeviceRunner* fused_device_runner(DeviceType type);

}  // namespace duet::kernels
