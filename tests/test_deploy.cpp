// Saved programs (duet::save, duet::load; trace/serialize.h): round trips of an MLP, a CNN, a
// scan and a training step; symbolic dims and the errors of calls that do not fit; files that
// are not programs, truncated, corrupt or from a newer format.
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "trace/serialize.h"
#include "util.h"

namespace duet::test {
namespace {

std::string temp_path(const std::string& name) {
  return fmt::format("/tmp/duet_test_deploy_{}_{}.duet", name, static_cast<long>(::getpid()));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file of tests/data/deploy (its README says what each is).
std::string data_file(const std::string& name) {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/deploy/" + name;
}

// The exit code of a shell command, or 128 + the signal that ended it (an abort: 134).
int exit_code(const std::string& command) {
  const int s = std::system(command.c_str());
  if (s == -1) return -1;
  return WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
}

// Swallows what duet::print writes while it lives.
struct QuietPrints {
  detail::PrintSink prev = detail::set_print_sink([](const std::string&) {});
  ~QuietPrints() { detail::set_print_sink(prev); }
};

}  // namespace

TEST_CASE("deploy: a compiled MLP saved and loaded computes what it computed") {
  manual_seed(1);
  nn::Linear fc1(12, 16), fc2(16, 3);
  auto f = compile([&](Tensor x) { return fc2(relu(fc1(x))); });
  const Tensor x = randn({5, 12});
  const std::string path = temp_path("mlp");
  save(f, path, x);
  Program p = load(path);
  CHECK(p.input_names() == std::vector<std::string>{"arg0"});
  const std::vector<std::pair<std::string, Tensor>> params = p.named_parameters();
  CHECK(params.size() == 4);
  const Tensor y = randn({5, 12});
  std::vector<Tensor> out = p({y});
  REQUIRE(out.size() == 1);
  CHECK(close(out[0], f(y), 1e-6));
  CHECK(close(p.run({{"arg0", y}})[0], fc2(relu(fc1(y))), 1e-6));
  // The batch was saved fixed: another one is refused, in words.
  const std::string e = error_of<ShapeError>([&] { p({randn({4, 12})}); });
  CHECK(contains(e,
                 "input \"arg0\" expects f32 (5, 12) cpu, got shape (4, 12): dim 0 was saved "
                 "fixed at 5"));
  CHECK(contains(error_of<DTypeError>([&] {
                   p({randn({5, 12}, Options().dtype(DType::f64))});
                 }),
                 "expects f32 (5, 12) cpu, got f64"));
  CHECK(contains(error_of<ValueError>([&] { p({}); }), "takes 1 inputs (arg0), got 0"));
  std::remove(path.c_str());
}

TEST_CASE("deploy: a dim held symbolic stays symbolic, with its guards") {
  manual_seed(2);
  nn::Linear fc(6, 2);
  CompileOptions o;
  o.dynamic = {{0, 0}, {1, 0}};
  auto f = compile([&](Tensor x, Tensor y) { return fc(x + y); }, o);
  const std::string path = temp_path("dynamic");
  save(f, path, randn({8, 6}), randn({8, 6}));
  Program p = load(path);
  for (int64_t batch : {1, 7, 300}) {
    CAPTURE(batch);
    const Tensor x = randn({batch, 6}), y = randn({batch, 6});
    CHECK(close(p({x, y})[0], fc(x + y), 1e-6));
  }
  // Equal sizes shared one symbol when traced: they must stay equal.
  const std::string e = error_of<ShapeError>([&] { p({randn({3, 6}), randn({4, 6})}); });
  CHECK(contains(e,
                 "input \"arg1\" expects f32 (s0, 6) cpu, got shape (4, 6): s0 is 3 in input "
                 "\"arg0\" dim 0"));
  std::remove(path.c_str());
}

TEST_CASE("deploy: a CNN, a scan and a print survive the round trip") {
  manual_seed(3);
  nn::Conv2d conv(1, 4, 3);
  nn::Linear head(4 * 6 * 6, 5);
  auto cnn = compile([&](Tensor x) { return head(reshape(relu(conv(x)), {x.sizes()[0], -1})); });
  const std::string path = temp_path("cnn");
  save(cnn, path, randn({2, 1, 8, 8}));
  const Tensor x = randn({2, 1, 8, 8});
  CHECK(close(load(path)({x})[0], cnn(x), 1e-5));

  nn::Linear cell(4 + 3, 4);
  auto rnn = compile([&](Tensor h, Tensor xs) {
    return scan(
        [&](const std::vector<Tensor>& in) {
          Tensor n = tanh(cell(cat({in[0], in[1]}, 1)));
          print(sum(n), "step {}");
          return std::vector<Tensor>{n, n};
        },
        {h}, {xs})[0];
  });
  save(rnn, path, zeros({2, 4}), randn({5, 2, 3}));
  Program p = load(path);
  const Tensor xs = randn({5, 2, 3});
  CHECK(close(p({zeros({2, 4}), xs})[0], rnn(zeros({2, 4}), xs), 1e-5));
  CHECK(contains(p.graph().str(), "scan("));
  CHECK(contains(p.graph().str(), "{format=\"step {}\"}"));
  std::remove(path.c_str());
}

TEST_CASE("deploy: a saved training step updates the loaded program's own parameters") {
  manual_seed(4);
  nn::Linear fc(3, 2);
  optim::SGD sgd(fc.parameters(), {.lr = 0.5});
  auto step = compile([&](Tensor x, Tensor t) {
    sgd.zero_grad();
    Tensor loss = cross_entropy(fc(x), t);
    loss.backward();
    sgd.step();
    return loss;
  });
  const Tensor x = randn({4, 3}), t = randint(2, {4});
  const std::string path = temp_path("step");
  save(step, path, x, t);
  const Tensor w_before = fc.weight.clone();
  Program p = load(path);
  const Tensor loss1 = p({x, t})[0];
  const Tensor loss2 = p({x, t})[0];
  CHECK(values(loss2)[0] < values(loss1)[0]);  // it trained
  CHECK(bitwise_equal(fc.weight, w_before));   // on its own copy
  // Its first loss is the module's, before any step.
  CHECK(close(loss1, cross_entropy(fc(x), t), 1e-6));
  std::remove(path.c_str());
}

TEST_CASE("deploy: files that are not programs, truncated, corrupt or newer raise, never crash") {
  auto f = compile([](Tensor x) { return exp(x) * 2; });
  const std::string path = temp_path("bad");
  save(f, path, randn({3}));
  const std::string good = read_file(path);
  auto error_loading = [&](const std::string& bytes) {
    write_file(path, bytes);
    return error_of<ValueError>([&] { load(path); });
  };
  CHECK(contains(error_loading("hello"), "is not a duet program file"));
  CHECK(contains(error_loading(""), "is not a duet program file"));
  CHECK(contains(error_loading(good.substr(0, 20)), "is truncated: 20 bytes"));
  CHECK(contains(error_loading(good.substr(0, good.size() - 7)), "is truncated: the header"));
  CHECK(contains(error_loading(good + "x"), "1 bytes after the payload"));
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  CHECK(contains(error_loading(flipped), "the payload's checksum does not match"));
  std::string header = good;
  header[12] = 1;
  CHECK(contains(error_loading(header), "the header's checksum does not match"));
  // A newer version, with a header checksum that matches.
  std::string newer = good;
  newer[8] = 2;
  detail::reseal_program(newer);
  CHECK(contains(error_loading(newer), "has format version 2, newer than this build reads"));
  CHECK(contains(error_of<ValueError>([] { load("/nonexistent/duet.duet"); }), "cannot open"));
  // Every truncation and every single-byte change of the payload, with checksums fixed up,
  // raises a typed error or loads a program that runs: never a crash.
  for (size_t at = 32; at < good.size(); at += 7) {
    std::string b = good;
    b[at] = static_cast<char>(b[at] ^ 0x5a);
    detail::reseal_program(b);
    write_file(path, b);
    try {
      Program p = load(path);
      (void)p({randn({3})});
    } catch (const Error&) {
    }
  }
  std::remove(path.c_str());
}

TEST_CASE("deploy: size expressions read back as written") {
  const SymInt s0 = SymInt::symbol(0), s1 = SymInt::symbol(1);
  for (const SymInt& e : {s0 * 2 * s1 + s0 + 3, floordiv(s0 + 1, 2), mod(s0 * 3, 4), s0 * s0 - s1,
                          SymInt(-4), SymInt(7)}) {
    CAPTURE(e.str());
    const std::optional<SymInt> back = detail::parse_sym(e.str());
    REQUIRE(back.has_value());
    CHECK(*back == e);
  }
  for (const char* bad : {"", "s", "2 +", "floordiv(s0)", "s0 ** 99", "q1", "mod(s0, 0)"})
    CHECK_FALSE(detail::parse_sym(bad).has_value());
}

TEST_CASE("deploy: .npy files are read and written with their dtype, shape and order") {
  const std::string path = temp_path("npy");
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64, DType::b8}) {
    for (const Shape& s : {Shape{}, Shape{4}, Shape{2, 3}, Shape{2, 0, 3}}) {
      CAPTURE(std::string(dtype_name(dt)));
      CAPTURE(s);
      Rng rng(5);
      const Tensor t = make(random_values(s.numel(), Domain{}, dt, rng), s, dt);
      data::write_npy(path, t);
      const Tensor back = data::read_npy(path);
      CHECK(bitwise_equal(back, t));
    }
  }
  // A transposed view is written in C order.
  const Tensor m = make({1, 2, 3, 4, 5, 6}, {2, 3});
  data::write_npy(path, transpose(m, 0, 1));
  CHECK(bitwise_equal(data::read_npy(path), transpose(m, 0, 1).contiguous()));
  // What NumPy writes: Fortran order and big-endian values, by hand (numpy.save's bytes).
  auto npy = [](const std::string& header, const std::string& data) {
    std::string h = header;
    h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
    h += '\n';
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(h.size());
    out += '\0';
    return out + h + data;
  };
  std::string be;
  for (int32_t v : {1, 2, 3, 4, 5, 6})
    for (int k = 3; k >= 0; --k) be += static_cast<char>((v >> (8 * k)) & 0xff);
  write_file(path, npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }", be));
  // Fortran order: element (i, j) is value i + 2 j.
  CHECK(values(data::read_npy(path)) == std::vector<double>{1, 3, 5, 2, 4, 6});
  write_file(path, npy("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", "ab"));
  CHECK(contains(error_of<DTypeError>([&] { data::read_npy(path); }), "dtype '<u2' is not one"));
  write_file(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", "abcd"));
  CHECK(contains(error_of<ValueError>([&] { data::read_npy(path); }), "truncated data: 12 bytes"));
  write_file(path, "not numpy");
  CHECK(contains(error_of<ValueError>([&] { data::read_npy(path); }), "not a .npy file"));
  // A shape is a tuple of sizes, as in Python: a trailing comma is allowed, and needed for one.
  const std::string four(16, '\0');
  write_file(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2,), }", four));
  CHECK(data::read_npy(path).sizes() == Shape{2, 2});
  for (const std::string shape : {"(4)", "(2,, 2)", "(, 4)", "(2 2)", "(-4,)", "[4]", "4", ""}) {
    CAPTURE(shape);
    write_file(path,
               npy("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }", four));
    CHECK(
        contains(error_of<ValueError>([&] { data::read_npy(path); }), "expected a tuple of sizes"));
  }
  std::remove(path.c_str());
}

