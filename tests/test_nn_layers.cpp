// nn: the recurrent layers (RNN, GRU, LSTM) against their equations written out in doubles,
// batch norm's statistics and buffers eagerly and compiled, Conv1d against a direct loop, and the
// containers (ModuleList, ModuleDict). Gradchecks and eager-against-compiled runs of every one of
// these layers are rows of the layer table in test_nn.cpp.
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "nn/activation.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/norm.h"
#include "nn/rnn.h"
#include "nn/transformer.h"
#include "util.h"

namespace duet::test {
namespace {

using namespace duet::nn;

const Options f64 = Options().dtype(DType::f64);

// ---- The recurrent equations, in doubles ----

enum class Kind { Tanh, ReLU, GRU, LSTM };

const char* kind_str(Kind k) {
  return k == Kind::Tanh   ? "RNN tanh"
         : k == Kind::ReLU ? "RNN relu"
         : k == Kind::GRU  ? "GRU"
                           : "LSTM";
}

struct Setup {
  Kind kind;
  int64_t layers = 1;
  bool bidirectional = false, bias = true, batch_first = false, with_state = false;
  int64_t steps = 4, batch = 2, input = 3, hidden = 4;
};

struct Result {
  std::vector<double> out, h_n, c_n;  // out time-major (T, N, dirs * H)
};

double sigmoid_d(double v) { return 1 / (1 + std::exp(-v)); }

// PyTorch's documented equations, one element at a time. x is (T, N, I) time-major; p holds the
// parameters by PyTorch's names; h0 and c0 are (layers * dirs, N, H).
Result reference(const Setup& s, const std::vector<double>& x,
                 const std::map<std::string, std::vector<double>>& p, const std::vector<double>& h0,
                 const std::vector<double>& c0) {
  const int64_t T = s.steps, N = s.batch, H = s.hidden, dirs = s.bidirectional ? 2 : 1;
  const int64_t G = s.kind == Kind::GRU ? 3 : s.kind == Kind::LSTM ? 4 : 1;
  Result r;
  std::vector<double> in = x;
  int64_t in_size = s.input;
  for (int64_t l = 0; l < s.layers; ++l) {
    std::vector<double> next(static_cast<size_t>(T * N * dirs * H));
    for (int64_t d = 0; d < dirs; ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      const std::vector<double>& w_ih = p.at("weight_ih" + sfx);
      const std::vector<double>& w_hh = p.at("weight_hh" + sfx);
      const std::vector<double> zero(static_cast<size_t>(G * H), 0.0);
      const std::vector<double>& b_ih = s.bias ? p.at("bias_ih" + sfx) : zero;
      const std::vector<double>& b_hh = s.bias ? p.at("bias_hh" + sfx) : zero;
      const int64_t k = l * dirs + d;
      std::vector<double> h(h0.begin() + k * N * H, h0.begin() + (k + 1) * N * H);
      std::vector<double> c(c0.begin() + k * N * H, c0.begin() + (k + 1) * N * H);
      for (int64_t step = 0; step < T; ++step) {
        const int64_t t = d ? T - 1 - step : step;
        for (int64_t n = 0; n < N; ++n) {
          std::vector<double> gi(static_cast<size_t>(G * H)), gh(static_cast<size_t>(G * H));
          for (int64_t g = 0; g < G * H; ++g) {
            double a = b_ih[g], b = b_hh[g];
            for (int64_t j = 0; j < in_size; ++j)
              a += w_ih[g * in_size + j] * in[(t * N + n) * in_size + j];
            for (int64_t j = 0; j < H; ++j) b += w_hh[g * H + j] * h[n * H + j];
            gi[g] = a;
            gh[g] = b;
          }
          for (int64_t u = 0; u < H; ++u) {
            double& hu = h[n * H + u];
            double& cu = c[n * H + u];
            switch (s.kind) {
              case Kind::Tanh:
                hu = std::tanh(gi[u] + gh[u]);
                break;
              case Kind::ReLU:
                hu = std::max(0.0, gi[u] + gh[u]);
                break;
              case Kind::GRU: {
                const double rg = sigmoid_d(gi[u] + gh[u]);
                const double zg = sigmoid_d(gi[H + u] + gh[H + u]);
                const double ng = std::tanh(gi[2 * H + u] + rg * gh[2 * H + u]);
                hu = (1 - zg) * ng + zg * hu;
                break;
              }
              case Kind::LSTM: {
                const double ig = sigmoid_d(gi[u] + gh[u]);
                const double fg = sigmoid_d(gi[H + u] + gh[H + u]);
                const double gg = std::tanh(gi[2 * H + u] + gh[2 * H + u]);
                const double og = sigmoid_d(gi[3 * H + u] + gh[3 * H + u]);
                cu = fg * cu + ig * gg;
                hu = og * std::tanh(cu);
                break;
              }
            }
            next[((t * N + n) * dirs + d) * H + u] = hu;
          }
        }
      }
      r.h_n.insert(r.h_n.end(), h.begin(), h.end());
      r.c_n.insert(r.c_n.end(), c.begin(), c.end());
    }
    in = next;
    in_size = dirs * H;
  }
  r.out = in;
  return r;
}

// A layer of the setup, in f64. Holder keeps it as the concrete type.
struct Layer {
  std::shared_ptr<RNNBase> module;
  Kind kind;
  // (output, h_n, c_n (LSTM only)).
  std::tuple<Tensor, Tensor, Tensor> operator()(const Tensor& x, const Tensor& h0 = {},
                                                const Tensor& c0 = {}) const {
    if (kind == Kind::LSTM) {
      auto& m = static_cast<LSTM&>(*module);
      auto [y, st] = h0.defined() ? m(x, LSTM::State{h0, c0}) : m(x);
      return {y, std::get<0>(st), std::get<1>(st)};
    }
    auto [y, h] =
        kind == Kind::GRU ? static_cast<GRU&>(*module)(x, h0) : static_cast<RNN&>(*module)(x, h0);
    return {y, h, Tensor()};
  }
};

template <class O>
O configure(O o, const Setup& s) {
  return o.num_layers(s.layers)
      .bias(s.bias)
      .batch_first(s.batch_first)
      .bidirectional(s.bidirectional);
}

Layer make_layer(const Setup& s) {
  std::shared_ptr<RNNBase> m;
  switch (s.kind) {
    case Kind::Tanh:
    case Kind::ReLU:
      m = std::make_shared<RNN>(configure(RNNOptions(s.input, s.hidden), s)
                                    .nonlinearity(s.kind == Kind::Tanh ? "tanh" : "relu"));
      break;
    case Kind::GRU:
      m = std::make_shared<GRU>(configure(GRUOptions(s.input, s.hidden), s));
      break;
    case Kind::LSTM:
      m = std::make_shared<LSTM>(configure(LSTMOptions(s.input, s.hidden), s));
      break;
  }
  m->to(DType::f64);
  return {m, s.kind};
}

std::map<std::string, std::vector<double>> param_values(const Module& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : m.named_parameters()) out[name] = values(t);
  return out;
}

std::string label(const Setup& s) {
  return fmt::format("{} layers {}{}{}{}{} T {} N {}", kind_str(s.kind), s.layers,
                     s.bidirectional ? " bidirectional" : "", s.bias ? "" : " bias=false",
                     s.batch_first ? " batch_first" : "", s.with_state ? " with state" : "",
                     s.steps, s.batch);
}

std::vector<Setup> setups() {
  std::vector<Setup> out;
  for (Kind k : {Kind::Tanh, Kind::ReLU, Kind::GRU, Kind::LSTM}) {
    out.push_back({k});
    out.push_back({k, 1, false, true, false, true, 1});  // one step, from a given state
    out.push_back({k, 2, false, true, true, true});
    out.push_back({k, 2, true, false, false, false, 3});
    out.push_back({k, 1, true, true, true, true, 5, 3});
  }
  return out;
}

TEST_CASE("RNN, GRU, LSTM: outputs and final states are PyTorch's equations, written out") {
  int checked = 0;
  for (const Setup& s : setups()) {
    INFO(label(s));
    manual_seed(static_cast<uint64_t>(10 + checked));
    Layer layer = make_layer(s);
    const int64_t states = s.layers * (s.bidirectional ? 2 : 1);
    Tensor x = randn({s.steps, s.batch, s.input}, f64);
    Tensor h0 = s.with_state ? randn({states, s.batch, s.hidden}, f64)
                             : zeros({states, s.batch, s.hidden}, f64);
    Tensor c0 = s.with_state ? randn({states, s.batch, s.hidden}, f64)
                             : zeros({states, s.batch, s.hidden}, f64);
    const Result want =
        reference(s, values(x), param_values(*layer.module), values(h0), values(c0));
    Tensor in = s.batch_first ? transpose(x, 0, 1).contiguous() : x;
    auto [y, h_n, c_n] = s.with_state ? layer(in, h0, c0) : layer(in);
    const int64_t width = s.hidden * (s.bidirectional ? 2 : 1);
    if (s.batch_first) {
      CHECK(y.sizes() == Shape{s.batch, s.steps, width});
      y = transpose(y, 0, 1);
    }
    check_tensor(y, {s.steps, s.batch, width}, DType::f64, want.out, 1e-12, 1e-12);
    check_tensor(h_n, {states, s.batch, s.hidden}, DType::f64, want.h_n, 1e-12, 1e-12);
    if (s.kind == Kind::LSTM)
      check_tensor(c_n, {states, s.batch, s.hidden}, DType::f64, want.c_n, 1e-12, 1e-12);
    ++checked;
  }
  CHECK(checked == 20);
}

TEST_CASE("GRU and LSTM: one step on plain numbers, worked by hand") {
  // input_size 1, hidden_size 1: every weight and bias set by hand.
  GRU gru(1, 1);
  gru.to(DType::f64);
  // Rows r, z, n.
  gru.load_state_dict({{"weight_ih_l0", tensor({0.5, -1.0, 2.0}, {3, 1}, f64)},
                       {"weight_hh_l0", tensor({1.0, 0.25, -0.5}, {3, 1}, f64)},
                       {"bias_ih_l0", tensor({0.1, 0.2, 0.3}, f64)},
                       {"bias_hh_l0", tensor({-0.1, 0.4, 0.6}, f64)}});
  const double x = 0.8, h = -0.3;
  const double r = sigmoid_d(0.5 * x + 0.1 + 1.0 * h - 0.1);
  const double z = sigmoid_d(-1.0 * x + 0.2 + 0.25 * h + 0.4);
  const double n = std::tanh(2.0 * x + 0.3 + r * (-0.5 * h + 0.6));
  const double want = (1 - z) * n + z * h;
  auto [y, h_n] = gru(tensor({x}, {1, 1, 1}, f64), tensor({h}, {1, 1, 1}, f64));
  check_tensor(y, {1, 1, 1}, DType::f64, {want}, 1e-15, 1e-15);
  check_tensor(h_n, {1, 1, 1}, DType::f64, {want}, 1e-15, 1e-15);
  // n uses r * (W_hn h + b_hn), not W_hn (r * h) + b_hn: they differ here.
  const double other = std::tanh(2.0 * x + 0.3 + (-0.5 * (r * h) + 0.6));
  CHECK(std::abs(((1 - z) * other + z * h) - want) > 1e-3);

  LSTM lstm(1, 1);
  lstm.to(DType::f64);
  // Rows i, f, g, o.
  lstm.load_state_dict({{"weight_ih_l0", tensor({0.5, -1.0, 2.0, 0.7}, {4, 1}, f64)},
                        {"weight_hh_l0", tensor({1.0, 0.25, -0.5, -0.8}, {4, 1}, f64)},
                        {"bias_ih_l0", tensor({0.1, 0.2, 0.3, -0.2}, f64)},
                        {"bias_hh_l0", tensor({-0.1, 0.4, 0.6, 0.05}, f64)}});
  const double c = 0.9;
  const double i = sigmoid_d(0.5 * x + 0.1 + 1.0 * h - 0.1);
  const double f = sigmoid_d(-1.0 * x + 0.2 + 0.25 * h + 0.4);
  const double g = std::tanh(2.0 * x + 0.3 - 0.5 * h + 0.6);
  const double o = sigmoid_d(0.7 * x - 0.2 - 0.8 * h + 0.05);
  const double c1 = f * c + i * g, h1 = o * std::tanh(c1);
  auto [ly, st] = lstm(tensor({x}, {1, 1, 1}, f64),
                       LSTM::State{tensor({h}, {1, 1, 1}, f64), tensor({c}, {1, 1, 1}, f64)});
  check_tensor(ly, {1, 1, 1}, DType::f64, {h1}, 1e-15, 1e-15);
  check_tensor(std::get<0>(st), {1, 1, 1}, DType::f64, {h1}, 1e-15, 1e-15);
  check_tensor(std::get<1>(st), {1, 1, 1}, DType::f64, {c1}, 1e-15, 1e-15);
}

TEST_CASE("RNN, GRU, LSTM: gradcheck with respect to the input and the start state") {
  for (Kind k : {Kind::Tanh, Kind::GRU, Kind::LSTM}) {
    for (bool bidirectional : {false, true}) {
      Setup s{k, 2, bidirectional, true, true, true, 3, 2, 2, 3};
      INFO(label(s));
      manual_seed(5);
      Layer layer = make_layer(s);
      const int64_t states = s.layers * (bidirectional ? 2 : 1);
      std::vector<Tensor> in = {randn({s.batch, s.steps, s.input}, f64).requires_grad_(),
                                randn({states, s.batch, s.hidden}, f64).requires_grad_(),
                                randn({states, s.batch, s.hidden}, f64).requires_grad_()};
      auto fn = [&](const std::vector<Tensor>& v) {
        auto [y, h_n, c_n] = layer(v[0], v[1], v[2]);
        std::vector<Tensor> parts{reshape(y, {-1}), reshape(h_n, {-1})};
        if (c_n.defined()) parts.push_back(reshape(c_n, {-1}));
        return cat(parts, 0);
      };
      if (k != Kind::LSTM) in.pop_back();
      GradcheckResult r = gradcheck(fn, in);
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
}

// The loss of a compiled or eager training step, and the parameters' gradients.
TEST_CASE(
    "RNN, GRU, LSTM compiled: equal to eager with gradients; the graph holds a scan, "
    "not the steps unrolled") {
  for (Kind k : {Kind::ReLU, Kind::GRU, Kind::LSTM}) {
    INFO(kind_str(k));
    Setup s{k, 2, true, true, false, false};
    manual_seed(8);
    Layer layer = make_layer(s);
    const std::vector<Tensor> params = layer.module->parameters();
    auto loss_of = [&](const Tensor& x) {
      auto [y, h_n, c_n] = layer(x);
      Tensor l = sum(y * y) + sum(h_n);
      return c_n.defined() ? l + sum(c_n * c_n) : l;
    };
    auto grads_of = [&](const Tensor& x) {
      Tensor l = loss_of(x);
      std::vector<Tensor> g = grad({l}, params);
      g.insert(g.begin(), l);
      return g;
    };
    std::map<int64_t, int64_t> nodes;
    for (int64_t steps : {3, 9}) {
      auto step = compile([&](Tensor x) { return grads_of(x); });
      Tensor x = randn({steps, 2, s.input}, f64);
      const std::vector<Tensor> e = grads_of(x);
      const std::vector<Tensor> c = step(x);
      REQUIRE(c.size() == e.size());
      for (size_t i = 0; i < e.size(); ++i) CHECK(close(c[i], e[i], 1e-10));
      nodes[steps] = step.stats().nodes_after;
      const std::string g = step.graph().str();
      CHECK(g.find("scan(") != std::string::npos);
    }
    // The sequence length is only a size: 3 steps and 9 steps make graphs of one size.
    CHECK(nodes[3] == nodes[9]);
  }
}

TEST_CASE(
    "RNN, GRU, LSTM compiled: one trace serves two batch sizes, the zero start state "
    "built from the symbolic batch dim") {
  for (Kind k : {Kind::Tanh, Kind::GRU, Kind::LSTM}) {
    for (bool batch_first : {false, true}) {
      Setup s{k, 2, false, true, batch_first};
      INFO(label(s));
      manual_seed(9);
      Layer layer = make_layer(s);
      CompileOptions o;
      o.dynamic = {{0, batch_first ? 0 : 1}};
      auto f = compile(
          [&](Tensor x) {
            auto [y, h_n, c_n] = layer(x);
            return c_n.defined() ? std::vector<Tensor>{y, h_n, c_n} : std::vector<Tensor>{y, h_n};
          },
          o);
      for (int64_t n : {2, 5, 3}) {
        Tensor x = batch_first ? randn({n, 4, s.input}, f64) : randn({4, n, s.input}, f64);
        auto [y, h_n, c_n] = layer(x);
        std::vector<Tensor> c = f(x);
        CHECK(close(c[0], y, 1e-12));
        CHECK(close(c[1], h_n, 1e-12));
        if (c_n.defined()) CHECK(close(c[2], c_n, 1e-12));
        CHECK(c[1].sizes() == Shape{2, n, s.hidden});
      }
      CHECK(f.stats().traces == 1);
    }
  }
}

TEST_CASE("RNN, GRU, LSTM compiled: batch and sequence length both symbolic, one trace") {
  for (Kind k : {Kind::Tanh, Kind::GRU, Kind::LSTM}) {
    Setup s{k, 1, true};
    INFO(label(s));
    manual_seed(10);
    Layer layer = make_layer(s);
    CompileOptions o;
    o.dynamic = {{0, 0}, {0, 1}};
    auto f = compile(
        [&](Tensor x) {
          auto [y, h_n, c_n] = layer(x);
          return std::vector<Tensor>{y, h_n};
        },
        o);
    for (auto [t, n] : {std::pair<int64_t, int64_t>{3, 2}, {7, 4}, {2, 3}}) {
      Tensor x = randn({t, n, s.input}, f64);
      auto [y, h_n, c_n] = layer(x);
      std::vector<Tensor> c = f(x);
      CHECK(close(c[0], y, 1e-12));
      CHECK(close(c[1], h_n, 1e-12));
    }
    CHECK(f.stats().traces == 1);
  }
}

TEST_CASE("RNN, GRU, LSTM: an empty sequence gives an empty output and the start state") {
  GRU gru(3, 4);
  Tensor h0 = randn({1, 2, 4});
  auto [y, h_n] = gru(zeros({0, 2, 3}), h0);
  CHECK(y.sizes() == Shape{0, 2, 4});
  CHECK(bitwise_equal(h_n, h0));
}

TEST_CASE("RNN, GRU, LSTM: the state out of one half of a sequence continues into the other") {
  for (Kind k : {Kind::Tanh, Kind::GRU, Kind::LSTM}) {
    INFO(kind_str(k));
    Setup s{k, 2};
    manual_seed(11);
    Layer layer = make_layer(s);
    Tensor x = randn({6, 2, s.input}, f64);
    auto [y, h_n, c_n] = layer(x);
    auto [y1, h1, c1] = layer(slice(x, 0, 0, 2));
    auto [y2, h2, c2] = layer(slice(x, 0, 2, 6), h1, c1);
    CHECK(close(cat({y1, y2}, 0), y, 1e-12));
    CHECK(close(h2, h_n, 1e-12));
    if (k == Kind::LSTM) CHECK(close(c2, c_n, 1e-12));
  }
}

TEST_CASE("RNN, GRU, LSTM: unbatched input is a batch of one without the batch dim") {
  for (Kind k : {Kind::ReLU, Kind::GRU, Kind::LSTM}) {
    INFO(kind_str(k));
    Setup s{k, 2, true};
    manual_seed(12);
    Layer layer = make_layer(s);
    Tensor x = randn({5, s.input}, f64);
    Tensor h0 = randn({4, s.hidden}, f64), c0 = randn({4, s.hidden}, f64);
    auto [y, h_n, c_n] = layer(x, h0, c0);
    auto [yb, hb, cb] = layer(unsqueeze(x, 1), unsqueeze(h0, 1), unsqueeze(c0, 1));
    CHECK(y.sizes() == Shape{5, 2 * s.hidden});
    CHECK(h_n.sizes() == Shape{4, s.hidden});
    CHECK(close(y, squeeze(yb, 1), 1e-12));
    CHECK(close(h_n, squeeze(hb, 1), 1e-12));
    if (k == Kind::LSTM) CHECK(close(c_n, squeeze(cb, 1), 1e-12));
  }
}

TEST_CASE("RNN, GRU, LSTM: PyTorch's parameter names, shapes and initialization") {
  LSTM lstm(LSTMOptions(3, 5).num_layers(2).bidirectional(true));
  std::vector<std::string> names;
  for (const auto& [name, t] : lstm.named_parameters()) names.push_back(name);
  const std::vector<std::string> want = {
      "weight_ih_l0",         "weight_hh_l0",         "bias_ih_l0",         "bias_hh_l0",
      "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse",
      "weight_ih_l1",         "weight_hh_l1",         "bias_ih_l1",         "bias_hh_l1",
      "weight_ih_l1_reverse", "weight_hh_l1_reverse", "bias_ih_l1_reverse", "bias_hh_l1_reverse"};
  CHECK(names == want);
  const StateDict sd = lstm.state_dict();
  CHECK(sd.at("weight_ih_l0").sizes() == Shape{20, 3});
  CHECK(sd.at("weight_hh_l0").sizes() == Shape{20, 5});
  CHECK(sd.at("bias_ih_l0").sizes() == Shape{20});
  CHECK(sd.at("weight_ih_l1").sizes() == Shape{20, 10});
  CHECK(sd.at("weight_ih_l1_reverse").sizes() == Shape{20, 10});
  GRU gru(GRUOptions(4, 6).bias(false));
  CHECK(gru.state_dict().size() == 2);
  CHECK(gru.state_dict().at("weight_hh_l0").sizes() == Shape{18, 6});
  CHECK(RNN(4, 6).state_dict().at("weight_ih_l0").sizes() == Shape{6, 4});
  // U(-1/sqrt(hidden), 1/sqrt(hidden)) on every parameter, and nearly reaching both ends.
  manual_seed(3);
  GRU big(GRUOptions(16, 25).num_layers(2));
  const double bound = 1 / std::sqrt(25.0);
  double lo = 1, hi = -1;
  for (const Tensor& p : big.parameters())
    for (double v : values(p)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(lo < -0.95 * bound);
  CHECK(hi > 0.95 * bound);
  // reset_parameters draws again; the same seed draws the same values.
  manual_seed(3);
  GRU again(GRUOptions(16, 25).num_layers(2));
  CHECK(bitwise_equal(again.parameters()[5], big.parameters()[5]));
  again.reset_parameters();
  CHECK_FALSE(bitwise_equal(again.parameters()[5], big.parameters()[5]));
  CHECK(big.name() == "GRU(16, 25, num_layers=2)");
  CHECK(RNN(RNNOptions(2, 3).nonlinearity("relu").batch_first(true)).name() ==
        "RNN(2, 3, nonlinearity='relu', batch_first=true)");
}

TEST_CASE("RNN, GRU, LSTM: a state dict loads by name into a fresh layer, same outputs") {
  manual_seed(13);
  LSTM a(LSTMOptions(3, 4).num_layers(2));
  LSTM b(LSTMOptions(3, 4).num_layers(2));
  Tensor x = randn({5, 2, 3});
  auto [ya, sa] = a(x);
  auto [yb0, sb0] = b(x);
  CHECK_FALSE(close(yb0, ya, 1e-3));
  b.load_state_dict(a.state_dict());
  auto [yb, sb] = b(x);
  CHECK(bitwise_equal(yb, ya));
  CHECK(bitwise_equal(std::get<1>(sb), std::get<1>(sa)));
}

TEST_CASE("RNN, GRU, LSTM: dropout between layers in training mode only") {
  manual_seed(14);
  GRU with(GRUOptions(3, 4).num_layers(2).dropout(0.5));
  GRU without(GRUOptions(3, 4).num_layers(2));
  without.load_state_dict(with.state_dict());
  Tensor x = randn({5, 2, 3});
  auto [yt, ht] = with(x);
  auto [yn, hn] = without(x);
  CHECK_FALSE(close(yt, yn, 1e-3));
  // The first layer's final state comes before the dropout.
  CHECK(close(slice(ht, 0, 0, 1), slice(hn, 0, 0, 1), 1e-6));
  with.eval();
  auto [ye, he] = with(x);
  CHECK(bitwise_equal(ye, yn));
}

TEST_CASE("RNN, GRU, LSTM: errors name the layer, the shapes and what was expected") {
  GRU gru(GRUOptions(3, 4).num_layers(2));
  std::string e = error_of<ShapeError>([&] { gru(randn({5, 2, 4})); });
  CHECK(contains(e, "[GRU]"));
  CHECK(contains(e, "(5, 2, 4)"));
  e = error_of<ShapeError>([&] { gru(randn({5, 2, 3}), randn({1, 2, 4})); });
  CHECK(contains(e, "[GRU] hx must be (2, 2, 4)"));
  CHECK(contains(e, "(1, 2, 4)"));
  e = error_of<DTypeError>([&] { gru(randn({5, 2, 3}, f64)); });
  CHECK(contains(e, "[GRU]"));
  LSTM lstm(3, 4);
  e = error_of<ShapeError>([&] {
    lstm(randn({5, 2, 3}), LSTM::State{zeros({1, 2, 4}), zeros({1, 3, 4})});
  });
  CHECK(contains(e, "[LSTM] c_0 must be (1, 2, 4)"));
  e = error_of<ValueError>([] { RNN(RNNOptions(3, 4).nonlinearity("sigmoid")); });
  CHECK(contains(e, "[RNN] nonlinearity must be \"tanh\" or \"relu\", got \"sigmoid\""));
  e = error_of<ValueError>([] { LSTM(LSTMOptions(3, 4).num_layers(0)); });
  CHECK(contains(e, "[LSTM]"));
  e = error_of<ValueError>([] { GRU(GRUOptions(3, 4).dropout(1)); });
  CHECK(contains(e, "[GRU] dropout must be in [0, 1)"));
  e = error_of<ValueError>([] { GRU(0, 4); });
  CHECK(contains(e, "input_size 0"));
}

// ---- Cells ----

// The layer's one-layer parameters under the cell's names (weight_ih_l0 -> weight_ih).
StateDict cell_dict(const Module& layer) {
  StateDict out;
  for (const auto& [name, t] : layer.named_parameters())
    out[name.substr(0, name.size() - 3)] = t.detach().clone();
  return out;
}

TEST_CASE("RNNCell, GRUCell, LSTMCell: a loop of cells is the one-layer RNN, GRU, LSTM") {
  manual_seed(41);
  Tensor x = randn({5, 2, 3}, f64), h0 = randn({1, 2, 4}, f64), c0 = randn({1, 2, 4}, f64);
  auto steps = [&](auto&& step) {
    std::vector<Tensor> ys;
    for (int64_t t = 0; t < 5; ++t) ys.push_back(step(squeeze(slice(x, 0, t, t + 1), 0)));
    return stack(ys, 0);
  };
  {
    RNN layer(RNNOptions(3, 4).nonlinearity("relu"));
    layer.to(DType::f64);
    RNNCell cell(RNNCellOptions(3, 4).nonlinearity("relu"));
    cell.to(DType::f64);
    cell.load_state_dict(cell_dict(layer));
    auto [y, h_n] = layer(x, h0);
    Tensor h = squeeze(h0, 0);
    CHECK(close(steps([&](const Tensor& xt) { return h = cell(xt, h); }), y, 1e-12));
    CHECK(cell.name() == "RNNCell(3, 4, nonlinearity='relu')");
  }
  {
    GRU layer(3, 4);
    layer.to(DType::f64);
    GRUCell cell(3, 4);
    cell.to(DType::f64);
    cell.load_state_dict(cell_dict(layer));
    auto [y, h_n] = layer(x, h0);
    Tensor h = squeeze(h0, 0);
    CHECK(close(steps([&](const Tensor& xt) { return h = cell(xt, h); }), y, 1e-12));
    // From a zero state: forward(x) alone, also through Module's operator().
    auto [y0, h0n] = layer(slice(x, 0, 0, 1));
    CHECK(close(cell(squeeze(slice(x, 0, 0, 1), 0)), squeeze(y0, 0), 1e-12));
  }
  {
    LSTM layer(3, 4);
    layer.to(DType::f64);
    LSTMCell cell(3, 4);
    cell.to(DType::f64);
    cell.load_state_dict(cell_dict(layer));
    auto [y, state] = layer(x, LSTM::State{h0, c0});
    LSTMCell::State st{squeeze(h0, 0), squeeze(c0, 0)};
    CHECK(close(steps([&](const Tensor& xt) { return std::get<0>(st = cell(xt, st)); }), y, 1e-12));
    CHECK(close(std::get<1>(st), squeeze(std::get<1>(state), 0), 1e-12));
  }
}

TEST_CASE("RNNCell, GRUCell, LSTMCell: names, unbatched input, errors") {
  LSTMCell cell(LSTMCellOptions(3, 5).bias(false));
  std::vector<std::string> names;
  for (const auto& [name, t] : cell.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"weight_ih", "weight_hh"});
  CHECK(cell.weight_ih.sizes() == Shape{20, 3});
  CHECK(cell.name() == "LSTMCell(3, 5, bias=false)");
  GRUCell gru(3, 5);
  CHECK(gru.weight_hh.sizes() == Shape{15, 5});
  const double bound = 1 / std::sqrt(5.0);
  for (const Tensor& p : gru.parameters())
    for (double v : values(p)) CHECK(std::abs(v) <= bound);
  Tensor x = randn({3}), h = randn({5});
  Tensor one = gru(x, h);
  CHECK(one.sizes() == Shape{5});
  CHECK(close(one, squeeze(gru(unsqueeze(x, 0), unsqueeze(h, 0)), 0), 1e-6));
  // A cell of one input goes into a Sequential (a zero state at every call).
  Sequential seq(RNNCell(3, 4), Linear(4, 2));
  CHECK(seq(randn({6, 3})).sizes() == Shape{6, 2});
  std::string e = error_of<ShapeError>([&] { gru(randn({2, 3}), randn({3, 5})); });
  CHECK(contains(e, "[GRUCell] hx must be (2, 5)"));
  e = error_of<ShapeError>([&] { gru(randn({2, 4})); });
  CHECK(contains(e, "[GRUCell] input must be (N, 3) or unbatched (3)"));
  e = error_of<ValueError>([] { RNNCell(RNNCellOptions(3, 4).nonlinearity("gelu")); });
  CHECK(contains(e, "nonlinearity must be"));
  e = error_of<ValueError>([] { LSTMCell(3, 0); });
  CHECK(contains(e, "[LSTMCell]"));
}

// ---- Known values from ONNX Runtime ----

// Made by tools/rnn_reference.py (onnxruntime 1.20.1, onnx 1.17.0, numpy 2.2.6): ONNX Runtime's
// RNN, GRU (linear_before_reset=1), LSTM and Conv on the weights below given in PyTorch's layout,
// which the script reorders into ONNX's gate order. Every input is fill() of its index.

// RNN(3, 4) tanh, T 3, N 2: output, h_n: (3, 2, 4) + (1, 2, 4)
const std::vector<double> kRNNKnown = {
    0.93055439,   -0.419436455,  -0.804563284, -0.0951809287, 0.162255526,  0.120498538,
    -0.412522614, -0.789521575,  0.911443353,  -0.384741366,  -0.98068881,  0.0547732115,
    0.870648026,  -0.328151643,  -0.589158893, -0.935240805,  0.725435376,  -0.0244563222,
    -0.985036016, -0.195323229,  0.964165449,  -0.743126094,  -0.860068917, -0.846297204,
    0.725435376,  -0.0244563222, -0.985036016, -0.195323229,  0.964165449,  -0.743126094,
    -0.860068917, -0.846297204};
// GRU(3, 4) bidirectional, T 3, N 2: output, h_n: (3, 2, 8) + (2, 2, 4)
const std::vector<double> kGRUKnown = {
    0.154695064,   0.110237844,  0.166408107,    0.284725338,   -0.0963419527,  0.28187567,
    -0.582887232,  -0.416043997, -0.0413372144,  0.0679525882,  0.501396,       -0.308119595,
    0.846951067,   -0.577606797, -0.746095419,   0.325210929,   0.179907173,    0.23437947,
    0.108116053,   0.450082064,  -0.0872348696,  -0.0415439829, -0.317498893,   -0.425838053,
    -0.226112112,  0.0765007436, 0.713673234,    -0.478554517,  0.672987998,    -0.219209269,
    -0.669203162,  0.337952256,  0.00953570753,  0.490601718,   -0.00454666466, 0.360167116,
    -0.0252186507, -0.212266624, 0.0336483531,   -0.375694096,  -0.0480496362,  -0.00278746709,
    0.753432512,   -0.424569756, 0.306819111,    0.163389757,   -0.525529683,   0.225560308,
    0.00953570753, 0.490601718,  -0.00454666466, 0.360167116,   -0.0480496362,  -0.00278746709,
    0.753432512,   -0.424569756, -0.0963419527,  0.28187567,    -0.582887232,   -0.416043997,
    0.846951067,   -0.577606797, -0.746095419,   0.325210929};
// LSTM(3, 4), T 4, N 2: output, h_n, c_n: (4, 2, 4) + (1, 2, 4) + (1, 2, 4)
const std::vector<double> kLSTMKnown = {
    0.0335448198, 0.0707685128,  0.0604446605,  0.0624172688,  -0.093500182,  0.140850976,
    0.163666844,  -0.131999999,  0.0416815095,  0.196711645,   0.0784441307,  0.106111251,
    -0.194773242, 0.232670888,   0.250079006,   -0.186398163,  -0.0288691018, 0.242183685,
    0.0493377447, 0.0719633996,  -0.0698149204, 0.209258318,   0.275554359,   -0.176772475,
    -0.191757187, 0.248165488,   0.0740642324,  -0.0378529727, 0.0313001238,  0.158794776,
    0.278840095,  -0.0237890296, -0.191757187,  0.248165488,   0.0740642324,  -0.0378529727,
    0.0313001238, 0.158794776,   0.278840095,   -0.0237890296, -0.501246691,  1.04307592,
    0.0944532156, -0.060492631,  0.157729536,   0.250833035,   0.45710212,    -0.0451575331};
// Conv1d(2, 3, 3, stride 2, padding 1), N 2, L 7: (2, 3, 4)
const std::vector<double> kConv1dKnown = {
    0.667992949, 0.087683171,  -0.106622666,  0.635828793, 0.644261122, 0.882873297,
    0.142552525, 0.135621756,  -0.404295743,  0.2017629,   0.31618011,  -0.427019298,
    0.673553586, 0.0711743832, -0.0949234068, 0.635434508, 0.656698465, 0.875214815,
    0.130392343, 0.146374285,  -0.408514321,  0.217445239, 0.303168535, -0.42546469};

// scale * sin(freq * i + phase) for i = 0 .. n-1, as tools/rnn_reference.py's value().
std::vector<double> fill(int64_t n, double scale, double freq, double phase) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(scale * std::sin(freq * double(i) + phase));
  return v;
}

// The parameters of a one-layer recurrent layer, by PyTorch's names, filled as the script fills
// them: parameter k (in PyTorch's order, the reverse direction's from 4) is fill(.., 0.5, 1.3,
// 0.7 k).
void load_filled(Module& m, int64_t gates, int64_t input, int64_t hidden, bool bidirectional) {
  StateDict sd;
  const int64_t rows = gates * hidden;
  for (int64_t d = 0; d < (bidirectional ? 2 : 1); ++d) {
    const std::string sfx = d ? "_l0_reverse" : "_l0";
    const double k = 4.0 * double(d);
    sd["weight_ih" + sfx] = tensor(fill(rows * input, 0.5, 1.3, 0.7 * k), {rows, input});
    sd["weight_hh" + sfx] = tensor(fill(rows * hidden, 0.5, 1.3, 0.7 * (k + 1)), {rows, hidden});
    sd["bias_ih" + sfx] = tensor(fill(rows, 0.5, 1.3, 0.7 * (k + 2)));
    sd["bias_hh" + sfx] = tensor(fill(rows, 0.5, 1.3, 0.7 * (k + 3)));
  }
  m.load_state_dict(sd);
}

std::vector<double> joined(const std::vector<Tensor>& ts) {
  std::vector<double> out;
  for (const Tensor& t : ts) {
    const std::vector<double> v = values(t);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST_CASE("RNN, GRU, LSTM, Conv1d: known values from ONNX Runtime, weights in PyTorch's layout") {
  const double tol = 2e-6;  // ONNX Runtime computed in float32
  auto input = [](int64_t t, int64_t n, int64_t i) {
    return tensor(fill(t * n * i, 1, 0.9, 0.3), {t, n, i});
  };
  {
    RNN rnn(3, 4);
    load_filled(rnn, 1, 3, 4, false);
    auto [y, h_n] = rnn(input(3, 2, 3), tensor(fill(8, 0.3, 2.1, 0.5), {1, 2, 4}));
    CHECK(differences(joined({y, h_n}), kRNNKnown, tol, tol) == "");
  }
  {
    GRU gru(GRUOptions(3, 4).bidirectional(true));
    load_filled(gru, 3, 3, 4, true);
    auto [y, h_n] = gru(input(3, 2, 3), tensor(fill(16, 0.3, 2.1, 0.5), {2, 2, 4}));
    CHECK(differences(joined({y, h_n}), kGRUKnown, tol, tol) == "");
  }
  {
    LSTM lstm(3, 4);
    load_filled(lstm, 4, 3, 4, false);
    auto [y, state] = lstm(input(4, 2, 3), LSTM::State{tensor(fill(8, 0.3, 2.1, 0.5), {1, 2, 4}),
                                                       tensor(fill(8, 0.2, 1.7, 1.1), {1, 2, 4})});
    CHECK(differences(joined({y, std::get<0>(state), std::get<1>(state)}), kLSTMKnown, tol, tol) ==
          "");
  }
  {
    Conv1d conv(2, 3, 3, 2, 1);
    conv.load_state_dict({{"weight", tensor(fill(18, 0.5, 1.3, 0), {3, 2, 3})},
                          {"bias", tensor(fill(3, 0.5, 1.3, 0.7))}});
    Tensor y = conv(tensor(fill(28, 1, 0.9, 0.3), {2, 2, 7}));
    CHECK(y.sizes() == Shape{2, 3, 4});
    CHECK(differences(values(y), kConv1dKnown, tol, tol) == "");
  }
}

// ---- Batch norm ----

// Per-channel mean and variances of x (N, C, *) values, in doubles.
struct Stats {
  std::vector<double> mean, biased, unbiased;
};
Stats channel_stats(const std::vector<double>& x, int64_t n, int64_t c, int64_t inner) {
  Stats s;
  const double count = static_cast<double>(n * inner);
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) sum += x[(i * c + ch) * inner + j];
    const double m = sum / count;
    double sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const double d = x[(i * c + ch) * inner + j] - m;
        sq += d * d;
      }
    s.mean.push_back(m);
    s.biased.push_back(sq / count);
    s.unbiased.push_back(sq / (count - 1));
  }
  return s;
}

TEST_CASE(
    "BatchNorm: training normalizes by the batch and updates the running statistics as "
    "PyTorch does") {
  for (std::optional<double> momentum :
       {std::optional<double>(0.1), std::optional<double>(0.3), std::optional<double>()}) {
    INFO("momentum " << (momentum ? std::to_string(*momentum) : "None"));
    BatchNorm1d bn(BatchNormOptions(3).momentum(momentum));
    bn.to(DType::f64);
    {
      NoGradGuard ng;
      bn.weight.copy_(tensor({1.5, -0.5, 2}, f64));
      bn.bias.copy_(tensor({0.1, 0.2, -0.3}, f64));
    }
    std::vector<double> rm(3, 0.0), rv(3, 1.0);
    for (int step = 1; step <= 3; ++step) {
      Tensor x = randn({4, 3, 5}, f64) * step + step;
      const std::vector<double> xv = values(x);
      const Stats st = channel_stats(xv, 4, 3, 5);
      Tensor y = bn(x);
      std::vector<double> want(xv.size());
      const std::vector<double> w{1.5, -0.5, 2}, b{0.1, 0.2, -0.3};
      for (size_t i = 0; i < xv.size(); ++i) {
        const size_t ch = (i / 5) % 3;
        want[i] = (xv[i] - st.mean[ch]) / std::sqrt(st.biased[ch] + 1e-5) * w[ch] + b[ch];
      }
      check_tensor(y, {4, 3, 5}, DType::f64, want, 1e-12, 1e-12);
      const double f = momentum ? *momentum : 1.0 / step;
      for (size_t ch = 0; ch < 3; ++ch) {
        rm[ch] = (1 - f) * rm[ch] + f * st.mean[ch];
        rv[ch] = (1 - f) * rv[ch] + f * st.unbiased[ch];
      }
      check_tensor(bn.running_mean, {3}, DType::f64, rm, 1e-12, 1e-12);
      check_tensor(bn.running_var, {3}, DType::f64, rv, 1e-12, 1e-12);
      check_tensor(bn.num_batches_tracked, {}, DType::i64, {double(step)});
    }
    // Evaluation mode normalizes with the running statistics and leaves them as they are.
    bn.eval();
    Tensor x = randn({2, 3, 5}, f64);
    const std::vector<double> xv = values(x);
    std::vector<double> want(xv.size());
    const std::vector<double> w{1.5, -0.5, 2}, b{0.1, 0.2, -0.3};
    for (size_t i = 0; i < xv.size(); ++i) {
      const size_t ch = (i / 5) % 3;
      want[i] = (xv[i] - rm[ch]) / std::sqrt(rv[ch] + 1e-5) * w[ch] + b[ch];
    }
    check_tensor(bn(x), {2, 3, 5}, DType::f64, want, 1e-12, 1e-12);
    check_tensor(bn.running_mean, {3}, DType::f64, rm, 1e-12, 1e-12);
    check_tensor(bn.num_batches_tracked, {}, DType::i64, {3});
  }
}

TEST_CASE("BatchNorm: buffers are state but not parameters; affine and track_running_stats") {
  BatchNorm2d bn(4);
  std::vector<std::string> params, buffers;
  for (const auto& [name, t] : bn.named_parameters()) params.push_back(name);
  for (const auto& [name, t] : bn.named_buffers()) buffers.push_back(name);
  CHECK(params == std::vector<std::string>{"weight", "bias"});
  CHECK(buffers == std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"});
  const StateDict sd = bn.state_dict();
  CHECK(sd.size() == 5);
  CHECK(sd.at("num_batches_tracked").dtype() == DType::i64);
  CHECK(sd.at("num_batches_tracked").dim() == 0);
  check_tensor(bn.running_var, {4}, DType::f32, {1, 1, 1, 1});
  CHECK_FALSE(bn.running_mean.requires_grad());
  // A PyTorch state dict loads by name, buffers included.
  StateDict loaded = {{"weight", full({4}, 2.0)},
                      {"bias", full({4}, 1.0)},
                      {"running_mean", full({4}, 0.5)},
                      {"running_var", full({4}, 4.0)},
                      {"num_batches_tracked", scalar(int64_t(7))}};
  bn.load_state_dict(loaded);
  bn.eval();
  check_tensor(bn(full({1, 4, 1, 1}, 2.5)), {1, 4, 1, 1}, DType::f32,
               std::vector<double>(4, (2.5 - 0.5) / std::sqrt(4 + 1e-5) * 2 + 1), 1e-6);
  // to(f64) converts the floating buffers and keeps the count an integer.
  bn.to(DType::f64);
  CHECK(bn.running_mean.dtype() == DType::f64);
  CHECK(bn.num_batches_tracked.dtype() == DType::i64);
  bn.reset_parameters();
  check_tensor(bn.num_batches_tracked, {}, DType::i64, {0});
  check_tensor(bn.weight, {4}, DType::f64, {1, 1, 1, 1});

  BatchNorm1d plain(3, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  CHECK(plain.state_dict().empty());
  CHECK_FALSE(plain.running_mean.defined());
  // Without running statistics, evaluation mode normalizes by the batch too.
  plain.eval();
  Tensor x = randn({6, 3});
  Tensor y = plain(x);
  check_tensor(mean(y, {0}), {3}, DType::f32, {0, 0, 0}, 0, 1e-5);
  CHECK(plain.name() ==
        "BatchNorm1d(3, eps=1e-05, momentum=0.1, affine=false, track_running_stats=false)");
}

TEST_CASE(
    "BatchNorm compiled: a training step writes the buffers back, as eager does, step "
    "after step; evaluation reads them") {
  auto make = [] {
    manual_seed(21);
    return Sequential(Conv2d(2, 3, 3, 1, 1), BatchNorm2d(3), ReLU(), Flatten(), Linear(3 * 16, 2));
  };
  Sequential eager = make(), compiled = make();
  auto train_step = [](Sequential& net, const Tensor& x, const Tensor& target) {
    net.zero_grad();
    Tensor loss = mse_loss(net(x), target);
    loss.backward();
    NoGradGuard ng;
    for (Tensor p : net.parameters()) p.sub_(p.grad() * 0.1);
    return loss.detach();
  };
  CompileOptions o;
  o.dynamic = {{0, 0}, {1, 0}};
  auto step = compile([&](Tensor x, Tensor t) { return train_step(compiled, x, t); }, o);
  auto& bn_e = eager.at<BatchNorm2d>(1);
  auto& bn_c = compiled.at<BatchNorm2d>(1);
  for (int i = 0; i < 5; ++i) {
    const int64_t n = i % 2 ? 6 : 4;  // two batch sizes, one trace
    Tensor x = randn({n, 2, 4, 4}) * 2 + 1, t = randn({n, 2});
    Tensor le = train_step(eager, x, t);
    Tensor lc = step(x, t);
    CHECK(close(lc, le, 1e-5));
    CHECK(close(bn_c.running_mean, bn_e.running_mean, 1e-5));
    CHECK(close(bn_c.running_var, bn_e.running_var, 1e-5));
    CHECK(bitwise_equal(bn_c.num_batches_tracked, bn_e.num_batches_tracked));
  }
  check_tensor(bn_c.num_batches_tracked, {}, DType::i64, {5});
  CHECK(step.stats().traces == 1);
  // The statistics moved away from their start (zeros and ones).
  CHECK(values(bn_c.running_mean) != std::vector<double>(3, 0.0));
  for (size_t k = 0; k < eager.parameters().size(); ++k)
    CHECK(close(compiled.parameters()[k], eager.parameters()[k], 1e-4));
  // Evaluation mode, compiled apart from the training step: the running statistics, read at
  // every call (a change of the buffers is seen by the next call).
  eager.eval();
  compiled.eval();
  auto eval_fwd = compile([&](Tensor x) { return compiled(x); });
  Tensor x = randn({3, 2, 4, 4});
  CHECK(close(eval_fwd(x), eager(x), 1e-5));
  {
    NoGradGuard ng;
    bn_c.running_mean.add_(1);
    bn_e.running_mean.add_(1);
  }
  CHECK(close(eval_fwd(x), eager(x), 1e-5));
  CHECK(eval_fwd.stats().traces == 1);
  check_tensor(bn_c.num_batches_tracked, {}, DType::i64, {5});
}

TEST_CASE("BatchNorm: train() and eval() reach a batch norm inside containers") {
  Sequential net(Linear(3, 4), BatchNorm1d(4));
  ModuleList list(net, BatchNorm1d(2));
  list.eval();
  CHECK_FALSE(net.at<BatchNorm1d>(1).is_training());
  CHECK_FALSE(list.at<BatchNorm1d>(1).is_training());
  Tensor x = randn({5, 3});
  net(x);
  check_tensor(net.at<BatchNorm1d>(1).num_batches_tracked, {}, DType::i64, {0});
  list.train();
  net(x);
  check_tensor(net.at<BatchNorm1d>(1).num_batches_tracked, {}, DType::i64, {1});
}

TEST_CASE("BatchNorm: errors name the layer and the input") {
  BatchNorm2d bn(3);
  std::string e = error_of<ShapeError>([&] { bn(randn({2, 4, 3, 3})); });
  CHECK(contains(e, "[BatchNorm2d] input must be (N, C, H, W) with C = num_features = 3"));
  CHECK(contains(e, "(2, 4, 3, 3)"));
  e = error_of<ShapeError>([&] { BatchNorm1d(3)(randn({2, 3, 4, 5})); });
  CHECK(contains(e, "[BatchNorm1d] input must be (N, C) or (N, C, L)"));
  e = error_of<ValueError>([&] { BatchNorm1d(3)(randn({1, 3})); });
  CHECK(contains(e, "[BatchNorm1d] expected more than 1 value per channel when training"));
  e = error_of<ValueError>([] { BatchNorm1d(0); });
  CHECK(contains(e, "[BatchNorm1d]"));
  e = error_of<ValueError>([] { BatchNorm2d(3, 1e-5, 1.5); });
  CHECK(contains(e, "momentum in [0, 1]"));
  // One value per channel is fine in evaluation mode.
  BatchNorm1d one(3);
  one.eval();
  CHECK(one(randn({1, 3})).sizes() == Shape{1, 3});
}

// ---- Conv1d, Identity ----

TEST_CASE("Conv1d: a direct loop over positions, with stride, padding, bias, groups, dilation") {
  struct Case {
    int64_t k, stride, padding;
    bool bias;
    int64_t groups = 1, dilation = 1;
  };
  for (Case cs : {Case{3, 1, 0, true}, Case{3, 2, 1, false}, Case{1, 1, 0, true},
                  Case{4, 3, 2, true}, Case{5, 1, 2, true}, Case{2, 1, 1, true, 2},
                  Case{3, 2, 2, false, 1, 2}, Case{2, 1, 0, true, 2, 3}}) {
    INFO("k " << cs.k << " stride " << cs.stride << " padding " << cs.padding << " groups "
              << cs.groups << " dilation " << cs.dilation);
    manual_seed(31);
    const int64_t n = 2, c = 2, len = 7, o = 4, cg = c / cs.groups, og = o / cs.groups;
    Conv1d conv(c, o, cs.k, cs.stride, cs.padding, cs.bias, cs.groups, cs.dilation);
    conv.to(DType::f64);
    CHECK(conv.weight.sizes() == Shape{o, cg, cs.k});
    Tensor x = randn({n, c, len}, f64);
    const std::vector<double> xv = values(x), wv = values(conv.weight);
    const std::vector<double> bv = cs.bias ? values(conv.bias) : std::vector<double>(o, 0.0);
    const int64_t lo = (len + 2 * cs.padding - cs.dilation * (cs.k - 1) - 1) / cs.stride + 1;
    std::vector<double> want;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t oc = 0; oc < o; ++oc)
        for (int64_t p = 0; p < lo; ++p) {
          double acc = bv[oc];
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t j = 0; j < cs.k; ++j) {
              const int64_t at = p * cs.stride + j * cs.dilation - cs.padding;
              const int64_t channel = oc / og * cg + ic;
              if (at >= 0 && at < len)
                acc += wv[(oc * cg + ic) * cs.k + j] * xv[(i * c + channel) * len + at];
            }
          want.push_back(acc);
        }
    check_tensor(conv(x), {n, o, lo}, DType::f64, want, 1e-12, 1e-12);
    // Unbatched (C, L): the first sample's result without the batch dim.
    std::vector<double> first(want.begin(), want.begin() + o * lo);
    check_tensor(conv(squeeze(slice(x, 0, 0, 1), 0)), {o, lo}, DType::f64, first, 1e-12, 1e-12);
  }
  // Compiled with a symbolic batch: one trace.
  Conv1d c1(2, 3, 3, 2, 1);
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([&](Tensor x) { return c1(x); }, o);
  for (int64_t n : {2, 5}) {
    Tensor x = randn({n, 2, 9});
    CHECK(close(f(x), c1(x), 1e-5));
  }
  CHECK(f.stats().traces == 1);
  Conv1d conv(4, 6, 3);
  CHECK(conv.weight.sizes() == Shape{6, 4, 3});
  CHECK(conv.name() == "Conv1d(4, 6, kernel_size=3, stride=1, padding=0)");
  const double bound = 1 / std::sqrt(12.0);
  for (double v : values(conv.weight)) CHECK(std::abs(v) <= bound);
  std::string e = error_of<ShapeError>([&] { conv(randn({2, 5, 8})); });
  CHECK(contains(e, "[Conv1d] input must be (N, 4, L)"));
  e = error_of<ShapeError>([&] { conv(randn({2, 4, 2})); });
  CHECK(contains(e, "[Conv1d] kernel_size 3 is larger than the padded input length 2"));
  e = error_of<ValueError>([] { Conv1d(1, 1, 0); });
  CHECK(contains(e, "[Conv1d]"));
}

TEST_CASE("Conv1d's padding modes and padding same, and the 1-D poolings, as their functions") {
  manual_seed(37);
  Tensor x = randn({2, 4, 9});
  // padding_mode pads x in that mode, then convolves unpadded; "same" keeps the length.
  Conv1d circ(4, 6, 3, 1, 2, true, 2, 2, "circular");
  CHECK(circ.name() ==
        "Conv1d(4, 6, kernel_size=3, stride=1, padding=2, dilation=2, groups=2, "
        "padding_mode='circular')");
  CHECK(bitwise_equal(circ(x),
                      conv1d(pad(x, {2, 2}, "circular"), circ.weight, circ.bias, 1, 0, 2, 2)));
  Conv1d refl(4, 3, 2, 2, 1, false, 1, 1, "reflect");
  CHECK(bitwise_equal(refl(x), conv1d(pad(x, {1, 1}, "reflect"), refl.weight, {}, 2)));
  Conv1d same(4, 3, 4, 1, kSame);  // an even kernel: 1 before, 2 after
  CHECK(same.name() == "Conv1d(4, 3, kernel_size=4, stride=1, padding=same)");
  CHECK(same(x).sizes() == Shape{2, 3, 9});
  CHECK(bitwise_equal(same(x), conv1d(pad(x, {1, 2}), same.weight, same.bias)));
  CHECK(bitwise_equal(same(x), conv1d(x, same.weight, same.bias, 1, kSame)));
  Conv1d same_rep(4, 3, 3, 1, kSame, true, 1, 3, "replicate");
  CHECK(bitwise_equal(same_rep(x), conv1d(pad(x, {3, 3}, "replicate"), same_rep.weight,
                                          same_rep.bias, 1, 0, 1, 3)));
  CHECK(contains(error_of<ValueError>([] { Conv1d(4, 3, 3, 2, kSame); }),
                 "[Conv1d] padding \"same\" needs stride 1, got 2"));
  CHECK(contains(error_of<ValueError>([] { Conv1d(4, 3, 3, 1, 0, true, 3); }),
                 "[Conv1d] in_channels (4) and out_channels (3) must be divisible by groups (3)"));
  CHECK(contains(error_of<ValueError>([] { Conv1d(4, 3, 3, 1, 0, true, 1, 1, "edge"); }),
                 "[Conv1d] padding_mode must be"));
  // Each pooling argument reaches the function, in PyTorch's order.
  CHECK(bitwise_equal(MaxPool1d(3, 2, 1, 2, true)(x), max_pool1d(x, 3, 2, 1, 2, true)));
  CHECK(MaxPool1d(3, 0, 1).name() == "MaxPool1d(kernel_size=3, stride=3, padding=1)");
  CHECK(bitwise_equal(AvgPool1d(3, 2, 1, true, false)(x), avg_pool1d(x, 3, 2, 1, true, false)));
  CHECK(AvgPool1d(2).name() == "AvgPool1d(kernel_size=2, stride=2)");
  CHECK(AvgPool1d(2)(x).sizes() == Shape{2, 4, 4});
  CHECK(bitwise_equal(AdaptiveAvgPool1d(4)(x), adaptive_avg_pool1d(x, 4)));
  CHECK(bitwise_equal(AdaptiveMaxPool1d(3)(x[0]), adaptive_max_pool1d(x[0], 3)));
  CHECK(close(AdaptiveAvgPool1d(1)(x), mean(x, Dims{2}, true), 1e-6));
  // The 1-D ops are the 2-D ones over a height of 1.
  CHECK(bitwise_equal(max_pool1d(x, 3, 2, 1),
                      squeeze(max_pool2d(unsqueeze(x, 2), {1, 3}, {1, 2}, {0, 1}), 2)));
  CHECK(contains(error_of<ValueError>([] { MaxPool1d(0); }),
                 "[MaxPool1d] kernel_size and dilation must be positive"));
  CHECK(contains(error_of<ValueError>([] { AvgPool1d(2, -1); }), "[AvgPool1d]"));
  CHECK(contains(error_of<ValueError>([] { AdaptiveMaxPool1d(0); }),
                 "[AdaptiveMaxPool1d] output_size must be positive"));
  // avg_pool2d's divisor_override through AvgPool2d.
  Tensor img = randn({1, 2, 4, 4});
  CHECK(AvgPool2d(2, 0, 0, false, true, 3).name() ==
        "AvgPool2d(kernel_size=2, stride=2, divisor_override=3)");
  CHECK(close(AvgPool2d(2, 0, 0, false, true, 3)(img), avg_pool2d(img, 2) * (4.0 / 3.0), 1e-6));
  CHECK(contains(error_of<ValueError>([] { AvgPool2d(2, 0, 0, false, true, -2); }),
                 "[AvgPool2d] divisor_override must be positive (0: none), got -2"));
}

TEST_CASE("Conv3d and the 3-D poolings: names, padding modes and same, as their functions") {
  manual_seed(41);
  Tensor x = randn({2, 4, 5, 4, 6});
  Conv3d conv(4, 6, {3, 2, 1}, {2, 1, 1}, {1, 0, 0}, true, 2, {1, 2, 1});
  CHECK(conv.name() ==
        "Conv3d(4, 6, kernel_size=(3, 2, 1), stride=(2, 1, 1), padding=(1, 0, 0), dilation=(1, 2, "
        "1), groups=2)");
  CHECK(conv.weight.sizes() == Shape{6, 2, 3, 2, 1});
  CHECK(bitwise_equal(conv(x),
                      conv3d(x, conv.weight, conv.bias, {2, 1, 1}, {1, 0, 0}, 2, {1, 2, 1})));
  // padding_mode pads x (W, H, then D) in that mode first; "same" keeps the size.
  Conv3d refl(4, 3, 3, 1, {1, 0, 2}, false, 1, 1, "reflect");
  CHECK(bitwise_equal(refl(x), conv3d(pad(x, {2, 2, 0, 0, 1, 1}, "reflect"), refl.weight)));
  Conv3d same(4, 3, {2, 3, 4}, 1, kSame);  // even kernels: the odd pad after
  CHECK(same.name() == "Conv3d(4, 3, kernel_size=(2, 3, 4), stride=1, padding=same)");
  CHECK(same(x).sizes() == Shape{2, 3, 5, 4, 6});
  CHECK(bitwise_equal(same(x), conv3d(pad(x, {1, 2, 1, 1, 0, 1}), same.weight, same.bias)));
  Conv3d circ(4, 2, 3, 1, kSame, true, 1, 1, "circular");
  CHECK(bitwise_equal(circ(x[0]),
                      conv3d(pad(x[0], {1, 1, 1, 1, 1, 1}, "circular"), circ.weight, circ.bias)));
  CHECK(contains(error_of<ValueError>([] { Conv3d(4, 3, 3, 2, kSame); }),
                 "[Conv3d] padding \"same\" needs stride 1, got 2"));
  CHECK(contains(error_of<ValueError>([] { Conv3d(4, 3, 3, 1, 0, true, 3); }),
                 "[Conv3d] in_channels (4) and out_channels (3) must be divisible by groups (3)"));
  CHECK(contains(error_of<ValueError>([] { Conv3d(4, 3, 3, 1, 0, true, 1, 1, "edge"); }),
                 "[Conv3d] padding_mode must be"));
  CHECK(contains(error_of<ValueError>([] {
                   Conv3d(4, 3, {3, 0, 3});
                 }),
                 "[Conv3d] channels, kernel_size, stride, dilation and groups must be positive"));
  CHECK(contains(error_of<ShapeError>([&] { Conv3d(3, 2, 2)(x); }),
                 "[Conv3d] input must be (N, 3, D, H, W) or unbatched (3, D, H, W)"));
  // ConvTranspose3d: PyTorch's weight layout and argument order; an output size picks the
  // output padding.
  ConvTranspose3d up(4, 2, {2, 3, 2}, 2, {0, 1, 0}, {1, 0, 0}, 2, true, 1);
  CHECK(up.name() ==
        "ConvTranspose3d(4, 2, kernel_size=(2, 3, 2), stride=2, padding=(0, 1, 0), "
        "output_padding=(1, 0, 0), groups=2)");
  CHECK(up.weight.sizes() == Shape{4, 1, 2, 3, 2});
  CHECK(bitwise_equal(up(x), conv_transpose3d(x, up.weight, up.bias, 2, {0, 1, 0}, {1, 0, 0}, 2)));
  CHECK(up(x).sizes() == Shape{2, 2, 11, 7, 12});
  CHECK(bitwise_equal(up.forward(x, {10, 8, 13}),
                      conv_transpose3d(x, up.weight, up.bias, 2, {0, 1, 0}, {0, 1, 1}, 2)));
  CHECK(
      contains(error_of<ValueError>([&] {
                 up.forward(x, {12, 7, 12});
               }),
               "[ConvTranspose3d] output size (12, 7, 12): its depth 12 is not between 10 and 11"));
  CHECK(contains(error_of<ValueError>([] { ConvTranspose3d(4, 2, 3, 1, 0, 1); }),
                 "[ConvTranspose3d] output_padding must be non-negative and below the stride or "
                 "the dilation"));
  // Each pooling argument reaches the function, in PyTorch's order.
  CHECK(bitwise_equal(MaxPool3d({3, 2, 2}, {2, 1, 2}, {1, 1, 0}, {1, 1, 2}, true)(x),
                      max_pool3d(x, {3, 2, 2}, {2, 1, 2}, {1, 1, 0}, {1, 1, 2}, true)));
  CHECK(MaxPool3d(2, 0, {1, 0, 1}).name() ==
        "MaxPool3d(kernel_size=2, stride=2, padding=(1, 0, 1))");
  CHECK(
      bitwise_equal(AvgPool3d(3, 2, 1, true, false, 4)(x), avg_pool3d(x, 3, 2, 1, true, false, 4)));
  CHECK(AvgPool3d(Size3{1, 2, 2}).name() == "AvgPool3d(kernel_size=(1, 2, 2), stride=(1, 2, 2))");
  CHECK(AvgPool3d(2)(x).sizes() == Shape{2, 4, 2, 2, 3});
  CHECK(bitwise_equal(AdaptiveAvgPool3d({2, 3, 4})(x), adaptive_avg_pool3d(x, {2, 3, 4})));
  CHECK(bitwise_equal(AdaptiveMaxPool3d(2)(x[1]), adaptive_max_pool3d(x[1], 2)));
  CHECK(close(AdaptiveAvgPool3d(1)(x), mean(x, Dims{2, 3, 4}, true), 1e-6));
  CHECK(close(AdaptiveMaxPool3d(1)(x), amax(x, Dims{2, 3, 4}, true), 0));
  CHECK(contains(error_of<ValueError>([] { MaxPool3d(2, -1); }),
                 "[MaxPool3d] kernel_size and dilation must be positive"));
  CHECK(contains(error_of<ValueError>([] {
                   AdaptiveAvgPool3d({1, 0, 1});
                 }),
                 "[AdaptiveAvgPool3d] output_size must be positive, got (1, 0, 1)"));
  CHECK(contains(error_of<ValueError>([] { AvgPool3d(2, 0, 0, false, true, -2); }),
                 "[AvgPool3d] divisor_override must be positive (0: none), got -2"));
}

TEST_CASE("activation layers, GroupNorm and RMSNorm: their functions, names and parameters") {
  manual_seed(41);
  Tensor x = randn({2, 6, 4});
  // Each layer is its function, with PyTorch's printed name.
  const std::vector<std::tuple<std::shared_ptr<Module>, Tensor, std::string>> layers = {
      {std::make_shared<LeakyReLU>(0.2), leaky_relu(x, 0.2), "LeakyReLU(negative_slope=0.2)"},
      {std::make_shared<ELU>(0.5), elu(x, 0.5), "ELU(alpha=0.5)"},
      {std::make_shared<SELU>(), selu(x), "SELU()"},
      {std::make_shared<CELU>(2), celu(x, 2), "CELU(alpha=2)"},
      {std::make_shared<Hardtanh>(-2, 1), hardtanh(x, -2, 1), "Hardtanh(min_val=-2, max_val=1)"},
      {std::make_shared<ReLU6>(), relu6(x), "ReLU6()"},
      {std::make_shared<Hardsigmoid>(), hardsigmoid(x), "Hardsigmoid()"},
      {std::make_shared<Hardswish>(), hardswish(x), "Hardswish()"},
      {std::make_shared<Mish>(), mish(x), "Mish()"},
      {std::make_shared<GLU>(1), glu(x, 1), "GLU(dim=1)"},
      {std::make_shared<Softmax>(1), softmax(x, 1), "Softmax(dim=1)"},
      {std::make_shared<LogSoftmax>(-1), log_softmax(x, -1), "LogSoftmax(dim=-1)"},
  };
  for (const auto& [m, want, name] : layers) {
    CAPTURE(name);
    CHECK(m->name() == name);
    CHECK(bitwise_equal((*m)(x), want));
    CHECK(m->parameters().empty());
  }
  // PReLU: one learned slope per channel (or one), starting at init.
  PReLU pr(6, 0.1);
  CHECK(pr.name() == "PReLU(num_parameters=6)");
  check_tensor(pr.weight, {6}, DType::f32, std::vector<double>(6, 0.1), 1e-7, 0);
  CHECK(bitwise_equal(pr(x), prelu(x, pr.weight)));
  CHECK(pr.state_dict().count("weight") == 1);
  // GroupNorm: one group is layer_norm over (C, L); C groups normalize each channel alone.
  GroupNorm one(1, 6), each(6, 6, 1e-3, false);
  CHECK(one.name() == "GroupNorm(1, 6, eps=1e-05, affine=true)");
  CHECK(each.parameters().empty());
  CHECK(close(one(x), layer_norm(x, {6, 4}), 1e-5));
  CHECK(close(each(x), (x - mean(x, Dims{2}, true)) / sqrt(var(x, Dims{2}, 0, true) + 1e-3), 1e-5));
  CHECK(one.weight.sizes() == Shape{6});
  CHECK(one.bias.sizes() == Shape{6});
  // RMSNorm: weight ones over normalized_shape; eps None is the dtype's machine epsilon.
  RMSNorm rms(Shape{4});
  CHECK(rms.name() == "RMSNorm((4), eps=None, elementwise_affine=true)");
  CHECK(rms.weight.sizes() == Shape{4});
  CHECK(close(rms(x), x * rsqrt(mean(x * x, Dims{2}, true) + 1.1920928955078125e-07), 1e-6));
  CHECK(RMSNorm(Shape{6, 4}, 1e-6, false).parameters().empty());
  const Tensor xd = x.to(DType::f64);
  CHECK(close(rms_norm(xd, {4}), xd * rsqrt(mean(xd * xd, Dims{2}, true) + 2.220446049250313e-16),
              1e-12));
  // InstanceNorm: a group per channel; unbatched is the batch of one.
  InstanceNorm1d inst(6);
  CHECK(inst.name() ==
        "InstanceNorm1d(6, eps=1e-05, momentum=0.1, affine=false, track_running_stats=false)");
  CHECK(inst.parameters().empty());
  CHECK(bitwise_equal(inst(x), group_norm(x, 6)));
  CHECK(bitwise_equal(inst(x[1]), group_norm(x, 6)[1]));
  InstanceNorm2d inst2(6, 1e-3, 0.1, true);
  CHECK(inst2.weight.sizes() == Shape{6});
  const Tensor img = randn({2, 6, 3, 2});
  CHECK(bitwise_equal(inst2(img), group_norm(img, 6, inst2.weight, inst2.bias, 1e-3)));
  // With running statistics: buffers, the training output unchanged, and evaluation by them.
  InstanceNorm2d tracked(6, 1e-3, 0.5, false, true);
  CHECK(tracked.named_buffers().size() == 3);
  CHECK(bitwise_equal(tracked(img), group_norm(img, 6, Tensor(), Tensor(), 1e-3)));
  CHECK(close(tracked.running_mean, 0.5 * mean(img, {0, 2, 3}), 1e-5));
  tracked.eval();
  CHECK(close(tracked(img),
              (img - tracked.running_mean.reshape({6, 1, 1})) *
                  rsqrt(tracked.running_var.reshape({6, 1, 1}) + 1e-3),
              1e-5));
  tracked.train();
  CHECK(contains(error_of<ValueError>([&] {
                   tracked(randn({2, 6, 1, 1}));
                 }),
                 "[InstanceNorm2d] expected more than 1 spatial element when training with "
                 "track_running_stats, got input (2, 6, 1, 1)"));
  CHECK(contains(error_of<ShapeError>([&] { InstanceNorm2d(4)(img); }),
                 "[InstanceNorm2d] input must be 4-D (N, 4, ...) or 3-D unbatched (4, ...), got "
                 "(2, 6, 3, 2)"));
  // Arguments out of range name the layer.
  CHECK(contains(error_of<ValueError>([] { GroupNorm(4, 6); }), "[GroupNorm]"));
  CHECK(contains(error_of<ValueError>([] { RMSNorm(Shape{0}); }), "[RMSNorm]"));
  CHECK(contains(error_of<ValueError>([] { PReLU(0); }), "[PReLU]"));
  CHECK(contains(error_of<ValueError>([] { Hardtanh(1, -1); }),
                 "[Hardtanh] min_val 1 must be at most max_val -1"));
  CHECK(contains(error_of<ValueError>([] { CELU(0); }), "[CELU] alpha must be finite and nonzero"));
  CHECK(contains(error_of<ShapeError>([&] { PReLU(4)(x); }),
                 "[prelu] weight (4) must hold 1 value or one per channel (dim 1 of (2, 6, 4))"));
}

TEST_CASE("loss modules: their functions, names, weights as buffers, and errors") {
  manual_seed(47);
  const Tensor x = randn({4, 5}), y = randn({4, 5});
  const Tensor p = sigmoid(randn({4, 5})), t = rand({4, 5});
  const Tensor lp = log_softmax(randn({4, 5}), 1);
  const Tensor idx = tensor({1, 0, 4, 2}, Options().dtype(DType::i64)).reshape({4});
  const Tensor cw = rand({5}) + 0.5;
  // Each module is its function with the same arguments, and prints as PyTorch's.
  const std::vector<std::tuple<std::shared_ptr<Loss>, Tensor, Tensor, Tensor, std::string>> losses =
      {
          {std::make_shared<MSELoss>(), x, y, mse_loss(x, y), "MSELoss()"},
          {std::make_shared<L1Loss>("sum"), x, y, l1_loss(x, y, "sum"), "L1Loss()"},
          {std::make_shared<SmoothL1Loss>("none", 0.5), x, y, smooth_l1_loss(x, y, "none", 0.5),
           "SmoothL1Loss()"},
          {std::make_shared<HuberLoss>("mean", 0.3), x, y, huber_loss(x, y, "mean", 0.3),
           "HuberLoss()"},
          {std::make_shared<KLDivLoss>("batchmean"), lp, softmax(y, 1),
           kl_div(lp, softmax(y, 1), "batchmean"), "KLDivLoss()"},
          {std::make_shared<KLDivLoss>("sum", true), lp, log_softmax(y, 1),
           kl_div(lp, log_softmax(y, 1), "sum", true), "KLDivLoss()"},
          {std::make_shared<CrossEntropyLoss>(
               CrossEntropyOptions().label_smoothing(0.1).weight(cw)),
           x, idx, cross_entropy(x, idx, CrossEntropyOptions().label_smoothing(0.1).weight(cw)),
           "CrossEntropyLoss()"},
          {std::make_shared<NLLLoss>(cw, 2, "sum"), lp, idx, nll_loss(lp, idx, cw, "sum", 2),
           "NLLLoss()"},
          {std::make_shared<NLLLoss>(), lp, idx, nll_loss(lp, idx), "NLLLoss()"},
          {std::make_shared<BCELoss>(cw), p, t, binary_cross_entropy(p, t, cw), "BCELoss()"},
          {std::make_shared<BCEWithLogitsLoss>(Tensor(), "none", cw), x, t,
           binary_cross_entropy_with_logits(x, t, "none", Tensor(), cw), "BCEWithLogitsLoss()"},
      };
  for (const auto& [m, a, b, want, name] : losses) {
    CAPTURE(name);
    CHECK(m->name() == name);
    CHECK(bitwise_equal((*m)(a, b), want));
    CHECK(m->parameters().empty());
  }
  // A weight is a buffer: in the state dict, and what the loss reads.
  BCEWithLogitsLoss both(cw, "mean", cw * 2);
  CHECK(both.buffers().size() == 2);
  CHECK(both.state_dict().count("weight") == 1);
  CHECK(both.state_dict().count("pos_weight") == 1);
  CrossEntropyLoss ce(CrossEntropyOptions().weight(cw).reduction(Reduction::Sum));
  CHECK(ce.reduction == "sum");
  CHECK(ce.state_dict().count("weight") == 1);
  CHECK(ce.options.weight().is_same(ce.buffers()[0]));
  CHECK(MSELoss().buffers().empty());
  // The binary losses against their formulas: the weights scale each element, pos_weight the
  // positive term along the last dim.
  CHECK(close(binary_cross_entropy(p, t, cw, "none"), -(t * log(p) + (1 - t) * log(1 - p)) * cw,
              1e-5));
  CHECK(close(binary_cross_entropy_with_logits(x, t, "sum", cw, cw * 2),
              -sum((cw * 2 * t * log_sigmoid(x) + (1 - t) * log_sigmoid(-x)) * cw), 1e-4));
  CHECK(close(binary_cross_entropy_with_logits(x, t, "mean"),
              binary_cross_entropy_with_logits(x, t), 1e-6));
  // Logs clamped at -100: probabilities of exactly 0 and 1 give finite losses and gradients.
  const Tensor edge = tensor({0.0, 1.0, 0.0, 1.0}).requires_grad_();
  const Tensor hit = tensor({1.0, 0.0, 0.0, 1.0});
  Tensor l = binary_cross_entropy(edge, hit, Tensor(), "none");
  check_tensor(l, {4}, DType::f32, {100, 100, 0, 0});
  sum(l).backward();
  for (double g : values(edge.grad())) CHECK(std::isfinite(g));
  // The weighted nll_loss's mean divides by the weights of the targets not ignored.
  const Tensor each = nll_loss(lp, idx, cw, "none", 2);
  const std::vector<double> w = values(cw), li = values(idx);
  double denom = 0;
  for (double k : li)
    if (k != 2) denom += w[static_cast<size_t>(k)];
  CHECK(close(nll_loss(lp, idx, cw, "mean", 2), sum(each) / denom, 1e-6));
  // Arguments out of range name the module; bad inputs name the function.
  CHECK(contains(error_of<ValueError>([] { MSELoss("avg"); }),
                 "[MSELoss] reduction must be \"none\", \"mean\" or \"sum\", got \"avg\""));
  CHECK(contains(error_of<ValueError>([] { L1Loss("batchmean"); }), "[L1Loss]"));
  CHECK(KLDivLoss("batchmean").reduction == "batchmean");
  CHECK(contains(error_of<ValueError>([] { SmoothL1Loss("mean", -1); }),
                 "[SmoothL1Loss] beta must be non-negative and finite, got -1"));
  CHECK(contains(error_of<ValueError>([] { HuberLoss("mean", 0); }), "[HuberLoss] delta"));
  CHECK(contains(
      error_of<ValueError>([] { CrossEntropyLoss(CrossEntropyOptions().label_smoothing(2)); }),
      "[CrossEntropyLoss] label_smoothing must be in [0, 1], got 2"));
  CHECK(contains(error_of<ShapeError>([&] { BCELoss(rand({3}))(p, t); }),
                 "[binary_cross_entropy] weight (3) must broadcast to the input's shape (4, 5)"));
  CHECK(contains(error_of<ShapeError>([&] { NLLLoss(rand({3}))(lp, idx); }),
                 "[nll_loss] weight must be 1-D with one element per class: log_probs (4, 5) have "
                 "5 classes, weight has shape (3)"));
  CHECK(contains(
      error_of<DTypeError>([&] {
        BCEWithLogitsLoss(Tensor(), "mean", tensor({1, 2}, Options().dtype(DType::i64)))(x, t);
      }),
      "[binary_cross_entropy_with_logits] pos_weight must be floating, got i64"));
  CHECK(contains(error_of<DTypeError>([&] { BCELoss()(p, t.to(DType::f64)); }),
                 "[binary_cross_entropy] needs a floating input and target of one dtype"));
}

TEST_CASE("margin and likelihood loss modules, PairwiseDistance and CosineSimilarity") {
  manual_seed(71);
  const Tensor a = randn({4, 5}), b = randn({4, 5}), c = randn({4, 5});
  const Tensor y = tensor({1, -1, -1, 1}).reshape({4}),
               y2 = where(gt(randn({4, 5}), 0), 1.0, full({4, 5}, -1.0));
  const Tensor var = rand({4, 1}) + 0.1, counts = floor(rand({4, 5}) * 4);
  CHECK(bitwise_equal(MarginRankingLoss(0.2)(a, b, y2), margin_ranking_loss(a, b, y2, 0.2)));
  CHECK(bitwise_equal(HingeEmbeddingLoss(0.5, "sum")(a, y2),
                      hinge_embedding_loss(a, y2, 0.5, "sum")));
  CHECK(bitwise_equal(SoftMarginLoss("none")(a, y2), soft_margin_loss(a, y2, "none")));
  CHECK(bitwise_equal(CosineEmbeddingLoss(0.1)(a, b, y), cosine_embedding_loss(a, b, y, 0.1)));
  CHECK(bitwise_equal(TripletMarginLoss(0.5, 1, 1e-6, true)(a, b, c),
                      triplet_margin_loss(a, b, c, 0.5, 1, 1e-6, true)));
  CHECK(bitwise_equal(PoissonNLLLoss(true, true)(a, counts),
                      poisson_nll_loss(a, counts, true, true)));
  CHECK(bitwise_equal(GaussianNLLLoss(true)(a, b, var), gaussian_nll_loss(a, b, var, true)));
  CHECK(bitwise_equal(PairwiseDistance(3)(a, b), pairwise_distance(a, b, 3)));
  CHECK(bitwise_equal(CosineSimilarity(0)(a, b), cosine_similarity(a, b, 0)));
  CHECK(TripletMarginLoss().name() == "TripletMarginLoss()");
  CHECK(PairwiseDistance().name() == "PairwiseDistance(p=2, eps=1e-06, keepdim=false)");
  // gaussian_nll_loss: var of one value per row is that value broadcast; a var below eps is
  // clamped in value, and its gradient is var's own.
  CHECK(close(gaussian_nll_loss(a, b, var), gaussian_nll_loss(a, b, expand(var, {4, 5})), 1e-6));
  CHECK(close(gaussian_nll_loss(a, b, var.reshape({4})), gaussian_nll_loss(a, b, var), 1e-6));
  const Tensor tiny = full({4, 5}, 1e-9).requires_grad_();
  const Tensor l = gaussian_nll_loss(a, b, tiny, false, 1e-6, "sum");
  CHECK(close(l, sum(0.5 * (std::log(1e-6) + (a - b) * (a - b) / 1e-6)), 1e-4));
  l.backward();
  CHECK(close(tiny.grad(), 0.5 * (1 / 1e-6 - (a - b) * (a - b) / 1e-12), 1e-4));
  // A loss of three operands called with two (and the other way) names its module.
  CHECK(contains(error_of<ValueError>([&] { TripletMarginLoss()(a, b); }),
                 "[TripletMarginLoss] takes three operands: forward(a, b, c)"));
  CHECK(contains(error_of<ValueError>([&] { SoftMarginLoss()(a, b, c); }),
                 "[SoftMarginLoss] takes two operands: forward(input, target)"));
  CHECK(contains(error_of<ValueError>([] { TripletMarginLoss(0); }),
                 "[TripletMarginLoss] margin must be positive, got 0"));
  CHECK(contains(error_of<ShapeError>([&] { cosine_embedding_loss(a, b, y2); }),
                 "[cosine_embedding_loss] expected inputs (N, D) with a target (N), or (D) with a "
                 "0-d target; got (4, 5) and (4, 5)"));
  CHECK(contains(error_of<ShapeError>([&] { gaussian_nll_loss(a, b, rand({5})); }),
                 "[gaussian_nll_loss] var (5) must have the input's shape (4, 5), or that with its "
                 "last dim 1 or without it"));
  CHECK(contains(error_of<ShapeError>([&] { margin_ranking_loss(a, b, y); }),
                 "[margin_ranking_loss] input1 (4, 5) and target (4) must have the same shape"));
}

TEST_CASE("multi-class and multi-label margin loss modules") {
  manual_seed(73);
  const Tensor x = randn({4, 5}), w = rand({5}) + 0.5;
  const Tensor y = tensor({0, 3, 4, 3}, Options().dtype(DType::i64));
  const Tensor labels = floor(rand({4, 5}) * 2);
  const Tensor rows = tensor({3, 0, -1, 1, 1, 2, 4, 0, 3, 1, -1, 2, 2, 2, 2, 4, 4, -1, 0, 0},
                             Options().dtype(DType::i64))
                          .reshape({4, 5});
  CHECK(bitwise_equal(MultiMarginLoss(2, 0.5, w, "sum")(x, y),
                      multi_margin_loss(x, y, 2, 0.5, w, "sum")));
  CHECK(bitwise_equal(MultiLabelSoftMarginLoss(w)(x, labels),
                      multilabel_soft_margin_loss(x, labels, w)));
  CHECK(bitwise_equal(MultiLabelMarginLoss("none")(x, rows),
                      multilabel_margin_loss(x, rows, "none")));
  CHECK(MultiMarginLoss().name() == "MultiMarginLoss()");
  CHECK(MultiMarginLoss(1, 1, w).named_buffers().size() == 1);
  // One sample (C) with a 0-d target is the first row of a batch of one.
  CHECK(close(multi_margin_loss(x.select(0, 1), y.select(0, 1)),
              multi_margin_loss(x.narrow(0, 1, 1), y.narrow(0, 1, 1)), 1e-6));
  CHECK(close(multilabel_margin_loss(x.select(0, 2), rows.select(0, 2)),
              multilabel_margin_loss(x.narrow(0, 2, 1), rows.narrow(0, 2, 1)), 1e-6));
  // Entries after a row's -1 are not targets: the first row's are classes 3 and 0.
  CHECK(close(
      multilabel_margin_loss(x.narrow(0, 0, 1), rows.narrow(0, 0, 1)),
      multilabel_margin_loss(x.narrow(0, 0, 1),
                             tensor({3, 0, -1, 2, 4}, Options().dtype(DType::i64)).reshape({1, 5})),
      1e-6));
  CHECK(contains(error_of<ValueError>([] { MultiMarginLoss(3); }),
                 "[MultiMarginLoss] p must be 1 or 2, got 3"));
  CHECK(
      contains(error_of<ValueError>([] { MultiLabelMarginLoss("avg"); }), "MultiLabelMarginLoss"));
}

TEST_CASE("EmbeddingBag") {
  manual_seed(79);
  EmbeddingBag bag(6, 3, "sum", false, -1);
  CHECK(bag.name() == "EmbeddingBag(6, 3, mode='sum', padding_idx=5)");
  CHECK(bag.padding_idx == 5);
  CHECK(bag.parameters().size() == 1);
  CHECK(bitwise_equal(bag.weight.select(0, 5), zeros({3})));
  const Options i64 = Options().dtype(DType::i64);
  const Tensor input = tensor({0, 5, 2, 4, 4}, i64), offsets = tensor({0, 2}, i64);
  CHECK(bitwise_equal(bag(input, offsets),
                      embedding_bag(input, bag.weight, offsets, "sum", Tensor(), false, 5)));
  // A 2-D input's rows are its bags: the same as the flat input with offsets every row.
  EmbeddingBag mean(6, 3);
  const Tensor rows = tensor({1, 2, 3, 4, 0, 0}, i64).reshape({2, 3});
  CHECK(close(mean(rows), mean(rows.reshape({6}), tensor({0, 3}, i64)), 1e-6));
  // The padding row gets no gradient, and the mean leaves it out of its count.
  Tensor l = sum(bag(input, offsets));
  l.backward();
  CHECK(bitwise_equal(bag.weight.grad().select(0, 5), zeros({3})));
  EmbeddingBag padded_mean(6, 3, "mean", false, 5);
  CHECK(close(padded_mean(tensor({5, 1}, i64), tensor({0}, i64)),
              padded_mean.weight.select(0, 1).unsqueeze(0), 1e-6));
  // "max": each column's largest row of the bag, padding left out; an empty bag is zeros.
  EmbeddingBag top(6, 3, "max", false, 0);
  const Tensor picked = top(tensor({0, 1, 2, 0}, i64), tensor({0, 1, 3}, i64));
  CHECK(bitwise_equal(picked.select(0, 0), zeros({3})));
  CHECK(bitwise_equal(picked.select(0, 1),
                      maximum(top.weight.select(0, 1), top.weight.select(0, 2))));
  CHECK(bitwise_equal(picked.select(0, 2), zeros({3})));
  CHECK(contains(error_of<ValueError>([] { EmbeddingBag(6, 3, "min"); }),
                 "[EmbeddingBag] mode must be \"sum\", \"mean\" or \"max\", got \"min\""));
}

TEST_CASE("MultiheadAttention's key_padding_mask and dropout") {
  manual_seed(53);
  MultiheadAttention m(8, 2);
  const Tensor x = randn({2, 4, 8});
  // Padded keys take no part: changing their values changes nothing, and a b8 mask equals the
  // same mask spread over the heads as an attn_mask (N * heads, L, S).
  const Tensor kpm = tensor({0, 0, 1, 1, 0, 1, 0, 0}).reshape({2, 4}).to(DType::b8);
  const Tensor y = m.forward(x, x, x, {}, false, kpm);
  // Key 3 of sample 0 (padding) gets other values.
  const Tensor at3 = tensor({0, 0, 0, 1, 0, 0, 0, 0}).reshape({2, 4, 1}).to(DType::b8);
  const Tensor other = where(at3, randn({2, 4, 8}), x);
  const Tensor y2 = m.forward(x, other, other, {}, false, kpm);
  CHECK(close(y, y2, 1e-6));
  const Tensor per_head = expand(kpm.reshape({2, 1, 1, 4}), {2, 2, 4, 4}).reshape({4, 4, 4});
  CHECK(close(y, m.forward(x, x, x, per_head), 1e-6));
  // A floating key padding mask is added; with a b8 attn_mask, both apply.
  const Tensor fk = where(kpm, -1e9, zeros({2, 4}));
  CHECK(close(m.forward(x, x, x, {}, false, fk), y, 1e-5));
  const Tensor am = tensor({0, 1, 0, 0}).reshape({1, 4}).to(DType::b8).expand({4, 4});
  const Tensor both = m.forward(x, x, x, am, false, kpm);
  const Tensor merged = where(expand(am.reshape({1, 4, 4}), {4, 4, 4}), true, per_head);
  CHECK(close(both, m.forward(x, x, x, merged), 1e-6));
  CHECK(close(both, m.forward(x, x, x, am, false, fk), 1e-5));
  // Dropout drops attention weights in training mode only.
  MultiheadAttention d(8, 2, true, 0.5);
  CHECK(d.name() == "MultiheadAttention(embed_dim=8, num_heads=2, dropout=0.5)");
  d.load_state_dict(m.state_dict());
  d.train(false);
  CHECK(close(d(x), m(x), 1e-6));
  d.train(true);
  manual_seed(1);
  const Tensor t1 = d(x);
  manual_seed(1);
  CHECK(bitwise_equal(d(x), t1));
  CHECK(!close(t1, m(x), 1e-3));
  MultiheadAttention all(8, 2, true, 1.0);
  all.load_state_dict(m.state_dict());
  // Every weight dropped: the output is out_proj's bias alone.
  CHECK(close(all(x), expand(all.out_proj.bias, {2, 4, 8}), 1e-6));
  // Errors name the layer.
  CHECK(contains(error_of<ValueError>([] { MultiheadAttention(8, 2, true, 1.5); }),
                 "[MultiheadAttention] dropout must be in [0, 1], got 1.5"));
  CHECK(contains(error_of<ShapeError>([&] {
                   m.forward(x, x, x, {}, false, kpm.reshape({4, 2}));
                 }),
                 "[MultiheadAttention] key_padding_mask must be (N, S) = (2, 4), got (4, 2)"));
  // is_causal joins a key_padding_mask: as the causal mask (true: not allowed) given with it.
  const Tensor causal = gt(unsqueeze(arange(4), 0), unsqueeze(arange(4), 1));
  CHECK(close(m.forward(x, x, x, {}, true, kpm), m.forward(x, x, x, causal, false, kpm), 0));
  CHECK(contains(error_of<DTypeError>([&] { m.forward(x, x, x, {}, false, kpm.to(DType::i64)); }),
                 "[MultiheadAttention] key_padding_mask must be b8 or the query's dtype f32"));
}

TEST_CASE("TransformerEncoderLayer and TransformerEncoder: PyTorch's structure and equations") {
  manual_seed(59);
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16));
  CHECK(layer.name() ==
        "TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.1, "
        "activation=relu)");
  // PyTorch's parameter names, in its order.
  std::vector<std::string> names;
  for (const auto& [n, p] : layer.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                          "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                          "linear1.weight", "linear1.bias", "linear2.weight",
                                          "linear2.bias", "norm1.weight", "norm1.bias",
                                          "norm2.weight", "norm2.bias"});
  // Post-norm, sequence first, in eval mode: the equations written out.
  layer.train(false);
  const Tensor x = randn({5, 2, 8});
  const Tensor b = transpose(x, 0, 1);
  const Tensor h = layer.norm1(b + layer.self_attn(b));
  const Tensor want = layer.norm2(h + layer.linear2(relu(layer.linear1(h))));
  CHECK(close(layer(x), transpose(want, 0, 1), 1e-5));
  // Pre-norm, batch first, gelu.
  TransformerEncoderLayer pre(TransformerEncoderLayerOptions(8, 2)
                                  .dim_feedforward(16)
                                  .norm_first(true)
                                  .batch_first(true)
                                  .activation("gelu")
                                  .dropout(0));
  pre.load_state_dict(layer.state_dict());
  Tensor v = b + pre.self_attn(pre.norm1(b));
  v = v + pre.linear2(gelu(pre.linear1(pre.norm2(v))));
  CHECK(close(pre(b), v, 1e-5));
  // Causal: each position sees itself and those before it; compiled, the same.
  const Tensor causal = pre.forward(b, {}, {}, true);
  const Tensor at4 = tensor({0, 0, 0, 0, 1}).reshape({1, 5, 1}).to(DType::b8);
  const Tensor later = where(at4, randn({2, 5, 8}), b);
  CHECK(close(slice(pre.forward(later, {}, {}, true), 1, 0, 4), slice(causal, 1, 0, 4), 1e-5));
  auto f = compile([&](Tensor in) { return pre.forward(in, {}, {}, true); });
  CHECK(close(f(b), causal, 1e-5));
  // Training mode with dropout draws; the same seed, the same draws.
  layer.train(true);
  manual_seed(3);
  const Tensor t1 = layer(x);
  manual_seed(3);
  CHECK(bitwise_equal(layer(x), t1));
  // The encoder's layers start equal to the layer and own their parameters.
  TransformerEncoder enc(pre, 3, LayerNorm(Shape{8}));
  CHECK(enc.name() == "TransformerEncoder(num_layers=3, norm)");
  CHECK(enc.parameters().size() == 3 * 12 + 2);
  CHECK(enc.state_dict().count("layers.2.linear2.bias") == 1);
  CHECK(enc.state_dict().count("norm.weight") == 1);
  const auto l0 = std::static_pointer_cast<TransformerEncoderLayer>(enc.layers.ptr(0));
  const auto l1 = std::static_pointer_cast<TransformerEncoderLayer>(enc.layers.ptr(1));
  CHECK(bitwise_equal(l1->linear1.weight, pre.linear1.weight));
  CHECK(!l1->linear1.weight.is_same(pre.linear1.weight));
  {
    NoGradGuard ng;
    l0->linear1.weight.add_(1.0);
  }
  CHECK(bitwise_equal(l1->linear1.weight, pre.linear1.weight));
  Tensor e = b;
  for (const auto& m : enc.layers)
    e = std::static_pointer_cast<TransformerEncoderLayer>(m)->forward(e);
  CHECK(close(enc(b), (*enc.norm)(e), 1e-6));
  // bias false: no bias anywhere (the projections, the attention, the norms).
  TransformerEncoderLayer nb(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).bias(false));
  for (const auto& [n, p] : nb.named_parameters()) CHECK(n.find("bias") == std::string::npos);
  CHECK(nb.parameters().size() == 6);
  CHECK(!LayerNorm(Shape{4}, 1e-5, true, false).bias.defined());
  // Arguments out of range and bad inputs name the layer.
  CHECK(
      contains(error_of<ValueError>([] {
                 TransformerEncoderLayer(TransformerEncoderLayerOptions(8, 2).activation("tanh"));
               }),
               "[TransformerEncoderLayer] activation must be \"relu\" or \"gelu\", got \"tanh\""));
  CHECK(contains(error_of<ValueError>([] { TransformerEncoderLayer(8, 3); }),
                 "[MultiheadAttention] embed_dim and num_heads must be positive"));
  CHECK(contains(error_of<ValueError>([&] { TransformerEncoder(pre, 0); }),
                 "[TransformerEncoder] num_layers must be positive, got 0"));
  CHECK(contains(error_of<ShapeError>([&] {
                   layer(randn({5, 8}));
                 }),
                 "[TransformerEncoderLayer] src must be (S, N, E) (3-D), got (5, 8)"));
}

