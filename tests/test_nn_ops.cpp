// The checks beyond the op rows: the softmax family and cross_entropy at logits of
// +-1e4, the gradient of every composite against a hand-written closed form, conv2d against a
// direct convolution over a grid of geometries, unfold/fold adjointness, max-pool ties, argmax
// ties and NaN, repeated indices, and cat with mixed dtypes.
#include <cmath>
#include <limits>

#include "op_rows.h"

namespace duet::test {
namespace {

const Options kF64 = Options().dtype(DType::f64);

Tensor leaf64(const std::vector<double>& v, const Shape& s) {
  return make(v, s, DType::f64).requires_grad_();
}

// Gradients of y with respect to xs for the upstream gradient g.
std::vector<std::vector<double>> grads_of(const Tensor& y, const std::vector<Tensor>& xs,
                                          const Tensor& g) {
  std::vector<std::vector<double>> out;
  for (const Tensor& t : grad({y}, xs, {g})) out.push_back(values(t));
  return out;
}

// Normwise relative difference max|got - want| / max|want| (0 when both are 0).
double rel_diff(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return den == 0 ? num : num / den;
}

// The largest relative difference between a composite's gradient and its closed form, reported
// by the test case that checks them.
double g_worst = 0;
std::string g_worst_name;
void check_closed(const char* name, const std::vector<double>& got, const std::vector<double>& want,
                  double tol = 1e-14) {
  const double d = rel_diff(got, want);
  INFO(name);
  CHECK_MESSAGE(d <= tol, "relative difference " << d);
  if (d >= g_worst) g_worst = d, g_worst_name = name;
}

std::vector<double> softmax_rows(const std::vector<double>& x, int64_t rows, int64_t c) {
  std::vector<double> s(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, t = 0;
    for (int64_t j = 0; j < c; ++j) m = std::max(m, x[r * c + j]);
    for (int64_t j = 0; j < c; ++j) t += std::exp(x[r * c + j] - m);
    for (int64_t j = 0; j < c; ++j) s[r * c + j] = std::exp(x[r * c + j] - m) / t;
  }
  return s;
}

bool all_finite(const Tensor& t) {
  for (double v : values(t))
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

TEST_CASE("log_softmax, logsumexp, softmax and cross_entropy at logits of +-1e4") {
  const std::vector<double> xv = {1e4,  -1e4, 0,   5e3,       -1e4, -1e4,
                                  -1e4, -1e4, 1e4, 1e4 - 0.5, -1e4, 1e4};
  const std::vector<double> targets = {1, 2, 0};
  const std::vector<double> s = softmax_rows(xv, 3, 4);
  std::vector<double> lse(3), lsm(12), ce_grad(12);
  double ce = 0;
  for (int r = 0; r < 3; ++r) {
    double m = -INFINITY, t = 0;
    for (int j = 0; j < 4; ++j) m = std::max(m, xv[r * 4 + j]);
    for (int j = 0; j < 4; ++j) t += std::exp(xv[r * 4 + j] - m);
    lse[r] = m + std::log(t);
    for (int j = 0; j < 4; ++j) {
      lsm[r * 4 + j] = (xv[r * 4 + j] - m) - std::log(t);
      ce_grad[r * 4 + j] = (s[r * 4 + j] - (j == targets[r])) / 3;
    }
    ce += (lse[r] - xv[r * 4 + int(targets[r])]) / 3;
  }
  const Tensor t = make(targets, {3}, DType::i64);
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dtype_name(dt));
    const Tensor x = make(xv, {3, 4}, dt);
    const double rtol = dt == DType::f64 ? 1e-14 : 1e-6, atol = dt == DType::f64 ? 1e-15 : 1e-7;
    for (const Tensor& y : {log_softmax(x, 1), logsumexp(x, 1), softmax(x, 1), cross_entropy(x, t)})
      CHECK(all_finite(y));
    check_tensor(log_softmax(x, 1), {3, 4}, dt, lsm, rtol, atol);
    check_tensor(logsumexp(x, -1), {3}, dt, lse, rtol, atol);
    check_tensor(softmax(x, 1), {3, 4}, dt, s, rtol, atol);
    check_tensor(cross_entropy(x, t), {}, dt, {ce}, rtol, atol);
  }
  // Gradcheck in float64 with the default tolerances, on every function of the logits.
  Tensor x = leaf64(xv, {3, 4});
  const std::vector<std::pair<const char*, std::function<Tensor(const std::vector<Tensor>&)>>> fns =
      {{"log_softmax", [](const auto& in) { return log_softmax(in[0], 1); }},
       {"logsumexp", [](const auto& in) { return logsumexp(in[0], 1); }},
       {"softmax", [](const auto& in) { return softmax(in[0], 0); }},
       {"cross_entropy", [&](const auto& in) { return cross_entropy(in[0], t); }}};
  for (const auto& [name, fn] : fns) {
    GradcheckResult r = gradcheck(fn, {x});
    CHECK_MESSAGE(r.ok, name << ": " << r.message);
    MESSAGE(std::string(name) << " at +-1e4: finite, gradcheck "
                              << std::string(r.ok ? "passes" : "FAILS"));
  }
  // The gradient is the closed form to the last bits.
  std::vector<double> g = grads_of(cross_entropy(x, t), {x}, ones({}, kF64))[0];
  check_closed("cross_entropy at +-1e4", g, ce_grad, 1e-15);
  MESSAGE("cross_entropy at +-1e4: " << cross_entropy(x, t).item<double>() << " (reference " << ce
                                     << "), gradient off the closed form by "
                                     << rel_diff(g, ce_grad));
  check_tensor(grad({logsumexp(x, 1)}, {x}, {ones({3}, kF64)})[0], {3, 4}, DType::f64, s, 0, 1e-15);
}

TEST_CASE("gradients of the composites against hand-written closed forms") {
  Rng rng(41);
  auto rnd = [&](int64_t n, double lo = -2, double hi = 2) {
    return random_values(n, Domain{lo, hi}, DType::f64, rng);
  };
  const std::vector<double> xv = rnd(12), gv = rnd(12);
  const Tensor g = make(gv, {3, 4}, DType::f64);
  Tensor x = leaf64(xv, {3, 4});
  const std::vector<double> s = softmax_rows(xv, 3, 4);
  std::vector<double> want(12), want_log(12);
  // softmax: s * (g - sum(g * s)); log_softmax: g - s * sum(g); logsumexp: g * s.
  for (int r = 0; r < 3; ++r) {
    double gs = 0, gsum = 0;
    for (int j = 0; j < 4; ++j) gs += gv[r * 4 + j] * s[r * 4 + j], gsum += gv[r * 4 + j];
    for (int j = 0; j < 4; ++j) {
      want[r * 4 + j] = s[r * 4 + j] * (gv[r * 4 + j] - gs);
      want_log[r * 4 + j] = gv[r * 4 + j] - s[r * 4 + j] * gsum;
    }
  }
  check_closed("softmax", grads_of(softmax(x, 1), {x}, g)[0], want);
  check_closed("log_softmax", grads_of(log_softmax(x, -1), {x}, g)[0], want_log);
  const std::vector<double> g3 = {0.5, -1.5, 2};
  for (int i = 0; i < 12; ++i) want[i] = g3[i / 4] * s[i];
  check_closed("logsumexp", grads_of(logsumexp(x, 1), {x}, make(g3, {3}, DType::f64))[0], want);
  // cross_entropy: (softmax - onehot) / N.
  const std::vector<double> tv = {3, 0, 3};
  for (int i = 0; i < 12; ++i) want[i] = (s[i] - (i % 4 == tv[i / 4])) / 3;
  check_closed("cross_entropy",
               grads_of(cross_entropy(x, make(tv, {3}, DType::i64)), {x}, ones({}, kF64))[0], want);
  // Elementwise composites: gelu' = Phi + x phi, silu' = s (1 + x (1 - s)).
  std::vector<double> wg(12), ws(12);
  for (int i = 0; i < 12; ++i) {
    const double v = xv[i], sg = 1 / (1 + std::exp(-v));
    wg[i] = gv[i] *
            (0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI));
    ws[i] = gv[i] * sg * (1 + v * (1 - sg));
  }
  check_closed("gelu", grads_of(gelu(x), {x}, g)[0], wg);
  // gelu, tanh form: with u = c (x + a x^3), t = tanh(u):
  // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2).
  std::vector<double> wt(12);
  for (int i = 0; i < 12; ++i) {
    const double v = xv[i], c = std::sqrt(2 / M_PI), a = 0.044715;
    const double t = std::tanh(c * (v + a * v * v * v));
    wt[i] = gv[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * a * v * v));
  }
  check_closed("gelu tanh", grads_of(gelu(x, "tanh"), {x}, g)[0], wt);
  check_closed("silu", grads_of(silu(x), {x}, g)[0], ws);
  // mse_loss: 2 (p - t) / n for the prediction, the negative for the target.
  const std::vector<double> yv = rnd(12);
  Tensor y = leaf64(yv, {3, 4});
  std::vector<std::vector<double>> gm = grads_of(mse_loss(x, y), {x, y}, ones({}, kF64));
  for (int i = 0; i < 12; ++i) want[i] = 2 * (xv[i] - yv[i]) / 12;
  check_closed("mse_loss (prediction)", gm[0], want);
  for (double& w : want) w = -w;
  check_closed("mse_loss (target)", gm[1], want);
}

