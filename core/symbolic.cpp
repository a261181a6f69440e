// duet: symbolic integer sizes. See Note [Symbolic sizes] in core/symbolic.h.
#include "core/symbolic.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <numeric>
#include <ostream>
#include <unordered_set>

#include "core/error.h"

namespace duet {
namespace detail {

// Atoms sort by kind in this order, so symbols come before floordiv and mod atoms.
enum class SymKind : uint8_t { Symbol, FloorDiv, Mod, Poly };

using Mono = std::vector<const SymNode*>;

/// coeff * (product of the atoms): the atoms sorted, a power repeating its atom.
struct SymTerm {
  Mono atoms;
  int64_t coeff = 0;
  bool operator==(const SymTerm&) const = default;
};

using Poly = std::vector<SymTerm>;

/// An interned expression node: a polynomial (what a symbolic SymInt points to) or an atom.
struct SymNode {
  SymKind kind = SymKind::Poly;
  int32_t symbol = -1;  ///< Symbol: the id
  SymInt lhs, rhs;      ///< FloorDiv, Mod: the canonical operands
  Poly terms;           ///< Poly: canonical order, nonzero coefficients, never only a constant
  size_t hash = 0;

  static SymInt wrap(const SymNode* n) { return SymInt(n, SymInt::NodeTag{}); }
};

namespace {

/// Coefficient arithmetic overflowed. Entry points turn it into a ValueError naming the
/// operation (or, in the comparisons, into "unknown").
struct Overflow {};

int64_t add_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw Overflow{};
  return r;
}
int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Overflow{};
  return r;
}
/// Python's a // b (b != 0).
int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return mul_checked(a, -1);
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}
/// Python's a % b (b != 0): the sign of b.
int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

[[noreturn]] void throw_overflow(const char* op, const SymInt& a, const SymInt& b) {
  throw ValueError(::duet::detail::with_context(
      fmt::format("[SymInt] int64 overflow in {}({}, {})", op, a.str(), b.str())));
}

// ---- hashing and interning ------------------------------------------------------------------

uint64_t fmix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
size_t combine(size_t h, uint64_t v) { return fmix(h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6))); }

// Structural (child hashes, not addresses), so that hash() is the same in every run.
size_t node_hash(const SymNode& n) {
  size_t h = combine(0, static_cast<uint64_t>(n.kind));
  switch (n.kind) {
    case SymKind::Symbol:
      return combine(h, static_cast<uint64_t>(n.symbol));
    case SymKind::FloorDiv:
    case SymKind::Mod:
      return combine(combine(h, n.lhs.hash()), n.rhs.hash());
    case SymKind::Poly:
      for (const SymTerm& t : n.terms) {
        h = combine(h, static_cast<uint64_t>(t.coeff));
        for (const SymNode* a : t.atoms) h = combine(h, a->hash);
        h = combine(h, 0x7e);  // end of term
      }
      return h;
  }
  return h;
}

// Children are interned already, so node equality compares them by pointer.
struct NodeHash {
  size_t operator()(const SymNode* n) const { return n->hash; }
};
struct NodeEq {
  bool operator()(const SymNode* a, const SymNode* b) const {
    return a->kind == b->kind && a->symbol == b->symbol && a->lhs == b->lhs && a->rhs == b->rhs &&
           a->terms == b->terms;
  }
};

/// The shared node equal to `n`, created on first use. Nodes are never freed (the table is
/// leaked too, so that nodes outlive every static destructor).
const SymNode* intern(SymNode&& n) {
  struct Table {
    std::mutex mu;
    std::unordered_set<const SymNode*, NodeHash, NodeEq> nodes;
  };
  static Table* table = new Table;
  n.hash = node_hash(n);
  std::lock_guard<std::mutex> lock(table->mu);
  auto it = table->nodes.find(&n);
  if (it != table->nodes.end()) return *it;
  const SymNode* node = new SymNode(std::move(n));
  table->nodes.insert(node);
  return node;
}

