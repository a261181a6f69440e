// duet::dist in one process: the world of one (collectives return their input, eagerly and
// compiled, with gradients), the errors of misuse, and the TCP rendezvous that hands NCCL's id
// to the ranks (three threads here). tests/test_dist_mpi.cpp runs the collectives across
// processes under mpirun.
#include <thread>

#include "util.h"

using namespace duet;
using namespace duet::test;

TEST_CASE("dist: before init, a collective says to call init()") {
  if (dist::is_initialized()) return;  // another case of this binary ran first
  const std::string m = error_of<Error>([] { (void)dist::all_reduce(ones({2})); });
  CHECK(contains(m, "[all_reduce] no process group: call duet::dist::init() first"));
  CHECK(contains(error_of<Error>([] { (void)dist::rank(); }), "[dist.rank] no process group"));
}

TEST_CASE("dist: a process started alone is a world of one") {
  dist::init();
  CHECK(dist::is_initialized());
  CHECK(dist::rank() == 0);
  CHECK(dist::world_size() == 1);
  CHECK(dist::launcher() == "single");
  CHECK(dist::backend(DeviceType::CPU) == "local");
  dist::barrier();
  const Tensor x = reshape(arange(6).to(DType::f32), {2, 3});
  CHECK(bitwise_equal(dist::all_reduce(x), x));
  CHECK(bitwise_equal(dist::all_reduce(x, dist::ReduceOp::Mean), x));
  CHECK(bitwise_equal(dist::broadcast(x), x));
  CHECK(bitwise_equal(dist::all_gather(x, 1), x));
  CHECK(bitwise_equal(dist::reduce_scatter(x, dist::ReduceOp::Max, 0), x));
  // A strided input and an empty one.
  CHECK(bitwise_equal(dist::all_reduce(transpose(x, 0, 1)), transpose(x, 0, 1).contiguous()));
  CHECK(dist::all_gather(zeros({0, 3})).sizes() == Shape{0, 3});
}

TEST_CASE("dist: misuse names the collective, the shape and the dtype") {
  dist::init();
  const std::string split = error_of<ShapeError>([] {
    dist::InitOptions o;
    (void)o;
    (void)dist::all_gather(ones({}));
  });
  CHECK(contains(split, "[all_gather] needs a tensor with a dim to join along, got a 0-d f32"));
  CHECK(contains(error_of<DTypeError>([] { (void)dist::all_reduce(ones({2}).to(DType::b8)); }),
                 "[all_reduce] cannot sum b8 values over ranks (shape (2))"));
  CHECK(contains(error_of<DTypeError>([] {
                   (void)dist::all_reduce(ones({2}, Options().dtype(DType::i64)),
                                          dist::ReduceOp::Mean);
                 }),
                 "[all_reduce] mean needs a floating tensor, got i64 (2)"));
  CHECK(contains(error_of<ValueError>([] { (void)dist::broadcast(ones({2}), 3); }),
                 "[broadcast] root 3 is not a rank of a world of 1 (shape (2), f32)"));
  CHECK(contains(error_of<ValueError>([] {
                   dist::InitOptions o;
                   o.timeout_s = 0;
                   dist::init(o);
                 }),
                 "[dist.init] timeout_s must be positive, got 0"));
}

