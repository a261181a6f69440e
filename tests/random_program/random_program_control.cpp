// Random programs, the control-flow steps of the generator: cond, scan and while_loop steps
// whose functions are short random sub-programs (see random_program.h).
#include "random_program.h"

namespace duet::test {

// ---- control flow ----

namespace {
// The ops of the functions of control-flow steps (branches, bodies).
constexpr Op kFunctionOps[] = {
    Op::Neg,  Op::Exp,     Op::Log,     Op::Sqrt,    Op::Abs,       Op::Sin,    Op::Cos,
    Op::Tanh, Op::Sigmoid, Op::Relu,    Op::Silu,    Op::Clamp,     Op::Add,    Op::Sub,
    Op::Mul,  Op::Div,     Op::Maximum, Op::Minimum, Op::Pow,       Op::MatMul, Op::Sum,
    Op::Mean, Op::Max,     Op::Min,     Op::Softmax, Op::LogSumExp, Op::Gt,     Op::Where};

// Per value of a function (or program) whose first values have flags in `grad`: whether it
// requires grad in a run with gradients. Every op of kFunctionOps is differentiable in each
// floating operand, so a floating result requires grad when an operand does.
void propagate(const std::vector<Tensor>& vals, const std::vector<Step>& steps,
               std::vector<bool>& grad) {
  const size_t first = vals.size() - steps.size();
  grad.resize(vals.size(), false);
  for (size_t k = 0; k < steps.size(); ++k) {
    bool g = false;
    for (int a : steps[k].args) g = g || grad[size_t(a)];
    grad[first + k] = g && floating(vals[first + k]);
  }
}

// Whether value v of a function (or program) whose steps, the last values, are `steps` reads
// value `from`, directly or through other steps.
bool reads(const std::vector<Tensor>& vals, const std::vector<Step>& steps, int from, int v) {
  const size_t first = vals.size() - steps.size();
  std::vector<bool> need(vals.size(), false);
  need[size_t(v)] = true;
  for (size_t k = steps.size(); k-- > 0;)
    if (need[first + k])
      for (int a : steps[k].args) need[size_t(a)] = true;
  return need[size_t(from)];
}
}  // namespace

void Generator::swap_function(Function& f) {
  std::swap(pool_, f.vals);
  std::swap(p_.steps, f.steps);
  std::swap(blocked_, f.blocked);
  std::swap(tuples_, f.tuples);
  f.shadow_vals.resize(shadows_.size());
  f.shadow_tuples.resize(shadows_.size());
  for (size_t k = 0; k < shadows_.size(); ++k) {
    std::swap(shadows_[k].pool, f.shadow_vals[k]);
    std::swap(shadows_[k].tuples, f.shadow_tuples[k]);
  }
}

bool Generator::make_function(Function& f, const std::vector<Tensor>& args,
                              const std::vector<int>& free, const std::vector<bool>& grad,
                              std::string& err,
                              const std::vector<std::vector<Tensor>>& shadow_args) {
  f.vals = args;
  for (int x : free) f.vals.push_back(at(x));
  f.shadow_vals = shadow_args;
  f.shadow_vals.resize(shadows_.size());
  for (size_t k = 0; k < shadows_.size(); ++k)
    for (int x : free) f.shadow_vals[k].push_back(shadows_[k].pool[size_t(x)]);
  f.blocked.assign(f.vals.size(), false);
  f.grad = grad;
  static const std::vector<double> cum = [] {
    std::vector<double> c;
    double total = 0;
    for (Op op : kFunctionOps) c.push_back(total += op_weight(op));
    return c;
  }();
  swap_function(f);
  const int want = int(irand(1, 4));
  int made = 0;
  for (int tries = 0; made < want && tries < 40; ++tries) {
    const double r = urand(0, cum.back());
    const size_t i =
        std::min(size_t(std::upper_bound(cum.begin(), cum.end(), r) - cum.begin()), cum.size() - 1);
    Step st;
    if (!propose(kFunctionOps[i], st)) continue;
    const int v = commit(st, err);
    if (v == -2) break;
    made += v >= 0;
  }
  swap_function(f);
  propagate(f.vals, f.steps, f.grad);
  return err.empty() && made > 0;
}

int Generator::fit(int u, const Shape& s, DType d, std::string& err,
                   const std::vector<Shape>& at_shadows) {
  std::vector<int64_t> dims(s.begin(), s.end());
  const Shape su = at(u).sizes();
  // The batch mix: the batch dims of s (those whose size differs in `at_shadows`) and u's must
  // line up, and become -1 in expand and reshape targets (the target's sizes at the first batch
  // size would not fit the others); outside it, neither has any.
  std::vector<bool> sb(size_t(s.size()), false);
  for (const Shape& t : at_shadows)
    for (int64_t i = 0; i < s.size(); ++i) sb[size_t(i)] = sb[size_t(i)] || t[i] != s[i];
  const std::vector<bool> ub = batch_dims(u);
  const bool any_sb = std::find(sb.begin(), sb.end(), true) != sb.end();
  const bool any_ub = std::find(ub.begin(), ub.end(), true) != ub.end();
  std::vector<int64_t> expand_dims = dims, reshape_dims = dims;
  bool expandable = su.size() <= s.size(), reshapable = true;
  for (int64_t i = 0, lead = s.size() - su.size(); expandable && i < s.size(); ++i) {
    const bool from = i >= lead && ub[size_t(i - lead)];
    expandable = from == sb[size_t(i)];
    if (from) expand_dims[size_t(i)] = -1;
  }
  if (std::count(sb.begin(), sb.end(), true) > 1 || any_sb != any_ub) reshapable = false;
  for (size_t i = 0; i < sb.size(); ++i)
    if (sb[i]) reshape_dims[i] = -1;
  // v has the shape asked for at every batch size.
  auto fits_here = [&](int v) {
    if (at(v).sizes() != s) return false;
    for (size_t k = 0; k < shadows_.size() && k < at_shadows.size(); ++k)
      if (shadows_[k].pool[size_t(v)].sizes() != at_shadows[k]) return false;
    return true;
  };
  if (!fits_here(u)) {
    Step st;
    if (can_broadcast(su, s) && broadcast_shape(su, s) == s && expandable) {
      st.op = Op::Expand;
      st.args = {u};
      st.ints = expand_dims;
    } else if (su.numel() == s.numel() && at(u).is_contiguous() &&
               reshapable) {  // see propose(Reshape)
      st.op = Op::Reshape;
      st.args = {u};
      st.ints = reshape_dims;
    } else {
      // Reduced to a number, then added to a value of the shape (or expanded to it).
      Step m;
      m.op = floating(at(u)) && chance(0.6) ? Op::Mean : Op::Sum;
      m.args = {u};
      if ((u = commit(m, err)) < 0) return -1;
      const int w = pick([&](const Tensor& t) {
        return floating(t) && t.sizes() == s && fits_here(int(&t - pool_.data()));
      });
      if (w >= 0 && chance(0.7)) {
        st.op = Op::Add;
        st.args = {w, u};
      } else {
        if (any_sb) return -1;  // no size to expand a number to
        st.op = Op::Expand;
        st.args = {u};
        st.ints = dims;
      }
    }
    if ((u = commit(st, err)) < 0) return -1;
  }
  if (at(u).dtype() != d) {
    Step c;
    c.op = Op::Cast;
    c.args = {u};
    c.mode = int(d);
    if ((u = commit(c, err)) < 0) return -1;
  }
  return u;
}

std::vector<bool> Generator::grad_flags(std::vector<Tensor>* vals) {
  const bool prev = detail::grad_mode();
  detail::set_grad_mode(true);
  std::vector<Tensor> v;
  try {
    manual_seed(kRandSeed);
    v = run_values(p_, build_inputs(p_, first_, true));
  } catch (const std::exception&) {
    v.clear();
  }
  detail::set_grad_mode(prev);
  std::vector<bool> g;
  for (const Tensor& t : v) g.push_back(t.requires_grad());
  if (vals) *vals = std::move(v);
  return g;
}

double Generator::threshold(const std::vector<double>& others, double x) {
  std::vector<double> xs = others;
  xs.push_back(x);
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  // Midpoints between neighbours, those nearest the median first, far enough from both.
  std::vector<size_t> order;
  for (size_t j = 0; j + 1 < xs.size(); ++j) order.push_back(j);
  const double mid = (double(xs.size()) - 2) / 2;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::fabs(double(a) - mid) < std::fabs(double(b) - mid);
  });
  for (size_t j : order) {
    const double t = (xs[j] + xs[j + 1]) / 2;
    if (std::min(t - xs[j], xs[j + 1] - t) > 3e-3 * std::max(1.0, std::fabs(t))) return t;
  }
  // The value hardly depends on the inputs: a predicate that is the same for all of them.
  return x + (chance(0.5) ? -1 : 1) * (0.25 + 0.25 * std::fabs(x));
}

