// Random programs (random_program.h): the generator's fusion mix, programs built to stress
// elementwise fusion and the memory planner.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "random_program.h"

namespace duet::test {

// Note [Inexact values]
// A fused kernel computes each element of an elementwise op exactly as eager does, whatever the
// operands' layout, but a fused sum adds in another order (block by block, or split over
// threads): sums and means, and softmax, log_softmax and logsumexp, round differently, and so
// does everything computed from them. The comparison allows for rounding relative to each tensor's
// magnitude; it cannot allow for an error that a later step blows up (a difference of two large
// values that nearly cancel, a sum of thousands of elements that all carry the same error), nor for
// one that a discontinuity or a kink turns into a wrong result or gradient (comparisons, maximum,
// abs, relu, clamp, the abs inside log, sqrt, div and pow, casts to b8 and integers, max and min
// over dims). So the generator estimates, per value, how far compiled may be from eager (the
// largest absolute difference; 0 for exact values): a reduction adds its own rounding, other steps
// carry their operands' errors (the step run again with the operands moved by their errors, each
// way). It rejects a step whose result's error comes within a fifth of the comparison's absolute
// tolerance, a kink step whose operands come within ten times their error of the kink, and max and
// min over dims of inexact values.

// Note [Low-precision fusion programs]
// Programs of the fusion mix in bf16 and f16 (Mix::LowFusion) check that a fused kernel rounds
// as the eager kernels do: each op computes in f32 and rounds its result to the op's dtype once,
// so fused and eager agree bit for bit on every elementwise value, and the comparison allows no
// difference. Their inputs of the iteration shape are bf16 or f16, the others that, the other
// one, f32, i32 or b8; casts go between the three floating dtypes. A low-precision sum, mean,
// softmax, log_softmax or logsumexp accumulates in f32, in another order when fused, and rounds
// once at the end: it is kept only where that rounding is settled, where every element's exact
// value lies further from the dtype's rounding boundaries than any order of f32 math can move
// it (rounding_settled); elsewhere the step is rejected, as a step with too large an error is.
// So a low-precision value is exact or absent, while f32 values keep the errors of Note
// [Inexact values]. Low-precision gradients are allowed two of their dtype's ulps: a broadcast
// operand's gradient is a low-precision sum of the same kind, whose rounding a later rule may
// carry on (none differed at all over 1,000 programs, but nothing settles those sums).

namespace {

// The smallest |a - b| over the broadcast elements.
double gap(const Tensor& a, const Tensor& b) {
  double m = INFINITY;
  for (double x : values(abs(a.to(DType::f64) - b.to(DType::f64)))) m = std::min(m, x);
  return m;
}
double gap(const Tensor& a, double s) {
  return gap(a, full(Shape{}, s, Options().dtype(DType::f64)));
}
// The smallest distance to an integer (where a cast to an integer type jumps).
double integer_gap(const Tensor& a) {
  double m = INFINITY;
  for (double x : values(a)) m = std::min(m, std::fabs(x - std::round(x)));
  return m;
}

// The sums (or means) a Sum or Mean step computes from x, per output element, added in long
// double with compensation (Kahan): within a few long double ulps of exact.
std::vector<long double> exact_reduction(const Step& st, const Tensor& x) {
  const int64_t r = x.dim();
  std::vector<bool> reduced(size_t(r), st.ints.empty());
  for (int64_t d : st.ints) reduced[size_t(d < 0 ? d + r : d)] = true;
  std::vector<int64_t> order;  // the kept dims, then the reduced ones
  for (int64_t d = 0; d < r; ++d)
    if (!reduced[size_t(d)]) order.push_back(d);
  int64_t kept = 1;
  for (int64_t d : order) kept *= x.sizes()[d];
  for (int64_t d = 0; d < r; ++d)
    if (reduced[size_t(d)]) order.push_back(d);
  const std::vector<double> v = values(r > 0 ? permute(x, Dims(order)).contiguous() : x);
  const size_t n = v.size() / size_t(kept);
  std::vector<long double> out(size_t(kept), 0.0L);
  for (size_t i = 0; i < out.size(); ++i) {
    long double sum = 0, lost = 0;
    for (size_t j = 0; j < n; ++j) {
      const long double y = v[i * n + j] - lost, t = sum + y;
      lost = (t - sum) - y;
      sum = t;
    }
    out[i] = st.op == Op::Mean ? sum / (long double)(n) : sum;
  }
  return out;
}

// bf16's sibling is f16, and f16's bf16.
DType low_sibling(DType d) { return d == DType::bf16 ? DType::f16 : DType::bf16; }

template <class T>
T one_of(Generator& g, std::initializer_list<T> v) {
  return *(v.begin() + g.irand(0, int64_t(v.size()) - 1));
}

}  // namespace

double Generator::kink_distance(const Step& st) const {
  auto arg = [&](size_t i) -> const Tensor& { return at(st.args[i]); };
  switch (st.op) {
    case Op::Relu:
    case Op::Abs:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
      return gap(arg(0), 0);
    case Op::Exp:  // exp(clamp(x, -4, 4))
      return std::min(gap(arg(0), -4), gap(arg(0), 4));
    case Op::Clamp:
      return std::min(gap(arg(0), st.s), gap(arg(0), st.s2));
    case Op::Maximum:
    case Op::Minimum:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne:
      return st.mode == 1 || st.mode == 2 ? gap(arg(0), st.s) : gap(arg(0), arg(1));
    case Op::Div:  // the divisor is |b| + 0.5
      return st.mode == 1 ? INFINITY : gap(arg(st.mode == 2 ? 0 : 1), 0);
    case Op::Pow:  // pow(|a| + 0.5, clamp(b, -2, 2)), pow(|a| + 0.5, s), pow(s, clamp(b, -3, 3))
      if (st.mode == 1) return gap(arg(0), 0);
      if (st.mode == 2) return std::min(gap(arg(0), -3), gap(arg(0), 3));
      return std::min({gap(arg(0), 0), gap(arg(1), -2), gap(arg(1), 2)});
    case Op::Cast:
      if (static_cast<DType>(st.mode) == DType::b8) return gap(arg(0), 0);
      return is_floating(static_cast<DType>(st.mode)) ? INFINITY : integer_gap(arg(0));
    case Op::Max:
    case Op::Min:
      return 0;
    default:
      return INFINITY;
  }
}

double Generator::error_estimate(const Step& st, const Tensor& out) const {
  double in = 0;
  std::vector<int> moved;  // the operands with an error, each once
  for (int a : st.args) {
    in = std::max(in, err_[size_t(a)]);
    if (err_[size_t(a)] > 0 && std::find(moved.begin(), moved.end(), a) == moved.end())
      moved.push_back(a);
  }
  if (in > 0 && kink_distance(st) <= 10 * in) return -1;
  if (!floating(out)) return 0;
  const bool low = out.dtype() == DType::bf16 || out.dtype() == DType::f16;
  if (low && (st.op == Op::Sum || st.op == Op::Mean || st.op == Op::Softmax ||
              st.op == Op::LogSoftmax || st.op == Op::LogSumExp))
    return in == 0 && rounding_settled(st, out) ? 0 : -1;
  const double eps = out.dtype() == DType::f32 ? 6e-8 : 1.2e-16;
  double e = 0;
  if (st.op == Op::Cast) {
    e = in > 0 ? in + eps * max_abs(out) : 0;
  } else if (in > 0) {
    // In f64, operands and all, so that a move smaller than an f32 ulp is not rounded away.
    std::vector<Tensor> base = pool_;
    for (int a : st.args)
      if (floating(at(a))) base[size_t(a)] = at(a).to(DType::f64);
    const Tensor want = apply_step(st, base).to(DType::f64);
    for (unsigned signs = 0; signs < (1u << moved.size()); ++signs) {
      std::vector<Tensor> alt = base;
      for (size_t j = 0; j < moved.size(); ++j) {
        const double d = err_[size_t(moved[j])];
        alt[size_t(moved[j])] = base[size_t(moved[j])] + ((signs >> j) & 1 ? d : -d);
      }
      e = std::max(e, max_abs(apply_step(st, alt).to(DType::f64) - want));
    }
  }
  const Tensor& x = at(st.args[0]);
  if (st.op == Op::Sum || st.op == Op::Mean) {
    // Another order rounds differently, by about as much as this one: four times eager's
    // difference from the exact result, and at least the last rounding.
    const std::vector<long double> exact = exact_reduction(st, x);
    const std::vector<double> got = values(out);
    long double off = 0;
    for (size_t i = 0; i < got.size(); ++i) off = std::max(off, std::fabs(got[i] - exact[i]));
    e += 4 * double(off) + 2 * eps * max_abs(out);
  } else if (st.op == Op::Softmax || st.op == Op::LogSoftmax || st.op == Op::LogSumExp) {
    // A sum of positive terms inside: relative rounding up to about sqrt(n) eps.
    const int64_t d = st.ints[0] < 0 ? st.ints[0] + x.dim() : st.ints[0];
    e += (8 + 2 * std::sqrt(double(x.sizes()[d]))) * eps * std::max(1.0, max_abs(out));
  }
  // Against the comparison's absolute tolerance for f32 (for f64 too: a program that computes
  // in both compares f64 values with it, and f64 errors are far smaller otherwise); bf16 and f16
  // values are compared bit for bit (Note [Low-precision fusion programs]).
  return e <= 0.2 * value_tolerance(low ? out.dtype() : DType::f32).atol *
                     std::max(1.0, max_abs(out))
             ? e
             : -1;
}

bool Generator::rounding_settled(const Step& st, const Tensor& out) const {
  const Tensor x = at(st.args[0]).to(DType::f64);
  const int64_t n = std::max<int64_t>(1, x.numel() / std::max<int64_t>(1, out.numel()));
  std::vector<long double> exact;
  std::vector<double> bound;
  if (st.op == Op::Sum || st.op == Op::Mean) {
    // Any order of f32 additions is within (n - 1) u of the sum of magnitudes (u = 2^-24);
    // a mean divides once more.
    exact = exact_reduction(st, x);
    Step sum = st;
    sum.op = Op::Sum;
    const std::vector<long double> mags = exact_reduction(sum, abs(x));
    for (size_t i = 0; i < exact.size(); ++i) {
      double b = double(n + 1) * 0x1p-24 * double(mags[i]);
      if (st.op == Op::Mean) b = b / double(n) + 0x1p-23 * std::fabs(double(exact[i]));
      bound.push_back(b);
    }
  } else {
    // softmax, log_softmax, logsumexp in f32: as in error_estimate, about sqrt(n) rounding
    // errors relative to the magnitudes the exponentials and logarithms work at.
    std::vector<Tensor> base = pool_;
    base[size_t(st.args[0])] = x;
    const double scale = 1 + max_abs(x);
    for (double v : values(apply_step(st, base))) {
      exact.push_back(v);
      bound.push_back((8 + 2 * std::sqrt(double(n))) * 0x1p-24 * scale * (1 + std::fabs(v)));
    }
  }
  for (size_t i = 0; i < exact.size(); ++i) {
    const double v = double(exact[i]);
    if (round_to(v - bound[i], out.dtype()) != round_to(v + bound[i], out.dtype())) return false;
  }
  return true;
}

// Iteration shapes by size: a few elements (partial blocks), about a thousand (rows longer than
// a block, which cross block ends), past 4096 (several blocks) and past 65,536 (the fused
// kernels split their work over both threads from 2 * kParallelGrain elements).
Shape Generator::fusion_shape() {
  const double r = urand(0, 1);
  if (r < 0.15)
    return one_of<Shape>(*this, {{}, {1}, {1, 1}, {7}, {1, 7}, {7, 1}, {33}, {3, 11}, {33, 1}});
  if (r < 0.55) {
    if (chance(0.3)) return Shape{irand(2, 4), irand(2, 5), one_of<int64_t>(*this, {7, 33, 65})};
    return Shape{one_of<int64_t>(*this, {2, 3, 5, 8, 16, 17}),
                 one_of<int64_t>(*this, {7, 31, 33, 63, 65, 127})};
  }
  if (r < 0.89)
    return one_of<Shape>(*this, {{1000},
                                 {1, 1031},
                                 {2, 1000},
                                 {3, 1001},
                                 {33, 37},
                                 {37, 33},
                                 {4, 513},
                                 {2, 3, 347},
                                 {1031, 1}});
  if (r < 0.99)
    return one_of<Shape>(*this, {{5, 1031}, {65, 67}, {3, 2053}, {4099}, {2, 3, 1000}, {9, 1000}});
  return one_of<Shape>(*this, {{67, 1031}, {2, 33001}, {65600}, {3, 2, 11000}});
}

void Generator::make_fusion_inputs() {
  p_.domain = Domain{};
  p_.domain.lo = -2;
  p_.domain.hi = 2;
  p_.domain.discrete = chance(0.15);
  DType main = chance(0.5) ? DType::f32 : DType::f64;
  DType other = main == DType::f32 ? DType::f64 : DType::f32;
  if (p_.mix == Mix::LowFusion) {  // Note [Low-precision fusion programs]
    main = chance(0.5) ? DType::bf16 : DType::f16;
    other = chance(0.6) ? DType::f32 : main == DType::bf16 ? DType::f16 : DType::bf16;
  }
  shape_ = fusion_shape();
  max_numel_ = std::max(shape_.numel(), kMaxNumel);
  const int64_t rank = shape_.size();
  auto layout = [&](const Shape& s) {
    const int l = int(irand(0, 5));
    const bool transposable = s.size() >= 2 && s[s.size() - 1] > 1 && s[s.size() - 2] > 1;
    return l == 1 && transposable   ? Layout::Transposed
           : l == 2 && s.size() > 0 ? Layout::Strided
           : l == 3                 ? Layout::Offset
                                    : Layout::Contiguous;
  };
  // Operands of the iteration shape: some stored smaller and expanded, some captured.
  const int full = int(irand(1, 3));
  for (int i = 0; i < full; ++i) {
    InputSpec in;
    in.shape = in.made = shape_;
    in.dtype = chance(0.9) ? main : other;
    if (rank > 0 && chance(0.15))
      for (int64_t d = 0; d < rank; ++d)
        if (chance(0.5)) in.made[d] = 1;
    in.layout = layout(in.made);
    in.captured = in.made == in.shape && chance(0.1);
    p_.inputs.push_back(in);
  }
  // Broadcast operands: 0-d, the trailing dims ([n]), leading dims of 1 ([1, n]), trailing
  // dims of 1 ([m, 1]), or any dims of 1.
  const int bcast = int(irand(rank == 0 ? 0 : 1, 3));
  for (int i = 0; i < bcast; ++i) {
    InputSpec in;
    Shape s = shape_;
    const int kind = int(irand(0, 4));
    const int64_t j = rank > 1 ? irand(1, rank - 1) : 1;
    if (kind == 0) {
      s = {};
    } else if (kind == 1) {
      s = rank > 1 ? Shape(shape_.data() + j, rank - j) : Shape{1};
    } else if (kind == 2) {
      for (int64_t d = 0; d < std::min(j, rank); ++d) s[d] = 1;
    } else if (kind == 3) {
      for (int64_t d = rank - std::min(j, rank); d < rank; ++d) s[d] = 1;
    } else {
      for (int64_t d = 0; d < rank; ++d)
        if (chance(0.5)) s[d] = 1;
    }
    if (s == shape_) s = {};
    in.shape = in.made = s;
    const double t = urand(0, 1);
    in.dtype = t < 0.77 ? main : t < 0.9 ? other : t < 0.95 ? DType::i32 : DType::b8;
    in.layout = layout(s);
    in.captured = chance(0.1);
    p_.inputs.push_back(in);
  }
  first_ = sample_values(rng_);
  pool_ = build_inputs(p_, first_, false);
  blocked_.assign(pool_.size(), false);
  err_.assign(pool_.size(), 0.0);
}

int Generator::pick_chain() {
  if (chance(0.85)) {
    int a = pick([&](const Tensor& t) { return floating(t) && t.sizes() == shape_; });
    if (a >= 0) return a;
  }
  return pick([](const Tensor& t) { return floating(t); });
}

int Generator::pick_partner(int a, bool ints_ok) {
  const Shape sa = at(a).sizes();
  auto type_ok = [&](const Tensor& t) {
    return floating(t) || (ints_ok && t.dtype() != DType::b8);
  };
  const double r = urand(0, 1);
  if (r < 0.45) {  // any smaller operand whose broadcast keeps a's shape, old ones as likely
    std::vector<int> c;
    for (size_t i = 0; i < pool_.size(); ++i) {
      const Shape& s = pool_[i].sizes();
      if (type_ok(pool_[i]) && s != sa && can_broadcast(sa, s) && broadcast_shape(sa, s) == sa)
        c.push_back(int(i));
    }
    if (!c.empty()) return c[size_t(irand(0, int64_t(c.size()) - 1))];
  }
  if (r < 0.75) {
    int b = pick([&](const Tensor& t) { return type_ok(t) && t.sizes() == sa; });
    if (b >= 0) return b;
  }
  return pick([&](const Tensor& t) {
    return type_ok(t) && can_broadcast(sa, t.sizes()) &&
           broadcast_shape(sa, t.sizes()).numel() <= max_numel_;
  });
}

Step Generator::unary_on(int a) {
  Step st;
  st.op = one_of(
      *this, {Op::Neg, Op::Exp, Op::Log, Op::Sqrt, Op::Rsqrt, Op::Abs, Op::Sin, Op::Cos, Op::Tanh,
              Op::Sigmoid, Op::Relu, Op::Gelu, Op::Silu, Op::Erf, Op::LogSigmoid, Op::Clamp});
  st.args = {a};
  if (st.op == Op::Clamp) {
    st.s = -urand(0.2, 2);
    st.s2 = urand(0.2, 2);
  } else {
    st.mode = chance(0.15) ? 1 : (st.op == Op::Neg && chance(0.3)) ? 2 : 0;
  }
  return st;
}

Step Generator::binary_on(int a, int b) {
  Step st;
  st.op = one_of(*this, {Op::Add, Op::Add, Op::Sub, Op::Sub, Op::Mul, Op::Mul, Op::Mul, Op::Div,
                         Op::Maximum, Op::Minimum, Op::Pow});
  st.args = {a};
  if (b < 0) {
    st.mode = chance(0.5) ? 1 : 2;
    scalar_operand(st.op, st, at(a));
    return st;
  }
  st.args.push_back(b);
  if (chance(0.35)) std::swap(st.args[0], st.args[1]);  // the broadcast operand on the left
  const bool has_operator =
      st.op == Op::Add || st.op == Op::Sub || st.op == Op::Mul || st.op == Op::Div;
  st.mode = has_operator && chance(0.15) ? 3 : 0;
  return st;
}

// kind: 0 unary, 1 binary, 2 comparison, 3 where, 4 cast.
bool Generator::propose_fusion(Step& st, int kind) {
  st = Step{};
  switch (kind) {
    case 0: {
      const int a = pick_chain();
      if (a < 0) return false;
      st = unary_on(a);
      return true;
    }
    case 1: {
      const int a = pick_chain();
      if (a < 0) return false;
      if (chance(0.3)) {
        st = binary_on(a, -1);
        return true;
      }
      // Peek at the op first: integers only where eager promotes them (not mul, not pow).
      st = binary_on(a, a);
      const bool ints_ok = st.op == Op::Add || st.op == Op::Sub || st.op == Op::Maximum ||
                           st.op == Op::Minimum || st.op == Op::Div;
      const int b = pick_partner(a, ints_ok);
      if (b < 0) return false;
      st.args[chance(0.35) ? 0 : 1] = b;  // the broadcast operand on either side
      return true;
    }
    case 2: {
      const int a = pick_chain();
      if (a < 0) return false;
      st.op = one_of(*this, {Op::Lt, Op::Le, Op::Gt, Op::Ge, Op::Eq, Op::Ne});
      st.args = {a};
      if (chance(0.4)) {
        st.mode = chance(0.5) ? 1 : 2;
        st.s = p_.domain.discrete ? std::round(urand(-2, 2) * 2) / 2 : urand(-1.5, 1.5);
        return true;
      }
      const int b = pick_partner(a, true);
      if (b < 0) return false;
      st.args.push_back(b);
      if (chance(0.3)) std::swap(st.args[0], st.args[1]);
      return true;
    }
    case 3: {
      const int c = pick([](const Tensor& t) { return t.dtype() == DType::b8; });
      const int a = pick_chain();
      if (c < 0 || a < 0 || !can_broadcast(at(c).sizes(), at(a).sizes())) return false;
      const Shape sca = broadcast_shape(at(c).sizes(), at(a).sizes());
      if (sca.numel() > max_numel_) return false;
      st.op = Op::Where;
      st.args = {c, a};
      if (chance(0.3)) {
        st.mode = chance(0.5) ? 1 : 2;
        st.s = nice_scalar();
        return true;
      }
      int b = -1;
      if (chance(0.4)) {  // a broadcast operand
        std::vector<int> cand;
        for (size_t i = 0; i < pool_.size(); ++i) {
          const Shape& s = pool_[i].sizes();
          if (floating(pool_[i]) && s != sca && can_broadcast(sca, s) &&
              broadcast_shape(sca, s) == sca)
            cand.push_back(int(i));
        }
        if (!cand.empty()) b = cand[size_t(irand(0, int64_t(cand.size()) - 1))];
      }
      if (b < 0)
        b = pick([&](const Tensor& t) {
          return floating(t) && can_broadcast(sca, t.sizes()) &&
                 broadcast_shape(sca, t.sizes()).numel() <= max_numel_;
        });
      if (b < 0) return false;
      st.args.push_back(b);
      if (chance(0.5)) std::swap(st.args[1], st.args[2]);
      return true;
    }
    default: {
      const int a = chance(0.7) ? pick_chain() : pick([](const Tensor& t) { return !floating(t); });
      if (a < 0) return false;
      st.op = Op::Cast;
      st.args = {a};
      const DType from = at(a).dtype();
      const bool low = p_.mix == Mix::LowFusion;
      const DType wide = low ? DType::f32 : DType::f64;  // the widest float of the mix
      DType other_float = from == DType::f32 ? DType::f64 : DType::f32;
      if (low)
        other_float = from != DType::f32 ? (chance(0.6) ? DType::f32 : low_sibling(from))
                      : chance(0.5)      ? DType::bf16
                                         : DType::f16;
      const double r = urand(0, 1);
      DType to;
      if (is_floating(from))
        to = r < 0.5 ? other_float : r < 0.6 ? from : r < 0.85 ? DType::b8 : DType::i32;
      else
        to = r < 0.6 ? p_.inputs[0].dtype : r < 0.9 ? wide : low ? DType::bf16 : DType::f32;
      st.mode = int(to);
      return true;
    }
  }
}

// A reduction at the end of a chain: over the trailing dims, the leading dims, all of them or
// one in the middle, keeping them or not; or softmax, log_softmax or logsumexp over one dim.
bool Generator::propose_reduction(Step& st) {
  st = Step{};
  const int a =
      chance(0.1) ? pick([](const Tensor& t) { return t.dtype() == DType::b8; }) : pick_chain();
  if (a < 0) return false;
  const Tensor& A = at(a);
  const int64_t r = A.dim();
  st.args = {a};
  const double k = urand(0, 1);
  if (k < 0.2 && r >= 1 && floating(A)) {
    st.op = one_of(*this, {Op::Softmax, Op::LogSoftmax, Op::LogSumExp});
    const int64_t d = chance(0.65) ? r - 1 : chance(0.6) ? 0 : irand(0, r - 1);
    st.ints = {wrap_or_negative(d, r)};
    return true;
  }
  st.op = !floating(A) || k < 0.5 ? Op::Sum : k < 0.65 ? Op::Mean : k < 0.82 ? Op::Max : Op::Min;
  st.mode = chance(0.5);  // keepdim
  const double w = urand(0, 1);
  if (r == 0 || w < 0.2) {  // all dims: none named, or every one
    if (r > 0 && chance(0.5))
      for (int64_t d = 0; d < r; ++d) st.ints.push_back(wrap_or_negative(d, r));
  } else if (w < 0.6) {
    for (int64_t d = r - irand(1, r); d < r; ++d) st.ints.push_back(wrap_or_negative(d, r));
  } else if (w < 0.9) {
    for (int64_t d = 0, n = irand(1, r); d < n; ++d) st.ints.push_back(wrap_or_negative(d, r));
  } else {
    st.ints = {wrap_or_negative(irand(0, r - 1), r)};
  }
  if (chance(0.3)) std::reverse(st.ints.begin(), st.ints.end());
  return true;
}

std::string Generator::add_diamond() {
  const int x = pick_chain();
  if (x < 0) return "";
  std::string err;
  int br[2];
  for (int& b : br) {  // each branch one to three steps from x
    b = x;
    for (int64_t k = 0, n = irand(1, 3); k < n; ++k) {
      const double r = urand(0, 1);
      const int partner = r < 0.5 ? -2 : r < 0.75 ? -1 : pick_partner(b, false);
      const int v = commit(partner == -2 ? unary_on(b) : binary_on(b, partner), err);
      if (v == -2) return err;
      if (v >= 0) b = v;
    }
  }
  const Shape& s0 = at(br[0]).sizes();
  const Shape& s1 = at(br[1]).sizes();
  if ((br[0] == x && br[1] == x) || !can_broadcast(s0, s1) ||
      broadcast_shape(s0, s1).numel() > max_numel_)
    return "";
  if (chance(0.25)) {  // where(b0 < b1, b0, b1), or with a number for one of them
    Step cmp;
    cmp.op = one_of(*this, {Op::Lt, Op::Le, Op::Gt, Op::Ge, Op::Eq, Op::Ne});
    cmp.args = {br[0], br[1]};
    const int c = commit(cmp, err);
    if (c < 0) return err;
    Step w;
    w.op = Op::Where;
    w.args = {c, br[0], br[1]};
    if (chance(0.3)) {
      w.mode = chance(0.5) ? 1 : 2;
      w.args.pop_back();
      w.s = nice_scalar();
    }
    return commit(w, err) == -2 ? err : "";
  }
  Step join = binary_on(br[0], br[1]);
  return commit(join, err) == -2 ? err : "";
}

std::string Generator::make_fusion_steps(int n) {
  NoGradGuard ng;
  manual_seed(kRandSeed);
  std::string err;
  int64_t since = 0, chain = irand(4, 16);
  for (int tries = 0; int(p_.steps.size()) < n && tries < 4000; ++tries) {
    // A reduction ends a chain: after `chain` steps, and often as the program's last step.
    const bool last = int(p_.steps.size()) + 1 >= n;
    if ((since >= chain && chance(0.6)) || (last && chance(0.5))) {
      Step st;
      if (!propose_reduction(st)) continue;
      const int v = commit(st, err);
      if (v == -2) return err;
      if (v >= 0) {
        since = 0;
        chain = irand(4, 16);
      }
      continue;
    }
    const double r = urand(0, 1);
    if (r < 0.1) {
      const size_t before = p_.steps.size();
      err = add_diamond();
      if (!err.empty()) return err;
      since += int64_t(p_.steps.size() - before);
      continue;
    }
    const int kind = r < 0.35 ? 0 : r < 0.7 ? 1 : r < 0.8 ? 2 : r < 0.9 ? 3 : 4;
    Step st;
    if (!propose_fusion(st, kind)) continue;
    const int v = commit(st, err);
    if (v == -2) return err;
    if (v >= 0) ++since;
  }
  return "";
}

// The last value, and values that later steps read too (a fused group stores them as well as
// keeping them in registers), mostly of the iteration shape.
void Generator::choose_fusion_outputs() {
  const int first = int(p_.inputs.size()), last = int(pool_.size()) - 1;
  p_.outputs = {last};
  std::vector<bool> read(pool_.size(), false);
  for (const Step& st : p_.steps)
    for (int a : st.args) read[size_t(a)] = true;
  std::vector<int> inner, inner_full;
  for (int v = first; v < last; ++v)
    if (read[size_t(v)]) {
      inner.push_back(v);
      if (at(v).sizes() == shape_) inner_full.push_back(v);
    }
  for (int64_t k = 0, extra = irand(0, 3); k < extra; ++k) {
    const std::vector<int>& c = !inner_full.empty() && chance(0.7) ? inner_full : inner;
    if (!c.empty()) p_.outputs.push_back(c[size_t(irand(0, int64_t(c.size()) - 1))]);
  }
  if (last > first && chance(0.2)) p_.outputs.push_back(int(irand(first, last - 1)));
  if (chance(0.05)) p_.outputs.push_back(p_.outputs[0]);             // the same tensor twice
  if (chance(0.05)) p_.outputs.push_back(int(irand(0, first - 1)));  // an input itself
}

}  // namespace duet::test
