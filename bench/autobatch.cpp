// duet_bench B1, B2 (docs/benchmarks.md): per-sample models trained eagerly, one sample at a
// time as users write them, in a duet::Autobatch scope against the plain loop (and, for B1,
// against the same model batched by hand, padded and masked). One step: the loss of a batch of
// 64 samples and its backward (no optimizer). Rows: samples per second (median), kernels run
// per step, and the peak of the CPU allocator during a step.
//  - B1: a BiLSTM tagger (embeddings 64, LSTM cells of 64 each way, 8 tags) over sentences of
//    5-60 tokens; the hand-batched version runs both cells over (64, 64) padded steps, keeps
//    each sentence's state where its tokens end (masks), and averages the tags' losses over
//    the real tokens.
//  - B2: the binary TreeLSTM of samples/treelstm.h (embeddings and hidden 64, 5 classes) over
//    random binary trees of 2-40 leaves.
#include <optional>
#include <random>

#include "bench/bench.h"
#include "duet.h"
#include "samples/treelstm.h"

namespace bench {

using duet::Tensor;
namespace nn = duet::nn;

namespace {

constexpr int64_t kBatch = 64, kDim = 64;

// The losses of two modes of one step agree (float tolerance), or the rows would mean nothing.
void check_agree(const char* name, float want, float got) {
  if (!(std::abs(got - want) <= 1e-4 * (1 + std::abs(want))))
    throw duet::Error(
        fmt::format("{}: the step's loss is {} one way and {} the other", name, want, got));
}

// Times each mode's step, and writes the rows: samples/s; kernels per step (an Autobatch
// scope counts what it runs; the others are counted by a dispatch mode); and the peak of the
// CPU allocator over a step, above what was allocated before it.
void report(const char* name, const Config& c, std::vector<Result>& out,
            const std::vector<std::pair<const char*, std::function<void()>>>& modes) {
  std::vector<std::function<void()>> bodies;
  for (const auto& m : modes) bodies.push_back(m.second);
  // Each timed step follows an untimed one of its mode (a loop step leaves malloc work that
  // the next step would pay).
  const auto t = time_interleaved(bodies, c.reps, /*warmup=*/1, /*settle=*/1);
  for (size_t k = 0; k < modes.size(); ++k) {
    const std::string mode = modes[k].first;
    Result r = base(name, mode.c_str(), c, "samples_per_s");
    out.push_back(summarize(r, t[k], [](double s) { return kBatch / s; }));
    duet::reset_peak_memory();
    const int64_t before = duet::cpu_memory_stats().current;
    modes[k].second();
    Result p = base(name, mode.c_str(), c, "peak_mib");
    p.median = p.min = p.max =
        static_cast<double>(duet::cpu_memory_stats().peak - before) / (1 << 20);
    out.push_back(p);
    int64_t kernels = 0;
    if (mode == "autobatch") {
      kernels = duet::autobatch_stats().kernels_launched;
    } else {
      duet::detail::KernelCounter count;
      {
        duet::ModeGuard counting(&count);
        modes[k].second();
      }
      kernels = count.kernels;
    }
    Result kr = base(name, mode.c_str(), c, "kernels_per_step");
    kr.median = kr.min = kr.max = static_cast<double>(kernels);
    out.push_back(kr);
  }
}

}  // namespace

void run_b2(const Config& c, std::vector<Result>& out) {
  constexpr int64_t kVocab = 1000, kClasses = 5;
  duet::manual_seed(41);
  duet::treelstm::TreeLSTM model(kVocab, kDim, kClasses);
  std::mt19937 g(43);
  const std::vector<duet::treelstm::Sample> batch =
      duet::treelstm::random_batch(g, kBatch, 2, 40, kVocab, kClasses);
  const std::vector<Tensor> params = model.parameters();
  auto step = [&](bool batched) {
    for (const Tensor& p : params)
      if (p.grad().defined()) p.grad().zero_();
    std::optional<duet::Autobatch> scope;
    if (batched) scope.emplace();
    Tensor loss = model.loss(batch);
    loss.backward();
    return loss.item<float>();
  };
  check_agree("B2", step(false), step(true));
  report("B2", c, out, {{"loop", [&] { step(false); }}, {"autobatch", [&] { step(true); }}});
}

void run_b1(const Config& c, std::vector<Result>& out) {
  constexpr int64_t kVocab = 1000, kTags = 8;
  duet::manual_seed(47);
  nn::Embedding emb(kVocab, kDim);
  nn::LSTMCell fwd(kDim, kDim), bwd(kDim, kDim);
  nn::Linear tag(2 * kDim, kTags);
  std::mt19937 g(53);
  std::vector<Tensor> words, tags;
  std::vector<int64_t> lens;
  int64_t longest = 0;
  std::vector<std::vector<double>> ws, ts;
  for (int64_t i = 0; i < kBatch; ++i) {
    const int64_t n = 5 + static_cast<int64_t>(g() % 56);
    std::vector<double> w, t;
    for (int64_t k = 0; k < n; ++k) {
      w.push_back(static_cast<double>(g() % kVocab));
      t.push_back(static_cast<double>(g() % kTags));
    }
    words.push_back(duet::tensor(w, duet::Options().dtype(duet::DType::i64)));
    tags.push_back(duet::tensor(t, duet::Options().dtype(duet::DType::i64)));
    lens.push_back(n);
    longest = std::max(longest, n);
    ws.push_back(w);
    ts.push_back(t);
  }
  // The padded batch: words and tags (padding 0), the mask of real tokens, 1 / length.
  std::vector<double> pw, pt, pm, inv;
  for (int64_t i = 0; i < kBatch; ++i) {
    for (int64_t k = 0; k < longest; ++k) {
      const bool real = k < lens[static_cast<size_t>(i)];
      pw.push_back(real ? ws[static_cast<size_t>(i)][static_cast<size_t>(k)] : 0);
      pt.push_back(real ? ts[static_cast<size_t>(i)][static_cast<size_t>(k)] : 0);
      pm.push_back(real ? 1 : 0);
    }
    inv.push_back(1.0 / static_cast<double>(lens[static_cast<size_t>(i)]));
  }
  const Tensor pwords =
      duet::tensor(pw, {kBatch, longest}, duet::Options().dtype(duet::DType::i64));
  const Tensor ptags = duet::tensor(pt, {kBatch, longest}, duet::Options().dtype(duet::DType::i64));
  const Tensor mask = duet::tensor(pm, {kBatch, longest});
  const Tensor inv_len = duet::tensor(inv, {kBatch, 1});
  std::vector<Tensor> params;
  for (nn::Module* m : std::initializer_list<nn::Module*>{&emb, &fwd, &bwd, &tag})
    for (const Tensor& p : m->parameters()) params.push_back(p);
  auto zero = [&] {
    for (Tensor& p : params)
      if (p.grad().defined()) p.grad().zero_();
  };
  auto sentence_loss = [&](const Tensor& w, const Tensor& t) {
    const int64_t n = w.sizes()[0];
    Tensor x = emb(w);
    std::vector<Tensor> hf(static_cast<size_t>(n)), hb(static_cast<size_t>(n)), h;
    std::optional<nn::LSTMCell::State> s;
    for (int64_t k = 0; k < n; ++k) {
      s = fwd(x.select(0, k), s);
      hf[static_cast<size_t>(k)] = std::get<0>(*s);
    }
    s.reset();
    for (int64_t k = n - 1; k >= 0; --k) {
      s = bwd(x.select(0, k), s);
      hb[static_cast<size_t>(k)] = std::get<0>(*s);
    }
    for (int64_t k = 0; k < n; ++k)
      h.push_back(duet::cat({hf[static_cast<size_t>(k)], hb[static_cast<size_t>(k)]}, 0));
    return duet::cross_entropy(tag(duet::stack(h, 0)), t);
  };
  auto step = [&](bool batched) {
    zero();
    std::optional<duet::Autobatch> scope;
    if (batched) scope.emplace();
    Tensor loss;
    for (size_t i = 0; i < words.size(); ++i) {
      Tensor l = sentence_loss(words[i], tags[i]);
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    return loss.item<float>();
  };
  // By hand: both cells over the padded steps; a sentence's state stays put past its end (and
  // before its start, right to left); each tag's loss weighted by mask / length.
  auto padded = [&] {
    zero();
    Tensor x = emb(pwords);
    auto run = [&](nn::LSTMCell& cell, bool reverse) {
      std::vector<Tensor> hs(static_cast<size_t>(longest));
      Tensor h = duet::zeros({kBatch, kDim}), cs = duet::zeros({kBatch, kDim});
      for (int64_t s = 0; s < longest; ++s) {
        const int64_t k = reverse ? longest - 1 - s : s;
        auto [h1, c1] = cell(x.select(1, k), nn::LSTMCell::State{h, cs});
        const Tensor m = mask.select(1, k).unsqueeze(1);
        h = m * h1 + (1 - m) * h;
        cs = m * c1 + (1 - m) * cs;
        hs[static_cast<size_t>(k)] = h;
      }
      return duet::stack(hs, 1);  // (batch, longest, dim)
    };
    Tensor h = duet::cat({run(fwd, false), run(bwd, true)}, 2);
    Tensor lp = duet::log_softmax(tag(h), -1);
    Tensor picked = duet::gather(lp, 2, ptags.unsqueeze(2)).squeeze(2);
    Tensor loss = -(picked * mask * inv_len).sum();
    loss.backward();
    return loss.item<float>();
  };
  const float want = step(false);
  check_agree("B1", want, step(true));
  check_agree("B1", want, padded());
  report("B1", c, out,
         {{"loop", [&] { step(false); }}, {"autobatch", [&] { step(true); }}, {"padded", [&] {
                                                                                 padded();
                                                                               }}});
}

}  // namespace bench