// Headers whose shape has no value, or is a number: an error, not an escaped
// std::out_of_range, nor a 0-d tensor of the first value.
TEST_CASE("deploy: a .npy shape that is not a tuple is an error") {
  CHECK(contains(error_of<ValueError>([] { data::read_npy(data_file("npy_shape_empty.npy")); }),
                 "'shape' is empty, expected a tuple of sizes"));
  CHECK(contains(error_of<ValueError>([] { data::read_npy(data_file("npy_shape_12.npy")); }),
                 "'shape' is 12, expected a tuple of sizes"));
  CHECK(exit_code(std::string(DUET_RUN) + " " + data_file("print_ok.duet") + " --input " +
                  data_file("npy_shape_empty.npy") + " 2> /dev/null") == 1);
}

#ifdef DUET_NUMPY_PYTHON
namespace {
bool skip_numpy() {
  const char* s = std::getenv("DUET_SKIP_ORT");
  return s && std::string(s) == "1";
}
}  // namespace

// NumPy itself (the ONNX Runtime venv's) reads what write_npy writes, and writes what read_npy
// reads: each dtype, C and Fortran order, either byte order.
TEST_CASE("deploy: .npy files agree with NumPy's" * doctest::skip(skip_numpy())) {
  REQUIRE_MESSAGE(std::ifstream(DUET_NUMPY_PYTHON).good(),
                  "no venv at " DUET_NUMPY_PYTHON ": run tools/setup_deps.sh (or DUET_SKIP_ORT=1)");
  const std::string dir = fmt::format("/tmp/duet_test_npy_{}", static_cast<long>(::getpid()));
  REQUIRE(std::system(fmt::format("mkdir -p {}", dir).c_str()) == 0);
  const Tensor m = make({1, -2, 3, 4, 5, 6}, {2, 3});
  const std::vector<std::pair<std::string, Tensor>> mine = {{"f4", m},
                                                            {"f8", m.to(DType::f64)},
                                                            {"i4", m.to(DType::i32)},
                                                            {"i8", m.to(DType::i64)},
                                                            {"b1", gt(m, 2)},
                                                            {"t", transpose(m, 0, 1)}};
  for (const auto& [name, t] : mine) data::write_npy(fmt::format("{}/{}.npy", dir, name), t);
  // NumPy checks duet's files and writes its own: big-endian, Fortran order, each dtype.
  const std::string script = fmt::format(R"(
import numpy as np, sys
d = sys.argv[1]
m = np.array([[1, -2, 3], [4, 5, 6]])
want = {{'f4': m.astype('<f4'), 'f8': m.astype('<f8'), 'i4': m.astype('<i4'),
         'i8': m.astype('<i8'), 'b1': m > 2, 't': m.T.astype('<f4')}}
for k, v in want.items():
    got = np.load(f'{{d}}/{{k}}.npy')
    assert got.dtype == v.dtype and got.shape == v.shape and (got == v).all(), k
np.save(f'{{d}}/np_be.npy', m.astype('>f8'))
np.save(f'{{d}}/np_fortran.npy', np.asfortranarray(m.astype('<i8')))
np.save(f'{{d}}/np_bool.npy', m > 2)
np.save(f'{{d}}/np_scalar.npy', np.float32(2.5))
)");
  std::ofstream(dir + "/check.py") << script;
  CHECK(std::system(fmt::format("{} {}/check.py {}", DUET_NUMPY_PYTHON, dir, dir).c_str()) == 0);
  CHECK(bitwise_equal(data::read_npy(dir + "/np_be.npy"), m.to(DType::f64)));
  CHECK(bitwise_equal(data::read_npy(dir + "/np_fortran.npy"), m.to(DType::i64)));
  CHECK(bitwise_equal(data::read_npy(dir + "/np_bool.npy"), gt(m, 2)));
  CHECK(bitwise_equal(data::read_npy(dir + "/np_scalar.npy"), scalar(2.5f)));
  CHECK(std::system(fmt::format("rm -rf {}", dir).c_str()) == 0);
}
#endif

