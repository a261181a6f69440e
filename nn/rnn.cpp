// duet: RNN, GRU and LSTM over duet::scan (Note [Recurrent layers over scan] in nn/rnn.h).
#include "nn/rnn.h"

#include <cmath>

#include "core/autocast.h"
#include "core/op_table.h"
#include "core/ops.h"
#include "nn/init.h"
#include "trace/control_flow.h"

namespace duet::nn {
namespace {

using Mode = RNNBase::Mode;
using Config = RNNBase::Config;

const char* kind_name(Mode m) {
  switch (m) {
    case Mode::RNNTanh:
    case Mode::RNNReLU:
      return "RNN";
    case Mode::GRU:
      return "GRU";
    case Mode::LSTM:
      return "LSTM";
  }
  return "RNN";
}

int64_t gates_of(Mode m) { return m == Mode::GRU ? 3 : m == Mode::LSTM ? 4 : 1; }

// "GRU(8, 16, num_layers=2, batch_first=true)": the sizes and the options that differ from
// PyTorch's defaults.
std::string layer_name(const Config& c) {
  std::string s = fmt::format("{}({}, {}", kind_name(c.mode), c.input_size, c.hidden_size);
  if (c.num_layers != 1) s += fmt::format(", num_layers={}", c.num_layers);
  if (c.mode == Mode::RNNReLU) s += ", nonlinearity='relu'";
  if (!c.bias) s += ", bias=false";
  if (c.batch_first) s += ", batch_first=true";
  if (c.dropout != 0) s += fmt::format(", dropout={}", c.dropout);
  if (c.bidirectional) s += ", bidirectional=true";
  return s + ")";
}

Config checked(Config c) {
  const char* kind = kind_name(c.mode);
  DUET_CHECK_VALUE(c.input_size > 0 && c.hidden_size > 0 && c.num_layers >= 1,
                   "[{}] input_size and hidden_size must be positive and num_layers at least 1, "
                   "got input_size {}, hidden_size {}, num_layers {}",
                   kind, c.input_size, c.hidden_size, c.num_layers);
  DUET_CHECK_VALUE(c.dropout >= 0 && c.dropout < 1, "[{}] dropout must be in [0, 1), got {}", kind,
                   c.dropout);
  return c;
}

template <class O>
Config config_of(const O& o, Mode mode) {
  return checked(Config{mode, o.input_size(), o.hidden_size(), o.num_layers(), o.bias(),
                        o.batch_first(), o.dropout(), o.bidirectional()});
}

Mode rnn_mode(const RNNOptions& o) {
  DUET_CHECK_VALUE(o.nonlinearity() == "tanh" || o.nonlinearity() == "relu",
                   "[RNN] nonlinearity must be \"tanh\" or \"relu\", got \"{}\"", o.nonlinearity());
  return o.nonlinearity() == "tanh" ? Mode::RNNTanh : Mode::RNNReLU;
}

// Note [Whole products]
// Every step multiplies its state by all the gates' rows of W_hh at once, one product, and the
// input's product of all gates comes whole too (computed before the scan for a whole sequence
// in a layer, Note [Recurrent layers over scan] in nn/rnn.h). No gate is sliced out of a
// product: the LSTM and GRU cells are one op each on the two products (Note [LSTM cell] in
// core/ops/rnn.cpp), which reads its gates inside, and the RNN has a single gate. A slice per
// gate would cost a slice_scatter of a zero (N, gates * H) tensor per gate and step in the
// backward, and blocks of the weights (per gate, outside the scan) would cost a product per gate
// and step instead of one.

// Note [Unbatched cells]
// A cell's unbatched step (one sample's vector, as per-sample code calls it, one token at a
// time) computes on vectors: its products are linear() of a vector (the weight times it as a
// column) and the state stays a vector. Run as a batch of one, it made a row of the input and
// of each state and squeezed the new state back, and each product transposed its weight. Each
// view is a tape node eagerly, and under Autobatch an op to record and run (matmul's batching
// rule makes the samples' columns one product). The sums are the same dot products.

// One time step: {h, (c), x} (x the input's product of all gates) -> {h', (c'), h'}, PyTorch's
// equations (Note [Whole products]).
std::vector<Tensor> step_once(Mode mode, const Tensor& w_hh, const Tensor& b_hh,
                              const std::vector<Tensor>& in) {
  const Tensor& h = in[0];
  const Tensor& x = in.back();
  const Tensor hp = linear(h, w_hh, b_hh);
  switch (mode) {
    case Mode::RNNTanh:
    case Mode::RNNReLU: {
      Tensor next = mode == Mode::RNNTanh ? tanh(x + hp) : relu(x + hp);
      return {next, next};
    }
    case Mode::GRU: {
      Tensor next = fused_gru_cell(x, hp, h);
      return {next, next};
    }
    case Mode::LSTM: {
      auto [h_next, c_next] = fused_lstm_cell(x, hp, in[1]);
      return {h_next, c_next, h_next};
    }
  }
  return {};
}

// The step as scan's body.
Fn step_fn(Mode mode, const Tensor& w_hh, const Tensor& b_hh) {
  return
      [mode, w_hh, b_hh](const std::vector<Tensor>& in) { return step_once(mode, w_hh, b_hh, in); };
}

// Row i of a (rows, ...) tensor.
Tensor row(const Tensor& t, int64_t i) { return squeeze(slice(t, 0, i, i + 1), 0); }

}  // namespace

RNNBase::RNNBase(const Config& config) : Module(layer_name(config)), config_(config) {
  const int64_t dirs = config.bidirectional ? 2 : 1;
  const int64_t rows = gates_of(config.mode) * config.hidden_size;
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const int64_t in = layer == 0 ? config.input_size : config.hidden_size * dirs;
    for (int64_t d = 0; d < dirs; ++d) {
      const std::string suffix = fmt::format("_l{}{}", layer, d == 1 ? "_reverse" : "");
      Weights w;
      w.w_ih = register_parameter("weight_ih" + suffix, zeros({rows, in}));
      w.w_hh = register_parameter("weight_hh" + suffix, zeros({rows, config.hidden_size}));
      if (config.bias) {
        w.b_ih = register_parameter("bias_ih" + suffix, zeros({rows}));
        w.b_hh = register_parameter("bias_hh" + suffix, zeros({rows}));
      }
      weights_.push_back(w);
    }
  }
  reset_parameters();
}

