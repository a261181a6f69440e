// duet_bench workloads W4, W5, W6 (BENCH.md): small models, eager and compiled, against floors
// measured in the same run; and CT, the time compile() takes (trace, passes, plan).
//
// The models have no nn module yet: a Linear layer is either duet::linear(x, w, b) =
// matmul(x, transpose(w, 0, 1)) + b with torch.nn.Linear's weight layout (out, in), or
// matmul(x, w) + b with the weight kept transposed, (in, out). Both are fair; each workload uses
// the one that measured faster for duet on this machine, and its floor makes the same products
// with the same transposes.
// - Training (W4, W6): (in, out). Every product of the step then reads and writes its operands
//   in their own layout, and the weight's gradient x^T dy arrives in the weight's layout. With
//   (out, in) it arrives as a transposed view, and accumulating it into .grad, the SGD update and
//   the compiled step's write-back of .grad take strided paths: W6 eager about 235 against
//   180 us per step, compiled about 150 against 95; W4 eager about 12.5 against 9.2 ms,
//   compiled about 15.3 against 8.9 (same runs, floors 7.5 ms and 40 us either way).
// - Inference (W5): (out, in), gemv on rows: about 55 against 62 to 72 us per call, eager and
//   compiled, with the floor following (52 to 59 against 60 to 71 us).
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::NoGradGuard;
using duet::Tensor;

namespace {

// ---- the models ----

enum class Act { Relu, Tanh };

/// Weights stored (in, out) (true) or (out, in) as torch.nn.Linear (false): for the training
/// steps (W4, W6, and CT's W4 step) and for W5's forward.
constexpr bool kTrainWeightsInOut = true;
constexpr bool kInferWeightsInOut = false;

/// Linear layers of the given sizes (sizes[0] inputs, sizes.back() outputs).
struct Mlp {
  std::vector<Tensor> w, b;
  Act act = Act::Relu;
  bool act_last = false;  ///< whether the last layer is followed by the activation too
  bool wt = false;        ///< weights (in, out), a layer h @ w + b; else (out, in), linear()

  std::vector<Tensor> params() const {
    std::vector<Tensor> p;
    for (size_t l = 0; l < w.size(); ++l) {
      p.push_back(w[l]);
      p.push_back(b[l]);
    }
    return p;
  }
  int64_t in(size_t l) const { return w[l].sizes()[wt ? 0 : 1]; }
  int64_t out(size_t l) const { return w[l].sizes()[wt ? 1 : 0]; }
};

Mlp make_mlp(const std::vector<int64_t>& sizes, Act act, bool act_last, bool in_out, double scale) {
  Mlp m;
  m.act = act;
  m.act_last = act_last;
  m.wt = in_out;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    duet::Shape ws =
        m.wt ? duet::Shape{sizes[l], sizes[l + 1]} : duet::Shape{sizes[l + 1], sizes[l]};
    m.w.push_back((duet::randn(ws) * scale).requires_grad_());
    m.b.push_back((duet::randn({sizes[l + 1]}) * scale).requires_grad_());
  }
  return m;
}

Tensor forward(const Mlp& m, Tensor h) {
  for (size_t l = 0; l < m.w.size(); ++l) {
    h = m.wt ? duet::matmul(h, m.w[l]) + m.b[l] : duet::linear(h, m.w[l], m.b[l]);
    if (l + 1 < m.w.size() || m.act_last)
      h = m.act == Act::Relu ? duet::relu(std::move(h)) : duet::tanh(std::move(h));
  }
  return h;
}

enum class Loss { CrossEntropy, Mse };

/// One SGD training step, as a user writes it: zero the grads in place, forward, loss,
/// backward, update in place. The compiled step is the same body under duet::compile.
Tensor train_step(const Mlp& m, const std::vector<Tensor>& params, const Tensor& x, const Tensor& y,
                  Loss kind, double lr) {
  {
    NoGradGuard ng;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) g.zero_();
    }
  }
  Tensor out = forward(m, x);
  Tensor loss = kind == Loss::CrossEntropy ? duet::cross_entropy(out, y) : duet::mse_loss(out, y);
  loss.backward();
  {
    NoGradGuard ng;
    for (Tensor p : params) p.sub_(p.grad() * lr);
  }
  return loss;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = static_cast<float>((s >> 8) * (2.0 / 16777216.0) - 1.0) * 0.05f;
  }
  return v;
}

