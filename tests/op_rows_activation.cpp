// Rows of the piecewise activations (core/ops/activations.cpp) as elementwise rows, and of glu,
// prelu, the normalizations rms_norm, group_norm, normalize and cosine_similarity
// (core/ops/norms.cpp), and the losses l1_loss, smooth_l1_loss, huber_loss, kl_div, mse_loss's
// reductions, binary_cross_entropy and binary_cross_entropy_with_logits' weights
// (core/ops/losses.cpp), with float64 references written from PyTorch's formulas.
#include <cmath>

#include "op_rows.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;
using R = ResultKind;
const std::vector<DType> kFloat = {DType::f32, DType::f64};

double elu_ref(double x, double alpha) { return x > 0 ? x : alpha * std::expm1(x); }
// clamp as PyTorch's: -0 at a bound of 0 stays -0.
double hardtanh_ref(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }
double softplus_ref(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

// ---- normalizations ----

// rms_norm over the trailing `norm` dims, with a weight of that shape where given.
OpRow rms_norm_row(Shape xs, Shape norm, bool weight, std::optional<double> eps) {
  std::vector<Shape> shapes = {xs};
  if (weight) shapes.push_back(norm);
  OpRow r{fmt::format("rms_norm {} over {}{}{}", xs.str(), norm.str(), weight ? ", weight" : "",
                      eps ? fmt::format(", eps {}", *eps) : ""),
          OpId::Rsqrt,
          true,
          shapes,
          [=](const Ins& in) { return rms_norm(in[0], norm, weight ? in[1] : Tensor(), eps); },
          [=](const Values& v) {
            // The default eps is the machine epsilon of the dtype: f64's here (the reference is
            // compared with the f64 run; f32's differs by far less than the f32 tolerance).
            const double e = eps ? *eps : 2.220446049250313e-16;
            const int64_t g = norm.numel(), groups = g ? xs.numel() / g : 0;
            std::vector<double> y(v[0].size());
            for (int64_t k = 0; k < groups; ++k) {
              double ms = 0;
              for (int64_t i = 0; i < g; ++i) ms += v[0][k * g + i] * v[0][k * g + i] / double(g);
              for (int64_t i = 0; i < g; ++i)
                y[k * g + i] = v[0][k * g + i] / std::sqrt(ms + e) * (weight ? v[1][i] : 1.0);
            }
            return y;
          },
          xs};
  r.tol32 = 1e-4;
  return r;
}

// group_norm of (N, C, ...) in `groups` groups, with weight and bias (C) where given.
OpRow group_norm_row(Shape xs, int64_t groups, bool affine) {
  std::vector<Shape> shapes = {xs};
  const int64_t c = xs[1];
  if (affine) shapes.insert(shapes.end(), {{c}, {c}});
  OpRow r{fmt::format("group_norm {} in {} groups{}", xs.str(), groups, affine ? ", affine" : ""),
          OpId::Rsqrt,
          true,
          shapes,
          [=](const Ins& in) {
            return group_norm(in[0], groups, affine ? in[1] : Tensor(), affine ? in[2] : Tensor());
          },
          [=](const Values& v) {
            const int64_t n = xs[0], rest = c ? xs.numel() / (n * c) : 0, cg = c / groups;
            const int64_t size = cg * rest;  // one group's elements, contiguous
            std::vector<double> y(v[0].size());
            for (int64_t b = 0; b < n * groups; ++b) {
              const double* x = v[0].data() + b * size;
              double mu = 0, var = 0;
              for (int64_t i = 0; i < size; ++i) mu += x[i] / double(size);
              for (int64_t i = 0; i < size; ++i) var += (x[i] - mu) * (x[i] - mu) / double(size);
              for (int64_t i = 0; i < size; ++i) {
                const int64_t ch = (b % groups) * cg + i / rest;
                double t = (x[i] - mu) / std::sqrt(var + 1e-5);
                if (affine) t = t * v[1][ch] + v[2][ch];
                y[b * size + i] = t;
              }
            }
            return y;
          },
          xs};
  r.tol32 = 1e-4;
  return r;
}

// The p-norms along `dim` of x (row-major xs), one per position of the other dims, as
// (outer, len, inner) walks them.
struct Along {
  int64_t outer = 1, len = 1, inner = 1;
  Along(const Shape& s, int64_t dim) {
    for (int64_t d = 0; d < int64_t(s.size()); ++d)
      (d < dim ? outer : d == dim ? len : inner) *= s[d];
  }
  size_t at(int64_t o, int64_t k, int64_t i) const { return size_t((o * len + k) * inner + i); }
};
double norm_ref(const std::vector<double>& x, const Along& a, int64_t o, int64_t i, double p) {
  double acc = 0;
  for (int64_t k = 0; k < a.len; ++k) {
    const double v = std::abs(x[a.at(o, k, i)]);
    acc = std::isinf(p) ? std::max(acc, v) : acc + std::pow(v, p);
  }
  return std::isinf(p) ? acc : std::pow(acc, 1 / p);
}

OpRow normalize_row(Shape xs, double p, int64_t d) {
  const int64_t dim = d < 0 ? d + int64_t(xs.size()) : d;
  OpRow r{fmt::format("normalize {} p {} dim {}", xs.str(), p, d),
          std::isinf(p) ? OpId::Max : OpId::Sum,
          true,
          {xs},
          [=](const Ins& in) { return normalize(in[0], p, d); },
          [=](const Values& v) {
            const Along a(xs, dim);
            std::vector<double> y(v[0].size());
            for (int64_t o = 0; o < a.outer; ++o)
              for (int64_t i = 0; i < a.inner; ++i) {
                const double nrm = std::max(norm_ref(v[0], a, o, i, p), 1e-12);
                for (int64_t k = 0; k < a.len; ++k) y[a.at(o, k, i)] = v[0][a.at(o, k, i)] / nrm;
              }
            return y;
          },
          xs};
  r.tol32 = 1e-4;
  return r;
}

// Inputs of one shape (broadcasting is checked by the layer tests).
OpRow cosine_row(Shape xs, int64_t dim) {
  Shape out;
  for (int64_t d = 0; d < int64_t(xs.size()); ++d)
    if (d != dim) out.push_back(xs[d]);
  OpRow r{fmt::format("cosine_similarity {} dim {}", xs.str(), dim),
          OpId::Sum,
          true,
          {xs, xs},
          [=](const Ins& in) { return cosine_similarity(in[0], in[1], dim); },
          [=](const Values& v) {
            const Along a(xs, dim);
            std::vector<double> y;
            for (int64_t o = 0; o < a.outer; ++o)
              for (int64_t i = 0; i < a.inner; ++i) {
                const double na = std::max(norm_ref(v[0], a, o, i, 2), 1e-8),
                             nb = std::max(norm_ref(v[1], a, o, i, 2), 1e-8);
                double dot = 0;
                for (int64_t k = 0; k < a.len; ++k)
                  dot += v[0][a.at(o, k, i)] * v[1][a.at(o, k, i)];
                y.push_back(dot / (na * nb));
              }
            return y;
          },
          out};
  r.tol32 = 1e-4;
  return r;
}

// ---- losses ----

enum class Loss { L1, SmoothL1, Huber, Kl, KlLogTarget, Mse };

// The loss of one element, PyTorch's formula; `param` is smooth_l1's beta or huber's delta.
double loss_ref(Loss k, double x, double t, double param) {
  const double d = std::abs(x - t);
  switch (k) {
    case Loss::L1:
      return d;
    case Loss::SmoothL1:
      return param == 0 ? d : d < param ? 0.5 * d * d / param : d - 0.5 * param;
    case Loss::Huber:
      return d <= param ? 0.5 * d * d : param * (d - 0.5 * param);
    case Loss::Kl:
      return (t == 0 ? 0 : t * std::log(t)) - t * x;
    case Loss::KlLogTarget:
      return std::exp(t) * (t - x);
    case Loss::Mse:
      return d * d;
  }
  return 0;
}

OpRow loss_row(Loss k, Shape s, std::string reduction, double param = 1) {
  static const char* names[] = {"l1_loss", "smooth_l1_loss", "huber_loss",
                                "kl_div",  "kl_div",         "mse_loss"};
  OpRow r{fmt::format("{} {} {}{}{}", names[int(k)], s.str(), reduction,
                      k == Loss::SmoothL1 || k == Loss::Huber ? fmt::format(" {}", param) : "",
                      k == Loss::KlLogTarget ? " log_target" : ""),
          reduction == "none" ? OpId::Sub : OpId::Sum,
          true,
          {s, s},
          [=](const Ins& in) {
            switch (k) {
              case Loss::L1:
                return l1_loss(in[0], in[1], reduction);
              case Loss::SmoothL1:
                return smooth_l1_loss(in[0], in[1], reduction, param);
              case Loss::Huber:
                return huber_loss(in[0], in[1], reduction, param);
              case Loss::Kl:
                return kl_div(in[0], in[1], reduction);
              case Loss::KlLogTarget:
                return kl_div(in[0], in[1], reduction, true);
              case Loss::Mse:
                break;
            }
            return mse_loss(in[0], in[1], reduction);
          },
          [=](const Values& v) {
            std::vector<double> each;
            double total = 0;
            for (size_t i = 0; i < v[0].size(); ++i) {
              each.push_back(loss_ref(k, v[0][i], v[1][i], param));
              total += each.back();
            }
            if (reduction == "none") return each;
            if (reduction == "sum") return std::vector<double>{total};
            const double n =
                reduction == "batchmean" && s.size() > 0 ? double(s[0]) : double(v[0].size());
            return std::vector<double>{total / n};
          },
          reduction == "none" ? s : Shape{}};
  // kl_div's targets are probabilities (positive: log reads them); a log-target any value.
  if (k == Loss::Kl) r.domains = {Domain{-3, 3}, Domain{0.05, 1}};
  return r;
}

// Each element's loss, reduced: "none" keeps them, "sum" adds them, "mean" averages.
std::vector<double> reduce_ref(const std::vector<double>& each, const std::string& reduction) {
  if (reduction == "none") return each;
  double total = 0;
  for (double l : each) total += l;
  return {reduction == "sum" ? total : total / double(each.size())};
}

// binary_cross_entropy (logits false: of probabilities, each log clamped at -100) or
// binary_cross_entropy_with_logits, over s with, where asked, a weight and a positive examples'
// weight along the last dim (PyTorch's formulas).
OpRow bce_row(bool logits, Shape s, std::string reduction, bool weight, bool pos_weight = false) {
  std::vector<Shape> shapes = {s, s};
  const Shape last{s.size() ? s[s.size() - 1] : 1};
  if (weight) shapes.push_back(last);
  if (pos_weight) shapes.push_back(last);
  OpRow r{
      fmt::format("{} {} {}{}{}",
                  logits ? "binary_cross_entropy_with_logits" : "binary_cross_entropy", s.str(),
                  reduction, weight ? " weight" : "", pos_weight ? " pos_weight" : ""),
      reduction == "none" ? OpId::Neg : OpId::Sum,
      true,
      shapes,
      [=](const Ins& in) {
        const Tensor w = weight ? in[2] : Tensor();
        if (!logits) return binary_cross_entropy(in[0], in[1], w, reduction);
        return binary_cross_entropy_with_logits(in[0], in[1], reduction, w,
                                                pos_weight ? in[weight ? 3 : 2] : Tensor());
      },
      [=](const Values& v) {
        auto log_sigmoid = [](double x) {
          return x > 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
        };
        std::vector<double> each;
        const size_t n = static_cast<size_t>(last[0]);
        for (size_t i = 0; i < v[0].size(); ++i) {
          const double x = v[0][i], t = v[1][i];
          const double w = weight ? v[2][i % n] : 1.0;
          double l;
          if (logits) {
            const double p = pos_weight ? v[weight ? 3 : 2][i % n] : 1.0;
            l = -(p * t * log_sigmoid(x) + (1 - t) * log_sigmoid(-x));
          } else {
            l = -(t * std::max(std::log(x), -100.0) + (1 - t) * std::max(std::log(1 - x), -100.0));
          }
          each.push_back(l * w);
        }
        return reduce_ref(each, reduction);
      },
      reduction == "none" ? s : Shape{}};
  // Probabilities inside (0, 1) (the logs' clamps are checked apart), targets in [0, 1],
  // positive weights.
  r.domains = {logits ? Domain{-4, 4} : Domain{0.05, 0.95}, Domain{0, 1}, Domain{0.1, 2}};
  return r;
}

// The losses with a +-1 target (fixed: a random one would not be +-1), of inputs over s:
// margin_ranking_loss (two inputs), hinge_embedding_loss and soft_margin_loss (one), with
// PyTorch's formulas.
enum class Margin { Ranking, Hinge, Soft };
OpRow margin_row(Margin k, Shape s, std::vector<double> y, std::string reduction, double m) {
  static const char* names[] = {"margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss"};
  std::vector<Shape> shapes = {s};
  if (k == Margin::Ranking) shapes.push_back(s);
  return {fmt::format("{} {} {} margin {}", names[int(k)], s.str(), reduction, m),
          k == Margin::Hinge    ? OpId::Where
          : reduction == "none" ? OpId::Neg
                                : OpId::Sum,
          true,
          shapes,
          [=](const Ins& in) {
            const Tensor t = make(y, s, in[0].dtype());
            if (k == Margin::Ranking) return margin_ranking_loss(in[0], in[1], t, m, reduction);
            if (k == Margin::Hinge) return hinge_embedding_loss(in[0], t, m, reduction);
            return soft_margin_loss(in[0], t, reduction);
          },
          [=](const Values& v) {
            std::vector<double> each;
            for (size_t i = 0; i < v[0].size(); ++i) {
              const double x = v[0][i], t = y[i];
              double l;
              if (k == Margin::Ranking)
                l = std::max(0.0, -t * (x - v[1][i]) + m);
              else if (k == Margin::Hinge)
                l = t == 1 ? x : std::max(0.0, m - x);
              else
                l = std::log1p(std::exp(-t * x));
              each.push_back(l);
            }
            return reduce_ref(each, reduction);
          },
          reduction == "none" ? s : Shape{}};
}

// ||a - b + eps||_p over the last dim of each row.
std::vector<double> ref_distances(const std::vector<double>& a, const std::vector<double>& b,
                                  int64_t d, double p, double eps) {
  std::vector<double> out;
  for (size_t r = 0; r * d < a.size(); ++r) {
    double acc = 0;
    for (int64_t j = 0; j < d; ++j) acc += std::pow(std::abs(a[r * d + j] - b[r * d + j] + eps), p);
    out.push_back(std::pow(acc, 1 / p));
  }
  return out;
}

OpRow triplet_row(Shape s, double margin, double p, bool swap, std::string reduction) {
  const int64_t d = s[s.size() - 1];
  return {fmt::format("triplet_margin_loss {} margin {} p {}{} {}", s.str(), margin, p,
                      swap ? " swap" : "", reduction),
          OpId::Sum,
          true,
          {s, s, s},
          [=](const Ins& in) {
            return triplet_margin_loss(in[0], in[1], in[2], margin, p, 1e-6, swap, reduction);
          },
          [=](const Values& v) {
            const auto ap = ref_distances(v[0], v[1], d, p, 1e-6);
            const auto an = ref_distances(v[0], v[2], d, p, 1e-6);
            const auto pn = ref_distances(v[1], v[2], d, p, 1e-6);
            std::vector<double> each;
            for (size_t i = 0; i < ap.size(); ++i) {
              const double n = swap ? std::min(an[i], pn[i]) : an[i];
              each.push_back(std::max(ap[i] - n + margin, 0.0));
            }
            return reduce_ref(each, reduction);
          },
          reduction == "none" && s.size() > 1 ? Shape{s[0]} : Shape{}};
}

// cosine_embedding_loss of rows (n, d) with targets y (n).
OpRow cosine_embedding_row(int64_t n, int64_t d, std::vector<double> y, double margin,
                           std::string reduction) {
  return {fmt::format("cosine_embedding_loss ({}, {}) margin {} {}", n, d, margin, reduction),
          OpId::Sum,
          true,
          {{n, d}, {n, d}},
          [=](const Ins& in) {
            return cosine_embedding_loss(in[0], in[1], make(y, {n}, in[0].dtype()), margin,
                                         reduction);
          },
          [=](const Values& v) {
            std::vector<double> each;
            for (int64_t r = 0; r < n; ++r) {
              double dot = 0, m1 = 1e-12, m2 = 1e-12;
              for (int64_t j = 0; j < d; ++j) {
                const double a = v[0][r * d + j], b = v[1][r * d + j];
                dot += a * b, m1 += a * a, m2 += b * b;
              }
              const double cos = dot / std::sqrt(m1 * m2);
              each.push_back(y[r] == 1 ? 1 - cos : std::max(0.0, cos - margin));
            }
            return reduce_ref(each, reduction);
          },
          reduction == "none" ? Shape{n} : Shape{}};
}

// poisson_nll_loss (target a count: a fixed input of non-negative values) and
// gaussian_nll_loss (var a third, positive input of the input's shape or one per row).
OpRow poisson_row(Shape s, bool log_input, bool full, std::string reduction) {
  std::vector<double> y;
  for (int64_t i = 0; i < s.numel(); ++i) y.push_back(double(i % 4));  // 0, 1, 2, 3 ...
  return {fmt::format("poisson_nll_loss {}{}{} {}", s.str(), log_input ? " log_input" : "",
                      full ? " full" : "", reduction),
          OpId::Mul,
          true,
          {s},
          [=](const Ins& in) {
            return poisson_nll_loss(in[0], make(y, s, in[0].dtype()), log_input, full, 1e-8,
                                    reduction);
          },
          [=](const Values& v) {
            std::vector<double> each;
            for (size_t i = 0; i < v[0].size(); ++i) {
              const double x = v[0][i], t = y[i];
              double l = log_input ? std::exp(x) - t * x : x - t * std::log(x + 1e-8);
              if (full && t > 1) l += t * std::log(t) - t + 0.5 * std::log(2 * M_PI * t);
              each.push_back(l);
            }
            return reduce_ref(each, reduction);
          },
          reduction == "none" ? s : Shape{},
          {DType::f32, DType::f64},
          {log_input ? Domain{-2, 2} : Domain{0.2, 3}}};
}

OpRow gaussian_row(Shape s, bool per_row, bool full, std::string reduction) {
  Shape vs = s;
  if (per_row) vs[vs.size() - 1] = 1;
  const int64_t d = s[s.size() - 1];
  return {
      fmt::format("gaussian_nll_loss {} var {}{} {}", s.str(), vs.str(), full ? " full" : "",
                  reduction),
      OpId::Log,
      true,
      {s, s, vs},
      [=](const Ins& in) { return gaussian_nll_loss(in[0], in[1], in[2], full, 1e-6, reduction); },
      [=](const Values& v) {
        std::vector<double> each;
        for (size_t i = 0; i < v[0].size(); ++i) {
          const double var = std::max(v[2][per_row ? i / size_t(d) : i], 1e-6);
          const double e = v[0][i] - v[1][i];
          double l = 0.5 * (std::log(var) + e * e / var);
          if (full) l += 0.5 * std::log(2 * M_PI);
          each.push_back(l);
        }
        return reduce_ref(each, reduction);
      },
      reduction == "none" ? s : Shape{},
      {DType::f32, DType::f64},
      {Domain{}, Domain{}, Domain{0.2, 2}}};
}

OpRow pairwise_row(Shape s, double p, bool keepdim) {
  const int64_t d = s[s.size() - 1];
  Shape out;
  for (int64_t i = 0; i + 1 < s.size(); ++i) out.push_back(s[i]);
  if (keepdim) out.push_back(1);
  return {fmt::format("pairwise_distance {} p {}{}", s.str(), p, keepdim ? " keepdim" : ""),
          OpId::Sum,
          true,
          {s, s},
          [=](const Ins& in) { return pairwise_distance(in[0], in[1], p, 1e-6, keepdim); },
          [=](const Values& v) { return ref_distances(v[0], v[1], d, p, 1e-6); },
          out};
}

}  // namespace