void RNNBase::reset_parameters() {
  const double bound = 1 / std::sqrt(static_cast<double>(config_.hidden_size));
  for (const Weights& w : weights_)
    for (const Tensor* t : {&w.w_ih, &w.w_hh, &w.b_ih, &w.b_hh})
      if (t->defined()) init::uniform_(*t, -bound, bound);
}

std::tuple<Tensor, Tensor> RNNBase::run(const Tensor& input, const Tensor& hx, const Tensor& cx,
                                        Tensor* c_n) {
  using duet::detail::size_is;
  using duet::detail::sym_dim;
  const Config& c = config_;
  const char* op = kind_name(c.mode);
  const bool lstm = c.mode == Mode::LSTM;
  const int64_t dirs = c.bidirectional ? 2 : 1, hs = c.hidden_size;
  DUET_CHECK_VALUE(input.defined(), "[{}] the input is an undefined tensor", op);
  const bool batched = input.dim() == 3;
  DUET_CHECK_SHAPE(
      (input.dim() == 2 || batched) && size_is(input, input.dim() - 1, c.input_size, op),
      "[{}] input must be ({}, {}) or unbatched (L, {}) with input_size {}, got {}", op,
      c.batch_first ? "N, L" : "L, N", c.input_size, c.input_size, c.input_size, input.sizes());
  const Tensor& w0 = weights_[0].w_ih;
  DUET_CHECK_DTYPE(input.dtype() == w0.dtype(),
                   "[{}] input ({}) and parameters ({}) must share a dtype", op, input.dtype(),
                   w0.dtype());
  // x: (L, N, input_size), time first.
  Tensor x = !batched ? unsqueeze(input, 1) : c.batch_first ? transpose(input, 0, 1) : input;
  const SymInt n = sym_dim(x, 1);
  const int64_t states = c.num_layers * dirs;
  auto start = [&](const Tensor& s, const char* what) -> Tensor {
    if (!s.defined())
      return duet::detail::full_dims({states, n, hs}, 0,
                                     Options().dtype(x.dtype()).device(x.device()));
    const bool fits = batched ? s.dim() == 3 && size_is(s, 0, states, op) && size_is(s, 1, n, op) &&
                                    size_is(s, 2, hs, op)
                              : s.dim() == 2 && size_is(s, 0, states, op) && size_is(s, 1, hs, op);
    DUET_CHECK_SHAPE(fits,
                     "[{}] {} must be {} (num_layers * directions{}, hidden_size) for input {}, "
                     "got {}",
                     op, what,
                     batched ? fmt::format("({}, {}, {})", states, duet::detail::sym_hint(n), hs)
                             : fmt::format("({}, {})", states, hs),
                     batched ? ", batch" : "", input.sizes(), s.sizes());
    DUET_CHECK_DTYPE(s.dtype() == x.dtype(), "[{}] {} ({}) must have the input's dtype {}", op,
                     what, s.dtype(), x.dtype());
    return batched ? s : unsqueeze(s, 1);
  };
  const Tensor h0 = start(hx, lstm ? "h_0" : "hx");
  const Tensor c0 = lstm ? start(cx, "c_0") : Tensor();

  std::vector<Tensor> h_last, c_last;
  Tensor layer_in = x;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t k = layer * dirs + d;
      const Weights& w = weights_[static_cast<size_t>(k)];
      // Note [Recurrent layers over scan]: the input's products of all steps at once.
      std::vector<Tensor> xs{linear(layer_in, w.w_ih, w.b_ih)};
      std::vector<Tensor> carry{row(h0, k)};
      if (lstm) carry.push_back(row(c0, k));
      std::vector<Tensor> r =
          duet::detail::scan_impl(step_fn(c.mode, w.w_hh, w.b_hh), carry, xs, d == 1);
      h_last.push_back(r[0]);
      if (lstm) c_last.push_back(r[1]);
      outs.push_back(r.back());
    }
    layer_in = dirs == 1 ? outs[0] : cat(outs, 2);
    if (c.dropout > 0 && layer + 1 < c.num_layers)
      layer_in = duet::dropout(layer_in, c.dropout, is_training());
  }
  Tensor out = layer_in;
  Tensor h_n = stack(h_last, 0);
  if (lstm) *c_n = stack(c_last, 0);
  if (!batched) {
    out = squeeze(out, 1);
    h_n = squeeze(h_n, 1);
    if (lstm) *c_n = squeeze(*c_n, 1);
  } else if (c.batch_first) {
    out = transpose(out, 0, 1);
  }
  return {out, h_n};
}

