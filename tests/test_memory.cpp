// Memory (docs/memory.md): duet::checkpoint (Note [Checkpoint] in eager/checkpoint.cpp), whose
// gradients equal the unchecked ones with dropout inside, eagerly and compiled, nested too, the
// memory it saves and its errors; a compiled function's memory report.
#include <doctest/doctest.h>

#include "util.h"

namespace duet::test {
namespace {

// A residual MLP of `depth` blocks, each linear -> gelu -> dropout, for checkpointing per block.
struct Mlp {
  std::vector<std::shared_ptr<nn::Linear>> fc;
  nn::Dropout drop{0.25};
  Mlp(int64_t width, int depth) {
    for (int i = 0; i < depth; ++i) fc.push_back(std::make_shared<nn::Linear>(width, width));
  }
  Tensor block(int i, const Tensor& h) { return h + drop(gelu((*fc[static_cast<size_t>(i)])(h))); }
  std::vector<Tensor> parameters() {
    std::vector<Tensor> p;
    for (auto& f : fc)
      for (const Tensor& t : f->parameters()) p.push_back(t);
    return p;
  }
  void zero_grad() {
    NoGradGuard no_grad;
    for (const Tensor& p : parameters())
      if (Tensor g = p.grad(); g.defined()) g.zero_();
  }
};

enum class Mode { Plain, PerBlock, Nested };

Tensor loss_of(Mlp& m, const Tensor& x, Mode mode) {
  Tensor h = x;
  const int depth = static_cast<int>(m.fc.size());
  if (mode == Mode::Nested) {
    // Pairs of blocks, each pair and each block in it checkpointed.
    for (int i = 0; i + 1 < depth; i += 2)
      h = checkpoint(
          [&m, i](const Tensor& a) {
            Tensor b = checkpoint([&m, i](const Tensor& t) { return m.block(i, t); }, a);
            return checkpoint([&m, i](const Tensor& t) { return m.block(i + 1, t); }, b);
          },
          h);
  } else {
    for (int i = 0; i < depth; ++i)
      h = mode == Mode::PerBlock ? checkpoint([&m, i](const Tensor& t) { return m.block(i, t); }, h)
                                 : m.block(i, h);
  }
  return (h * h).mean();
}

// One step's loss and gradients (the parameters', then x's), from generator seed `seed`.
std::vector<Tensor> step(Mlp& m, Tensor x, Mode mode, uint64_t seed) {
  m.zero_grad();
  x.set_grad(Tensor());
  manual_seed(seed);
  Tensor loss = loss_of(m, x, mode);
  loss.backward();
  std::vector<Tensor> r{loss.detach()};
  for (const Tensor& p : m.parameters()) r.push_back(p.grad().clone());
  r.push_back(x.grad().clone());
  return r;
}

void check_same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(a[i], b[i]));
  }
}

// The CPU generator's state.
Tensor generator_states_copy() { return detail::generator_states()[0].clone(); }

// The peak of tensor memory over fn, above what was held when it began.
template <class F>
int64_t peak_during(F fn) {
  const int64_t base = cpu_memory_stats().current;
  reset_peak_memory();
  fn();
  return cpu_memory_stats().peak - base;
}

}  // namespace

TEST_CASE("checkpoint: gradients equal unchecked ones, with dropout inside, bit for bit") {
  manual_seed(1);
  Mlp m(16, 4);
  Tensor x = randn({8, 16}).requires_grad_(true);
  const std::vector<Tensor> plain = step(m, x, Mode::Plain, 7);
  const Tensor next_plain = rand({4});  // the generator advanced as far
  check_same(plain, step(m, x, Mode::PerBlock, 7));
  CHECK(bitwise_equal(rand({4}), next_plain));
  SUBCASE("nested") { check_same(plain, step(m, x, Mode::Nested, 7)); }
  SUBCASE("duet::grad") {
    manual_seed(7);
    Tensor loss = loss_of(m, x, Mode::PerBlock);
    std::vector<Tensor> g = grad({loss}, {x});
    CHECK(bitwise_equal(g[0], plain.back()));
  }
}