// ---- canonical order ------------------------------------------------------------------------

int compare_value(const SymInt& a, const SymInt& b);

int compare_atoms(const SymNode* a, const SymNode* b) {
  if (a == b) return 0;
  if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
  if (a->kind == SymKind::Symbol) return a->symbol < b->symbol ? -1 : 1;
  if (int c = compare_value(a->lhs, b->lhs)) return c;
  return compare_value(a->rhs, b->rhs);
}
bool atom_less(const SymNode* a, const SymNode* b) { return compare_atoms(a, b) < 0; }

// Graded lexicographic: higher degree first, then the atom lists compared in order. This is a
// monomial order (it survives multiplication), which the exact division below relies on.
int compare_monos(const Mono& a, const Mono& b) {
  if (a.size() != b.size()) return a.size() > b.size() ? -1 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (int c = compare_atoms(a[i], b[i])) return c;
  }
  return 0;
}

int compare_value(const SymInt& a, const SymInt& b) {
  if (a == b) return 0;
  if (a.is_concrete() != b.is_concrete()) return a.is_concrete() ? -1 : 1;
  if (a.is_concrete()) return a.concrete() < b.concrete() ? -1 : 1;
  const Poly& x = a.node()->terms;
  const Poly& y = b.node()->terms;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (int c = compare_monos(x[i].atoms, y[i].atoms)) return c;
    if (x[i].coeff != y[i].coeff) return x[i].coeff < y[i].coeff ? -1 : 1;
  }
  return x.size() < y.size() ? -1 : 1;
}

// ---- polynomials ----------------------------------------------------------------------------

/// Sorts the terms, adds up equal monomials and drops zeros.
void canonicalize(Poly& p) {
  std::sort(p.begin(), p.end(),
            [](const SymTerm& a, const SymTerm& b) { return compare_monos(a.atoms, b.atoms) < 0; });
  Poly out;
  for (SymTerm& t : p) {
    if (!out.empty() && out.back().atoms == t.atoms) {
      out.back().coeff = add_checked(out.back().coeff, t.coeff);
    } else {
      out.push_back(std::move(t));
    }
  }
  std::erase_if(out, [](const SymTerm& t) { return t.coeff == 0; });
  p = std::move(out);
}

Poly to_poly(const SymInt& s) {
  if (s.node()) return s.node()->terms;
  if (s.concrete() == 0) return {};
  return {SymTerm{{}, s.concrete()}};
}

SymInt from_poly(Poly p) {
  if (p.empty()) return 0;
  if (p.size() == 1 && p[0].atoms.empty()) return p[0].coeff;
  SymNode n;
  n.terms = std::move(p);
  return SymNode::wrap(intern(std::move(n)));
}

/// a + sign * b.
Poly poly_add(Poly a, const Poly& b, int64_t sign) {
  for (const SymTerm& t : b) a.push_back({t.atoms, mul_checked(t.coeff, sign)});
  canonicalize(a);
  return a;
}

Poly poly_mul(const Poly& a, const Poly& b) {
  Poly out;
  out.reserve(a.size() * b.size());
  for (const SymTerm& x : a) {
    for (const SymTerm& y : b) {
      SymTerm t{{}, mul_checked(x.coeff, y.coeff)};
      t.atoms.reserve(x.atoms.size() + y.atoms.size());
      std::merge(x.atoms.begin(), x.atoms.end(), y.atoms.begin(), y.atoms.end(),
                 std::back_inserter(t.atoms), atom_less);
      out.push_back(std::move(t));
    }
  }
  canonicalize(out);
  return out;
}

/// The atom as a value: the polynomial 1 * atom.
SymInt make_atom(SymKind kind, const SymInt& lhs, const SymInt& rhs) {
  SymNode n;
  n.kind = kind;
  n.lhs = lhs;
  n.rhs = rhs;
  return from_poly({SymTerm{{intern(std::move(n))}, 1}});
}

