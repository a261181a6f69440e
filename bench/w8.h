// duet_bench: W8's model and step (docs/benchmarks.md), shared by the W8 workload
// (bench/transformer.cpp) and the memory workload (bench/memory.cpp).
#pragma once

#include <memory>

#include "duet.h"

namespace bench {

using duet::Tensor;

constexpr int64_t kVocab = 1024, kWidth = 256, kHeads = 4, kHidden = 1024, kBlocks = 2;
constexpr int64_t kBatch = 8, kSeq = 128;

/// A pre-LayerNorm transformer block: x + attn(ln1(x)) with a causal mask, then
/// x + fc2(gelu_tanh(fc1(ln2(x)))).
class Block : public duet::nn::Module {
 public:
  Block(int64_t d, int64_t heads, int64_t hidden)
      : ln1(register_module("ln1", duet::nn::LayerNorm(duet::Shape{d}))),
        attn(register_module("attn", duet::nn::MultiheadAttention(d, heads))),
        ln2(register_module("ln2", duet::nn::LayerNorm(duet::Shape{d}))),
        fc1(register_module("fc1", duet::nn::Linear(d, hidden))),
        act(register_module("act", duet::nn::GELU("tanh"))),
        fc2(register_module("fc2", duet::nn::Linear(hidden, d))) {}

  Tensor forward(const Tensor& x) override {
    Tensor h = ln1(x);
    Tensor y = x + attn.forward(h, h, h, {}, /*is_causal=*/true);
    return y + fc2(act(fc1(ln2(y))));
  }

  duet::nn::LayerNorm ln1;
  duet::nn::MultiheadAttention attn;
  duet::nn::LayerNorm ln2;
  duet::nn::Linear fc1;
  duet::nn::GELU act;
  duet::nn::Linear fc2;
};

/// Token ids (N, T) -> logits (N, T, vocab).
class TinyTransformer : public duet::nn::Module {
 public:
  TinyTransformer()
      : tok(register_module("tok", duet::nn::Embedding(kVocab, kWidth))),
        ln_f(register_module("ln_f", duet::nn::LayerNorm(duet::Shape{kWidth}))),
        head(register_module("head", duet::nn::Linear(kWidth, kVocab))) {
    for (int64_t i = 0; i < kBlocks; ++i)
      blocks.push_back(register_module(fmt::format("blocks{}", i),
                                       std::make_shared<Block>(kWidth, kHeads, kHidden)));
  }

  Tensor forward(const Tensor& tokens) override {
    Tensor x = tok(tokens);
    for (auto& b : blocks)
      x = checkpoint_blocks ? duet::checkpoint([b](const Tensor& h) { return (*b)(h); }, x)
                            : (*b)(x);
    return head(ln_f(x));
  }

  bool checkpoint_blocks = false;  ///< each block under duet::checkpoint (bench MEM)

  duet::nn::Embedding tok;
  std::vector<std::shared_ptr<Block>> blocks;
  duet::nn::LayerNorm ln_f;
  duet::nn::Linear head;
};

/// A model, its optimizer and one batch; step() is one training step, eager, or compiled when
/// called through compile().
struct W8 {
  std::shared_ptr<TinyTransformer> model;
  std::unique_ptr<duet::optim::AdamW> opt;
  Tensor x, y;
  bool autocast = false;  ///< the forward pass and the loss under Autocast(cpu, bf16)

  explicit W8(uint64_t seed, bool amp = false, int64_t batch = kBatch) : autocast(amp) {
    duet::manual_seed(seed);
    model = std::make_shared<TinyTransformer>();
    opt = std::make_unique<duet::optim::AdamW>(model->parameters());
    Tensor tokens = duet::randint(kVocab, {batch, kSeq + 1});
    x = duet::slice(tokens, 1, 0, kSeq).clone();
    y = duet::slice(tokens, 1, 1, kSeq + 1).clone();
  }

  Tensor step(const Tensor& xs, const Tensor& ys) {
    opt->zero_grad();
    Tensor loss;
    {
      duet::Autocast ac(duet::Device::cpu(), duet::DType::bf16, autocast);
      Tensor logits = (*model)(xs);
      loss = duet::cross_entropy(duet::reshape(logits, {-1, kVocab}), duet::reshape(ys, {-1}));
    }
    loss.backward();
    opt->step();
    return loss;
  }

  auto compile() {
    return duet::compile([this](Tensor xs, Tensor ys) { return step(xs, ys); });
  }
};

}  // namespace bench
