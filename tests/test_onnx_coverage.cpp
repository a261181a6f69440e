// ONNX export of every op: each row of the op table (tests/op_rows.h) is compiled, exported with
// export_onnx (which runs the ONNX checker with full checking and strict shape inference) and
// so counts its primitive as exported; or its primitive is on kNoOnnxForm below, with the reason,
// and then the export must refuse it with a ValueError naming the op. A primitive that is neither
// exported by some row nor on the list fails the test, so a new op cannot reach a release
// without an ONNX form or a stated reason for having none.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "op_rows.h"
#include "trace/onnx/onnx.h"

namespace duet::test {
namespace {

using Ins = std::vector<Tensor>;

// The primitives with no ONNX form, and why.
const std::map<OpId, const char*>& no_onnx_form() {
  static const std::map<OpId, const char*> m = {
      {OpId::Random, "a draw from Philox state that a model file cannot hold"},
      {OpId::Argsort, "stable, NaN-last order: ONNX's TopK leaves the order of ties open"},
      {OpId::Transfer, "a move between devices; a model has one device"},
      {OpId::Print, "an effect (printing) that ONNX has no op for"},
      {OpId::AllReduce, "a collective of a multi-process job"},
      {OpId::Broadcast, "a collective of a multi-process job"},
      {OpId::AllGather, "a collective of a multi-process job"},
      {OpId::ReduceScatter, "a collective of a multi-process job"},
      {OpId::CollectiveWait, "a collective of a multi-process job"},
      {OpId::Conv2dWeightGrad, "conv2d's gradient: training graphs, which inference models omit"},
      {OpId::AttentionBackward,
       "attention's gradient: training graphs, which inference models omit"},
      {OpId::LstmCellBackward,
       "lstm_cell's gradient: training graphs, which inference models omit"},
      {OpId::LstmStepBackward,
       "lstm_step's gradient: training graphs, which inference models omit"},
      {OpId::GruCellBackward, "gru_cell's gradient: training graphs, which inference models omit"},
  };
  return m;
}

std::string model_path() {
  return fmt::format("/tmp/duet_onnx_cover_{}.onnx", static_cast<long>(::getpid()));
}

Tensor random_input(const Shape& shape, DType dtype, const Domain& d, Rng& rng) {
  return make(random_values(shape.numel(), d, dtype, rng), shape, dtype);
}

// What exporting one row did.
struct Outcome {
  bool exported = false;
  std::string error;  // the ValueError's message, when it refused
};

template <class F>
Outcome export_call(F&& fn, const Ins& inputs) {
  auto f = compile([&](const Ins& x) { return fn(x); });
  Outcome r;
  try {
    export_onnx(f, model_path(), OnnxExportOptions{}, inputs);
    r.exported = true;
  } catch (const ValueError& e) {
    r.error = e.what();
  }
  std::remove(model_path().c_str());
  return r;
}

// Every row as (name, primitive, inputs, call).
struct Case {
  std::string name;
  OpId op;
  Ins inputs;
  std::function<Tensor(const Ins&)> fn;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  Rng rng(7);
  const Shape s23{2, 3};
  for (const auto* rows : {&elementwise_rows(), &special_function_rows()})
    for (const ElementwiseRow& row : *rows) {
      const DType d = row.dtypes.front();
      Ins in;
      for (int i = 0; i < row.arity; ++i)
        in.push_back(random_input(s23, row.cond_first && i == 0 ? DType::b8 : d,
                                  row.domains[static_cast<size_t>(i)], rng));
      cases.push_back({row.name, row.op, in, row.fn});
    }
  for (const ConversionRow& row : conversion_rows())
    cases.push_back({row.name,
                     row.op,
                     {random_input(s23, DType::f32, Domain{}, rng)},
                     [fn = row.fn](const Ins& x) { return fn(x[0], DType::f64); }});
  for (const ReduceRow& row : reduce_rows())
    cases.push_back({row.name,
                     row.op,
                     {random_input(s23, row.dtypes.front(), Domain{}, rng)},
                     [fn = row.fn](const Ins& x) { return fn(x[0], Dims{1}, false); }});
  for (const ViewRow& row : view_rows())
    cases.push_back({row.name,
                     row.op,
                     {random_input(row.in, DType::f32, Domain{}, rng)},
                     [fn = row.fn](const Ins& x) { return fn(x[0]); }});
  for (const ScatterRow& row : scatter_rows())
    cases.push_back({row.name,
                     OpId::SliceScatter,
                     {random_input(row.base, DType::f32, Domain{}, rng),
                      random_input(row.src, DType::f32, Domain{}, rng)},
                     [row](const Ins& x) {
                       return slice_scatter(x[0], x[1], row.dim, row.start, row.end, row.step);
                     }});
  for (const SourceRow& row : source_rows())
    cases.push_back({row.name, row.op, {}, [fn = row.fn](const Ins&) { return fn(); }});
  for (const MatmulRow& row : matmul_rows())
    cases.push_back({row.name,
                     OpId::MatMul,
                     {random_input(row.a, DType::f32, Domain{}, rng),
                      random_input(row.b, DType::f32, Domain{}, rng)},
                     [](const Ins& x) { return matmul(x[0], x[1]); }});
  for (const OpRow& row : op_rows()) {
    Ins in;
    for (size_t i = 0; i < row.shapes.size(); ++i)
      in.push_back(random_input(row.shapes[i], row.dtypes.front(),
                                row.domains[std::min(i, row.domains.size() - 1)], rng));
    cases.push_back({row.name, row.op, in, row.fn});
  }
  return cases;
}

TEST_CASE(
    "export_onnx: every primitive exports through some row of the op table, or is listed "
    "with the reason it has no ONNX form") {
  std::set<OpId> exported;
  std::vector<std::string> unlisted_refusals;
  for (const Case& c : all_cases()) {
    CAPTURE(c.name);
    const Outcome o = export_call(c.fn, c.inputs);
    if (o.exported) {
      exported.insert(c.op);
      continue;
    }
    // A refusal must name an op on the list (a composite's row may hold a draw, as dropout).
    bool listed = false;
    for (const auto& [op, why] : no_onnx_form())
      listed |= contains(o.error, fmt::format("op {} ", op_name(op)));
    if (!listed) unlisted_refusals.push_back(fmt::format("{}: {}", c.name, o.error));
  }
  CHECK_MESSAGE(unlisted_refusals.empty(),
                fmt::format("rows whose export failed for an op not on the no-ONNX-form list:\n{}",
                            fmt::join(unlisted_refusals, "\n")));
  std::vector<std::string> missing, wrongly_listed;
  for (int i = 0; i < kNumOps; ++i) {
    const auto op = static_cast<OpId>(i);
    const bool listed = no_onnx_form().count(op) > 0;
    if (!listed && !exported.count(op)) missing.push_back(std::string(op_name(op)));
    if (listed && exported.count(op)) wrongly_listed.push_back(std::string(op_name(op)));
  }
  CHECK_MESSAGE(missing.empty(),
                fmt::format("primitives that no row exported and that have no stated reason: {}",
                            fmt::join(missing, ", ")));
  CHECK_MESSAGE(wrongly_listed.empty(),
                fmt::format("primitives on the no-ONNX-form list that exported: {}",
                            fmt::join(wrongly_listed, ", ")));
}

TEST_CASE("export_onnx: each op on the no-ONNX-form list is refused with a ValueError naming it") {
  // One call per listed op that a user can write directly.
  const Tensor x = make({3, 1, 2}, {3});
  const std::vector<std::pair<OpId, std::function<Tensor(const Ins&)>>> calls = {
      {OpId::Random, [](const Ins& in) { return in[0] + rand({3}); }},
      {OpId::Argsort, [](const Ins& in) { return argsort(in[0]).to(DType::f32); }},
      {OpId::Print,
       [](const Ins& in) {
         print(in[0]);
         return in[0] * 2;
       }},
  };
  for (const auto& [op, fn] : calls) {
    CAPTURE(op_name(op));
    const Outcome o = export_call(fn, {x});
    CHECK_FALSE(o.exported);
    CHECK(contains(o.error, fmt::format("op {} ", op_name(op))));
    CHECK(contains(o.error, "has no ONNX form"));
  }
}

}  // namespace
}  // namespace duet::test
