// duet: options of nn layers with chained setters, as LibTorch's: `GRUOptions(8, 16)
// .num_layers(2).batch_first(true)` sets, `options.num_layers()` reads.
#pragma once

/// Declares an option of type T: a private member name_ (whose initializer may follow the
/// macro: `DUET_NN_OPTION(int64_t, num_layers) = 1;`), a setter returning the options, and a
/// getter. LibTorch's TORCH_ARG.
#define DUET_NN_OPTION(T, name)             \
 public:                                    \
  auto& name(const T& value) {              \
    name##_ = value;                        \
    return *this;                           \
  }                                         \
  const T& name() const { return name##_; } \
                                            \
 private:                                   \
  T name##_
