// duet_bench: shared pieces of the benchmark program.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"

namespace duet {
struct CompileOptions;
struct CompileStats;
class Tensor;
}  // namespace duet

namespace bench {

/// One figure: a median over repetitions, with min and max.
struct Result {
  std::string workload, mode, device = "cpu", metric, variant;
  int threads = 1;
  int64_t n = 0;  ///< W3 matrix size
  double median = 0, min = 0, max = 0;
};

struct Config {
  int threads = 2;
  int reps = 7;
  std::string device = "cpu";
};

/// Times `body` `reps` times after `warmup` calls; returns seconds per call of each rep.
inline std::vector<double> time_reps(const std::function<void()>& body, int reps, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto a = std::chrono::steady_clock::now();
    body();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  return t;
}

/// Times several bodies rep by rep, interleaved (A B C A B C ...), so that a workload and its
/// floors see the same machine conditions on a shared, noisy host. Returns seconds per call
/// of each rep, per body.
/// `settle`: untimed calls of a body right before each of its timed ones. Steps that make and
/// free a few hundred thousand small objects leave malloc work behind (freed chunks that glibc
/// coalesces at a later allocation), which the next step pays; settling makes each timed step
/// pay its own mode's, as in a run of that mode alone.
inline std::vector<std::vector<double>> time_interleaved(
    const std::vector<std::function<void()>>& bodies, int reps, int warmup = 2, int settle = 0) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& b : bodies) b();
  std::vector<std::vector<double>> t(bodies.size());
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < bodies.size(); ++k) {
      for (int i = 0; i < settle; ++i) bodies[k]();
      auto a = std::chrono::steady_clock::now();
      bodies[k]();
      auto e = std::chrono::steady_clock::now();
      t[k].push_back(std::chrono::duration<double>(e - a).count());
    }
  return t;
}

/// A Result whose figures are f(seconds) for each rep (f maps time to the metric).
inline Result summarize(Result r, const std::vector<double>& secs,
                        const std::function<double(double)>& f) {
  std::vector<double> v;
  for (double s : secs) v.push_back(f(s));
  std::sort(v.begin(), v.end());
  r.median = v[v.size() / 2];
  r.min = v.front();
  r.max = v.back();
  return r;
}

/// An empty figure of a workload, mode and metric on the configured threads.
inline Result base(const char* w, const char* mode, const Config& c, const char* metric) {
  Result r;
  r.workload = w;
  r.mode = mode;
  r.metric = metric;
  r.threads = c.threads;
  return r;
}

/// A single measured value (memory, node counts).
inline Result single(Result r, double value) {
  r.median = r.min = r.max = value;
  return r;
}

/// Process peak resident set size in bytes.
double peak_rss_bytes();

/// Calls that bring a compiled function to its steady state: past the codegen tier's threshold,
/// so that its hot fused kernels are queued for a build.
int warmup_calls();
/// Blocks until the codegen tier's background builds are done (duet::codegen::wait_idle), so
/// that a compiled workload is timed in its steady state; the builds would take a core from it.
/// Returns the milliseconds waited; with `what`, also prints them and the codegen counters.
double wait_codegen(const std::string& what = "");

/// Prints a compiled workload's figures to stderr in one line ("W4 compiled: nodes 412 -> 260,
/// ...", or "W4 compiled (no_fuse): ..." for a variant), with its allocator high-water mark
/// against eager's.
void print_compiled(const std::string& w, const std::string& variant, const duet::CompileStats& s,
                    double peak_compiled, double peak_eager);

/// The compiled figures of docs/benchmarks.md (nodes before and after, fused kernels, arena
/// bytes) and the sum of the sizes of all intermediate values, as rows of workload w.
void compiled_figures(const char* w, const std::string& variant, const Config& c,
                      const duet::CompileStats& s, std::vector<Result>& out);