TEST_CASE("TransformerDecoderLayer and TransformerDecoder: PyTorch's structure and equations") {
  manual_seed(61);
  TransformerDecoderLayer layer(
      TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).batch_first(true));
  CHECK(layer.name() ==
        "TransformerDecoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.1, "
        "activation=relu, batch_first=true)");
  std::vector<std::string> names;
  for (const auto& [n, p] : layer.named_parameters()) names.push_back(n);
  CHECK(names ==
        std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                 "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                 "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias",
                                 "multihead_attn.out_proj.weight", "multihead_attn.out_proj.bias",
                                 "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
                                 "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                                 "norm3.weight", "norm3.bias"});
  // Post-norm in eval mode: the equations written out; tgt_is_causal is the causal mask.
  layer.train(false);
  const Tensor t = randn({2, 4, 8}), mem = randn({2, 5, 8});
  Tensor x = layer.norm1(t + layer.self_attn.forward(t, t, t, {}, true));
  x = layer.norm2(x + layer.multihead_attn.forward(x, mem, mem));
  x = layer.norm3(x + layer.linear2(relu(layer.linear1(x))));
  const Tensor got = layer.forward(t, mem, {}, {}, {}, {}, true);
  CHECK(close(got, x, 1e-5));
  const Tensor causal = where(triu(ones({4, 4}), 1).to(DType::b8), -INFINITY, zeros({4, 4}));
  CHECK(close(layer(t, mem, causal), got, 1e-5));
  auto f = compile([&](Tensor a, Tensor b) { return layer.forward(a, b, {}, {}, {}, {}, true); });
  CHECK(close(f(t, mem), got, 1e-5));
  // The decoder's layers: copies with parameters of their own, then the norm.
  TransformerDecoder dec(layer, 2, LayerNorm(Shape{8}));
  CHECK(dec.name() == "TransformerDecoder(num_layers=2, norm)");
  CHECK(dec.parameters().size() == 2 * 18 + 2);
  const auto l1 = std::static_pointer_cast<TransformerDecoderLayer>(dec.layers.ptr(1));
  CHECK(bitwise_equal(l1->norm3.weight, layer.norm3.weight));
  CHECK(!l1->norm3.weight.is_same(layer.norm3.weight));
  CHECK(close(dec(t, mem), (*dec.norm)(l1->forward(layer.forward(t, mem), mem)), 1e-5));
  // Errors name the layer.
  CHECK(contains(error_of<ShapeError>([&] {
                   layer(randn({4, 8}), mem);
                 }),
                 "[TransformerDecoderLayer] tgt and memory must be (N, T, E) and (N, S, E) (3-D), "
                 "got (4, 8) and (2, 5, 8)"));
  CHECK(contains(error_of<ValueError>([] {
                   TransformerDecoderLayer(TransformerDecoderLayerOptions(8, 2).dropout(2));
                 }),
                 "[TransformerDecoderLayer] dropout must be in [0, 1], got 2"));
  CHECK(contains(error_of<ValueError>([&] { TransformerDecoder(layer, -1); }),
                 "[TransformerDecoder] num_layers must be positive, got -1"));
}

