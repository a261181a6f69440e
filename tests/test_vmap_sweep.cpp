// func::vmap over the op table's rows (op_rows.h): the OpRows (index, nn, image and the others)
// and the typed rows (elementwise, conversion, reduce, view, slice_scatter, matmul), each
// vmapped over a batch against the row run per sample. Every operand batched at dim 0, then at
// its last dim (a batching rule must move or read the batch where it is), then each operand in
// turn shared by every sample (unbatched), and with three or more operands each alone batched.
#include <doctest/doctest.h>

#include <functional>
#include <optional>

#include "layouts.h"
#include "op_rows.h"

namespace duet::test {
namespace {

constexpr int64_t kBatch = 3;

using Inputs = std::vector<Tensor>;
using InDims = std::vector<std::optional<int64_t>>;
using func::detail::vmap_call;

// f on each of kBatch samples (from draw()), stacked, against vmap(f) with operand i batched at
// dims[i] (the samples stacked there) or, where dims[i] is nullopt, sample 0's operand shared by
// every sample.
void check_vmap(const std::function<Tensor(const Inputs&)>& f, const std::function<Inputs()>& draw,
                const InDims& dims, double tol) {
  std::vector<Inputs> s;
  for (int64_t k = 0; k < kBatch; ++k) {
    s.push_back(draw());
    for (size_t i = 0; i < dims.size(); ++i)
      if (!dims[i]) s.back()[i] = s[0][i];
  }
  Inputs batched;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!dims[i]) {
      batched.push_back(s[0][i]);
      continue;
    }
    Inputs per;
    for (const Inputs& x : s) per.push_back(x[i]);
    batched.push_back(stack(per, *dims[i]));
  }
  Inputs want;
  for (const Inputs& x : s) want.push_back(f(x));
  const Inputs got = vmap_call([&](Inputs in) { return Inputs{f(in)}; }, batched, dims, 0,
                               func::Randomness::Error, "vmap sweep");
  REQUIRE(got.size() == 1);
  const Tensor w = stack(want, 0);
  REQUIRE(got[0].sizes() == w.sizes());
  REQUIRE(got[0].dtype() == w.dtype());
  const std::string m = differences(values(got[0]), values(w), tol, tol);
  CHECK_MESSAGE(m.empty(), m);
}

// Every operand at dim 0; every operand at its last dim (after its own dims); each operand
// shared in turn; with three or more, each operand alone batched.
std::vector<std::pair<std::string, InDims>> batchings(const Inputs& sample) {
  const size_t n = sample.size();
  std::vector<std::pair<std::string, InDims>> out;
  out.push_back({"batched at dim 0", InDims(n, 0)});
  InDims last;
  for (const Tensor& x : sample) last.push_back(x.dim());
  out.push_back({"batched at the last dim", last});
  for (size_t i = 0; n > 1 && i < n; ++i) {
    InDims d(n, 0);
    d[i] = std::nullopt;
    out.push_back({"operand " + std::to_string(i) + " shared", d});
  }
  // With three or more operands, each alone batched (a layer's input, its weights shared).
  for (size_t i = 0; n > 2 && i < n; ++i) {
    InDims d(n, std::nullopt);
    d[i] = 0;
    out.push_back({"only operand " + std::to_string(i) + " batched", d});
  }
  return out;
}

// Runs check_vmap for each batching of draw()'s operands.
void sweep(const std::string& what, const std::function<Tensor(const Inputs&)>& f,
           const std::function<Inputs()>& draw, double tol) {
  for (const auto& [how, dims] : batchings(draw())) {
    INFO(what << ", " << how);
    check_vmap(f, draw, dims, tol);
  }
}

}  // namespace

TEST_CASE("vmap: every op row on a batch equals the row run per sample") {
  Rng rng(501);
  int rows = 0, random = 0;
  for (const OpRow& row : op_rows()) {
    if (row.shapes.empty()) continue;  // random draws: see the randomness case (test_func.cpp)
    const DType dt = row.dtypes[0];
    try {
      sweep(
          row.name + " on " + std::string(dtype_name(dt)),
          [&](const Inputs& in) { return row.fn(in); },
          [&] {
            Inputs in;
            for (size_t i = 0; i < row.shapes.size(); ++i) {
              const Domain& d = row.domains[std::min(i, row.domains.size() - 1)];
              in.push_back(
                  make(random_values(row.shapes[i].numel(), d, dt, rng), row.shapes[i], dt));
            }
            return in;
          },
          row.index_result || !is_floating(dt) ? 0 : row.tol32);
    } catch (const ValueError& e) {
      // Rows that draw (dropout): Randomness::Error refuses them (see the randomness case).
      CHECK_MESSAGE(std::string(e.what()).find("a random op") != std::string::npos, e.what());
      ++random;
    }
    ++rows;
  }
  CHECK(rows > 100);
  CHECK(random < 5);
}

