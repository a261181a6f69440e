// The static graph's speed passes, as behaviour: fusion (what fuses, exact results), the
// memory planner (one arena, reuse), and parameter hoisting (done once per parameter version).
// Speed itself is measured in bench/, never here.
//
// ctest runs this file twice: test_fusion with DUET_CODEGEN=0 (the interpreter) and
// test_fusion_codegen with DUET_CODEGEN=1 and DUET_CODEGEN_THRESHOLD=0, where every fused
// kernel is generated after its first run. Each check then runs a second time, after
// codegen::wait_idle(), on the generated code, and must give the same bits (random programs of
// the fusion mix: eager's values, within their tolerance).
#include <algorithm>
#include <string>
#include <vector>

#include "trace/plan/codegen.h"
#include "kernels/fused.h"
#include "kernels/matrices.h"
#include "long_sums.h"
#include "trace/compile.h"
#include "trace/plan/fusion.h"
#include "random_program.h"
#include "trace/plan/memory_plan.h"
#include "util.h"

namespace duet::test {
namespace {

// Fused reductions add in another order than eager's: a looser tolerance than test_compile's.
bool near(const Tensor& a, const Tensor& b) { return close(a, b, 1e-5); }
CompileOptions without(std::vector<std::string> passes) {
  CompileOptions o;
  o.disable_passes = std::move(passes);
  return o;
}

// How many times each check runs: twice when generated kernels can be swapped in.
int tiers() {
  if (!codegen::enabled()) return 1;
  codegen::set_threshold(0);  // generated after the first run
  return 2;
}
// Between the tiers: wait until every queued kernel is built and loaded.
void next_tier() {
  codegen::wait_idle();
  CHECK(codegen::stats().failed == 0);
}

Tensor w2(const Tensor& x) { return tanh(x * 1.5 + 0.5) * sigmoid(x) + relu(x - 0.25); }

// The steps of a plan over g: each fusion group one step, every other node its own. Empty when
// they can be ordered (no group needs a result of a step that needs one of its own), otherwise
// the groups left on a cycle.
std::string step_cycle(const Graph& g, const std::vector<detail::FusionGroup>& groups) {
  const size_t n = g.nodes.size(), units = n + groups.size();
  std::vector<size_t> unit(n);
  for (size_t v = 0; v < n; ++v) unit[v] = v;
  for (size_t k = 0; k < groups.size(); ++k)
    for (int32_t m : groups[k].members) unit[size_t(m)] = n + k;
  std::vector<std::vector<size_t>> next(units);
  std::vector<int> indeg(units, 0);
  for (size_t v = 0; v < n; ++v)
    for (int32_t in : g.nodes[v].inputs) {
      const size_t a = unit[size_t(in)], b = unit[v];
      if (a == b || std::find(next[a].begin(), next[a].end(), b) != next[a].end()) continue;
      next[a].push_back(b);
      ++indeg[b];
    }
  std::vector<size_t> ready;
  for (size_t u = 0; u < units; ++u)
    if (indeg[u] == 0) ready.push_back(u);
  size_t ordered = 0;
  while (!ready.empty()) {
    const size_t u = ready.back();
    ready.pop_back();
    ++ordered;
    for (size_t w : next[u])
      if (--indeg[w] == 0) ready.push_back(w);
  }
  if (ordered == units) return "";
  std::string left;
  for (size_t k = 0; k < groups.size(); ++k)
    if (indeg[n + k] > 0)
      left += fmt::format(" group {} (values {})", k, fmt::join(groups[k].members, ", "));
  return fmt::format("{} of {} steps ordered; on a cycle:{}", ordered, units, left);
}

}  // namespace

TEST_CASE("fusion: the W2 chain is one kernel whose results equal eager's bit for bit") {
  for (int64_t n : {1, 7, 100, 5000, 70001}) {
    manual_seed(n);
    Tensor x = randn({n});
    auto f = compile(w2);
    auto g = compile(w2, without({"fuse"}));  // eight kernels, the same values
    for (int t = 0; t < tiers(); ++t, next_tier()) {
      Tensor y = f(x);
      CHECK(f.stats().fused_kernels == 1);
      CHECK(f.stats().fused_nodes == 8);
      CHECK(bitwise_equal(y, w2(x)));
      CHECK(g.stats().fused_kernels == 0);
      CHECK(bitwise_equal(g(x), y));
    }
  }
  if (codegen::enabled()) CHECK(codegen::stats().loaded >= 1);
}

TEST_CASE("fusion: broadcasts, strided inputs and b8 values ride inside a group") {
  manual_seed(1);
  Tensor a = randn({33, 65});
  Tensor b = randn({65});
  Tensor c = randn({33, 1});
  Tensor t = transpose(randn({65, 33}), 0, 1);  // strided: read through its strides
  auto fn = [](Tensor a, Tensor b, Tensor c, Tensor t) {
    Tensor m = a > b;
    return where(m, a * c, t - b) + m.to(DType::f32);
  };
  auto f = compile(fn);
  for (int i = 0; i < tiers(); ++i, next_tier()) {
    CHECK(bitwise_equal(f(a, b, c, t), fn(a, b, c, t)));
    CHECK(f.stats().fused_kernels == 1);
  }
}

TEST_CASE("fusion: reductions take their elementwise prologue") {
  manual_seed(2);
  Tensor x = randn({64, 300}), y = randn({64, 300});
  Tensor labels = randint(300, {64});
  // sum(x * y) over everything, over rows (inner), over columns (outer).
  auto all = compile([](Tensor x, Tensor y) { return sum(x * y); });
  auto rows = compile([](Tensor x, Tensor y) { return sum(x * y, {1}); });
  auto cols = compile([](Tensor x, Tensor y) { return max(exp(x) - y, {0}); });
  // softmax: the exp-and-sum and the normalization fuse. cross_entropy: its log_softmax is one
  // op (Note [log_softmax] in core/ops/nn.cpp), and the gather and the mean after it fuse.
  auto sm = compile([](Tensor x) { return softmax(x, 1); });
  auto ce = compile([](Tensor x, Tensor l) { return cross_entropy(x, l); });
  for (int t = 0; t < tiers(); ++t, next_tier()) {
    CHECK(near(all(x, y), sum(x * y)));
    CHECK(all.stats().fused_kernels == 1);
    CHECK(near(rows(x, y), sum(x * y, {1})));
    CHECK(rows.stats().fused_kernels == 1);
    CHECK(near(cols(x, y), max(exp(x) - y, {0})));
    CHECK(cols.stats().fused_kernels == 1);
    CHECK(near(sm(x), softmax(x, 1)));
    CHECK(sm.stats().fused_kernels >= 2);
    CHECK(near(ce(x, labels), cross_entropy(x, labels)));
    CHECK(ce.stats().fused_kernels >= 1);
  }
}

TEST_CASE("fusion: eq of integers joins an f32 group where f32 decides it exactly") {
  // Note [Integer equality in registers]: cross_entropy's gradient compares an arange with the
  // targets; 2^24 + 1 rounds to 2^24 in f32, so a constant 2^24 must not be compared there.
  const int64_t big = int64_t(1) << 24;
  Tensor g = randn({5, 1});
  Tensor idx = tensor({1.0, double(big + 1), double(-(big + 1)), 3.0, double(big)},
                      Options().dtype(DType::i64))
                   .reshape({5, 1});
  auto by_arange = [](Tensor g, Tensor idx) {
    return sum(where(eq(arange(6).reshape({1, 6}), idx), g, 0.0), {1});
  };
  auto by_big_constant = [big](Tensor g, Tensor idx) {
    // (folded into a constant of the graph)
    Tensor c = full({1, 2}, double(big - 1), Options().dtype(DType::i64)) + 1;
    return sum(where(eq(c, idx), g, 0.0), {1});
  };
  auto by_inputs = [](Tensor g, Tensor idx, Tensor other) {
    return sum(where(ne(other, idx), g, 0.0), {1});
  };
  Tensor other = tensor({0.0, double(big), 7.0}, Options().dtype(DType::i64)).reshape({1, 3});
  auto f = compile(by_arange);
  auto h = compile(by_big_constant);
  auto k = compile(by_inputs);
  for (int i = 0; i < tiers(); ++i, next_tier()) {
    CHECK(bitwise_equal(f(g, idx), by_arange(g, idx)));
    CHECK(f.stats().fused_kernels == 1);
    CHECK(f.stats().fused_nodes == 3);  // eq, where and sum
    CHECK(bitwise_equal(h(g, idx), by_big_constant(g, idx)));
    CHECK(h.stats().fused_nodes == 2);  // where and sum; eq alone, in i64
    CHECK(bitwise_equal(k(g, idx, other), by_inputs(g, idx, other)));
    CHECK(k.stats().fused_nodes == 2);
  }
}

TEST_CASE("duplicate: a mask of small inputs read by two kernels is computed in both") {
  // Note [Duplicated producers]: log_softmax's gradient of cross_entropy's one-hot mask. Its row
  // sum and the gradient each compute the mask from the targets instead of storing it.
  const int64_t n = 64, c = 512;
  Tensor g = randn({n, 1}), lp = randn({n, c});
  Tensor idx = randint(c, {n, 1});
  auto fn = [c](Tensor g, Tensor idx, Tensor lp) {
    Tensor m = where(eq(arange(c).reshape({1, c}), idx), g, 0.0);
    return m - exp(lp) * sum(m, {1}, true);
  };
  // A product of two large values is not duplicated: recomputing it reads more than it saves.
  auto large = [](Tensor a, Tensor b) {
    Tensor m = a * b;
    return sum(m, {1}) + sum(exp(m), {1});
  };
  auto f = compile(fn), f0 = compile(fn, without({"duplicate"}));
  auto h = compile(large), h0 = compile(large, without({"duplicate"}));
  for (int i = 0; i < tiers(); ++i, next_tier()) {
    CHECK(bitwise_equal(f(g, idx, lp), fn(g, idx, lp)));
    CHECK(bitwise_equal(f0(g, idx, lp), fn(g, idx, lp)));
    CHECK(f.stats().fused_kernels == 2);
    CHECK(f.stats().fused_nodes == f0.stats().fused_nodes + 2);  // the copies of eq and where
    CHECK(f.stats().arena_bytes + n * c * 4 <= f0.stats().arena_bytes);  // no mask stored
    CHECK(bitwise_equal(h(lp, g * lp), large(lp, g * lp)));
    CHECK(bitwise_equal(h0(lp, g * lp), large(lp, g * lp)));
    CHECK(h.stats().fused_nodes == h0.stats().fused_nodes);
  }
}

TEST_CASE("fusion: f16 and bf16 reductions take their prologue and round once, as eager does") {
  // Multiples of 1/8 in [-2, 2): their products are exact in either dtype, and any order of f32
  // additions of 300 of them is exact, so the sums round once to the same value however the
  // fused kernel orders them, and compiled equals eager bit for bit.
  manual_seed(5);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    auto eighths = [low] { return ((randint(32, {64, 300}).to(DType::f32) - 16) * 0.125).to(low); };
    const Tensor x = eighths(), y = eighths();
    auto all = compile([](Tensor a, Tensor b) { return sum(a * b); });
    auto rows = compile([](Tensor a, Tensor b) { return sum(a * b, {1}); });
    auto cols = compile([](Tensor a, Tensor b) { return sum(a * b, {0}); });
    auto top = compile([](Tensor a, Tensor b) { return max(a - b, {0}); });
    for (int t = 0; t < tiers(); ++t, next_tier()) {
      CHECK(bitwise_equal(all(x, y), sum(x * y)));
      CHECK(bitwise_equal(rows(x, y), sum(x * y, {1})));
      CHECK(bitwise_equal(cols(x, y), sum(x * y, {0})));
      CHECK(bitwise_equal(top(x, y), max(x - y, {0})));
      auto one_kernel = [](const auto& f) {  // the product and the reduction
        CHECK(f.stats().fused_kernels == 1);
        CHECK(f.stats().fused_nodes == 2);
      };
      one_kernel(all);
      one_kernel(rows);
      one_kernel(cols);
      one_kernel(top);
    }
  }
}

