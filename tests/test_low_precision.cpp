// f16 and bf16 (Note [Low precision] in kernels/low_precision.h): conversions, printing,
// promotion, and the op table's bf16 and f16 columns. Each column runs the row on inputs rounded
// to the low dtype and compares with the row's f32 result on the same (rounded) values: an
// elementwise primitive and a reduction give that result rounded once, bit for bit; other rows
// agree within torch.testing's tolerances (bf16 rtol 1.6e-2, f16 rtol 1e-3), against the
// result's magnitude where the row chains several rounded ops.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>

#include "kernels/low_precision.h"
#include "op_rows.h"

namespace duet::test {
namespace {

const DType kLow[] = {DType::bf16, DType::f16};

double rtol_of(DType d) { return d == DType::bf16 ? 1.6e-2 : 1e-3; }

// The values rounded to `low`, in f32 (what the f32 reference computes on).
std::vector<double> rounded(std::vector<double> v, DType low) {
  for (double& x : v) x = round_to(x, low);
  return v;
}

// Rounds every value of an f32 result to `low` (the elementwise columns' exact expectation).
std::vector<double> rounded_result(const Tensor& r32, DType low) {
  return rounded(values(r32), low);
}

// |got - want| within atol + rtol * |want|, with atol at least rtol times the largest |want|
// (a row of several rounded ops loses digits against the result's scale, not each element's).
std::string scaled_differences(const std::vector<double>& got, const std::vector<double>& want,
                               double rtol) {
  double scale = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  return differences(got, want, rtol, std::max(1e-5, rtol * scale));
}

}  // namespace

TEST_CASE("low precision: .to() rounds to nearest even, keeps NaN, overflows f16 to infinity") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // bf16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and goes to the
  // even one (1); 1 + 3 * 2^-8 goes up to 1 + 2^-6.
  const Tensor x =
      make({1 + std::ldexp(1, -8), 1 + 3 * std::ldexp(1, -8), -2.5, nan, inf, 3.39e38, 1e-40}, {7});
  const Tensor b = x.to(DType::bf16);
  CHECK(b.dtype() == DType::bf16);
  const std::vector<double> vb = values(b);
  CHECK(vb[0] == 1.0);
  CHECK(vb[1] == 1 + std::ldexp(1, -6));
  CHECK(vb[2] == -2.5);
  CHECK(std::isnan(vb[3]));
  CHECK(vb[4] == inf);
  CHECK(vb[5] == 3.3895313892515355e38);  // the largest bf16, to nearest (3.4e38 rounds to inf)
  // f16: 11 significant bits, largest finite 65504; 65519 rounds down, 65520 to infinity.
  const Tensor h =
      make({1 + std::ldexp(1, -11), 65519, 65520, -70000, nan, 6e-8}, {6}).to(DType::f16);
  const std::vector<double> vh = values(h);
  CHECK(vh[0] == 1.0);
  CHECK(vh[1] == 65504);
  CHECK(vh[2] == inf);
  CHECK(vh[3] == -inf);
  CHECK(std::isnan(vh[4]));
  CHECK(vh[5] == std::ldexp(1, -24));  // the smallest subnormal
  // Back to f32 and f64 exactly; between the two low dtypes through f32 (one rounding).
  CHECK(differences(values(b.to(DType::f32)), vb, 0, 0).empty());
  CHECK(differences(values(h.to(DType::f64)), vh, 0, 0).empty());
  CHECK(values(make({1 + std::ldexp(1, -10)}, {1}, DType::f16).to(DType::bf16))[0] == 1.0);
  // Integers and booleans convert both ways.
  CHECK(values(make({257, -3}, {2}, DType::i64).to(DType::bf16)) == std::vector<double>{256, -3});
  CHECK(values(make({2.75, -0.5, 0}, {3}, DType::bf16).to(DType::i32)) ==
        std::vector<double>{2, 0, 0});
  CHECK(values(make({2.75, 0}, {2}, DType::f16).to(DType::b8)) == std::vector<double>{1, 0});
}

