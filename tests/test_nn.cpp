// nn: modules, layers, initializers and the state dict file. The layers run from one table:
// gradcheck in float64 with respect to input and parameters, and eager against compiled
// (forward, a training step's loss and parameter gradients, and input gradients).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/rnn.h"
#include "nn_rows.h"
#include "util.h"

namespace duet::test {
namespace {

using namespace duet::nn;

// gradcheck of m's forward with respect to its input (when floating) and every parameter.
// gradcheck perturbs copies of its inputs, so fn writes a perturbed copy into the parameter it
// stands for (outside autograd: the numerical half runs without grad) and writes the original
// back once gradcheck moves on. Every call reseeds, so Dropout draws one mask throughout.
GradcheckResult gradcheck_module(Module& m, const Tensor& x) {
  const std::vector<Tensor> params = m.parameters();
  std::vector<Tensor> saved;
  for (const Tensor& p : params) saved.push_back(p.detach().clone());
  std::vector<bool> dirty(params.size(), false);
  const bool wrt_x = is_floating(x.dtype());
  std::vector<Tensor> inputs;
  if (wrt_x) inputs.push_back(x.detach().clone().requires_grad_());
  for (const Tensor& p : params) inputs.push_back(p);
  const size_t first = wrt_x ? 1 : 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    for (size_t i = 0; i < params.size(); ++i) {
      const bool perturbed = !in[first + i].is_same(params[i]);
      if (perturbed || dirty[i]) {
        NoGradGuard no_grad;
        Tensor(params[i]).copy_(perturbed ? in[first + i] : saved[i]);
        dirty[i] = perturbed;
      }
    }
    manual_seed(77);
    return m(wrt_x ? in[0] : x);
  };
  GradcheckResult r = gradcheck(fn, inputs);
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) Tensor(params[i]).copy_(saved[i]);
  return r;
}

TEST_CASE("layers: gradcheck in float64 with respect to the input and every parameter") {
  int checked = 0, params = 0;
  for (size_t i = 0; i < layer_rows().size(); ++i) {
    const LayerRow& row = layer_rows()[i];
    INFO(row.label);
    manual_seed(i + 1);
    ModulePtr m = row.make();
    m->to(DType::f64);
    Tensor x = make_input(row, DType::f64);
    std::vector<Tensor> before;
    for (const Tensor& p : m->parameters()) {
      CHECK(p.dtype() == DType::f64);
      before.push_back(p.clone());
    }
    GradcheckResult r = gradcheck_module(*m, x);
    CHECK_MESSAGE(r.ok, r.message);
    // The parameters hold their own values again.
    for (size_t k = 0; k < before.size(); ++k) CHECK(bitwise_equal(m->parameters()[k], before[k]));
    ++checked;
    params += static_cast<int>(before.size());
  }
  CHECK(params >= 20);
  MESSAGE(checked, " layers gradchecked, ", params, " parameters");
}

TEST_CASE("layers: gradcheck fails for a wrong gradient (the helper can fail)") {
  // A module whose parameter enters through detach(): the tape gives it no gradient, while
  // finite differences see it, so the check must fail.
  struct Leaky : Module {
    Tensor w{register_parameter("w", ones({3}, Options().dtype(DType::f64)))};
    Tensor forward(const Tensor& x) override { return x * w.detach(); }
  };
  Leaky m;
  Tensor x = randn({3}, Options().dtype(DType::f64)).requires_grad_();
  CHECK_FALSE(gradcheck_module(m, x).ok);
}

// The same computation compiled and eager: forward; a training step (loss, backward into .grad)
// whose loss and parameter gradients match over two calls and one trace; a compiled forward
// with an eager backward; and input gradients through duet::grad inside a compiled function.
TEST_CASE("layers: compiled equals eager, forward and backward") {
  for (size_t i = 0; i < layer_rows().size(); ++i) {
    const LayerRow& row = layer_rows()[i];
    INFO(row.label);
    manual_seed(i + 1);
    ModulePtr m = row.make();
    Module& mod = *m;
    Tensor x = make_input(row, DType::f32);
    auto fwd = compile([&](Tensor in) { return mod(in); });
    manual_seed(100);
    Tensor e = mod(x);
    manual_seed(100);
    Tensor c = fwd(x);
    CHECK(close(c, e, 1e-5));
    Tensor w = randn(e.shape());
    auto loss_of = [&](const Tensor& in) { return sum(mod(in) * w); };

    const std::vector<Tensor> params = mod.parameters();
    if (!params.empty()) {
      for (Tensor p : params) p.set_grad(Tensor());
      manual_seed(100);
      Tensor le = loss_of(x);
      le.backward();
      std::vector<Tensor> ge;
      for (const Tensor& p : params) ge.push_back(p.grad().clone());
      for (Tensor p : params) p.set_grad(Tensor());
      auto step = compile([&](Tensor in) {
        Tensor l = loss_of(in);
        l.backward();
        return l.detach();
      });
      for (int call = 0; call < 2; ++call) {
        mod.zero_grad();  // nothing the first time; in place the second
        manual_seed(100);
        Tensor lc = step(x);
        CHECK(close(lc, le.detach(), 1e-5));
        for (size_t k = 0; k < params.size(); ++k) CHECK(close(params[k].grad(), ge[k], 1e-4));
      }
      CHECK(step.stats().traces == 1);
      mod.zero_grad();
      manual_seed(100);
      sum(fwd(x) * w).backward();
      for (size_t k = 0; k < params.size(); ++k) CHECK(close(params[k].grad(), ge[k], 1e-4));
      CHECK(fwd.stats().traces == 1);
    }
    if (is_floating(x.dtype())) {
      Tensor xr = x.clone().requires_grad_();
      manual_seed(100);
      Tensor gx_e = grad({loss_of(xr)}, {xr})[0];
      auto grad_x = compile([&](Tensor in) { return grad({loss_of(in)}, {in})[0]; });
      manual_seed(100);
      Tensor gx_c = grad_x(xr);
      CHECK(close(gx_c, gx_e, 1e-4));
    }
  }
}

TEST_CASE("Dropout: the same seed draws the same masks eagerly and compiled, call after call") {
  Dropout d(0.5);
  Tensor x = ones({6, 7});
  auto f = compile([&](Tensor in) { return d(in); });
  manual_seed(21);
  Tensor e1 = d(x), e2 = d(x);
  manual_seed(21);
  Tensor c1 = f(x), c2 = f(x);
  CHECK(bitwise_equal(e1, c1));
  CHECK(bitwise_equal(e2, c2));
  CHECK_FALSE(bitwise_equal(c1, c2));
  // Kept elements are scaled by 1 / (1 - p); some are dropped, some kept.
  int kept = 0;
  for (double v : values(c1)) {
    CHECK((v == 0 || v == 2));
    kept += v == 2;
  }
  CHECK(kept > 5);
  CHECK(kept < 37);
  // Evaluation mode is the identity, compiled too (the training flag is a static value of the
  // trace, so the compiled function follows the module's mode).
  d.eval();
  CHECK(bitwise_equal(d(x), x));
  auto g = compile([&](Tensor in, bool training) {
    d.train(training);
    return d(in);
  });
  CHECK(bitwise_equal(g(x, false), x));
  CHECK_FALSE(bitwise_equal(g(x, true), x));
}

TEST_CASE("Flatten keeps a symbolic batch dim symbolic: no retrace when it changes") {
  Sequential net(Conv2d(1, 2, 3), Flatten(), Linear(8, 2));
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([&](Tensor in) { return net(in); }, o);
  for (int64_t n : {2, 5, 3}) {
    Tensor x = randn({n, 1, 4, 4});
    CHECK(close(f(x), net(x), 1e-5));
  }
  CHECK(f.stats().traces == 1);
}

// ---- Layers one by one ----

