// The paged (blocked) KV cache's two ops, as DeepSpeed-FastGen and vLLM split them: the append of each new token's K
// and V into its slot, then causal attention of each new token over its sequence's cached positions, read block by
// block through the sequence's block table. One layer's cache is cache[n_blocks, block_size, 2, Hkv, D].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

template <typename C>
void kv_cache_append(C* cache, const float* qkv, const int32_t* slots, int64_t N, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t R = (H + 2 * Hkv) * D, kv = Hkv * D;
#pragma omp parallel for if (N * kv >= 16384)
  for (int64_t n = 0; n < N; n++) {
    C* dst = cache + int64_t(slots[n]) * 2 * kv;
    const float* k = qkv + n * R + H * D;  // the k heads, then the v heads, as the slot stores them
    for (int64_t i = 0; i < 2 * kv; i++) dst[i] = C(k[i]);
  }
}

template <typename C>
void paged_attention_forward(float* out, const float* qkv, const C* cache, const int32_t* block_table,
                             const int32_t* seq_start, const int32_t* pos, int64_t S, int64_t max_blocks,
                             int64_t block_size, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t R = (H + 2 * Hkv) * D, G = H / Hkv, N = seq_start[S], kv = Hkv * D;
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<int32_t> seq_of(static_cast<size_t>(N));
  for (int64_t s = 0; s < S; s++)
    for (int64_t n = seq_start[s]; n < seq_start[s + 1]; n++) seq_of[size_t(n)] = int32_t(s);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t n = 0; n < N; n++)
    for (int64_t h = 0; h < H; h++) {
      const int32_t* blocks = block_table + seq_of[size_t(n)] * max_blocks;
      const int64_t len = int64_t(pos[n]) + 1;  // causal: positions 0 .. pos[n], its own included
      const float* q = qkv + n * R + h * D;
      // Position j's k head (of group h / G); its v head follows Hkv * D floats later in the slot.
      auto key = [&](int64_t j) {
        return cache + (int64_t(blocks[j / block_size]) * block_size + j % block_size) * 2 * kv + (h / G) * D;
      };
      std::vector<float> p(static_cast<size_t>(len));
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < len; j++) {
        const C* k = key(j);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; d++) dot += q[d] * float(k[d]);
        p[size_t(j)] = dot * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < len; j++) sum += p[size_t(j)] = std::exp(p[size_t(j)] - mx);
      const float inv = 1.0f / sum;
      float* o = out + n * H * D + h * D;
      std::memset(o, 0, size_t(D) * sizeof(float));
      for (int64_t j = 0; j < len; j++) {
        const float pj = p[size_t(j)] * inv;
        const C* v = key(j) + kv;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) o[d] += pj * float(v[d]);
      }
    }
}

#define DSCPP_PAGED_KV(C)                                                                                        \
  template void kv_cache_append<C>(C*, const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t);          \
  template void paged_attention_forward<C>(float*, const float*, const C*, const int32_t*, const int32_t*,          \
                                           const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
DSCPP_PAGED_KV(float)
DSCPP_PAGED_KV(fp8_e4m3)
#undef DSCPP_PAGED_KV

}  // namespace dscpp::cpu
