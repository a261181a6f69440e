// duet: symbolic integer sizes (SymInt), for traced tensor dims in compiled graphs.
//
// Note [Symbolic sizes]
// A SymInt is either a concrete int64 (the fast path: no allocation, no lock) or a pointer to an
// immutable, interned expression over symbols s0, s1, ... Symbolic values are kept in one
// canonical form: a polynomial with int64 coefficients over monomials, a monomial being a sorted
// multiset of atoms. An atom is a symbol or an opaque floordiv(p, q) / mod(p, q) of two
// canonical values. Terms are sorted by degree (highest first), then lexicographically by their
// atoms (symbols by id, then floordiv, then mod), zero terms dropped; a polynomial that is only
// a constant is stored as a concrete SymInt. So x*3 + x*2 == 5*x, x*y == y*x, x - x == 0.
// Division stays a polynomial when it is exact (b divides a as polynomials with integer
// coefficients, found by polynomial division with graded-lex leading terms); by a constant c it
// splits a into c*k + r with the coefficients of r in [0, c): floordiv(a, c) = k + floordiv(r, c)
// and mod(a, c) = mod(r, c), r and c then divided by their gcd. Division by a symbolic divisor
// assumes the divisor is nonzero (as sympy does): floordiv(x*y, x) = y, mod(x, x) = 0.
//
// Nodes are hash-consed in a process-wide table under a mutex, so equal expressions share one
// node and == is a pointer comparison. Nodes are never freed: their number is bounded by the
// distinct size expressions of the programs compiled in the process.
//
// Use: in a traced graph a Shape dim is either concrete or a SymInt over the symbols of
// the compiled signature (one symbol per dynamic input dim); shape rules compute with SymInts
// and decide with the tri-state comparisons (Unknown becomes a guard or an error); the executor
// evaluates each dim for the concrete sizes of a call.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace duet {

class SymInt;
namespace detail {
struct SymNode;
// The symbolic (out-of-line) halves of SymInt's arithmetic.
SymInt sym_add(const SymInt& a, const SymInt& b);
SymInt sym_sub(const SymInt& a, const SymInt& b);
SymInt sym_mul(const SymInt& a, const SymInt& b);
[[noreturn]] void throw_not_concrete(const SymInt& s);
}  // namespace detail

/// An integer size: a concrete int64 or a symbolic expression (Note [Symbolic sizes]).
/// Cheap to copy (16 bytes); arithmetic on concrete values neither allocates nor locks.
class SymInt {
 public:
  /// A concrete value.
  SymInt(int64_t v = 0) : value_(v) {}
  /// The symbol with this id (>= 0), printed "s<id>" by default.
  static SymInt symbol(int32_t id);

  bool is_concrete() const { return node_ == nullptr; }
  /// The concrete value; throws InternalError when symbolic.
  int64_t concrete() const {
    if (node_) detail::throw_not_concrete(*this);
    return value_;
  }
  /// The concrete value, or nullopt when symbolic.
  std::optional<int64_t> maybe_concrete() const {
    return node_ ? std::nullopt : std::optional<int64_t>(value_);
  }

  /// "2*s0*s1 + s0 + 3", "floordiv(s0 + 1, 2)", "s0**2"; symbol id i prints as names[i] when
  /// given, else "s<i>".
  std::string str() const;
  /// str() with symbol names from a table.
  std::string str(const std::vector<std::string>& names) const;
  /// Consistent with ==: equal values hash equal (stable across runs).
  size_t hash() const;
  /// The symbol ids mentioned, sorted, each once.
  std::vector<int32_t> symbols() const;

  /// The value with symbol id i bound to bindings[i]. Throws ValueError naming the symbol when a
  /// binding is missing, and naming the expression on division by zero or int64 overflow.
  int64_t evaluate(const std::vector<int64_t>& bindings) const;
  /// Replaces symbol i by *values[i] where present (other symbols stay) and re-canonicalises.
  SymInt substitute(const std::vector<std::optional<SymInt>>& values) const;