std::vector<ElementwiseRow> activation_rows() {
  return {
      {"leaky_relu",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return leaky_relu(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] > 0 ? x[0] : 0.01 * x[0]; },
       {Domain{-4, 4}},
       kFloat,
       R::Same},
      {"leaky_relu, slope 0.2",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return leaky_relu(in[0], 0.2); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] > 0 ? x[0] : 0.2 * x[0]; },
       {Domain{-4, 4}},
       kFloat,
       R::Same},
      {"elu",
       OpId::Expm1,
       true,
       1,
       [](const Ins& in) { return elu(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return elu_ref(x[0], 1); },
       {Domain{-5, 90}},
       kFloat,
       R::Same},
      {"elu, alpha 0.5",
       OpId::Expm1,
       true,
       1,
       [](const Ins& in) { return elu(in[0], 0.5); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return elu_ref(x[0], 0.5); },
       {Domain{-5, 5}},
       kFloat,
       R::Same},
      {"selu",
       OpId::Expm1,
       true,
       1,
       [](const Ins& in) { return selu(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) {
         return 1.0507009873554804934193349852946 *
                elu_ref(x[0], 1.6732632423543772848170429916717);
       },
       {Domain{-5, 5}},
       kFloat,
       R::Same},
      {"celu, alpha 2",
       OpId::Expm1,
       true,
       1,
       [](const Ins& in) { return celu(in[0], 2); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] > 0 ? x[0] : 2 * std::expm1(x[0] / 2); },
       {Domain{-5, 5}},
       kFloat,
       R::Same},
      {"hardtanh",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return hardtanh(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return hardtanh_ref(x[0], -1, 1); },
       {Domain{-3, 3}},
       kFloat,
       R::Same},
      {"hardtanh, -0.5 to 2",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return hardtanh(in[0], -0.5, 2); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return hardtanh_ref(x[0], -0.5, 2); },
       {Domain{-3, 3}},
       kFloat,
       R::Same},
      {"relu6",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return relu6(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return hardtanh_ref(x[0], 0, 6); },
       {Domain{-3, 9}},
       kFloat,
       R::Same},
      {"hardsigmoid",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return hardsigmoid(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return hardtanh_ref(x[0] + 3, 0, 6) / 6; },
       {Domain{-5, 5}},
       kFloat,
       R::Same},
      {"hardswish",
       OpId::Where,
       true,
       1,
       [](const Ins& in) { return hardswish(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] * hardtanh_ref(x[0] + 3, 0, 6) / 6; },
       {Domain{-5, 5}},
       kFloat,
       R::Same},
      {"mish",
       OpId::Tanh,
       true,
       1,
       [](const Ins& in) { return mish(in[0]); },
       nullptr,
       nullptr,
       nullptr,
       [](const double* x) { return x[0] * std::tanh(softplus_ref(x[0])); },
       {Domain{-8, 8}},
       kFloat,
       R::Same},
  };
}

