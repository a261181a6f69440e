// ONNX export (trace/onnx/onnx.h, docs/onnx_export.md): the Fashion-MNIST MLP with a dynamic and a
// fixed batch, the CNN of samples/cnn.cpp, the seed's DynamicModel (cond -> If), an Elman RNN
// (scan -> Scan), a while_loop (Loop), Programs traced and loaded, and the errors. The first case
// checks the models' structure in C++ (no ONNX Runtime); the others run each model in ONNX
// Runtime (tests/onnx/ort_run.py, in the venv tools/setup_deps.sh makes) and compare with duet
// at float32 rtol 1e-4, atol 1e-5. DUET_SKIP_ORT=1 reports those cases as skipped.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "trace/onnx/onnx.h"
#include "trace/onnx/onnx_proto.h"
#include "util.h"

namespace duet::test {
namespace {

bool skip_ort() {
  const char* s = std::getenv("DUET_SKIP_ORT");
  return s && std::string(s) == "1";
}

std::string temp(const std::string& name) {
  return fmt::format("/tmp/duet_onnx_{}_{}", static_cast<long>(::getpid()), name);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs the model in ONNX Runtime on the inputs; returns its outputs, or nullopt with ORT's
// message in *error when it refuses.
std::optional<std::vector<Tensor>> ort_run(const std::string& model,
                                           const std::vector<Tensor>& inputs,
                                           std::string* error = nullptr) {
  REQUIRE_MESSAGE(std::ifstream(DUET_ORT_PYTHON).good(),
                  "no ONNX Runtime venv at " DUET_ORT_PYTHON
                  ": run tools/setup_deps.sh (or set DUET_SKIP_ORT=1 to skip these cases)");
  const std::string prefix = temp("ort_out");
  std::string cmd = fmt::format("{} {} {} {}", DUET_ORT_PYTHON, DUET_ORT_SCRIPT, model, prefix);
  std::vector<std::string> files;
  for (size_t i = 0; i < inputs.size(); ++i) {
    files.push_back(temp(fmt::format("in{}.npy", i)));
    data::write_npy(files.back(), inputs[i]);
    cmd += " " + files.back();
  }
  const std::string err = temp("ort_err");
  const int rc = std::system((cmd + " 2> " + err).c_str());
  for (const std::string& f : files) std::remove(f.c_str());
  const std::string message = read_text(err);
  std::remove(err.c_str());
  if (rc != 0) {
    if (error)
      *error = message;
    else
      FAIL_CHECK("ONNX Runtime failed on " << model << ": " << message);
    return std::nullopt;
  }
  std::vector<Tensor> outs;
  for (int k = 0;; ++k) {
    const std::string f = fmt::format("{}{}.npy", prefix, k);
    if (!std::ifstream(f).good()) break;
    outs.push_back(data::read_npy(f));
    std::remove(f.c_str());
  }
  return outs;
}

// ONNX Runtime's outputs against duet's: shape, dtype, |a - b| <= 1e-5 + 1e-4 |b|.
void check_outputs(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].sizes() == want[i].sizes());
    CHECK(got[i].dtype() == want[i].dtype());
    if (got[i].sizes() != want[i].sizes()) continue;
    const std::vector<double> a = values(got[i]), b = values(want[i]);
    double worst = 0;
    for (size_t k = 0; k < a.size(); ++k)
      worst = std::max(worst, std::abs(a[k] - b[k]) - (1e-5 + 1e-4 * std::abs(b[k])));
    CHECK_MESSAGE(worst <= 0, "output " << i << " differs beyond the tolerance by " << worst);
  }
}

void run_and_compare(const std::string& model, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& want) {
  const std::optional<std::vector<Tensor>> got = ort_run(model, inputs);
  if (got) check_outputs(*got, want);
}

onnx::ModelProto read(const std::string& path) { return detail::onnx_io::read_model(path); }

// Every op type of a graph and of its subgraphs.
void op_types(const onnx::GraphProto& g, std::set<std::string>& out) {
  for (const onnx::NodeProto& n : g.node()) {
    out.insert(n.op_type());
    for (const onnx::AttributeProto& a : n.attribute())
      if (a.has_g()) op_types(a.g(), out);
  }
}
std::set<std::string> op_types(const onnx::ModelProto& m) {
  std::set<std::string> r;
  op_types(m.graph(), r);
  return r;
}

