// duet_bench workloads (BENCH.md), eager face. The compiled face joins with trace/.
#include <cstring>
#include <vector>

#include "bench/bench.h"
#include "duet.h"

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

}  // namespace

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

// W2: y = tanh(x*1.5 + 0.5) * sigmoid(x) + relu(x - 0.25), n = 2^22.
void run_w2(const Config& c, std::vector<Result>& out) {
  constexpr int64_t n = int64_t(1) << 22;
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
  // The floors run in their own loops, after eager: x stays warm in the 32 MB L3 for them,
  // which makes them the stronger (stricter) floors; interleaving would flush it.
  std::vector<std::vector<double>> t(3);
  t[0] = time_reps([&] { y = duet::tanh(x * 1.5 + 0.5) * duet::sigmoid(x) + duet::relu(x - 0.25); },
                   c.reps);
  t[1] = time_reps([&] { w2_floor_fused(px, yf.data(), n); }, c.reps);
  t[2] = time_reps([&] { w2_floor_memcpy(px, yc.data(), n); }, c.reps);
  report("eager", t[0]);
  out.push_back(single(base("W2", "eager", c, "peak_tensor_bytes"),
                       static_cast<double>(duet::cpu_memory_stats().peak)));
  // The floor must compute the same function as duet.
  std::vector<float> dy = y.to_vector<float>();
  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::max(err, double(std::abs(dy[i] - yf[i])));
  if (err > 1e-5) std::fprintf(stderr, "W2: duet and the fused floor differ by %g\n", err);
  for (int k : {1, 2}) {
    Result fr = base("W2", "floor", c, "ms");
    fr.variant = k == 1 ? "fused_eigen" : "memcpy";
    out.push_back(summarize(fr, t[k], [](double s) { return s * 1e3; }));
    fr.metric = "gbps";
    out.push_back(summarize(fr, t[k], [&](double s) { return bytes / s / 1e9; }));
  }
}

// W3: matmul at 1024^3, 256^3, 64^3 against oneDNN and OpenBLAS called directly.
void run_w3(const Config& c, std::vector<Result>& out) {
  for (int64_t n : {1024, 256, 64}) {
    Tensor a = duet::reshape(random_f32(n * n, 4), {n, n});
    Tensor b = duet::reshape(random_f32(n * n, 5), {n, n});
    // Enough calls per rep that each rep takes about 20 ms or more.
    const double flop = 2.0 * n * n * n;
    const int calls = std::max<int>(1, static_cast<int>(4e9 / flop));
    auto gflops = [&](double s) { return flop * calls / s / 1e9; };
    Tensor y;
    std::vector<float> c1(n * n), c2(n * n);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    auto repeat = [&](std::function<void()> f) {
      return [f, calls] {
        for (int i = 0; i < calls; ++i) f();
      };
    };
    auto t = time_interleaved({repeat([&] { y = duet::matmul(a, b); }),
                               repeat([&] { sgemm_onednn(pa, pb, c1.data(), n); }),
                               repeat([&] { sgemm_openblas(pa, pb, c2.data(), n); })},
                              c.reps);
    const char* modes[] = {"eager", "floor", "floor"};
    const char* variants[] = {"", "onednn", "openblas"};
    for (int k = 0; k < 3; ++k) {
      Result r = base("W3", modes[k], c, "gflops");
      r.variant = variants[k];
      r.n = n;
      out.push_back(summarize(r, t[k], gflops));
    }
  }
}

// C1: conv2d forward + backward (grad of input and weight) through duet's im2col + GEMM.
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
      sgemm_onednn_mnk('N', 'N', co, l, ckk, wa.data(), cols.data(), y.data());  // forward
      sgemm_onednn_mnk('N', 'T', co, ckk, l, y.data(), cols.data(), gw.data());  // grad weight
      sgemm_onednn_mnk('T', 'N', ckk, l, co, wa.data(), y.data(), gc.data());    // grad columns
    }
  };
  auto t = time_interleaved({step, gemms}, c.reps);
  Result r = base("C1", "eager", c, "gflops");
  r.variant = "conv2d_fwd_bwd";
  out.push_back(summarize(r, t[0], [&](double s) { return flop / s / 1e9; }));
  r.mode = "floor";
  r.variant = "onednn_gemms";
  out.push_back(summarize(r, t[1], [&](double s) { return flop / s / 1e9; }));
}

}  // namespace bench