std::vector<int> Generator::pick_floats(int count, int64_t max_numel) {
  std::vector<int> r;
  for (int k = 0; k < count; ++k) {
    const int a = pick([&](const Tensor& t) {
      if (!floating(t) || t.numel() > max_numel) return false;
      for (int b : r)
        if (&t == &at(b)) return false;
      return true;
    });
    if (a < 0) break;
    r.push_back(a);
  }
  return r;
}

void Generator::take_results(int c, size_t count, std::string& err) {
  control_.push_back(c);
  for (size_t k = 1; k < count; ++k) {
    Step t;
    t.op = Op::Take;
    t.args = {c};
    t.mode = int(k);
    if (commit(t, err) == -2) return;
  }
}

bool Generator::add_cond(std::string& err) {
  // The predicate: a one-element value of the program compared with a number.
  int a = pick([](const Tensor& t) { return floating(t); });
  if (a < 0) return false;
  if (at(a).numel() != 1) {
    Step r;
    const double u = urand(0, 1);
    r.op = u < 0.4 ? Op::Sum : u < 0.7 ? Op::Mean : u < 0.85 ? Op::Max : Op::Min;
    r.args = {a};
    r.mode = chance(0.3);  // keepdim: one element of a's rank
    if ((a = commit(r, err)) < 0) return false;
  }
  // Its values on a few other draws of the inputs, then on the first (the run the harness does
  // on them, last, so that randn continues from where that run leaves it).
  std::vector<double> others;
  for (int k = 0; k < 6; ++k) {
    manual_seed(kRandSeed);
    const Values vals = sample_values(side_);
    try {
      const double x = values(run_values(p_, build_inputs(p_, vals, false))[size_t(a)])[0];
      if (std::isfinite(x)) others.push_back(x);
    } catch (const std::exception&) {  // the harness would draw other values too
    }
  }
  std::vector<Tensor> vals;
  std::vector<bool> grad = grad_flags(&vals);
  if (grad.empty()) return false;
  Step c;
  const double u = urand(0, 1);
  c.op = u < 0.35 ? Op::Gt : u < 0.7 ? Op::Lt : u < 0.85 ? Op::Ge : Op::Le;
  c.mode = chance(0.75) ? 1 : 2;  // x op number, number op x
  c.args = {a};
  c.s = threshold(others, values(vals[size_t(a)])[0]);
  const int pred = commit(c, err);
  if (pred < 0) return false;
  grad.resize(pool_.size(), false);
  // The operands, and a value the branches read directly.
  const std::vector<int> ops = pick_floats(int(irand(1, 3)), kMaxNumel);
  if (ops.empty()) return false;
  std::vector<int> free;
  if (chance(0.5)) {
    const int f = pick([&](const Tensor& t) {
      return floating(t) &&
             std::none_of(ops.begin(), ops.end(), [&](int o) { return &t == &at(o); });
    });
    if (f >= 0) free.push_back(f);
  }
  std::vector<Tensor> args;
  std::vector<std::vector<Tensor>> shadow_args(shadows_.size());
  std::vector<bool> in_grad;
  for (int o : ops) {
    args.push_back(at(o));
    for (size_t k = 0; k < shadows_.size(); ++k)
      shadow_args[k].push_back(shadows_[k].pool[size_t(o)]);
    in_grad.push_back(grad[size_t(o)]);
  }
  for (int f : free) in_grad.push_back(grad[size_t(f)]);
  // When an input requires grad, every result must (see random_program.h).
  const bool need = std::find(in_grad.begin(), in_grad.end(), true) != in_grad.end();
  Function t, f;
  if (!make_function(t, args, free, in_grad, err, shadow_args)) return false;
  auto usable = [&](const Function& fn, size_t v) {
    return floating(fn.vals[v]) && (!need || fn.grad[v]);
  };
  std::vector<int> outs;
  for (size_t v = t.vals.size(); v-- > 0 && outs.empty();)
    if (usable(t, v)) outs.push_back(int(v));
  if (outs.empty()) return false;
  if (chance(0.4)) {
    std::vector<int> c2;
    for (size_t v = 0; v < t.vals.size(); ++v)
      if (usable(t, v)) c2.push_back(int(v));
    outs.push_back(c2[size_t(irand(0, int64_t(c2.size()) - 1))]);
  }
  // The false branch, its results made to fit the true branch's (at every batch size).
  if (!make_function(f, args, free, in_grad, err, shadow_args)) return false;
  std::vector<int> outs2;
  swap_function(f);
  for (int o : outs) {
    const Tensor& want = t.vals[size_t(o)];
    std::vector<Shape> want_at;  // its shapes at the other batch sizes
    for (const auto& sv : t.shadow_vals) want_at.push_back(sv[size_t(o)].sizes());
    auto same_everywhere = [&](size_t v) {
      for (size_t k = 0; k < shadows_.size(); ++k)
        if (shadows_[k].pool[v].sizes() != want_at[k]) return false;
      return true;
    };
    propagate(pool_, p_.steps, f.grad);
    std::vector<int> same, any;
    for (size_t v = 0; v < pool_.size(); ++v) {
      if (!floating(at(int(v))) || (need && !f.grad[v])) continue;
      any.push_back(int(v));
      if (at(int(v)).sizes() == want.sizes() && at(int(v)).dtype() == want.dtype() &&
          same_everywhere(v))
        same.push_back(int(v));
    }
    int u2 = -1;
    if (!same.empty() && chance(0.7))
      u2 = same[size_t(irand(0, int64_t(same.size()) - 1))];
    else if (!any.empty())
      u2 = chance(0.7) ? any.back() : any[size_t(irand(0, int64_t(any.size()) - 1))];
    if (u2 >= 0) u2 = fit(u2, want.sizes(), want.dtype(), err, want_at);
    if (u2 >= 0 && !same_everywhere(size_t(u2))) u2 = -1;  // compiled, both branches must agree
    if (u2 < 0) break;
    outs2.push_back(u2);
  }
  swap_function(f);
  if (outs2.size() != outs.size()) return false;
  Step st;
  st.op = Op::Cond;
  st.args = {pred};
  st.args.insert(st.args.end(), ops.begin(), ops.end());
  st.args.insert(st.args.end(), free.begin(), free.end());
  st.ints = {int64_t(ops.size())};
  st.body = std::move(t.steps);
  st.body2 = std::move(f.steps);
  st.outs = outs;
  st.outs2 = outs2;
  const int cv = int(pool_.size());
  if (commit(st, err) < 0) return false;
  take_results(cv, outs.size(), err);
  return true;
}