TEST_CASE("Transformer: an encoder and a decoder with their norms, PyTorch's initialization") {
  manual_seed(67);
  Transformer t(TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).batch_first(true), 2, 1);
  CHECK(t.name() == "Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1)");
  CHECK(t.state_dict().count("encoder.layers.1.linear2.weight") == 1);
  CHECK(t.state_dict().count("decoder.norm.bias") == 1);
  CHECK(t.parameters().size() == 2 * 12 + 2 + 18 + 2);
  // xavier_uniform_ on every matrix: linear1's weight (16, 8) within sqrt(6 / 24).
  for (const auto& [n, p] : t.named_parameters())
    if (p.dim() > 1) {
      CAPTURE(n);
      const double bound = std::sqrt(6.0 / double(p.size(0) + p.size(1)));
      CHECK(max(abs(p)).item<double>() <= bound);
    }
  // ... past Linear's own bound, 1 / sqrt(fan_in) = 0.25 for linear2's (8, 16).
  for (const auto& [n, p] : t.named_parameters())
    if (n.find("linear2.weight") != std::string::npos) {
      CAPTURE(n);
      CHECK(max(abs(p)).item<double>() > 0.3);
    }
  t.train(false);
  const Tensor src = randn({2, 5, 8}), tgt = randn({2, 3, 8});
  const Tensor mask = Transformer::generate_square_subsequent_mask(3);
  check_tensor(mask, {3, 3}, DType::f32, {0, -INFINITY, -INFINITY, 0, 0, -INFINITY, 0, 0, 0});
  CHECK(close(t(src, tgt, {}, mask), t.decoder(tgt, t.encoder(src), mask), 1e-6));
  CHECK(
      close(t.forward(src, tgt, {}, {}, {}, {}, {}, {}, false, true), t(src, tgt, {}, mask), 1e-5));
  CHECK(contains(error_of<ShapeError>([&] {
                   t(src, randn({3, 3, 8}));
                 }),
                 "[Transformer] src and tgt must be (N, S, E) and (N, T, E) with one batch size "
                 "and d_model 8, got (2, 5, 8) and (3, 3, 8)"));
}

