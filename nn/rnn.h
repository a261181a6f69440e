// duet: recurrent layers (torch.nn's RNN, GRU and LSTM), with LibTorch's options and return
// shapes and PyTorch's parameter names, layout, gate equations and initialization, so that a
// PyTorch state dict loads by name.
//
// Note [Recurrent layers over scan]
// Each layer and direction is one duet::scan over time (trace/control_flow.h): compiled, a
// step is one subgraph run in a loop, not a graph unrolled over the sequence, and the gradient
// is a reverse scan of the step's. The input projections of every time step, x_t W_ih^T + b_ih,
// do not depend on the carry: they are computed before the scan as products over the whole
// sequence (what cuDNN and PyTorch's CPU path do too), and the scan steps over their rows; a
// step then holds the product h W_hh^T + b_hh of all gates and the cell's op on both products
// (Note [Whole products] in nn/rnn.cpp).
// The reverse direction of a bidirectional layer is the same scan run from the last step to the
// first. A start state not given is zeros built from the input's symbolic batch dim
// (full_dims), so one compiled trace serves every batch size.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/call_site.h"
#include "nn/module.h"
#include "nn/options.h"

// The recurrent layers' forward takes the state and returns two tensors, and so hides
// Module::forward(Tensor) on purpose (as in LibTorch); clang's -Woverloaded-virtual says so.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Woverloaded-virtual"
#endif

namespace duet::nn {

/// The options every recurrent layer shares (LibTorch's RNN, GRU and LSTM options).
/// input_size and hidden_size must be positive, num_layers at least 1, dropout in [0, 1).
/// dropout is applied to the output of every layer but the last, in training mode (PyTorch's).
#define DUET_RNN_COMMON_OPTIONS              \
  DUET_NN_OPTION(int64_t, input_size);       \
  DUET_NN_OPTION(int64_t, hidden_size);      \
  DUET_NN_OPTION(int64_t, num_layers) = 1;   \
  DUET_NN_OPTION(bool, bias) = true;         \
  DUET_NN_OPTION(bool, batch_first) = false; \
  DUET_NN_OPTION(double, dropout) = 0.0;     \
  DUET_NN_OPTION(bool, bidirectional) = false

/// nn::RNN's options; nonlinearity is "tanh" (the default) or "relu".
class RNNOptions {
 public:
  RNNOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  DUET_RNN_COMMON_OPTIONS;
  DUET_NN_OPTION(std::string, nonlinearity) = "tanh";
};

/// nn::GRU's options.
class GRUOptions {
 public:
  GRUOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  DUET_RNN_COMMON_OPTIONS;
};

/// nn::LSTM's options (no proj_size).
class LSTMOptions {
 public:
  LSTMOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  DUET_RNN_COMMON_OPTIONS;
};

#undef DUET_RNN_COMMON_OPTIONS

/// The shared implementation of RNN, GRU and LSTM (LibTorch's RNNImplBase). Parameters, per
/// layer k and direction (suffix "" forward, "_reverse" backward), in PyTorch's order:
/// weight_ih_l{k} (gates * hidden_size, input of the layer), weight_hh_l{k} (gates *
/// hidden_size, hidden_size), bias_ih_l{k} and bias_hh_l{k} (gates * hidden_size), where gates
/// is 1 (RNN), 3 (GRU: r, z, n) or 4 (LSTM: i, f, g, o), stacked by rows in that order; the
/// input of layer 0 is input_size, of later layers hidden_size times the directions. All start
/// U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch's.
class RNNBase : public Module {
 public:
  /// What differs between the three recurrent layers.
  enum class Mode { RNNTanh, RNNReLU, GRU, LSTM };
  /// The options of any recurrent layer, as the shared implementation reads them.
  struct Config {
    Mode mode;
    int64_t input_size, hidden_size, num_layers;
    bool bias, batch_first;
    double dropout;
    bool bidirectional;
  };

  /// Draws every parameter again, as the constructor does.
  void reset_parameters();
  /// The parameters in registration order (PyTorch's all_weights, flattened).
  std::vector<Tensor> all_weights() const { return parameters(); }

 protected:
  explicit RNNBase(const Config& config);
  /// The whole sequence: returns (output, h_n) and, for an LSTM, c_n in *c_n. hx and cx may be
  /// undefined (zeros).
  std::tuple<Tensor, Tensor> run(const Tensor& input, const Tensor& hx, const Tensor& cx,
                                 Tensor* c_n);

  Config config_;

 private:
  // Per layer and direction: w_ih, w_hh, b_ih, b_hh (biases undefined without bias).
  struct Weights {
    Tensor w_ih, w_hh, b_ih, b_hh;
  };
  std::vector<Weights> weights_;
};

/// Elman RNN, as torch.nn.RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh
/// or relu. Input (L, N, input_size), or (N, L, input_size) with batch_first, or unbatched
/// (L, input_size); hx (num_layers * directions, N, hidden_size) or unbatched without N,
/// zeros when not given. Returns (output, h_n): output (L, N, directions * hidden_size) (batch
/// first with batch_first), the last layer's h_t at every t; h_n the last h of every layer
/// and direction, (num_layers * directions, N, hidden_size), never batch first.
class RNN : public RNNBase {
 public:
  explicit RNN(const RNNOptions& options);
  RNN(int64_t input_size, int64_t hidden_size) : RNN(RNNOptions(input_size, hidden_size)) {}
  // This forward takes the state and returns two tensors: it hides Module::forward(Tensor),
  // as in LibTorch, where a recurrent layer does not go into a Sequential either.
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx = {});
  std::tuple<Tensor, Tensor> operator()(const Tensor& input, const Tensor& hx = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, hx);
  }
  RNNOptions options;
};