TEST_CASE("fusion: every f16 and bf16 value through a fused chain, as eager gives it") {
  // Note [f16 with F16C] and [bf16 by its bits] in kernels/codegen/cpu.cpp: the generated loads,
  // roundings and stores convert whole packets and redo the NaN lanes, so that every value (NaNs
  // with payloads, signaling ones, infinities, subnormals) comes out as eager's ops give it.
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dtype_name(low));
    Tensor x = zeros({256, 256}, Options().dtype(low));
    auto* bits = static_cast<uint16_t*>(x.raw_data());
    for (int i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
    auto body = [](Tensor a) {
      return std::vector<Tensor>{(a + 0.0) * 1.0, (a * 0.5).to(DType::f32)};
    };
    auto f = compile(body);
    const std::vector<Tensor> want = body(x);
    for (int t = 0; t < tiers(); ++t, next_tier()) {
      const std::vector<Tensor> got = f(x);
      CHECK(bitwise_equal(got[0], want[0]));
      CHECK(bitwise_equal(got[1], want[1]));
      CHECK(f.stats().fused_kernels == 1);
    }
  }
}

TEST_CASE("fusion: long f32 sums on the interpreter stay within a few ulps, at 1 and 2 threads") {
  const bool was = codegen::enabled();
  codegen::set_enabled(false);
  check_long_sums_compiled(Device::cpu(), false);
  codegen::set_enabled(was);
}

