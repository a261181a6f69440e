// import_onnx on malformed models: attributes and inputs out of range, inputs of the wrong rank,
// sizes no machine holds. Each model imports (its nodes run at the call), and each call, eager
// and compiled, raises a typed duet::Error that names the node and what it expected, as the ONNX
// checker and ONNX Runtime reject these models: never a crash, an escaped std:: exception or a
// silently wrong result. The models are in tests/data/onnx_malformed, one node each (after a
// Reshape for the signal ops).
#include <onnx/onnx_pb.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "duet.h"
#include "trace/onnx/onnx_proto.h"
#include "util.h"

using namespace duet;

namespace {

std::string model_path(const std::string& name) {
  return (std::filesystem::path(DUET_SOURCE_DIR) / "tests" / "data" / "onnx_malformed" /
          (name + ".onnx"))
      .string();
}

struct Malformed {
  const char* file;
  Shape input;        // the one f32 input each model declares
  const char* where;  // the node, as errors name it
  const char* what;   // what the error says was expected
};

// Each call of p (eager, then compiled) must raise a duet::Error naming the node and `what`.
void check_refused(Program& p, const std::vector<Tensor>& in, const std::string& where,
                   const std::string& what) {
  for (bool eager : {true, false}) {
    CAPTURE(eager);
    try {
      if (eager)
        (void)p.eager(in);
      else
        (void)p(in);
      FAIL_CHECK("no error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_MESSAGE(msg.find("[import_onnx] " + where) != std::string::npos, msg);
      CHECK_MESSAGE(msg.find(what) != std::string::npos, msg);
    }
  }
}

const std::vector<Malformed>& malformed() {
  static const Shape x4{1, 1, 4, 4}, x23{2, 3}, c2{1, 2, 5, 5};
  static const std::vector<Malformed> cases = {
      // divisions by an attribute or input of 0
      {"conv_strides0", x4, "node \"Y\" (Conv, opset 17)", "strides must be 1 or more"},
      {"conv_group0", x4, "node \"Y\" (Conv, opset 17)", "group must be 1 or more, got 0"},
      {"conv_dilations0", c2, "node \"Y\" (Conv, opset 17)", "dilations must be 1 or more"},
      {"maxpool_strides0", x4, "node \"Y\" (MaxPool, opset 17)", "strides must be 1 or more"},
      {"avgpool_strides0", x4, "node \"Y\" (AveragePool, opset 17)", "strides must be 1 or more"},
      {"stft_step0", x4, "node \"Y\" (STFT, opset 17)", "frame_step must be 1 or more, got 0"},
      // a 0-d input where the op indexes the channel dim
      {"batchnorm_scalar_input", x4, "node \"Y\" (BatchNormalization, opset 17)",
       "input 0 must have rank 2 or more (N, C, ...), got shape ()"},
      {"instancenorm_scalar_input", x4, "node \"Y\" (InstanceNormalization, opset 17)",
       "input 0 must have rank 3 or more"},
      {"lrn_scalar_input", x4, "node \"Y\" (LRN, opset 17)", "input 0 must have rank 2 or more"},
      // empty inputs and attributes shorter than the op reads
      {"topk_empty_k", x4, "node \"Y\" (TopK, opset 17)", "input 1 (k) must hold one value"},
      {"concat_no_inputs", x4, "node \"Y\" (Concat, opset 17)", "needs at least one input"},
      {"stft_empty_step", x4, "node \"Y\" (STFT, opset 17)", "input 1 must hold one integer"},
      {"dft_empty_axis", x4, "node \"Y\" (DFT, opset 20)", "input 2 (axis) must hold one value"},
      {"conv_transpose_short_output_shape", x4, "node \"Y\" (ConvTranspose, opset 17)",
       "output_shape must hold 2 values (or 4 with N and C), got [6]"},
      // sizes no machine holds, refused before anything is allocated
      {"resize_sizes_2e31", x4, "node \"Y\" (Resize, opset 17)",
       "the output of shape (1, 1, 2147483648, 2147483648) and dtype f32 would take"},
      {"split_num_outputs_2e31", x4, "node \"Y\" (Split, opset 18)",
       "num_outputs is 2147483648, but the node lists 3 outputs"},
      // models that ONNX Runtime rejects
      {"range_delta0", x23, "node \"Y\" (Range, opset 17)", "delta not 0"},
      {"range_limit_inf", x23, "node \"Y\" (Range, opset 17)", "limit inf"},
      {"range_limit_nan", x23, "node \"Y\" (Range, opset 17)", "limit nan"},
      {"pad_negative", x23, "node \"Y\" (Pad, opset 17)",
       "pads -5 and 0 on dim 1 of shape (2, 3) crop more than the dim holds"},
      {"split_negative", x23, "node \"A\" (Split, opset 17)",
       "split sizes must be 0 or more, got [-1, 4]"},
      {"unsqueeze_axis_twice", x23, "node \"Y\" (Unsqueeze, opset 17)",
       "axes [0, 0] name one axis twice"},
      {"lrn_size0", c2, "node \"Y\" (LRN, opset 17)", "size must be 1 or more, got 0"},
      {"softmax_float_axis", x23, "node \"Y\" (Softmax, opset 17)",
       "attribute axis must be of type INT, got FLOAT"},
  };
  return cases;
}

// A model of one node over one f32 input "x" (and i64 or f32 initializers), output "y".
struct OneNode {
  onnx::ModelProto m;
  onnx::NodeProto* node;
  OneNode(const std::string& op, const Shape& x, int32_t elem = onnx::TensorProto::FLOAT) {
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    onnx::GraphProto* g = m.mutable_graph();
    g->set_name("g");
    onnx::ValueInfoProto* in = g->add_input();
    in->set_name("x");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
    for (int64_t d : x)
      in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
    onnx::ValueInfoProto* out = g->add_output();
    out->set_name("y");
    out->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
    node = g->add_node();
    node->set_op_type(op);
    node->add_input(std::string("x"));
    node->add_output(std::string("y"));
  }
  void input(const std::string& name, const Tensor& t) {
    node->add_input(name);
    if (name.empty()) return;
    onnx::TensorProto* p = m.mutable_graph()->add_initializer();
    detail::onnx_io::tensor_to_proto(t, *p);
    p->set_name(name);
  }
  void attr_i(const std::string& name, int64_t v) {
    onnx::AttributeProto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  void attr_s(const std::string& name, const std::string& v) {
    onnx::AttributeProto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  Program import() {
    const std::string path =
        fmt::format("/tmp/duet_test_onnx_malformed_{}.onnx", static_cast<long>(::getpid()));
    {
      std::ofstream f(path, std::ios::binary);
      REQUIRE(m.SerializeToOstream(&f));
    }
    Program p = import_onnx(path);
    std::remove(path.c_str());
    return p;
  }
};

}  // namespace

TEST_CASE("a malformed ONNX model imports, and each call raises an error naming the node") {
  for (const Malformed& c : malformed()) {
    const std::string file = c.file;
    CAPTURE(file);
    Program p = import_onnx(model_path(c.file));
    check_refused(p, {randn(c.input)}, c.where, c.what);
  }
}

TEST_CASE("a Resize by a scale of 1e9 is refused before anything is allocated") {
  OneNode m("Resize", {1, 1, 4, 4});
  m.input("", Tensor());
  m.input("scales", tensor({1.0, 1.0, 1e9, 1e9}, Options().dtype(DType::f32)));
  Program p = m.import();
  check_refused(p, {randn({1, 1, 4, 4})}, "node \"y\" (Resize, opset 17)",
                "the output of shape (1, 1, 4000000000, 4000000000) and dtype f32 would take");
}

TEST_CASE("integer Div and Mod by 0 give the ONNX reference's values") {
  // The reference divides as NumPy does, in floating point, and casts the infinity or NaN of a
  // division by 0 to the dtype: its lowest value. Its mod and fmod of integers by 0 are 0.
  for (DType d : {DType::i64, DType::i32}) {
    CAPTURE(d);
    const int32_t elem = d == DType::i64 ? onnx::TensorProto::INT64 : onnx::TensorProto::INT32;
    const double lowest = d == DType::i64 ? static_cast<double>(INT64_MIN) : INT32_MIN;
    Tensor x = tensor({5.0, 0.0, -3.0, 7.0}, Options().dtype(d));
    Tensor z = tensor({0.0, 0.0, 0.0, 2.0}, Options().dtype(d));
    OneNode div("Div", {4}, elem);
    div.input("z", z);
    Program pd = div.import();
    OneNode mod("Mod", {4}, elem), fmod("Mod", {4}, elem);
    mod.input("z", z);
    fmod.input("z", z);
    fmod.attr_i("fmod", 1);
    Program pm = mod.import(), pf = fmod.import();
    for (bool eager : {true, false}) {
      CAPTURE(eager);
      auto run = [&](Program& p) { return eager ? p.eager({x})[0] : p({x})[0]; };
      CHECK(test::values(run(pd)) == std::vector<double>{lowest, lowest, lowest, 3});
      CHECK(test::values(run(pm)) == std::vector<double>{0, 0, 0, 1});
      CHECK(test::values(run(pf)) == std::vector<double>{0, 0, 0, 1});
    }
  }
}

TEST_CASE("a float Mod without fmod is refused, as the ONNX specification asks") {
  OneNode m("Mod", {3});
  m.input("z", tensor({2.0, 2.0, 2.0}, Options().dtype(DType::f32)));
  Program p = m.import();
  check_refused(p, {randn({3})}, "node \"y\" (Mod, opset 17)", "fmod must be 1 for f32 inputs");
}

TEST_CASE("inputs of a rank the op cannot index are refused (cases the import fuzzer found)") {
  struct Case {
    const char* op;
    Shape x;
    std::vector<std::pair<std::string, Tensor>> inputs;  // initializers after x
    int64_t blocksize;                                   // DepthToSpace's; 0: none
    const char* what;
  };
  const Options i64 = Options().dtype(DType::i64);
  const std::vector<Case> cases = {
      {"ScatterND",
       {4},
       {{"i", full({}, 0, i64)}, {"u", full({}, 1)}},
       0,
       "indices () do not index data (4) with batch_dims 0"},
      {"GatherND",
       {2, 2},
       {{"i", full({}, 0, i64)}},
       0,
       "indices () do not index data (2, 2) with batch_dims 0"},
      {"NonMaxSuppression",
       {4},
       {{"s", full({4}, 1)}},
       0,
       "boxes must be (batch, boxes, 4) and scores (batch, classes, boxes), got (4) and (4)"},
      {"TopK", {}, {{"k", full({1}, 1, i64)}}, 0, "input 0 must have rank 1 or more"},
      {"Hardmax", {}, {}, 0, "input 0 must have rank 1 or more"},
      {"Gather", {}, {{"i", full({}, 0, i64)}}, 0, "input 0 must have rank 1 or more"},
      {"DepthToSpace",
       {1, 4, 2, 2},
       {},
       int64_t(1) << 40,
       "blocksize 1099511627776 does not divide the channels"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.op);
    OneNode m(c.op, c.x);
    for (const auto& [name, t] : c.inputs) m.input(name, t);
    if (c.blocksize) m.attr_i("blocksize", c.blocksize);
    Program p = m.import();
    check_refused(p, {randn(c.x)}, fmt::format("node \"y\" ({}, opset 17)", c.op), c.what);
  }
}

TEST_CASE("an LRN window wider than the channels sums them all, in time independent of its size") {
  // A size of 2^31 ran one slice and add per position of the window: a hang.
  const double size = 2147483648.0, alpha = 1e-4, beta = 0.75, bias = 1.0;
  OneNode m("LRN", {1, 3, 2, 2});
  m.attr_i("size", static_cast<int64_t>(size));
  Program p = m.import();
  Tensor x = randn({1, 3, 2, 2});
  Tensor want = x / pow(sum(x * x, Dims{1}, true) * (alpha / size) + bias, beta);
  for (bool eager : {true, false}) {
    CAPTURE(eager);
    Tensor got = eager ? p.eager({x})[0] : p({x})[0];
    std::vector<double> g = test::values(got), w = test::values(want);
    REQUIRE(g.size() == w.size());
    for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(w[i]).epsilon(1e-5));
  }
}

TEST_CASE("a reflect or edge Pad of a dim with no elements is refused, not looped on") {
  for (const char* mode : {"reflect", "edge"}) {
    CAPTURE(mode);
    OneNode m("Pad", {2, 0});
    m.input("pads", tensor({0.0, 1.0, 0.0, 1.0}, Options().dtype(DType::i64)));
    m.attr_s("mode", mode);
    Program p = m.import();
    check_refused(
        p, {randn({2, 0})}, "node \"y\" (Pad, opset 17)",
        fmt::format("pad mode \"{}\" has no elements to pad from on dim 1 of shape (2, 0)", mode));
  }
}

TEST_CASE("a Pad of opset 7 with an axes input and no pads is refused (found by the fuzzer)") {
  // The mapping read the pads of each axis named from an empty list.
  OneNode m("Pad", {2, 3});
  m.m.mutable_opset_import(0)->set_version(7);
  m.input("", Tensor());
  m.input("", Tensor());
  m.input("a", full({1}, 0, Options().dtype(DType::i64)));
  Program p = m.import();
  check_refused(p, {randn({2, 3})}, "node \"y\" (Pad, opset 7)",
                "pads must hold 2 values per axis of input 3 (1), got 0");
}

TEST_CASE("a RoiAlign of 2^31 bins a side is refused before its samples are computed") {
  OneNode m("RoiAlign", {1, 1, 10, 10});
  m.input("rois", full({3, 4}, 1));
  m.input("batch", full({3}, 0, Options().dtype(DType::i64)));
  m.attr_i("output_height", INT32_MAX);
  m.attr_i("output_width", 5);
  m.attr_i("sampling_ratio", 2);
  Program p = m.import();
  check_refused(p, {randn({1, 1, 10, 10})}, "node \"y\" (RoiAlign, opset 17)",
                "the samples of shape (3, 1, 4294967294, 10) and dtype f32 would take");
}
