// duet_bench workloads W1, W2, W3 (docs/benchmarks.md) and C1: eager, and compiled for W2 and W3.
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "bench/bench.h"
#include "duet.h"
#include "trace/plan/codegen.h"

namespace bench {

using duet::Tensor;

namespace {

Tensor random_f32(int64_t n, uint32_t seed) {
  std::vector<double> v(n);
  uint32_t s = seed;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = (s >> 8) * (2.0 / 16777216.0) - 1.0;  // uniform in [-1, 1)
  }
  return duet::tensor(v);
}

/// W2's expression, the same for eager and compiled.
Tensor w2_expr(const Tensor& x) {
  return duet::tanh(x * 1.5 + 0.5) * duet::sigmoid(x) + duet::relu(x - 0.25);
}

constexpr int64_t kW2N = int64_t(1) << 22;

// f called `calls` times, as one timed body.
std::function<void()> repeated(int calls, std::function<void()> f) {
  return [f = std::move(f), calls] {
    for (int i = 0; i < calls; ++i) f();
  };
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

}  // namespace

int warmup_calls() { return std::max(3, duet::codegen::threshold() + 1); }

double wait_codegen(const std::string& what) {
  auto a = std::chrono::steady_clock::now();
  duet::codegen::wait_idle();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
  if (!what.empty()) {
    const duet::codegen::CodegenStats s = duet::codegen::stats();
    std::fprintf(stderr,
                 "%s compiled: waited %.1f ms for background codegen before timing (process so "
                 "far: %lld kernels built in %.0f ms, %lld cache hits, %lld loaded, %lld failed)\n",
                 what.c_str(), ms, (long long)s.built, s.build_ms, (long long)s.cache_hits,
                 (long long)s.loaded, (long long)s.failed);
  }
  return ms;
}

// W1: dispatch overhead, 100,000 x c = a + b on 8-element tensors.
void run_w1(const Config& c, std::vector<Result>& out) {
  constexpr int kOps = 100000;
  Tensor a = random_f32(8, 1), b = random_f32(8, 2);
  Tensor r;
  auto secs = time_reps(
      [&] {
        for (int i = 0; i < kOps; ++i) r = a + b;
      },
      c.reps);
  Result res = base("W1", "eager", c, "ns_per_op");
  res.variant = "no_grad";
  out.push_back(summarize(res, secs, [](double s) { return s / kOps * 1e9; }));

  // (b) a and b require grad: every op records a tape node.
  Tensor ga = random_f32(8, 1).requires_grad_(), gb = random_f32(8, 2).requires_grad_();
  auto tape = time_reps(
      [&] {
        for (int i = 0; i < kOps; ++i) r = ga + gb;
      },
      c.reps);
  res.variant = "tape";
  out.push_back(summarize(res, tape, [](double s) { return s / kOps * 1e9; }));
}

// W2: y = tanh(x*1.5 + 0.5) * sigmoid(x) + relu(x - 0.25), n = 2^22, eager and compiled.
void run_w2(const Config& c, std::vector<Result>& out) {
  constexpr int64_t n = kW2N;
  const double bytes = 2.0 * n * sizeof(float);  // one read of x, one write of y
  Tensor x = random_f32(n, 3);
  auto report = [&](const char* mode, const std::vector<double>& secs) {
    out.push_back(summarize(base("W2", mode, c, "ms"), secs, [](double s) { return s * 1e3; }));
    out.push_back(
        summarize(base("W2", mode, c, "gbps"), secs, [&](double s) { return bytes / s / 1e9; }));
  };
  duet::reset_peak_memory();
  Tensor y;
  std::vector<float> yf(n), yc(n);
  const float* px = x.data_ptr<float>();
  // Each mode runs in its own loop, and the floors after eager and compiled: x stays warm in the
  // 32 MB L3 for them, which makes them the stronger (stricter) floors; interleaving would
  // flush it.
  std::vector<std::vector<double>> t(5);
  t[0] = time_reps([&] { y = w2_expr(x); }, c.reps);
  const double peak_eager = static_cast<double>(duet::cpu_memory_stats().peak);
  std::vector<float> ye = y.to_vector<float>();
  // Compiled: warmed up, and the codegen tier's background build of the fused kernel waited
  // for, so that the steady state is timed. y keeps eager's result, as it keeps the previous
  // call's in eager's loop, so the two high-water marks count the same.
  auto f = duet::compile([](Tensor xs) { return w2_expr(xs); });
  for (int i = 0; i < warmup_calls(); ++i) y = f(x);
  wait_codegen("W2");
  duet::reset_peak_memory();
  t[1] = time_reps([&] { y = f(x); }, c.reps);
  const double peak_compiled = static_cast<double>(duet::cpu_memory_stats().peak);
  std::vector<float> yco = y.to_vector<float>();
  t[2] = time_reps([&] { w2_floor_fused(px, yf.data(), n, false); }, c.reps);
  t[3] = time_reps([&] { w2_floor_memcpy(px, yc.data(), n); }, c.reps);
  t[4] = time_reps([&] { w2_floor_fused(px, yc.data(), n, true); }, c.reps);
  report("eager", t[0]);
  out.push_back(single(base("W2", "eager", c, "peak_tensor_bytes"), peak_eager));
  report("compiled", t[1]);
  out.push_back(single(base("W2", "compiled", c, "peak_tensor_bytes"), peak_compiled));
  compiled_figures("W2", "", c, f.stats(), out);
  print_compiled("W2", "", f.stats(), peak_compiled, peak_eager);
  // The floor must compute the same function as duet, eager and compiled.
  const double err = max_abs_diff(ye, yf), errc = max_abs_diff(yco, yf);
  if (err > 1e-5 || errc > 1e-5)
    std::fprintf(stderr, "W2: duet (eager %g, compiled %g) and the fused floor differ\n", err,
                 errc);
  for (int k : {2, 3, 4}) {
    Result fr = base("W2", "floor", c, "ms");
    fr.variant = k == 2 ? "fused_eigen" : k == 3 ? "memcpy" : "fused_eigen_logistic";
    out.push_back(summarize(fr, t[k], [](double s) { return s * 1e3; }));
    fr.metric = "gbps";
    out.push_back(summarize(fr, t[k], [&](double s) { return bytes / s / 1e9; }));
  }
}

// W2 for --ablate: y = f(x) into one output tensor, checked against eager within 1e-5.
Ablatable w2_ablatable() {
  struct State {
    Tensor x = random_f32(kW2N, 3), y;
    std::vector<float> want;
  };
  auto s = std::make_shared<State>();
  s->want = w2_expr(s->x).to_vector<float>();
  Ablatable a;
  a.workload = "W2";
  a.metric = "ms";
  a.unit = 1e3;
  a.eager = [s] { s->y = w2_expr(s->x); };
  a.compile = [s](const duet::CompileOptions& o) {
    auto f = duet::compile([](Tensor xs) { return w2_expr(xs); }, o);
    for (int i = 0; i < warmup_calls(); ++i) s->y = f(s->x);
    wait_codegen();
    s->y = f(s->x);
    const double err = max_abs_diff(s->y.to_vector<float>(), s->want);
    if (err > 1e-5) std::fprintf(stderr, "W2: warning: compiled and eager differ by %g\n", err);
    return CompiledCall{[s, f]() mutable { s->y = f(s->x); },
                        [f]() -> duet::CompileStats { return f.stats(); }};
  };
  return a;
}

// W3's linear rows: nn::Linear(1024, 1024) forward (no grad) on a batch of 16 and of 64 rows, x
// W^T + b, eager and compiled, against the same product and a plain loop adding the bias on
// oneDNN called directly, both ways it has: its sgemm reading W transposed, and its matmul
// primitive (Note [Products read transposed] in kernels/matmul.cpp). The target is the faster.
void w3_linear(const Config& c, std::vector<Result>& out) {
  constexpr int64_t kWidth = 1024;
  for (int64_t rows : {16, 64}) {
    duet::manual_seed(7);
    duet::nn::Linear lin(kWidth, kWidth);
    const Tensor x = duet::randn({rows, kWidth});
    const double flop = 2.0 * rows * kWidth * kWidth;
    const int calls = std::max<int>(1, static_cast<int>(2e9 / flop));
    auto gflops = [&](double s) { return flop * calls / s / 1e9; };
    duet::NoGradGuard no_grad;
    auto f = duet::compile([&](Tensor xs) { return lin(xs); });
    Tensor y;
    std::vector<float> yf(static_cast<size_t>(rows * kWidth));
    const float *px = x.data_ptr<float>(), *pw = lin.weight.data_ptr<float>(),
                *pb = lin.bias.data_ptr<float>();
    auto add_bias = [&] {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < kWidth; ++j) yf[i * kWidth + j] += pb[j];
    };
    auto repeat = [calls](std::function<void()> g) { return repeated(calls, std::move(g)); };
    auto t = time_interleaved(
        {repeat([&] { y = lin(x); }), repeat([&] { y = f(x); }), repeat([&] {
           sgemm_onednn_mnk('N', 'T', rows, kWidth, kWidth, px, pw, yf.data());
           add_bias();
         }),
         repeat([&] {
           matmul_onednn_f32_mnk('N', 'T', rows, kWidth, kWidth, px, pw, yf.data());
           add_bias();
         })},
        c.reps);
    const char* modes[] = {"eager", "compiled", "floor", "floor"};
    const char* floors[] = {"", "", " onednn_sgemm", " onednn_matmul"};
    for (int k = 0; k < 4; ++k) {
      Result r = base("W3", modes[k], c, "gflops");
      r.variant = fmt::format("linear batch {}{}", rows, floors[k]);
      r.n = kWidth;
      out.push_back(summarize(r, t[k], gflops));
    }
  }
}

