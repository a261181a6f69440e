// duet_bench CUDA workloads, W7 of docs/benchmarks.md (built only with the CUDA backend), eager
// and compiled (fused NVRTC kernels, CUDA-graph replay) on cuda:0 against floors called directly
// on the same device:
//   W3cuda: matmul 64^3, 256^3, 1024^3 and 4096^3 f32 against cublasSgemm and cuBLASLt's
//           fastest algorithm, with TF32 off (variant "fp32") and with duet's TF32 switch on
//           against cuBLAS in TF32 math (variant "tf32");
//   W2cuda: W2's chain (n = 2^22) against a device-to-device cudaMemcpy of the same
//           bytes (one read of x, one write of y), in ms and GB/s, and against the chain fused
//           by hand in one CUDA kernel (bench/cuda_floors.cu): what its math costs at best;
//   W4cuda, W6cuda: the W4 and W6 training steps with parameters and batch on the GPU,
//           against their GEMM floor: the step's own products (same shapes and transposes) on
//           cuBLAS, back to back.
// Each figure is the median of the reps (with min and max), each rep timed with CUDA events
// around enough back-to-back calls to take tens of milliseconds, duet and its floor interleaved
// rep by rep. The events are recorded on the legacy default stream: duet's per-device streams
// are blocking streams, so the start event waits for duet's earlier work and the stop event for
// all the work the calls queued. Each workload also reports its ratio to the floor (metric
// "ratio_to_floor", duet's median over the floor's, for GFLOP/s and GB/s). Without a usable GPU
// the workloads print one line saying they were skipped.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <cstdio>
#include <vector>

#include "bench/bench.h"
#include "cuda/check.h"
#include "duet.h"

