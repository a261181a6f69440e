// A character-level language model: nn::Embedding -> nn::GRU -> nn::Linear, trained with
// cross_entropy and Adam on a few paragraphs of built-in text, twice from the same seed: once
// eagerly, once with the training step under duet::compile. The program prints the two losses
// side by side, checks that they agree to rounding, and then lets the model write a few lines.
// It exits with 1 when the faces disagree or the model did not learn, so CI runs it as a test.
// With --device cuda the models and batches live on the GPU (it exits with 77, skipped, where
// there is none).
//
//   char_gru [--steps N] [--seed S] [--device cpu|cuda]
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "duet.h"
#include "side_by_side.h"

using namespace duet;

namespace {

// Written for this sample. It is small (about 1,200 characters), so that within 60 steps the
// model learns its words and much of its phrasing.
constexpr const char* kText =
    "The keeper of the harbour light climbed the tower every evening at six. She carried a tin "
    "of oil, a cloth for the glass, and a notebook in which she wrote the wind, the sea and the "
    "ships that passed. On calm nights the notebook said little: the wind from the west, the sea "
    "flat, two boats going home with their nets. On rough nights it said more.\n"
    "In the morning she walked down to the village for bread and news. The baker told her which "
    "boats were late and the fishermen told her which were lost, and she wrote that down as "
    "well. Nobody had asked her to keep the notebook. She kept it because the light was a "
    "promise, and a promise needs a witness.\n"
    "The winter was long that year. Snow lay on the rocks, the ice came into the harbour, and "
    "for three weeks no boat went out. The keeper lit the lamp every evening all the same. A "
    "light that burns for nobody, she wrote, is still a light; the sea does not know whether "
    "anyone is watching, and neither, most nights, does the keeper.\n"
    "When spring came the boats went out again, one by one, and the notebook filled with their "
    "names. The keeper grew old in the tower, and the village grew used to her light, the way "
    "one grows used to the sound of the sea: you only hear it when it stops.\n";

constexpr int64_t kEmbed = 32, kHidden = 128, kBatch = 32, kSeq = 48;

// Note [Eager against compiled, step by step]
// Both faces compute in f32 and run the same ops, but the compiled plan fuses elementwise ops
// and may order a reduction's additions differently, so a step's loss can differ in its last
// bits: about 1e-7 relative. Training then amplifies such a difference, as it amplifies any
// perturbation: each step starts from the parameters the last one left, and once the model fits
// the text Adam's updates (gradients divided by the root of their small second moments) turn a
// difference in the last bit into a larger one. Measured with --steps 400: 1e-7 at step 30,
// 3e-6 at step 100, 2e-4 at step 200, a few percent from step 270 on, when the two faces are
// two different runs of the same training, equally good (final losses 0.108 and 0.111). So
// the comparison is checked over the first kCheckedSteps steps, where rounding stays below
// 1e-5, with a tolerance of 1e-4; a real difference between the faces (a parameter or Adam's
// state not written back, a wrong gradient) is larger than that within a few steps.
constexpr int64_t kCheckedSteps = 60;
constexpr double kTolerance = 1e-4;

// The characters of the text and their ids.
struct Vocab {
  std::string chars;
  std::map<char, int64_t> id;
  explicit Vocab(const std::string& text) {
    for (char c : text)
      if (!id.count(c)) id[c] = 0;
    for (auto& [c, i] : id) {
      i = static_cast<int64_t>(chars.size());
      chars += c;
    }
  }
  int64_t size() const { return static_cast<int64_t>(chars.size()); }
};

// ids (N, T) -> logits (N, T, vocab). step() carries the GRU's state for sampling.
class CharGRU : public nn::Module {
 public:
  explicit CharGRU(int64_t vocab)
      : embed(register_module("embed", nn::Embedding(vocab, kEmbed))),
        gru(register_module("gru", nn::GRU(nn::GRUOptions(kEmbed, kHidden).batch_first(true)))),
        head(register_module("head", nn::Linear(kHidden, vocab))) {}

  Tensor forward(const Tensor& ids) override { return std::get<0>(step(ids, Tensor())); }

  /// Logits and the GRU's last state h_n (1, N, hidden), from state h (undefined: zeros).
  std::tuple<Tensor, Tensor> step(const Tensor& ids, const Tensor& h) {
    auto [out, h_n] = gru(embed(ids), h);
    return {head(out), h_n};
  }

  nn::Embedding embed;
  nn::GRU gru;
  nn::Linear head;
};

// One training step, the same code for both faces. Gradient clipping is the usual guard of
// recurrent training; it is ops on the .grad buffers, so it compiles with the rest.
Tensor train_step(CharGRU& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor logits = model(x);
  Tensor loss = cross_entropy(reshape(logits, {-1, logits.size(-1)}), reshape(y, {-1}));
  loss.backward();
  nn::utils::clip_grad_norm_(model.parameters(), /*max_norm=*/1.0);
  opt.step();
  return loss;
}

}  // namespace

