// import_onnx: a model built with ONNX's own protobuf classes, run eagerly and compiled against
// the same computation written in duet, differentiated and fine-tuned; and the errors of models
// duet cannot run. The op-by-op conformance is duet_onnx_conformance's (docs/onnx.md).
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <fstream>

#include <unistd.h>

#include <cmath>

#include "duet.h"
#include "onnx_models.h"
#include "util.h"

using namespace duet;
using namespace duet::test::onnx_models;

namespace {

bool allclose(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype()) return false;
  std::vector<double> g = test::values(got), w = test::values(want);
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i]))) return false;
  return true;
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path(fmt::format("/tmp/duet_test_onnx_{}_{}", static_cast<long>(::getpid()), name)) {}
  ~TempFile() { std::remove(path.c_str()); }
};

// A two-layer MLP: relu(x @ w1 + b1), then Gemm with w2 transposed (as nn::Linear keeps it).
struct Mlp {
  Tensor w1 = randn({4, 8}, Options().dtype(DType::f64)),
         b1 = randn({8}, Options().dtype(DType::f64)),
         w2 = randn({3, 8}, Options().dtype(DType::f64)),
         b2 = randn({3}, Options().dtype(DType::f64));

  void write(const std::string& path) const {
    onnx::GraphProto g;
    g.set_name("mlp");
    add_input(g, "x", onnx::TensorProto::DOUBLE, {std::string("batch"), int64_t(4)});
    add_initializer(g, "w1", w1);
    add_initializer(g, "b1", b1);
    add_initializer(g, "w2", w2);
    add_initializer(g, "b2", b2);
    add_node(g, "MatMul", {"x", "w1"}, {"h0"});
    add_node(g, "Add", {"h0", "b1"}, {"h1"});
    add_node(g, "Relu", {"h1"}, {"h"});
    onnx::NodeProto* gemm = add_node(g, "Gemm", {"h", "w2", "b2"}, {"y"});
    onnx::AttributeProto* a = gemm->add_attribute();
    a->set_name("transB");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(1);
    add_output(g, "y", onnx::TensorProto::DOUBLE);
    write_model(std::move(g), path);
  }
  Tensor forward(const Tensor& x, const std::vector<Tensor>& p) const {
    return linear(relu(matmul(x, p[0]) + p[1]), p[2], p[3]);
  }
};

Tensor param(const Program& p, const std::string& name) {
  for (const auto& [n, t] : p.named_parameters())
    if (n == name) return t;
  FAIL("no parameter " << name);
  return {};
}

}  // namespace

TEST_CASE("an imported MLP runs eagerly and compiled, at any batch of its dim_param") {
  manual_seed(3);
  Mlp mlp;
  TempFile f("mlp.onnx");
  mlp.write(f.path);
  Program p = import_onnx(f.path);
  CHECK(p.input_names() == std::vector<std::string>{"x"});
  CHECK(p.output_names() == std::vector<std::string>{"y"});
  CHECK(p.named_parameters().size() == 4);
  for (int64_t batch : {5, 1, 7}) {
    Tensor x = randn({batch, 4}, Options().dtype(DType::f64));
    Tensor want = mlp.forward(x, {mlp.w1, mlp.b1, mlp.w2, mlp.b2});
    CHECK(allclose(p.eager({x})[0], want, 1e-12, 1e-12));
    CHECK(allclose(p({x})[0], want, 1e-12, 1e-12));
    CHECK(allclose(p.run({{"x", x}}, {"y"})[0], want, 1e-12, 1e-12));
  }
}

