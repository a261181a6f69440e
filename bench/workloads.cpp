// duet_bench workloads (BENCH.md), eager face. The compiled face joins with trace/.
#include <cstring>
#include <vector>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

namespace {

Result base(const char* w, const char* mode, const Config& c, const char* metric) {
  Result r;
  r.workload = w;
  r.mode = mode;
  r.metric = metric;
  r.threads = c.threads;
  return r;
}

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
  auto eager = time_reps(
      [&] { y = duet::tanh(x * 1.5 + 0.5) * duet::sigmoid(x) + duet::relu(x - 0.25); }, c.reps);
  report("eager", eager);
  out.push_back(single(base("W2", "eager", c, "peak_tensor_bytes"),
                       static_cast<double>(duet::cpu_memory_stats().peak)));

  std::vector<float> yf(n);
  const float* px = x.data_ptr<float>();
  auto fused = time_reps([&] { w2_floor_fused(px, yf.data(), n); }, c.reps);
  // The floor must compute the same function as duet.
  std::vector<float> dy = y.to_vector<float>();
  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::max(err, double(std::abs(dy[i] - yf[i])));
  if (err > 1e-5) std::fprintf(stderr, "W2: duet and the fused floor differ by %g\n", err);
  Result fr = base("W2", "floor", c, "ms");
  fr.variant = "fused_eigen";
  out.push_back(summarize(fr, fused, [](double s) { return s * 1e3; }));
  fr.metric = "gbps";
  out.push_back(summarize(fr, fused, [&](double s) { return bytes / s / 1e9; }));
  auto copy = time_reps([&] { w2_floor_memcpy(px, yf.data(), n); }, c.reps);
  Result mr = base("W2", "floor", c, "ms");
  mr.variant = "memcpy";
  out.push_back(summarize(mr, copy, [](double s) { return s * 1e3; }));
  mr.metric = "gbps";
  out.push_back(summarize(mr, copy, [&](double s) { return bytes / s / 1e9; }));
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
    auto run = [&](const char* mode, const char* variant, const std::function<void()>& f) {
      auto secs = time_reps(
          [&] {
            for (int i = 0; i < calls; ++i) f();
          },
          c.reps);
      Result r = base("W3", mode, c, "gflops");
      r.variant = variant;
      r.n = n;
      out.push_back(summarize(r, secs, gflops));
    };
    Tensor y;
    run("eager", "", [&] { y = duet::matmul(a, b); });
    std::vector<float> cbuf(n * n);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    run("floor", "onednn", [&] { sgemm_onednn(pa, pb, cbuf.data(), n); });
    run("floor", "openblas", [&] { sgemm_openblas(pa, pb, cbuf.data(), n); });
  }
}

}  // namespace bench
