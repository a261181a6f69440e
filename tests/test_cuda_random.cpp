// The CUDA default generators (core/ops/random.cpp, Note [Default generators]): after the same
// manual_seed, rand and randint on a CUDA device give the same bits as on the CPU, randn agrees
// within 2 ulp, dropout draws the same masks; manual_seed reseeds the CUDA generators, which are
// streams of their own (a CPU draw does not advance them); a compiled function drawing on CUDA
// draws what eager code draws and advances the same state. Every case needs a usable GPU:
// without one, gpu() calls skip() and the binary exits with 77, which ctest reports as Skipped.
// The errors of a draw on CUDA without a GPU are tested by test_no_gpu, in every build.
#include <cmath>
#include <cstdio>
#include <functional>

#include "cuda/cuda.h"
#include "util.h"

namespace duet::test {
namespace {

const Device kCuda = Device::cuda();

// A device tensor's values and bytes, read through a copy to the CPU.
Tensor host(const Tensor& t) {
  CHECK(t.device().is_cuda());
  return t.to(Device::cpu());
}

const std::vector<uint64_t> kSeeds = {0, 42, 12345678901ull, 0xfedcba9876543210ull};
const std::vector<Shape> kShapes = {{1}, {7}, {1000}, {3, 333}, {0, 5}, {129, 65}, {2, 3, 4, 5}};

// Draws `draw(options)` twice on the CPU and twice on CUDA, each pair after manual_seed(seed),
// and hands both pairs to `check`.
void draw_pairs(const std::function<Tensor(const Options&)>& draw,
                const std::function<void(const Tensor&, const Tensor&)>& check) {
  for (uint64_t seed : kSeeds) {
    INFO("seed " << seed);
    manual_seed(seed);
    const Tensor c1 = draw(Options()), c2 = draw(Options());
    manual_seed(seed);
    const Tensor g1 = draw(Options().device(kCuda)), g2 = draw(Options().device(kCuda));
    CHECK(g1.device() == kCuda);
    check(host(g1), c1);
    check(host(g2), c2);  // the second draw continues both streams alike
  }
}

void same_bits(const Tensor& got, const Tensor& want) { CHECK(bitwise_equal(got, want)); }

// Normals (Box-Muller): CUDA documents its double log as within 1 ulp and its sin and cos
// within 2, glibc's are within 1, and the product compounds them: an f64 normal may differ
// from the CPU's by a few ulp (3 seen on an H100). f32 normals are computed in double and
// rounded once, so they differ by at most an ulp or two.
void within_ulps(const Tensor& got, const Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  const std::vector<double> g = values(got), w = values(want);
  const bool f32 = want.dtype() == DType::f32;
  const double ulps = f32 ? 2 : 4;
  for (size_t i = 0; i < g.size(); ++i) {
    const double ulp = f32 ? std::abs(std::nextafter(float(w[i]), INFINITY) - float(w[i]))
                           : std::abs(std::nextafter(w[i], INFINITY) - w[i]);
    CHECK_MESSAGE(std::abs(g[i] - w[i]) <= ulps * ulp,
                  "element " << i << ": " << g[i] << " vs " << w[i]);
  }
}

}  // namespace

TEST_CASE("cuda random: a CUDA generator made after manual_seed starts at that seed") {
  if (!gpu()) return;
  // Whether or not cuda:0's generator exists yet, the first draw after manual_seed(s) is the
  // CPU's first draw after manual_seed(s).
  manual_seed(2026);
  const Tensor want = rand({17});
  manual_seed(2026);
  CHECK(bitwise_equal(host(rand({17}, Options().device(kCuda))), want));
  for (int d = 1; d < cuda::device_count(); ++d) {
    INFO("cuda:" << d);
    manual_seed(2026);
    const Tensor got = rand({17}, Options().device(Device::cuda(d)));
    CHECK(got.device() == Device::cuda(d));
    CHECK(bitwise_equal(got.to(Device::cpu()), want));
  }
}

TEST_CASE("cuda rand: bit-identical to the CPU for the same seed, shapes and dtypes") {
  if (!gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (const Shape& s : kShapes) {
      INFO(dtype_name(dt) << " " << s);
      draw_pairs([&](const Options& o) { return rand(s, Options(o).dtype(dt)); }, same_bits);
    }
}

TEST_CASE("cuda randint: bit-identical to the CPU for the same seed, shapes, highs and dtypes") {
  if (!gpu()) return;
  struct Row {
    DType dtype;
    int64_t high;
  };
  for (const Row& r :
       {Row{DType::i64, 1000003}, Row{DType::i64, int64_t(1) << 62}, Row{DType::i32, 7},
        Row{DType::i32, int64_t(1) << 31}, Row{DType::f32, 1 << 20}, Row{DType::f64, 3}})
    for (const Shape& s : kShapes) {
      INFO(dtype_name(r.dtype) << " high " << r.high << " " << s);
      draw_pairs([&](const Options& o) { return randint(r.high, s, Options(o).dtype(r.dtype)); },
                 same_bits);
    }
}

TEST_CASE("cuda randn: within 2 ulp (f32) and 4 ulp (f64) of the CPU for the same seed") {
  if (!gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (const Shape& s : kShapes) {
      INFO(dtype_name(dt) << " " << s);
      draw_pairs([&](const Options& o) { return randn(s, Options(o).dtype(dt)); }, within_ulps);
    }
}

TEST_CASE("cuda dropout: the same masks as the CPU for the same seed") {
  if (!gpu()) return;
  for (DType dt : {DType::f32, DType::f64})
    for (double p : {0.1, 0.5, 0.9}) {
      INFO(dtype_name(dt) << " p " << p);
      const Tensor x = ones({33, 31}, Options().dtype(dt));
      const Tensor dx = x.to(kCuda);
      for (uint64_t seed : {uint64_t(1), uint64_t(77)}) {
        INFO("seed " << seed);
        manual_seed(seed);
        const Tensor c1 = dropout(x, p, true), c2 = dropout(x, p, true);
        manual_seed(seed);
        const Tensor g1 = dropout(dx, p, true), g2 = dropout(dx, p, true);
        CHECK(g1.device() == kCuda);
        CHECK(bitwise_equal(host(ne(g1, 0)), ne(c1, 0)));  // the masks
        CHECK(bitwise_equal(host(ne(g2, 0)), ne(c2, 0)));
        CHECK(close(host(g1), c1, 1e-6));  // kept elements scaled by 1 / (1 - p)
        CHECK(close(host(g2), c2, 1e-6));
      }
    }
  // Off or p = 0 draws nothing: the next draw is unchanged.
  manual_seed(9);
  const Tensor want = rand({8});
  manual_seed(9);
  const Tensor dx = ones({4}).to(kCuda);
  CHECK(bitwise_equal(host(dropout(dx, 0.5, false)), ones({4})));
  CHECK(bitwise_equal(host(dropout(dx, 0.0, true)), ones({4})));
  CHECK(bitwise_equal(host(rand({8}, Options().device(kCuda))), want));
}

TEST_CASE("cuda random: manual_seed reseeds the CUDA generators; they are streams of their own") {
  if (!gpu()) return;
  const Options dev = Options().device(kCuda);
  manual_seed(5);
  const Tensor c1 = rand({6, 7}), c2 = randn({9}), c3 = randint(100, {11});
  // Advance cuda:0 by a few draws, then reseed: it starts over.
  for (int i = 0; i < 3; ++i) rand({100}, dev);
  manual_seed(5);
  CHECK(bitwise_equal(host(rand({6, 7}, dev)), c1));
  within_ulps(host(randn({9}, dev)), c2);
  CHECK(bitwise_equal(host(randint(100, {11}, dev)), c3));
  // Interleaved CPU and CUDA draws: each generator keeps its own offset.
  manual_seed(5);
  const Tensor a1 = rand({6, 7});
  const Tensor b1 = rand({6, 7}, dev);
  const Tensor b2 = randn({9}, dev);
  const Tensor a2 = randn({9});
  CHECK(bitwise_equal(a1, c1));
  CHECK(bitwise_equal(host(b1), c1));
  within_ulps(host(b2), c2);
  CHECK(bitwise_equal(a2, c2));
  // Different seeds differ on the device too.
  manual_seed(6);
  CHECK(!bitwise_equal(host(rand({6, 7}, dev)), c1));
  // Options that ask for gradients make a leaf on the device.
  const Tensor r = rand({3}, Options().device(kCuda).requires_grad());
  CHECK(r.requires_grad());
  CHECK(r.is_leaf());
  CHECK(r.device() == kCuda);
}

TEST_CASE("cuda random: a compiled function drawing on CUDA draws as eager code does") {
  if (!gpu()) return;
  const auto on = [](Device d) {
    return [d](Tensor x) {
      return dropout(x, 0.5, true) + rand({4, 6}, Options().device(d)) +
             randn({6}, Options().device(d).dtype(DType::f32));
    };
  };
  const auto fn = on(kCuda);
  auto f = compile(fn);
  const Tensor x = ones({4, 6}).to(kCuda);
  manual_seed(11);
  const Tensor e1 = fn(x), e2 = fn(x), e_next = rand({5}, Options().device(kCuda));
  manual_seed(11);
  const Tensor c1 = f(x), c2 = f(x), c_next = rand({5}, Options().device(kCuda));
  CHECK(c1.device() == kCuda);
  CHECK(bitwise_equal(host(c1), host(e1)));
  CHECK(bitwise_equal(host(c2), host(e2)));
  CHECK(!bitwise_equal(host(c1), host(c2)));  // the captured state advanced between calls
  // The compiled calls advanced the CUDA generator in place: eager draws continue after them.
  CHECK(bitwise_equal(host(c_next), host(e_next)));
  CHECK(f.stats().traces == 1);
  // And the eager CUDA draws are the CPU's (up to the normals' ulps).
  manual_seed(11);
  const Tensor cpu1 = on(Device::cpu())(ones({4, 6}));
  CHECK(close(host(e1), cpu1, 1e-6));
}

}  // namespace duet::test
