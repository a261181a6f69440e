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
// In a quarter of the mixed programs (a draw of its own, so that the others stay as they were),
// one or two steps are structured control flow (trace/control_flow.h), whose functions are short
// random programs of their own (1-4 steps of elementwise math, matmul, reductions, comparisons and
// where, over their inputs and, read directly, a value of the pool: a free value the tracer
// lifts), listed indented under the step:
// - Cond: a data-dependent predicate (a one-element value compared with a threshold, the steps
//   before it ordinary steps of the program) picks one of two branches over 1-3 operands, which
//   return 1-2 floating values of the same shapes and dtypes (the false branch's made to fit).
//   The threshold lies between the predicate's values on several draws of the inputs, so that
//   inputs taking either branch are common, and test_compile_random draws its second sample to
//   take the other branch (branches_taken).
// - Scan: a body over 1-2 carries and x_t (of 1-2 xs scanned along dim 0, mostly 2-6 steps,
//   sometimes 0 or 1); each new carry is tanh of a value of the body fitted to the carry, plus
//   x_t fitted to it when that value does not read x_t, plus carry * s (always bounded, however
//   many steps run), and 0-2 per-step results are stacked.
// - While: a counter-bounded loop, {i, v} -> {i + 1, v * s + c} while i < k, with k a number or
//   a count computed from an input; forward only, so its results are detached.
// A control-flow step's first result is its value; Take steps name the others. The faces differ
// on requires_grad (eagerly a branch's result requires grad when it reads a value that does;
// compiled, every floating result of a construct does when any of its inputs does), so when an
// input of a construct requires grad, its results are values that read one that does.
//
// A generator in the fusion mix (Mix::Fusion) builds programs that stress elementwise fusion and
// the memory planner instead: 20-60 steps, mostly elementwise unary and binary ops, comparisons,
// where and casts, over one iteration shape (odd sizes from 1 to over 65,536 elements, so that
// blocks are partial, rows cross block ends and large kernels split over both threads); long
// chains, diamonds (a value read by two branches that join again), broadcast operands ([n],
// [1, n], [m, 1] and 0-d against [m, n], numbers on either side), reductions over trailing,
// leading or all dims (sum, mean, max, min, softmax, log_softmax, logsumexp) at the ends of
// chains, and outputs that later steps also read. It is in random_program_fusion.cpp.
//
// A generator in the batch mix (Mix::Batch) builds mixed programs, control flow included (in
// two fifths of them), over arguments of which some (at least one) have a leading batch dim of
// a size the program does not know: a program is a function of its batch size, called at each
// of kBatchSizes. Batched inputs are contiguous arguments (not captured, not expanded: the
// others, weights and biases, are as in the mixed mix). The generator runs every step at each of
// those sizes (the first is the one it generates at, the others run beside it in shadow pools)
// and keeps a step only when it runs at all of them with results of the same rank and dtype, so
// steps whose parameters name sizes name them in terms the batch size does not change: reshape
// targets with -1 where the batch dims go (a flatten, or the batch split off again), expand
// targets with -1 for batch dims, slices of a batch dim from 0, 1 or the end (-1, -2) to the end
// (INT64_MAX) or -1 (from -2, clamped at size 1: a guard of a trace at another size fails
// there), indices along other dims, layer_norm over trailing dims that are not batch dims,
// and the shapes that make cond branches agree and scan carries fit. A dim whose size differs
// between the sizes is a batch dim of the value (B, 2B, B + 4 or ceil(B / 3) after reshapes, cats
// and slices); Step::batch records whether a step reads and makes values with batch dims, and a
// scan over a batch dim (its length the batch size) has mode 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
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
  X(Source) X(RandnLike) X(Dropout) X(UpdateBuffer)                                              \
  X(MaskedFill) X(Tril) X(Split) X(Flip) X(Roll) X(Pad) X(Like) X(Cumsum) X(Var) X(MaxIndices)    \
  X(Sort) X(Einsum) X(OneHot) X(NllLoss) X(Multinomial)                                            \
  X(Cond) X(Scan) X(While) X(Take)
// clang-format on