TEST_CASE("checkpoint: several results, a vector argument and a number") {
  manual_seed(2);
  Tensor a = randn({3, 4}).requires_grad_(true), b = randn({3, 4}).requires_grad_(true);
  auto fn = [](const std::vector<Tensor>& v, double s) {
    return std::make_tuple(tanh(v[0] * s), exp(v[1]) * v[0]);
  };
  auto [p, q] = fn({a, b}, 0.5);
  (p.sum() + (q * q).sum()).backward();
  const Tensor ga = a.grad().clone(), gb = b.grad().clone();
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  auto [pc, qc] = checkpoint(fn, std::vector<Tensor>{a, b}, 0.5);
  CHECK(bitwise_equal(p, pc));
  (pc.sum() + (qc * qc).sum()).backward();
  CHECK(bitwise_equal(a.grad(), ga));
  CHECK(bitwise_equal(b.grad(), gb));
}

TEST_CASE("checkpoint: a compiled step with checkpointed blocks equals the eager one") {
  manual_seed(3);
  Mlp m(16, 4);
  const Tensor x = randn({8, 16});
  auto compiled = compile([&](const Tensor& in) {
    Tensor xr = in;
    Tensor loss = loss_of(m, xr, Mode::PerBlock);
    loss.backward();
    return loss;
  });
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    m.zero_grad();
    manual_seed(10 + s);
    const Tensor le = [&] {
      Tensor loss = loss_of(m, x, Mode::Plain);
      loss.backward();
      return loss;
    }();
    std::vector<Tensor> ge;
    for (const Tensor& p : m.parameters()) ge.push_back(p.grad().clone());
    const Tensor after_eager = generator_states_copy();
    m.zero_grad();
    manual_seed(10 + s);
    const Tensor lc = compiled(x);
    CHECK(bitwise_equal(le, lc));
    const std::vector<Tensor> ps = m.parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      CAPTURE(i);
      CHECK(bitwise_equal(ps[i].grad(), ge[i]));
    }
    CHECK(bitwise_equal(generator_states_copy(), after_eager));
  }
  CHECK(compiled.stats().traces == 1);
}

TEST_CASE("checkpoint: per block, a step holds at most 0.6x the memory, eager and compiled") {
  manual_seed(4);
  Mlp m(256, 8);
  const Tensor x = randn({256, 256});
  auto run = [&](Mode mode) {
    loss_of(m, x, mode).backward();  // .grad buffers exist before the measured step
    return peak_during([&] { loss_of(m, x, mode).backward(); });
  };
  const int64_t plain = run(Mode::Plain), checked = run(Mode::PerBlock);
  MESSAGE("eager peak: " << plain << " B unchecked, " << checked << " B checkpointed");
  CHECK(checked <= 0.6 * plain);
  auto arena = [&](Mode mode) {
    auto f = compile([&](const Tensor& in) { loss_of(m, in, mode).backward(); });
    f(x);
    return f.stats().arena_bytes;
  };
  const int64_t plain_arena = arena(Mode::Plain), checked_arena = arena(Mode::PerBlock);
  MESSAGE("compiled arena: " << plain_arena << " B unchecked, " << checked_arena
                             << " B checkpointed");
  CHECK(checked_arena <= 0.6 * plain_arena);
}