// "(s0, 784)" / "(256, 784)": the declared shape of a graph input.
std::string input_shape(const onnx::ModelProto& m, int i) {
  std::vector<std::string> dims;
  for (const auto& d : m.graph().input(i).type().tensor_type().shape().dim())
    dims.push_back(d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
  return fmt::format("({})", fmt::join(dims, ", "));
}

// ---- the models ----

nn::Sequential make_mlp() {
  return nn::Sequential(nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 128), nn::ReLU(),
                        nn::Linear(128, 10));
}

nn::Sequential make_cnn() {  // samples/cnn.cpp
  return nn::Sequential(nn::Conv2d(1, 16, 5, 1, 2), nn::ReLU(), nn::MaxPool2d(2),
                        nn::Conv2d(16, 32, 5, 1, 2), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                        nn::Linear(32 * 7 * 7, 10));
}

// The seed's model (samples/seeds.cpp): a data-dependent branch as a cond.
struct DynamicModel : nn::Module {
  nn::Linear linear1{10, 5}, linear2{5, 1};
  DynamicModel() {
    register_module("linear1", linear1);
    register_module("linear2", linear2);
  }
  Tensor forward(const Tensor& x) override {
    nn::Linear l1 = linear1;
    Tensor h = cond(
        mean(x) > 0.5,
        [l1](const std::vector<Tensor>& in) mutable { return std::vector<Tensor>{l1(in[0])}; },
        [l1](const std::vector<Tensor>& in) mutable {
          return std::vector<Tensor>{relu(l1(in[0]))};
        },
        {x})[0];
    return linear2(h);
  }
};

// An Elman RNN over scan: h_t = tanh(x_t W + h_{t-1} U + b); returns {h_T, every h_t}.
struct Elman {
  Tensor W = randn({4, 8}) * 0.5, U = randn({8, 8}) * 0.3, b = randn({8}) * 0.1;
  std::vector<Tensor> operator()(const Tensor& xs, const Tensor& h0) const {
    const Tensor W_ = W, U_ = U, b_ = b;
    auto cell = [W_, U_, b_](const std::vector<Tensor>& s) {
      Tensor h = tanh(matmul(s[1], W_) + matmul(s[0], U_) + b_);
      return std::vector<Tensor>{h, h};
    };
    return scan(cell, {h0}, {xs});
  }
};

// Doubles x until its sum reaches `limit`, counting the steps: a while_loop.
std::vector<Tensor> doubling(const Tensor& x, const Tensor& limit) {
  auto below = [](const std::vector<Tensor>& s) { return std::vector<Tensor>{sum(s[0]) < s[2]}; };
  auto twice = [](const std::vector<Tensor>& s) {
    return std::vector<Tensor>{s[0] * 2, s[1] + 1, s[2]};
  };
  std::vector<Tensor> r = while_loop(below, twice, {x, zeros({}), limit});
  return {r[0], r[1]};
}