// multilabel_soft_margin_loss over s ((N, C) or (C)) with, where asked, a class weight.
OpRow multilabel_soft_row(Shape s, bool weight, std::string reduction) {
  const int64_t c = s[s.size() - 1];
  std::vector<Shape> shapes = {s, s};
  if (weight) shapes.push_back({c});
  OpRow r{fmt::format("multilabel_soft_margin_loss {} {}{}", s.str(), reduction,
                      weight ? " weight" : ""),
          OpId::Neg,
          true,
          shapes,
          [=](const Ins& in) {
            return multilabel_soft_margin_loss(in[0], in[1], weight ? in[2] : Tensor(), reduction);
          },
          [=](const Values& v) {
            auto log_sigmoid = [](double x) {
              return x > 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
            };
            std::vector<double> each;
            for (size_t i = 0; i < v[0].size(); i += size_t(c)) {
              double l = 0;
              for (size_t j = 0; j < size_t(c); ++j) {
                const double x = v[0][i + j], t = v[1][i + j];
                l += -(t * log_sigmoid(x) + (1 - t) * log_sigmoid(-x)) * (weight ? v[2][j] : 1.0);
              }
              each.push_back(l / double(c));
            }
            return reduce_ref(each, reduction);
          },
          reduction != "none" ? Shape{}
          : s.size() == 2     ? Shape{s[0]}
                              : Shape{}};
  r.domains = {Domain{-3, 3}, Domain{0, 1}, Domain{0.2, 2}};
  return r;
}