TEST_CASE("deploy: duet-run runs a saved program on .npy files, and times it") {
  manual_seed(6);
  nn::Linear fc(5, 2);
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([&](Tensor x) { return softmax(fc(x), 1); }, o);
  const std::string model = temp_path("run"), in = model + ".in.npy", out = model + ".out.npy";
  save(f, model, randn({8, 5}));
  const Tensor x = randn({3, 5});
  data::write_npy(in, x);
  const std::string run = DUET_RUN;
  CHECK(std::system((run + " " + model + " --input arg0=" + in + " --output " + out).c_str()) == 0);
  CHECK(close(data::read_npy(out), f(x), 1e-6));
  // In order, timed.
  const std::string log = model + ".log";
  CHECK(std::system((run + " " + model + " --input " + in + " --bench 5 > " + log).c_str()) == 0);
  const std::string printed = read_file(log);
  CHECK(contains(printed, "5 runs on cpu: median "));
  CHECK(contains(printed, "out0: tensor("));
  // Errors: a wrong input name, a bad option.
  CHECK(std::system((run + " " + model + " --input y=" + in + " 2> " + log).c_str()) != 0);
  CHECK(contains(read_file(log), "has no input named \"y\" (it has arg0)"));
  CHECK(std::system((run + " " + model + " --frobnicate 2> " + log).c_str()) != 0);
  CHECK(contains(read_file(log), "unknown option --frobnicate"));
  for (const std::string& p : {model, in, out, log}) std::remove(p.c_str());
}