TEST_CASE("gradients reach an imported model's initializers, eagerly and compiled") {
  manual_seed(4);
  Mlp mlp;
  TempFile f("mlp_grad.onnx");
  mlp.write(f.path);
  Program p = import_onnx(f.path);
  Tensor x = randn({6, 4}, Options().dtype(DType::f64));
  // The reference: the same computation written in duet, on copies of the weights.
  std::vector<Tensor> ref;
  for (const Tensor& t : {mlp.w1, mlp.b1, mlp.w2, mlp.b2})
    ref.push_back(t.clone().requires_grad_());
  Tensor want = mlp.forward(x, ref);
  sum(want * want).backward();
  const char* names[] = {"w1", "b1", "w2", "b2"};
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    for (auto [n, t] : p.named_parameters()) t.set_grad({});
    Tensor y = compiled ? p({x})[0] : p.eager({x})[0];
    sum(y * y).backward();
    for (int i = 0; i < 4; ++i) {
      CAPTURE(names[i]);
      REQUIRE(param(p, names[i]).grad().defined());
      CHECK(allclose(param(p, names[i]).grad(), ref[static_cast<size_t>(i)].grad(), 1e-10, 1e-10));
    }
  }
}

TEST_CASE("an imported model fine-tunes with optim::SGD") {
  manual_seed(5);
  Mlp mlp;
  TempFile f("mlp_tune.onnx");
  mlp.write(f.path);
  Program p = import_onnx(f.path);
  std::vector<Tensor> params;
  for (const auto& [n, t] : p.named_parameters()) params.push_back(t);
  optim::SGD opt(params, optim::SGDOptions(0.05));
  Tensor x = randn({16, 4}, Options().dtype(DType::f64));
  Tensor target = randn({16, 3}, Options().dtype(DType::f64));
  auto loss_of = [&] { return mse_loss(p({x})[0], target); };
  const double first = loss_of().item<double>();
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    Tensor loss = loss_of();
    loss.backward();
    opt.step();
  }
  CHECK(loss_of().item<double>() < 0.8 * first);
}

TEST_CASE("a shape read from an input is guarded: a new shape traces again") {
  onnx::GraphProto g;
  add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(2), int64_t(6)});
  add_input(g, "shape", onnx::TensorProto::INT64, {int64_t(2)});
  add_node(g, "Reshape", {"x", "shape"}, {"y"});
  add_output(g, "y", onnx::TensorProto::FLOAT);
  TempFile f("reshape.onnx");
  write_model(std::move(g), f.path);
  Program p = import_onnx(f.path);
  Tensor x = arange(12, Options().dtype(DType::f32));
  x = reshape(x, {2, 6});
  CHECK(p({x, tensor({3, 4}, Options().dtype(DType::i64))})[0].sizes() == Shape{3, 4});
  CHECK(p({x, tensor({4, 3}, Options().dtype(DType::i64))})[0].sizes() == Shape{4, 3});
  CHECK(p({x, tensor({3, 4}, Options().dtype(DType::i64))})[0].sizes() == Shape{3, 4});
}