// Most primitives at once, under a symbolic batch: the unary, binary and comparison families
// (with dtype promotion), where, casts, reductions (integer sums in i64), gather, scatter_add,
// cat, slicing with a step, reshape and mean of symbolic sizes, unfold and fold with stride and
// padding, arange, argmax, the LSTM and GRU cells and lstm_step.
std::vector<Tensor> op_zoo(const Tensor& x, const Tensor& idx, const Tensor& img) {
  const Tensor u = exp(x) + log1p(abs(x)) + expm1(x * 0.1) + rsqrt(abs(x) + 1) + atan(x) + erf(x) +
                   log_sigmoid(x) + floor(x * 3) + sin(x) * cos(x) + sigmoid(x) + tanh(x) +
                   sqrt(abs(x)) + log(abs(x) + 1) - neg(relu(x)) + gelu_tanh(x) + gelu_tanh_grad(x);
  const Tensor p = pow(abs(x) + 0.5, 1.5) + maximum(x, scalar(0.2f)) - minimum(x, scalar(-0.1f)) +
                   x / 3 + idx / 4;
  const Tensor c = where(x > 0, x, x * 0.5) + (idx >= 3).to(DType::f32) +
                   (idx != 2).to(DType::f32) + (idx <= 2.5).to(DType::f32) +
                   (x < 0.1).to(DType::f32);
  const Tensor ints = sum(idx * 2 + 1, {1}) + sum(x > 0, {1});
  const Tensor red = max(x, {1}, true) - min(x, {0}) + mean(x);
  const Tensor g = gather(x, 1, idx) + scatter_add(x * 0, 1, idx, x);
  const Tensor flat = reshape(reshape(x, {-1, 2}), {-1, 6});  // sizes of the symbolic batch
  const Tensor joined = cat({slice(x, 1, 1, 6, 2), slice(flat, 1, 0, 3)}, 1);
  const Tensor cols = unfold(img, 3, 2, 1);
  const Tensor back = fold(cols * 2, 5, 5, 3, 2, 1);
  const Tensor pooled = max_pool2d(img, 2) + avg_pool2d(img, 2);
  // Pooling over padding, with ceil_mode, and adaptive: pad, windows, and their divisors.
  const Tensor padded_pools = max_pool2d(img, {3, 2}, 2, 1, 1, true) +
                              avg_pool2d(img, {3, 2}, 2, 1, true, false) +
                              adaptive_avg_pool2d(img, {3, 3}) + adaptive_max_pool2d(img, {3, 3});
  // Resampling: gathers of rows and columns, and bilinear's weights.
  const Tensor resampled =
      interpolate(img, {7, 4}, "bilinear") + interpolate(img, {7, 4}, "bilinear", true);
  const Tensor upsampled = upsample(slice(img, 2, 0, 5, 2), 2.4, "nearest-exact");
  const Tensor counted = x + arange(6).to(DType::f32);
  const Tensor gates = cat({x, x * 0.5, x - 1, x * 2}, 1);  // (batch, 4 * 6)
  const auto [cell_h, cell_c] = fused_lstm_cell(gates, gates * 0.3, x);
  const Tensor gru_gates = slice(gates, 1, 0, 18);  // (batch, 3 * 6)
  const Tensor gru_h = fused_gru_cell(gru_gates, gru_gates * 0.7, x);
  // lstm_step with its products, on weights (24, 6) and biases (24) made of constants.
  const Tensor w = reshape(arange(144).to(DType::f32) * 0.01 - 0.7, {24, 6});
  const Tensor bias = arange(24).to(DType::f32) * 0.05 - 0.5;
  const auto [step_h, step_c] = lstm_step(x, x * 0.5, x, w, w * -0.5, bias, bias * 0.3);
  return {cell_h,
          cell_c,
          step_h,
          step_c,
          gru_h,
          u,
          p,
          c,
          ints,
          red,
          g,
          joined,
          cols,
          back,
          pooled,
          padded_pools,
          resampled,
          upsampled,
          counted,
          argmax(x, 1),
          softmax(x, 1),
          layer_norm(x, {6})};
}

Program make_program() {
  return Program([] {
    Tensor a = placeholder({2, 3}, DType::f32, "a"), b = placeholder({3}, DType::f32, "b");
    return std::vector<Tensor>{exp(a) * b + 1.0, sum(a, {1}), argmax(a, 1)};
  });
}

}  // namespace

TEST_CASE("export_onnx: models pass the checker, with dim_params, If, Scan and Loop") {
  manual_seed(0);
  nn::Sequential mlp = make_mlp();
  auto f = compile([&](const Tensor& x) { return mlp(x); });
  const std::string dyn = temp("mlp_dyn.onnx"), fixed = temp("mlp_fixed.onnx");
  OnnxExportOptions o;
  o.dynamic = {{0, 0}};
  o.dim_names = {{"s0", "batch"}};
  o.input_names = {"images"};
  o.output_names = {"logits"};
  o.parameter_names = mlp.named_parameters();
  export_onnx(f, dyn, o, randn({256, 784}));
  onnx::ModelProto m = read(dyn);
  CHECK(m.opset_import(0).version() == 17);
  CHECK(m.graph().input(0).name() == "images");
  CHECK(input_shape(m, 0) == "(batch, 784)");
  CHECK(m.graph().output(0).name() == "logits");
  CHECK(m.graph().initializer_size() == 6);
  CHECK(m.graph().initializer(0).name() == mlp.named_parameters()[0].first);
  export_onnx(f, fixed, {}, randn({256, 784}));
  m = read(fixed);
  CHECK(input_shape(m, 0) == "(256, 784)");
  CHECK(m.graph().input(0).name() == "arg0");
  CHECK(m.graph().output(0).name() == "out0");

  DynamicModel dm;
  auto g = compile([&](const Tensor& x) { return dm(x); });
  const std::string cond_path = temp("cond.onnx");
  export_onnx(g, cond_path, {}, rand({4, 10}));
  CHECK(op_types(read(cond_path)).count("If") == 1);

  Elman rnn;
  auto r = compile([&](const Tensor& xs, const Tensor& h0) { return rnn(xs, h0); });
  const std::string scan_path = temp("scan.onnx");
  export_onnx(r, scan_path, {}, randn({6, 3, 4}), zeros({3, 8}));
  CHECK(op_types(read(scan_path)).count("Scan") == 1);

  auto w = compile(doubling);
  const std::string loop_path = temp("loop.onnx");
  export_onnx(w, loop_path, {}, rand({3}), scalar(10.0f));
  CHECK(op_types(read(loop_path)).count("Loop") == 1);

  for (const std::string& p : {dyn, fixed, cond_path, scan_path, loop_path}) std::remove(p.c_str());
}

