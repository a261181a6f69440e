// import_onnx of models that keep tensors in external data files (Note [External data] in
// trace/onnx/onnx_external.cpp): the layouts exporters write, each computing what the same model
// with its data inline computes, eagerly and compiled; and every location, range and file duet
// refuses, each with a ValueError naming the model, the tensor and what is wrong.
#include <onnx/onnx_pb.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "duet.h"
#include "onnx_models.h"
#include "util.h"

namespace fs = std::filesystem;
using namespace duet;
using namespace duet::test::onnx_models;

namespace {

// A fresh folder under /tmp, removed with what it holds.
struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/duet_test_onnx_external_XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// Marks t external with these external_data entries (and no inline data).
void set_external(onnx::TensorProto& t,
                  const std::vector<std::pair<std::string, std::string>>& entries) {
  t.clear_raw_data();
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  t.clear_external_data();
  for (const auto& [k, v] : entries) {
    onnx::StringStringEntryProto* e = t.add_external_data();
    e->set_key(k);
    e->set_value(v);
  }
}

// Moves t's raw_data to the end of `data`, the contents of the file `location`, at an offset
// aligned to 64 bytes (zero bytes between tensors), as exporters align them.
void move_out(onnx::TensorProto& t, std::string& data, const std::string& location) {
  data.resize((data.size() + 63) / 64 * 64, '\0');
  const size_t offset = data.size();
  const std::string bytes = t.raw_data();
  data += bytes;
  set_external(t, {{"location", location},
                   {"offset", std::to_string(offset)},
                   {"length", std::to_string(bytes.size())}});
}

// relu(x @ w1 + b1) @ w2^T + b2, times a Constant: initializers and a node attribute's value.
struct Mlp {
  Tensor w1 = randn({4, 8}), b1 = randn({8}), w2 = randn({3, 8}), b2 = randn({3}),
         scale = randn({3});

  onnx::GraphProto graph() const {
    onnx::GraphProto g;
    g.set_name("mlp");
    add_input(g, "x", onnx::TensorProto::FLOAT, {std::string("batch"), int64_t(4)});
    add_initializer(g, "w1", w1);
    add_initializer(g, "b1", b1);
    add_initializer(g, "w2", w2);
    add_initializer(g, "b2", b2);
    add_node(g, "MatMul", {"x", "w1"}, {"h0"});
    add_node(g, "Add", {"h0", "b1"}, {"h1"});
    add_node(g, "Relu", {"h1"}, {"h"});
    add_int_attr(add_node(g, "Gemm", {"h", "w2", "b2"}, {"z"}), "transB", 1);
    onnx::NodeProto* c = add_node(g, "Constant", {}, {"scale"});
    onnx::AttributeProto* a = c->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    detail::onnx_io::tensor_to_proto(scale, *a->mutable_t());
    add_node(g, "Mul", {"z", "scale"}, {"y"});
    add_output(g, "y", onnx::TensorProto::FLOAT);
    return g;
  }
};

onnx::TensorProto& initializer(onnx::GraphProto& g, const std::string& name) {
  for (onnx::TensorProto& t : *g.mutable_initializer())
    if (t.name() == name) return t;
  FAIL("no initializer " << name);
  return *g.mutable_initializer(0);
}

onnx::TensorProto& constant_value(onnx::GraphProto& g) {
  for (onnx::NodeProto& n : *g.mutable_node())
    if (n.op_type() == "Constant") return *n.mutable_attribute(0)->mutable_t();
  FAIL("no Constant");
  return *g.mutable_initializer(0);
}

// The imported model computes what `inline_path` computes, eagerly and compiled, and its
// parameters get the same gradients.
void check_same(const std::string& external_path, const std::string& inline_path) {
  Program p = import_onnx(external_path), q = import_onnx(inline_path);
  REQUIRE(p.named_parameters().size() == q.named_parameters().size());
  for (int64_t batch : {5, 2}) {
    Tensor x = randn({batch, 4});
    CHECK(test::bitwise_equal(p.eager({x})[0], q.eager({x})[0]));
    CHECK(test::bitwise_equal(p({x})[0], q({x})[0]));
    Tensor yp = p.eager({x})[0], yq = q.eager({x})[0];
    sum(yp * yp).backward();
    sum(yq * yq).backward();
    for (size_t i = 0; i < q.named_parameters().size(); ++i) {
      CAPTURE(q.named_parameters()[i].first);
      CHECK(p.named_parameters()[i].first == q.named_parameters()[i].first);
      CHECK(test::bitwise_equal(p.named_parameters()[i].second.grad(),
                                q.named_parameters()[i].second.grad()));
    }
  }
}

}  // namespace