TEST_CASE("fusion: an output that is also an intermediate, and a training step") {
  manual_seed(3);
  Tensor x = randn({8, 16});
  auto fn = [](Tensor x) {
    Tensor h = tanh(x) * 2;
    return std::make_tuple(h, sigmoid(h) + h);
  };
  auto f = compile(fn);
  for (int t = 0; t < tiers(); ++t, next_tier()) {
    auto [h, y] = f(x);
    auto [he, ye] = fn(x);
    CHECK(bitwise_equal(h, he));
    CHECK(bitwise_equal(y, ye));
    CHECK(f.stats().fused_kernels == 1);
  }
}

// The example of Fuser::depends_on (trace/plan/fusion.cpp): A = {a1, a2} and B = {b1, b2} with
// a1 -> b1 and b2 -> a2 have no path between them in the graph, yet as steps A needs B and B
// needs A. Here B is an f64 group {c = f64(a1), b1 = c * y, b2 = exp(y)} (b2 joins as a sibling
// through y) and a2 = a1 + f32(b2) reads it back: a2 may not join a1's group, nor may the group
// of f32(b2) that a2 joins merge with a1's, because the path from f32(b2) to a1 runs through B.
TEST_CASE("fusion: groups never need each other (a cycle through a third group)") {
  auto fn = [](Tensor x, Tensor y) {
    Tensor a1 = tanh(x);
    Tensor b1 = a1.to(DType::f64) * y;
    Tensor b2 = exp(y);
    Tensor a2 = a1 + b2.to(DType::f32);
    return std::make_tuple(b1, a2);
  };
  manual_seed(8);
  Tensor x = randn({3, 41});
  Tensor y = randn({3, 41}, Options().dtype(DType::f64));
  // The fusion pass on the graph the plan is built from (the graph passes run with or without
  // the plan's passes): its groups as steps can be ordered.
  auto unfused = compile(fn, without({"fuse"}));
  (void)unfused(x, y);
  const Graph& g = unfused.graph();
  const std::vector<detail::FusionGroup> groups = detail::find_fusion_groups(g);
  CHECK(step_cycle(g, groups) == "");
  CHECK(groups.size() == 2);  // {f64(a1), b1, b2} and {f32(b2), a2}; a1 alone runs eagerly
  // Compiled, with those groups, the results are eager's.
  auto f = compile(fn);
  for (int t = 0; t < tiers(); ++t, next_tier()) {
    auto [b1, a2] = f(x, y);
    auto [eb1, ea2] = fn(x, y);
    CHECK(bitwise_equal(b1, eb1));
    CHECK(bitwise_equal(a2, ea2));
    CHECK(f.stats().fused_kernels == 2);
  }
}

