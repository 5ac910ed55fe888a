// Private: the RMSNorm that the decode GEMVs (gemv.cuh, gemv_mma.cuh) run on their own input rows.
//
// Note [Norm in the decode GEMV]
// At decode each layer ran an RMSNorm kernel on a handful of rows ahead of the qkv and the gate_up GEMVs: two
// kernels a layer that move a few KB, each paying a launch and the gap before the GEMV behind it. Here the GEMV
// normalizes its input rows itself: every CTA reads the M rows of x (from L2: a few KB, against the MBs of weight
// it streams), sums their squares, and writes x * rstd * gamma (norm_rows.cuh's expression, one rounding to T) into
// shared memory, which its main loop then reads instead of the global input; the CTA of blockIdx.x 0 also writes
// those rows to `normed`, so the op's contract (rmsnorm_matmul_forward: normed and out) holds whichever path ran.
// Before the prologue each warp asks L2 for its first weight bytes (prefetch.global.L2), so the weight stream does
// not wait for the norm. Taken for one row (a batch-1 decode step) whose C * sizeof(T) fits 40 KB of shared memory;
// else the two ops run. With the rope + KV append kernel of rope.cu and the GEMVs' warps of gemv_mma.cuh, batch-1
// decode went 168.2 -> 170.0 tokens/s (Llama-3.1-8B bf16), 270.6 -> 278.2 (int4), 760.5 -> 784.0 (Llama-3.2-1B
// bf16) on an H100 (docs/PERF.md); with the norm taken at 8 rows too, Llama-3.2-1B's batch 8 was 22-27% slower,
// every CTA re-reading and normalizing 8 rows, as many bytes from L2 as its share of the weight. 2-7 rows were not
// measured.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.h"

namespace dscpp::cuda::gemv {

using RowNorm = GemvNorm;

// The 48 KB a CTA may use without opting in, less the GEMV kernels' own reductions (at most 4.2 KB).
constexpr size_t kMaxNormSmem = 40 * 1024;
constexpr int64_t kMaxNormRows = 1;

// xs[m][c] (=) inp[m][c] * rstd_m * gamma[c] for the M rows, by all the CTA's threads; block 0 also writes them to
// norm.normed. Ends with a barrier.
template <typename T>
__device__ __forceinline__ void norm_rows_to_shared(T* xs, const T* __restrict__ inp, const RowNorm& norm, int M,
                                                    int C) {
  __shared__ float scratch[32];
  constexpr int V = 16 / int(sizeof(T));
  const T* gamma = static_cast<const T*>(norm.gamma);
  T* normed = blockIdx.x == 0 ? static_cast<T*>(norm.normed) : nullptr;
  for (int m = 0; m < M; m++) {
    const T* x = inp + int64_t(m) * C;
    float ss = 0.0f;
    for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
      float v[V];
      load_f<T, V>(x + c, v);
#pragma unroll
      for (int k = 0; k < V; k++) ss += v[k] * v[k];
    }
    const float rs = 1.0f / sqrtf(block_sum(ss, scratch) / float(C) + norm.eps);
    for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
      float v[V], w[V];
      load_f<T, V>(x + c, v);
      load_f<T, V>(gamma + c, w);
#pragma unroll
      for (int k = 0; k < V; k++) v[k] = (v[k] - 0.0f) * rs * w[k];
      store_f<T, V>(xs + int64_t(m) * C + c, v);
      if (normed) store_f<T, V>(normed + int64_t(m) * C + c, v);
    }
  }
  __syncthreads();
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace dscpp::cuda::gemv