int main(int argc, char** argv) try {
  const auto [steps, seed, device] = samples::parse_args("char_gru", argc, argv, kCheckedSteps);
  if (!samples::device_usable("char_gru", device)) return samples::kSkipped;

  const std::string text = kText;
  const Vocab vocab(text);
  const int64_t V = vocab.size(), n = static_cast<int64_t>(text.size());
  std::vector<double> ids;
  for (char c : text) ids.push_back(static_cast<double>(vocab.id.at(c)));
  const Tensor data = tensor(ids, Options().dtype(DType::i64));
  std::printf(
      "char_gru: %lld characters, %lld distinct; Embedding(%lld, %lld) -> GRU(%lld, %lld) "
      "-> Linear(%lld, %lld); batch %lld x %lld characters, Adam, %lld steps on %s\n",
      static_cast<long long>(n), static_cast<long long>(V), static_cast<long long>(V),
      static_cast<long long>(kEmbed), static_cast<long long>(kEmbed),
      static_cast<long long>(kHidden), static_cast<long long>(kHidden), static_cast<long long>(V),
      static_cast<long long>(kBatch), static_cast<long long>(kSeq), static_cast<long long>(steps),
      device.str().c_str());

  // The batches, drawn once so that both faces see the same ones: windows of kSeq + 1
  // characters at random offsets; the model reads the first kSeq and predicts the last kSeq.
  manual_seed(seed);
  std::vector<Tensor> xs, ys;
  for (int64_t s = 0; s < steps; ++s) {
    Tensor start = reshape(randint(n - kSeq, {kBatch}), {kBatch, 1});
    Tensor window =
        index_select(data, 0, reshape(start + reshape(arange(kSeq + 1), {1, -1}), {-1}));
    window = reshape(window, {kBatch, kSeq + 1});
    xs.push_back(slice(window, 1, 0, kSeq).contiguous().to(device));
    ys.push_back(slice(window, 1, 1, kSeq + 1).contiguous().to(device));
  }

  // The same initialization twice: the initializers draw from the seeded generator.
  manual_seed(seed + 1);
  CharGRU eager_model(V);
  manual_seed(seed + 1);
  CharGRU compiled_model(V);
  eager_model.to(device);
  compiled_model.to(device);
  optim::Adam eager_opt(eager_model.parameters(), {.lr = 1e-2});
  optim::Adam compiled_opt(compiled_model.parameters(), {.lr = 1e-2});
  auto compiled_step = compile([&](const Tensor& x, const Tensor& y) {
    return train_step(compiled_model, compiled_opt, x, y);
  });

  const samples::SideBySide r = samples::side_by_side(
      steps, kCheckedSteps,
      [&](int64_t s) { return train_step(eager_model, eager_opt, xs[s], ys[s]); },
      [&](int64_t s) { return compiled_step(xs[s], ys[s]); });
  const CompileStats st = compiled_step.stats();
  std::printf(
      "\ntime: eager %.2f s, compiled %.2f s (%d trace, %d hits); the loss of a uniform "
      "guess is ln(%lld) = %.3f\n",
      r.eager_s, r.compiled_s, st.traces, st.hits, static_cast<long long>(V),
      std::log(static_cast<double>(V)));

  int failures = samples::check_agreement(r, steps, kCheckedSteps, kTolerance);
  if (steps >= kCheckedSteps && !(r.last < 0.8 * std::log(static_cast<double>(V)))) {
    std::printf("CHECK FAILED: the loss did not fall well below a uniform guess's\n");
    ++failures;
  }

  // Let the compiled model write: feed a prompt, then draw each next character from
  // softmax(logits / temperature), eagerly and without gradients.
  NoGradGuard no_grad;
  manual_seed(seed + 2);
  const std::string prompt = "The keeper ";
  std::string out = prompt;
  std::vector<double> prompt_ids;
  for (char ch : prompt) prompt_ids.push_back(static_cast<double>(vocab.id.at(ch)));
  auto [logits, h] =
      compiled_model.step(tensor(prompt_ids, Shape{1, static_cast<int64_t>(prompt_ids.size())},
                                 Options().dtype(DType::i64))
                              .to(device),
                          Tensor());
  // (1, 1, V): the prediction after the prompt's last character.
  Tensor next = slice(logits, 1, logits.size(1) - 1, logits.size(1));
  for (int i = 0; i < 160; ++i) {
    Tensor probs = softmax(reshape(next, {1, V}) / 0.6, 1);
    Tensor id = multinomial(probs, 1);  // (1, 1)
    out += vocab.chars[static_cast<size_t>(id.item<int64_t>())];
    std::tie(next, h) = compiled_model.step(id, h);
  }
  std::printf("\nsampled (temperature 0.6) after \"%s\":\n%s\n", prompt.c_str(), out.c_str());

  std::printf(failures ? "\n%d check(s) failed\n" : "\nall checks passed\n", failures);
  return failures ? 1 : 0;
} catch (const Error& e) {
  std::printf("char_gru: %s\n", e.what());
  return 1;
}
