// duet: IDX files through zlib, Fashion-MNIST, and the DataLoader.
#include "nn/data.h"

#include "core/dist.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "core/check_shape.h"
#include "core/ops.h"

namespace duet::data {
namespace {

namespace fs = std::filesystem;

// ---- IDX ----

/// An IDX element type: its code, its size in the file, the dtype it is read into.
struct IdxType {
  uint8_t code;
  int bytes;
  DType dtype;
  const char* name;
};
constexpr IdxType kIdxTypes[] = {
    {0x08, 1, DType::f32, "u8"},  {0x09, 1, DType::f32, "i8"},  {0x0B, 2, DType::i32, "i16"},
    {0x0C, 4, DType::i32, "i32"}, {0x0D, 4, DType::f32, "f32"}, {0x0E, 8, DType::f64, "f64"},
};

/// A gzFile that closes itself. gzread reads plain files as they are, so one reader serves both.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    DUET_CHECK(fs::exists(path), "[read_idx] {}: no such file", path);
    DUET_CHECK(!fs::is_directory(path), "[read_idx] {}: is a directory, expected an IDX file",
               path);
    // Only a regular file: a device (/dev/zero, /dev/urandom) never ends, and opening a pipe
    // blocks.
    DUET_CHECK_VALUE(fs::is_regular_file(path),
                     "[read_idx] {}: is not a regular file (a device, pipe or socket), expected "
                     "an IDX file",
                     path);
    size_ = fs::file_size(path);
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    DUET_CHECK(f_, "[read_idx] {}: cannot open ({})", path,
               errno ? std::strerror(errno) : "out of memory");
  }
  ~GzReader() { gzclose(f_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads up to n bytes into p and returns how many it read: fewer only at the end of the
  /// data. A corrupt gzip stream is an error; a gzip stream that ends early counts as the end
  /// of the data, and ended_early() says so.
  size_t read(void* p, size_t n, const char* what) {
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, size_t{1} << 30));
      const int r = gzread(f_, static_cast<char*>(p) + got, chunk);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    int err = Z_OK;
    const char* msg = gzerror(f_, &err);
    if (err == Z_BUF_ERROR) {
      ended_early_ = true;
    } else if (err == Z_ERRNO) {
      throw Error(fmt::format("[read_idx] {}: read error in the {} ({})", path_, what,
                              std::strerror(errno)));
    } else if (err != Z_OK && err != Z_STREAM_END) {
      // gzerror's message starts with the path, which the error names already.
      std::string why = msg;
      if (why.rfind(path_ + ": ", 0) == 0) why = why.substr(path_.size() + 2);
      throw Error(fmt::format("[read_idx] {}: corrupt gzip stream ({}), found while reading the {}",
                              path_, why, what));
    }
    return got;
  }
  /// Reads exactly n bytes, or throws: "truncated <what>: expected n bytes, read m".
  void read_exact(void* p, size_t n, const char* what) {
    const size_t got = read(p, n, what);
    DUET_CHECK(got == n, "[read_idx] {}: truncated {}: expected {} bytes, read {}{}", path_, what,
               n, got, ended_early_ ? " (the gzip stream ends early)" : "");
  }
  /// True once a gzip stream ended before its trailer (a truncated .gz file).
  bool ended_early() const { return ended_early_; }
  /// The bytes a plain file holds after `offset`, from its size; nullopt for a compressed one
  /// (whose data is read in chunks, so that memory grows only with what it really holds).
  std::optional<uint64_t> left_after(uint64_t offset) {
    if (!gzdirect(f_)) return std::nullopt;
    return size_ > offset ? size_ - offset : 0;
  }

 private:
  std::string path_;
  uint64_t size_ = 0;
  gzFile f_ = nullptr;
  bool ended_early_ = false;
};

uint32_t load_be32(const unsigned char* b) {
  return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
}
uint64_t load_be64(const unsigned char* b) {
  return uint64_t{load_be32(b)} << 32 | load_be32(b + 4);
}