// W3: matmul at 1024^3, 256^3, 64^3 against oneDNN and OpenBLAS called directly. The compiled
// row is a compiled function of one matmul: the same kernel behind a plan replay.
void run_w3(const Config& c, std::vector<Result>& out) {
  w3_linear(c, out);
  for (int64_t n : {1024, 256, 64}) {
    Tensor a = duet::reshape(random_f32(n * n, 4), {n, n});
    Tensor b = duet::reshape(random_f32(n * n, 5), {n, n});
    // Enough calls per rep that each rep takes about 20 ms or more.
    const double flop = 2.0 * n * n * n;
    const int calls = std::max<int>(1, static_cast<int>(4e9 / flop));
    auto gflops = [&](double s) { return flop * calls / s / 1e9; };
    Tensor y;
    auto mm = duet::compile([](Tensor p, Tensor q) { return duet::matmul(p, q); });
    std::vector<float> c1(n * n), c2(n * n);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    auto repeat = [calls](std::function<void()> g) { return repeated(calls, std::move(g)); };
    auto t =
        time_interleaved({repeat([&] { y = duet::matmul(a, b); }), repeat([&] { y = mm(a, b); }),
                          repeat([&] { sgemm_onednn(pa, pb, c1.data(), n); }),
                          repeat([&] { sgemm_openblas(pa, pb, c2.data(), n); })},
                         c.reps);
    const char* modes[] = {"eager", "compiled", "floor", "floor"};
    const char* variants[] = {"", "", "onednn", "openblas"};
    for (int k = 0; k < 4; ++k) {
      Result r = base("W3", modes[k], c, "gflops");
      r.variant = variants[k];
      r.n = n;
      out.push_back(summarize(r, t[k], gflops));
    }
    // bf16: the same product on bf16 operands, against oneDNN called directly, its faster way
    // on this CPU (its bf16 primitive, or sgemm on f32 copies where it emulates bf16).
    const duet::DType bf16 = duet::DType::bf16;
    Tensor ab = a.to(bf16), bb = b.to(bf16), cb = duet::zeros({n, n}, duet::Options().dtype(bf16));
    auto tb = time_interleaved(
        {repeat([&] { y = duet::matmul(ab, bb); }), repeat([&] { y = mm(ab, bb); }), repeat([&] {
           matmul_onednn_bf16_mnk('N', 'N', n, n, n, ab.raw_data(), bb.raw_data(), cb.raw_data());
         })},
        c.reps);
    for (int k = 0; k < 3; ++k) {
      Result r = base("W3", modes[k], c, "gflops");
      r.variant = k == 2 ? "bf16 onednn" : "bf16";
      r.n = n;
      out.push_back(summarize(r, tb[k], gflops));
    }
  }
}

