// Structured control flow (trace/control_flow.h): cond, scan and while_loop, eagerly and
// compiled (Control nodes with subgraphs), with gradients in both faces.
#include "trace/compile.h"
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

// An Elman RNN over scan: h_t = tanh(x_t W + h_{t-1} U); returns {h_T, all h_t}.
std::vector<Tensor> elman(const Tensor& seq, const Tensor& h0, const Tensor& W, const Tensor& U) {
  auto cell = [W, U](const std::vector<Tensor>& s) {
    Tensor h = tanh(matmul(s[1], W) + matmul(s[0], U));
    return std::vector<Tensor>{h, h};
  };
  return scan(cell, {h0}, {seq});
}

Tensor rnn_loss(const Tensor& seq, const Tensor& h0, const Tensor& W, const Tensor& U) {
  std::vector<Tensor> o = elman(seq, h0, W, U);
  return sum(o[1] * o[1]) + sum(o[0]);
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

TEST_CASE("cond, scan, while_loop: results are new tensors, eagerly as compiled") {
  // Each construct hands back an operand unchanged; eagerly that was the operand itself, so a
  // write through the result reached it (Note [Control flow returns new tensors]).
  const Tensor zero_steps = zeros({0, 2});
  auto pass = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; };
  auto each = [&](const Tensor& x) {
    return std::vector<Tensor>{
        cond(scalar(true), pass, pass, {x})[0],
        scan([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; }, {x},
             {zero_steps})[0],
        scan([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; }, {x},
             {zeros({3, 2})})[0],
        while_loop([](const std::vector<Tensor>&) { return std::vector<Tensor>{scalar(false)}; },
                   pass, {x})[0]};
  };
  const Tensor x = ones({2});
  for (Tensor r : each(x)) {
    r.add_(1);
    CHECK(close(x, ones({2})));
  }
  // A branch that returns a tensor from outside (a parameter), as it is.
  const Tensor w = ones({2});
  auto outside = [&](const std::vector<Tensor>&) { return std::vector<Tensor>{w}; };
  Tensor rw = cond(scalar(true), outside, outside, {x})[0];
  rw.add_(1);
  CHECK(close(w, ones({2})));
  // A buffer updated in place from such a result, with the buffer passed as the argument: the
  // update reads the value the construct returned, in both faces.
  Tensor buf = ones({2}) * 1.5;
  auto update = [&](const Tensor& a) {
    const Tensor r = scan(pass, {a}, {zero_steps})[0];
    buf.mul_(0.5);
    buf.add_(r.detach());
    return r;
  };
  auto f = compile(update);
  const Tensor got = f(buf.clone());  // traced on an argument of its own
  buf.copy_(ones({2}) * 1.5);
  const Tensor eager_r = update(buf);
  const Tensor eager_buf = buf.clone();
  buf.copy_(ones({2}) * 1.5);
  const Tensor compiled_r = f(buf);
  CHECK(close(compiled_r, eager_r));
  CHECK(close(buf, eager_buf));
  CHECK(close(eager_buf, ones({2}) * 2.25));  // 0.75 + 1.5: the result is the value before
  (void)got;
}

TEST_CASE("scan: a carry that changes shape, or xs of two lengths, is an error") {
  auto grows = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{cat({in[0], in[1]}, 0)};
  };
  CHECK_THROWS_AS(scan(grows, {f64({0}, {1})}, {f64({1, 2}, {2, 1})}), ShapeError);
  auto id = [](const std::vector<Tensor>& in) { return in; };
  CHECK_THROWS_AS(scan(id, {}, {f64({1, 2}, {2}), f64({1, 2, 3}, {3})}), ShapeError);
  CHECK_THROWS_AS(scan(id, {f64({0}, {})}, {}), ValueError);
  // A carry that changes dtype only, eagerly and compiled: a DTypeError.
  auto narrows = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{(in[0] + in[1]).to(DType::f32)};
  };
  const Tensor c0 = f64({0, 0}, {2}), xs = f64({1, 2, 3, 4}, {2, 2});
  CHECK_THROWS_AS(scan(narrows, {c0}, {xs}), DTypeError);
  auto traced = compile([&](Tensor c, Tensor x) { return scan(narrows, {c}, {x})[0]; });
  CHECK_THROWS_AS(traced(c0, xs), DTypeError);
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
  auto narrows = [](const std::vector<Tensor>& s) {
    return std::vector<Tensor>{(s[0] * 2).to(DType::f32)};
  };
  CHECK_THROWS_AS(while_loop(below, narrows, {f64({3}, {})}), DTypeError);
  auto traced = compile([&](Tensor x) { return while_loop(below, narrows, {x})[0]; });
  CHECK_THROWS_AS(traced(f64({3}, {})), DTypeError);
}

