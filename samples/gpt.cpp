// A GPT (samples/gpt.h: GPT-2's architecture, smaller) learns a text byte by byte, then writes.
//
// The vocabulary is the 256 byte values and the text is built in (below). A compiled training
// step (forward, backward, clipping, AdamW) runs on random windows of the text for a while; then
// the model continues a few prompts greedily, one byte at a time, with a cache of each block's
// keys and values, the decoding step compiled once for a symbolic cache length. The program
// checks that the loss fell, and that the compiled decoder writes what the eager model does; it
// exits with 1 otherwise, so CI runs it (briefly) as a test.
//
//   gpt [--seconds S | --steps N] [--seed N] [--config small|gpt2]
//
// --seconds: how long to train (60 by default); --steps: train this many steps instead (CI runs
// a fixed number, so that what it checks does not depend on the machine's speed); --config gpt2
// trains GPT-2 small's shape
// (12 layers of width 768, 124M parameters with a 50257 vocabulary, here 256) instead of the
// default 4 layers of width 128.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "duet.h"
#include "gpt.h"

using namespace duet;

namespace {

// The opening of Lewis Carroll's "Alice's Adventures in Wonderland" (1865), public domain.
const char* const kText =
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
    "nothing to do: once or twice she had peeped into the book her sister was reading, but it "
    "had no pictures or conversations in it, \"and what is the use of a book,\" thought Alice "
    "\"without pictures or conversations?\"\n"
    "So she was considering in her own mind (as well as she could, for the hot day made her "
    "feel very sleepy and stupid), whether the pleasure of making a daisy-chain would be worth "
    "the trouble of getting up and picking the daisies, when suddenly a White Rabbit with pink "
    "eyes ran close by her.\n"
    "There was nothing so very remarkable in that; nor did Alice think it so very much out of "
    "the way to hear the Rabbit say to itself, \"Oh dear! Oh dear! I shall be late!\" (when she "
    "thought it over afterwards, it occurred to her that she ought to have wondered at this, "
    "but at the time it all seemed quite natural); but when the Rabbit actually took a watch "
    "out of its waistcoat-pocket, and looked at it, and then hurried on, Alice started to her "
    "feet, for it flashed across her mind that she had never before seen a rabbit with either "
    "a waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran "
    "across the field after it, and fortunately was just in time to see it pop down a large "
    "rabbit-hole under the hedge.\n"
    "In another moment down went Alice after it, never once considering how in the world she "
    "was to get out again.\n"
    "The rabbit-hole went straight on like a tunnel for some way, and then dipped suddenly "
    "down, so suddenly that Alice had not a moment to think about stopping herself before she "
    "found herself falling down a very deep well.\n";

constexpr int64_t kBatch = 16;

// Random windows of the text: inputs (kBatch, T) and the bytes after them as targets.
std::pair<Tensor, Tensor> batch_of(const std::vector<int64_t>& bytes, int64_t t) {
  const int64_t n = static_cast<int64_t>(bytes.size()) - t - 1;
  const std::vector<int64_t> starts = randint(n, {kBatch}).to_vector<int64_t>();
  std::vector<double> x, y;
  for (int64_t s : starts) {
    x.insert(x.end(), bytes.begin() + s, bytes.begin() + s + t);
    y.insert(y.end(), bytes.begin() + s + 1, bytes.begin() + s + t + 1);
  }
  const Options o = Options().dtype(DType::i64);
  return {tensor(x, {kBatch, t}, o), tensor(y, {kBatch, t}, o)};
}

// Caches stacked per block: (layers, 1, H, t, D) each for keys and values.
Tensor stacked(const std::vector<Tensor>& per_block) { return stack(per_block); }
std::vector<Tensor> unstacked(const Tensor& t) {
  std::vector<Tensor> r;
  for (int64_t i = 0; i < t.size(0); ++i) r.push_back(select(t, 0, i));
  return r;
}

// Greedy continuation of `prompt` by `n` bytes, one decoding step per byte (the prompt's too).
template <class Step>
std::string continue_text(gpt::Gpt& model, Step&& step, const std::string& prompt, int64_t n) {
  NoGradGuard no_grad;
  Tensor k = stacked(model.empty_cache(1)), v = stacked(model.empty_cache(1));
  std::string out = prompt;
  int64_t next = 0;
  const Options o = Options().dtype(DType::i64);
  for (int64_t i = 0; i < static_cast<int64_t>(prompt.size()) + n - 1; ++i) {
    const int64_t tok = i < static_cast<int64_t>(prompt.size())
                            ? static_cast<unsigned char>(prompt[static_cast<size_t>(i)])
                            : next;
    std::vector<Tensor> r = step(full({1, 1}, tok, o), full({1}, i, o), k, v);
    next = r[0].template item<int64_t>();
    k = r[1];
    v = r[2];
    if (i >= static_cast<int64_t>(prompt.size()) - 1) out += static_cast<char>(next);
  }
  return out;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  double seconds = 60;
  int64_t max_steps = 0;  // 0: train for `seconds`
  uint64_t seed = 1;
  std::string config = "small";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    DUET_CHECK_VALUE(
        i + 1 < argc && (a == "--seconds" || a == "--steps" || a == "--seed" || a == "--config"),
        "usage: gpt [--seconds S | --steps N] [--seed N] [--config small|gpt2], got "
        "'{}'",
        a);
    if (a == "--steps") max_steps = std::stoll(v);
    if (a == "--seconds") seconds = std::stod(v);
    if (a == "--seed") seed = std::stoull(v);
    if (a == "--config") config = v;
    ++i;
  }
  DUET_CHECK_VALUE(config == "small" || config == "gpt2", "[gpt] --config is small or gpt2");
  gpt::GptConfig c{.vocab = 256, .context = 128, .width = 128, .heads = 4, .layers = 4};
  if (config == "gpt2")
    c = {.vocab = 256, .context = 1024, .width = 768, .heads = 12, .layers = 12};
  const int64_t t = std::min<int64_t>(c.context, 128);
  const std::string text = kText;
  const std::vector<int64_t> bytes(text.begin(), text.end());

