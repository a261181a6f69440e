// Rows of erf, log_sigmoid, the math and neural-network composites (softmax, log_softmax,
// logsumexp, gelu (both forms), silu, linear, scaled_dot_product_attention, layer_norm, losses,
// dropout) and of the random draws, with references on plain doubles (see op_rows.h).
#include <cmath>

#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;
using R = ResultKind;

const std::vector<DType> kAll = {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8};
const std::vector<DType> kFloat = {DType::f32, DType::f64};
const Domain kWide{-10, 10, -5, 5};
const Domain kUnit{0, 1, 0, 1};

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
// log(sigmoid(x)) without overflow for either sign.
double log_sigmoid_ref(double x) {
  return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x));
}

int64_t wrap(int64_t dim, int64_t rank) { return dim < 0 ? dim + std::max<int64_t>(rank, 1) : dim; }

// Splits a shape around dim: element (o, j, i) sits at (o * n + j) * inner + i.
struct Around {
  int64_t outer = 1, n = 1, inner = 1;
};
Around around(const Shape& s, int64_t dim) {
  Around a;
  if (s.size() == 0) return a;
  dim = wrap(dim, s.size());
  for (int64_t d = 0; d < dim; ++d) a.outer *= s[d];
  a.n = s[dim];
  for (int64_t d = dim + 1; d < s.size(); ++d) a.inner *= s[d];
  return a;
}

enum class Soft { Softmax, LogSoftmax, LogSumExp };

std::vector<double> ref_soft(Soft kind, const std::vector<double>& x, const Shape& s, int64_t dim) {
  const Around a = around(s, dim);
  std::vector<double> out(kind == Soft::LogSumExp ? a.outer * a.inner : x.size());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      auto at = [&](int64_t j) { return (o * a.n + j) * a.inner + i; };
      double m = -INFINITY, total = 0;
      for (int64_t j = 0; j < a.n; ++j) m = std::max(m, x[at(j)]);
      for (int64_t j = 0; j < a.n; ++j) total += std::exp(x[at(j)] - m);
      const double lse = a.n ? m + std::log(total) : -INFINITY;
      if (kind == Soft::LogSumExp) out[o * a.inner + i] = lse;
      for (int64_t j = 0; kind != Soft::LogSumExp && j < a.n; ++j)
        out[at(j)] = kind == Soft::Softmax ? std::exp(x[at(j)] - m) / total : x[at(j)] - lse;
    }
  return out;
}

OpRow soft_row(Soft kind, Shape xs, int64_t dim) {
  static const char* names[] = {"softmax", "log_softmax", "logsumexp"};
  static const OpId ops[] = {OpId::Exp, OpId::LogSoftmax, OpId::Log};
  Shape out = xs;
  if (kind == Soft::LogSumExp && xs.size()) out.erase(wrap(dim, xs.size()));
  // logsumexp over an empty dim is the empty sum's -inf (Note [jvp by two vjps]).
  const bool empty_sum = kind == Soft::LogSumExp && xs.size() && xs[wrap(dim, xs.size())] == 0;
  OpRow r{fmt::format("{} {} dim {}", names[int(kind)], xs.str(), dim),
          empty_sum ? OpId::Sum : ops[int(kind)],
          kind != Soft::LogSoftmax,  // log_softmax is one op (Note [log_softmax])
          {xs},
          [=](const Ins& in) {
            return kind == Soft::Softmax      ? softmax(in[0], dim)
                   : kind == Soft::LogSoftmax ? log_softmax(in[0], dim)
                                              : logsumexp(in[0], dim);
          },
          [=](const Values& v) { return ref_soft(kind, v[0], xs, dim); },
          out};
  r.domains = {kWide};
  return r;
}

// x (..., in) @ w(out, in)^T + b.
OpRow linear_row(std::string name, Shape xs, int64_t out_features, bool bias) {
  const int64_t in_features = xs[xs.size() - 1],
                rows = xs.numel() / std::max<int64_t>(in_features, 1);
  Shape out = xs;
  out[out.size() - 1] = out_features;
  std::vector<Shape> shapes = {xs, {out_features, in_features}};
  if (bias) shapes.push_back({out_features});
  OpRow r{name,
          // (a vector's: Note [addmv]; a batch's: Note [addmm])
          !bias            ? OpId::MatMul
          : xs.size() == 1 ? OpId::Addmv
                           : OpId::Addmm,
          true, shapes,
          [=](const Ins& in) { return bias ? linear(in[0], in[1], in[2]) : linear(in[0], in[1]); },
          [=](const Values& v) {
            std::vector<double> y;
            for (int64_t n = 0; n < rows; ++n)
              for (int64_t o = 0; o < out_features; ++o) {
                double acc = bias ? v[2][o] : 0;
                for (int64_t i = 0; i < in_features; ++i)
                  acc += v[0][n * in_features + i] * v[1][o * in_features + i];
                y.push_back(acc);
              }
            return y;
          },
          out};
  return r;
}

