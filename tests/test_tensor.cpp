// Tensor handles: views sharing storage, reshape copies, in-place ops (broadcast, conversion,
// aliasing), reading values out.
#include "util.h"

namespace duet::test {
namespace {
std::vector<double> iota(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
  return v;
}
}  // namespace

TEST_CASE("Tensor handles share storage; clone does not") {
  Tensor x = make({1, 2, 3}, {3});
  Tensor y = x;
  CHECK(y.is_same(x));
  y.add_(1);
  CHECK(values(x) == std::vector<double>{2, 3, 4});
  Tensor undefined;
  CHECK(!undefined.defined());
  CHECK(starts_with(error_of([&] { undefined.numel(); }), "[tensor] use of an undefined Tensor"));
  CHECK(undefined.str() == "tensor(undefined)");
}

TEST_CASE("metadata: dims, sizes, strides, offsets") {
  Tensor x = make(iota(24), {2, 3, 4});
  CHECK(x.dim() == 3);
  CHECK(x.numel() == 24);
  CHECK(x.size(-1) == 4);
  CHECK(x.size(0) == 2);
  CHECK(x.strides() == Strides{12, 4, 1});
  CHECK(x.is_contiguous());
  CHECK(x.device() == Device::cpu());
  Tensor s = slice(x, 2, 1, 4, 2);
  CHECK(s.strides() == Strides{12, 4, 2});
  CHECK(s.storage_offset() == 1);
  CHECK(!s.is_contiguous());
  Tensor t = transpose(x, 0, 2);
  CHECK(t.strides() == Strides{1, 4, 12});
  Tensor e = expand(make({1, 2, 3}, {3, 1}), {3, 4});
  CHECK(e.strides() == Strides{1, 0});
  CHECK(starts_with(error_of<ValueError>([&] { x.size(3); }), "[size] dim 3 is out of range"));
}

TEST_CASE("views share storage: writes through each view reach the base") {
  Tensor x = make(iota(24), {2, 3, 4});

  SUBCASE("reshape") {
    Tensor v = reshape(x, {6, 4});
    CHECK(same_storage(v, x));
    v.add_(make({100, 200, 300, 400}, {4}));
    CHECK(values(x)[5] == 205);
  }
  SUBCASE("transpose") {
    Tensor v = transpose(x, 0, 2);  // (4, 3, 2)
    CHECK(same_storage(v, x));
    slice(v, 0, 3, 4).zero_();  // v[3] is x[..., 3]
    std::vector<double> want = iota(24);
    for (int i = 3; i < 24; i += 4) want[i] = 0;
    CHECK(values(x) == want);
  }
  SUBCASE("permute") {
    Tensor v = permute(x, {1, 2, 0});  // (3, 4, 2)
    CHECK(same_storage(v, x));
    v.copy_(make({-1, -2}, {2}));  // x[0] = -1, x[1] = -2
    std::vector<double> want(24, -1);
    for (int i = 12; i < 24; ++i) want[i] = -2;
    CHECK(values(x) == want);
  }
  SUBCASE("slice with steps") {
    Tensor v = slice(slice(x, 2, 0, 4, 2), 1, 1, 3, 1);  // x[:, 1:3, ::2]
    CHECK(same_storage(v, x));
    CHECK(values(v) == std::vector<double>{4, 6, 8, 10, 16, 18, 20, 22});
    v.mul_(-1);
    std::vector<double> want = iota(24);
    for (double i : {4, 6, 8, 10, 16, 18, 20, 22}) want[static_cast<size_t>(i)] = -i;
    CHECK(values(x) == want);
  }
  SUBCASE("squeeze and unsqueeze") {
    Tensor u = unsqueeze(x, 1);  // (2, 1, 3, 4)
    Tensor sq = squeeze(u, 1);
    CHECK(same_storage(u, x));
    CHECK(same_storage(sq, x));
    CHECK(u.sizes() == Shape{2, 1, 3, 4});
    CHECK(sq.sizes() == Shape{2, 3, 4});
    sq.sub_(1);
    u.add_(3);
    std::vector<double> want = iota(24);
    for (double& w : want) w += 2;
    CHECK(values(x) == want);
    CHECK(squeeze(x, 0).is_same(x));  // a dim of size 2 is left alone, as in PyTorch
  }
  SUBCASE("expand sees later writes to the base") {
    Tensor col = make({1, 2, 3}, {3, 1});
    Tensor e = expand(col, {2, 3, 4});
    CHECK(same_storage(e, col));
    col.mul_(10);
    CHECK(values(e)[0] == 10);
    CHECK(values(e)[23] == 30);
    CHECK(values(sum(e, {0, 2})) == std::vector<double>{80, 160, 240});
  }
}

TEST_CASE("reshape of a non-contiguous tensor copies when no view exists, and is right") {
  Tensor x = make(iota(6), {2, 3});
  Tensor t = transpose(x, 0, 1);  // (3, 2): 0 3 1 4 2 5
  Tensor r = reshape(t, {6});
  CHECK(!same_storage(r, x));
  CHECK(values(r) == std::vector<double>{0, 3, 1, 4, 2, 5});
  r.add_(100);
  CHECK(values(x) == iota(6));
  check_tensor(reshape(t, {2, -1}), {2, 3}, DType::f32, {0, 3, 1, 4, 2, 5});
  // Every other block of a larger tensor still reshapes as a view.
  Tensor big = make(iota(24), {4, 3, 2});
  Tensor s = slice(big, 0, 0, 4, 2);  // (2, 3, 2), strides (12, 2, 1)
  Tensor v = reshape(s, {2, 6});
  CHECK(same_storage(v, big));
  CHECK(values(v) == std::vector<double>{0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17});
  // An expanded tensor cannot be flattened without a copy.
  Tensor e = expand(make({1, 2}, {2, 1}), {2, 3});
  Tensor f = reshape(e, {6});
  CHECK(!same_storage(f, e));
  CHECK(values(f) == std::vector<double>{1, 1, 1, 2, 2, 2});
}

TEST_CASE("in-place arithmetic with tensors and scalars, with broadcasting") {
  Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor& r = x.add_(make({10, 20, 30}, {3}));
  CHECK(&r == &x);
  CHECK(values(x) == std::vector<double>{11, 22, 33, 14, 25, 36});
  x.sub_(1);
  CHECK(values(x) == std::vector<double>{10, 21, 32, 13, 24, 35});
  x.mul_(make({2}, {}));
  CHECK(values(x) == std::vector<double>{20, 42, 64, 26, 48, 70});
  x.div_(make({2, 4}, {2, 1}));
  CHECK(values(x) == std::vector<double>{10, 21, 32, 6.5, 12, 17.5});
  x.sub_(make({1, 1, 1}, {1, 3}, DType::f64));  // f64 argument, f32 result kept
  CHECK(dtype_name(x.dtype()) == "f32");
  CHECK(values(x) == std::vector<double>{9, 20, 31, 5.5, 11, 16.5});
  x.div_(0.5);
  CHECK(values(x) == std::vector<double>{18, 40, 62, 11, 22, 33});

  Tensor i = make({1, 2, 3}, {3}, DType::i32);
  i.add_(make({5, 5, 5}, {3}, DType::i64));  // same category: allowed, stays i32
  i.mul_(3);
  CHECK(dtype_name(i.dtype()) == "i32");
  CHECK(values(i) == std::vector<double>{18, 21, 24});
  Tensor b = make({1, 0, 0}, {3}, DType::b8);
  b.add_(make({0, 1, 0}, {3}, DType::b8));
  CHECK(values(b) == std::vector<double>{1, 1, 0});
  b.mul_(true);
  CHECK(values(b) == std::vector<double>{1, 1, 0});
}

TEST_CASE("in-place ops bump the storage version") {
  Tensor x = zeros({3});
  uint32_t v0 = x.impl()->storage->version_.load();
  x.add_(1);
  x.copy_(make({1, 2, 3}, {3}));
  slice(x, 0, 0, 1).zero_();
  CHECK(x.impl()->storage->version_.load() == v0 + 3);
  Tensor y = x + 1;  // out of place: no bump
  CHECK(x.impl()->storage->version_.load() == v0 + 3);
}

TEST_CASE("copy_ broadcasts and converts dtypes; zero_") {
  Tensor y = zeros({2, 3});
  y.copy_(make({1, 2, 3}, {3}));
  CHECK(values(y) == std::vector<double>{1, 2, 3, 1, 2, 3});
  Tensor i = zeros({3}, Options().dtype(DType::i64));
  i.copy_(make({1.7, -1.7, 2.5}, {3}));  // float to int truncates toward zero
  CHECK(values(i) == std::vector<double>{1, -1, 2});
  Tensor b = zeros({3}, Options().dtype(DType::b8));
  b.copy_(make({0, 0.5, -2}, {3}));
  CHECK(values(b) == std::vector<double>{0, 1, 1});
  Tensor f = zeros({2, 2}, Options().dtype(DType::f64));
  f.copy_(transpose(make({1, 2, 3, 4}, {2, 2}, DType::i32), 0, 1));
  CHECK(values(f) == std::vector<double>{1, 3, 2, 4});
  Tensor s = make({5}, {});
  s.copy_(make({7}, {}, DType::i64));
  CHECK(values(s) == std::vector<double>{7});
  Tensor m = zeros({2, 2});
  m.copy_(s);
  CHECK(values(m) == std::vector<double>{7, 7, 7, 7});
  for (DType dt : kAllDTypes) {
    Tensor z = make({1, 2, 3, 4}, {2, 2}, dt);
    transpose(z, 0, 1).zero_();
    CHECK(values(z) == std::vector<double>{0, 0, 0, 0});
    CHECK(z.dtype() == dt);
  }
  Tensor col = make(iota(6), {2, 3});
  slice(col, 1, 1, 2).zero_();
  CHECK(values(col) == std::vector<double>{0, 0, 2, 3, 0, 5});
}

TEST_CASE("in-place ops into transposed and strided views") {
  Tensor x = make(iota(6), {2, 3});
  Tensor t = transpose(x, 0, 1);  // (3, 2)
  t.add_(make({100, 200}, {2}));  // t[:, j] += ..., i.e. x[j, :] += ...
  CHECK(values(x) == std::vector<double>{100, 101, 102, 203, 204, 205});
  Tensor big = make(iota(300 * 257), {300, 257});
  Tensor bt = transpose(big, 0, 1);
  bt.mul_(2);
  bt.add_(slice(bt, 1, 0, 1));  // broadcast a column of the view itself (aliasing)
  std::vector<double> v = values(big);
  bool ok = true;
  for (int64_t r = 0; r < 300 && ok; ++r)
    for (int64_t c = 0; c < 257 && ok; ++c) ok = v[r * 257 + c] == 2.0 * (r * 257 + c) + 2.0 * c;
  CHECK(ok);
}

TEST_CASE("in-place ops whose argument aliases the destination") {
  SUBCASE("x += x^T on a square matrix") {
    Tensor x = make(iota(9), {3, 3});
    x.add_(transpose(x, 0, 1));
    CHECK(values(x) == std::vector<double>{0, 4, 8, 4, 8, 12, 8, 12, 16});
  }
  SUBCASE("x = x^T through copy_") {
    Tensor x = make(iota(9), {3, 3});
    x.copy_(transpose(x, 0, 1));
    CHECK(values(x) == std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8});
  }
  SUBCASE("shifted overlap") {
    Tensor x = make({1, 2, 3, 4}, {4});
    slice(x, 0, 1, 4).add_(slice(x, 0, 0, 3));
    CHECK(values(x) == std::vector<double>{1, 3, 5, 7});
    Tensor y = make({1, 2, 3, 4}, {4});
    slice(y, 0, 1, 4).copy_(slice(y, 0, 0, 3));
    CHECK(values(y) == std::vector<double>{1, 1, 2, 3});
  }
  SUBCASE("the same layout reads and writes each element once") {
    Tensor x = make({1, 2, 3}, {3});
    x.mul_(x);
    CHECK(values(x) == std::vector<double>{1, 4, 9});
    x.copy_(x);
    CHECK(values(x) == std::vector<double>{1, 4, 9});
  }
  SUBCASE("large, past the parallel threshold") {
    Tensor x = make(iota(512 * 512), {512, 512});
    x.sub_(transpose(x, 0, 1));
    std::vector<double> v = values(x);
    bool ok = true;
    for (int64_t r = 0; r < 512 && ok; ++r)
      for (int64_t c = 0; c < 512 && ok; ++c) ok = v[r * 512 + c] == 511.0 * (r - c);
    CHECK(ok);
  }
}

