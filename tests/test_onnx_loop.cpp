// import_onnx of Loop: eagerly it unrolls; compiled it becomes scan or while_loop, so that a
// graph's size does not grow with the trip count (Note [Imported control flow] in
// trace/onnx/onnx_import_control.cpp). Each case runs both faces against a loop written on plain
// doubles; the errors are those of malformed Loops.
#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "duet.h"
#include "trace/onnx/onnx_proto.h"
#include "util.h"

using namespace duet;

namespace {

std::string model_file(const std::string& name) {
  return (std::filesystem::path(DUET_SOURCE_DIR) / "tests" / "data" / "onnx-loop" / name).string();
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path(fmt::format("/tmp/duet_test_onnx_loop_{}_{}", static_cast<long>(::getpid()), name)) {}
  ~TempFile() { std::remove(path.c_str()); }
};

void add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* to,
               const std::string& name, int32_t elem, std::optional<std::vector<int64_t>> dims) {
  onnx::ValueInfoProto* v = to->Add();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  if (dims) {
    t->mutable_shape();
    for (int64_t d : *dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  }
}

onnx::NodeProto* add_node(onnx::GraphProto& g, const std::string& op,
                          const std::vector<std::string>& in, const std::vector<std::string>& out) {
  onnx::NodeProto* n = g.add_node();
  n->set_op_type(op);
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
  return n;
}

void add_int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void add_initializer(onnx::GraphProto& g, const std::string& name, const Tensor& t) {
  onnx::TensorProto* p = g.add_initializer();
  detail::onnx_io::tensor_to_proto(t, *p);
  p->set_name(name);
}

void write_model(onnx::GraphProto g, const std::string& path) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  *m.mutable_graph() = std::move(g);
  std::ofstream f(path, std::ios::binary);
  REQUIRE(m.SerializeToOstream(&f));
}

Options f64() { return Options().dtype(DType::f64); }
Tensor i64_scalar(int64_t v) { return full(Shape{}, v, Options().dtype(DType::i64)); }
Tensor bool_scalar(bool v) { return full(Shape{}, v, Options().dtype(DType::b8)); }

// A Loop over v (f64, 3 values), from x. Each iteration: v = v * w + 1 (w an initializer, so a
// parameter) or v = v + 1; with `scan_output`, v + i is stacked per iteration; with
// `data_condition`, the loop goes on while sum(v) < limit, else the body passes its condition on.
struct LoopCase {
  std::optional<int64_t> trips;  // M as an initializer
  bool trips_input = false;      // M as the graph input "m" (i64 scalar)
  std::optional<bool> cond;      // the condition as an initializer
  bool data_condition = false;
  double limit = 100;
  bool scan_output = false;
  bool weight = false;
  Tensor w = tensor({1.5, 0.5, 1.0}, f64());

