// Data loading (nn/data): IDX files written here (plain and gzipped) read back exactly, every
// malformed file a clear error, Fashion-MNIST from its Debian package, and the DataLoader's
// batches and orders.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "nn/data.h"
#include "util.h"

namespace duet::test {
namespace {

namespace fs = std::filesystem;
using data::Batch;
using data::DataLoader;
using data::read_idx;

// ---- writing IDX files ----

/// A directory of its own under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("duet_test_data_{}", ::getpid());
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

using Bytes = std::vector<unsigned char>;

void put_be(Bytes& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

/// The bytes of an IDX file: the header for `type` and `dims`, then `values` big-endian.
Bytes idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                const std::vector<double>& values) {
  Bytes b = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (uint32_t d : dims) put_be(b, d, 4);
  for (double v : values) {
    switch (type) {
      case 0x08:
      case 0x09:
        b.push_back(static_cast<unsigned char>(static_cast<int64_t>(v)));
        break;
      case 0x0B:
        put_be(b, static_cast<uint16_t>(static_cast<int16_t>(v)), 2);
        break;
      case 0x0C:
        put_be(b, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
        break;
      case 0x0D:
        put_be(b, std::bit_cast<uint32_t>(static_cast<float>(v)), 4);
        break;
      case 0x0E:
        put_be(b, std::bit_cast<uint64_t>(v), 8);
        break;
    }
  }
  return b;
}

void write_plain(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f);
  if (!b.empty()) REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == int(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

/// Writes b plainly or gzipped, to name or name.gz.
std::string write(const TempDir& dir, const std::string& name, const Bytes& b, bool gz) {
  const std::string path = dir.file(gz ? name + ".gz" : name);
  if (gz)
    write_gz(path, b);
  else
    write_plain(path, b);
  return path;
}

/// The message of the duet::Error that read_idx(path) throws.
std::string idx_error(const std::string& path) {
  return error_of([&] { read_idx(path); });
}

/// Checks that the message contains the part (each evaluated once).
#define CHECK_HAS(msg, part)                                                      \
  do {                                                                            \
    const std::string has_msg_ = (msg), has_part_ = (part);                       \
    CHECK_MESSAGE(has_msg_.find(has_part_) != std::string::npos, "\"", has_part_, \
                  "\" not in: ", has_msg_);                                       \
  } while (0)

// ---- read_idx ----

TEST_CASE("read_idx: every type, plain and gzipped, round-trips exactly") {
  TempDir dir;
  struct Row {
    const char* name;
    uint8_t type;
    std::vector<uint32_t> dims;
    std::vector<double> values;
    DType dtype;
  };
  std::vector<double> pixels(3 * 4 * 5);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = double((i * 37 + 11) % 256);
  pixels[0] = 0;
  pixels[1] = 255;
  const std::vector<Row> rows = {
      {"u8", 0x08, {3, 4, 5}, pixels, DType::f32},
      {"u8 labels", 0x08, {6}, {0, 9, 3, 3, 1, 7}, DType::f32},
      {"i8", 0x09, {4}, {-128, -1, 0, 127}, DType::f32},
      {"i16", 0x0B, {2, 2}, {-32768, -1, 258, 32767}, DType::i32},
      {"i32", 0x0C, {2, 3}, {-2147483648.0, -1, 0, 1, 65536 + 3, 2147483647.0}, DType::i32},
      {"f32", 0x0D, {3}, {0.1, -2.5e-30, 3.4e38}, DType::f32},
      {"f64", 0x0E, {2, 1}, {0.1, -1e300}, DType::f64},
      {"0-d", 0x0C, {}, {42}, DType::i32},
      {"empty", 0x08, {0, 28}, {}, DType::f32},
  };
  for (const Row& r : rows) {
    for (bool gz : {false, true}) {
      CAPTURE(r.name);
      CAPTURE(gz);
      const std::string path = write(dir, r.name, idx_bytes(r.type, r.dims, r.values), gz);
      Tensor t = read_idx(path);
      Shape shape;
      for (uint32_t d : r.dims) shape.push_back(d);
      std::vector<double> want = r.values;
      for (double& v : want) v = round_to(v, r.dtype);
      check_tensor(t, shape, r.dtype, want);
      CHECK(t.is_contiguous());
    }
  }
}

TEST_CASE("read_idx: malformed files are errors naming the file and what was expected") {
  TempDir dir;
  const std::vector<double> values = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const Bytes good = idx_bytes(0x0C, {3, 5}, values);  // 12 header bytes + 60 data bytes
  REQUIRE(good.size() == 72);
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    // Truncated header: inside the magic number, and inside the dims.
    for (size_t n : {0, 2, 3}) {
      const std::string path = write(dir, "magic", Bytes(good.begin(), good.begin() + n), gz);
      const std::string msg = idx_error(path);
      CHECK_HAS(msg, "[read_idx] " + path);
      CHECK_HAS(msg, fmt::format("truncated header (magic number): expected 4 bytes, read {}", n));
    }
    for (size_t n : {4, 9}) {
      const std::string path = write(dir, "dims", Bytes(good.begin(), good.begin() + n), gz);
      CHECK_HAS(idx_error(path),
                fmt::format("truncated header (dims): expected 8 bytes, read {}", n - 4));
    }
    // Truncated data at several lengths.
    for (size_t n : {12, 13, 40, 71}) {
      const std::string path = write(dir, "data", Bytes(good.begin(), good.begin() + n), gz);
      const std::string msg = idx_error(path);
      CHECK_HAS(msg, path);
      CHECK_HAS(msg, fmt::format("truncated data: the header declares 15 i32 values of shape (3, "
                                 "5), expected 60 bytes, read {}",
                                 n - 12));
    }
    // Bytes after the data: the header does not describe the file.
    Bytes longer = good;
    longer.insert(longer.end(), {1, 2, 3});
    CHECK_HAS(idx_error(write(dir, "long", longer, gz)), "3 bytes follow the 60 bytes of data");
    // Bad magic and unknown type codes.
    Bytes magic = good;
    magic[0] = 0x1f;
    magic[1] = 0x02;
    CHECK_HAS(idx_error(write(dir, "bad_magic", magic, gz)), "bad magic number 1f 02 0c 02");
    for (unsigned char code : {0x00, 0x0A, 0x0F, 0xFF}) {
      Bytes typed = good;
      typed[2] = code;
      const std::string msg = idx_error(write(dir, "type", typed, gz));
      CHECK_HAS(msg, fmt::format("unsupported type code 0x{:02x}", code));
      CHECK_HAS(msg, "0x08 (u8)");
    }
  }
  // Missing paths and directories.
  CHECK_HAS(idx_error(dir.file("nothing.gz")), dir.file("nothing.gz") + ": no such file");
  CHECK_HAS(idx_error(dir.path.string()), "is a directory");
}

TEST_CASE("read_idx: a corrupt or cut gzip stream is an error") {
  TempDir dir;
  std::vector<double> values(500);
  for (size_t i = 0; i < values.size(); ++i) values[i] = double(i % 251);
  const std::string path = write(dir, "good", idx_bytes(0x08, {20, 25}, values), true);
  const Bytes gz = read_file(path);
  REQUIRE(gz.size() > 40);
  // A wrong CRC in the trailer (the last 8 bytes are CRC-32 and length).
  Bytes crc = gz;
  crc[crc.size() - 6] ^= 0xff;
  write_plain(dir.file("crc.gz"), crc);
  std::string msg = idx_error(dir.file("crc.gz"));
  CHECK_HAS(msg, dir.file("crc.gz"));
  CHECK_HAS(msg, "corrupt gzip stream (incorrect data check)");
  // An invalid deflate block type (BTYPE 11) right after the 10-byte gzip header.
  Bytes block = gz;
  block[10] |= 0x06;
  write_plain(dir.file("block.gz"), block);
  msg = idx_error(dir.file("block.gz"));
  CHECK_HAS(msg, "corrupt gzip stream (invalid block type), found while reading the header");
  // A gzip file cut short: the data ends early.
  write_plain(dir.file("cut.gz"), Bytes(gz.begin(), gz.begin() + gz.size() / 2));
  msg = idx_error(dir.file("cut.gz"));
  CHECK_HAS(msg, "truncated data");
  CHECK_HAS(msg, "expected 500 bytes");
  CHECK_HAS(msg, "(the gzip stream ends early)");
}

// ---- Fashion-MNIST ----

// ctest runs this case alone, selected by its name, as test_data_fashion_mnist
// (tests/CMakeLists.txt): Skipped where the data set is not installed, Passed or Failed where it
// is. $DUET_FASHION_MNIST_DIR points it at another directory.
TEST_CASE("load_fashion_mnist: 60000 + 10000 images in [0, 1], ten balanced classes") {
  const char* env = std::getenv("DUET_FASHION_MNIST_DIR");
  const std::string dir = env && *env ? env : data::kFashionMnistDir;
  if (!fs::is_directory(dir)) {
    skip(dir + " not found (apt install dataset-fashion-mnist)");
    return;
  }
  for (bool train : {true, false}) {
    CAPTURE(train);
    const int64_t n = train ? 60000 : 10000;
    data::Dataset d = data::load_fashion_mnist(train, dir);
    CHECK(d.inputs.shape() == Shape{n, 784});
    CHECK(d.inputs.dtype() == DType::f32);
    CHECK(d.inputs.is_contiguous());
    CHECK(d.targets.shape() == Shape{n});
    CHECK(d.targets.dtype() == DType::i64);
    const float* x = d.inputs.data_ptr<float>();
    const auto [lo, hi] = std::minmax_element(x, x + n * 784);
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);
    // Every value is a byte over 255.
    bool bytes = true;
    for (int64_t i = 0; i < n * 784; ++i) bytes &= float(std::lround(x[i] * 255)) / 255 == x[i];
    CHECK(bytes);
    std::vector<int64_t> count(10, 0);
    const int64_t* y = d.targets.data_ptr<int64_t>();
    bool in_range = true;
    for (int64_t i = 0; i < n; ++i) {
      in_range &= y[i] >= 0 && y[i] <= 9;
      if (in_range) ++count[y[i]];
    }
    REQUIRE(in_range);
    CHECK(count == std::vector<int64_t>(10, n / 10));
  }
}

TEST_CASE("load_fashion_mnist: a missing directory or file says what to do") {
  std::string msg = error_of([] { data::load_fashion_mnist(true, "/nonexistent/fashion"); });
  CHECK_HAS(msg, "[load_fashion_mnist] directory /nonexistent/fashion not found");
  CHECK_HAS(msg, "apt install dataset-fashion-mnist");
  TempDir dir;
  msg = error_of([&] { data::load_fashion_mnist(false, dir.path.string()); });
  CHECK_HAS(msg, "neither t10k-images-idx3-ubyte.gz nor t10k-images-idx3-ubyte");
  // Image and label counts must agree.
  write(dir, "t10k-images-idx3-ubyte", idx_bytes(0x08, {2, 28, 28}, std::vector<double>(1568)),
        true);
  write(dir, "t10k-labels-idx1-ubyte", idx_bytes(0x08, {3}, {1, 2, 3}), false);
  msg = error_of([&] { data::load_fashion_mnist(false, dir.path.string()); });
  CHECK_HAS(msg, "holds 2 images but");
  CHECK_HAS(msg, "holds 3 labels");
  // Labels outside 0..9.
  write(dir, "t10k-labels-idx1-ubyte", idx_bytes(0x08, {2}, {1, 12}), false);
  msg = error_of([&] { data::load_fashion_mnist(false, dir.path.string()); });
  CHECK_HAS(msg, "label 1 is 12, expected 0..9");
  // A small valid pair loads, from a mix of .gz and plain names.
  write(dir, "t10k-labels-idx1-ubyte", idx_bytes(0x08, {2}, {4, 0}), false);
  data::Dataset d = data::load_fashion_mnist(false, dir.path.string());
  CHECK(d.inputs.shape() == Shape{2, 784});
  check_tensor(d.targets, {2}, DType::i64, {4, 0});
}

// ---- DataLoader ----

/// n rows: inputs (n, 2) with row i = (i, 100 + i), targets i64 = i.
data::Dataset rows(int64_t n) {
  std::vector<double> x, y;
  for (int64_t i = 0; i < n; ++i) {
    x.insert(x.end(), {double(i), 100.0 + i});
    y.push_back(double(i));
  }
  return {make(x, {n, 2}, DType::f32), make(y, {n}, DType::i64)};
}

/// The targets of each batch of one pass (the row indices, given rows()).
std::vector<std::vector<int64_t>> pass(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const Batch& b : loader) {
    std::vector<int64_t> ids;
    for (double v : values(b.targets)) ids.push_back(int64_t(v));
    out.push_back(ids);
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

TEST_CASE("DataLoader: batch counts and sizes, with and without drop_last") {
  struct Row {
    int64_t n, batch;
    bool drop_last;
    std::vector<int64_t> sizes;
  };
  const std::vector<Row> table = {
      {10, 3, false, {3, 3, 3, 1}},
      {10, 3, true, {3, 3, 3}},
      {9, 3, false, {3, 3, 3}},
      {9, 3, true, {3, 3, 3}},
      {2, 5, false, {2}},
      {2, 5, true, {}},
      {0, 4, false, {}},
      {7, 1, true, {1, 1, 1, 1, 1, 1, 1}},
  };
  for (const Row& r : table) {
    for (bool shuffle : {false, true}) {
      CAPTURE(r.n);
      CAPTURE(r.batch);
      CAPTURE(r.drop_last);
      CAPTURE(shuffle);
      data::Dataset d = rows(r.n);
      DataLoader loader(d.inputs, d.targets, r.batch, shuffle, 3, r.drop_last);
      CHECK(loader.size() == int64_t(r.sizes.size()));
      CHECK(loader.num_samples() == r.n);
      std::vector<int64_t> sizes;
      for (const Batch& b : loader) {
        CHECK(b.inputs.shape() == Shape{b.targets.size(0), 2});
        sizes.push_back(b.targets.size(0));
      }
      CHECK(sizes == r.sizes);
    }
  }
}

TEST_CASE("DataLoader: without shuffle, batches are the rows in order") {
  data::Dataset d = rows(7);
  DataLoader loader(d.inputs, d.targets, 3, /*shuffle=*/false);
  const std::vector<std::vector<int64_t>> want = {{0, 1, 2}, {3, 4, 5}, {6}};
  CHECK(pass(loader) == want);
  CHECK(pass(loader) == want);
  auto it = loader.begin();
  Batch b = *++it;
  check_tensor(b.inputs, {3, 2}, DType::f32, {3, 103, 4, 104, 5, 105});
  check_tensor(b.targets, {3}, DType::i64, {3, 4, 5});
}

TEST_CASE("DataLoader: each epoch visits every row once, in a seeded order") {
  data::Dataset d = rows(103);
  DataLoader a(d.inputs, d.targets, 10, true, /*seed=*/42);
  DataLoader b(d.inputs, d.targets, 10, true, /*seed=*/42);
  DataLoader c(d.inputs, d.targets, 10, true, /*seed=*/43);
  std::vector<std::vector<int64_t>> seen;
  for (int epoch = 0; epoch < 3; ++epoch) {
    CAPTURE(epoch);
    CHECK(a.epoch() == uint64_t(epoch));
    std::vector<int64_t> order = flat(pass(a));
    // Every index exactly once.
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(103);
    for (int64_t i = 0; i < 103; ++i) all[i] = i;
    CHECK(sorted == all);
    CHECK(order != all);  // shuffled
    // The same seed gives the same order; another seed another.
    CHECK(flat(pass(b)) == order);
    CHECK(flat(pass(c)) != order);
    // The order is the one order(epoch) reports.
    CHECK(values(a.order(epoch)) == std::vector<double>(order.begin(), order.end()));
    seen.push_back(order);
  }
  // Different epochs, different orders; set_epoch goes back.
  CHECK(seen[0] != seen[1]);
  CHECK(seen[1] != seen[2]);
  a.set_epoch(1);
  CHECK(flat(pass(a)) == seen[1]);
  CHECK(a.epoch() == 2);
}

TEST_CASE("DataLoader: batches are contiguous gathers of the shuffled rows") {
  manual_seed(5);
  Tensor x = randn({23, 3, 2});
  Tensor y = randint(10, {23});
  DataLoader loader(x, y, 5, true, 7);
  Tensor order = loader.order(0);
  int64_t i = 0;
  for (const Batch& b : loader) {
    Tensor idx = slice(order, 0, i * 5, std::min<int64_t>(i * 5 + 5, 23));
    CHECK(b.inputs.is_contiguous());
    CHECK(b.targets.is_contiguous());
    CHECK(bitwise_equal(b.inputs, index_select(x, 0, idx)));
    CHECK(bitwise_equal(b.targets, index_select(y, 0, idx)));
    // And row by row, read straight from storage.
    const std::vector<double> xv = values(x), bv = values(b.inputs), ids = values(idx);
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t k = 0; k < 6; ++k) CHECK(bv[r * 6 + k] == xv[int64_t(ids[r]) * 6 + k]);
    ++i;
  }
  CHECK(i == 5);
}

TEST_CASE("DataLoader: shuffling does not touch duet's random stream") {
  data::Dataset d = rows(50);
  DataLoader loader(d.inputs, d.targets, 8, true, 1);
  manual_seed(9);
  Tensor want = randn({4});
  manual_seed(9);
  for (const Batch& b : loader) (void)b;
  CHECK(bitwise_equal(randn({4}), want));
}

TEST_CASE("DataLoader: errors") {
  data::Dataset d = rows(6);
  std::string msg = error_of<ShapeError>([&] { DataLoader(d.inputs, rows(5).targets, 2); });
  CHECK_HAS(msg, "[DataLoader] inputs have 6 rows but targets have 5");
  msg = error_of<ValueError>([&] { DataLoader(d.inputs, d.targets, 0); });
  CHECK_HAS(msg, "[DataLoader] batch_size must be > 0, got 0");
  msg = error_of<ValueError>([&] { DataLoader(d.inputs, d.targets, -3); });
  CHECK_HAS(msg, "got -3");
  msg = error_of<ShapeError>([&] { DataLoader(scalar(1.0), d.targets, 2); });
  CHECK_HAS(msg, "need a dim 0");
  msg = error_of([&] { DataLoader(Tensor(), d.targets, 2); });
  CHECK_HAS(msg, "defined");
  DataLoader loader(d.inputs, d.targets, 4);
  msg = error_of([&] { *loader.end(); });
  CHECK_HAS(msg, "not at a batch");
}

}  // namespace
}  // namespace duet::test
