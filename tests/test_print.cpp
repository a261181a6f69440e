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

// ---- duet::print: values at run time, in both faces ----

namespace {
std::vector<std::string>& printed() {
  static std::vector<std::string> lines;
  return lines;
}
// Catches what duet::print writes while it lives.
struct CapturePrints {
  detail::PrintSink prev;
  CapturePrints()
      : prev(detail::set_print_sink([](const std::string& l) { printed().push_back(l); })) {
    printed().clear();
  }
  ~CapturePrints() { detail::set_print_sink(prev); }
};
std::string line(const std::string& format, const Tensor& t) {
  return fmt::format(fmt::runtime(format), t) + "\n";
}
}  // namespace

TEST_CASE("print: eagerly, at once, formatted like fmt") {
  CapturePrints cap;
  Tensor x = make({1, 2}, {2});
  print(x);
  print(x * 2, "x * 2 = {}");
  REQUIRE(printed().size() == 2);
  CHECK(printed()[0] == line("{}", x));
  CHECK(printed()[1] == "x * 2 = " + (x * 2).str() + "\n");
  CHECK(contains(error_of<ValueError>([&] { print(x, "{} and {}"); }),
                 "[print] the format \"{} and {}\" does not format one tensor"));
  // A print takes no part in autograd.
  Tensor w = make({3}, {1}).requires_grad_();
  print(w * 2);
  Tensor y = sum(w * 3);
  y.backward();
  CHECK(values(w.grad()) == std::vector<double>{3});
}

TEST_CASE("print: compiled, each call prints its own values in program order") {
  CapturePrints cap;
  auto f = compile([](Tensor x) {
    Tensor y = x * 2;
    print(y, "y = {}");
    print(x, "x = {}");
    print(x, "x = {}");               // the same print twice: both run (no merging)
    print(full({2}, 3.0), "c = {}");  // of a constant: printed at run time, not folded
    return y + 1;
  });
  Tensor a = make({1, 2}, {2}), b = make({5, 6}, {2});
  f(a);
  f(b);
  CHECK(f.stats().traces == 1);
  const Tensor c = full({2}, 3.0);
  const std::vector<std::string> want = {
      line("y = {}", a * 2), line("x = {}", a), line("x = {}", a), line("c = {}", c),
      line("y = {}", b * 2), line("x = {}", b), line("x = {}", b), line("c = {}", c)};
  CHECK(printed() == want);
  CHECK(contains(f.graph().str(), "print(%"));
  CHECK(contains(f.graph().str(), "{format=\"y = {}\"}"));
}

TEST_CASE("print: kept in order across parallel branches, hoisting and backward") {
  CapturePrints cap;
  Tensor w = make({1, 2, 3}, {3}).requires_grad_();
  auto f = compile([&](Tensor x) {
    Tensor left = exp(x), right = tanh(x);  // independent branches
    print(right, "right {}");
    print(left, "left {}");
    print(w, "w {}");  // reads only a parameter: would be hoisted if it were not an effect
    Tensor loss = sum(left * right * w);
    loss.backward();
    print(w.grad(), "grad {}");
    return loss;
  });
  for (int i = 0; i < 3; ++i) {
    w.set_grad(Tensor());
    Tensor x = make({0.1 * i, 0.2, 0.3}, {3});
    f(x);
    REQUIRE(printed().size() == size_t(4 * (i + 1)));
    CHECK(printed()[4 * i] == line("right {}", tanh(x)));
    CHECK(printed()[4 * i + 1] == line("left {}", exp(x)));
    CHECK(printed()[4 * i + 2] == line("w {}", w.detach()));
    CHECK(contains(printed()[4 * i + 3], "grad tensor("));
  }
}

TEST_CASE("print: inside a scan body, once per step; in a Program, at each run") {
  CapturePrints cap;
  auto f = compile([](Tensor xs) {
    return scan(
        [](const std::vector<Tensor>& in) {
          Tensor c = in[0] + in[1];
          print(c, "carry {}");
          return std::vector<Tensor>{c, c * 2};
        },
        {zeros({1})}, {xs})[0];
  });
  f(make({1, 2, 3}, {3, 1}));
  REQUIRE(printed().size() == 3);
  CHECK(printed()[2] == line("carry {}", make({6}, {1})));
  printed().clear();
  Program prog([] {
    Tensor p = placeholder({2}, DType::f32, "p");
    print(p, "p = {}");
    return std::vector<Tensor>{p * 3};
  });
  CHECK(printed().empty());  // building the program prints nothing
  prog.run({{"p", make({1, 2}, {2})}});
  REQUIRE(printed().size() == 1);
  CHECK(printed()[0] == line("p = {}", make({1, 2}, {2})));
}

}  // namespace duet::test

namespace duet::test {
TEST_CASE("print: a scan's gradient replays its body without printing again") {
  CapturePrints cap;
  Tensor w = make({0.5}, {1}).requires_grad_();
  auto body = [&](const std::vector<Tensor>& in) {
    Tensor c = tanh(in[0] * w + in[1]);
    print(c, "c {}");
    return std::vector<Tensor>{c, c};
  };
  const Tensor xs = make({1, 2, 3}, {3, 1});
  // Eagerly: three steps print; the backward prints nothing.
  Tensor loss = sum(scan(body, {zeros({1})}, {xs})[0]);
  CHECK(printed().size() == 3);
  loss.backward();
  CHECK(printed().size() == 3);
  // Compiled: the same.
  printed().clear();
  auto f = compile([&](Tensor x) { return sum(scan(body, {zeros({1})}, {x})[0]); });
  Tensor l = f(xs);
  CHECK(printed().size() == 3);
  l.backward();
  CHECK(printed().size() == 3);
}
}  // namespace duet::test
