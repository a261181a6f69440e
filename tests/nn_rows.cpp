// The nn test tables (tests/nn_rows.h).
#include "nn_rows.h"

#include <tuple>
#include <type_traits>

#include "core/ops.h"
#include "nn/norm.h"
#include "nn/rnn.h"

namespace duet::test {

using namespace duet::nn;

namespace {

// Self-attention with the causal mask, as a module of one input for the table.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t e, int64_t heads)
      : Module(), attn(register_module("attn", MultiheadAttention(e, heads))) {}
  Tensor forward(const Tensor& x) override { return attn.forward(x, x, x, {}, true); }
  MultiheadAttention attn;
};

// A recurrent layer as a module of one input for the table: its output and final state(s),
// flattened and joined.
template <class R>
class RecurrentOutputs : public Module {
 public:
  template <class O>
  explicit RecurrentOutputs(O options) : Module(), rnn(register_module("rnn", R(options))) {}
  Tensor forward(const Tensor& x) override {
    if constexpr (std::is_same_v<R, LSTM>) {
      auto [y, state] = rnn(x);
      return cat(
          {reshape(y, {-1}), reshape(std::get<0>(state), {-1}), reshape(std::get<1>(state), {-1})});
    } else {
      auto [y, h_n] = rnn(x);
      return cat({reshape(y, {-1}), reshape(h_n, {-1})});
    }
  }
  R rnn;
};

// An LSTM cell from a zero state as a module of one input: h' and c' joined.
class LSTMCellOutputs : public Module {
 public:
  LSTMCellOutputs(int64_t in, int64_t hidden, bool bias)
      : Module(), cell(register_module("cell", LSTMCell(LSTMCellOptions(in, hidden).bias(bias)))) {}
  Tensor forward(const Tensor& x) override {
    auto [h, c] = cell(x);
    return cat({h, c}, -1);
  }
  LSTMCell cell;
};

// Linear layers held in a ModuleList, applied in turn with tanh between them.
class ListNet : public Module {
 public:
  ListNet() : Module(), layers(register_module("layers", ModuleList(Linear(4, 5), Linear(5, 3)))) {}
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& m : layers) y = m->forward(y.is_same(x) ? y : tanh(y));
    return y;
  }
  ModuleList layers;
};

}  // namespace