TEST_CASE("low precision: creation, printing and item()") {
  const Tensor z = zeros({2, 3}, Options().dtype(DType::bf16));
  CHECK(z.dtype() == DType::bf16);
  CHECK(values(z) == std::vector<double>(6, 0.0));
  const Tensor t = tensor({1.5, -0.1, 3}, Options().dtype(DType::f16));
  CHECK(t.dtype() == DType::f16);
  CHECK(values(t)[1] == round_to(-0.1, DType::f16));
  CHECK(t.str() == "tensor([ 1.5000, -0.1000,  3.0000], shape=(3), dtype=f16, device=cpu)");
  CHECK(make({1, 2}, {2}, DType::bf16).str() ==
        "tensor([1., 2.], shape=(2), dtype=bf16, device=cpu)");
  CHECK(make({0.3}, {}, DType::bf16).item<float>() == float(round_to(0.3, DType::bf16)));
  CHECK(values(arange(4, Options().dtype(DType::bf16))) == std::vector<double>{0, 1, 2, 3});
  CHECK(values(full({2}, 0.1, Options().dtype(DType::bf16)))[0] == round_to(0.1, DType::bf16));
  CHECK(values(eye(2, Options().dtype(DType::f16))) == std::vector<double>{1, 0, 0, 1});
  // Uniform draws stay below 1 in every dtype (they keep the dtype's digits).
  for (DType d : kLow) {
    manual_seed(3);
    const std::vector<double> u = values(rand({4096}, Options().dtype(d)));
    CHECK(*std::max_element(u.begin(), u.end()) < 1.0);
    CHECK(*std::min_element(u.begin(), u.end()) >= 0.0);
  }
}

TEST_CASE("low precision: PyTorch's promotion; a number enters the f32 math unrounded") {
  const Tensor b = make({1, 2}, {2}, DType::bf16), h = make({1, 2}, {2}, DType::f16);
  CHECK((b + h).dtype() == DType::f32);
  CHECK((b + make({1, 2}, {2})).dtype() == DType::f32);
  CHECK((b + make({1, 2}, {2}, DType::f64)).dtype() == DType::f64);
  CHECK((b + make({1, 2}, {2}, DType::i64)).dtype() == DType::bf16);
  CHECK((b * 2.5).dtype() == DType::bf16);
  CHECK((h + make({3}, {}, DType::f32)).dtype() == DType::f16);  // a 0-d tensor does not promote
  CHECK((b < 1.5).dtype() == DType::b8);
  CHECK(exp(make({1, 2}, {2}, DType::i64)).dtype() == DType::f32);
  // x * 0.1 multiplies by the f32 nearest 0.1, not by 0.1 rounded to bf16 first, then rounds.
  Rng rng(5);
  const std::vector<double> v = rounded(random_values(64, Domain{}, DType::f32, rng), DType::bf16);
  const Tensor x = make(v, {64}, DType::bf16);
  const Tensor want = (make(v, {64}) * 0.1).to(DType::bf16);
  CHECK(bitwise_equal(x * 0.1, want));
  CHECK(bitwise_equal(x * make({0.1}, {}, DType::f64), want));
}

TEST_CASE("low precision columns: elementwise primitives are the f32 result rounded once") {
  Rng rng(21);
  int checks = 0;
  std::vector<ElementwiseRow> rows = elementwise_rows();
  for (const ElementwiseRow& r : special_function_rows()) rows.push_back(r);
  for (const ElementwiseRow& row : rows) {
    if (std::find(row.dtypes.begin(), row.dtypes.end(), DType::f32) == row.dtypes.end()) continue;
    for (DType low : kLow) {
      // A contiguous operand and a transposed one, broadcast against a row.
      const std::vector<Shape> shapes = {{6, 7}, {7}, {6, 7}};
      std::vector<Tensor> in32, inlow;
      for (int i = 0; i < row.arity; ++i) {
        const bool cond = row.cond_first && i == 0;
        const DType dt = cond ? DType::b8 : low;
        const Shape& s = shapes[i];
        const std::vector<double> v = rounded(
            random_values(s.numel(), row.domains[i], cond ? DType::b8 : DType::f32, rng), dt);
        const Layout l = i == 0 ? Layout::Transposed : Layout::Contiguous;
        in32.push_back(make_layout(v, s, cond ? DType::b8 : DType::f32, l));
        inlow.push_back(make_layout(v, s, dt, l));
      }
      INFO(std::string(row.name) << " in " << dtype_name(low));
      const Tensor r32 = row.fn(in32), got = row.fn(inlow);
      const DType want_dtype = r32.dtype() == DType::f32 ? low : r32.dtype();
      CHECK(got.dtype() == want_dtype);
      const std::vector<double> want = want_dtype == low ? rounded_result(r32, low) : values(r32);
      // A composite may round after each of its ops (gelu and silu do not: the next test).
      const std::string diff = row.composite
                                   ? scaled_differences(values(got), values(r32), rtol_of(low))
                                   : differences(values(got), want, 0, 0);
      CHECK_MESSAGE(diff.empty(), diff);
      ++checks;
    }
  }
  CHECK(checks > 40);
}