/// Converts n big-endian elements of type `t` from raw bytes into the tensor's dtype.
void decode(const IdxType& t, const unsigned char* in, int64_t n, const Tensor& out) {
  switch (t.code) {
    case 0x08: {
      float* o = out.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(in[i]);
      break;
    }
    case 0x09: {
      float* o = out.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(static_cast<int8_t>(in[i]));
      break;
    }
    case 0x0B: {
      int32_t* o = out.data_ptr<int32_t>();
      for (int64_t i = 0; i < n; ++i)
        o[i] = static_cast<int16_t>(static_cast<uint16_t>(in[2 * i] << 8 | in[2 * i + 1]));
      break;
    }
    case 0x0C: {
      int32_t* o = out.data_ptr<int32_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int32_t>(load_be32(in + 4 * i));
      break;
    }
    case 0x0D: {
      float* o = out.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(load_be32(in + 4 * i));
      break;
    }
    case 0x0E: {
      double* o = out.data_ptr<double>();
      for (int64_t i = 0; i < n; ++i) o[i] = std::bit_cast<double>(load_be64(in + 8 * i));
      break;
    }
  }
}

struct IdxFile {
  Tensor values;
  const IdxType* type;
};

IdxFile read_idx_file(const std::string& path) {
  GzReader in(path);
  unsigned char magic[4];
  in.read_exact(magic, 4, "header (magic number)");
  DUET_CHECK(magic[0] == 0 && magic[1] == 0,
             "[read_idx] {}: bad magic number {:02x} {:02x} {:02x} {:02x}: an IDX file starts "
             "with two zero bytes, a type code and the number of dims",
             path, magic[0], magic[1], magic[2], magic[3]);
  const IdxType* type = nullptr;
  for (const IdxType& t : kIdxTypes)
    if (t.code == magic[2]) type = &t;
  DUET_CHECK(type,
             "[read_idx] {}: unsupported type code 0x{:02x}: expected 0x08 (u8), 0x09 (i8), "
             "0x0B (i16), 0x0C (i32), 0x0D (f32) or 0x0E (f64)",
             path, magic[2]);
  const int ndims = magic[3];
  DUET_CHECK_VALUE(ndims <= duet::detail::kMaxRank,
                   "[read_idx] {}: the header declares a tensor of rank {}, above the maximum "
                   "rank {}",
                   path, ndims, duet::detail::kMaxRank);
  std::vector<unsigned char> dim_bytes(4 * ndims);
  in.read_exact(dim_bytes.data(), dim_bytes.size(), "header (dims)");
  std::vector<int64_t> dims(ndims);
  // The elements, and the span of the strides (size-0 dims taken as 1) in bytes of the dtype
  // read into: both checked (Note [Checked sizes] in core/types.cpp).
  int64_t numel = 1, span = itemsize(type->dtype);
  bool fits = true;
  for (int i = 0; i < ndims; ++i) {
    dims[i] = load_be32(&dim_bytes[4 * i]);
    fits = fits && !__builtin_mul_overflow(numel, dims[i], &numel) &&
           !__builtin_mul_overflow(span, std::max<int64_t>(dims[i], 1), &span);
  }
  const Shape shape(dims);
  DUET_CHECK_VALUE(fits && numel <= (int64_t{1} << 56),
                   "[read_idx] {}: the dims in the header {} describe an impossibly large tensor",
                   path, shape.str());

  // The data is read in chunks into a buffer that grows with what the file really holds, so a
  // corrupt header that declares a huge tensor gives a "truncated data" error, not a huge
  // allocation.
  const size_t want = static_cast<size_t>(numel) * type->bytes;
  // A plain file's size bounds the data before anything is allocated.
  const std::optional<uint64_t> left = in.left_after(4 + dim_bytes.size());
  DUET_CHECK(!left || want <= *left,
             "[read_idx] {}: truncated data: the header declares {} {} values of shape {}, "
             "expected {} bytes, read {}",
             path, numel, type->name, shape.str(), want, left.value_or(0));
  std::vector<unsigned char> raw;
  const size_t chunk = size_t{1} << 26;
  while (raw.size() < want) {
    const size_t start = raw.size();
    const size_t n = std::min(chunk, want - start);
    raw.resize(start + n);
    const size_t got = in.read(raw.data() + start, n, "data");
    raw.resize(start + got);
    if (got < n) break;
  }
  DUET_CHECK(raw.size() == want,
             "[read_idx] {}: truncated data: the header declares {} {} values of shape {}, "
             "expected {} bytes, read {}{}",
             path, numel, type->name, shape.str(), want, raw.size(),
             in.ended_early() ? " (the gzip stream ends early)" : "");
  // Anything after the values means the header does not describe the file: rejected. (Reading
  // on also makes zlib check the gzip trailer's CRC.)
  unsigned char extra[4096];
  size_t trailing = 0;
  for (size_t got; (got = in.read(extra, sizeof extra, "data")) > 0;) trailing += got;
  DUET_CHECK(trailing == 0,
             "[read_idx] {}: {} bytes follow the {} bytes of data that the header declares ({} {} "
             "values of shape {}); expected the end of the file",
             path, trailing, want, numel, type->name, shape.str());

  Tensor out = duet::detail::empty(shape, type->dtype);
  decode(*type, raw.data(), numel, out);
  return {out, type};
}

}  // namespace