bool Generator::add_scan(std::string& err) {
  // Mostly xs of two steps or more (lengths 0 and 1 are asked for below).
  int x = -1;
  if (chance(0.9))
    x = pick([](const Tensor& t) { return floating(t) && t.dim() >= 1 && t.sizes()[0] >= 2; });
  if (x < 0) x = pick([](const Tensor& t) { return floating(t) && t.dim() >= 1; });
  if (x < 0) return false;
  const int64_t n = at(x).sizes()[0];
  int64_t len = -1;  // all of dim 0
  const double r = urand(0, 1);
  if (r < 0.15)
    len = 0;
  else if (r < 0.3)
    len = 1;
  else if (n > 6 && !batch_dims(x)[0])  // a batch dim is scanned whole (its length varies)
    len = irand(2, 6);
  std::vector<int> xs = {x};
  if (chance(0.2)) {
    const int x2 = pick([&](const Tensor& t) {
      return floating(t) && t.dim() >= 1 && t.sizes()[0] == n && &t != &at(x);
    });
    if (x2 >= 0) xs.push_back(x2);
  }
  const std::vector<int> carry = pick_floats(chance(0.3) ? 2 : 1, 300);
  if (carry.empty()) return false;
  std::vector<int> free;
  if (chance(0.4)) {
    const int f = pick([&](const Tensor& t) {
      for (int c : carry)
        if (&t == &at(c)) return false;
      for (int c : xs)
        if (&t == &at(c)) return false;
      return floating(t);
    });
    if (f >= 0) free.push_back(f);
  }
  const std::vector<bool> grad = grad_flags();
  if (grad.empty()) return false;
  std::vector<Tensor> args;
  std::vector<std::vector<Tensor>> shadow_args(shadows_.size());
  std::vector<bool> in_grad;
  for (int c : carry) {
    args.push_back(at(c));
    for (size_t k = 0; k < shadows_.size(); ++k)
      shadow_args[k].push_back(shadows_[k].pool[size_t(c)]);
    in_grad.push_back(grad[size_t(c)]);
  }
  for (int c : xs) {
    args.push_back(squeeze(slice(at(c), 0, 0, 1), 0));  // x_0 (also when none is scanned)
    for (size_t k = 0; k < shadows_.size(); ++k)
      shadow_args[k].push_back(squeeze(slice(shadows_[k].pool[size_t(c)], 0, 0, 1), 0));
    in_grad.push_back(grad[size_t(c)]);
  }
  for (int f : free) in_grad.push_back(grad[size_t(f)]);
  const bool need = std::find(in_grad.begin(), in_grad.end(), true) != in_grad.end();
  // Length 0 returns the initial carries as they are: they must require grad where the
  // compiled construct's results do.
  if (len == 0 && need &&
      std::any_of(carry.begin(), carry.end(), [&](int c) { return !grad[size_t(c)]; }))
    len = 1;
  const int64_t steps = len < 0 ? n : len;
  Function b;
  if (!make_function(b, args, free, in_grad, err, shadow_args)) return false;
  std::vector<int> outs;
  swap_function(b);
  for (size_t k = 0; k < carry.size(); ++k) {
    // The new carry: tanh(fitted value + carry * s), bounded however many steps run.
    propagate(pool_, p_.steps, b.grad);
    std::vector<int> same, any;
    std::vector<Shape> carry_at;  // the carry's shapes at the other batch sizes
    for (const Shadow& sh : shadows_) carry_at.push_back(sh.pool[k].sizes());
    auto same_everywhere = [&](size_t v) {
      if (at(int(v)).sizes() != at(int(k)).sizes()) return false;
      for (size_t j = 0; j < shadows_.size(); ++j)
        if (shadows_[j].pool[v].sizes() != carry_at[j]) return false;
      return true;
    };
    for (size_t v = carry.size() + xs.size(); v < pool_.size(); ++v) {
      if (!floating(at(int(v))) || (need && !b.grad[v])) continue;
      any.push_back(int(v));
      if (same_everywhere(v)) same.push_back(int(v));
    }
    if (any.empty())  // the arguments themselves
      for (size_t v = 0; v < carry.size() + xs.size(); ++v)
        if (!need || b.grad[v]) any.push_back(int(v));
    int u = !same.empty() && chance(0.6) ? same[size_t(irand(0, int64_t(same.size()) - 1))]
            : any.empty()                ? -1
                                         : any[size_t(irand(0, int64_t(any.size()) - 1))];
    const Shape sk = at(int(k)).sizes();
    const DType dk = at(int(k)).dtype();
    if (u >= 0) u = fit(u, sk, dk, err, carry_at);
    // It reads x_t (fitted to the carry: expanded, reshaped, or its mean), and the carry itself.
    const int x0 = int(carry.size());
    if (u >= 0 && !reads(pool_, p_.steps, x0, u)) {
      const int xf = fit(x0, sk, dk, err, carry_at);
      Step add;
      add.op = Op::Add;
      add.args = {u, xf};
      u = xf < 0 ? -1 : commit(add, err);
    }
    if (u >= 0 && (!reads(pool_, p_.steps, int(k), u) || chance(0.7))) {
      static const double kDecay[] = {0.5, -0.5, 0.75, 0.25};
      Step m;
      m.op = Op::Mul;
      m.mode = 1;
      m.args = {int(k)};
      m.s = kDecay[irand(0, 3)];
      const int mk = commit(m, err);
      Step add;
      add.op = Op::Add;
      add.args = {u, mk};
      u = mk < 0 ? -1 : commit(add, err);
    }
    if (u >= 0) {
      Step th;
      th.op = Op::Tanh;
      th.args = {u};
      u = commit(th, err);
    }
    if (u >= 0 && !same_everywhere(size_t(u))) u = -1;  // a carry keeps its shape
    if (u < 0) break;
    outs.push_back(u);
  }
  swap_function(b);
  if (outs.size() != carry.size()) return false;
  propagate(b.vals, b.steps, b.grad);
  // Per-step results.
  const int ny = chance(0.3) ? 0 : chance(0.7) ? 1 : 2;
  std::vector<int> ys;
  for (size_t v = 0; v < b.vals.size(); ++v)
    if (floating(b.vals[v]) && (!need || b.grad[v]) &&
        b.vals[v].numel() * std::max<int64_t>(steps, 1) <= kMaxNumel)
      ys.push_back(int(v));
  for (int k = 0; k < ny && !ys.empty(); ++k)
    outs.push_back(chance(0.5) ? ys.back() : ys[size_t(irand(0, int64_t(ys.size()) - 1))]);
  Step st;
  st.op = Op::Scan;
  st.args = carry;
  st.args.insert(st.args.end(), xs.begin(), xs.end());
  st.args.insert(st.args.end(), free.begin(), free.end());
  st.ints = {int64_t(carry.size()), int64_t(xs.size()), len};
  st.mode = batch_dims(x)[0] && len < 0;  // the batch mix: scanned over the batch dim
  st.body = std::move(b.steps);
  st.outs = outs;
  const int cv = int(pool_.size());
  if (commit(st, err) < 0) return false;
  take_results(cv, outs.size(), err);
  return true;
}

