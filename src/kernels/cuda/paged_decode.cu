// Decode tokens' paged attention on tensor cores (kernels/cuda/paged_common.cuh).
//
// Note [Paged decode on tensor cores]
// A decode token's attention reads its sequence's K and V once and does little arithmetic per byte (the G query
// heads of a GQA group share each K/V row), so the kernel is a memory stream: it is as fast as the bytes it keeps
// in flight. One CTA per (token, kv head, split), four warps. The G <= 16 query heads are the rows of one m16 tile,
// held as A fragments in registers for the whole CTA. Each warp walks its own 16-key steps of the CTA's positions
// (warp w: steps w, w + 4, ...) through its own two-stage cp.async pipeline in shared memory, so warps never wait
// for each other until the end: per step S = Q K^T (16 x 16 on mma.m16n8k16), online softmax in the exp2 domain,
// O += P V with P straight from the accumulators. The four warps' (m, l, O) are then merged in shared memory. An fp8
// cache is copied raw (16 codes per cp.async) and widened to T in the warp's shared memory before the mma (every
// e4m3 value is exact in bf16 and f16), so fp8 reads half the bytes with the same overlap as a 16-bit cache.
// Splits (FlashDecoding) follow the shapes alone (paged_decode_mma_splits), the token's positions are cut evenly
// over them in whole steps, and splits > 1 write the CUDA-core kernel's partials, which the last CTA of each
// (token, kv head) to finish merges (merge_splits_if_last, Note [Paged attention design]): no merge kernel, one
// launch a layer less at decode.
// Replaced, measured: the 128-row flash tile with the group's heads as rows (one warp of four computing, a CTA-wide
// barrier per 64-key tile, an fp8 cache widened synchronously) and, at small batches, the CUDA-core split-K kernel
// (docs/PERF.md).
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_cache_elem.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/paged_common.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kKeys = 16;    // keys per warp step: the n of two m16n8 score tiles, the k of the P V mma
constexpr int kStages = 2;   // steps a warp has in shared memory: one computed while the next lands
constexpr int kMaxSplits = 32;
constexpr int kTargetCtas = 512;  // split while N * Hkv CTAs would leave the GPU's SMs short of work

// One warp's shared memory: kStages steps of K and V rows as they arrive (T rows of LD = D + 8 elements, or raw
// fp8 rows of D bytes), then, for fp8, the step widened to T.
template <typename T, typename C, int D>
struct WarpTiles {
  static constexpr int LD = D + 8;
  static constexpr bool kFp8 = !std::is_same_v<C, T>;
  static constexpr int kRowBytes = kFp8 ? D : LD * 2;  // a stage row
  static constexpr int kStageBytes = 2 * kKeys * kRowBytes;
  static constexpr int kWideBytes = kFp8 ? 2 * kKeys * LD * 2 : 0;
  static constexpr int kBytes = kStages * kStageBytes + kWideBytes;
};

template <typename T, typename C, int D>
constexpr size_t decode_smem_bytes() {
  const size_t tiles = size_t(kWarps) * WarpTiles<T, C, D>::kBytes;
  const size_t merge = size_t(kWarps) * 16 * (D + 2) * sizeof(float);
  return std::max(tiles, merge);
}

