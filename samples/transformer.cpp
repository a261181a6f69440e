// A small decoder-only transformer learns to reverse sequences of digits. Its block is the
// GPT-2 pattern: pre-LayerNorm, nn::MultiheadAttention with a causal mask, and an MLP with the
// tanh form of GELU. It is trained twice from the same seed, eagerly and with the training step
// under duet::compile; the program prints the two losses side by side, checks that they agree to
// rounding, and then decodes a few held-out sequences greedily. It exits with 1 when the faces
// disagree or the model did not learn, so CI runs it as a test.
//
// A sequence is K random digits, a separator, and the K digits reversed:
//   3 1 4 1 5 9 2 6 | 6 2 9 5 1 4 1 3
// The model reads it left to right and is scored on its predictions of the second half.
//
//   transformer [--steps N] [--seed S] [--device cpu|cuda] [--autocast bf16|f16]
//
// --autocast runs the forward pass and the loss of both faces under Autocast: the products in
// the low dtype, the norms, the softmax and the loss in f32 (docs/low-precision.md). With
// --device cuda the models and batches live on the GPU (it exits with 77, skipped, where there
// is none).
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "duet.h"
#include "side_by_side.h"

using namespace duet;

namespace {

constexpr int64_t kDigits = 10, kSep = 10, kVocab = 11;  // tokens: the digits and the separator
constexpr int64_t kK = 8, kLen = 2 * kK + 1;             // K digits, separator, K reversed
constexpr int64_t kWidth = 64, kHeads = 4, kHidden = 256, kBlocks = 2, kBatch = 64;

// How closely the two faces must agree: as in samples/char_gru.cpp (Note [Eager against
// compiled, step by step] there). Both compute in f32; the compiled plan fuses elementwise ops
// and may order additions differently, so a loss may differ in its last bits, and training
// amplifies such differences step after step. The comparison is checked over the first
// kCheckedSteps steps with a tolerance of 1e-4. (Measured here: this model's losses were equal
// to the last bit over 300 steps.)
constexpr int64_t kCheckedSteps = 60;
constexpr double kTolerance = 1e-4;

/// A pre-LayerNorm block: x + attn(ln1(x)) with a causal mask, then x + fc2(gelu(fc1(ln2(x)))).
class Block : public nn::Module {
 public:
  Block()
      : ln1(register_module("ln1", nn::LayerNorm(Shape{kWidth}))),
        attn(register_module("attn", nn::MultiheadAttention(kWidth, kHeads))),
        ln2(register_module("ln2", nn::LayerNorm(Shape{kWidth}))),
        fc1(register_module("fc1", nn::Linear(kWidth, kHidden))),
        act(register_module("act", nn::GELU("tanh"))),
        fc2(register_module("fc2", nn::Linear(kHidden, kWidth))) {}

  Tensor forward(const Tensor& x) override {
    Tensor h = ln1(x);
    Tensor y = x + attn.forward(h, h, h, /*attn_mask=*/{}, /*is_causal=*/true);
    return y + fc2(act(fc1(ln2(y))));
  }

  nn::LayerNorm ln1;
  nn::MultiheadAttention attn;
  nn::LayerNorm ln2;
  nn::Linear fc1;
  nn::GELU act;
  nn::Linear fc2;
};

/// Tokens (N, T), T <= kLen -> logits (N, T, kVocab): token and learned position embeddings,
/// the blocks, a final LayerNorm and a linear head.
class Decoder : public nn::Module {
 public:
  Decoder()
      : tok(register_module("tok", nn::Embedding(kVocab, kWidth))),
        pos(register_module("pos", nn::Embedding(kLen, kWidth))),
        blocks(register_module("blocks", nn::ModuleList())),
        ln_f(register_module("ln_f", nn::LayerNorm(Shape{kWidth}))),
        head(register_module("head", nn::Linear(kWidth, kVocab))) {
    for (int64_t i = 0; i < kBlocks; ++i) blocks.push_back(Block());
  }

  Tensor forward(const Tensor& tokens) override {
    // (N, T, E) + (T, E), the positions where the tokens are
    Tensor x = tok(tokens) + pos(arange(tokens.size(1), Options().device(tokens.device())));
    for (const auto& b : blocks) x = b->forward(x);
    return head(ln_f(x));
  }

