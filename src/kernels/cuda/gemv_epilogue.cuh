// Private: the paired epilogues of the decode GEMVs (gemv_epilogue.h): pair p holds rows 16 (p / 8) + p % 8 and the
// row 8 further, whose finished sums (bias added) are s1 and s2.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_epilogue.h"
#include "kernels/cuda/kv_cache_elem.cuh"

namespace dscpp::cuda {

constexpr int kGemvPairBlock = 8;

// out row m (=) pair p's epilogue. rope_kv rounds s1 and s2 to O first, as the GEMV's store and rope_kv_cache_append's
// load would, then rotates a q or k pair as rope.cu does, so the tokens are those of the two-op path.
template <typename O>
__device__ __forceinline__ void store_pair(const GemvEpilogue& e, O* out, int64_t OC, int m, int64_t p, float s1,
                                           float s2) {
  if (e.kind == GemvEpi::swiglu) {
    out[int64_t(m) * (OC / 2) + p] = swiglu_of<O>(s1, s2);
    return;
  }
  const GemvRopeKv& r = e.rope_kv;
  const int64_t row = p / kGemvPairBlock * 2 * kGemvPairBlock + p % kGemvPairBlock, q = int64_t(r.H) * r.D;
  float x1 = to_f(from_f<O>(s1)), x2 = to_f(from_f<O>(s2));
  if (row < q + int64_t(r.Hkv) * r.D) {  // a q or a k head's pair i
    const int d = int(row % r.D), i = d / (2 * kGemvPairBlock) * kGemvPairBlock + d % kGemvPairBlock;
    float sn, cs;
    sincosf(float(r.pos[m]) * rope_inv_freq(i, r.D, r.rope.theta, r.rope.scaling), &sn, &cs);
    rope_rotate(x1, x2, cs, sn, x1, x2);
  }
  O* o = out + int64_t(m) * OC + row;
  o[0] = from_f<O>(x1);
  o[kGemvPairBlock] = from_f<O>(x2);
  if (row < q) return;
  const int64_t slot = r.slots[m];
  if (slot < 0 || slot >= r.n_slots) return;  // Note [Paged attention design]: indices
  // cache[slot] = [k heads | v heads]: rows from q on map onto it one to one
  const int64_t at = slot * 2 * int64_t(r.Hkv) * r.D + row - q;
  const float y1[1] = {x1}, y2[1] = {x2};
  if (r.cache_fp8) {
    store_cache<Fp8, 1>(static_cast<Fp8*>(r.cache) + at, y1);
    store_cache<Fp8, 1>(static_cast<Fp8*>(r.cache) + at + kGemvPairBlock, y2);
  } else {
    store_cache<O, 1>(static_cast<O*>(r.cache) + at, y1);
    store_cache<O, 1>(static_cast<O*>(r.cache) + at + kGemvPairBlock, y2);
  }
}

// Whether a launch of OC output rows (residual: one is added) can take e's pairs.
inline bool pairs_fit(const GemvEpilogue& e, int64_t OC, bool residual) {
  if (!e.paired()) return true;
  if (OC % (2 * kGemvPairBlock) != 0 || residual) return false;
  if (e.kind != GemvEpi::rope_kv) return true;
  const GemvRopeKv& r = e.rope_kv;
  return r.rope.pair_block == kGemvPairBlock && r.D % (2 * kGemvPairBlock) == 0 &&
         OC == int64_t(r.H + 2 * r.Hkv) * r.D;
}

}  // namespace dscpp::cuda