TEST_CASE(
    "a model with its weights in one external file, as PyTorch's exporter writes it, "
    "computes what the same model with its data inline computes") {
  manual_seed(11);
  TempDir dir;
  Mlp mlp;
  write_model(mlp.graph(), (dir.path / "inline.onnx").string());
  // model.onnx beside model.onnx.data: every weight but the smallest (b2, kept inline as
  // exporters keep small tensors) in one file, the Constant's value too.
  onnx::GraphProto g = mlp.graph();
  std::string data;
  for (const char* name : {"w1", "b1", "w2"})
    move_out(initializer(g, name), data, "model.onnx.data");
  move_out(constant_value(g), data, "model.onnx.data");
  data += std::string(100, '\0');  // bytes after the last tensor are never read
  write_bytes(dir.path / "model.onnx.data", data);
  write_model(std::move(g), (dir.path / "model.onnx").string());
  check_same((dir.path / "model.onnx").string(), (dir.path / "inline.onnx").string());
}

TEST_CASE("external data: one file per tensor in a subfolder, without offset or length") {
  manual_seed(12);
  TempDir dir;
  Mlp mlp;
  write_model(mlp.graph(), (dir.path / "inline.onnx").string());
  onnx::GraphProto g = mlp.graph();
  fs::create_directory(dir.path / "weights");
  for (const char* name : {"w1", "b1", "w2", "b2"}) {
    onnx::TensorProto& t = initializer(g, name);
    write_bytes(dir.path / "weights" / name, t.raw_data());
    set_external(t, {{"location", std::string("./weights/") + name}});
  }
  write_model(std::move(g), (dir.path / "model.onnx").string());
  check_same((dir.path / "model.onnx").string(), (dir.path / "inline.onnx").string());

  SUBCASE("a model named by a relative path reads from its own folder, not the working one") {
    struct Cwd {  // restores the working folder, whatever happens
      fs::path was = fs::current_path();
      ~Cwd() { fs::current_path(was); }
    } cwd;
    fs::current_path(dir.path / "weights");
    CHECK_NOTHROW(import_onnx("../model.onnx"));
    fs::current_path(dir.path);
    CHECK_NOTHROW(import_onnx("model.onnx"));
  }
}

TEST_CASE("external data: a symlink in the model's folder is followed") {
  // As a Hugging Face cache lays a model out: the data file a link into the cache's blobs/.
  manual_seed(13);
  TempDir dir;
  Mlp mlp;
  write_model(mlp.graph(), (dir.path / "inline.onnx").string());
  onnx::GraphProto g = mlp.graph();
  std::string data;
  for (const char* name : {"w1", "b1", "w2", "b2"})
    move_out(initializer(g, name), data, "model.onnx.data");
  fs::create_directories(dir.path / "blobs");
  fs::create_directories(dir.path / "snapshot");
  write_bytes(dir.path / "blobs" / "0123abcd", data);
  fs::create_symlink("../blobs/0123abcd", dir.path / "snapshot" / "model.onnx.data");
  write_model(std::move(g), (dir.path / "snapshot" / "model.onnx").string());
  check_same((dir.path / "snapshot" / "model.onnx").string(), (dir.path / "inline.onnx").string());
}