TEST_CASE("deploy: duet-run names the inputs a run lacks, and the flag that gives them") {
  manual_seed(7);
  nn::Linear fc(5, 2);
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto f = compile([&](Tensor x) { return fc(x); }, o);
  const std::string model = temp_path("missing"), log = model + ".log";
  save(f, model, randn({8, 5}));
  Program p = load(model);
  CHECK(contains(error_of<ValueError>([&] { p.run({}); }),
                 "[Program::run] input \"arg0\" (f32 (s0, 5) cpu) was not fed: the saved "
                 "program takes its size s0 from it"));
  CHECK(exit_code(std::string(DUET_RUN) + " " + model + " 2> " + log) == 1);
  const std::string e = read_file(log);
  CHECK(contains(e, "takes 1 input (arg0); not given: arg0"));
  CHECK(contains(e, "--input arg0=FILE.npy"));
  for (const std::string& path : {model, log}) std::remove(path.c_str());
}

TEST_CASE("deploy: --bench takes a whole number of runs, strictly") {
  auto f = compile([](Tensor x) { return x * 2; });
  const std::string model = temp_path("bench"), in = model + ".in.npy", log = model + ".log";
  save(f, model, randn({2}));
  data::write_npy(in, randn({2}));
  const std::string run = std::string(DUET_RUN) + " " + model + " --input " + in + " --bench ";
  // 99999999999 overflowed atoi into 1.2e9 runs; 1e3 ran once.
  for (const char* bad : {"99999999999", "1e3", "0", "-5", "5x", "\"\"", "10000001"}) {
    CAPTURE(bad);
    CHECK(exit_code(run + bad + " > /dev/null 2> " + log) == 2);
    CHECK(contains(read_file(log), "--bench takes a whole number of runs from 1 to 10000000"));
  }
  CHECK(exit_code(run + "2 > " + log) == 0);
  CHECK(contains(read_file(log), "2 runs on cpu"));
  for (const std::string& path : {model, in, log}) std::remove(path.c_str());
}