TEST_CASE("dist: collectives trace into a compiled step and keep their place") {
  dist::init();
  nn::Linear lin(4, 3);
  optim::SGD opt(lin.parameters(), {.lr = 0.1});
  auto step = compile([&](Tensor x, Tensor y) {
    opt.zero_grad();
    Tensor loss = mse_loss(lin(x), y);
    loss.backward();
    for (Tensor& p : lin.parameters())
      p.grad().copy_(dist::all_reduce(p.grad(), dist::ReduceOp::Mean));
    opt.step();
    // A collective whose value nothing reads is still a collective every rank calls.
    (void)dist::all_gather(x);
    return dist::all_reduce(loss.detach(), dist::ReduceOp::Mean);
  });
  nn::Linear ref(4, 3);
  for (size_t i = 0; i < ref.parameters().size(); ++i)
    ref.parameters()[i].detach().copy_(lin.parameters()[i].detach());
  optim::SGD ref_opt(ref.parameters(), {.lr = 0.1});
  manual_seed(3);
  for (int i = 0; i < 5; ++i) {
    const Tensor x = randn({8, 4}), y = randn({8, 3});
    ref_opt.zero_grad();
    Tensor l = mse_loss(ref(x), y);
    l.backward();
    ref_opt.step();
    CHECK(step(x, y).item<double>() == doctest::Approx(l.item<double>()).epsilon(1e-6));
  }
  const std::string g = step.graph().str();
  CHECK(contains(g, "all_reduce"));
  CHECK(contains(g, "all_gather"));  // kept though unread
  CHECK(step.stats().traces == 1);
  // Gradients through the collectives.
  const Tensor w = randn({3, 2}, Options().dtype(DType::f64)).requires_grad_();
  sum(dist::all_gather(w, 1) * 2.0).backward();
  CHECK(values(w.grad()) == std::vector<double>(6, 2.0));
}

TEST_CASE("dist: the TCP rendezvous hands rank 0's bytes to every rank, or times out naming who") {
  const int port = 29500 + static_cast<int>(::getpid() % 2000);
  std::vector<std::string> got(3, std::string(16, '\0'));
  got[0] = "0123456789abcdef";
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      try {
        dist::detail::tcp_broadcast(got[r], r, 3, "127.0.0.1", port, 20);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    CHECK_MESSAGE(errors[r].empty(), errors[r]);
    CHECK(got[r] == "0123456789abcdef");
  }
  // Rank 2 never comes.
  std::string e0, e1;
  std::string b0 = "abcd", b1 = "....";
  std::thread t0([&] {
    try {
      dist::detail::tcp_broadcast(b0, 0, 3, "127.0.0.1", port + 1, 1.0);
    } catch (const DistError& e) {
      e0 = e.what();
    }
  });
  std::thread t1([&] {
    try {
      dist::detail::tcp_broadcast(b1, 1, 3, "127.0.0.1", port + 1, 5.0);
    } catch (const DistError& e) {
      e1 = e.what();
    }
  });
  t0.join();
  t1.join();
  CHECK_MESSAGE(contains(e0, "[dist.init] timed out after 1 s at the rendezvous 127.0.0.1:"), e0);
  CHECK(contains(e0, "waiting for rank 2"));
  CHECK(b1 == "abcd");  // rank 1 was served before rank 0 gave up
  // Nobody listens.
  std::string lone = "xx";
  CHECK(contains(error_of<DistError>(
                     [&] { dist::detail::tcp_broadcast(lone, 1, 2, "127.0.0.1", port + 2, 0.3); }),
                 "timed out after 0.3 s connecting to rank 0"));
}

TEST_CASE("dist: DistributedSampler follows torch: shards, padding or dropping, epochs") {
  // 10 rows over 3 ranks without shuffling: padded to 12 with rows 0 and 1.
  auto rows = [](const data::DistributedSampler& s, uint64_t epoch) {
    return values(s.indices(epoch));
  };
  CHECK(rows(data::DistributedSampler(10, 3, 0, false), 0) == std::vector<double>{0, 3, 6, 9});
  CHECK(rows(data::DistributedSampler(10, 3, 1, false), 0) == std::vector<double>{1, 4, 7, 0});
  CHECK(rows(data::DistributedSampler(10, 3, 2, false), 0) == std::vector<double>{2, 5, 8, 1});
  // drop_last: 9 rows used, 3 each.
  CHECK(rows(data::DistributedSampler(10, 3, 2, false, 0, true), 0) ==
        std::vector<double>{2, 5, 8});
  // Shuffled: the ranks' shares of one epoch are disjoint and cover every row; another epoch is
  // another order; the same seed and epoch give the same order.
  std::vector<double> all;
  for (int r = 0; r < 2; ++r)
    for (double v : rows(data::DistributedSampler(10, 2, r, true, 5), 3)) all.push_back(v);
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(rows(data::DistributedSampler(10, 2, 0, true, 5), 3) !=
        rows(data::DistributedSampler(10, 2, 0, true, 5), 4));
  CHECK(rows(data::DistributedSampler(10, 2, 0, true, 5), 3) ==
        rows(data::DistributedSampler(10, 2, 0, true, 5), 3));
  CHECK(data::DistributedSampler(0, 2, 1).num_samples() == 0);
  CHECK(contains(error_of<ValueError>([] { data::DistributedSampler(10, 2, 2); }),
                 "[DistributedSampler] rank 2 is not in [0, 2) (num_replicas)"));
  // In a world of one, the defaults are this process.
  dist::init();
  CHECK(data::DistributedSampler(4).num_samples() == 4);
}