const std::vector<LayerRow>& layer_rows() {
  static const std::vector<LayerRow> rows = {
      {"Linear(4, 3)", maker<Linear>(4, 3), {2, 4}},
      {"Linear(4, 3, bias=false)", maker<Linear>(4, 3, false), {2, 4}},
      {"Linear(3, 2) on a batch of matrices", maker<Linear>(3, 2), {2, 2, 3}},
      {"Conv2d(2, 3, 3)", maker<Conv2d>(2, 3, 3), {2, 2, 5, 5}},
      {"Conv2d(2, 2, 3, stride 2, padding 1, bias=false)",
       maker<Conv2d>(2, 2, 3, 2, 1, false),
       {1, 2, 5, 5}},
      {"ConvTranspose2d(2, 3, 3, stride 2, padding 1, output_padding 1)",
       maker<ConvTranspose2d>(2, 3, 3, 2, 1, 1),
       {1, 2, 3, 3}},
      {"Conv2d(2, 3, 3, padding 1, padding_mode circular)",
       maker<Conv2d>(2, 3, 3, 1, 1, true, 1, 1, "circular"),
       {1, 2, 4, 4}},
      {"MaxPool2d(2)", maker<MaxPool2d>(2), {1, 2, 4, 4}},
      {"MaxPool2d(3, stride 1)", maker<MaxPool2d>(3, 1), {1, 1, 5, 5}},
      {"AvgPool2d(2)", maker<AvgPool2d>(2), {1, 2, 4, 4}},
      {"MaxPool2d(3, stride 2, padding 1, ceil_mode)",
       maker<MaxPool2d>(3, 2, 1, 1, true),
       {1, 2, 4, 4}},
      {"AvgPool2d(3, stride 2, padding 1, ceil_mode, count_include_pad=False)",
       maker<AvgPool2d>(3, 2, 1, true, false),
       {1, 2, 4, 4}},
      {"AdaptiveAvgPool2d((2, 3))", maker<AdaptiveAvgPool2d>(Size2{2, 3}), {1, 2, 5, 4}},
      {"AdaptiveMaxPool2d(1)", maker<AdaptiveMaxPool2d>(1), {2, 2, 3, 3}},
      {"Upsample(2, bilinear)", maker<Upsample>(2.0, "bilinear"), {1, 2, 3, 3}},
      {"Upsample(2, trilinear)", maker<Upsample>(2.0, "trilinear"), {1, 2, 2, 3, 2}},
      {"Upsample(1.5, linear, align_corners)", maker<Upsample>(1.5, "linear", true), {2, 2, 4}},
      {"Upsample((3, 4, 2))", maker<Upsample>(Size3{3, 4, 2}), {1, 1, 2, 2, 3}},
      {"Embedding(5, 3)", maker<Embedding>(5, 3), {2, 3}, 5},
      {"LayerNorm((4))", maker<LayerNorm>(Shape{4}), {3, 4}},
      {"LayerNorm((2, 3)) without affine", maker<LayerNorm>(Shape{2, 3}, 1e-5, false), {2, 2, 3}},
      {"Dropout(0.3), training", maker<Dropout>(0.3), {3, 5}},
      {"Flatten()", maker<Flatten>(), {2, 3, 2}},
      {"Flatten(0, 1)", maker<Flatten>(0, 1), {2, 3, 2}},
      {"ReLU", maker<ReLU>(), {3, 4}},
      {"Tanh", maker<Tanh>(), {3, 4}},
      {"GELU", maker<GELU>(), {3, 4}},
      {"GELU(approximate='tanh')", maker<GELU>("tanh"), {3, 4}},
      {"MultiheadAttention(4, 2)", maker<MultiheadAttention>(4, 2), {2, 3, 4}},
      {"MultiheadAttention(6, 3, bias=false)", maker<MultiheadAttention>(6, 3, false), {1, 4, 6}},
      {"MultiheadAttention(4, 2), causal", maker<CausalSelfAttention>(4, 2), {2, 3, 4}},
      {"Conv1d(2, 3, 3)", maker<Conv1d>(2, 3, 3), {2, 2, 6}},
      {"Conv1d(2, 2, 3, stride 2, padding 1, bias=false)",
       maker<Conv1d>(2, 2, 3, 2, 1, false),
       {1, 2, 7}},
      {"Conv1d(3, 2, 2), unbatched", maker<Conv1d>(3, 2, 2), {3, 5}},
      {"Conv1d(4, 2, 2, groups 2, dilation 2)",
       maker<Conv1d>(4, 2, 2, 1, 1, true, 2, 2),
       {1, 4, 5}},
      {"Conv1d(2, 2, 3, padding same, circular)",
       maker<Conv1d>(2, 2, 3, 1, kSame, true, 1, 1, "circular"),
       {2, 2, 4}},
      {"MaxPool1d(3, 2, padding 1)", maker<MaxPool1d>(3, 2, 1), {2, 2, 5}},
      {"AvgPool1d(2), unbatched", maker<AvgPool1d>(2), {3, 6}},
      {"AdaptiveAvgPool1d(3)", maker<AdaptiveAvgPool1d>(3), {1, 2, 7}},
      {"AdaptiveMaxPool1d(2)", maker<AdaptiveMaxPool1d>(2), {2, 2, 5}},
      {"Conv3d(2, 3, 2)", maker<Conv3d>(2, 3, 2), {2, 2, 3, 3, 4}},
      {"Conv3d(4, 2, (2, 1, 2), stride (2, 1, 1), groups 2, dilation (1, 1, 2), bias=false)",
       maker<Conv3d>(4, 2, Size3{2, 1, 2}, Size3{2, 1, 1}, 1, false, 2, Size3{1, 1, 2}),
       {1, 4, 4, 3, 5}},
      {"Conv3d(2, 2, 3, padding same, reflect), unbatched",
       maker<Conv3d>(2, 2, 3, 1, kSame, true, 1, 1, "reflect"),
       {2, 3, 4, 3}},
      {"ConvTranspose3d(4, 2, (2, 1, 2), stride 2, output_padding (1, 0, 1), groups 2)",
       maker<ConvTranspose3d>(4, 2, Size3{2, 1, 2}, 2, 0, Size3{1, 0, 1}, 2),
       {1, 4, 2, 3, 2}},
      {"ConvTranspose3d(2, 3, 2), unbatched", maker<ConvTranspose3d>(2, 3, 2), {2, 2, 3, 2}},
      {"MaxPool3d((2, 2, 3), 2, padding (1, 0, 1))",
       maker<MaxPool3d>(Size3{2, 2, 3}, 2, Size3{1, 0, 1}),
       {2, 2, 4, 4, 5}},
      {"AvgPool3d(2, ceil_mode), unbatched", maker<AvgPool3d>(2, 0, 0, true), {2, 3, 5, 4}},
      {"AdaptiveAvgPool3d((1, 2, 3))", maker<AdaptiveAvgPool3d>(Size3{1, 2, 3}), {1, 2, 3, 4, 5}},
      {"AdaptiveMaxPool3d(2)", maker<AdaptiveMaxPool3d>(2), {2, 2, 3, 3, 4}},
      {"BatchNorm1d(3)", maker<BatchNorm1d>(3), {4, 3}},
      {"BatchNorm1d(2) over (N, C, L)", maker<BatchNorm1d>(2), {3, 2, 4}},
      {"BatchNorm2d(2)", maker<BatchNorm2d>(2), {2, 2, 3, 3}},
      {"BatchNorm2d(3) without affine or running stats",
       maker<BatchNorm2d>(3, 1e-5, 0.1, false, false),
       {2, 3, 2, 2}},
      {"BatchNorm3d(2)", maker<BatchNorm3d>(2), {2, 2, 2, 2, 2}},
      {"Identity", maker<Identity>(), {2, 3}},
      {"RNN(3, 4)", maker<RecurrentOutputs<RNN>>(RNNOptions(3, 4)), {4, 2, 3}},
      {"RNN(3, 4), relu, 2 layers, batch_first",
       maker<RecurrentOutputs<RNN>>(
           RNNOptions(3, 4).nonlinearity("relu").num_layers(2).batch_first(true)),
       {2, 4, 3}},
      {"GRU(3, 4)", maker<RecurrentOutputs<GRU>>(GRUOptions(3, 4)), {4, 2, 3}},
      {"GRU(3, 3), 2 layers, bidirectional, batch_first",
       maker<RecurrentOutputs<GRU>>(
           GRUOptions(3, 3).num_layers(2).bidirectional(true).batch_first(true)),
       {2, 3, 3}},
      {"GRU(2, 3), unbatched", maker<RecurrentOutputs<GRU>>(GRUOptions(2, 3)), {4, 2}},
      {"LSTM(3, 4)", maker<RecurrentOutputs<LSTM>>(LSTMOptions(3, 4)), {4, 2, 3}},
      {"LSTM(2, 3), 2 layers, bidirectional, bias=false",
       maker<RecurrentOutputs<LSTM>>(
           LSTMOptions(2, 3).num_layers(2).bidirectional(true).bias(false)),
       {3, 2, 2}},
      // Followed by a Linear: a compiled forward whose result is saved by its own gradient rule
      // (tanh's result, here) and never backwarded leaks today (a cycle between the result and
      // its tape node), which the ASan build reports; `compile(tanh(x * 2))` on an x that
      // requires grad shows it without nn.
      {"RNNCell(3, 4), then Linear(4, 2)",
       [] { return ModulePtr(std::make_shared<Sequential>(RNNCell(3, 4), Linear(4, 2))); },
       {2, 3}},
      {"GRUCell(3, 4), unbatched", maker<GRUCell>(3, 4), {3}},
      {"LSTMCell(3, 2)", maker<LSTMCellOutputs>(3, 2, true), {2, 3}},
      {"LSTMCell(2, 3, bias=false)", maker<LSTMCellOutputs>(2, 3, false), {4, 2}},
      {"ModuleList of Linear layers", maker<ListNet>(), {3, 4}},
      {"Sequential of Conv1d, BatchNorm1d, ReLU, Flatten, Linear",
       [] {
         return ModulePtr(std::make_shared<Sequential>(Conv1d(2, 3, 3, 1, 1), BatchNorm1d(3),
                                                       ReLU(), Flatten(), Linear(15, 2)));
       },
       {4, 2, 5}},
      {"Sigmoid", maker<Sigmoid>(), {3, 4}},
      {"SiLU", maker<SiLU>(), {3, 4}},
      {"Softplus", maker<Softplus>(), {3, 4}},
      {"Softplus(beta=2, threshold=1)", maker<Softplus>(2, 1), {3, 4}},
      {"LeakyReLU(0.2)", maker<LeakyReLU>(0.2), {3, 4}},
      {"ELU", maker<ELU>(), {3, 4}},
      {"SELU", maker<SELU>(), {3, 4}},
      {"CELU(2)", maker<CELU>(2), {3, 4}},
      {"Hardtanh(-0.5, 0.5)", maker<Hardtanh>(-0.5, 0.5), {3, 4}},
      {"ReLU6", maker<ReLU6>(), {3, 4}},
      {"Hardsigmoid", maker<Hardsigmoid>(), {3, 4}},
      {"Hardswish", maker<Hardswish>(), {3, 4}},
      {"Mish", maker<Mish>(), {3, 4}},
      {"GLU(1)", maker<GLU>(1), {3, 4}},
      {"PReLU(3)", maker<PReLU>(3), {2, 3, 2}},
      {"Softmax(1)", maker<Softmax>(1), {3, 4}},
      {"LogSoftmax(-1)", maker<LogSoftmax>(-1), {3, 4}},
      {"GroupNorm(2, 4)", maker<GroupNorm>(2, 4), {2, 4, 3}},
      {"RMSNorm((4))", maker<RMSNorm>(Shape{4}), {3, 4}},
      {"RMSNorm((2, 3)) without affine", maker<RMSNorm>(Shape{2, 3}, 1e-6, false), {2, 2, 3}},
      {"InstanceNorm2d(3, affine)", maker<InstanceNorm2d>(3, 1e-5, 0.1, true), {2, 3, 2, 2}},
      {"InstanceNorm1d(2), unbatched", maker<InstanceNorm1d>(2), {2, 5}},
      {"InstanceNorm1d(3, affine, track_running_stats)",
       maker<InstanceNorm1d>(3, 1e-5, 0.1, true, true), {2, 3, 4}},
      {"Sequential MLP with dropout",
       [] {
         return ModulePtr(
             std::make_shared<Sequential>(Linear(4, 5), Tanh(), Dropout(0.2), Linear(5, 2)));
       },
       {3, 4}},
      {"Sequential CNN",
       [] {
         return ModulePtr(std::make_shared<Sequential>(Conv2d(1, 2, 3), ReLU(), MaxPool2d(2),
                                                       Flatten(), Linear(8, 3)));
       },
       {2, 1, 6, 6}},
      {"Sequential of embedding, layer norm, gelu, linear",
       [] {
         return ModulePtr(std::make_shared<Sequential>(Embedding(6, 4), LayerNorm(Shape{4}), GELU(),
                                                       Linear(4, 2)));
       },
       {2, 3},
       6},
  };
  return rows;
}