TEST_CASE("low precision: gelu and silu compute in f32 and round once, forward and backward") {
  // Note [Activations in f32]: as PyTorch's kernels, not a composite rounded after each step.
  Rng rng(23);
  for (DType low : kLow) {
    const std::vector<double> v = rounded(random_values(256, Domain{}, DType::f32, rng), low);
    const std::vector<double> vg = rounded(random_values(256, Domain{}, DType::f32, rng), low);
    const std::vector<std::function<Tensor(const Tensor&)>> fns = {
        [](const Tensor& t) { return gelu(t); }, [](const Tensor& t) { return gelu(t, "tanh"); },
        [](const Tensor& t) { return silu(t); }};
    for (size_t i = 0; i < fns.size(); ++i) {
      INFO("activation " << i << " in " << dtype_name(low));
      Tensor x = make(v, {16, 16}, low).requires_grad_(true);
      Tensor x32 = make(v, {16, 16}, DType::f32).requires_grad_(true);
      const Tensor y = fns[i](x), y32 = fns[i](x32);
      CHECK(y.dtype() == low);
      CHECK(bitwise_equal(y, y32.to(low)));
      // The gradient arrives in the low dtype, widens, and goes through the f32 rule once.
      const Tensor g = make(vg, {16, 16}, low);
      y.backward(g);
      y32.backward(g.to(DType::f32));
      CHECK(x.grad().dtype() == low);
      CHECK(bitwise_equal(x.grad(), x32.grad().to(low)));
    }
  }
}

TEST_CASE("low precision columns: sum, max and min accumulate in f32 and round once") {
  Rng rng(22);
  for (const ReduceRow& row : reduce_rows()) {
    if (std::find(row.dtypes.begin(), row.dtypes.end(), DType::f32) == row.dtypes.end()) continue;
    for (DType low : kLow) {
      const std::vector<double> v =
          rounded(random_values(300 * 70, Domain{}, DType::f32, rng), low);
      for (const Dims& dims : {Dims{}, Dims{0}, Dims{1}}) {
        INFO(std::string(row.name) << " in " << dtype_name(low) << " over " << dims.str());
        const Tensor r32 = row.fn(make(v, {300, 70}), dims, false);
        const Tensor got = row.fn(make(v, {300, 70}, low), dims, false);
        CHECK(got.dtype() == low);
        if (row.composite) {
          CHECK_MESSAGE(scaled_differences(values(got), values(r32), rtol_of(low)).empty(),
                        scaled_differences(values(got), values(r32), rtol_of(low)));
        } else {
          CHECK(differences(values(got), rounded_result(r32, low), 0, 0).empty());
        }
      }
    }
  }
}

TEST_CASE("low precision: column sums widen row by row and equal the f32 sum rounded") {
  // Note [Low precision sums]: wide tiles, several tiles, a strided (transposed) input, and sums
  // over two leading dims, each the f32 sum of the same values rounded once.
  Rng rng(23);
  struct Case {
    Shape shape;
    Dims dims;
    bool transposed;
  };
  for (DType low : kLow)
    for (const Case& c : {Case{{33, 5000}, Dims{0}, false}, Case{{4, 8, 300}, Dims{0, 1}, false},
                          Case{{70, 300}, Dims{1}, true}, Case{{1, 9000}, Dims{0}, false}}) {
      INFO(dtype_name(low) << " " << c.shape << " over " << c.dims.str()
                           << (c.transposed ? " transposed" : ""));
      const std::vector<double> v =
          rounded(random_values(c.shape.numel(), Domain{}, DType::f32, rng), low);
      Tensor x = make(v, c.shape, low), x32 = make(v, c.shape);
      if (c.transposed) {
        x = x.transpose(0, 1);
        x32 = x32.transpose(0, 1);
      }
      const Tensor got = sum(x, c.dims);
      CHECK(got.dtype() == low);
      CHECK(differences(values(got), rounded_result(sum(x32, c.dims), low), 0, 0).empty());
    }
}

