// Autobatch (eager/autobatch.h, Note [Autobatch]): per-sample models (a TreeLSTM over random
// binary trees, a BiLSTM tagger over sentences of different lengths) give the values and
// gradients of the unbatched eager run in far fewer kernels; reads, in-place writes, dead ops,
// batches that are views, random ops, traces, and the errors.
#include <doctest/doctest.h>

#include <optional>
#include <random>
#include <thread>

#include "samples/treelstm.h"
#include "util.h"

namespace duet::test {
namespace {

// A BiLSTM tagger: LSTM cells left to right and right to left over each sentence's embeddings,
// and a tag per word from both states.
struct Tagger {
  nn::Embedding emb{30, 8};
  nn::LSTMCell fwd{8, 6}, bwd{8, 6};
  nn::Linear tag{12, 4};
  std::vector<Tensor> parameters() {
    std::vector<Tensor> p;
    for (nn::Module* m : std::initializer_list<nn::Module*>{&emb, &fwd, &bwd, &tag})
      for (const Tensor& t : m->parameters()) p.push_back(t);
    return p;
  }
  Tensor loss(const Tensor& words, const Tensor& tags) {
    const int64_t n = words.sizes()[0];
    Tensor x = emb(words);
    std::vector<Tensor> hf(static_cast<size_t>(n)), hb(static_cast<size_t>(n));
    std::optional<nn::LSTMCell::State> s;
    for (int64_t t = 0; t < n; ++t) {
      s = fwd(x.select(0, t), s);
      hf[static_cast<size_t>(t)] = std::get<0>(*s);
    }
    s.reset();
    for (int64_t t = n - 1; t >= 0; --t) {
      s = bwd(x.select(0, t), s);
      hb[static_cast<size_t>(t)] = std::get<0>(*s);
    }
    std::vector<Tensor> h;
    for (int64_t t = 0; t < n; ++t)
      h.push_back(cat({hf[static_cast<size_t>(t)], hb[static_cast<size_t>(t)]}, 0));
    return cross_entropy(tag(stack(h, 0)), tags);
  }
};

// A random sentence of n words (of 30) and its tags (of 4), for the Tagger.
void add_sentence(std::mt19937& g, int n, std::vector<Tensor>& words, std::vector<Tensor>& tags) {
  std::vector<double> w, t;
  for (int k = 0; k < n; ++k) {
    w.push_back(static_cast<double>(g() % 30));
    t.push_back(static_cast<double>(g() % 4));
  }
  words.push_back(tensor(w, Options().dtype(DType::i64)));
  tags.push_back(tensor(t, Options().dtype(DType::i64)));
}

int64_t eager_kernels = 0;  // of the last unbatched step()

// The loss and the parameters' gradients of one step, in an Autobatch scope or not.
std::pair<Tensor, std::vector<Tensor>> step(std::vector<Tensor> params,
                                            const std::function<Tensor()>& loss, bool batched) {
  for (Tensor& p : params)
    if (p.grad().defined()) p.grad().zero_();
  Tensor l;
  detail::KernelCounter count;
  {
    std::optional<ModeGuard> counting;
    if (!batched) counting.emplace(&count);
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    l = loss();
    l.backward();
  }
  if (!batched) eager_kernels = count.kernels;
  std::vector<Tensor> g;
  for (const Tensor& p : params) g.push_back(p.grad().clone());
  return {l, g};
}

void check_same_step(std::vector<Tensor> params, const std::function<Tensor()>& loss,
                     double loss_tol = 1e-5, double grad_tol = 1e-4) {
  auto [want, want_g] = step(params, loss, false);
  auto [got, got_g] = step(params, loss, true);
  CHECK(close(got, want, loss_tol));
  REQUIRE(got_g.size() == want_g.size());
  for (size_t i = 0; i < got_g.size(); ++i) CHECK(close(got_g[i], want_g[i], grad_tol));
}

TEST_CASE("autobatch: a TreeLSTM over random trees, values and gradients") {
  // B2's model (samples/treelstm.h), small.
  manual_seed(3);
  treelstm::TreeLSTM m(20, 6, 3);
  std::mt19937 g(5);
  const std::vector<treelstm::Sample> batch = treelstm::random_batch(g, 12, 2, 10, 20, 3);
  check_same_step(m.parameters(), [&] { return m.loss(batch); });
  const AutobatchStats s = autobatch_stats();
  CHECK(s.runs == 1);  // the backward runs the forward, then walks the batched tape
  CHECK(s.batches > 0);
  CHECK(s.kernels_launched * 4 < eager_kernels);  // forward and backward, gathers included
}

TEST_CASE("autobatch: a BiLSTM tagger over sentences of different lengths") {
  manual_seed(4);
  Tagger m;
  std::mt19937 g(7);
  std::vector<Tensor> words, tags;
  for (int i = 0; i < 8; ++i) {
    add_sentence(g, 2 + static_cast<int>(g() % 6), words, tags);
  }
  check_same_step(m.parameters(), [&] {
    Tensor total;
    for (size_t i = 0; i < words.size(); ++i) {
      Tensor l = m.loss(words[i], tags[i]);
      total = total.defined() ? total + l : l;
    }
    return total;
  });
  const AutobatchStats s = autobatch_stats();
  CHECK(s.kernels_launched * 3 < eager_kernels);
}

// Note [Longest chains first]: each step of the cells reads the step before as a slice when
// the longest sentences come first in its batches, whatever order they were recorded in.
TEST_CASE("autobatch: sentences recorded shortest first batch as those recorded longest first") {
  manual_seed(6);
  Tagger m;
  std::mt19937 g(9);
  std::vector<Tensor> words, tags;
  for (int n : {2, 3, 4, 5, 6, 7, 8, 9}) add_sentence(g, n, words, tags);
  auto kernels = [&](bool longest_first) {
    check_same_step(m.parameters(), [&] {
      Tensor total;
      for (size_t k = 0; k < words.size(); ++k) {
        const size_t i = longest_first ? words.size() - 1 - k : k;
        Tensor l = m.loss(words[i], tags[i]);
        total = total.defined() ? total + l : l;
      }
      return total;
    });
    return autobatch_stats().kernels_launched;
  };
  // (Recorded shortest first without that order: 452 kernels against 442. The steps' gathers
  // aside, the order can still move a kernel: 439 against 440.)
  const int64_t shortest_first = kernels(false), longest_first = kernels(true);
  CHECK(std::abs(shortest_first - longest_first) <= 2);
}

TEST_CASE("autobatch: results of one batched op feed the next as views, without gathers") {
  Tensor x = randn({6, 5}), w = randn({5});
  std::vector<Tensor> y;
  {
    Autobatch scope;
    for (int64_t i = 0; i < 6; ++i) y.push_back(tanh(x.select(0, i) * w).exp());
  }
  const AutobatchStats s = autobatch_stats();
  CHECK(s.ops_recorded == 18);
  CHECK(s.kernels_launched == 3);  // mul, tanh and exp, once each
  CHECK(s.gathers == 0);           // x's rows and each result's samples lie at a fixed stride
  for (int64_t i = 0; i < 6; ++i) CHECK(close(y[static_cast<size_t>(i)], tanh(x[i] * w).exp()));
}

TEST_CASE("autobatch: by_op says which ops batched and which ran per sample") {
  // Vectors of one shape batch, and so do rows of different lengths (by rows, Note [Rows] in
  // core/ops/rows.cpp: their exp, and their sums of all); a chain of adds runs once per link.
  std::vector<Tensor> vectors, rows, keep;
  for (int64_t n : {2, 3, 4, 5}) {
    vectors.push_back(randn({7}));
    rows.push_back(randn({n, 3}));
  }
  {
    Autobatch scope;
    Tensor total;
    for (size_t i = 0; i < rows.size(); ++i) {
      keep.push_back(tanh(vectors[i]));
      Tensor l = sum(exp(rows[i]));
      total = total.defined() ? total + l : l;
    }
    keep.push_back(total);
  }
  const AutobatchStats s = autobatch_stats();
  auto find = [&](const char* op) {
    for (const AutobatchOpStats& o : s.by_op)
      if (o.op == op) return o;
    FAIL("no entry for " << op);
    return AutobatchOpStats{};
  };
  CHECK(find("tanh").groups == 1);
  CHECK(find("tanh").ops == 4);
  CHECK(find("exp").groups == 1);
  CHECK(find("exp").ops == 4);
  CHECK(find("sum").groups == 1);
  CHECK(find("add").groups == 3);
  CHECK(find("add").ops == 3);
  int64_t calls = 0;
  for (size_t i = 0; i < s.by_op.size(); ++i) {
    calls += s.by_op[i].ops;
    if (i) CHECK(s.by_op[i - 1].groups >= s.by_op[i].groups);  // the most groups first
  }
  CHECK(calls == s.ops_recorded);  // every recorded call ran in some group (no view here)
}

TEST_CASE("autobatch: an operand read from batches in turns is gathered once per batch") {
  // Note [Pieces by source]: z_i = a_i * c_i runs in a_i's order, and c_i comes from two
  // batches in turns (even i and odd i): one piece per batch, not one per sample.
  Tensor w = randn({4}).requires_grad_(true);
  std::vector<Tensor> x, y;
  for (int i = 0; i < 8; ++i) {
    x.push_back(randn({4}));
    y.push_back(randn({4}));
  }
  auto loss_of = [&](bool batched, bool turns) {
    if (w.grad().defined()) w.grad().zero_();
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    Tensor total;
    for (int i = 0; i < 8; ++i) {
      const Tensor& xi = x[static_cast<size_t>(i)];
      const Tensor& yi = y[static_cast<size_t>(i)];
      Tensor a = tanh(tanh(tanh(xi * w)));  // deeper: its group runs last
      Tensor c = i % 2 == 0 || !turns ? sigmoid(yi * w) : exp(yi + w);
      Tensor z = sum(a * c);
      total = total.defined() ? total + z : z;
    }
    total.backward();
    return total;
  };
  const Tensor want = loss_of(false, true);
  const Tensor want_grad = w.grad().clone();
  const Tensor got = loss_of(true, true);
  CHECK(close(got, want, 1e-6));
  CHECK(close(w.grad(), want_grad, 1e-5));
  const int64_t pieces = autobatch_stats().pieces;
  loss_of(true, false);  // c from one batch, in order: c is that batch
  // The two batches in turns are each whole: no piece more (before: a slice per sample).
  CHECK(pieces == autobatch_stats().pieces);
}

TEST_CASE("autobatch: samples of a batch in turns with tensors of their own, gathered by source") {
  // Note [Pieces by source]: c_i is a batch's sample for even i and a leaf of its own for odd
  // i; gathered by source, each leaf is a piece, and each gets its own gradient. 48 samples
  // find their sources through a table rather than a scan.
  for (const int n : {8, 48}) {
    CAPTURE(n);
    Tensor w = randn({4}).requires_grad_(true);
    std::vector<Tensor> x, y, leaf;
    for (int i = 0; i < n; ++i) {
      x.push_back(randn({4}));
      y.push_back(randn({4}));
      leaf.push_back(randn({4}).requires_grad_(true));
    }
    auto grads = [&](bool batched) {
      if (w.grad().defined()) w.grad().zero_();
      for (int i = 1; i < n; i += 2)
        if (leaf[static_cast<size_t>(i)].grad().defined())
          leaf[static_cast<size_t>(i)].grad().zero_();
      std::optional<Autobatch> scope;
      if (batched) scope.emplace();
      Tensor total;
      for (int i = 0; i < n; ++i) {
        const auto k = static_cast<size_t>(i);
        Tensor a = tanh(tanh(tanh(x[k] * w)));
        Tensor c = i % 2 == 0 ? sigmoid(y[k] * w) : leaf[k];
        Tensor z = sum(a * c);
        total = total.defined() ? total + z : z;
      }
      total.backward();
      std::vector<Tensor> g{total.detach(), w.grad().clone()};
      for (int i = 1; i < n; i += 2) g.push_back(leaf[static_cast<size_t>(i)].grad().clone());
      return g;
    };
    const std::vector<Tensor> want = grads(false), got = grads(true);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(close(got[i], want[i], 1e-5));
  }
}

TEST_CASE("autobatch: ops that read one of a few weights batch per weight, not by copies") {
  // Note [Groups by operand]: two layers of one shape make one signature; gathering their
  // weights would copy a weight per sample.
  nn::Linear a(5, 7), b(5, 7);
  std::vector<Tensor> x;
  for (int i = 0; i < 16; ++i) x.push_back(randn({1, 5}));
  std::vector<Tensor> y;
  {
    NoGradGuard no_grad;
    Autobatch scope;
    for (int i = 0; i < 16; ++i)
      y.push_back(i % 3 == 0 ? a(x[static_cast<size_t>(i)]) : b(x[static_cast<size_t>(i)]));
  }
  const AutobatchStats s = autobatch_stats();
  CHECK(s.gathers == 2);  // the inputs of each weight's batch; never a weight
  CHECK(s.batches == 2);  // a product with its bias (addmm) per weight
  for (int i = 0; i < 16; ++i) {
    const Tensor& xi = x[static_cast<size_t>(i)];
    CHECK(close(y[static_cast<size_t>(i)], i % 3 == 0 ? a(xi) : b(xi), 1e-6));
  }
}

// Note [Joined parts]: a differentiated group split by weight, whose results one signature
// reads across the weights, becomes one batch; its readers take it whole, not from two batches.
TEST_CASE("autobatch: the parts of a group that one signature reads across are joined") {
  manual_seed(8);
  nn::Linear a(5, 7), b(5, 7);
  std::vector<Tensor> x, params;
  for (int i = 0; i < 16; ++i) x.push_back(randn({5}));
  for (nn::Module* m : std::initializer_list<nn::Module*>{&a, &b})
    for (const Tensor& p : m->parameters()) params.push_back(p);
  auto loss = [&] {
    std::vector<Tensor> y;
    for (int i = 0; i < 16; ++i)
      y.push_back(tanh(i % 3 == 0 ? a(x[static_cast<size_t>(i)]) : b(x[static_cast<size_t>(i)])));
    return stack(y, 0).sum();
  };
  check_same_step(params, loss);
  const AutobatchStats s = autobatch_stats();
  // The inputs of each weight's product and the stack's rows; the tanh reads the joined
  // products whole (apart, they were two pieces and a concatenation: 4 gathers).
  CHECK(s.gathers == 3);
  // Parts whose samples each compute one value (exp of one of two weights): each part's value
  // is repeated over its samples in the joined batch.
  Tensor wa = randn({3}).requires_grad_(), wb = randn({3}).requires_grad_();
  std::vector<Tensor> z;
  for (int i = 0; i < 16; ++i) z.push_back(randn({3}));
  check_same_step({wa, wb}, [&] {
    std::vector<Tensor> y;
    for (int i = 0; i < 16; ++i) y.push_back(exp(i % 2 ? wa : wb) * z[static_cast<size_t>(i)]);
    return stack(y, 0).sum();
  });
}

// Note [Views by source]: views of the results of two weights' batches (a BiLSTM step's h'
// slices of its forward and backward cells) run as one view per batch, and the next ops split by
// weight read those views as they lie: nothing is joined or gathered between the two layers.
TEST_CASE("autobatch: views of several batches split by source, which stay apart") {
  manual_seed(9);
  nn::Linear a(5, 7), b(5, 7), a2(4, 3), b2(4, 3);
  std::vector<Tensor> x, params;
  for (int i = 0; i < 16; ++i) x.push_back(randn({5}));
  for (nn::Module* m : std::initializer_list<nn::Module*>{&a, &b, &a2, &b2})
    for (const Tensor& p : m->parameters()) params.push_back(p);
  auto loss = [&] {
    std::vector<Tensor> y;
    for (int i = 0; i < 16; ++i) {
      const bool first = i % 3 == 0;
      const Tensor h = (first ? a : b)(x[static_cast<size_t>(i)]).slice(0, 0, 4);
      y.push_back(tanh((first ? a2 : b2)(h)));
    }
    return stack(y, 0).sum();
  };
  check_same_step(params, loss);
  const AutobatchStats s = autobatch_stats();
  // The inputs of the first layer's two products, and the stack's rows; joined, the first
  // layer's batches were concatenated and the second layer's parts gathered their rows.
  CHECK(s.gathers == 3);
}

// A detached alias and the tensor itself are one memory read the same way, but only the
// tensor has a history: ops of one signature reading the alias first and the tensor next ran
// as one op on the alias (a shared operand), and the tensor's gradient was lost. Autocast's
// casts of matmul(x.detach(), x) made that group (a random program found it).
TEST_CASE("autobatch: a detached alias and its tensor in one group keep their own histories") {
  auto run = [](bool batched, bool autocast) {
    std::vector<Tensor> xs;
    for (int i = 0; i < 3; ++i)
      xs.push_back(make({0.5 + i, -1.0 - i}, {2}, DType::f32).requires_grad_());
    {
      std::optional<Autobatch> scope;
      if (batched) scope.emplace();
      std::optional<Autocast> ac;
      if (autocast) ac.emplace(Device::cpu(), DType::f16);
      Tensor loss;
      for (const Tensor& x : xs) {
        const Tensor x1 = x * 3;
        if (scope) scope->flush();  // x1 computed, as a read would leave it
        const Tensor v = x1.detach();
        const Tensor y = autocast ? matmul(v, x1) : sum((v * 2) * (x1 * 2));
        loss = loss.defined() ? loss + sin(y) : sin(y);
      }
      loss.backward();
    }
    std::vector<Tensor> g;
    for (const Tensor& x : xs) g.push_back(x.grad());
    return g;
  };
  for (bool autocast : {false, true}) {
    const std::vector<Tensor> want = run(false, autocast), got = run(true, autocast);
    for (size_t i = 0; i < want.size(); ++i) {
      REQUIRE(got[i].defined());
      CHECK(close(got[i], want[i], 1e-6));
    }
  }
}

TEST_CASE("autobatch: a backward walks a tape of batched ops, whatever reads the results") {
  // Note [Autobatch's tape]: eight samples of one op make one batched node.
  Tensor w = randn({3, 4}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int i = 0; i < 8; ++i) x.push_back(randn({1, 3}));
  auto loss_of = [&](bool batched, Tensor* kept) {
    if (w.grad().defined()) w.grad().zero_();
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    Tensor total;
    for (int i = 0; i < 8; ++i) {
      Tensor h = tanh(matmul(x[static_cast<size_t>(i)], w));
      if (i == 3) *kept = h;  // a result that outlives the run
      total = total.defined() ? total + sum(h * h) : sum(h * h);
    }
    total.backward({}, /*retain_graph=*/true);
    return total;
  };
  Tensor kept_eager, kept_batched;
  const Tensor want = loss_of(false, &kept_eager);
  const Tensor want_grad = w.grad().clone();
  const Tensor got = loss_of(true, &kept_batched);
  CHECK(close(got, want, 1e-6));
  CHECK(close(w.grad(), want_grad, 1e-5));
  const AutobatchStats s = autobatch_stats();
  CHECK(s.batches >= 3);  // the products, tanh and the squares: one batch each
  // The kept result has its own history and memory: it differentiates, and writing it does
  // not change what the batched tape saved.
  REQUIRE(kept_batched.requires_grad());
  const Tensor g = detail::grad({sum(kept_batched)}, {w}, {}, false, /*retain_graph=*/true)[0];
  const Tensor g_eager = grad({sum(kept_eager)}, {w})[0];
  CHECK(close(g, g_eager, 1e-6));
  {
    NoGradGuard no_grad;
    kept_batched.mul_(0);
  }
  CHECK(close(grad({got}, {w})[0], want_grad, 1e-5));
}

TEST_CASE("autobatch: an in-place write to a pending result that needs a gradient") {
  // The pending result has no history until its run: the write runs it first, and is then
  // recorded on the result's own copy (Note [Autobatch's tape]).
  Tensor w = randn({4}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int i = 0; i < 5; ++i) x.push_back(randn({4}));
  check_same_step(
      {w},
      [&] {
        Tensor total;
        for (int i = 0; i < 5; ++i) {
          Tensor y = x[static_cast<size_t>(i)] * w;
          CHECK(!y.is_leaf());  // (pending in the scope: asking runs it)
          y.mul_(2);
          const Tensor l = sum(exp(y) * y);
          total = total.defined() ? total + l : l;
        }
        return total;
      },
      1e-6, 1e-5);
}

TEST_CASE("autobatch: an op without a batching rule runs per sample on the batched tape") {
  // Every differentiable primitive has a rule; take tanh's away for the test, as an op added
  // without one would be: each sample then runs alone, on operands with their history.
  OpDef& def = detail::op_table()[static_cast<int>(OpId::Tanh)];
  const auto rule = def.batch;
  def.batch = nullptr;
  struct Restore {
    OpDef& d;
    decltype(rule) r;
    ~Restore() { d.batch = r; }
  } restore{def, rule};
  Tensor w = randn({5}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int i = 0; i < 4; ++i) x.push_back(randn({5}));
  check_same_step(
      {w},
      [&] {
        Tensor total;
        for (int i = 0; i < 4; ++i) {
          const Tensor c = tanh(x[static_cast<size_t>(i)] * w) * 3;
          const Tensor l = sum(c * c);
          total = total.defined() ? total + l : l;
        }
        return total;
      },
      1e-6, 1e-5);
}

TEST_CASE("autobatch: grad() and a second backward inside a scope") {
  Tensor w = randn({4}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int i = 0; i < 5; ++i) x.push_back(randn({4}));
  Tensor total, want;
  for (int i = 0; i < 5; ++i) {
    const Tensor l = sum(sigmoid(x[static_cast<size_t>(i)] * w));
    want = want.defined() ? want + l : l;
  }
  const Tensor want_g = grad({want}, {w}, {}, /*create_graph=*/true)[0];
  const Tensor want_gg = grad({sum(want_g * want_g)}, {w})[0];
  Autobatch scope;
  for (int i = 0; i < 5; ++i) {
    const Tensor l = sum(sigmoid(x[static_cast<size_t>(i)] * w));
    total = total.defined() ? total + l : l;
  }
  const Tensor g = grad({total}, {w}, {}, /*create_graph=*/true)[0];
  CHECK(close(g, want_g, 1e-6));
  const Tensor gg = grad({sum(g * g)}, {w})[0];  // through the batched tape's own backward
  CHECK(close(gg, want_gg, 1e-5));
}

TEST_CASE("autobatch: rows picked from inputs of different lengths batch as one") {
  // Note [Picks]: each sample's rows of its own (n_i, 3) input, by select (a slice of dim 0,
  // recorded as its gradient flows through it) and by index_select, from inputs the scope
  // computes (batched by length) and from inputs made before it.
  Tensor w = randn({3}).requires_grad_(true);
  std::vector<Tensor> x, picks;
  const int64_t lens[] = {3, 7, 4, 7, 5, 2, 6, 3};
  for (int64_t n : lens) {
    x.push_back(randn({n, 3}));
    picks.push_back(tensor({0.0, static_cast<double>(n - 1)}, Options().dtype(DType::i64)));
  }
  auto loss = [&] {
    Tensor total;
    for (size_t i = 0; i < x.size(); ++i) {
      const Tensor h = x[i] * w;  // computed in the scope, batched by rows
      const int64_t n = lens[i];
      Tensor l = sum(exp(h.select(0, n - 1)) * h.select(0, n / 2));  // slices
      l = l + sum(tanh(index_select(h, 0, picks[i])));               // a Gather
      l = l + sum(sigmoid(index_select(x[i], 0, picks[i]) * w));     // of an input
      total = total.defined() ? total + l : l;
    }
    return total;
  };
  check_same_step({w}, loss, 1e-6, 1e-5);
  const AutobatchStats s = autobatch_stats();
  // One batch of products (by rows), one of the two selects, one of each index_select: never a
  // pick per sample (at least 8 x 3 batches of picks).
  CHECK(s.batches < 30);
  // Samples that alternate between two sources (parameters of different lengths): each
  // source's rows are taken at once, and each sample still gets its own.
  Tensor a = randn({3, 3}).requires_grad_(true), b = randn({6, 3}).requires_grad_(true);
  check_same_step({a, b}, [&] {
    Tensor total;
    for (size_t i = 0; i < x.size(); ++i) {
      const Tensor& src = i % 2 ? b : a;
      const Tensor rows = tensor({static_cast<double>(i % 3), 2.0}, Options().dtype(DType::i64));
      const Tensor l = sum(index_select(src, 0, rows) * static_cast<double>(i + 1));
      total = total.defined() ? total + l * l : l * l;
    }
    return total;
  });
  // Without a gradient, the rows are copied straight into the batch.
  std::vector<Tensor> got;
  {
    NoGradGuard no_grad;
    Autobatch scope;
    for (size_t i = 0; i < x.size(); ++i) got.push_back(index_select(x[i] * 2, 0, picks[i]));
  }
  for (size_t i = 0; i < x.size(); ++i)
    CHECK(bitwise_equal(got[i], index_select(x[i] * 2, 0, picks[i])));
}

TEST_CASE("autobatch: a picked index out of range is the eager error") {
  std::vector<Tensor> x{randn({3, 2}), randn({5, 2})};
  const Tensor ok = full({1}, 1, Options().dtype(DType::i64));
  const Tensor bad = full({1}, 4, Options().dtype(DType::i64));  // in range of the longer only
  Tensor r;
  Autobatch scope;
  r = index_select(x[0], 0, bad) + index_select(x[1], 0, ok);
  CHECK_THROWS_WITH_AS(scope.flush(), doctest::Contains("out of range"), Error);
}

TEST_CASE("autobatch: samples of differentiated batches are placed when read") {
  // Note [Placed when read]: their storages stay lazy in the run unless something reads them:
  // a consumer recorded without a gradient, a view of the storage made without one, a tensor
  // kept after the run.
  Tensor w = randn({4}).requires_grad_(true);
  std::vector<Tensor> x;
  for (int i = 0; i < 6; ++i) x.push_back(randn({3, 4}));
  std::vector<Tensor> read, views, kept;
  {
    Autobatch scope;
    for (int i = 0; i < 6; ++i) {
      Tensor y = tanh(x[static_cast<size_t>(i)] * w);  // differentiated: batched
      Tensor z = sigmoid(x[static_cast<size_t>(i)] * w);
      NoGradGuard no_grad;
      read.push_back(z * 2 + 1);        // a consumer without a gradient reads z's samples
      views.push_back(y.select(0, 1));  // a view made at once; y itself is dropped
      if (i == 2) kept.push_back(y);
    }
  }
  for (int i = 0; i < 6; ++i) {
    const Tensor want = tanh(x[static_cast<size_t>(i)] * w).detach();
    const Tensor z = sigmoid(x[static_cast<size_t>(i)] * w).detach();
    CHECK(close(read[static_cast<size_t>(i)], z * 2 + 1, 1e-6));
    CHECK(close(views[static_cast<size_t>(i)], want.select(0, 1), 1e-6));
  }
  CHECK(close(kept[0].detach(), tanh(x[2] * w).detach(), 1e-6));
}

TEST_CASE("autobatch: a read runs what is pending; an in-place write runs after it") {
  Tensor a = tensor({1, 2, 3});
  Autobatch scope;
  Tensor y = a * 2;
  CHECK(autobatch_stats().kernels_launched == 0);  // recorded only
  a.add_(1);                                       // y was recorded before the write
  CHECK(y.to_vector<float>() == std::vector<float>{2, 4, 6});
  Tensor z = a * 2;
  CHECK(z.sum().item<float>() == 18);
  CHECK(autobatch_stats().runs >= 2);
}

TEST_CASE("autobatch: ops whose results nobody holds do not run") {
  Tensor x = randn({4});
  Tensor kept;
  {
    Autobatch scope;
    (void)(x * 3);  // dropped at once
    kept = x + 1;
  }
  CHECK(autobatch_stats().ops_recorded == 2);
  CHECK(autobatch_stats().kernels_launched == 1);
  CHECK(close(kept, x + 1));
}

TEST_CASE("autobatch: random ops draw what they draw eagerly") {
  Tensor x = ones({4, 8});
  manual_seed(11);
  std::vector<Tensor> want;
  for (int64_t i = 0; i < 4; ++i) want.push_back(dropout(x[i], 0.5, true));
  manual_seed(11);
  std::vector<Tensor> got;
  {
    Autobatch scope;
    for (int64_t i = 0; i < 4; ++i) got.push_back(dropout(x[i], 0.5, true));
  }
  for (size_t i = 0; i < 4; ++i) CHECK(bitwise_equal(got[i], want[i]));
}

TEST_CASE("autobatch: compile inside a scope, and a scope inside a compiled function") {
  Tensor x = randn({3});
  auto f = compile([](const Tensor& v) { return v * v + 1; });
  Tensor before = f(x);
  {
    Autobatch scope;
    Tensor p = x * 2;  // pending when the compiled call reads it
    CHECK(close(f(p), p * p + 1));
  }
  auto g = compile([](const Tensor& v) {
    Autobatch inner;  // a trace records the ops: the scope does nothing
    return v.exp() * 2;
  });
  CHECK(close(g(x), x.exp() * 2));
  CHECK(close(before, x * x + 1));
}

TEST_CASE("autobatch: an in-place write of another dtype keeps its gradient") {
  // t.sub_(x) with x f64 and t f32 computes t - x out of place (pending) and copies it into t.
  // The copy's tape node took its input's edge while the result was pending, before it had
  // its history, and x's gradient was lost (found by Autobatch's random programs).
  for (const DType dt : {DType::f64, DType::f32}) {
    CAPTURE(dt);
    Tensor x = randn({3, 4}, Options().dtype(dt)).requires_grad_(true);
    {
      Autobatch scope;
      Tensor t = ne(x, x).to(DType::f32) * 1.25;  // pending, needs no gradient
      t.sub_(x);
      logsumexp(t, {1}).sum().backward();
    }
    REQUIRE(x.grad().defined());
    Tensor want;
    {
      Tensor x2 = x.detach().requires_grad_(true);
      Tensor t = ne(x2, x2).to(DType::f32) * 1.25;
      t.sub_(x2);
      logsumexp(t, {1}).sum().backward();
      want = x2.grad();
    }
    CHECK(close(x.grad(), want, 1e-6));
  }
}

TEST_CASE("autobatch: a failed run is an Error, and so is reading what it did not compute") {
  Tensor table = randn({4, 3});
  Tensor bad = full({1}, 9, Options().dtype(DType::i64));  // out of range for 4 rows
  Tensor r;
  {
    Autobatch scope;
    r = embedding(table, bad) * 2;  // the error, raised when the ops run, names this line
    CHECK_THROWS_WITH_AS(scope.flush(), doctest::Contains("test_autobatch.cpp:"), Error);
  }
  CHECK_THROWS_AS(r.sum().item<float>(), Error);
}

// An op recorded on a tensor that a failed run left uncomputed raises, after running what is
// pending (Autobatch::Impl::record checks its operands before it makes the op): the ops pending
// then, and those recorded after, compute as before.
TEST_CASE("autobatch: an op on what a failed run left is an Error, and the scope goes on") {
  manual_seed(3);
  Tensor table = randn({4, 3});
  Tensor bad = full({1}, 9, Options().dtype(DType::i64));
  Tensor x = randn({3});
  Autobatch scope;
  Tensor r = embedding(table, bad) * 2;
  CHECK_THROWS_AS(scope.flush(), Error);
  Tensor a = x * 3;  // pending when the next line raises
  CHECK_THROWS_AS(r + 1, Error);
  Tensor b = a * 2 + 1;
  CHECK(close(a, x.detach() * 3, 1e-6));
  CHECK(close(b, x.detach() * 6 + 1, 1e-6));
  CHECK(autobatch_stats().ops_recorded >= 1);
}

TEST_CASE("autobatch: a pending tensor read on another thread is an Error") {
  Autobatch scope;
  Tensor y = randn({3}) * 2;
  bool threw = false;
  std::thread t([&] {
    try {
      (void)y.data_ptr<float>();
    } catch (const Error&) {
      threw = true;
    }
  });
  t.join();
  CHECK(threw);
  CHECK(y.numel() == 3);
}

// Note [Tensor object cache]: a scope's tensor objects come from regions that malloc never made.
// Results kept past their scope, freed outside any scope, on another thread, by a thread that
// exits, and many more than a short list holds, must never reach free(); their values stay right.
TEST_CASE("autobatch: results outlive their scope and their thread") {
  auto made = [](int n) {
    std::vector<Tensor> kept;
    Autobatch scope;
    for (int i = 0; i < n; ++i) kept.push_back(full({2}, static_cast<double>(i)) * 2 + 1);
    return kept;
  };
  std::vector<Tensor> here = made(3000), there;
  std::thread t([&] {
    std::vector<Tensor> own = made(3000);  // freed as the thread ends
    there = made(3000);                    // freed on the main thread
    CHECK(own[2999].to_vector<float>()[1] == 5999.0f);
  });
  t.join();
  for (int i : {0, 1234, 2999}) {
    CHECK(here[static_cast<size_t>(i)].to_vector<float>()[0] == 2.0f * i + 1);
    CHECK(there[static_cast<size_t>(i)].to_vector<float>()[1] == 2.0f * i + 1);
  }
  here.clear();  // outside any scope: more than a short list holds
  there.clear();
  for (int round = 0; round < 3; ++round) {  // the objects freed above are drawn again
    std::vector<Tensor> again = made(3000);
    CHECK(again[2999].to_vector<float>()[0] == 5999.0f);
  }
}

// An op made under NoGradGuard may join a group of ops that record a gradient (a copy of a
// vector beside copies of vectors of other lengths, grouped by rows). Its operand must not be
// wired into the group's tape: eagerly that operand gets no gradient from it, even where the
// backward reaches the op's result through a detached view (autobatch seed 157334 of the batch
// mix: a while_loop's copy of its state beside a scan's copies of its carry; x got zeros).
TEST_CASE(
    "autobatch: an op under NoGradGuard in a differentiated group sends its operand nothing") {
  auto run = [](bool batched) {
    manual_seed(3);
    std::vector<Tensor> xs, cs;
    for (int64_t n : {3, 5, 1}) {
      xs.push_back(randn({n}).requires_grad_());
      cs.push_back(randn({n + 1}).requires_grad_());
    }
    {
      std::optional<Autobatch> scope;
      if (batched) scope.emplace();
      Tensor loss;
      for (size_t k = 0; k < xs.size(); ++k) {
        Tensor y;
        {
          NoGradGuard ng;
          y = xs[k].clone();
        }
        Tensor z = cs[k].clone();
        Tensor l = (z.sum() * y.detach()).sin().sum();  // (a product that records a gradient)
        loss = loss.defined() ? loss + l : l;
      }
      loss.backward();
    }
    return std::make_pair(xs, cs);
  };
  auto [ex, ec] = run(false);
  auto [bx, bc] = run(true);
  for (size_t k = 0; k < ex.size(); ++k) {
    CHECK_FALSE(ex[k].grad().defined());
    CHECK_FALSE(bx[k].grad().defined());
    CHECK(close(bc[k].grad(), ec[k].grad()));
  }
}

// docs/design.md, "Missing .grad": only a trace makes a zero .grad for a leaf whose gradient is
// read; in an Autobatch scope (a mode, but eager) a leaf the backward has not reached has none.
TEST_CASE("autobatch: reading a leaf's .grad in a scope makes no buffer") {
  Tensor w = randn({3}).requires_grad_();
  {
    Autobatch scope;
    Tensor a = tensor({1.0, 2.0, 3.0}).requires_grad_();
    CHECK_FALSE(a.grad().defined());
    CHECK_FALSE(w.grad().defined());
    (a * 2).sum().backward();
    CHECK(a.grad().defined());
  }
  CHECK_FALSE(w.grad().defined());
}

}  // namespace
}  // namespace duet::test