namespace bench {

using duet::Device;
using duet::Tensor;

// bench/cuda_floors.cu: W2's chain fused by hand, on stream s.
cudaError_t w2_hand_fused(const float* x, float* y, int64_t n, cudaStream_t s);

namespace {

const Device kCuda = Device::cuda(0);

// A CPU tensor of n uniform values in [-1, 1) (the CPU workloads' generator), moved to cuda:0.
Tensor random_cuda(int64_t n, uint32_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = (s >> 8) * (2.0 / 16777216.0) - 1.0;
  }
  return duet::tensor(v).to(kCuda);
}

// A pair of CUDA events, made once and destroyed with the timer.
struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  Events() {
    DUET_CUDA_CHECK(cudaEventCreate(&start));
    DUET_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// Times each body `reps` times, interleaved (A B A B ...) after `warmup` rounds, with events on
// the legacy default stream around `calls` calls of it. Returns seconds per call, per body.
std::vector<std::vector<double>> time_events(const std::vector<std::function<void()>>& bodies,
                                             int calls, int reps, int warmup = 2) {
  Events ev;
  for (int i = 0; i < warmup; ++i)
    for (const auto& b : bodies) b();
  duet::cuda::synchronize();
  DUET_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<double>> t(bodies.size());
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < bodies.size(); ++k) {
      DUET_CUDA_CHECK(cudaEventRecord(ev.start, 0));
      for (int i = 0; i < calls; ++i) bodies[k]();
      DUET_CUDA_CHECK(cudaEventRecord(ev.stop, 0));
      DUET_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float ms = 0;
      DUET_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
      t[k].push_back(ms * 1e-3 / calls);
    }
  return t;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The largest |a - b| / (1 + |b|) over two device results of n floats.
double max_rel_diff(const Tensor& a, const float* b_dev, int64_t n) {
  std::vector<float> hb(static_cast<size_t>(n));
  DUET_CUDA_CHECK(cudaDeviceSynchronize());
  DUET_CUDA_CHECK(cudaMemcpy(hb.data(), b_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  const std::vector<float> ha = a.to_vector<float>();
  double d = 0;
  for (size_t i = 0; i < hb.size(); ++i)
    d = std::max(d, std::abs(double(ha[i]) - hb[i]) / (1 + std::abs(double(hb[i]))));
  return d;
}

// A Result of the CUDA device, on the configured threads.
Result cuda_base(const char* w, const char* mode, const Config& c, const char* metric) {
  Result r = base(w, mode, c, metric);
  r.device = "cuda";
  return r;
}

// Times a compiled function's first call, NVRTC's compiles and the CUDA-graph capture included
// (the kernel cache is the one DUET_CACHE_DIR names: an empty folder measures a cold start), as
// the row "first_call_s"; returns the seconds.
double first_call_s(const char* w, const std::function<void()>& call, const Config& c,
                    std::vector<Result>& out) {
  duet::cuda::synchronize();
  const duet::cuda::CodegenStats before = duet::cuda::codegen_stats();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  duet::cuda::synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const duet::cuda::CodegenStats after = duet::cuda::codegen_stats();
  out.push_back(single(cuda_base(w, "compiled", c, "first_call_s"), s));
  std::fprintf(stderr,
               "%s: first compiled call %.3f s (NVRTC built %lld programs in %.0f ms, %lld from "
               "the disk cache)\n",
               w, s, (long long)(after.built - before.built), after.build_ms - before.build_ms,
               (long long)(after.disk_hits - before.disk_hits));
  return s;
}

// A cuBLAS handle on the legacy default stream, destroyed with it.
struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() {
    DUET_CUBLAS_CHECK(cublasCreate(&h));
    DUET_CUBLAS_CHECK(cublasSetStream(h, 0));
  }
  ~Cublas() { cublasDestroy(h); }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
};

// cuBLASLt's fastest algorithm for a row-major n x n x n f32 product C = A B (column-major
// C^T = B^T A^T), chosen by timing the heuristic's top candidates on these operands: the floor
// that duet's matmul, which calls cuBLAS itself, is measured against.
class LtBest {
 public:
  LtBest(int64_t n, bool tf32, const float* a, const float* b, float* c) : a_(a), b_(b), c_(c) {
    DUET_CUBLAS_CHECK(cublasLtCreate(&h_));
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DUET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F));
    for (cublasLtMatrixLayout_t* l : {&la_, &lb_, &lc_})
      DUET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, n, n, n));
    DUET_CUDA_CHECK(cudaMalloc(&ws_, kWorkspace));
    cublasLtMatmulPreference_t pref = nullptr;
    DUET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    DUET_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof kWorkspace));
    cublasLtMatmulHeuristicResult_t found[16];
    int count = 0;
    DUET_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(h_, op_, lb_, la_, lc_, lc_, pref, 16, found, &count));
    cublasLtMatmulPreferenceDestroy(pref);
    double best = 1e30;
    for (int i = 0; i < count; ++i) {
      algo_ = found[i].algo;
      if (call_status() != CUBLAS_STATUS_SUCCESS) continue;
      const double t = median_of(time_events({[&] { (*this)(); }}, 20, 3, 1)[0]);
      if (t < best) best = t, best_ = found[i].algo, candidates_ = i + 1;
    }
    if (best == 1e30) throw std::runtime_error("cuBLASLt found no algorithm");
    algo_ = best_;
  }
  ~LtBest() {
    cudaFree(ws_);
    for (cublasLtMatrixLayout_t l : {la_, lb_, lc_}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(op_);
    cublasLtDestroy(h_);
  }
  LtBest(const LtBest&) = delete;
  LtBest& operator=(const LtBest&) = delete;
  void operator()() { DUET_CUBLAS_CHECK(call_status()); }
  int tried() const { return candidates_; }

 private:
  cublasStatus_t call_status() {
    const float one = 1, zero = 0;
    return cublasLtMatmul(h_, op_, &one, b_, lb_, a_, la_, &zero, c_, lc_, c_, lc_, &algo_, ws_,
                          kWorkspace, 0);
  }
  static constexpr size_t kWorkspace = size_t(32) << 20;
  cublasLtHandle_t h_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{}, best_{};
  void* ws_ = nullptr;
  const float* a_;
  const float* b_;
  float* c_;
  int candidates_ = 0;
};