/// The case labels of the composites of core/api.def from masked_fill to einsum
/// (random_program_more.cpp), which the generator, the runner and the tolerances hand to that file
/// as one group.
#define DUET_RANDOM_MORE_OP_CASES \
  case Op::MaskedFill:            \
  case Op::Tril:                  \
  case Op::Split:                 \
  case Op::Flip:                  \
  case Op::Roll:                  \
  case Op::Pad:                   \
  case Op::Like:                  \
  case Op::Cumsum:                \
  case Op::Var:                   \
  case Op::MaxIndices:            \
  case Op::Sort:                  \
  case Op::Einsum:                \
  case Op::OneHot:                \
  case Op::NllLoss:               \
  case Op::Multinomial

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
  /// Mix::Batch: bit 1, an operand has a batch dim; bit 2, the result has one; bit 4, it is an
  /// elementwise op that broadcasts (operands of different shapes) and bit 1 is set.
  uint8_t batch = 0;
  /// Control flow (Cond, Scan): the steps of its functions (a cond's true branch, then its false
  /// one; a scan's body), over values numbered from the function's own: its arguments, then the
  /// free values among `args`, then one per step; and the values each returns.
  std::vector<Step> body, body2;
  std::vector<int> outs, outs2;
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
  /// Mix::Batch: dim 0 is the batch dim (its size is the program's batch size).
  bool batched = false;
};

/// Which programs a generator builds.
enum class Mix : uint8_t {
  Mixed,   ///< the whole op table
  Fusion,  ///< elementwise chains, diamonds, broadcasts and reductions (see the top)
  Batch,   ///< the whole op table over arguments with a batch dim of any size (see the top)
  /// The fusion mix in bf16 and f16: the inputs of the iteration shape in one of them, the others
  /// in it, the other one, f32 or an integer type (Note [Low-precision fusion programs])
  LowFusion,
  /// The mixed mix in bf16 and f16: floating inputs in one of them, some in f32 (where the mixed
  /// mix has f64), and the whole op table over them (test_compile_random's looseness)
  LowMixed,
};

/// Whether programs of `m` are built by the fusion generator (Fusion and LowFusion).
inline bool fusion_mix(Mix m) { return m == Mix::Fusion || m == Mix::LowFusion; }

/// The batch sizes a program of the batch mix is called at, in this order (1 and a repeat
/// included); the first is the size it is generated at.
inline constexpr int64_t kBatchSizes[] = {3, 5, 1, 8, 5};

struct Program {
  uint64_t seed = 0;
  Mix mix = Mix::Mixed;
  /// bf16 or f16: run_program runs the steps inside Autocast(Device::cpu(), autocast), so that
  /// the products compute in it (test_compile_random's autocast test); f32: no scope.
  DType autocast = DType::f32;
  std::vector<InputSpec> inputs;
  std::vector<Step> steps;
  std::vector<int> outputs;
  Domain domain;
};

/// One line of a listing: the step, its result numbered `value` (values are named by `sigil`
/// and a number: % in the program, $ in a function of a control-flow step). A control-flow step
/// adds its functions' steps, indented, on further lines.
std::string step_text(const Step& st, size_t value, const char* sigil = "%");
/// The listing of a program: its inputs, one line per step, its outputs.
std::string program_text(const Program& p);

/// Input values as stored (before expansion), one vector per input.
using Values = std::vector<std::vector<double>>;

/// p with its batched inputs (Mix::Batch) at batch size b.
Program at_batch(const Program& p, int64_t b);
/// Values for the inputs of p: one draw from its domain, as stored (before expansion).
Values random_inputs(const Program& p, Rng& rng);
/// The values with each floating input's elements moved by 2^scale of themselves (-21: about
/// four f32 ulps): up and down in turn (alternate), or all up. The random-program tests use it
/// to tell an ill-conditioned program (whose eager results move that much) from a wrong one.
Values nudged(const Program& p, const Values& vals, bool alternate, int scale = -21);
/// p computing in f64 what it computes in f32: its f32 inputs and its casts to f32 (in the
/// bodies of control flow too) become f64. Run on in_f64_values(p, vals), its results are closer
/// to exact than p's own: the random-program tests use them to tell rounding that p's f32 run
/// itself suffers from a wrong result.
Program in_f64(const Program& p);
/// The values of p's f32 inputs rounded to f32, as p's run holds them, for in_f64(p).
Values in_f64_values(const Program& p, const Values& vals);

/// Whether t's dtype is floating.
bool floating(const Tensor& t);

/// The results of control-flow steps after their first (which is the step's value), by value
/// index: Take steps read them.
using Tuples = std::map<size_t, std::vector<Tensor>>;