// ---- RNN, GRU, LSTM ----

RNN::RNN(const RNNOptions& o) : RNNBase(config_of(o, rnn_mode(o))), options(o) {}

std::tuple<Tensor, Tensor> RNN::forward(const Tensor& input, const Tensor& hx) {
  return run(input, hx, {}, nullptr);
}

GRU::GRU(const GRUOptions& o) : RNNBase(config_of(o, Mode::GRU)), options(o) {}

std::tuple<Tensor, Tensor> GRU::forward(const Tensor& input, const Tensor& hx) {
  return run(input, hx, {}, nullptr);
}

LSTM::LSTM(const LSTMOptions& o) : RNNBase(config_of(o, Mode::LSTM)), options(o) {}

std::tuple<Tensor, LSTM::State> LSTM::forward(const Tensor& input, const std::optional<State>& hx) {
  Tensor c_n;
  Tensor h0 = hx ? std::get<0>(*hx) : Tensor(), c0 = hx ? std::get<1>(*hx) : Tensor();
  DUET_CHECK_VALUE(!hx || (h0.defined() && c0.defined()),
                   "[LSTM] the state (h_0, c_0) must hold two defined tensors");
  auto [out, h_n] = run(input, h0, c0, &c_n);
  return {out, State{h_n, c_n}};
}

// ---- Cells ----

namespace {

const char* cell_kind(Mode m) {
  return m == Mode::GRU ? "GRUCell" : m == Mode::LSTM ? "LSTMCell" : "RNNCell";
}

}  // namespace

RNNCellBase::RNNCellBase(Mode mode, int64_t in, int64_t hidden, bool bias)
    : Module(fmt::format("{}({}, {}{}{})", cell_kind(mode), in, hidden, bias ? "" : ", bias=false",
                         mode == Mode::RNNReLU ? ", nonlinearity='relu'" : "")),
      input_size(in),
      hidden_size(hidden),
      mode_(mode) {
  const char* kind = cell_kind(mode);
  DUET_CHECK_VALUE(in > 0 && hidden > 0,
                   "[{}] input_size and hidden_size must be positive, got input_size {}, "
                   "hidden_size {}",
                   kind, in, hidden);
  const int64_t rows = gates_of(mode) * hidden;
  weight_ih = register_parameter("weight_ih", zeros({rows, in}));
  weight_hh = register_parameter("weight_hh", zeros({rows, hidden}));
  if (bias) {
    bias_ih = register_parameter("bias_ih", zeros({rows}));
    bias_hh = register_parameter("bias_hh", zeros({rows}));
  }
  reset_parameters();
}

