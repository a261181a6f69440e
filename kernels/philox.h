// duet: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), the
// counter-based generator behind rand, randn, randint and dropout. A (key, counter) pair gives
// four 32-bit words; element i of a draw reads block counter + i/4, so any element can be
// computed alone (in parallel, on any device) and the same seed always gives the same numbers.
#pragma once

#include <cstdint>

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

}  // namespace duet::philox