// A saved print whose format fmt refuses (print_bad_format.duet: "x = {:d}") aborted duet-run
// with an uncaught fmt::format_error at the first run. It is refused at load, naming the format.
TEST_CASE("deploy: a print format that does not format a tensor is an error, never an abort") {
  QuietPrints quiet;
  const Tensor x = data::read_npy(data_file("x23.npy"));
  Program ok = load(data_file("print_ok.duet"));  // a file of format version 1 still loads
  CHECK(close(ok({x})[0], full({2}, 3.0), 0));
  const std::string e = error_of<ValueError>([] { load(data_file("print_bad_format.duet")); });
  CHECK(contains(e,
                 "print_bad_format.duet is corrupt: a print's format \"x = {:d}\" does not "
                 "format one tensor"));
  const std::string run = DUET_RUN, log = temp_path("print") + ".log";
  CHECK(exit_code(run + " " + data_file("print_bad_format.duet") + " --input " +
                  data_file("x23.npy") + " 2> " + log) == 1);
  CHECK(contains(read_file(log), "does not format one tensor"));
  CHECK(exit_code(run + " " + data_file("print_ok.duet") + " --input " + data_file("x23.npy") +
                  " > " + log) == 0);
  std::remove(log.c_str());
  // At the call, eagerly and traced; and a Print node with a bad format fails its shape rule.
  CHECK(contains(error_of<ValueError>([&] { print(x, "x = {:d}"); }), "does not format one"));
  auto f = compile([](Tensor t) {
    print(t, "t = {:d}");
    return t * 2;
  });
  CHECK(contains(error_of<ValueError>([&] { f(x); }), "does not format one tensor"));
  Attrs a;
  a.dim = detail::intern_format("{} {}");
  const Tensor* in[] = {&x};
  CHECK(contains(error_of<ValueError>([&] { detail::call(OpId::Print, TensorRefs(in, 1), a); }),
                 "[print] the format \"{} {}\" does not format one tensor"));
}

TEST_CASE("deploy: an argmax whose dim a loaded program got wrong is an error, never an abort") {
  // Found by the loader's fuzzer: a program's Argmax node with its dim out of range reached the
  // shape rule, which indexed the shape with it.
  const Tensor x = randn({2, 3});
  const Tensor* in[] = {&x};
  for (int64_t dim : {2, 7, -1}) {
    Attrs a;
    a.dim = dim;
    CHECK(contains(error_of<ValueError>([&] { detail::call(OpId::Argmax, TensorRefs(in, 1), a); }),
                   "[argmax] dim"));
  }
}

