// duet_bench AT (docs/benchmarks.md): scaled_dot_product_attention, forward and backward, the
// fused primitive against the composite it replaced (matmul, softmax, matmul), in one run.
//  - L = S = 1024, 12 heads of 64, batch 1, causal, f32: milliseconds of forward + backward
//    (and of the forward alone) for each, interleaved rep by rep; bf16 for the fused kernel.
//  - L = S = 4096, one head of 64, causal: forward + backward time, and the peak memory one call
//    holds beyond its inputs, fused and composite.
// Both go through the public function: the composite is detail::attention_composite, the path
// the public function takes where the fused kernels do not apply.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

namespace {

struct Inputs {
  Tensor q, k, v, g;
};

Inputs inputs(int64_t heads, int64_t len, int64_t dim, duet::DType dt) {
  const duet::Options o = duet::Options().dtype(dt);
  return {duet::randn({1, heads, len, dim}, o), duet::randn({1, heads, len, dim}, o),
          duet::randn({1, heads, len, dim}, o), duet::randn({1, heads, len, dim}, o)};
}

// One forward (and backward, when `backward`) of the fused or composite attention.
std::function<void()> step(const Inputs& in, bool fused, bool backward) {
  return [=] {
    Tensor q = in.q.detach(), k = in.k.detach(), v = in.v.detach();
    if (backward) {
      q.requires_grad_();
      k.requires_grad_();
      v.requires_grad_();
    }
    Tensor y = fused ? duet::scaled_dot_product_attention(q, k, v, {}, true)
                     : duet::detail::attention_composite("scaled_dot_product_attention", q, k, v,
                                                         {}, true, 0);
    if (backward) duet::grad({y}, {q, k, v}, {in.g});
  };
}

// Peak bytes one call of body holds beyond what was allocated before it.
double held_bytes(const std::function<void()>& body) {
  const int64_t before = duet::cpu_memory_stats().current;
  duet::reset_peak_memory();
  body();
  return double(duet::cpu_memory_stats().peak - before);
}

}  // namespace

void run_at(const Config& c, std::vector<Result>& out) {
  const auto ms = [](double s) { return s * 1e3; };
  {
    const Inputs f32 = inputs(12, 1024, 64, duet::DType::f32);
    const Inputs b16 = inputs(12, 1024, 64, duet::DType::bf16);
    const auto t =
        time_interleaved({step(f32, true, true), step(f32, false, true), step(f32, true, false),
                          step(f32, false, false), step(b16, true, true)},
                         c.reps);
    // The fused kernels are what an eager call runs: mode "eager" (peers.py compares those).
    const char* names[] = {"eager", "composite", "eager", "composite", "eager"};
    const char* metrics[] = {"fwd_bwd_ms", "fwd_bwd_ms", "fwd_ms", "fwd_ms", "fwd_bwd_ms"};
    for (int i = 0; i < 5; ++i) {
      Result r = base("AT", names[i], c, metrics[i]);
      r.variant = i == 4 ? "L1024 h12 bf16" : "L1024 h12";
      out.push_back(summarize(r, t[static_cast<size_t>(i)], ms));
    }
  }
  {
    const Inputs big = inputs(1, 4096, 64, duet::DType::f32);
    for (bool fused : {true, false}) {
      const auto body = step(big, fused, true);
      Result m = base("AT", fused ? "eager" : "composite", c, "held_MiB");
      m.variant = "L4096 h1";
      const double mib = held_bytes(body) / (1 << 20);
      m.median = m.min = m.max = mib;
      out.push_back(m);
      Result r = base("AT", fused ? "eager" : "composite", c, "fwd_bwd_ms");
      r.variant = "L4096 h1";
      out.push_back(summarize(r, time_reps(body, std::max(3, c.reps / 2), 1), ms));
    }
  }
}

}  // namespace bench
