// Random programs for test_compile_random: the program representation (ops, steps, inputs,
// listings, running a program on tensors) and the generator that builds them.
//
// A generator builds programs of 5-30 steps over a pool of live tensors. Each step picks an op
// from the whole table (elementwise math, broadcasting binary ops with tensors or numbers on
// either side, comparisons and where, matmul and linear, reshapes and views, joining,
// reductions, softmax-like composites, gather / index_select / scatter_add / slice_scatter /
// embedding, casts and copies, in-place updates of fresh results, layer_norm, losses, pooling,
// unfold / fold, conv2d, tensors made inside (full, arange, eye), and randn and dropout, seeded
// identically before every run) and operands from the pool whose shapes and dtypes fit, and
// appends its result. Inputs have ranks 0-4, f32 and f64 (some i32, i64, b8), and layouts that
// are contiguous, transposed, strided, offset or expanded; some are captured by the function
// (read by reference) instead of passed, and some programs update a captured state buffer in
// place (written back by the compiled function). The generator runs every step on sample
// inputs as it goes, so shapes never need predicting, and a result whose magnitude grew past 16
// is followed by a multiplication by a power of two (an ordinary step of the program) that
// brings it back, so that long chains stay in the range where float32 tolerances mean
// something.
//
// A generator in the fusion mix (Mix::Fusion) builds programs that stress elementwise fusion and
// the memory planner instead: 20-60 steps, mostly elementwise unary and binary ops, comparisons,
// where and casts, over one iteration shape (odd sizes from 1 to over 65,536 elements, so that
// blocks are partial, rows cross block ends and large kernels split over both threads); long
// chains, diamonds (a value read by two branches that join again), broadcast operands ([n],
// [1, n], [m, 1] and 0-d against [m, n], numbers on either side), reductions over trailing,
// leading or all dims (sum, mean, max, min, softmax, log_softmax, logsumexp) at the ends of
// chains, and outputs that later steps also read. It is in random_program_fusion.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "util.h"

namespace duet::test {

// ---- the program ----

// clang-format off
#define DUET_RANDOM_OPS(X)                                                                         \
  X(Neg) X(Exp) X(Log) X(Sqrt) X(Rsqrt) X(Abs) X(Sin) X(Cos) X(Tanh) X(Sigmoid) X(Relu) X(Gelu)    \
  X(Silu) X(Erf) X(LogSigmoid) X(Clamp)                                                            \
  X(Add) X(Sub) X(Mul) X(Div) X(Maximum) X(Minimum) X(Pow)                                         \
  X(Lt) X(Le) X(Gt) X(Ge) X(Eq) X(Ne) X(Where)                                                     \
  X(MatMul) X(Linear)                                                                              \
  X(Reshape) X(Transpose) X(Permute) X(Squeeze) X(SqueezeAll) X(Unsqueeze) X(Expand) X(Slice)      \
  X(Cat) X(Stack)                                                                                  \
  X(Sum) X(Mean) X(Max) X(Min) X(Argmax) X(Argmin) X(Softmax) X(LogSoftmax) X(LogSumExp)           \
  X(Gather) X(IndexSelect) X(GatherArgmax) X(ScatterAdd) X(SliceScatter)                           \
  X(Cast) X(Clone) X(Contiguous)                                                                   \
  X(AddInplace) X(SubInplace) X(MulInplace) X(DivInplace) X(CopyInplace)                           \
  X(LayerNorm) X(MseLoss) X(CrossEntropy) X(BceLogits) X(Embedding)                                \
  X(MaxPool) X(AvgPool) X(Unfold) X(Conv2d)                                                        \
  X(Source) X(RandnLike) X(Dropout) X(UpdateBuffer)
// clang-format on

enum class Op : uint8_t {
#define X(n) n,
  DUET_RANDOM_OPS(X)
#undef X
      Count
};

/// The op's name, for listings.
const char* op_text(Op op);

/// One step: an op, the pool values it reads, and its parameters. Its result is the next value.
struct Step {
  Op op{};
  std::vector<int> args;        ///< values read (indices into the pool)
  std::vector<int64_t> ints;    ///< dims, shapes, slice bounds, kernel sizes
  std::vector<int64_t> index;   ///< index values (gather, index_select, scatter_add)
  std::vector<int64_t> ishape;  ///< the index's shape
  double s = 0, s2 = 0;         ///< numbers
  bool int_scalar = false;      ///< s is passed as an integer Scalar
  int mode = 0;                 ///< op-specific variant (scalar side, keepdim, dtype, ...)
  std::string result;           ///< the result's metadata at generation, for the listing
};

struct InputSpec {
  Shape shape, made;  ///< made: the shape of the stored values (expanded to shape when it differs)
  DType dtype = DType::f32;
  Layout layout = Layout::Contiguous;
  /// Read by the compiled function from its closure (captured by reference) instead of passed
  /// as an argument; updated in place between calls.
  bool captured = false;
  /// A captured state buffer (as a running mean): never requires grad, and the program
  /// updates it in place (an UpdateBuffer step) before anything else reads it.
  bool buffer = false;
};

/// Which programs a generator builds.
enum class Mix : uint8_t {
  Mixed,   ///< the whole op table
  Fusion,  ///< elementwise chains, diamonds, broadcasts and reductions (see the top)
};

struct Program {
  uint64_t seed = 0;
  Mix mix = Mix::Mixed;
  std::vector<InputSpec> inputs;
  std::vector<Step> steps;
  std::vector<int> outputs;
  Domain domain;
};

/// One line of a listing: the step, its result numbered `value`.
std::string step_text(const Step& st, size_t value);
/// The listing of a program: its inputs, one line per step, its outputs.
std::string program_text(const Program& p);

/// Whether t's dtype is floating.
bool floating(const Tensor& t);

/// Runs one step on the values computed so far.
Tensor apply_step(const Step& st, const std::vector<Tensor>& v);
/// The program as a function of its inputs: what runs eagerly and what compile() traces.
std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs);