TEST_CASE("cross_entropy's options: the string and enum reductions, and typed errors") {
  const Tensor x = randn({4, 3}, kF64), y = make({2, 0, 1, 2}, {4}, DType::i64);
  // The reduction as PyTorch spells it, as the enum, and in the options give one value.
  CHECK(values(cross_entropy(x, y, "none")) == values(cross_entropy(x, y, Reduction::None)));
  CHECK(cross_entropy(x, y, "none").sizes() == Shape{4});
  CHECK(values(cross_entropy(x, y, "sum")) ==
        values(cross_entropy(x, y, CrossEntropyOptions().reduction(Reduction::Sum))));
  CHECK(values(cross_entropy(x, y, "mean")) == values(cross_entropy(x, y)));
  // The default ignore_index is -100, as PyTorch's: such a target leaves the mean.
  const Tensor padded = make({2, -100, 1, 2}, {4}, DType::i64);
  const std::vector<double> each = values(cross_entropy(x, padded, "none"));
  CHECK(each[1] == 0);
  CHECK(std::abs(cross_entropy(x, padded).item<double>() - (each[0] + each[2] + each[3]) / 3) <
        1e-14);
  // Every target ignored: the mean of nothing is NaN, as in PyTorch.
  CHECK(std::isnan(cross_entropy(x, full({4}, -100, Options().dtype(DType::i64))).item<double>()));
  CHECK(starts_with(error_of<ValueError>([&] { cross_entropy(x, y, "average"); }),
                    "[cross_entropy] reduction must be"));
  CHECK(starts_with(error_of<ValueError>(
                        [&] { cross_entropy(x, y, CrossEntropyOptions().label_smoothing(1.5)); }),
                    "[cross_entropy] label_smoothing"));
  const std::string shape_msg = error_of<ShapeError>(
      [&] { cross_entropy(x, y, CrossEntropyOptions().weight(ones({4}, kF64))); });
  CHECK_MESSAGE(starts_with(shape_msg, "[cross_entropy] weight must be 1-D"), shape_msg);
  CHECK_MESSAGE(contains(shape_msg, "(4, 3)"), shape_msg);
  CHECK(starts_with(
      error_of<DTypeError>([&] { cross_entropy(x, y, CrossEntropyOptions().weight(ones({3}))); }),
      "[cross_entropy] weight must have the logits' dtype"));
  CHECK(starts_with(error_of<DTypeError>([&] { cross_entropy(x, y.to(DType::i32)); }),
                    "[cross_entropy] targets must be i64"));
  CHECK(starts_with(error_of<ShapeError>([&] {
                      cross_entropy(x, make({1, 2}, {2}, DType::i64));
                    }),
                    "[cross_entropy] expected logits"));
  CHECK(starts_with(error_of<ShapeError>([&] {
                      cross_entropy(x, zeros({4, 2}, kF64));
                    }),
                    "[cross_entropy] class probabilities must have the logits' shape"));
  // A class index out of range that is not ignore_index names cross_entropy.
  const std::string range = error_of<ValueError>([&] {
    cross_entropy(x, make({2, 0, 3, 2}, {4}, DType::i64));
  });
  CHECK_MESSAGE(starts_with(range, "[cross_entropy]"), range);
}