TEST_CASE("import errors name the op, the node and the opset, or the element type") {
  TempFile f("bad.onnx");
  SUBCASE("an op with no mapping") {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(8)});
    add_node(g, "StringNormalizer", {"x"}, {"y"});
    add_output(g, "y", onnx::TensorProto::FLOAT);
    write_model(std::move(g), f.path);
    CHECK_THROWS_WITH_AS(
        import_onnx(f.path),
        doctest::Contains(
            "node \"y\" (StringNormalizer, opset 17): ONNX op StringNormalizer (opset 17) "
            "has no mapping in duet"),
        ValueError);
  }
  SUBCASE("an op of another domain") {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(8)});
    add_node(g, "FusedConv", {"x"}, {"y"})->set_domain("com.microsoft");
    add_output(g, "y", onnx::TensorProto::FLOAT);
    write_model(std::move(g), f.path);
    CHECK_THROWS_WITH_AS(import_onnx(f.path),
                         doctest::Contains("op FusedConv of domain \"com.microsoft\""), ValueError);
  }
  SUBCASE("an element type duet has no dtype for") {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::UINT16, {int64_t(8)});
    add_node(g, "Identity", {"x"}, {"y"});
    add_output(g, "y", onnx::TensorProto::UINT16);
    write_model(std::move(g), f.path);
    CHECK_THROWS_WITH_AS(
        import_onnx(f.path),
        doctest::Contains("input \"x\" has ONNX element type UINT16, which duet has "
                          "no dtype for"),
        DTypeError);
  }
  SUBCASE("a Cast to float16 and bfloat16 rounds as .to() does") {
    for (auto [elem, dt] : {std::pair{onnx::TensorProto::FLOAT16, DType::f16},
                            std::pair{onnx::TensorProto::BFLOAT16, DType::bf16}}) {
      onnx::GraphProto g;
      add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(8)});
      onnx::NodeProto* n = add_node(g, "Cast", {"x"}, {"y"});
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name("to");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(elem);
      add_output(g, "y", elem);
      write_model(std::move(g), f.path);
      Program p = import_onnx(f.path);
      const Tensor x = randn({8});
      const Tensor y = p.eager({x})[0];
      CHECK(y.dtype() == dt);
      CHECK(duet::test::bitwise_equal(y, x.to(dt)));
    }
  }
  SUBCASE("an attribute out of range raises at the call, never divides by zero") {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(1), int64_t(4), int64_t(2), int64_t(2)});
    onnx::NodeProto* n = add_node(g, "DepthToSpace", {"x"}, {"y"});
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("blocksize");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(0);
    add_output(g, "y", onnx::TensorProto::FLOAT);
    write_model(std::move(g), f.path);
    Program p = import_onnx(f.path);
    CHECK_THROWS_WITH_AS(p.eager({randn({1, 4, 2, 2})}),
                         doctest::Contains("(DepthToSpace, opset 17): needs a 4-D input and a "
                                           "positive blocksize"),
                         ValueError);
  }
  SUBCASE("an op on sequences, a type duet has no dtype for") {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(6)});
    add_node(g, "SplitToSequence", {"x"}, {"s"});
    add_int_attr(add_node(g, "ConcatFromSequence", {"s"}, {"y"}), "axis", 0);
    add_output(g, "y", onnx::TensorProto::FLOAT);
    write_model(std::move(g), f.path);
    CHECK_THROWS_WITH_AS(
        import_onnx(f.path),
        doctest::Contains("node \"s\" (SplitToSequence, opset 17): op SplitToSequence computes "
                          "on values of ONNX type sequence, which duet has no dtype for"),
        DTypeError);
  }
  SUBCASE("an op on optionals, a type duet has no dtype for") {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(6)});
    add_node(g, "Optional", {"x"}, {"o"});
    add_node(g, "OptionalGetElement", {"o"}, {"y"});
    add_output(g, "y", onnx::TensorProto::FLOAT);
    write_model(std::move(g), f.path, 18);
    CHECK_THROWS_WITH_AS(
        import_onnx(f.path),
        doctest::Contains("node \"o\" (Optional, opset 18): op Optional computes on values of "
                          "ONNX type optional, which duet has no dtype for"),
        DTypeError);
  }
  SUBCASE("a file that is not a model") {
    std::ofstream(f.path) << "not a model at all";
    CHECK_THROWS_WITH_AS(import_onnx(f.path), doctest::Contains("is not an ONNX model"),
                         ValueError);
  }
  SUBCASE("a missing file") {
    CHECK_THROWS_WITH_AS(import_onnx(f.path + ".none"), doctest::Contains("cannot open"),
                         ValueError);
  }
}