TEST_CASE("checkpoint: without grad mode it is a plain call; its errors") {
  manual_seed(5);
  Tensor w = randn({4, 4}).requires_grad_(true);
  const Tensor x = randn({2, 4});
  // The inner tanh's result is made inside and saved (by the outer tanh): given up, recomputed.
  auto f = [&](const Tensor& t) { return tanh(tanh(matmul(t, w))); };
  {
    NoGradGuard no_grad;
    const Tensor y = checkpoint(f, x);
    CHECK(!y.requires_grad());
    CHECK(bitwise_equal(y, f(x)));
  }
  SUBCASE("double backward through it") {
    const Tensor y = checkpoint(f, x).sum();
    CHECK_THROWS_AS(grad({y}, {w}, {}, true), Error);
  }
  SUBCASE("a function that tapes other ops when rerun") {
    int calls = 0;
    const Tensor y = checkpoint(
        [&](const Tensor& t) {
          const Tensor h = tanh(matmul(t, w));
          return ++calls == 1 ? tanh(h) : exp(h);
        },
        x);
    CHECK_THROWS_AS(y.sum().backward(), ValueError);
  }
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("memory report: a compiled step's plans, its saved activations and its peak buffers") {
  manual_seed(6);
  Mlp m(64, 3);
  const Tensor x = randn({32, 64});
  auto report = [&](Mode mode) {
    auto f = compile([&](const Tensor& in) { loss_of(m, in, mode).backward(); });
    CHECK_THROWS_AS(f.memory_report(), Error);  // not called yet
    f(x);
    const CompileStats s = f.stats();
    REQUIRE(s.plans.size() == 1);
    CHECK(s.plans[0].plan == "step");
    CHECK(s.plans[0].arena_bytes == s.arena_bytes);
    const MemoryReport r = f.memory_report();
    CHECK(r.peak_bytes == s.plans[0].peak_bytes);
    CHECK(r.peak_bytes >= r.arena_bytes);
    CHECK(r.arena_bytes <= r.intermediate_bytes);
    CHECK(r.saved_bytes == s.plans[0].saved_bytes);
    REQUIRE(!r.live_at_peak.empty());
    int64_t live = 0;
    for (size_t i = 0; i < r.live_at_peak.size(); ++i) {
      const MemoryReport::Buffer& b = r.live_at_peak[i];
      CAPTURE(b.value);
      if (i > 0) CHECK(b.bytes <= r.live_at_peak[i - 1].bytes);
      CHECK(!b.op.empty());
      live += b.bytes;
    }
    CHECK(live <= r.arena_bytes);
    CHECK(!r.str().empty());
    return r;
  };
  const MemoryReport plain = report(Mode::Plain), checked = report(Mode::PerBlock);
  // Each block saves at least its input (32 x 64 f32) and gelu's input for the backward; with
  // checkpoints only the blocks' inputs are saved.
  CHECK(plain.saved_bytes >= 3 * 2 * 32 * 64 * 4);
  CHECK(checked.saved_bytes < plain.saved_bytes);
  // Some buffer at the peak was made on a line of this file.
  bool here = false;
  for (const MemoryReport::Buffer& b : plain.live_at_peak)
    here = here || b.site.find("test_memory.cpp") != std::string::npos;
  CHECK(here);
}

TEST_CASE("memory report: a compiled forward saves values for the eager backward") {
  manual_seed(7);
  nn::Linear l1(16, 32), l2(32, 4);
  const Tensor x = randn({8, 16});
  auto f = compile([&](const Tensor& in) { return l2(tanh(l1(in))).sum(); });
  Tensor loss = f(x);
  loss.backward();
  const CompileStats s = f.stats();
  REQUIRE(s.plans.size() == 2);
  CHECK(s.plans[0].plan == "forward");
  CHECK(s.plans[1].plan == "backward 0");
  // tanh's result (8 x 32) at least is saved for the backward.
  CHECK(s.plans[0].saved_bytes >= 8 * 32 * 4);
  CHECK(s.plans[1].saved_bytes == 0);
}

}  // namespace duet::test

