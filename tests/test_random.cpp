// Randomness: the Philox reference against Random123's known answers, seeds and streams, the
// statistics of rand, randn and randint, and dropout. The draws themselves are checked value by
// value against the reference by the random rows of the op sweep (op_rows_nn.cpp).
#include <cmath>
#include <functional>

#include "op_rows.h"

namespace duet::test {
namespace {

struct Stats {
  double mean = 0, std = 0, lo = INFINITY, hi = -INFINITY;
};
Stats stats(const std::vector<double>& v) {
  Stats s;
  for (double x : v)
    s.mean += x / double(v.size()), s.lo = std::min(s.lo, x), s.hi = std::max(s.hi, x);
  for (double x : v) s.std += (x - s.mean) * (x - s.mean) / double(v.size() - 1);
  s.std = std::sqrt(s.std);
  return s;
}

const int64_t kN = 100000;

}  // namespace

TEST_CASE("the Philox reference gives Random123's known answers (kat_vectors)") {
  using W = std::vector<uint32_t>;
  CHECK(ref_philox({0, 0, 0, 0}, {0, 0}) == W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  const uint32_t f = 0xffffffffu;
  CHECK(ref_philox({f, f, f, f}, {f, f}) == W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(ref_philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("manual_seed: the same seed gives the same numbers; seeds and successive draws differ") {
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    const Options o = Options().dtype(dt);
    const std::vector<std::function<Tensor()>> draws = {[&] {
                                                          return rand({4, 5}, o);
                                                        },
                                                        [&] {
                                                          return randn({4, 5}, o);
                                                        },
                                                        [&] {
                                                          return randint(1000, {4, 5}, o);
                                                        }};
    for (size_t k = 0; k < draws.size(); ++k) {
      INFO("draw " << k);
      manual_seed(123);
      const std::vector<double> a1 = values(draws[k]()), a2 = values(draws[k]());
      manual_seed(123);
      const std::vector<double> b1 = values(draws[k]()), b2 = values(draws[k]());
      manual_seed(124);
      const std::vector<double> c1 = values(draws[k]());
      CHECK(a1 == b1);
      CHECK(a2 == b2);
      CHECK(a1 != a2);  // successive draws continue the stream
      CHECK(a1 != c1);
      int same = 0;
      for (size_t i = 0; i < a1.size(); ++i) same += a1[i] == a2[i] || a1[i] == c1[i];
      CHECK(same <= (k == 2 ? 2 : 0));  // randint(1000) may repeat a value by chance
    }
  }
  // A draw of an even count advances by whole blocks: two draws read on where one would.
  manual_seed(7);
  const std::vector<double> one = values(rand({10}));
  manual_seed(7);
  std::vector<double> two = values(rand({4}));
  for (double v : values(rand({6}))) two.push_back(v);
  CHECK(one == two);
  // An odd count rounds up to whole blocks: the next draw starts at block ceil(n / 2).
  manual_seed(7);
  randn({3}, Options().dtype(DType::f64));
  CHECK(randn({1}, Options().dtype(DType::f64)).item<double>() ==
        ref_draw(1, DType::f64, 0, 7, 2, 0));
  // Options that ask for gradients make a leaf that requires them.
  Tensor r = rand({2}, Options().requires_grad());
  CHECK(r.requires_grad());
  CHECK(r.is_leaf());
}

TEST_CASE("statistics: 1e5 normals, uniforms and integers; draws do not depend on threads") {
  manual_seed(2024);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    const Options o = Options().dtype(dt);
    // Standard error of the mean: 1 / sqrt(1e5) = 0.0032; of the std: 0.0022.
    const std::vector<double> n = values(randn({kN}, o));
    const Stats sn = stats(n);
    CHECK(std::fabs(sn.mean) < 0.015);
    CHECK(std::fabs(sn.std - 1) < 0.01);
    int64_t within = 0;
    for (double v : n) within += std::fabs(v) < 1;
    CHECK(std::fabs(double(within) / kN - 0.682689) < 0.008);
    CHECK(sn.hi > 3.5);
    CHECK(sn.lo < -3.5);
    // Uniform on [0, 1): mean 1/2, std 1/sqrt(12); each tenth holds a tenth of the draws.
    const std::vector<double> u = values(rand({kN}, o));
    const Stats su = stats(u);
    CHECK(su.lo >= 0);
    CHECK(su.hi < 1);
    CHECK(std::fabs(su.mean - 0.5) < 0.005);
    CHECK(std::fabs(su.std - 1 / std::sqrt(12.0)) < 0.003);
    std::vector<int64_t> tenths(10, 0);
    for (double v : u) ++tenths[static_cast<size_t>(v * 10)];
    for (int64_t c : tenths) CHECK(std::fabs(double(c) / kN - 0.1) < 0.006);
  }
  for (DType dt : {DType::i64, DType::i32, DType::f32}) {
    INFO("randint " << dtype_name(dt));
    const std::vector<double> r = values(randint(7, {kN}, Options().dtype(dt)));
    std::vector<int64_t> count(7, 0);
    int64_t bad = 0;
    for (double v : r) {
      if (v >= 0 && v < 7 && v == std::floor(v))
        ++count[static_cast<size_t>(v)];
      else
        ++bad;
    }
    CHECK(bad == 0);
    for (int64_t c : count) CHECK(std::fabs(double(c) / kN - 1.0 / 7) < 0.006);
  }
  CHECK(dtype_name(randint(3, {2}).dtype()) == "i64");
  CHECK(dtype_name(rand({2}).dtype()) == "f32");
  // The kernels split a large draw across threads; every element is computed alone.
  std::vector<double> one, two;
  with_threads(1, [&] {
    manual_seed(5);
    one = values(randn({kN}));
  });
  with_threads(2, [&] {
    manual_seed(5);
    two = values(randn({kN}));
  });
  CHECK(one == two);
}

TEST_CASE("dropout: keeps 1 - p of the elements, scaled by 1 / (1 - p); edge cases") {
  const Tensor x = ones({kN});
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    INFO("p " << p);
    manual_seed(99);
    const std::vector<double> y = values(dropout(x, p, true));
    const double scale = static_cast<float>(1 / (1 - p));
    int64_t kept = 0, bad = 0;
    for (double v : y) {
      kept += v != 0;
      bad += v != 0 && std::fabs(v - scale) > 1e-6 * scale;
    }
    CHECK(bad == 0);
    // Binomial: the standard deviation of the kept fraction is sqrt(p (1 - p) / n) <= 0.0016.
    CHECK(std::fabs(double(kept) / kN - (1 - p)) < 0.008);
    manual_seed(99);
    CHECK(values(dropout(x, p, true)) == y);  // the same seed, the same mask
    CHECK(values(dropout(x, p, true)) != y);  // the next mask differs
  }
  // The gradient is the mask scaled: y / x where x is nonzero.
  Rng rng(3);
  Tensor a = make(random_values(24, Domain{0.5, 2}, DType::f64, rng), {4, 6}, DType::f64);
  a.requires_grad_();
  manual_seed(17);
  Tensor y = dropout(a, 0.25, true);
  std::vector<double> want, ya = values(y), xa = values(a);
  for (size_t i = 0; i < ya.size(); ++i) want.push_back(ya[i] / xa[i]);
  check_tensor(grad({y}, {a}, {ones({4, 6}, Options().dtype(DType::f64))})[0], {4, 6}, DType::f64,
               want, 1e-15, 0);
  // Evaluation mode and p = 0 are the identity; p = 1 zeroes everything, gradient included.
  CHECK(dropout(a, 0.5, false).is_same(a));
  CHECK(dropout(a, 0.0, true).is_same(a));
  Tensor z = dropout(a, 1.0, true);
  check_tensor(z, {4, 6}, DType::f64, std::vector<double>(24, 0));
  check_tensor(grad({z}, {a}, {ones({4, 6}, Options().dtype(DType::f64))})[0], {4, 6}, DType::f64,
               std::vector<double>(24, 0));
  // Evaluation mode draws nothing: the stream is where it was.
  manual_seed(3);
  dropout(x, 0.5, false);
  const double first = rand({1}).item<float>();
  CHECK(first == ref_draw(0, DType::f32, 0, 3, 0, 0));
}

}  // namespace duet::test