// addmv(input (n or broadcast), mat (n, k), vec (k), beta, alpha): one op (Addmv) where beta and
// alpha are 1 and the input is (n), its composite otherwise.
OpRow addmv_row(Shape input, int64_t n, int64_t k, double beta, double alpha) {
  const bool one = beta == 1 && alpha == 1 && input == Shape{n};
  OpRow r{
      fmt::format("addmv input {} mat ({}, {}) beta {} alpha {}", input.str(), n, k, beta, alpha),
      one ? OpId::Addmv : OpId::MatMul,
      !one,
      {input, {n, k}, {k}},
      [=](const Ins& in) { return addmv(in[0], in[1], in[2], beta, alpha); },
      [=](const Values& v) {
        std::vector<double> y;
        for (int64_t o = 0; o < n; ++o) {
          double acc = 0;
          for (int64_t i = 0; i < k; ++i) acc += v[1][o * k + i] * v[2][i];
          const double b = v[0][input.numel() == 1 ? 0 : o];
          y.push_back(alpha * acc + (beta == 0 ? 0 : beta * b));
        }
        return y;
      },
      {n}};
  r.dtypes = {DType::f32, DType::f64};
  if (beta == std::floor(beta) && alpha == std::floor(alpha)) r.dtypes.push_back(DType::i64);
  return r;
}

// addmm(input (n or broadcast), mat1 (m, k), mat2 (k, n), beta, alpha): one op (Addmm) where
// beta and alpha are 1 and the input is (n), its composite otherwise.
OpRow addmm_row(Shape input, int64_t m, int64_t k, int64_t n, double beta, double alpha) {
  const bool one = beta == 1 && alpha == 1 && input == Shape{n};
  OpRow r{fmt::format("addmm input {} mat1 ({}, {}) mat2 ({}, {}) beta {} alpha {}", input.str(), m,
                      k, k, n, beta, alpha),
          one ? OpId::Addmm : OpId::MatMul,
          !one,
          {input, {m, k}, {k, n}},
          [=](const Ins& in) { return addmm(in[0], in[1], in[2], beta, alpha); },
          [=](const Values& v) {
            std::vector<double> y;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (int64_t l = 0; l < k; ++l) acc += v[1][i * k + l] * v[2][l * n + j];
                // the input broadcast from the right: (n), (1), (m, 1), (1, n), (m, n) or ()
                const int64_t d = static_cast<int64_t>(input.size());
                const int64_t rows = d == 2 ? input[0] : 1, cols = d >= 1 ? input[d - 1] : 1;
                const double b = v[0][(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
                y.push_back(alpha * acc + (beta == 0 ? 0 : beta * b));
              }
            return y;
          },
          {m, n}};
  r.dtypes = {DType::f32, DType::f64};
  if (beta == std::floor(beta) && alpha == std::floor(alpha)) r.dtypes.push_back(DType::i64);
  return r;
}

// Normalizes over the trailing dims `norm`; weight and bias of shape norm.
OpRow layer_norm_row(std::string name, Shape xs, Shape norm, bool weight, bool bias) {
  std::vector<Shape> shapes = {xs};
  if (weight) shapes.push_back(norm);
  if (bias) shapes.push_back(norm);
  OpRow r{name,
          OpId::Rsqrt,
          true,
          shapes,
          [=](const Ins& in) {
            Tensor w = weight ? in[1] : Tensor(), b = bias ? in[weight ? 2 : 1] : Tensor();
            return layer_norm(in[0], norm, w, b);
          },
          [=](const Values& v) {
            const int64_t g = norm.numel(), groups = g ? xs.numel() / g : 0;
            std::vector<double> y(v[0].size());
            for (int64_t k = 0; k < groups; ++k) {
              double mu = 0, var = 0;
              for (int64_t i = 0; i < g; ++i) mu += v[0][k * g + i] / double(g);
              for (int64_t i = 0; i < g; ++i) {
                const double d = v[0][k * g + i] - mu;
                var += d * d / double(g);
              }
              for (int64_t i = 0; i < g; ++i) {
                double t = (v[0][k * g + i] - mu) / std::sqrt(var + 1e-5);
                if (weight) t *= v[1][i];
                if (bias) t += v[weight ? 2 : 1][i];
                y[k * g + i] = t;
              }
            }
            return y;
          },
          xs};
  r.tol32 = 1e-4;  // (x - mean) / std loses digits in f32
  return r;
}

// The b8 mask of the attention rows: keeps (i, j) where (i + j) % 3 != 0 (every row keeps one
// at least when S >= 2).
Tensor keep_mask(int64_t l, int64_t s) {
  std::vector<double> keep;
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < s; ++j) keep.push_back((i + j) % 3 != 0);
  return make(keep, {l, s}, DType::b8);
}