TEST_CASE("Embedding's padding_idx: a zero row at first, and no gradient through its reads") {
  manual_seed(43);
  Embedding emb(6, 3, -2);  // row 4
  CHECK(emb.name() == "Embedding(6, 3, padding_idx=4)");
  CHECK(emb.padding_idx == 4);
  check_tensor(emb.weight[4], {3}, DType::f32, {0, 0, 0});
  CHECK(values(emb.weight[3]) != std::vector<double>{0, 0, 0});
  const Tensor idx = tensor({4, 1, 4, 0, 3}, Options().dtype(DType::i64)).reshape({5});
  const Tensor g = randn({5, 3});
  auto step = [&](const Tensor& w) { return sum(embedding(w, idx, 4) * g); };
  // Values as without padding; the padding row's gradient 0, the others' as without.
  CHECK(bitwise_equal(emb(idx), embedding(emb.weight, idx)));
  const Tensor w = randn({6, 3}).requires_grad_();
  const Tensor got = grad({step(w)}, {w})[0];
  const Tensor plain = grad({sum(embedding(w, idx) * g)}, {w})[0];
  check_tensor(got[4], {3}, DType::f32, {0, 0, 0});
  CHECK(values(plain[4]) != std::vector<double>{0, 0, 0});
  for (int64_t r : {0, 1, 2, 3, 5}) CHECK(bitwise_equal(got[r], plain[r]));
  // Compiled, the same gradient.
  auto f = compile([&](const Tensor& wt) { return grad({step(wt)}, {wt})[0]; });
  CHECK(bitwise_equal(f(w), got));
  CHECK(contains(error_of<ValueError>([] { Embedding(6, 3, 6); }),
                 "[Embedding] padding_idx 6 is out of range for 6 embeddings"));
  CHECK(contains(error_of<ValueError>([&] { embedding(emb.weight, idx, -7); }),
                 "[embedding] padding_idx -7 is out of range for 6 embeddings"));
}