  nn::Embedding tok, pos;
  nn::ModuleList blocks;
  nn::LayerNorm ln_f;
  nn::Linear head;
};

/// n sequences (n, kLen): K digits, the separator, the digits reversed.
Tensor make_sequences(int64_t n) {
  Tensor digits = randint(kDigits, {n, kK});
  return cat({digits, full({n, 1}, kSep, Options().dtype(DType::i64)), flip(digits, {1})}, 1);
}

// One training step, the same code for both faces: the input is the sequence but its last
// token, the targets are the sequence shifted by one, and only the predictions of the reversed
// half count (the first half is random digits, which nothing can predict).
Tensor train_step(Decoder& model, optim::Optimizer& opt, const Tensor& seq,
                  std::optional<DType> autocast) {
  opt.zero_grad();
  Tensor loss;
  {
    Autocast ac(seq.device(), autocast.value_or(DType::bf16), autocast.has_value());
    Tensor logits = model(slice(seq, 1, 0, kLen - 1));          // (N, 2K, V)
    Tensor scored = slice(logits, 1, kK, 2 * kK).contiguous();  // the predictions after the sep
    Tensor targets = slice(seq, 1, kK + 1, kLen).contiguous();  // the reversed digits
    loss = cross_entropy(reshape(scored, {-1, kVocab}), reshape(targets, {-1}));
  }
  loss.backward();
  opt.step();
  return loss;
}

/// Greedy decoding: the first K + 1 tokens of each sequence, then K tokens, each the argmax of
/// the model's prediction after the tokens so far.
Tensor decode(Decoder& model, const Tensor& seq) {
  NoGradGuard no_grad;
  Tensor out = slice(seq, 1, 0, kK + 1);
  for (int64_t i = 0; i < kK; ++i) {
    Tensor logits = model(out);
    Tensor last = slice(logits, 1, out.size(1) - 1, out.size(1));  // (N, 1, V)
    out = cat({out, argmax(last, 2)}, 1);
  }
  return out;
}

std::string show(const Tensor& row) {
  std::string s;
  for (int64_t t : row.to_vector<int64_t>())
    s += (s.empty() ? "" : " ") + (t == kSep ? std::string("|") : std::to_string(t));
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  // --autocast bf16|f16, taken out before the shared options are parsed.
  std::optional<DType> autocast;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) != "--autocast") {
      args.push_back(argv[i]);
      continue;
    }
    const std::string v = i + 1 < argc ? argv[++i] : "";
    DUET_CHECK_VALUE(v == "bf16" || v == "f16", "[transformer] --autocast is bf16 or f16, got {}",
                     v);
    autocast = v == "bf16" ? DType::bf16 : DType::f16;
  }
  const auto [steps, seed, device] =
      samples::parse_args("transformer", static_cast<int>(args.size()), args.data(), kCheckedSteps);
  if (!samples::device_usable("transformer", device)) return samples::kSkipped;
  std::printf(
      "transformer: reverse %lld digits; %lld pre-LayerNorm blocks, width %lld, %lld "
      "heads, MLP %lld; batch %lld, AdamW, %lld steps on %s%s%s\n",
      static_cast<long long>(kK), static_cast<long long>(kBlocks), static_cast<long long>(kWidth),
      static_cast<long long>(kHeads), static_cast<long long>(kHidden),
      static_cast<long long>(kBatch), static_cast<long long>(steps), device.str().c_str(),
      autocast ? ", autocast " : "", autocast ? dtype_name(*autocast).data() : "");

  // The batches, drawn once so that both faces see the same ones, and a held-out set.
  manual_seed(seed);
  std::vector<Tensor> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(make_sequences(kBatch).to(device));
  const Tensor held_out = make_sequences(256).to(device);

  // The same initialization twice: the initializers draw from the seeded generator.
  manual_seed(seed + 1);
  Decoder eager_model;
  manual_seed(seed + 1);
  Decoder compiled_model;
  eager_model.to(device);
  compiled_model.to(device);
  optim::AdamW eager_opt(eager_model.parameters(), {.lr = 3e-3});
  optim::AdamW compiled_opt(compiled_model.parameters(), {.lr = 3e-3});
  auto compiled_step = compile(
      [&](const Tensor& seq) { return train_step(compiled_model, compiled_opt, seq, autocast); });

  const samples::SideBySide r = samples::side_by_side(
      steps, kCheckedSteps,
      [&](int64_t s) { return train_step(eager_model, eager_opt, batches[s], autocast); },
      [&](int64_t s) { return compiled_step(batches[s]); });
  const CompileStats st = compiled_step.stats();
  std::printf(
      "\ntime: eager %.2f s, compiled %.2f s (%d trace, %d hits); the loss of a uniform "
      "guess over the %lld tokens is ln(%lld) = %.3f\n",
      r.eager_s, r.compiled_s, st.traces, st.hits, static_cast<long long>(kVocab),
      static_cast<long long>(kVocab), std::log(static_cast<double>(kVocab)));
  int failures = samples::check_agreement(r, steps, kCheckedSteps, kTolerance);

  // Greedy decoding of the held-out sequences by the compiled model.
  compiled_model.eval();
  const Tensor decoded = decode(compiled_model, held_out);
  const Tensor hits = eq(slice(decoded, 1, kK + 1, kLen), slice(held_out, 1, kK + 1, kLen));
  const double token_acc = mean(hits.to(DType::f32)).item<float>();
  const double seq_acc = mean((sum(hits.to(DType::i64), {1}) == kK).to(DType::f32)).item<float>();
  std::printf(
      "\nheld out, 256 sequences decoded greedily: %.1f%% of the digits right, %.1f%% "
      "of the sequences entirely\n",
      100 * token_acc, 100 * seq_acc);
  for (int64_t i = 0; i < 3; ++i) std::printf("  %s\n", show(slice(decoded, 0, i, i + 1)).c_str());
  if (steps >= kCheckedSteps && !(token_acc > 0.9)) {
    std::printf("CHECK FAILED: fewer than 90%% of the digits reversed right\n");
    ++failures;
  }

  std::printf(failures ? "\n%d check(s) failed\n" : "\nall checks passed\n", failures);
  return failures ? 1 : 0;
} catch (const Error& e) {
  std::printf("transformer: %s\n", e.what());
  return 1;
}