TEST_CASE("export_onnx: an op with no ONNX form, and options that do not fit, are ValueErrors") {
  auto noisy = compile([](const Tensor& x) { return x + randn({3}); });
  const std::string path = temp("noisy.onnx");
  const std::string e = error_of<ValueError>([&] { export_onnx(noisy, path, {}, zeros({3})); });
  CHECK(starts_with(e, "[export_onnx] op random (at test_onnx_export.cpp:"));
  CHECK(contains(e, "has no ONNX form"));
  CHECK(!std::ifstream(path).good());  // nothing written

  auto printing = compile([](const Tensor& x) {
    print(x);
    return x * 2;
  });
  CHECK(starts_with(error_of<ValueError>([&] { export_onnx(printing, path, {}, zeros({3})); }),
                    "[export_onnx] op print (at test_onnx_export.cpp:"));

  auto id = compile([](const Tensor& x) { return x + 1; });
  OnnxExportOptions o;
  o.opset = 18;
  CHECK(contains(error_of<ValueError>([&] { export_onnx(id, path, o, zeros({3})); }),
                 "[export_onnx] opset 18 asked; duet exports opset 17"));
  o = {};
  o.input_names = {"a", "b"};
  CHECK(contains(error_of<ValueError>([&] { export_onnx(id, path, o, zeros({3})); }),
                 "[export_onnx] 2 input names given for 1 input (arg0)"));
  Program p = make_program();
  o = {};
  o.dynamic = {{0, 0}};
  CHECK(contains(error_of<ValueError>([&] { export_onnx(p, path, o); }),
                 "[export_onnx] input 0 dim 0 of Program is fixed in its graph"));
}

TEST_CASE(
    "export_onnx: the MLP with a dynamic batch runs in ONNX Runtime at batch 1, 7 and 300; "
    "with fixed dims it refuses batch 7" *
    doctest::skip(skip_ort())) {
  manual_seed(1);
  nn::Sequential mlp = make_mlp();
  auto f = compile([&](const Tensor& x) { return mlp(x); });
  const std::string dyn = temp("mlp_dyn_ort.onnx"), fixed = temp("mlp_fixed_ort.onnx");
  OnnxExportOptions o;
  o.dynamic = {{0, 0}};
  export_onnx(f, dyn, o, randn({256, 784}));
  for (int64_t batch : {1, 7, 300}) {
    CAPTURE(batch);
    const Tensor x = randn({batch, 784});
    run_and_compare(dyn, {x}, {mlp(x)});
  }
  export_onnx(f, fixed, {}, randn({256, 784}));
  const Tensor x = randn({256, 784});
  run_and_compare(fixed, {x}, {mlp(x)});
  std::string error;
  CHECK(!ort_run(fixed, {randn({7, 784})}, &error));
  CHECK(contains(error, "Got invalid dimensions for input"));
  std::remove(dyn.c_str());
  std::remove(fixed.c_str());
}