/// a / b as monomials, when b divides a (a sub-multiset; both sorted).
std::optional<Mono> mono_div(const Mono& a, const Mono& b) {
  Mono out;
  size_t j = 0;
  for (const SymNode* x : a) {
    if (j < b.size() && x == b[j]) {
      ++j;
    } else {
      out.push_back(x);
    }
  }
  if (j != b.size()) return std::nullopt;
  return out;
}

/// q with a == b * q and integer coefficients, if there is one. Polynomial division: with a
/// monomial order the leading term of the remainder must be a multiple of b's leading term and
/// strictly decreases at each step, and b divides a exactly when the remainder reaches zero.
std::optional<Poly> exact_quotient(const Poly& a, const Poly& b) {
  constexpr int kMaxSteps = 256;  // a bound on the work, never reached by real size expressions
  try {
    Poly q;
    Poly r = a;
    for (int step = 0; !r.empty(); ++step) {
      const SymTerm& lr = r.front();
      const SymTerm& lb = b.front();
      if (step == kMaxSteps || floor_mod(lr.coeff, lb.coeff) != 0) return std::nullopt;
      std::optional<Mono> m = mono_div(lr.atoms, lb.atoms);
      if (!m) return std::nullopt;
      Poly t = {SymTerm{std::move(*m), floor_div(lr.coeff, lb.coeff)}};
      r = poly_add(std::move(r), poly_mul(t, b), -1);
      q.push_back(std::move(t[0]));
    }
    canonicalize(q);
    return q;
  } catch (const Overflow&) {
    return std::nullopt;  // not provably exact: the caller keeps an opaque atom
  }
}

/// floordiv or mod of a by a constant c > 0: a = c*k + r with r's coefficients in [0, c), so
/// floordiv(a, c) = k + floordiv(r, c) and mod(a, c) = mod(r, c); then r and c lose their gcd.
SymInt divide_by_constant(const Poly& a, int64_t c, SymKind kind) {
  Poly k, r;  // subsequences of a: still canonical
  for (const SymTerm& t : a) {
    if (int64_t kc = floor_div(t.coeff, c)) k.push_back({t.atoms, kc});
    if (int64_t rc = floor_mod(t.coeff, c)) r.push_back({t.atoms, rc});
  }
  // A remainder that is a constant in [0, c) has floordiv 0 and is its own mod.
  if (r.empty() || (r.size() == 1 && r[0].atoms.empty())) {
    return kind == SymKind::FloorDiv ? from_poly(std::move(k)) : from_poly(std::move(r));
  }
  int64_t g = c;
  for (const SymTerm& t : r) g = std::gcd(g, t.coeff);
  for (SymTerm& t : r) t.coeff /= g;
  SymInt atom = make_atom(kind, from_poly(std::move(r)), c / g);
  return kind == SymKind::FloorDiv ? from_poly(std::move(k)) + atom : atom * g;
}

SymInt divide(const SymInt& a, const SymInt& b, SymKind kind) {
  const bool is_div = kind == SymKind::FloorDiv;
  const char* op = is_div ? "floordiv" : "mod";
  if (b.is_concrete()) {
    const int64_t c = b.concrete();
    DUET_CHECK_VALUE(c != 0, "[{}] division by zero: {}({}, 0)", op, op, a.str());
    if (a.is_concrete()) return is_div ? floor_div(a.concrete(), c) : floor_mod(a.concrete(), c);
    if (c < 0) {  // a // c == (-a) // (-c) and a % c == -((-a) % (-c))
      SymInt q = divide(-a, SymInt(0) - c, kind);
      return is_div ? q : -q;
    }
    return divide_by_constant(to_poly(a), c, kind);
  }
  // A symbolic divisor is assumed nonzero (Note [Symbolic sizes]).
  if (a == 0) return 0;
  if (std::optional<Poly> q = exact_quotient(to_poly(a), to_poly(b))) {
    return is_div ? from_poly(std::move(*q)) : 0;
  }
  return make_atom(kind, a, b);
}