  manual_seed(seed);
  gpt::Gpt model(c);
  int64_t params = 0;
  for (const Tensor& p : model.parameters()) params += p.numel();
  optim::AdamW opt(model.parameters(), gpt::adamw_options(1e-3));
  auto step =
      compile([&](const Tensor& x, const Tensor& y) { return gpt::train_step(model, opt, x, y); });
  std::printf(
      "gpt: %lld layers, width %lld, %lld heads, %lld parameters; %zu bytes of text; "
      "batch %lld x %lld; training for %s\n",
      static_cast<long long>(c.layers), static_cast<long long>(c.width),
      static_cast<long long>(c.heads), static_cast<long long>(params), text.size(),
      static_cast<long long>(kBatch), static_cast<long long>(t),
      (max_steps ? fmt::format("{} steps", max_steps) : fmt::format("{:.0f} s", seconds)).c_str());

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double first = 0, last = 0;
  int64_t steps = 0;
  auto training = [&] { return max_steps ? steps < max_steps : elapsed() < seconds; };
  for (double next_report = 0; steps == 0 || training(); ++steps) {
    auto [x, y] = batch_of(bytes, t);
    last = step(x, y).item<float>();
    if (steps == 0) first = last;
    if (elapsed() >= next_report) {
      std::printf("  step %5lld  %5.1f s  loss %.3f\n", static_cast<long long>(steps), elapsed(),
                  last);
      next_report += max_steps ? 1.0 : std::max(seconds / 6, 1.0);
    }
  }
  std::printf("%lld steps, %.0f tokens/s; loss %.3f -> %.3f (a uniform guess: ln 256 = %.3f)\n\n",
              static_cast<long long>(steps), double(steps * kBatch * t) / elapsed(), first, last,
              std::log(256.0));

  // Decoding: the eager model, and the same step compiled with the caches' length symbolic.
  model.eval();
  auto eager_step = [&](const Tensor& tok, const Tensor& pos, const Tensor& k, const Tensor& v) {
    std::vector<Tensor> kc = unstacked(k), vc = unstacked(v);
    Tensor logits = model.decode_step(tok, pos, kc, vc);
    return std::vector<Tensor>{argmax(logits, -1), stacked(kc), stacked(vc)};
  };
  CompileOptions o;
  o.dynamic = {{1, 0}, {2, 3}, {3, 3}};  // the position, and the caches' length
  auto compiled_step = compile(eager_step, o);
  int failures = 0;
  for (const std::string prompt : {"Alice was ", "The rabbit", "\"Oh dear"}) {
    const std::string eager = continue_text(model, eager_step, prompt, 80);
    const std::string compiled = continue_text(model, compiled_step, prompt, 80);
    std::printf("  %s\n", one_line(compiled).c_str());
    if (eager != compiled) {
      std::printf("CHECK FAILED: the eager decoder wrote\n  %s\n", one_line(eager).c_str());
      ++failures;
    }
  }
  std::printf("\ndecoding compiled: %d trace(s) for %d calls\n", compiled_step.stats().traces,
              compiled_step.stats().traces + compiled_step.stats().hits);
  if (!(last < first - 1.0)) {
    std::printf("CHECK FAILED: the loss fell by less than 1 (%.3f -> %.3f)\n", first, last);
    ++failures;
  }
  std::printf(failures ? "\n%d check(s) failed\n" : "\nall checks passed\n", failures);
  return failures ? 1 : 0;
} catch (const Error& e) {
  std::printf("gpt: %s\n", e.what());
  return 1;
}
