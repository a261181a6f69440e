// CPU kernel of Random: uniform, normal and integer draws from Philox (kernels/philox.h).
//
// in[0] is the generator state, an i64 tensor {seed, offset}; the draw reads blocks
// offset, offset + 1, ... and the builder advances offset afterwards (core/ops/random.cpp).
// attrs.dim selects the distribution: 0 uniform [0, 1), 1 standard normal, 2 integers in
// [0, attrs.end). Element i uses block offset + i / 2 (two words per element, so f64 and
// randint have 64 bits), words 2 * (i % 2) and 2 * (i % 2) + 1.
#include <cmath>

#include "kernels/cpu_kernels.h"
#include "kernels/low_precision.h"
#include "kernels/loops.h"
#include "kernels/philox.h"

namespace duet::kernels {
namespace {

void random_kernel(TensorRefs in, const Attrs& a, const Tensor& out) {
  const Tensor state = in[0].contiguous();
  const int64_t* st = static_cast<const int64_t*>(state.raw_data());
  const uint64_t key = static_cast<uint64_t>(st[0]), offset = static_cast<uint64_t>(st[1]);
  const int dist = static_cast<int>(a.dim);
  // The narrow integers draw as i32 (randint's range fits them; Note [Low precision]).
  if (is_narrow_integral(out.dtype())) [[unlikely]]
    return run_wide(random_kernel, in, a, out);
  if (is_low_precision(out.dtype())) {
    const bool bf = out.dtype() == DType::bf16;
    uint16_t* o = static_cast<uint16_t*>(out.raw_data());
    parallel_for(out.numel(), kParallelGrain / 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float v = philox::draw_low(dist, a.end, key, offset, i, bf ? 8 : 11);
        o[i] = bf ? Eigen::numext::bit_cast<uint16_t>(bf16_t(v))
                  : Eigen::numext::bit_cast<uint16_t>(f16_t(v));
      }
    });
    return;
  }
  DUET_DISPATCH_DTYPE(out.dtype(), "random", [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, bool>) {
      DUET_ASSERT(false, "the random shape rule rejects b8");
    } else {
      T* o = static_cast<T*>(out.raw_data());
      parallel_for(out.numel(), kParallelGrain / 8, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = philox::draw<T>(dist, a.end, key, offset, i);
      });
    }
  });
}

}  // namespace

void register_random_kernels(OpDef* t) {
  detail::register_kernel(t, OpId::Random, DeviceType::CPU, random_kernel);
}

}  // namespace duet::kernels