template <typename T, typename C, int D>
__global__ void __launch_bounds__(kThreads)
    paged_decode_mma_kernel(T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                            const T* __restrict__ qkv, const C* __restrict__ cache, PagedArgs a, float scale_log2) {
  using W = WarpTiles<T, C, D>;
  constexpr int LD = W::LD, KD = D / 16, DT = D / 8;
  constexpr int kElems = 16 / int(sizeof(C));  // cache elements per 16-byte copy
  constexpr int kCopiesPerRow = D / kElems;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int bad;
  const int n = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int H = a.H, G = H / a.Hkv;
  const int s = sequence_of(a.seq_start, a.S, n);
  // A prompt chunk's token is the prompt kernel's when it runs (N > S); with empty sequences beside a chunk (N <= S,
  // never in the engine's batches) this kernel takes it too: each token's attention is its own here.
  if (a.skip_prompts && a.seq_start[s + 1] - a.seq_start[s] >= 2) return;
  const int p = a.pos[n];
  const bool bad_pos = p < 0 || p >= a.max_blocks * a.block_size;
  const int len = bad_pos ? 0 : p + 1;
  const int chunk = (len + splits * kKeys - 1) / (splits * kKeys) * kKeys;
  const int begin = min(len, split * chunk), end = min(len, begin + chunk);
  const int steps = (end - begin + kKeys - 1) / kKeys;
  const int64_t head0 = int64_t(kh) * G;  // the group's first query head

  if (steps == 0) {  // nothing to attend to: a split past the token's context, or a position outside the cache
    if (splits == 1) {
      for (int i = threadIdx.x; i < G * D; i += kThreads) out[(int64_t(n) * H + head0) * D + i] = nan_of<T>();
      return;
    }
    const float m = bad_pos && split == 0 ? NAN : -INFINITY;  // the merge weighs -inf by 0; NaN poisons
    for (int r = threadIdx.x; r < G; r += kThreads) {
      const int64_t at = (int64_t(n) * H + head0 + r) * splits + split;
      part_ml[at * 2] = m, part_ml[at * 2 + 1] = 0.0f;
    }
    return merge_splits_if_last(out, part_acc, part_ml, a, n, kh, splits, reinterpret_cast<float*>(smem));
  }
  if (threadIdx.x == 0) bad = 0;

  // Q: rows g and g + 8 of the m16 tile are query heads g, g + 8 of the group (zero past G).
  uint32_t qa[KD][4];
  {
    const T* q = qkv + int64_t(n) * (H + 2 * a.Hkv) * D + head0 * D;
#pragma unroll
    for (int kk = 0; kk < KD; kk++)
#pragma unroll
      for (int x = 0; x < 4; x++) {
        const int row = g + (x & 1) * 8, col = kk * 16 + 2 * tq + (x >> 1) * 8;
        qa[kk][x] = row < G ? *reinterpret_cast<const uint32_t*>(q + row * D + col) : 0u;
      }
  }
  __syncthreads();  // `bad` initialised before any warp may set it

  unsigned char* mine = smem + warp * W::kBytes;
  const int64_t slot = int64_t(2) * a.Hkv * D, v_off = int64_t(a.Hkv) * D;
  const C* kbase = cache + int64_t(kh) * D;
  const int32_t* blocks = a.block_table + int64_t(s) * a.max_blocks;
  const int my_steps = steps > warp ? (steps - warp + kWarps - 1) / kWarps : 0;

  // Step i of this warp (keys begin + (warp + 4 i) * 16 ..) into stage `st`: lane r < 16 finds row r's slot, every
  // lane copies 16-byte pieces of K and V; rows past `end` (and rows of a bad block) are zero-filled.
  auto issue = [&](int i, int st) {
    const int j0 = begin + (warp + kWarps * i) * kKeys;
    int64_t off = 0;
    int ok = 0;
    if (lane < kKeys && j0 + lane < end) {
      const int j = j0 + lane, blk = blocks[j / a.block_size];
      ok = blk >= 0 && blk < a.n_blocks;
      if (!ok) bad = 1;  // benign race: every writer stores 1
      off = (int64_t(blk) * a.block_size + j % a.block_size) * slot;
    }
    unsigned char* dk = mine + st * W::kStageBytes;
    unsigned char* dv = dk + kKeys * W::kRowBytes;
#pragma unroll
    for (int c = lane; c < kKeys * kCopiesPerRow; c += 32) {
      const int r = c / kCopiesPerRow, col = (c % kCopiesPerRow) * kElems;
      const int64_t o = __shfl_sync(0xffffffffu, off, r);
      const bool okr = __shfl_sync(0xffffffffu, ok, r);
      const C* src = okr ? kbase + o + col : kbase;
      cp_async16(dk + r * W::kRowBytes + col * int(sizeof(C)), src, okr);
      cp_async16(dv + r * W::kRowBytes + col * int(sizeof(C)), okr ? src + v_off : kbase, okr);
    }
  };

  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

#pragma unroll
  for (int i = 0; i < kStages - 1; i++) {
    if (i < my_steps) issue(i, i);
    cp_async_commit();
  }
  for (int i = 0; i < my_steps; i++) {
    if (i + kStages - 1 < my_steps) issue(i + kStages - 1, (i + kStages - 1) % kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned char* stage = mine + (i % kStages) * W::kStageBytes;
    const T* ks;
    const T* vs;
    if constexpr (W::kFp8) {
      T* wk = reinterpret_cast<T*>(mine + kStages * W::kStageBytes);
      T* wv = wk + kKeys * LD;
#pragma unroll
      for (int c = lane; c < 2 * kKeys * (D / 8); c += 32) {  // 8 codes at a time, K rows then V rows
        const int r = c / (D / 8), col = (c % (D / 8)) * 8;
        const uint2 q = *reinterpret_cast<const uint2*>(stage + r * D + col);
        *reinterpret_cast<uint4*>(wk + r * LD + col) = widen_fp8x8<T>(q);  // r >= 16: wv's rows
      }
      __syncwarp();
      ks = wk, vs = wv;
    } else {
      ks = reinterpret_cast<const T*>(stage);
      vs = ks + kKeys * LD;
    }

    // S = Q K^T: two n-tiles of 8 keys.
    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      uint32_t b[4];
      ldsm_x4(b, ks + ((lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
      mma16816<T>(sc[0], qa[kk], b[0], b[1]);
      mma16816<T>(sc[1], qa[kk], b[2], b[3]);
    }
    const int j0 = begin + (warp + kWarps * i) * kKeys;
    if (j0 + kKeys > end) {
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          if (j0 + nt * 8 + 2 * tq + (e & 1) >= end) sc[nt][e] = -INFINITY;
    }
    // Online softmax on raw scores (rows g: elements 0, 1; g + 8: 2, 3); a row's four threads are a quad.
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = fmaxf(m[r], fmaxf(fmaxf(sc[0][2 * r], sc[0][2 * r + 1]), fmaxf(sc[1][2 * r], sc[1][2 * r + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float ms = mx * scale_log2;  // finite: the step's first key is valid
      const float alpha = exp2f(m[r] * scale_log2 - ms);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
        sc[nt][2 * r] = exp2f(fmaf(sc[nt][2 * r], scale_log2, -ms));
        sc[nt][2 * r + 1] = exp2f(fmaf(sc[nt][2 * r + 1], scale_log2, -ms));
        sum += sc[nt][2 * r] + sc[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
#pragma unroll
      for (int dt = 0; dt < DT; dt++) o[dt][2 * r] *= alpha, o[dt][2 * r + 1] *= alpha;
    }
    // O += P V.
    const uint32_t pa[4] = {pack2<T>(sc[0][0], sc[0][1]), pack2<T>(sc[0][2], sc[0][3]),
                            pack2<T>(sc[1][0], sc[1][1]), pack2<T>(sc[1][2], sc[1][3])};
#pragma unroll
    for (int nn = 0; nn < DT / 2; nn++) {
      uint32_t b[4];
      ldsm_x4_trans(b, vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + nn * 16 + (lane >> 4) * 8);
      mma16816<T>(o[2 * nn], pa, b[0], b[1]);
      mma16816<T>(o[2 * nn + 1], pa, b[2], b[3]);
    }
    __syncwarp();  // this stage (and the widened tile) is refilled by the next iteration
  }
  cp_async_wait<0>();

  // The warps' (m, l, O) into shared memory (reusing the tiles), then each (head, d) merged over the warps.
  __syncthreads();
  float* mw = reinterpret_cast<float*>(smem);  // [kWarps][16]
  float* lw = mw + kWarps * 16;                 // [kWarps][16]
  float* ow = lw + kWarps * 16;                 // [kWarps][16][D]
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const int row = g + 8 * r;
    if (tq == 0) mw[warp * 16 + row] = m[r], lw[warp * 16 + row] = lr;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<float2*>(ow + (warp * 16 + row) * D + dt * 8 + 2 * tq) =
          make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
  }
  __syncthreads();
  const bool poisoned = bad != 0;
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int row = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, mw[w * 16 + row]);
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      const float mwr = mw[w * 16 + row];
      if (mwr == -INFINITY) continue;  // a warp with no step
      const float c = exp2f((mwr - M) * scale_log2);
      L += c * lw[w * 16 + row];
      O += c * ow[(w * 16 + row) * D + d];
    }
    const int64_t h = head0 + row;
    if (splits == 1) {
      out[(int64_t(n) * H + h) * D + d] = poisoned ? nan_of<T>() : from_f<T>(O / L);
    } else {
      const int64_t at = (int64_t(n) * H + h) * splits + split;
      part_acc[at * D + d] = poisoned ? NAN : O;
      if (d == 0) part_ml[at * 2] = poisoned ? NAN : M * scale_log2 * kLn2, part_ml[at * 2 + 1] = L;
    }
  }
  if (splits > 1) merge_splits_if_last(out, part_acc, part_ml, a, n, kh, splits, mw);
}

template <typename T, typename C, int D>
void launch(const Tensor& out, float* part_acc, float* part_ml, const Tensor& qkv, const Tensor& cache,
            const PagedArgs& a, int64_t N, int splits, cudaStream_t stream) {
  auto kernel = paged_decode_mma_kernel<T, C, D>;
  constexpr size_t smem = decode_smem_bytes<T, C, D>();
  static_assert(smem >= merge_scratch_bytes(16, kMaxSplits), "the split-K merge reuses the shared memory");
  if (smem > 48 * 1024)
    DSCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(unsigned(N), unsigned(a.Hkv), unsigned(splits)), kThreads, smem, stream>>>(
      ptr<T>(out), part_acc, part_ml, ptr<T>(qkv), ptr<C>(cache), a, a.scale * kLog2e);
  DSCPP_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool paged_decode_mma_supported(const Tensor& out, const Tensor& qkv, const Tensor& cache, int64_t H, int64_t Hkv,
                                int64_t D) {
  return (D == 64 || D == 128) && H % Hkv == 0 && H / Hkv <= 16 &&
         (qkv.dtype() == DType::bf16 || qkv.dtype() == DType::f16) &&
         (cache.dtype() == qkv.dtype() || cache.dtype() == DType::fp8_e4m3) &&
         all_aligned16(out.raw(), qkv.raw(), cache.raw());
}

// Enough CTAs to fill the GPU, each split at least one step of every warp; from the shapes alone, so a call gives
// the same bits on every run and a captured graph serves every context up to max_ctx.
int paged_decode_mma_splits(int64_t N, int64_t Hkv, int64_t max_ctx) {
  const int64_t ctas = N * Hkv;
  if (ctas >= kTargetCtas) return 1;
  const int64_t s = std::min(ceil_div(int64_t(kTargetCtas), ctas), ceil_div(max_ctx, int64_t(kWarps * kKeys)));
  return int(std::clamp<int64_t>(s, 1, kMaxSplits));
}

void paged_decode_mma(const Tensor& out, float* part_acc, float* part_ml, const Tensor& qkv, const Tensor& cache,
                      const PagedArgs& a, int64_t N, int splits, cudaStream_t stream) {
  dispatch_paged("paged_attention_forward", qkv.dtype(), cache.dtype(), [&](auto* tag, auto* ctag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = std::remove_pointer_t<decltype(ctag)>;
    if constexpr (!std::is_same_v<T, float>) {
      if (a.D == 64) launch<T, C, 64>(out, part_acc, part_ml, qkv, cache, a, N, splits, stream);
      else launch<T, C, 128>(out, part_acc, part_ml, qkv, cache, a, N, splits, stream);
    }
  });
}

}  // namespace dscpp::cuda
