// lstm_step (Note [LSTM step] in core/ops/rnn.cpp) beyond its op rows: the CPU kernels against the
// composed ones that the CUDA backend registers, second derivatives, per-sample weights under vmap
// and Autobatch, nn::LSTMCell's use of it, and its errors. The op rows (tests/op_rows_step.cpp)
// check values, gradients, compiled calls and vmap with shared weights.
#include "eager/autobatch.h"
#include "kernels/composed.h"
#include "nn/rnn.h"
#include "trace/func.h"
#include "util.h"

namespace duet::test {
namespace {

struct Step {
  Tensor x, h, c, w_ih, w_hh, b_ih, b_hh;
  std::vector<Tensor> all() const { return {x, h, c, w_ih, w_hh, b_ih, b_hh}; }
};

Step random_step(Shape lead, int64_t in, int64_t hidden, DType dt = DType::f32) {
  auto with = [&](int64_t n) {
    Shape s = lead;
    s.push_back(n);
    return randn(s, Options().dtype(dt));
  };
  const Options o = Options().dtype(dt);
  return {with(in),
          with(hidden),
          with(hidden),
          randn({4 * hidden, in}, o) * 0.5,
          randn({4 * hidden, hidden}, o) * 0.5,
          randn({4 * hidden}, o),
          randn({4 * hidden}, o)};
}

Shape with_last(Shape s, int64_t n) {
  s.push_back(n);
  return s;
}

// Each of got equals the same of want within tol.
void check_each(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(close(got[i], want[i], tol));
  }
}

Tensor run_kernel_on(KernelFn k, OpId op, const std::vector<Tensor>& in) {
  std::vector<const Tensor*> p;
  for (const Tensor& t : in) p.push_back(&t);
  TensorMeta meta;
  detail::op_def(op).infer(detail::op_def(op), TensorRefs(p.data(), static_cast<int64_t>(p.size())),
                           Attrs(), meta);
  Tensor out = detail::empty(meta.shape, meta.dtype, meta.device);
  k(TensorRefs(p.data(), static_cast<int64_t>(p.size())), Attrs(), out);
  return out;
}

TEST_CASE("lstm_step: the CPU kernels equal the composed kernels of the CUDA backend") {
  for (DType dt : {DType::f32, DType::f64}) {
    CAPTURE(dt);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    const Step s = random_step({3, 2}, 5, 4, dt);
    std::vector<Tensor> in = s.all();
    in[0] = randn({5, 2, 3}, Options().dtype(dt)).permute({2, 1, 0});  // a strided x
    // c read in place at a row stride, as the previous step's result is.
    in[2] = randn({3, 2, 24}, Options().dtype(dt)).slice(-1, 4, 8);
    const KernelFn cpu = detail::op_def(OpId::LstmStep).kernel[int(DeviceType::CPU)];
    const Tensor a = run_kernel_on(cpu, OpId::LstmStep, in);
    CHECK(close(a, run_kernel_on(kernels::lstm_step_composed_kernel, OpId::LstmStep, in), tol));
    // h as the previous step's rows, and h expanded (rows no stride apart: copied).
    for (const Tensor& h : {randn({3, 2, 24}, Options().dtype(dt)).slice(-1, 0, 4),
                            randn({1, 1, 4}, Options().dtype(dt)).expand({3, 2, 4})}) {
      std::vector<Tensor> v = in;
      v[1] = h;
      CHECK(close(run_kernel_on(cpu, OpId::LstmStep, v),
                  run_kernel_on(kernels::lstm_step_composed_kernel, OpId::LstmStep, v), tol));
    }
    // The backward, with a gradient whose a columns are not zero (they add to a's gradient).
    const Tensor av = a.slice(-1, 8, 24);
    const Tensor g = randn({3, 2, 24}, Options().dtype(dt));
    const std::vector<Tensor> bin{av, in[2], g};
    const KernelFn cpu_b = detail::op_def(OpId::LstmStepBackward).kernel[int(DeviceType::CPU)];
    const Tensor ra = run_kernel_on(cpu_b, OpId::LstmStepBackward, bin);
    const Tensor rb =
        run_kernel_on(kernels::lstm_step_backward_composed_kernel, OpId::LstmStepBackward, bin);
    CHECK(close(ra, rb, tol));
    // Without g's a columns, the gradient of a is lstm_cell_backward's on (a, 0).
    const Tensor g2 = cat({g.slice(-1, 0, 8), zeros({3, 2, 16}, Options().dtype(dt))}, -1);
    const Tensor r0 = run_kernel_on(cpu_b, OpId::LstmStepBackward, {av, in[2], g2});
    const Tensor want = run_kernel_on(
        detail::op_def(OpId::LstmCellBackward).kernel[int(DeviceType::CPU)], OpId::LstmCellBackward,
        {av.contiguous(), zeros_like(av), in[2].contiguous(), g.slice(-1, 0, 8).contiguous()});
    CHECK(close(r0, want, tol));
    CHECK(close(ra.slice(-1, 0, 16) - r0.slice(-1, 0, 16), g.slice(-1, 8, 24), tol));
  }
}

// The step written as nn::LSTMCell wrote it before: two linears and fused_lstm_cell.
std::tuple<Tensor, Tensor> composite(const std::vector<Tensor>& v) {
  return fused_lstm_cell(linear(v[0], v[3], v[5]), linear(v[1], v[4], v[6]), v[2]);
}

TEST_CASE("lstm_step: second derivatives equal the composite's") {
  const Step s = random_step({2}, 3, 2, DType::f64);
  auto second = [&](bool fused) {
    std::vector<Tensor> v;
    for (const Tensor& t : s.all()) v.push_back(t.detach().requires_grad_(true));
    auto [hn, cn] = fused ? lstm_step(v[0], v[1], v[2], v[3], v[4], v[5], v[6]) : composite(v);
    const Tensor loss = (hn * hn).sum() + (cn * hn).sum();
    std::vector<Tensor> g1 = grad({loss}, v, {}, /*create_graph=*/true);
    Tensor norm = zeros({}, Options().dtype(DType::f64));
    for (const Tensor& t : g1) norm = norm + (t * t).sum();
    return grad({norm}, v);
  };
  check_each(second(true), second(false), 1e-10);
}

TEST_CASE("lstm_step compiled: a symbolic batch traces once, values and gradients as eager") {
  nn::LSTMCell cell(3, 4);
  const std::vector<Tensor> params = cell.parameters();
  // Three steps over x (N, 3, 3), then the weights' gradients of a loss of h and c.
  auto fn = [&](const Tensor& x) {
    std::optional<nn::LSTMCell::State> s;
    for (int64_t k = 0; k < 3; ++k) s = cell(x.select(1, k), s);
    const Tensor loss = (std::get<0>(*s) * std::get<1>(*s)).sum();
    std::vector<Tensor> out = grad({loss}, params);
    out.push_back(loss);
    return out;
  };
  auto f = compile(fn);
  for (int64_t n : {2, 5, 7, 0}) {
    CAPTURE(n);
    const Tensor x = randn({n, 3, 3});
    check_each(f(x), fn(x), 1e-5);
  }
  CHECK(f.stats().traces == 2);  // the second batch size makes it symbolic
}

TEST_CASE("lstm_step: a cell of no hidden units") {
  const Step s = random_step({2}, 3, 0);
  std::vector<Tensor> v;
  for (const Tensor& t : s.all()) v.push_back(t.detach().requires_grad_(true));
  auto [hn, cn] = lstm_step(v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
  CHECK(hn.sizes() == Shape{2, 0});
  const std::vector<Tensor> g = grad({(hn.sum() + cn.sum()) + v[0].sum()}, v);
  CHECK(close(g[0], ones({2, 3})));
  CHECK(g[3].sizes() == Shape{0, 3});
}

TEST_CASE("lstm_step under vmap: shared and per-sample weights, without a loop") {
  const Step s = random_step({4}, 3, 2);
  auto step = [](const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& wi,
                 const Tensor& wh, const Tensor& bi, const Tensor& bh) {
    auto [hn, cn] = lstm_step(x, h, c, wi, wh, bi, bh);
    return cat({hn, cn}, -1);
  };
  const int64_t before = detail::batch_loop_calls();
  const Tensor shared =
      func::vmap(step, {0, 0, 0, std::nullopt, std::nullopt, std::nullopt, std::nullopt})(
          s.x, s.h, s.c, s.w_ih, s.w_hh, s.b_ih, s.b_hh);
  CHECK(close(shared, step(s.x, s.h, s.c, s.w_ih, s.w_hh, s.b_ih, s.b_hh), 1e-5));
  // An ensemble: each sample its own weights.
  const Tensor wi = randn({4, 8, 3}), wh = randn({4, 8, 2}), bi = randn({4, 8}), bh = randn({4, 8});
  const Tensor each = func::vmap(step)(s.x, s.h, s.c, wi, wh, bi, bh);
  for (int64_t b = 0; b < 4; ++b) {
    CAPTURE(b);
    CHECK(close(each.select(0, b),
                step(s.x.select(0, b), s.h.select(0, b), s.c.select(0, b), wi.select(0, b),
                     wh.select(0, b), bi.select(0, b), bh.select(0, b)),
                1e-5));
  }
  // Samples of no rows, and of two dims of rows.
  for (Shape lead : {Shape{4, 0}, Shape{4, 2, 3}}) {
    CAPTURE(lead);
    const Step e = random_step(lead, 3, 2);
    const Tensor got = func::vmap(step)(e.x, e.h, e.c, wi, wh, bi, bh);
    REQUIRE(got.sizes() == with_last(lead, 4));
    for (int64_t b = 0; b < 4; ++b)
      CHECK(close(got.select(0, b),
                  step(e.x.select(0, b), e.h.select(0, b), e.c.select(0, b), wi.select(0, b),
                       wh.select(0, b), bi.select(0, b), bh.select(0, b)),
                  1e-5));
  }
  CHECK(detail::batch_loop_calls() == before);
}

TEST_CASE("lstm_step in an Autobatch scope: two cells' samples, values and gradients") {
  // Two cells of one shape, each step of one sample: a group too small to split by weight
  // batches their weights (per-sample weights), a larger one splits.
  nn::LSTMCell a(3, 2), b(3, 2);
  const Tensor xs = randn({5, 3});
  auto run = [&](bool batched) {
    for (nn::LSTMCell* m : {&a, &b})
      for (const Tensor& p : m->parameters())
        if (p.grad().defined()) p.grad().zero_();
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    Tensor loss;
    for (int64_t n : {1, 5}) {
      std::optional<nn::LSTMCell::State> sa, sb;
      for (int64_t k = 0; k < n; ++k) {
        sa = a(xs.select(0, k), sa);
        sb = b(xs.select(0, k), sb);
      }
      const Tensor l = (std::get<0>(*sa) * std::get<1>(*sb)).sum();
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    std::vector<Tensor> out{loss.detach()};
    for (nn::LSTMCell* m : {&a, &b})
      for (const Tensor& p : m->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const int64_t before = detail::batch_loop_calls();
  const std::vector<Tensor> want = run(false), got = run(true);
  CHECK(detail::batch_loop_calls() == before);
  check_each(got, want, 1e-5);
}

TEST_CASE("nn::LSTMCell runs lstm_step outside autocast, and the two linears inside it") {
  nn::LSTMCell cell(3, 4);
  const Tensor x = randn({2, 3});
  {
    detail::KernelCounter count;
    ModeGuard counting(&count);
    NoGradGuard ng;
    cell(x, std::nullopt);
    CHECK(count.kernels == 3);  // the start state's h and c (zeros), then lstm_step
  }
  Autocast ac(Device::cpu(), DType::bf16);
  auto [h, c] = cell(x, std::nullopt);
  CHECK(h.dtype() == DType::f32);  // the bf16 products' cell on the f32 state promotes
  nn::LSTMCell nobias(nn::LSTMCellOptions(3, 4).bias(false));
  CHECK(std::get<0>(nobias(x, std::nullopt)).sizes() == Shape{2, 4});
}

TEST_CASE("lstm_step: errors name the op, the shapes and the dtypes") {
  const Step s = random_step({2}, 3, 2);
  std::string e =
      error_of<ShapeError>([&] { lstm_step(s.x, s.h, s.c, s.w_hh, s.w_hh, s.b_ih, s.b_hh); });
  CHECK(contains(e, "[lstm_step] w_ih must be (8, 3)"));
  e = error_of<ShapeError>(
      [&] { lstm_step(s.x, s.h.slice(0, 0, 1), s.c, s.w_ih, s.w_hh, s.b_ih, s.b_hh); });
  CHECK(contains(e, "[lstm_step]"));
  CHECK(contains(e, "(1, 2)"));
  e = error_of<DTypeError>(
      [&] { lstm_step(s.x.to(DType::f64), s.h, s.c, s.w_ih, s.w_hh, s.b_ih, s.b_hh); });
  CHECK(contains(e, "[lstm_step] operands must share a floating dtype, got f64"));
  e = error_of<ValueError>([&] { lstm_step(Tensor(), s.h, s.c, s.w_ih, s.w_hh, s.b_ih, s.b_hh); });
  CHECK(contains(e, "[lstm_step] input 0 is an undefined tensor"));
}

}  // namespace
}  // namespace duet::test