  /// The interned node (null when concrete): equal symbolic values share one node.
  const detail::SymNode* node() const { return node_; }

  /// + - * of SymInts or int64s, in canonical form; int64 overflow throws ValueError.
  friend SymInt operator+(const SymInt& a, const SymInt& b) {
    int64_t r;
    if (!a.node_ && !b.node_ && !__builtin_add_overflow(a.value_, b.value_, &r)) return r;
    return detail::sym_add(a, b);  // symbolic, or the overflow error
  }
  friend SymInt operator-(const SymInt& a, const SymInt& b) {
    int64_t r;
    if (!a.node_ && !b.node_ && !__builtin_sub_overflow(a.value_, b.value_, &r)) return r;
    return detail::sym_sub(a, b);
  }
  friend SymInt operator*(const SymInt& a, const SymInt& b) {
    int64_t r;
    if (!a.node_ && !b.node_ && !__builtin_mul_overflow(a.value_, b.value_, &r)) return r;
    return detail::sym_mul(a, b);
  }
  friend SymInt operator-(const SymInt& a) { return SymInt(0) - a; }
  SymInt& operator+=(const SymInt& b) { return *this = *this + b; }
  SymInt& operator-=(const SymInt& b) { return *this = *this - b; }
  SymInt& operator*=(const SymInt& b) { return *this = *this * b; }

  /// Structural equality of the canonical forms (a pointer comparison for symbolic values).
  friend bool operator==(const SymInt& a, const SymInt& b) {
    return a.node_ == b.node_ && a.value_ == b.value_;
  }

 private:
  friend struct detail::SymNode;  // wraps interned nodes
  struct NodeTag {};
  SymInt(const detail::SymNode* node, NodeTag) : value_(0), node_(node) {}

  int64_t value_ = 0;                      ///< the value when concrete, else 0
  const detail::SymNode* node_ = nullptr;  ///< the interned polynomial when symbolic
};

/// Floor division (Python's //, rounding toward -inf). Throws ValueError on a concrete zero
/// divisor; exact divisions stay polynomials, others become a floordiv atom.
SymInt floordiv(const SymInt& a, const SymInt& b);
/// The remainder of floordiv (Python's %, the sign of the divisor): a - b * floordiv(a, b).
SymInt mod(const SymInt& a, const SymInt& b);

/// Prints str().
std::ostream& operator<<(std::ostream& os, const SymInt& s);

/// The answer of a symbolic comparison: proven, disproven, or not decidable from the bounds.
enum class Truth { False, True, Unknown };
/// "False", "True", "Unknown".
const char* truth_name(Truth t);

/// Known lower bounds of the symbols, for the comparisons. A symbol not listed is >= 0 (a size);
/// declare more with at_least, e.g. a dim known to be >= 2 (not broadcast).
struct SymbolBounds {
  std::vector<int64_t> lower;  ///< lower[id]; ids past the end have bound 0
  /// Declares symbol `id` >= lo.
  SymbolBounds& at_least(int32_t id, int64_t lo);
  /// The declared bound of symbol `id`, else 0.
  int64_t lower_of(int32_t id) const;
};

/// A proven lower bound of s (each symbol shifted to its bound, then every non-constant
/// coefficient must be >= 0; the constant is the bound), or nullopt.
std::optional<int64_t> lower_bound(const SymInt& s, const SymbolBounds& bounds = {});

/// Tri-state a == b, a < b, a <= b, a > b, a >= b: True or False only when proven.
Truth sym_eq(const SymInt& a, const SymInt& b, const SymbolBounds& bounds = {});
Truth sym_lt(const SymInt& a, const SymInt& b, const SymbolBounds& bounds = {});
Truth sym_le(const SymInt& a, const SymInt& b, const SymbolBounds& bounds = {});
inline Truth sym_gt(const SymInt& a, const SymInt& b, const SymbolBounds& bounds = {}) {
  return sym_lt(b, a, bounds);
}
inline Truth sym_ge(const SymInt& a, const SymInt& b, const SymbolBounds& bounds = {}) {
  return sym_le(b, a, bounds);
}

}  // namespace duet

