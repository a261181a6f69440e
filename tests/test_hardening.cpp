// Reproducers of misuse that once crashed, hung or gave a wrong answer with no error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "nn/data.h"
#include "util.h"

namespace duet::test {
namespace {

// A path in the temporary directory, removed when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& stem)
      : path((std::filesystem::temp_directory_path() /
              fmt::format("duet_test_hardening_{}_{}", ::getpid(), stem))
                 .string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// ---- 1. Checked size arithmetic ----

TEST_CASE("hardening: conv2d, unfold, fold and pooling sizes that overflow int64 are errors") {
  const Tensor x = zeros({1, 1, 4, 4});
  const Tensor w = zeros({1, 1, 3, 3});
  // 4 + 2 * 2^62 wraps: the padded size must be computed with a checked add.
  std::string msg = error_of<ValueError>([&] { conv2d(x, w, Tensor(), 1, int64_t(1) << 62); });
  CHECK(starts_with(msg, "[conv2d]"));
  CHECK(contains(msg, "(1, 1, 4, 4)"));
  msg = error_of<ValueError>([&] { unfold(x, 3, 1, int64_t(1) << 62); });
  CHECK(starts_with(msg, "[unfold]"));
  // A kernel of 2^32 x 2^32 has 2^64 elements per window.
  msg = error_of<ValueError>([&] { unfold(x, int64_t(1) << 32, 1, int64_t(1) << 32); });
  CHECK(starts_with(msg, "[unfold]"));
  // 2^40 x 2^40 output positions.
  msg = error_of<ValueError>([&] {
    fold(zeros({1, 1, 1}), int64_t(1) << 40, int64_t(1) << 40, 1, 1, 0);
  });
  CHECK(starts_with(msg, "[fold]"));
  msg = error_of<ValueError>([&] { nn::Conv2d(1, 1, 3, 1, int64_t(1) << 62).forward(x); });
  CHECK(starts_with(msg, "[conv2d]"));
  // Sizes that fit still work; a huge stride is legal (one window).
  CHECK(conv2d(x, w, Tensor(), 1, 1).sizes() == Shape{1, 1, 4, 4});
  CHECK(max_pool2d(x, 2, std::numeric_limits<int64_t>::max()).sizes() == Shape{1, 1, 1, 1});
}

// An IDX file: u8 data, the given dims, and `data_bytes` zero bytes of data.
void write_idx(const std::string& path, const std::vector<uint32_t>& dims, size_t data_bytes) {
  std::vector<unsigned char> b = {0, 0, 0x08, static_cast<unsigned char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  b.resize(b.size() + data_bytes, 0);
  write_bytes(path, b);
}

TEST_CASE("hardening: an IDX header whose dims overflow the strides is an error naming read_idx") {
  TempFile file("overflow.idx");
  // numel is 0, but the strides (size-0 dims taken as 1) are 2 * 2^31 * 2^31 elements.
  write_idx(file.path, {2, 0, 1u << 31, 1u << 31}, 0);
  std::string msg = error_of<ValueError>([&] { data::read_idx(file.path); });
  CHECK(starts_with(msg, "[read_idx]"));
  CHECK(contains(msg, file.path));
  CHECK(contains(msg, "(2, 0, 2147483648, 2147483648)"));
  // A rank above the maximum rank.
  write_idx(file.path, std::vector<uint32_t>(100, 1), 1);
  msg = error_of<ValueError>([&] { data::read_idx(file.path); });
  CHECK(starts_with(msg, "[read_idx]"));
  CHECK(contains(msg, "rank 100"));
  // A good one still loads.
  write_idx(file.path, {2, 3}, 6);
  CHECK(data::read_idx(file.path).sizes() == Shape{2, 3});
}

TEST_CASE("hardening: SymInt arithmetic that overflows int64 is a ValueError") {
  const SymInt big = int64_t(1) << 62;
  CHECK(starts_with(error_of<ValueError>([&] { (void)(big * 4); }), "[SymInt]"));
  CHECK(starts_with(error_of<ValueError>([&] { (void)(big + big); }), "[SymInt]"));
  const SymInt s = SymInt::symbol(0) * big;
  CHECK(starts_with(error_of<ValueError>([&] { (void)(s * 4); }), "[SymInt]"));
  CHECK(starts_with(error_of<ValueError>([&] { (void)(s + s); }), "[SymInt]"));
}

// ---- 2. The maximum rank ----

TEST_CASE("hardening: ranks above the maximum are errors at the door, and permutations are exact") {
  Shape s100;
  for (int i = 0; i < 100; ++i) s100.push_back(1);
  std::string msg = error_of<ValueError>([&] { transpose(ones(s100), 0, 99); });
  CHECK(starts_with(msg, "[full]"));
  CHECK(contains(msg, "rank 100"));
  CHECK(contains(msg, "64"));
  msg = error_of<ValueError>([&] { reshape(ones({1}), s100); });
  CHECK(starts_with(msg, "[reshape]"));
  CHECK(contains(msg, "rank 100"));
  CHECK(contains(error_of<ValueError>([&] { detail::empty(s100, DType::f32); }), "rank 100"));
  // Rank 64, the maximum, works, and a permutation check covers every dim.
  Shape s64;
  for (int i = 0; i < 64; ++i) s64.push_back(1);
  s64[0] = 2;
  s64[63] = 3;
  Tensor x = ones(s64);
  Tensor t = transpose(x, 0, 63);
  CHECK(t.sizes()[0] == 3);
  CHECK(t.sizes()[63] == 2);
  std::vector<int64_t> order(64);
  for (int i = 0; i < 64; ++i) order[i] = 63 - i;
  CHECK(permute(x, Dims(order)).sizes()[0] == 3);
  order[0] = 62;  // 62 twice, 63 missing
  CHECK(starts_with(error_of<ValueError>([&] { permute(x, Dims(order)); }), "[permute]"));
}

// ---- 3. Integer matmul and sums wrap as two's complement ----

TEST_CASE("hardening: integer matmul and sums wrap around, as in PyTorch") {
  // Several shapes, so that both Eigen's vectorized and scalar loops are covered.
  for (auto [m, k, n] : {std::tuple{1, 3, 1}, std::tuple{2, 2, 2}, std::tuple{3, 5, 7}}) {
    std::vector<double> av(m * k), bv(k * n);
    for (int i = 0; i < m * k; ++i) av[i] = (i % 2 ? -1.0 : 1.0) * (2000000000.0 - 12345.0 * i);
    for (int i = 0; i < k * n; ++i) bv[i] = 3.0 + 7.0 * i;
    for (DType d : {DType::i32, DType::i64}) {
      CAPTURE(m);
      CAPTURE(d);
      std::vector<double> a64 = av, b64 = bv;
      if (d == DType::i64)  // products beyond 2^63
        for (double& v : a64) v *= 4e9;
      const Tensor a = tensor(a64, Shape{m, k}, Options().dtype(d));
      const Tensor b = tensor(b64, Shape{k, n}, Options().dtype(d));
      const Tensor c = matmul(a, b);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          if (d == DType::i32) {
            uint32_t acc = 0;
            for (int p = 0; p < k; ++p)
              acc += static_cast<uint32_t>(static_cast<int32_t>(a64[i * k + p])) *
                     static_cast<uint32_t>(static_cast<int32_t>(b64[p * n + j]));
            CHECK(c.data_ptr<int32_t>()[i * n + j] == static_cast<int32_t>(acc));
          } else {
            uint64_t acc = 0;
            for (int p = 0; p < k; ++p)
              acc += static_cast<uint64_t>(static_cast<int64_t>(a64[i * k + p])) *
                     static_cast<uint64_t>(static_cast<int64_t>(b64[p * n + j]));
            CHECK(c.data_ptr<int64_t>()[i * n + j] == static_cast<int64_t>(acc));
          }
        }
    }
  }
  // Sums of integers wrap too (i32 sums accumulate in i64).
  const int64_t big = std::numeric_limits<int64_t>::max();
  Tensor x = full({4}, big, Options().dtype(DType::i64));
  CHECK(sum(x).item<int64_t>() == static_cast<int64_t>(4 * static_cast<uint64_t>(big)));
  Tensor y = full({3, 5}, big, Options().dtype(DType::i64));
  CHECK(sum(y, 1).to_vector<int64_t>()[0] == static_cast<int64_t>(5 * static_cast<uint64_t>(big)));
  CHECK(sum(y, 0).to_vector<int64_t>()[0] == static_cast<int64_t>(3 * static_cast<uint64_t>(big)));
}

// ---- 4. File readers: non-regular files, headers first, bounded reads ----

TEST_CASE("hardening: loading a state dict from /dev/zero or /dev/urandom is a quick error") {
  nn::Linear net(2, 3);
  for (const char* path : {"/dev/zero", "/dev/urandom"}) {
    CAPTURE(path);
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg = error_of<ValueError>([&] { net.load(path); });
    CHECK(starts_with(msg, "[load]"));
    CHECK(contains(msg, path));
    CHECK(contains(msg, "regular file"));
    msg = error_of<ValueError>([&] { nn::read_state_dict(path); });
    CHECK(contains(msg, path));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
}

TEST_CASE("hardening: IDX reader refuses non-regular files") {
  for (const char* path : {"/dev/zero", "/dev/urandom"}) {
    CAPTURE(path);
    std::string msg = error_of<ValueError>([&] { data::read_idx(path); });
    CHECK(starts_with(msg, "[read_idx]"));
    CHECK(contains(msg, path));
    CHECK(contains(msg, "regular file"));
  }
}

// While it lives, opens `fifo` for writing once a reader has waited 5 s, and again every 50 ms:
// a reader that blocks opening the FIFO (the bug) then reads an empty file and fails its check,
// instead of hanging the test.
struct FifoWriter {
  std::string fifo;
  std::atomic<bool> done{false};
  std::thread thread;
  explicit FifoWriter(std::string path)
      : fifo(std::move(path)), thread([this] {
          for (int k = 0; k < 100 && !done; ++k)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          while (!done) {
            const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // fails with no reader
            if (fd >= 0) ::close(fd);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        }) {}
  ~FifoWriter() {
    done = true;
    thread.join();
  }
};

// /dev/zero was read until bad_alloc, and a FIFO blocked the reader forever.
TEST_CASE("hardening: program, .npy and state dict readers refuse devices, FIFOs, directories") {
  TempFile fifo("fifo");
  REQUIRE(::mkfifo(fifo.path.c_str(), 0600) == 0);
  FifoWriter writer(fifo.path);
  const std::string dir = std::filesystem::temp_directory_path().string();
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& path :
       {std::string("/dev/zero"), std::string("/dev/urandom"), fifo.path}) {
    CAPTURE(path);
    std::string msg = error_of<ValueError>([&] { load(path); });
    CHECK(starts_with(msg, "[load] cannot read " + path + ": it is not a regular file"));
    CHECK(contains(msg, "expected a duet program file"));
    msg = error_of<ValueError>([&] { data::read_npy(path); });
    CHECK(starts_with(msg, "[read_npy] cannot read " + path + ": it is not a regular file"));
    msg = error_of<ValueError>([&] { nn::read_state_dict(path); });
    CHECK(contains(msg, "not a regular file"));
  }
  CHECK(contains(error_of<ValueError>([&] { load(dir); }), "it is a directory"));
  CHECK(contains(error_of<ValueError>([&] { data::read_npy(dir); }), "it is a directory"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

uint32_t crc32_of(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}
template <class T>
void put(std::vector<unsigned char>& b, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    b.push_back(static_cast<unsigned char>(uint64_t(v) >> (8 * i)));
}

TEST_CASE("hardening: truncated state dicts and headers that claim huge tensors are errors") {
  TempFile file("state.duet");
  nn::Linear net(2, 3);
  net.save(file.path);
  const std::vector<unsigned char> good = read_bytes(file.path);
  // Truncated anywhere: in the header, in the entries.
  for (size_t keep : {size_t(0), size_t(5), size_t(20), good.size() / 2, good.size() - 1}) {
    CAPTURE(keep);
    write_bytes(file.path, std::vector<unsigned char>(good.begin(), good.begin() + keep));
    std::string msg = error_of<ValueError>([&] { net.load(file.path); });
    CHECK(starts_with(msg, "[load]"));
    CHECK(contains(msg, file.path));
  }
  // A well-formed file (right size, right checksum) whose one entry claims 2^60 elements.
  std::vector<unsigned char> b(good.begin(), good.begin() + 12);  // magic, version
  std::vector<unsigned char> body;
  put<uint64_t>(body, 1);  // one entry
  put<uint32_t>(body, 1);
  body.push_back('w');
  body.push_back(1);  // f32
  put<uint32_t>(body, 2);
  put<int64_t>(body, int64_t(1) << 40);
  put<int64_t>(body, int64_t(1) << 20);
  put<float>(body, 0);
  put<uint64_t>(b, b.size() + 8 + body.size() + 4);
  b.insert(b.end(), body.begin(), body.end());
  put<uint32_t>(b, crc32_of(b.data(), b.size()));
  write_bytes(file.path, b);
  std::string msg = error_of<ValueError>([&] { nn::read_state_dict(file.path); });
  CHECK(starts_with(msg, "[load]"));
  CHECK(contains(msg, "corrupt"));
  // A header that claims a file size far beyond the real one.
  std::vector<unsigned char> h(good.begin(), good.end());
  for (int i = 0; i < 8; ++i) h[12 + i] = 0xFF >> (i == 7 ? 1 : 0);
  write_bytes(file.path, h);
  msg = error_of<ValueError>([&] { nn::read_state_dict(file.path); });
  CHECK(starts_with(msg, "[load]"));
  CHECK(contains(msg, "truncated"));
  // The good file still loads.
  write_bytes(file.path, good);
  net.load(file.path);
}

// ---- 5. Tensors that escaped a trace ----

TEST_CASE("hardening: serializing or reading a tensor that escaped its trace is a typed error") {
  Tensor leak;
  auto f = compile([&](Tensor x) {
    leak = x * 2;
    return x + 1;
  });
  f(ones({2}));
  REQUIRE(leak.defined());
  TempFile file("escaped.duet");
  std::string msg = error_of([&] { nn::write_state_dict({{"w", leak}}, file.path); });
  CHECK(starts_with(msg, "[write_state_dict]"));
  CHECK(contains(msg, "used after that trace ended"));
  msg = error_of([&] { (void)leak.raw_data(); });
  CHECK(starts_with(msg, "[raw_data]"));
  CHECK(contains(msg, "used after that trace ended"));
  CHECK(contains(error_of([&] { leak.to_vector<float>(); }), "used after that trace ended"));
  CHECK(contains(error_of([&] { sum(leak).item<float>(); }), "used after that trace ended"));
}

// ---- 6. Scalars out of the dtype's range ----

TEST_CASE("hardening: creation functions refuse values that do not fit the dtype") {
  const Options i32 = Options().dtype(DType::i32), i64 = Options().dtype(DType::i64);
  // The message, then the line that called full (core/call_site.h). The call stays outside a
  // macro: inside one, clang's source_location names the macro's last line.
  const int line = __LINE__ + 1;
  const std::string err = error_of<ValueError>([&] { full({1}, int64_t(1) << 40, i32); });
  CHECK(err ==
        fmt::format("[full] value 1099511627776 does not fit in i32 (at test_hardening.cpp:{})",
                    line));
  CHECK(starts_with(error_of<ValueError>([&] { full({1}, 1e20, i32); }), "[full] value 1e+20"));
  CHECK(contains(error_of<ValueError>([&] { full({1}, NAN, i64); }), "does not fit in i64"));
  CHECK(contains(error_of<ValueError>([&] { full({1}, -INFINITY, i32); }), "does not fit in i32"));
  CHECK(
      contains(error_of<ValueError>([&] { full({1}, 1e300, Options()); }), "does not fit in f32"));
  CHECK(contains(error_of<ValueError>([&] { scalar(int64_t(1) << 31, i32); }), "[full]"));
  std::string msg = error_of<ValueError>([&] { tensor({9.3e18}, i64); });
  CHECK(starts_with(msg, "[tensor]"));
  CHECK(contains(msg, "does not fit in i64"));
  CHECK(starts_with(error_of<ValueError>([&] { tensor({1, 2, 3e9}, i32); }), "[tensor]"));
  CHECK(starts_with(error_of<ValueError>([&] { tensor({NAN}, i32); }), "[tensor]"));
  // Values at the edges fit.
  CHECK(full({1}, std::numeric_limits<int32_t>::min(), i32).item<int32_t>() == INT32_MIN);
  CHECK(full({1}, std::numeric_limits<int64_t>::max(), i64).item<int64_t>() == INT64_MAX);
  CHECK(full({1}, -2147483648.0, i32).item<int32_t>() == INT32_MIN);
  CHECK(full({1}, 2.5, i32).item<int32_t>() == 2);
  CHECK(tensor({-9.2e18}, i64).item<int64_t>() == int64_t(-9.2e18));
  CHECK(std::isinf(full({1}, INFINITY).item<float>()));
  CHECK(std::isnan(tensor({NAN}).item<float>()));
}

TEST_CASE("hardening: arange refuses a length whose values do not fit the dtype") {
  std::string msg =
      error_of<ValueError>([&] { arange(int64_t(1) << 32, Options().dtype(DType::i32)); });
  CHECK(starts_with(msg, "[arange]"));
  CHECK(contains(msg, "i32"));
  CHECK(arange(5, Options().dtype(DType::i32)).to_vector<int32_t>()[4] == 4);
}

TEST_CASE("hardening: arithmetic with an integer scalar outside an integer tensor's range") {
  const Tensor a = tensor({1, 2}, Options().dtype(DType::i32));
  const int64_t big = int64_t(1) << 40;
  const int line = __LINE__ + 1;
  const std::string err = error_of<ValueError>([&] { a + big; });
  CHECK(err ==
        fmt::format("[add] value 1099511627776 does not fit in i32 (at test_hardening.cpp:{})",
                    line));
  CHECK(starts_with(error_of<ValueError>([&] { big* a; }), "[mul]"));
  CHECK(starts_with(error_of<ValueError>([&] { maximum(a, -big); }), "[maximum]"));
  CHECK(starts_with(error_of<ValueError>([&] { Tensor(a.clone()).add_(big); }), "[add]"));
  CHECK(starts_with(error_of<ValueError>([&] { where(a > 1, a, big); }), "[where]"));
  // In range, or promoted to a wider dtype: no error.
  CHECK((a + int64_t(INT32_MAX)).dtype() == DType::i32);
  CHECK((a / big).dtype() == DType::f32);
  CHECK((a + 1e20).dtype() == DType::f32);
  CHECK((tensor({1}, Options().dtype(DType::i64)) + big).item<int64_t>() == big + 1);
  // clamp with bounds beyond the dtype's range clamps nothing on that side.
  CHECK(clamp(a, -big, big).to_vector<int32_t>() == std::vector<int32_t>{1, 2});
}

TEST_CASE("hardening: comparisons with a scalar outside the tensor's range are exact") {
  const Tensor z = tensor({0, -1, 5}, Options().dtype(DType::i32));
  const int64_t big = int64_t(1) << 32;
  auto v = [](const Tensor& t) { return t.to_vector<bool>(); };
  using B = std::vector<bool>;
  CHECK(v(eq(z, big)) == B{false, false, false});
  CHECK(v(ne(z, big)) == B{true, true, true});
  CHECK(v(lt(z, big)) == B{true, true, true});
  CHECK(v(le(z, big)) == B{true, true, true});
  CHECK(v(gt(z, big)) == B{false, false, false});
  CHECK(v(ge(z, -big)) == B{true, true, true});
  CHECK(v(lt(z, -big)) == B{false, false, false});
  CHECK(v(eq(big, z)) == B{false, false, false});
  CHECK(v(gt(big, z)) == B{true, true, true});
  CHECK(v(z == big) == B{false, false, false});
  CHECK(v(z < big) == B{true, true, true});
  CHECK(v(eq(z, 5)) == B{false, false, true});
  CHECK(v(lt(z, 1e20)) == B{true, true, true});
}

// ---- 7. set_grad ----

TEST_CASE("hardening: set_grad with the wrong dtype is a DTypeError") {
  Tensor x = zeros({2}).requires_grad_();
  std::string msg =
      error_of<DTypeError>([&] { x.set_grad(zeros({2}, Options().dtype(DType::f64))); });
  CHECK(starts_with(msg, "[set_grad]"));
  CHECK(contains(msg, "f64"));
  CHECK(starts_with(error_of<ShapeError>([&] { x.set_grad(zeros({3})); }), "[set_grad]"));
}

}  // namespace
}  // namespace duet::test
