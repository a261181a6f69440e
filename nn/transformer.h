// duet: torch.nn.TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
// TransformerDecoder and Transformer, with PyTorch's options, defaults, submodule names (so a
// PyTorch state_dict loads as it is) and equations, over nn::MultiheadAttention (nn/layers.h).
#pragma once

#include <optional>
#include <string>

#include "nn/layers.h"

namespace duet::nn {

/// The options of a TransformerEncoderLayer (and a TransformerDecoderLayer), LibTorch's names
/// with PyTorch's defaults.
struct TransformerEncoderLayerOptions {
  TransformerEncoderLayerOptions(int64_t d_model, int64_t nhead)
      : d_model_(d_model), nhead_(nhead) {}
#define DUET_OPTION(type, name)                  \
  TransformerEncoderLayerOptions& name(type v) { \
    name##_ = v;                                 \
    return *this;                                \
  }                                              \
  type name() const { return name##_; }
  DUET_OPTION(int64_t, d_model)
  DUET_OPTION(int64_t, nhead)
  DUET_OPTION(int64_t, dim_feedforward)  ///< the feed-forward's hidden width (2048)
  DUET_OPTION(double, dropout)           ///< of the attention weights and the residual
                                         ///< branches' dropouts (0.1)
  DUET_OPTION(std::string, activation)   ///< "relu" (the default) or "gelu" (the exact one)
  DUET_OPTION(double, layer_norm_eps)    ///< 1e-5
  DUET_OPTION(bool, batch_first)         ///< (N, S, E) when true; (S, N, E), the default, when not
  DUET_OPTION(bool, norm_first)          ///< pre-norm: x + f(norm(x)); post-norm (the default):
                                         ///< norm(x + f(x))
  DUET_OPTION(bool, bias)  ///< the linear layers', the attention's and the norms' biases (true)
#undef DUET_OPTION

 private:
  int64_t d_model_, nhead_, dim_feedforward_ = 2048;
  double dropout_ = 0.1;
  std::string activation_ = "relu";
  double layer_norm_eps_ = 1e-5;
  bool batch_first_ = false, norm_first_ = false, bias_ = true;
};

using TransformerDecoderLayerOptions = TransformerEncoderLayerOptions;

/// Self-attention and a feed-forward network, each a residual branch with dropout and a layer
/// norm, as torch.nn.TransformerEncoderLayer: post-norm
///     x = norm1(x + dropout1(self_attn(x))); x = norm2(x +
///     dropout2(linear2(dropout(act(linear1(x))))))
/// or, with norm_first, x = x + dropout1(self_attn(norm1(x))); x = x + dropout2(ff(norm2(x))).
class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options);
  TransformerEncoderLayer(int64_t d_model, int64_t nhead)
      : TransformerEncoderLayer(TransformerEncoderLayerOptions(d_model, nhead)) {}
  Tensor forward(const Tensor& src) override { return forward(src, {}, {}, false); }
  /// src_mask: MultiheadAttention's attn_mask, (S, S) or (N * nhead, S, S); src_key_padding_mask:
  /// (N, S), b8 true where a key is padding (or floating, added to the scores); is_causal: each
  /// position attends to itself and those before it (not with a src_mask).
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = {},
                 bool is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& src_mask,
                    const Tensor& src_key_padding_mask = {}, bool is_causal = false, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(src, src_mask, src_key_padding_mask, is_causal);
  }

  TransformerEncoderLayerOptions options;
  MultiheadAttention self_attn;
  Linear linear1, linear2;
  Dropout dropout, dropout1, dropout2;
  LayerNorm norm1, norm2;
};

/// The layers of a TransformerEncoder or TransformerDecoder (layers.0, layers.1, ...) and its
/// optional final norm. Its layers start equal to the layer it is made from (PyTorch deep-copies
/// it) and train apart: each has parameters of its own.
class TransformerStack : public Module {
 public:
  ModuleList layers;
  std::optional<LayerNorm> norm;
  int64_t num_layers;

 protected:
  // cls: the class ("TransformerEncoder"); Layer: its layer's class.
  template <class Layer>
  TransformerStack(const char* cls, const Layer& layer, int64_t num_layers,
                   std::optional<LayerNorm> norm);
};