/// Runs one step on the values computed so far (its result is value v.size()); control-flow
/// steps put all their results in `more`, which Take steps read.
Tensor apply_step(const Step& st, const std::vector<Tensor>& v, Tuples* more = nullptr);
/// Runs a step of one of the composites of core/api.def from masked_fill to einsum
/// (random_program_more.cpp); apply_step calls it.
Tensor apply_more(const Step& st, const std::vector<Tensor>& v);
/// Every value of the program (inputs, then one per step).
std::vector<Tensor> run_values(const Program& p, const std::vector<Tensor>& inputs);
/// The program as a function of its inputs: what runs eagerly and what compile() traces (inside
/// an autocast scope when p.autocast says so).
std::vector<Tensor> run_program(const Program& p, const std::vector<Tensor>& inputs);

/// While one lives (on this thread), a Cond step run eagerly with grad mode on gives its
/// results the gradient that lax.cond's (and the compiled cond's) has: every floating operand
/// that the other branch's results reach on the tape gets zeros from the branch that ran, which
/// then flow into the gradient rules of the ops that made it (Note [Gradients a branch cannot
/// reach] in trace/control_flow.cpp: the one way the two faces' gradients may differ). The
/// values are unchanged. test_compile_random compares a differing program with this eager run.
class CondZerosScope {
 public:
  CondZerosScope();
  ~CondZerosScope();
  CondZerosScope(const CondZerosScope&) = delete;
  CondZerosScope& operator=(const CondZerosScope&) = delete;

 private:
  bool prev_;
};

/// Per Cond step of p, run eagerly on the inputs `vals`: 1 when it takes the true branch, 0 the
/// false one, -1 when its predicate's value lies so close to the threshold (1e-3 relative) that
/// eager and compiled rounding might choose differently. Empty for programs without Cond.
std::vector<int> branches_taken(const Program& p, const Values& vals);

// ---- the generator ----

/// An independent generator for (seed, stream). Rng(s) and Rng(s + 1) walk one sequence a step
/// apart (splitmix64 adds a constant per draw), so seeds are hashed first.
Rng rng_for(uint64_t seed, uint64_t stream);

/// Fresh input tensors holding the values in the program's layouts (or, with `contiguous`, the
/// arguments contiguous and not expanded); floats require grad when asked.
std::vector<Tensor> build_inputs(const Program& p, const Values& vals, bool rg,
                                 bool contiguous = false);

/// The largest magnitude in t (infinity when an element is not finite).
double max_abs(const Tensor& t);

/// Whether an input or a step result of p (as its listing shows it) has dtype d.
bool has_dtype(const Program& p, DType d);

/// p without step k; its uses read value `rep` instead (-1: it has none). For reducers.
Program without_step(const Program& p, size_t k, int rep);
/// Shrinks a failing program for a report, while `fails` holds: drops outputs, and steps whose
/// uses can read one of their operands of the same shape and dtype instead (`values` runs a
/// program to give every value, for the shapes); `more`, when given, tries further shrinks on
/// each round and says whether it made one.
Program shrink_program(Program p, const std::function<std::vector<Tensor>(const Program&)>& values,
                       const std::function<bool(const Program&)>& fails,
                       const std::function<bool(Program&)>& more = {});

/// The integer in the environment variable `name`, or `fallback` when it is unset or empty.
int env_int(const char* name, int fallback);
/// The seeds to run: first..first+n-1 with n from the variable `count` (else `fallback`) and
/// first from DUET_SEED_FIRST (else 0), or the one seed the variable `one` names.
std::vector<uint64_t> seeds_from_env(const char* count, int fallback, const char* one);

/// How far a compiled value may be from eager's (the comparisons of test_compile_random):
/// relative, and absolute at magnitude 1. bf16 and f16 values are compared bit for bit (Note
/// [Low-precision fusion programs]); integers and bools always are.
struct Tolerance {
  double rtol, atol;
};
inline Tolerance value_tolerance(DType d) {
  if (d == DType::f32) return {1.3e-5, 1.5e-5};
  if (d == DType::f64) return {1e-7, 1e-7};
  return {0, 0};
}

/// The seed manual_seed() gets before every run, eager or compiled (randn, dropout).
inline constexpr uint64_t kRandSeed = 1234;

/// Elements of any value in the mixed mix: each program stays well under 1 ms.
inline constexpr int64_t kMaxNumel = 1200;

/// Whether shapes a and b broadcast together.
bool can_broadcast(const Shape& a, const Shape& b);