TEST_CASE("binary_cross_entropy_with_logits: gradient sigmoid(x) - y, also at x = 0") {
  const std::vector<double> xv = {0, 0, -0.0, 1e4, -1e4, 30, -30, 0.5},
                            yv = {0, 1, 0.5, 0, 1, 1, 0, 0.25};
  Tensor x = leaf64(xv, {8}), y = leaf64(yv, {8});
  Tensor loss = binary_cross_entropy_with_logits(x, y);
  CHECK(all_finite(loss));
  std::vector<std::vector<double>> g = grads_of(loss, {x, y}, ones({}, kF64));
  std::vector<double> wx, wy;
  for (size_t i = 0; i < xv.size(); ++i) {
    wx.push_back((1 / (1 + std::exp(-xv[i])) - yv[i]) / 8);
    wy.push_back(-xv[i] / 8);
  }
  check_closed("bce (logits)", g[0], wx);
  check_closed("bce (targets)", g[1], wy);
  CHECK(g[0][0] == 0.5 / 8);  // exactly, at x == 0
  CHECK(g[0][1] == -0.5 / 8);
  CHECK(g[0][2] == 0.0);
  // log_sigmoid' = sigmoid(-x) and erf' = 2/sqrt(pi) exp(-x^2), finite everywhere.
  Tensor z = leaf64({-1e4, -3, 0, 2.5, 1e4}, {5});
  std::vector<double> wl, we;
  for (double v : values(z)) {
    wl.push_back(1 / (1 + std::exp(v)));
    we.push_back(2 / std::sqrt(M_PI) * std::exp(-v * v));
  }
  check_closed("log_sigmoid", grads_of(log_sigmoid(z), {z}, ones({5}, kF64))[0], wl);
  check_closed("erf", grads_of(erf(z), {z}, ones({5}, kF64))[0], we);
}