// W3cuda: C = A B, row-major n x n f32 on cuda:0 for n = 64, 256, 1024 (and 4096), duet eager
// (dispatch included) and compiled, against cublasSgemm and cuBLASLt's fastest algorithm on the
// same A and B; with TF32 off (variant "fp32") and with duet's TF32 switch on against cuBLAS in
// TF32 math (variant "tf32"). The ratio is to the faster of the two floors.
void run_w3cuda(const Config& c, std::vector<Result>& out) {
  Cublas blas;
  const bool tf32_before = duet::cuda::allow_tf32();
  for (int64_t n : {64, 256, 1024, 4096}) {
    const Tensor a = duet::reshape(random_cuda(n * n, 4), {n, n});
    const Tensor b = duet::reshape(random_cuda(n * n, 5), {n, n});
    const Tensor floor_out = duet::zeros({n, n}).to(kCuda);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* pc = floor_out.data_ptr<float>();
    const int dim = static_cast<int>(n);
    const double flop = 2.0 * n * n * n;
    // About 4 TFLOP per rep for the large sizes, and at most 2000 calls for the small ones.
    const int calls = std::clamp(static_cast<int>(4e12 / flop), 3, 2000);
    for (bool tf32 : {false, true}) {
      const char* variant = tf32 ? "tf32" : "fp32";
      duet::cuda::set_allow_tf32(tf32);
      DUET_CUBLAS_CHECK(
          cublasSetMathMode(blas.h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      LtBest lt(n, tf32, pa, pb, pc);
      Tensor y, yc;
      auto compiled = duet::compile([](Tensor p, Tensor q) { return duet::matmul(p, q); });
      const float one = 1, zero = 0;
      auto sgemm = [&] {
        DUET_CUBLAS_CHECK(cublasSgemm(blas.h, CUBLAS_OP_N, CUBLAS_OP_N, dim, dim, dim, &one, pb,
                                      dim, pa, dim, &zero, pc, dim));
      };
      const auto t = time_events(
          {[&] { y = duet::matmul(a, b); }, sgemm, [&] { yc = compiled(a, b); }, [&] { lt(); }},
          calls, c.reps);
      auto gflops = [&](double s) { return flop / s / 1e9; };
      Result r = cuda_base("W3cuda", "eager", c, "gflops");
      r.variant = variant;
      r.n = n;
      out.push_back(summarize(r, t[0], gflops));
      Result rc = r;
      rc.mode = "compiled";
      out.push_back(summarize(rc, t[2], gflops));
      Result f = r;
      f.mode = "floor";
      f.variant = std::string("cublas_") + variant;
      out.push_back(summarize(f, t[1], gflops));
      f.variant = std::string("cublaslt_best_") + variant;
      out.push_back(summarize(f, t[3], gflops));
      const double floor_s = std::min(median_of(t[1]), median_of(t[3]));
      const double ratio = floor_s / median_of(t[0]);  // GFLOP/s over the floor's
      Result q = r;
      q.metric = "ratio_to_floor";
      out.push_back(single(q, ratio));
      q.mode = "compiled";
      out.push_back(single(q, floor_s / median_of(t[2])));
      // The floor must compute what duet computes (TF32 rounds the inputs to 10 bits).
      sgemm();
      const double err = max_rel_diff(y, pc, n * n);
      std::fprintf(stderr,
                   "W3cuda n=%lld %s: duet eager %.1f GFLOP/s, compiled %.1f; cublasSgemm %.1f, "
                   "cuBLASLt best of %d %.1f: eager %.3fx and compiled %.3fx of the faster floor "
                   "(max relative difference %.2g)\n",
                   (long long)n, variant, gflops(median_of(t[0])), gflops(median_of(t[2])),
                   gflops(median_of(t[1])), lt.tried(), gflops(median_of(t[3])), ratio,
                   floor_s / median_of(t[2]), err);
      if (err > (tf32 ? 2e-2 : 1e-4))
        std::fprintf(stderr, "W3cuda n=%lld %s: warning: duet and cuBLAS differ by %g\n",
                     (long long)n, variant, err);
    }
  }
  duet::cuda::set_allow_tf32(tf32_before);
}

// W2cuda: y = tanh(x*1.5 + 0.5) * sigmoid(x) + relu(x - 0.25), n = 2^22, eager on cuda:0,
// against a device-to-device copy of n floats (the bytes W2 counts: one read, one write).
void run_w2cuda(const Config& c, std::vector<Result>& out) {
  constexpr int64_t n = int64_t(1) << 22;
  const double bytes = 2.0 * n * sizeof(float);
  const Tensor x = random_cuda(n, 3);
  const Tensor copy_out = duet::zeros({n}).to(kCuda);
  const float* px = x.data_ptr<float>();
  float* pc = copy_out.data_ptr<float>();
  auto w2 = [](const Tensor& v) {
    return duet::tanh(v * 1.5 + 0.5) * duet::sigmoid(v) + duet::relu(v - 0.25);
  };
  auto compiled = duet::compile([&w2](Tensor v) { return w2(v); });
  Tensor y, yc;
  auto memcpy_d2d = [&] {
    DUET_CUDA_CHECK(cudaMemcpyAsync(pc, px, n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
  };
  auto hand_fused = [&] { DUET_CUDA_CHECK(w2_hand_fused(px, pc, n, 0)); };
  first_call_s(
      "W2cuda", [&] { yc = compiled(x); }, c, out);
  duet::cuda::reset_peak_memory_stats(0);
  const int calls = 200;  // a rep moves about 13 GB (W2's count)
  const auto t = time_events(
      {[&] { y = w2(x); }, memcpy_d2d, [&] { yc = compiled(x); }, hand_fused}, calls, c.reps);
  const double peak = static_cast<double>(duet::cuda::memory_stats(0).peak);
  auto ms = [](double s) { return s * 1e3; };
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  out.push_back(summarize(cuda_base("W2cuda", "eager", c, "ms"), t[0], ms));
  out.push_back(summarize(cuda_base("W2cuda", "eager", c, "gbps"), t[0], gbps));
  out.push_back(summarize(cuda_base("W2cuda", "compiled", c, "ms"), t[2], ms));
  out.push_back(summarize(cuda_base("W2cuda", "compiled", c, "gbps"), t[2], gbps));
  out.push_back(single(cuda_base("W2cuda", "eager", c, "peak_tensor_bytes"), peak));
  const double ratio = median_of(t[1]) / median_of(t[0]);  // GB/s over the copy's
  out.push_back(single(cuda_base("W2cuda", "eager", c, "ratio_to_floor"), ratio));
  const double ratio_c = median_of(t[1]) / median_of(t[2]);
  out.push_back(single(cuda_base("W2cuda", "compiled", c, "ratio_to_floor"), ratio_c));
  const double ratio_h = median_of(t[3]) / median_of(t[2]);  // compiled over the hand-fused kernel
  out.push_back(single(cuda_base("W2cuda", "compiled", c, "ratio_to_hand_fused"), ratio_h));
  out.push_back(single(cuda_base("W2cuda", "hand_fused", c, "ratio_to_floor"),
                       median_of(t[1]) / median_of(t[3])));
  compiled_figures("W2cuda", "", c, compiled.stats(), out);
  for (const char* metric : {"ms", "gbps"}) {
    Result f = cuda_base("W2cuda", "floor", c, metric);
    f.variant = "memcpy_d2d";
    out.push_back(summarize(f, t[1],
                            metric[0] == 'm' ? std::function<double(double)>(ms)
                                             : std::function<double(double)>(gbps)));
    Result h = cuda_base("W2cuda", "hand_fused", c, metric);
    out.push_back(summarize(h, t[3],
                            metric[0] == 'm' ? std::function<double(double)>(ms)
                                             : std::function<double(double)>(gbps)));
  }
  // duet on the GPU must compute what it computes on the CPU.
  const std::vector<float> got = y.to_vector<float>(),
                           want = w2(x.to(Device::cpu())).to_vector<float>();
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::abs(got[i] - want[i])));
  double err_c = 0;
  const std::vector<float> got_c = yc.to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i)
    err_c = std::max(err_c, double(std::abs(got_c[i] - want[i])));
  std::fprintf(stderr,
               "W2cuda: duet eager %.3f ms, %.0f GB/s, compiled %.3f ms, %.0f GB/s; device copy "
               "%.0f GB/s, hand-fused kernel %.3f ms, %.0f GB/s: eager %.3fx and compiled %.3fx "
               "of the copy bandwidth, compiled %.3fx of the hand-fused kernel (max difference "
               "to the CPU %.2g eager, %.2g compiled; %lld fused kernels, %lld CUDA-graph plans)\n",
               ms(median_of(t[0])), gbps(median_of(t[0])), ms(median_of(t[2])),
               gbps(median_of(t[2])), gbps(median_of(t[1])), ms(median_of(t[3])),
               gbps(median_of(t[3])), ratio, ratio_c, ratio_h, err, err_c,
               (long long)compiled.stats().fused_kernels,
               (long long)compiled.stats().cuda_graph_plans);
  if (std::max(err, err_c) > 1e-5)
    std::fprintf(stderr, "W2cuda: warning: CUDA and CPU results differ by %g\n",
                 std::max(err, err_c));
}

// The products of one training step of an MLP with weights (in, out), row-major, on cuBLAS:
// forward Y = X W, backward dX = dY W^T (every layer but the first) and dW = X^T dY; as
// GemmFloor in models.cpp does on oneDNN. Row-major C = A B is column-major C^T = B^T A^T.
class CudaGemmFloor {
 public:
  CudaGemmFloor(const std::vector<int64_t>& sizes, int64_t batch) : sizes_(sizes), batch_(batch) {
    size_t total = 0;
    for (size_t l = 0; l + 1 < sizes.size(); ++l)
      total += size_t(batch * sizes[l] + sizes[l] * sizes[l + 1] + batch * sizes[l + 1]) * 3;
    buf_ = random_cuda(static_cast<int64_t>(total), 17);
  }
  void operator()() {
    float* p = buf_.data_ptr<float>();
    const float one = 1, zero = 0;
    for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
      const int in = static_cast<int>(sizes_[l]), out = static_cast<int>(sizes_[l + 1]);
      const int b = static_cast<int>(batch_);
      float* x = p;
      float* w = x + size_t(b) * in;
      float* y = w + size_t(in) * out;
      float* dy = y + size_t(b) * out;
      float* dx = dy + size_t(b) * out;
      float* dw = dx + size_t(b) * in;
      // Y = X W
      DUET_CUBLAS_CHECK(cublasSgemm(blas_.h, CUBLAS_OP_N, CUBLAS_OP_N, out, b, in, &one, w, out, x,
                                    in, &zero, y, out));
      // dX = dY W^T
      if (l > 0)
        DUET_CUBLAS_CHECK(cublasSgemm(blas_.h, CUBLAS_OP_T, CUBLAS_OP_N, in, b, out, &one, w, out,
                                      dy, out, &zero, dx, in));
      // dW = X^T dY
      DUET_CUBLAS_CHECK(cublasSgemm(blas_.h, CUBLAS_OP_N, CUBLAS_OP_T, out, in, b, &one, dy, out, x,
                                    in, &zero, dw, out));
      p = dw + size_t(in) * out;
    }
  }

 private:
  std::vector<int64_t> sizes_;
  int64_t batch_;
  Tensor buf_;
  Cublas blas_;
};