// ---- printing, evaluation, substitution -----------------------------------------------------

std::string symbol_name(int32_t id, const std::vector<std::string>* names) {
  if (names && id < static_cast<int32_t>(names->size())) return (*names)[id];
  return fmt::format("s{}", id);
}

void print(std::string& out, const SymInt& s, const std::vector<std::string>* names);

void print_atom(std::string& out, const SymNode* a, const std::vector<std::string>* names) {
  if (a->kind == SymKind::Symbol) {
    out += symbol_name(a->symbol, names);
    return;
  }
  out += a->kind == SymKind::FloorDiv ? "floordiv(" : "mod(";
  print(out, a->lhs, names);
  out += ", ";
  print(out, a->rhs, names);
  out += ")";
}

void print(std::string& out, const SymInt& s, const std::vector<std::string>* names) {
  if (s.is_concrete()) {
    out += std::to_string(s.concrete());
    return;
  }
  bool first = true;
  for (const SymTerm& t : s.node()->terms) {
    if (first) {
      if (t.coeff < 0) out += "-";
    } else {
      out += t.coeff < 0 ? " - " : " + ";
    }
    first = false;
    // |coeff| as unsigned, so that INT64_MIN prints.
    uint64_t mag = t.coeff < 0 ? 0 - static_cast<uint64_t>(t.coeff) : t.coeff;
    if (t.atoms.empty() || mag != 1) {
      out += std::to_string(mag);
      if (!t.atoms.empty()) out += "*";
    }
    for (size_t i = 0; i < t.atoms.size();) {
      size_t j = i;
      while (j < t.atoms.size() && t.atoms[j] == t.atoms[i]) ++j;
      if (i > 0) out += "*";
      print_atom(out, t.atoms[i], names);
      if (j - i > 1) out += fmt::format("**{}", j - i);
      i = j;
    }
  }
}

int64_t eval(const SymInt& s, const std::vector<int64_t>& bindings, const SymInt& whole);

int64_t eval_atom(const SymNode* a, const std::vector<int64_t>& bindings, const SymInt& whole) {
  if (a->kind == SymKind::Symbol) {
    DUET_CHECK_VALUE(a->symbol < static_cast<int64_t>(bindings.size()),
                     "[SymInt.evaluate] no binding for symbol s{} in {} ({} bindings given)",
                     a->symbol, whole.str(), bindings.size());
    return bindings[a->symbol];
  }
  const int64_t num = eval(a->lhs, bindings, whole);
  const int64_t den = eval(a->rhs, bindings, whole);
  if (den == 0) {
    std::string atom;
    print_atom(atom, a, nullptr);
    throw ValueError(::duet::detail::with_context(
        fmt::format("[SymInt.evaluate] division by zero in {}: {} is 0 (in {})", atom, a->rhs.str(),
                    whole.str())));
  }
  return a->kind == SymKind::FloorDiv ? floor_div(num, den) : floor_mod(num, den);
}

int64_t eval(const SymInt& s, const std::vector<int64_t>& bindings, const SymInt& whole) {
  if (s.is_concrete()) return s.concrete();
  int64_t sum = 0;
  for (const SymTerm& t : s.node()->terms) {
    int64_t v = t.coeff;
    for (const SymNode* a : t.atoms) v = mul_checked(v, eval_atom(a, bindings, whole));
    sum = add_checked(sum, v);
  }
  return sum;
}

void collect_symbols(const SymInt& s, std::vector<int32_t>& out) {
  if (s.is_concrete()) return;
  for (const SymTerm& t : s.node()->terms) {
    for (const SymNode* a : t.atoms) {
      if (a->kind == SymKind::Symbol) {
        out.push_back(a->symbol);
      } else {
        collect_symbols(a->lhs, out);
        collect_symbols(a->rhs, out);
      }
    }
  }
}