// scaled_dot_product_attention over q (batch..., L, E), k (batch..., S, E), v (batch..., S, F),
// the same batch dims on all three. mask: 0 none, 1 causal, 2 a b8 mask keeping (i + j) % 3 != 0
// (every row keeps one at least when S >= 2), 3 a floating (L, S) mask, the row's 4th input.
OpRow sdpa_row(Shape batch, int64_t l, int64_t s, int64_t e, int64_t f, int mask, double scale) {
  auto with = [&](int64_t a, int64_t b) {
    Shape r = batch;
    r.push_back(a);
    r.push_back(b);
    return r;
  };
  static const char* kinds[] = {"", ", causal", ", b8 mask", ", float mask"};
  std::vector<Shape> shapes = {with(l, e), with(s, e), with(s, f)};
  if (mask == 3) shapes.push_back({l, s});
  OpRow r{fmt::format("scaled_dot_product_attention q {} k {} v {}{}{}", shapes[0].str(),
                      shapes[1].str(), shapes[2].str(), kinds[mask],
                      scale ? fmt::format(", scale {}", scale) : ""),
          OpId::Attention,
          false,
          shapes,
          [=](const Ins& in) {
            const Tensor m = mask == 2 ? keep_mask(l, s) : mask == 3 ? in[3] : Tensor();
            return scaled_dot_product_attention(in[0], in[1], in[2], m, mask == 1, scale);
          },
          [=](const Values& v) {
            const int64_t nb = batch.numel();
            const double sc = scale ? scale : 1 / std::sqrt(double(e));
            std::vector<double> y(nb * l * f, 0.0);
            for (int64_t b = 0; b < nb; ++b)
              for (int64_t i = 0; i < l; ++i) {
                std::vector<double> w(s);
                double m = -INFINITY;
                for (int64_t j = 0; j < s; ++j) {
                  double acc = 0;
                  for (int64_t c = 0; c < e; ++c)
                    acc += v[0][(b * l + i) * e + c] * v[1][(b * s + j) * e + c];
                  acc *= sc;
                  if ((mask == 1 && j > i) || (mask == 2 && (i + j) % 3 == 0)) acc = -INFINITY;
                  if (mask == 3) acc += v[3][i * s + j];
                  w[j] = acc;
                  m = std::max(m, acc);
                }
                double total = 0;
                for (double& x : w) total += (x = std::exp(x - m));
                for (int64_t j = 0; j < s; ++j)
                  for (int64_t c = 0; c < f; ++c)
                    y[(b * l + i) * f + c] += w[j] / total * v[2][(b * s + j) * f + c];
              }
            return y;
          },
          with(l, f)};
  r.domains = {Domain{-2, 2}};
  return r;
}

// The float64 attention of q (l, e), k (s, e) and v (s, f) and its gradient for g (l, f): dq, dk
// and dv one after another. mask as sdpa_row's (no floating mask).
std::vector<double> ref_attention_grads(const double* q, const double* k, const double* v,
                                        const double* g, int64_t l, int64_t s, int64_t e, int64_t f,
                                        int mask) {
  const double sc = 1 / std::sqrt(double(e));
  std::vector<double> p(l * s), dp(l * s), out(l * e + s * e + s * f, 0.0);
  for (int64_t i = 0; i < l; ++i) {
    double m = -INFINITY, total = 0;
    for (int64_t j = 0; j < s; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < e; ++c) acc += q[i * e + c] * k[j * e + c];
      acc *= sc;
      if ((mask == 1 && j > i) || (mask == 2 && (i + j) % 3 == 0)) acc = -INFINITY;
      p[i * s + j] = acc;
      m = std::max(m, acc);
    }
    for (int64_t j = 0; j < s; ++j) total += (p[i * s + j] = std::exp(p[i * s + j] - m));
    for (int64_t j = 0; j < s; ++j) p[i * s + j] /= total;
  }
  double* dq = out.data();
  double* dk = dq + l * e;
  double* dv = dk + s * e;
  for (int64_t i = 0; i < l; ++i) {
    double d = 0;
    for (int64_t j = 0; j < s; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < f; ++c) acc += g[i * f + c] * v[j * f + c];
      dp[i * s + j] = acc;
      d += acc * p[i * s + j];
    }
    for (int64_t j = 0; j < s; ++j) {
      const double ds = p[i * s + j] * (dp[i * s + j] - d) * sc;
      for (int64_t c = 0; c < e; ++c) {
        dq[i * e + c] += ds * k[j * e + c];
        dk[j * e + c] += ds * q[i * e + c];
      }
      for (int64_t c = 0; c < f; ++c) dv[j * f + c] += p[i * s + j] * g[i * f + c];
    }
  }
  return out;
}

// attention_backward through grad() of scaled_dot_product_attention: inputs q, k, v and the
// output's gradient g; the result is dq, dk and dv of each batch, flattened and joined.
OpRow attention_backward_row(Shape batch, int64_t l, int64_t s, int64_t e, int64_t f, int mask) {
  auto with = [&](int64_t a, int64_t b) {
    Shape r = batch;
    r.push_back(a);
    r.push_back(b);
    return r;
  };
  static const char* kinds[] = {"", ", causal", ", b8 mask"};
  const int64_t nb = batch.numel(), per = l * e + s * e + s * f;
  OpRow r{fmt::format("attention_backward (grad of scaled_dot_product_attention) q {} k {} v {}{}",
                      with(l, e).str(), with(s, e).str(), with(s, f).str(), kinds[mask]),
          OpId::AttentionBackward,
          false,
          {with(l, e), with(s, e), with(s, f), with(l, f)},
          [=](const Ins& in) {
            std::vector<Tensor> x;
            for (int i = 0; i < 3; ++i) x.push_back(in[i].detach().requires_grad_(true));
            Tensor m;
            if (mask == 2) m = keep_mask(l, s);
            Tensor y = scaled_dot_product_attention(x[0], x[1], x[2], m, mask == 1);
            std::vector<Tensor> gs = grad({y}, x, {in[3]});
            Shape flat = batch;
            flat.push_back(-1);
            return cat({gs[0].reshape(flat), gs[1].reshape(flat), gs[2].reshape(flat)}, -1);
          },
          [=](const Values& v) {
            std::vector<double> y;
            for (int64_t b = 0; b < nb; ++b) {
              std::vector<double> one =
                  ref_attention_grads(&v[0][b * l * e], &v[1][b * s * e], &v[2][b * s * f],
                                      &v[3][b * l * f], l, s, e, f, mask);
              y.insert(y.end(), one.begin(), one.end());
            }
            return y;
          },
          [&] {
            Shape o = batch;
            o.push_back(per);
            return o;
          }()};
  r.domains = {Domain{-2, 2}};
  r.grad = false;  // second derivatives go through the composite (Note [Attention])
  r.tol32 = 1e-4;
  return r;
}