TEST_CASE(
    "export_onnx: the fused attention (causal with a symbolic length, b8 and float masks) runs "
    "in ONNX Runtime" *
    doctest::skip(skip_ort())) {
  manual_seed(4);
  const Tensor bmask = gt(rand({5, 7}), 0.3), fmask = randn({5, 7});
  for (int kind = 0; kind < 3; ++kind) {
    CAPTURE(kind);
    const Tensor m = kind == 1 ? bmask : kind == 2 ? fmask : Tensor();
    auto attend = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
      return scaled_dot_product_attention(q, k, v, m, kind == 0);
    };
    auto f = compile(attend);
    const std::string path = temp("attention.onnx");
    OnnxExportOptions o;
    if (kind == 0) o.dynamic = {{0, 1}, {1, 1}, {2, 1}};  // L = S, symbolic
    export_onnx(f, path, o, randn({2, 5, 8}), randn({2, 7, 8}), randn({2, 7, 4}));
    const Tensor q = randn({2, 5, 8}), k = randn({2, 7, 8}), v = randn({2, 7, 4});
    run_and_compare(path, {q, k, v}, {attend(q, k, v)});
    if (kind == 0) {
      const Tensor q2 = randn({2, 9, 8}), k2 = randn({2, 9, 8}), v2 = randn({2, 9, 4});
      run_and_compare(path, {q2, k2, v2}, {attend(q2, k2, v2)});
    }
    std::remove(path.c_str());
  }
}

TEST_CASE(
    "export_onnx: the CNN of samples/cnn.cpp (conv2d, max pooling, linear) runs in ONNX "
    "Runtime" *
    doctest::skip(skip_ort())) {
  manual_seed(2);
  nn::Sequential cnn = make_cnn();
  auto f = compile([&](const Tensor& x) { return cnn(x); });
  const std::string path = temp("cnn.onnx");
  OnnxExportOptions o;
  o.dynamic = {{0, 0}};
  export_onnx(f, path, o, randn({4, 1, 28, 28}));
  for (int64_t batch : {1, 5}) {
    CAPTURE(batch);
    const Tensor x = randn({batch, 1, 28, 28});
    run_and_compare(path, {x}, {cnn(x)});
  }
  std::remove(path.c_str());
}

// Conv's kernel_shape, strides, pads, dilations and group as torch.nn.Conv2d's tuples give them,
// a dilated unfold (a Gather of the padded plane), and Conv1d and the 1-D poolings (their 2-D
// ops over a height of 1).
TEST_CASE(
    "export_onnx: dilated and transposed convolutions with per-dim strides and paddings run in "
    "ONNX Runtime" *
    doctest::skip(skip_ort())) {
  manual_seed(6);
  nn::Conv2d a(4, 6, {2, 3}, {2, 1}, {1, 2}, true, 2, {2, 1});
  nn::Conv1d b(3, 5, 3, 2, 1);
  nn::Conv1d grouped(3, 6, 2, 1, 1, false, 3, 2);  // in groups, dilated
  // Transposed: with an output padding below the stride, and (the output padding below only
  // the dilation) as a crop of the unpadded image.
  nn::ConvTranspose2d up(4, 6, {3, 2}, {2, 1}, {1, 0}, {1, 0}, 2, true, {1, 2});
  nn::ConvTranspose2d wide(4, 3, 2, 1, 1, {1, 0}, 1, false, {2, 1});
  auto f = compile([&](const Tensor& x, const Tensor& s) {
    return std::vector<Tensor>{a(x),
                               unfold(x, {2, 2}, {1, 2}, {0, 1}, {3, 2}),
                               b(s),
                               up(x),
                               wide(x),
                               grouped(s),
                               max_pool1d(s, 3, 2, 1, 1, true) + avg_pool1d(s, 3, 2, 1),
                               adaptive_avg_pool1d(s, 4) + adaptive_max_pool1d(s, 4)};
  });
  const std::string path = temp("dilated.onnx");
  const Tensor x = randn({2, 4, 7, 6}), s = randn({2, 3, 9});
  export_onnx(f, path, OnnxExportOptions(), x, s);
  run_and_compare(path, {x, s}, f(x, s));
  std::remove(path.c_str());
}

TEST_CASE("export_onnx: the DynamicModel's cond runs as If in ONNX Runtime, on both branches" *
          doctest::skip(skip_ort())) {
  manual_seed(3);
  DynamicModel dm;
  auto f = compile([&](const Tensor& x) { return dm(x); });
  const std::string path = temp("dynamic_model.onnx");
  export_onnx(f, path, {}, rand({8, 10}));
  for (double shift : {0.25, -0.25}) {
    CAPTURE(shift);
    const Tensor x = rand({8, 10}) + shift;  // a mean near 0.75, then near 0.25
    run_and_compare(path, {x}, {dm(x)});
  }
  std::remove(path.c_str());
}