TEST_CASE("vmap: every elementwise row on a batch equals the row run per sample") {
  Rng rng(511);
  int rows = 0;
  std::vector<ElementwiseRow> all = elementwise_rows();
  all.insert(all.end(), special_function_rows().begin(), special_function_rows().end());
  for (const ElementwiseRow& row : all) {
    for (const char* name : {"normal", "0-d", "broadcast () (3,4) (1,4)", "empty"}) {
      const Sample& s = sample(name);
      if (row.arity < s.min_arity) continue;
      for (DType dt : row.dtypes) {
        const double tol = is_floating(dt) ? std::max(row.rtol32, row.atol32) : 0;
        sweep(
            std::string(row.name) + " on " + std::string(dtype_name(dt)) + ", sample " + name,
            [&](const Inputs& in) { return row.fn(in); },
            [&] { return build(row, {dt}, s, rng).in; }, tol);
      }
    }
    ++rows;
  }
  CHECK(rows > 40);
}

TEST_CASE("vmap: every conversion row on a batch equals the row run per sample") {
  Rng rng(512);
  for (const ConversionRow& row : conversion_rows()) {
    for (DType from : {DType::f32, DType::i64, DType::b8, DType::bf16}) {
      for (DType to : {DType::f64, DType::i32, DType::f16}) {
        if (row.keeps_dtype && to != from) continue;
        for (const Shape& shape : {Shape{}, Shape{2, 3}}) {
          sweep(
              std::string(row.name) + " " + std::string(dtype_name(from)) + " -> " +
                  std::string(dtype_name(to)),
              [&](const Inputs& in) { return row.fn(in[0], to); },
              [&] {
                return Inputs{
                    make(random_values(shape.numel(), Domain{-50, 50, -50, 50}, from, rng), shape,
                         from)};
              },
              0);
        }
      }
      if (row.keeps_dtype) break;
    }
  }
}

TEST_CASE("vmap: every reduce row on a batch equals the row run per sample") {
  Rng rng(513);
  const std::vector<std::pair<Shape, std::vector<Dims>>> cases = {
      {Shape{}, {{}, {0}}},
      {Shape{2, 3, 4}, {{}, {0}, {1}, {-1}, {0, 2}, {2, 0}, {0, 1, 2}}},
      {Shape{2, 0, 3}, {{1}, {2}}},
  };
  for (const ReduceRow& row : reduce_rows()) {
    for (const auto& [shape, dim_sets] : cases) {
      for (const Dims& dims : dim_sets) {
        std::string over;
        for (int64_t d : dims) over += (over.empty() ? "" : ",") + std::to_string(d);
        for (bool keepdim : {false, true}) {
          for (DType dt : row.dtypes) {
            // max and min of nothing are errors: the empty case reduces its nonempty dims only
            const bool extremum = row.kind == ReduceKind::Max || row.kind == ReduceKind::Min;
            if (extremum && shape.numel() == 0 && dims.size() && dims[0] == 1) continue;
            sweep(
                std::string(row.name) + " over (" + over + ") of " + fmt::format("{}", shape) +
                    (keepdim ? ", keepdim" : "") + " on " + std::string(dtype_name(dt)),
                [&](const Inputs& in) { return row.fn(in[0], dims, keepdim); },
                [&] {
                  return Inputs{
                      make(random_values(shape.numel(), Domain{-9, 9}, dt, rng), shape, dt)};
                },
                is_floating(dt) ? 1e-5 : 0);
          }
        }
      }
    }
  }
}

TEST_CASE("vmap: every view row on a batch equals the row run per sample") {
  Rng rng(514);
  for (const ViewRow& row : view_rows()) {
    for (DType dt : {DType::f32, DType::i64}) {
      sweep(
          std::string(row.name) + " on " + std::string(dtype_name(dt)),
          [&](const Inputs& in) { return row.fn(in[0]); },
          [&] {
            return Inputs{make(random_values(row.in.numel(), Domain{-9, 9}, dt, rng), row.in, dt)};
          },
          0);
    }
  }
}

TEST_CASE("vmap: every slice_scatter row on a batch equals the row run per sample") {
  Rng rng(515);
  for (const ScatterRow& row : scatter_rows()) {
    sweep(
        std::string(row.name),
        [&](const Inputs& in) {
          return slice_scatter(in[0], in[1], row.dim, row.start, row.end, row.step);
        },
        [&] {
          return Inputs{
              make(random_values(row.base.numel(), Domain{-9, 9}, DType::f32, rng), row.base),
              make(random_values(row.src.numel(), Domain{-9, 9}, DType::f32, rng), row.src)};
        },
        0);
  }
}

TEST_CASE("vmap: every matmul row on a batch equals the row run per sample") {
  // Vectors, matrices and batches on either side (Note [Vector operands] in
  // core/ops/linalg.cpp).
  Rng rng(503);
  int rows = 0;
  for (const MatmulRow& row : matmul_rows()) {
    if (row.a.numel() > 4096 || row.b.numel() > 4096) continue;
    for (DType dt : {DType::f32, DType::i64}) {
      sweep(
          std::string(row.name) + " on " + std::string(dtype_name(dt)),
          [](const Inputs& in) { return matmul(in[0], in[1]); },
          [&] {
            return Inputs{
                make(random_values(row.a.numel(), Domain{-1, 1, -3, 3}, dt, rng), row.a, dt),
                make(random_values(row.b.numel(), Domain{-1, 1, -3, 3}, dt, rng), row.b, dt)};
          },
          is_floating(dt) ? 1e-5 : 0);
    }
    ++rows;
  }
  CHECK(rows > 20);
}

}  // namespace duet::test