TEST_CASE("an imported program checks each call's inputs against the model's") {
  Mlp mlp;
  TempFile f("mlp_inputs.onnx");
  mlp.write(f.path);
  Program p = import_onnx(f.path);
  CHECK_THROWS_WITH_AS(p({randn({2, 4})}),
                       doctest::Contains("input \"x\" expects f64 (?, 4), got f32 (2, 4)"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(p.eager({randn({2, 5}, Options().dtype(DType::f64))}),
                       doctest::Contains("input \"x\" expects f64 (?, 4), got shape (2, 5)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(p({}), doctest::Contains("takes 1 inputs (x), got 0"), ValueError);
}

namespace {

// Conv -> BatchNormalization -> Relu -> GlobalAveragePool, as PyTorch exports a conv block in
// eval mode: the batch norm's running mean and var are initializers, like its weights.
struct ConvBn {
  Tensor w = randn({4, 3, 3, 3}, Options().dtype(DType::f64)),
         b = randn({4}, Options().dtype(DType::f64)),
         scale = randn({4}, Options().dtype(DType::f64)),
         bias = randn({4}, Options().dtype(DType::f64)),
         mean = randn({4}, Options().dtype(DType::f64)),
         var = rand({4}, Options().dtype(DType::f64)) + 0.5;

  // With `mean_too`, the running mean is also added to the output: read otherwise than as a
  // statistic, it is a parameter.
  void write(const std::string& path, bool mean_too = false) const {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::DOUBLE, {int64_t(2), int64_t(3), int64_t(5), int64_t(5)});
    add_initializer(g, "conv.weight", w);
    add_initializer(g, "conv.bias", b);
    add_initializer(g, "bn.weight", scale);
    add_initializer(g, "bn.bias", bias);
    add_initializer(g, "bn.running_mean", mean);
    add_initializer(g, "bn.running_var", var);
    add_ints_attr(add_node(g, "Conv", {"x", "conv.weight", "conv.bias"}, {"c"}), "pads",
                  {1, 1, 1, 1});
    add_node(g, "BatchNormalization",
             {"c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, {"n"});
    add_node(g, "Relu", {"n"}, {"r"});
    add_node(g, "GlobalAveragePool", {"r"}, {mean_too ? "p" : "y"});
    if (mean_too) {
      add_node(g, "Flatten", {"p"}, {"f"});
      add_node(g, "Add", {"f", "bn.running_mean"}, {"y"});
    }
    add_output(g, "y", onnx::TensorProto::DOUBLE);
    write_model(std::move(g), path);
  }
  Tensor forward(const Tensor& x) const {
    auto ch = [](const Tensor& t) { return reshape(t, {1, -1, 1, 1}); };
    Tensor c = conv2d(x, w, b, 1, 1);
    Tensor n = (c - ch(mean)) / sqrt(ch(var) + 1e-5) * ch(scale) + ch(bias);
    return mean_of(relu(n));
  }
  static Tensor mean_of(const Tensor& t) { return duet::mean(t, Dims({2, 3}), true); }
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> r;
  for (const auto& [n, t] : v) r.push_back(n);
  return r;
}

}  // namespace

TEST_CASE("import: a 2-D Conv that conv2d expresses runs as conv2d, in groups; others as windows") {
  manual_seed(8);
  const Tensor w = randn({6, 2, 3, 2}), b = randn({6}), x = randn({2, 4, 7, 7});  // (3 x 2)
  struct Case {
    std::vector<int64_t> pads, strides, dilations;
    bool conv2d;  // whether conv2d expresses it: the same padding before and after each dim
  };
  for (const Case& c :
       {Case{{1, 1, 1, 1}, {1, 1}, {1, 1}, true},
        Case{{1, 0, 1, 0}, {2, 1}, {1, 2}, true},  // per dim
        Case{{1, 0, 0, 1}, {1, 1}, {1, 1}, false}, Case{{0, 1, 1, 0}, {1, 2}, {2, 1}, false}}) {
    CAPTURE(c.pads);
    CAPTURE(c.strides);
    CAPTURE(c.dilations);
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(2), int64_t(4), int64_t(7), int64_t(7)});
    add_initializer(g, "w", w);
    add_initializer(g, "b", b);
    onnx::NodeProto* conv = add_node(g, "Conv", {"x", "w", "b"}, {"y"});
    add_ints_attr(conv, "pads", c.pads);
    add_ints_attr(conv, "strides", c.strides);
    add_ints_attr(conv, "dilations", c.dilations);
    add_int_attr(conv, "group", 2);
    add_output(g, "y", onnx::TensorProto::FLOAT);
    TempFile f("conv_groups.onnx");
    write_model(std::move(g), f.path);
    Program p = import_onnx(f.path);
    Profiler prof;
    const Tensor y = p.eager({x})[0];
    const bool conv2d_ran = prof.json().find("\"conv2d\"") != std::string::npos;
    CHECK(conv2d_ran == c.conv2d);
    // Each group's two channels and three filters, by duet's conv2d on the padded input.
    const Tensor xp = pad(x, {c.pads[1], c.pads[3], c.pads[0], c.pads[2]});
    for (int64_t k = 0; k < 2; ++k) {
      const Tensor want = conv2d(slice(xp, 1, 2 * k, 2 * k + 2), slice(w, 0, 3 * k, 3 * k + 3),
                                 slice(b, 0, 3 * k, 3 * k + 3), {c.strides[0], c.strides[1]}, 0, 1,
                                 {c.dilations[0], c.dilations[1]});
      CHECK(allclose(slice(y, 1, 3 * k, 3 * k + 3), want, 1e-4, 1e-5));
    }
  }
}

TEST_CASE("import: a 2-D MaxPool or AveragePool that the pooling ops express runs on them") {
  manual_seed(9);
  const Tensor x = randn({2, 3, 7, 6});
  struct Case {
    const char* op;
    std::vector<int64_t> kernel, pads, strides, dilations;
    int64_t ceil_mode, count_include_pad;
    bool pool2d;  // the same padding before and after, at most half the kernel (avg: undilated)
  };
  for (const Case& c : {Case{"MaxPool", {3, 2}, {1, 1, 1, 1}, {2, 1}, {1, 2}, 1, 0, true},
                        Case{"AveragePool", {3, 3}, {1, 0, 1, 0}, {2, 2}, {1, 1}, 1, 0, true},
                        Case{"AveragePool", {3, 3}, {1, 1, 1, 1}, {2, 1}, {1, 1}, 0, 1, true},
                        Case{"MaxPool", {3, 3}, {1, 0, 0, 1}, {1, 1}, {1, 1}, 0, 0, false},
                        Case{"MaxPool", {2, 2}, {2, 0, 2, 0}, {1, 1}, {1, 1}, 0, 0, false},
                        Case{"AveragePool", {2, 2}, {0, 0, 0, 0}, {1, 1}, {2, 1}, 0, 0, false}}) {
    CAPTURE(c.op);
    CAPTURE(c.pads);
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(2), int64_t(3), int64_t(7), int64_t(6)});
    onnx::NodeProto* node = add_node(g, c.op, {"x"}, {"y"});
    add_ints_attr(node, "kernel_shape", c.kernel);
    add_ints_attr(node, "pads", c.pads);
    add_ints_attr(node, "strides", c.strides);
    add_ints_attr(node, "dilations", c.dilations);
    add_int_attr(node, "ceil_mode", c.ceil_mode);
    if (std::string(c.op) == "AveragePool")
      add_int_attr(node, "count_include_pad", c.count_include_pad);
    add_output(g, "y", onnx::TensorProto::FLOAT);
    TempFile f("pool2d.onnx");
    write_model(std::move(g), f.path);
    Program p = import_onnx(f.path);
    Profiler prof;
    const Tensor y = p.eager({x})[0];
    // One Unfold where the pooling ops ran; one strided slice per kernel offset otherwise.
    CHECK((prof.json().find("\"unfold\"") != std::string::npos) == c.pool2d);
    if (!c.pool2d) continue;
    const Size2 k{c.kernel[0], c.kernel[1]}, s{c.strides[0], c.strides[1]};
    const Size2 pd{c.pads[0], c.pads[1]}, d{c.dilations[0], c.dilations[1]};
    const Tensor want = std::string(c.op) == "MaxPool"
                            ? max_pool2d(x, k, s, pd, d, c.ceil_mode != 0)
                            : avg_pool2d(x, k, s, pd, c.ceil_mode != 0, c.count_include_pad != 0);
    CHECK(test::bitwise_equal(y, want));
  }
}

TEST_CASE("import: a 2-D ConvTranspose that conv_transpose2d expresses runs on it") {
  manual_seed(10);
  const Tensor x = randn({2, 4, 5, 4}), w = randn({4, 3, 3, 2}), b = randn({6});
  struct Case {
    std::vector<int64_t> pads, strides, output_padding, dilations;
    bool fast;  // the same padding before and after each dim
  };
  for (const Case& c : {Case{{1, 0, 1, 0}, {2, 1}, {1, 0}, {1, 2}, true},
                        Case{{0, 1, 0, 1}, {1, 1}, {1, 0}, {2, 1}, true},
                        Case{{1, 0, 0, 0}, {2, 2}, {0, 0}, {1, 1}, false}}) {
    CAPTURE(c.pads);
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(2), int64_t(4), int64_t(5), int64_t(4)});
    add_initializer(g, "w", w);
    add_initializer(g, "b", b);
    onnx::NodeProto* node = add_node(g, "ConvTranspose", {"x", "w", "b"}, {"y"});
    add_ints_attr(node, "pads", c.pads);
    add_ints_attr(node, "strides", c.strides);
    add_ints_attr(node, "output_padding", c.output_padding);
    add_ints_attr(node, "dilations", c.dilations);
    add_int_attr(node, "group", 2);
    add_output(g, "y", onnx::TensorProto::FLOAT);
    TempFile f("conv_transpose.onnx");
    write_model(std::move(g), f.path);
    Program p = import_onnx(f.path);
    Profiler prof;
    const Tensor y = p.eager({x})[0];
    CHECK((prof.json().find("\"conv2d_input_grad\"") != std::string::npos) == c.fast);
    if (!c.fast) continue;
    const Tensor want = conv_transpose2d(
        x, w, b, {c.strides[0], c.strides[1]}, {c.pads[0], c.pads[1]},
        {c.output_padding[0], c.output_padding[1]}, 2, {c.dilations[0], c.dilations[1]});
    CHECK(test::bitwise_equal(y, want));
  }
}

