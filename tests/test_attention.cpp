// The fused attention primitive (Note [Attention] in core/ops/attention.cpp) against the
// composite it replaces: random shapes and masks, the low dtypes, second derivatives, eager
// against compiled, and the memory it holds at 4096 tokens (CUDA against CPU: test_cuda_ops).
#include <doctest/doctest.h>

#include "util.h"

namespace duet::test {
namespace {

const char* kOp = "scaled_dot_product_attention";

// The composite's result and gradients on copies of the same leaves.
struct Run {
  Tensor out, dq, dk, dv;
};
Run run(bool fused, const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& mask,
        bool causal, double scale, const Tensor& g) {
  Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(),
         v = v0.detach().requires_grad_();
  Tensor out = fused ? scaled_dot_product_attention(q, k, v, mask, causal, scale)
                     : detail::attention_composite(kOp, q, k, v, mask, causal, scale);
  std::vector<Tensor> gs = grad({out}, {q, k, v}, {g});
  return {out.detach(), gs[0], gs[1], gs[2]};
}

// |a - b| <= tol * (1 + |b|) elementwise, NaN where both are NaN.
bool near(const Tensor& a, const Tensor& b, double tol) {
  if (a.sizes() != b.sizes()) return false;
  const std::vector<double> x = values(a), y = values(b);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (!(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])))) return false;
  }
  return true;
}

int64_t pick(Rng& rng, int64_t lo, int64_t hi) {
  return std::min<int64_t>(hi, lo + static_cast<int64_t>(rng.uniform(0, 1) * double(hi - lo + 1)));
}

}  // namespace

TEST_CASE("attention: the fused kernels against the composite, random shapes and masks") {
  Rng rng(45);
  manual_seed(45);
  const int64_t heads[] = {16, 32, 64, 128};
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t l = pick(rng, 1, 300), s = pick(rng, 1, 300);
    const int64_t e = heads[pick(rng, 0, 3)], f = trial % 3 ? e : heads[pick(rng, 0, 3)];
    const int kind = trial % 5;  // none, causal, b8 (L, S), float (L, S), b8 key padding
    const Shape batch = trial % 2 ? Shape{2} : Shape{};
    auto with = [&](int64_t a, int64_t b) {
      Shape r = batch;
      r.push_back(a);
      r.push_back(b);
      return r;
    };
    const DType dt = trial % 4 == 3 ? DType::f64 : DType::f32;
    const Options o = Options().dtype(dt);
    Tensor q = randn(with(l, e), o), k = randn(with(s, e), o), v = randn(with(s, f), o);
    Tensor g = randn(with(l, f), o), mask;
    if (kind == 2) mask = gt(rand({l, s}), 0.2);
    if (kind == 3) mask = randn({l, s}, o);
    if (kind == 4) mask = gt(rand(with(1, s)), 0.3);  // one row of keys per batch
    const double scale = trial % 7 == 0 ? 0.3 : 0;
    INFO("L " << l << " S " << s << " E " << e << " F " << f << " mask kind " << kind << " "
              << dtype_name(dt));
    const Run a = run(true, q, k, v, mask, kind == 1, scale, g);
    const Run b = run(false, q, k, v, mask, kind == 1, scale, g);
    const double tol = dt == DType::f64 ? 1e-10 : 2e-4;
    CHECK(near(a.out, b.out, tol));
    CHECK(near(a.dq, b.dq, tol));
    CHECK(near(a.dk, b.dk, tol));
    CHECK(near(a.dv, b.dv, tol));
  }
}

TEST_CASE("attention: the call is one Attention node and its gradient one AttentionBackward") {
  Tensor q = randn({2, 5, 8}).requires_grad_(), k = randn({2, 7, 8}).requires_grad_(),
         v = randn({2, 7, 4}).requires_grad_();
  CountingMode mode;
  {
    ModeGuard guard(&mode);
    Tensor y = scaled_dot_product_attention(q, k, v, {}, true);
    y.sum().backward();
  }
  CHECK(mode.count("attention") == 1);
  CHECK(mode.count("attention_backward") == 1);
  CHECK(mode.count("matmul") == 0);
}

TEST_CASE("attention: f16 and bf16 accumulate in f32, as the f32 result rounded") {
  manual_seed(3);
  Tensor q = randn({2, 140, 32}), k = randn({2, 180, 32}), v = randn({2, 180, 32});
  const Tensor want = scaled_dot_product_attention(q, k, v, {}, true);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor y = scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), {}, true);
    CHECK(y.dtype() == dt);
    // The inputs' rounding (2^-8 for bf16) moves the result by about that much.
    CHECK(near(y.to(DType::f32), want, dt == DType::bf16 ? 3e-2 : 4e-3));
  }
  // The gradients too: bf16 multiplies its tiles in bf16 where oneDNN can (Note [Low-precision
  // tiles] in kernels/attention.cpp), over several tiles each way, causal, with a padding mask,
  // with L != S; against f32 on the same rounded inputs. (Four batches: each sums its dq over
  // its three key tiles itself.)
  const Tensor pad = arange(300).lt(280).reshape({1, 1, 300}).expand({4, 140, 300});
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    const Tensor qr = randn({4, 140, 32}).to(DType::bf16), kr = randn({4, 300, 32}).to(DType::bf16),
                 vr = randn({4, 300, 32}).to(DType::bf16);
    const Tensor mask = causal ? Tensor() : pad;
    const Tensor g = randn({4, 140, 32});
    const Run want32 =
        run(true, qr.to(DType::f32), kr.to(DType::f32), vr.to(DType::f32), mask, causal, 0, g);
    const Run got = run(true, qr, kr, vr, mask, causal, 0, g.to(DType::bf16));
    CHECK(near(got.out.to(DType::f32), want32.out, 3e-2));
    CHECK(near(got.dq.to(DType::f32), want32.dq, 3e-2));
    CHECK(near(got.dk.to(DType::f32), want32.dk, 3e-2));
    CHECK(near(got.dv.to(DType::f32), want32.dv, 3e-2));
  }
  // Under autocast the f32 inputs run in bf16 and the result is bf16.
  {
    Autocast ac(Device::cpu());
    CHECK(scaled_dot_product_attention(q, k, v).dtype() == DType::bf16);
  }
}

