// CUDA twins of the paged KV-cache ops (include/dscpp/kernels/paged_ops.h), the same functions as the CPU references
// in src/kernels/cpu/paged_kv.cpp, for f32, bf16 and f16 tensors (qkv and out of one dtype; f32 math), over a cache
// of that dtype or of fp8 e4m3 (Note [fp8 KV cache]): the kernels take the cache element C apart from T and
// convert in registers, so an fp8 cache is read at one byte an element.
//
// Note [Paged attention design]
// One CTA per (new token n, kv head, split) with kThreads threads. The CTA first puts the G = H/Hkv query heads that
// share the kv head in shared memory (f32, pre-scaled by 1/sqrt(D)), then walks the token's positions in tiles of
// kTile keys: each tile's K and V rows are read once, through the block table, into shared memory and serve all G
// heads (GQA: the group costs one K/V read, not G). Per tile and head, online softmax in f32 (FlashAttention's
// running max m, running sum l, the accumulator rescaled by exp(m_old - m_new)); the accumulator acc[G][D] lives
// in shared memory, each element owned by one thread, so the rescale and the P @ V update need no atomics.
// Split-K (FlashDecoding): at decode, N * Hkv CTAs are far fewer than the SMs while each walks a long context, so
// each token's positions are cut into `splits` chunks of whole tiles, one CTA each; a CTA of a split writes its
// unnormalised acc and its (m, l) to an f32 workspace, and the splits of each (token, head) are merged:
//   out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,  M = max_s m_s.
// A split past a token's last position has nothing to do and leaves m = -inf, l = 0, acc = 0, which the merge
// weighs by exp(-inf) = 0. The number of splits follows the shapes alone (never the SM count), the chunks the
// token's context, so a call gives the same bits on every run.
// The merge is done by the last CTA of each (token, kv head) to finish, not by a second kernel: at batch-1 decode
// a layer is a CUDA graph of a few short kernels, and a merge kernel would add its launch gap and ramp to a few
// microseconds of work. Each CTA writes its partials, fences, and counts itself in an arrival counter of its
// (token, kv head); the CTA that arrives last fences again, merges the G heads' splits in split order 0 ..
// splits-1 (the same bits on every run, whichever CTA is last; the same bits as the merge kernel it replaced) and
// sets the counter back to 0, so the next call and every graph replay start from zero with no memset
// (merge_splits_if_last, paged_common.cuh). The counters are a __device__ array, zero when the module loads on each
// device: nothing is allocated or cleared on the launch path, so a first call inside a graph capture records the
// kernel alone. Two kernels in flight on one device at once would share the counters; none are: the inference
// engine runs on one stream per device (a graph is captured on that device's capture stream and replayed on the
// current stream, one after another, Note [Graph memory]), no launch overlaps the one before it (no programmatic
// dependent launch), and tensor-parallel ranks are processes of their own.
// Indices: the device cannot range-check slots, pos and the block table on the host without a sync, so the
// kernels do: an append whose slot is outside the cache writes nothing, and a token whose position or block-table
// entries fall outside the cache gets NaN rows (its error shows in the logits instead of another sequence's KV).
// The scores are plain f32 FMA on CUDA cores. Since the tensor-core kernels (Note [Paged decode on tensor cores],
// Note [Paged prompt attention]) this kernel serves what they do not: f32, head sizes other than 64 and 128, and
// groups of more than 16 query heads.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_cache_elem.cuh"
#include "kernels/cuda/paged_common.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 32;         // keys per shared-memory tile: one lane each in the softmax step
constexpr int kMaxSplits = 32;
constexpr int kSplitKeys = 32;     // splits of a max-width context cover at least this many positions (one tile)
constexpr int kTargetCtas = 1024;  // split while N * Hkv CTAs would leave an H100's 132 SMs (8 CTAs each) idle

// ---- kv_cache_append ----
// cache[slot] (=) the 2*Hkv*D k and v elements of qkv row n (they are contiguous in the row, as in the slot).
// One CTA row per token (grid-stride), V elements per access (Note [Vector width]).
template <typename T, typename C, int V>
__global__ void kv_append_kernel(C* __restrict__ cache, const T* __restrict__ qkv, const int32_t* __restrict__ slots,
                                 int64_t N, int64_t n_slots, int row, int kv_off, int kv2) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t slot = slots[n];
    if (slot < 0 || slot >= n_slots) continue;  // Note [Paged attention design]: indices
    const T* src = qkv + n * row + kv_off;
    C* dst = cache + slot * kv2;
    for (int i = threadIdx.x * V; i < kv2; i += blockDim.x * V) {
      float x[V];
      load_f<T, V>(src + i, x);
      store_cache<C, V>(dst + i, x);  // C = T: a copy (f32 holds every bf16/f16 value); fp8: rounded
    }
  }
}

