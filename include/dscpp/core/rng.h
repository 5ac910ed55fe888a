// Philox4x32-10: a counter-based generator. The same (seed, offset) gives the same numbers on CPU and GPU, and the
// whole state is two integers, so checkpoints save and restore it exactly.
#pragma once
#include <array>
#include <cstdint>

namespace dscpp {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // number of 4-word blocks generated
  uint32_t used = 4;    // words of the last block already handed out
};

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter_hi, uint64_t counter_lo);

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { state_.seed = seed; }
  explicit Rng(RngState s) : state_(s) {}
  uint32_t next_u32();
  uint64_t next_u64();
  float uniform();                      // [0, 1)
  float normal();                       // N(0, 1), Box-Muller
  uint64_t below(uint64_t n);           // uniform integer in [0, n)
  RngState state() const { RngState s = state_; s.used = uint32_t(used_); return s; }
  void set_state(RngState s);

 private:
  RngState state_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

}  // namespace dscpp
