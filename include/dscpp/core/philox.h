// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), shared by host and device
// code so both produce the same bits from the same (seed, counter). Plain struct return: no std:: types on device.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DSCPP_HOST_DEVICE __host__ __device__
#else
#define DSCPP_HOST_DEVICE
#endif

namespace dscpp {

struct Philox4 {
  uint32_t v[4];
};

DSCPP_HOST_DEVICE inline Philox4 philox4x32_10(uint64_t seed, uint64_t hi, uint64_t lo) {
  uint32_t c0 = uint32_t(lo), c1 = uint32_t(lo >> 32), c2 = uint32_t(hi), c3 = uint32_t(hi >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = uint32_t(p1);
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = uint32_t(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// [0, 1) from the top 24 bits: exact in f32 on every device.
DSCPP_HOST_DEVICE inline float philox_uniform01(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }
// (0, 1]: the first Box-Muller input (never 0, so its log is finite).
DSCPP_HOST_DEVICE inline float philox_uniform01_open0(uint32_t x) {
  return (float(x >> 8) + 1.0f) * (1.0f / 16777217.0f);
}

}  // namespace dscpp