// ---- paged_attention_forward ----
// Grid (N, Hkv, splits). Shared memory (floats): q[G][D], k[kTile][D+1] (padded: the score step reads a column of
// it), v[kTile][D], p[G][kTile], acc[G][D], m[G], l[G], alpha[G].
// out[n, h*D + d] (=) the attention, in T; splits > 1 through part_acc[n][h][split][D], part_ml[n][h][split][2]
// (f32), merged by the last split to finish.
template <typename T, typename C, int V>
__global__ void __launch_bounds__(kThreads)
    paged_attention_kernel(T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                           const T* __restrict__ qkv, const C* __restrict__ cache, PagedArgs a) {
  extern __shared__ float smem[];
  const int n = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int D = a.D, G = a.H / a.Hkv, Dp = D + 1;
  float* q_s = smem;
  float* k_s = q_s + G * D;
  float* v_s = k_s + kTile * Dp;
  float* p_s = v_s + kTile * D;
  float* acc_s = p_s + G * kTile;
  float* m_s = acc_s + G * D;
  float* l_s = m_s + G;
  float* alpha_s = l_s + G;
  __shared__ int bad;

  const int64_t row = int64_t(a.H + 2 * a.Hkv) * D, kv = int64_t(a.Hkv) * D;
  const int s = sequence_of(a.seq_start, a.S, n);
  if (a.skip_prompts && a.seq_start[s + 1] - a.seq_start[s] >= 2) return;
  const int32_t* blocks = a.block_table + int64_t(s) * a.max_blocks;
  const int p_n = a.pos[n];
  const int len = p_n + 1;  // causal: positions 0 .. pos[n]
  // The token's own positions cut evenly over the splits, in whole tiles: a short context in a graph captured for
  // long ones (Note [Graph memory]) still spreads over several CTAs.
  const int chunk = (len + splits * kTile - 1) / (splits * kTile) * kTile;
  const int begin = split * chunk, end = min(len, begin + chunk);

  if (threadIdx.x == 0) bad = p_n < 0 || p_n >= a.max_blocks * a.block_size;
  const T* q = qkv + int64_t(n) * row + int64_t(kvh) * G * D;  // the group's G query heads are adjacent
  for (int i = threadIdx.x * V; i < G * D; i += kThreads * V) {
    float x[V];
    load_f<T, V>(q + i, x);
#pragma unroll
    for (int k = 0; k < V; k++) q_s[i + k] = x[k] * a.scale;
  }
  for (int i = threadIdx.x; i < G * D; i += kThreads) acc_s[i] = 0.0f;
  for (int g = threadIdx.x; g < G; g += kThreads) m_s[g] = -INFINITY, l_s[g] = 0.0f;
  __syncthreads();

  for (int j0 = bad ? end : begin; j0 < end; j0 += kTile) {
    // K and V of positions j0 .. j0 + kTile - 1 (those past `end` are masked below and not read).
    const int per_row = D / V;
    for (int i = threadIdx.x; i < kTile * per_row; i += kThreads) {
      const int r = i / per_row, d = (i % per_row) * V, j = j0 + r;
      if (j >= end) continue;
      const int blk = blocks[j / a.block_size];
      if (blk < 0 || blk >= a.n_blocks) {
        bad = 1;  // benign race: every writer stores 1
        continue;
      }
      const C* slot = cache + (int64_t(blk) * a.block_size + j % a.block_size) * 2 * kv + int64_t(kvh) * D;
      float x[V], y[V];
      load_cache<C, V>(slot + d, x);
      load_cache<C, V>(slot + kv + d, y);
#pragma unroll
      for (int k = 0; k < V; k++) k_s[r * Dp + d + k] = x[k], v_s[r * D + d + k] = y[k];
    }
    __syncthreads();
    // Scores p[g][r] = q_g . k_r, -inf past the end.
    for (int i = threadIdx.x; i < G * kTile; i += kThreads) {
      const int g = i / kTile, r = i % kTile;
      float dot = -INFINITY;
      if (j0 + r < end) {
        dot = 0.0f;
        for (int d = 0; d < D; d++) dot += q_s[g * D + d] * k_s[r * Dp + d];
      }
      p_s[i] = dot;
    }
    __syncthreads();
    // Online softmax, one warp per head, one lane per key of the tile (kTile == 32).
    for (int g = threadIdx.x / 32; g < G; g += kThreads / 32) {
      const int lane = threadIdx.x % 32;
      const float x = p_s[g * kTile + lane];
      const float m_old = m_s[g], m_new = fmaxf(m_old, warp_max(x));  // finite: the tile's first key is valid
      const float e = expf(x - m_new);                              // 0 for a masked key
      p_s[g * kTile + lane] = e;
      const float sum = warp_sum(e);
      if (lane == 0) {
        const float alpha = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        alpha_s[g] = alpha, m_s[g] = m_new, l_s[g] = l_s[g] * alpha + sum;
      }
    }
    __syncthreads();
    // acc[g][d] = alpha_g acc[g][d] + sum_r p[g][r] v[r][d]
    for (int i = threadIdx.x; i < G * D; i += kThreads) {
      const int g = i / D, d = i % D;
      float o = acc_s[i] * alpha_s[g];
      const int nr = min(kTile, end - j0);
      for (int r = 0; r < nr; r++) o += p_s[g * kTile + r] * v_s[r * D + d];
      acc_s[i] = o;
    }
    __syncthreads();  // the next tile overwrites k_s, v_s, p_s
  }

  const int64_t h0 = int64_t(kvh) * G;
  if (splits == 1) {
    T* o = out + int64_t(n) * a.H * D + h0 * D;
    for (int i = threadIdx.x; i < G * D; i += kThreads)
      o[i] = bad ? nan_of<T>() : from_f<T>(acc_s[i] / l_s[i / D]);
    return;
  }
  // Split-K partials, laid out [n][h][split].
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int g = i / D, d = i % D;
    const int64_t at = ((int64_t(n) * a.H + h0 + g) * splits + split);
    part_acc[at * D + d] = bad ? NAN : acc_s[i];
  }
  for (int g = threadIdx.x; g < G; g += kThreads) {
    const int64_t at = ((int64_t(n) * a.H + h0 + g) * splits + split);
    part_ml[at * 2] = bad ? NAN : m_s[g];
    part_ml[at * 2 + 1] = bad ? NAN : l_s[g];
  }
  merge_splits_if_last(out, part_acc, part_ml, a, n, kvh, splits, smem);
}