TEST_CASE("layer_norm and linear: gradients against closed forms") {
  Rng rng(42);
  const int64_t rows = 3, n = 5;
  const double eps = 1e-5;
  std::vector<double> xv = random_values(rows * n, Domain{-2, 2}, DType::f64, rng);
  std::vector<double> wv = random_values(n, Domain{0.5, 2}, DType::f64, rng);
  std::vector<double> bv = random_values(n, Domain{-1, 1}, DType::f64, rng);
  std::vector<double> gv = random_values(rows * n, Domain{-1, 1}, DType::f64, rng);
  Tensor x = leaf64(xv, {rows, n}), w = leaf64(wv, {n}), b = leaf64(bv, {n});
  std::vector<std::vector<double>> got =
      grads_of(layer_norm(x, {n}, w, b, eps), {x, w, b}, make(gv, {rows, n}, DType::f64));
  // With xhat = (x - mu) / sigma and h = g * w: dx = (h - mean(h) - xhat * mean(h * xhat)) /
  // sigma, dw = sum over rows of g * xhat, db = sum over rows of g.
  std::vector<double> dx(rows * n), dw(n, 0), db(n, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mu += xv[r * n + i] / n;
    for (int64_t i = 0; i < n; ++i) var += (xv[r * n + i] - mu) * (xv[r * n + i] - mu) / n;
    const double sigma = std::sqrt(var + eps);
    double mh = 0, mhx = 0;
    std::vector<double> xhat(n);
    for (int64_t i = 0; i < n; ++i) {
      xhat[i] = (xv[r * n + i] - mu) / sigma;
      mh += gv[r * n + i] * wv[i] / n;
      mhx += gv[r * n + i] * wv[i] * xhat[i] / n;
      dw[i] += gv[r * n + i] * xhat[i];
      db[i] += gv[r * n + i];
    }
    for (int64_t i = 0; i < n; ++i)
      dx[r * n + i] = (gv[r * n + i] * wv[i] - mh - xhat[i] * mhx) / sigma;
  }
  check_closed("layer_norm (input)", got[0], dx, 1e-13);
  check_closed("layer_norm (weight)", got[1], dw);
  check_closed("layer_norm (bias)", got[2], db);

  // linear: dx = g W, dW = g^T x, db = column sums of g.
  const int64_t in = 4, out = 3;
  std::vector<double> lx = random_values(2 * in, Domain{-2, 2}, DType::f64, rng);
  std::vector<double> lw = random_values(out * in, Domain{-2, 2}, DType::f64, rng);
  std::vector<double> lg = random_values(2 * out, Domain{-2, 2}, DType::f64, rng);
  Tensor a = leaf64(lx, {2, in}), lwt = leaf64(lw, {out, in}), lb = leaf64({1, 2, 3}, {out});
  got = grads_of(linear(a, lwt, lb), {a, lwt, lb}, make(lg, {2, out}, DType::f64));
  std::vector<double> ga(2 * in, 0), gw(out * in, 0), gb(out, 0);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t o = 0; o < out; ++o) {
      gb[o] += lg[r * out + o];
      for (int64_t i = 0; i < in; ++i) {
        ga[r * in + i] += lg[r * out + o] * lw[o * in + i];
        gw[o * in + i] += lg[r * out + o] * lx[r * in + i];
      }
    }
  check_closed("linear (input)", got[0], ga);
  check_closed("linear (weight)", got[1], gw);
  check_closed("linear (bias)", got[2], gb);
}

