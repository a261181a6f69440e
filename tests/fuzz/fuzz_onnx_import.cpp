// fuzz_onnx_import: a deterministic mutation driver for import_onnx. It reads seed models (ONNX
// node test cases: a folder with model.onnx and test_data_set_0/input_N.pb, or .onnx files),
// makes mutation i of seed i % seeds from a generator seeded by (--seed, i): attribute values
// and types, initializer values and dims, node inputs and outputs, op types, declared input
// shapes and the opset. Each mutant is imported and, when that succeeds, run eagerly (one in 8
// compiled too) on small inputs (the seed's own when they still fit, else random ones of the
// declared shapes). A duet::Error is a pass; anything else (a signal, an exception that is not a
// duet::Error) is a failure, reported with the mutant's index and written to --artifacts, so that
// it replays with --only (which also writes the mutant there). A mutant that runs past --timeout
// seconds is reported as a time-out, not a failure: a legitimately large model may.
//
//   fuzz_onnx_import [--seconds S] [--mutations N] [--seed K] [--only I] [--timeout T]
//                    [--artifacts DIR] SEED...
//
// The runs go to child processes (fork), so that a crash or a hang ends one child, not the run:
// the parent never runs duet, only reads the seeds and makes mutants (the same ones the children
// make), and starts a new child after the mutant that ended the last one. A child's address space
// is limited (4 GiB), so that an allocation no check refused fails rather than swaps.
#include <onnx/onnx_pb.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <typeinfo>

#include "duet.h"
#include "trace/onnx/onnx_proto.h"

namespace fs = std::filesystem;
using namespace duet;

namespace {

struct Seed {
  std::string name;
  onnx::ModelProto model;
  std::vector<onnx::TensorProto> inputs;  // test_data_set_0, when the seed has one
};

struct Options_ {
  double seconds = 60;
  int64_t mutations = -1;  // -1: until the time is up
  uint64_t seed = 1;
  int64_t only = -1;
  int timeout = 3;
  std::string artifacts = "fuzz-onnx-artifacts";
  std::vector<std::string> seeds;
};

bool read_proto(const fs::path& p, google::protobuf::MessageLite& m) {
  std::ifstream f(p, std::ios::binary);
  return f && m.ParseFromIstream(&f);
}

void add_seed(const fs::path& model, std::vector<Seed>& out) {
  if (fs::file_size(model) > (256 << 10)) return;  // keep each run small
  Seed s;
  s.name = model.parent_path().filename().string() + "/" + model.filename().string();
  if (!read_proto(model, s.model)) return;
  const fs::path data = model.parent_path() / "test_data_set_0";
  for (int i = 0; fs::exists(data / fmt::format("input_{}.pb", i)); ++i) {
    const fs::path p = data / fmt::format("input_{}.pb", i);
    onnx::TensorProto t;
    if (fs::file_size(p) > (256 << 10) || !read_proto(p, t)) {
      s.inputs.clear();
      break;
    }
    s.inputs.push_back(std::move(t));
  }
  out.push_back(std::move(s));
}

std::vector<Seed> read_seeds(const std::vector<std::string>& paths) {
  std::vector<fs::path> models;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file() && e.path().extension() == ".onnx") models.push_back(e.path());
    } else if (fs::exists(p)) {
      models.push_back(p);
    }
  }
  std::sort(models.begin(), models.end());
  std::vector<Seed> seeds;
  for (const fs::path& m : models) add_seed(m, seeds);
  return seeds;
}

// ---- mutations ----

using Rng = std::mt19937_64;

int64_t pick(Rng& r, int64_t n) { return n <= 0 ? 0 : static_cast<int64_t>(r() % n); }

int64_t some_int(Rng& r) {
  static const int64_t v[] = {0,         -1,        1,         2,           -2,        3,
                              7,         -5,        100000,    INT32_MAX,   1LL << 31, 1LL << 40,
                              INT64_MAX, INT64_MIN, 1LL << 62, -(1LL << 31)};
  return r() % 3 == 0 ? pick(r, 9) - 4 : v[pick(r, std::size(v))];
}