SymInt substitute_value(const SymInt& s, const std::vector<std::optional<SymInt>>& values) {
  if (s.is_concrete()) return s;
  SymInt sum = 0;
  for (const SymTerm& t : s.node()->terms) {
    SymInt v = t.coeff;
    for (const SymNode* a : t.atoms) {
      if (a->kind == SymKind::Symbol) {
        bool bound = a->symbol < static_cast<int64_t>(values.size()) && values[a->symbol];
        v = v * (bound ? *values[a->symbol] : SymInt::symbol(a->symbol));
      } else {
        SymInt lhs = substitute_value(a->lhs, values);
        SymInt rhs = substitute_value(a->rhs, values);
        v = v * (a->kind == SymKind::FloorDiv ? floordiv(lhs, rhs) : mod(lhs, rhs));
      }
    }
    sum = sum + v;
  }
  return sum;
}

// ---- bounds ---------------------------------------------------------------------------------

std::optional<int64_t> lower_bound_poly(const SymInt& s, const SymbolBounds& bounds);

std::optional<int64_t> atom_lower_bound(const SymNode* a, const SymbolBounds& bounds) {
  if (a->kind == SymKind::Symbol) return bounds.lower_of(a->symbol);
  const bool positive_divisor = a->rhs.is_concrete()
                                    ? a->rhs.concrete() > 0
                                    : lower_bound_poly(a->rhs, bounds).value_or(0) >= 1;
  if (!positive_divisor) return std::nullopt;
  if (a->kind == SymKind::Mod) return 0;  // in [0, divisor)
  std::optional<int64_t> num = lower_bound_poly(a->lhs, bounds);
  if (!num) return std::nullopt;
  if (a->rhs.is_concrete()) return floor_div(*num, a->rhs.concrete());
  return *num >= 0 ? std::optional<int64_t>(0) : std::nullopt;
}

// Each atom x >= L is written L + x' with x' >= 0; once expanded, a polynomial whose non-constant
// coefficients are all >= 0 is >= its constant term.
std::optional<int64_t> lower_bound_poly(const SymInt& s, const SymbolBounds& bounds) {
  if (s.is_concrete()) return s.concrete();
  Poly shifted;
  for (const SymTerm& t : s.node()->terms) {
    Poly term = {SymTerm{{}, t.coeff}};
    for (const SymNode* a : t.atoms) {
      std::optional<int64_t> lo = atom_lower_bound(a, bounds);
      if (!lo) return std::nullopt;
      Poly shift = {SymTerm{{a}, 1}};  // the atom now stands for x'
      if (*lo != 0) shift.push_back({{}, *lo});
      term = poly_mul(term, shift);
    }
    shifted.insert(shifted.end(), term.begin(), term.end());
  }
  canonicalize(shifted);
  int64_t constant = 0;
  for (const SymTerm& t : shifted) {
    if (t.atoms.empty()) {
      constant = t.coeff;
    } else if (t.coeff < 0) {
      return std::nullopt;
    }
  }
  return constant;
}

/// a - b, or nullopt on overflow (the comparisons then answer Unknown).
std::optional<SymInt> try_sub(const SymInt& a, const SymInt& b) {
  try {
    return from_poly(poly_add(to_poly(a), to_poly(b), -1));
  } catch (const Overflow&) {
    return std::nullopt;
  }
}

/// Whether a - b >= at_least is proven.
bool proves_diff_at_least(const SymInt& a, const SymInt& b, int64_t at_least,
                          const SymbolBounds& bounds) {
  std::optional<SymInt> d = try_sub(a, b);
  if (!d) return false;
  std::optional<int64_t> lo = lower_bound(*d, bounds);
  return lo && *lo >= at_least;
}

}  // namespace

SymInt sym_add(const SymInt& a, const SymInt& b) {
  try {
    return from_poly(poly_add(to_poly(a), to_poly(b), 1));
  } catch (const Overflow&) {
    throw_overflow("add", a, b);
  }
}

