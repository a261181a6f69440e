// Random programs (random_program.h): the generator. Running a program is in
// random_program_run.cpp.
#include "random_program.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace duet::test {

// ---- the generator ----

/// An independent generator for (seed, stream). Rng(s) and Rng(s + 1) walk one sequence a step
/// apart (splitmix64 adds a constant per draw), so seeds are hashed first.
Rng rng_for(uint64_t seed, uint64_t stream) {
  Rng h(seed ^ (stream * 0xd1b54a32d192ed03ull));
  return Rng(h.next());
}

std::vector<Tensor> build_inputs(const Program& p, const Values& vals, bool rg, bool contiguous) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    const InputSpec& in = p.inputs[i];
    std::vector<double> v = vals[i];
    Tensor t = contiguous && !in.captured
                   ? make(broadcast_values(v, in.made, in.shape), in.shape, in.dtype)
                   : make_sample(v, in.made, in.shape, in.dtype, in.layout);
    if (rg && is_floating(in.dtype) && !in.buffer) t.requires_grad_(true);
    out.push_back(t);
  }
  return out;
}

Program at_batch(const Program& p, int64_t b) {
  Program q = p;
  for (InputSpec& in : q.inputs)
    if (in.batched) in.shape[0] = in.made[0] = b;
  return q;
}

Values random_inputs(const Program& p, Rng& rng) {
  Values out;
  for (const InputSpec& in : p.inputs)
    out.push_back(random_values(in.made.numel(), p.domain, in.dtype, rng));
  return out;
}

Values nudged(const Program& p, const Values& vals, bool alternate, int scale) {
  Values out = vals;
  for (size_t i = 0; i < out.size() && i < p.inputs.size(); ++i)
    if (is_floating(p.inputs[i].dtype))
      for (size_t j = 0; j < out[i].size(); ++j)
        out[i][j] *= 1 + std::ldexp(alternate && j % 2 ? -1.0 : 1.0, scale);
  return out;
}

namespace {
void steps_in_f64(std::vector<Step>& steps) {
  for (Step& st : steps) {
    if (st.op == Op::Cast && static_cast<DType>(st.mode) == DType::f32)
      st.mode = static_cast<int>(DType::f64);
    steps_in_f64(st.body);
    steps_in_f64(st.body2);
  }
}
}  // namespace

Program in_f64(const Program& p) {
  Program q = p;
  for (InputSpec& in : q.inputs)
    if (in.dtype == DType::f32) in.dtype = DType::f64;
  steps_in_f64(q.steps);
  return q;
}

Values in_f64_values(const Program& p, const Values& vals) {
  Values out = vals;
  for (size_t i = 0; i < out.size() && i < p.inputs.size(); ++i)
    if (p.inputs[i].dtype == DType::f32)
      for (double& v : out[i]) v = static_cast<double>(static_cast<float>(v));
  return out;
}