namespace duet {

/// A tensor's dims in a trace with symbolic sizes: one SymInt per dim. Empty means "all dims
/// concrete": the tensor's Shape then says everything (the common, allocation-free case).
using SymDims = std::vector<SymInt>;

/// The size-holding attributes of one op call when some are symbolic (Note [Symbolic dims] in
/// trace/compile.h): ints (Reshape, Expand, Full, Random: the shape), start and end (Slice,
/// SliceScatter), end (Arange) and value (Full). Attrs keeps the concrete values at the trace's
/// sizes beside them; a compiled run evaluates these for the sizes of its call.
struct SymAttrs {
  std::vector<SymInt> ints;  ///< empty: Attrs::ints is concrete
  std::optional<SymInt> start, end, value;
  friend bool operator==(const SymAttrs& a, const SymAttrs& b) {
    return a.ints == b.ints && a.start == b.start && a.end == b.end && a.value == b.value;
  }
};

namespace detail {

/// How a symbolic size is compared with another (guards).
enum class SymRel : uint8_t { Eq, Ne, Lt, Le };
const char* sym_rel_str(SymRel r);
/// Whether `x rel y` holds for concrete values.
bool sym_rel_holds(int64_t x, SymRel rel, int64_t y);

/// The trace of a compiled function with symbolic dims (installed by trace/compile.cpp while it
/// traces; null otherwise). Library code asks it the concrete size a symbol has in the call being
/// traced (the hint), records the guards that decisions taken on those sizes need, and asks for
/// specialization when it cannot go on without a concrete size.
class SymContext {
 public:
  virtual ~SymContext() = default;
  /// The value of s at the traced call's sizes.
  virtual int64_t hint(const SymInt& s) const = 0;
  /// Records that `a rel b` must hold for the graph to be valid (it holds at the hints).
  virtual void guard(const SymInt& a, SymRel rel, const SymInt& b, std::string why) = 0;
  /// Gives up on the symbols of `sizes`: the trace restarts with them concrete. Never returns.
  [[noreturn]] virtual void specialize(const std::vector<SymInt>& sizes, std::string why) = 0;
  /// The known lower bounds of the symbols.
  virtual const SymbolBounds& bounds() const = 0;
};
/// This thread's context, or null.
SymContext* sym_context();
/// Installs `c` for the lifetime of the guard.
class SymContextGuard {
 public:
  explicit SymContextGuard(SymContext* c);
  ~SymContextGuard();
  SymContextGuard(const SymContextGuard&) = delete;
  SymContextGuard& operator=(const SymContextGuard&) = delete;

 private:
  SymContext* prev_;
};

/// Decides `a rel b`: from the bounds when they prove it, else from the hints, recording the
/// answer as a guard (`why` says which op needed it). Concrete sizes never guard.
bool sym_decide(const SymInt& a, SymRel rel, const SymInt& b, const char* why);

/// Thrown by SymContext::specialize and caught by compile: not a duet::Error, so that code
/// catching errors does not swallow it.
struct SpecializeRequest {
  std::vector<int32_t> symbols;
  std::string why;
};

/// While alive, reading the sizes of a tensor with symbolic dims as integers is allowed on this
/// thread (shape rules validate the sizes of the traced call; the symbolic rule says how the
/// result depends on them, Note [Symbolic dims]).
class HintReads {
 public:
  HintReads() { ++depth_; }
  ~HintReads() { --depth_; }
  HintReads(const HintReads&) = delete;
  HintReads& operator=(const HintReads&) = delete;
  static bool active() { return depth_ > 0; }

 private:
  static thread_local int depth_;
};

}  // namespace detail
}  // namespace duet

template <>
struct std::hash<duet::SymInt> {
  size_t operator()(const duet::SymInt& s) const { return s.hash(); }
};