namespace {
// A direct convolution on the zero-padded image, and its two gradients written out.
struct Conv {
  int64_t n, c, h, w, o, k, s, p, ho, wo;
  int64_t xi(int64_t a, int64_t b, int64_t i, int64_t j) const {
    return ((a * c + b) * h + i) * w + j;
  }
  int64_t wi(int64_t a, int64_t b, int64_t i, int64_t j) const {
    return ((a * c + b) * k + i) * k + j;
  }
  int64_t yi(int64_t a, int64_t b, int64_t i, int64_t j) const {
    return ((a * o + b) * ho + i) * wo + j;
  }
  // Calls f(x index, w index, y index) for every product in the convolution.
  template <class F>
  void each(F f) const {
    for (int64_t a = 0; a < n; ++a)
      for (int64_t q = 0; q < o; ++q)
        for (int64_t i = 0; i < ho; ++i)
          for (int64_t j = 0; j < wo; ++j)
            for (int64_t b = 0; b < c; ++b)
              for (int64_t u = 0; u < k; ++u)
                for (int64_t v = 0; v < k; ++v) {
                  const int64_t r = i * s - p + u, t = j * s - p + v;
                  if (r >= 0 && r < h && t >= 0 && t < w)
                    f(xi(a, b, r, t), wi(q, b, u, v), yi(a, q, i, j));
                }
  }
};
}  // namespace

