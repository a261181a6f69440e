// GPT-2 written with duet's nn modules, as nanoGPT writes it in PyTorch: learned token and
// position embeddings, pre-LayerNorm blocks (causal self-attention through
// scaled_dot_product_attention, then an MLP of four times the width with the tanh form of GELU),
// a final LayerNorm, and logits from the token embedding (tied input and output embeddings).
// GPT-2 small is GptConfig{} (124M parameters); samples/gpt.cpp trains a smaller one on text,
// bench/gpt.cpp times GPT-2 small (W9), tests/test_gpt.cpp checks two blocks eager against
// compiled.
//
// Besides forward() over whole sequences, the model decodes one token at a time with a cache of
// every block's keys and values (decode_step), which a compiled function runs at a symbolic
// cache length.
#pragma once

#include <cmath>
#include <vector>

#include "duet.h"

namespace gpt {

using duet::Tensor;

struct GptConfig {
  int64_t vocab = 50257, context = 1024, width = 768, heads = 12, layers = 12;
};

/// Multi-head causal self-attention: one Linear for q, k and v, one for the output.
class CausalSelfAttention : public duet::nn::Module {
 public:
  explicit CausalSelfAttention(const GptConfig& c)
      : heads(c.heads),
        c_attn(register_module("c_attn", duet::nn::Linear(c.width, 3 * c.width))),
        c_proj(register_module("c_proj", duet::nn::Linear(c.width, c.width))) {}

  /// x (N, T, C) -> (N, T, C), each position attending to itself and those before it.
  Tensor forward(const Tensor& x) override {
    auto [q, k, v] = split_heads(c_attn(x));
    return merge_heads(duet::scaled_dot_product_attention(q, k, v, {}, /*is_causal=*/true));
  }

  /// x (N, 1, C), the newest position, attending to the cached keys and values (N, H, t, D) of
  /// the positions before it and to itself; the caches grow by one position.
  Tensor step(const Tensor& x, Tensor& k_cache, Tensor& v_cache) {
    auto [q, k, v] = split_heads(c_attn(x));
    k_cache = duet::cat({k_cache, k}, 2);
    v_cache = duet::cat({v_cache, v}, 2);
    return merge_heads(duet::scaled_dot_product_attention(q, k_cache, v_cache));
  }

  int64_t heads;
  duet::nn::Linear c_attn, c_proj;

 private:
  // (N, T, 3C) -> q, k, v, each (N, H, T, C / H).
  std::tuple<Tensor, Tensor, Tensor> split_heads(const Tensor& qkv) const {
    const int64_t n = qkv.size(0), c = qkv.size(2) / 3;
    auto part = [&](int64_t i) {
      return duet::slice(qkv, 2, i * c, (i + 1) * c)
          .reshape({n, -1, heads, c / heads})
          .transpose(1, 2);
    };
    return {part(0), part(1), part(2)};
  }
  // (N, H, T, D) -> (N, T, H * D), then the output projection.
  Tensor merge_heads(const Tensor& y) {
    const int64_t n = y.size(0), h = y.size(1), d = y.size(3);
    return c_proj(y.transpose(1, 2).reshape({n, -1, h * d}));
  }
};

class Mlp : public duet::nn::Module {
 public:
  explicit Mlp(const GptConfig& c)
      : c_fc(register_module("c_fc", duet::nn::Linear(c.width, 4 * c.width))),
        gelu(register_module("gelu", duet::nn::GELU("tanh"))),
        c_proj(register_module("c_proj", duet::nn::Linear(4 * c.width, c.width))) {}
  Tensor forward(const Tensor& x) override { return c_proj(gelu(c_fc(x))); }