TEST_CASE("Identity returns its input") {
  Identity id;
  Tensor x = randn({2, 3});
  CHECK(id(x).is_same(x));
  auto f = compile([&](Tensor in) { return id(in) * 2; });
  CHECK(close(f(x), x * 2));
  CHECK(id.parameters().empty());
}

// ---- ModuleList, ModuleDict ----

TEST_CASE("ModuleList: children named by index, access, iteration, extend") {
  struct Net : Module {
    ModuleList layers{register_module("layers", ModuleList(Linear(3, 4), ReLU()))};
    Net() { layers.push_back(std::make_shared<Linear>(4, 2)); }
    Tensor forward(const Tensor& x) override {
      Tensor y = x;
      for (const auto& m : layers) y = m->forward(y);
      return y;
    }
  };
  Net net;
  CHECK(net.layers.size() == 3);
  CHECK_FALSE(net.layers.is_empty());
  std::vector<std::string> names;
  for (const auto& [name, t] : net.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.2.weight",
                                          "layers.2.bias"});
  CHECK(net.layers[1]->name() == "ReLU()");
  CHECK(net.layers.at<Linear>(2).out_features == 2);
  CHECK(net.layers.ptr(0)->is_same(*net.layers[0]));
  Tensor x = randn({5, 3});
  Linear& l0 = net.layers.at<Linear>(0);
  Linear& l2 = net.layers.at<Linear>(2);
  CHECK(close(net(x), l2(relu(l0(x))), 1e-6));
  int count = 0;
  for (auto it = net.layers.begin(); it != net.layers.end(); ++it)
    count += (*it)->name().empty() ? 0 : 1;
  CHECK(count == 3);
  // extend shares the modules; extending a list by itself doubles it.
  ModuleList more;
  CHECK(more.is_empty());
  more.extend(net.layers);
  more.extend(more);
  CHECK(more.size() == 6);
  CHECK(more[4]->is_same(*net.layers[1]));
  CHECK(more.parameters().size() == 4);  // each tensor once
  std::string e = error_of<ValueError>([&] { net.layers[3]; });
  CHECK(contains(e, "[ModuleList] index 3 is out of range for 3 modules"));
  e = error_of<ValueError>([&] { net.layers.at<Linear>(1); });
  CHECK(contains(e, "[ModuleList] module 1 is ReLU()"));
  e = error_of([&] { net.layers(x); });
  CHECK(contains(e, "ModuleList has no forward(Tensor)"));
}

