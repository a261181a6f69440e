// Data-parallel training (docs/distributed.md): each rank trains the same MLP on its own shard of
// the data, and DistributedDataParallel averages the gradients over the ranks inside the
// compiled step. Run it on 2 processes, or alone (a world of one):
//   mpirun -np 2 ./build/samples/ddp
//   ./build/samples/ddp
// It checks itself: after training, every rank holds the same parameters, and the loss fell.
#include <cstdio>

#include "duet.h"

using namespace duet;

int main() {
  dist::init();
  const int rank = dist::rank(), world = dist::world_size();
  // A synthetic task: 4096 points in 16 dims, labelled by which of 4 random directions they
  // lean towards most. Every rank makes the same data set (same seed) and takes its shard.
  manual_seed(0);
  const Tensor xs = randn({4096, 16});
  const Tensor ys = argmax(matmul(xs, randn({16, 4})), 1);
  data::DataLoader loader(xs, ys, 64, data::DistributedSampler(4096, world, rank, true, 42));

  manual_seed(1 + rank);  // different starts on purpose: DDP copies rank 0's parameters
  nn::Sequential model(nn::Linear(16, 64), nn::ReLU(), nn::Linear(64, 4));
  nn::DistributedDataParallel ddp(model);
  optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto step = compile([&](Tensor x, Tensor y) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model(x), y);
    loss.backward();  // each bucket's all-reduce runs as backward completes it
    opt.step();
    return dist::all_reduce(loss.detach(), dist::ReduceOp::Mean);
  });
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    double sum = 0;
    int64_t n = 0;
    for (auto [x, y] : loader) {
      sum += step(x, y).item<double>();
      ++n;
    }
    if (epoch == 0) first = sum / n;
    last = sum / n;
    if (rank == 0)
      std::printf("epoch %d: mean loss %.4f over %lld batches per rank, %d rank(s)\n", epoch,
                  sum / n, static_cast<long long>(n), world);
  }
  // Every rank must hold rank 0's parameters.
  double spread = 0;
  for (const Tensor& p : model.parameters())
    spread += max(abs(p - dist::broadcast(p, 0))).item<double>();
  spread = dist::all_reduce(full({}, spread), dist::ReduceOp::Max).item<double>();
  if (rank == 0)
    std::printf("parameters differ across ranks by %g; %zu gradient bucket(s), %d trace(s)\n",
                spread, ddp.buckets().size(), static_cast<int>(step.stats().traces));
  return spread == 0 && last < first ? 0 : 1;
}