namespace duet::test {

// tanh-GELU written out by a user, as duet's gelu was before it became one op (Note [GELU's tanh
// form as one op] in kernels/functors.h): a chain of elementwise pieces.
namespace {
Tensor composed_gelu(const Tensor& x) {
  return x * sigmoid((x + x * x * x * 0.044715) * 1.5957691216057307118);
}
struct ComposedGelu : nn::Module {
  ComposedGelu() : Module("ComposedGelu") {}
  Tensor forward(const Tensor& x) override { return composed_gelu(x); }
};
}  // namespace

TEST_CASE("remat: the backward recomputes a composed GELU's pieces from its input, bit for bit") {
  // Note [Rematerialization]: eagerly, the composed tanh-GELU keeps its input, its square, a
  // sigmoid and its result (32 x 256 floats each) for the backward; compiled, only the input is
  // kept and the rest is computed again in the backward's kernels.
  auto make = [] {
    manual_seed(13);
    return std::make_shared<nn::Sequential>(nn::Linear(64, 256), ComposedGelu(),
                                            nn::Linear(256, 64));
  };
  const Tensor x = randn({32, 64}), y = randn({32, 64});
  auto run = [&](std::vector<std::string> disabled) {
    auto m = make();
    optim::SGD opt(m->parameters(), {.lr = 0.1});
    CompileOptions o;
    o.disable_passes = std::move(disabled);
    auto f = compile(
        [&](const Tensor& in, const Tensor& t) {
          opt.zero_grad();
          Tensor loss = mse_loss((*m)(in), t);
          loss.backward();
          opt.step();
          return loss;
        },
        o);
    for (int s = 0; s < 2; ++s) f(x, y);
    std::vector<Tensor> r;
    for (const Tensor& p : m->parameters()) r.push_back(p.clone());
    return std::make_pair(r, f.memory_report());
  };
  auto [with, rw] = run({});
  auto [without, ro] = run({"remat"});
  REQUIRE(with.size() == without.size());
  for (size_t i = 0; i < with.size(); ++i) CHECK(bitwise_equal(with[i], without[i]));
  CAPTURE(rw.str());
  CAPTURE(ro.str());
  const int64_t act = 32 * 256 * 4;
  CHECK(rw.saved_bytes + 2 * act <= ro.saved_bytes);
  CHECK(rw.peak_bytes < ro.peak_bytes);
  // Eagerly, the same steps give the same parameters.
  auto m = make();
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  for (int s = 0; s < 2; ++s) {
    opt.zero_grad();
    mse_loss((*m)(x), y).backward();
    opt.step();
  }
  const auto pe = m->parameters();
  for (size_t i = 0; i < pe.size(); ++i) CHECK(bitwise_equal(pe[i], with[i]));
}

TEST_CASE(
    "remat: a value that only a product reads, made from what only attention reads, is kept") {
  // Note [Rematerialization]: the heads merged back into rows (a copy of attention's permuted
  // output) are read in the backward by the weight gradient's product alone, and attention's
  // result only by attention's backward: recomputed, the copy would be a kernel of its own.
  manual_seed(21);
  const Tensor w = randn({16, 16}), q = randn({2, 4, 8, 4});
  auto step = [&](const Tensor& x) {
    Tensor a = x.detach().requires_grad_(), b = w.detach().requires_grad_();
    Tensor y = scaled_dot_product_attention(a, a, a, {}, true);
    Tensor loss = matmul(y.permute({0, 2, 1, 3}).reshape({16, 16}), b).sum();
    return grad({loss}, {a, b});
  };
  auto f = compile(step);
  const std::vector<Tensor> got = f(q), want = step(q);
  for (size_t i = 0; i < got.size(); ++i) CHECK(bitwise_equal(got[i], want[i]));
  CAPTURE(f.graph().str());
  CHECK(f.stats().recomputed_values == 0);
}

TEST_CASE("remat: a parameter's bf16 copy under autocast is kept for the backward, not recast") {
  // Note [Rematerialization]: a value made from captured tensors alone does not grow with the
  // batch; recomputing it would cast the weight again at every step.
  manual_seed(20);
  nn::Sequential fc(nn::Linear(64, 64), nn::Linear(64, 64));
  optim::SGD opt(fc.parameters(), {.lr = 0.1});
  const Tensor x = randn({32, 64});
  auto f = compile([&](const Tensor& in) {
    opt.zero_grad();
    Tensor loss;
    {
      Autocast ac(Device::cpu(), DType::bf16);
      loss = fc(in).to(DType::f32).mean();  // the first layer's gradient reads the second's weight
    }
    loss.backward();
    opt.step();
    return loss;
  });
  f(x);
  const Graph& g = f.graph();
  int weight_casts = 0;
  for (const GraphNode& n : g.nodes)
    if (n.kind == NodeKind::Op && n.op == OpId::Cast && n.meta.dtype == DType::bf16 &&
        n.meta.shape == Shape{64, 64}) {
      int32_t v = n.inputs[0];  // a recast reads its weight through a barrier
      while (g.nodes[v].kind == NodeKind::Op && g.nodes[v].op == OpId::OptimizationBarrier)
        v = g.nodes[v].inputs[0];
      weight_casts += g.nodes[v].kind == NodeKind::Input && g.nodes[v].role == InputRole::Captured;
    }
  CAPTURE(g.str());
  CHECK(weight_casts == 2);  // once per layer, in the forward
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("memory_budget: the backward recomputes until the plan fits, with the same results") {
  // Note [Memory budget]: eight Linear + ReLU layers; the unconstrained step keeps every
  // layer's activation for the backward. Under a budget of 0.8 of its plan's peak, the
  // backward recomputes some products instead, and the parameters train the same, bit for bit.
  auto make = [] {
    manual_seed(14);
    auto m = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 8; ++i) {
      m->push_back(nn::Linear(128, 128));
      m->push_back(nn::ReLU());
    }
    return m;
  };
  const Tensor x = randn({512, 128}), y = randn({512, 128});  // activations well above the .grads
  auto run = [&](int64_t budget, int steps) {
    auto m = make();
    auto opt = std::make_shared<optim::SGD>(m->parameters(), optim::SGDOptions{.lr = 0.05});
    CompileOptions o;
    o.memory_budget = budget;
    auto f = compile(
        [m, opt](const Tensor& in, const Tensor& t) {
          opt->zero_grad();
          Tensor loss = mse_loss((*m)(in), t);
          loss.backward();
          opt->step();
          return loss;
        },
        o);
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(f(x, y).item<float>());
    std::vector<Tensor> ps;
    for (const Tensor& p : m->parameters()) ps.push_back(p.clone());
    return std::make_tuple(losses, ps, f.stats(), f.memory_report());
  };
  auto [l0, p0, s0, r0] = run(0, 3);
  CHECK(s0.recomputed_for_budget.empty());
  const int64_t budget = r0.peak_bytes * 8 / 10;
  auto [l1, p1, s1, r1] = run(budget, 3);
  CAPTURE(r0.str());
  CAPTURE(r1.str());
  CHECK(r1.peak_bytes <= budget);
  CHECK(!s1.recomputed_for_budget.empty());
  CHECK(s1.recomputed_flops > s0.recomputed_flops);
  CHECK(l0 == l1);
  for (size_t i = 0; i < p0.size(); ++i) CHECK(bitwise_equal(p0[i], p1[i]));
  // A budget no recomputation meets: a ValueError naming the smallest peak reached.
  CHECK_THROWS_WITH_AS(run(1024, 1), doctest::Contains("the smallest peak the planner reached"),
                       ValueError);
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE(
    "compare: a training step's two faces, from the caller's state, which it leaves as it was") {
  manual_seed(15);
  nn::Sequential m(nn::Linear(32, 64), nn::Tanh(), nn::Dropout(0.2), nn::Linear(64, 8));
  optim::Adam opt(m.parameters());
  const Tensor x = randn({16, 32}), y = randint(8, {16});
  auto step = [&](const Tensor& in, const Tensor& target) {
    opt.zero_grad();
    Tensor loss = cross_entropy(m(in), target);
    loss.backward();
    opt.step();
    return loss;
  };
  step(x, y);  // gradients and optimizer state exist
  std::vector<Tensor> before;
  for (const Tensor& p : m.parameters()) before.push_back(p.clone());
  const Tensor rng = detail::generator_states()[0].clone();
  const FacesReport r = compare(step, x, y);
  CAPTURE(r.str());
  CHECK(r.traces == 1);
  CHECK(r.calls > 0);
  CHECK(r.eager_seconds > 0);
  CHECK(r.compiled_seconds > 0);
  CHECK(r.eager_min_seconds <= r.eager_seconds);
  CHECK(r.eager_seconds <= r.eager_max_seconds);
  CHECK(r.first_call_seconds > 0);
  CHECK(r.eager_peak_bytes > 0);
  CHECK(r.compiled_peak_bytes > 0);
  // Same state, same dropout mask: the faces agree to rounding.
  CHECK(r.max_abs_difference <= 1e-5);
  CHECK(r.json().find("\"max_abs_difference\": ") != std::string::npos);
  // A CPU function holds nothing in a GPU's memory (tests/test_cuda_compile.cpp counts a CUDA
  // step's).
  CHECK(r.eager_cuda_peak_bytes == 0);
  CHECK(r.compiled_cuda_peak_bytes == 0);
  CHECK(r.json().find("\"compiled_cuda_peak_bytes\": 0") != std::string::npos);
  const std::vector<Tensor> after = m.parameters();
  for (size_t i = 0; i < before.size(); ++i) CHECK(bitwise_equal(after[i], before[i]));
  CHECK(bitwise_equal(detail::generator_states()[0], rng));
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("MemoryProfile: an eager step's peak and the buffers live there, with ops and lines") {
  manual_seed(16);
  nn::Linear l1(64, 512), l2(512, 64);
  const Tensor x = randn({128, 64});
  int64_t peak = 0;
  std::vector<MemoryProfile::Buffer> live;
  const int64_t before = cpu_memory_stats().current;
  reset_peak_memory();
  {
    MemoryProfile prof;
    Tensor h = tanh(l1(x));  // 256 KiB, saved by tanh for the backward
    (l2(h) * l2(h)).mean().backward();
    peak = prof.peak_bytes();
    live = prof.live_at_peak();
    CHECK(!prof.str().empty());
  }
  CAPTURE(peak);
  // The allocator rounds to size classes; the profile counts the storages' own bytes.
  CHECK(peak <= cpu_memory_stats().peak - before);
  CHECK(peak >= 128 * 512 * 4);
  REQUIRE(!live.empty());
  int64_t sum = 0;
  bool tanh_here = false;
  for (size_t i = 0; i < live.size(); ++i) {
    if (i > 0) CHECK(live[i].bytes <= live[i - 1].bytes);
    sum += live[i].bytes;
    tanh_here = tanh_here ||
                (live[i].op == "tanh" && live[i].site.find("test_memory.cpp") != std::string::npos);
  }
  CHECK(sum == peak);
  CHECK(tanh_here);
  // A CPU region holds nothing on a GPU (tests/test_cuda_runtime.cpp profiles one that does).
  {
    MemoryProfile prof;
    Tensor h = tanh(l1(x));
    CHECK(prof.cuda_peak_bytes() == 0);
    CHECK(prof.cuda_live_at_peak().empty());
    CHECK(prof.str().find("GPU") == std::string::npos);
  }
  // Without a profile, storages report to none.
  CHECK(detail::g_memory_profiles.load() == 0);
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("checkpoint: parameters only, a result that is an input, autocast, symbolic batch") {
  manual_seed(17);
  nn::Linear fc(16, 16);
  const Tensor x = randn({8, 16});
  auto grads = [&](auto&& loss_fn) {
    for (Tensor p : fc.parameters()) p.set_grad(Tensor());
    loss_fn().backward();
    std::vector<Tensor> g;
    for (const Tensor& p : fc.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  auto same = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(bitwise_equal(a[i], b[i]));
  };
  SUBCASE("no input requires grad: the parameters still get theirs") {
    auto f = [&](const Tensor& t) { return tanh(fc(t)) * 2; };
    same(grads([&] { return f(x).sum(); }), grads([&] { return checkpoint(f, x).sum(); }));
  }
  SUBCASE("a result that is an input, beside one computed") {
    auto f = [&](const Tensor& t) { return std::make_tuple(t, sigmoid(fc(t))); };
    auto plain = [&] {
      auto [a, b] = f(x);
      return (a * b).sum();
    };
    auto checked = [&] {
      auto [a, b] = checkpoint(f, x);
      return (a * b).sum();
    };
    same(grads(plain), grads(checked));
  }
  SUBCASE("under autocast: the rerun casts as the first run did") {
    auto f = [&](const Tensor& t) { return gelu(fc(t)); };
    auto under = [&](bool ck) {
      return grads([&] {
        Autocast ac(Device::cpu(), DType::bf16);
        return (ck ? checkpoint(f, x) : f(x)).to(DType::f32).sum();
      });
    };
    same(under(false), under(true));
  }
  SUBCASE("compiled with a symbolic batch") {
    auto step = [&](const Tensor& in) {
      Tensor h = checkpoint([&](const Tensor& t) { return tanh(fc(t)); }, in);
      (h * h).sum().backward();
      return h;
    };
    CompileOptions o;
    o.dynamic = {{0, 0}};
    auto f = compile(step, o);
    for (int64_t b : {4, 7, 5}) {
      CAPTURE(b);
      const Tensor xb = randn({b, 16});
      fc.zero_grad();
      const Tensor he = step(xb);
      const std::vector<Tensor> ge{fc.weight.grad().clone(), fc.bias.grad().clone()};
      fc.zero_grad();
      const Tensor hc = f(xb);
      CHECK(bitwise_equal(he, hc));
      CHECK(bitwise_equal(ge[0], fc.weight.grad()));
      CHECK(bitwise_equal(ge[1], fc.bias.grad()));
    }
    CHECK(f.stats().traces == 1);
  }
}

}  // namespace duet::test

namespace duet::test {
namespace {

// A pre-LayerNorm transformer over token ids and its loss: W8's structure (docs/benchmarks.md)
// at a quarter of its width and sequence.
constexpr int64_t kTinyVocab = 256, kTinyWidth = 64;
struct TinyBlock : nn::Module {
  nn::LayerNorm ln1{Shape{kTinyWidth}}, ln2{Shape{kTinyWidth}};
  nn::MultiheadAttention attn{kTinyWidth, 4};
  nn::Linear fc1{kTinyWidth, 4 * kTinyWidth}, fc2{4 * kTinyWidth, kTinyWidth};
  TinyBlock() {
    register_module("ln1", ln1);
    register_module("ln2", ln2);
    register_module("attn", attn);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = ln1(x);
    Tensor y = x + attn.forward(h, h, h, {}, /*is_causal=*/true);
    return y + fc2(composed_gelu(fc1(ln2(y))));  // (the budget test's MLP, piece by piece)
  }
};
struct TinyTransformer : nn::Module {
  nn::Embedding tok{kTinyVocab, kTinyWidth};
  std::vector<std::shared_ptr<TinyBlock>> blocks;
  nn::LayerNorm ln_f{Shape{kTinyWidth}};
  nn::Linear head{kTinyWidth, kTinyVocab};
  TinyTransformer() {
    register_module("tok", tok);
    for (int i = 0; i < 2; ++i)
      blocks.push_back(register_module(fmt::format("blocks{}", i), std::make_shared<TinyBlock>()));
    register_module("ln_f", ln_f);
    register_module("head", head);
  }
  Tensor loss(const Tensor& ids, const Tensor& next) {
    Tensor x = tok(ids);
    for (auto& b : blocks) x = (*b)(x);
    return cross_entropy(reshape(head(ln_f(x)), {-1, kTinyVocab}), reshape(next, {-1}));
  }
};

}  // namespace

TEST_CASE("plan: a view no strides express reads a copy, or its cast computed in that order") {
  // Note [Copies for views no strides express]: heads merged back into rows, in f32 (a copy
  // step) and cast to bf16 first (the cast runs on the permuted view: no copy at all).
  const Tensor x = randn({2, 4, 8, 16});
  for (bool cast_first : {false, true}) {
    CAPTURE(cast_first);
    auto fn = [cast_first](const Tensor& a) {
      Tensor h = tanh(a);  // a value of the plan's own
      if (cast_first) h = h.to(DType::bf16);
      return reshape(permute(h, {0, 2, 1, 3}), {2, 8, 64}) * 2.0;
    };
    auto f = compile(fn);
    const Tensor got = f(x), want = fn(x);
    CHECK(bitwise_equal(got, want));
    const Graph& g = f.graph();  // the plan's graph
    int copies = 0, casts_of_views = 0;
    for (const GraphNode& n : g.nodes) {
      if (n.kind != NodeKind::Op) continue;
      copies += n.op == OpId::Copy;
      casts_of_views += n.op == OpId::Cast && detail::is_view_node(g.nodes[n.inputs[0]]);
    }
    CAPTURE(g.str());
    CHECK(copies == (cast_first ? 0 : 1));
    CHECK(casts_of_views == (cast_first ? 1 : 0));
    // Nothing is allocated outside the plan but its result.
    CHECK(peak_during([&] { f(x); }) <=
          want.numel() * static_cast<int64_t>(itemsize(want.dtype())) + 64);
  }
  // Two views of one permuted value that both need a copy (a linear layer's weight and bias
  // gradients reshape attention's merged heads as rows and as (batch, seq, width)): one copy,
  // or one moved cast, serves both.
  for (bool cast_first : {false, true}) {
    CAPTURE(cast_first);
    auto fn = [cast_first](const Tensor& a) {
      Tensor h = tanh(a);
      if (cast_first) h = h.to(DType::bf16);
      const Tensor p = permute(h, {0, 2, 1, 3});
      return std::vector<Tensor>{sum(reshape(p, {2, 8, 64}), {0, 1}), reshape(p, {16, 64}) * 2.0};
    };
    auto f = compile(fn);
    const std::vector<Tensor> got = f(x), want = fn(x);
    for (size_t k = 0; k < got.size(); ++k) CHECK(bitwise_equal(got[k], want[k]));
    const Graph& g = f.graph();
    int copies = 0, casts = 0;
    for (const GraphNode& n : g.nodes) {
      if (n.kind != NodeKind::Op) continue;
      copies += n.op == OpId::Copy;
      casts += n.op == OpId::Cast;
    }
    CAPTURE(g.str());
    CHECK(copies == (cast_first ? 0 : 1));
    CHECK(casts == (cast_first ? 1 : 0));
  }
  // A symbolic dim: the plans of other sizes follow the first plan's decisions (Note [Copies
  // for views no strides express]), and a size at which the reshape is a plain view (a
  // sequence of one) agrees too.
  for (int dim : {0, 2})
    for (DType dt : {DType::f32, DType::bf16}) {
      CAPTURE(dim);
      CAPTURE(dtype_name(dt));
      auto fn = [dt](const Tensor& a) {  // a fused chain after the copy or the moved cast
        return (reshape(permute(tanh(a).to(dt), {0, 2, 1, 3}), {-1, 64}) + 1.0) * 3.0;
      };
      CompileOptions o;
      o.dynamic = {{0, dim}};
      auto f = compile(fn, o);
      for (int64_t size : {3, 1, 8, 2}) {
        const Tensor a = randn(dim == 0 ? Shape{size, 4, 8, 16} : Shape{2, 4, size, 16});
        CHECK(bitwise_equal(f(a), fn(a)));
      }
      CHECK(f.stats().traces == 1);
    }
}

TEST_CASE("compiled transformer step: nothing outside its plan; half its plan's peak as a budget") {
  // Note [Copies for views no strides express]: attention merges its heads back into rows by a
  // reshape of a permuted value, which no strides express. The plan copies it into its arena as
  // a step of its own; it used to copy at run time, outside the plan and its figures.
  // Note [Memory budget]: with the MLP's product recomputed, its GELU gradient is written in
  // place of the recomputed input, which the backward reads through a barrier (Note
  // [Rematerialization]); that is what brings the step to half its plan.
  manual_seed(18);
  const Tensor ids = randint(kTinyVocab, {8, 33});
  const Tensor x = slice(ids, 1, 0, 32).clone(), y = slice(ids, 1, 1, 33).clone();
  auto run = [&](int64_t budget, int64_t* outside) {
    manual_seed(19);
    auto m = std::make_shared<TinyTransformer>();
    auto opt = std::make_shared<optim::AdamW>(m->parameters());
    CompileOptions o;
    o.memory_budget = budget;
    auto f = compile(
        [m, opt](const Tensor& in, const Tensor& t) {
          opt->zero_grad();
          Tensor loss = m->loss(in, t);
          loss.backward();
          opt->step();
          return loss;
        },
        o);
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(f(x, y).item<float>());
    *outside = peak_during([&] { f(x, y); });
    return std::make_pair(losses, f.memory_report());
  };
  int64_t outside = 0, outside_budget = 0;
  auto [l0, r0] = run(0, &outside);
  CAPTURE(r0.str());
  CHECK(outside < 4096);  // the loss, and the index checks' small copies
  const int64_t budget = r0.peak_bytes / 2;
  auto [l1, r1] = run(budget, &outside_budget);
  CAPTURE(r1.str());
  CHECK(r1.peak_bytes <= budget);
  CHECK(outside_budget < 4096);
  CHECK(l0 == l1);
}

}  // namespace duet::test
