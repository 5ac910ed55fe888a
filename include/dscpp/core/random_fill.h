// Filling tensors from the Philox stream (seed, offset), on any device, with the same numbers everywhere.
// Element i of fill_uniform takes word i % 4 of block offset + i / 4: exactly the values that
// Rng(RngState{seed, offset}).uniform() returns when called numel times. fill_normal takes two words per element
// (block offset + i / 2), as Rng::normal() does; device logf/cosf may differ from the host's in the last ulp.
// The caller advances its offset by the blocks consumed (philox_blocks_*) so the next fill draws fresh numbers.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"

namespace dscpp {

// t: f32, bf16 or f16. Values lo + (hi - lo) * u, u in [0, 1).
void fill_uniform(const Tensor& t, uint64_t seed, uint64_t offset, float lo = 0.0f, float hi = 1.0f);
// t: f32, bf16 or f16. Values mean + std * z, z ~ N(0, 1) (Box-Muller).
void fill_normal(const Tensor& t, uint64_t seed, uint64_t offset, float mean = 0.0f, float std = 1.0f);
// t: i32. The raw 32-bit words (bit patterns), e.g. for dropout masks: word i % 4 of block offset + i / 4.
void fill_random_bits(const Tensor& t, uint64_t seed, uint64_t offset);

inline uint64_t philox_blocks_uniform(int64_t n) { return uint64_t((n + 3) / 4); }  // also fill_random_bits
inline uint64_t philox_blocks_normal(int64_t n) { return uint64_t((n + 1) / 2); }

}  // namespace dscpp
