// Private: what the paged attention kernels share (paged_kv.cu: the CUDA-core split-K kernel, the merge of
// split-K partials and the entry; paged_decode.cu: decode tokens on tensor cores): their arguments and a token's
// sequence (Note [Paged attention design]).
#pragma once
#include "kernels/cuda/common.cuh"
#include "dscpp/core/tensor.h"

namespace dscpp::cuda {

struct PagedArgs {
  const int32_t* block_table;  // [S, max_blocks]
  const int32_t* seq_start;    // [S + 1]
  const int32_t* pos;          // [N]
  int S, max_blocks, block_size, n_blocks, H, Hkv, D;
  float scale;
  int skip_prompts;  // tokens of sequences with 2 or more new tokens are the prompt kernel's (attention.cu)
};

// The sequence of token n: the last s with seq_start[s] <= n (empty sequences before it share its start).
__device__ __forceinline__ int sequence_of(const int32_t* seq_start, int S, int n) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (seq_start[mid] <= n) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Note [Paged decode on tensor cores]: the decode tokens of `a` (sequences of one new token; the others' tokens
// exit when a.skip_prompts, else they are attended here too) on tensor cores, split over `splits` CTAs per (token, kv head). splits == 1 writes out; more write the
// partials part_acc [N, H, splits, D] and part_ml [N, H, splits, 2] (f32, the CUDA-core kernel's layout) for
// paged_kv.cu's merge. T bf16 or f16 (out, qkv), the cache T or fp8 e4m3, D 64 or 128, H / Hkv <= 16, 16-byte
// aligned rows (paged_decode_mma_supported).
bool paged_decode_mma_supported(const Tensor& out, const Tensor& qkv, const Tensor& cache, int64_t H, int64_t Hkv,
                                int64_t D);
int paged_decode_mma_splits(int64_t N, int64_t Hkv, int64_t max_ctx);
void paged_decode_mma(const Tensor& out, float* part_acc, float* part_ml, const Tensor& qkv, const Tensor& cache,
                      const PagedArgs& a, int64_t N, int splits, cudaStream_t stream);

}  // namespace dscpp::cuda
