// duet_bench workload W8 (docs/benchmarks.md): a transformer training step written with nn modules
// as a user writes one: a token embedding (vocabulary 1024, width 256), two pre-LayerNorm blocks
// (x + MultiheadAttention(LN(x)) with 4 heads and a causal mask, then x + MLP(LN(x)) with
// Linear(256, 1024), tanh-GELU and Linear(1024, 256)), a final LayerNorm, logits Linear(256,
// 1024), cross-entropy against the next tokens, and AdamW; batch 8, sequence 128. Eager and
// compiled, against the GEMM floor: every matrix product of the step, forward and backward, with
// the same shapes and transposes, called directly on oneDNN's sgemm (the entry point duet's
// matmul kernel calls), batched as the model batches them (one sgemm per (batch, head) for the
// attention products, as duet's kernel does).
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/w8.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

namespace {

/// One sgemm shape of the step: `batch` products C = op(A) op(B), row-major, C (m, n).
struct Gemm {
  char ta, tb;
  int64_t m, n, k, batch = 1;
};

/// Every matrix product of a W8 step, forward then backward. Linear layers hold weights (out,
/// in): forward Y = X W^T ('N','T'); backward dX = dY W ('N','N') and dW = dY^T X ('T','N',
/// computed in the weight's layout). Every layer's input requires grad (the first products read
/// LayerNorm outputs), so every dX is computed. Attention per (batch, head): S = Q K^T ('N','T'),
/// O = P V ('N','N'); backward dP = dO V^T ('N','T'), dV = P^T dO ('T','N'), dQ = dS K ('N','N'),
/// dK^T = Q^T dS ('T','N').
std::vector<Gemm> w8_gemms() {
  const int64_t n = kBatch * kSeq, e = kWidth, f = kHidden, t = kSeq, d = kWidth / kHeads;
  const int64_t bh = kBatch * kHeads;
  std::vector<Gemm> fwd, bwd;
  auto linear = [&](int64_t in, int64_t out) {
    fwd.push_back({'N', 'T', n, out, in});
    bwd.push_back({'N', 'N', n, in, out});
    bwd.push_back({'T', 'N', out, in, n});
  };
  for (int64_t b = 0; b < kBlocks; ++b) {
    for (int i = 0; i < 3; ++i) linear(e, e);  // query, key and value projections
    fwd.push_back({'N', 'T', t, t, d, bh});    // S = Q K^T
    fwd.push_back({'N', 'N', t, d, t, bh});    // O = P V
    bwd.push_back({'N', 'T', t, t, d, bh});    // dP = dO V^T
    bwd.push_back({'T', 'N', t, d, t, bh});    // dV = P^T dO
    bwd.push_back({'N', 'N', t, d, t, bh});    // dQ = dS K
    bwd.push_back({'T', 'N', d, t, t, bh});    // dK^T = Q^T dS
    linear(e, e);                              // out_proj
    linear(e, f);                              // fc1
    linear(f, e);                              // fc2
  }
  linear(e, kVocab);  // logits
  fwd.insert(fwd.end(), bwd.begin(), bwd.end());
  return fwd;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>((s >> 8) * (2.0 / 16777216.0) - 1.0) * 0.05f;
  }
  return v;
}

/// The floor: the products of w8_gemms() on their own operands, back to back.
class W8Floor {
 public:
  W8Floor() : gemms_(w8_gemms()) {
    uint32_t seed = 101;
    for (const Gemm& g : gemms_) {
      a_.push_back(random_floats(g.batch * g.m * g.k, seed++));
      b_.push_back(random_floats(g.batch * g.k * g.n, seed++));
      c_.emplace_back(g.batch * g.m * g.n);
    }
  }
  void operator()() {
    for (size_t i = 0; i < gemms_.size(); ++i) {
      const Gemm& g = gemms_[i];
      for (int64_t j = 0; j < g.batch; ++j)
        sgemm_floor_mnk(g.ta, g.tb, g.m, g.n, g.k, a_[i].data() + j * g.m * g.k,
                        b_[i].data() + j * g.k * g.n, c_[i].data() + j * g.m * g.n);
    }
  }
  double gflop() const {
    double f = 0;
    for (const Gemm& g : gemms_) f += 2.0 * g.m * g.n * g.k * g.batch;
    return f / 1e9;
  }
  size_t count() const {
    size_t c = 0;
    for (const Gemm& g : gemms_) c += g.batch;
    return c;
  }