Tensor make_input(const LayerRow& row, DType dtype) {
  return row.index_high ? randint(row.index_high, row.input)
                        : randn(row.input, Options().dtype(dtype));
}

// ---- optimizers ----

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimCase& c, std::vector<Tensor> params) {
  switch (c.kind) {
    case OptimKind::SGD:
      return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = c.lr,
                                                                    .momentum = c.momentum,
                                                                    .weight_decay = c.weight_decay,
                                                                    .nesterov = c.nesterov});
    case OptimKind::Adam:
      return std::make_unique<optim::Adam>(params,
                                           optim::AdamOptions{.lr = c.lr,
                                                              .betas = {c.beta1, c.beta2},
                                                              .eps = c.eps,
                                                              .weight_decay = c.weight_decay});
    case OptimKind::AdamW:
      return std::make_unique<optim::AdamW>(params,
                                            optim::AdamWOptions{.lr = c.lr,
                                                                .betas = {c.beta1, c.beta2},
                                                                .eps = c.eps,
                                                                .weight_decay = c.weight_decay});
    case OptimKind::RMSprop:
      return std::make_unique<optim::RMSprop>(params,
                                              optim::RMSpropOptions{.lr = c.lr,
                                                                    .alpha = c.alpha,
                                                                    .eps = c.eps,
                                                                    .weight_decay = c.weight_decay,
                                                                    .momentum = c.momentum,
                                                                    .centered = c.centered});
  }
  return nullptr;
}

