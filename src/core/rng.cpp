#include "dscpp/core/rng.h"

#include <cmath>

#include "dscpp/core/philox.h"

namespace dscpp {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t hi, uint64_t lo) {
  Philox4 r = philox4x32_10(seed, hi, lo);  // shared with the device code (dscpp/core/philox.h)
  return {r.v[0], r.v[1], r.v[2], r.v[3]};
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

float Rng::uniform() { return philox_uniform01(next_u32()); }

float Rng::normal() {
  float u1 = philox_uniform01_open0(next_u32());  // (0, 1]
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
