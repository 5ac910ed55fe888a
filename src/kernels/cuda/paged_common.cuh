// Private: what the paged attention kernels share (paged_kv.cu: the CUDA-core split-K kernel and the entry;
// paged_decode.cu: decode tokens on tensor cores): their arguments, a token's sequence and the merge of split-K
// partials by the last CTA of each (token, kv head) (Note [Paged attention design]).
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

// Split-K merge (Note [Paged attention design]). Both kernels split only while N * Hkv is under 1024 CTAs, so the
// (token, kv head) pairs of a split call index an array of this many arrival counters.
constexpr int kMaxSplitGroups = 1024;

// The shared memory merge_splits_if_last needs for a group of G query heads: (m, l) of each split, and l.
constexpr size_t merge_scratch_bytes(int G, int splits) { return sizeof(float) * size_t(G) * (2 * splits + 1); }

namespace {

// Zero when the module loads, on each device, and back to zero after every call; each kernel file has its own.
__device__ int split_arrivals[kMaxSplitGroups] = {};

// out rows of the group (row0 + g for g < G) from the splits' acc and, per split, (m, w = exp(m - M)) in ml and
// l_g[g]. Each thread takes V consecutive d (V = 4 when D allows) and reads kBatch splits at once: every load is in
// flight together rather than one after another.
template <typename T, int V>
__device__ void merge_rows(T* out, const float* part_acc, const float* ml, const float* l_g, int64_t row0, int G,
                           int D, int splits) {
  constexpr int kBatch = 4;
  for (int i = threadIdx.x * V; i < G * D; i += blockDim.x * V) {
    const int g = i / D, d = i % D;
    const float* r = ml + g * splits * 2;
    const float* acc = part_acc + (row0 + g) * splits * D + d;
    float o[V] = {};
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      float x[kBatch][V];
#pragma unroll
      for (int k = 0; k < kBatch; k++) {  // past L1 (__ldcg): other CTAs wrote them
        if (s0 + k >= splits) continue;
        if constexpr (V == 4) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(acc + int64_t(s0 + k) * D));
          x[k][0] = v.x, x[k][1] = v.y, x[k][2] = v.z, x[k][3] = v.w;
        } else {
          x[k][0] = __ldcg(acc + int64_t(s0 + k) * D);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; k++) {
        const int s = s0 + k;
        if (s >= splits || r[2 * s] == -INFINITY) continue;  // a split with nothing to do may not write its acc
#pragma unroll
        for (int v = 0; v < V; v++) o[v] += r[2 * s + 1] * x[k][v];
      }
    }
#pragma unroll
    for (int v = 0; v < V; v++) out[(row0 + g) * D + d + v] = from_f<T>(o[v] / l_g[g]);
  }
}

// Called by every thread of a CTA of one split of (token n, kv head kh) once it has written its partials
// part_acc [n][h][split][D] and part_ml [n][h][split][2] (m, l) for the group's G query heads h: the last of the
// `splits` CTAs to arrive merges them, in split order, into out [n][h][D]:
//   out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,  M = max_s m_s;
// the others return. scratch: merge_scratch_bytes(G, splits) of the caller's shared memory, free once its partials
// are written. The merge is on the call's critical path: the group's (m, l) come in one parallel read, and no
// load waits on another.
template <typename T>
__device__ void merge_splits_if_last(T* out, const float* part_acc, const float* part_ml, const PagedArgs& a, int n,
                                     int kh, int splits, float* scratch) {
  __shared__ int last;
  __syncthreads();  // the CTA's partials are written
  if (threadIdx.x == 0) {
    int& arrivals = split_arrivals[n * a.Hkv + kh];
    __threadfence();  // release: our partials are visible device-wide before we count as arrived
    last = atomicAdd(&arrivals, 1) == splits - 1;
    if (last) {
      arrivals = 0;     // every split has arrived: ready for the next call or graph replay
      __threadfence();  // acquire: the other splits' partials, read below past L1 (__ldcg)
    }
  }
  __syncthreads();
  if (!last) return;
  const int G = a.H / a.Hkv, D = a.D;
  const int64_t row0 = int64_t(n) * a.H + int64_t(kh) * G;  // (token, head) row of the group's first head
  float* ml = scratch;                                      // [G][splits] (m, l), then (m, exp(m - M))
  float* l_g = ml + G * splits * 2;                         // [G]
  for (int i = threadIdx.x; i < G * splits * 2; i += blockDim.x) ml[i] = __ldcg(part_ml + row0 * splits * 2 + i);
  __syncthreads();
  for (int g = threadIdx.x; g < G; g += blockDim.x) {
    float* r = ml + g * splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, r[2 * s]);  // NaN-poisoned partials stay NaN below
    float l = 0.0f;
    for (int s = 0; s < splits; s++) {
      const float m = r[2 * s], w = expf(m - M);
      l += m == -INFINITY ? 0.0f : w * r[2 * s + 1];
      r[2 * s + 1] = w;
    }
    l_g[g] = l;
  }
  __syncthreads();
  if (D % 4 == 0) merge_rows<T, 4>(out, part_acc, ml, l_g, row0, G, D, splits);  // 16-byte aligned rows
  else merge_rows<T, 1>(out, part_acc, ml, l_g, row0, G, D, splits);
}

}  // namespace

// Note [Paged decode on tensor cores]: the decode tokens of `a` (sequences of one new token; the others' tokens
// exit when a.skip_prompts, else they are attended here too) into out, on tensor cores, split over `splits` CTAs
// per (token, kv head). splits > 1 go through the workspaces part_acc [N, H, splits, D] and part_ml
// [N, H, splits, 2] (f32, the CUDA-core kernel's layout), merged by merge_splits_if_last. T bf16 or f16 (out, qkv),
// the cache T or fp8 e4m3, D 64 or 128, H / Hkv <= 16, 16-byte aligned rows (paged_decode_mma_supported).
bool paged_decode_mma_supported(const Tensor& out, const Tensor& qkv, const Tensor& cache, int64_t H, int64_t Hkv,
                                int64_t D);
int paged_decode_mma_splits(int64_t N, int64_t Hkv, int64_t max_ctx);
void paged_decode_mma(const Tensor& out, float* part_acc, float* part_ml, const Tensor& qkv, const Tensor& cache,
                      const PagedArgs& a, int64_t N, int splits, cudaStream_t stream);

}  // namespace dscpp::cuda
