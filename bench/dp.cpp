// DP (not a standard workload; run under mpirun): data-parallel training of the W4 MLP
// (784-1024-1024-10, ReLU, softmax cross-entropy, SGD lr 0.01) at a global batch of 256, split
// over the ranks, written as a user writes it: nn::Linear layers, optim::SGD,
// nn::DistributedDataParallel, and compile over the plain step. Per rank, one step of batch
// 256 / world_size(), eager and compiled; and the compiled step under no_sync() (no
// communication), so that the difference is what the gradient all-reduces cost. Rank 0 reports;
// with one process (no mpirun) it is the single-process baseline at batch 256.
//   mpirun -np 2 --oversubscribe ./build/bench/duet_bench --only DP --threads 1
//   ./build/bench/duet_bench --only DP --threads 2
#include <cstdio>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

void run_dp(const Config& c, std::vector<Result>& out) {
  duet::dist::init();
  const int world = duet::dist::world_size(), rank = duet::dist::rank();
  const int64_t global = 256, local = global / world;
  duet::manual_seed(5);  // every rank draws the same model; DDP broadcasts rank 0's anyway
  duet::nn::Sequential m(duet::nn::Linear(784, 1024), duet::nn::ReLU(), duet::nn::Linear(1024, 1024),
                         duet::nn::ReLU(), duet::nn::Linear(1024, 10));
  duet::nn::DistributedDataParallel ddp(m);
  duet::optim::SGD opt(m.parameters(), {.lr = 0.01});
  duet::manual_seed(100 + rank);
  const Tensor x = duet::randn({local, 784});
  const Tensor y = duet::randint(10, {local});
  auto plain = [&](const Tensor& xs, const Tensor& ys) {
    opt.zero_grad();
    Tensor loss = duet::cross_entropy(m(xs), ys);
    loss.backward();
    opt.step();
    return loss;
  };
  auto step = duet::compile([&](Tensor xs, Tensor ys) { return plain(xs, ys); });
  auto eager = [&] { (void)plain(x, y); };
  auto compiled = [&] { (void)step(x, y); };
  // The same compiled function under no_sync(): its own trace, with no all-reduce in it.
  auto local_only = [&] {
    auto guard = ddp.no_sync();
    (void)step(x, y);
  };
  for (int i = 0; i < warmup_calls(); ++i) {
    compiled();
    local_only();
  }
  wait_codegen();
  duet::dist::barrier();
  const auto t = time_interleaved({eager, compiled, local_only}, c.reps, 2);
  const char* names[] = {"eager", "compiled", "compiled_no_sync"};
  for (size_t k = 0; k < 3; ++k) {
    Result r = base("DP", names[k], c, "ms_per_step");
    r.variant = fmt::format("world{}", world);
    out.push_back(summarize(r, t[k], [](double s) { return s * 1e3; }));
    Result sps = base("DP", names[k], c, "samples_per_s");
    sps.variant = r.variant;
    out.push_back(summarize(sps, t[k], [&](double s) { return double(global) / s; }));
  }
  if (rank == 0) {
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::fprintf(stderr,
                 "DP: %d ranks x batch %lld, %zu buckets, %d threads each: eager %.2f ms, "
                 "compiled %.2f ms, compiled without all-reduce %.2f ms per step (the all-reduces "
                 "cost %.0f%% of the compiled step)\n",
                 world, static_cast<long long>(local), ddp.buckets().size(), c.threads,
                 med(t[0]) * 1e3, med(t[1]) * 1e3, med(t[2]) * 1e3,
                 100.0 * (med(t[1]) - med(t[2])) / med(t[1]));
  }
}

}  // namespace bench