TEST_CASE("layers compute what their ops compute") {
  manual_seed(3);
  Tensor x = randn({2, 4});
  Linear lin(4, 3);
  CHECK(bitwise_equal(lin(x), linear(x, lin.weight, lin.bias)));
  Linear nob(4, 3, false);
  CHECK_FALSE(nob.bias.defined());
  CHECK(nob.parameters().size() == 1);
  CHECK(close(nob(x), matmul(x, transpose(nob.weight, 0, 1)), 1e-6));
  Conv2d conv(2, 3, 3, 2, 1);
  Tensor img = randn({1, 2, 5, 5});
  CHECK(bitwise_equal(conv(img), conv2d(img, conv.weight, conv.bias, 2, 1)));
  CHECK(conv(img).shape() == Shape{1, 3, 3, 3});
  CHECK(MaxPool2d(2)(img).shape() == Shape{1, 2, 2, 2});
  CHECK(bitwise_equal(AvgPool2d(2, 1)(img), avg_pool2d(img, 2, 1)));
  // Each pooling argument reaches the function, in PyTorch's order.
  CHECK(bitwise_equal(MaxPool2d({3, 2}, {2, 1}, {1, 0}, {1, 2}, true)(img),
                      max_pool2d(img, {3, 2}, {2, 1}, {1, 0}, {1, 2}, true)));
  CHECK(bitwise_equal(AvgPool2d({3, 2}, {2, 1}, {1, 1}, true, false)(img),
                      avg_pool2d(img, {3, 2}, {2, 1}, {1, 1}, true, false)));
  CHECK(AvgPool2d({3, 2}, {2, 1}, {1, 1}, true, false)(img).shape() == Shape{1, 2, 3, 6});
  CHECK(close(AdaptiveAvgPool2d(1)(img), mean(img, Dims{2, 3}, true), 1e-6));
  CHECK(bitwise_equal(AdaptiveMaxPool2d({2, 3})(img), adaptive_max_pool2d(img, {2, 3})));
  CHECK(bitwise_equal(Upsample(2, "bilinear", true)(img), upsample(img, 2, "bilinear", true)));
  CHECK(Upsample(1.5)(img).shape() == Shape{1, 2, 7, 7});
  // Upsampling by an integer factor is interpolating to that multiple of the size.
  CHECK(bitwise_equal(upsample(img, 3, "bilinear"), interpolate(img, {15, 15}, "bilinear")));
  CHECK(bitwise_equal(upsample(img, 2), interpolate(img, 10)));
  // By an output size (a Size2), in every mode; "area" is the adaptive average pooling.
  CHECK(Upsample(Size2{7, 3}, "bicubic", true).name() ==
        "Upsample(size=(7, 3), mode='bicubic', align_corners=True)");
  CHECK(bitwise_equal(Upsample(Size2{7, 3}, "bicubic", true)(img),
                      interpolate(img, {7, 3}, "bicubic", true)));
  CHECK(bitwise_equal(Upsample(Size2(3), "area")(img), adaptive_avg_pool2d(img, 3)));
  CHECK(bitwise_equal(Upsample(0.5, "area")(img), adaptive_avg_pool2d(img, 2)));
  CHECK(Upsample(2).scale_factor == 2);  // an int is a scale factor, as before
  CHECK(contains(error_of<ValueError>([] {
                   Upsample(Size2{0, 3});
                 }),
                 "[Upsample] size must be positive, got (0, 3)"));
  CHECK(contains(error_of<ValueError>([] { Upsample(2.0, "area", true); }),
                 "[Upsample] align_corners is for modes"));
  // By a scale factor, sequences and volumes too, in their interpolating modes.
  const Tensor seq = randn({2, 3, 5}), vol = randn({1, 2, 3, 4, 2});
  CHECK(bitwise_equal(Upsample(2.0, "linear", true)(seq), upsample(seq, 2, "linear", true)));
  CHECK(Upsample(2.0, "trilinear")(vol).sizes() == Shape{1, 2, 6, 8, 4});
  CHECK(bitwise_equal(Upsample(1.5, "trilinear")(vol), upsample(vol, 1.5, "trilinear")));
  // A volume by an output size (a Size3).
  CHECK(Upsample({4, 5, 3}, "trilinear", true).name() ==
        "Upsample(size=(4, 5, 3), mode='trilinear', align_corners=True)");
  CHECK(bitwise_equal(Upsample({4, 5, 3}, "trilinear", true)(vol),
                      interpolate(vol, Size3{4, 5, 3}, "trilinear", true)));
  CHECK(contains(error_of<ValueError>([] {
                   Upsample(Size3{2, 0, 2});
                 }),
                 "[Upsample] size must be positive, got (2, 0, 2)"));
  CHECK(contains(error_of<ShapeError>([&] { Upsample(2.0, "bilinear")(vol); }),
                 "[upsample] mode \"bilinear\" needs (N, C, H, W) input, got (1, 2, 3, 4, 2)"));
  Embedding emb(5, 3);
  Tensor idx = tensor({4, 0, 4}, Options().dtype(DType::i64));
  CHECK(close(emb(idx), index_select(emb.weight, 0, idx), 0));
  LayerNorm ln(Shape{4});
  check_tensor(ln.weight, {4}, DType::f32, {1, 1, 1, 1});
  check_tensor(ln.bias, {4}, DType::f32, {0, 0, 0, 0});
  CHECK(bitwise_equal(ln(x), layer_norm(x, {4}, ln.weight, ln.bias)));
  CHECK(LayerNorm(Shape{4}, 1e-5, false).parameters().empty());
  CHECK(Flatten()(img).shape() == Shape{1, 50});
  CHECK(Flatten(0, 1)(img).shape() == Shape{2, 5, 5});
  CHECK(Flatten(-2)(img).shape() == Shape{1, 2, 25});
  CHECK(Flatten()(scalar(2.0)).shape() == Shape{1});
  CHECK(bitwise_equal(ReLU()(x), relu(x)));
  CHECK(bitwise_equal(Tanh()(x), tanh(x)));
  CHECK(bitwise_equal(GELU()(x), gelu(x)));
  CHECK(bitwise_equal(GELU("none")(x), gelu(x)));
  CHECK(bitwise_equal(GELU("tanh")(x), gelu(x, "tanh")));
  CHECK(GELU("tanh").name() == "GELU(approximate='tanh')");
  CHECK(close(gelu(x, "tanh"), gelu(x), 1e-3));
  CHECK(bitwise_equal(Sigmoid()(x), sigmoid(x)));
  CHECK(bitwise_equal(SiLU()(x), silu(x)));
  CHECK(bitwise_equal(Softplus(2, 1)(x), softplus(x, 2, 1)));
  CHECK(Softplus(2, 1).name() == "Softplus(beta=2, threshold=1)");
  CHECK_THROWS_AS(softplus(x, 0), ValueError);
  // Far above the threshold e^x overflows f32; the gradient stays 1, not NaN (0 * inf).
  Tensor big = tensor({100.0, 200.0}, {2}, Options().requires_grad(true));
  sum(softplus(big)).backward();
  CHECK(values(big.grad()) == std::vector<double>{1, 1});
}

// torch.nn.MultiheadAttention's forward (batch_first) on plain doubles: query (n, l, e), key and
// value (n, s, e); add(b, h, i, j) is added to the scores (-inf masks).
std::vector<double> ref_mha(const MultiheadAttention& m, const std::vector<double>& xq,
                            const std::vector<double>& xk, const std::vector<double>& xv, int64_t n,
                            int64_t l, int64_t s,
                            const std::function<double(int64_t, int64_t, int64_t, int64_t)>& add) {
  const int64_t e = m.embed_dim, hn = m.num_heads, d = m.head_dim;
  const std::vector<double> w = values(m.in_proj_weight), b = values(m.in_proj_bias),
                            wo = values(m.out_proj.weight), bo = values(m.out_proj.bias);
  auto proj = [&](const std::vector<double>& x, int64_t rows, int64_t block) {
    std::vector<double> y(rows * e);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < e; ++o) {
        double acc = b[block * e + o];
        for (int64_t i = 0; i < e; ++i) acc += x[r * e + i] * w[(block * e + o) * e + i];
        y[r * e + o] = acc;
      }
    return y;
  };
  const std::vector<double> q = proj(xq, n * l, 0), k = proj(xk, n * s, 1), v = proj(xv, n * s, 2);
  std::vector<double> att(n * l * e, 0.0), out(n * l * e);
  for (int64_t bb = 0; bb < n; ++bb)
    for (int64_t h = 0; h < hn; ++h)
      for (int64_t i = 0; i < l; ++i) {
        std::vector<double> p(s);
        double mx = -INFINITY, total = 0;
        for (int64_t j = 0; j < s; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d; ++c)
            acc += q[(bb * l + i) * e + h * d + c] * k[(bb * s + j) * e + h * d + c];
          p[j] = acc / std::sqrt(double(d)) + add(bb, h, i, j);
          mx = std::max(mx, p[j]);
        }
        for (double& x : p) total += (x = std::exp(x - mx));
        for (int64_t j = 0; j < s; ++j)
          for (int64_t c = 0; c < d; ++c)
            att[(bb * l + i) * e + h * d + c] += p[j] / total * v[(bb * s + j) * e + h * d + c];
      }
  for (int64_t r = 0; r < n * l; ++r)
    for (int64_t o = 0; o < e; ++o) {
      double acc = bo[o];
      for (int64_t i = 0; i < e; ++i) acc += att[r * e + i] * wo[o * e + i];
      out[r * e + o] = acc;
    }
  return out;
}