const std::vector<OptimCase>& optimizer_cases() {
  static const std::vector<OptimCase> cases = {
      {.name = "SGD", .kind = OptimKind::SGD, .lr = 0.1},
      {.name = "SGD weight_decay", .kind = OptimKind::SGD, .lr = 0.1, .weight_decay = 0.05},
      {.name = "SGD momentum", .kind = OptimKind::SGD, .lr = 0.05, .momentum = 0.9},
      {.name = "SGD momentum weight_decay",
       .kind = OptimKind::SGD,
       .lr = 0.05,
       .momentum = 0.8,
       .weight_decay = 0.1},
      {.name = "SGD nesterov",
       .kind = OptimKind::SGD,
       .lr = 0.05,
       .momentum = 0.7,
       .weight_decay = 0.01,
       .nesterov = true},
      {.name = "Adam", .kind = OptimKind::Adam, .lr = 0.01},
      {.name = "Adam betas eps weight_decay",
       .kind = OptimKind::Adam,
       .lr = 0.02,
       .weight_decay = 0.05,
       .beta1 = 0.8,
       .beta2 = 0.95,
       .eps = 1e-3},
      {.name = "Adam beta1 0", .kind = OptimKind::Adam, .lr = 0.01, .beta1 = 0, .beta2 = 0.5},
      {.name = "AdamW", .kind = OptimKind::AdamW, .lr = 0.01, .weight_decay = 1e-2},
      {.name = "AdamW strong decay",
       .kind = OptimKind::AdamW,
       .lr = 0.05,
       .weight_decay = 0.3,
       .beta1 = 0.5,
       .beta2 = 0.9,
       .eps = 1e-4},
      {.name = "RMSprop", .kind = OptimKind::RMSprop, .lr = 0.01},
      {.name = "RMSprop momentum weight_decay",
       .kind = OptimKind::RMSprop,
       .lr = 0.005,
       .momentum = 0.9,
       .weight_decay = 0.05,
       .eps = 1e-3,
       .alpha = 0.9},
      {.name = "RMSprop centered",
       .kind = OptimKind::RMSprop,
       .lr = 0.01,
       .alpha = 0.95,
       .centered = true},
      // alpha < 0.5 takes lerp's other form for the centered average.
      {.name = "RMSprop centered momentum alpha 0.3",
       .kind = OptimKind::RMSprop,
       .lr = 0.002,
       .momentum = 0.5,
       .weight_decay = 0.01,
       .alpha = 0.3,
       .centered = true},
  };
  return cases;
}