OpRow forward_only(OpRow r) {
  r.grad = false;
  return r;
}

OpRow mse_row(Shape s) {
  return {"mse_loss " + s.str(),
          OpId::Sum,
          true,
          {s, s},
          [](const Ins& in) { return mse_loss(in[0], in[1]); },
          [](const Values& v) {
            double acc = 0;
            for (size_t i = 0; i < v[0].size(); ++i)
              acc += (v[0][i] - v[1][i]) * (v[0][i] - v[1][i]);
            return std::vector<double>{acc / double(v[0].size())};
          },
          {}};
}

// cross_entropy's options as a row states them; the reference below computes PyTorch's formulas
// on plain doubles.
struct CeCase {
  std::string reduction = "mean";
  int64_t ignore = -100;
  double smoothing = 0;
  std::vector<double> weight;  ///< per class; empty: none
  bool probabilities = false;  ///< targets are a second input of the logits' shape
};

// The class dim is 1 (0 for 1-D logits); position p of the targets is the logits' position with
// the class dim removed.
std::vector<double> ref_cross_entropy(const Values& v, const Shape& ls,
                                      const std::vector<double>& targets, const CeCase& o) {
  const size_t cdim = ls.size() == 1 ? 0 : 1;
  const int64_t c = ls[cdim];
  Shape ts;
  for (size_t d = 0; d < ls.size(); ++d)
    if (d != cdim) ts.push_back(ls[d]);
  auto w = [&](int64_t k) { return o.weight.empty() ? 1.0 : o.weight[size_t(k)]; };
  std::vector<double> each;
  double total = 0, denominator = 0;
  for (int64_t i = 0; i < ts.numel(); ++i) {
    std::vector<int64_t> p = unravel(i, ts);
    auto at = [&](int64_t k) {
      std::vector<int64_t> q = p;
      q.insert(q.begin() + cdim, k);
      return ravel(q, ls);
    };
    double m = -INFINITY, z = 0;
    for (int64_t k = 0; k < c; ++k) m = std::max(m, v[0][at(k)]);
    for (int64_t k = 0; k < c; ++k) z += std::exp(v[0][at(k)] - m);
    auto lp = [&](int64_t k) { return v[0][at(k)] - m - std::log(z); };
    double loss = 0;
    if (o.probabilities) {
      for (int64_t k = 0; k < c; ++k) {
        const double pk = v[1][at(k)] * (1 - o.smoothing) + o.smoothing / double(c);
        loss -= w(k) * pk * lp(k);
      }
      denominator += 1;
    } else if (const int64_t t = int64_t(targets[size_t(i)]); t != o.ignore) {
      double smooth = 0;
      for (int64_t k = 0; k < c; ++k) smooth -= w(k) * lp(k);
      loss = (1 - o.smoothing) * -w(t) * lp(t) + o.smoothing / double(c) * smooth;
      denominator += w(t);
    }
    each.push_back(loss);
    total += loss;
  }
  if (o.reduction == "none") return each;
  return {o.reduction == "sum" ? total : total / denominator};
}

// logits (N, C, d1, ...) or (C); targets as class indices (N, d1, ...) (a 0-d target for 1-D
// logits), or as probabilities (a second input).
OpRow cross_entropy_row(std::string name, Shape ls, std::vector<double> targets, CeCase o = {}) {
  const size_t cdim = ls.size() == 1 ? 0 : 1;
  Shape ts;
  for (size_t d = 0; d < ls.size(); ++d)
    if (d != cdim) ts.push_back(ls[d]);
  std::vector<Shape> shapes{ls};
  if (o.probabilities) shapes.push_back(ls);
  OpRow r{name,
          o.probabilities ? OpId::Sum : OpId::Gather,
          true,
          shapes,
          [=](const Ins& in) {
            CrossEntropyOptions opts;
            opts.ignore_index(o.ignore).label_smoothing(o.smoothing);
            opts.reduction(o.reduction == "none"  ? Reduction::None
                           : o.reduction == "sum" ? Reduction::Sum
                                                  : Reduction::Mean);
            if (!o.weight.empty()) opts.weight(make(o.weight, {ls[cdim]}, in[0].dtype()));
            Tensor t = o.probabilities ? in[1] : make(targets, ts, DType::i64);
            return cross_entropy(in[0], t, opts);
          },
          [=](const Values& v) { return ref_cross_entropy(v, ls, targets, o); },
          o.reduction == "none" ? ts : Shape{}};
  r.domains = {kWide};
  if (o.probabilities) r.domains = {kWide, Domain{0, 1, 0, 1}};
  return r;
}