TEST_CASE("cond compiled: one trace runs both branches, as eager does") {
  auto f = compile([](Tensor x, Tensor x3, Tensor x4) { return seed_branch(x, x3, x4)[0]; });
  Tensor x3 = f64({1.5}, {}), x4 = f64({10}, {});
  for (double v : {1.0, 3.0, 2.0, 5.0, -1.0}) {
    Tensor x = f64({v}, {});
    CHECK(bitwise_equal(f(x, x3, x4), seed_branch(x, x3, x4)[0]));
  }
  CHECK(f.stats().traces == 1);
  const std::string g = f.graph().str();
  CHECK(g.find("cond(") != std::string::npos);
  CHECK(g.find("true:") != std::string::npos);
  CHECK(g.find("false:") != std::string::npos);
  CHECK(g.find("project(") != std::string::npos);
}

TEST_CASE("cond compiled: gradients flow through it (gradcheck), in both branches") {
  auto f = compile([](Tensor x, Tensor a, Tensor b) { return seed_branch(x, a, b)[0]; });
  for (double v : {1.0, 3.0}) {
    Tensor x = f64({v}, {}).requires_grad_();
    Tensor a = f64({1.5}, {}).requires_grad_(), b = f64({10}, {}).requires_grad_();
    CHECK(gradcheck([&](const std::vector<Tensor>& in) { return f(in[0], in[1], in[2]); },
                    {x, a, b}));
    // The compiled gradient equals eager's.
    std::vector<Tensor> ge = grad({seed_branch(x, a, b)[0]}, {x, a, b});
    std::vector<Tensor> gc = grad({f(x, a, b)}, {x, a, b});
    for (size_t i = 0; i < 3; ++i) CHECK(bitwise_equal(ge[i], gc[i]));
  }
  // Gradients computed inside the compiled function: a cond of the branches' gradients.
  auto df = compile([](Tensor x, Tensor a, Tensor b) {
    Tensor xl = x.detach().requires_grad_();
    return grad({seed_branch(xl, a, b)[0] * xl}, {xl});
  });
  for (double v : {1.0, 3.0}) {
    Tensor x = f64({v}, {}), a = f64({1.5}, {}), b = f64({10}, {});
    const double want = v > 2 ? 2 * v * 1.5 : 10 - 2 * v;  // d/dx of y * x
    CHECK(df(x, a, b)[0].item<double>() == doctest::Approx(want));
  }
  CHECK(df.stats().traces == 1);
}

// Note [Gradients a branch cannot reach] in trace/control_flow.cpp: s = std of one element is 0
// and its gradient rule NaN there. Neither branch's result depends on s (the true branch reads it
// in a comparison, the false one in a value it does not return), so eagerly no gradient reaches
// the std, and compiled none may either: a zero through the std's rule was NaN.
TEST_CASE("cond compiled: an operand no branch's result depends on gets no gradient, as eagerly") {
  auto fn = [](const Tensor& x, const Tensor& y) {
    const Tensor s = duet::std(x, {-1}, 0, false);  // (2), zeros
    const Tensor out = cond(
        sum(y) > 0,
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{where(in[0] > 1, in[1], in[1] * 2)};
        },
        [](const std::vector<Tensor>& in) {
          const Tensor unused = pow(in[0], -1.0);  // (inf; not returned)
          return std::vector<Tensor>{in[1] + 1};
        },
        {s, sin(y)})[0];
    return sum(out) + sum(x);
  };
  auto f = compile(fn);
  for (double v : {1.0, -1.0}) {  // both branches
    Tensor x = f64({0.5, -2.0}, {2, 1}).requires_grad_();
    Tensor y = f64({v, 0.25}, {2}).requires_grad_();
    const std::vector<Tensor> ge = grad({fn(x, y)}, {x, y});
    const std::vector<Tensor> gc = grad({f(x, y)}, {x, y});
    CHECK(close(ge[0], ones({2, 1}, Options().dtype(DType::f64))));
    for (size_t i = 0; i < 2; ++i) CHECK(bitwise_equal(ge[i], gc[i]));
  }
}