// ---- learning-rate schedules ----

const std::vector<ScheduleRow>& schedule_rows() {
  static const std::vector<ScheduleRow> rows = {
      {"StepLR",
       [](optim::Optimizer& o, auto&) { return std::make_unique<optim::StepLR>(o, 3, 0.5); }},
      {"CosineAnnealingLR",
       [](optim::Optimizer& o, auto&) {
         return std::make_unique<optim::CosineAnnealingLR>(o, 6, 0.01);
       }},
      {"LinearLR", [](optim::Optimizer& o,
                      auto&) { return std::make_unique<optim::LinearLR>(o, 0.2, 1.0, 5); }},
      {"OneCycleLR",
       [](optim::Optimizer& o, auto&) {
         return std::make_unique<optim::OneCycleLR>(o, 0.3, 16, optim::OneCycleLROptions{});
       }},
      {"SequentialLR",
       [](optim::Optimizer& o, std::vector<std::unique_ptr<optim::LRScheduler>>& held) {
         held.push_back(std::make_unique<optim::LinearLR>(o, 0.1, 1.0, 4));
         held.push_back(std::make_unique<optim::CosineAnnealingLR>(o, 10));
         return std::make_unique<optim::SequentialLR>(
             o, std::vector<std::reference_wrapper<optim::LRScheduler>>{*held[0], *held[1]},
             std::vector<int64_t>{4});
       }},
  };
  return rows;
}