/// CT's "new size" case: a compiled training step whose batch dim is symbolic, at batches it
/// has not seen. fresh() makes a new compiled step and calls it at its first batches; at(b)
/// makes the inputs of batch b and returns one call of the step on them; stats() is its stats.
struct NewSizeCase {
  std::vector<int64_t> batches;  ///< the new batches, in the order called
  std::function<void()> fresh;
  std::function<std::function<void()>(int64_t)> at;
  std::function<duet::CompileStats()> stats;
};
/// Per repetition (reps / 2 of them, each with a fresh step), the first and the second call at
/// each new batch. Rows, medians over every new batch: new_size_ms (what the first call spent
/// before its plans ran: finding the entry, binding the symbols, the guards, building the plans;
/// CompileStats::new_size_ms), first_call_ms and steady_ms (the whole first and second calls),
/// call_extra_ms (their difference: new_size_ms, the first run of fresh buffers, and noise),
/// plan_ms and optimize_ms (plans built and passes run by the first call, 0 when none) and
/// traces (traces it made).
void new_size_rows(const std::string& variant, const Config& c, const NewSizeCase& k,
                   std::vector<Result>& out);
/// CT's W8 case (bench/transformer.cpp): the W8 training step at new batches.
void run_ct_w8(const Config& c, std::vector<Result>& out);

// ---- --ablate: each compiled workload with each pass switched off in turn ----

/// One compiled build of a workload: a call (one unit of the workload's figure) and its stats.
struct CompiledCall {
  std::function<void()> call;
  std::function<duet::CompileStats()> stats;
};

/// A compiled workload for the ablation: `compile` builds it under the given options, warms it
/// up, waits for codegen and checks one call against `eager` from the same state (a warning on
/// stderr where they differ), and returns it.
struct Ablatable {
  std::string workload, tag;  ///< tag: prefix of the variant ("b16" gives "b16_no_fuse")
  std::string metric;
  double unit = 1;  ///< metric = seconds per call * unit
  int calls = 1;    ///< calls per timed repetition
  std::function<void()> eager;
  std::function<CompiledCall(const duet::CompileOptions&)> compile;
};

/// W2's ablation case (workloads.cpp).
Ablatable w2_ablatable();
/// Runs each wanted compiled workload (W2, W4, W5, W6, TT) once with all passes and once with
/// each pass switched off, and reports its time and peak per variant (models.cpp).
void run_ablation(const Config&, const std::function<bool(const char*)>& want,
                  std::vector<Result>&);

// Workloads (workloads.cpp) and floors (floors.cpp) append their figures.
void run_w1(const Config&, std::vector<Result>&);
void run_w2(const Config&, std::vector<Result>&);
void run_w3(const Config&, std::vector<Result>&);
/// C1 (not a standard workload): conv2d forward + backward, x (32, 16, 28, 28), 32 3x3
/// filters, padding 1, against the same GEMMs called directly on oneDNN.
void run_c1(const Config&, std::vector<Result>&);

/// W4 and W6: an MLP training step (forward, backward, SGD), eager and compiled, against the
/// GEMM floor. W5: the W4 MLP forward at batch 1 against three gemv calls (models.cpp).
void run_w4(const Config&, std::vector<Result>&);
void run_w5(const Config&, std::vector<Result>&);
void run_w6(const Config&, std::vector<Result>&);
/// W8: a transformer training step (nn modules, AdamW), eager and compiled, against the GEMM
/// floor of its products (transformer.cpp).
void run_w8(const Config&, std::vector<Result>&);
/// W9: GPT-2 small training and forward steps on 1 x 1024 tokens, eager and compiled, f32 and
/// bf16 autocast, tokens per second and peak memory (gpt.cpp).
void run_w9(const Config&, std::vector<Result>&);
/// AT (not a standard workload): scaled_dot_product_attention forward and backward, the fused
/// primitive against the composite, at 1024 and 4096 tokens (attention.cpp).
void run_at(const Config&, std::vector<Result>&);
/// MEM: the memory of training steps, eager and compiled, with and without checkpoints.
void run_mem(const Config&, std::vector<Result>&);
/// MB: the largest W8 batch whose training step fits a fixed memory, per face (memory.cpp).
void run_mb(const Config&, std::vector<Result>&);
/// VM (not a standard workload): per-sample gradients with func::vmap(func::grad), against a
/// loop over the samples and the gradients batched by hand (func.cpp).
void run_vm(const Config&, std::vector<Result>&);
/// B1, B2: per-sample models (a BiLSTM tagger, a TreeLSTM) in an Autobatch scope against the
/// loop over samples and, for B1, the model padded and batched by hand (autobatch.cpp).
void run_b1(const Config&, std::vector<Result>&);
/// B3: per-sample gradients of the W4 MLP's last weight at batch 64, vmap(grad) against the loop
/// (func.cpp).
void run_b3(const Config&, std::vector<Result>&);
void run_b2(const Config&, std::vector<Result>&);
/// TT (not a standard workload): two MLP towers on one input, joined, a head and a training
/// step, at batch 16 and 128, compiled with and without parallel branches.
void run_tt(const Config&, std::vector<Result>&);
/// RN (not a standard workload): an Elman RNN gradient step over duet::scan at lengths 8 and
/// 64, eager and compiled, and the traces the compiled step takes over lengths 1..64 (rnn.cpp).
void run_rn(const Config&, std::vector<Result>&);
/// DP: data-parallel training of the W4 MLP under mpirun (dp.cpp).
void run_dp(const Config&, std::vector<Result>&);
/// CT (not a standard workload): compile time (trace, passes, plan) of elementwise chains of
/// 1,000 to 10,000 ops and of the W4 training step.
void run_ct(const Config&, std::vector<Result>&);
void run_cs(const Config&, std::vector<Result>&);