// multi_margin_loss of scores (n, c) (n 0: one sample (c)) with targets y, p, margin and, where
// asked, a class weight (PyTorch's formula).
OpRow multi_margin_row(int64_t n, int64_t c, std::vector<int64_t> y, int64_t p, double margin,
                       bool weight, std::string reduction) {
  const Shape s = n ? Shape{n, c} : Shape{c};
  std::vector<Shape> shapes = {s};
  if (weight) shapes.push_back({c});
  return {fmt::format("multi_margin_loss {} p {} margin {} {}{}", s.str(), p, margin, reduction,
                      weight ? " weight" : ""),
          OpId::Gather,
          true,
          shapes,
          [=](const Ins& in) {
            std::vector<double> yd(y.begin(), y.end());
            const Tensor t = make(yd, n ? Shape{n} : Shape{}, DType::i64);
            return multi_margin_loss(in[0], t, p, margin, weight ? in[1] : Tensor(), reduction);
          },
          [=](const Values& v) {
            std::vector<double> each;
            for (size_t k = 0; k < y.size(); ++k) {
              const double* x = v[0].data() + k * size_t(c);
              const auto t = size_t(y[k]);
              double l = 0;
              for (size_t i = 0; i < size_t(c); ++i) {
                if (i == t) continue;
                const double h = std::max(0.0, margin - x[t] + x[i]);
                l += (p == 2 ? h * h : h) * (weight ? v[1][t] : 1.0);
              }
              each.push_back(l / double(c));
            }
            return reduce_ref(each, reduction);
          },
          reduction == "none" && n ? Shape{n} : Shape{}};
}

