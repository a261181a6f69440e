// Symbolic integer sizes (core/symbolic.h): canonical forms and their text, exact and opaque
// division, evaluation of random expressions against plain integer arithmetic, tri-state
// comparisons, hashing, interning across threads, and the errors.
#include <cmath>
#include <limits>
#include <sstream>
#include <thread>
#include <type_traits>
#include <unordered_set>

#include "core/symbolic.h"
#include "util.h"

namespace duet::test {
namespace {

static_assert(sizeof(SymInt) == 16 && std::is_trivially_copyable_v<SymInt>,
              "a SymInt is an int64 and a pointer, copied as such");

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

const SymInt x = SymInt::symbol(0);
const SymInt y = SymInt::symbol(1);
const SymInt z = SymInt::symbol(2);

// Python's a // b and a % b, computed in long double (exact for the magnitudes used here).
int64_t py_floordiv(int64_t a, int64_t b) {
  return static_cast<int64_t>(std::floor(static_cast<long double>(a) / b));
}
int64_t py_mod(int64_t a, int64_t b) { return a - b * py_floordiv(a, b); }

}  // namespace

TEST_CASE("SymInt: concrete values") {
  SymInt a = 3;
  CHECK(a.is_concrete());
  CHECK(a.concrete() == 3);
  CHECK(a.maybe_concrete() == std::optional<int64_t>(3));
  CHECK((a + 4) * 2 - 1 == 13);
  CHECK((10 - a).concrete() == 7);
  CHECK(SymInt().concrete() == 0);
  CHECK(a.str() == "3");
  CHECK(SymInt(-5).str() == "-5");
  CHECK(a.node() == nullptr);
  CHECK(a.symbols().empty());
  CHECK(a.evaluate({}) == 3);
  CHECK(!x.is_concrete());
  CHECK(x.maybe_concrete() == std::nullopt);
  SymInt b = x;
  b += 2;
  b *= 3;
  b -= 6;
  CHECK(b == 3 * x);
}

TEST_CASE("SymInt: canonical forms and their text") {
  struct Row {
    SymInt got;
    const char* want;
  };
  const Row rows[] = {
      {x * 3 + x * 2, "5*s0"},
      {5 * x, "5*s0"},
      {(x + 1) * (x + 1), "s0**2 + 2*s0 + 1"},
      {x * x + 2 * x + 1, "s0**2 + 2*s0 + 1"},
      {x - x, "0"},
      {(x + 1) * (x + 1) - x * x - 2 * x, "1"},
      {x * y, "s0*s1"},
      {y * x, "s0*s1"},
      {2 * x * y + x + 3, "2*s0*s1 + s0 + 3"},
      {3 + x + y * x * 2, "2*s0*s1 + s0 + 3"},
      {1 - x, "-s0 + 1"},
      {x - 2 * y, "s0 - 2*s1"},
      {y * y + x, "s1**2 + s0"},
      {-(x * x * 2), "-2*s0**2"},
      {(x + y) * (x - y), "s0**2 - s1**2"},
      {x * y * x, "s0**2*s1"},
      {z * x * y * 3 - 1, "3*s0*s1*s2 - 1"},
      {x * kMin, "-9223372036854775808*s0"},
      {floordiv(x + 1, 2), "floordiv(s0 + 1, 2)"},
      {floordiv(x, y) * x, "s0*floordiv(s0, s1)"},
      {mod(x, y) + floordiv(x, y) + x, "s0 + floordiv(s0, s1) + mod(s0, s1)"},
      {floordiv(x, 2) * floordiv(x, 2), "floordiv(s0, 2)**2"},
      {floordiv(x + 1, 2) - floordiv(1 + x, 2), "0"},
      {SymInt::symbol(12), "s12"},
  };
  for (const Row& row : rows) {
    CHECK(row.got.str() == row.want);
    // A constant result is concrete, never a node.
    CHECK(row.got.is_concrete() == (row.got.str().find('s') == std::string::npos));
  }
  CHECK((x * y + z).str({"batch", "seq"}) == "batch*seq + s2");
  CHECK(floordiv(x, y).str({"n", "k"}) == "floordiv(n, k)");
  std::ostringstream os;
  os << x + 1;
  CHECK(os.str() == "s0 + 1");
}

TEST_CASE("SymInt: floordiv and mod, exact and opaque") {
  struct Row {
    SymInt a, b;
    const char* div;
    const char* rem;
  };
  const Row rows[] = {
      // exact: stays a polynomial
      {6 * x + 4, 2, "3*s0 + 2", "0"},
      {x * y * 4, 2 * x, "2*s1", "0"},
      {x * y + x, x, "s1 + 1", "0"},
      {(x + 1) * (y + 2), x + 1, "s1 + 2", "0"},
      {x * x - 1, x - 1, "s0 + 1", "0"},
      {x * x * y + 2 * x * y + y, x + 1, "s0*s1 + s1", "0"},
      {x, x, "1", "0"},
      {-2 * x * y - 2 * x, -x, "2*s1 + 2", "0"},
      {x, 1, "s0", "0"},
      {x, -1, "-s0", "0"},
      {0, x, "0", "0"},
      // concrete: Python's // and %
      {7, 2, "3", "1"},
      {-7, 2, "-4", "1"},
      {7, -2, "-4", "-1"},
      {-7, -2, "3", "-1"},
      // by a constant: the multiple of c leaves the atom, the gcd is divided out
      {x + 1, 2, "floordiv(s0 + 1, 2)", "mod(s0 + 1, 2)"},
      {x + 3, 2, "floordiv(s0 + 1, 2) + 1", "mod(s0 + 1, 2)"},
      {2 * x, 4, "floordiv(s0, 2)", "2*mod(s0, 2)"},
      {6 * x + 5, 4, "s0 + floordiv(2*s0 + 1, 4) + 1", "mod(2*s0 + 1, 4)"},
      {x, -2, "-s0 + floordiv(s0, 2)", "-mod(s0, 2)"},
      // by a symbolic divisor that does not divide
      {x, y, "floordiv(s0, s1)", "mod(s0, s1)"},
      {x * y + 1, x, "floordiv(s0*s1 + 1, s0)", "mod(s0*s1 + 1, s0)"},
      {5, x, "floordiv(5, s0)", "mod(5, s0)"},
      {3 * x * y, 2 * x, "floordiv(3*s0*s1, 2*s0)", "mod(3*s0*s1, 2*s0)"},
  };
  for (const Row& row : rows) {
    INFO(row.a.str() << " by " << row.b.str());
    CHECK(floordiv(row.a, row.b).str() == row.div);
    CHECK(mod(row.a, row.b).str() == row.rem);
  }
  CHECK(floordiv(x + 3, 2) == floordiv(x + 1, 2) + 1);
  CHECK(floordiv(2 * x, 4) == floordiv(x, 2));
  CHECK(error_of<ValueError>([] { return floordiv(x, 0); }) ==
        "[floordiv] division by zero: floordiv(s0, 0)");
  CHECK(error_of<ValueError>([] { return mod(3, 0); }) == "[mod] division by zero: mod(3, 0)");
}

namespace {

// A random expression over s0..s2 and its value at each point, computed with plain integers.
struct Sample {
  SymInt e;
  std::vector<int64_t> v;
};

Sample leaf(Rng& rng, const std::vector<std::vector<int64_t>>& points) {
  Sample s;
  if (rng.next() % 2) {
    int32_t id = static_cast<int32_t>(rng.next() % 3);
    s.e = SymInt::symbol(id);
    for (const auto& p : points) s.v.push_back(p[id]);
  } else {
    int64_t c = static_cast<int64_t>(rng.next() % 9) - 4;
    s.e = c;
    s.v.assign(points.size(), c);
  }
  return s;
}

// Only + - * (a polynomial), or also floordiv and mod by a constant or by s_i + k (k >= 1, so
// nonzero at the points, whose values are >= 0).
Sample random_expr(Rng& rng, int depth, bool divide,
                   const std::vector<std::vector<int64_t>>& points) {
  if (depth == 0 || rng.next() % 4 == 0) return leaf(rng, points);
  Sample a = random_expr(rng, depth - 1, divide, points);
  const int op = static_cast<int>(rng.next() % (divide ? 5 : 3));
  Sample b;
  if (op >= 3) {
    if (rng.next() % 2) {
      int64_t c = static_cast<int64_t>(rng.next() % 7) - 3;
      b = {c == 0 ? 4 : c, std::vector<int64_t>(points.size(), c == 0 ? 4 : c)};
    } else {
      int32_t id = static_cast<int32_t>(rng.next() % 3);
      int64_t k = 1 + static_cast<int64_t>(rng.next() % 3);
      b.e = SymInt::symbol(id) + k;
      for (const auto& p : points) b.v.push_back(p[id] + k);
    }
  } else {
    b = random_expr(rng, depth - 1, divide, points);
  }
  Sample r;
  switch (op) {
    case 0:
      r.e = a.e + b.e;
      break;
    case 1:
      r.e = a.e - b.e;
      break;
    case 2:
      r.e = a.e * b.e;
      break;
    case 3:
      r.e = floordiv(a.e, b.e);
      break;
    default:
      r.e = mod(a.e, b.e);
      break;
  }
  for (size_t i = 0; i < points.size(); ++i) {
    const int64_t p = a.v[i], q = b.v[i];
    const int64_t want[] = {p + q, p - q, p * q, op >= 3 ? py_floordiv(p, q) : 0,
                            op >= 3 ? py_mod(p, q) : 0};
    r.v.push_back(want[op]);
    // (a op b).evaluate == a.evaluate op b.evaluate, at every node of the tree.
    CHECK_MESSAGE(r.e.evaluate(points[i]) == want[op],
                  a.e << " op" << op << " " << b.e << " = " << r.e);
  }
  return r;
}

std::vector<std::vector<int64_t>> random_points(Rng& rng, int n) {
  std::vector<std::vector<int64_t>> points(n);
  for (auto& p : points) {
    for (int i = 0; i < 3; ++i) p.push_back(static_cast<int64_t>(rng.next() % 6));
  }
  return points;
}

}  // namespace

TEST_CASE("SymInt: random expressions evaluate like integers") {
  Rng rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const auto points = random_points(rng, 8);
    Sample a = random_expr(rng, 4, trial % 2 == 1, points);
    Sample b = random_expr(rng, 3, trial % 2 == 1, points);
    INFO("a = " << a.e << ", b = " << b.e);
    for (size_t i = 0; i < points.size(); ++i) CHECK(a.e.evaluate(points[i]) == a.v[i]);
    // Identities that hold on the canonical forms themselves.
    CHECK(a.e + b.e == b.e + a.e);
    CHECK(a.e * b.e == b.e * a.e);
    CHECK((a.e - b.e) + b.e == a.e);
    CHECK(a.e * (b.e + 1) == a.e * b.e + a.e);
    CHECK((a.e + b.e).hash() == (b.e + a.e).hash());
    CHECK(floordiv(a.e * 6, 3) == a.e * 2);
    CHECK(mod(a.e * 6, 3) == 0);
    // Substituting every symbol by its value is evaluation; substituting one keeps the rest.
    for (size_t i = 0; i < points.size(); ++i) {
      const auto& p = points[i];
      CHECK(a.e.substitute({SymInt(p[0]), SymInt(p[1]), SymInt(p[2])}) == a.v[i]);
      SymInt partial = a.e.substitute({std::nullopt, SymInt(p[1])});
      CHECK(partial.evaluate(p) == a.v[i]);
      for (int32_t id : partial.symbols()) CHECK(id != 1);
    }
  }
}

