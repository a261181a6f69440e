// duet: options for tensor creation: dtype, device, requires_grad.
#pragma once

#include <optional>

#include "core/device.h"
#include "core/dtype.h"

namespace duet {

/// Creation options, chained: Options().dtype(DType::f64).device(Device::cpu()).
struct Options {
  Options& dtype(DType d) {
    dtype_ = d;
    return *this;
  }
  Options& device(Device d) {
    device_ = d;
    return *this;
  }
  Options& requires_grad(bool r = true) {
    requires_grad_ = r;
    return *this;
  }
  std::optional<DType> dtype_;
  Device device_ = Device::cpu();
  bool requires_grad_ = false;
};

}  // namespace duet