// The generated kernels on programs nobody wrote by hand: random programs of the fusion mix
// (random_program.h: elementwise chains, diamonds, broadcasts, reductions), in f32 and f64 and
// in bf16 and f16, each run compiled on the interpreter and then, in test_fusion_codegen, on its
// generated kernels, against eager: bf16 and f16 values bit for bit (Note [Low-precision fusion
// programs] in random_program_fusion.cpp); DUET_FUSION_MIX_SEEDS programs of each (default 12).
// (test_compile_random_codegen runs many more programs with the generated tier on, but its
// kernels are built in the background and most programs end before theirs are swapped in.)
TEST_CASE("fusion: random programs of the fusion mix equal eager, on generated kernels too") {
  for (Mix mix : {Mix::Fusion, Mix::LowFusion}) {
    INFO((mix == Mix::Fusion ? "fusion mix" : "fusion mix in bf16 and f16"));
    const int64_t loaded_before = codegen::stats().loaded;
    int programs = 0, fused = 0;
    const auto seeds = uint64_t(env_int("DUET_FUSION_MIX_SEEDS", 12));
    for (uint64_t seed = 0; seed < seeds; ++seed) {
      Program p;
      p.seed = seed;
      Generator gen(p, seed, mix);
      if (!gen.build()) continue;
      INFO("seed " << seed << "\n" << program_text(p));
      auto fn = [&p](const std::vector<Tensor>& xs) { return run_program(p, xs); };
      auto c = compile(fn);
      Rng r = rng_for(seed, 9);
      for (int t = 0; t < tiers(); ++t, next_tier()) {
        INFO("tier " << t);
        const Values vals = t == 0 ? gen.first_values() : gen.sample_values(r);
        const std::vector<Tensor> in = build_inputs(p, vals, false);
        manual_seed(kRandSeed);
        const std::vector<Tensor> want = fn(in);
        manual_seed(kRandSeed);
        const std::vector<Tensor> got = c(in);
        REQUIRE(got.size() == want.size());
        for (size_t k = 0; k < got.size(); ++k) {
          INFO("output " << k);
          if (floating(want[k]) && max_abs(want[k]) > 1e4) continue;  // ill-conditioned
          CHECK(got[k].sizes() == want[k].sizes());
          CHECK(got[k].dtype() == want[k].dtype());
          if (got[k].sizes() != want[k].sizes() || got[k].dtype() != want[k].dtype()) continue;
          if (is_low_precision(want[k].dtype())) {
            CHECK(bitwise_equal(got[k], want[k]));
            continue;
          }
          const std::string m = differences(values(got[k]), values(want[k]), 1e-4, 1e-4);
          CHECK_MESSAGE(m.empty(), m);
        }
      }
      ++programs;
      fused += c.stats().fused_kernels > 0;
    }
    CHECK(programs >= 10);
    CHECK(fused * 4 >= programs * 3);  // else the test would say little about fusion
    if (codegen::enabled()) CHECK(codegen::stats().loaded - loaded_before >= programs);
  }
}

TEST_CASE("memory planner: buffers of two devices go to two arenas") {
  // A function that moves data between the CPU and a GPU has buffers on both: one arena once
  // held them all, on the last buffer's device, and the others read or wrote the wrong memory.
  using detail::BufferRequest;
  std::vector<BufferRequest> req(3);
  req[0] = {1000, 0, 2, -1, 0};
  req[1] = {1000, 1, 2, -1, 1};
  req[2] = {500, 1, 3, -1, 0};
  const detail::MemoryPlan plan = detail::plan_memory(req);
  CHECK(detail::check_memory_plan(req, plan) == "");
  REQUIRE(plan.pool_bytes.size() == 2);
  CHECK(plan.offsets[1] == 0);  // the start of its own arena
  CHECK(plan.pool_bytes[1] == 1024);
  CHECK(plan.pool_bytes[0] == 1024 + 512);
  CHECK(plan.arena_bytes == 1024 + 1024 + 512);
  // Overlapping offsets in different pools are no overlap; in one pool they are.
  detail::MemoryPlan bad = plan;
  bad.offsets[2] = 0;
  CHECK(detail::check_memory_plan(req, bad) != "");
}

TEST_CASE("memory planner: one arena, far smaller than the intermediates") {
  manual_seed(4);
  Tensor x = randn({1000});
  auto chain = [](Tensor h) {
    for (int i = 0; i < 20; ++i) h = (i % 2) ? exp(h * -0.5) : h - 0.1;
    return h * 2;
  };
  // Without fusion every op has a buffer; the planner reuses them in place.
  auto f = compile(chain, without({"fuse"}));
  CHECK(near(f(x), chain(x)));
  CHECK(f.stats().intermediate_bytes == 31 * 4000);  // 31 ops of 1000 floats
  CHECK(f.stats().arena_bytes <= 4096);
  auto g = compile(chain, without({"fuse", "plan_memory"}));
  CHECK(near(g(x), chain(x)));
  CHECK(g.stats().arena_bytes == 0);
  CHECK(g.stats().buffer_bytes == 30 * 4000);  // every intermediate but the result
}

TEST_CASE("memory planner: the schedule frees activations early (weight gradients first)") {
  // A three-layer relu MLP's gradients. The forward keeps h1, h2 (64 KiB each) and their masks
  // (16 KiB each) for the backward: 160 KiB. In the graph's order the backward computes the
  // input gradient dh2 (64 KiB more) while h2 still waits for dW3; run first, dW3 frees h2.
  // (In order: in waves, dW3 and dh2 would run side by side, and no buffer is reused in place.)
  manual_seed(8);
  Tensor x = randn({64, 128});
  Tensor w1 = (randn({128, 256}) * 0.1).requires_grad_();
  Tensor w2 = (randn({256, 256}) * 0.1).requires_grad_();
  Tensor w3 = (randn({256, 8}) * 0.1).requires_grad_();
  auto fn = [&](Tensor x) {
    Tensor out = matmul(relu(matmul(relu(matmul(x, w1)), w2)), w3);
    std::vector<Tensor> g = grad({sum(out * out)}, {w1, w2, w3});
    return std::make_tuple(g[0], g[1], g[2]);
  };
  auto f = compile(fn, without({"parallel"}));
  auto [g1, g2, g3] = f(x);
  auto [e1, e2, e3] = fn(x);
  CHECK(near(g1, e1));
  CHECK(near(g2, e2));
  CHECK(near(g3, e3));
  CHECK(f.stats().arena_bytes > 160 * 1024);
  CHECK(f.stats().arena_bytes < 200 * 1024);
}