/// Gated recurrent unit, as torch.nn.GRU, per step (rows of the weights r, z, n):
///   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
///   z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
///   n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
///   h' = (1 - z) * n + z * h
/// Shapes and results as nn::RNN's.
class GRU : public RNNBase {
 public:
  explicit GRU(const GRUOptions& options);
  GRU(int64_t input_size, int64_t hidden_size) : GRU(GRUOptions(input_size, hidden_size)) {}
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx = {});
  std::tuple<Tensor, Tensor> operator()(const Tensor& input, const Tensor& hx = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, hx);
  }
  GRUOptions options;
};

/// Long short-term memory, as torch.nn.LSTM, per step (rows of the weights i, f, g, o):
///   i = sigmoid(W_ii x + b_ii + W_hi h + b_hi), f = sigmoid(...), g = tanh(...),
///   o = sigmoid(...); c' = f * c + i * g; h' = o * tanh(c')
/// The state is (h_0, c_0), each shaped as nn::RNN's hx, zeros when not given. Returns
/// (output, (h_n, c_n)).
class LSTM : public RNNBase {
 public:
  using State = std::tuple<Tensor, Tensor>;
  explicit LSTM(const LSTMOptions& options);
  LSTM(int64_t input_size, int64_t hidden_size) : LSTM(LSTMOptions(input_size, hidden_size)) {}
  std::tuple<Tensor, State> forward(const Tensor& input, const std::optional<State>& hx = {});
  std::tuple<Tensor, State> operator()(const Tensor& input, const std::optional<State>& hx = {},
                                       DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, hx);
  }
  LSTMOptions options;
};

/// nn::RNNCell's options; nonlinearity is "tanh" (the default) or "relu".
class RNNCellOptions {
 public:
  RNNCellOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  DUET_NN_OPTION(int64_t, input_size);
  DUET_NN_OPTION(int64_t, hidden_size);
  DUET_NN_OPTION(bool, bias) = true;
  DUET_NN_OPTION(std::string, nonlinearity) = "tanh";
};

/// nn::GRUCell's and nn::LSTMCell's options.
class GRUCellOptions {
 public:
  GRUCellOptions(int64_t input_size, int64_t hidden_size)
      : input_size_(input_size), hidden_size_(hidden_size) {}
  DUET_NN_OPTION(int64_t, input_size);
  DUET_NN_OPTION(int64_t, hidden_size);
  DUET_NN_OPTION(bool, bias) = true;
};
using LSTMCellOptions = GRUCellOptions;

/// One time step of RNN, GRU or LSTM (LibTorch's RNNCellImplBase), with the equations of the
/// full layers. Parameters weight_ih (gates * hidden_size, input_size), weight_hh (gates *
/// hidden_size, hidden_size), bias_ih and bias_hh (gates * hidden_size), all starting
/// U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)). Input (N, input_size) or unbatched
/// (input_size); the state (N, hidden_size) or (hidden_size), zeros when not given.
class RNNCellBase : public Module {
 public:
  void reset_parameters();
  int64_t input_size, hidden_size;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;  ///< the biases undefined without bias

 protected:
  RNNCellBase(RNNBase::Mode mode, int64_t input_size, int64_t hidden_size, bool bias);
  /// {h'} or, for an LSTM cell, {h', c'}.
  std::vector<Tensor> step(const Tensor& input, const Tensor& hx, const Tensor& cx);

 private:
  RNNBase::Mode mode_;
};

/// h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), as torch.nn.RNNCell.
class RNNCell : public RNNCellBase {
 public:
  explicit RNNCell(const RNNCellOptions& options);
  RNNCell(int64_t input_size, int64_t hidden_size)
      : RNNCell(RNNCellOptions(input_size, hidden_size)) {}
  /// From a zero state.
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  Tensor forward(const Tensor& input, const Tensor& hx);
  using Module::operator();
  Tensor operator()(const Tensor& input, const Tensor& hx, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, hx);
  }
  RNNCellOptions options;
};

/// One GRU step (nn::GRU's equations), as torch.nn.GRUCell.
class GRUCell : public RNNCellBase {
 public:
  explicit GRUCell(const GRUCellOptions& options);
  GRUCell(int64_t input_size, int64_t hidden_size)
      : GRUCell(GRUCellOptions(input_size, hidden_size)) {}
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  Tensor forward(const Tensor& input, const Tensor& hx);
  using Module::operator();
  Tensor operator()(const Tensor& input, const Tensor& hx, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, hx);
  }
  GRUCellOptions options;
};

/// One LSTM step (nn::LSTM's equations), as torch.nn.LSTMCell: returns (h', c').
class LSTMCell : public RNNCellBase {
 public:
  using State = std::tuple<Tensor, Tensor>;
  explicit LSTMCell(const LSTMCellOptions& options);
  LSTMCell(int64_t input_size, int64_t hidden_size)
      : LSTMCell(LSTMCellOptions(input_size, hidden_size)) {}
  // Returns two tensors: it hides Module::forward(Tensor), as in LibTorch.
  State forward(const Tensor& input, const std::optional<State>& hx = {});
  State operator()(const Tensor& input, const std::optional<State>& hx = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, hx);
  }
  LSTMCellOptions options;
};

}  // namespace duet::nn

#if defined(__clang__)
#pragma clang diagnostic pop
#endif