  void write(const std::string& path) const {
    onnx::GraphProto body;
    body.set_name("body");
    add_value(body.mutable_input(), "i", onnx::TensorProto::INT64, std::vector<int64_t>{});
    add_value(body.mutable_input(), "c_in", onnx::TensorProto::BOOL, std::vector<int64_t>{});
    add_value(body.mutable_input(), "v_in", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
    add_initializer(body, "one", full(Shape{}, 1.0, f64()));
    add_initializer(body, "limit", full(Shape{}, limit, f64()));
    if (weight) {
      add_node(body, "Mul", {"v_in", "w"}, {"vw"});
      add_node(body, "Add", {"vw", "one"}, {"v_out"});
    } else {
      add_node(body, "Add", {"v_in", "one"}, {"v_out"});
    }
    if (data_condition) {
      add_int_attr(add_node(body, "ReduceSum", {"v_out"}, {"s"}), "keepdims", 0);
      add_node(body, "Less", {"s", "limit"}, {"c_out"});
    } else {
      add_node(body, "Identity", {"c_in"}, {"c_out"});
    }
    add_value(body.mutable_output(), "c_out", onnx::TensorProto::BOOL, std::vector<int64_t>{});
    add_value(body.mutable_output(), "v_out", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
    if (scan_output) {
      add_int_attr(add_node(body, "Cast", {"i"}, {"fi"}), "to", onnx::TensorProto::DOUBLE);
      add_node(body, "Add", {"v_out", "fi"}, {"y_out"});
      add_value(body.mutable_output(), "y_out", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
    }

    onnx::GraphProto g;
    g.set_name("loop");
    add_value(g.mutable_input(), "x", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
    if (trips_input)
      add_value(g.mutable_input(), "m", onnx::TensorProto::INT64, std::vector<int64_t>{});
    if (trips) add_initializer(g, "M", i64_scalar(*trips));
    if (cond) add_initializer(g, "cond", bool_scalar(*cond));
    add_initializer(g, "w", w);
    std::vector<std::string> outs{"y"};
    if (scan_output) outs.push_back("ys");
    onnx::NodeProto* loop = add_node(g, "Loop",
                                     {trips_input ? "m"
                                      : trips     ? "M"
                                                  : "",
                                      cond ? "cond" : "", "x"},
                                     outs);
    loop->set_name("the_loop");
    onnx::AttributeProto* a = loop->add_attribute();
    a->set_name("body");
    a->set_type(onnx::AttributeProto::GRAPH);
    *a->mutable_g() = std::move(body);
    add_value(g.mutable_output(), "y", onnx::TensorProto::DOUBLE, std::nullopt);
    if (scan_output) add_value(g.mutable_output(), "ys", onnx::TensorProto::DOUBLE, std::nullopt);
    write_model(std::move(g), path);
  }

  // The loop on plain doubles: {y, ys (iterations x 3)}.
  std::pair<std::vector<double>, std::vector<double>> reference(std::vector<double> v,
                                                                int64_t m) const {
    const std::vector<double> wv = test::values(w);
    std::vector<double> ys;
    bool go = cond.value_or(true);
    for (int64_t i = 0; (!(trips || trips_input) || i < m) && go; ++i) {
      for (size_t k = 0; k < 3; ++k) v[k] = weight ? v[k] * wv[k] + 1 : v[k] + 1;
      if (scan_output)
        for (size_t k = 0; k < 3; ++k) ys.push_back(v[k] + static_cast<double>(i));
      if (cond && data_condition) go = v[0] + v[1] + v[2] < limit;
    }
    return {v, ys};
  }
};

bool same_values(const Tensor& got, const std::vector<double>& want) {
  std::vector<double> g = test::values(got);
  if (g.size() != want.size()) return false;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - want[i]) <= 1e-9 * (1 + std::abs(want[i])))) return false;
  return true;
}

// The kinds of control nodes in a graph (top level), and its node count.
int count_control(const Graph& g, ControlKind kind) {
  int c = 0;
  for (const GraphNode& n : g.nodes)
    if (n.kind == NodeKind::Control && n.control->kind == kind) ++c;
  return c;
}

// Runs the case eagerly and compiled on x (and m), checks both against the reference; returns
// the compiled program's graph size.
size_t check_case(Program& p, const LoopCase& c, const Tensor& x, int64_t m = 0) {
  std::vector<Tensor> in{x};
  if (c.trips_input) in.push_back(i64_scalar(m));
  auto [y, ys] = c.reference(test::values(x), c.trips ? *c.trips : m);
  for (bool compiled : {false, true}) {
    CAPTURE(compiled);
    std::vector<Tensor> out = compiled ? p(in) : p.eager(in);
    CHECK(same_values(out[0], y));
    if (c.scan_output) {
      CHECK(out[1].sizes() == Shape{static_cast<int64_t>(ys.size() / 3), 3});
      CHECK(same_values(out[1], ys));
    }
  }
  return p.graph().nodes.size();
}

}  // namespace

TEST_CASE("a compiled Loop is one scan: its graph does not grow with the trip count") {
  Tensor x = tensor({0.5, -1.0, 2.0}, f64());
  std::vector<size_t> sizes;
  for (int64_t trips : {10, 30000}) {
    CAPTURE(trips);
    LoopCase c;
    c.trips = trips;
    c.cond = true;
    TempFile f("trips.onnx");
    c.write(f.path);
    Program p = import_onnx(f.path);
    sizes.push_back(check_case(p, c, x));
    CHECK(count_control(p.graph(), ControlKind::Scan) == 1);
  }
  CHECK(sizes[0] == sizes[1]);
  CHECK(sizes[1] < 40);
}