// W4cuda and W6cuda: the training step eager and compiled on cuda:0, against its GEMM floor.
void run_training_cuda(const char* w, const char* metric, double unit, int calls, const Config& c,
                       std::vector<Result>& out) {
  const std::string name = std::string(w) + "cuda";
  DeviceTraining t = device_training(w, kCuda);
  CudaGemmFloor floor(t.sizes, t.batch);
  const double first = first_call_s(
      name.c_str(), [&] { t.compiled(); }, c, out);
  const auto tm =
      time_events({[&] { t.eager(); }, [&] { t.compiled(); }, [&] { floor(); }}, calls, c.reps, 3);
  const char* modes[] = {"eager", "compiled", "floor"};
  auto per_step = [&](double s) { return s * unit; };
  for (int k = 0; k < 3; ++k) {
    Result r = cuda_base(name.c_str(), modes[k], c, metric);
    if (k == 2) r.variant = "cublas_gemms";
    out.push_back(summarize(r, tm[k], per_step));
  }
  const duet::CompileStats s = t.stats();
  compiled_figures(name.c_str(), "", c, s, out);
  const double e = median_of(tm[0]) * unit, p = median_of(tm[1]) * unit,
               f = median_of(tm[2]) * unit;
  std::fprintf(stderr,
               "%s: eager %.1f, compiled %.1f, GEMM floor %.1f %s per step: compiled %.2fx faster "
               "than eager, %.2fx the floor; first call %.2f s (%lld traces, %lld fused kernels, "
               "%lld CUDA-graph plans replayed %lld times; captures failed: %lld %s)\n",
               name.c_str(), e, p, f, metric, e / p, p / f, first, (long long)s.traces,
               (long long)s.fused_kernels, (long long)s.cuda_graph_plans,
               (long long)s.cuda_graph_replays, (long long)duet::cuda_graph_stats().failed,
               duet::cuda_graph_stats().last_failure.c_str());
}

}  // namespace

void run_cuda(const Config& c, const std::function<bool(const char*)>& want,
              std::vector<Result>& out) {
  if (!duet::cuda::is_available()) {
    std::fprintf(stderr, "W7 (CUDA workloads): skipped (no usable CUDA GPU)\n");
    return;
  }
  if (want("W3cuda")) run_w3cuda(c, out);
  if (want("W2cuda")) run_w2cuda(c, out);
  if (want("W4cuda")) run_training_cuda("W4", "ms_per_step", 1e3, 20, c, out);
  if (want("W6cuda")) run_training_cuda("W6", "us_per_step", 1e6, 200, c, out);
}

}  // namespace bench
