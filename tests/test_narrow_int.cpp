// The narrow integers i8, u8 and i16: storage, PyTorch's promotion and casts, arithmetic that
// wraps as PyTorch's does, comparisons, indexing, reductions into i64, files, and the compiled
// face (Note [Low precision] in kernels/low_precision.h). The dtype sweeps of test_ops and
// test_compile_sweep (conversions, views, slice_scatter, zero_) run them too, through kAllDTypes.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "util.h"

namespace duet::test {
namespace {

const DType kNarrow[] = {DType::i8, DType::u8, DType::i16};

Tensor of(std::vector<double> v, DType d) {
  const int64_t n = static_cast<int64_t>(v.size());
  return make(v, {n}, d);
}

TEST_CASE("narrow integers: sizes, names and PyTorch's promotion table") {
  CHECK(itemsize(DType::i8) == 1);
  CHECK(itemsize(DType::u8) == 1);
  CHECK(itemsize(DType::i16) == 2);
  CHECK(dtype_name(DType::u8) == "u8");
  for (DType d : kNarrow) {
    CHECK(is_integral(d));
    CHECK(!is_floating(d));
    CHECK(compute_dtype(d) == DType::i32);
  }
  struct Row {
    DType a, b, want;
  };
  // torch.promote_types on these pairs.
  const Row rows[] = {{DType::u8, DType::i8, DType::i16},  {DType::i8, DType::u8, DType::i16},
                      {DType::u8, DType::i16, DType::i16}, {DType::i8, DType::i16, DType::i16},
                      {DType::u8, DType::i32, DType::i32}, {DType::i16, DType::i64, DType::i64},
                      {DType::b8, DType::u8, DType::u8},   {DType::b8, DType::i8, DType::i8},
                      {DType::u8, DType::f16, DType::f16}, {DType::i16, DType::bf16, DType::bf16},
                      {DType::i8, DType::f32, DType::f32}, {DType::u8, DType::u8, DType::u8}};
  for (const Row& r : rows) {
    INFO(dtype_name(r.a) << " with " << dtype_name(r.b));
    CHECK(promote_types(r.a, r.b) == r.want);
    CHECK((make({1}, {1}, r.a) + make({1}, {1}, r.b)).dtype() == r.want);
  }
  // A Python number keeps the tensor's dtype within its category.
  CHECK((of({1, 2}, DType::u8) + 1).dtype() == DType::u8);
  CHECK((of({1, 2}, DType::i8) * 1.5).dtype() == DType::f32);
  CHECK((of({1, 2}, DType::i16) / of({2, 2}, DType::i16)).dtype() == DType::f32);
}

TEST_CASE("narrow integers: casts truncate, then keep the low bits") {
  // torch.tensor([-1.0, 300.0, 2.7, -129.5, 70000.0]).to(torch.uint8) is [255, 44, 2, 127, 112].
  Tensor x = tensor({-1.0, 300.0, 2.7, -129.5, 70000.0});
  CHECK(values(x.to(DType::u8)) == std::vector<double>{255, 44, 2, 127, 112});
  CHECK(values(x.to(DType::i8)) == std::vector<double>{-1, 44, 2, 127, 112});
  CHECK(values(x.to(DType::i16)) == std::vector<double>{-1, 300, 2, -129, 4464});
  // Through bf16, which rounds first (-129.5 to -130, 70000 to 70144), and between the integers.
  CHECK(values(x.to(DType::bf16).to(DType::u8)) == std::vector<double>{255, 44, 2, 126, 0});
  CHECK(values(of({-2, 200}, DType::i16).to(DType::u8)) == std::vector<double>{254, 200});
  CHECK(values(of({255, 128}, DType::u8).to(DType::i8)) == std::vector<double>{-1, -128});
  CHECK(values(of({255, 0}, DType::u8).to(DType::b8)) == std::vector<double>{1, 0});
  CHECK(values(of({-128, 127}, DType::i8).to(DType::f16)) == std::vector<double>{-128, 127});
  // NaN becomes 0.
  CHECK(values(tensor({NAN}).to(DType::u8)) == std::vector<double>{0});
  // tensor() checks that each value fits, as torch.tensor does.
  CHECK_THROWS_AS(tensor({256}, Options().dtype(DType::u8)), Error);
  CHECK_THROWS_AS(tensor({-1}, Options().dtype(DType::u8)), Error);
  CHECK_THROWS_AS(tensor({128}, Options().dtype(DType::i8)), Error);
  CHECK(values(tensor({-128, 127}, Options().dtype(DType::i8))) == std::vector<double>{-128, 127});
  CHECK(tensor({200}, Options().dtype(DType::u8)).item<uint8_t>() == 200);
  CHECK(tensor({-300}, Options().dtype(DType::i16)).to_vector<int16_t>() ==
        std::vector<int16_t>{-300});
}

TEST_CASE("narrow integers: arithmetic wraps as PyTorch's does") {
  Tensor a = of({250, 3, 128}, DType::u8), b = of({10, 4, 128}, DType::u8);
  CHECK(values(a + b) == std::vector<double>{4, 7, 0});
  CHECK(values(b - a) == std::vector<double>{16, 1, 0});
  CHECK(values(a * b) == std::vector<double>{196, 12, 0});
  CHECK((a + b).dtype() == DType::u8);
  CHECK(values(neg(of({1, 0}, DType::u8))) == std::vector<double>{255, 0});
  CHECK(values(of({100, -100}, DType::i8) * 2) == std::vector<double>{-56, 56});
  CHECK(values(abs(of({-128, -5}, DType::i8))) == std::vector<double>{-128, 5});
  CHECK(values(of({30000}, DType::i16) + of({30000}, DType::i16)) == std::vector<double>{-5536});
  CHECK(values(of({7, 9}, DType::u8) / of({2, 4}, DType::u8)) == std::vector<double>{3.5, 2.25});
  CHECK(values(maximum(of({-3, 9}, DType::i8), of({2, 1}, DType::i8))) ==
        std::vector<double>{2, 9});
  CHECK(values(relu(of({-3, 9}, DType::i16))) == std::vector<double>{0, 9});
  // Mixed: u8 with i8 computes in i16, without wrapping at 8 bits.
  Tensor m = of({200}, DType::u8) + of({100}, DType::i8);
  CHECK(m.dtype() == DType::i16);
  CHECK(values(m) == std::vector<double>{300});
  // A number the dtype cannot hold is an error, as in PyTorch.
  CHECK_THROWS_AS(of({1}, DType::u8) + 300, ValueError);
  CHECK_THROWS_AS(of({1}, DType::i8) * -129, ValueError);
  // Float math promotes to f32.
  CHECK(sqrt(of({4, 9}, DType::u8)).dtype() == DType::f32);
  CHECK(values(sqrt(of({4, 9}, DType::u8))) == std::vector<double>{2, 3});
  // In place: the sum wraps into the tensor itself.
  Tensor c = of({255, 1}, DType::u8);
  c.add_(of({1, 1}, DType::u8));
  CHECK(values(c) == std::vector<double>{0, 2});
  CHECK(values(clamp(of({0, 200, 255}, DType::u8), -5, 300)) == std::vector<double>{0, 200, 255});
  CHECK(values(clamp(of({0, 200, 255}, DType::u8), 10, 250)) == std::vector<double>{10, 200, 250});
  // Integer tensors take no gradient.
  CHECK_THROWS_AS(of({1}, DType::u8).requires_grad_(true), Error);
}

TEST_CASE("narrow integers: comparisons are exact across dtypes") {
  CHECK(values(of({200, 5}, DType::u8) > of({-1, 6}, DType::i8)) == std::vector<double>{1, 0});
  CHECK(values(of({255}, DType::u8) < 300) == std::vector<double>{1});
  CHECK(values(of({-128}, DType::i8) > -1000) == std::vector<double>{1});
  CHECK(values(eq(of({7, 8}, DType::i16), of({7, 9}, DType::u8))) == std::vector<double>{1, 0});
  CHECK(values(where(of({1, 0}, DType::u8) > 0, of({3, 3}, DType::u8),
                     of({250, 250}, DType::u8))) == std::vector<double>{3, 250});
}

TEST_CASE("narrow integers: views, indexing, cat, matmul and printing") {
  for (DType d : kNarrow) {
    INFO(dtype_name(d));
    Tensor x = make({1, 2, 3, 4, 5, 6}, {2, 3}, d);
    CHECK(values(transpose(x, 0, 1).contiguous()) == std::vector<double>{1, 4, 2, 5, 3, 6});
    CHECK(values(slice(x, 1, 1, 3)) == std::vector<double>{2, 3, 5, 6});
    CHECK(values(index_select(x, 1, tensor({2, 0}, Options().dtype(DType::i64)))) ==
          std::vector<double>{3, 1, 6, 4});
    CHECK(values(gather(x, 1, make({0, 0, 2, 1}, {2, 2}, DType::i64))) ==
          std::vector<double>{1, 1, 6, 5});
    Tensor c = cat({x, x}, 0);
    CHECK(c.dtype() == d);
    CHECK(c.sizes() == Shape{4, 3});
    CHECK(values(matmul(x, transpose(x, 0, 1))) == std::vector<double>{14, 32, 32, 77});
    CHECK(matmul(x, transpose(x, 0, 1)).dtype() == d);
    CHECK(fmt::format("{}", make({1, 2}, {2}, d)).find("1, 2") != std::string::npos);
    // A narrow index is refused, as PyTorch refuses one.
    CHECK_THROWS_AS(index_select(x, 1, make({0}, {1}, d)), DTypeError);
  }
  CHECK(fmt::format("{}", of({255}, DType::u8)).find("255") != std::string::npos);
  // The raw pointers, as an image loader would fill them.
  Tensor img = zeros({3}, Options().dtype(DType::u8));
  img.data_ptr<uint8_t>()[1] = 200;
  CHECK(values(img) == std::vector<double>{0, 200, 0});
  CHECK(of({-7}, DType::i8).data_ptr<int8_t>()[0] == -7);
  CHECK(of({-300}, DType::i16).data_ptr<int16_t>()[0] == -300);
  CHECK_THROWS_AS(img.data_ptr<int8_t>(), DTypeError);
}

TEST_CASE("narrow integers: reductions into i64, max, min and argmax") {
  for (DType d : kNarrow) {
    INFO(dtype_name(d));
    Tensor x = make({100, 120, 7, 1}, {2, 2}, d);
    Tensor s = sum(x);
    CHECK(s.dtype() == DType::i64);
    CHECK(s.item<int64_t>() == 228);  // no wrap: PyTorch sums integers in i64
    CHECK(values(sum(x, {1})) == std::vector<double>{220, 8});
    Tensor mx = max(x, {0});
    CHECK(mx.dtype() == d);
    CHECK(values(mx) == std::vector<double>{100, 120});
    CHECK(values(min(x, {1})) == std::vector<double>{100, 1});
    CHECK(values(argmax(x, 1)) == std::vector<double>{1, 0});
  }
  CHECK(sum(of({200, 200, 200}, DType::u8)).item<int64_t>() == 600);
}

TEST_CASE("narrow integers: randint stays in range") {
  manual_seed(5);
  Tensor r = randint(256, {1000}, Options().dtype(DType::u8));
  CHECK(r.dtype() == DType::u8);
  const std::vector<double> v = values(r);
  CHECK(*std::min_element(v.begin(), v.end()) >= 0);
  CHECK(*std::max_element(v.begin(), v.end()) <= 255);
  CHECK(*std::max_element(v.begin(), v.end()) >= 200);  // the draw covers the range
  CHECK_THROWS_AS(randint(129, {2}, Options().dtype(DType::i8)), ValueError);
}

TEST_CASE("narrow integers: compiled equals eager, bit for bit") {
  auto fn = [](Tensor a, Tensor b) {
    Tensor s = a * 3 + b;  // wraps in the narrow dtype
    return std::make_tuple(s, sum(s), s > b, s.to(DType::f32) * 0.5f);
  };
  auto f = compile(fn);
  Rng rng(3);
  for (DType d : kNarrow) {
    INFO(dtype_name(d));
    Tensor a = make(random_values(64, Domain{-100, 100, -100, 300}, d, rng), {8, 8}, d);
    Tensor b = make(random_values(64, Domain{-100, 100, -100, 300}, d, rng), {8, 8}, d);
    auto [s0, t0, c0, h0] = fn(a, b);
    auto [s1, t1, c1, h1] = f(a, b);
    CHECK(s1.dtype() == d);
    CHECK(values(s1) == values(s0));
    CHECK(values(t1) == values(t0));
    CHECK(values(c1) == values(c0));
    CHECK(values(h1) == values(h0));
  }
}

TEST_CASE("narrow integers: .npy files and state-dict files keep the dtype") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("duet_narrow_" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(dir);
  nn::StateDict dict;
  for (DType d : kNarrow) {
    INFO(dtype_name(d));
    Tensor x = make({-1, 2, 100, 0}, {2, 2}, d);
    const std::string path = dir + "/" + std::string(dtype_name(d)) + ".npy";
    data::write_npy(path, x);
    Tensor y = data::read_npy(path);
    CHECK(y.dtype() == d);
    CHECK(values(y) == values(x));
    dict[std::string(dtype_name(d))] = x;
  }
  nn::write_state_dict(dict, dir + "/dict.duet");
  nn::StateDict back = nn::read_state_dict(dir + "/dict.duet");
  for (DType d : kNarrow) {
    const Tensor& y = back.at(std::string(dtype_name(d)));
    CHECK(y.dtype() == d);
    CHECK(values(y) == values(dict.at(std::string(dtype_name(d)))));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace duet::test