TEST_CASE("MultiheadAttention: PyTorch's parameters, and its forward on plain doubles") {
  manual_seed(5);
  MultiheadAttention m(4, 2);
  std::vector<std::string> names;
  for (const auto& [name, t] : m.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                          "out_proj.bias"});
  CHECK(m.in_proj_weight.shape() == Shape{12, 4});
  CHECK(m.out_proj.weight.shape() == Shape{4, 4});
  check_tensor(m.in_proj_bias, {12}, DType::f32, std::vector<double>(12, 0.0));
  check_tensor(m.out_proj.bias, {4}, DType::f32, std::vector<double>(4, 0.0));
  // xavier_uniform on (12, 4): bound sqrt(6 / 16).
  for (double w : values(m.in_proj_weight)) CHECK(std::abs(w) <= std::sqrt(6.0 / 16));
  CHECK(m.name() == "MultiheadAttention(embed_dim=4, num_heads=2)");

  m.to(DType::f64);
  {
    // Non-zero biases, so that the reference checks where they go.
    NoGradGuard ng;
    Tensor(m.in_proj_bias).copy_(randn({12}, Options().dtype(DType::f64)));
    Tensor(m.out_proj.bias).copy_(randn({4}, Options().dtype(DType::f64)));
  }
  const int64_t n = 2, l = 3, s = 5;
  const Options f64 = Options().dtype(DType::f64);
  Tensor q = randn({n, l, 4}, f64), k = randn({n, s, 4}, f64), v = randn({n, s, 4}, f64);
  const auto none = [](int64_t, int64_t, int64_t, int64_t) { return 0.0; };
  const std::vector<double> xq = values(q), xk = values(k), xv = values(v);
  check_tensor(m.forward(q, k, v), {n, l, 4}, DType::f64, ref_mha(m, xq, xk, xv, n, l, s, none),
               1e-12, 1e-12);
  // A b8 (L, S) mask is true where attending is not allowed.
  std::vector<double> bm;
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < s; ++j) bm.push_back((i + 2 * j) % 3 == 0);
  auto masked = [&](int64_t, int64_t, int64_t i, int64_t j) {
    return bm[i * s + j] ? -INFINITY : 0.0;
  };
  check_tensor(m.forward(q, k, v, make(bm, {l, s}, DType::b8)), {n, l, 4}, DType::f64,
               ref_mha(m, xq, xk, xv, n, l, s, masked), 1e-12, 1e-12);
  // A (N * num_heads, L, S) mask, one per batch entry and head.
  std::vector<double> bm3;
  for (int64_t bh = 0; bh < n * 2; ++bh)
    for (int64_t i = 0; i < l; ++i)
      for (int64_t j = 0; j < s; ++j) bm3.push_back((i + j + bh) % 4 == 1);
  auto masked3 = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return bm3[((b * 2 + h) * l + i) * s + j] ? -INFINITY : 0.0;
  };
  check_tensor(m.forward(q, k, v, make(bm3, {n * 2, l, s}, DType::b8)), {n, l, 4}, DType::f64,
               ref_mha(m, xq, xk, xv, n, l, s, masked3), 1e-12, 1e-12);
  // A floating mask is added.
  Tensor fm = randn({l, s}, f64);
  const std::vector<double> fmv = values(fm);
  auto added = [&](int64_t, int64_t, int64_t i, int64_t j) { return fmv[i * s + j]; };
  check_tensor(m.forward(q, k, v, fm), {n, l, 4}, DType::f64,
               ref_mha(m, xq, xk, xv, n, l, s, added), 1e-12, 1e-12);
  // is_causal is the b8 mask of j > i.
  Tensor x = randn({n, 4, 4}, f64);
  const std::vector<double> xx = values(x);
  auto causal = [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -INFINITY : 0.0; };
  check_tensor(m.forward(x, x, x, {}, true), {n, 4, 4}, DType::f64,
               ref_mha(m, xx, xx, xx, n, 4, 4, causal), 1e-12, 1e-12);
  // The weights, averaged over the heads: rows of probabilities, zero where masked (to within
  // the vectorized exp's value at -inf, which is below 1e-300 in f64 rather than exactly 0).
  auto [out, w] = m.forward_with_weights(x, x, x, {}, true);
  CHECK(close(out, m.forward(x, x, x, {}, true), 1e-14));
  REQUIRE(w.shape() == Shape{n, 4, 4});
  const std::vector<double> wv = values(w);
  for (int64_t r = 0; r < n * 4; ++r) {
    double total = 0;
    for (int64_t j = 0; j < 4; ++j) {
      total += wv[r * 4 + j];
      if (j > r % 4) CHECK(wv[r * 4 + j] < 1e-300);
    }
    CHECK(total == doctest::Approx(1).epsilon(1e-12));
  }
}

TEST_CASE("scaled_dot_product_attention: a causal mask over a symbolic sequence length") {
  manual_seed(9);
  CompileOptions o;
  o.dynamic = {{0, 1}, {1, 1}, {2, 1}};
  auto f = compile(
      [](Tensor q, Tensor k, Tensor v) { return scaled_dot_product_attention(q, k, v, {}, true); },
      o);
  for (int64_t len : {3, 6, 4}) {
    Tensor q = randn({2, len, 4}), k = randn({2, len, 4}), v = randn({2, len, 3});
    CHECK(close(f(q, k, v), scaled_dot_product_attention(q, k, v, {}, true), 1e-5));
  }
  CHECK(f.stats().traces == 1);
  // A causal self-attention layer over a changing length: the second length makes it symbolic.
  MultiheadAttention m(8, 2);
  auto g = compile([&](Tensor x) { return m.forward(x, x, x, {}, true); });
  for (int64_t len : {3, 5, 7, 4}) {
    Tensor x = randn({2, len, 8});
    CHECK(close(g(x), m.forward(x, x, x, {}, true), 1e-5));
  }
  CHECK(g.stats().traces == 2);
}

TEST_CASE("scaled_dot_product_attention: errors name the op, the shapes and the dtypes") {
  Tensor q = ones({2, 3, 4}), k = ones({2, 5, 4}), v = ones({2, 5, 2});
  const std::string shape = error_of<ShapeError>([&] {
    scaled_dot_product_attention(q, ones({2, 5, 3}), v);
  });
  CHECK(shape.rfind("[scaled_dot_product_attention]", 0) == 0);
  CHECK(shape.find("(2, 5, 3)") != std::string::npos);
  const std::string dt = error_of<DTypeError>([&] {
    scaled_dot_product_attention(q, k, ones({2, 5, 2}, Options().dtype(DType::f64)));
  });
  CHECK(dt.rfind("[scaled_dot_product_attention]", 0) == 0);
  CHECK(dt.find("f64") != std::string::npos);
  CHECK(error_of<ValueError>([&] {
          scaled_dot_product_attention(q, k, v, ones({3, 5}), true);
        }).rfind("[scaled_dot_product_attention]", 0) == 0);
  CHECK(error_of<DTypeError>([&] {
          scaled_dot_product_attention(q, k, v, ones({3, 5}, Options().dtype(DType::i64)));
        }).rfind("[scaled_dot_product_attention]", 0) == 0);
  CHECK(error_of<ValueError>([&] { gelu(q, "fast"); }).rfind("[gelu]", 0) == 0);
}