// ---- the generator ----

/// An independent generator for (seed, stream). Rng(s) and Rng(s + 1) walk one sequence a step
/// apart (splitmix64 adds a constant per draw), so seeds are hashed first.
Rng rng_for(uint64_t seed, uint64_t stream);

/// Input values as stored (before expansion), one vector per input.
using Values = std::vector<std::vector<double>>;

/// Fresh input tensors holding the values in the program's layouts (or, with `contiguous`, the
/// arguments contiguous and not expanded); floats require grad when asked.
std::vector<Tensor> build_inputs(const Program& p, const Values& vals, bool rg,
                                 bool contiguous = false);

/// The largest magnitude in t (infinity when an element is not finite).
double max_abs(const Tensor& t);

/// The seed manual_seed() gets before every run, eager or compiled (randn, dropout).
inline constexpr uint64_t kRandSeed = 1234;

/// Elements of any value in the mixed mix: each program stays well under 1 ms.
inline constexpr int64_t kMaxNumel = 1200;

/// Whether shapes a and b broadcast together.
bool can_broadcast(const Shape& a, const Shape& b);

class Generator {
 public:
  Generator(Program& p, uint64_t seed, Mix mix = Mix::Mixed)
      : p_(p), rng_(rng_for(seed, mix == Mix::Fusion ? 2 : 0)) {
    p_.mix = mix;
  }

  int64_t irand(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(rng_.next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double urand(double lo, double hi) { return rng_.uniform(lo, hi); }
  bool chance(double p) { return rng_.uniform(0, 1) < p; }

  void make_inputs();
  /// Values for the inputs (one draw from the program's domain), as stored before expansion.
  Values sample_values(Rng& rng) const;
  /// The values the generator ran the steps on.
  const Values& first_values() const { return first_; }
  /// Appends steps until the program has `n` (or gives up on finding more).
  std::string make_steps(int n);
  void choose_outputs();
  /// How many steps make_steps should aim at: 5-30, or 20-60 in the fusion mix (20-30 for its
  /// largest shapes).
  int random_length() {
    if (p_.mix == Mix::Mixed) return int(irand(5, 30));
    return int(irand(20, shape_.numel() > 65536 ? 30 : 60));
  }

 private:
  template <class F>
  int pick(F&& ok) {
    std::vector<int> c;
    for (size_t i = 0; i < pool_.size(); ++i)
      if (!blocked_[i] && ok(pool_[i])) c.push_back(int(i));
    if (c.empty()) return -1;
    // Mostly recent values, so that programs grow deep chains rather than many shallow ones.
    if (chance(0.6))
      return c[size_t(irand(std::max<int64_t>(0, int64_t(c.size()) - 3), int64_t(c.size()) - 1))];
    return c[size_t(irand(0, int64_t(c.size()) - 1))];
  }
  const Tensor& at(int i) const { return pool_[size_t(i)]; }
  double nice_scalar() {
    double s = std::round(urand(-2, 2) * 4) / 4;
    return p_.domain.discrete ? std::round(s * 2) / 2 : s;
  }
  int64_t wrap_or_negative(int64_t d, int64_t rank) { return chance(0.3) ? d - rank : d; }
  std::vector<int64_t> random_shape(int64_t numel);
  void random_index(Step& st, const Tensor& x, int64_t d);
  bool propose(Op op, Step& st);
  bool propose_binary(Op op, Step& st);
  /// The number operand of a binary op on a (st.mode 1 or 2): st.s and st.int_scalar.
  void scalar_operand(Op op, Step& st, const Tensor& a);
  /// Runs st on the pool and appends it (and a taming step when its magnitude grew): the index
  /// of the value that stands for its result, -1 when rejected (empty, too large, not finite),
  /// -2 when it threw (the message in err).
  int commit(Step st, std::string& err);

  // The fusion mix.
  void make_fusion_inputs();
  std::string make_fusion_steps(int n);
  void choose_fusion_outputs();
  Shape fusion_shape();
  /// A floating value to continue a chain on: mostly a recent one of the iteration shape.
  int pick_chain();
  /// A second operand for an elementwise op on a: a broadcast operand, a value of a's shape or
  /// any that broadcasts with it (recent ones first); -1 when none.
  int pick_partner(int a, bool ints_ok);
  Step unary_on(int a);
  /// A binary op of a and b, or of a and a number when b < 0.
  Step binary_on(int a, int b);
  bool propose_fusion(Step& st, int kind);
  bool propose_reduction(Step& st);
  /// How close st's operands come to a kink of st (Note [Inexact values]): the smallest
  /// absolute distance.
  double kink_distance(const Step& st) const;
  /// The estimated error of st's result `out` (Note [Inexact values]), -1 to reject st.
  double error_estimate(const Step& st, const Tensor& out) const;
  /// Appends a diamond: two branches from one value, joined again.
  std::string add_diamond();

  Shape shape_;              ///< the fusion mix: the iteration shape
  std::vector<double> err_;  ///< the fusion mix, per pool value: Note [Inexact values]
  int64_t max_numel_ = 0;    ///< the largest value a step may make
  Program& p_;
  Rng rng_;
  Values first_;
  std::vector<Tensor> pool_;
  std::vector<bool> blocked_;  ///< per pool value: not to be read (a buffer not yet updated)
  std::vector<bool> updated_ = std::vector<bool>(64, false);  ///< per input: buffer updated
};

}  // namespace duet::test