// A branch whose result depends on an operand only through a cond inside it: the operand's
// gradient flows (a construct's node counts every input as reaching every result).
TEST_CASE("cond compiled: gradients through a cond nested in a branch equal eager's") {
  auto fn = [](const Tensor& x, const Tensor& y) {
    auto inner = [](const std::vector<Tensor>& in) {
      return cond(
          sum(in[1]) > 0,
          [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * a[1]}; },
          [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] - a[1]}; }, in);
    };
    auto outer_false = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[1] * 3}; };
    return sum(cond(sum(x) > 0, inner, outer_false, {x, y})[0]);
  };
  auto f = compile(fn);
  for (double v : {1.0, -1.0}) {
    Tensor x = f64({0.5, 2.0}, {2}).requires_grad_();
    Tensor y = f64({v, 0.25}, {2}).requires_grad_();
    const std::vector<Tensor> ge = grad({fn(x, y)}, {x, y});
    const std::vector<Tensor> gc = grad({f(x, y)}, {x, y});
    for (size_t i = 0; i < 2; ++i) CHECK(bitwise_equal(ge[i], gc[i]));
  }
}

// The same for scan: a value that no result of the body depends on (read only by a comparison
// and by a value the body does not return) gets no gradient, eagerly and compiled.
TEST_CASE("scan compiled: an input no result of the body depends on gets no gradient") {
  auto fn = [](const Tensor& x, const Tensor& seq) {
    const Tensor s = duet::std(x, {-1}, 0, false);  // (2), zeros; NaN gradient rule there
    auto body = [s](const std::vector<Tensor>& c) {
      const Tensor unused = pow(s, -1.0);
      const Tensor h = where(s > 1, c[0] * c[1], c[0] + c[1]);
      return std::vector<Tensor>{h, h};
    };
    return sum(scan(body, {zeros({2}, Options().dtype(DType::f64))}, {seq})[1]) + sum(x);
  };
  auto f = compile(fn);
  Tensor x = f64({0.5, -2.0}, {2, 1}).requires_grad_();
  Tensor seq = f64({1, 2, 3, 4, 5, 6}, {3, 2}).requires_grad_();
  const std::vector<Tensor> ge = grad({fn(x, seq)}, {x, seq});
  const std::vector<Tensor> gc = grad({f(x, seq)}, {x, seq});
  CHECK(close(ge[0], ones({2, 1}, Options().dtype(DType::f64))));
  for (size_t i = 0; i < 2; ++i) CHECK(bitwise_equal(ge[i], gc[i]));
  // A carry is different: a body whose results do not depend on the carry still returns it
  // when it takes no steps, so the initial carry's gradient is the result's.
  auto zero_steps = [](const Tensor& c0, const Tensor& seq) {
    auto body = [](const std::vector<Tensor>& c) {
      const Tensor h = tanh(where(c[0] > 0, c[1], c[1] * 2));
      return std::vector<Tensor>{h, h};
    };
    return sum(scan(body, {c0 * 2}, {seq})[0]);
  };
  auto fz = compile(zero_steps);
  Tensor c0 = f64({0.5, -1.0}, {2}).requires_grad_();
  Tensor empty = zeros({0, 2}, Options().dtype(DType::f64)).requires_grad_();
  const Tensor gze = grad({zero_steps(c0, empty)}, {c0})[0];
  CHECK(close(gze, full({2}, 2.0, Options().dtype(DType::f64))));
  CHECK(bitwise_equal(grad({fz(c0, empty)}, {c0})[0], gze));
  // Per result: the first carry's result never depends on the second carry, at any number of
  // steps, so the second's initial value (a std of one element, NaN gradient rule) gets no
  // gradient from it.
  auto two = [](const Tensor& x, const Tensor& seq) {
    const Tensor s = duet::std(x, {-1}, 0, false);  // (2), zeros
    auto body = [](const std::vector<Tensor>& c) {
      const Tensor a = tanh(c[0] + c[2]), b = c[1] * 0.5 + c[2];
      return std::vector<Tensor>{a, b, a};
    };
    return sum(scan(body, {zeros({2}, Options().dtype(DType::f64)), s}, {seq})[0]) + sum(x);
  };
  auto ft = compile(two);
  for (int64_t steps : {0, 3}) {
    Tensor xs = f64({0.5, -2.0}, {2, 1}).requires_grad_();
    Tensor q = (arange(2.0 * static_cast<double>(steps), Options().dtype(DType::f64)) * 0.1)
                   .reshape({steps, 2})
                   .requires_grad_();
    const Tensor ge = grad({two(xs, q)}, {xs})[0];
    CHECK(close(ge, ones({2, 1}, Options().dtype(DType::f64))));
    CHECK(bitwise_equal(grad({ft(xs, q)}, {xs})[0], ge));
  }
}