SymInt sym_sub(const SymInt& a, const SymInt& b) {
  try {
    return from_poly(poly_add(to_poly(a), to_poly(b), -1));
  } catch (const Overflow&) {
    throw_overflow("sub", a, b);
  }
}

SymInt sym_mul(const SymInt& a, const SymInt& b) {
  try {
    return from_poly(poly_mul(to_poly(a), to_poly(b)));
  } catch (const Overflow&) {
    throw_overflow("mul", a, b);
  }
}

void throw_not_concrete(const SymInt& s) {
  throw InternalError(
      fmt::format("[SymInt.concrete] {} is symbolic, not a concrete size", s.str()));
}

}  // namespace detail

using detail::SymKind;

SymInt SymInt::symbol(int32_t id) {
  DUET_CHECK_VALUE(id >= 0, "[SymInt.symbol] symbol ids are >= 0, got {}", id);
  detail::SymNode n;
  n.kind = SymKind::Symbol;
  n.symbol = id;
  return detail::from_poly({detail::SymTerm{{detail::intern(std::move(n))}, 1}});
}

std::string SymInt::str() const {
  std::string out;
  detail::print(out, *this, nullptr);
  return out;
}

std::string SymInt::str(const std::vector<std::string>& names) const {
  std::string out;
  detail::print(out, *this, &names);
  return out;
}

size_t SymInt::hash() const {
  return node_ ? node_->hash : detail::fmix(static_cast<uint64_t>(value_));
}