bool Generator::add_while(std::string& err) {
  const int v = pick([](const Tensor& t) { return floating(t) && t.numel() <= 600; });
  if (v < 0) return false;
  Step st;
  st.op = Op::While;
  st.args = {v};
  static const double kDecay[] = {0.5, -0.5, 0.75};
  st.s = kDecay[irand(0, 2)];
  const int inputs = int(p_.inputs.size());
  if (chance(0.5)) {
    // k counted by the program: how many elements of a floating input exceed a number, at
    // most 5. An input, not a computed value: its values are exact in both faces, so the count
    // is too.
    int b = -1;
    for (int i = 0; i < inputs; ++i)
      if (!blocked_[size_t(i)] && floating(at(i)) && (b < 0 || chance(0.5))) b = i;
    if (b < 0) return false;
    Step g;
    g.op = Op::Gt;
    g.mode = 1;
    g.args = {b};
    g.s = chance(0.5) ? 0.25 : -0.75;  // off the grid of discrete values
    Step cnt;
    cnt.op = Op::Sum;
    Step cap;
    cap.op = Op::Minimum;
    cap.mode = 1;
    cap.s = 5;
    cap.int_scalar = true;
    int k = commit(g, err);
    cnt.args = {k};
    if (k >= 0) k = commit(cnt, err);
    cap.args = {k};
    if (k >= 0) k = commit(cap, err);
    if (k < 0) return false;
    st.args.push_back(k);
    st.mode |= 1;
  } else {
    st.ints = {irand(0, 4)};
  }
  const Shape sv = at(v).sizes();
  const DType dv = at(v).dtype();
  int c = -1;  // a value added at each step (read from outside: a free value), else a number
  if (chance(0.5))
    c = pick([&](const Tensor& t) {
      // (At every batch size: compiled, the body is traced even when it runs no step.)
      return t.dtype() == dv && broadcasts_into(int(&t - pool_.data()), v);
    });
  if (c >= 0) {
    st.args.push_back(c);
    st.mode |= 2;
  } else {
    st.s2 = nice_scalar();
  }
  const int cv = int(pool_.size());
  if (commit(st, err) < 0) return false;
  take_results(cv, 2, err);
  return true;
}

}  // namespace duet::test