// ---- floors ----

/// The matrix products of one training step of an MLP, called on oneDNN directly, back to back,
/// with the shapes and transposes duet's own step uses. Weights (in, out):
///   forward   Y = X W          ('N','N', batch x out x in)
///   backward  dX = dY W^T      ('N','T', batch x in x out), every layer but the first (the
///                               input does not require grad, so the step does not compute it)
///             dW = X^T dY      ('T','N', in x out x batch)
/// Weights (out, in): Y = X W^T ('N','T'), dX = dY W ('N','N'), and (dW)^T = X^T dY ('T','N'),
/// the gradient of the transposed view that linear() multiplies by.
class GemmFloor {
 public:
  GemmFloor(const std::vector<int64_t>& sizes, int64_t batch, bool wt)
      : sizes_(sizes), batch_(batch), wt_(wt) {
    for (size_t l = 0; l + 1 < sizes.size(); ++l) {
      const int64_t in = sizes[l], out = sizes[l + 1];
      x_.push_back(random_floats(batch * in, 11 + l));
      w_.push_back(random_floats(out * in, 23 + l));
      y_.emplace_back(batch * out);
      dy_.push_back(random_floats(batch * out, 37 + l));
      dx_.emplace_back(batch * in);
      dw_.emplace_back(in * out);
    }
  }
  void operator()() {
    const size_t layers = w_.size();
    for (size_t l = 0; l < layers; ++l)
      sgemm_onednn_mnk('N', wt_ ? 'N' : 'T', batch_, sizes_[l + 1], sizes_[l], x_[l].data(),
                       w_[l].data(), y_[l].data());
    for (size_t l = layers; l-- > 0;) {
      if (l > 0)
        sgemm_onednn_mnk('N', wt_ ? 'T' : 'N', batch_, sizes_[l], sizes_[l + 1], dy_[l].data(),
                         w_[l].data(), dx_[l].data());
      sgemm_onednn_mnk('T', 'N', sizes_[l], sizes_[l + 1], batch_, x_[l].data(), dy_[l].data(),
                       dw_[l].data());
    }
  }

 private:
  std::vector<int64_t> sizes_;
  int64_t batch_;
  bool wt_;
  std::vector<std::vector<float>> x_, w_, y_, dy_, dx_, dw_;
};

/// W5's floor: the MLP forward at batch 1 as three BLAS matrix-vector products, each followed
/// by a plain loop adding the bias (and ReLU but for the last), on the model's own weights.
class GemvFloor {
 public:
  explicit GemvFloor(const Mlp& m) : wt_(m.wt) {
    for (size_t l = 0; l < m.w.size(); ++l) {
      w_.push_back(m.w[l].data_ptr<float>());
      b_.push_back(m.b[l].data_ptr<float>());
      in_.push_back(m.in(l));
      out_.push_back(m.out(l));
      h_.emplace_back(m.out(l));
    }
  }
  /// y = forward(x) for a row x of in(0) floats; `onednn`: dnnl_sgemm with M = 1 instead of
  /// OpenBLAS's cblas_sgemv. Weights (in, out) make the gemv the transposed one, y = W^T x.
  const std::vector<float>& operator()(const float* x, bool onednn) {
    const float* h = x;
    for (size_t l = 0; l < w_.size(); ++l) {
      const int64_t in = in_[l], out = out_[l];
      float* y = h_[l].data();
      if (onednn)
        dnnl_sgemm('N', wt_ ? 'N' : 'T', 1, out, in, 1.0f, h, in, w_[l], wt_ ? out : in, 0.0f, y,
                   out);
      else if (wt_)
        cblas_sgemv(CblasRowMajor, CblasTrans, in, out, 1.0f, w_[l], out, h, 1, 0.0f, y, 1);
      else
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w_[l], in, h, 1, 0.0f, y, 1);
      const float* b = b_[l];
      if (l + 1 < w_.size())
        for (int64_t i = 0; i < out; ++i) y[i] = std::max(y[i] + b[i], 0.0f);
      else
        for (int64_t i = 0; i < out; ++i) y[i] += b[i];
      h = y;
    }
    return h_.back();
  }

 private:
  bool wt_;
  std::vector<const float*> w_, b_;
  std::vector<int64_t> in_, out_;
  std::vector<std::vector<float>> h_;
};