TEST_CASE("ModuleDict: modules by key in insertion order") {
  ModuleDict heads(
      {{"cls", std::make_shared<Linear>(4, 3)}, {"box", std::make_shared<Linear>(4, 2)}});
  heads.insert("act", Tanh());
  CHECK(heads.size() == 3);
  CHECK(heads.keys() == std::vector<std::string>{"cls", "box", "act"});
  CHECK(heads.contains("box"));
  CHECK_FALSE(heads.contains("mask"));
  CHECK(heads.at<Linear>("box").out_features == 2);
  CHECK(heads["act"]->name() == "Tanh()");
  CHECK(heads.values().size() == 3);
  CHECK(heads.items()[1].first == "box");
  std::vector<std::string> names;
  for (const auto& [name, t] : heads.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"cls.weight", "cls.bias", "box.weight", "box.bias"});
  std::string e = error_of<ValueError>([&] { heads["mask"]; });
  CHECK(contains(e, "[ModuleDict] no module under key 'mask' (keys: 'cls', 'box', 'act')"));
  e = error_of<ValueError>([&] { heads.insert("cls", ReLU()); });
  CHECK(contains(e, "'cls' is already registered"));
  e = error_of<ValueError>([&] { heads.insert("a.b", ReLU()); });
  CHECK(contains(e, "contains '.'"));
  e = error_of<ValueError>([&] { heads.at<Linear>("act"); });
  CHECK(contains(e, "[ModuleDict] module 'act' is Tanh()"));
  CHECK(ModuleDict().is_empty());
}

}  // namespace
}  // namespace duet::test
