// LibTorch-style Tensor methods (x.sum(), x.reshape(...), a.add(b), ...), generated from the rows
// of core/elementwise.def and core/api.def: each method gives exactly what its free function
// gives, for every row (a table that must name every kind-Method row); an rvalue's elementwise
// method reuses its buffer; a method's error names the user's line; `y.sum().backward()` works
// eagerly and compiled; and the ops added with the methods (view, flatten, t, expand_as).
#include <cmath>
#include <functional>
#include <set>
#include <source_location>
#include <string>
#include <tuple>
#include <vector>

#include "core/ops.h"
#include "eager/autograd.h"
#include "trace/compile.h"
#include "util.h"

namespace duet::test {
namespace {

Options f64() { return Options().dtype(DType::f64); }

using Results = std::vector<Tensor>;
Results one(const Tensor& t) { return {t}; }
Results both(const std::tuple<Tensor, Tensor>& t) { return {std::get<0>(t), std::get<1>(t)}; }

/// A method and the free function it stands for, on the same inputs.
struct MethodRow {
  std::string name;
  std::function<Results()> method, free;
};

/// Every kind-Method row's name, from core/api.def itself, and every elementwise row's.
std::set<std::string> method_names() {
  std::set<std::string> names;
#define DUET_API(kind, ret, name, params, args, doc) \
  if (std::string(#kind) == "Method") names.insert(#name);
#include "core/api.def"
#define DUET_UNARY(Name, name, math, doc) names.insert(#name);
#define DUET_BINARY(Name, name, doc) names.insert(#name);
#define DUET_COMPARE(Name, name, expr, doc) names.insert(#name);
#include "core/elementwise.def"
  return names;
}

std::vector<MethodRow> method_rows() {
  manual_seed(7);
  const Tensor x = randn({3, 4}, f64()), y = randn({3, 4}, f64());
  const Tensor pos = rand({3, 4}, f64()) + 0.5;
  const Tensor m = randn({4, 2}, f64());
  const Tensor mask = randn({3, 4}) > 0;
  const Tensor idx = randint(4, {3, 2});
  const Tensor sel = randint(3, {5});
  const Tensor probs = rand({2, 6}, f64());
  std::vector<MethodRow> rows;
  // Elementwise: generated from the rows, with a tensor and a scalar operand.
#define DUET_UNARY(Name, name, math, doc) \
  rows.push_back({#name, [=] { return one(pos.name()); }, [=] { return one(duet::name(pos)); }});
#define DUET_BINARY(Name, name, doc)                                          \
  rows.push_back({#name,                                                      \
                  [=] {                                                       \
                    return Results{pos.name(y), pos.name(1.5)};               \
                  },                                                          \
                  [=] {                                                       \
                    return Results{duet::name(pos, y), duet::name(pos, 1.5)}; \
                  }});
#define DUET_COMPARE(Name, name, expr, doc) DUET_BINARY(Name, name, doc)
#include "core/elementwise.def"
  auto row = [&](std::string name, std::function<Results()> method, std::function<Results()> free) {
    rows.push_back({std::move(name), std::move(method), std::move(free)});
  };
  const Tensor xn = where(mask, x, scalar(NAN, f64()));
  row(
      "isnan", [=] { return one(xn.isnan()); }, [=] { return one(isnan(xn)); });
  row(
      "isinf", [=] { return one((x / 0).isinf()); }, [=] { return one(isinf(x / 0)); });
  row(
      "isfinite", [=] { return one(xn.isfinite()); }, [=] { return one(isfinite(xn)); });
  row(
      "clamp", [=] { return one(x.clamp(-0.5, 0.5)); }, [=] { return one(clamp(x, -0.5, 0.5)); });
  row(
      "clamp_min", [=] { return one(x.clamp_min(-0.5)); }, [=] { return one(clamp_min(x, -0.5)); });
  row(
      "clamp_max", [=] { return one(x.clamp_max(0.5)); }, [=] { return one(clamp_max(x, 0.5)); });
  row(
      "reciprocal", [=] { return one(pos.reciprocal()); }, [=] { return one(reciprocal(pos)); });
  row(
      "square", [=] { return one(x.square()); }, [=] { return one(square(x)); });
  row(
      "lerp",
      [=] {
        return Results{x.lerp(y, 0.25), x.lerp(y, pos)};
      },
      [=] {
        return Results{lerp(x, y, 0.25), lerp(x, y, pos)};
      });
  row(
      "addcmul", [=] { return one(x.addcmul(y, pos, 2)); },
      [=] { return one(addcmul(x, y, pos, 2)); });
  row(
      "addcdiv", [=] { return one(x.addcdiv(y, pos)); }, [=] { return one(addcdiv(x, y, pos)); });
  row(
      "logical_not", [=] { return one(mask.logical_not()); },
      [=] { return one(logical_not(mask)); });
  row(
      "logical_and", [=] { return one(x.logical_and(mask)); },
      [=] { return one(logical_and(x, mask)); });
  row(
      "logical_or", [=] { return one(mask.logical_or(y)); },
      [=] { return one(logical_or(mask, y)); });
  row(
      "logical_xor", [=] { return one(x.logical_xor(y)); }, [=] { return one(logical_xor(x, y)); });
  row(
      "prod",
      [=] {
        return Results{pos.prod(), pos.prod({1}, true)};
      },
      [=] {
        return Results{prod(pos), prod(pos, {1}, true)};
      });
  row(
      "all",
      [=] {
        return Results{mask.all(), mask.all({0})};
      },
      [=] {
        return Results{all(mask), all(mask, {0})};
      });
  row(
      "any",
      [=] {
        return Results{mask.any(), mask.any({1}, true)};
      },
      [=] {
        return Results{any(mask), any(mask, {1}, true)};
      });
  row(
      "cumprod", [=] { return one(pos.cumprod(1)); }, [=] { return one(cumprod(pos, 1)); });
  const Tensor b3 = randn({2, 3, 4}, f64()), c3 = randn({2, 4, 2}, f64());
  row(
      "repeat",
      [=] {
        return one(x.repeat({2, 1, 2}));
      },
      [=] {
        return one(repeat(x, {2, 1, 2}));
      });
  row(
      "tile", [=] { return one(x.tile({2})); }, [=] { return one(tile(x, {2})); });
  row(
      "repeat_interleave",
      [=] {
        return Results{x.repeat_interleave(2, 1), x.repeat_interleave(3)};
      },
      [=] {
        return Results{repeat_interleave(x, 2, 1), repeat_interleave(x, 3)};
      });
  row(
      "movedim",
      [=] {
        return one(b3.movedim({0, 1}, {2, 0}));
      },
      [=] {
        return one(movedim(b3, {0, 1}, {2, 0}));
      });
  row(
      "swapaxes", [=] { return one(b3.swapaxes(0, 2)); }, [=] { return one(swapaxes(b3, 0, 2)); });
  row(
      "swapdims", [=] { return one(b3.swapdims(1, -1)); },
      [=] { return one(swapdims(b3, 1, -1)); });
  row(
      "unflatten",
      [=] {
        return one(x.unflatten(1, {2, 2}));
      },
      [=] {
        return one(unflatten(x, 1, {2, 2}));
      });
  row(
      "unbind", [=] { return x.unbind(1); }, [=] { return unbind(x, 1); });
  row(
      "broadcast_to",
      [=] {
        return one(x.broadcast_to({2, 3, 4}));
      },
      [=] {
        return one(broadcast_to(x, {2, 3, 4}));
      });
  row(
      "outer", [=] { return one(x.select(0, 0).outer(y.select(1, 1))); },
      [=] { return one(outer(x.select(0, 0), y.select(1, 1))); });
  row(
      "bmm", [=] { return one(b3.bmm(c3)); }, [=] { return one(bmm(b3, c3)); });
  row(
      "baddbmm",
      [=] { return one(x.select(1, 0).unsqueeze(1).baddbmm(b3.slice(1, 0, 3), c3, 2, 3)); },
      [=] { return one(baddbmm(x.select(1, 0).unsqueeze(1), b3.slice(1, 0, 3), c3, 2, 3)); });
  row(
      "diag",
      [=] {
        return Results{x.diag(1), x.select(0, 1).diag(-1)};
      },
      [=] {
        return Results{diag(x, 1), diag(x.select(0, 1), -1)};
      });
  row(
      "diag_embed", [=] { return one(x.diag_embed(1, 0, 2)); },
      [=] { return one(diag_embed(x, 1, 0, 2)); });
  row(
      "trace", [=] { return one(x.trace()); }, [=] { return one(trace(x)); });
  row(
      "diff",
      [=] {
        return Results{x.diff(), x.diff(2, 0)};
      },
      [=] {
        return Results{diff(x), diff(x, 2, 0)};
      });
  row(
      "norm",
      [=] {
        return Results{x.norm(), x.norm(1, {1}, true)};
      },
      [=] {
        return Results{norm(x), norm(x, 1, {1}, true)};
      });
  row(
      "sum",
      [=] {
        return Results{x.sum(), x.sum(1, true)};
      },
      [=] {
        return Results{sum(x), sum(x, 1, true)};
      });
  row(
      "mean",
      [=] {
        return Results{x.mean(), x.mean({0})};
      },
      [=] {
        return Results{mean(x), mean(x, {0})};
      });
  row(
      "max",
      [=] {
        return Results{x.max(), x.max(1)};
      },
      [=] {
        return Results{max(x), max(x, 1)};
      });
  row(
      "min",
      [=] {
        return Results{x.min(), x.min(0, true)};
      },
      [=] {
        return Results{min(x), min(x, 0, true)};
      });
  row(
      "matmul", [=] { return one(x.matmul(m)); }, [=] { return one(matmul(x, m)); });
  row(
      "reshape",
      [=] {
        return one(x.reshape({2, -1}));
      },
      [=] {
        return one(reshape(x, {2, -1}));
      });
  row(
      "view",
      [=] {
        return one(x.view({4, 3}));
      },
      [=] {
        return one(view(x, {4, 3}));
      });
  row(
      "flatten", [=] { return one(x.flatten()); }, [=] { return one(flatten(x)); });
  row(
      "transpose", [=] { return one(x.transpose(0, 1)); }, [=] { return one(transpose(x, 0, 1)); });
  row(
      "t", [=] { return one(x.t()); }, [=] { return one(t(x)); });
  row(
      "permute",
      [=] {
        return one(x.permute({1, 0}));
      },
      [=] {
        return one(permute(x, {1, 0}));
      });
  row(
      "squeeze",
      [=] {
        return Results{x.reshape({3, 1, 4}).squeeze(1), x.squeeze()};
      },
      [=] {
        return Results{squeeze(reshape(x, {3, 1, 4}), 1), squeeze(x)};
      });
  row(
      "unsqueeze", [=] { return one(x.unsqueeze(-1)); }, [=] { return one(unsqueeze(x, -1)); });
  row(
      "expand",
      [=] {
        return one(x.unsqueeze(0).expand({2, -1, -1}));
      },
      [=] {
        return one(expand(unsqueeze(x, 0), {2, -1, -1}));
      });
  row(
      "expand_as", [=] { return one(x.sum(0).expand_as(x)); },
      [=] { return one(expand_as(sum(x, 0), x)); });
  row(
      "slice", [=] { return one(x.slice(1, 1, 4, 2)); }, [=] { return one(slice(x, 1, 1, 4, 2)); });
  row(
      "narrow", [=] { return one(x.narrow(1, -3, 2)); }, [=] { return one(narrow(x, 1, -3, 2)); });
  row(
      "select",
      [=] {
        return Results{x.select(1, -2), x[1]};
      },
      [=] {
        return Results{select(x, 1, -2), select(x, 0, 1)};
      });
  row(
      "slice_scatter", [=] { return one(x.slice_scatter(y.slice(0, 0, 1), 0, 2, 3)); },
      [=] { return one(slice_scatter(x, slice(y, 0, 0, 1), 0, 2, 3)); });
  row(
      "gather", [=] { return one(x.gather(1, idx)); }, [=] { return one(gather(x, 1, idx)); });
  row(
      "scatter_add", [=] { return one(x.scatter_add(1, idx, y.slice(1, 0, 2))); },
      [=] { return one(scatter_add(x, 1, idx, slice(y, 1, 0, 2))); });
  row(
      "index_select", [=] { return one(x.index_select(0, sel)); },
      [=] { return one(index_select(x, 0, sel)); });
  row(
      "argmax", [=] { return one(x.argmax(1)); }, [=] { return one(argmax(x, 1)); });
  row(
      "argmin", [=] { return one(x.argmin(0, true)); }, [=] { return one(argmin(x, 0, true)); });
  row(
      "softmax", [=] { return one(x.softmax(-1)); }, [=] { return one(softmax(x, -1)); });
  row(
      "log_softmax", [=] { return one(x.log_softmax(0)); }, [=] { return one(log_softmax(x, 0)); });
  row(
      "logsumexp", [=] { return one(x.logsumexp(1)); }, [=] { return one(logsumexp(x, 1)); });
  row(
      "masked_fill",
      [=] {
        return Results{x.masked_fill(mask, 2.0), x.masked_fill(mask, scalar(-1.0, f64()))};
      },
      [=] {
        return Results{masked_fill(x, mask, 2.0), masked_fill(x, mask, scalar(-1.0, f64()))};
      });
  row(
      "tril", [=] { return one(x.tril(1)); }, [=] { return one(tril(x, 1)); });
  row(
      "triu", [=] { return one(x.triu(-1)); }, [=] { return one(triu(x, -1)); });
  row(
      "split", [=] { return x.split(3, 1); }, [=] { return split(x, 3, 1); });
  row(
      "chunk", [=] { return x.chunk(2); }, [=] { return chunk(x, 2); });
  row(
      "flip",
      [=] {
        return one(x.flip({0, 1}));
      },
      [=] {
        return one(flip(x, {0, 1}));
      });
  row(
      "roll", [=] { return one(x.roll(1, 1)); }, [=] { return one(roll(x, 1, 1)); });
  row(
      "cumsum", [=] { return one(x.cumsum(1)); }, [=] { return one(cumsum(x, 1)); });
  row(
      "var", [=] { return one(x.var(1, 0, true)); }, [=] { return one(var(x, 1, 0, true)); });
  row(
      "std", [=] { return one(x.std()); }, [=] { return one(duet::std(x)); });
  row(
      "amax", [=] { return one(x.amax(0)); }, [=] { return one(amax(x, 0)); });
  row(
      "amin", [=] { return one(x.amin()); }, [=] { return one(amin(x)); });
  row(
      "argsort", [=] { return one(x.argsort(1, true)); }, [=] { return one(argsort(x, 1, true)); });
  row(
      "sort", [=] { return both(x.sort(0)); }, [=] { return both(sort(x, 0)); });
  row(
      "topk", [=] { return both(x.topk(2)); }, [=] { return both(topk(x, 2)); });
  row(
      "multinomial",
      [=] {
        manual_seed(3);
        return one(probs.multinomial(3));
      },
      [=] {
        manual_seed(3);
        return one(multinomial(probs, 3));
      });
  return rows;
}

}  // namespace

TEST_CASE("Tensor methods: each gives what its free function gives, for every method row") {
  std::set<std::string> covered;
  for (const MethodRow& r : method_rows()) {
    INFO("method " << r.name);
    covered.insert(r.name);
    const Results got = r.method(), want = r.free();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].sizes() == want[i].sizes());
      CHECK(got[i].dtype() == want[i].dtype());
      CHECK(bitwise_equal(got[i], want[i]));
    }
  }
  // A new kind-Method row (or elementwise row) needs a row here.
  for (const std::string& name : method_names()) {
    INFO("the method " << name << " has no row in method_rows()");
    CHECK(covered.count(name) == 1);
  }
}

TEST_CASE("Tensor methods: y.sum().backward(), eagerly and compiled, and chains of methods") {
  Tensor w = make({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64).requires_grad_();
  Tensor y = w.mul(w).sum(1).exp().log();
  y.sum().backward();
  check_tensor(w.grad(), {2, 3}, DType::f64, {2, 4, 6, 8, 10, 12}, 1e-12);
  w.set_grad({});
  auto step = compile([&](const Tensor& x) {
    Tensor loss = x.matmul(w.t()).relu().pow(2).mean();
    loss.backward();
    return loss;
  });
  Tensor x = make({1, -1, 2, 0.5, 3, -2}, {2, 3}, DType::f64);
  Tensor eager_loss = mean(pow(relu(matmul(x, transpose(w, 0, 1))), 2));
  Tensor got = step(x);
  CHECK(close(got, eager_loss, 1e-12));
  Tensor g_compiled = w.grad().clone();
  w.set_grad({});
  eager_loss.backward();
  CHECK(close(g_compiled, w.grad(), 1e-12));
}

TEST_CASE("Tensor methods: an rvalue's elementwise method reuses its buffer") {
  Tensor x = randn({64});
  Tensor tmp = x.mul(2);
  const void* buffer = tmp.raw_data();
  Tensor r = std::move(tmp).exp();
  CHECK(r.raw_data() == buffer);
  CHECK(bitwise_equal(r, exp(x * 2)));
  // An lvalue is left as it is.
  Tensor kept = x.mul(2);
  Tensor r2 = kept.exp();
  CHECK(r2.raw_data() != kept.raw_data());
}

TEST_CASE("Tensor methods: an error names the op and the caller's line") {
  const int line = std::source_location::current().line() + 1;
  const std::string msg = error_of<ShapeError>([] { zeros({2, 3}).reshape({4}); });
  CHECK_MESSAGE(starts_with(msg, "[reshape]"), msg);
  CHECK_MESSAGE(contains(msg, "test_tensor_methods.cpp:" + std::to_string(line)), msg);
}

TEST_CASE("view: a view or a ValueError, never a silent copy") {
  Tensor x = arange(12, f64()).reshape({3, 4});
  Tensor v = x.view({2, 6});
  CHECK(same_storage(v, x));
  v.mul_(2);  // writes through the view reach x
  CHECK(values(x)[5] == 10);
  CHECK(x.view({-1}).sizes() == Shape{12});
  // A transposed x has no 1-D view: reshape copies, view refuses.
  Tensor xt = x.t();
  CHECK(!same_storage(xt.reshape({12}), x));
  const std::string msg = error_of<ValueError>([&] { xt.view({12}); });
  CHECK_MESSAGE(starts_with(msg, "[view]"), msg);
  CHECK_MESSAGE(contains(msg, "reshape"), msg);
  // Splitting a dim of a transposed tensor is a view.
  CHECK(same_storage(xt.view({2, 2, 3}), x));
  // The same under compile: the traced tensors carry the strides of the call.
  auto f = compile([](const Tensor& a) { return a.t().view({12}); });
  CHECK(starts_with(error_of<ValueError>([&] { f(x); }), "[view]"));
  auto g = compile([](const Tensor& a) { return a.view({6, 2}).sum(1); });
  CHECK(close(g(x), sum(reshape(x, {6, 2}), 1), 1e-12));
}

TEST_CASE("flatten, t and expand_as: torch's shapes, errors, symbolic dims under compile") {
  Tensor x = zeros({2, 3, 4, 5});
  CHECK(x.flatten().sizes() == Shape{120});
  CHECK(x.flatten(1).sizes() == Shape{2, 60});
  CHECK(x.flatten(1, 2).sizes() == Shape{2, 12, 5});
  CHECK(x.flatten(-2).sizes() == Shape{2, 3, 20});
  CHECK(scalar(1.0).flatten().sizes() == Shape{1});
  CHECK(starts_with(error_of<ValueError>([&] { x.flatten(2, 1); }), "[flatten]"));
  CHECK(starts_with(error_of<ValueError>([&] { x.flatten(0, 4); }), "[flatten]"));
  CHECK(zeros({3}).t().sizes() == Shape{3});
  CHECK(scalar(2.0).t().sizes() == Shape{});
  CHECK(zeros({2, 3}).t().sizes() == Shape{3, 2});
  CHECK(starts_with(error_of<ValueError>([&] { x.t(); }), "[t]"));
  CHECK(zeros({1, 5}).expand_as(zeros({4, 5})).sizes() == Shape{4, 5});
  CHECK(starts_with(error_of<ShapeError>([&] {
                      zeros({2, 5}).expand_as(zeros({4, 5}));
                    }),
                    "[expand]"));
  // A symbolic batch stays symbolic through flatten and expand_as: one trace for every batch.
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile(
      [](const Tensor& a) {
        Tensor flat = a.flatten(1);
        return flat + flat.mean(1, true).expand_as(flat);
      },
      o);
  for (int64_t n : {2, 3, 5}) {
    Tensor a = randn({n, 3, 2}, f64());
    Tensor flat = reshape(a, {n, 6});
    CHECK(close(f(a), flat + expand(mean(flat, 1, true), {n, 6}), 1e-12));
  }
  CHECK(f.stats().traces == 1);
}

TEST_CASE("select and x[i]: views without the dim, negative indices, typed errors, compiled") {
  Tensor x = arange(24, f64()).reshape({2, 3, 4});
  CHECK(x[1].sizes() == Shape{3, 4});
  CHECK(x.select(2, -1).sizes() == Shape{2, 3});
  CHECK(values(x.select(2, -1)) == std::vector<double>{3, 7, 11, 15, 19, 23});
  CHECK(values(x[-1][0]) == std::vector<double>{12, 13, 14, 15});
  CHECK(x[0][2][3].dim() == 0);
  CHECK(x[0][2][3].item<double>() == 11);
  // A view: a write through it reaches x.
  Tensor row = x[1][0];
  CHECK(same_storage(row, x));
  row.mul_(0);
  CHECK(values(x)[12] == 0);
  CHECK(values(x)[11] == 11);
  for (int64_t bad : {3, -4}) {
    const std::string msg = error_of<ValueError>([&] { x.select(1, bad); });
    CHECK_MESSAGE(starts_with(msg, "[select]"), msg);
    CHECK_MESSAGE(contains(msg, "(2, 3, 4)"), msg);
  }
  CHECK(starts_with(error_of<ValueError>([&] { x[2]; }), "[select]"));
  CHECK(starts_with(error_of<ValueError>([&] { scalar(1.0)[0]; }), "[select]"));
  CHECK(starts_with(error_of<ValueError>([&] { x.select(3, 0); }), "[select]"));
  // Gradients flow back into the selected elements only.
  Tensor w = randn({3, 4}, f64()).requires_grad_();
  (w[1] * 2).sum().backward();
  std::vector<double> g = values(w.grad());
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == (i / 4 == 1 ? 2.0 : 0.0));
  // Compiled, with a symbolic first dim: -1 picks the last row of every size, one trace.
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([](const Tensor& a) { return a[-1] * 2 + a.select(1, 0).sum(); }, o);
  for (int64_t n : {2, 3, 5}) {
    Tensor a = randn({n, 4}, f64());
    CHECK(close(f(a), select(a, 0, n - 1) * 2 + sum(select(a, 1, 0)), 1e-12));
  }
  CHECK(f.stats().traces == 1);
  // Out of range under compile is the same error.
  auto g1 = compile([](const Tensor& a) { return a.select(0, 7); });
  CHECK(starts_with(error_of<ValueError>([&] { g1(zeros({3, 2})); }), "[select]"));
}

}  // namespace duet::test