std::vector<int32_t> SymInt::symbols() const {
  std::vector<int32_t> out;
  detail::collect_symbols(*this, out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t SymInt::evaluate(const std::vector<int64_t>& bindings) const {
  try {
    return detail::eval(*this, bindings, *this);
  } catch (const detail::Overflow&) {
    throw ValueError(::duet::detail::with_context(
        fmt::format("[SymInt.evaluate] int64 overflow evaluating {}", str())));
  }
}

SymInt SymInt::substitute(const std::vector<std::optional<SymInt>>& values) const {
  return detail::substitute_value(*this, values);
}

SymInt floordiv(const SymInt& a, const SymInt& b) {
  try {
    return detail::divide(a, b, SymKind::FloorDiv);
  } catch (const detail::Overflow&) {
    detail::throw_overflow("floordiv", a, b);
  }
}

SymInt mod(const SymInt& a, const SymInt& b) {
  try {
    return detail::divide(a, b, SymKind::Mod);
  } catch (const detail::Overflow&) {
    detail::throw_overflow("mod", a, b);
  }
}

std::ostream& operator<<(std::ostream& os, const SymInt& s) { return os << s.str(); }

const char* truth_name(Truth t) {
  switch (t) {
    case Truth::False:
      return "False";
    case Truth::True:
      return "True";
    case Truth::Unknown:
      return "Unknown";
  }
  return "?";
}

SymbolBounds& SymbolBounds::at_least(int32_t id, int64_t lo) {
  DUET_CHECK_VALUE(id >= 0, "[SymbolBounds] symbol ids are >= 0, got {}", id);
  if (static_cast<size_t>(id) >= lower.size()) lower.resize(id + 1, 0);
  lower[id] = lo;
  return *this;
}

int64_t SymbolBounds::lower_of(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < lower.size() ? lower[id] : 0;
}

std::optional<int64_t> lower_bound(const SymInt& s, const SymbolBounds& bounds) {
  try {
    return detail::lower_bound_poly(s, bounds);
  } catch (const detail::Overflow&) {
    return std::nullopt;
  }
}

Truth sym_eq(const SymInt& a, const SymInt& b, const SymbolBounds& bounds) {
  if (a == b) return Truth::True;
  if (a.is_concrete() && b.is_concrete()) return Truth::False;
  // Canonical forms differ, so a - b is not the zero polynomial; it may still be 0 for some
  // values of the symbols unless it is bounded away from 0.
  if (detail::proves_diff_at_least(a, b, 1, bounds) ||
      detail::proves_diff_at_least(b, a, 1, bounds)) {
    return Truth::False;
  }
  return Truth::Unknown;
}

Truth sym_lt(const SymInt& a, const SymInt& b, const SymbolBounds& bounds) {
  if (a.is_concrete() && b.is_concrete()) {
    return a.concrete() < b.concrete() ? Truth::True : Truth::False;
  }
  if (detail::proves_diff_at_least(b, a, 1, bounds)) return Truth::True;
  if (detail::proves_diff_at_least(a, b, 0, bounds)) return Truth::False;
  return Truth::Unknown;
}

Truth sym_le(const SymInt& a, const SymInt& b, const SymbolBounds& bounds) {
  if (a.is_concrete() && b.is_concrete()) {
    return a.concrete() <= b.concrete() ? Truth::True : Truth::False;
  }
  if (detail::proves_diff_at_least(b, a, 0, bounds)) return Truth::True;
  if (detail::proves_diff_at_least(a, b, 1, bounds)) return Truth::False;
  return Truth::Unknown;
}

}  // namespace duet

namespace duet::detail {

thread_local int HintReads::depth_ = 0;

namespace {
thread_local SymContext* tls_sym_context = nullptr;
}  // namespace

const char* sym_rel_str(SymRel r) {
  switch (r) {
    case SymRel::Eq:
      return "==";
    case SymRel::Ne:
      return "!=";
    case SymRel::Lt:
      return "<";
    case SymRel::Le:
      return "<=";
  }
  return "?";
}

bool sym_rel_holds(int64_t x, SymRel rel, int64_t y) {
  switch (rel) {
    case SymRel::Eq:
      return x == y;
    case SymRel::Ne:
      return x != y;
    case SymRel::Lt:
      return x < y;
    case SymRel::Le:
      return x <= y;
  }
  return false;
}

SymContext* sym_context() { return tls_sym_context; }
SymContextGuard::SymContextGuard(SymContext* c) : prev_(tls_sym_context) { tls_sym_context = c; }
SymContextGuard::~SymContextGuard() { tls_sym_context = prev_; }

bool sym_decide(const SymInt& a, SymRel rel, const SymInt& b, const char* why) {
  SymContext* c = tls_sym_context;
  const SymbolBounds none;
  const SymbolBounds& bounds = c ? c->bounds() : none;
  Truth t = Truth::Unknown;
  switch (rel) {
    case SymRel::Eq:
      t = sym_eq(a, b, bounds);
      break;
    case SymRel::Ne:
      t = sym_eq(a, b, bounds);
      if (t != Truth::Unknown) t = t == Truth::True ? Truth::False : Truth::True;
      break;
    case SymRel::Lt:
      t = sym_lt(a, b, bounds);
      break;
    case SymRel::Le:
      t = sym_le(a, b, bounds);
      break;
  }
  if (t != Truth::Unknown) return t == Truth::True;
  DUET_ASSERT(c, "a symbolic size ({} {} {}) was compared outside a symbolic trace", a.str(),
              sym_rel_str(rel), b.str());
  const bool holds = sym_rel_holds(c->hint(a), rel, c->hint(b));
  // Record what was decided: the relation when it holds, its negation when it does not.
  if (holds) {
    c->guard(a, rel, b, why);
  } else {
    switch (rel) {
      case SymRel::Eq:
        c->guard(a, SymRel::Ne, b, why);
        break;
      case SymRel::Ne:
        c->guard(a, SymRel::Eq, b, why);
        break;
      case SymRel::Lt:
        c->guard(b, SymRel::Le, a, why);
        break;
      case SymRel::Le:
        c->guard(b, SymRel::Lt, a, why);
        break;
    }
  }
  return holds;
}

}  // namespace duet::detail
