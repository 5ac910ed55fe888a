// Private: what a decode GEMV does with its output rows besides adding bias and residual (gemv.cuh, gemv_mma.cuh,
// gemv_fp8.cuh). The paired kinds need the weight's rows in blocks of 8 first rows then their 8 partners, so that
// one CTA holds both rows of a pair: SwiGLU's gate and up rows (Note [SwiGLU in the decode GEMV]), or a q or k head's
// rotated pairs (Note [Rope and KV append in the decode GEMV]). Plain C++: the op layer fills it.
#pragma once
#include <cstdint>

#include "dscpp/kernels/rope_params.h"

namespace dscpp::cuda {

enum class GemvEpi : uint8_t {
  plain,    // out[m, oc] (=) sum + bias + residual
  swiglu,   // out [M, OC / 2] (=) silu(gate) * up of each pair; no residual
  rope_kv,  // out = qkv [M, (H + 2Hkv) D], then as rope_kv_cache_append; no residual
};

// rope_kv's arguments: rope_kv_cache_append's (paged_ops.h) for the GEMV's M rows, rope.pair_block 8.
struct GemvRopeKv {
  const int32_t* pos = nullptr;    // [M]
  const int32_t* slots = nullptr;  // [M]; a slot outside [0, n_slots) is not written
  void* cache = nullptr;           // one layer's [n_slots][2][Hkv][D], of out's dtype or e4m3
  bool cache_fp8 = false;
  int64_t n_slots = 0;
  int H = 0, Hkv = 0, D = 0;
  RopeParams rope;
};

struct GemvEpilogue {
  GemvEpi kind = GemvEpi::plain;
  GemvRopeKv rope_kv;
  DSCPP_HOST_DEVICE bool paired() const { return kind != GemvEpi::plain; }
};

}  // namespace dscpp::cuda