// ---- losses ----

const std::vector<LossRow>& loss_rows() {
  using T = LossRow::Target;
  static const std::vector<LossRow> rows = {
      {"mse_loss", [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); }, T::Values},
      {"cross_entropy", [](const Tensor& o, const Tensor& t) { return cross_entropy(o, t); },
       T::Classes},
      {"cross_entropy, sum, ignore_index 1",
       [](const Tensor& o, const Tensor& t) {
         return cross_entropy(o, t,
                              CrossEntropyOptions().reduction(Reduction::Sum).ignore_index(1));
       },
       T::Classes},
      {"cross_entropy, label smoothing 0.1 and class weights",
       [](const Tensor& o, const Tensor& t) {
         // The weights on the logits' device, as the options ask.
         const Tensor w = (arange(o.size(1), Options().dtype(o.dtype())) + 1) / 2;
         return cross_entropy(o, t,
                              CrossEntropyOptions().label_smoothing(0.1).weight(w.to(o.device())));
       },
       T::Classes},
      {"cross_entropy against probabilities",
       [](const Tensor& o, const Tensor& t) { return cross_entropy(o, softmax(t, 1)); }, T::Values},
      {"nll_loss of log_softmax",
       [](const Tensor& o, const Tensor& t) { return nll_loss(log_softmax(o, 1), t); }, T::Classes},
      {"nll_loss, sum",
       [](const Tensor& o, const Tensor& t) { return nll_loss(log_softmax(o, 1), t, "sum"); },
       T::Classes},
      {"binary_cross_entropy_with_logits",
       [](const Tensor& o, const Tensor& t) { return binary_cross_entropy_with_logits(o, t); },
       T::Probabilities},
  };
  return rows;
}

Tensor make_target(const LossRow& row, int64_t n, int64_t c, DType dtype) {
  switch (row.target) {
    case LossRow::Target::Classes:
      return randint(c, {n});
    case LossRow::Target::Values:
      return randn({n, c}, Options().dtype(dtype));
    case LossRow::Target::Probabilities:
      return rand({n, c}, Options().dtype(dtype));
  }
  return Tensor();
}

}  // namespace duet::test