TEST_CASE("the 30000-trip Loop model compiles to a graph of a few nodes") {
  // Loop(M = 30000, cond = true, X): v + 1 per iteration, X f32 (2, 3).
  Program p = import_onnx(model_file("loop_30000.onnx"));
  Tensor x = randn({2, 3});
  std::vector<double> want = test::values(x);
  for (double& v : want) v = static_cast<double>(static_cast<float>(v) + 30000.0f);
  std::vector<double> got = test::values(p({x})[0]);
  CHECK(got == test::values(p.eager({x})[0]));
  for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) < 0.02);
  CHECK(p.graph().nodes.size() < 40);
  CHECK(count_control(p.graph(), ControlKind::Scan) == 1);
}

TEST_CASE("a trip count fed as an input stays data: one while_loop serves every count") {
  LoopCase c;
  c.trips_input = true;
  c.cond = true;
  TempFile f("trips_input.onnx");
  c.write(f.path);
  Program p = import_onnx(f.path);
  Tensor x = tensor({1.0, 2.0, 3.0}, f64());
  check_case(p, c, x, 5);
  const std::string graph = p.graph().str();
  CHECK(count_control(p.graph(), ControlKind::WhileLoop) == 1);
  for (int64_t m : {300, 0, -2, 7}) {
    CAPTURE(m);
    check_case(p, c, x, m);
    CHECK(p.graph().str() == graph);  // not traced again
  }
}

TEST_CASE("a Loop's scan outputs stack per iteration, eagerly and compiled") {
  Tensor x = tensor({0.25, 1.0, -3.0}, f64());
  SUBCASE("a known trip count: one scan whatever the count") {
    std::vector<size_t> sizes;
    for (int64_t trips : {7, 700}) {
      LoopCase c;
      c.trips = trips;
      c.scan_output = true;
      TempFile f("scan_out.onnx");
      c.write(f.path);
      Program p = import_onnx(f.path);
      sizes.push_back(check_case(p, c, x));
      CHECK(count_control(p.graph(), ControlKind::Scan) == 1);
    }
    CHECK(sizes[0] == sizes[1]);
  }
  SUBCASE("a trip count fed as an input: read, and scanned") {
    LoopCase c;
    c.trips_input = true;
    c.scan_output = true;
    TempFile f("scan_out_input.onnx");
    c.write(f.path);
    Program p = import_onnx(f.path);
    for (int64_t m : {4, 9, 0}) {
      CAPTURE(m);
      check_case(p, c, x, m);
    }
  }
}

TEST_CASE("a Loop whose condition is data becomes a while_loop, eagerly and compiled alike") {
  LoopCase c;
  c.cond = true;
  c.data_condition = true;
  SUBCASE("no trip count") {}
  SUBCASE("a trip count that stops it first") { c.trips = 3; }
  SUBCASE("a trip count that does not") { c.trips = 1000; }
  SUBCASE("the trip count exporters write for none") { c.trips = INT64_MAX; }
  TempFile f("data_cond.onnx");
  c.write(f.path);
  Program p = import_onnx(f.path);
  check_case(p, c, tensor({1.0, 2.0, 3.0}, f64()));
  const std::string graph = p.graph().str();
  CHECK(count_control(p.graph(), ControlKind::WhileLoop) == 1);
  CHECK(p.graph().nodes.size() < 40);
  // Other data, other iteration counts (34 and 1 without a trip count), one graph.
  check_case(p, c, tensor({-2.0, 0.0, 2.0}, f64()));
  check_case(p, c, tensor({50.0, 60.0, 2.0}, f64()));
  CHECK(p.graph().str() == graph);
}

TEST_CASE("a data-dependent Loop with scan outputs counts its iterations, then scans them") {
  LoopCase c;
  c.cond = true;
  c.data_condition = true;
  c.scan_output = true;
  c.limit = 40;
  TempFile f("data_cond_scan.onnx");
  c.write(f.path);
  Program p = import_onnx(f.path);
  check_case(p, c, tensor({1.0, 2.0, 3.0}, f64()));
  // The count is a value guard (the while_loop runs in the guards' part, which graph() leaves
  // out): other data, another count, a new trace that the results show.
  CHECK(count_control(p.graph(), ControlKind::Scan) == 1);
  CHECK(p.graph().nodes.size() < 40);
  check_case(p, c, tensor({-5.0, 0.0, 2.0}, f64()));
}

