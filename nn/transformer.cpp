// duet: the transformer layers of nn/transformer.h.
#include "nn/transformer.h"

#include <limits>

#include "core/ops.h"
#include "core/op_table.h"
#include "nn/init.h"

namespace duet::nn {

namespace {
// The layer's printed name: PyTorch's first five arguments, and the others that differ from
// their defaults.
std::string layer_name(const char* cls, const TransformerEncoderLayerOptions& o) {
  std::string s =
      fmt::format("{}(d_model={}, nhead={}, dim_feedforward={}, dropout={}, activation={}", cls,
                  o.d_model(), o.nhead(), o.dim_feedforward(), o.dropout(), o.activation());
  if (o.layer_norm_eps() != 1e-5) s += fmt::format(", layer_norm_eps={}", o.layer_norm_eps());
  if (o.batch_first()) s += ", batch_first=true";
  if (o.norm_first()) s += ", norm_first=true";
  if (!o.bias()) s += ", bias=false";
  return s + ")";
}

const TransformerEncoderLayerOptions& checked(const char* op,
                                              const TransformerEncoderLayerOptions& o) {
  DUET_CHECK_VALUE(o.dim_feedforward() > 0, "[{}] dim_feedforward must be positive, got {}", op,
                   o.dim_feedforward());
  DUET_CHECK_VALUE(o.dropout() >= 0 && o.dropout() <= 1, "[{}] dropout must be in [0, 1], got {}",
                   op, o.dropout());
  DUET_CHECK_VALUE(o.activation() == "relu" || o.activation() == "gelu",
                   "[{}] activation must be \"relu\" or \"gelu\", got \"{}\"", op, o.activation());
  DUET_CHECK_VALUE(o.layer_norm_eps() > 0, "[{}] layer_norm_eps must be positive, got {}", op,
                   o.layer_norm_eps());
  return o;
}

// linear2(dropout(act(linear1(x)))), the layers' feed-forward network.
Tensor feed_forward(const std::string& activation, Linear& linear1, Dropout& dropout,
                    Linear& linear2, const Tensor& x) {
  Tensor h = linear1(x);
  h = activation == "gelu" ? gelu(h) : relu(h);
  return linear2(dropout(h));
}

// Sequence-first tensors as MultiheadAttention takes them, batch first (and back).
Tensor batch_first(const Tensor& x, const TransformerEncoderLayerOptions& o) {
  return o.batch_first() ? x : transpose(x, 0, 1);
}

}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o)
    : Module(layer_name("TransformerEncoderLayer", checked("TransformerEncoderLayer", o))),
      options(o),
      self_attn(o.d_model(), o.nhead(), o.bias(), o.dropout()),
      linear1(o.d_model(), o.dim_feedforward(), o.bias()),
      linear2(o.dim_feedforward(), o.d_model(), o.bias()),
      dropout(o.dropout()),
      dropout1(o.dropout()),
      dropout2(o.dropout()),
      norm1(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias()),
      norm2(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias()) {
  // PyTorch's names and order (its state_dict's).
  self_attn = register_module("self_attn", self_attn);
  linear1 = register_module("linear1", linear1);
  dropout = register_module("dropout", dropout);
  linear2 = register_module("linear2", linear2);
  norm1 = register_module("norm1", norm1);
  norm2 = register_module("norm2", norm2);
  dropout1 = register_module("dropout1", dropout1);
  dropout2 = register_module("dropout2", dropout2);
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  DUET_CHECK_SHAPE(src.dim() == 3, "[TransformerEncoderLayer] src must be {} (3-D), got {}",
                   options.batch_first() ? "(N, S, E)" : "(S, N, E)", src.sizes());
  Tensor x = batch_first(src, options);
  auto attend = [&](const Tensor& v) {
    return dropout1(self_attn.forward(v, v, v, src_mask, is_causal, src_key_padding_mask));
  };
  auto ff = [&](const Tensor& v) {
    return dropout2(feed_forward(options.activation(), linear1, dropout, linear2, v));
  };
  if (options.norm_first()) {
    x = x + attend(norm1(x));
    x = x + ff(norm2(x));
  } else {
    x = norm1(x + attend(x));
    x = norm2(x + ff(x));
  }
  return batch_first(x, options);
}