// C1: conv2d forward + backward (grad of input and weight): duet::conv2d, whose Conv2d primitive
// and gradients run oneDNN's convolutions on CPU f32 (kernels/conv.cpp). The floor is the
// im2col GEMMs alone, on columns built beforehand.
void run_c1(const Config& c, std::vector<Result>& out) {
  const int64_t n = 32, ci = 16, h = 28, co = 32, k = 3;
  const int64_t ckk = ci * k * k, l = h * h;       // padding 1 keeps 28 x 28
  const double flop = 3 * 2.0 * n * co * ckk * l;  // forward, grad input, grad weight
  Tensor x = duet::reshape(random_f32(n * ci * h * h, 6), {n, ci, h, h}).requires_grad_();
  Tensor w = duet::reshape(random_f32(co * ckk, 7), {co, ci, k, k}).requires_grad_();
  Tensor g = duet::reshape(random_f32(n * co * l, 8), {n, co, h, h});
  auto step = [&] {
    Tensor y = duet::conv2d(x, w, {}, 1, 1);
    y.backward(g);
  };
  // Floor: the step's three GEMM shapes per image, on oneDNN directly.
  std::vector<float> wa(co * ckk), cols(ckk * l), y(co * l), gw(co * ckk), gc(ckk * l);
  auto gemms = [&] {
    for (int64_t i = 0; i < n; ++i) {
      sgemm_floor_mnk('N', 'N', co, l, ckk, wa.data(), cols.data(), y.data());  // forward
      sgemm_floor_mnk('N', 'T', co, ckk, l, y.data(), cols.data(), gw.data());  // grad weight
      sgemm_floor_mnk('T', 'N', ckk, l, co, wa.data(), y.data(), gc.data());    // grad columns
    }
  };
  // bf16: the same step on bf16 x, w and g (oneDNN's bf16 convolutions, f32 accumulation),
  // against the same GEMMs on bf16 operands.
  const duet::DType bf16 = duet::DType::bf16;
  Tensor xb = x.detach().to(bf16).requires_grad_(), wb = w.detach().to(bf16).requires_grad_();
  Tensor gb = g.to(bf16);
  auto step_bf16 = [&] {
    Tensor y = duet::conv2d(xb, wb, {}, 1, 1);
    y.backward(gb);
  };
  auto low = [&](int64_t n) { return duet::zeros({n}, duet::Options().dtype(bf16)); };
  Tensor wab = low(co * ckk), colsb = low(ckk * l), yb = low(co * l), gwb = low(co * ckk),
         gcb = low(ckk * l);
  auto gemms_bf16 = [&] {
    for (int64_t i = 0; i < n; ++i) {
      matmul_onednn_bf16_mnk('N', 'N', co, l, ckk, wab.raw_data(), colsb.raw_data(), yb.raw_data());
      matmul_onednn_bf16_mnk('N', 'T', co, ckk, l, yb.raw_data(), colsb.raw_data(), gwb.raw_data());
      matmul_onednn_bf16_mnk('T', 'N', ckk, l, co, wab.raw_data(), yb.raw_data(), gcb.raw_data());
    }
  };
  auto t = time_interleaved({step, gemms, step_bf16, gemms_bf16}, c.reps);
  const char* modes[] = {"eager", "floor", "eager", "floor"};
  const char* variants[] = {"conv2d_fwd_bwd", "onednn_gemms", "conv2d_fwd_bwd bf16",
                            "onednn_gemms bf16"};
  for (int k = 0; k < 4; ++k) {
    Result r = base("C1", modes[k], c, "gflops");
    r.variant = variants[k];
    out.push_back(summarize(r, t[k], [&](double s) { return flop / s / 1e9; }));
  }
}

}  // namespace bench