TEST_CASE(
    "export_onnx: an Elman RNN over scan runs as Scan in ONNX Runtime, at another "
    "sequence length" *
    doctest::skip(skip_ort())) {
  manual_seed(4);
  Elman rnn;
  auto f = compile([&](const Tensor& xs, const Tensor& h0) { return rnn(xs, h0); });
  const std::string path = temp("rnn.onnx");
  OnnxExportOptions o;
  o.dynamic = {{0, 0}, {0, 1}, {1, 0}};  // time and batch
  export_onnx(f, path, o, randn({6, 3, 4}), zeros({3, 8}));
  for (auto [t, b] : {std::pair<int64_t, int64_t>{6, 3}, {11, 2}}) {
    CAPTURE(t);
    const Tensor xs = randn({t, b, 4}), h0 = randn({b, 8}) * 0.1;
    run_and_compare(path, {xs, h0}, rnn(xs, h0));
  }
  std::remove(path.c_str());
}

TEST_CASE("export_onnx: a while_loop runs as Loop in ONNX Runtime" * doctest::skip(skip_ort())) {
  auto f = compile(doubling);
  const std::string path = temp("loop_ort.onnx");
  export_onnx(f, path, {}, rand({3}), scalar(10.0f));
  const Tensor x = full({3}, 0.5), limit = scalar(40.0f);
  run_and_compare(path, {x, limit}, doubling(x, limit));
  std::remove(path.c_str());
}

TEST_CASE(
    "export_onnx: the primitives, under a symbolic batch, compute in ONNX Runtime what "
    "they compute in duet" *
    doctest::skip(skip_ort())) {
  auto f = compile(op_zoo);
  const std::string path = temp("zoo.onnx");
  OnnxExportOptions o;
  o.dynamic = {{0, 0}, {1, 0}, {2, 0}};
  manual_seed(6);
  export_onnx(f, path, o, randn({4, 6}), randint(6, {4, 6}), randn({4, 2, 5, 5}));
  for (int64_t batch : {4, 3}) {
    CAPTURE(batch);
    const Tensor x = randn({batch, 6}), idx = randint(6, {batch, 6}), img = randn({batch, 2, 5, 5});
    run_and_compare(path, {x, idx, img}, op_zoo(x, idx, img));
  }
  std::remove(path.c_str());
}

TEST_CASE(
    "export_onnx: cross_entropy with every option, and its gradient, under a symbolic batch, "
    "in ONNX Runtime" *
    doctest::skip(skip_ort())) {
  // Class weights, label smoothing, an ignored class, each reduction, and the gradient of the
  // logits: one model, a symbolic batch.
  const Tensor weight = tensor({0.5, 1.0, 2.0, 0.25});
  auto f = compile([&](const Tensor& logits, const Tensor& y) {
    CrossEntropyOptions o;
    o.weight(weight).label_smoothing(0.1).ignore_index(3);
    Tensor mean_loss = cross_entropy(logits, y, o);
    Tensor sum_loss = cross_entropy(logits, y, CrossEntropyOptions(o).reduction(Reduction::Sum));
    Tensor each = cross_entropy(logits, y, "none");
    std::vector<Tensor> g = grad({mean_loss}, {logits});
    return std::vector<Tensor>{mean_loss, sum_loss, each, g[0]};
  });
  const std::string path = temp("cross_entropy.onnx");
  OnnxExportOptions eo;
  eo.dynamic = {{0, 0}, {1, 0}};
  export_onnx(f, path, eo, randn({5, 4}).requires_grad_(), randint(4, {5}));
  for (int64_t batch : {5, 7}) {
    CAPTURE(batch);
    const Tensor x = randn({batch, 4}).requires_grad_();
    Tensor y = randint(4, {batch});
    y.data_ptr<int64_t>()[0] = 3;  // one ignored target
    run_and_compare(path, {x, y}, f(x, y));
  }
  std::remove(path.c_str());
}

TEST_CASE("export_onnx: a Program's gradient (grad() in the builder) runs in ONNX Runtime" *
          doctest::skip(skip_ort())) {
  Program p([] {
    Tensor a = placeholder({4, 6}, DType::f32, "a");
    Tensor y = sum(slice(a, 1, 1, 5, 2) * slice(a, 1, 0, 2)) + sum(softmax(a, 1) * a) +
               sum(expand(reshape(a, {4, 1, 6}), {4, 3, 6}) * reshape(a, {4, 1, 6}));
    std::vector<Tensor> g = grad({y}, {a});
    return std::vector<Tensor>{y, g[0]};
  });
  const std::string path = temp("grad.onnx");
  export_onnx(p, path);
  const Tensor a = randn({4, 6});
  run_and_compare(path, {a}, p({a}));
  std::remove(path.c_str());
}