bool can_broadcast(const Shape& a, const Shape& b) {
  const int64_t n = std::max(a.size(), b.size());
  for (int64_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}

void Generator::make_inputs() {
  if (fusion_mix(p_.mix)) return make_fusion_inputs();
  if (p_.mix == Mix::Batch) return make_batch_inputs();
  max_numel_ = kMaxNumel;
  int64_t vocab[4];
  for (int64_t& d : vocab) d = chance(0.15) ? 1 : irand(2, 5);
  p_.domain = Domain{};
  p_.domain.lo = -2;
  p_.domain.hi = 2;
  p_.domain.discrete = chance(0.2);  // ties: equal values for eq/ne, and for max/min gradients
  DType main = chance(0.6) ? DType::f32 : DType::f64, other = DType::f32;
  if (p_.mix == Mix::LowMixed) main = main == DType::f32 ? DType::bf16 : DType::f16;
  if (main == DType::f32) other = DType::f64;
  const int n = int(irand(1, 4));
  for (int i = 0; i < n; ++i) {
    InputSpec in;
    const int64_t rank = irand(0, 4);
    for (int64_t d = 4 - rank; d < 4; ++d) {
      int64_t s = vocab[d];
      if (chance(0.15)) s = 1;
      if (chance(0.1)) s = irand(1, 5);
      in.shape.push_back(s);
    }
    in.dtype = chance(0.85) ? main : other;
    if (chance(0.1))
      in.dtype = chance(0.5) ? DType::i64 : DType::i32;
    else if (chance(0.04))
      in.dtype = DType::b8;
    in.made = in.shape;
    if (chance(0.2) && rank > 0) {  // stored smaller, expanded to shape (stride 0)
      for (int64_t d = 0; d < rank; ++d)
        if (chance(0.5)) in.made[d] = 1;
    }
    const int l = int(irand(0, 5));
    in.layout = l == 1   ? Layout::Transposed
                : l == 2 ? Layout::Strided
                : l == 3 ? Layout::Offset
                         : Layout::Contiguous;
    in.captured = in.made == in.shape && chance(0.2);  // not expanded: it is written in place
    p_.inputs.push_back(in);
    if (rank == 4 && is_floating(in.dtype) && chance(0.4)) {  // a conv2d weight for it
      InputSpec w;
      const int64_t k = irand(1, std::min<int64_t>(2, std::min(in.shape[2], in.shape[3])));
      w.shape = w.made = Shape{irand(1, 3), in.shape[1], k, k};
      w.dtype = in.dtype;
      p_.inputs.push_back(w);
    }
  }
  finish_inputs(vocab, main);
}

void Generator::finish_inputs(const int64_t* vocab, DType main) {
  if (chance(0.15)) {
    InputSpec b;
    const int64_t rank = irand(0, 3);
    for (int64_t d = 4 - rank; d < 4; ++d) b.shape.push_back(vocab[d]);
    b.made = b.shape;
    b.dtype = main;
    b.layout = chance(0.3) ? Layout::Transposed : Layout::Contiguous;
    b.captured = b.buffer = true;
    p_.inputs.push_back(b);
  }
  first_ = sample_values(rng_);
  pool_ = build_inputs(p_, first_, false);
  // A buffer is read only after its update (a read before it would be saved by autograd, or
  // be a view made before the write: eager and compiled both reject those).
  for (const InputSpec& in : p_.inputs) blocked_.push_back(in.buffer);
}

Values Generator::sample_values(Rng& rng) const { return random_inputs(p_, rng); }

std::vector<int64_t> Generator::random_shape(int64_t numel) {
  std::vector<int64_t> primes;
  for (int64_t n = numel, f = 2; n > 1;) {
    if (n % f == 0) {
      primes.push_back(f);
      n /= f;
    } else {
      ++f;
    }
  }
  int64_t rank = irand(numel == 1 ? 0 : 1, 4);
  std::vector<int64_t> s(size_t(rank), 1);
  for (int64_t f : primes) s[size_t(irand(0, rank - 1))] *= f;
  if (rank > 0 && chance(0.3)) s[size_t(irand(0, rank - 1))] = -1;
  return s;
}

// An i64 index for gather / scatter_add along d of value a: sizes up to a's along the other
// dims (at every batch size, in the batch mix).
void Generator::class_targets(Step& st, int a) {
  const Tensor& A = at(a);
  st.args = {a};
  const int64_t c = min_sizes(a)[A.dim() - 1];
  const int64_t n = A.dim() == 2 ? A.sizes()[0] : 1;
  for (int64_t i = 0; i < n; ++i) st.index.push_back(irand(0, c - 1));
  st.ishape = A.dim() == 2 ? std::vector<int64_t>{n} : std::vector<int64_t>{};
}

void Generator::random_index(Step& st, int a, int64_t d) {
  const Shape lim = min_sizes(a);
  st.ishape.clear();
  st.index.clear();
  for (int64_t e = 0; e < lim.size(); ++e)
    st.ishape.push_back(e == d ? irand(1, 4) : irand(1, lim[e]));
  const int64_t n = Shape(st.ishape).numel();
  for (int64_t i = 0; i < n; ++i) st.index.push_back(irand(0, lim[d] - 1));
}

bool Generator::propose_binary(Op op, Step& st) {
  const bool ints_ok =
      op == Op::Add || op == Op::Sub || op == Op::Maximum || op == Op::Minimum || op == Op::Div;
  int a = pick([&](const Tensor& t) {
    return floating(t) || (ints_ok && t.dtype() != DType::b8 && op != Op::Div);
  });
  if (a < 0) return false;
  const double r = urand(0, 1);
  st.args = {a};
  if (r < 0.2) {
    st.mode = 1;  // tensor op number
  } else if (r < 0.35) {
    st.mode = 2;  // number op tensor
  } else {
    st.mode =
        (r > 0.9 && (op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Div)) ? 3 : 0;
    const Shape& sa = at(a).sizes();
    int b = pick([&](const Tensor& t) {
      return (floating(t) || (ints_ok && t.dtype() != DType::b8)) && can_broadcast(sa, t.sizes()) &&
             broadcast_shape(sa, t.sizes()).numel() <= kMaxNumel;
    });
    if (b < 0) return false;
    st.args.push_back(b);
    return true;
  }
  scalar_operand(op, st, at(a));
  return true;
}

void Generator::scalar_operand(Op op, Step& st, const Tensor& a) {
  st.int_scalar = !floating(a) || chance(0.15);
  st.s = nice_scalar();
  if (op == Op::Div && st.mode == 1) st.s = (chance(0.5) ? 1 : -1) * urand(0.5, 2);
  if (op == Op::Div && st.mode == 1 && st.int_scalar) st.s = chance(0.5) ? 2 : -1;
  if (op == Op::Pow && st.mode == 1) {
    static const double exps[] = {2, 3, 0.5, -1, 1.5, -0.5, 1, 0};
    st.s = exps[irand(0, 7)];
    st.int_scalar = st.s == std::floor(st.s) && chance(0.5);
  }
  if (op == Op::Pow && st.mode == 2) {
    st.s = urand(0.5, 2);
    st.int_scalar = false;
  }
  if (st.int_scalar) st.s = std::round(st.s);
}

bool Generator::propose(Op op, Step& st) {
  st = Step{};
  st.op = op;
  auto any = [](const Tensor&) { return true; };
  auto numeric = [](const Tensor& t) { return t.dtype() != DType::b8; };
  auto fl = [](const Tensor& t) { return floating(t); };
  auto fl_nd = [](const Tensor& t) { return floating(t) && t.dim() >= 1; };
  switch (op) {
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Abs:
    case Op::Sin:
    case Op::Cos:
    case Op::Tanh:
    case Op::Sigmoid:
    case Op::Relu:
    case Op::Gelu:
    case Op::Silu:
    case Op::Erf:
    case Op::LogSigmoid: {
      int a = pick(fl);
      if (a < 0) return false;
      st.args = {a};
      st.mode = chance(0.25) ? 1 : (op == Op::Neg && chance(0.3)) ? 2 : 0;
      return true;
    }
    case Op::Clamp: {
      int a = pick(fl);
      if (a < 0) return false;
      st.args = {a};
      st.s = -urand(0.2, 2);
      st.s2 = urand(0.2, 2);
      return true;
    }
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Pow:
      return propose_binary(op, st);
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Eq:
    case Op::Ne: {
      int a = pick(numeric);
      if (a < 0) return false;
      st.args = {a};
      if (chance(0.4)) {
        st.mode = chance(0.5) ? 1 : 2;
        st.s = p_.domain.discrete ? std::round(urand(-2, 2) * 2) / 2 : urand(-1.5, 1.5);
        st.int_scalar = !floating(at(a));
        if (st.int_scalar) st.s = std::round(st.s);
        return true;
      }
      const Shape& sa = at(a).sizes();
      int b = pick([&](const Tensor& t) {
        return t.dtype() != DType::b8 && can_broadcast(sa, t.sizes()) &&
               broadcast_shape(sa, t.sizes()).numel() <= kMaxNumel;
      });
      if (b < 0) return false;
      st.args.push_back(b);
      return true;
    }
    case Op::Where: {
      int c = pick([](const Tensor& t) { return t.dtype() == DType::b8; });
      if (c < 0) return false;
      const Shape& sc = at(c).sizes();
      int a = pick([&](const Tensor& t) {
        return floating(t) && can_broadcast(sc, t.sizes()) &&
               broadcast_shape(sc, t.sizes()).numel() <= kMaxNumel;
      });
      if (a < 0) return false;
      st.args = {c, a};
      const double r = urand(0, 1);
      if (r < 0.3) {
        st.mode = r < 0.15 ? 1 : 2;
        st.s = nice_scalar();
        return true;
      }
      Shape sca = broadcast_shape(sc, at(a).sizes());
      int b = pick([&](const Tensor& t) {
        return floating(t) && can_broadcast(sca, t.sizes()) &&
               broadcast_shape(sca, t.sizes()).numel() <= kMaxNumel;
      });
      if (b < 0) return false;
      st.args.push_back(b);
      return true;
    }
    case Op::MatMul: {
      int a = pick(fl_nd);
      if (a < 0) return false;
      const Tensor& A = at(a);
      const int64_t k = A.sizes()[A.dim() - 1];
      Shape batch_a = A.sizes();
      batch_a.resize(std::max<int64_t>(A.dim() - 2, 0));
      auto batch_ok = [&](const Tensor& t) {
        Shape bb = t.sizes();
        bb.resize(t.dim() - 2);
        if (!can_broadcast(batch_a, bb)) return false;
        Shape out = broadcast_shape(batch_a, bb);
        return out.numel() * (A.dim() >= 2 ? A.sizes()[A.dim() - 2] : 1) * t.sizes()[t.dim() - 1] <=
               kMaxNumel;
      };
      st.args = {a};
      st.mode = chance(0.3) ? 1 : 0;
      if (st.mode == 0) {
        int b = pick([&](const Tensor& t) {
          if (t.dtype() != A.dtype() || t.dim() == 0) return false;
          if (t.dim() == 1) return t.sizes()[0] == k;
          return t.sizes()[t.dim() - 2] == k && batch_ok(t);
        });
        if (b >= 0) {
          st.args.push_back(b);
          return true;
        }
        st.mode = 1;
      }
      // matmul(a, transpose(c)) with c (..., n, k): a itself (a Gram matrix) when nothing else.
      int c = pick([&](const Tensor& t) {
        if (t.dtype() != A.dtype() || t.dim() < 2 || t.sizes()[t.dim() - 1] != k) return false;
        Shape bb = t.sizes();
        bb.resize(t.dim() - 2);
        if (!can_broadcast(batch_a, bb)) return false;
        return broadcast_shape(batch_a, bb).numel() * (A.dim() >= 2 ? A.sizes()[A.dim() - 2] : 1) *
                   t.sizes()[t.dim() - 2] <=
               kMaxNumel;
      });
      if (c < 0) {
        if (A.dim() == 1) {
          st.mode = 0;
          st.args.push_back(a);  // a dot product
          return true;
        }
        return false;
      }
      st.args.push_back(c);
      return true;
    }
    case Op::Linear: {
      int x = pick(fl_nd);
      if (x < 0) return false;
      const Tensor& X = at(x);
      int w = pick([&](const Tensor& t) {
        return t.dim() == 2 && t.dtype() == X.dtype() && t.sizes()[1] == X.sizes()[X.dim() - 1] &&
               X.numel() / X.sizes()[X.dim() - 1] * t.sizes()[0] <= kMaxNumel;
      });
      if (w < 0) return false;
      st.args = {x, w};
      int b = pick([&](const Tensor& t) {
        return t.dim() == 1 && t.dtype() == X.dtype() && t.sizes()[0] == at(w).sizes()[0];
      });
      if (b >= 0 && chance(0.6)) st.args.push_back(b);
      return true;
    }
    case Op::Reshape: {
      int a = pick(any);
      if (a < 0) return false;
      st.args = {a};
      if (batch_mode() && has_batch_dim(a)) return batch_reshape(a, st.ints);
      st.ints = random_shape(at(a).numel());
      return true;
    }
    case Op::Transpose: {
      int a = pick([](const Tensor& t) { return t.dim() >= 1; });
      if (a < 0) return false;
      const int64_t r = at(a).dim();
      st.args = {a};
      int64_t d0 = irand(0, r - 1), d1 = irand(0, r - 1);
      if (d0 == d1 && r > 1 && chance(0.8)) d1 = (d0 + 1) % r;
      st.ints = {wrap_or_negative(d0, r), wrap_or_negative(d1, r)};
      return true;
    }
    case Op::Permute: {
      int a = pick([](const Tensor& t) { return t.dim() >= 2; });
      if (a < 0) return false;
      const int64_t r = at(a).dim();
      st.args = {a};
      std::vector<int64_t> perm(static_cast<size_t>(r));
      std::iota(perm.begin(), perm.end(), 0);
      for (int64_t i = r - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(irand(0, i))]);
      for (int64_t& d : perm) d = wrap_or_negative(d, r);
      st.ints = perm;
      return true;
    }
    case Op::Squeeze: {
      int a = pick([](const Tensor& t) { return t.dim() >= 1; });
      if (a < 0) return false;
      const Tensor& A = at(a);
      st.args = {a};
      std::vector<int64_t> ones;
      for (int64_t d = 0; d < A.dim(); ++d)
        if (A.sizes()[d] == 1) ones.push_back(d);
      int64_t d = !ones.empty() && chance(0.8) ? ones[size_t(irand(0, int64_t(ones.size()) - 1))]
                                               : irand(0, A.dim() - 1);
      st.ints = {wrap_or_negative(d, A.dim())};
      return true;
    }
    case Op::SqueezeAll: {
      int a = pick(any);
      if (a < 0) return false;
      st.args = {a};
      return true;
    }
    case Op::Unsqueeze: {
      int a = pick([](const Tensor& t) { return t.dim() < 4; });
      if (a < 0) return false;
      st.args = {a};
      const int64_t r = at(a).dim() + 1;
      st.ints = {wrap_or_negative(irand(0, r - 1), r)};
      return true;
    }
    case Op::Expand: {
      int a = pick([](const Tensor& t) { return t.dim() < 4 || t.numel() < t.dim() * 8; });
      if (a < 0) return false;
      const Tensor& A = at(a);
      st.args = {a};
      std::vector<int64_t> target;
      if (A.dim() < 4 && chance(0.5)) target.push_back(irand(1, 3));
      const std::vector<bool> batch = batch_dims(a);
      for (int64_t d = 0; d < A.dim(); ++d) {
        if (batch[size_t(d)]) {  // kept as it is, whatever the batch size
          target.push_back(-1);
          continue;
        }
        int64_t s = A.sizes()[d];
        if (s == 1 && chance(0.7)) s = irand(2, 4);
        target.push_back(s == A.sizes()[d] && chance(0.3) ? -1 : s);
      }
      st.ints = target;
      return true;
    }
    case Op::Slice: {
      int a = pick([](const Tensor& t) { return t.dim() >= 1; });
      if (a < 0) return false;
      const Tensor& A = at(a);
      st.args = {a};
      const int64_t d = irand(0, A.dim() - 1), n = A.sizes()[d];
      if (batch_dims(a)[size_t(d)]) {
        int64_t start, end;
        batch_slice(start, end);
        st.ints = {wrap_or_negative(d, A.dim()), start, end, irand(1, 3)};
        return true;
      }
      int64_t start = irand(0, n - 1), end = irand(start + 1, n + 1), step = irand(1, 3);
      if (chance(0.2)) start -= n;  // counts from the end
      st.ints = {wrap_or_negative(d, A.dim()), start, end, step};
      return true;
    }
    case Op::Cat:
    case Op::Stack: {
      int a =
          pick([&](const Tensor& t) { return numeric(t) && (op == Op::Stack || t.dim() >= 1); });
      if (a < 0) return false;
      const Tensor& A = at(a);
      const int64_t r = op == Op::Cat ? A.dim() : A.dim() + 1;
      const int64_t d = irand(0, r - 1);
      st.args = {a};
      st.ints = {wrap_or_negative(d, r)};
      const int parts = int(irand(1, 2));
      int64_t total = A.numel();
      for (int k = 0; k < parts; ++k) {
        int b = pick([&](const Tensor& t) {
          if (!numeric(t) || t.dim() != A.dim()) return false;
          if (op == Op::Stack) return t.sizes() == A.sizes();
          for (int64_t e = 0; e < t.dim(); ++e)
            if (e != d && t.sizes()[e] != A.sizes()[e]) return false;
          return true;
        });
        if (total + at(b).numel() > kMaxNumel) break;
        total += at(b).numel();
        st.args.push_back(b);
      }
      return true;
    }
    case Op::Sum:
    case Op::Mean:
    case Op::Max:
    case Op::Min: {
      int a = op == Op::Sum ? pick(any) : op == Op::Mean ? pick(fl) : pick(numeric);
      if (a < 0) return false;
      const Tensor& A = at(a);
      st.args = {a};
      st.mode = chance(0.4);
      if (A.dim() > 0 && chance(0.75)) {
        for (int64_t d = 0; d < A.dim(); ++d)
          if (chance(0.4)) st.ints.push_back(wrap_or_negative(d, A.dim()));
        if (st.ints.empty()) st.ints.push_back(irand(0, A.dim() - 1));
        std::reverse(st.ints.begin(), st.ints.end());
      }
      return true;
    }
    case Op::Argmax:
    case Op::Argmin:
    case Op::GatherArgmax: {
      int a = pick([&](const Tensor& t) {
        return t.dim() >= 1 && numeric(t) && (op == Op::GatherArgmax || chance(0.5) || floating(t));
      });
      if (a < 0) return false;
      st.args = {a};
      st.ints = {wrap_or_negative(irand(0, at(a).dim() - 1), at(a).dim())};
      st.mode = chance(0.5);
      return true;
    }
    case Op::Softmax:
    case Op::LogSoftmax:
    case Op::LogSumExp: {
      int a = pick(fl_nd);
      if (a < 0) return false;
      st.args = {a};
      st.ints = {wrap_or_negative(irand(0, at(a).dim() - 1), at(a).dim())};
      return true;
    }
    case Op::Gather:
    case Op::ScatterAdd: {
      int a = pick(op == Op::Gather ? std::function<bool(const Tensor&)>(
                                          [](const Tensor& t) { return t.dim() >= 1; })
                                    : std::function<bool(const Tensor&)>(fl_nd));
      if (a < 0) return false;
      const Tensor& A = at(a);
      const int64_t d = other_than_batch(a, irand(0, A.dim() - 1));
      st.args = {a};
      random_index(st, a, d);
      st.ints = {d};
      if (op == Op::ScatterAdd) {
        int b =
            pick([&](const Tensor& t) { return t.sizes() == A.sizes() && t.dtype() == A.dtype(); });
        st.args.push_back(b);
      }
      return true;
    }
    case Op::IndexSelect: {
      int a = pick([](const Tensor& t) { return t.dim() >= 1; });
      if (a < 0) return false;
      const Tensor& A = at(a);
      const int64_t d = other_than_batch(a, irand(0, A.dim() - 1));
      st.args = {a};
      st.ints = {wrap_or_negative(d, A.dim())};
      const int64_t n = irand(1, 5), lim = min_sizes(a)[d];
      for (int64_t i = 0; i < n; ++i) st.index.push_back(irand(0, lim - 1));
      st.ishape = {n};
      return A.numel() / A.sizes()[d] * n <= kMaxNumel;
    }
    case Op::SliceScatter: {
      int a = pick(fl_nd);
      if (a < 0) return false;
      const Tensor& A = at(a);
      const int64_t d = irand(0, A.dim() - 1), n = A.sizes()[d];
      int64_t start, end, step;
      if (batch_dims(a)[size_t(d)]) {
        batch_slice(start, end);
        step = irand(1, 2);
      } else {
        start = irand(0, n - 1);
        end = irand(start + 1, n);
        step = irand(1, 2);
      }
      st.ints = {d, start, end, step};
      st.args = {a};
      const Shape s = slice(A, d, start, end, step).sizes();
      int b = pick([&](const Tensor& t) { return t.sizes() == s && t.dtype() == A.dtype(); });
      if (b >= 0 && chance(0.7)) {
        st.args.push_back(b);
      } else {
        st.mode = 1;
      }
      return true;
    }
    case Op::Cast: {
      int a = pick(any);
      if (a < 0) return false;
      st.args = {a};
      const DType from = at(a).dtype();
      DType to;
      const double r = urand(0, 1);
      if (is_floating(from))
        to = r < 0.7    ? (from == DType::f32 ? DType::f64 : DType::f32)
             : r < 0.8  ? from
             : r < 0.88 ? DType::i64
             : r < 0.95 ? DType::i32
                        : DType::b8;
      else
        to = r < 0.5 ? DType::f32 : r < 0.8 ? DType::f64 : DType::i64;
      st.mode = int(to);
      return true;
    }
    case Op::Clone:
    case Op::Contiguous: {
      int a = pick(any);
      if (a < 0) return false;
      st.args = {a};
      return true;
    }
    case Op::AddInplace:
    case Op::SubInplace:
    case Op::MulInplace:
    case Op::DivInplace: {
      int a = pick(fl);
      if (a < 0) return false;
      const Tensor& A = at(a);
      st.args = {a};
      st.mode = int(irand(0, 1));
      st.s2 = nice_scalar();
      int b = pick([&](const Tensor& t) {
        return floating(t) && can_broadcast(A.sizes(), t.sizes()) &&
               broadcast_shape(A.sizes(), t.sizes()) == A.sizes();
      });
      if (b < 0 || chance(0.25)) {
        st.mode |= 2;
        st.s = op == Op::DivInplace ? (chance(0.5) ? 1 : -1) * urand(0.5, 2) : nice_scalar();
      } else {
        st.args.push_back(b);
      }
      return true;
    }
    case Op::CopyInplace: {
      int a = pick(fl);
      if (a < 0) return false;
      const Shape& sa = at(a).sizes();
      int b = pick([&](const Tensor& t) {
        return t.dtype() != DType::b8 && can_broadcast(sa, t.sizes()) &&
               broadcast_shape(sa, t.sizes()) == sa;
      });
      if (b < 0) return false;
      st.args = {a, b};
      return true;
    }
    case Op::CrossEntropy: {
      int a = pick([](const Tensor& t) { return floating(t) && t.dim() >= 1 && t.dim() <= 2; });
      if (a < 0) return false;
      class_targets(st, a);
      return true;
    }
    case Op::BceLogits: {
      int a = pick(fl);
      if (a < 0) return false;
      const Shape& sa = at(a).sizes();
      int b = pick([&](const Tensor& t) { return floating(t) && t.sizes() == sa; });
      st.args = {a, b};
      return true;
    }
    case Op::Embedding: {
      int a = pick([](const Tensor& t) { return floating(t) && t.dim() == 2; });
      if (a < 0) return false;
      st.args = {a};
      const int64_t rows = min_sizes(a)[0];
      const int64_t rank = irand(0, 2);
      for (int64_t d = 0; d < rank; ++d) st.ishape.push_back(irand(1, 3));
      const int64_t n = Shape(st.ishape).numel();
      for (int64_t i = 0; i < n; ++i) st.index.push_back(irand(0, rows - 1));
      return true;
    }
    case Op::Source: {
      int a = pick(fl_nd);
      if (a < 0) return false;
      st.args = {a};
      st.mode = int(irand(0, 2));
      st.s = nice_scalar();
      return true;
    }
    case Op::UpdateBuffer: {
      int buf = -1;
      for (size_t i = 0; i < p_.inputs.size(); ++i)
        if (p_.inputs[i].buffer && !updated_[i]) buf = int(i);
      if (buf < 0) return false;
      const Shape& sb = at(buf).sizes();
      int y = pick([&](const Tensor& t) {
        return floating(t) && can_broadcast(sb, t.sizes()) && broadcast_shape(sb, t.sizes()) == sb;
      });
      if (y < 0 || chance(0.3)) {
        y = pick(fl);
        st.mode = 1;  // its mean
      }
      if (y < 0) return false;
      st.args = {buf, y};
      st.s2 = urand(0.5, 0.95);
      return true;
    }
    case Op::Dropout: {
      int a = pick(fl);
      if (a < 0) return false;
      st.args = {a};
      st.mode = chance(0.8);  // training (random), else the identity
      st.s = chance(0.2) ? 0 : urand(0.1, 0.6);
      return true;
    }
    case Op::LayerNorm: {
      int a = pick(fl_nd);
      if (a < 0) return false;
      const Tensor& A = at(a);
      st.args = {a};
      int64_t most = std::min<int64_t>(2, A.dim());  // not over batch dims (their size varies)
      const std::vector<bool> batch = batch_dims(a);
      for (int64_t k = 1; k <= most; ++k)
        if (batch[size_t(A.dim() - k)]) most = k - 1;
      if (most < 1) return false;
      const int64_t k = irand(1, most);
      st.ints = {k};
      // Not the default 1e-5: rows of equal values (expanded inputs, repeated indices, size-1
      // rows) have variance 0, where the gradient is O(1) terms scaled by 1/sqrt(eps) that cancel
      // to 0 in exact arithmetic, and eager and compiled (which sum per output) cancel to
      // different f32 noise. eps >= 0.01 keeps the factor at most 10, which is enough for rows
      // of magnitude 1; a row of equal values near 10 (a product of an expanded scalar, seed
      // 333561) has noise of a few ulps of 10 times 10, which the comparison allows only as
      // ill-conditioned (Note [Ill-conditioned programs] in test_compile_random.cpp).
      st.s = chance(0.5) ? 0.01 : 0.1;
      Shape norm;
      for (int64_t e = A.dim() - k; e < A.dim(); ++e) norm.push_back(A.sizes()[e]);
      auto fits = [&](const Tensor& t) { return t.sizes() == norm && t.dtype() == A.dtype(); };
      int w = pick(fits), b = pick(fits);
      if (w >= 0 && chance(0.6)) {
        st.mode |= 1;
        st.args.push_back(w);
      }
      if (b >= 0 && chance(0.6)) {
        st.mode |= 2;
        st.args.push_back(b);
      }
      return true;
    }
    case Op::MseLoss: {
      int a = pick(fl);
      if (a < 0) return false;
      const Shape& s = at(a).sizes();
      int b = pick([&](const Tensor& t) { return floating(t) && t.sizes() == s; });
      st.args = {a, b};
      return true;
    }
    case Op::MaxPool:
    case Op::AvgPool:
    case Op::Unfold: {
      int a = pick([](const Tensor& t) {
        return floating(t) && t.dim() == 4 && t.sizes()[2] >= 2 && t.sizes()[3] >= 2;
      });
      if (a < 0) return false;
      st.args = {a};
      if (op == Op::Unfold) {
        st.ints = {irand(1, 2), irand(1, 2), irand(0, 1)};
        st.mode = chance(0.5);
      } else
        st.ints = {2, irand(0, 1)};
      return true;
    }
    case Op::Conv2d: {
      int a = pick([](const Tensor& t) { return floating(t) && t.dim() == 4; });
      if (a < 0) return false;
      const Tensor& X = at(a);
      const int64_t pad = irand(0, 1);
      int w = pick([&](const Tensor& t) {
        return t.dim() == 4 && t.dtype() == X.dtype() && t.sizes()[1] == X.sizes()[1] &&
               t.sizes()[2] == t.sizes()[3] && t.sizes()[2] <= X.sizes()[2] + 2 * pad &&
               t.sizes()[2] <= X.sizes()[3] + 2 * pad;
      });
      if (w < 0) return false;
      st.args = {a, w};
      int b = pick([&](const Tensor& t) {
        return t.dim() == 1 && t.dtype() == X.dtype() && t.sizes()[0] == at(w).sizes()[0];
      });
      if (b >= 0 && chance(0.6)) st.args.push_back(b);
      st.ints = {irand(1, 2), pad};
      return true;
    }
    case Op::RandnLike: {
      int a = pick(fl);
      if (a < 0) return false;
      st.args = {a};
      return true;
    }
    DUET_RANDOM_MORE_OP_CASES:
      return propose_more(op, st);
    case Op::Cond:  // control flow: add_cond, add_scan and add_while build these
    case Op::Scan:
    case Op::While:
    case Op::Take:
    case Op::Count:
      break;
  }
  return false;
}