// ---- helpers ----

/// Calls `f` `n` times (a repetition long enough for the steady clock on a noisy host).
std::function<void()> times(int n, std::function<void()> f) {
  return [n, f = std::move(f)] {
    for (int i = 0; i < n; ++i) f();
  };
}

/// The allocator's high-water mark over one call of f, counting everything live at the start
/// (parameters, gradients, inputs, buffers a plan keeps).
double peak_bytes(const std::function<void()>& f) {
  duet::reset_peak_memory();
  f();
  return static_cast<double>(duet::cpu_memory_stats().peak);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  if (x.size() != y.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::abs(x[i] - y[i])));
  return d;
}

std::vector<Tensor> snapshot(const std::vector<Tensor>& params) {
  NoGradGuard ng;
  std::vector<Tensor> s;
  for (const Tensor& p : params) s.push_back(p.clone());
  return s;
}

void restore(const std::vector<Tensor>& params, const std::vector<Tensor>& s) {
  NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) Tensor(params[i]).copy_(s[i]);
}

/// Warns unless the compiled function traced exactly once.
template <class S>
void check_traced_once(const char* w, const S& stats) {
  if (stats.traces == 1) return;
  std::fprintf(stderr, "%s: warning: the compiled function traced %d times, not once:", w,
               stats.traces);
  for (const auto& r : stats.retrace_reasons) std::fprintf(stderr, " [%s]", r.c_str());
  std::fprintf(stderr, "\n");
}

/// One eager and one compiled step from the same parameters must agree (loss and the updated
/// parameters); the parameters keep the compiled step's result.
template <class E, class C>
void check_same_step(const char* w, const std::vector<Tensor>& params, E eager, C compiled) {
  std::vector<Tensor> start = snapshot(params);
  Tensor le = eager();
  std::vector<Tensor> after = snapshot(params);
  restore(params, start);
  Tensor lc = compiled();
  double dl = max_abs_diff(le, lc), dp = 0;
  for (size_t i = 0; i < params.size(); ++i) dp = std::max(dp, max_abs_diff(params[i], after[i]));
  if (!(dl <= 1e-4 && dp <= 1e-5))
    std::fprintf(stderr,
                 "%s: warning: the compiled step differs from the eager step (loss by %g, "
                 "parameters by %g)\n",
                 w, dl, dp);
}

/// The compiled figures of BENCH.md: nodes before and after the passes, fused kernels, the
/// bytes the plans keep, and the sum of the sizes of the values the (optimized) graph computes,
/// views (transposes of the weights, reshapes) left out as they own no buffer.
template <class S>
void compiled_figures(const char* w, const Config& c, const S& stats, const duet::Graph& g,
                      std::vector<Result>& out) {
  double inter = 0;
  for (const auto& n : g.nodes)
    if (n.kind == duet::NodeKind::Op && duet::detail::op_def(n.op).cls != duet::OpClass::View)
      inter += static_cast<double>(n.meta.shape.numel() * duet::itemsize(n.meta.dtype));
  out.push_back(single(base(w, "compiled", c, "nodes_before"), double(stats.nodes_before)));
  out.push_back(single(base(w, "compiled", c, "nodes_after"), double(stats.nodes_after)));
  out.push_back(single(base(w, "compiled", c, "fused_kernels"), 0.0));  // no fusion pass yet
  out.push_back(single(base(w, "compiled", c, "arena_bytes"), double(stats.buffer_bytes)));
  out.push_back(single(base(w, "compiled", c, "intermediate_bytes"), inter));
}