TEST_CASE("conv2d against a direct convolution: strides, paddings, channels, batch, bias") {
  Rng rng(43);
  int cases = 0;
  for (int64_t k : {1, 2, 3})
    for (int64_t s : {1, 2, 3})
      for (int64_t p : {0, 1, 2})
        for (auto [c, o] : {std::pair<int64_t, int64_t>{1, 1}, std::pair<int64_t, int64_t>{3, 2}})
          for (bool bias : {false, true}) {
            const Conv cv{2, c, 5, 6, o, k, s, p, (5 + 2 * p - k) / s + 1, (6 + 2 * p - k) / s + 1};
            INFO("k " << k << " s " << s << " p " << p << " c " << c << " o " << o << " bias "
                      << bias);
            std::vector<double> xv = random_values(cv.n * c * 30, Domain{-2, 2}, DType::f64, rng);
            std::vector<double> wv = random_values(o * c * k * k, Domain{-2, 2}, DType::f64, rng);
            std::vector<double> bv = random_values(o, Domain{-2, 2}, DType::f64, rng);
            std::vector<double> gv =
                random_values(cv.n * o * cv.ho * cv.wo, Domain{-1, 1}, DType::f64, rng);
            std::vector<double> yv(gv.size(), 0), gx(xv.size(), 0), gw(wv.size(), 0), gb(o, 0);
            cv.each([&](int64_t xi, int64_t wi, int64_t yi) {
              yv[yi] += xv[xi] * wv[wi];
              gx[xi] += gv[yi] * wv[wi];
              gw[wi] += gv[yi] * xv[xi];
            });
            for (size_t i = 0; i < yv.size(); ++i) {
              const int64_t q = (int64_t(i) / (cv.ho * cv.wo)) % o;
              if (bias) yv[i] += bv[q];
              gb[q] += gv[i];
            }
            Tensor x = leaf64(xv, {2, c, 5, 6}), wt = leaf64(wv, {o, c, k, k}), b = leaf64(bv, {o});
            Tensor y = conv2d(x, wt, bias ? b : Tensor(), s, p);
            check_tensor(y, {2, o, cv.ho, cv.wo}, DType::f64, yv, 1e-13, 1e-13);
            std::vector<Tensor> wrt = {x, wt};
            if (bias) wrt.push_back(b);
            std::vector<std::vector<double>> got =
                grads_of(y, wrt, make(gv, {2, o, cv.ho, cv.wo}, DType::f64));
            check_closed("conv2d (input)", got[0], gx, 1e-13);
            check_closed("conv2d (weight)", got[1], gw, 1e-13);
            if (bias) check_closed("conv2d (bias)", got[2], gb, 1e-13);
            // The same in f32, against the f64 result.
            check_tensor(conv2d(x.detach().to(DType::f32), wt.detach().to(DType::f32),
                                bias ? b.detach().to(DType::f32) : Tensor(), s, p),
                         {2, o, cv.ho, cv.wo}, DType::f32, yv, 1e-4, 1e-4);
            ++cases;
          }
  MESSAGE(cases << " conv2d geometries against the direct convolution");
}

TEST_CASE("pooling gradients: max to the largest element, ties split evenly; avg spreads") {
  // Windows of 2x2, stride 2, on one 4x4 plane; the second window has a 3-way tie.
  const std::vector<double> xv = {1, 5, 2, 2, 3, 0, 2, 1, 7, 7, 0, 0, 7, 6, 0, 0};
  Tensor x = leaf64(xv, {1, 1, 4, 4});
  check_tensor(max_pool2d(x, 2), {1, 1, 2, 2}, DType::f64, {5, 2, 7, 0});
  const Tensor g = make({1, 2, 3, 4}, {1, 1, 2, 2}, DType::f64);
  check_tensor(grad({max_pool2d(x, 2)}, {x}, {g})[0], {1, 1, 4, 4}, DType::f64,
               {0, 1, 2.0 / 3, 2.0 / 3, 0, 0, 2.0 / 3, 0, 1, 1, 1, 1, 1, 0, 1, 1});
  // avg_pool2d with overlapping windows (stride 1): each pixel gets g / 4 from every window.
  Tensor y = leaf64(std::vector<double>(9, 1), {1, 1, 3, 3});
  check_tensor(grad({avg_pool2d(y, 2, 1)}, {y}, {ones({1, 1, 2, 2}, kF64)})[0], {1, 1, 3, 3},
               DType::f64, {0.25, 0.5, 0.25, 0.5, 1, 0.5, 0.25, 0.5, 0.25});
}