OpRow bce_row(Shape s) {
  OpRow r{"binary_cross_entropy_with_logits " + s.str(),
          OpId::LogSigmoid,
          true,
          {s, s},
          [](const Ins& in) { return binary_cross_entropy_with_logits(in[0], in[1]); },
          [](const Values& v) {
            double acc = 0;
            for (size_t i = 0; i < v[0].size(); ++i) {
              const double x = v[0][i], y = v[1][i];
              acc -= y * log_sigmoid_ref(x) + (1 - y) * log_sigmoid_ref(-x);
            }
            return std::vector<double>{acc / double(v[0].size())};
          },
          {}};
  r.domains = {kWide, kUnit};
  return r;
}

// Seeded inside the call, so every call (and every gradcheck evaluation) draws the same mask;
// p is a power of two so the f32 and f64 uniform draws give the same mask.
OpRow dropout_row(Shape s, double p, uint64_t seed) {
  return {fmt::format("dropout {} p {}", s.str(), p),
          OpId::Random,
          true,
          {s},
          [=](const Ins& in) {
            manual_seed(seed);
            return dropout(in[0], p, true);
          },
          [=](const Values& v) {
            std::vector<double> y;
            for (size_t i = 0; i < v[0].size(); ++i) {
              const double u = ref_draw(0, DType::f64, 0, seed, 0, int64_t(i));
              y.push_back(u >= p ? v[0][i] / (1 - p) : 0.0);
            }
            return y;
          },
          s};
}

OpRow draw_row(int dist, Shape s, DType dt, uint64_t seed, int64_t high = 0, int64_t before = 0) {
  static const char* names[] = {"rand", "randn", "randint"};
  OpRow r{fmt::format("{} {} {}{}", names[dist], s.str(), dtype_name(dt),
                      before ? fmt::format(" after {} draws", before) : ""),
          OpId::Random,
          false,
          {},
          [=](const Ins&) {
            manual_seed(seed);
            const Options o = Options().dtype(dt);
            if (before) rand({before}, o);  // advances the offset by ceil(before / 2) blocks
            return dist == 0 ? rand(s, o) : dist == 1 ? randn(s, o) : randint(high, s, o);
          },
          [=](const Values&) {
            std::vector<double> y;
            for (int64_t i = 0; i < s.numel(); ++i)
              y.push_back(ref_draw(dist, dt, high, seed, uint64_t(before + 1) / 2, i));
            return y;
          },
          s};
  r.dtypes = {dt};
  r.grad = s.numel() <= 24;  // small enough for the gradient sweep (results outside autograd)
  return r;
}

}  // namespace

const std::vector<ElementwiseRow>& special_function_rows() {
  static const std::vector<ElementwiseRow> rows = [] {
    std::vector<ElementwiseRow> r = {
        {"erf",
         OpId::Erf,
         false,
         1,
         [](const Ins& in) { return erf(in[0]); },
         [](Ins in) { return erf(std::move(in[0])); },
         nullptr,
         nullptr,
         [](const double* x) { return std::erf(x[0]); },
         {Domain{-3, 3, -3, 3}},
         kAll,
         R::FloatIfNotFloat},
        {"log_sigmoid",
         OpId::LogSigmoid,
         false,
         1,
         [](const Ins& in) { return log_sigmoid(in[0]); },
         [](Ins in) { return log_sigmoid(std::move(in[0])); },
         nullptr,
         nullptr,
         [](const double* x) { return log_sigmoid_ref(x[0]); },
         {Domain{-20, 20, -30, 30}},
         kAll,
         R::FloatIfNotFloat},
        {"gelu_tanh",
         OpId::GeluTanh,
         false,
         1,
         [](const Ins& in) { return gelu_tanh(in[0]); },
         [](Ins in) { return gelu_tanh(std::move(in[0])); },
         nullptr,
         nullptr,
         [](const double* x) {
           const double v = x[0];
           return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
         },
         {Domain{-6, 6}},
         kAll,
         R::FloatIfNotFloat},
        {"gelu_tanh_grad",
         OpId::GeluTanhGrad,
         false,
         1,
         [](const Ins& in) { return gelu_tanh_grad(in[0]); },
         [](Ins in) { return gelu_tanh_grad(std::move(in[0])); },
         nullptr,
         nullptr,
         [](const double* x) {
           const double v = x[0], a = std::sqrt(2 / M_PI),
                        t = std::tanh(a * (v + 0.044715 * v * v * v));
           return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * a * (1 + 3 * 0.044715 * v * v);
         },
         {Domain{-6, 6}},
         kAll,
         R::FloatIfNotFloat},
        {"gelu",
         OpId::Erf,
         true,
         1,
         [](const Ins& in) { return gelu(in[0]); },
         nullptr,
         nullptr,
         nullptr,
         [](const double* x) { return x[0] * 0.5 * (1 + std::erf(x[0] / std::sqrt(2.0))); },
         {Domain{-4, 4}},
         kFloat,
         R::Same},
        {"gelu, approximate tanh",
         OpId::GeluTanh,
         true,
         1,
         [](const Ins& in) { return gelu(in[0], "tanh"); },
         nullptr,
         nullptr,
         nullptr,
         [](const double* x) {
           const double v = x[0];
           return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
         },
         {Domain{-5, 5}},
         kFloat,
         R::Same},
        {"softplus",
         OpId::Log1p,
         true,
         1,
         [](const Ins& in) { return softplus(in[0]); },
         nullptr,
         nullptr,
         nullptr,
         [](const double* x) { return x[0] > 20 ? x[0] : std::log1p(std::exp(x[0])); },
         {Domain{-25, 25}},
         kFloat,
         R::Same},
        {"softplus, beta 2, threshold 5",
         OpId::Log1p,
         true,
         1,
         [](const Ins& in) { return softplus(in[0], 2, 5); },
         nullptr,
         nullptr,
         nullptr,
         [](const double* x) { return 2 * x[0] > 5 ? x[0] : std::log1p(std::exp(2 * x[0])) / 2; },
         {Domain{-6, 6}},
         kFloat,
         R::Same},
        {"silu",
         OpId::Sigmoid,
         true,
         1,
         [](const Ins& in) { return silu(in[0]); },
         nullptr,
         nullptr,
         nullptr,
         [](const double* x) { return x[0] * sigmoid_ref(x[0]); },
         {Domain{-8, 8}},
         kFloat,
         R::Same},
    };
    for (const ElementwiseRow& act : activation_rows()) r.push_back(act);
    for (const ElementwiseRow& p : pointwise_rows()) r.push_back(p);
    return r;
  }();
  return rows;
}