float some_float(Rng& r) {
  static const float v[] = {0.0f,      -0.0f, 1.0f,  -1.0f, 0.5f,  NAN,  INFINITY,
                            -INFINITY, 1e9f,  1e-9f, 1e30f, -3.5f, 2.0f, 1e-45f};
  return v[pick(r, std::size(v))];
}

// All nodes of the graph and its subgraphs.
void nodes_of(onnx::GraphProto& g, std::vector<onnx::NodeProto*>& out) {
  for (onnx::NodeProto& n : *g.mutable_node()) {
    out.push_back(&n);
    for (onnx::AttributeProto& a : *n.mutable_attribute()) {
      if (a.has_g()) nodes_of(*a.mutable_g(), out);
      for (onnx::GraphProto& s : *a.mutable_graphs()) nodes_of(s, out);
    }
  }
}

void mutate_attribute(Rng& r, onnx::NodeProto& n) {
  if (n.attribute_size() == 0) return;
  const int idx = static_cast<int>(pick(r, n.attribute_size()));
  onnx::AttributeProto& a = *n.mutable_attribute(idx);
  switch (pick(r, 7)) {
    case 0:
      a.set_i(some_int(r));
      break;
    case 1:
      a.set_f(some_float(r));
      break;
    case 2:  // an element of a list, the list cut, emptied or grown
      if (a.ints_size()) a.set_ints(static_cast<int>(pick(r, a.ints_size())), some_int(r));
      if (a.floats_size()) a.set_floats(static_cast<int>(pick(r, a.floats_size())), some_float(r));
      break;
    case 3:
      if (a.ints_size()) a.mutable_ints()->Truncate(static_cast<int>(pick(r, a.ints_size())));
      if (a.floats_size()) a.mutable_floats()->Truncate(static_cast<int>(pick(r, a.floats_size())));
      break;
    case 4:
      a.add_ints(some_int(r));
      break;
    case 5:  // another type
      a.set_type(static_cast<onnx::AttributeProto::AttributeType>(1 + pick(r, 8)));
      break;
    case 6:
      n.mutable_attribute()->DeleteSubrange(idx, 1);
      break;
  }
}

// One value of an initializer's data (raw or typed), or its dims.
void mutate_initializer(Rng& r, onnx::TensorProto& t) {
  const int64_t k = pick(r, 4);
  if (k == 0) {  // other dims: 0-d, empty, one dim more or less
    const int64_t how = pick(r, 3);
    if (how == 0) t.clear_dims();
    if (how == 1 && t.dims_size()) t.set_dims(static_cast<int>(pick(r, t.dims_size())), 0);
    if (how == 2) t.add_dims(1);
    if (how != 2 && pick(r, 2)) {
      t.clear_raw_data();
      t.clear_float_data();
      t.clear_int64_data();
      t.clear_int32_data();
      t.clear_double_data();
    }
    return;
  }
  std::string& raw = *t.mutable_raw_data();
  if (t.data_type() == onnx::TensorProto::INT64) {
    const int64_t v = some_int(r);
    if (raw.size() >= 8) std::memcpy(&raw[8 * pick(r, raw.size() / 8)], &v, 8);
    if (t.int64_data_size()) t.set_int64_data(static_cast<int>(pick(r, t.int64_data_size())), v);
  } else if (t.data_type() == onnx::TensorProto::FLOAT) {
    const float v = some_float(r);
    if (raw.size() >= 4) std::memcpy(&raw[4 * pick(r, raw.size() / 4)], &v, 4);
    if (t.float_data_size()) t.set_float_data(static_cast<int>(pick(r, t.float_data_size())), v);
  } else if (t.data_type() == onnx::TensorProto::INT32) {
    const auto v = static_cast<int32_t>(some_int(r));
    if (raw.size() >= 4) std::memcpy(&raw[4 * pick(r, raw.size() / 4)], &v, 4);
    if (t.int32_data_size()) t.set_int32_data(static_cast<int>(pick(r, t.int32_data_size())), v);
  }
}

