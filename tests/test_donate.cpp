// Intermediates in dead write-back targets (Note [Intermediates in dead write-back targets] in
// trace/plan/plan_build.cpp): the planner's regions, a training step that keeps its activations
// in the .grad buffers before its gradients are computed there, with the same results bit for
// bit, an argument sharing a target's storage, and a captured tensor given new storage.
#include <map>

#include <doctest/doctest.h>

#include "trace/plan/memory_plan.h"
#include "util.h"

namespace duet::test {
namespace {

using detail::BufferRequest;
using detail::DonatedRegion;

// The 12-block MLP of docs/memory.md: Linear(512, 512) + ReLU blocks and a head, Adam.
struct Mlp12 {
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<optim::Adam> opt;
  explicit Mlp12(int64_t width) {
    manual_seed(21);
    for (int i = 0; i < 13; ++i) {
      model->push_back(nn::Linear(width, width));
      model->push_back(nn::ReLU());
    }
    model->push_back(nn::Linear(width, 10));
    opt = std::make_unique<optim::Adam>(model->parameters());
  }
  Tensor step(const Tensor& x, const Tensor& y) { return classifier_step(*model, *opt, x, y); }
};

}  // namespace

TEST_CASE("memory planner: buffers go in a donated region only within its window") {
  // Three buffers of 1000 bytes; a region of 2048 bytes free from step 1 to step 4.
  std::vector<BufferRequest> req(3);
  req[0] = {1000, 0, 2, -1, 0};  // begins before the window: the arena
  req[1] = {1000, 1, 3, -1, 0};  // inside it
  req[2] = {1000, 2, 5, -1, 0};  // ends after it: the arena
  const std::vector<DonatedRegion> regions = {{2048, 1, 4, 0}};
  const detail::MemoryPlan plan = detail::plan_memory(req, regions);
  CHECK(detail::check_memory_plan(req, plan, regions) == "");
  CHECK(plan.region[0] == -1);
  CHECK(plan.region[1] == 0);
  CHECK(plan.region[2] == -1);
  CHECK(plan.arena_bytes == 2048);  // two buffers, live together
  // The checker refuses a buffer outside its region's window, and two live buffers overlapping
  // in one region.
  detail::MemoryPlan outside = plan;
  outside.region[2] = 0;
  outside.offsets[2] = 1024;
  CHECK(detail::check_memory_plan(req, outside, regions).find("outside its window") !=
        std::string::npos);
  std::vector<BufferRequest> two = {{1000, 1, 2, -1, 0}, {1000, 2, 3, -1, 0}};
  detail::MemoryPlan both = detail::plan_memory(two, regions);
  CHECK(both.region == std::vector<int32_t>{0, 0});
  CHECK(both.offsets[0] != both.offsets[1]);
  both.offsets[1] = both.offsets[0];
  CHECK(detail::check_memory_plan(two, both, regions).find("overlap") != std::string::npos);
}

TEST_CASE("donate: a training step keeps its activations in .grad, 0.8x eager, bit for bit") {
  // The 12-block MLP over batches of 256 and 96 (an epoch's short last batch). Its gradients
  // (13 MiB) count in both faces; eagerly the activations come on top of them, compiled they
  // live in the .grad buffers of the layers whose gradients come later in the backward.
  Mlp12 e(512), c(512);
  std::map<int64_t, std::pair<Tensor, Tensor>> batch;
  manual_seed(22);
  for (int64_t b : {256, 96}) batch[b] = {randn({b, 512}), randint(10, {b})};
  auto f = compile([&](const Tensor& x, const Tensor& y) { return c.step(x, y); });
  auto run = [&](auto&& step) {
    const int64_t base = cpu_memory_stats().current;
    for (int64_t b : {256, 96}) step(batch[b].first, batch[b].second);  // warm-up
    reset_peak_memory();
    for (int64_t b : {256, 96}) step(batch[b].first, batch[b].second);
    return cpu_memory_stats().peak - base;
  };
  const int64_t eager = run([&](const Tensor& x, const Tensor& y) { return e.step(x, y); });
  const int64_t compiled = run(f);
  CAPTURE(eager);
  CAPTURE(compiled);
  CHECK(compiled <= eager * 8 / 10);
  const MemoryReport r = f.memory_report();
  CAPTURE(r.str());
  CHECK(r.donated_bytes > 0);
  CHECK(r.str().find("placed in write-back targets") != std::string::npos);
  const auto pe = e.model->parameters(), pc = c.model->parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(pe[i], pc[i]));
    CHECK(bitwise_equal(pe[i].grad(), pc[i].grad()));
  }
  // Without the pass, the same step needs the larger arena.
  Mlp12 d(512);
  CompileOptions o;
  o.disable_passes = {"donate"};
  auto g = compile([&](const Tensor& x, const Tensor& y) { return d.step(x, y); }, o);
  g(batch[256].first, batch[256].second);
  CHECK(g.memory_report().donated_bytes == 0);
  CHECK(g.memory_report().arena_bytes > r.arena_bytes + 4 * 512 * 256 * 4);
}

TEST_CASE("donate: an argument sharing a target's storage is read as it was") {
  // t is written back (its old value unread), so its bytes hold f's intermediates until then;
  // called with t itself as the argument, the steps would read those instead of x.
  manual_seed(23);
  Tensor t = randn({128, 128});
  auto fn = [&](const Tensor& x) {
    Tensor a = exp(x) * 3.0;
    Tensor b = matmul(a, a);
    Tensor c = tanh(b) + x;
    t.copy_(matmul(c, x));
    return c.sum();
  };
  const Tensor t0 = t.clone();
  Tensor want_t = t0.clone();
  Tensor want;
  {
    // Eagerly, on a copy: x is t's old value throughout (it is read before t is written).
    Tensor a = exp(t0) * 3.0;
    Tensor b = matmul(a, a);
    Tensor c = tanh(b) + t0;
    want_t = matmul(c, t0);
    want = c.sum();
  }
  auto f = compile(fn);
  const Tensor got = f(t);
  CHECK(f.memory_report().donated_bytes > 0);
  CHECK(bitwise_equal(got, want));
  CHECK(bitwise_equal(t, want_t));
}

TEST_CASE("compile: a captured tensor given new storage (Module::to) is retraced") {
  // Plans hold views of the storage they were built over (static views of parameters, and
  // intermediates in the .grad buffers): after a round trip through f64 the old plan computed
  // with the old weights.
  auto make = [] {
    manual_seed(24);
    return std::make_shared<nn::Sequential>(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 10));
  };
  auto em = make(), cm = make();
  optim::SGD eo(em->parameters(), {.lr = 0.1}), co(cm->parameters(), {.lr = 0.1});
  manual_seed(25);
  const Tensor x = randn({32, 64}), y = randint(10, {32});
  const auto step = classifier_step;
  auto f = compile([&](const Tensor& in, const Tensor& t) { return step(*cm, co, in, t); });
  for (int s = 0; s < 2; ++s) CHECK(close(step(*em, eo, x, y), f(x, y), 1e-5));
  for (auto* m : {em.get(), cm.get()}) {
    m->to(DType::f64);
    m->to(DType::f32);
  }
  for (int s = 0; s < 2; ++s) CHECK(close(step(*em, eo, x, y), f(x, y), 1e-5));
  CHECK(f.stats().traces == 2);
  const CacheExplanation why = f.explain();
  REQUIRE(why.retraces.size() == 1);
  CHECK(why.retraces[0].find("was given new storage") != std::string::npos);
}

}  // namespace duet::test