namespace {
template <class T>
double max_abs_dense(const T* p, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = p[i];
    m = std::isfinite(x) ? std::max(m, std::fabs(x)) : INFINITY;
  }
  return m;
}
}  // namespace

double max_abs(const Tensor& t) {
  // A device tensor is read on the host (its memory is not the host's: reading it crashed).
  if (!t.device().is_cpu()) return max_abs(t.to(Device::cpu()));
  // Contiguous floats straight from memory: the fusion mix calls this on large tensors often.
  if (t.is_contiguous() && t.dtype() == DType::f32)
    return max_abs_dense(static_cast<const float*>(t.raw_data()), t.numel());
  if (t.is_contiguous() && t.dtype() == DType::f64)
    return max_abs_dense(static_cast<const double*>(t.raw_data()), t.numel());
  double m = 0;
  for (double x : values(t)) m = std::isfinite(x) ? std::max(m, std::fabs(x)) : INFINITY;
  return m;
}

int Generator::commit(Step st, std::string& err) {
  Tensor out;
  try {
    out = apply_step(st, pool_, &tuples_);
  } catch (const std::exception& e) {
    err = fmt::format("generation: step {} threw: {}", step_text(st, pool_.size()), e.what());
    return -2;
  }
  const double m = floating(out) ? max_abs(out) : 0;
  if (out.numel() == 0 || out.numel() > max_numel_ || !std::isfinite(m)) return -1;
  double e = 0;  // the fusion mix: Note [Inexact values]
  if (fusion_mix(p_.mix) && (e = error_estimate(st, out)) < 0) return -1;
  // The batch mix: the step at the other batch sizes, and the magnitude at all of them.
  double mag = m;
  if (batch_mode() && (mag = commit_shadows(st, out, m)) < 0) return -1;
  if (fusion_mix(p_.mix)) err_.push_back(e);
  st.result = meta_text(out);
  if (st.op == Op::Cond || st.op == Op::Scan || st.op == Op::While) {
    st.result.clear();
    for (const Tensor& t : tuples_.at(pool_.size()))
      st.result += (st.result.empty() ? "" : ", ") + meta_text(t);
  }
  if (batch_mode()) batch_result(st, out);
  if (st.op == Op::UpdateBuffer) updated_[size_t(st.args[0])] = true;
  p_.steps.push_back(st);
  pool_.push_back(out);
  blocked_.push_back(false);
  if (mag > 16) {
    // Tame: multiply by a power of two (exact) that brings the magnitude to at most 4.
    Step t;
    t.op = Op::Mul;
    t.mode = 1;
    t.args = {int(pool_.size()) - 1};
    t.s = std::ldexp(1.0, -int(std::ceil(std::log2(mag / 4))));
    Tensor o = apply_step(t, pool_);
    t.result = meta_text(o);
    for (Shadow& sh : shadows_) sh.pool.push_back(apply_step(t, sh.pool));
    if (batch_mode()) batch_result(t, o);
    p_.steps.push_back(t);
    pool_.push_back(o);
    blocked_.push_back(false);
    if (fusion_mix(p_.mix)) err_.push_back(e * t.s);
  }
  return int(pool_.size()) - 1;
}