void RNNCellBase::reset_parameters() {
  const double bound = 1 / std::sqrt(static_cast<double>(hidden_size));
  for (const Tensor* t : {&weight_ih, &weight_hh, &bias_ih, &bias_hh})
    if (t->defined()) init::uniform_(*t, -bound, bound);
}

std::vector<Tensor> RNNCellBase::step(const Tensor& input, const Tensor& hx, const Tensor& cx) {
  using duet::detail::size_is;
  const char* op = cell_kind(mode_);
  const bool lstm = mode_ == Mode::LSTM;
  DUET_CHECK_VALUE(input.defined(), "[{}] the input is an undefined tensor", op);
  const bool batched = input.dim() == 2;
  DUET_CHECK_SHAPE((input.dim() == 1 || batched) && size_is(input, input.dim() - 1, input_size, op),
                   "[{}] input must be (N, {}) or unbatched ({}), got {}", op, input_size,
                   input_size, input.sizes());
  DUET_CHECK_DTYPE(input.dtype() == weight_ih.dtype(),
                   "[{}] input ({}) and parameters ({}) must share a dtype", op, input.dtype(),
                   weight_ih.dtype());
  // An unbatched step computes on vectors (Note [Unbatched cells]).
  const Tensor& x = input;
  const SymInt n = batched ? duet::detail::sym_dim(x, 0) : SymInt(1);
  auto start = [&](const Tensor& s, const char* what) -> Tensor {
    if (!s.defined())
      return duet::detail::full_dims(batched ? SymDims{n, hidden_size} : SymDims{hidden_size}, 0,
                                     Options().dtype(x.dtype()).device(x.device()));
    const bool fits = batched
                          ? s.dim() == 2 && size_is(s, 0, n, op) && size_is(s, 1, hidden_size, op)
                          : s.dim() == 1 && size_is(s, 0, hidden_size, op);
    DUET_CHECK_SHAPE(fits, "[{}] {} must be {} for input {}, got {}", op, what,
                     batched ? fmt::format("({}, {})", duet::detail::sym_hint(n), hidden_size)
                             : fmt::format("({})", hidden_size),
                     input.sizes(), s.sizes());
    DUET_CHECK_DTYPE(s.dtype() == x.dtype(), "[{}] {} ({}) must have the input's dtype {}", op,
                     what, s.dtype(), x.dtype());
    return s;
  };
  std::vector<Tensor> in;
  in.reserve(3);
  in.push_back(start(hx, lstm ? "h_0" : "hx"));
  if (lstm) in.push_back(start(cx, "c_0"));
  // The step with its products as one op (Note [LSTM step] in core/ops/rnn.cpp); under autocast
  // the products run in the low dtype through linear() instead, and the state stays f32.
  if (lstm && bias_ih.defined() && !autocast_enabled(x.device())) {
    auto [h_next, c_next] = lstm_step(x, in[0], in[1], weight_ih, weight_hh, bias_ih, bias_hh);
    return {h_next, c_next};
  }
  in.push_back(linear(x, weight_ih, bias_ih));  // all gates (Note [Whole products])
  std::vector<Tensor> out = step_once(mode_, weight_hh, bias_hh, in);
  out.pop_back();  // the per-step result, a copy of h'
  return out;
}

RNNCell::RNNCell(const RNNCellOptions& o)
    : RNNCellBase(
          rnn_mode(RNNOptions(o.input_size(), o.hidden_size()).nonlinearity(o.nonlinearity())),
          o.input_size(), o.hidden_size(), o.bias()),
      options(o) {}

Tensor RNNCell::forward(const Tensor& input, const Tensor& hx) { return step(input, hx, {})[0]; }

GRUCell::GRUCell(const GRUCellOptions& o)
    : RNNCellBase(Mode::GRU, o.input_size(), o.hidden_size(), o.bias()), options(o) {}

Tensor GRUCell::forward(const Tensor& input, const Tensor& hx) { return step(input, hx, {})[0]; }

LSTMCell::LSTMCell(const LSTMCellOptions& o)
    : RNNCellBase(Mode::LSTM, o.input_size(), o.hidden_size(), o.bias()), options(o) {}

LSTMCell::State LSTMCell::forward(const Tensor& input, const std::optional<State>& hx) {
  Tensor h0 = hx ? std::get<0>(*hx) : Tensor(), c0 = hx ? std::get<1>(*hx) : Tensor();
  DUET_CHECK_VALUE(!hx || (h0.defined() && c0.defined()),
                   "[LSTMCell] the state (h_0, c_0) must hold two defined tensors");
  std::vector<Tensor> r = step(input, h0, c0);
  return {r[0], r[1]};
}

}  // namespace duet::nn