/// W4 and W6: a training step, eager and compiled, against its GEMM floor.
void run_training(const char* w, const char* metric, double unit, const Config& c,
                  const std::vector<int64_t>& sizes, int64_t batch, Act act, bool act_last,
                  Loss kind, int steps_per_rep, std::vector<Result>& out) {
  const double lr = 0.01;
  duet::manual_seed(42);
  Mlp m = make_mlp(sizes, act, act_last, kTrainWeightsInOut, 0.05);
  const std::vector<Tensor> params = m.params();
  Tensor x = duet::randn({batch, sizes.front()});
  Tensor y = kind == Loss::CrossEntropy ? duet::randint(sizes.back(), {batch})
                                        : duet::randn({batch, sizes.back()});
  auto eager = [&] { return train_step(m, params, x, y, kind, lr); };

  // Eager's high-water mark first, before a compiled plan exists.
  for (int i = 0; i < 2; ++i) eager();
  const double peak_eager = peak_bytes([&] { eager(); });

  auto step =
      duet::compile([&](Tensor xs, Tensor ys) { return train_step(m, params, xs, ys, kind, lr); });
  for (int i = 0; i < 4; ++i) step(x, y);
  check_traced_once(w, step.stats());
  check_same_step(w, params, eager, [&] { return step(x, y); });
  const double peak_compiled = peak_bytes([&] { step(x, y); });

  GemmFloor floor(sizes, batch, m.wt);
  auto t = time_interleaved(
      {times(steps_per_rep, [&] { eager(); }), times(steps_per_rep, [&] { step(x, y); }),
       times(steps_per_rep, [&] { floor(); })},
      c.reps);
  check_traced_once(w, step.stats());
  auto per_step = [&](double s) { return s / steps_per_rep * unit; };
  const char* modes[] = {"eager", "compiled", "floor"};
  for (int k = 0; k < 3; ++k) {
    Result r = base(w, modes[k], c, metric);
    if (k == 2) r.variant = "onednn_gemms";
    out.push_back(summarize(r, t[k], per_step));
  }
  out.push_back(single(base(w, "eager", c, "peak_tensor_bytes"), peak_eager));
  out.push_back(single(base(w, "compiled", c, "peak_tensor_bytes"), peak_compiled));
  compiled_figures(w, c, step.stats(), step.graph(), out);
}

const std::vector<int64_t> kW4Sizes = {784, 1024, 1024, 10};

}  // namespace

// W4: MLP 784-1024-1024-10, ReLU, batch 256, softmax cross-entropy, SGD lr 0.01.
void run_w4(const Config& c, std::vector<Result>& out) {
  run_training("W4", "ms_per_step", 1e3, c, kW4Sizes, 256, Act::Relu, false, Loss::CrossEntropy, 4,
               out);
}

// W6: 20 x (Linear(64, 64) + tanh), batch 8, mse against a fixed random target, SGD lr 0.01.
void run_w6(const Config& c, std::vector<Result>& out) {
  run_training("W6", "us_per_step", 1e6, c, std::vector<int64_t>(21, 64), 8, Act::Tanh, true,
               Loss::Mse, 200, out);
}

// W5: the W4 MLP forward at batch 1, no grad.
void run_w5(const Config& c, std::vector<Result>& out) {
  constexpr int kCalls = 200;
  duet::manual_seed(43);
  Mlp m = make_mlp(kW4Sizes, Act::Relu, false, kInferWeightsInOut, 0.05);
  Tensor x = duet::randn({1, kW4Sizes.front()});
  Tensor y;
  auto eager = [&] {
    NoGradGuard ng;
    y = forward(m, x);
  };
  for (int i = 0; i < 2; ++i) eager();
  const double peak_eager = peak_bytes(eager);

  auto fwd = duet::compile([&](Tensor xs) { return forward(m, xs); });
  auto compiled = [&] {
    NoGradGuard ng;
    y = fwd(x);
  };
  for (int i = 0; i < 4; ++i) compiled();
  check_traced_once("W5", fwd.stats());
  const double peak_compiled = peak_bytes(compiled);

  GemvFloor floor(m);
  const float* px = x.data_ptr<float>();
  // The floor computes the same function.
  eager();
  std::vector<float> ye = y.to_vector<float>();
  compiled();
  std::vector<float> yc = y.to_vector<float>();
  for (bool onednn : {false, true}) {
    const std::vector<float>& yf = floor(px, onednn);
    double err = 0, errc = 0;
    for (size_t i = 0; i < ye.size(); ++i) {
      err = std::max(err, double(std::abs(ye[i] - yf[i])));
      errc = std::max(errc, double(std::abs(yc[i] - yf[i])));
    }
    if (err > 1e-4 || errc > 1e-4)
      std::fprintf(stderr, "W5: duet (eager %g, compiled %g) and the %s floor differ\n", err, errc,
                   onednn ? "oneDNN" : "OpenBLAS");
  }

  auto t = time_interleaved(
      {times(kCalls, eager), times(kCalls, compiled), times(kCalls, [&] { floor(px, false); }),
       times(kCalls, [&] { floor(px, true); })},
      c.reps);
  check_traced_once("W5", fwd.stats());
  auto us = [&](double s) { return s / kCalls * 1e6; };
  out.push_back(summarize(base("W5", "eager", c, "us_per_call"), t[0], us));
  out.push_back(summarize(base("W5", "compiled", c, "us_per_call"), t[1], us));
  // One floor: the faster of OpenBLAS's sgemv and oneDNN's sgemm with M = 1 in this run.
  Result blas = summarize(base("W5", "floor", c, "us_per_call"), t[2], us);
  blas.variant = "openblas_sgemv";
  Result dnnl = summarize(base("W5", "floor", c, "us_per_call"), t[3], us);
  dnnl.variant = "onednn_sgemm_m1";
  std::fprintf(stderr,
               "W5 floor: OpenBLAS cblas_sgemv %.1f us, oneDNN dnnl_sgemm M=1 %.1f us per call; "
               "the faster is the floor\n",
               blas.median, dnnl.median);
  out.push_back(blas.median <= dnnl.median ? blas : dnnl);
  out.push_back(single(base("W5", "eager", c, "peak_tensor_bytes"), peak_eager));
  out.push_back(single(base("W5", "compiled", c, "peak_tensor_bytes"), peak_compiled));
  compiled_figures("W5", c, fwd.stats(), fwd.graph(), out);
}