// A value name of the graph: an input, an initializer or a node's output.
std::string some_name(Rng& r, const onnx::GraphProto& g) {
  const int64_t k = pick(r, g.input_size() + g.initializer_size() + g.node_size() + 1);
  if (k < g.input_size()) return g.input(static_cast<int>(k)).name();
  if (k < g.input_size() + g.initializer_size())
    return g.initializer(static_cast<int>(k - g.input_size())).name();
  const int64_t n = k - g.input_size() - g.initializer_size();
  if (n < g.node_size() && g.node(static_cast<int>(n)).output_size())
    return g.node(static_cast<int>(n)).output(0);
  return "";
}

void mutate_node(Rng& r, onnx::GraphProto& g, onnx::NodeProto& n,
                 const std::vector<std::string>& ops) {
  switch (pick(r, 5)) {
    case 0:
      mutate_attribute(r, n);
      break;
    case 1:  // an input omitted, dropped, added or read from another value
      if (n.input_size()) {
        const int i = static_cast<int>(pick(r, n.input_size()));
        const int64_t how = pick(r, 3);
        if (how == 0) n.set_input(i, "");
        if (how == 1) n.mutable_input()->RemoveLast();
        if (how == 2) n.set_input(i, some_name(r, g));
      } else {
        n.add_input(some_name(r, g));
      }
      break;
    case 2:  // an output more or fewer
      if (pick(r, 2) && n.output_size() > 1)
        n.mutable_output()->RemoveLast();
      else
        n.add_output(fmt::format("fuzz_out{}", n.output_size()));
      break;
    case 3:
      n.set_op_type(ops[static_cast<size_t>(pick(r, static_cast<int64_t>(ops.size())))]);
      break;
    case 4:
      mutate_attribute(r, n);
      mutate_attribute(r, n);
      break;
  }
}

void mutate_input_shape(Rng& r, onnx::GraphProto& g) {
  if (!g.input_size()) return;
  auto* t = g.mutable_input(static_cast<int>(pick(r, g.input_size())))
                ->mutable_type()
                ->mutable_tensor_type();
  if (pick(r, 2)) {
    t->clear_shape();  // any rank then: the inputs get a random one
  } else if (t->shape().dim_size()) {
    t->mutable_shape()
        ->mutable_dim(static_cast<int>(pick(r, t->shape().dim_size())))
        ->set_dim_value(pick(r, 4));
  }
}

// Mutation i: 1 to 3 changes to a copy of its seed.
onnx::ModelProto mutant(const std::vector<Seed>& seeds, const std::vector<std::string>& ops,
                        uint64_t seed, int64_t i) {
  Rng r(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i));
  onnx::ModelProto m = seeds[static_cast<size_t>(i) % seeds.size()].model;
  onnx::GraphProto& g = *m.mutable_graph();
  for (int64_t k = 0, count = 1 + pick(r, 3); k < count; ++k) {
    std::vector<onnx::NodeProto*> nodes;
    nodes_of(g, nodes);
    const int64_t what = pick(r, 10);
    if (what < 6 && !nodes.empty()) {
      mutate_node(r, g, *nodes[static_cast<size_t>(pick(r, static_cast<int64_t>(nodes.size())))],
                  ops);
    } else if (what < 8 && g.initializer_size()) {
      mutate_initializer(r,
                         *g.mutable_initializer(static_cast<int>(pick(r, g.initializer_size()))));
    } else if (what == 8) {
      mutate_input_shape(r, g);
    } else if (m.opset_import_size()) {
      m.mutable_opset_import(0)->set_version(7 + pick(r, 16));
    }
  }
  return m;
}

// ---- running one mutant (in a child) ----