TEST_CASE("in-place errors: narrowing the kind, shapes that do not fit") {
  Tensor i = make({1, 2}, {2}, DType::i64);
  CHECK(starts_with(error_of<DTypeError>([&] { i.add_(1.5); }),
                    "[add_] the result of dtype f32 cannot be written in place into a tensor of "
                    "dtype i64"));
  CHECK(starts_with(error_of<DTypeError>([&] { i.div_(2); }), "[div_]"));
  CHECK(starts_with(error_of<DTypeError>([&] { i.mul_(make({1, 2}, {2})); }), "[mul_]"));
  Tensor b = make({1, 0}, {2}, DType::b8);
  CHECK(starts_with(error_of<DTypeError>([&] { b.add_(1); }), "[add_]"));
  CHECK(values(i) == std::vector<double>{1, 2});  // nothing was written
  Tensor x = zeros({3});
  CHECK(starts_with(error_of<ShapeError>([&] {
                      x.add_(ones({2, 3}));
                    }),
                    "[add_] the result of shape (2, 3) cannot be written in place"));
  CHECK(starts_with(error_of<ShapeError>([&] { x.sub_(ones({4})); }), "[sub] shapes (3) and (4)"));
  CHECK(starts_with(error_of<ShapeError>([&] { x.copy_(ones({2})); }), "[copy_]"));
}