const std::vector<OpRow>& nn_rows() {
  static const std::vector<OpRow> rows = [] {
    std::vector<OpRow> r = {
        soft_row(Soft::Softmax, {3, 4}, 1),
        soft_row(Soft::Softmax, {3, 4}, 0),
        soft_row(Soft::Softmax, {2, 3, 4}, -2),
        soft_row(Soft::Softmax, {5}, 0),
        soft_row(Soft::Softmax, {}, 0),
        soft_row(Soft::Softmax, {0, 3}, 1),
        soft_row(Soft::Softmax, {2, 0}, 1),
        soft_row(Soft::LogSoftmax, {3, 4}, -1),
        soft_row(Soft::LogSoftmax, {4, 3}, 0),
        soft_row(Soft::LogSoftmax, {2, 3, 2}, 1),
        soft_row(Soft::LogSoftmax, {}, -1),
        soft_row(Soft::LogSoftmax, {2, 0}, 1),
        soft_row(Soft::LogSumExp, {3, 4}, 1),
        soft_row(Soft::LogSumExp, {2, 3, 4}, 0),
        soft_row(Soft::LogSumExp, {6}, 0),
        soft_row(Soft::LogSumExp, {}, 0),
        soft_row(Soft::LogSumExp, {2, 0}, 1),
        soft_row(Soft::LogSumExp, {0, 3}, 1),
        linear_row("linear (3, 4) -> 2, bias", {3, 4}, 2, true),
        linear_row("linear (4) -> 3, no bias", {4}, 3, false),
        linear_row("linear (4) -> 3, bias", {4}, 3, true),
        addmv_row({3}, 3, 4, 1, 1),
        addmv_row({4}, 4, 4, 1, 1),  // square: batched as mat^T, a transpose no shape checks
        addmv_row({0}, 0, 4, 1, 1),
        addmv_row({3}, 3, 0, 1, 1),
        addmv_row({2}, 2, 1, 1, 1),
        addmv_row({3}, 3, 4, 0.5, 2),
        addmv_row({1}, 3, 2, 1, 1),
        addmv_row({}, 3, 2, 0, 1),
        addmm_row({3}, 2, 4, 3, 1, 1),
        addmm_row({0}, 2, 4, 0, 1, 1),
        addmm_row({3}, 0, 4, 3, 1, 1),
        addmm_row({3}, 2, 0, 3, 1, 1),
        addmm_row({3}, 2, 4, 3, 0.5, 2),
        addmm_row({1}, 2, 3, 4, 1, 1),
        addmm_row({2, 1}, 2, 3, 4, 1, 1),
        addmm_row({2, 4}, 2, 3, 4, 1, 1),
        addmm_row({}, 2, 3, 4, 0, 1),
        linear_row("linear (2, 2, 3) -> 2, bias", {2, 2, 3}, 2, true),
        linear_row("linear (0, 4) -> 3, bias", {0, 4}, 3, true),
        layer_norm_row("layer_norm (3, 4) over (4), weight and bias", {3, 4}, {4}, true, true),
        layer_norm_row("layer_norm (2, 3, 2) over (3, 2), weight", {2, 3, 2}, {3, 2}, true, false),
        layer_norm_row("layer_norm (4, 3) over (3), bias", {4, 3}, {3}, false, true),
        layer_norm_row("layer_norm (5) over (5)", {5}, {5}, false, false),
        layer_norm_row("layer_norm (0, 4) over (4)", {0, 4}, {4}, true, true),
        sdpa_row({2}, 3, 4, 2, 3, 0, 0),
        sdpa_row({2}, 3, 4, 2, 3, 1, 0),
        sdpa_row({1, 2}, 4, 4, 2, 3, 1, 0),
        sdpa_row({2}, 3, 4, 2, 3, 2, 0),
        sdpa_row({2}, 3, 4, 2, 3, 3, 0.5),
        sdpa_row({}, 4, 3, 3, 2, 1, 0),
        // Past one tile of 64 queries and of 64 keys (the fused kernels' tiles), L != S; too large
        // for the gradient sweep, so attention_backward_row covers their gradients.
        forward_only(sdpa_row({2}, 70, 130, 8, 5, 1, 0)),
        forward_only(sdpa_row({1}, 65, 67, 4, 3, 2, 0)),
        forward_only(sdpa_row({}, 66, 129, 3, 4, 3, 0.25)),
        sdpa_row({2}, 3, 0, 2, 3, 0, 0),
        attention_backward_row({2}, 3, 4, 2, 3, 0),
        attention_backward_row({2}, 3, 4, 2, 3, 1),
        attention_backward_row({}, 70, 67, 4, 3, 2),
        mse_row({3, 4}),
        mse_row({5}),
        mse_row({}),
        cross_entropy_row("cross_entropy (4, 3)", {4, 3}, {2, 0, 1, 2}),
        cross_entropy_row("cross_entropy (3, 5), repeated targets", {3, 5}, {4, 4, 0}),
        cross_entropy_row("cross_entropy (4) with a 0-d target", {4}, {3}),
        cross_entropy_row("cross_entropy (1, 1)", {1, 1}, {0}),
        cross_entropy_row("cross_entropy (4, 3) none", {4, 3}, {2, 0, 1, 2}, {.reduction = "none"}),
        cross_entropy_row("cross_entropy (4, 3) sum", {4, 3}, {2, 0, 1, 2}, {.reduction = "sum"}),
        cross_entropy_row("cross_entropy (5, 3) ignore_index -100", {5, 3}, {2, -100, 1, 0, -100}),
        cross_entropy_row("cross_entropy (4, 3) ignore_index 1 none", {4, 3}, {1, 0, 1, 2},
                          {.reduction = "none", .ignore = 1}),
        cross_entropy_row("cross_entropy (4, 3) weight", {4, 3}, {2, 0, 1, 2},
                          {.weight = {0.2, 1.5, 0.7}}),
        cross_entropy_row("cross_entropy (4, 3) weight, ignore_index, smoothing", {4, 3},
                          {2, 0, 1, 2}, {.ignore = 0, .smoothing = 0.1, .weight = {0.2, 1.5, 0.7}}),
        cross_entropy_row("cross_entropy (4, 3) smoothing sum", {4, 3}, {2, 0, 1, 1},
                          {.reduction = "sum", .smoothing = 0.3}),
        cross_entropy_row("cross_entropy (2, 3, 4) K-dim smoothing", {2, 3, 4},
                          {0, 1, 2, 1, 2, 2, 0, 0}, {.smoothing = 0.2}),
        cross_entropy_row("cross_entropy (2, 3, 2) K-dim weight none", {2, 3, 2}, {0, 2, 1, 1},
                          {.reduction = "none", .weight = {1.0, 0.5, 2.0}}),
        cross_entropy_row("cross_entropy (3) 0-d target, smoothing", {3}, {1}, {.smoothing = 0.2}),
        cross_entropy_row("cross_entropy (3, 4) probabilities", {3, 4}, {},
                          {.probabilities = true}),
        cross_entropy_row("cross_entropy (3, 4) probabilities, weight, smoothing none", {3, 4}, {},
                          {.reduction = "none",
                           .smoothing = 0.1,
                           .weight = {0.5, 1, 1.5, 2},
                           .probabilities = true}),
        bce_row({3, 4}),
        bce_row({5}),
        bce_row({}),
        dropout_row({3, 4}, 0.5, 11),
        dropout_row({2, 3, 2}, 0.25, 12),
        dropout_row({}, 0.5, 13),
    };
    for (OpRow& more : norm_loss_rows()) r.push_back(std::move(more));
    return r;
  }();
  return rows;
}

