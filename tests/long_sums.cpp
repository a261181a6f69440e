// The long sums' inputs and exact references (long_sums.h): loops over 2^26 elements, compiled
// with the other helpers' optimisation (tests/CMakeLists.txt) rather than the test files' -O0.
#include "long_sums.h"

#include <cfloat>
#include <cmath>

namespace duet::test {

float long_sum_value(const LongSum& c, int64_t i) {
  const uint64_t h = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  return c.constant ? 1e4f : 1e4f + static_cast<float>(h >> 46) / 4096.0f;
}

Tensor long_sum_input(const LongSum& c) {
  const Shape stored = c.transposed ? Shape{c.shape[1], c.shape[0]} : c.shape;
  Tensor x = zeros(stored);
  float* p = x.data_ptr<float>();
  const int64_t n = stored.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = long_sum_value(c, i);
  return c.transposed ? x.t() : x;
}

std::vector<double> long_sum_reference(const LongSum& c) {
  const int64_t rows = c.shape.size() == 1 ? 1 : c.shape[0];
  const int64_t cols = c.shape.size() == 1 ? c.shape[0] : c.shape[1];
  const bool all = c.dims.empty();
  const bool over_rows = !all && c.dims[0] == 0;
  std::vector<double> out(all ? 1 : over_rows ? cols : rows, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t stored = c.transposed ? j * rows + i : i * cols + j;
      out[all ? 0 : over_rows ? j : i] += long_sum_value(c, stored);
    }
  return out;
}

double long_sum_count(const LongSum& c) {
  return c.dims.empty() ? double(c.shape.numel()) : double(c.shape[c.dims[0]]);
}

std::string long_sum_errors(const LongSum& c, const std::vector<double>& want, const Tensor& got,
                            bool mean) {
  const std::vector<double> v = values(got);
  if (v.size() != want.size())
    return "got " + std::to_string(v.size()) + " values, want " + std::to_string(want.size());
  for (size_t k = 0; k < v.size(); ++k) {
    const double w = mean ? want[k] / long_sum_count(c) : want[k];
    if (std::fabs(v[k] - w) <= 4 * FLT_EPSILON * std::fabs(w)) continue;
    return std::string(mean ? "mean" : "sum") + " " + std::to_string(k) + ": got " +
           std::to_string(v[k]) + ", want " + std::to_string(w) + " (relative error " +
           std::to_string(std::fabs(v[k] - w) / std::fabs(w)) + ")";
  }
  return "";
}

}  // namespace duet::test