TEST_CASE("deploy: save names captured tensors as the module names its parameters") {
  manual_seed(8);
  nn::Sequential mlp(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
  auto f = compile([&](Tensor x) { return mlp(x); });
  const std::string path = temp_path("named");
  const nn::NamedTensors want = mlp.named_parameters();
  auto names_of = [](const Program& p) {
    std::map<std::string, Tensor> r;
    for (const auto& [name, t] : p.named_parameters()) r.emplace(name, t);
    return r;
  };
  auto check_named = [&](const Program& p) {
    const std::map<std::string, Tensor> got = names_of(p);
    CHECK(got.size() == want.size());
    for (const auto& [name, t] : want) {
      CAPTURE(name);
      REQUIRE(got.count(name));
      CHECK(bitwise_equal(got.at(name), t));
    }
  };
  save(f, path, SaveOptions{.parameter_names = want}, randn({3, 4}));
  Program p = load(path);
  check_named(p);
  CHECK(names_of(p).count("0.weight"));
  CHECK(names_of(p).count("2.bias"));
  const Tensor x = randn({3, 4});
  CHECK(close(p({x})[0], mlp(x), 1e-6));
  // Options as an lvalue, const or not, are options, not an example argument.
  SaveOptions o;
  o.parameter_names = want;
  save(f, path, o, randn({3, 4}));
  check_named(load(path));
  const SaveOptions& co = o;
  save(f, path, co, randn({3, 4}));
  check_named(load(path));
  // Without names: by position.
  save(f, path, randn({3, 4}));
  CHECK(names_of(load(path)).count("captured0"));
  // One name for two tensors is refused.
  o.parameter_names = {{"w", want[0].second}, {"w", want[2].second}};
  CHECK(contains(error_of<ValueError>([&] {
                   save(f, path, o, randn({3, 4}));
                 }),
                 "would both be named \"w\""));
  std::remove(path.c_str());
}

TEST_CASE("deploy: duet-run refuses a device or a FIFO as a program or an input") {
  auto f = compile([](Tensor x) { return x * 2; });
  const std::string model = temp_path("devices"), fifo = model + ".fifo", log = model + ".log";
  save(f, model, randn({2}));
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // `timeout`: a run that blocks on the FIFO, or reads /dev/zero without end, exits 124.
  const std::string run = "timeout 60 " + std::string(DUET_RUN) + " ";
  for (const std::string& bad : {std::string("/dev/zero"), fifo}) {
    CAPTURE(bad);
    CHECK(exit_code(run + bad + " 2> " + log) == 1);
    CHECK(contains(read_file(log), "is not a regular file"));
    CHECK(exit_code(run + model + " --input " + bad + " 2> " + log) == 1);
    CHECK(contains(read_file(log), "is not a regular file"));
  }
  for (const std::string& path : {model, fifo, log}) std::remove(path.c_str());
}

// The fuzz target's seed corpus (tests/fuzz/corpus): small programs of each kind of node. It
// writes them when DUET_WRITE_FUZZ_CORPUS names a directory:
//   DUET_WRITE_FUZZ_CORPUS=tests/fuzz/corpus ./build/tests/test_deploy -tc='*corpus*'
TEST_CASE("deploy: the fuzz corpus programs save and load") {
  const char* env = std::getenv("DUET_WRITE_FUZZ_CORPUS");
  const std::string dir = env ? env : "/tmp";
  auto put = [&](const std::string& name, auto& f, auto&&... args) {
    const std::string path = fmt::format("{}/{}{}.duet", dir, env ? "" : "duet_corpus_", name);
    save(f, path, args...);
    CHECK_NOTHROW(load(path));
    if (!env) std::remove(path.c_str());
  };
  manual_seed(9);
  auto ew = compile([](Tensor x) { return exp(x) * 2 - 1; });
  put("elementwise", ew, randn({3}));
  CompileOptions o;
  o.dynamic = {{0, 0}};
  auto sym = compile([](Tensor x) { return sum(reshape(x, {-1}) * 2) / 3; }, o);
  put("symbolic", sym, randn({4, 2}));
  nn::Linear cell(3, 2);
  auto rnn = compile([&](Tensor h, Tensor xs) {
    return scan(
        [&](const std::vector<Tensor>& in) {
          Tensor n = tanh(cell(cat({in[0], in[1]}, 1)));
          print(n, "h {}");
          return std::vector<Tensor>{n, n};
        },
        {h}, {xs})[0];
  });
  put("scan", rnn, zeros({1, 2}), randn({2, 1, 1}));
  nn::Linear fc(2, 2);
  optim::SGD sgd(fc.parameters(), {.lr = 0.1});
  auto step = compile([&](Tensor x, Tensor t) {
    sgd.zero_grad();
    Tensor loss = cross_entropy(fc(x), t);
    loss.backward();
    sgd.step();
    return loss;
  });
  put("train_step", step, randn({2, 2}), randint(2, {2}));
}

}  // namespace duet::test