TEST_CASE("unfold and fold are adjoint: <fold(c), x> == <c, unfold(x)>") {
  Rng rng(44);
  int cases = 0;
  using P = std::pair<int64_t, int64_t>;
  for (auto [h, w] : {P{4, 4}, P{5, 3}, P{2, 7}})
    for (int64_t k : {1, 2, 3})
      for (int64_t s : {1, 2, 3})
        for (int64_t p : {0, 1, 2}) {
          if (h + 2 * p < k || w + 2 * p < k) continue;
          INFO(h << "x" << w << " k " << k << " s " << s << " p " << p);
          Tensor x = make(random_values(2 * 3 * h * w, Domain{-1, 1}, DType::f64, rng),
                          {2, 3, h, w}, DType::f64);
          Tensor u = unfold(x, k, s, p);
          Tensor c =
              make(random_values(u.numel(), Domain{-1, 1}, DType::f64, rng), u.sizes(), DType::f64);
          const double lhs = sum(fold(c, h, w, k, s, p) * x).item<double>();
          const double rhs = sum(c * u).item<double>();
          CHECK(lhs == doctest::Approx(rhs).epsilon(1e-12));
          ++cases;
        }
  MESSAGE(cases << " unfold/fold geometries adjoint");
}

TEST_CASE("argmax and argmin: the first index among ties; NaN counts as the extreme") {
  const double nan = std::nan("");
  auto idx = [](const Tensor& t) { return values(t); };
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    CHECK(idx(argmax(make({1, 3, 3, 2}, {4}, dt), 0)) == std::vector<double>{1});
    CHECK(idx(argmin(make({2, 1, 1, 3}, {4}, dt), 0)) == std::vector<double>{1});
    CHECK(idx(argmax(make({1, nan, 5, nan}, {4}, dt), 0)) == std::vector<double>{1});
    CHECK(idx(argmin(make({1, nan, -5, nan}, {4}, dt), 0)) == std::vector<double>{1});
    CHECK(idx(argmax(make({INFINITY, nan}, {2}, dt), 0)) == std::vector<double>{1});
    CHECK(idx(argmin(make({-INFINITY, -INFINITY}, {2}, dt), 0)) == std::vector<double>{0});
    CHECK(idx(argmax(make({nan, nan}, {2}, dt), 0)) == std::vector<double>{0});
    // Along dim 0 of a transposed tensor, keepdim.
    Tensor x = transpose(make({4, 4, 1, nan, 0, 0, 2, 3, 3}, {3, 3}, dt), 0, 1);
    check_tensor(argmax(x, 0, true), {1, 3}, DType::i64, {0, 0, 1});
    check_tensor(argmin(x, 1), {3}, DType::i64, {1, 1, 1});
  }
  // Integer extremes: argmin must not overflow at the smallest value.
  check_tensor(argmin(make({0, -2147483648.0, 5, -2147483648.0}, {4}, DType::i32), 0), {},
               DType::i64, {1});
  check_tensor(argmax(make({7, 9, 9}, {3}, DType::i64), 0), {}, DType::i64, {1});
  Tensor lo = full({3}, std::numeric_limits<int64_t>::min());
  check_tensor(argmin(lo, 0), {}, DType::i64, {0});
}