TEST_CASE("layers: default initialization follows PyTorch's bounds and the seed") {
  struct Row {
    const char* label;
    std::function<ModulePtr()> make;
    double bound;  // every parameter within [-bound, bound], its extremes near the bound
  };
  const Row rows[] = {
      {"Linear(50, 40)", maker<Linear>(50, 40), 1 / std::sqrt(50.0)},
      {"Conv2d(3, 16, 3)", maker<Conv2d>(3, 16, 3), 1 / std::sqrt(27.0)},
      {"Conv2d(4, 30, 2)", maker<Conv2d>(4, 30, 2), 1 / std::sqrt(16.0)},
      // (fan_in counts a filter's own channels: 4 / 2 groups times 3 * 3)
      {"Conv2d(4, 8, 3, groups 2)", maker<Conv2d>(4, 8, 3, 1, 0, true, 2), 1 / std::sqrt(18.0)},
      // (a kernel of 1 x 5: fan_in 3 * 5)
      {"Conv2d(3, 8, {1, 5})", maker<Conv2d>(3, 8, Size2(1, 5)), 1 / std::sqrt(15.0)},
      // (weight (in, out / groups, kh, kw): fan_in 6 / 2 groups times 3 * 3, as PyTorch's)
      {"ConvTranspose2d(4, 6, 3, groups 2)", maker<ConvTranspose2d>(4, 6, 3, 1, 0, 0, 2),
       1 / std::sqrt(27.0)},
  };
  for (const Row& row : rows) {
    INFO(std::string(row.label));
    manual_seed(5);
    ModulePtr a = row.make();
    for (const auto& [name, p] : a->named_parameters()) {
      INFO(name);
      std::vector<double> v = values(p);
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      const double rounding = 1e-6 * row.bound;  // the draw is computed in f32
      CHECK(*lo >= -row.bound - rounding);
      CHECK(*hi <= row.bound + rounding);
      // The extremes of n draws near the bound (a bias has fewer draws than its weight).
      const double near = v.size() >= 100 ? 0.8 : 0.5;
      CHECK(*lo < -near * row.bound);
      CHECK(*hi > near * row.bound);
    }
    manual_seed(5);
    ModulePtr b = row.make();
    manual_seed(6);
    ModulePtr c = row.make();
    for (size_t k = 0; k < a->parameters().size(); ++k) {
      CHECK(bitwise_equal(a->parameters()[k], b->parameters()[k]));
      CHECK_FALSE(bitwise_equal(a->parameters()[k], c->parameters()[k]));
    }
  }
  manual_seed(7);
  std::vector<double> e = values(Embedding(2000, 50).weight);
  double sum = 0, sq = 0;
  for (double v : e) sum += v, sq += v * v;
  const double mean = sum / e.size(), sd = std::sqrt(sq / e.size() - mean * mean);
  CHECK(std::abs(mean) < 0.015);
  CHECK(std::abs(sd - 1) < 0.015);
}

TEST_CASE("layers: constructor arguments out of range name the layer") {
  const std::pair<std::function<void()>, const char*> rows[] = {
      {[] { Linear(0, 3); }, "[Linear]"},
      {[] { Linear(3, -1); }, "[Linear]"},
      {[] { Conv2d(0, 3, 3); }, "[Conv2d]"},
      {[] { Conv2d(1, 3, 0); }, "[Conv2d]"},
      {[] { Conv2d(1, 3, 3, 0); }, "[Conv2d]"},
      {[] { Conv2d(1, 3, 3, 1, -1); }, "[Conv2d]"},
      {[] { Conv2d(3, 4, 3, 1, 0, true, 2); }, "[Conv2d]"},
      {[] { Conv2d(4, 4, 3, 1, 0, true, 0); }, "[Conv2d]"},
      {[] { MaxPool2d(0); }, "[MaxPool2d]"},
      {[] { MaxPool2d(2, -1); }, "[MaxPool2d]"},
      {[] { AvgPool2d(0); }, "[AvgPool2d]"},
      {[] { MaxPool2d(2, 2, -1); }, "[MaxPool2d]"},
      {[] {
         MaxPool2d(2, 2, 1, {1, 0});
       },
       "[MaxPool2d]"},
      {[] {
         AvgPool2d(Size2{2, 0});
       },
       "[AvgPool2d]"},
      {[] {
         AdaptiveAvgPool2d({1, 0});
       },
       "[AdaptiveAvgPool2d]"},
      {[] { AdaptiveMaxPool2d(-1); }, "[AdaptiveMaxPool2d]"},
      {[] { Upsample(0); }, "[Upsample]"},
      {[] { Upsample(2, "cubic"); }, "[Upsample]"},
      {[] { Upsample(2, "nearest", true); }, "[Upsample]"},
      {[] { Embedding(0, 3); }, "[Embedding]"},
      {[] { Embedding(3, 0); }, "[Embedding]"},
      {[] { LayerNorm(Shape{}); }, "[LayerNorm]"},
      {[] {
         LayerNorm(Shape{3, 0});
       },
       "[LayerNorm]"},
      {[] { LayerNorm(Shape{3}, -1); }, "[LayerNorm]"},
      {[] { Dropout(-0.1); }, "[Dropout]"},
      {[] { Dropout(1.0); }, "[Dropout]"},
      {[] { Flatten(2, 1); }, "[Flatten]"},
      {[] { GELU("fast"); }, "[GELU]"},
      {[] { MultiheadAttention(5, 2); }, "[MultiheadAttention]"},
      {[] { MultiheadAttention(4, 0); }, "[MultiheadAttention]"},
  };
  for (const auto& [f, prefix] : rows) {
    std::string e = error_of<ValueError>(f);
    INFO(e);
    CHECK(e.rfind(prefix, 0) == 0);
  }
}

TEST_CASE("layers: bad inputs raise the op's error") {
  const std::pair<std::function<void()>, const char*> rows[] = {
      {[] {
         Linear(3, 4)(ones({2, 5}));
       },
       "[linear]"},
      {[] {
         Conv2d(3, 4, 3)(ones({1, 2, 5, 5}));
       },
       "[conv2d]"},
      {[] {
         MaxPool2d(2)(ones({2, 3}));
       },
       "[max_pool2d]"},
      {[] { Embedding(4, 2)(ones({3})); }, "[embedding]"},
      {[] {
         LayerNorm(Shape{4})(ones({2, 3}));
       },
       "[layer_norm]"},
      {[] { Dropout(0.5)(ones({3}, Options().dtype(DType::i64))); }, "[dropout]"},
      {[] {
         Flatten(3)(ones({2, 3}));
       },
       "[Flatten]"},
      {[] {
         MultiheadAttention(4, 2)(ones({2, 3, 5}));
       },
       "[MultiheadAttention]"},
      {[] {
         MultiheadAttention(4, 2).forward(ones({2, 3, 4}), ones({2, 3, 4}), ones({2, 3, 4}),
                                          ones({3, 3}, Options().dtype(DType::i64)));
       },
       "[MultiheadAttention]"},
      {[] {
         Tensor x = ones({2, 3, 4});
         MultiheadAttention(4, 2).forward(x, x, x, ones({3, 3}), true);
       },
       "[MultiheadAttention]"},
  };
  for (const auto& [f, prefix] : rows) {
    std::string e = error_of(f);
    INFO(e);
    CHECK(e.rfind(prefix, 0) == 0);
  }
}

TEST_CASE("layers: Conv2d in groups convolves each group of channels with its own filters") {
  manual_seed(41);
  Conv2d conv(4, 6, 3, 1, 1, true, 2);
  REQUIRE(conv.weight.sizes() == Shape{6, 2, 3, 3});
  const Tensor x = randn({2, 4, 5, 5});
  const Tensor y = conv(x);
  // Each group by itself: its two channels, its three filters and biases.
  for (int64_t g = 0; g < 2; ++g) {
    const Tensor part =
        conv2d(slice(x, 1, 2 * g, 2 * g + 2), slice(conv.weight, 0, 3 * g, 3 * g + 3),
               slice(conv.bias, 0, 3 * g, 3 * g + 3), 1, 1);
    CHECK(close(slice(y, 1, 3 * g, 3 * g + 3), part, 1e-5));
  }
  // A depthwise convolution (a filter per channel) and the channels' errors.
  Conv2d depthwise(4, 4, 3, 1, 1, false, 4);
  CHECK(depthwise(x).sizes() == Shape{2, 4, 5, 5});
  CHECK_THROWS_AS(conv(randn({2, 3, 5, 5})), ShapeError);
  CHECK_THROWS_AS(conv2d(x, randn({6, 2, 3, 3}), {}, 1, 1, 3), ShapeError);
}