 private:
  std::vector<Gemm> gemms_;
  std::vector<std::vector<float>> a_, b_, c_;
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  if (x.size() != y.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::abs(x[i] - y[i])));
  return d;
}

double peak_bytes(const std::function<void()>& f) {
  duet::reset_peak_memory();
  f();
  return static_cast<double>(duet::cpu_memory_stats().peak);
}

}  // namespace

void run_w8(const Config& c, std::vector<Result>& out) {
  // A repetition runs 8 steps of one body before the next body's: the first step after the
  // others pays for refilling the caches with its model's state (each body's parameters,
  // gradients, optimizer state and arena, some 60 MB, evict the others'), 3 ms on the AMX Xeon,
  // which a user's loop of steps does not pay. With 2 steps a repetition, half the steps paid
  // it, and the bf16 step, at 20 ms against the f32 step's 46, paid the larger share.
  constexpr int kCheckSteps = 4, kStepsPerRep = 8;
  // Two copies of the same model, optimizer and batch: one trained eagerly, one by the compiled
  // step, side by side, so that their losses and parameters can be compared step by step: first
  // over the warm-up steps (fused kernels on the interpreter), then, once the generated kernels
  // are built, over kCheckSteps more.
  W8 e(81), k(81);
  auto step = k.compile();
  double dl = 0;
  std::vector<double> losses;
  auto compare = [&] {
    Tensor le = e.step(e.x, e.y), lc = step(k.x, k.y);
    dl = std::max(dl, max_abs_diff(le, lc));
    losses.push_back(le.item<double>());
  };
  for (int i = 0; i < warmup_calls(); ++i) compare();
  wait_codegen("W8");
  for (int i = 0; i < kCheckSteps; ++i) compare();
  double dp = 0;
  {
    const std::vector<Tensor> pe = e.model->parameters(), pc = k.model->parameters();
    for (size_t i = 0; i < pe.size(); ++i) dp = std::max(dp, max_abs_diff(pe[i], pc[i]));
  }
  std::fprintf(stderr,
               "W8: %zu steps eager and compiled (loss %.4f -> %.4f): they differ by %.3g in the "
               "loss and %.3g in the parameters\n",
               losses.size(), losses.front(), losses.back(), dl, dp);
  if (!(dl <= 1e-4 && dp <= 1e-4))
    std::fprintf(stderr, "W8: warning: the compiled steps differ from the eager steps\n");

  const double peak_eager = peak_bytes([&] { e.step(e.x, e.y); });
  const double peak_compiled = peak_bytes([&] { step(k.x, k.y); });

  // The same step under Autocast(cpu, bf16): the products in bf16, the rest as PyTorch's
  // autocast runs it, eager and compiled. Its steps are timed in the same rounds as the f32
  // ones, so that the ratio of the two compiled steps is taken over the same spells of a shared
  // machine's load.
  W8 ea(81, true), ka(81, true);
  auto amp_step = ka.compile();
  for (int i = 0; i < warmup_calls(); ++i) {
    ea.step(ea.x, ea.y);
    amp_step(ka.x, ka.y);
  }
  wait_codegen("W8");

  W8Floor floor;
  auto steps = [](auto&& f) {
    return [f] {
      for (int i = 0; i < kStepsPerRep; ++i) f();
    };
  };
  auto tm = time_interleaved(
      {steps([&] { e.step(e.x, e.y); }), steps([&] { step(k.x, k.y); }), steps([&] { floor(); }),
       steps([&] { ea.step(ea.x, ea.y); }), steps([&] { amp_step(ka.x, ka.y); })},
      c.reps);
  const auto& st = step.stats();
  if (st.traces != 1) {
    std::fprintf(stderr, "W8: warning: the compiled step traced %d times, not once:", st.traces);
    for (const auto& r : st.retrace_reasons) std::fprintf(stderr, " [%s]", r.c_str());
    std::fprintf(stderr, "\n");
  }
  auto ms = [&](double s) { return s / kStepsPerRep * 1e3; };
  const char* modes[] = {"eager", "compiled", "floor"};
  std::vector<Result> rows;
  for (int i = 0; i < 3; ++i) {
    Result r = base("W8", modes[i], c, "ms_per_step");
    if (i == 2) r.variant = "onednn_gemms";
    rows.push_back(summarize(r, tm[i], ms));
    out.push_back(rows.back());
  }
  out.push_back(single(base("W8", "eager", c, "peak_tensor_bytes"), peak_eager));
  out.push_back(single(base("W8", "compiled", c, "peak_tensor_bytes"), peak_compiled));
  compiled_figures("W8", "", c, st, out);
  print_compiled("W8", "", st, peak_compiled, peak_eager);
  std::fprintf(stderr,
               "W8 floor: %zu sgemm calls, %.2f GFLOP per step; compiled %.2fx and eager %.2fx the "
               "floor\n",
               floor.count(), floor.gflop(), rows[1].median / rows[2].median,
               rows[0].median / rows[2].median);
  std::vector<Result> amp_rows;
  for (int i = 0; i < 2; ++i) {
    Result r = base("W8", modes[i], c, "ms_per_step");
    r.variant = "autocast_bf16";
    amp_rows.push_back(summarize(r, tm[3 + i], ms));
    out.push_back(amp_rows.back());
  }
  // The median of the rounds' own ratios, beside the ratio of the medians.
  auto round_ratio = [&](size_t f32_body, size_t bf16_body) {
    std::vector<double> r;
    for (size_t i = 0; i < tm[f32_body].size(); ++i)
      r.push_back(tm[f32_body][i] / tm[bf16_body][i]);
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  };
  std::fprintf(
      stderr,
      "W8 autocast bf16: eager %.1f ms, compiled %.1f ms per step; f32 over bf16: eager "
      "%.2fx, compiled %.2fx (median of the rounds' ratios: eager %.2fx, compiled %.2fx)\n",
      amp_rows[0].median, amp_rows[1].median, rows[0].median / amp_rows[0].median,
      rows[1].median / amp_rows[1].median, round_ratio(0, 3), round_ratio(1, 4));
}

void run_ct_w8(const Config& c, std::vector<Result>& out) {
  // The W8 step traced at batch 8 and 4 (the batch dim symbolic from the second call on), then
  // called at batches it has not seen.
  W8 k(81);
  std::optional<decltype(k.compile())> step;
  auto tokens = [](int64_t b) {
    duet::manual_seed(b);
    Tensor t = duet::randint(kVocab, {b, kSeq + 1});
    return std::make_pair(duet::slice(t, 1, 0, kSeq).clone(),
                          duet::slice(t, 1, 1, kSeq + 1).clone());
  };
  NewSizeCase w8;
  w8.batches = {6, 5, 3, 7, 2, 10};
  w8.fresh = [&] {
    step.emplace(k.compile());
    for (int64_t b : {8, 4}) {
      auto [x, y] = tokens(b);
      (*step)(x, y);
    }
  };
  w8.at = [&](int64_t b) -> std::function<void()> {
    auto [x, y] = tokens(b);
    return [&, x, y] { (*step)(x, y); };
  };
  w8.stats = [&] { return step->stats(); };
  new_size_rows("W8 step", c, w8, out);
}

}  // namespace bench