TEST_CASE("low precision columns: matmul rows accumulate in f32") {
  Rng rng(23);
  for (const MatmulRow& row : matmul_rows()) {
    for (DType low : kLow) {
      const std::vector<double> va =
          rounded(random_values(row.a.numel(), Domain{}, DType::f32, rng), low);
      const std::vector<double> vb =
          rounded(random_values(row.b.numel(), Domain{}, DType::f32, rng), low);
      INFO(std::string(row.name) << " in " << dtype_name(low));
      const Tensor r32 = matmul(make_layout(va, row.a, DType::f32, row.la),
                                make_layout(vb, row.b, DType::f32, row.lb));
      const Tensor got =
          matmul(make_layout(va, row.a, low, row.la), make_layout(vb, row.b, low, row.lb));
      CHECK(got.dtype() == low);
      CHECK(got.sizes() == r32.sizes());
      CHECK_MESSAGE(scaled_differences(values(got), values(r32), rtol_of(low)).empty(),
                    scaled_differences(values(got), values(r32), rtol_of(low)));
    }
  }
}

TEST_CASE("low precision columns: every op row against its f32 result") {
  Rng rng(24);
  int checks = 0;
  for (const OpRow& row : op_rows()) {
    if (row.shapes.empty()) continue;  // random draws: their own test
    if (std::find(row.dtypes.begin(), row.dtypes.end(), DType::f32) == row.dtypes.end()) continue;
    for (DType low : kLow) {
      std::vector<Tensor> in32, inlow;
      for (size_t i = 0; i < row.shapes.size(); ++i) {
        const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
        const std::vector<double> v =
            rounded(random_values(row.shapes[i].numel(), d, DType::f32, rng), low);
        in32.push_back(make(v, row.shapes[i]));
        inlow.push_back(make(v, row.shapes[i], low));
      }
      INFO(row.name << " in " << dtype_name(low));
      const Tensor r32 = row.fn(in32), got = row.fn(inlow);
      CHECK(got.dtype() == (row.index_result ? DType::i64 : low));
      CHECK(got.sizes() == r32.sizes());
      if (row.index_result)
        CHECK(differences(values(got), values(r32), 0, 0).empty());
      else
        CHECK_MESSAGE(
            scaled_differences(values(got), values(r32), rtol_of(low) * row.low_rtol_scale).empty(),
            scaled_differences(values(got), values(r32), rtol_of(low) * row.low_rtol_scale));
      ++checks;
    }
  }
  CHECK(checks > 60);
}

TEST_CASE("low precision: gradients flow in the low dtype and match f32's") {
  Rng rng(25);
  for (DType low : kLow) {
    const std::vector<double> vx = rounded(random_values(12, Domain{}, DType::f32, rng), low);
    const std::vector<double> vw = rounded(random_values(12, Domain{}, DType::f32, rng), low);
    auto grads = [&](DType dt) {
      Tensor x = make(vx, {3, 4}, dt).requires_grad_(true);
      Tensor w = make(vw, {4, 3}, dt).requires_grad_(true);
      // Weights that differ along the softmax dim (a plain sum of a softmax has gradient 0).
      sum(softmax(tanh(matmul(x, w)), -1) * make({1, -2, 3}, {3}, dt)).backward();
      return std::pair{x.grad(), w.grad()};
    };
    const auto [gx, gw] = grads(low);
    const auto [fx, fw] = grads(DType::f32);
    CHECK(gx.dtype() == low);
    CHECK(gw.dtype() == low);
    CHECK(scaled_differences(values(gx), values(fx), 4 * rtol_of(low)).empty());
    CHECK(scaled_differences(values(gw), values(fw), 4 * rtol_of(low)).empty());
  }
}

// Note [Low-precision convolutions] in kernels/conv.cpp: oneDNN's bf16 weight gradient gave a
// filter tap that meets only the padding (a 2x2 filter at stride 3, padding 1: its left column
// never meets the input) garbage now and then, where it is zero. Each call here follows a large
// tensor of noise freed, so that stale memory would show.
TEST_CASE("low precision: a bf16 conv2d weight gradient is zero at taps that meet only padding") {
  Rng rng(26);
  const std::vector<double> vx = rounded(random_values(24, Domain{}, DType::f32, rng), DType::bf16);
  const std::vector<double> vg = rounded(random_values(4, Domain{}, DType::f32, rng), DType::bf16);
  for (int k = 0; k < 40; ++k) {
    { Tensor noise = randn({64, 1024}).to(DType::bf16) * 1e30; }
    const Tensor gw = conv2d_weight_grad(make(vx, {2, 2, 3, 2}, DType::bf16),
                                         make(vg, {2, 1, 2, 1}, DType::bf16), 2, 3, 1);
    const Tensor gw32 = conv2d_weight_grad(make(vx, {2, 2, 3, 2}), make(vg, {2, 1, 2, 1}), 2, 3, 1);
    const std::vector<double> got = values(gw), want = values(gw32);
    for (size_t i = 0; i < want.size(); ++i)
      if (want[i] == 0) REQUIRE_MESSAGE(got[i] == 0, "element " << i << " of call " << k);
    CHECK(scaled_differences(got, want, rtol_of(DType::bf16)).empty());
  }
}