TEST_CASE("dist: a post-accumulate-grad hook sees each leaf's whole gradient once") {
  Tensor w = ones({3}).requires_grad_();
  std::vector<double> seen;
  const int64_t h = w.register_post_accumulate_grad_hook(
      [&](const Tensor& leaf) { seen.push_back(values(leaf.grad())[0]); });
  sum(w * 2.0 + w * 3.0).backward();  // two uses, one hook call with the sum
  CHECK(seen == std::vector<double>{5});
  sum(w).backward();  // accumulated: 5 + 1
  CHECK(seen == std::vector<double>{5, 6});
  w.remove_post_accumulate_grad_hook(h);
  sum(w).backward();
  CHECK(seen.size() == 2);
  CHECK(contains(error_of<ValueError>([] {
                   (void)ones({2}).register_post_accumulate_grad_hook([](const Tensor&) {});
                 }),
                 "needs a leaf that requires grad"));
  CHECK(contains(error_of<Error>([] { detail::at_backward_end([] {}); }),
                 "[at_backward_end] called outside a backward"));
}

// Run alone by the ctest entry test_dist_env, with RANK=1 WORLD_SIZE=2 and a MASTER_ADDR in the
// environment and no mpirun.
TEST_CASE("dist env: a torchrun-style launch without MPI says CPU collectives need mpirun" *
          doctest::skip(std::getenv("DUET_DIST_ENV_CASE") == nullptr)) {
  dist::init();
  CHECK(dist::launcher() == "env");
  CHECK(dist::rank() == 1);
  CHECK(dist::world_size() == 2);
  CHECK(dist::backend(DeviceType::CPU) == "none");
  const std::string m = error_of<DeviceError>([] { (void)dist::all_reduce(ones({2})); });
  CHECK(contains(m,
                 "[all_reduce] no transport for cpu tensors: CPU collectives in a world of 2 "
                 "processes need MPI: launch with mpirun (this process was started by "
                 "RANK/WORLD_SIZE from the environment)"));
}

TEST_CASE("dist: DistributedDataParallel recovers from a backward that threw") {
  dist::init();
  nn::Linear lin(3, 2);
  nn::DistributedDataParallel ddp(lin);
  // A gradient hook that throws in the middle of a backward, once.
  bool fail = true;
  const int64_t h = lin.bias.register_post_accumulate_grad_hook([&](const Tensor&) {
    if (fail) throw ValueError("[test] a failing hook");
  });
  const Tensor x = ones({4, 3});
  CHECK(contains(error_of<ValueError>([&] { sum(lin(x)).backward(); }), "a failing hook"));
  fail = false;
  lin.weight.set_grad(Tensor());
  lin.bias.set_grad(Tensor());
  sum(lin(x)).backward();  // a new backward: the buckets start afresh and all complete
  CHECK(dist::detail::g_started.load() == 0);  // every started all-reduce was waited for
  // Every later backward reduces its bucket again (once stuck, none did: the gradients were
  // silently left unaveraged).
  const int64_t after = ddp.reductions();
  sum(lin(x)).backward();
  sum(lin(x)).backward();
  CHECK(ddp.reductions() == after + 2);
  // Three backwards accumulated (the failed one's gradients were cleared).
  check_tensor(lin.weight.grad(), {2, 3}, DType::f32, std::vector<double>(6, 12));
  check_tensor(lin.bias.grad(), {2}, DType::f32, {12, 12});
  lin.bias.remove_post_accumulate_grad_hook(h);
}
