// GPT-2's architecture at two blocks (samples/gpt.h, the model of samples/gpt and of bench W9):
// training steps eagerly and compiled from the same initialization agree, and so do the eager
// and compiled decoders with a key-value cache.
#include <doctest/doctest.h>

#include "samples/gpt.h"
#include "util.h"

namespace duet::test {

TEST_CASE("gpt: two GPT-2 blocks train the same eagerly and compiled") {
  const gpt::GptConfig c{.vocab = 256, .context = 32, .width = 64, .heads = 4, .layers = 2};
  manual_seed(21);
  gpt::Gpt eager_model(c);
  manual_seed(21);
  gpt::Gpt compiled_model(c);
  optim::AdamW eager_opt(eager_model.parameters(), gpt::adamw_options(1e-3));
  optim::AdamW compiled_opt(compiled_model.parameters(), gpt::adamw_options(1e-3));
  auto step = compile([&](const Tensor& x, const Tensor& y) {
    return gpt::train_step(compiled_model, compiled_opt, x, y);
  });
  for (int s = 0; s < 4; ++s) {
    const Tensor tokens = randint(c.vocab, {3, 33});
    const Tensor x = slice(tokens, 1, 0, 32), y = slice(tokens, 1, 1, 33);
    const float le = gpt::train_step(eager_model, eager_opt, x, y).item<float>();
    const float lc = step(x, y).item<float>();
    CAPTURE(s);
    CHECK(std::abs(le - lc) <= 1e-5 * std::abs(le));
  }
  CHECK(step.stats().traces == 1);
  const auto pe = eager_model.named_parameters(), pc = compiled_model.named_parameters();
  REQUIRE(pe.size() == pc.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    CAPTURE(pe[i].first);
    CHECK(close(pe[i].second, pc[i].second, 1e-5));
  }
}

TEST_CASE("gpt: decoding with a key-value cache, compiled at a symbolic length, is eager's") {
  const gpt::GptConfig c{.vocab = 256, .context = 32, .width = 32, .heads = 2, .layers = 2};
  manual_seed(22);
  gpt::Gpt model(c);
  model.eval();
  NoGradGuard no_grad;
  auto decode = [&](const Tensor& tok, const Tensor& pos, const Tensor& k, const Tensor& v) {
    std::vector<Tensor> kc, vc;
    for (int64_t i = 0; i < k.size(0); ++i) {
      kc.push_back(select(k, 0, i));
      vc.push_back(select(v, 0, i));
    }
    Tensor logits = model.decode_step(tok, pos, kc, vc);
    return std::vector<Tensor>{logits, stack(kc), stack(vc)};
  };
  CompileOptions o;
  o.dynamic = {{1, 0}, {2, 3}, {3, 3}};
  auto compiled = compile(decode, o);
  Tensor k = stack(model.empty_cache(1)), v = stack(model.empty_cache(1));
  Tensor kc = k, vc = v;
  const Options i64 = Options().dtype(DType::i64);
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 12; ++i) tokens.push_back((i * 37) % c.vocab);
  Tensor last_logits;
  for (int64_t i = 0; i < 12; ++i) {
    const Tensor tok = full({1, 1}, tokens[static_cast<size_t>(i)], i64), pos = full({1}, i, i64);
    std::vector<Tensor> e = decode(tok, pos, k, v), r = compiled(tok, pos, kc, vc);
    CAPTURE(i);
    CHECK(close(e[0], r[0], 1e-5));
    k = e[1];
    v = e[2];
    kc = r[1];
    vc = r[2];
    last_logits = e[0];
  }
  CHECK(compiled.stats().traces == 1);
  // The cache decodes what a forward over the whole sequence predicts at its last position.
  std::vector<double> seq(tokens.begin(), tokens.end());
  const Tensor full_logits = model(tensor(seq, {1, 12}, i64));
  CHECK(close(select(full_logits, 1, 11), last_logits, 1e-4));
}

}  // namespace duet::test
namespace duet::test {

TEST_CASE("gpt: a compiled training step holds less memory than the eager one, f32 and bf16") {
  // One block of width 256 over 256 tokens, vocabulary 4096, AdamW. The eager step's peak
  // beyond what it starts with, against the compiled step's: what a call adds, plus the buffers
  // its plan keeps between calls. Under autocast the compiled step once held 36.8 MB against
  // 27.8 eager: the fusion pass joined each weight's bf16 cast (forward) with the optimizer's
  // decay of the same weight (the last step) as siblings, which kept the decayed weight live
  // through the whole step.
  const gpt::GptConfig c{.vocab = 4096, .context = 256, .width = 256, .heads = 4, .layers = 1};
  manual_seed(23);
  const Tensor tokens = randint(c.vocab, {1, 257});
  const Tensor x = slice(tokens, 1, 0, 256).contiguous(), y = slice(tokens, 1, 1, 257).contiguous();
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    manual_seed(1);
    gpt::Gpt model(c);
    optim::AdamW opt(model.parameters(), gpt::adamw_options(1e-3));
    auto train = [&](const Tensor& a, const Tensor& b) {
      opt.zero_grad();
      Tensor loss;
      {
        Autocast scope(Device::cpu(), DType::bf16, bf16);
        loss = gpt::loss_of(model, a, b);
      }
      loss.backward();
      opt.step();
      return loss;
    };
    auto held = [](auto&& f) {
      const int64_t before = cpu_memory_stats().current;
      reset_peak_memory();
      f();
      return cpu_memory_stats().peak - before;
    };
    train(x, y);
    const int64_t eager = held([&] { train(x, y); });
    auto step = compile(train);
    step(x, y);
    step(x, y);
    const int64_t compiled = held([&] { step(x, y); }) + step.stats().buffer_bytes;
    MESSAGE(std::string(bf16 ? "bf16" : "f32")
            << ": eager " << eager / 1024 << " KiB, compiled " << compiled / 1024 << " KiB");
    CHECK(compiled < eager);
  }
}

}  // namespace duet::test