TEST_CASE("hoisting: work on parameters runs once per parameter version") {
  manual_seed(5);
  Tensor w = randn({4, 3});
  Tensor x = randn({2, 3});
  auto fn = [&](Tensor x) { return matmul(x, transpose(exp(w * 0.5), 0, 1).contiguous()); };
  auto f = compile(fn);
  CHECK(near(f(x), fn(x)));
  CHECK(f.stats().hoisted_nodes >= 2);
  CHECK(near(f(x), fn(x)));
  {
    NoGradGuard ng;
    w.add_(1.0);  // a new version: the hoisted work runs again
  }
  CHECK(near(f(x), fn(x)));
  auto g = compile(fn, without({"hoist"}));
  CHECK(g.stats().hoisted_nodes == 0);
  CHECK(near(g(x), fn(x)));
}

TEST_CASE("hoisting: a training step keeps no buffers for work on the parameters it updates") {
  // Under autocast each weight is cast to bf16 before its product. A compiled forward hoists
  // those casts (the weights change only between calls, if at all); a compiled training step
  // updates the weights itself, so the casts run at every call anyway: they stay in the
  // schedule, their buffers in the arena, and the step holds no bf16 copy of the weights
  // between calls. Results are the same either way.
  manual_seed(8);
  nn::Linear l1(256, 512), l2(512, 10);
  const Tensor x = randn({16, 256}), y = randint(10, {16});
  auto loss_of = [&](const Tensor& in, const Tensor& target) {
    Autocast ac(Device::cpu());
    return cross_entropy(l2(relu(l1(in))), target);
  };
  auto forward = compile(loss_of);
  forward(x, y);
  CHECK(forward.stats().hoisted_nodes >= 2);  // the two weight casts at least

  optim::SGD opt(std::vector<Tensor>{l1.weight, l1.bias, l2.weight, l2.bias}, {.lr = 0.1});
  auto step = compile([&](const Tensor& in, const Tensor& target) {
    opt.zero_grad();
    Tensor loss = loss_of(in, target);
    loss.backward();
    opt.step();
    return loss;
  });
  step(x, y);
  step(x, y);
  // What the step keeps outside its arena (hoisted values: here the constants of the loss) is
  // smaller than the bf16 copy of the smaller weight, 10 x 512 (before: 274 KB, both weights).
  const int64_t kept = step.stats().buffer_bytes - step.stats().arena_bytes;
  CAPTURE(kept);
  CHECK(kept < 10 * 512 * 2);
  CHECK(step.stats().hoisted_nodes < forward.stats().hoisted_nodes);
}

TEST_CASE("hoisting: a large value made of sources alone is made at each run, in the arena") {
  // An embedding's gradient adds rows into zeros of the table's shape (1 MiB here). Hoisted,
  // the zeros were kept for the function's life; made at each run, they share the arena.
  manual_seed(9);
  nn::Embedding eager_emb(4096, 64), emb(4096, 64);
  {
    NoGradGuard ng;
    emb.weight.copy_(eager_emb.weight);
  }
  const Tensor idx = randint(4096, {32});
  auto make_step = [&](nn::Embedding& e, optim::SGD& opt) {
    return [&e, &opt](const Tensor& i) {
      opt.zero_grad();
      Tensor h = e(i);
      Tensor loss = mean(h * h);
      loss.backward();
      opt.step();
      return loss;
    };
  };
  optim::SGD eager_opt(std::vector<Tensor>{eager_emb.weight}, {.lr = 0.5});
  optim::SGD opt(std::vector<Tensor>{emb.weight}, {.lr = 0.5});
  auto eager_step = make_step(eager_emb, eager_opt);
  auto step = compile(make_step(emb, opt));
  for (int k = 0; k < 3; ++k) CHECK(bitwise_equal(step(idx), eager_step(idx)));
  CHECK(bitwise_equal(emb.weight, eager_emb.weight));
  const int64_t kept = step.stats().buffer_bytes - step.stats().arena_bytes;
  CAPTURE(kept);
  CHECK(kept < 64 * 1024);  // before: the 1 MiB of zeros
}

TEST_CASE("one arena per function: the plans of two batch sizes share it") {
  // An epoch with a short last batch compiles a second plan. Each plan kept an arena of its
  // own, so the Fashion-MNIST step held 26.9 MiB compiled against 16.3 eager; the plans now
  // share the function's arena, and the second plan adds none.
  manual_seed(10);
  nn::Linear l1(256, 512), l2(512, 10);
  optim::SGD opt(std::vector<Tensor>{l1.weight, l1.bias, l2.weight, l2.bias}, {.lr = 0.1});
  auto step = compile([&](const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = cross_entropy(l2(relu(l1(x))), y);
    loss.backward();
    opt.step();
    return loss;
  });
  step(randn({128, 256}), randint(10, {128}));
  const int64_t arena = step.stats().arena_bytes;
  REQUIRE(arena > 0);
  const Tensor x = randn({48, 256}), y = randint(10, {48});
  const int64_t before = cpu_memory_stats().current;
  step(x, y);  // traces and plans the second size
  const int64_t grown = cpu_memory_stats().current - before;
  const int64_t arena48 = step.stats().arena_bytes;  // what its own arena would have held
  CAPTURE(grown);
  CAPTURE(arena48);
  CHECK(arena48 > 0);
  CHECK(arena48 < arena);
  CHECK(grown < arena48);
  // The first size again, on the same arena: the same results as eagerly.
  manual_seed(11);
  const Tensor x2 = randn({128, 256}), y2 = randint(10, {128});
  CHECK(std::isfinite(step(x2, y2).item<float>()));
}