TEST_CASE("repeated indices accumulate: scatter_add, and the gradients of gather and embedding") {
  check_tensor(
      scatter_add(zeros({3}), 0, make({0, 2, 0, 0}, {4}, DType::i64), make({1, 2, 3, 4}, {4})), {3},
      DType::f32, {8, 0, 2});
  check_tensor(
      scatter_add(make({1, 1, 1, 1}, {2, 2}, DType::i32), 1, make({1, 1, 1, 0}, {2, 2}, DType::i64),
                  make({5, 6, 7, 8}, {2, 2}, DType::i32)),
      {2, 2}, DType::i32, {1, 12, 9, 8});
  // gather reads x[1] three times: its gradient there is the sum of the three.
  Tensor x = leaf64({1, 2, 3}, {3});
  check_tensor(grad({gather(x, 0, make({1, 1, 1, 0}, {4}, DType::i64))}, {x},
                    {make({1, 2, 4, 8}, {4}, DType::f64)})[0],
               {3}, DType::f64, {8, 7, 0});
  // embedding: row 1 is looked up three times, row 3 once, rows 0 and 2 never.
  Tensor w = leaf64(std::vector<double>(12, 0.5), {4, 3});
  std::vector<double> gv(12);
  for (int i = 0; i < 12; ++i) gv[i] = i + 1;
  Tensor e = embedding(w, make({1, 3, 1, 1}, {2, 2}, DType::i64));
  check_tensor(grad({e}, {w}, {make(gv, {2, 2, 3}, DType::f64)})[0], {4, 3}, DType::f64,
               {0, 0, 0, 1 + 7 + 10, 2 + 8 + 11, 3 + 9 + 12, 0, 0, 0, 4, 5, 6});
  // index_select the same way along dim 1.
  Tensor m = leaf64({1, 2, 3, 4}, {2, 2});
  check_tensor(
      grad({index_select(m, 1, make({0, 0, 0}, {3}, DType::i64))}, {m}, {ones({2, 3}, kF64)})[0],
      {2, 2}, DType::f64, {3, 0, 3, 0});
}

TEST_CASE("cat with mixed dtypes promotes; its gradient slices back in each input's dtype") {
  Tensor a = make({1, 2}, {2}).requires_grad_();                 // f32
  Tensor b = make({3, 4, 5}, {3}, DType::f64).requires_grad_();  // f64
  Tensor y = cat({a, b});
  check_tensor(y, {5}, DType::f64, {1, 2, 3, 4, 5});
  std::vector<Tensor> g = grad({y}, {a, b}, {make({1, 2, 3, 4, 5}, {5}, DType::f64)});
  check_tensor(g[0], {2}, DType::f32, {1, 2});
  check_tensor(g[1], {3}, DType::f64, {3, 4, 5});
  check_tensor(cat({make({1, 2}, {2}, DType::i32), make({0.5}, {1})}), {3}, DType::f32,
               {1, 2, 0.5});
  check_tensor(cat({make({7}, {1}, DType::i64), make({1, 0}, {2}, DType::b8)}), {3}, DType::i64,
               {7, 1, 0});
  check_tensor(cat({make({1, 0}, {1, 2}, DType::b8), make({1}, {1, 1}, DType::b8)}, 1), {1, 3},
               DType::b8, {1, 0, 1});
  check_tensor(stack({make({1}, {1}, DType::i32), make({2.5}, {1}, DType::f64)}), {2, 1},
               DType::f64, {1, 2.5});
  // Many inputs (more than the tape's save bits) that all require grad.
  std::vector<Tensor> parts;
  for (int i = 0; i < 40; ++i) parts.push_back(full({2}, double(i), kF64).requires_grad_());
  Tensor joined = cat(parts);
  std::vector<double> w(80);
  for (int i = 0; i < 80; ++i) w[i] = i;
  joined.backward(make(w, {80}, DType::f64));
  check_tensor(parts[39].grad(), {2}, DType::f64, {78, 79});
  check_tensor(parts[0].grad(), {2}, DType::f64, {0, 1});
}

TEST_CASE("the composites' gradients are as accurate as the hand-written ones") {
  // Runs after the closed-form checks above (doctest runs a file's cases in order).
  MESSAGE("largest relative difference from a closed form: " << g_worst << " (" << g_worst_name
                                                             << ")");
  CHECK(g_worst <= 1e-13);
}

}  // namespace duet::test
