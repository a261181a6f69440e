// Autobatch (eager/autobatch.h, Note [Autobatch]): per-sample models (a TreeLSTM over random
// binary trees, a BiLSTM tagger over sentences of different lengths) give the values and
// gradients of the unbatched eager run in far fewer kernels; reads, in-place writes, dead ops,
// batches that are views, random ops, traces, and the errors.
#include <doctest/doctest.h>

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

// The loss and the parameters' gradients of one step, in an Autobatch scope or not.
std::pair<Tensor, std::vector<Tensor>> step(std::vector<Tensor> params,
                                            const std::function<Tensor()>& loss, bool batched) {
  for (Tensor& p : params)
    if (p.grad().defined()) p.grad().zero_();
  Tensor l;
  {
    std::optional<Autobatch> scope;
    if (batched) scope.emplace();
    l = loss();
    l.backward();
  }
  std::vector<Tensor> g;
  for (const Tensor& p : params) g.push_back(p.grad().clone());
  return {l, g};
}

void check_same_step(std::vector<Tensor> params, const std::function<Tensor()>& loss) {
  auto [want, want_g] = step(params, loss, false);
  auto [got, got_g] = step(params, loss, true);
  CHECK(close(got, want, 1e-5));
  REQUIRE(got_g.size() == want_g.size());
  for (size_t i = 0; i < got_g.size(); ++i) CHECK(close(got_g[i], want_g[i], 1e-4));
}

TEST_CASE("autobatch: a TreeLSTM over random trees, values and gradients") {
  // B2's model (samples/treelstm.h), small.
  manual_seed(3);
  treelstm::TreeLSTM m(20, 6, 3);
  std::mt19937 g(5);
  const std::vector<treelstm::Sample> batch = treelstm::random_batch(g, 12, 2, 10, 20, 3);
  check_same_step(m.parameters(), [&] { return m.loss(batch); });
  const AutobatchStats s = autobatch_stats();
  CHECK(s.runs == 1);  // the backward defers the leaves' accumulation: one run at the end
  CHECK(s.batches > 0);
  CHECK(s.kernels_launched * 4 < s.ops_recorded);
}

TEST_CASE("autobatch: a BiLSTM tagger over sentences of different lengths") {
  manual_seed(4);
  Tagger m;
  std::mt19937 g(7);
  std::vector<Tensor> words, tags;
  for (int i = 0; i < 8; ++i) {
    const int n = 2 + static_cast<int>(g() % 6);
    std::vector<double> w, t;
    for (int k = 0; k < n; ++k) {
      w.push_back(static_cast<double>(g() % 30));
      t.push_back(static_cast<double>(g() % 4));
    }
    words.push_back(tensor(w, Options().dtype(DType::i64)));
    tags.push_back(tensor(t, Options().dtype(DType::i64)));
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
  CHECK(s.kernels_launched * 3 < s.ops_recorded);
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
  CHECK(s.batches == 4);  // a product and a bias add per weight
  for (int i = 0; i < 16; ++i) {
    const Tensor& xi = x[static_cast<size_t>(i)];
    CHECK(close(y[static_cast<size_t>(i)], i % 3 == 0 ? a(xi) : b(xi), 1e-6));
  }
}

TEST_CASE("autobatch: a weight's per-use products sum as one product") {
  // Note [Sums of products]: the backward sums a shared weight's gradients, one product per use.
  std::vector<Tensor> a, b;
  for (int i = 0; i < 5; ++i) {
    a.push_back(randn({4, 1 + i % 2}));
    b.push_back(randn({1 + i % 2, 3}));
  }
  Tensor want = zeros({4, 3});
  for (int i = 0; i < 5; ++i) want = want + matmul(a[i], b[i]);
  Autobatch scope;
  std::vector<Tensor> parts, transposed, mixed;
  for (int i = 0; i < 5; ++i) {
    parts.push_back(matmul(a[i], b[i]));
    transposed.push_back(matmul(b[i].t(), a[i].t()).t());  // the layout of x W^T's weight grad
    mixed.push_back(i == 2 ? parts.back() + 0 : parts.back());
  }
  const Tensor sum = detail::sum_of_products(parts), sum_t = detail::sum_of_products(transposed);
  REQUIRE(sum.defined());
  REQUIRE(sum_t.defined());
  CHECK(close(sum, want, 1e-5));
  CHECK(close(sum_t, want, 1e-5));
  CHECK(!detail::sum_of_products(mixed).defined());  // a part that is no product: summed as is
}

TEST_CASE("autobatch: the gradients of slices, scatters and sums add up as one op each") {
  // Note [Sums of slices], [Sums of scatters], [Sums of sums]: what the backward sums.
  const Tensor g1 = randn({2, 3}), g2 = randn({2, 4}), g3 = randn({2, 3});
  const Tensor i1 = tensor({3, 1, 0, 3, 4, 4}, {2, 3}, Options().dtype(DType::i64));
  const Tensor i2 = tensor({0, 0, 2}, {1, 3}, Options().dtype(DType::i64));
  const Tensor s1 = randn({2, 3}), s2 = randn({1, 3});
  const Tensor a1 = randn({2, 4}), a2 = randn({3, 4}), b = randn({4, 4});
  Autobatch scope;
  auto into_zeros = [](const Tensor& g, int64_t start) {
    return slice_scatter(zeros({2, 12}), g, 1, start, start + g.sizes()[1]);
  };
  // The same slice twice (added), a slice before it, gaps at 4 and from 8.
  const std::vector<Tensor> slices = {into_zeros(g1, 5), into_zeros(g2, 0), into_zeros(g3, 5)};
  const Tensor got = detail::sum_of_slices(slices);
  REQUIRE(got.defined());
  CHECK(close(got, slices[0] + slices[1] + slices[2], 1e-6));
  CHECK(!detail::sum_of_slices({into_zeros(g1, 0), into_zeros(g2, 1)}).defined());  // overlap
  CHECK(!detail::sum_of_slices({into_zeros(g1, 0), g2.sum() + zeros({2, 12})}).defined());

  const std::vector<Tensor> scatters = {scatter_add(zeros({5, 3}), 0, i1, s1),
                                        scatter_add(zeros({5, 3}), 0, i2, s2)};
  const Tensor sc = detail::sum_of_scatter_adds(scatters);
  REQUIRE(sc.defined());
  CHECK(close(sc, scatters[0] + scatters[1], 1e-6));
  CHECK(!detail::sum_of_scatter_adds({scatters[0], scatter_add(ones({5, 3}), 0, i2, s2)})
             .defined());  // a base that is not zero

  // A bias's gradients: sums over the leading dim, kept as (1, 4) and reshaped.
  const std::vector<Tensor> sums = {reshape(sum(a1, {0}, true), {4}),
                                    reshape(sum(a2, {0}, true), {4})};
  const Tensor su = detail::sum_of_sums(sums);
  REQUIRE(su.defined());
  CHECK(close(su, sum(a1, {0}) + sum(a2, {0}), 1e-6));
  CHECK(!detail::sum_of_sums({sum(b, {0}), sum(b, {1})}).defined());  // other dims
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

}  // namespace
}  // namespace duet::test