size_t paged_smem_bytes(int G, int D) {
  const size_t attend = sizeof(float) * (size_t(G) * D + kTile * (D + 1) + size_t(kTile) * D + size_t(G) * kTile +
                                         size_t(G) * D + 3 * size_t(G));
  return std::max(attend, merge_scratch_bytes(G, kMaxSplits));  // the merge reuses it; tiny heads need more
}

// Splits for N tokens of up to max_ctx positions: enough CTAs to fill the GPU, at least kSplitKeys positions each.
int paged_splits(int64_t N, int Hkv, int64_t max_ctx) {
  const int64_t ctas = N * Hkv;
  if (ctas >= kTargetCtas) return 1;
  int64_t s = std::min<int64_t>(ceil_div(kTargetCtas, ctas), ceil_div(max_ctx, kSplitKeys));
  return int(std::max<int64_t>(1, std::min<int64_t>(s, kMaxSplits)));
}

// Runs attend(part_acc, part_ml): a kernel of `splits` CTAs per (token, kv head) that writes out, itself when
// splits is 1 (both null), else through the split-K partials that its last CTAs merge. The partials are
// stream-ordered workspace (Note [Current stream]): freed to the caching allocator, reused by the next call.
template <typename F>
void split_and_merge(const PagedArgs& a, int64_t N, int splits, Device device, F&& attend) {
  if (splits == 1) return attend(nullptr, nullptr);
  DSCPP_CHECK(N * a.Hkv <= kMaxSplitGroups, "paged_attention_forward: ", N, " tokens x ", a.Hkv,
              " kv heads split over ", splits, " CTAs each, more than the ", kMaxSplitGroups, " arrival counters");
  Tensor part_acc = Tensor::empty({N, a.H, splits, a.D}, DType::f32, device);
  Tensor part_ml = Tensor::empty({N, a.H, splits, 2}, DType::f32, device);
  attend(ptr<float>(part_acc), ptr<float>(part_ml));
}

