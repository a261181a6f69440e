// DP (not a standard workload; run under mpirun): data-parallel training of the W4 MLP
// (784-1024-1024-10, ReLU, softmax cross-entropy, SGD lr 0.01) at a global batch of 256, split
// over the ranks, written as a user writes it: nn::Linear layers, optim::SGD,
// nn::DistributedDataParallel, and compile over the plain step. Per rank, one step of batch
// 256 / world_size(), eager and compiled; and the compiled step under no_sync() (no
// communication), so that the difference is what the gradient all-reduces cost. Rank 0 reports;
// with one process (no mpirun) it is the single-process baseline at batch 256. Also the time of
// one small collective: an all-reduce of one float.
//   mpirun -np 2 --oversubscribe ./build/bench/duet_bench --only DP --threads 1
//   ./build/bench/duet_bench --only DP --threads 2
#include <cstdio>
#include <functional>

#include "bench/bench.h"
#include "duet.h"

namespace bench {

using duet::Tensor;

namespace {

// One data-parallel trainer: the model, DDP over it, SGD, and the compiled plain step.
struct Trainer {
  duet::nn::Sequential m;
  duet::nn::DistributedDataParallel ddp;
  duet::optim::SGD opt;
  duet::Compiled<std::function<Tensor(Tensor, Tensor)>> step;
  Trainer(bool overlap, double bucket_cap_mb)
      : m((duet::manual_seed(5), duet::nn::Linear(784, 1024)), duet::nn::ReLU(),
          duet::nn::Linear(1024, 1024), duet::nn::ReLU(), duet::nn::Linear(1024, 10)),
        ddp(m, {.bucket_cap_mb = bucket_cap_mb, .overlap = overlap}),
        opt(m.parameters(), {.lr = 0.01}),
        step(duet::compile(std::function<Tensor(Tensor, Tensor)>(
            [this](Tensor x, Tensor y) { return plain(x, y); }))) {}
  Tensor plain(const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = duet::cross_entropy(m(x), y);
    loss.backward();
    opt.step();
    return loss;
  }
};

}  // namespace

void run_dp(const Config& c, std::vector<Result>& out) {
  duet::dist::init();
  const int world = duet::dist::world_size(), rank = duet::dist::rank();
  const int64_t global = 256, local = global / world;
  // As users get it (buckets of 25 MiB after a first of 1: two here), and with buckets of
  // 2 MiB (four), whose all-reduces can overlap the backward, or not.
  Trainer user(true, 25), over(true, 2), sync(false, 2);
  duet::manual_seed(100 + rank);
  const Tensor x = duet::randn({local, 784});
  const Tensor y = duet::randint(10, {local});
  auto eager = [&] { (void)user.plain(x, y); };
  auto compiled = [&] { (void)user.step(x, y); };
  auto compiled_over = [&] { (void)over.step(x, y); };
  auto compiled_sync = [&] { (void)sync.step(x, y); };
  // The same compiled function under no_sync(): its own trace, with no all-reduce in it.
  auto local_only = [&] {
    auto guard = user.ddp.no_sync();
    (void)user.step(x, y);
  };
  for (int i = 0; i < warmup_calls(); ++i) {
    compiled();
    compiled_over();
    compiled_sync();
    local_only();
  }
  wait_codegen();
  duet::dist::barrier();
  // Time blocked in the all-reduces, per step, with and without overlap.
  auto blocked_ms = [&](const std::function<void()>& f) {
    const int64_t b0 = duet::dist::detail::g_blocked_ns.load();
    for (int i = 0; i < c.reps; ++i) f();
    return double(duet::dist::detail::g_blocked_ns.load() - b0) / 1e6 / c.reps;
  };
  const double blocked_over = blocked_ms(compiled_over), blocked_sync = blocked_ms(compiled_sync);
  const auto t =
      time_interleaved({eager, compiled, compiled_over, compiled_sync, local_only}, c.reps, 2);
  for (auto [mode, v] : {std::pair{"compiled_cap2", blocked_over},
                         std::pair{"compiled_cap2_no_overlap", blocked_sync}}) {
    Result r = base("DP", mode, c, "ms_blocked_in_all_reduce");
    r.variant = fmt::format("world{}", world);
    out.push_back(single(r, v));
  }
  const char* names[] = {"eager", "compiled", "compiled_cap2", "compiled_cap2_no_overlap",
                         "compiled_no_sync"};
  for (size_t k = 0; k < 5; ++k) {
    Result r = base("DP", names[k], c, "ms_per_step");
    r.variant = fmt::format("world{}", world);
    out.push_back(summarize(r, t[k], [](double s) { return s * 1e3; }));
    Result sps = base("DP", names[k], c, "samples_per_s");
    sps.variant = r.variant;
    out.push_back(summarize(sps, t[k], [&](double s) { return double(global) / s; }));
  }
  // One collective alone: an all-reduce of one float, 1000 of them per timed call; what a small
  // collective costs, its fingerprint exchange included (docs/distributed.md).
  const Tensor one = duet::ones({1});
  const auto small = time_interleaved({[&] {
                                        for (int i = 0; i < 1000; ++i)
                                          (void)duet::dist::all_reduce(one);
                                      }},
                                      c.reps, 1);
  Result ar = base("DP", "all_reduce_1_float", c, "us_per_call");
  ar.variant = fmt::format("world{}", world);
  out.push_back(summarize(ar, small[0], [](double s) { return s * 1e3; }));
  if (rank == 0) {
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2] * 1e3;
    };
    const double none = med(t[4]), ov = med(t[2]), sy = med(t[3]);
    std::fprintf(stderr,
                 "DP: %d ranks x batch %lld, %d threads each: eager %.2f ms, compiled %.2f ms "
                 "(%zu buckets), without all-reduces %.2f ms; in %zu buckets of 2 MiB the "
                 "all-reduces cost %.2f ms waited at once and %.2f ms overlapped with backward; "
                 "blocked in them %.2f ms per step waited at once, %.2f ms overlapped\n",
                 world, static_cast<long long>(local), c.threads, med(t[0]), med(t[1]),
                 user.ddp.buckets().size(), none, over.ddp.buckets().size(), sy - none, ov - none,
                 blocked_sync, blocked_over);
  }
}

}  // namespace bench