TEST_CASE("low precision: a compiled function equals the eager one bit for bit") {
  Rng rng(26);
  for (DType low : kLow) {
    const Tensor x = make(random_values(32, Domain{}, DType::f32, rng), {4, 8}, low);
    const Tensor w = make(random_values(48, Domain{}, DType::f32, rng), {8, 6}, low);
    const Tensor b = make(random_values(6, Domain{}, DType::f32, rng), {6}, low);
    auto step = [](Tensor x, Tensor w, Tensor b) {
      Tensor wl = w.detach().requires_grad_(true);
      Tensor h = relu(matmul(x, wl) + b) * 0.5;
      Tensor y = log_softmax(h, -1);
      Tensor loss = -mean(y);
      Tensor gw = grad({loss}, {wl})[0];
      return std::vector<Tensor>{y.detach(), loss.detach(), gw,
                                 sum(h.detach().to(DType::f32), {0})};
    };
    const std::vector<Tensor> eager = step(x, w, b);
    auto compiled = compile(step);
    for (int call = 0; call < 2; ++call) {
      const std::vector<Tensor> got = compiled(x, w, b);
      REQUIRE(got.size() == eager.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO(dtype_name(low) << " output " << i << " call " << call);
        CHECK(bitwise_equal(got[i], eager[i]));
      }
    }
  }
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("low precision: constants of a compiled function keep their values") {
  // The graph passes store a folded constant's value in its dtype; they once stored it as an
  // integer for f16 and bf16 (a * 0.5 became a * 0). The compiled test above catches that; this
  // one checks the values a user writes.
  for (DType low : kLow) {
    auto body = [low](Tensor x) { return x * 2.7 + full({3}, 0.3).to(low); };
    auto f = compile(body);
    const Tensor x = make({1, 2, 3}, {3}, low);
    const Tensor eager = body(x);
    CHECK(bitwise_equal(f(x), eager));
    CHECK(values(eager)[0] ==
          round_to(round_to(round_to(2.7, DType::f32), low) + round_to(0.3, low), low));
  }
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("low precision: bf16 and f16 chains fuse, and equal the eager ops bit for bit") {
  // Each fused instruction rounds its register to the op's dtype, as the eager kernel rounds
  // what it stores (Note [Fused registers] in kernels/fused.h).
  Rng rng(27);
  for (DType low : kLow) {
    INFO(dtype_name(low));
    auto body = [low](Tensor x, Tensor y, Tensor i) {
      Tensor a = tanh(x * 1.7 + y);
      Tensor b = where(a > 0.2, exp(a), -a) / 3.0;
      // b + i rounds the i32 tensor to `low` first: it runs alone, outside the fused groups.
      return std::vector<Tensor>{b,
                                 (b + i).to(DType::f32),
                                 sum(b.to(DType::f32), {1}),
                                 b < 0.5,
                                 x.to(DType::f32) * 2.0 + 1.0,
                                 (x * 3.0).to(low == DType::bf16 ? DType::f16 : DType::bf16)};
    };
    auto f = compile(body);
    for (int call = 0; call < 2; ++call) {
      const Tensor x = make_layout(rounded(random_values(42, Domain{}, DType::f32, rng), low),
                                   {6, 7}, low, Layout::Transposed);
      const Tensor y = make(random_values(7, Domain{}, low, rng), {7}, low);
      const Tensor i = make(random_values(42, Domain{}, DType::i32, rng), {6, 7}, DType::i32);
      const std::vector<Tensor> want = body(x, y, i), got = f(x, y, i);
      REQUIRE(got.size() == want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        INFO("output " << k << ", call " << call);
        CHECK(bitwise_equal(got[k], want[k]));
      }
    }
    CHECK(f.stats().fused_kernels >= 1);
    CHECK(f.stats().fused_nodes >= 6);
  }
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE("low precision: modules convert, and state-dict files and saved programs keep the bits") {
  manual_seed(5);
  nn::Linear fc1(6, 8), fc2(8, 3);
  fc1.to(DType::bf16);
  fc2.to(DType::bf16);
  for (const Tensor& p : fc1.parameters()) CHECK(p.dtype() == DType::bf16);
  const Tensor x = randn({4, 6}).to(DType::bf16);
  const Tensor y = fc2(relu(fc1(x)));
  CHECK(y.dtype() == DType::bf16);
  const std::string base =
      fmt::format("/tmp/duet_test_low_precision_{}", static_cast<long>(::getpid()));
  // A state-dict file: the same bits back.
  fc1.save(base + ".state");
  nn::Linear other(6, 8);
  other.to(DType::bf16);
  other.load(base + ".state");
  const std::vector<Tensor> a = fc1.parameters(), b = other.parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK(bitwise_equal(a[i], b[i]));
  // A saved program: the same outputs, bit for bit, from the file alone.
  auto f = compile([&](Tensor in) { return fc2(relu(fc1(in))); });
  save(f, base + ".duet", x);
  Program p = load(base + ".duet");
  CHECK(bitwise_equal(p({x})[0], y));
  std::remove((base + ".state").c_str());
  std::remove((base + ".duet").c_str());
}

TEST_CASE("low precision: optimizers train bf16 parameters with f32 state") {
  Tensor w = make({0.5, -1.25, 2}, {3}, DType::bf16).requires_grad_(true);
  optim::Adam opt({w}, {.lr = 0.1});
  for (const Tensor& t : opt.state_tensors())
    if (t.dim() > 0) CHECK(t.dtype() == DType::f32);
  const std::vector<double> before = values(w);
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    sum(w * w).backward();
    CHECK(w.grad().dtype() == DType::bf16);
    opt.step();
  }
  CHECK(w.dtype() == DType::bf16);
  const std::vector<double> after = values(w);
  for (size_t i = 0; i < after.size(); ++i) CHECK(std::fabs(after[i]) < std::fabs(before[i]));
}

}  // namespace duet::test

namespace duet::test {

// Every value of the 16-bit type L (bf16_t or f16_t) in `all`, widened by `widen` into `wide`;
// how many differ from Eigen's conversion of each.
template <class L>
int64_t widened_differently(void (*widen)(const L*, float*, int64_t), std::vector<L>& all,
                            std::vector<float>& wide) {
  all.resize(65536);
  wide.resize(65536);
  for (int i = 0; i < 65536; ++i) all[i] = Eigen::numext::bit_cast<L>(uint16_t(i));
  widen(all.data(), wide.data(), 65536);
  int64_t bad = 0;
  for (int i = 0; i < 65536; ++i)
    bad += Eigen::numext::bit_cast<uint32_t>(wide[i]) !=
           Eigen::numext::bit_cast<uint32_t>(static_cast<float>(all[i]));
  return bad;
}

// A million f32 bit patterns from a fixed LCG, after the edge cases a test lists.
void append_random_bits(std::vector<uint32_t>& bits) {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 1 << 20; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    bits.push_back(static_cast<uint32_t>(s >> 32));
  }
}

TEST_CASE("low precision: bf16 rows convert by their bits exactly as Eigen converts each value") {
  // Note [bf16 rows by their bits] in kernels/low_precision.h: the kernels' row conversions
  // (casts, the elementwise families, the fused interpreter) against Eigen's conversion of each
  // value: every bf16 widened, and the f32 values at the edges (signed zeros, denormals, ties,
  // the carry into inf, NaNs with payloads) and a million random bit patterns rounded.
  using kernels::bf16_t;
  std::vector<bf16_t> all;
  std::vector<float> wide;
  CHECK(widened_differently<bf16_t>(kernels::widen_bf16, all, wide) == 0);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x3F808000u,
                                0x3F818000u, 0x3F80FFFFu, 0x7F7FFFFFu, 0x7F7F8000u, 0xFF7F8000u,
                                0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC12345u, 0x7FFFFFFFu};
  append_random_bits(bits);
  const int64_t n = static_cast<int64_t>(bits.size());
  std::vector<float> f(bits.size()), in_place(bits.size());
  for (int64_t i = 0; i < n; ++i) f[i] = Eigen::numext::bit_cast<float>(bits[i]);
  std::vector<bf16_t> low(bits.size());
  kernels::round_to_bf16(f.data(), low.data(), n);
  in_place = f;
  kernels::round_bf16_in_place(in_place.data(), n);
  int64_t bad_round = 0, bad_in_place = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t want = Eigen::numext::bit_cast<uint16_t>(bf16_t(f[i]));
    bad_round += Eigen::numext::bit_cast<uint16_t>(low[i]) != want;
    bad_in_place += Eigen::numext::bit_cast<uint32_t>(in_place[i]) != uint32_t(want) << 16;
  }
  CHECK(bad_round == 0);
  CHECK(bad_in_place == 0);
  // Through the kernels: a cast of a row and an elementwise op.
  Tensor x = zeros({n});
  std::memcpy(x.raw_data(), f.data(), bits.size() * 4);
  const Tensor y = x.to(DType::bf16);
  CHECK(std::memcmp(y.raw_data(), low.data(), bits.size() * 2) == 0);
}