template <typename T, typename C, int V>
void launch_paged_attention_v(T* out, const T* qkv, const C* cache, PagedArgs a, int64_t N, int splits,
                              const Tensor& like, cudaStream_t stream) {
  const int G = a.H / a.Hkv;
  const size_t smem = paged_smem_bytes(G, a.D);
  auto kernel = paged_attention_kernel<T, C, V>;
  if (smem > 48 * 1024)
    DSCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(N), unsigned(a.Hkv), unsigned(splits));
  split_and_merge(a, N, splits, like.device(), [&](float* part_acc, float* part_ml) {
    kernel<<<grid, kThreads, smem, stream>>>(out, part_acc, part_ml, qkv, cache, a);
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---- checked entries (ops_paged.cpp has validated shapes, dtypes and devices) ----
void kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& slots, int64_t H, int64_t Hkv, int64_t D) {
  const char* op = "kv_cache_append";
  const int64_t row = (H + 2 * Hkv) * D, N = qkv.numel() / row, kv2 = 2 * Hkv * D;
  if (N == 0) return;
  OpLaunch L(qkv);
  dispatch_paged(op, qkv.dtype(), cache.dtype(), [&](auto* tag, auto* ctag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = std::remove_pointer_t<decltype(ctag)>;
    constexpr int V = 16 / int(sizeof(T));
    const int64_t n_slots = cache.size(0) * cache.size(1);
    const unsigned grid = grid_for(N, 1);
    // Every access V-aligned: the row, the k heads' start and the slot size multiples of V, aligned bases.
    if (D % V == 0 && all_aligned16(ptr<C>(cache), ptr<T>(qkv)))
      kv_append_kernel<T, C, V><<<grid, kThreads, 0, L.stream>>>(ptr<C>(cache), ptr<T>(qkv), ptr<int32_t>(slots), N,
                                                                 n_slots, int(row), int(H * D), int(kv2));
    else
      kv_append_kernel<T, C, 1><<<grid, kThreads, 0, L.stream>>>(ptr<C>(cache), ptr<T>(qkv), ptr<int32_t>(slots), N,
                                                                 n_slots, int(row), int(H * D), int(kv2));
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

void paged_attention_forward(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                             const Tensor& seq_start, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D) {
  const char* op = "paged_attention_forward";
  const int64_t N = qkv.numel() / ((H + 2 * Hkv) * D);
  if (N == 0) return;
  const int G = int(H / Hkv);
  DSCPP_CHECK(paged_smem_bytes(G, int(D)) <= 227 * 1024, op, ": H / Hkv = ", G, " query heads per kv head of D = ", D,
              " need ", paged_smem_bytes(G, int(D)), " bytes of shared memory, more than the 227 KiB of a CTA");
  const int64_t S = seq_start.numel() - 1, max_blocks = block_table.numel() / S;
  PagedArgs a{ptr<int32_t>(block_table), ptr<int32_t>(seq_start), ptr<int32_t>(pos), int(S), int(max_blocks),
              int(cache.size(1)), int(cache.size(0)), int(H), int(Hkv), int(D), 1.0f / std::sqrt(float(D)), 0};
  // Decode tokens (sequences of one new token) go to tensor cores where the shapes allow (Note [Paged decode on
  // tensor cores]), prompt chunks to the tensor-core prompt kernel after them (Note [Paged prompt attention]); the
  // rest (f32, other head sizes, groups of more than 16 heads) to the CUDA-core kernel here.
  if (paged_decode_mma_supported(out, qkv, cache, H, Hkv, D)) {
    const int splits = paged_decode_mma_splits(N, Hkv, int64_t(max_blocks) * a.block_size);
    a.skip_prompts = N > S ? 1 : 0;
    {
      OpLaunch L(qkv);
      split_and_merge(a, N, splits, qkv.device(), [&](float* part_acc, float* part_ml) {
        paged_decode_mma(out, part_acc, part_ml, qkv, cache, a, N, splits, L.stream);
      });
    }
    if (N > S) paged_prompt_attention(out, qkv, cache, block_table, seq_start, pos, H, Hkv, D);
    return;
  }
  const int splits = paged_splits(N, int(Hkv), max_blocks * a.block_size);
  const bool prompts = N > S && paged_prompt_attention_supported(out, qkv, cache, D);
  a.skip_prompts = prompts ? 1 : 0;
  OpLaunch L(qkv);
  dispatch_paged(op, qkv.dtype(), cache.dtype(), [&](auto* tag, auto* ctag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = std::remove_pointer_t<decltype(ctag)>;
    constexpr int V = 16 / int(sizeof(T));
    if (D % V == 0 && all_aligned16(ptr<C>(cache), ptr<T>(qkv)))
      launch_paged_attention_v<T, C, V>(ptr<T>(out), ptr<T>(qkv), ptr<C>(cache), a, N, splits, qkv, L.stream);
    else
      launch_paged_attention_v<T, C, 1>(ptr<T>(out), ptr<T>(qkv), ptr<C>(cache), a, N, splits, qkv, L.stream);
  });
  if (prompts) paged_prompt_attention(out, qkv, cache, block_table, seq_start, pos, H, Hkv, D);
}

}  // namespace dscpp::cuda