TEST_CASE("SymInt: exact division of random polynomials") {
  Rng rng(11);
  int exact_symbolic = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const auto points = random_points(rng, 1);
    SymInt p = random_expr(rng, 3, false, points).e;
    SymInt q = random_expr(rng, 2, false, points).e;
    if (q == 0) continue;
    INFO("p = " << p << ", q = " << q);
    CHECK(floordiv(p * q, q) == p);
    CHECK(mod(p * q, q) == 0);
    exact_symbolic += !q.is_concrete() && !p.is_concrete();
  }
  CHECK(exact_symbolic > 50);
}

TEST_CASE("SymInt: tri-state comparisons") {
  SymbolBounds y_pos = SymbolBounds().at_least(1, 1);
  SymbolBounds x_ge2 = SymbolBounds().at_least(0, 2);
  SymbolBounds x_ge1 = SymbolBounds().at_least(0, 1);
  const SymbolBounds none;
  using T = Truth;
  struct Row {
    Truth got, want;
    const char* what;
  };
  const Row rows[] = {
      {sym_lt(0, x + 1), T::True, "s0 + 1 > 0"},
      {sym_ge(x, 0), T::True, "s0 >= 0"},
      {sym_eq(x, 3), T::Unknown, "s0 == 3"},
      {sym_eq(2 * x, x + x), T::True, "2*s0 == s0 + s0"},
      {sym_eq(x * y, y * x), T::True, "s0*s1 == s1*s0"},
      {sym_eq(x + 1, x), T::False, "s0 + 1 == s0"},
      {sym_eq(-x - 1, 0), T::False, "-s0 - 1 == 0"},
      {sym_lt(x, x + 1), T::True, "s0 < s0 + 1"},
      {sym_le(x + 1, x), T::False, "s0 + 1 <= s0"},
      {sym_gt(x + y + 1, x), T::True, "s0 + s1 + 1 > s0"},
      {sym_lt(x, y), T::Unknown, "s0 < s1"},
      {sym_ge(x * x, 0), T::True, "s0**2 >= 0"},
      // (s0 - 1)**2 >= 0 holds but is beyond the shift-and-check proof
      {sym_ge(x * x - 2 * x + 1, 0), T::Unknown, "s0**2 - 2*s0 + 1 >= 0"},
      {sym_le(x, x * y), T::Unknown, "s0 <= s0*s1"},
      {sym_le(x, x * y, y_pos), T::True, "s0 <= s0*s1, s1 >= 1"},
      {sym_eq(x, 1, x_ge2), T::False, "s0 == 1, s0 >= 2"},
      {sym_lt(1, x), T::Unknown, "1 < s0"},
      {sym_lt(1, x, x_ge2), T::True, "1 < s0, s0 >= 2"},
      {sym_ge(x - 1, 0), T::Unknown, "s0 - 1 >= 0"},
      {sym_ge(x - 1, 0, x_ge1), T::True, "s0 - 1 >= 0, s0 >= 1"},
      {sym_lt(floordiv(x, 2), 0), T::False, "floordiv(s0, 2) < 0"},
      {sym_ge(floordiv(x + 4, 2), 2), T::True, "floordiv(s0 + 4, 2) >= 2"},
      {sym_ge(mod(x, 4), 0), T::True, "mod(s0, 4) >= 0"},
      {sym_lt(mod(x, y), 0), T::Unknown, "mod(s0, s1) < 0"},
      {sym_lt(mod(x, y), 0, y_pos), T::False, "mod(s0, s1) < 0, s1 >= 1"},
      {sym_ge(floordiv(x, y), 0, y_pos), T::True, "floordiv(s0, s1) >= 0, s1 >= 1"},
      {sym_lt(2, 3), T::True, "2 < 3"},
      {sym_eq(3, 3), T::True, "3 == 3"},
      {sym_eq(3, 4), T::False, "3 == 4"},
      {sym_le(4, 3), T::False, "4 <= 3"},
      {sym_ge(4, 3, none), T::True, "4 >= 3"},
      // a - b overflows: nothing is proven, nothing throws
      {sym_le(x * kMax, -x * kMax), T::Unknown, "overflowing difference"},
  };
  for (const Row& row : rows) {
    INFO(row.what);
    CHECK(truth_name(row.got) == std::string(truth_name(row.want)));
  }
  CHECK(lower_bound(2 * x * y + x + 3) == 3);
  CHECK(lower_bound(2 * x * y + x + 3, SymbolBounds().at_least(0, 2).at_least(1, 1)) == 9);
  CHECK(lower_bound(x - y) == std::nullopt);
  CHECK(x_ge2.lower_of(0) == 2);
  CHECK(x_ge2.lower_of(5) == 0);
}