const std::vector<OpRow>& random_rows() {
  using D = DType;
  static const std::vector<OpRow> rows = {
      draw_row(0, {3, 5}, D::f32, 1),
      draw_row(0, {7}, D::f64, 2),
      draw_row(0, {}, D::f32, 3),
      draw_row(0, {0, 3}, D::f32, 4),
      draw_row(0, {2, 3}, D::f32, 5, 0, 5),
      draw_row(1, {3, 3}, D::f32, 6),
      draw_row(1, {5}, D::f64, 7),
      draw_row(1, {2, 2}, D::f64, 8, 0, 3),
      draw_row(2, {4, 4}, D::i64, 9, 10),
      draw_row(2, {9}, D::i32, 10, 3),
      draw_row(2, {5}, D::f32, 11, 1000),
      draw_row(2, {3}, D::i64, 12, int64_t(1) << 40),
      draw_row(0, {300, 257}, D::f32, 13),
      draw_row(1, {257, 300}, D::f64, 14),
      draw_row(2, {300, 257}, D::i64, 15, 7),
  };
  return rows;
}

const std::vector<OpRow>& op_rows() {
  static const std::vector<OpRow> rows = [] {
    std::vector<OpRow> r;
    for (const auto* part :
         {&index_rows(), &nn_rows(), &image_rows(), &random_rows(), &more_rows()})
      r.insert(r.end(), part->begin(), part->end());
    // Print: an effect in the middle of a computation, which must leave its value alone (the
    // tests drop the text: tests/main.cpp; test_print checks it).
    r.push_back({"print",
                 OpId::Print,
                 false,
                 {{2, 3}},
                 [](const std::vector<Tensor>& in) {
                   print(in[0], "x = {}");
                   return in[0] * 2.0;
                 },
                 [](const Values& v) {
                   std::vector<double> o = v[0];
                   for (double& x : o) x *= 2;
                   return o;
                 },
                 {2, 3}});
    // Collectives in this test process's world of one (tests/test_dist_mpi.cpp runs them
    // across ranks): each returns its input, and each gradient rule, itself a collective, too.
    auto identity = [](const Values& v) { return v[0]; };
    auto collective = [&](std::string name, OpId op, bool composite, Shape s,
                          std::function<Tensor(const Tensor&)> f) {
      r.push_back({std::move(name),
                   op,
                   composite,
                   {s},
                   [f](const std::vector<Tensor>& in) {
                     dist::init();
                     return f(in[0]);
                   },
                   identity,
                   s,
                   {DType::f32, DType::f64, DType::i64}});
    };
    using dist::ReduceOp;
    collective("all_reduce", OpId::AllReduce, false, {2, 3},
               [](const Tensor& x) { return dist::all_reduce(x); });
    collective("all_reduce_max", OpId::AllReduce, false, {2, 3},
               [](const Tensor& x) { return dist::all_reduce(x, ReduceOp::Max); });
    collective("broadcast", OpId::Broadcast, false, {4},
               [](const Tensor& x) { return dist::broadcast(x, 0); });
    collective("all_gather", OpId::AllGather, false, {3, 2},
               [](const Tensor& x) { return dist::all_gather(x); });
    collective("all_gather_dim1", OpId::AllGather, true, {2, 3},
               [](const Tensor& x) { return dist::all_gather(x, -1); });
    collective("all_reduce_start_wait", OpId::CollectiveWait, false, {2, 3}, [](const Tensor& x) {
      return dist::detail::wait(dist::detail::all_reduce_start(x));
    });
    collective("reduce_scatter", OpId::ReduceScatter, false, {3, 2},
               [](const Tensor& x) { return dist::reduce_scatter(x); });
    collective("reduce_scatter_max_dim1", OpId::ReduceScatter, true, {2, 3},
               [](const Tensor& x) { return dist::reduce_scatter(x, ReduceOp::Max, 1); });
    r.push_back({"all_reduce_mean",
                 OpId::AllReduce,
                 true,
                 {{2, 3}},
                 [](const std::vector<Tensor>& in) {
                   dist::init();
                   return dist::all_reduce(in[0], dist::ReduceOp::Mean);
                 },
                 identity,
                 {2, 3}});
    return r;
  }();
  return rows;
}