// The inputs: the seed's when they fit the mutant's declared inputs, else random ones.
std::vector<Tensor> inputs_for(const Seed& s, const onnx::ModelProto& m, Rng& r) {
  std::set<std::string> initialized;
  for (const auto& t : m.graph().initializer()) initialized.insert(t.name());
  std::vector<Tensor> in;
  size_t k = 0;
  for (const onnx::ValueInfoProto& v : m.graph().input()) {
    if (initialized.count(v.name())) continue;
    const auto& tt = v.type().tensor_type();
    std::optional<DType> d = detail::onnx_io::dtype_of(tt.elem_type());
    if (!d) d = DType::f32;
    Tensor t;
    if (k < s.inputs.size()) {
      try {
        t = detail::onnx_io::tensor_from_proto(s.inputs[k], "input");
      } catch (const Error&) {
      }
    }
    bool fits =
        t.defined() && t.dtype() == *d && (!tt.has_shape() || t.dim() == tt.shape().dim_size());
    for (int j = 0; fits && tt.has_shape() && j < tt.shape().dim_size(); ++j)
      fits = !tt.shape().dim(j).has_dim_value() || tt.shape().dim(j).dim_value() == t.sizes()[j];
    if (!fits) {
      std::vector<int64_t> dims;
      if (tt.has_shape())
        for (const auto& dim : tt.shape().dim())
          dims.push_back(dim.has_dim_value() ? std::min<int64_t>(dim.dim_value(), 64) : 2);
      else
        for (int64_t j = 0, rank = pick(r, 5); j < rank; ++j) dims.push_back(pick(r, 4));
      const Tensor ints = randint(7, Shape(dims)) - 3;
      t = is_floating(*d)   ? randn(Shape(dims), Options().dtype(*d))
          : *d == DType::b8 ? gt(ints, 0)
                            : ints.to(*d);
    }
    in.push_back(t);
    ++k;
  }
  return in;
}

// "": a pass (imported and ran, or a duet::Error); else what went wrong.
std::string run_one(const Seed& s, const onnx::ModelProto& m, int64_t i, uint64_t seed,
                    const std::string& path) {
  {
    std::ofstream f(path, std::ios::binary);
    m.SerializeToOstream(&f);
  }
  Rng r(seed + static_cast<uint64_t>(i) * 7919);
  try {
    Program p = import_onnx(path);
    std::vector<Tensor> in = inputs_for(s, m, r);
    (void)p.eager(in);
    if (i % 8 == 0) (void)p(in);  // one in 8 compiled too (fused groups on the interpreter)
  } catch (const Error&) {
    return "";
  } catch (const std::exception& e) {
    return fmt::format("escaped {}: {}", typeid(e).name(), e.what());
  } catch (...) {
    return "escaped an exception that is not a std::exception";
  }
  return "";
}

}  // namespace

namespace {

Options_ parse(int argc, char** argv) {
  Options_ o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return std::string(argv[++i]);
    };
    if (a == "--seconds")
      o.seconds = std::stod(next());
    else if (a == "--mutations")
      o.mutations = std::stoll(next());
    else if (a == "--seed")
      o.seed = std::stoull(next());
    else if (a == "--only")
      o.only = std::stoll(next());
    else if (a == "--timeout")
      o.timeout = std::stoi(next());
    else if (a == "--artifacts")
      o.artifacts = next();
    else
      o.seeds.push_back(a);
  }
  return o;
}

// The child: runs mutants from `start` on, writing the index it is at to `*at` before each, and
// its findings to `report`, until `end` or the deadline; exits 0.
[[noreturn]] void child(const std::vector<Seed>& seeds, const std::vector<std::string>& ops,
                        const Options_& o, int64_t start, int64_t end, double deadline,
                        volatile int64_t* at, int report) {
  setenv("DUET_CODEGEN", "0", 1);  // read at the first compiled call, in the child
  rlimit lim{4LL << 30, 4LL << 30};
  setrlimit(RLIMIT_AS, &lim);
  set_num_threads(1);
  const std::string path =
      fmt::format("/tmp/fuzz_onnx_import_{}.onnx", static_cast<long>(getpid()));
  const auto t0 = std::chrono::steady_clock::now();
  int64_t i = start;
  for (; i < end; ++i) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > deadline)
      break;
    *at = i;
    alarm(static_cast<unsigned>(o.timeout));
    const std::string why = run_one(seeds[static_cast<size_t>(i) % seeds.size()],
                                    mutant(seeds, ops, o.seed, i), i, o.seed, path);
    alarm(0);
    if (!why.empty()) {
      const std::string line = fmt::format("{}\t{}\n", i, why);
      (void)!write(report, line.data(), line.size());
    }
  }
  *at = i;
  std::remove(path.c_str());
  _exit(0);
}