TEST_CASE("SymInt: hash and equality agree; equal values share one node") {
  // Groups of equal values built different ways; different groups are different values.
  const std::vector<std::vector<SymInt>> groups = {
      {5 * x, x * 3 + x * 2, x + x + x + x + x},
      {(x + 1) * (x + 1), x * x + 2 * x + 1, (x + 1) * x + x + 1},
      {x * y, y * x},
      {floordiv(x + 1, 2), floordiv(x + 3, 2) - 1},
      {mod(x, y), mod(x + 0, y * 1)},
      {0, x - x, mod(x * y, x)},
      {1, floordiv(x, x)},
      {y},
  };
  std::unordered_set<SymInt> set;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const SymInt& a : groups[i]) {
      set.insert(a);
      for (size_t j = 0; j < groups.size(); ++j) {
        for (const SymInt& b : groups[j]) {
          CHECK((a == b) == (i == j));
          CHECK((a != b) == (i != j));
          if (i == j) CHECK(a.hash() == b.hash());
          if (i == j) CHECK(a.node() == b.node());
        }
      }
    }
  }
  CHECK(set.size() == groups.size());
}

TEST_CASE("SymInt: interning is thread-safe") {
  // Threads build the same expressions at once; each must get the same nodes.
  constexpr int kThreads = 4, kExprs = 200;
  std::vector<std::vector<const void*>> nodes(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &nodes] {
      for (int i = 0; i < kExprs; ++i) {
        SymInt a = SymInt::symbol(i % 7) + i;
        SymInt b = floordiv(a * SymInt::symbol(i % 5 + 10) + 1, i % 3 + 2);
        nodes[t].push_back(b.node());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) CHECK(nodes[t] == nodes[0]);
}

TEST_CASE("SymInt: symbols()") {
  CHECK((x * floordiv(z, y) + 1).symbols() == std::vector<int32_t>{0, 1, 2});
  CHECK((x - x + y).symbols() == std::vector<int32_t>{1});
  CHECK((z * z * x).symbols() == std::vector<int32_t>{0, 2});
}

TEST_CASE("SymInt: errors") {
  // int64 overflow of coefficients and constants
  CHECK(error_of<ValueError>([] { return SymInt(kMax) + 1; }) ==
        "[SymInt] int64 overflow in add(9223372036854775807, 1)");
  CHECK(error_of<ValueError>([] { return x * kMax * 2; }) ==
        "[SymInt] int64 overflow in mul(9223372036854775807*s0, 2)");
  CHECK(error_of<ValueError>([] { return (x + kMax) + 1; }) ==
        "[SymInt] int64 overflow in add(s0 + 9223372036854775807, 1)");
  CHECK(error_of<ValueError>([] { return -SymInt(kMin); }) ==
        "[SymInt] int64 overflow in sub(0, -9223372036854775808)");
  CHECK(error_of<ValueError>([] {
          return x * kMin - x;
        }).rfind("[SymInt] int64 overflow in sub(", 0) == 0);
  CHECK(error_of<ValueError>([] { return floordiv(kMin, -1); }) ==
        "[SymInt] int64 overflow in floordiv(-9223372036854775808, -1)");
  CHECK(error_of<ValueError>([] { (x * x).evaluate({int64_t{1} << 32}); }) ==
        "[SymInt.evaluate] int64 overflow evaluating s0**2");
  // evaluation: a missing binding names the symbol; a zero divisor names the division
  CHECK(error_of<ValueError>([] { (x + y).evaluate({3}); }) ==
        "[SymInt.evaluate] no binding for symbol s1 in s0 + s1 (1 bindings given)");
  CHECK(
      error_of<ValueError>([] {
        (floordiv(x, y) + 1).evaluate({3, 0});
      }) ==
      "[SymInt.evaluate] division by zero in floordiv(s0, s1): s1 is 0 (in floordiv(s0, s1) + 1)");
  CHECK(error_of<ValueError>([] {
          mod(x, y - 2).evaluate({3, 2});
        }) ==
        "[SymInt.evaluate] division by zero in mod(s0, s1 - 2): s1 - 2 is 0 (in mod(s0, s1 - 2))");
  // a symbolic value where a concrete one is needed is our bug, not the user's
  CHECK(error_of<InternalError>([] { return (x + 1).concrete(); }) ==
        "[SymInt.concrete] s0 + 1 is symbolic, not a concrete size");
  CHECK(error_of<ValueError>([] { return SymInt::symbol(-1); }) ==
        "[SymInt.symbol] symbol ids are >= 0, got -1");
  CHECK(error_of<ValueError>([] { return SymbolBounds().at_least(-2, 1); }) ==
        "[SymbolBounds] symbol ids are >= 0, got -2");
}

}  // namespace duet::test