TEST_CASE("low precision: f16 rows convert with F16C exactly as Eigen converts each value") {
  // Note [f16 rows with F16C] in kernels/low_precision.h: the rows against Eigen's conversion of
  // each value: every f16 widened (signaling NaNs included, which F16C quiets and Eigen keeps),
  // and f32 values at the edges (signed zeros, f16 subnormals and their ties, the largest f16
  // and the carry into inf, NaNs with payloads) and a million random bit patterns rounded, in
  // rows of every length up to 40 (the lanes, and the tail after them).
  using kernels::f16_t;
  std::vector<f16_t> all;
  std::vector<float> wide;
  CHECK(widened_differently<f16_t>(kernels::widen_f16, all, wide) == 0);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x33000000u,
                                0x33000001u, 0x337FFFFFu, 0x387FC000u, 0x38800000u, 0x477FE000u,
                                0x477FEFFFu, 0x477FF000u, 0x477FFFFFu, 0xC77FF000u, 0x7F7FFFFFu,
                                0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC12345u, 0x7FFFFFFFu,
                                0x3F801000u, 0x3F803000u, 0x3F802FFFu};
  append_random_bits(bits);
  // The f16 values themselves, widened and moved by an f32 ulp either way (ties and their
  // neighbours everywhere in the range).
  for (int i = 0; i < 65536; ++i) {
    const uint32_t u = Eigen::numext::bit_cast<uint32_t>(wide[i]);
    for (uint32_t v : {u, u + 1, u - 1, u + 0x1000u, u + 0xFFFu}) bits.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(bits.size());
  std::vector<float> f(bits.size()), in_place(bits.size());
  for (int64_t i = 0; i < n; ++i) f[i] = Eigen::numext::bit_cast<float>(bits[i]);
  std::vector<f16_t> low(bits.size());
  kernels::round_to_f16(f.data(), low.data(), n);
  in_place = f;
  kernels::round_f16_in_place(in_place.data(), n);
  int64_t bad_round = 0, bad_in_place = 0;
  for (int64_t i = 0; i < n; ++i) {
    const f16_t want = f16_t(f[i]);
    bad_round +=
        Eigen::numext::bit_cast<uint16_t>(low[i]) != Eigen::numext::bit_cast<uint16_t>(want);
    bad_in_place += Eigen::numext::bit_cast<uint32_t>(in_place[i]) !=
                    Eigen::numext::bit_cast<uint32_t>(static_cast<float>(want));
  }
  CHECK(bad_round == 0);
  CHECK(bad_in_place == 0);
  int64_t bad_rows = 0;  // short rows: every lane count, and the tails
  for (int64_t len = 1; len <= 40; ++len) {
    std::vector<f16_t> r(static_cast<size_t>(len));
    std::vector<float> back(static_cast<size_t>(len));
    kernels::round_to_f16(f.data() + len, r.data(), len);
    kernels::widen_f16(all.data() + 0x7C00 - 3 * len, back.data(), len);
    for (int64_t i = 0; i < len; ++i) {
      bad_rows += Eigen::numext::bit_cast<uint16_t>(r[size_t(i)]) !=
                  Eigen::numext::bit_cast<uint16_t>(f16_t(f[size_t(len + i)]));
      bad_rows += Eigen::numext::bit_cast<uint32_t>(back[size_t(i)]) !=
                  Eigen::numext::bit_cast<uint32_t>(static_cast<float>(all[0x7C00 - 3 * len + i]));
    }
  }
  CHECK(bad_rows == 0);
  // Through the kernels: a cast of a row, and back.
  Tensor x = zeros({n});
  std::memcpy(x.raw_data(), f.data(), bits.size() * 4);
  const Tensor y = x.to(DType::f16);
  CHECK(std::memcmp(y.raw_data(), low.data(), bits.size() * 2) == 0);
  Tensor h = zeros({65536}, Options().dtype(DType::f16));
  std::memcpy(h.raw_data(), all.data(), 65536 * 2);
  const Tensor w = h.to(DType::f32);
  CHECK(std::memcmp(w.raw_data(), wide.data(), 65536 * 4) == 0);
}

}  // namespace duet::test

