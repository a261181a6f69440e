// Random programs, the batch mix of the generator (random_program.h): inputs with a batch dim,
// and the shadow pools that run every step at the other batch sizes.
#include <limits>

#include "random_program.h"

namespace duet::test {

void Generator::make_batch_inputs() {
  max_numel_ = kMaxNumel;
  const int64_t b0 = kBatchSizes[0];
  int64_t vocab[4];
  for (int64_t& d : vocab) d = chance(0.15) ? 1 : irand(2, 5);
  p_.domain = Domain{};
  p_.domain.lo = -2;
  p_.domain.hi = 2;
  p_.domain.discrete = chance(0.2);
  const DType main = chance(0.6) ? DType::f32 : DType::f64;
  const int n = int(irand(1, 4));
  bool any_batched = false;
  for (int i = 0; i < n; ++i) {
    InputSpec in;
    in.batched = (i == n - 1 && !any_batched) || chance(0.65);
    any_batched |= in.batched;
    // The dims after the batch dim (a batched input has 1-4 dims), or all of them.
    const int64_t rank = irand(0, 3);
    if (in.batched) in.shape.push_back(b0);
    for (int64_t d = 4 - rank; d < 4; ++d) {
      int64_t s = vocab[d];
      if (chance(0.15)) s = 1;
      if (chance(0.1)) s = irand(1, 5);
      in.shape.push_back(s);
    }
    in.dtype = chance(0.85) ? main : main == DType::f32 ? DType::f64 : DType::f32;
    if (chance(0.1))
      in.dtype = chance(0.5) ? DType::i64 : DType::i32;
    else if (chance(0.04))
      in.dtype = DType::b8;
    in.made = in.shape;
    if (in.batched) {
      // An argument whose dims can be symbolic: contiguous (compile keeps the sizes of a
      // strided argument, whose strides depend on them), possibly at an offset.
      in.layout = chance(0.25) ? Layout::Offset : Layout::Contiguous;
    } else {
      if (chance(0.2) && in.shape.size() > 0)  // stored smaller, expanded to shape
        for (int64_t d = 0; d < in.shape.size(); ++d)
          if (chance(0.5)) in.made[d] = 1;
      const int l = int(irand(0, 5));
      in.layout = l == 1   ? Layout::Transposed
                  : l == 2 ? Layout::Strided
                  : l == 3 ? Layout::Offset
                           : Layout::Contiguous;
      in.captured = in.made == in.shape && chance(0.3);
    }
    p_.inputs.push_back(in);
    if (in.batched && in.shape.size() == 4 && is_floating(in.dtype) && chance(0.5)) {
      InputSpec w;  // a conv2d weight for the batch of images (N, C, H, W)
      const int64_t k = irand(1, std::min<int64_t>(2, std::min(in.shape[2], in.shape[3])));
      w.shape = w.made = Shape{irand(1, 3), in.shape[1], k, k};
      w.dtype = in.dtype;
      w.captured = chance(0.5);
      p_.inputs.push_back(w);
    }
  }
  finish_inputs(vocab, main);
  Rng r(rng_.next());
  for (int64_t b : kBatchSizes) {
    if (b == b0 || std::any_of(shadows_.begin(), shadows_.end(),
                               [&](const Shadow& s) { return s.batch == b; }))
      continue;
    Shadow s;
    s.batch = b;
    const Program q = at_batch(p_, b);
    s.pool = build_inputs(q, random_inputs(q, r), false);
    shadows_.push_back(std::move(s));
  }
}

std::vector<bool> Generator::batch_dims(int v) const {
  const Shape& s = at(v).sizes();
  std::vector<bool> r(size_t(s.size()), false);
  for (const Shadow& sh : shadows_) {
    const Shape& t = sh.pool[size_t(v)].sizes();
    for (int64_t d = 0; d < s.size() && d < t.size(); ++d)
      if (t[d] != s[d]) r[size_t(d)] = true;
  }
  return r;
}

bool Generator::has_batch_dim(int v) const {
  const std::vector<bool> b = batch_dims(v);
  return std::find(b.begin(), b.end(), true) != b.end();
}

Shape Generator::min_sizes(int v) const {
  Shape s = at(v).sizes();
  for (const Shadow& sh : shadows_) {
    const Shape& t = sh.pool[size_t(v)].sizes();
    for (int64_t d = 0; d < s.size() && d < t.size(); ++d) s[d] = std::min(s[d], t[d]);
  }
  return s;
}

bool Generator::broadcasts_into(int from, int into) const {
  auto fits = [](const Shape& f, const Shape& t) {
    return can_broadcast(t, f) && broadcast_shape(t, f) == t;
  };
  if (!fits(at(from).sizes(), at(into).sizes())) return false;
  for (const Shadow& sh : shadows_)
    if (!fits(sh.pool[size_t(from)].sizes(), sh.pool[size_t(into)].sizes())) return false;
  return true;
}

int64_t Generator::other_than_batch(int v, int64_t d) {
  if (!batch_mode()) return d;
  const std::vector<bool> b = batch_dims(v);
  if (!b[size_t(d)]) return d;
  std::vector<int64_t> others;
  for (size_t e = 0; e < b.size(); ++e)
    if (!b[e]) others.push_back(int64_t(e));
  return others.empty() ? d : others[size_t(irand(0, int64_t(others.size()) - 1))];
}

void Generator::batch_slice(int64_t& start, int64_t& end) {
  // Mostly the whole dim, every step-th element; 1 and -2 are empty or guarded at batch size 1.
  static const int64_t kStarts[] = {0, 0, 0, 1, -1, -2};
  start = kStarts[irand(0, 5)];
  end = chance(0.9) ? std::numeric_limits<int64_t>::max() : -1;
}

bool Generator::batch_reshape(int a, std::vector<int64_t>& target) {
  const int64_t n0 = at(a).numel(), b0 = kBatchSizes[0];
  if (n0 % b0) return false;
  const int64_t c = n0 / b0;
  for (const Shadow& sh : shadows_)
    if (sh.pool[size_t(a)].numel() != c * sh.batch) return false;
  const double r = urand(0, 1);
  if (r < 0.15) {
    target = {-1};  // flatten
    return true;
  }
  if (r < 0.4) {
    target = {-1, c};  // flatten after the batch dim
    return true;
  }
  std::vector<int64_t> primes;
  for (int64_t m = c, f = 2; m > 1;) {
    if (m % f == 0) {
      primes.push_back(f);
      m /= f;
    } else {
      ++f;
    }
  }
  const int64_t rank = std::max<int64_t>(irand(0, 3), c > 1 ? 1 : 0);
  target.assign(size_t(rank), 1);
  for (int64_t f : primes) target[size_t(irand(0, rank - 1))] *= f;
  if (rank > 0 && chance(0.3))
    target[size_t(irand(0, rank - 1))] = -1;  // the batch merged with that dim
  else
    target.insert(target.begin() + irand(0, rank), -1);
  return true;
}

double Generator::commit_shadows(const Step& st, const Tensor& out, double m) {
  const size_t v = pool_.size();
  const bool control = st.op == Op::Cond || st.op == Op::Scan || st.op == Op::While;
  double mag = m;
  auto fits = [&](const Tensor& o, const Tensor& want) {
    if (o.dim() != want.dim() || o.dtype() != want.dtype() || o.numel() == 0 ||
        o.numel() > max_numel_)
      return false;
    const double x = floating(o) ? max_abs(o) : 0;
    mag = std::max(mag, x);
    return std::isfinite(x);
  };
  std::vector<Tensor> outs;
  for (Shadow& sh : shadows_) {
    Tensor o;
    try {
      o = apply_step(st, sh.pool, &sh.tuples);
    } catch (const std::exception&) {
      return -1;
    }
    if (!fits(o, out)) return -1;
    if (control) {
      const std::vector<Tensor>&a = tuples_.at(v), &b = sh.tuples.at(v);
      if (a.size() != b.size()) return -1;
      for (size_t i = 0; i < a.size(); ++i)
        if (!fits(b[i], a[i])) return -1;
    }
    outs.push_back(o);
  }
  // Magnitudes far apart between the sizes: one factor (commit's taming) would not fit them all.
  if (mag > 64 * std::max(m, 1.0)) return -1;
  for (size_t k = 0; k < shadows_.size(); ++k) shadows_[k].pool.push_back(outs[k]);
  return mag;
}

namespace {
// The dims of t at the first batch size and `others` at the shadows' sizes `batch`: a dim whose
// size changes as a*B + c ("B", "2B+1", "B-1"), or its sizes ("2|3|1|3") when not linear.
std::string dims_text(const Tensor& t, const std::vector<const Tensor*>& others,
                      const std::vector<int64_t>& batch, bool& varies) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t x0 = t.sizes()[d], b0 = kBatchSizes[0];
    bool same = true;
    for (const Tensor* o : others) same = same && o->sizes()[d] == x0;
    std::string e = std::to_string(x0);
    if (!same) {
      varies = true;
      const int64_t x1 = others[0]->sizes()[d], b1 = batch[0];
      const int64_t a = (x1 - x0) / (b1 - b0), c = x0 - a * b0;
      bool linear = (x1 - x0) % (b1 - b0) == 0;
      for (size_t k = 0; k < others.size(); ++k)
        linear = linear && others[k]->sizes()[d] == a * batch[k] + c;
      if (linear) {
        e = (a == 1 ? "" : std::to_string(a)) + "B";
        if (c) e += fmt::format("{}{}", c > 0 ? "+" : "-", std::abs(c));
      } else {
        for (const Tensor* o : others) e += fmt::format("|{}", o->sizes()[d]);
      }
    }
    s += (d ? ", " : "") + e;
  }
  return s + (t.dim() == 1 ? ",)" : ")");
}
}  // namespace