template <class Layer>
TransformerStack::TransformerStack(const char* cls, const Layer& layer, int64_t n,
                                   std::optional<LayerNorm> final_norm)
    : Module(fmt::format("{}(num_layers={}{})", cls, n, final_norm ? ", norm" : "")),
      norm(std::move(final_norm)),
      num_layers(n) {
  DUET_CHECK_VALUE(n > 0, "[{}] num_layers must be positive, got {}", cls, n);
  // Copies of the layer's values, each with tensors of its own (a module copy would share them).
  const StateDict values = layer.state_dict();
  for (int64_t i = 0; i < n; ++i) {
    Layer copy(layer.options);
    copy.load_state_dict(values);
    copy.train(layer.is_training());
    layers.push_back(copy);
  }
  layers = register_module("layers", layers);
  if (norm) norm = register_module("norm", *norm);
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& layer, int64_t n,
                                       std::optional<LayerNorm> final_norm)
    : TransformerStack("TransformerEncoder", layer, n, std::move(final_norm)) {}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal) {
  Tensor x = src;
  for (const std::shared_ptr<Module>& m : layers)
    x = std::static_pointer_cast<TransformerEncoderLayer>(m)->forward(x, mask, src_key_padding_mask,
                                                                      is_causal);
  return norm ? (*norm)(x) : x;
}

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerDecoderLayerOptions& o)
    : Module(layer_name("TransformerDecoderLayer", checked("TransformerDecoderLayer", o))),
      options(o),
      self_attn(o.d_model(), o.nhead(), o.bias(), o.dropout()),
      multihead_attn(o.d_model(), o.nhead(), o.bias(), o.dropout()),
      linear1(o.d_model(), o.dim_feedforward(), o.bias()),
      linear2(o.dim_feedforward(), o.d_model(), o.bias()),
      dropout(o.dropout()),
      dropout1(o.dropout()),
      dropout2(o.dropout()),
      dropout3(o.dropout()),
      norm1(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias()),
      norm2(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias()),
      norm3(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias()) {
  self_attn = register_module("self_attn", self_attn);
  multihead_attn = register_module("multihead_attn", multihead_attn);
  linear1 = register_module("linear1", linear1);
  dropout = register_module("dropout", dropout);
  linear2 = register_module("linear2", linear2);
  norm1 = register_module("norm1", norm1);
  norm2 = register_module("norm2", norm2);
  norm3 = register_module("norm3", norm3);
  dropout1 = register_module("dropout1", dropout1);
  dropout2 = register_module("dropout2", dropout2);
  dropout3 = register_module("dropout3", dropout3);
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const Tensor& tgt_mask, const Tensor& memory_mask,
                                        const Tensor& tgt_key_padding_mask,
                                        const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                        bool memory_is_causal) {
  const char* shape = options.batch_first() ? "(N, T, E) and (N, S, E)" : "(T, N, E) and (S, N, E)";
  DUET_CHECK_SHAPE(tgt.dim() == 3 && memory.dim() == 3,
                   "[TransformerDecoderLayer] tgt and memory must be {} (3-D), got {} and {}",
                   shape, tgt.sizes(), memory.sizes());
  Tensor x = batch_first(tgt, options);
  const Tensor mem = batch_first(memory, options);
  auto attend = [&](const Tensor& v) {
    return dropout1(self_attn.forward(v, v, v, tgt_mask, tgt_is_causal, tgt_key_padding_mask));
  };
  auto cross = [&](const Tensor& v) {
    return dropout2(multihead_attn.forward(v, mem, mem, memory_mask, memory_is_causal,
                                           memory_key_padding_mask));
  };
  auto ff = [&](const Tensor& v) {
    return dropout3(feed_forward(options.activation(), linear1, dropout, linear2, v));
  };
  if (options.norm_first()) {
    x = x + attend(norm1(x));
    x = x + cross(norm2(x));
    x = x + ff(norm3(x));
  } else {
    x = norm1(x + attend(x));
    x = norm2(x + cross(x));
    x = norm3(x + ff(x));
  }
  return batch_first(x, options);
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderLayer& layer, int64_t n,
                                       std::optional<LayerNorm> final_norm)
    : TransformerStack("TransformerDecoder", layer, n, std::move(final_norm)) {}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                   const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                   const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                   bool memory_is_causal) {
  Tensor x = tgt;
  for (const std::shared_ptr<Module>& m : layers)
    x = std::static_pointer_cast<TransformerDecoderLayer>(m)->forward(
        x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
        tgt_is_causal, memory_is_causal);
  return norm ? (*norm)(x) : x;
}

Transformer::Transformer(const TransformerEncoderLayerOptions& o, int64_t encoders,
                         int64_t decoders)
    : Module(fmt::format("Transformer(d_model={}, nhead={}, num_encoder_layers={}, "
                         "num_decoder_layers={})",
                         o.d_model(), o.nhead(), encoders, decoders)),
      encoder(TransformerEncoderLayer(o), encoders,
              LayerNorm(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias())),
      decoder(TransformerDecoderLayer(o), decoders,
              LayerNorm(Shape{o.d_model()}, o.layer_norm_eps(), true, o.bias())),
      d_model(o.d_model()),
      nhead(o.nhead()),
      batch_first(o.batch_first()) {
  encoder = register_module("encoder", encoder);
  decoder = register_module("decoder", decoder);
  for (Tensor& p : parameters())
    if (p.dim() > 1) init::xavier_uniform_(p);
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt, const Tensor& src_mask,
                            const Tensor& tgt_mask, const Tensor& memory_mask,
                            const Tensor& src_key_padding_mask, const Tensor& tgt_key_padding_mask,
                            const Tensor& memory_key_padding_mask, bool src_is_causal,
                            bool tgt_is_causal, bool memory_is_causal) {
  const int64_t batch = batch_first ? 0 : 1;
  const char* op = "Transformer";
  DUET_CHECK_SHAPE(
      src.dim() == 3 && tgt.dim() == 3 &&
          duet::detail::size_is(tgt, batch, duet::detail::sym_dim(src, batch), op) &&
          duet::detail::size_is(src, 2, d_model, op) && duet::detail::size_is(tgt, 2, d_model, op),
      "[Transformer] src and tgt must be {} with one batch size and d_model {}, got {} "
      "and {}",
      batch_first ? "(N, S, E) and (N, T, E)" : "(S, N, E) and (T, N, E)", d_model, src.sizes(),
      tgt.sizes());
  const Tensor memory = encoder.forward(src, src_mask, src_key_padding_mask, src_is_causal);
  return decoder.forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                         memory_key_padding_mask, tgt_is_causal, memory_is_causal);
}

Tensor Transformer::generate_square_subsequent_mask(int64_t sz, DType dtype) {
  DUET_CHECK_VALUE(sz >= 0,
                   "[Transformer] generate_square_subsequent_mask needs a size >= 0, got {}", sz);
  const Tensor above = triu(ones({sz, sz}), 1).to(DType::b8);
  return where(above, -std::numeric_limits<double>::infinity(),
               zeros({sz, sz}, Options().dtype(dtype)));
}

}  // namespace duet::nn