// CT: the time of a first call of a compiled function, and of its trace + passes + plan, for
// chains of N elementwise ops and for the W4 training step. Each rep compiles afresh.
void run_ct(const Config& c, std::vector<Result>& out) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  // Rows of one case: compile_ms (trace + passes + plan) and first_call_ms, and the parts.
  auto report = [&](const std::string& variant, const std::vector<std::vector<double>>& v) {
    const char* metrics[] = {"compile_ms", "first_call_ms", "trace_ms", "optimize_ms", "plan_ms"};
    for (int k = 0; k < 5; ++k) {
      Result r = base("CT", "compiled", c, metrics[k]);
      r.variant = variant;
      out.push_back(summarize(r, v[k], [](double x) { return x; }));
    }
  };
  auto record = [&](std::vector<std::vector<double>>& v, const auto& stats, double first) {
    v[0].push_back(stats.trace_ms + stats.optimize_ms + stats.plan_ms);
    v[1].push_back(first);
    v[2].push_back(stats.trace_ms);
    v[3].push_back(stats.optimize_ms);
    v[4].push_back(stats.plan_ms);
  };

  Tensor x = duet::randn({16});
  for (int n : {1000, 5000, 10000}) {
    auto chain = [n](Tensor h) {
      for (int i = 0; i < n; ++i) {
        switch (i % 3) {
          case 0:
            h = std::move(h) * 1.0001;
            break;
          case 1:
            h = std::move(h) + 0.5;
            break;
          default:
            h = duet::tanh(std::move(h));
        }
      }
      return h;
    };
    std::vector<std::vector<double>> v(5);
    for (int r = 0; r < c.reps; ++r) {
      auto f = duet::compile(chain);
      auto a = Clock::now();
      Tensor y = f(x);
      auto b = Clock::now();
      record(v, f.stats(), ms(a, b));
    }
    report(fmt::format("chain N={}", n), v);
  }

  // The W4 step, with its gradients already allocated (the state of every step but the first).
  const double lr = 0.01;
  duet::manual_seed(42);
  Mlp m = make_mlp(kW4Sizes, Act::Relu, false, kTrainWeightsInOut, 0.05);
  const std::vector<Tensor> params = m.params();
  Tensor xs = duet::randn({256, kW4Sizes.front()});
  Tensor ys = duet::randint(kW4Sizes.back(), {256});
  train_step(m, params, xs, ys, Loss::CrossEntropy, lr);
  std::vector<std::vector<double>> v(5);
  for (int r = 0; r < c.reps; ++r) {
    auto step = duet::compile(
        [&](Tensor a, Tensor b) { return train_step(m, params, a, b, Loss::CrossEntropy, lr); });
    auto a = Clock::now();
    step(xs, ys);
    auto b = Clock::now();
    record(v, step.stats(), ms(a, b));
  }
  report("W4 step", v);
}

}  // namespace bench
