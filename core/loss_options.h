// duet: options of the losses, chained as LibTorch's options:
//   cross_entropy(logits, y, CrossEntropyOptions().reduction(Reduction::Sum).ignore_index(0))
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace duet {

/// How a loss reduces its per-element values: kept as they are, averaged, or summed.
enum class Reduction { None, Mean, Sum };

/// The options of cross_entropy, with PyTorch's defaults. Each setter returns the options, and
/// the getter of the same name reads them back.
struct CrossEntropyOptions {
  /// None keeps one loss per target; Mean (the default) divides the sum by the number of
  /// targets not ignored, or with `weight` by the sum of their classes' weights; Sum adds them.
  CrossEntropyOptions& reduction(Reduction r) {
    reduction_ = r;
    return *this;
  }
  /// Targets equal to it add nothing and leave the mean (class-index targets only).
  CrossEntropyOptions& ignore_index(int64_t i) {
    ignore_index_ = i;
    return *this;
  }
  /// In [0, 1]: the target distribution becomes (1 - s) * one_hot + s / C.
  CrossEntropyOptions& label_smoothing(double s) {
    label_smoothing_ = s;
    return *this;
  }
  /// A weight per class: a 1-D floating tensor of C elements, the logits' dtype and device.
  CrossEntropyOptions& weight(Tensor w) {
    weight_ = std::move(w);
    return *this;
  }
  Reduction reduction() const { return reduction_; }
  int64_t ignore_index() const { return ignore_index_; }
  double label_smoothing() const { return label_smoothing_; }
  const Tensor& weight() const { return weight_; }

 private:
  Reduction reduction_ = Reduction::Mean;
  int64_t ignore_index_ = -100;
  double label_smoothing_ = 0.0;
  Tensor weight_;
};

}  // namespace duet
