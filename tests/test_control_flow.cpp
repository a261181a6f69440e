// Structured control flow (trace/control_flow.h): cond, scan and while_loop, eagerly. (The
// compiled face is issue 7's work in progress.)
#include "trace/control_flow.h"
#include "util.h"

namespace duet::test {
namespace {

Tensor f64(std::vector<double> v, Shape s) { return make(v, s, DType::f64); }

// The seeds' branch: if (X > 2) return X * X3; else return X4 - X.
std::vector<Tensor> seed_branch(const Tensor& x, const Tensor& x3, const Tensor& x4) {
  return cond(
      x > 2, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * in[1]}; },
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[2] - in[0]}; },
      {x, x3, x4});
}

}  // namespace

TEST_CASE("cond: runs the branch the predicate picks, with gradients through it") {
  Tensor x3 = f64({1.5}, {}), x4 = f64({10}, {});
  for (double v : {1.0, 3.0}) {
    Tensor x = f64({v}, {});
    std::vector<Tensor> y = seed_branch(x, x3, x4);
    REQUIRE(y.size() == 1);
    CHECK(y[0].item<double>() == (v > 2 ? v * 1.5 : 10 - v));
  }
  for (double v : {1.0, 3.0}) {
    Tensor x = f64({v}, {}).requires_grad_();
    Tensor a = f64({1.5}, {}).requires_grad_(), b = f64({10}, {}).requires_grad_();
    CHECK(
        gradcheck([](const std::vector<Tensor>& in) { return seed_branch(in[0], in[1], in[2])[0]; },
                  {x, a, b}));
  }
}

TEST_CASE("cond: a predicate that is not one b8 element is an error naming it") {
  Tensor x = f64({1, 2}, {2});
  auto id = [](const std::vector<Tensor>& in) { return in; };
  CHECK_THROWS_WITH_AS(cond(x, id, id, {x}),
                       "[cond] the predicate must be a one-element b8 tensor, got f64 (2)",
                       ValueError);
  CHECK_THROWS_AS(cond(x > 0, id, id, {x}), ValueError);  // two elements
}

TEST_CASE("scan: carries and stacked per-step results, with gradients through every step") {
  // A running sum and the running values: carry c, ys c + x_t.
  Tensor xs = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  auto body = [](const std::vector<Tensor>& in) {
    Tensor c = in[0] + in[1];
    return std::vector<Tensor>{c, c * 2};
  };
  std::vector<Tensor> r = scan(body, {f64({0, 0}, {2})}, {xs});
  REQUIRE(r.size() == 2);
  CHECK(values(r[0]) == std::vector<double>{9, 12});
  CHECK(r[1].sizes() == Shape{3, 2});
  CHECK(values(r[1]) == std::vector<double>{2, 4, 8, 12, 18, 24});
  // An Elman RNN: h_t = tanh(x_t W + h_{t-1} U), the outputs stacked; gradcheck over all of it.
  manual_seed(1);
  Tensor w = (randn({3, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor u = (randn({4, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor seq = randn({5, 2, 3}, Options().dtype(DType::f64)).requires_grad_();
  Tensor h0 = zeros({2, 4}, Options().dtype(DType::f64));
  auto rnn = [&](const std::vector<Tensor>& in) {
    Tensor W = in[0], U = in[1];
    auto cell = [W, U](const std::vector<Tensor>& s) {
      Tensor h = tanh(matmul(s[1], W) + matmul(s[0], U));
      return std::vector<Tensor>{h, h};
    };
    std::vector<Tensor> o = scan(cell, {h0}, {in[2]});
    return sum(o[1] * o[1]) + sum(o[0]);
  };
  CHECK(gradcheck(rnn, {w, u, seq}));
}

TEST_CASE("scan: length 0 returns the initial carry and empty stacked results") {
  Tensor xs = zeros({0, 3}, Options().dtype(DType::f64));
  auto body = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] + sum(in[1]), stack({in[1], in[1]}, 0)};
  };
  std::vector<Tensor> r = scan(body, {f64({7}, {})}, {xs});
  REQUIRE(r.size() == 2);
  CHECK(r[0].item<double>() == 7);
  CHECK(r[1].sizes() == Shape{0, 2, 3});
  CHECK(r[1].dtype() == DType::f64);
}

TEST_CASE("scan: a carry that changes shape, or xs of two lengths, is an error") {
  auto grows = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{cat({in[0], in[1]}, 0)};
  };
  CHECK_THROWS_AS(scan(grows, {f64({0}, {1})}, {f64({1, 2}, {2, 1})}), ShapeError);
  auto id = [](const std::vector<Tensor>& in) { return in; };
  CHECK_THROWS_AS(scan(id, {}, {f64({1, 2}, {2}), f64({1, 2, 3}, {3})}), ShapeError);
  CHECK_THROWS_AS(scan(id, {f64({0}, {})}, {}), ValueError);
}

TEST_CASE("while_loop: runs while the predicate holds; a gradient through it points to scan") {
  auto below = [](const std::vector<Tensor>& s) { return std::vector<Tensor>{s[0] < 100}; };
  auto twice = [](const std::vector<Tensor>& s) { return std::vector<Tensor>{s[0] * 2, s[1] + 1}; };
  std::vector<Tensor> r = while_loop(below, twice, {f64({3}, {}), f64({0}, {})});
  CHECK(r[0].item<double>() == 192);
  CHECK(r[1].item<double>() == 6);
  Tensor x = f64({3}, {}).requires_grad_();
  std::vector<Tensor> g = while_loop(below, twice, {x, f64({0}, {})});
  CHECK(g[0].item<double>() == 192);
  CHECK_THROWS_WITH(g[0].backward(),
                    doctest::Contains("[while_loop] is forward only: a gradient cannot flow "
                                      "through it. For a loop with a gradient use scan"));
  auto grows = [](const std::vector<Tensor>& s) { return std::vector<Tensor>{cat({s[0], s[0]})}; };
  CHECK_THROWS_AS(while_loop(below, grows, {f64({3}, {1})}), ShapeError);
}

}  // namespace duet::test
