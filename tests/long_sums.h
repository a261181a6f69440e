// Long f32 sums, one table for every tier: eager (test_reduce_matmul), compiled on the fused
// interpreter (test_fusion), on generated kernels (test_codegen) and on CUDA (test_cuda_ops).
// Each row is a reduction long enough that adding one value after another drifts by a percent
// (2^26 copies of 1e4 came out 1.4% off); summed in a cascade (Note [Cascade sums] in
// kernels/functors.h) every result stays within a few ulps of the exact sum, at any thread
// count. The reference is the float64 sum of the same f32 values, which is exact for them.
#pragma once

#include <string>
#include <vector>

#include "trace/plan/codegen.h"
#include "trace/compile.h"
#include "util.h"

namespace duet::test {

struct LongSum {
  const char* name;
  Shape shape;                // the input's shape
  std::vector<int64_t> dims;  // reduced; empty: all
  bool transposed = false;    // made at the reversed (2-D) shape, then transposed
  bool constant = false;      // 1e4 everywhere; else long_sum_value's pattern
};

inline const std::vector<LongSum>& long_sums() {
  static const std::vector<LongSum> rows = {
      {"2^26 copies of 1e4", {int64_t(1) << 26}, {}, false, true},
      {"2^24 varied values", {int64_t(1) << 24}, {}},
      {"rows of 2^22", {2, int64_t(1) << 22}, {1}},
      {"over dim 0: 2^22 rows of 8 (strided)", {int64_t(1) << 22, 8}, {0}, false, true},
      {"over dim 0: 2^21 rows of 5 (strided)", {int64_t(1) << 21, 5}, {0}},
      {"over dim 0 of a transpose (contiguous)", {int64_t(1) << 22, 3}, {0}, true},
      {"over dim 1 of a transpose (strided)", {3, int64_t(1) << 22}, {1}, true},
  };
  return rows;
}

/// The value at flat index i of the stored tensor: 1e4, or a hash of i from 1e4 to 1e4 + 64 in
/// steps of 2^-12 (float64 sums of up to 2^26 of them are exact). Added one after another to a
/// running sum of 2^29 or more, each rounds the same way, up to the sum's ulp, as 1e4 does.
float long_sum_value(const LongSum& c, int64_t i);

/// The row's input, on the CPU.
Tensor long_sum_input(const LongSum& c);

/// The exact sums (float64 over the f32 values), one per output, row-major.
std::vector<double> long_sum_reference(const LongSum& c);

/// How many elements each output of the row sums.
double long_sum_count(const LongSum& c);

/// Empty when every value of got (a sum, or a mean when `mean`) is within 4 ulps (relative) of
/// the exact one (want: long_sum_reference); else the first that is not.
std::string long_sum_errors(const LongSum& c, const std::vector<double>& want, const Tensor& got,
                            bool mean);

/// Every row as sum(abs(x)) and mean(abs(x)) over its dims, compiled (abs makes the sum the end
/// of a fused group), with x on `device`, checked at 1 and 2 threads. With `generated`, each
/// function runs once and waits for its generated kernel first, so that the checks run on it.
inline void check_long_sums_compiled(Device device, bool generated) {
  for (const LongSum& c : long_sums()) {
    INFO(c.name);
    const Tensor x = long_sum_input(c).to(device);
    const std::vector<double> want = long_sum_reference(c);
    const Dims dims(c.dims);
    auto s = compile([dims](Tensor x) { return sum(abs(x), dims); });
    auto m = compile([dims](Tensor x) { return mean(abs(x), dims); });
    if (generated) {
      const int64_t loaded = codegen::stats().loaded;
      s(x);
      m(x);
      codegen::wait_idle();
      CHECK(codegen::stats().loaded >= loaded + 2);
    }
    for (int threads : {1, 2})
      with_threads(threads, [&] {
        INFO(threads << " threads");
        const Tensor got = s(x), got_mean = m(x);
        CHECK(s.stats().fused_kernels == 1);
        const std::string e = long_sum_errors(c, want, got, false);
        CHECK_MESSAGE(e.empty(), e);
        const std::string em = long_sum_errors(c, want, got_mean, true);
        CHECK_MESSAGE(em.empty(), em);
      });
  }
}

}  // namespace duet::test