TEST_CASE("an imported batch norm's running statistics are constants, not parameters") {
  manual_seed(6);
  ConvBn m;
  TempFile f("conv_bn.onnx");
  m.write(f.path);
  Program p = import_onnx(f.path);
  // The statistics are buffers, not parameters: only the weights are trained.
  CHECK(names_of(p.named_parameters()) ==
        std::vector<std::string>{"conv.weight", "conv.bias", "bn.weight", "bn.bias"});
  REQUIRE(names_of(p.named_buffers()) ==
          std::vector<std::string>{"bn.running_mean", "bn.running_var"});
  Tensor x = randn({2, 3, 5, 5}, Options().dtype(DType::f64));
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    for (auto [n, t] : p.named_parameters()) t.set_grad({});
    Tensor y = compiled ? p({x})[0] : p.eager({x})[0];
    CHECK(allclose(y, m.forward(x), 1e-10, 1e-10));
    sum(y * y).backward();
    for (const auto& [n, t] : p.named_parameters()) {
      CAPTURE(n);
      CHECK(t.requires_grad());
      CHECK(t.grad().defined());
    }
    for (const auto& [n, t] : p.named_buffers()) {
      CAPTURE(n);
      CHECK(!t.requires_grad());
      CHECK(!t.grad().defined());
    }
  }
  // An SGD step on the parameters changes what the model computes, and leaves the statistics.
  std::vector<Tensor> params;
  for (const auto& [n, t] : p.named_parameters()) params.push_back(t);
  optim::SGD opt(params, optim::SGDOptions(0.1));
  opt.step();
  CHECK(!allclose(p.eager({x})[0], m.forward(x), 1e-6, 1e-6));
  CHECK(test::bitwise_equal(p.named_buffers()[0].second, m.mean));
  CHECK(test::bitwise_equal(p.named_buffers()[1].second, m.var));
}