// torch.nn.Conv2d(3, 4, (2, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1)): the weight
// (4, 3, 2, 3), and the layer is conv2d with those arguments.
TEST_CASE("layers: Conv2d with a kh x kw kernel, strides and paddings per dim, and dilation") {
  manual_seed(43);
  Conv2d conv(3, 4, {2, 3}, {2, 1}, {1, 2}, true, 1, {2, 1});
  REQUIRE(conv.weight.sizes() == Shape{4, 3, 2, 3});
  CHECK(conv.kernel_size == Size2(2, 3));
  CHECK(conv.dilation == Size2(2, 1));
  const Tensor x = randn({2, 3, 6, 5});
  const Tensor y = conv(x);
  // (6 + 2 - 2 * 1 - 1) / 2 + 1 = 3 rows, (5 + 4 - 2 - 1) / 1 + 1 = 7 columns
  CHECK(y.sizes() == Shape{2, 4, 3, 7});
  CHECK(bitwise_equal(y, conv2d(x, conv.weight, conv.bias, {2, 1}, {1, 2}, 1, {2, 1})));
  CHECK(conv.name() ==
        "Conv2d(3, 4, kernel_size=(2, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1))");
  // A padding_mode pads x in that mode first; zeros is conv2d's own padding.
  for (const char* mode : {"reflect", "replicate", "circular"}) {
    CAPTURE(mode);
    Conv2d m(3, 4, {2, 3}, {2, 1}, {1, 2}, true, 1, 1, mode);
    CHECK(bitwise_equal(m(x), conv2d(pad(x, {2, 2, 1, 1}, mode), m.weight, m.bias, {2, 1}, 0)));
  }
  // padding "same": an output as large as x, the odd pad after (a 2 x 4 kernel dilated 1 x 2:
  // rows 0 before and 1 after, columns 3 and 3), in every padding_mode.
  for (const char* mode : {"zeros", "reflect", "circular"}) {
    CAPTURE(mode);
    Conv2d same(3, 4, {2, 4}, 1, kSame, true, 1, {1, 2}, mode);
    const Tensor want =
        conv2d(pad(x, {3, 3, 0, 1}, std::string(mode) == "zeros" ? "constant" : mode), same.weight,
               same.bias, 1, 0, 1, {1, 2});
    CHECK(same(x).sizes() == Shape{2, 4, 6, 5});
    CHECK(bitwise_equal(same(x), want));
    if (std::string(mode) == "zeros")
      CHECK(bitwise_equal(conv2d(x, same.weight, same.bias, 1, kSame, 1, {1, 2}), want));
  }
  Conv2d odd(3, 4, 3, 1, kSame);  // an odd kernel: conv2d's own padding of 1
  CHECK(bitwise_equal(odd(x), conv2d(x, odd.weight, odd.bias, 1, 1)));
  CHECK(odd.name() == "Conv2d(3, 4, kernel_size=3, stride=1, padding=same)");
  CHECK_THROWS_AS(Conv2d(3, 4, 3, 2, kSame), ValueError);
  CHECK_THROWS_AS(conv2d(x, odd.weight, {}, 2, kSame), ValueError);
  CHECK(Conv2d(3, 4, 3, 1, 1, true, 1, 1, "reflect").name() ==
        "Conv2d(3, 4, kernel_size=3, stride=1, padding=1, padding_mode='reflect')");
  CHECK_THROWS_AS(Conv2d(3, 4, 3, 1, 1, true, 1, 1, "same"), ValueError);
  CHECK_THROWS_AS(Conv2d(3, 4, 3, 1, 0, true, 1, 0), ValueError);
  CHECK_THROWS_AS(Conv2d(3, 4, {3, 0}), ValueError);
}

TEST_CASE("layers: ConvTranspose2d is conv2d's adjoint, and inverts its shapes") {
  // <conv2d(x, w), y> = <x, conv_transpose2d(y, w)> for every x and y: the transposed
  // convolution is the linear map's transpose, with the same stride, padding, groups and
  // dilation, and the output padding that gives x's size back.
  manual_seed(44);
  const Options f64 = Options().dtype(DType::f64);
  struct Case {
    Shape x, w;
    Size2 s, p, d;
    int64_t groups;
    Size2 op;  // the output padding that gives x's size back
  };
  for (const Case& c : {Case{{2, 3, 7, 7}, {4, 3, 3, 3}, 2, 1, 1, 1, 0},
                        Case{{1, 4, 8, 6}, {6, 2, 3, 2}, {2, 1}, {1, 0}, {1, 2}, 2, {1, 0}},
                        Case{{1, 2, 6, 5}, {2, 2, 2, 2}, 1, 1, 2, 1, 0}}) {
    CAPTURE(c.x);
    const Tensor x = randn(c.x, f64), w = randn(c.w, f64);
    const Tensor y = conv2d(x, w, {}, c.s, c.p, c.groups, c.d);
    const Tensor g = randn(y.sizes(), f64);
    const Tensor back = conv_transpose2d(g, w, {}, c.s, c.p, c.op, c.groups, c.d);
    REQUIRE(back.sizes() == x.sizes());
    CHECK(sum(y * g).item<double>() ==
          doctest::Approx(sum(x * back).item<double>()).epsilon(1e-12));
  }
  ConvTranspose2d up(4, 3, 3, 2, 1, 1);
  REQUIRE(up.weight.sizes() == Shape{4, 3, 3, 3});
  const Tensor z = randn({2, 4, 5, 5});
  CHECK(up(z).sizes() == Shape{2, 3, 10, 10});
  CHECK(bitwise_equal(up(z), conv_transpose2d(z, up.weight, up.bias, 2, 1, 1)));
  CHECK(up.name() == "ConvTranspose2d(4, 3, kernel_size=3, stride=2, padding=1, output_padding=1)");
  CHECK(ConvTranspose2d(4, 8, {2, 3}, 1, 0, 0, 4, false, 2).name() ==
        "ConvTranspose2d(4, 8, kernel_size=(2, 3), stride=1, padding=0, groups=4, dilation=2, "
        "bias=false)");
  CHECK_THROWS_AS(ConvTranspose2d(4, 3, 3, 1, 0, 1), ValueError);     // output padding >= both
  CHECK_THROWS_AS(ConvTranspose2d(4, 3, 3, 1, 0, 0, 2), ValueError);  // 3 out in 2 groups
  // An output size in place of the output padding (PyTorch's forward(x, output_size)): a
  // conv2d's input size back, whichever of the sizes its stride maps to one output it was.
  ConvTranspose2d down_up(4, 3, {3, 2}, {2, 3}, {1, 0});
  for (Size2 size : {Size2{9, 14}, Size2{10, 16}, Size2{9, 15}}) {
    CAPTURE(size.h);
    CAPTURE(size.w);
    const Tensor back = down_up.forward(z, size);
    CHECK(back.sizes() == Shape{2, 3, size.h, size.w});
    const Size2 op{size.h - 9, size.w - 14};
    CHECK(
        bitwise_equal(back, conv_transpose2d(z, down_up.weight, down_up.bias, {2, 3}, {1, 0}, op)));
  }
  CHECK(contains(error_of<ValueError>([&] {
                   down_up.forward(z, {11, 14});
                 }),
                 "[ConvTranspose2d] output size 11x14: its height 11 is not between 9 and 10 (for "
                 "the input (2, 4, 5, 5))"));
  CHECK(contains(error_of<ValueError>([&] {
                   down_up.forward(z, {9, 13});
                 }),
                 "its width 13 is not between 14 and 16"));
  CHECK(contains(error_of<ShapeError>([&] {
                   down_up.forward(randn({4, 5, 5}), {9, 6});
                 }),
                 "[ConvTranspose2d] input must be (N, 4, H, W) for an output size"));
}

TEST_CASE("layers: names for messages") {
  CHECK(Linear(784, 1024).name() == "Linear(784, 1024)");
  CHECK(Linear(3, 4, false).name() == "Linear(3, 4, bias=false)");
  CHECK(Conv2d(1, 32, 3).name() == "Conv2d(1, 32, kernel_size=3, stride=1, padding=0)");
  CHECK(Conv2d(4, 8, 3, 1, 1, true, 4).name() ==
        "Conv2d(4, 8, kernel_size=3, stride=1, padding=1, groups=4)");
  CHECK(MaxPool2d(2).name() == "MaxPool2d(kernel_size=2, stride=2)");
  CHECK(MaxPool2d({2, 3}, {0, 1}, {1, 0}, 2, true).name() ==
        "MaxPool2d(kernel_size=(2, 3), stride=(2, 1), padding=(1, 0), dilation=2, ceil_mode=True)");
  CHECK(AvgPool2d(3, 2, 1, false, false).name() ==
        "AvgPool2d(kernel_size=3, stride=2, padding=1, count_include_pad=False)");
  CHECK(AdaptiveAvgPool2d(1).name() == "AdaptiveAvgPool2d(output_size=1)");
  CHECK(AdaptiveMaxPool2d({7, 5}).name() == "AdaptiveMaxPool2d(output_size=(7, 5))");
  CHECK(Upsample(2).name() == "Upsample(scale_factor=2, mode='nearest')");
  CHECK(Upsample(1.5, "bilinear", true).name() ==
        "Upsample(scale_factor=1.5, mode='bilinear', align_corners=True)");
  CHECK(Dropout(0.25).name() == "Dropout(p=0.25)");
  CHECK(Embedding(10, 3).name() == "Embedding(10, 3)");
  CHECK(ReLU().name() == "ReLU()");
  CHECK(Sequential().name() == "Sequential");
}

