// duet: the transformer encoder layers of nn/transformer.h.
#include "nn/transformer.h"

#include "core/ops.h"

namespace duet::nn {

namespace {
// The layer's printed name: PyTorch's constructor arguments that differ from the defaults.
std::string layer_name(const TransformerEncoderLayerOptions& o) {
  std::string s = fmt::format(
      "TransformerEncoderLayer(d_model={}, nhead={}, dim_feedforward={}, "
      "dropout={}, activation={}",
      o.d_model(), o.nhead(), o.dim_feedforward(), o.dropout(), o.activation());
  if (o.layer_norm_eps() != 1e-5) s += fmt::format(", layer_norm_eps={}", o.layer_norm_eps());
  if (o.batch_first()) s += ", batch_first=true";
  if (o.norm_first()) s += ", norm_first=true";
  return s + ")";
}

const TransformerEncoderLayerOptions& checked(const TransformerEncoderLayerOptions& o) {
  const char* op = "TransformerEncoderLayer";
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
}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& o)
    : Module(layer_name(checked(o))),
      options(o),
      self_attn(o.d_model(), o.nhead(), true, o.dropout()),
      linear1(o.d_model(), o.dim_feedforward()),
      linear2(o.dim_feedforward(), o.d_model()),
      dropout(o.dropout()),
      dropout1(o.dropout()),
      dropout2(o.dropout()),
      norm1(Shape{o.d_model()}, o.layer_norm_eps()),
      norm2(Shape{o.d_model()}, o.layer_norm_eps()) {
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
  // MultiheadAttention takes the batch first.
  Tensor x = options.batch_first() ? src : transpose(src, 0, 1);
  auto attend = [&](const Tensor& v) {
    return dropout1(self_attn.forward(v, v, v, src_mask, is_causal, src_key_padding_mask));
  };
  auto feed_forward = [&](const Tensor& v) {
    Tensor h = linear1(v);
    h = options.activation() == "gelu" ? gelu(h) : relu(h);
    return dropout2(linear2(dropout(h)));
  };
  if (options.norm_first()) {
    x = x + attend(norm1(x));
    x = x + feed_forward(norm2(x));
  } else {
    x = norm1(x + attend(x));
    x = norm2(x + feed_forward(x));
  }
  return options.batch_first() ? x : transpose(x, 0, 1);
}

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& layer, int64_t n,
                                       std::optional<LayerNorm> final_norm)
    : Module(fmt::format("TransformerEncoder(num_layers={}{})", n, final_norm ? ", norm" : "")),
      norm(std::move(final_norm)),
      num_layers(n) {
  DUET_CHECK_VALUE(n > 0, "[TransformerEncoder] num_layers must be positive, got {}", n);
  // Copies of the layer's values, each with tensors of its own (a module copy would share them).
  const StateDict values = layer.state_dict();
  for (int64_t i = 0; i < n; ++i) {
    TransformerEncoderLayer copy(layer.options);
    copy.load_state_dict(values);
    copy.train(layer.is_training());
    layers.push_back(copy);
  }
  layers = register_module("layers", layers);
  if (norm) norm = register_module("norm", *norm);
}

Tensor TransformerEncoder::forward(const Tensor& src, const Tensor& mask,
                                   const Tensor& src_key_padding_mask, bool is_causal) {
  Tensor x = src;
  for (const std::shared_ptr<Module>& m : layers)
    x = std::static_pointer_cast<TransformerEncoderLayer>(m)->forward(x, mask, src_key_padding_mask,
                                                                      is_causal);
  return norm ? (*norm)(x) : x;
}

}  // namespace duet::nn
