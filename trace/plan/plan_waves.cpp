// duet: a plan's parallel waves (Note [Parallel waves] in trace/plan/executor.cpp): which steps
// may run side by side, what each costs, and which waves run their steps side by side.
#include <algorithm>

#include <omp.h>

#include "kernels/loops.h"
#include "kernels/matrices.h"
#include "trace/plan/plan_internal.h"

namespace duet::detail {

// ---- parallel branches (Note [Parallel waves]) ----
// A step's wave is one more than the latest wave it reads from; the steps of one wave are
// independent. With two threads, a plan runs wave by wave, the steps of a wave side by side
// (each kernel on one thread), when the cost model says that beats running the steps in
// order, each kernel on both threads: that is, when branches are many and their kernels too
// small to split well.
void Plan::Builder::find_waves() {
  wave_of.assign(ng + n, 0);
  for (int32_t u : order) {
    int32_t w = 0;
    for (int32_t v : unit_nodes[u])
      for (int32_t in : graph.nodes[v].inputs)
        if (is_step_node(graph.nodes[in]) && unit_of(in) != u)
          w = std::max(w, wave_of[unit_of(in)] + 1);
    wave_of[u] = w;
    num_waves = std::max(num_waves, w + 1);
  }
}

namespace {

bool is_conv(OpId op) {
  return op == OpId::Conv2d || op == OpId::Conv2dInputGrad || op == OpId::Conv2dWeightGrad;
}

// The FLOPs of a matmul or a convolution node.
double product_flops(const Graph& graph, const GraphNode& g) {
  const Shape& a = graph.nodes[g.inputs[0]].meta.shape;
  const Shape& b = graph.nodes[g.inputs[1]].meta.shape;
  const double numel = static_cast<double>(g.meta.shape.numel());
  // A convolution's FLOPs: 2 * (N, O, Ho, Wo) * (C, kh, kw), as its im2col GEMMs.
  auto per_filter = [](const Shape& w) { return w.size() && w[0] ? w.numel() / w[0] : 0; };
  return g.op == OpId::MatMul   ? 2.0 * numel * static_cast<double>(a.size() ? a[a.size() - 1] : 1)
         : g.op == OpId::Conv2d ? 2.0 * numel * static_cast<double>(per_filter(b))
         : g.op == OpId::Conv2dInputGrad
             ? 2.0 * static_cast<double>(a.numel() * per_filter(b))
             : 2.0 * static_cast<double>(b.numel() * per_filter(g.meta.shape));
}

}  // namespace

// Estimated nanoseconds of unit u on one thread (-1: not on the CPU), and how much faster it
// runs when its kernels split over two (1: not at all). Measured on the 2-core AVX-512
// machines: one core multiplies at about 200 GFLOP/s from 16 x 256 x 512 up; oneDNN splits a
// product over two threads only from about 64 MFLOP, and well (1.85x) only from about 256
// MFLOP; an elementwise kernel splits from 2 * kParallelGrain elements. (TT in bench/ checks
// it: the two-tower step against the same step in order and with every wave side by side.)
double Plan::Builder::step_cost(int32_t u, double* speedup) const {
  double ns = 0, split_ns = 0;
  for (int32_t v : unit_nodes[u]) {
    const GraphNode& g = graph.nodes[v];
    if (g.meta.device.type != DeviceType::CPU) return -1.0;
    if (op_class(g.op) == OpClass::View) continue;
    const int64_t numel = g.meta.shape.numel();
    double c = 0;
    if (g.op == OpId::MatMul || is_conv(g.op)) {
      const double flops = product_flops(graph, g);
      c = flops / 150.0 + 300;  // a little under the peak, and the call
      split_ns += c / (flops >= 256e6 ? 1.85 : flops >= 64e6 ? 1.5 : 1.0);
    } else {
      c = 0.1 * numel + 100;
      split_ns += numel >= 2 * kernels::kParallelGrain ? c / 1.9 : c;
    }
    ns += c;
  }
  *speedup = ns > 0 ? ns / split_ns : 1;
  return ns;
}

// Note [Sums that follow the threads]
// A kernel in a wave's step runs on one thread (Note [Parallel waves] in executor.cpp), where
// eagerly it runs on all of them. Most kernels sum in an order of their own (the reductions by
// pieces of a fixed size, the attention kernel's GEMMs pinned to their tile's thread), but
// oneDNN may split a GEMM's inner dim over the threads it gets, depending on the CPU and the
// shape: on a 2-core AVX2 EPYC a 64 x 64 product over k = 256 rounded apart on one thread and
// on two, and a bf16 training step (samples/transformer --autocast bf16) drifted from eager by
// 1.7e-4 in 40 steps, where one thread, or no waves, kept the two faces equal bit for bit. So
// a unit whose product's sums follow the threads keeps its wave in order: a matmul of a shape
// that kernels::product_sums_follow_threads finds so (it runs the product both ways, once per
// shape; an f32 product of at most kSmallProduct multiply-adds runs on OpenBLAS on one thread,
// and one past kLargestProbed is taken to follow them unprobed, as it splits well on the
// threads anyway), any low-precision product (its result rounds away most differences in the
// sums, so a probe would rarely see them, and a wave's drift grows from one), lstm_step's
// products, and a convolution from kSerialConvFlops, which oneDNN runs on all threads.
constexpr int64_t kLargestProbed = int64_t(1) << 27;  // multiply-adds

bool Plan::Builder::sums_by_threads(int32_t u) const {
  for (int32_t v : unit_nodes[u]) {
    const GraphNode& g = graph.nodes[v];
    auto shape = [&](size_t i) -> const Shape& { return graph.nodes[g.inputs[i]].meta.shape; };
    auto last = [](const Shape& s, int64_t back) {
      return s.size() >= back ? s[s.size() - back] : int64_t(1);
    };
    int64_t m = 0, n = 0, k = 0;
    if (g.op == OpId::MatMul) {
      const Shape &a = shape(0), &b = shape(1);
      k = last(a, 1);
      m = a.size() >= 2 ? last(a, 2) : 1;
      n = b.size() >= 2 ? last(b, 1) : 1;
    } else if (g.op == OpId::Addmm || g.op == OpId::Addmv) {
      const Shape &a = shape(1), &b = shape(2);
      m = last(a, 2), k = last(a, 1);
      n = b.size() >= 2 ? last(b, 1) : 1;
    } else if (g.op == OpId::LstmStep || g.op == OpId::LstmStepBackward) {
      return true;
    } else if (is_conv(g.op)) {
      if (product_flops(graph, g) >= kernels::kSerialConvFlops) return true;
      continue;
    } else {
      continue;
    }
    if (is_low_precision(g.meta.dtype)) return true;
    if (g.meta.dtype == DType::f32 && m * n * k <= kernels::kSmallProduct) continue;  // OpenBLAS
    if (m * n * k > kLargestProbed || kernels::product_sums_follow_threads(g.meta.dtype, m, n, k))
      return true;
  }
  return false;
}

// Whether the plan runs in waves, and which waves run their steps side by side; a parallel
// plan's schedule runs wave by wave.
void Plan::Builder::choose_parallel() {
  if (opt.parallel && !has_control && omp_get_max_threads() >= 2 && num_waves > 0) {
    // Per wave: in order, each step split over both threads as it can (wave_serial), or the
    // steps side by side, one thread each (the longest step, or half the sum, and a fork).
    std::vector<double> wave_sum(num_waves, 0), wave_max(num_waves, 0), wave_serial(num_waves, 0);
    std::vector<int32_t> wave_count(num_waves, 0);
    std::vector<bool> wave_in_order(num_waves, false);
    std::vector<std::vector<int32_t>> wave_units(num_waves);
    bool cpu = true;
    for (int32_t u : order) {
      double speedup = 1;
      const double c = step_cost(u, &speedup);
      if (c < 0) cpu = false;
      // Collectives and prints run in program order on every rank: their waves stay in order.
      for (int32_t v : unit_nodes[u])
        if (has_effect(graph.nodes[v])) wave_in_order[wave_of[u]] = true;
      wave_units[wave_of[u]].push_back(u);
      wave_serial[wave_of[u]] += c / speedup;
      wave_sum[wave_of[u]] += c;
      wave_max[wave_of[u]] = std::max(wave_max[wave_of[u]], c);
      ++wave_count[wave_of[u]];
    }
    constexpr double kWaveOverheadNs = 1500;  // an OpenMP fork and join of two threads
    // DUET_PARALLEL=always (the tests use it) runs every wave of more than one step side by
    // side; =auto (default) asks the cost model, wave by wave.
    const char* env = std::getenv("DUET_PARALLEL");
    const bool always = env && std::string(env) == "always";
    double serial = 0, waved = 0;
    plan.wave_parallel_.assign(num_waves, false);
    for (int32_t w = 0; w < num_waves; ++w) {
      const double side = std::max(wave_max[w], wave_sum[w] / 2) + kWaveOverheadNs;
      bool side_by_side =
          wave_count[w] > 1 && !wave_in_order[w] && (always || side < 0.85 * wave_serial[w]);
      // A wave with a product whose sums follow the threads stays in order (Note [Sums that
      // follow the threads]); asked only of a wave that would run side by side, as it may probe.
      for (size_t i = 0; side_by_side && i < wave_units[w].size(); ++i)
        side_by_side = !sums_by_threads(wave_units[w][i]);
      plan.wave_parallel_[w] = side_by_side;
      serial += wave_serial[w];
      waved += plan.wave_parallel_[w] ? side : wave_serial[w];
    }
    // Waves cost memory (no buffer is reused in place: steps of one wave may run together), so
    // a plan runs in waves only when they save a few percent of its time. A training step's
    // plan (one with a backward phase) gives up more in waves: its activations and gradients
    // are the larger buffers, and a wave holds all of its steps' buffers at once; it takes
    // waves only for a tenth of its time (W8: estimated 5% faster in waves, measured 7% slower
    // and 11% larger).
    const bool training = has_backward_phase(graph);
    parallel = cpu &&
               std::any_of(plan.wave_parallel_.begin(), plan.wave_parallel_.end(),
                           [](bool b) { return b; }) &&
               (always || waved < (training ? 0.9 : 0.97) * serial);
    stats.parallel = parallel;
    if (debug)
      fmt::print(stderr,
                 "--- parallel: {} waves, {} side by side; estimated {:.1f} us in order, {:.1f} us "
                 "in waves\n",
                 num_waves,
                 std::count(plan.wave_parallel_.begin(), plan.wave_parallel_.end(), true),
                 serial / 1e3, waved / 1e3);
  }
  if (parallel)
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return wave_of[a] < wave_of[b]; });
}

}  // namespace duet::detail