class Generator {
 public:
  Generator(Program& p, uint64_t seed, Mix mix = Mix::Mixed)
      : p_(p),
        rng_(rng_for(seed, mix == Mix::Fusion      ? 2
                           : mix == Mix::Batch     ? 4
                           : mix == Mix::LowFusion ? 6
                           : mix == Mix::LowMixed  ? 7
                                                   : 0)),
        side_(rng_for(seed, mix == Mix::Batch ? 5 : 3)) {
    p_.mix = mix;
  }

  int64_t irand(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(rng_.next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double urand(double lo, double hi) { return rng_.uniform(lo, hi); }
  bool chance(double p) { return rng_.uniform(0, 1) < p; }

  void make_inputs();
  /// Maybe adds a captured buffer (of dims from vocab, dtype main), then draws the first values
  /// and builds the input pool.
  void finish_inputs(const int64_t* vocab, DType main);
  /// Values for the inputs (one draw from the program's domain), as stored before expansion.
  Values sample_values(Rng& rng) const;
  /// The values the generator ran the steps on.
  const Values& first_values() const { return first_; }
  /// Appends steps until the program has `n` (or gives up on finding more).
  std::string make_steps(int n);
  /// Picks the outputs: the last value and a few others, and each control-flow step that no
  /// output reads.
  void choose_outputs();
  /// The whole program: inputs, random_length() steps and the outputs; false when the
  /// generator gave up on the steps (the tests that only count programs skip it then).
  bool build() {
    make_inputs();
    if (!make_steps(random_length()).empty()) return false;
    choose_outputs();
    return true;
  }
  /// How many steps make_steps should aim at: 5-30, or 20-60 in the fusion mix (20-30 for its
  /// largest shapes).
  int random_length() {
    if (!fusion_mix(p_.mix)) return int(irand(5, 30));
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
  void random_index(Step& st, int a, int64_t d);
  /// st.args = {a} and one class index per row of value a (1-D: one row; 2-D: (N, C)), in
  /// st.index of shape st.ishape: the targets of cross_entropy and nll_loss.
  void class_targets(Step& st, int a);
  bool propose(Op op, Step& st);
  /// propose for the composites of core/api.def from masked_fill to einsum
  /// (random_program_more.cpp).
  bool propose_more(Op op, Step& st);
  bool propose_binary(Op op, Step& st);
  /// The number operand of a binary op on a (st.mode 1 or 2): st.s and st.int_scalar.
  void scalar_operand(Op op, Step& st, const Tensor& a);
  /// Runs st on the pool and appends it (and a taming step when its magnitude grew): the index
  /// of the value that stands for its result, -1 when rejected (empty, too large, not finite),
  /// -2 when it threw (the message in err).
  int commit(Step st, std::string& err);

  // Control flow (see the top): each appends its steps and returns whether it did (err: a
  // step threw).
  /// A function of a control-flow step being built: the generator's pool and steps while it is
  /// swapped in (swap_function), so that propose and commit build it.
  struct Function {
    std::vector<Tensor> vals;  ///< its arguments, free values, then one per step
    std::vector<Step> steps;
    std::vector<bool> blocked;
    Tuples tuples;
    std::vector<bool> grad;  ///< per value: requires grad in a run with gradients (grad_flags)
    /// Mix::Batch: vals and tuples at the other batch sizes (Shadow).
    std::vector<std::vector<Tensor>> shadow_vals;
    std::vector<Tuples> shadow_tuples;
  };
  /// Swaps f's values and steps with the pool and the program's (twice: back again).
  void swap_function(Function& f);
  /// A function over `args` (its values at generation; in the batch mix, `shadow_args` per
  /// other batch size) and the free values `free` (pool indices), whose grad flags are `grad`:
  /// 1-4 random steps. False when none could be made.
  bool make_function(Function& f, const std::vector<Tensor>& args, const std::vector<int>& free,
                     const std::vector<bool>& grad, std::string& err,
                     const std::vector<std::vector<Tensor>>& shadow_args = {});
  /// Appends steps that turn value u into one of shape s and dtype d (expand, reshape, or a
  /// mean added to a value of that shape; a cast): the result's index, -1 when rejected. In
  /// the batch mix, `at_shadows` is the shape wanted at each other batch size (the dims where it
  /// differs from s are batch dims, where u's must go).
  int fit(int u, const Shape& s, DType d, std::string& err,
          const std::vector<Shape>& at_shadows = {});
  /// Per value of the program so far, whether it requires grad in the harness's run with
  /// gradients (that run, on the first sample; `vals` gets its values). Empty if it threw.
  std::vector<bool> grad_flags(std::vector<Tensor>* vals = nullptr);
  /// A threshold for a predicate on a value that is x on the first sample and `others` on other
  /// draws: between two of them (near their median), away from both.
  double threshold(const std::vector<double>& others, double x);
  /// Up to `count` distinct floating pool values of at most max_numel elements (as pick picks).
  std::vector<int> pick_floats(int count, int64_t max_numel);
  bool add_cond(std::string& err);
  bool add_scan(std::string& err);
  bool add_while(std::string& err);
  /// Commits the Take steps of results 1.. of the control-flow step at value c.
  void take_results(int c, size_t count, std::string& err);

  // The batch mix (see the top).
  /// The pool at another batch size: each value at that size, and the results of its
  /// control-flow steps.
  struct Shadow {
    int64_t batch = 0;
    std::vector<Tensor> pool;
    Tuples tuples;
  };
  bool batch_mode() const { return p_.mix == Mix::Batch; }
  void make_batch_inputs();
  /// Per dim of value v: whether its size differs between the batch sizes.
  std::vector<bool> batch_dims(int v) const;
  bool has_batch_dim(int v) const;
  /// Per dim of value v: its smallest size over the batch sizes (its size outside the batch mix).
  Shape min_sizes(int v) const;
  /// Whether value `from` broadcasts to the shape of value `into` (at every batch size).
  bool broadcasts_into(int from, int into) const;
  /// d, or in the batch mix when d is a batch dim of value v, another dim of v that is not.
  int64_t other_than_batch(int v, int64_t d);
  /// Runs st (to be committed as the next value of the pool, whose result is `out` of
  /// magnitude m) on every shadow pool and appends its results there; rejects it, leaving the
  /// shadow pools as they were, when it throws there, or a result there is empty, too large,
  /// not finite, or of another rank or dtype (also its other results, for control flow).
  /// Returns the largest magnitude of the result at all sizes (m at the first), -1 to reject.
  double commit_shadows(const Step& st, const Tensor& out, double m);
  /// Sets st.batch, and writes the batch dims of st.result as functions of the batch size B
  /// ("f32 (B, 4)", "(2B, 4)"): st's result is `out`, and the last value of each shadow pool.
  void batch_result(Step& st, const Tensor& out) const;
  /// A reshape target for value a with batch dims: the batch dims go to a -1 (a flatten, the
  /// batch split off again, or merged with another dim). False when its size is not a multiple
  /// of the batch size at every size.
  bool batch_reshape(int a, std::vector<int64_t>& target);
  /// Slice bounds for a batch dim, counted from its ends: from 0, 1, -1 or -2 to the end
  /// (INT64_MAX) or to -1. (Those that give nothing at some size are rejected there; -2 is
  /// clamped at size 1, which a trace at another size guards against.)
  void batch_slice(int64_t& start, int64_t& end);

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
  /// For a reduction step (sum, mean, softmax, log_softmax, logsumexp) with a bf16 or f16
  /// result from exact operands: whether every element rounds to one value however its f32
  /// math is ordered (Note [Low-precision fusion programs]).
  bool rounding_settled(const Step& st, const Tensor& out) const;
  /// Appends a diamond: two branches from one value, joined again.
  std::string add_diamond();

  Shape shape_;              ///< the fusion mix: the iteration shape
  std::vector<double> err_;  ///< the fusion mix, per pool value: Note [Inexact values]
  int64_t max_numel_ = 0;    ///< the largest value a step may make
  Program& p_;
  Rng rng_;
  Rng side_;                  ///< control flow: its plan, and the draws for thresholds
  Tuples tuples_;             ///< results of control-flow steps in the pool (Tuples)
  std::vector<int> control_;  ///< the values of control-flow steps
  Values first_;
  std::vector<Tensor> pool_;
  std::vector<bool> blocked_;  ///< per pool value: not to be read (a buffer not yet updated)
  std::vector<bool> updated_ = std::vector<bool>(64, false);  ///< per input: buffer updated
  std::vector<Shadow> shadows_;  ///< the batch mix: the pool at kBatchSizes after the first
};

/// How often the generator tries each op (relative; random_program.cpp).
double op_weight(Op op);
/// "f32 (2, 3)": a value's dtype and shape, as listings show it.
std::string meta_text(const Tensor& t);

}  // namespace duet::test