TEST_CASE("hoisting: a copied view of a parameter follows the parameter's new values") {
  // Regression (found by the random programs, seed 844): a reshape of a transposed parameter
  // is a copy made by a hoisted view step, which once ran only at the first call.
  Tensor w = transpose(make({1, 2, 3, 4, 5, 6}, {3, 2}), 0, 1);
  auto fn = [&](Tensor x) { return reshape(w, Shape{3, 2}) * x; };
  auto f = compile(fn);
  Tensor x = make({1}, {1});
  CHECK(near(f(x), fn(x)));
  {
    NoGradGuard ng;
    w.copy_(make({-1, 2, 3, 4, 5, 6}, {2, 3}));
  }
  CHECK(values(f(x))[0] == -1);
  CHECK(near(f(x), fn(x)));
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("parallel branches: a two-tower step runs in waves and matches eager") {
  // Small towers: the cost model runs them side by side on two threads.
  manual_seed(6);
  auto layer = [](int64_t in, int64_t out) {
    return std::make_pair((randn({in, out}) * 0.1).requires_grad_(),
                          (randn({out}) * 0.1).requires_grad_());
  };
  std::vector<std::pair<Tensor, Tensor>> a = {layer(32, 64), layer(64, 64), layer(64, 8)};
  std::vector<std::pair<Tensor, Tensor>> b = {layer(32, 64), layer(64, 64), layer(64, 8)};
  Tensor x = randn({16, 32});
  auto fn = [&](Tensor x) {
    Tensor ha = x, hb = x;
    for (auto& [w, bias] : a) ha = relu(matmul(ha, w) + bias);
    for (auto& [w, bias] : b) hb = tanh(matmul(hb, w) + bias);
    return sum(ha * hb);
  };
  // Whether waves pay here is the bench's question (TT); this test makes them run.
  setenv("DUET_PARALLEL", "always", 1);
  auto f = compile(fn);
  Tensor y = f(x);
  CHECK(near(y, fn(x)));
  // Waves need two threads: on one core (or under taskset) the plan runs in order.
  if (get_num_threads() >= 2)
    CHECK(f.stats().parallel_plans >= 1);
  else
    CHECK(f.stats().parallel_plans == 0);
  // Gradients through the compiled backward (also in waves) match eager's.
  std::vector<Tensor> ws = {a[0].first, b[0].first, a[2].second};
  std::vector<Tensor> ge = grad({fn(x)}, ws);
  std::vector<Tensor> gc = grad({f(x)}, ws);
  for (size_t i = 0; i < ws.size(); ++i) CHECK(near(gc[i], ge[i]));
  unsetenv("DUET_PARALLEL");
  auto serial = compile(fn, without({"parallel"}));
  CHECK(near(serial(x), y));
  CHECK(serial.stats().parallel_plans == 0);
}

// Note [Sums that follow the threads] in trace/plan/plan_waves.cpp: on a CPU where oneDNN splits
// a 64 x 64 product's inner dim (256) over two threads (the 2-core AVX2 EPYC), the two products
// ran side by side, one thread each, and their sums rounded apart from eager's; their wave now
// stays in order there. Where oneDNN does not split them, they run side by side and agree all
// the same.
TEST_CASE(
    "parallel branches: products whose sums follow the threads keep compiled equal to eager") {
  manual_seed(10);
  const Tensor a = randn({64, 256}), b = randn({256, 64}), c = randn({64, 256}),
               d = randn({256, 64});
  auto fn = [&](Tensor x) { return matmul(a * x, b) + matmul(c * x, d); };
  const Tensor x = randn({64, 256});
  setenv("DUET_PARALLEL", "always", 1);
  auto f = compile(fn);
  const Tensor got = f(x);
  unsetenv("DUET_PARALLEL");
  CHECK(bitwise_equal(got, fn(x)));
  if (kernels::product_sums_follow_threads(DType::f32, 64, 64, 256))
    CHECK(f.stats().parallel_plans == 0);
}

TEST_CASE("parallel branches: the cost model runs two small towers side by side, one chain not") {
  // TT in bench/ measures it: two towers of 256-512-512-64 at batch 16 run 1.5x faster in waves,
  // their products too small for oneDNN to split over two threads.
  manual_seed(9);
  auto tower = [](int64_t in, int64_t mid, int64_t out) {
    return std::vector<Tensor>{randn({in, mid}) * 0.05, randn({mid, mid}) * 0.05,
                               randn({mid, out}) * 0.05};
  };
  std::vector<Tensor> a = tower(256, 512, 64), b = tower(256, 512, 64);
  Tensor x = randn({16, 256});
  auto two = [&](Tensor x) {
    Tensor ha = x, hb = x;
    for (const Tensor& w : a) ha = relu(matmul(ha, w));
    for (const Tensor& w : b) hb = tanh(matmul(hb, w));
    return ha + hb;
  };
  auto f = compile(two);
  CHECK(near(f(x), two(x)));
  CHECK(f.stats().parallel_plans == (get_num_threads() >= 2 ? 1 : 0));  // waves need two threads
  auto one = [&](Tensor x) {
    for (const Tensor& w : a) x = relu(matmul(x, w));
    return x;
  };
  auto g = compile(one);
  CHECK(near(g(x), one(x)));
  CHECK(g.stats().parallel_plans == 0);
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE(
    "fusion: a group past the kernel's input and output limits splits into kernels that fit") {
  // An SGD step over 30 parameters of one shape: the updates are siblings (all read lr), so
  // they gather in one group of 60 ops, 61 inputs and 30 outputs, past a kernel's 24 inputs and
  // 12 outputs. Before the split, such a group ran op by op.
  manual_seed(7);
  std::vector<Tensor> ps, gs;
  for (int i = 0; i < 30; ++i) {
    ps.push_back(randn({5, 9}));
    gs.push_back(randn({5, 9}));
  }
  auto step = [](const std::vector<Tensor>& p, const std::vector<Tensor>& g, Tensor lr) {
    std::vector<Tensor> out;
    for (size_t i = 0; i < p.size(); ++i) out.push_back(p[i] - g[i] * lr);
    return out;
  };
  Tensor lr = full({}, 0.01);
  auto f = compile(step);
  for (int t = 0; t < tiers(); ++t, next_tier()) {
    std::vector<Tensor> got = f(ps, gs, lr), want = step(ps, gs, lr);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(bitwise_equal(got[i], want[i]));
    CHECK(f.stats().fused_nodes == 60);
    CHECK(f.stats().fused_kernels >= 3);
    CHECK(f.stats().fused_kernels <= 8);
  }
}

}  // namespace duet::test

namespace duet::test {

// ---- GEMM epilogues (Note [cuBLASLt epilogues]) -----------------------------------------------
// CUDA runs matmul + bias (+ relu) as one cuBLASLt call. The executor's side (finding the pair,
// skipping the group, the fallback) is the same for any device: here a CPU "epilogue" registered
// for the test computes the same values from eager ops and counts its calls.

namespace {
int g_epilogue_calls = 0;
bool g_epilogue_accepts = true;
bool test_epilogue(const Tensor& a, const Tensor& b, const Tensor& bias, bool relu,
                   const Tensor& out) {
  if (!g_epilogue_accepts) return false;
  ++g_epilogue_calls;
  detail::SuspendModes eager;
  NoGradGuard no_grad;
  Tensor y = matmul(a, b) + reshape(bias, {-1});
  Tensor dst = out;  // a handle to the same storage
  dst.copy_(relu ? duet::relu(y) : y);
  return true;
}
struct EpilogueFor {  // registered for the test's duration
  EpilogueFor() { kernels::set_gemm_epilogue(DeviceType::CPU, test_epilogue); }
  ~EpilogueFor() { kernels::set_gemm_epilogue(DeviceType::CPU, nullptr); }
};
}  // namespace

TEST_CASE("gemm epilogues: matmul + bias (+ relu) pairs run as one call, or fall back") {
  EpilogueFor registered;
  Tensor w = randn({8, 5}), b = randn({5}), b2 = randn({1, 5});
  auto lin_relu = compile([&](Tensor x) { return relu(matmul(x, w) + b); });
  auto lin = compile([&](Tensor x) { return b2 + matmul(x, w); });
  // The product is read twice: no epilogue.
  auto twice = compile([&](Tensor x) {
    Tensor y = matmul(x, w);
    return std::vector<Tensor>{y + b, y};
  });
  for (int call = 0; call < 3; ++call) {
    const Tensor x = randn({4, 8});
    g_epilogue_calls = 0;
    CHECK(values(lin_relu(x)) == values(relu(matmul(x, w) + b)));
    CHECK(g_epilogue_calls == 1);
    CHECK(values(lin(x)) == values(b2 + matmul(x, w)));
    CHECK(g_epilogue_calls == 2);
    const std::vector<Tensor> t = twice(x);
    CHECK(g_epilogue_calls == 2);
    CHECK(values(t[0]) == values(matmul(x, w) + b));
  }
  CHECK(lin_relu.stats().gemm_epilogues == 1);
  CHECK(lin.stats().gemm_epilogues == 1);
  CHECK(twice.stats().gemm_epilogues == 0);
  // A device that declines: the matmul and the group run as before.
  g_epilogue_accepts = false;
  const Tensor x = randn({4, 8});
  CHECK(values(lin_relu(x)) == values(relu(matmul(x, w) + b)));
  g_epilogue_accepts = true;
  // A training step: the forward's pairs go through the epilogue, gradients are unchanged.
  Tensor w1 = randn({8, 6}).requires_grad_(), b1 = randn({6}).requires_grad_();
  auto step = compile([&](Tensor x) {
    Tensor loss = sum(relu(matmul(x, w1) + b1));
    loss.backward();
    return loss;
  });
  const Tensor xs = randn({3, 8});
  Tensor want = sum(relu(matmul(xs, w1) + b1));
  want.backward();
  const std::vector<double> gw = values(w1.grad()), gb = values(b1.grad());
  w1.set_grad(Tensor());
  b1.set_grad(Tensor());
  g_epilogue_calls = 0;
  CHECK(step(xs).item<double>() == doctest::Approx(want.item<double>()).epsilon(1e-6));
  CHECK(differences(values(w1.grad()), gw, 1e-6, 1e-6) == "");
  CHECK(differences(values(b1.grad()), gb, 1e-6, 1e-6) == "");
}

}  // namespace duet::test

namespace duet::test {
namespace {

// The interpreter writes an output straight into its buffer when that buffer is exactly an
// input's (an in-place update) only if no instruction reads that input afterwards
// (kernels/fused.cpp, Note [Interpreter outputs]). Both cases, with the buffers shared.
TEST_CASE("fused interpreter: an output sharing an input's buffer") {
  using kernels::FusedInstr;
  using kernels::FusedProgram;
  const int64_t n = 5000;  // more than one block of some programs, a tail for all
  auto instr = [](OpId op, int dst, int a, int b) {
    FusedInstr in;
    in.op = op;
    in.dst = static_cast<int16_t>(dst);
    in.src[0] = static_cast<int16_t>(a);
    in.src[1] = static_cast<int16_t>(b);
    return in;
  };
  for (const bool read_after : {false, true}) {
    CAPTURE(read_after);
    // r2 = sub(r0, r1) -> out 0 (the buffer of input 0); then, when read_after,
    // r3 = mul(r0, r1) -> out 1, which must see input 0's values from before the update.
    FusedProgram p;
    p.dtype = DType::f32;
    p.in_dtypes = {DType::f32, DType::f32};
    p.code.push_back(instr(OpId::Sub, 2, 0, 1));
    p.outputs = {2};
    p.out_dtypes = {DType::f32};
    p.num_regs = 3;
    if (read_after) {
      p.code.push_back(instr(OpId::Mul, 3, 0, 1));
      p.outputs.push_back(3);
      p.out_dtypes.push_back(DType::f32);
      p.num_regs = 4;
    }
    std::vector<float> x(n), g(n), prod(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i % 97) * 0.5f;
      g[i] = static_cast<float>(i % 13) - 6.0f;
    }
    const std::vector<float> x0 = x;
    kernels::DuetFusedArgs a{};
    a.outer = 1;
    a.inner = n;
    a.in[0] = x.data();
    a.in[1] = g.data();
    for (int k = 0; k < 2; ++k) {
      a.in_so[k] = n;
      a.in_si[k] = 1;
    }
    a.out[0] = x.data();  // in place
    a.out[1] = prod.data();
    kernels::interpret_fused(p, a, 0, n);
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 4; ++i) {
      const bool ok = x[i] == x0[i] - g[i] && (!read_after || prod[i] == x0[i] * g[i]);
      if (!ok) {
        ++bad;
        INFO("element ", i, ": ", x[i], " for ", x0[i] - g[i], ", product ", prod[i], " for ",
             x0[i] * g[i]);
        CHECK(ok);
      }
    }
    CHECK(bad == 0);
  }
}

}  // namespace
}  // namespace duet::test