// multilabel_margin_loss of scores (n, c) (n 0: one sample (c)) with target rows t.
OpRow multilabel_margin_row(int64_t n, int64_t c, std::vector<int64_t> t, std::string reduction) {
  const Shape s = n ? Shape{n, c} : Shape{c};
  return {fmt::format("multilabel_margin_loss {} {}", s.str(), reduction),
          OpId::Gather,
          true,
          {s},
          [=](const Ins& in) {
            std::vector<double> td(t.begin(), t.end());
            return multilabel_margin_loss(in[0], make(td, s, DType::i64), reduction);
          },
          [=](const Values& v) {
            std::vector<double> each;
            for (size_t k = 0; k * size_t(c) < t.size(); ++k) {
              const double* x = v[0].data() + k * size_t(c);
              const int64_t* row = t.data() + k * size_t(c);
              std::vector<char> is_target(size_t(c), 0);
              size_t m = 0;
              while (m < size_t(c) && row[m] >= 0) is_target[size_t(row[m++])] = 1;
              double l = 0;
              for (size_t j = 0; j < m; ++j)
                for (size_t i = 0; i < size_t(c); ++i)
                  if (!is_target[i]) l += std::max(0.0, 1 - (x[row[j]] - x[i]));
              each.push_back(l / double(c));
            }
            return reduce_ref(each, reduction);
          },
          reduction == "none" && n ? Shape{n} : Shape{}};
}

