#include "dscpp/core/rng.h"

#include <cmath>

namespace dscpp {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t hi, uint64_t lo) {
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
  return {c0, c1, c2, c3};
}

uint32_t Rng::next_u32() {
  if (used_ == 4) {
    block_ = philox4x32(state_.seed, 0, state_.offset++);
    used_ = 0;
  }
  return block_[size_t(used_++)];
}

void Rng::set_state(RngState s) {
  state_ = s;
  used_ = s.used >= 4 || s.offset == 0 ? 4 : int(s.used);
  if (used_ < 4) block_ = philox4x32(s.seed, 0, s.offset - 1);
}

uint64_t Rng::next_u64() { return (uint64_t(next_u32()) << 32) | next_u32(); }

float Rng::uniform() { return float(next_u32() >> 8) * (1.0f / 16777216.0f); }

float Rng::normal() {
  float u1 = (float(next_u32() >> 8) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  float u2 = uniform();
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
}

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // reject the biased tail
  uint64_t x;
  do { x = next_u64(); } while (x >= limit);
  return x % n;
}

}  // namespace dscpp