namespace duet::test {

TEST_CASE(
    "low precision: gathers, their gradients and fills run without f32 copies of their input") {
  // A bf16 embedding lookup converted its whole table to f32 and the rows back (via_wide):
  // 100x the time of the f32 lookup at GPT-2's vocabulary. Gathers now move each element's
  // bits, and fills round their value once; a NaN's payload rides along, as in PyTorch.
  for (DType dt : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dt));
    const Tensor table = randn({4000, 64}).to(dt);
    uint16_t nan_bits = dt == DType::bf16 ? 0x7fa1 : 0x7e11;  // quiet NaNs with payloads
    std::memcpy(static_cast<char*>(table.raw_data()) + 2 * (3 * 64 + 5), &nan_bits, 2);
    const Tensor ids = tensor({3.0, 0, 3999, 3}, Options().dtype(DType::i64));
    NoGradGuard no_grad;
    index_select(table, 0, ids);  // (warm-up: first-call allocations are not the op's)
    reset_peak_memory();
    const int64_t before = cpu_memory_stats().current;
    const Tensor rows = index_select(table, 0, ids);
    const int64_t peak = cpu_memory_stats().peak - before;
    CHECK(peak <= 4 * 64 * 2 + 1024);  // the result, not an f32 table
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t src = static_cast<int64_t>(ids.to_vector<double>()[static_cast<size_t>(r)]);
      CHECK(std::memcmp(static_cast<const char*>(rows.raw_data()) + r * 128,
                        static_cast<const char*>(table.raw_data()) + src * 128, 128) == 0);
    }
    // index_select's gradient (rows added into a table): only the touched rows are widened,
    // summed in f32 in the index's order and rounded once, as via_wide's f32 sum rounded; a row
    // hit twice (id 3) sums before its one rounding; the other rows keep their bits.
    const Tensor grads = randn({4, 64}).to(dt);
    const Tensor idx2 = expand(reshape(ids, {4, 1}), {4, 64});
    scatter_add(table, 0, idx2, grads);  // (warm-up)
    reset_peak_memory();
    const int64_t before_add = cpu_memory_stats().current;
    const Tensor added = scatter_add(table, 0, idx2, grads);
    CHECK(cpu_memory_stats().peak - before_add <= table.numel() * 2 + 64 * 1024);
    const Tensor want = scatter_add(table.to(DType::f32), 0, idx2, grads.to(DType::f32)).to(dt);
    for (int64_t r : {0, 3, 1, 3999, 2000}) {
      CAPTURE(r);
      const bool keeps_nan = r == 3;  // row 3 holds the NaN, whose payload via f32 is lost
      if (!keeps_nan)
        CHECK(std::memcmp(static_cast<const char*>(added.raw_data()) + r * 128,
                          static_cast<const char*>(want.raw_data()) + r * 128, 128) == 0);
    }
    // Row 3: every element but the NaN as the f32 sum rounded; the NaN stays a NaN.
    const std::vector<double> got3 = slice(added, 0, 3, 4).to_vector<double>(),
                              want3 = slice(want, 0, 3, 4).to_vector<double>();
    for (size_t c = 0; c < got3.size(); ++c) {
      if (c == 5)
        CHECK(std::isnan(got3[c]));
      else
        CHECK(got3[c] == want3[c]);
    }
    // A fill: the f32 value rounded once, as the cast rounds it.
    for (double v : {1.0 / 3.0, -2.5e-5, 60001.0, std::numeric_limits<double>::infinity()}) {
      CAPTURE(v);
      const Tensor f = full({3, 5}, v, Options().dtype(dt));
      const Tensor want = full({3, 5}, v).to(dt);
      CHECK(std::memcmp(f.raw_data(), want.raw_data(), 30) == 0);
    }
  }
}

}  // namespace duet::test