TEST_CASE(
    "export_onnx: Programs, traced from placeholders and loaded with a symbolic batch, run "
    "in ONNX Runtime" *
    doctest::skip(skip_ort())) {
  Program p = make_program();
  const std::string path = temp("program.onnx");
  export_onnx(p, path);
  CHECK(read(path).graph().input(1).name() == "b");
  const Tensor a = randn({2, 3}), b = randn({3});
  run_and_compare(path, {a, b}, p({a, b}));

  manual_seed(5);
  nn::Linear fc(6, 3);
  CompileOptions co;
  co.dynamic = {{0, 0}};
  auto f = compile([&](const Tensor& x) { return softmax(fc(x), 1) * mean(x); }, co);
  const std::string saved = temp("program.duet");
  save(f, saved, randn({4, 6}));
  Program loaded = load(saved);
  export_onnx(loaded, path);
  CHECK(input_shape(read(path), 0) == "(s0, 6)");
  const Tensor x = randn({9, 6});
  run_and_compare(path, {x}, loaded({x}));
  std::remove(saved.c_str());
  std::remove(path.c_str());
}

TEST_CASE("export_onnx: the gradient of a scan, a reverse Scan, runs in ONNX Runtime" *
          doctest::skip(skip_ort())) {
  manual_seed(7);
  const Tensor W = randn({4, 8}) * 0.5, U = randn({8, 8}) * 0.3;
  Program p([&] {
    Tensor xs = placeholder({5, 2, 4}, DType::f32, "xs"),
           h0 = placeholder({2, 8}, DType::f32, "h0");
    auto cell = [W, U](const std::vector<Tensor>& s) {
      Tensor h = tanh(matmul(s[1], W) + matmul(s[0], U));
      return std::vector<Tensor>{h, h};
    };
    std::vector<Tensor> o = scan(cell, {h0}, {xs});
    Tensor loss = sum(o[1] * o[1]) + sum(o[0]);
    std::vector<Tensor> g = grad({loss}, {xs, h0});
    return std::vector<Tensor>{loss, g[0], g[1]};
  });
  const std::string path = temp("scan_grad.onnx");
  export_onnx(p, path);
  const Tensor xs = randn({5, 2, 4}), h0 = randn({2, 8}) * 0.1;
  run_and_compare(path, {xs, h0}, p({xs, h0}));
  std::remove(path.c_str());
}

}  // namespace duet::test

namespace duet::test {
namespace {

// |a - b| <= atol + rtol |b| everywhere, with equal shapes and dtypes.
void check_close(const Tensor& got, const Tensor& want, double rtol, double atol) {
  REQUIRE(got.sizes() == want.sizes());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<double> a = values(got), b = values(want);
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k)
    worst = std::max(worst, std::abs(a[k] - b[k]) - (atol + rtol * std::abs(b[k])));
  CHECK_MESSAGE(worst <= 0, "differs beyond the tolerance by " << worst);
}

// Exported, imported back, run compiled (and eagerly): the original's outputs.
void round_trip(nn::Sequential& model, const Shape& example, const std::vector<Shape>& calls,
                const std::string& name) {
  auto f = compile([&](const Tensor& x) { return model(x); });
  const std::string path = temp(name);
  OnnxExportOptions o;
  o.dynamic = {{0, 0}};
  export_onnx(f, path, o, randn(example));
  Program back = import_onnx(path);
  for (const Shape& s : calls) {
    CAPTURE(s);
    const Tensor x = randn(s);
    const Tensor want = model(x);
    check_close(back({x})[0], want, 1e-5, 1e-6);
    check_close(back.eager({x})[0], want, 1e-5, 1e-6);
  }
  std::remove(path.c_str());
}

}  // namespace

TEST_CASE("round trip: the MLP and the CNN exported to ONNX, imported and compiled") {
  manual_seed(11);
  nn::Sequential mlp = make_mlp();
  round_trip(mlp, {256, 784}, {{256, 784}, {3, 784}}, "mlp_round.onnx");
  nn::Sequential cnn = make_cnn();
  round_trip(cnn, {4, 1, 28, 28}, {{4, 1, 28, 28}, {2, 1, 28, 28}}, "cnn_round.onnx");
}

}  // namespace duet::test