Tensor read_idx(const std::string& path) { return read_idx_file(path).values; }

// ---- Fashion-MNIST ----

Dataset load_fashion_mnist(bool train, const std::string& dir) {
  DUET_CHECK(fs::is_directory(dir),
             "[load_fashion_mnist] directory {} not found: install the Debian package "
             "dataset-fashion-mnist (apt install dataset-fashion-mnist), or pass the directory "
             "that holds {{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte.gz",
             dir);
  const std::string prefix = train ? "train" : "t10k";
  auto file = [&](const std::string& name) {
    const fs::path plain = fs::path(dir) / name, gz = fs::path(dir) / (name + ".gz");
    if (fs::exists(gz)) return gz.string();
    DUET_CHECK(fs::exists(plain), "[load_fashion_mnist] {} holds neither {}.gz nor {}", dir, name,
               name);
    return plain.string();
  };
  const std::string images_path = file(prefix + "-images-idx3-ubyte");
  const std::string labels_path = file(prefix + "-labels-idx1-ubyte");
  IdxFile images = read_idx_file(images_path);
  IdxFile labels = read_idx_file(labels_path);
  const Shape is = images.values.shape(), ls = labels.values.shape();
  DUET_CHECK(images.type->code == 0x08 && is.size() == 3 && is[1] == 28 && is[2] == 28,
             "[load_fashion_mnist] {}: expected u8 images of shape (N, 28, 28), got {} values of "
             "shape {}",
             images_path, images.type->name, is.str());
  DUET_CHECK(labels.type->code == 0x08 && ls.size() == 1,
             "[load_fashion_mnist] {}: expected u8 labels of shape (N), got {} values of shape {}",
             labels_path, labels.type->name, ls.str());
  DUET_CHECK(is[0] == ls[0], "[load_fashion_mnist] {} holds {} images but {} holds {} labels",
             images_path, is[0], labels_path, ls[0]);
  const float* l = labels.values.data_ptr<float>();
  for (int64_t i = 0; i < ls[0]; ++i)
    DUET_CHECK(l[i] <= 9, "[load_fashion_mnist] {}: label {} is {}, expected 0..9", labels_path, i,
               l[i]);

  Tensor inputs = reshape(images.values, {is[0], 28 * 28});
  inputs.div_(255.0);
  return {inputs, labels.values.to(DType::i64)};
}

// ---- DataLoader ----

DataLoader::DataLoader(Tensor inputs, Tensor targets, int64_t batch_size, bool shuffle,
                       uint64_t seed, bool drop_last)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      batch_size_(batch_size),
      num_samples_(0),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  DUET_CHECK(inputs_.defined() && targets_.defined(),
             "[DataLoader] inputs and targets must be defined tensors");
  DUET_CHECK_SHAPE(inputs_.dim() >= 1 && targets_.dim() >= 1,
                   "[DataLoader] inputs and targets need a dim 0 to batch along, got shapes {} "
                   "and {}",
                   inputs_.shape().str(), targets_.shape().str());
  DUET_CHECK_SHAPE(inputs_.size(0) == targets_.size(0),
                   "[DataLoader] inputs have {} rows but targets have {} (shapes {} and {})",
                   inputs_.size(0), targets_.size(0), inputs_.shape().str(),
                   targets_.shape().str());
  DUET_CHECK_VALUE(batch_size > 0, "[DataLoader] batch_size must be > 0, got {}", batch_size);
  num_samples_ = inputs_.size(0);
}

int64_t DataLoader::size() const {
  return drop_last_ ? num_samples_ / batch_size_ : (num_samples_ + batch_size_ - 1) / batch_size_;
}

