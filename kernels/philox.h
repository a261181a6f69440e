// duet: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), the
// counter-based generator behind rand, randn, randint and dropout. A (key, counter) pair gives
// four 32-bit words; element i of a draw reads block counter + i/4, so any element can be
// computed alone (in parallel, on any device) and the same seed always gives the same numbers.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define DUET_PHILOX_HD __host__ __device__ __forceinline__
#else
#define DUET_PHILOX_HD inline
#endif

namespace duet::philox {

struct Block {
  uint32_t w[4];
};

DUET_PHILOX_HD Block generate(uint64_t key, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// Uniform in [0, 1) from 24 (float) or 53 (double) random bits.
DUET_PHILOX_HD float to_float(uint32_t x) { return (x >> 8) * (1.0f / 16777216.0f); }
DUET_PHILOX_HD double to_double(uint32_t hi, uint32_t lo) {
  return ((uint64_t(hi) << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0);
}

/// Element i of a draw in f16 (digits 11) or bf16 (digits 8), as a float that the dtype holds
/// exactly for uniform draws: they keep `digits` random bits, so that rounding cannot reach 1
/// (as PyTorch's reduced-precision draws). Normal and integer draws are the f32 draw, which the
/// caller rounds.
template <class T>
DUET_PHILOX_HD T draw(int dist, int64_t high, uint64_t key, uint64_t offset, int64_t i);
DUET_PHILOX_HD float draw_low(int dist, int64_t high, uint64_t key, uint64_t offset, int64_t i,
                              int digits) {
  if (dist != 0) return draw<float>(dist, high, key, offset, i);
  const Block b = generate(key, offset + static_cast<uint64_t>(i / 2));
  const uint32_t hi = b.w[2 * static_cast<int>(i % 2)];
  return static_cast<float>(hi >> (32 - digits)) / static_cast<float>(1u << digits);
}

/// Element i of a Random draw at state {key, offset}: the one definition that the CPU kernel
/// and the CUDA kernel both run, so that every device draws the same numbers. dist 0 is
/// uniform [0, 1), 1 standard normal, 2 integers in [0, high). Element i reads block
/// offset + i/2, words 2(i%2) and 2(i%2)+1.
template <class T>
DUET_PHILOX_HD T draw(int dist, int64_t high, uint64_t key, uint64_t offset, int64_t i) {
  const Block b = generate(key, offset + static_cast<uint64_t>(i / 2));
  const int j = 2 * static_cast<int>(i % 2);
  const uint32_t hi = b.w[j], lo = b.w[j + 1];
  if (dist == 2) {
    const uint64_t r = (uint64_t(hi) << 32) | lo;
    return static_cast<T>(r % static_cast<uint64_t>(high));
  }
  if (dist == 0) {
    if constexpr (std::is_same_v<T, float>) return to_float(hi);
    return static_cast<T>(to_double(hi, lo));
  }
  // Box-Muller on the block's two word pairs; element i takes the cosine or the sine branch
  // by its parity, from the pair that its block shares with its neighbour.
  const double u1 = 1.0 - to_double(b.w[0], b.w[1]);  // (0, 1]: log is finite
  const double u2 = to_double(b.w[2], b.w[3]);
#if defined(__CUDA_ARCH__)
  const double r = ::sqrt(-2.0 * ::log(u1)), theta = 6.283185307179586 * u2;
  return static_cast<T>(i % 2 ? r * ::sin(theta) : r * ::cos(theta));
#else
  const double r = std::sqrt(-2.0 * std::log(u1)), theta = 6.283185307179586 * u2;
  return static_cast<T>(i % 2 ? r * std::sin(theta) : r * std::cos(theta));
#endif
}

}  // namespace duet::philox