TEST_CASE(
    "an initializer that batch norm reads as a statistic and another node reads too is a "
    "parameter") {
  manual_seed(7);
  ConvBn m;
  TempFile f("conv_bn_shared.onnx");
  m.write(f.path, true);
  Program p = import_onnx(f.path);
  CHECK(names_of(p.named_parameters()) == std::vector<std::string>{"conv.weight", "conv.bias",
                                                                   "bn.weight", "bn.bias",
                                                                   "bn.running_mean"});
  CHECK(names_of(p.named_buffers()) == std::vector<std::string>{"bn.running_var"});
  Tensor y = p.eager({randn({2, 3, 5, 5}, Options().dtype(DType::f64))})[0];
  sum(y * y).backward();
  CHECK(param(p, "bn.running_mean").grad().defined());
}

namespace {

// Softmax, LogSoftmax or Hardmax of `x` (row-major values, dims `d`) on plain doubles, over
// groups of `inner` consecutive values: ONNX's opsets before 13 coerce the input to 2-D at the
// axis (dims [0, axis) and [axis, n) each flattened) and reduce over the whole second part, so
// the groups are prod(d[axis:]) long; from opset 13 the op runs along dim `axis` alone.
std::vector<double> softmax_reference(const std::string& op, const std::vector<double>& x,
                                      const std::vector<int64_t>& d, int64_t axis, bool coerce) {
  int64_t len = d[static_cast<size_t>(axis)], inner = 1;
  for (size_t k = static_cast<size_t>(axis) + 1; k < d.size(); ++k) inner *= d[k];
  if (coerce) len *= inner, inner = 1;
  std::vector<double> y(x.size());
  for (size_t base = 0; base < x.size(); base += static_cast<size_t>(len * inner))
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t i) { return base + static_cast<size_t>(i * inner + j); };
      int64_t arg = 0;
      for (int64_t i = 1; i < len; ++i)
        if (x[at(i)] > x[at(arg)]) arg = i;
      double total = 0;
      for (int64_t i = 0; i < len; ++i) total += std::exp(x[at(i)] - x[at(arg)]);
      for (int64_t i = 0; i < len; ++i) {
        const double s = x[at(i)] - x[at(arg)];
        y[at(i)] = op == "Softmax"      ? std::exp(s) / total
                   : op == "LogSoftmax" ? s - std::log(total)
                                        : (i == arg ? 1.0 : 0.0);
      }
    }
  return y;
}

}  // namespace