// ---- Philox4x32-10 (Salmon et al., SC'11; the constants of Random123) -------------------------

std::vector<uint32_t> ref_philox(const std::vector<uint32_t>& counter,
                                 const std::vector<uint32_t>& key) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int round = 0; round < 10; ++round) {
    if (round) k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;  // the key schedule (Weyl sequence)
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t next[4] = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1),
                              uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
    for (int j = 0; j < 4; ++j) c[j] = next[j];
  }
  return {c[0], c[1], c[2], c[3]};
}

double ref_draw(int dist, DType dtype, int64_t high, uint64_t seed, uint64_t offset, int64_t i) {
  const uint64_t block = offset + uint64_t(i) / 2;
  const std::vector<uint32_t> w = ref_philox({uint32_t(block), uint32_t(block >> 32), 0, 0},
                                             {uint32_t(seed), uint32_t(seed >> 32)});
  auto u53 = [](uint32_t hi, uint32_t lo) {
    return (double(hi) * 2097152.0 + double(lo >> 11)) / 9007199254740992.0;  // 53 bits / 2^53
  };
  const uint32_t hi = w[2 * (i % 2)], lo = w[2 * (i % 2) + 1];
  if (dist == 2) return round_to(double(((uint64_t(hi) << 32) | lo) % uint64_t(high)), dtype);
  // Uniform draws keep as many random bits as the dtype has digits, so they stay below 1.
  const int digits = dtype == DType::f32    ? 24
                     : dtype == DType::f16  ? 11
                     : dtype == DType::bf16 ? 8
                                            : 0;
  if (dist == 0) return digits ? std::ldexp(double(hi >> (32 - digits)), -digits) : u53(hi, lo);
  const double r = std::sqrt(-2 * std::log(1 - u53(w[0], w[1])));
  const double theta = 2 * M_PI * u53(w[2], w[3]);
  return round_to(i % 2 ? r * std::sin(theta) : r * std::cos(theta), dtype);
}

}  // namespace duet::test