// ---- Modules ----

// A model as users write one: members initialized by registering them.
struct Net : Module {
  Linear fc1{register_module("fc1", Linear(4, 8))};
  Tensor scale{register_parameter("scale", ones({8}))};
  Sequential block{register_module("block", Sequential(Tanh(), Dropout(0.5), Linear(8, 3)))};
  Tensor steps{register_buffer("steps", zeros({}, Options().dtype(DType::i64)))};
  Tensor forward(const Tensor& x) override { return block(fc1(x) * scale); }
};

// Exposes the protected registry, for tests of its rules.
struct Registry : Module {
  using Module::register_buffer;
  using Module::register_module;
  using Module::register_parameter;
};

std::vector<std::string> names_of(const NamedTensors& v) {
  std::vector<std::string> out;
  for (const auto& [name, t] : v) out.push_back(name);
  return out;
}

TEST_CASE("Module: names and order of parameters, buffers and children, nested") {
  Net net;
  CHECK(net.name() == "Net");
  CHECK(names_of(net.named_parameters()) == std::vector<std::string>{"scale", "fc1.weight",
                                                                     "fc1.bias", "block.2.weight",
                                                                     "block.2.bias"});
  CHECK(names_of(net.named_buffers()) == std::vector<std::string>{"steps"});
  // The handles are the members' tensors.
  std::vector<Tensor> p = net.parameters();
  REQUIRE(p.size() == 5);
  CHECK(p[0].is_same(net.scale));
  CHECK(p[1].is_same(net.fc1.weight));
  CHECK(p[3].is_same(net.block.at<Linear>(2).weight));
  for (const Tensor& t : p) CHECK(t.requires_grad());
  CHECK_FALSE(net.steps.requires_grad());
  auto children = net.named_children();
  REQUIRE(children.size() == 2);
  CHECK(children[0].first == "fc1");
  CHECK(children[1].first == "block");
  CHECK(children[0].second->name() == "Linear(4, 8)");
  CHECK(net.block.size() == 3);
  CHECK(net.block[1]->name() == "Dropout(p=0.5)");
  StateDict sd = net.state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, v] : sd) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"block.2.bias", "block.2.weight", "fc1.bias", "fc1.weight",
                                         "scale", "steps"});
  // state_dict values share storage with the parameters but are outside autograd.
  CHECK(same_storage(sd.at("fc1.weight"), net.fc1.weight));
  CHECK_FALSE(sd.at("fc1.weight").requires_grad());
}

TEST_CASE("Module: copies share parameters, children and the training flag") {
  Linear a(3, 2);
  Linear b = a;
  CHECK(a.is_same(b));
  CHECK(b.weight.is_same(a.weight));
  CHECK(b.parameters()[0].is_same(a.parameters()[0]));
  b.eval();
  CHECK_FALSE(a.is_training());
  init::zeros_(b.weight);
  CHECK(values(a.weight) == std::vector<double>(6, 0.0));
  // A module registered by value is a copy that shares state with the original; by
  // shared_ptr, the very object.
  Linear l(2, 2);
  auto lp = std::make_shared<Linear>(2, 2);
  Sequential s(l, lp, ReLU());
  CHECK(s.at<Linear>(0).is_same(l));
  CHECK(&s.at<Linear>(1) == lp.get());
  CHECK(s.parameters()[0].is_same(l.weight));
  CHECK(s.parameters()[2].is_same(lp->weight));
  // Sequential copies share their children, so push_back on one shows in the other.
  Sequential t = s;
  t.push_back(Tanh());
  CHECK(s.size() == 4);
  CHECK(names_of(s.named_parameters()).back() == "1.bias");
  CHECK(s.named_children().back().first == "3");
  // One Sequential argument copies; two nest.
  Sequential copy(s);
  CHECK(copy.is_same(s));
  Sequential nested(s, ReLU());
  CHECK(nested.size() == 2);
  CHECK(names_of(nested.named_parameters()).front() == "0.0.weight");
}