TEST_CASE("external data: a subgraph's initializer reads from the model's folder too") {
  // If(c) returns its then branch's initializer, kept in a file, or its else branch's, inline.
  TempDir dir;
  const Tensor t = randn({3}), e = randn({3});
  auto branch = [](const std::string& name, const Tensor& v) {
    onnx::GraphProto b;
    b.set_name(name);
    add_initializer(b, name, v);
    add_node(b, "Identity", {name}, {name + "_out"});
    add_output(b, name + "_out", onnx::TensorProto::FLOAT);
    return b;
  };
  onnx::GraphProto then_branch = branch("then_value", t), else_branch = branch("else_value", e);
  std::string data;
  move_out(*then_branch.mutable_initializer(0), data, "branch.data");
  write_bytes(dir.path / "branch.data", data);
  onnx::GraphProto g;
  add_input(g, "c", onnx::TensorProto::BOOL, {});
  onnx::NodeProto* n = add_node(g, "If", {"c"}, {"y"});
  for (const auto& [attr, body] :
       {std::pair<const char*, const onnx::GraphProto*>{"then_branch", &then_branch},
        {"else_branch", &else_branch}}) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(attr);
    a->set_type(onnx::AttributeProto::GRAPH);
    *a->mutable_g() = *body;
  }
  add_output(g, "y", onnx::TensorProto::FLOAT);
  write_model(std::move(g), (dir.path / "model.onnx").string());
  Program p = import_onnx((dir.path / "model.onnx").string());
  const Tensor yes = full({}, 1, Options().dtype(DType::b8)),
               no = full({}, 0, Options().dtype(DType::b8));
  CHECK(test::bitwise_equal(p.eager({yes})[0], t));
  CHECK(test::bitwise_equal(p.eager({no})[0], e));
  CHECK(test::bitwise_equal(p({yes})[0], t));
}