TEST_CASE("duet's while_loop, exported as a Loop and imported back, compiles to a while_loop") {
  auto loop = [](const Tensor& x) {
    return while_loop(
        [](const std::vector<Tensor>& s) { return std::vector<Tensor>{sum(s[0]) < 100.0}; },
        [](const std::vector<Tensor>& s) { return std::vector<Tensor>{s[0] * 2.0 + 1.0}; }, {x})[0];
  };
  auto f = compile(loop);
  TempFile file("while.onnx");
  export_onnx(f, file.path, {}, rand({4}));
  Program back = import_onnx(file.path);
  std::string graph;
  for (const Tensor& x : {rand({4}), full({4}, 30.0), full({4}, -0.5)}) {
    const std::vector<double> want = test::values(loop(x));
    CHECK(same_values(back.eager({x})[0], want));
    CHECK(same_values(back({x})[0], want));
    CHECK(count_control(back.graph(), ControlKind::WhileLoop) == 1);
    if (graph.empty()) graph = back.graph().str();
    CHECK(back.graph().str() == graph);  // other iteration counts, not traced again
  }
}

TEST_CASE("a Loop whose body reads its iteration number unrolls, eagerly and compiled alike") {
  // v = v + table[i : i + 1] (a Slice whose bounds are data inside the body): neither scan nor
  // while_loop can read them, so the compiled loop unrolls.
  onnx::GraphProto body;
  body.set_name("body");
  add_value(body.mutable_input(), "i", onnx::TensorProto::INT64, std::vector<int64_t>{});
  add_value(body.mutable_input(), "c_in", onnx::TensorProto::BOOL, std::vector<int64_t>{});
  add_value(body.mutable_input(), "v_in", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
  add_initializer(body, "axes", tensor({0}, Options().dtype(DType::i64)));
  add_initializer(body, "one", tensor({1}, Options().dtype(DType::i64)));
  add_node(body, "Unsqueeze", {"i", "axes"}, {"start"});
  add_node(body, "Add", {"start", "one"}, {"end"});
  add_node(body, "Slice", {"table", "start", "end"}, {"t_i"});
  add_node(body, "Add", {"v_in", "t_i"}, {"v_out"});
  add_node(body, "Identity", {"c_in"}, {"c_out"});
  add_value(body.mutable_output(), "c_out", onnx::TensorProto::BOOL, std::vector<int64_t>{});
  add_value(body.mutable_output(), "v_out", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
  onnx::GraphProto g;
  g.set_name("slice_loop");
  add_value(g.mutable_input(), "x", onnx::TensorProto::DOUBLE, std::vector<int64_t>{3});
  add_initializer(g, "M", i64_scalar(5));
  add_initializer(g, "cond", bool_scalar(true));
  add_initializer(g, "table", tensor({0.5, 1.0, 1.5, 2.0, 2.5}, f64()));
  onnx::NodeProto* loop = add_node(g, "Loop", {"M", "cond", "x"}, {"y"});
  onnx::AttributeProto* a = loop->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = std::move(body);
  add_value(g.mutable_output(), "y", onnx::TensorProto::DOUBLE, std::nullopt);
  TempFile f("slice_loop.onnx");
  write_model(std::move(g), f.path);
  Program p = import_onnx(f.path, OnnxImportOptions{.trainable = false});
  Tensor x = tensor({1.0, -2.0, 0.0}, f64());
  CHECK(same_values(p.eager({x})[0], {8.5, 5.5, 7.5}));
  CHECK(same_values(p({x})[0], {8.5, 5.5, 7.5}));
  CHECK(count_control(p.graph(), ControlKind::Scan) == 0);
  CHECK(count_control(p.graph(), ControlKind::WhileLoop) == 0);
}

TEST_CASE("gradients flow through a compiled Loop as through the eager one") {
  LoopCase c;
  c.weight = true;
  c.cond = true;
  SUBCASE("a known trip count (scan)") { c.trips = 4; }
  SUBCASE("a data-dependent condition (while_loop, then scan)") {
    c.data_condition = true;
    c.limit = 30;
  }
  TempFile f("grad.onnx");
  c.write(f.path);
  Program p = import_onnx(f.path);
  Tensor w;
  for (const auto& [name, t] : p.named_parameters())
    if (name == "w") w = t;
  REQUIRE(w.defined());
  Tensor x = tensor({1.0, 2.0, 0.5}, f64());
  std::vector<Tensor> grads;
  for (bool compiled : {false, true}) {
    w.set_grad({});
    Tensor y = compiled ? p({x})[0] : p.eager({x})[0];
    sum(y * y).backward();
    REQUIRE(w.grad().defined());
    grads.push_back(w.grad().clone());
  }
  CHECK(same_values(grads[1], test::values(grads[0])));
}

TEST_CASE("malformed Loops raise typed errors naming the node") {
  SUBCASE("a body condition of no value") {
    // Loop(M = 3, cond = true, X) whose body's condition is a bool tensor of shape (0).
    Program p = import_onnx(model_file("loop_empty_condition.onnx"));
    Tensor x = randn({1, 1, 4, 4});
    for (bool compiled : {false, true}) {
      CAPTURE(compiled);
      try {
        compiled ? p({x}) : p.eager({x});
        FAIL("no error");
      } catch (const ValueError& e) {
        const std::string m = e.what();
        CHECK(m.find("(Loop, opset 17)") != std::string::npos);
        CHECK(m.find("condition \"c_out\" must hold one value, got shape (0)") !=
              std::string::npos);
      }
    }
  }
  SUBCASE("a body condition output without a name") {
    LoopCase c;
    c.trips = 3;
    c.cond = true;
    TempFile f("unnamed_cond.onnx");
    c.write(f.path);
    onnx::ModelProto m = detail::onnx_io::read_model(f.path);
    onnx::GraphProto* body = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
    body->mutable_output(0)->set_name("");
    std::ofstream(f.path, std::ios::binary) << m.SerializeAsString();
    Program p = import_onnx(f.path);
    for (bool compiled : {false, true}) {
      CAPTURE(compiled);
      CHECK_THROWS_WITH_AS(compiled ? p({tensor({1.0, 2.0, 3.0}, f64())})
                                    : p.eager({tensor({1.0, 2.0, 3.0}, f64())}),
                           doctest::Contains("node \"the_loop\" (Loop, opset 17): its body's "
                                             "output 0 (the condition) has no name"),
                           ValueError);
    }
  }
  SUBCASE("a boolean carried value that the body declares a float, at import") {
    // Exported by duet: a while_loop on f32 (4) whose input the model declares bool. ONNX
    // Runtime rejects it (ReduceSum of a bool; the Loop alone: "Tensor element type mismatch.
    // 9 != 1"); duet's Mul kept the bool, so the loop never ended.
    CHECK_THROWS_WITH_AS(import_onnx(model_file("loop_bool_state.onnx")),
                         doctest::Contains("(Loop, opset 17): its carried value 0 (\"arg0\") is "
                                           "declared b8, but its body declares that input "
                                           "(\"state_15\") as f32"),
                         DTypeError);
  }
  SUBCASE("a computed carried value of another type than the body's, at the first call") {
    LoopCase c;
    c.trips = 3;
    c.cond = true;
    TempFile f("computed_state.onnx");
    c.write(f.path);
    onnx::ModelProto m = detail::onnx_io::read_model(f.path);
    add_int_attr(add_node(*m.mutable_graph(), "Cast", {"x"}, {"xi"}), "to",
                 onnx::TensorProto::INT64);
    m.mutable_graph()->mutable_node()->SwapElements(0, 1);  // the Cast first
    m.mutable_graph()->mutable_node(1)->set_input(2, "xi");
    std::ofstream(f.path, std::ios::binary) << m.SerializeAsString();
    Program p = import_onnx(f.path);
    for (bool compiled : {false, true}) {
      CAPTURE(compiled);
      CHECK_THROWS_WITH_AS(compiled ? p({tensor({1.0, 2.0, 3.0}, f64())})
                                    : p.eager({tensor({1.0, 2.0, 3.0}, f64())}),
                           doctest::Contains("its carried value 0 is i64 (3), but its body "
                                             "declares that input (\"v_in\") as f64"),
                           DTypeError);
    }
  }
  SUBCASE("no trip count and a condition that stays true: compiled, it never ends") {
    LoopCase c;
    c.cond = true;
    TempFile f("forever.onnx");
    c.write(f.path);
    Program p = import_onnx(f.path);
    CHECK_THROWS_WITH_AS(p({tensor({1.0, 2.0, 3.0}, f64())}),
                         doctest::Contains("node \"the_loop\" (Loop, opset 17): it has no trip "
                                           "count, and its body's condition \"c_out\" is always "
                                           "true: it never ends"),
                         ValueError);
  }
}
