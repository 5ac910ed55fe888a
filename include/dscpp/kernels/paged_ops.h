// The op contracts of the inference engine's ragged forward over the paged (blocked) KV cache
// (include/dscpp/inference/kv_cache.h), in the conventions of ops.h (shape letters, "(=)" overwrites). Each has a
// CPU reference (src/kernels/cpu/paged_kv.cpp, f32) and a CUDA twin (src/kernels/cuda/paged_kv.cu: f32, bf16 or f16,
// qkv and out of one dtype; the i32 index tensors on the same device). The cache has qkv's dtype or fp8_e4m3, on
// either backend (Note [fp8 KV cache]: the append rounds to e4m3, attention reads it as f32, scale 1). The CPU entry points check every index
// they read (slots, the block-table entries a position reaches) and throw; the CUDA kernels check them on the
// device instead: an out-of-range slot is not written, a token reaching outside the cache gets NaN rows.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/kernels/rope_params.h"

namespace dscpp::ops {

// One layer's cache: cache[n_blocks, block_size, 2 (K, V), Hkv, D]. The forward runs rope_forward on qkv first, then:
// cache[slots[n] / block_size, slots[n] % block_size] (=) = (k heads, v heads) of qkv[N,(H+2Hkv)*D] row n, where
// slots[N] (i32) = block * block_size + offset, the block taken from the token's sequence's block table.
void kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& slots, int64_t H, int64_t Hkv, int64_t D);

// rope_forward(qkv, pos, H, Hkv, D, rope) then kv_cache_append(cache, qkv, slots, H, Hkv, D), as one op: qkv's q and
// k heads rotated in place, the rotated k heads and the v heads into each token's slot (one kernel on CUDA).
void rope_kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& pos, const Tensor& slots, int64_t H,
                          int64_t Hkv, int64_t D, const RopeParams& rope);

// Causal attention of a ragged batch's new tokens over the cache (after kv_cache_append wrote them): token n of
// sequence s (seq_start[S+1] i32, CSR over the N tokens) at position pos[n] attends to positions 0..pos[n] of s,
// position j stored in block block_table[s * max_blocks + j / block_size] (block_table i32 [S, max_blocks]).
// out[N, H*D] (=) = softmax(q k^T / sqrt(D)) v with q the query heads of qkv; query head h reads kv head h / (H/Hkv).
void paged_attention_forward(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                             const Tensor& seq_start, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D);

}  // namespace dscpp::ops
