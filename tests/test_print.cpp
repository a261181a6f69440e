// Printing: the values as PyTorch prints them, then shape, dtype and device.
#include <sstream>

#include "util.h"

namespace duet::test {

TEST_CASE("printing floats: 4 decimals, integer-valued floats, scientific notation") {
  CHECK(make({1.5, 2.25, -3}, {3}).str() ==
        "tensor([ 1.5000,  2.2500, -3.0000], shape=(3), dtype=f32, device=cpu)");
  CHECK(make({1, 2, 3}, {3}).str() == "tensor([1., 2., 3.], shape=(3), dtype=f32, device=cpu)");
  CHECK(make({-1, 10}, {2}, DType::f64).str() ==
        "tensor([-1., 10.], shape=(2), dtype=f64, device=cpu)");
  CHECK(make({1e-5, 1}, {2}).str() ==
        "tensor([1.0000e-05, 1.0000e+00], shape=(2), dtype=f32, device=cpu)");
  CHECK(make({1e9, 1}, {2}, DType::f64).str() ==
        "tensor([1.0000e+09, 1.0000e+00], shape=(2), dtype=f64, device=cpu)");
  CHECK(make({0, 0}, {2}).str() == "tensor([0., 0.], shape=(2), dtype=f32, device=cpu)");
  // Non-finite values take no part in choosing the format or the width, as in PyTorch.
  CHECK(make({1, std::nan(""), INFINITY, -INFINITY}, {4}).str() ==
        "tensor([1., nan, inf, -inf], shape=(4), dtype=f32, device=cpu)");
  CHECK(make({0.5, std::nan("")}, {2}).str() ==
        "tensor([0.5000,    nan], shape=(2), dtype=f32, device=cpu)");
}

TEST_CASE("printing integers, bools, 0-d and empty tensors") {
  CHECK(make({1, -20, 300}, {3}, DType::i64).str() ==
        "tensor([  1, -20, 300], shape=(3), dtype=i64, device=cpu)");
  CHECK(make({7}, {1}, DType::i32).str() == "tensor([7], shape=(1), dtype=i32, device=cpu)");
  CHECK(make({1, 0}, {2}, DType::b8).str() ==
        "tensor([ True, False], shape=(2), dtype=b8, device=cpu)");
  CHECK(make({2.5}, {}).str() == "tensor(2.5000, shape=(), dtype=f32, device=cpu)");
  CHECK(make({7}, {}, DType::i64).str() == "tensor(7, shape=(), dtype=i64, device=cpu)");
  CHECK(make({1}, {}, DType::b8).str() == "tensor(True, shape=(), dtype=b8, device=cpu)");
  CHECK(zeros({0}).str() == "tensor([], shape=(0), dtype=f32, device=cpu)");
  CHECK(zeros({2, 0}, Options().dtype(DType::i64)).str() ==
        "tensor([], shape=(2, 0), dtype=i64, device=cpu)");
}

TEST_CASE("printing matrices and higher ranks") {
  CHECK(make({1, 2.5, 3, 4}, {2, 2}).str() ==
        "tensor([[1.0000, 2.5000],\n"
        "        [3.0000, 4.0000]], shape=(2, 2), dtype=f32, device=cpu)");
  CHECK(make({1, 2, 3, 4}, {2, 1, 2}, DType::i64).str() ==
        "tensor([[[1, 2]],\n"
        "\n"
        "        [[3, 4]]], shape=(2, 1, 2), dtype=i64, device=cpu)");
  // A non-contiguous view prints its logical values.
  CHECK(transpose(make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::i32), 0, 1).str() ==
        "tensor([[1, 4],\n"
        "        [2, 5],\n"
        "        [3, 6]], shape=(3, 2), dtype=i32, device=cpu)");
}

TEST_CASE("printing large tensors summarizes with ...") {
  CHECK(arange(2000).str() ==
        "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], shape=(2000), dtype=i64, "
        "device=cpu)");
  CHECK(arange(1000).str().find("...") == std::string::npos);  // 1000 elements: all shown
  CHECK(reshape(arange(2000), {40, 50}).str() ==
        "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
        "        [  50,   51,   52,  ...,   97,   98,   99],\n"
        "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
        "        ...,\n"
        "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n"
        "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n"
        "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]], shape=(40, 50), dtype=i64, "
        "device=cpu)");
  CHECK(reshape(arange(1008, Options().dtype(DType::f32)), {7, 3, 48})
            .str()
            .rfind("tensor([[[   0.,    1.,    2.,  ...,   45.,   46.,   47.],\n"
                   "         [  48.,   49.,   50.,  ...,   93.,   94.,   95.],\n"
                   "         [  96.,   97.,   98.,  ...,  141.,  142.,  143.]],\n"
                   "\n"
                   "        [[ 144.,",
                   0) == 0);
  // Between blocks of rank >= 3 the ... line keeps the blank lines around it.
  std::string s3 = reshape(arange(1400), {7, 2, 100}).str();
  CHECK(s3.find("]],\n\n        ...,\n\n        [[") != std::string::npos);
}

TEST_CASE("operator<< and fmt print the same text") {
  Tensor t = make({1, 2}, {2}, DType::i64);
  std::ostringstream os;
  os << t;
  CHECK(os.str() == t.str());
  CHECK(fmt::format("{}", t) == t.str());
  CHECK(fmt::format("{}", Shape{2, 3}) == "(2, 3)");
  CHECK(fmt::format("{}", DType::bf16) == "bf16");
  CHECK(fmt::format("{}", Device::cpu()) == "cpu");
  CHECK(fmt::format("{}", Device::cuda(1)) == "cuda:1");
}

}  // namespace duet::test