/// num_layers copies of a TransformerEncoderLayer, then an optional norm, as
/// torch.nn.TransformerEncoder.
class TransformerEncoder : public TransformerStack {
 public:
  TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers,
                     std::optional<LayerNorm> norm = std::nullopt);
  Tensor forward(const Tensor& src) override { return forward(src, {}, {}, false); }
  /// Each layer's forward with these masks, then the norm.
  Tensor forward(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = {},
                 bool is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = {},
                    bool is_causal = false, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(src, mask, src_key_padding_mask, is_causal);
  }
};

/// Self-attention, attention to the encoder's output (memory) and a feed-forward network, each a
/// residual branch with dropout and a layer norm, as torch.nn.TransformerDecoderLayer: post-norm
///     x = norm1(x + dropout1(self_attn(x))); x = norm2(x + dropout2(multihead_attn(x, memory)));
///     x = norm3(x + dropout3(linear2(dropout(act(linear1(x))))))
/// or, with norm_first, each branch on its norm's output, added to x.
class TransformerDecoderLayer : public Module {
 public:
  explicit TransformerDecoderLayer(const TransformerDecoderLayerOptions& options);
  TransformerDecoderLayer(int64_t d_model, int64_t nhead)
      : TransformerDecoderLayer(TransformerDecoderLayerOptions(d_model, nhead)) {}
  /// tgt_mask and memory_mask: MultiheadAttention's attn_mask for the self-attention (T, T) and
  /// the attention to memory (T, S); the key padding masks (N, T) and (N, S); tgt_is_causal:
  /// each target position attends to itself and those before it (not with a tgt_mask).
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = {},
                 const Tensor& memory_mask = {}, const Tensor& tgt_key_padding_mask = {},
                 const Tensor& memory_key_padding_mask = {}, bool tgt_is_causal = false,
                 bool memory_is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = {},
                    const Tensor& memory_mask = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(tgt, memory, tgt_mask, memory_mask);
  }

  TransformerDecoderLayerOptions options;
  MultiheadAttention self_attn, multihead_attn;
  Linear linear1, linear2;
  Dropout dropout, dropout1, dropout2, dropout3;
  LayerNorm norm1, norm2, norm3;
};

/// num_layers copies of a TransformerDecoderLayer, then an optional norm, as
/// torch.nn.TransformerDecoder.
class TransformerDecoder : public TransformerStack {
 public:
  TransformerDecoder(const TransformerDecoderLayer& layer, int64_t num_layers,
                     std::optional<LayerNorm> norm = std::nullopt);
  /// Each layer's forward with these masks, then the norm.
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = {},
                 const Tensor& memory_mask = {}, const Tensor& tgt_key_padding_mask = {},
                 const Tensor& memory_key_padding_mask = {}, bool tgt_is_causal = false,
                 bool memory_is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = {},
                    const Tensor& memory_mask = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(tgt, memory, tgt_mask, memory_mask);
  }
};

/// An encoder and a decoder, each with a final norm, as torch.nn.Transformer: the layers take
/// the options (PyTorch's Transformer defaults: d_model 512, nhead 8), and every parameter with
/// two or more dims starts from xavier_uniform_, as PyTorch's _reset_parameters.
class Transformer : public Module {
 public:
  explicit Transformer(const TransformerEncoderLayerOptions& options = {512, 8},
                       int64_t num_encoder_layers = 6, int64_t num_decoder_layers = 6);
  /// The encoder's output for src, and the decoder's for tgt on it, with each one's masks
  /// (memory_mask and memory_key_padding_mask for the decoder's attention to it).
  Tensor forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask = {},
                 const Tensor& tgt_mask = {}, const Tensor& memory_mask = {},
                 const Tensor& src_key_padding_mask = {}, const Tensor& tgt_key_padding_mask = {},
                 const Tensor& memory_key_padding_mask = {}, bool src_is_causal = false,
                 bool tgt_is_causal = false, bool memory_is_causal = false);
  using Module::operator();
  Tensor operator()(const Tensor& src, const Tensor& tgt, const Tensor& src_mask = {},
                    const Tensor& tgt_mask = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(src, tgt, src_mask, tgt_mask);
  }
  /// The (sz, sz) floating mask of a causal self-attention: -inf above the diagonal, 0 on and
  /// below it (PyTorch's Transformer.generate_square_subsequent_mask).
  static Tensor generate_square_subsequent_mask(int64_t sz, DType dtype = DType::f32);

  TransformerEncoder encoder;
  TransformerDecoder decoder;
  int64_t d_model, nhead;
  bool batch_first;
};

}  // namespace duet::nn