namespace {
// 0, ..., n - 1, shuffled by a generator seeded from (seed, epoch) when `shuffle`.
Tensor epoch_order(int64_t n, bool shuffle, uint64_t seed_, uint64_t epoch) {
  const int64_t num_samples_ = n;
  Tensor perm = duet::detail::empty(Shape{num_samples_}, DType::i64);
  int64_t* p = perm.data_ptr<int64_t>();
  std::iota(p, p + num_samples_, int64_t{0});
  if (!shuffle) return perm;
  // A generator of the loader's own, seeded from (seed, epoch) through seed_seq (whose output
  // the standard specifies), and an unbiased Fisher-Yates shuffle written out rather than
  // std::shuffle, whose draws differ between standard libraries: the same seed gives the same
  // order everywhere.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32)};
  std::mt19937_64 gen(seq);
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    // Uniform in [0, i] by rejection: drop the 2^64 mod (i + 1) lowest draws.
    const uint64_t n = static_cast<uint64_t>(i) + 1;
    const uint64_t threshold = (0 - n) % n;
    uint64_t r = gen();
    while (r < threshold) r = gen();
    std::swap(p[i], p[r % n]);
  }
  return perm;
}
}  // namespace

Tensor DataLoader::order(uint64_t epoch) const {
  if (sampler_) return sampler_->indices(epoch);
  return epoch_order(num_samples_, shuffle_, seed_, epoch);
}

DataLoader::DataLoader(Tensor inputs, Tensor targets, int64_t batch_size,
                       DistributedSampler sampler, bool drop_last)
    : DataLoader(std::move(inputs), std::move(targets), batch_size, false, 0, drop_last) {
  DUET_CHECK_VALUE(sampler.dataset_size() == num_samples_,
                   "[DataLoader] the sampler covers {} rows, the dataset has {}",
                   sampler.dataset_size(), num_samples_);
  num_samples_ = sampler.num_samples();
  sampler_ = std::move(sampler);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_samples_(0),
      replicas_(num_replicas < 0 ? dist::world_size() : num_replicas),
      rank_(rank < 0 ? dist::rank() : rank),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  DUET_CHECK_VALUE(dataset_size >= 0, "[DistributedSampler] dataset_size {} is negative",
                   dataset_size);
  DUET_CHECK_VALUE(replicas_ >= 1 && rank_ >= 0 && rank_ < replicas_,
                   "[DistributedSampler] rank {} is not in [0, {}) (num_replicas)", rank_,
                   replicas_);
  num_samples_ = drop_last ? dataset_size / replicas_ : (dataset_size + replicas_ - 1) / replicas_;
}

Tensor DistributedSampler::indices(uint64_t epoch) const {
  const Tensor all = epoch_order(dataset_size_, shuffle_, seed_, epoch);
  const int64_t* a = all.data_ptr<int64_t>();
  Tensor mine = duet::detail::empty(Shape{num_samples_}, DType::i64);
  int64_t* m = mine.data_ptr<int64_t>();
  // Position k of the padded (or cut) order is a[k % dataset_size_] (torch repeats the head).
  for (int64_t j = 0; j < num_samples_; ++j) {
    const int64_t k = rank_ + j * replicas_;
    m[j] = a[k % dataset_size_];
  }
  return mine;
}

DataLoader::Iterator DataLoader::begin() {
  Iterator it;
  it.loader_ = this;
  Tensor o = order(epoch_++);
  it.order_inputs_ = o.to(inputs_.device());
  it.order_targets_ = o.to(targets_.device());
  return it;
}

DataLoader::Iterator DataLoader::end() const {
  Iterator it;
  it.loader_ = this;
  it.batch_ = size();
  return it;
}

Batch DataLoader::Iterator::operator*() const {
  DUET_CHECK(loader_ && order_inputs_.defined() && batch_ < loader_->size(),
             "[DataLoader] dereferenced an iterator that is not at a batch (batch {} of {})",
             batch_, loader_ ? loader_->size() : 0);
  const int64_t start = batch_ * loader_->batch_size_;
  const int64_t stop = std::min(start + loader_->batch_size_, loader_->num_samples_);
  return {index_select(loader_->inputs_, 0, slice(order_inputs_, 0, start, stop)),
          index_select(loader_->targets_, 0, slice(order_targets_, 0, start, stop))};
}

}  // namespace duet::data