TEST_CASE("Module: a module registered twice has its parameters listed once") {
  Registry r;
  Linear l(2, 2);
  r.register_module("a", l);
  r.register_module("b", l);
  CHECK(r.parameters().size() == 2);
  CHECK(names_of(r.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  CHECK(r.state_dict().size() == 4);
}

TEST_CASE("Module: train() and eval() recurse and change what Dropout does") {
  manual_seed(8);
  Net net;
  Dropout& drop = net.block.at<Dropout>(1);
  Tensor x = randn({5, 4});
  CHECK(net.is_training());
  CHECK(drop.is_training());
  Tensor t1 = net(x), t2 = net(x);
  CHECK_FALSE(bitwise_equal(t1, t2));  // fresh masks
  net.eval();
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(net.fc1.is_training());
  CHECK_FALSE(drop.is_training());
  Tensor e1 = net(x), e2 = net(x);
  CHECK(bitwise_equal(e1, e2));
  Tensor h = tanh(net.fc1(x) * net.scale);
  CHECK(bitwise_equal(e1, net.block.at<Linear>(2)(h)));
  net.train();
  CHECK(drop.is_training());
  // A subtree alone.
  net.block.eval();
  CHECK(net.is_training());
  CHECK_FALSE(drop.is_training());
  CHECK(net.fc1.is_training());
}

TEST_CASE("Module: registry rules") {
  Registry r;
  r.register_parameter("w", ones({2}));
  CHECK(contains(error_of<ValueError>([&] { r.register_parameter("w", ones({2})); }),
                 "'w' is already registered as a parameter"));
  CHECK(contains(error_of<ValueError>([&] { r.register_buffer("w", ones({2})); }),
                 "'w' is already registered as a parameter"));
  CHECK(contains(error_of<ValueError>([&] { r.register_module("w", ReLU()); }),
                 "'w' is already registered as a parameter"));
  CHECK(contains(error_of<ValueError>([&] { r.register_parameter("a.b", ones({2})); }),
                 "contains '.'"));
  CHECK(contains(error_of<ValueError>([&] { r.register_module("", ReLU()); }), "empty"));
  Tensor leaf = ones({2}).requires_grad_();
  CHECK(contains(error_of([&] { r.register_parameter("v", leaf * 2); }), "leaf"));
  CHECK(contains(error_of([&] { r.register_parameter("v", Tensor()); }), "undefined"));
  CHECK(contains(error_of([&] { r.register_module("me", r); }), "its own descendant"));
  Tensor frozen = r.register_parameter("frozen", ones({2}), false);
  CHECK_FALSE(frozen.requires_grad());
  CHECK(r.parameters().size() == 2);
  // The message, then the caller's line (core/call_site.h). The call stays outside a macro:
  // inside one, clang's source_location names the macro's last line.
  const int line = __LINE__ + 1;
  const std::string err = error_of([&] { r(ones({1})); });
  CHECK(err == fmt::format("[nn] Registry has no forward(Tensor) (at test_nn.cpp:{})", line));
  Sequential s{ReLU()};
  CHECK(contains(error_of<ValueError>([&] { s[1]; }), "out of range"));
  CHECK(contains(error_of<ValueError>([&] { s.at<Linear>(0); }), "ReLU()"));
  CHECK(bitwise_equal(Sequential()(ones({2})), ones({2})));
}

TEST_CASE("Module: zero_grad zeroes gradients in place") {
  Linear l(3, 2);
  sum(l(ones({4, 3}))).backward();
  Tensor g = l.weight.grad();
  REQUIRE(g.defined());
  CHECK(values(l.bias.grad()) == std::vector<double>{4, 4});
  l.zero_grad();
  CHECK(l.weight.grad().is_same(g));
  CHECK(values(g) == std::vector<double>(6, 0.0));
}

TEST_CASE("Module: to(DType) converts in place; every handle stays valid") {
  manual_seed(9);
  Net net;
  Tensor w = net.fc1.weight;  // as an optimizer holds it
  std::vector<double> before = values(w);
  sum(net(ones({2, 4}))).backward();
  net.to(DType::f64);
  CHECK(w.is_same(net.fc1.weight));
  CHECK(w.dtype() == DType::f64);
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  CHECK(values(w) == before);  // f32 values are exact in f64
  CHECK(w.grad().dtype() == DType::f64);
  CHECK(net.steps.dtype() == DType::i64);  // integer buffers keep their dtype
  for (const Tensor& p : net.parameters()) CHECK(p.dtype() == DType::f64);
  CHECK(net(ones({2, 4}, Options().dtype(DType::f64))).dtype() == DType::f64);
  CHECK(error_of<DTypeError>([&] { net.to(DType::i32); }).rfind("[to] Net", 0) == 0);
}

TEST_CASE("Module: to(Device) moves in place, or raises Tensor::to's error and moves nothing") {
  Net net;
  Tensor w = net.fc1.weight;
  void* data = w.raw_data();
  net.to(Device::cpu());  // already there: nothing changes
  CHECK(w.raw_data() == data);
  CHECK(w.is_same(net.fc1.weight));
  std::vector<double> before = values(w);
  bool moved = true;
  try {
    net.to(Device::cuda());
  } catch (const DeviceError& e) {
    moved = false;
    CHECK(contains(e.what(), "[to]"));
    CHECK(contains(e.what(), "cuda"));
  }
  if (!moved) {
    for (const Tensor& p : net.parameters()) CHECK(p.device() == Device::cpu());
    CHECK(w.raw_data() == data);
  } else {
    // A build with CUDA kernels: the same tensors now live on the GPU.
    CHECK(w.is_same(net.fc1.weight));
    CHECK(w.device() == Device::cuda());
    CHECK(w.requires_grad());
    for (const Tensor& b : net.buffers()) CHECK(b.device() == Device::cuda());
    net.to(Device::cpu());
  }
  CHECK(w.device() == Device::cpu());
  CHECK(values(w) == before);
}

// ---- State dicts ----

// A path in the temporary directory, removed when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& stem)
      : path((std::filesystem::temp_directory_path() /
              fmt::format("duet_test_nn_{}_{}", ::getpid(), stem))
                 .string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_CASE("state dict: save and load into a freshly initialized model give identical outputs") {
  TempFile file("roundtrip.duet");
  manual_seed(1);
  Net a;
  a.steps.add_(7);
  manual_seed(2);
  Net b;
  a.eval();
  b.eval();
  Tensor x = randn({3, 4});
  CHECK_FALSE(bitwise_equal(a(x), b(x)));
  a.save(file.path);
  Tensor w = b.fc1.weight;
  b.load(file.path);
  CHECK(bitwise_equal(a(x), b(x)));
  CHECK(b.steps.item<int64_t>() == 7);
  CHECK(w.is_same(b.fc1.weight));  // loaded in place
  CHECK(w.requires_grad());
  for (const auto& [name, t] : a.state_dict()) CHECK(bitwise_equal(t, b.state_dict().at(name)));
}

TEST_CASE("state dict: the file keeps dtypes, shapes and bits") {
  TempFile file("dtypes.duet");
  Tensor t = make({1.5, -2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  StateDict dict = {
      {"f32", make({1.25, -0.5, 3}, {3}, DType::f32)},
      {"f64 transposed", transpose(t, 0, 1)},
      {"i32", make({-7, 8}, {2, 1}, DType::i32)},
      {"i64 scalar", make({1LL << 40}, {}, DType::i64)},
      {"b8", make({1, 0, 1}, {3}, DType::b8)},
      {"empty", zeros({0, 3})},
      {"nan", make({NAN, INFINITY}, {2}, DType::f32)},
  };
  write_state_dict(dict, file.path);
  StateDict back = read_state_dict(file.path);
  REQUIRE(back.size() == dict.size());
  for (const auto& [name, v] : dict) {
    INFO(name);
    REQUIRE(back.count(name));
    CHECK(bitwise_equal(back.at(name), v));
  }
}

TEST_CASE("state dict: load_state_dict checks names, shapes and dtypes, and loads all or none") {
  manual_seed(3);
  Net net;
  const StateDict good = Net().state_dict();
  std::vector<double> before = values(net.fc1.weight);
  auto unchanged = [&] { return values(net.fc1.weight) == before; };

  StateDict missing = good;
  missing.erase("fc1.bias");
  std::string e = error_of([&] { net.load_state_dict(missing); });
  CHECK(e.rfind("[load_state_dict] Net", 0) == 0);
  CHECK(contains(e, "missing keys 'fc1.bias'"));
  CHECK(unchanged());

  StateDict extra = good;
  extra["fc2.weight"] = ones({2});
  e = error_of([&] { net.load_state_dict(extra); });
  CHECK(contains(e, "unexpected keys 'fc2.weight'"));
  CHECK(unchanged());

  StateDict wrong_shape = good;
  wrong_shape["fc1.weight"] = zeros({3, 3});
  e = error_of<ShapeError>([&] { net.load_state_dict(wrong_shape); });
  CHECK(contains(e, "'fc1.weight'"));
  CHECK(contains(e, "(3, 3)"));
  CHECK(contains(e, "(8, 4)"));
  CHECK(unchanged());

  StateDict wrong_dtype = good;
  wrong_dtype["scale"] = ones({8}, Options().dtype(DType::f64));
  e = error_of<DTypeError>([&] { net.load_state_dict(wrong_dtype); });
  CHECK(contains(e, "'scale'"));
  CHECK(contains(e, "f64"));
  CHECK(contains(e, "f32"));
  CHECK(unchanged());

  // Not strict: missing and unexpected names are skipped, the rest loads.
  StateDict partial = {{"fc1.weight", good.at("fc1.weight")}, {"other", ones({1})}};
  net.load_state_dict(partial, false);
  CHECK(bitwise_equal(net.fc1.weight, good.at("fc1.weight")));
  CHECK_FALSE(bitwise_equal(net.fc1.bias, good.at("fc1.bias")));
  // But a shape mismatch is an error either way.
  CHECK(!error_of<ShapeError>([&] { net.load_state_dict(wrong_shape, false); }).empty());
}

TEST_CASE("state dict file: damaged, foreign, truncated and missing files name the problem") {
  TempFile good("good.duet"), bad("bad.duet");
  Net net;
  net.save(good.path);
  const std::vector<char> bytes = read_bytes(good.path);
  const auto n = static_cast<int64_t>(bytes.size());
  REQUIRE(n > 100);

  struct Row {
    std::string label;
    std::function<void(std::vector<char>&)> damage;
    std::vector<std::string> message;  // parts the error must contain
  };
  std::vector<Row> rows = {
      {"wrong magic", [](auto& b) { b[0] = 'X'; }, {"not a duet state dict", "DUETDICT"}},
      {"wrong version", [](auto& b) { b[8] = 2; }, {"format version 2", "reads version 1"}},
      {"bytes appended",
       [](auto& b) { b.push_back(0); },
       {"trailing data", fmt::format("{} bytes", n + 1)}},
  };
  for (int64_t at : {int64_t(0), int64_t(5), int64_t(8), int64_t(20), int64_t(31), n / 2, n - 1})
    rows.push_back({fmt::format("truncated to {} bytes", at),
                    [at](auto& b) { b.resize(static_cast<size_t>(at)); },
                    {"truncated", fmt::format("{} bytes", at)}});
  for (int64_t at : {int64_t(20), int64_t(40), n / 2, n - 5, n - 1})
    rows.push_back({fmt::format("byte {} flipped", at),
                    [at](auto& b) { b[at] ^= 0x10; },
                    {"damaged", "CRC-32 checksum"}});
  for (const Row& row : rows) {
    INFO(row.label);
    std::vector<char> b = bytes;
    row.damage(b);
    write_bytes(bad.path, b);
    std::string e = error_of<ValueError>([&] { net.load(bad.path); });
    INFO(e);
    CHECK(e.rfind("[load] '" + bad.path + "'", 0) == 0);
    for (const std::string& part : row.message) CHECK(contains(e, part));
  }

  std::string e = error_of([&] { net.load(good.path + ".missing"); });
  CHECK(e.rfind("[load] cannot open '" + good.path + ".missing'", 0) == 0);
  CHECK(contains(e, "No such file"));
  e = error_of([&] { net.load(std::filesystem::temp_directory_path().string()); });
  CHECK(e.rfind("[load] cannot", 0) == 0);
  e = error_of([&] { net.save("/nonexistent-dir/model.duet"); });
  CHECK(e.rfind("[save] cannot open '/nonexistent-dir/model.duet'", 0) == 0);
  // A sound file of another model.
  Linear(4, 8).save(bad.path);
  e = error_of([&] { net.load(bad.path); });
  CHECK(e.rfind("[load] '" + bad.path + "' does not fit Net", 0) == 0);
  CHECK(contains(e, "missing keys 'block.2.bias'"));
  CHECK(contains(e, "unexpected keys 'bias', 'weight'"));
  // The undamaged file still loads.
  net.load(good.path);
}

// ---- Initializers ----

TEST_CASE("init: fans and gains as PyTorch computes them") {
  const std::pair<Shape, std::pair<int64_t, int64_t>> fans[] = {
      {{3, 4}, {4, 3}}, {{5, 2, 3, 3}, {18, 45}}, {{2, 3, 4}, {12, 8}}, {{6, 0}, {0, 6}}};
  for (const auto& [shape, want] : fans) {
    INFO(shape.str());
    CHECK(init::calculate_fan_in_and_fan_out(zeros(shape)) == want);
  }
  for (Shape s : {Shape{3}, Shape{}}) {
    std::string e = error_of<ValueError>([&] { init::calculate_fan_in_and_fan_out(zeros(s)); });
    CHECK(contains(e, "fewer than 2 dims"));
    CHECK(contains(e, s.str()));
  }
  using N = init::Nonlinearity;
  const std::tuple<N, double, double> gains[] = {
      {N::Linear, 0.01, 1},
      {N::Conv2d, 0.01, 1},
      {N::Sigmoid, 0.01, 1},
      {N::Tanh, 0.01, 5.0 / 3},
      {N::ReLU, 0.01, std::sqrt(2.0)},
      {N::LeakyReLU, 0.01, std::sqrt(2 / 1.0001)},
      {N::LeakyReLU, 0.2, std::sqrt(2 / 1.04)},
      {N::LeakyReLU, std::sqrt(5.0), std::sqrt(1 / 3.0)},
      {N::SELU, 0.01, 0.75},
  };
  for (const auto& [nl, param, want] : gains)
    CHECK(init::calculate_gain(nl, param) == doctest::Approx(want));
}

using InitFn = std::function<void(Tensor)>;

TEST_CASE("init: uniform initializers stay within their bounds and reach them") {
  using init::FanMode;
  using init::Nonlinearity;
  struct Row {
    const char* label;
    InitFn init;
    double lo, hi;
  };
  // On a (64, 100) tensor: fan_in 100, fan_out 64.
  const Row rows[] = {
      {"uniform_(-0.3, 0.7)", [](Tensor t) { init::uniform_(t, -0.3, 0.7); }, -0.3, 0.7},
      {"kaiming_uniform_()", [](Tensor t) { init::kaiming_uniform_(t); }, -std::sqrt(0.06),
       std::sqrt(0.06)},
      {"kaiming_uniform_(a = sqrt(5))", [](Tensor t) { init::kaiming_uniform_(t, std::sqrt(5.0)); },
       -0.1, 0.1},
      {"kaiming_uniform_(fan_out, relu)",
       [](Tensor t) { init::kaiming_uniform_(t, 0, FanMode::FanOut, Nonlinearity::ReLU); },
       -std::sqrt(6 / 64.0), std::sqrt(6 / 64.0)},
      {"xavier_uniform_(gain 2)", [](Tensor t) { init::xavier_uniform_(t, 2); },
       -2 * std::sqrt(6 / 164.0), 2 * std::sqrt(6 / 164.0)},
  };
  for (const Row& row : rows) {
    for (DType dt : {DType::f32, DType::f64}) {
      INFO(std::string(row.label), " ", dtype_name(dt));
      Tensor t = zeros({64, 100}, Options().dtype(dt));
      row.init(t);
      std::vector<double> v = values(t);
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      const double margin = 0.02 * (row.hi - row.lo);
      const double rounding = (dt == DType::f32 ? 1e-6 : 1e-12) * (row.hi - row.lo);
      CHECK(*lo >= row.lo - rounding);
      CHECK(*hi <= row.hi + rounding);
      CHECK(*lo < row.lo + margin);
      CHECK(*hi > row.hi - margin);
    }
  }
}

TEST_CASE("init: normal initializers have the target mean and std") {
  using init::FanMode;
  using init::Nonlinearity;
  struct Row {
    const char* label;
    InitFn init;
    double mean, std;
  };
  // On a (200, 300) tensor: fan_in 300, fan_out 200, 60000 samples.
  const Row rows[] = {
      {"normal_(2, 0.5)", [](Tensor t) { init::normal_(t, 2, 0.5); }, 2, 0.5},
      {"kaiming_normal_()", [](Tensor t) { init::kaiming_normal_(t); }, 0, std::sqrt(2 / 300.0)},
      {"kaiming_normal_(fan_out, tanh)",
       [](Tensor t) { init::kaiming_normal_(t, 0, FanMode::FanOut, Nonlinearity::Tanh); }, 0,
       5.0 / 3 / std::sqrt(200.0)},
      {"xavier_normal_()", [](Tensor t) { init::xavier_normal_(t); }, 0, std::sqrt(2 / 500.0)},
      {"xavier_normal_(gain 3)", [](Tensor t) { init::xavier_normal_(t, 3); }, 0,
       3 * std::sqrt(2 / 500.0)},
  };
  for (const Row& row : rows) {
    INFO(std::string(row.label));
    Tensor t = zeros({200, 300});
    row.init(t);
    std::vector<double> v = values(t);
    double sum = 0, sq = 0;
    for (double x : v) sum += x;
    const double mean = sum / v.size();
    for (double x : v) sq += (x - mean) * (x - mean);
    const double sd = std::sqrt(sq / (v.size() - 1));
    CHECK(std::abs(mean - row.mean) < 0.02 * row.std);
    CHECK(std::abs(sd - row.std) < 0.02 * row.std);
  }
}

TEST_CASE("init: the same seed gives the same values; initializers keep the tensor a leaf") {
  const std::pair<const char*, InitFn> rows[] = {
      {"uniform_", [](Tensor t) { init::uniform_(t, -1, 1); }},
      {"normal_", [](Tensor t) { init::normal_(t); }},
      {"kaiming_uniform_", [](Tensor t) { init::kaiming_uniform_(t); }},
      {"kaiming_normal_", [](Tensor t) { init::kaiming_normal_(t); }},
      {"xavier_uniform_", [](Tensor t) { init::xavier_uniform_(t); }},
      {"xavier_normal_", [](Tensor t) { init::xavier_normal_(t); }},
  };
  for (const auto& [label, f] : rows) {
    INFO(std::string(label));
    Tensor a = zeros({5, 6}).requires_grad_(), b = zeros({5, 6}), c = zeros({5, 6});
    void* data = a.raw_data();
    manual_seed(12);
    f(a);  // a parameter, while grad mode is on
    manual_seed(12);
    f(b);
    manual_seed(13);
    f(c);
    CHECK(bitwise_equal(a.detach(), b));
    CHECK_FALSE(bitwise_equal(b, c));
    CHECK(a.is_leaf());
    CHECK(a.requires_grad());
    CHECK(a.raw_data() == data);
  }
}

TEST_CASE("init: constants, and errors naming the initializer") {
  Tensor f = zeros({2, 2});
  init::constant_(f, 0.25);
  CHECK(values(f) == std::vector<double>(4, 0.25));
  init::ones_(f);
  CHECK(values(f) == std::vector<double>(4, 1));
  init::zeros_(f);
  CHECK(values(f) == std::vector<double>(4, 0));
  Tensor i = zeros({3}, Options().dtype(DType::i64));
  init::constant_(i, 3);
  check_tensor(i, {3}, DType::i64, {3, 3, 3});
  // Zero-element tensors are left as they are, as in PyTorch.
  Tensor empty = zeros({0, 4});
  init::kaiming_uniform_(empty);
  init::xavier_normal_(empty);
  CHECK(empty.numel() == 0);

  CHECK(error_of<DTypeError>([&] { init::uniform_(i); }).rfind("[uniform_]", 0) == 0);
  CHECK(error_of<DTypeError>([&] { init::normal_(i); }).rfind("[normal_]", 0) == 0);
  CHECK(contains(error_of<ValueError>([&] { init::uniform_(f, 1, 0); }), "a <= b"));
  CHECK(contains(error_of<ValueError>([&] { init::normal_(f, 0, -1); }), "std >= 0"));
  CHECK(contains(error_of<ValueError>([&] { init::kaiming_normal_(zeros({4})); }),
                 "fewer than 2 dims"));
}

}  // namespace
}  // namespace duet::test