TEST_CASE("cond compiled: branches of different shapes or dtypes are an error at trace time") {
  const int line = __LINE__ + 1;  // the compile call's line, which the message names
  auto f = compile([](Tensor x) {
    return cond(
        sum(x) > 0, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(in[0])}; }, {x})[0];
  });
  // The message, then where: the compiled function being traced (core/call_site.h).
  const std::string want = fmt::format(
      "[cond] the branches must return tensors of the same shapes and dtypes: the true branch "
      "returns f64 (2), the false branch f64 () while tracing compiled function at "
      "test_control_flow.cpp:{}",
      line);
  CHECK_THROWS_WITH_AS(f(f64({1, 2}, {2})), want.c_str(), ShapeError);
  auto g = compile([](Tensor x) {
    return cond(
        sum(x) > 0, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].to(DType::f32)}; },
        {x})[0];
  });
  // Shapes that agree and dtypes that do not (a product's result under autocast): a DTypeError.
  CHECK_THROWS_AS(g(f64({1, 2}, {2})), DTypeError);
}

TEST_CASE("cond compiled: a captured tensor read by a branch is lifted into the node") {
  Tensor w = f64({2, 3}, {2}).requires_grad_();
  auto f = compile([&](Tensor x) {
    return cond(
        sum(x) > 0, [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * w}; },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{-in[0]}; }, {x})[0];
  });
  Tensor x = f64({1, 1}, {2});
  CHECK(values(f(x)) == std::vector<double>{2, 3});
  sum(f(x)).backward();
  CHECK(values(w.grad()) == std::vector<double>{1, 1});
  CHECK(values(f(-x)) == std::vector<double>{1, 1});
  CHECK(f.stats().traces == 1);
}

TEST_CASE("passes see into subgraphs: a constant predicate folds, DCE and CSE run inside") {
  auto folded = compile([](Tensor x) {
    return cond(
        scalar(true), [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2}; },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] - 1}; }, {x})[0];
  });
  Tensor x = f64({1, 2}, {2});
  CHECK(values(folded(x)) == std::vector<double>{2, 4});
  CHECK(folded.graph().str().find("cond(") == std::string::npos);
  // Inside the branches: an unused value is dropped, and two equal ones merge.
  auto f = compile([](Tensor x) {
    return cond(
        sum(x) > 0,
        [](const std::vector<Tensor>& in) {
          Tensor unused = exp(in[0]);
          return std::vector<Tensor>{sin(in[0]) + sin(in[0])};
        },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; }, {x})[0];
  });
  CHECK(close(f(x), sin(x) + sin(x)));
  const std::string g = f.graph().str();
  CHECK(g.find("exp(") == std::string::npos);
  size_t sins = 0;
  for (size_t p = g.find("sin("); p != std::string::npos; p = g.find("sin(", p + 1)) ++sins;
  CHECK(sins == 1);
  // A result nobody reads leaves the cond.
  auto two = compile([](Tensor x) {
    return cond(
        sum(x) > 0,
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0] + 1, cos(in[0])};
        },
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0], in[0]};
        },
        {x})[0];
  });
  CHECK(values(two(x)) == std::vector<double>{2, 3});
  CHECK(two.graph().str().find("cos(") == std::string::npos);
}