TEST_CASE("attention: second derivatives (create_graph) are the composite's") {
  manual_seed(5);
  const Options o = Options().dtype(DType::f64);
  Tensor q0 = randn({2, 4, 3}, o), k0 = randn({2, 5, 3}, o), v0 = randn({2, 5, 2}, o);
  auto second = [&](bool fused) {
    Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(),
           v = v0.detach().requires_grad_();
    Tensor y = fused ? scaled_dot_product_attention(q, k, v, {}, true)
                     : detail::attention_composite(kOp, q, k, v, {}, true, 0);
    std::vector<Tensor> g = grad({(y * y).sum()}, {q, k, v}, {}, /*create_graph=*/true);
    return grad({(g[0] * g[0]).sum() + (g[1] * g[2].sum()).sum()}, {q, k, v});
  };
  const std::vector<Tensor> a = second(true), b = second(false);
  for (int i = 0; i < 3; ++i) CHECK(near(a[i], b[i], 1e-10));
}

TEST_CASE("attention: compiled equals eager bit for bit, forward and backward") {
  manual_seed(7);
  Tensor q = randn({2, 3, 135, 16}), k = randn({2, 3, 160, 16}), v = randn({2, 3, 160, 16});
  Tensor mask = gt(rand({1, 1, 135, 160}), 0.1);
  auto step = [&](Tensor q_, Tensor k_, Tensor v_) {
    Tensor a = q_.detach().requires_grad_(), b = k_.detach().requires_grad_(),
           c = v_.detach().requires_grad_();
    Tensor y = scaled_dot_product_attention(a, b, c, mask);
    std::vector<Tensor> g = grad({(y * y).sum()}, {a, b, c});
    return std::vector<Tensor>{y.detach(), g[0], g[1], g[2]};
  };
  auto f = compile(step);
  const std::vector<Tensor> e = step(q, k, v), c = f(q, k, v);
  for (int i = 0; i < 4; ++i) CHECK(bitwise_equal(e[i], c[i]));
  // Note [Attention's gradient without its zeros]: the output's gradient goes to the backward
  // as it is, not written into zeros of the whole result first.
  const std::string g = f.graph().str();
  CHECK(g.find("attention_backward") != std::string::npos);
  CHECK(g.find("slice_scatter") == std::string::npos);
}

TEST_CASE("attention: every bit of forward and backward is the same on 1 and 2 threads") {
  // One batch (the key tiles split into parts) and eight (a batch per task), causal.
  manual_seed(17);
  for (int64_t nb : {1, 8}) {
    CAPTURE(nb);
    Tensor q = randn({nb, 600, 32}), k = randn({nb, 600, 32}), v = randn({nb, 600, 32});
    Tensor g = randn({nb, 600, 32});
    Run one, two;
    with_threads(1, [&] { one = run(true, q, k, v, {}, true, 0, g); });
    with_threads(2, [&] { two = run(true, q, k, v, {}, true, 0, g); });
    CHECK(bitwise_equal(one.out, two.out));
    CHECK(bitwise_equal(one.dq, two.dq));
    CHECK(bitwise_equal(one.dk, two.dk));
    CHECK(bitwise_equal(one.dv, two.dv));
  }
}

TEST_CASE("attention: forward and backward at 4096 tokens hold O(L) memory, eager and compiled") {
  // One head of 64 at L = S = 4096: the composite holds the 4096 x 4096 scores and
  // probabilities (64 MiB each); the fused kernels hold their tiles, the result and dq's
  // partial sums.
  manual_seed(11);
  Tensor q = randn({1, 4096, 64}), k = randn({1, 4096, 64}), v = randn({1, 4096, 64});
  auto step = [](Tensor a, Tensor b, Tensor c) {
    a = a.detach().requires_grad_();
    b = b.detach().requires_grad_();
    c = c.detach().requires_grad_();
    Tensor y = scaled_dot_product_attention(a, b, c, {}, true);
    std::vector<Tensor> g = grad({y.sum()}, {a, b, c});
    return g[0].sum() + g[1].sum() + g[2].sum();
  };
  auto compiled = compile(step);
  compiled(q, k, v);  // traced and planned outside the measured call
  for (int face = 0; face < 2; ++face) {
    INFO(std::string(face ? "compiled" : "eager"));
    const int64_t before = cpu_memory_stats().current;
    reset_peak_memory();
    Tensor r = face ? compiled(q, k, v) : step(q, k, v);
    // A compiled call also holds its plan's buffers, which it keeps between calls.
    const int64_t held =
        cpu_memory_stats().peak - before + (face ? compiled.stats().buffer_bytes : 0);
    MESSAGE(std::string(face ? "compiled" : "eager")
            << ": " << held / 1024 << " KiB beyond the inputs");
    CHECK(held <= 24 << 20);
  }
}

}  // namespace duet::test