TEST_CASE(
    "external data duet refuses: locations outside the model's folder, ranges past the "
    "end of the file, files that are not regular files") {
  TempDir dir;
  fs::create_directory(dir.path / "model");
  const fs::path folder = dir.path / "model";
  const std::string model = (folder / "model.onnx").string();
  const Tensor w = randn({2, 4});  // 32 bytes
  std::string bytes;
  {
    onnx::TensorProto t;
    detail::onnx_io::tensor_to_proto(w, t);
    bytes = t.raw_data();
  }
  write_bytes(folder / "w.bin", bytes);
  write_bytes(dir.path / "w.bin", bytes);  // beside the folder, not in it
  // A model whose one initializer "w" has these external_data entries.
  auto write = [&](const std::vector<std::pair<std::string, std::string>>& entries,
                   bool keep_inline = false) {
    onnx::GraphProto g;
    add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t(2), int64_t(4)});
    onnx::TensorProto* t = add_initializer(g, "w", w);
    set_external(*t, entries);
    if (keep_inline) t->set_raw_data(bytes);
    add_node(g, "Add", {"x", "w"}, {"y"});
    add_output(g, "y", onnx::TensorProto::FLOAT);
    write_model(std::move(g), model);
  };
  auto refused = [&](const std::string& why) {
    const std::string want =
        fmt::format("[import_onnx] initializer \"w\" of model {}: {}", model, why);
    CHECK_THROWS_WITH_AS(import_onnx(model), doctest::Contains(want.c_str()), ValueError);
  };
  // The model reads w.bin in its folder: the one place it may read.
  write({{"location", "w.bin"}, {"offset", "0"}, {"length", "32"}});
  Tensor x = randn({2, 4});
  CHECK(test::bitwise_equal(import_onnx(model).eager({x})[0], x + w));

  SUBCASE("an absolute location, even of a file that exists") {
    const std::string abs = (folder / "w.bin").string();
    write({{"location", abs}});
    refused(
        fmt::format("its external data location \"{}\" is an absolute path; duet reads "
                    "external data only from files in the model's folder {}",
                    abs, folder.string()));
  }
  SUBCASE("a location that climbs out of the folder") {
    for (const char* loc : {"../w.bin", "sub/../../w.bin", "./../model/w.bin"}) {
      CAPTURE(loc);
      write({{"location", loc}});
      refused(
          fmt::format("its external data location \"{}\" leaves the model's folder {} (a "
                      "\"..\" part)",
                      loc, folder.string()));
    }
  }
  SUBCASE("an offset past the end of the file") {
    write({{"location", "w.bin"}, {"offset", "64"}, {"length", "32"}});
    refused(fmt::format("its external data offset 64 is past the end of {} (32 bytes)",
                        (folder / "w.bin").string()));
  }
  SUBCASE("a length past the end of the file") {
    write({{"location", "w.bin"}, {"offset", "16"}, {"length", "32"}});
    refused(
        fmt::format("its external data (32 bytes at offset 16) runs past the end of {} (32 "
                    "bytes)",
                    (folder / "w.bin").string()));
    write({{"location", "w.bin"}, {"offset", "8"}, {"length", "9223372036854775807"}});
    refused(
        fmt::format("its external data (9223372036854775807 bytes at offset 8) runs past the "
                    "end of {} (32 bytes)",
                    (folder / "w.bin").string()));
  }
  SUBCASE("a range that does not hold the tensor") {
    write({{"location", "w.bin"}, {"offset", "8"}, {"length", "16"}});
    refused(
        fmt::format("its external data is 16 bytes (at offset 8 of {}), but its dims (2, 4) "
                    "of FLOAT take 32",
                    (folder / "w.bin").string()));
    write({{"location", "w.bin"}, {"offset", "4"}});  // to the end: 28 bytes
    refused("its external data is 28 bytes");
  }
  SUBCASE("an offset or a length that is not a byte count") {
    for (const char* v : {"-1", "12abc", "", " 4", "99999999999999999999"}) {
      CAPTURE(v);
      write({{"location", "w.bin"}, {"offset", v}});
      refused(fmt::format("its external data offset \"{}\" is not a byte count", v));
      write({{"location", "w.bin"}, {"length", v}});
      refused(fmt::format("its external data length \"{}\" is not a byte count", v));
    }
  }
  SUBCASE("a directory") {
    fs::create_directory(folder / "weights");
    write({{"location", "weights"}});
    refused(fmt::format("its external data file {} is a directory, not a regular file",
                        (folder / "weights").string()));
  }
  SUBCASE("a FIFO: refused without waiting for a writer") {
    REQUIRE(::mkfifo((folder / "pipe").c_str(), 0600) == 0);
    write({{"location", "pipe"}});
    refused(fmt::format("its external data file {} is a FIFO, not a regular file",
                        (folder / "pipe").string()));
  }
  SUBCASE("a file that does not exist") {
    write({{"location", "missing.bin"}});
    refused(
        fmt::format("cannot open its external data file {}", (folder / "missing.bin").string()));
  }
  SUBCASE("no location, or an empty one") {
    write({{"offset", "0"}});
    refused("its data_location is EXTERNAL, but its external data names no file");
    write({{"location", ""}});
    refused("its data_location is EXTERNAL, but its external data names no file");
  }
  SUBCASE("entries that leave the data in doubt") {
    write({{"location", "w.bin"}}, true);
    refused("its data_location is EXTERNAL, but it holds data inline too");
    write({{"location", "w.bin"}, {"location", "other.bin"}});
    refused("its external data gives \"location\" twice");
    write({{"location", "w.bin"}, {"basepath", "/"}});
    refused("its external data has an entry \"basepath\" duet does not know");
  }
}

TEST_CASE("import_onnx reads a regular model file only: /dev/zero, a FIFO and a folder refused") {
  // Read whole, /dev/zero would grow until memory runs out and a FIFO would wait for a writer.
  TempDir dir;
  const fs::path fifo = dir.path / "model.onnx";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {std::string("/dev/zero"), fifo.string(), dir.path.string()}) {
    CAPTURE(path);
    std::string msg;
    CHECK_THROWS_AS(
        [&] {
          try {
            import_onnx(path);
          } catch (const ValueError& e) {
            msg = e.what();
            throw;
          }
        }(),
        ValueError);
    CHECK_MESSAGE(msg.find("[import_onnx]") == 0, msg);
    CHECK_MESSAGE(msg.find("expected an ONNX file") != std::string::npos, msg);
  }
}