TEST_CASE("scan compiled: an Elman RNN equals eager, outputs and gradients") {
  manual_seed(3);
  Tensor W = (randn({3, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor U = (randn({4, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor h0 = zeros({2, 4}, Options().dtype(DType::f64));
  auto f = compile([&](Tensor seq) { return rnn_loss(seq, h0, W, U); });
  for (int64_t len : {1, 5}) {
    Tensor seq = randn({len, 2, 3}, Options().dtype(DType::f64)).requires_grad_();
    Tensor le = rnn_loss(seq, h0, W, U);
    std::vector<Tensor> ge = grad({le}, {seq, W, U});
    Tensor lc = f(seq);
    std::vector<Tensor> gc = grad({lc}, {seq, W, U});
    CHECK(close(lc, le, 1e-12));
    for (size_t i = 0; i < 3; ++i) CHECK(close(gc[i], ge[i], 1e-12));
    CHECK(gradcheck([&](const std::vector<Tensor>& in) { return f(in[0]); }, {seq}));
  }
  const std::string g = f.graph().str();
  CHECK(g.find("scan(") != std::string::npos);
}

TEST_CASE("scan compiled: the backward is itself a scan, in the compiled training step") {
  manual_seed(4);
  Tensor W = (randn({3, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor U = (randn({4, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor h0 = zeros({2, 4}, Options().dtype(DType::f64));
  auto step = compile([&](Tensor seq) { return grad({rnn_loss(seq, h0, W, U)}, {W, U}); });
  Tensor seq = randn({6, 2, 3}, Options().dtype(DType::f64));
  std::vector<Tensor> gc = step(seq);
  std::vector<Tensor> ge = grad({rnn_loss(seq, h0, W, U)}, {W, U});
  CHECK(close(gc[0], ge[0], 1e-12));
  CHECK(close(gc[1], ge[1], 1e-12));
  const std::string g = step.graph().str();
  CHECK(g.find("reverse") != std::string::npos);
}

// The reverse scans of a compiled function's optimized graph.
int reverse_scans(const Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes)
    n += node.kind == NodeKind::Control && node.control->kind == ControlKind::Scan &&
         node.control->reverse;
  return n;
}

TEST_CASE("scan compiled: one reverse scan for the gradients of its last carry and its stack") {
  // Note [Results of one construct]: each result that the loss reads ran a reverse scan of its
  // own, rerunning the body each time.
  manual_seed(5);
  Tensor W = (randn({3, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor U = (randn({4, 4}, Options().dtype(DType::f64)) * 0.5).requires_grad_();
  Tensor h0 = zeros({2, 4}, Options().dtype(DType::f64));
  auto lstm_like = [&](const Tensor& seq) {  // two carries and a stack
    auto body = [&](const std::vector<Tensor>& s) {
      Tensor h = tanh(matmul(s[2], W) + matmul(s[0], U)), c = s[1] * 0.5 + h;
      return std::vector<Tensor>{h, c, h * c};
    };
    return scan(body, {h0, h0}, {seq});
  };
  using Loss = std::function<Tensor(const std::vector<Tensor>&)>;
  const std::vector<std::pair<Loss, int>> losses = {
      {[](const std::vector<Tensor>& o) { return sum(o[0]) + sum(o[1]) + sum(o[2] * o[2]); }, 1},
      {[](const std::vector<Tensor>& o) { return sum(o[0] * o[1]); }, 1},
      {[](const std::vector<Tensor>& o) { return sum(o[2]); }, 1},
      {[](const std::vector<Tensor>& o) { return sum(o[1]); }, 1}};
  Tensor seq = randn({5, 2, 3}, Options().dtype(DType::f64)).requires_grad_();
  for (const auto& [loss, scans] : losses) {
    auto step = compile([&](Tensor x) { return grad({loss(lstm_like(x))}, {x, W, U}); });
    std::vector<Tensor> gc = step(seq);
    std::vector<Tensor> ge = grad({loss(lstm_like(seq))}, {seq, W, U});
    for (size_t i = 0; i < 3; ++i) CHECK(close(gc[i], ge[i], 1e-12));
    CHECK(reverse_scans(step.graph()) == scans);
  }
  // The Elman RNN's loss reads its last carry and its stack.
  auto step = compile([&](Tensor x) { return grad({rnn_loss(x, h0, W, U)}, {W, U}); });
  std::vector<Tensor> gc = step(seq.detach());
  std::vector<Tensor> ge = grad({rnn_loss(seq.detach(), h0, W, U)}, {W, U});
  CHECK(close(gc[0], ge[0], 1e-12));
  CHECK(close(gc[1], ge[1], 1e-12));
  CHECK(reverse_scans(step.graph()) == 1);
  // Twice through one traced tape (retain_graph), and the gradient of one result alone.
  auto twice = compile([&](Tensor x) {
    std::vector<Tensor> o = lstm_like(x);
    Tensor l = losses[0].first(o);
    std::vector<Tensor> a = detail::grad({l}, {x, W, U}, {}, false, /*retain_graph=*/true);
    std::vector<Tensor> b = detail::grad({l}, {x, W, U}, {}, false, false);
    std::vector<Tensor> c = grad({sum(lstm_like(x)[1])}, {x});
    return std::vector<Tensor>{a[0], a[1], a[2], b[0], b[1], b[2], c[0]};
  });
  std::vector<Tensor> r = twice(seq);
  std::vector<Tensor> want = grad({losses[0].first(lstm_like(seq))}, {seq, W, U});
  for (size_t i = 0; i < 3; ++i) {
    CHECK(close(r[i], want[i], 1e-12));
    CHECK(close(r[3 + i], want[i], 1e-12));
  }
  CHECK(close(r[6], grad({sum(lstm_like(seq)[1])}, {seq})[0], 1e-12));
}

TEST_CASE("cond compiled: one cond for the gradients of several of its results") {
  Tensor w = f64({0.5, -1.5, 2.0}, {3}).requires_grad_();
  auto two = [&](const Tensor& x) {
    return cond(
        sum(x) > 0,
        [&](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0] * w, sin(in[0] * w), in[0] + 1};
        },
        [&](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0] - w, in[0] * in[0], exp(in[0])};
        },
        {x});
  };
  auto loss = [](const std::vector<Tensor>& o) { return sum(o[0] * o[1]) + sum(o[2]); };
  auto step = compile([&](Tensor x) { return grad({loss(two(x))}, {x, w}); });
  for (double s : {1.0, -1.0}) {
    Tensor x = (f64({0.3, 0.7, -0.2}, {3}) * s).requires_grad_();
    std::vector<Tensor> gc = step(x);
    std::vector<Tensor> ge = grad({loss(two(x))}, {x, w});
    CHECK(close(gc[0], ge[0], 1e-12));
    CHECK(close(gc[1], ge[1], 1e-12));
  }
  int conds = 0;  // the forward's and one for the gradients (it was one per result read)
  for (const auto& node : step.graph().nodes)
    conds += node.kind == NodeKind::Control && node.control->kind == ControlKind::Cond;
  CHECK(conds == 2);
}

TEST_CASE("while_loop compiled: values equal eager; a gradient is the error pointing to scan") {
  auto below = [](const std::vector<Tensor>& s) { return std::vector<Tensor>{s[0] < 100}; };
  auto twice = [](const std::vector<Tensor>& s) { return std::vector<Tensor>{s[0] * 2, s[1] + 1}; };
  auto f = compile([&](Tensor x) { return while_loop(below, twice, {x, x * 0}); });
  for (double v : {3.0, 50.0, 200.0}) {
    std::vector<Tensor> r = f(f64({v}, {}));
    std::vector<Tensor> e = while_loop(below, twice, {f64({v}, {}), f64({0}, {})});
    CHECK(r[0].item<double>() == e[0].item<double>());
    CHECK(r[1].item<double>() == e[1].item<double>());
  }
  CHECK(f.stats().traces == 1);
  Tensor x = f64({3}, {}).requires_grad_();
  CHECK_THROWS_WITH(grad({f(x)[0]}, {x}),
                    doctest::Contains("[while_loop] is forward only: a gradient cannot flow "
                                      "through it. For a loop with a gradient use scan"));
}

TEST_CASE("a body that writes a tensor from outside in place is an error naming the construct") {
  Tensor acc = f64({0}, {});
  auto f = compile([&](Tensor x) {
    return cond(
        sum(x) > 0,
        [&](const std::vector<Tensor>& in) {
          acc.add_(1);
          return std::vector<Tensor>{in[0]};
        },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; }, {x})[0];
  });
  CHECK_THROWS_WITH(f(f64({1}, {1})), doctest::Contains("cond true branch"));
}

}  // namespace duet::test