std::string Generator::make_steps(int n) {
  if (fusion_mix(p_.mix)) return make_fusion_steps(n);
  std::vector<double> cum;
  double total = 0;
  for (int i = 0; i < int(Op::Count); ++i) cum.push_back(total += op_weight(Op(i)));
  NoGradGuard ng;
  manual_seed(kRandSeed);
  // Control flow in a quarter of the programs (two fifths in the batch mix): one or two steps,
  // each of a kind (0 cond, 1 scan, 2 while_loop) and at a step count drawn from side_, so that
  // the other programs are the ones this generator made before it knew control flow.
  std::vector<std::pair<int, int>> plan;
  if (side_.uniform(0, 1) < (batch_mode() ? 0.4 : 0.25)) {
    for (int k = 0, count = side_.uniform(0, 1) < 0.25 ? 2 : 1; k < count; ++k) {
      const double r = side_.uniform(0, 1);
      const int kind = r < 0.45 ? 0 : r < 0.87 ? 1 : 2;
      plan.emplace_back(int(side_.next() % uint64_t(std::max(1, n - 1))) + 1, kind);
    }
    std::sort(plan.begin(), plan.end());
  }
  size_t next = 0;
  for (int tries = 0, failed = 0; (int(p_.steps.size()) < n || next < plan.size()) && tries < 4000;
       ++tries) {
    if (next < plan.size() && int(p_.steps.size()) >= plan[next].first) {
      std::string err;
      const int kind = plan[next].second;
      const bool ok = kind == 0 ? add_cond(err) : kind == 1 ? add_scan(err) : add_while(err);
      if (!err.empty()) return err;
      if (ok || ++failed >= 8) {
        ++next;
        failed = 0;
      }
      continue;
    }
    if (int(p_.steps.size()) >= n) break;
    const double r = urand(0, total);
    const Op op = Op(std::upper_bound(cum.begin(), cum.end(), r) - cum.begin());
    Step st;
    if (!propose(op, st)) continue;
    std::string err;
    if (commit(st, err) == -2) return err;
  }
  return "";
}

void Generator::choose_outputs() {
  if (fusion_mix(p_.mix)) return choose_fusion_outputs();
  const int first = int(p_.inputs.size()), last = int(pool_.size()) - 1;
  p_.outputs = {last};
  const int extra = int(irand(0, 2));
  for (int k = 0; k < extra && last > first; ++k) p_.outputs.push_back(int(irand(first, last - 1)));
  if (chance(0.08)) p_.outputs.push_back(p_.outputs[0]);             // the same tensor twice
  if (chance(0.05)) p_.outputs.push_back(int(irand(0, first - 1)));  // an input itself
  if (control_.empty()) return;
  // A control-flow step that no output reads (through any of its results: a Take reads the
  // step) would be checked by nothing.
  std::vector<bool> read(pool_.size(), false);
  for (int o : p_.outputs) read[size_t(o)] = true;
  for (size_t k = p_.steps.size(); k-- > 0;)
    if (read[size_t(first) + k])
      for (int a : p_.steps[k].args) read[size_t(a)] = true;
  for (int c : control_)
    if (!read[size_t(c)]) p_.outputs.push_back(c);
}

}  // namespace duet::test