TEST_CASE("item and to_vector") {
  CHECK(make({2.5}, {}).item<float>() == 2.5f);
  CHECK(make({2.5}, {}).item<double>() == 2.5);
  CHECK(make({2.7}, {1, 1}).item<int64_t>() == 2);
  CHECK(make({-7}, {1}, DType::i64).item<int32_t>() == -7);
  CHECK(make({3}, {}, DType::i32).item<double>() == 3.0);
  CHECK(make({0.5}, {}).item<bool>() == true);
  CHECK(make({0}, {}, DType::b8).item<bool>() == false);
  Tensor x = transpose(make({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);
  CHECK(x.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(x.to_vector<double>() == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(x.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 2, 5, 3, 6});
  CHECK(make({1.9, -1.9}, {2}, DType::f64).to_vector<int32_t>() == std::vector<int32_t>{1, -1});
  CHECK(slice(make({0, 1, 2, 0}, {4}), 0, 0, 4, 2).to_vector<bool>() ==
        std::vector<bool>{false, true});
  CHECK(zeros({0, 3}).to_vector<float>().empty());
  CHECK(expand(make({7}, {}), {3}).to_vector<int64_t>() == std::vector<int64_t>{7, 7, 7});
  CHECK(starts_with(error_of<ValueError>([&] { x.item<float>(); }),
                    "[item] needs exactly one element, got shape (3, 2)"));
}

TEST_CASE("tensor(): values, shape and dtype") {
  check_tensor(tensor({1, 2, 3}), {3}, DType::f32, {1, 2, 3});
  check_tensor(tensor({1, 2, 3, 4, 5, 6}, {2, 3}, Options().dtype(DType::i64)), {2, 3}, DType::i64,
               {1, 2, 3, 4, 5, 6});
  check_tensor(tensor({2.5}, {}, Options().dtype(DType::f64)), {}, DType::f64, {2.5});
  check_tensor(tensor({}, {0, 2}), {0, 2}, DType::f32, {});
  check_tensor(tensor({0, 2}, Options().dtype(DType::b8)), {2}, DType::b8, {0, 1});
  Tensor d = make({1, 2}, {2}).detach();
  CHECK(d.numel() == 2);
  Tensor p = make({1, 2}, {2});
  CHECK(p.data_ptr<float>()[1] == 2.0f);
  CHECK(starts_with(error_of<DTypeError>([&] { p.data_ptr<double>(); }),
                    "[data_ptr] tensor has dtype f32, asked for f64"));
}

}  // namespace duet::test

namespace duet::test {
namespace {
// Regression: f32 sigmoid used Eigen's logistic packet, accurate in absolute terms only, so
// sigmoid(-8.1) was 4e-4 off relative to its value (found through silu in test_ops).
TEST_CASE("f32 sigmoid is accurate relative to its value, tails included") {
  std::vector<double> in;
  for (int i = 0; i <= 800; ++i) in.push_back(-20 + i * 0.05);
  const std::vector<double> got = values(sigmoid(make(in, {801}, DType::f32)));
  for (size_t i = 0; i < in.size(); ++i) {
    const double x = round_to(in[i], DType::f32), want = 1 / (1 + std::exp(-x));
    CAPTURE(x);
    CHECK(std::fabs(got[i] - want) <= 1e-6 * want);
  }
}

// Regression: the AVX-512 packet path of sqrt was an estimate plus a Newton step, so
// sqrt(9.0) was 3.0000000000000004 (found by the constant-folding test).
TEST_CASE("sqrt and rsqrt are correctly rounded, packets included") {
  for (DType d : {DType::f32, DType::f64}) {
    Tensor x = full({64}, 9.0, Options().dtype(d));
    for (double v : values(sqrt(x))) CHECK(v == 3.0);
    for (double v : values(rsqrt(full({64}, 4.0, Options().dtype(d))))) CHECK(v == 0.5);
    std::vector<double> in, want;
    for (int i = 1; i <= 64; ++i) {
      in.push_back(i * 1.37);
      want.push_back(d == DType::f32 ? double(std::sqrt(float(round_to(i * 1.37, d))))
                                     : std::sqrt(i * 1.37));
    }
    CHECK(values(sqrt(make(in, {64}, d))) == want);
  }
}

TEST_CASE("elementwise ops over transposed operands: tiled loops give every element") {
  // Shapes around the 32 x 32 tile and the 64-element threshold, with and without batch dims.
  const std::vector<Shape> shapes = {{64, 64}, {100, 130}, {3, 97, 65}, {2, 64, 200}};
  for (const Shape& s : shapes) {
    const int64_t n = s.numel();
    Tensor base = reshape(arange(n, Options().dtype(DType::f32)), s);
    Tensor t = transpose(base, -1, -2);  // reads across rows
    Tensor other = ones(t.sizes()) * 0.5;
    std::vector<double> tv = values(t.contiguous()), sum_v = values(t + other),
                        copy_v = values(t.contiguous());
    // The expected values, element by element from the index arithmetic.
    const int64_t R = s[s.size() - 2], C = s[s.size() - 1], batch = n / (R * C);
    std::vector<double> want;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < C; ++j)
        for (int64_t i = 0; i < R; ++i) want.push_back(double(b * R * C + i * C + j));
    CHECK_MESSAGE(copy_v == want, s);
    for (double& w : want) w += 0.5;
    CHECK_MESSAGE(sum_v == want, s);
  }
}

TEST_CASE("the gradient of a transposed weight arrives in the weight's layout") {
  // linear(x, w) multiplies by a transposed view of w (out, in): its gradient is made as
  // (g^T x)^T, so it arrives contiguous in w's own layout, as accumulating into .grad wants.
  Tensor x = randn({8, 5}, Options().dtype(DType::f64));
  Tensor w = randn({3, 5}, Options().dtype(DType::f64).requires_grad());
  Tensor g = grad({sum(linear(x, w) * linear(x, w))}, {w})[0];
  CHECK(g.is_contiguous());
  CHECK(g.sizes() == Shape{3, 5});
  // The same values as the plain product rule: d/dw sum((x w^T)^2) = 2 (x w^T)^T x.
  Tensor want = matmul(transpose(linear(x, w.detach()), 0, 1), x) * 2;
  CHECK(close(g, want, 1e-12));
}
}  // namespace
}  // namespace duet::test