/// W4's or W6's training step ("W4", "W6") with its parameters and batch on `device`: the same
/// model, draws and step as on the CPU, eagerly and compiled (models.cpp; for W7).
struct DeviceTraining {
  std::vector<int64_t> sizes;  ///< layer sizes
  int64_t batch = 0;
  std::function<duet::Tensor()> eager, compiled;  ///< one step each; the loss
  std::function<duet::CompileStats()> stats;      ///< the compiled step's
};
DeviceTraining device_training(const std::string& w, duet::Device device);

/// W7 (docs/benchmarks.md), the CUDA workloads (cuda.cpp, built only with the CUDA backend),
/// each eager and compiled on cuda:0: W2cuda against a device-to-device copy of the same bytes,
/// W3cuda (matmul 1024^3 and 4096^3 f32) against cublasSgemm with TF32 off and on, W4cuda and
/// W6cuda against their GEMM floor on cuBLAS. `want` says which; without a usable GPU, one line.
void run_cuda(const Config&, const std::function<bool(const char*)>& want, std::vector<Result>&);

/// W2 floors: memcpy of n floats, and the hand-fused Eigen loop on the configured threads.
void w2_floor_memcpy(const float* x, float* y, int64_t n);
void w2_floor_fused(const float* x, float* y, int64_t n, bool eigen_logistic);
/// W3 floors: C = A B, row-major n x n, directly on oneDNN and on OpenBLAS.
void sgemm_onednn(const float* a, const float* b, float* c, int64_t n);
/// The instruction set oneDNN dispatches to on this CPU, in words.
std::string onednn_isa();
void sgemm_openblas(const float* a, const float* b, float* c, int64_t n);
/// Row-major C = op(A) op(B) on oneDNN (trans 'N' or 'T').
void sgemm_onednn_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                      const float* b, float* c);
/// Row-major C = op(A) op(B) on oneDNN's f32 matmul primitive, one per shape, made on first use.
void matmul_onednn_f32_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                           const float* b, float* c);
/// The GEMM floors' product (W4, W6, C1, the transformer): the faster library for its shape on
/// these machines, as duet's own choice (Note [Small products] in kernels/matmul.cpp): OpenBLAS
/// up to kernels::kSmallProduct multiply-adds, oneDNN above (and below, where OpenBLAS chose
/// kernels that do not fit the CPU: kernels::small_products_on_openblas); on oneDNN, A B^T from
/// kernels::kTransposedPrimitiveRows rows of A on runs on its matmul primitive, the rest on its
/// sgemm (Note [Products read transposed]).
void sgemm_floor_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                     const float* b, float* c);
/// The same on bf16 operands (2-byte elements), f32 accumulation, a bf16 C, the faster way
/// oneDNN has on this CPU: its bf16 matmul primitive where the CPU has AVX512-BF16 or AMX;
/// elsewhere, where that primitive emulates them (about 5x slower than sgemm), sgemm on f32
/// copies, rounded.
void matmul_onednn_bf16_mnk(char ta, char tb, int64_t m, int64_t n, int64_t k, const void* a,
                            const void* b, void* c);
void set_blas_threads(int n);

}  // namespace bench