namespace duet::test {

TEST_CASE("memory planner: a training step computes its weight gradients into .grad") {
  // Note [Products computed into write-back targets] and [Write-backs wait for their readers]:
  // each weight gradient (256 x 512 floats, 512 KiB) is a product that only the optimizer's
  // update reads, and the update runs as soon as it can. No weight-sized buffer is live in the
  // arena at once; before, both gradients waited for the updates at the end (1.5 MiB).
  manual_seed(10);
  auto make = [] {
    manual_seed(11);
    return std::make_shared<nn::Sequential>(nn::Linear(512, 256), nn::ReLU(), nn::Linear(256, 512));
  };
  auto em = make(), cm = make();
  optim::Adam eo(em->parameters()), co(cm->parameters());
  const Tensor x = randn({32, 512}), y = randn({32, 512});
  auto step = [](nn::Module& m, optim::Optimizer& o, const Tensor& in, const Tensor& target) {
    o.zero_grad();
    Tensor loss = mse_loss(m(in), target);
    loss.backward();
    o.step();
    return loss;
  };
  auto f = compile([&](const Tensor& in, const Tensor& t) { return step(*cm, co, in, t); });
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    // The loss is a fused reduction (its own order of additions); the gradients are not.
    CHECK(near(step(*em, eo, x, y), f(x, y)));
  }
  const auto pe = em->parameters(), pc = cm->parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    CHECK(bitwise_equal(pe[i], pc[i]));
    CHECK(bitwise_equal(pe[i].grad(), pc[i].grad()));
  }
  const MemoryReport r = f.memory_report();
  CAPTURE(r.str());
  for (const MemoryReport::Buffer& b : r.live_at_peak) CHECK(b.bytes < 256 * 512 * 4);
  CHECK(r.arena_bytes < 256 * 512 * 4);
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("memory planner: an in-place update waits for the reads of the old value") {
  // Note [Write-backs wait for their readers]: the update of w (exp fused into it) comes first
  // in the graph, so the schedule would run it before the product that reads the old w; then
  // it could not write w in place, and the new w would wait in the arena until the end of the
  // run. In place, the step needs no arena at all (c is a result).
  manual_seed(12);
  Tensor w = randn({256, 256});
  const Tensor w0 = w.clone(), x = randn({256, 256});
  auto fn = [&](const Tensor& in) {
    Tensor e = exp(in);
    Tensor c = matmul(in, w);
    w.add_(e);
    return c;
  };
  auto f = compile(fn);
  const Tensor c = f(x);
  CHECK(bitwise_equal(c, matmul(x, w0)));
  CHECK(bitwise_equal(w, w0 + exp(x)));
  CHECK(f.stats().arena_bytes == 0);
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("memory planner: an elementwise step reuses a buffer it reads through a reshape") {
  // The gradient of a Linear's 3-D input arrives as a reshape of a 2-D product; the
  // elementwise step after it (GELU's gradient in W8) wrote a buffer of its own while the
  // product died there: W8's arena was 5 MiB larger.
  manual_seed(13);
  const Tensor x = randn({64, 256}), w = randn({256, 512}), w2 = randn({512, 32});
  auto fn = [&](const Tensor& in) {
    Tensor p = matmul(in, w);
    Tensor r = tanh(p.reshape({8, 8, 512})) * 2.0;
    return matmul(r.reshape({64, 512}), w2);
  };
  auto f = compile(fn);
  CHECK(bitwise_equal(f(x), fn(x)));
  CHECK(f.stats().arena_bytes == 64 * 512 * 4);  // p, and r in its bytes
}

}  // namespace duet::test
