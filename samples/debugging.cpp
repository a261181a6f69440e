// The debugging tools on a deliberately broken model (docs/debugging.md shows this output):
//   1. which line: an error names the line that called the op, under compile too;
//   2. a NaN from log(0) deep inside a compiled step, found by anomaly mode;
//   3. a retrace storm from a varying batch, explained by f.explain();
//   4. a probe: one intermediate of the compiled step beside its eager twin;
//   5. a profile of a training step, eager beside compiled;
//   6. eager and compiled disagree: a fusion pass forced wrong (from the testing library) is
//      found by check_against_eager, which names the pass and the node it broke.
// Each report is checked: the program exits with 1 if one is missing, so CI runs it as a test.
#include <cstdio>
#include <string>
#include <vector>

#include "broken_passes.h"
#include "duet.h"

using namespace duet;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("CHECK FAILED: %s\n", what.c_str());
    ++failures;
  }
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

int main() {
  manual_seed(7);
  nn::Linear enc(32, 64), head(16, 10);  // broken: head expects 16 features, enc makes 64

  std::printf("== 1. Which line?\n");
  const Tensor x = randn({8, 32});
  std::string e = error_of([&] { (void)head(relu(enc(x))); });
  std::printf("%s\n", e.c_str());
  check(has(e, "(at debugging.cpp:"), "the eager error names this file's line");
  auto step = compile([&](Tensor in) {
    auto s = scope("model");
    return head(relu(enc(in)));
  });
  e = error_of([&] { (void)step(x); });
  std::printf("%s\n", e.c_str());
  check(has(e, "while tracing compiled function at debugging.cpp:"), "the trace is named");
  check(has(e, "scope model"), "the scope is named");

  std::printf("\n== 2. A NaN deep inside a compiled step\n");
  auto loss_fn = compile([](Tensor p, Tensor y) {
    Tensor scaled = p * 2.0 - 1.0;
    return mean(y * log(scaled + 1.0));  // log(0) where p == 0
  });
  const Tensor p = tensor({0.5, 0.0, 0.25}), y = tensor({1, 1, 1});
  std::printf("without anomaly mode the loss is %g\n", loss_fn(p, y).item<double>());
  {
    AnomalyMode on;  // takes effect at the next call of the cached plan
    e = error_of([&] { (void)loss_fn(p, y); });
  }
  std::printf("%s\n", e.c_str());
  check(has(e, "[anomaly]") && has(e, "(log, called at debugging.cpp:"),
        "anomaly mode names the log and its line");

  std::printf("\n== 3. A retrace storm from a varying batch\n");
  auto norm = compile([](Tensor b) {
    // Reading the batch size as an integer keeps it concrete: a new trace per batch size.
    return sum(b, {0}) / static_cast<double>(b.size(0));
  });
  for (int64_t batch : {8, 9, 10, 11}) (void)norm(randn({batch, 4}));
  const std::string why = norm.explain().str();
  std::printf("%s", why.c_str());
  check(norm.stats().traces >= 4, "a trace per batch size");
  check(has(why, "size(0) at debugging.cpp:"), "the specialization names the line");
  auto fixed = compile([](Tensor b) { return mean(b, {0}); });
  for (int64_t batch : {8, 9, 10, 11}) (void)fixed(randn({batch, 4}));
  std::printf("with mean(): %lld traces for 4 batch sizes\n",
              static_cast<long long>(fixed.stats().traces));
  check(fixed.stats().traces <= 2, "mean() lets the batch be symbolic");

  std::printf("\n== 4. A probe: one intermediate, compiled beside eager\n");
  nn::Linear l1(32, 64), l2(64, 10);
  auto forward = [&](Tensor in) {
    Tensor h = probe(tanh(l1(in)), "hidden");
    return l2(h);
  };
  auto fwd = compile(forward);
  (void)fwd(x);
  (void)forward(x);
  const double diff = max(abs(fwd.probe("hidden") - probed("hidden"))).item<double>();
  std::printf("largest difference of \"hidden\", compiled against eager: %g\n", diff);
  check(diff < 1e-5, "the probe agrees with eager");

  std::printf("\n== 5. A profile of a training step, eager beside compiled\n");
  nn::Sequential model{nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 10)};
  optim::SGD sgd(model.parameters(), {.lr = 0.1});
  const Tensor targets = randint(10, {8});
  auto train = [&](Tensor in, Tensor t) {
    sgd.zero_grad();
    Tensor loss = cross_entropy(model(in), t);
    loss.backward();
    sgd.step();
    return loss;
  };
  auto train_c = compile(train);
  (void)train_c(x, targets);  // traced outside the profile
  std::string json;
  {
    Profiler prof;
    (void)train(x, targets);
    (void)train_c(x, targets);
    json = prof.json();
  }
  int ops = 0, steps = 0, plans = 0;
  for (size_t at = json.find("\"cat\": \""); at != std::string::npos;
       at = json.find("\"cat\": \"", at + 1)) {
    const std::string cat = json.substr(at + 8, json.find('"', at + 8) - at - 8);
    ops += cat == "op";
    steps += cat == "step";
    plans += cat == "compiled";
  }
  std::printf("eager: %d op events; compiled: %d plan events enclosing %d step events\n", ops,
              plans, steps);
  check(ops > 0 && steps > 0 && plans > 0, "both faces are in the profile");
  check(has(json, "\"site\": \"debugging.cpp:"), "events name their call sites");

  std::printf("\n== 6. Eager and compiled disagree: which pass, which node?\n");
  std::printf("%s", check_against_eager(train_c, x, targets).str().c_str());
  const Tensor w_before = model.parameters()[0].clone();
  CheckReport r;
  {
    // A fusion pass that wires a subtraction's operands the wrong way round.
    testing::BrokenPass broken(testing::kSwapOperands);
    r = check_against_eager(train_c, x, targets);
  }
  std::printf("%s", r.str().c_str());
  check(!r.ok && r.pass == testing::kSwapOperands, "the check names the broken pass");
  check(r.op == "sub" && has(r.site, "debugging.cpp:"), "and the node, with its line");
  const bool same = max(abs(model.parameters()[0] - w_before)).item<double>() == 0;
  std::printf("the parameters after the check are those before it: %s\n", same ? "yes" : "no");
  check(same, "the check leaves the caller's state as it was");

  std::printf("\n%s\n", failures ? "FAILED" : "all reports as expected");
  return failures ? 1 : 0;
}