void save(const std::vector<Seed>& seeds, const std::vector<std::string>& ops, const Options_& o,
          int64_t i, const std::string& why) {
  fs::create_directories(o.artifacts);
  const std::string path = fmt::format("{}/mutant-{}-{}.onnx", o.artifacts, o.seed, i);
  std::ofstream f(path, std::ios::binary);
  mutant(seeds, ops, o.seed, i).SerializeToOstream(&f);
  std::cout << fmt::format(
      "FAIL mutant {} of seed {} ({}): {}\n  saved as {}; replay with --seed {} --only {}\n", i,
      o.seed, seeds[static_cast<size_t>(i) % seeds.size()].name, why, path, o.seed, i);
  std::cout.flush();
}

}  // namespace

int main(int argc, char** argv) {
  const Options_ o = parse(argc, argv);
  const std::vector<Seed> seeds = read_seeds(o.seeds);
  if (seeds.empty()) {
    std::cerr << "fuzz_onnx_import: no seed models\n";
    return 2;
  }
  std::set<std::string> op_set;
  for (const Seed& s : seeds)
    for (const auto& n : s.model.graph().node()) op_set.insert(n.op_type());
  const std::vector<std::string> ops(op_set.begin(), op_set.end());
  int64_t start = o.only >= 0 ? o.only : 0;
  const int64_t first = start;
  const int64_t end = o.only >= 0 ? o.only + 1 : o.mutations >= 0 ? o.mutations : INT64_MAX;
  if (o.only >= 0) {  // the mutant, to look at
    fs::create_directories(o.artifacts);
    const std::string path = fmt::format("{}/mutant-{}-{}.onnx", o.artifacts, o.seed, o.only);
    std::ofstream f(path, std::ios::binary);
    mutant(seeds, ops, o.seed, o.only).SerializeToOstream(&f);
    std::cout << "mutant " << o.only << " written to " << path << std::endl;
  }
  auto* at = static_cast<volatile int64_t*>(
      mmap(nullptr, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  int failures = 0, timeouts = 0;
  while (start < end && (o.mutations >= 0 || o.only >= 0 || elapsed() < o.seconds)) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    *at = start;
    const double left = o.mutations >= 0 || o.only >= 0 ? 1e18 : o.seconds - elapsed();
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      child(seeds, ops, o, start, end, left, at, fds[1]);
    }
    close(fds[1]);
    std::string found;
    char buf[4096];
    for (ssize_t k; (k = read(fds[0], buf, sizeof buf)) > 0;)
      found.append(buf, static_cast<size_t>(k));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    for (size_t p = 0, q; (q = found.find('\n', p)) != std::string::npos; p = q + 1) {
      const std::string line = found.substr(p, q - p);
      const size_t tab = line.find('\t');
      save(seeds, ops, o, std::stoll(line.substr(0, tab)), line.substr(tab + 1));
      ++failures;
    }
    const int64_t last = *at;
    if (WIFSIGNALED(status)) {
      if (WTERMSIG(status) == SIGALRM) {
        ++timeouts;
        std::cout << fmt::format("time-out ({} s) in mutant {} of seed {} ({})\n", o.timeout, last,
                                 o.seed, seeds[static_cast<size_t>(last) % seeds.size()].name)
                  << std::flush;
      } else {
        save(seeds, ops, o, last,
             fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status))));
        ++failures;
      }
      start = last + 1;
    } else {
      start = last;
      if (o.mutations < 0 && o.only < 0) break;  // the child ran until the deadline
    }
  }
  std::cout << fmt::format(
      "fuzz_onnx_import: {} mutants of {} seeds (seed {}) in {:.1f} s: {} failures, {} time-outs\n",
      start - first, seeds.size(), o.seed, elapsed(), failures, timeouts);
  return failures ? 1 : 0;
}