  duet::nn::Linear c_fc;
  duet::nn::GELU gelu;
  duet::nn::Linear c_proj;
};

class Block : public duet::nn::Module {
 public:
  explicit Block(const GptConfig& c)
      : ln_1(register_module("ln_1", duet::nn::LayerNorm(duet::Shape{c.width}))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln_2(register_module("ln_2", duet::nn::LayerNorm(duet::Shape{c.width}))),
        mlp(register_module("mlp", Mlp(c))) {}

  Tensor forward(const Tensor& x) override {
    Tensor y = x + attn(ln_1(x));
    return y + mlp(ln_2(y));
  }
  Tensor step(const Tensor& x, Tensor& k_cache, Tensor& v_cache) {
    Tensor y = x + attn.step(ln_1(x), k_cache, v_cache);
    return y + mlp(ln_2(y));
  }

  duet::nn::LayerNorm ln_1;
  CausalSelfAttention attn;
  duet::nn::LayerNorm ln_2;
  Mlp mlp;
};

class Gpt : public duet::nn::Module {
 public:
  explicit Gpt(const GptConfig& c)
      : config(c),
        wte(register_module("wte", duet::nn::Embedding(c.vocab, c.width))),
        wpe(register_module("wpe", duet::nn::Embedding(c.context, c.width))),
        h(register_module("h", duet::nn::ModuleList())),
        ln_f(register_module("ln_f", duet::nn::LayerNorm(duet::Shape{c.width}))) {
    for (int64_t i = 0; i < c.layers; ++i) h.push_back(Block(c));
    // GPT-2's initialization: N(0, 0.02) weights and zero biases, the projections into the
    // residual stream scaled by 1 / sqrt(2 * layers).
    for (auto& [name, p] : named_parameters()) {
      const bool bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
      const bool residual = name.find("c_proj.weight") != std::string::npos;
      if (name.find("ln_") != std::string::npos) continue;  // LayerNorms keep ones and zeros
      if (bias)
        duet::nn::init::zeros_(p);
      else
        duet::nn::init::normal_(p, 0, residual ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02);
    }
  }

  /// Token ids (N, T), T <= context -> logits (N, T, vocab).
  Tensor forward(const Tensor& idx) override {
    Tensor x = wte(idx) + wpe(duet::arange(idx.size(1)));
    for (const auto& b : h) x = b->forward(x);
    return duet::linear(ln_f(x), wte.weight);  // tied: the logits use the token embedding
  }

  /// One decoding step: the token (N, 1) at position pos (a (1) i64 tensor) -> logits (N, vocab),
  /// with k_cache[i] and v_cache[i] (N, H, t, D) of block i grown by one position.
  Tensor decode_step(const Tensor& token, const Tensor& pos, std::vector<Tensor>& k_cache,
                     std::vector<Tensor>& v_cache) {
    Tensor x = wte(token) + wpe(pos);
    size_t i = 0;
    for (const auto& b : h) {
      x = static_cast<Block&>(*b).step(x, k_cache[i], v_cache[i]);
      ++i;
    }
    return duet::select(duet::linear(ln_f(x), wte.weight), 1, 0);
  }

  /// Empty caches (N, H, 0, D) for decode_step.
  std::vector<Tensor> empty_cache(int64_t n) const {
    return std::vector<Tensor>(static_cast<size_t>(config.layers),
                               duet::zeros({n, config.heads, 0, config.width / config.heads}));
  }

  GptConfig config;
  duet::nn::Embedding wte, wpe;
  duet::nn::ModuleList h;
  duet::nn::LayerNorm ln_f;
};

/// The loss of a batch: cross-entropy of the logits at each position against the next token.
inline Tensor loss_of(Gpt& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model(x);
  return duet::cross_entropy(logits.reshape({-1, model.config.vocab}), y.reshape({-1}));
}

/// One training step: forward, backward, gradients clipped to norm 1, AdamW.
inline Tensor train_step(Gpt& model, duet::optim::Optimizer& opt, const Tensor& x,
                         const Tensor& y) {
  opt.zero_grad();
  Tensor loss = loss_of(model, x, y);
  loss.backward();
  duet::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
  opt.step();
  return loss;
}

/// GPT-2's AdamW: betas (0.9, 0.95), weight decay 0.1.
inline duet::optim::AdamWOptions adamw_options(double lr) {
  return {.lr = lr, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.1};
}

}  // namespace gpt