void Generator::batch_result(Step& st, const Tensor& out) const {
  const size_t v = pool_.size();
  bool in = false;
  for (int a : st.args) in = in || has_batch_dim(a);
  std::vector<int64_t> batch;
  for (const Shadow& sh : shadows_) batch.push_back(sh.batch);
  bool varies = false;
  auto text = [&](const Tensor& t, const std::vector<const Tensor*>& others) {
    std::string s =
        fmt::format("{} {}", dtype_name(t.dtype()), dims_text(t, others, batch, varies));
    if (!t.is_contiguous())
      s += fmt::format(" strides {}", Shape(t.strides().data(), t.strides().size()));
    return s;
  };
  const bool control = st.op == Op::Cond || st.op == Op::Scan || st.op == Op::While;
  if (!control) {
    std::vector<const Tensor*> others;
    for (const Shadow& sh : shadows_) others.push_back(&sh.pool[v]);
    st.result = text(out, others);
  } else {
    st.result.clear();
    const std::vector<Tensor>& r = tuples_.at(v);
    for (size_t i = 0; i < r.size(); ++i) {
      std::vector<const Tensor*> others;
      for (const Shadow& sh : shadows_) others.push_back(&sh.tuples.at(v)[i]);
      st.result += (i ? ", " : "") + text(r[i], others);
    }
  }
  // A broadcast: an elementwise op on tensors of different shapes.
  bool broadcast = false;
  const bool elementwise = (st.op >= Op::Add && st.op <= Op::Where) &&
                           (st.mode == 0 || st.mode == 3 || st.op == Op::Where);
  for (size_t i = 1; elementwise && i < st.args.size(); ++i)
    broadcast |= at(st.args[i]).sizes() != at(st.args[0]).sizes();
  st.batch = uint8_t((in ? 1 : 0) | (varies ? 2 : 0) | (broadcast && in ? 4 : 0));
}

}  // namespace duet::test
