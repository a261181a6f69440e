// duet: data loading. IDX files (the MNIST format), Fashion-MNIST from its Debian package, and a
// DataLoader that yields shuffled mini-batches.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>

#include "core/tensor.h"

namespace duet::data {

/// Reads an IDX file (http://yann.lecun.com/exdb/mnist/): bytes 0 0, a type code, the number
/// of dims, the dims as big-endian u32, then the values, big-endian, row-major. Gzipped files
/// (.gz) are decompressed on the fly; plain files are read as they are. The tensor has the
/// file's shape, and its dtype follows the type code (duet has no 8- or 16-bit dtypes):
///   0x08 u8 -> f32 (raw values 0..255)   0x09 i8 -> f32   0x0B i16 -> i32
///   0x0C i32 -> i32                      0x0D f32 -> f32  0x0E f64 -> f64
/// Errors (duet::Error naming the file): missing or unreadable file, bad magic, unknown type
/// code, truncated header or data (with the byte counts), corrupt gzip stream, and bytes after
/// the values the header declares (a file longer than its header says is rejected, since it
/// means the header is wrong).
Tensor read_idx(const std::string& path);

/// Reads a NumPy .npy file (format versions 1, 2 and 3): dtypes f4, f8, i4, i8 and b1 in either
/// byte order (f2 as f16), C or Fortran order; the tensor is contiguous, with the file's shape.
/// Other dtypes, a bad header, truncated or extra data are a duet::Error naming the file.
Tensor read_npy(const std::string& path);
/// Writes t (any device and layout) as a version 1.0 .npy file, little-endian, C order.
void write_npy(const std::string& path, const Tensor& t);

/// A supervised dataset: row i of inputs goes with row i of targets.
struct Dataset {
  Tensor inputs, targets;
};

/// Where the Debian package dataset-fashion-mnist installs the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST (60000 training or 10000 test images of 28 x 28): inputs f32 (N, 784) scaled
/// to [0, 1], targets i64 (N) in 0..9. Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
/// from `dir` (or the same names without .gz). A missing directory is an error that says to
/// install the package dataset-fashion-mnist.
Dataset load_fashion_mnist(bool train, const std::string& dir = kFashionMnistDir);

/// One mini-batch: contiguous rows of the inputs and the matching targets.
struct Batch {
  Tensor inputs, targets;
};

/// Each rank's share of a dataset of num_samples rows, as torch's DistributedSampler: every
/// epoch one order of all rows (a permutation seeded from (seed, epoch) when shuffling, the same
/// on every rank), then rank r takes rows r, r + R, r + 2R, ... of it (R = num_replicas). Every
/// rank gets num_samples() rows: without drop_last the order is padded with its own first rows
/// up to a multiple of R; with drop_last its tail is dropped down to one.
class DistributedSampler {
 public:
  /// num_replicas and rank default to dist::world_size() and dist::rank() (-1).
  explicit DistributedSampler(int64_t dataset_size, int num_replicas = -1, int rank = -1,
                              bool shuffle = true, uint64_t seed = 0, bool drop_last = false);
  /// This rank's row indices in epoch `epoch`: an i64 tensor (num_samples()).
  Tensor indices(uint64_t epoch) const;
  /// Rows per rank and epoch.
  int64_t num_samples() const { return num_samples_; }
  int num_replicas() const { return replicas_; }
  int rank() const { return rank_; }
  int64_t dataset_size() const { return dataset_size_; }

 private:
  int64_t dataset_size_, num_samples_;
  int replicas_, rank_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
};

/// Mini-batches over (inputs, targets) along dim 0, for a range-for:
///   for (auto& [x, y] : loader) ...
/// Each pass (each begin()) is one epoch: with shuffle, the order is a permutation drawn from
/// a std::mt19937_64 seeded from (seed, epoch number), so the same seed gives the same order,
/// each epoch a new one, and duet's own random stream (dropout, randn) is not touched. begin()
/// uses the current epoch number and then advances it; set_epoch() sets it.
class DataLoader {
 public:
  /// Iterates the batches of one epoch; dereferencing gathers the batch (index_select).
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Batch;

    Iterator() = default;
    Batch operator*() const;
    Iterator& operator++() {
      ++batch_;
      return *this;
    }
    /// Iterators compare by batch position.
    bool operator==(const Iterator& o) const { return batch_ == o.batch_; }

   private:
    friend class DataLoader;
    const DataLoader* loader_ = nullptr;
    Tensor order_inputs_, order_targets_;  // the epoch's order, on each tensor's device
    int64_t batch_ = 0;
  };

  /// inputs and targets must have the same size along dim 0 (at least 1-D); batch_size > 0.
  /// Without drop_last the last batch may be smaller; with it, a partial batch is dropped.
  DataLoader(Tensor inputs, Tensor targets, int64_t batch_size, bool shuffle = true,
             uint64_t seed = 0, bool drop_last = false);
  /// This rank's share of the rows, in the sampler's order (its shuffle and seed); every rank
  /// gets the same number of batches.
  DataLoader(Tensor inputs, Tensor targets, int64_t batch_size, DistributedSampler sampler,
             bool drop_last = false);

  /// The first batch of the next epoch (draws its order, then advances the epoch number).
  Iterator begin();
  Iterator end() const;
  /// Batches per epoch.
  int64_t size() const;
  /// Rows in the dataset.
  int64_t num_samples() const { return num_samples_; }
  int64_t batch_size() const { return batch_size_; }
  /// Sets the epoch number the next begin() uses.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  /// The epoch number the next begin() will use.
  uint64_t epoch() const { return epoch_; }
  /// The row order of an epoch: an i64 tensor (N), arange(N) without shuffle.
  Tensor order(uint64_t epoch) const;

 private:
  Tensor inputs_, targets_;
  int64_t batch_size_, num_samples_;
  bool shuffle_, drop_last_;
  uint64_t seed_, epoch_ = 0;
  std::optional<DistributedSampler> sampler_;
};

}  // namespace duet::data