std::vector<OpRow> norm_loss_rows() {
  std::vector<OpRow> r = {
      rms_norm_row({3, 4}, {4}, true, 1e-6),
      rms_norm_row({2, 3, 2}, {3, 2}, false, std::nullopt),
      rms_norm_row({0, 4}, {4}, true, 1e-5),
      group_norm_row({2, 4, 3}, 2, true),
      group_norm_row({1, 6, 2, 2}, 3, false),
      group_norm_row({3, 2}, 1, true),
      normalize_row({3, 4}, 2, 1),
      normalize_row({2, 3, 2}, 1, 0),
      normalize_row({4, 3}, 3, -1),
      normalize_row({2, 5}, INFINITY, 1),
      cosine_row({3, 4}, 1),
      cosine_row({2, 3, 2}, 0),
      loss_row(Loss::L1, {3, 4}, "mean"),
      loss_row(Loss::L1, {2, 3}, "none"),
      loss_row(Loss::SmoothL1, {3, 4}, "mean"),
      loss_row(Loss::SmoothL1, {3, 4}, "sum", 0.5),
      loss_row(Loss::SmoothL1, {5}, "none", 0),
      loss_row(Loss::Huber, {3, 4}, "mean"),
      loss_row(Loss::Huber, {2, 3}, "none", 0.3),
      loss_row(Loss::Kl, {3, 4}, "batchmean"),
      loss_row(Loss::Kl, {2, 3}, "mean"),
      loss_row(Loss::Kl, {2, 3}, "none"),
      loss_row(Loss::KlLogTarget, {3, 4}, "sum"),
      loss_row(Loss::Mse, {3, 4}, "sum"),
      loss_row(Loss::Mse, {2, 3}, "none"),
      bce_row(false, {3, 4}, "mean", false),
      bce_row(false, {2, 3}, "none", true),
      bce_row(false, {5}, "sum", true),
      bce_row(true, {3, 4}, "mean", false),
      bce_row(true, {2, 3}, "none", true, true),
      bce_row(true, {3, 2}, "sum", false, true),
      margin_row(Margin::Ranking, {2, 3}, {1, -1, 1, -1, -1, 1}, "mean", 0.3),
      margin_row(Margin::Ranking, {4}, {1, 1, -1, -1}, "none", 0),
      margin_row(Margin::Hinge, {2, 3}, {1, -1, -1, 1, -1, 1}, "sum", 1),
      margin_row(Margin::Hinge, {4}, {-1, -1, 1, -1}, "none", 0.5),
      margin_row(Margin::Soft, {2, 3}, {1, -1, 1, 1, -1, -1}, "mean", 0),
      triplet_row({3, 4}, 1, 2, false, "mean"),
      triplet_row({2, 3}, 0.5, 1, true, "none"),
      triplet_row({4}, 1, 3, false, "sum"),
      cosine_embedding_row(3, 4, {1, -1, -1}, 0.2, "mean"),
      cosine_embedding_row(2, 3, {-1, 1}, -0.5, "none"),
      poisson_row({3, 4}, true, false, "mean"),
      poisson_row({2, 3}, false, true, "none"),
      poisson_row({5}, true, true, "sum"),
      gaussian_row({3, 4}, false, false, "mean"),
      gaussian_row({2, 3}, true, true, "none"),
      pairwise_row({3, 4}, 2, false),
      pairwise_row({2, 3}, 1, true),
      pairwise_row({4}, 3, false),
      multilabel_soft_row({3, 4}, false, "mean"),
      multilabel_soft_row({2, 5}, true, "none"),
      multilabel_soft_row({4}, true, "sum"),
      multi_margin_row(4, 5, {0, 3, 4, 3}, 1, 1, false, "mean"),
      multi_margin_row(3, 4, {2, 0, 1}, 2, 0.5, true, "none"),
      multi_margin_row(0, 6, {5}, 1, 2, true, "sum"),
      multilabel_margin_row(3, 5, {3, 0, -1, 1, 2, 1, 2, 4, 0, 3, -1, 2, 2, 2, 2}, "none"),
      multilabel_margin_row(2, 4, {1, -1, 0, 0, 2, 3, 0, -1}, "mean"),
      multilabel_margin_row(0, 6, {4, 1, 5, -1, 0, 0}, "sum"),
  };
  // glu along a dim of even size, and prelu with one slope and with one per channel.
  r.push_back({"glu (3, 4) dim -1",
               OpId::Sigmoid,
               true,
               {{3, 4}},
               [](const Ins& in) { return glu(in[0]); },
               [](const Values& v) {
                 std::vector<double> y;
                 for (int64_t i = 0; i < 3; ++i)
                   for (int64_t j = 0; j < 2; ++j)
                     y.push_back(v[0][size_t(i * 4 + j)] /
                                 (1 + std::exp(-v[0][size_t(i * 4 + j + 2)])));
                 return y;
               },
               {3, 2}});
  for (const Shape& ws : {Shape{1}, Shape{3}}) {
    r.push_back({fmt::format("prelu (2, 3, 2) weight {}", ws.str()),
                 OpId::Where,
                 true,
                 {{2, 3, 2}, ws},
                 [](const Ins& in) { return prelu(in[0], in[1]); },
                 [ws](const Values& v) {
                   std::vector<double> y;
                   for (size_t i = 0; i < v[0].size(); ++i) {
                     const double w = v[1][ws[0] == 1 ? 0 : (i / 2) % 3];
                     y.push_back(v[0][i] > 0 ? v[0][i] : w * v[0][i]);
                   }
                   return y;
                 },
                 {2, 3, 2}});
  }
  return r;
}

}  // namespace duet::test