// The conformance tables run these ops at the test data's own opsets (13 and later), and a 2-D
// input reads the same either way: only a model of rank 3 or more before opset 13 tells the old
// default axis (1, with the input coerced to 2-D) from the new one (-1, that dim alone).
TEST_CASE(
    "Softmax LogSoftmax and Hardmax without an axis: opset 11 over the dims from 1 on "
    "flattened; opset 13 along the last dim") {
  manual_seed(8);
  for (const std::string op : {"Softmax", "LogSoftmax", "Hardmax"})
    for (const std::vector<int64_t>& d : {std::vector<int64_t>{2, 3, 4}, {2, 3, 2, 5}})
      for (int opset : {11, 13})
        for (int64_t axis : {int64_t(-100), int64_t(2)}) {  // -100: no axis attribute
          CAPTURE(op);
          CAPTURE(d.size());
          CAPTURE(opset);
          CAPTURE(axis);
          onnx::GraphProto g;
          std::vector<std::variant<int64_t, std::string>> dims(d.begin(), d.end());
          add_input(g, "x", onnx::TensorProto::DOUBLE, dims);
          onnx::NodeProto* n = add_node(g, op, {"x"}, {"y"});
          if (axis != -100) add_int_attr(n, "axis", axis);
          add_output(g, "y", onnx::TensorProto::DOUBLE);
          TempFile f("softmax_axis.onnx");
          write_model(std::move(g), f.path, opset);
          Program p = import_onnx(f.path);
          const Tensor x = randn(Shape(d), Options().dtype(DType::f64));
          int64_t a = axis;  // the default: 1 before opset 13, the last dim from 13
          if (axis == -100) a = opset < 13 ? 1 : static_cast<int64_t>(d.size()) - 1;
          const Tensor want = test::make(softmax_reference(op, test::values(x), d, a, opset < 13),
                                         Shape(d), DType::f64);
          CHECK(allclose(p.eager({x})[0], want, 1e-12, 1e-12));
          CHECK(allclose(p({x})[0], want, 1e-12, 1e-12));
        }
}
