// Causal grouped-query attention on packed qkv (attention_forward / attention_backward of cuda_ops.h): the same
// function as the CPU reference src/kernels/cpu/attention.cpp, flash-attention style (only lse[B,H,T] is saved).
//
// Note [Flash attention design]
// Two paths, chosen per call:
//  * Tensor-core path (bf16/f16, D = 64 or 128, 16-byte aligned pointers): FlashAttention-2 on mma.sync
//    m16n8k16 (f32 accumulation), operands staged in shared memory by cp.async (double-buffered) and read with
//    ldmatrix; rows padded by 16 bytes so ldmatrix is free of bank conflicts.
//      forward   one CTA = 128 query rows of one (b, h), 4 warps x 32 rows (two m-tiles per warp, so each K/V
//                fragment read by ldmatrix feeds four mma: one m-tile per warp was shared-memory bound, 158 -> 181
//                TFLOP/s at D = 64, 177 -> 235 at D = 128 on an H100); loops over 64-key blocks up to the
//                diagonal (causal block skipping; a warp skips tiles wholly above its rows), online softmax in f32
//                in the log2 domain on raw scores (scale folded into one FFMA); P stays in registers and is
//                rounded to the input dtype for the P @ V product (as FlashAttention does), row sums use f32 P.
//                Q fragments stay in registers at D = 64, re-read per tile at D = 128 (255 registers already).
//      backward  Di = rowsum(dO * O) (a small kernel), then two deterministic kernels, no atomics:
//                dq:   Q-stationary, like the forward: S = Q K^T, P = exp(S/sqrt(D) - lse), dP = dO V^T,
//                      dS = P (dP - Di), dQ += dS K.
//                dkdv: KV-stationary, one CTA = 64 keys of one kv head; it loops over every query head of the
//                      GQA group and every query block at or after the diagonal, with S^T = K Q^T, dP^T = V dO^T,
//                      dV += P^T dO, dK += dS^T Q; the group's sum stays in registers (deterministic).
//                This recomputes S and dP in both kernels (7 matmuls instead of FA2's 5) in exchange for no
//                atomics and no f32 dq scratch. Measured (H100, 2026): FA2's single kernel (this dkdv kernel plus
//                dS in shared memory, dQ += dS K added with f32 atomics) was only 2% (D = 64) / 7% (D = 128)
//                faster, atomics costing ~5%: the bound is the one-m-tile-per-warp S^T/dP^T products (ldmatrix per
//                two mma), so that change was not kept; the next step is two m-tiles per warp here too.
//  * General path (f32 inputs, other head dims up to 256, unaligned views): plain f32 math, one warp per query row
//    (forward, dq) or per key row (dk/dv), keys/queries taken 32 at a time with one lane each. Slow but exact
//    to f32 rounding: pure-f32 training matches the CPU reference.
// Masking: key j is visible to query i when j <= i; rows and keys past T are zero-filled in shared memory and
// masked explicitly, so any T >= 1 works. Query blocks run heaviest-first (reversed block index).
#include <cuda_fp8.h>

#include <cmath>
#include <type_traits>

#include "kernels/attention_calls.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_cache_elem.cuh"
#include "kernels/cuda/mma.cuh"

namespace dscpp::cuda {
namespace {

// ---- tiles and warp-level products (shared-memory tiles have row stride LD = D + 8 elements) ----
// Rows [r0, r0 + ROWS) of a head slice (row r at g + r * stride, D elements) into s[ROWS][LD]; rows >= nrows are
// zero-filled. Issued with cp.async by all NT threads; the caller commits and waits.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t stride, int r0, int nrows) {
  constexpr int kChunks = D / 8, LD = D + 8;
  for (int c = threadIdx.x; c < ROWS * kChunks; c += NT) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r0 + r < nrows;
    cp_async16(s + r * LD + col, ok ? g + int64_t(r0 + r) * stride + col : g, ok);
  }
}

// A fragments of the warp's 16 rows (sA points at its first row), K columns.
template <int K, int LD, typename T>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[K / 16][4], const T* sA, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) ldsm_x4(a[kk], sA + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
}

// acc[16 x 8*NT8] += A[16 x K] @ B^T, A in registers, B[NT8*8 rows][K] in shared memory (k contiguous).
template <typename T, int K, int NT8, int LD>
__device__ __forceinline__ void mma_abt_rega(float (&acc)[NT8][4], const uint32_t (&a)[K / 16][4], const T* sB,
                                             int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++)
#pragma unroll
    for (int nn = 0; nn < NT8 / 2; nn++) {
      uint32_t b[4];  // {n-tile 2nn: k lo, k hi}, {n-tile 2nn+1: k lo, k hi}
      ldsm_x4(b, sB + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
      mma16816<T>(acc[2 * nn], a[kk], b[0], b[1]);
      mma16816<T>(acc[2 * nn + 1], a[kk], b[2], b[3]);
    }
}

// The same with A read from shared memory (sA at the warp's first row) one k-step at a time (fewer registers).
template <typename T, int K, int NT8, int LD>
__device__ __forceinline__ void mma_abt_smema(float (&acc)[NT8][4], const T* sA, const T* sB, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t a[4];
    ldsm_x4(a, sA + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int nn = 0; nn < NT8 / 2; nn++) {
      uint32_t b[4];
      ldsm_x4(b, sB + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
      mma16816<T>(acc[2 * nn], a, b[0], b[1]);
      mma16816<T>(acc[2 * nn + 1], a, b[2], b[3]);
    }
  }
}

// acc[16 x 8*NT8] += A[16 x K] @ B, A in registers, B[K rows][NT8*8] in shared memory (n contiguous: ldmatrix.trans).
template <typename T, int K, int NT8, int LD>
__device__ __forceinline__ void mma_ab_rega(float (&acc)[NT8][4], const uint32_t (&a)[K / 16][4], const T* sB,
                                            int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++)
#pragma unroll
    for (int nn = 0; nn < NT8 / 2; nn++) {
      uint32_t b[4];  // matrices: (k lo, n lo), (k hi, n lo), (k lo, n hi), (k hi, n hi)
      ldsm_x4_trans(b, sB + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + nn * 16 + (lane >> 4) * 8);
      mma16816<T>(acc[2 * nn], a[kk], b[0], b[1]);
      mma16816<T>(acc[2 * nn + 1], a[kk], b[2], b[3]);
    }
}

// Accumulator fragments of a 16 x 8*NT8 tile as A fragments (16 x 16 per k-step), rounded to T.
template <typename T, int NT8>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[NT8 / 2][4], const float (&c)[NT8][4]) {
#pragma unroll
  for (int kk = 0; kk < NT8 / 2; kk++) {
    a[kk][0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// ---- tensor-core kernels ----
constexpr int kFlashWarps = 4, kFlashThreads = 32 * kFlashWarps;
constexpr int kBlockK = 64;                // key rows per tile (forward) and per CTA (backward: 16 per warp)
static_assert(kBlockK == 16 * kFlashWarps, "the backward gives each warp 16 key rows");
constexpr int kFwdBlockQ = 32 * kFlashWarps;  // forward query rows per CTA: each warp owns two 16-row m-tiles

template <int D>
constexpr size_t fwd_smem_bytes() { return size_t(kFwdBlockQ + 4 * kBlockK) * (D + 8) * 2; }
constexpr int kBlockQ = 16 * kFlashWarps;  // backward dq query rows per CTA (one m-tile per warp)
template <int D>
constexpr size_t dq_smem_bytes() { return size_t(2 * kBlockQ + 4 * kBlockK) * (D + 8) * 2; }
template <int D>
constexpr int dkdv_block_q() { return D <= 64 ? 64 : 32; }  // query tile of the dkdv loop (registers: D = 128)
template <int D>
constexpr size_t dkdv_smem_bytes() {
  return size_t(2 * kBlockK + 4 * dkdv_block_q<D>()) * (D + 8) * 2 + 4 * dkdv_block_q<D>() * sizeof(float);
}

// Where one forward CTA's keys and values come from (Note [Flash attention design]): rows [r0, r0 + kBlockK) of
// a kv head into sK / sV (cp.async; rows >= n zero-filled).
// DenseKV: a training sequence's rows of qkv, `stride` elements apart.
template <typename T, int D>
struct DenseKV {
  const T* k;
  const T* v;
  int64_t stride;
  int n;
  __device__ __forceinline__ void load(T* sK, T* sV, int r0) const {
    load_tile<T, kBlockK, D, kFlashThreads>(sK, k, stride, r0, n);
    load_tile<T, kBlockK, D, kFlashThreads>(sV, v, stride, r0, n);
  }
};
// PagedKV: a ragged batch's sequence in the paged KV cache (kernels/paged_ops.h): position j in slot
// blocks[j / block_size] * block_size + j % block_size, each slot `slot` elements holding the K then V heads. A
// block-table entry outside the cache loads zeros and sets *bad (the rows become NaN, as in the decode kernel).
// C is the cache's element: T (cp.async, as the dense tiles) or fp8 e4m3 (Note [fp8 KV cache]), whose 8-byte chunks
// are loaded into registers and widened to T on their way into shared memory. Every e4m3 value is exact in bf16 and
// f16, so the tile the mma reads is the one a 16-bit cache of the same values would give.
template <typename T, typename C, int D>
struct PagedKV {
  const C* k;  // the cache, advanced to this kv head's K (V is v_off further)
  const int32_t* blocks;
  int64_t slot, v_off;
  int n, block_size, n_blocks;
  int* bad;  // shared
  __device__ __forceinline__ void load(T* sK, T* sV, int r0) const {
    constexpr int kChunks = D / 8, LD = D + 8;
    for (int c = threadIdx.x; c < kBlockK * kChunks; c += kFlashThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8, j = r0 + r;
      const int blk = j < n ? blocks[j / block_size] : 0;
      const bool ok = j < n && blk >= 0 && blk < n_blocks;
      if (j < n && !ok) *bad = 1;  // benign race: every writer stores 1
      const C* src = ok ? k + (int64_t(blk) * block_size + j % block_size) * slot + col : k;
      if constexpr (std::is_same_v<C, T>) {
        cp_async16(sK + r * LD + col, src, ok);
        cp_async16(sV + r * LD + col, ok ? src + v_off : k, ok);
      } else {
        uint2 kq = make_uint2(0, 0), vq = make_uint2(0, 0);  // zero codes are +0
        if (ok) kq = *reinterpret_cast<const uint2*>(src), vq = *reinterpret_cast<const uint2*>(src + v_off);
        *reinterpret_cast<uint4*>(sK + r * LD + col) = widen_fp8x8<T>(kq);
        *reinterpret_cast<uint4*>(sV + r * LD + col) = widen_fp8x8<T>(vq);
      }
    }
  }
};

// One forward CTA: query rows [q0, q0 + 128) of nq rows (row i at qg + i * q_stride) whose positions are
// offset + i (a sequence's tokens: training, prompt chunks), over keys 0 .. nk - 1 from `kv`; key j is visible to
// row i when j <= its position. Writes out rows (row i at out + i * out_stride) and, when lse is given, lse[i].
// Each warp owns 32 query rows (two m-tiles) so that every K/V fragment read from shared memory feeds four mma
// instead of two (one m-tile per warp is shared-memory bound on H100); a warp with no rows only loads. Q fragments
// stay in registers for D = 64 and are re-read per key tile for D = 128 (register budget).
template <typename T, int D, typename KV>
__device__ __forceinline__ void flash_fwd_tile(T* __restrict__ out, int64_t out_stride, float* __restrict__ lse,
                                               const T* __restrict__ qg, int64_t q_stride, int nq, int q0,
                                               int offset, int nk, const KV& kv, float scale_log2,
                                               const int* bad) {
  constexpr int LD = D + 8, BQ = kFwdBlockQ, BK = kBlockK, ST = BK / 8, DT = D / 8, KD = D / 16;
  constexpr bool kQReg = D <= 64;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + BQ * LD;      // [2][BK][LD]
  T* sV = sK + 2 * BK * LD;  // [2][BK][LD]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const int last = offset + min(q0 + BQ, nq) - 1;   // the CTA's last row's position
  const int nkb = min((nk + BK - 1) / BK, last / BK + 1);          // causal: keys up to it
  const int wrow = q0 + warp * 32;                                 // the warp's first query row
  const int wfirst = offset + wrow, wlast = offset + wrow + 31;  // its positions

  load_tile<T, BQ, D, kFlashThreads>(sQ, qg, q_stride, q0, nq);
  cp_async_commit();  // group: Q
  kv.load(sK, sV, 0);
  cp_async_commit();  // group: key block 0
  cp_async_wait<1>();  // Q has landed (key block 0 may still be in flight)
  __syncthreads();
  const T* sQw = sQ + warp * 32 * LD;
  uint32_t qf[2][kQReg ? KD : 1][4];
  if constexpr (kQReg) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++) load_a_frags<D, LD>(qf[mi], sQw + mi * 16 * LD, lane);
  }

  float o[2][DT][4];
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[mi][dt][0] = o[mi][dt][1] = o[mi][dt][2] = o[mi][dt][3] = 0.0f;
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  const int row0 = wrow + (lane >> 2);  // this thread's rows: row0 + 16 mi + 8 r

  for (int kb = 0; kb < nkb; kb++) {
    const int buf = kb & 1;
    if (kb + 1 < nkb) {  // prefetch the next key block into the other buffer (freed by last iteration's barrier)
      kv.load(sK + (buf ^ 1) * BK * LD, sV + (buf ^ 1) * BK * LD, (kb + 1) * BK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = kb * BK;
    if (wrow < nq && k0 <= wlast) {  // warp-uniform: skip key tiles entirely above this warp's rows (all masked)
      const T* ks = sK + buf * BK * LD;
      const T* vs = sV + buf * BK * LD;

      float s[2][ST][4];
#pragma unroll
      for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nt = 0; nt < ST; nt++) s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        uint32_t a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
          if constexpr (kQReg) {
#pragma unroll
            for (int x = 0; x < 4; x++) a[mi][x] = qf[mi][kk][x];
          } else {
            ldsm_x4(a[mi], sQw + (mi * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
          }
        }
#pragma unroll
        for (int nn = 0; nn < ST / 2; nn++) {
          uint32_t bf[4];  // {n-tile 2nn: k lo, k hi}, {n-tile 2nn+1: k lo, k hi}
          ldsm_x4(bf, ks + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mi = 0; mi < 2; mi++) {
            mma16816<T>(s[mi][2 * nn], a[mi], bf[0], bf[1]);
            mma16816<T>(s[mi][2 * nn + 1], a[mi], bf[2], bf[3]);
          }
        }
      }

      const bool need_mask = k0 + BK - 1 > wfirst || k0 + BK > nk;
      if (need_mask) {
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
          for (int nt = 0; nt < ST; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int j = k0 + nt * 8 + 2 * tq + (e & 1), i = row0 + mi * 16 + (e >> 1) * 8;
              if (j > offset + i || j >= nk) s[mi][nt][e] = -INFINITY;
            }
      }
      // Online softmax on raw scores (the scale folds into one FFMA per element); a row's 4 threads are a quad.
#pragma unroll
      for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          float mx = m[mi][r];
#pragma unroll
          for (int nt = 0; nt < ST; nt++) mx = fmaxf(mx, fmaxf(s[mi][nt][2 * r], s[mi][nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row fully masked so far keeps p = 0 and no NaN.
          const float mscaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
          const float alpha = exp2f(m[mi][r] * scale_log2 - mscaled);  // m = -inf: 0
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < ST; nt++) {
            const float p0 = exp2f(fmaf(s[mi][nt][2 * r], scale_log2, -mscaled));
            const float p1 = exp2f(fmaf(s[mi][nt][2 * r + 1], scale_log2, -mscaled));
            s[mi][nt][2 * r] = p0;
            s[mi][nt][2 * r + 1] = p1;
            sum += p0 + p1;
          }
          l[mi][r] = l[mi][r] * alpha + sum;  // this thread's partial row sum; the quad's parts are added at the end
          m[mi][r] = mx;
#pragma unroll
          for (int dt = 0; dt < DT; dt++) {
            o[mi][dt][2 * r] *= alpha;
            o[mi][dt][2 * r + 1] *= alpha;
          }
        }
      // O += P V, P straight from the accumulators (rounded to T) as the A operand.
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t pa[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
          pa[mi][0] = pack2<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
          pa[mi][1] = pack2<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
          pa[mi][2] = pack2<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
          pa[mi][3] = pack2<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
        }
#pragma unroll
        for (int nn = 0; nn < DT / 2; nn++) {
          uint32_t bf[4];  // matrices: (k lo, n lo), (k hi, n lo), (k lo, n hi), (k hi, n hi)
          ldsm_x4_trans(bf, vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + nn * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int mi = 0; mi < 2; mi++) {
            mma16816<T>(o[mi][2 * nn], pa[mi], bf[0], bf[1]);
            mma16816<T>(o[mi][2 * nn + 1], pa[mi], bf[2], bf[3]);
          }
        }
      }
    }
    __syncthreads();  // the buffer read here is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float lr = l[mi][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int i = row0 + mi * 16 + r * 8;
      if (i >= nq) continue;
      const float inv = bad && *bad ? NAN : 1.0f / lr;
      T* orow = out + int64_t(i) * out_stride;
#pragma unroll
      for (int dt = 0; dt < DT; dt++)
        *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * tq) =
            pack2<T>(o[mi][dt][2 * r] * inv, o[mi][dt][2 * r + 1] * inv);
      if (lse && tq == 0) lse[i] = (m[mi][r] * scale_log2 + log2f(lr)) * kLn2;
    }
}

// out[B,T,H*D], lse[B,H,T] from qkv[B,T,(H+2Hkv)*D]. Grid (ceil(T/128), H, B), 128 threads; query blocks run
// heaviest first.
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads) flash_fwd_kernel(T* __restrict__ out, float* __restrict__ lse,
                                                                  const T* __restrict__ qkv, int seq, int H, int Hkv,
                                                                  float scale_log2) {
  const int nqb = (seq + kFwdBlockQ - 1) / kFwdBlockQ;
  const int qb = nqb - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int kh = h / (H / Hkv);
  const int64_t R = int64_t(H + 2 * Hkv) * D;
  const T* base = qkv + int64_t(b) * seq * R;
  const DenseKV<T, D> kv{base + int64_t(H + kh) * D, base + int64_t(H + Hkv + kh) * D, R, seq};
  flash_fwd_tile<T, D>(out + int64_t(b) * seq * H * D + int64_t(h) * D, int64_t(H) * D,
                       lse + (int64_t(b) * H + h) * seq, base + int64_t(h) * D, R, seq, qb * kFwdBlockQ, 0, seq,
                       kv, scale_log2, nullptr);
}

// Note [Paged prompt attention]: the prompt chunks of a ragged batch (sequences bringing 2 or more new tokens)
// through the same tensor-core tile, keys and values read through the block table. Grid (upper bound on the
// sequences' 128-row query blocks, H); each CTA finds its (sequence, query block) by a warp scan over seq_start
// (work past the last block exits). Sequences of one new token are the decode kernel's (Note [Paged decode on tensor
// cores], paged_decode.cu).
template <typename T, typename C, int D>
__global__ void __launch_bounds__(kFlashThreads)
    paged_flash_fwd_kernel(T* __restrict__ out, const T* __restrict__ qkv, const C* __restrict__ cache,
                           const int32_t* __restrict__ block_table, const int32_t* __restrict__ seq_start,
                           const int32_t* __restrict__ pos, int S, int max_blocks, int block_size, int n_blocks, int H,
                           int Hkv, float scale_log2) {
  __shared__ int found_s, found_qb, bad;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    if (lane == 0) found_s = -1, bad = 0;
    __syncwarp();
    int before = 0;  // query blocks of the sequences already passed
    for (int s0 = 0; s0 < S; s0 += 32) {
      const int s = s0 + lane;
      const int n = s < S ? seq_start[s + 1] - seq_start[s] : 0;
      const int c = n >= 2 ? (n + kFwdBlockQ - 1) / kFwdBlockQ : 0, incl = warp_inclusive_sum(c);
      const int target = int(blockIdx.x);
      if (c > 0 && target >= before + incl - c && target < before + incl)
        found_s = s, found_qb = target - (before + incl - c);
      before += __shfl_sync(0xffffffffu, incl, 31);
      if (before > target) break;
    }
  }
  __syncthreads();
  if (found_s < 0) return;
  const int s = found_s, h = blockIdx.y, kh = h / (H / Hkv);
  const int n0 = seq_start[s], nq = seq_start[s + 1] - n0, offset = pos[n0];
  const int64_t R = int64_t(H + 2 * Hkv) * D, slot = int64_t(2) * Hkv * D;
  if (threadIdx.x == 0 && (offset < 0 || offset + nq > max_blocks * block_size)) bad = 1;
  __syncthreads();
  const PagedKV<T, C, D> kv{cache + int64_t(kh) * D, block_table + int64_t(s) * max_blocks, slot, int64_t(Hkv) * D,
                         bad ? 0 : offset + nq, block_size, n_blocks, &bad};
  flash_fwd_tile<T, D>(out + int64_t(n0) * H * D + int64_t(h) * D, int64_t(H) * D, nullptr,
                       qkv + int64_t(n0) * R + int64_t(h) * D, R, nq, found_qb * kFwdBlockQ, bad ? 0 : offset,
                       bad ? nq : offset + nq, kv, scale_log2, &bad);
}

// dq part of dqkv. Grid (ceil(T/64), H, B), 128 threads. Di[B,H,T] = rowsum(dout * out).
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    flash_bwd_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                        const float* __restrict__ lse, const float* __restrict__ Di, int seq, int H, int Hkv,
                        float scale, float scale_log2) {
  constexpr int LD = D + 8, BQ = kBlockQ, BK = kBlockK, ST = BK / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + BQ * LD;
  T* sK = sdO + BQ * LD;     // [2][BK][LD]
  T* sV = sK + 2 * BK * LD;  // [2][BK][LD]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const int nqb = (seq + BQ - 1) / BQ;
  const int qb = nqb - 1 - int(blockIdx.x), h = blockIdx.y, b = blockIdx.z;
  const int kh = h / (H / Hkv);
  const int64_t R = int64_t(H + 2 * Hkv) * D, RO = int64_t(H) * D;
  const T* qg = qkv + int64_t(b) * seq * R + int64_t(h) * D;
  const T* kg = qkv + int64_t(b) * seq * R + int64_t(H + kh) * D;
  const T* vg = kg + int64_t(Hkv) * D;
  const T* dog = dout + int64_t(b) * seq * RO + int64_t(h) * D;
  const int q0 = qb * BQ;
  const int nkb = min((seq + BK - 1) / BK, (q0 + BQ - 1) / BK + 1);

  load_tile<T, BQ, D, kFlashThreads>(sQ, qg, R, q0, seq);
  load_tile<T, BQ, D, kFlashThreads>(sdO, dog, RO, q0, seq);
  load_tile<T, BK, D, kFlashThreads>(sK, kg, R, 0, seq);
  load_tile<T, BK, D, kFlashThreads>(sV, vg, R, 0, seq);
  cp_async_commit();

  const int row0 = q0 + warp * 16 + (lane >> 2);
  float lse2[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = row0 + r * 8;
    const int64_t idx = (int64_t(b) * H + h) * seq + i;
    lse2[r] = i < seq ? lse[idx] * kLog2e : 0.0f;
    di[r] = i < seq ? Di[idx] : 0.0f;
  }
  float dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  for (int kb = 0; kb < nkb; kb++) {
    const int buf = kb & 1;
    if (kb + 1 < nkb) {
      load_tile<T, BK, D, kFlashThreads>(sK + (buf ^ 1) * BK * LD, kg, R, (kb + 1) * BK, seq);
      load_tile<T, BK, D, kFlashThreads>(sV + (buf ^ 1) * BK * LD, vg, R, (kb + 1) * BK, seq);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* ks = sK + buf * BK * LD;
    const T* vs = sV + buf * BK * LD;
    float s[ST][4], dp[ST][4];
#pragma unroll
    for (int nt = 0; nt < ST; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
    mma_abt_smema<T, D, ST, LD>(s, sQ + warp * 16 * LD, ks, lane);    // S = Q K^T
    mma_abt_smema<T, D, ST, LD>(dp, sdO + warp * 16 * LD, vs, lane);  // dP = dO V^T
    const int k0 = kb * BK;
    const bool need_mask = k0 + BK - 1 > q0;  // also covers keys >= T (they are > every valid row)
#pragma unroll
    for (int nt = 0; nt < ST; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1;
        float p = exp2f(s[nt][e] * scale_log2 - lse2[r]);
        if (need_mask && k0 + nt * 8 + 2 * tq + (e & 1) > row0 + r * 8) p = 0.0f;
        s[nt][e] = p * (dp[nt][e] - di[r]);  // dS
      }
    uint32_t da[BK / 16][4];
    acc_to_a<T, ST>(da, s);
    mma_ab_rega<T, BK, DT, LD>(dq, da, ks, lane);  // dQ += dS K
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = row0 + r * 8;
    if (i >= seq) continue;
    T* row = dqkv + (int64_t(b) * seq + i) * R + int64_t(h) * D;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * tq) = pack2<T>(dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
  }
}

// dk and dv parts of dqkv. Grid (ceil(T/64), Hkv, B), 128 threads; each warp owns 16 key rows.
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    flash_bwd_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                          const float* __restrict__ lse, const float* __restrict__ Di, int seq, int H, int Hkv,
                          float scale, float scale_log2) {
  constexpr int LD = D + 8, BK = kBlockK, BQ = dkdv_block_q<D>(), QT = BQ / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + BK * LD;
  T* sQ = sV + BK * LD;       // [2][BQ][LD]
  T* sdO = sQ + 2 * BQ * LD;  // [2][BQ][LD]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BQ * LD);  // [2][BQ] lse
  float* sD = sL + 2 * BQ;                                   // [2][BQ] Di
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const int kb = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, G = H / Hkv;
  const int64_t R = int64_t(H + 2 * Hkv) * D, RO = int64_t(H) * D;
  const int k0 = kb * BK;
  const int nqb = (seq + BQ - 1) / BQ, qstart = k0 / BQ, per_head = nqb - qstart, niters = G * per_head;
  const T* kg = qkv + int64_t(b) * seq * R + int64_t(H + kh) * D;
  const T* vg = kg + int64_t(Hkv) * D;

  // Query tile `it` of the (head in group, query block) sequence into buffer `buf`.
  auto issue = [&](int it, int buf) {
    const int h = kh * G + it / per_head, i0 = (qstart + it % per_head) * BQ;
    load_tile<T, BQ, D, kFlashThreads>(sQ + buf * BQ * LD, qkv + int64_t(b) * seq * R + int64_t(h) * D, R, i0, seq);
    load_tile<T, BQ, D, kFlashThreads>(sdO + buf * BQ * LD, dout + int64_t(b) * seq * RO + int64_t(h) * D, RO, i0,
                                       seq);
    const int64_t base = (int64_t(b) * H + h) * seq;
    for (int x = threadIdx.x; x < BQ; x += kFlashThreads) {
      const bool ok = i0 + x < seq;
      cp_async4(sL + buf * BQ + x, ok ? lse + base + i0 + x : lse, ok);
      cp_async4(sD + buf * BQ + x, ok ? Di + base + i0 + x : Di, ok);
    }
  };
  load_tile<T, BK, D, kFlashThreads>(sK, kg, R, k0, seq);
  load_tile<T, BK, D, kFlashThreads>(sV, vg, R, k0, seq);
  issue(0, 0);
  cp_async_commit();

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; dt++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[dt][e] = dv[dt][e] = 0.0f;
  const int j0 = k0 + warp * 16 + (lane >> 2);  // this thread's key rows: j0 and j0 + 8

  for (int it = 0; it < niters; it++) {
    const int buf = it & 1;
    if (it + 1 < niters) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* qs = sQ + buf * BQ * LD;
    const T* dos = sdO + buf * BQ * LD;
    const float* ls = sL + buf * BQ;
    const float* ds = sD + buf * BQ;
    const int i0 = (qstart + it % per_head) * BQ;

    float st[QT][4], dpt[QT][4];
#pragma unroll
    for (int nt = 0; nt < QT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
    mma_abt_smema<T, D, QT, LD>(st, sK + warp * 16 * LD, qs, lane);    // S^T = K Q^T
    mma_abt_smema<T, D, QT, LD>(dpt, sV + warp * 16 * LD, dos, lane);  // dP^T = V dO^T
    const bool need_mask = i0 < k0 + BK - 1 || i0 + BQ > seq;
#pragma unroll
    for (int nt = 0; nt < QT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int il = nt * 8 + 2 * tq + (e & 1), i = i0 + il, j = j0 + (e >> 1) * 8;
        float p = exp2f(st[nt][e] * scale_log2 - ls[il] * kLog2e);
        if (need_mask && (i < j || i >= seq)) p = 0.0f;
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - ds[il]);  // dS^T
      }
    uint32_t pa[BQ / 16][4];
    acc_to_a<T, QT>(pa, st);
    mma_ab_rega<T, BQ, DT, LD>(dv, pa, dos, lane);  // dV += P^T dO
    acc_to_a<T, QT>(pa, dpt);
    mma_ab_rega<T, BQ, DT, LD>(dk, pa, qs, lane);   // dK += dS^T Q
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int j = j0 + r * 8;
    if (j >= seq) continue;
    T* krow = dqkv + (int64_t(b) * seq + j) * R + int64_t(H + kh) * D;
    T* vrow = krow + int64_t(Hkv) * D;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      *reinterpret_cast<uint32_t*>(krow + dt * 8 + 2 * tq) = pack2<T>(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(vrow + dt * 8 + 2 * tq) = pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

// Di[(b*H + h)*T + t] = sum_d dout[b,t,h,d] * out[b,t,h,d]: one warp per (b, t, h).
template <typename T>
__global__ void attn_bwd_dot_kernel(float* __restrict__ Di, const T* __restrict__ dout, const T* __restrict__ out,
                                    int64_t rows, int seq, int H, int D) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;  // (b*T + t)*H + h
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* a = dout + row * D;
  const T* c = out + row * D;
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) s += to_f(a[d]) * to_f(c[d]);
  s = warp_sum(s);
  if (lane == 0) {
    const int h = int(row % H);
    const int64_t bt = row / H, t = bt % seq, b = bt / seq;
    Di[(b * H + h) * seq + t] = s;
  }
}

// ---- general path (Note [Flash attention design]) ----
constexpr int kGenWarps = 4, kGenMaxD = 256, kGenC = kGenMaxD / 32;

template <typename T>
__device__ __forceinline__ float dot_sf(const float* s, const T* g, int D) {
  float acc = 0.0f;
  for (int d = 0; d < D; d++) acc += s[d] * to_f(g[d]);
  return acc;
}

// Grid (ceil(T/4), H, B), 128 threads; one warp per query row.
template <typename T>
__global__ void __launch_bounds__(32 * kGenWarps) attn_fwd_general_kernel(T* __restrict__ out, float* __restrict__ lse,
                                                                          const T* __restrict__ qkv, int seq, int H,
                                                                          int Hkv, int D, float scale) {
  __shared__ float sq[kGenWarps][kGenMaxD];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * kGenWarps + w, h = blockIdx.y, b = blockIdx.z;
  if (i >= seq) return;  // whole warp; no block barriers below
  const int64_t R = int64_t(H + 2 * Hkv) * D;
  const T* q = qkv + (int64_t(b) * seq + i) * R + int64_t(h) * D;
  const T* kbase = qkv + int64_t(b) * seq * R + int64_t(H + h / (H / Hkv)) * D;
  const T* vbase = kbase + int64_t(Hkv) * D;
  for (int d = lane; d < D; d += 32) sq[w][d] = to_f(q[d]);
  __syncwarp();
  float m = -INFINITY, l = 0.0f, o[kGenC];
#pragma unroll
  for (int c = 0; c < kGenC; c++) o[c] = 0.0f;
  for (int jb = 0; jb <= i; jb += 32) {
    const int j = jb + lane;
    const float s = j <= i ? dot_sf(sq[w], kbase + int64_t(j) * R, D) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));  // key jb <= i is valid: finite
    const float p = j <= i ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int c = 0; c < kGenC; c++) o[c] *= alpha;
    const int n = min(32, i - jb + 1);
    for (int jj = 0; jj < n; jj++) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const T* v = vbase + int64_t(jb + jj) * R;
#pragma unroll
      for (int c = 0; c < kGenC; c++)
        if (lane + 32 * c < D) o[c] += pj * to_f(v[lane + 32 * c]);
    }
    m = m_new;
  }
  T* orow = out + (int64_t(b) * seq + i) * int64_t(H) * D + int64_t(h) * D;
  const float inv = 1.0f / l;
#pragma unroll
  for (int c = 0; c < kGenC; c++)
    if (lane + 32 * c < D) orow[lane + 32 * c] = from_f<T>(o[c] * inv);
  if (lane == 0) lse[(int64_t(b) * H + h) * seq + i] = m + logf(l);
}

// dq part of dqkv. Grid (ceil(T/4), H, B), 128 threads; one warp per query row.
template <typename T>
__global__ void __launch_bounds__(32 * kGenWarps)
    attn_bwd_dq_general_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                               const float* __restrict__ lse, const float* __restrict__ Di, int seq, int H, int Hkv,
                               int D, float scale) {
  __shared__ float sq[kGenWarps][kGenMaxD], sdo[kGenWarps][kGenMaxD];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * kGenWarps + w, h = blockIdx.y, b = blockIdx.z;
  if (i >= seq) return;
  const int64_t R = int64_t(H + 2 * Hkv) * D;
  const T* q = qkv + (int64_t(b) * seq + i) * R + int64_t(h) * D;
  const T* dy = dout + (int64_t(b) * seq + i) * int64_t(H) * D + int64_t(h) * D;
  const T* kbase = qkv + int64_t(b) * seq * R + int64_t(H + h / (H / Hkv)) * D;
  const T* vbase = kbase + int64_t(Hkv) * D;
  for (int d = lane; d < D; d += 32) {
    sq[w][d] = to_f(q[d]);
    sdo[w][d] = to_f(dy[d]);
  }
  __syncwarp();
  const int64_t li = (int64_t(b) * H + h) * seq + i;
  const float L = lse[li], Dv = Di[li];
  float dq[kGenC];
#pragma unroll
  for (int c = 0; c < kGenC; c++) dq[c] = 0.0f;
  for (int jb = 0; jb <= i; jb += 32) {
    const int j = jb + lane;
    float ds = 0.0f;
    if (j <= i) {
      const float p = expf(dot_sf(sq[w], kbase + int64_t(j) * R, D) * scale - L);
      ds = p * (dot_sf(sdo[w], vbase + int64_t(j) * R, D) - Dv);
    }
    const int n = min(32, i - jb + 1);
    for (int jj = 0; jj < n; jj++) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      const T* k = kbase + int64_t(jb + jj) * R;
#pragma unroll
      for (int c = 0; c < kGenC; c++)
        if (lane + 32 * c < D) dq[c] += dsj * to_f(k[lane + 32 * c]);
    }
  }
  T* row = dqkv + (int64_t(b) * seq + i) * R + int64_t(h) * D;
#pragma unroll
  for (int c = 0; c < kGenC; c++)
    if (lane + 32 * c < D) row[lane + 32 * c] = from_f<T>(dq[c] * scale);
}

// dk and dv parts of dqkv. Grid (ceil(T/4), Hkv, B), 128 threads; one warp per key row, summing over the group.
template <typename T>
__global__ void __launch_bounds__(32 * kGenWarps)
    attn_bwd_dkdv_general_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                                 const float* __restrict__ lse, const float* __restrict__ Di, int seq, int H, int Hkv,
                                 int D, float scale) {
  __shared__ float sk[kGenWarps][kGenMaxD], sv[kGenWarps][kGenMaxD];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = blockIdx.x * kGenWarps + w, kh = blockIdx.y, b = blockIdx.z, G = H / Hkv;
  if (j >= seq) return;
  const int64_t R = int64_t(H + 2 * Hkv) * D, RO = int64_t(H) * D;
  const T* k = qkv + (int64_t(b) * seq + j) * R + int64_t(H + kh) * D;
  const T* v = k + int64_t(Hkv) * D;
  for (int d = lane; d < D; d += 32) {
    sk[w][d] = to_f(k[d]);
    sv[w][d] = to_f(v[d]);
  }
  __syncwarp();
  float dk[kGenC], dv[kGenC];
#pragma unroll
  for (int c = 0; c < kGenC; c++) dk[c] = dv[c] = 0.0f;
  for (int g = 0; g < G; g++) {
    const int h = kh * G + g;
    const T* qh = qkv + int64_t(b) * seq * R + int64_t(h) * D;
    const T* doh = dout + int64_t(b) * seq * RO + int64_t(h) * D;
    const float* lh = lse + (int64_t(b) * H + h) * seq;
    const float* dh = Di + (int64_t(b) * H + h) * seq;
    for (int ib = j; ib < seq; ib += 32) {
      const int i = ib + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < seq) {
        p = expf(dot_sf(sk[w], qh + int64_t(i) * R, D) * scale - lh[i]);
        ds = p * (dot_sf(sv[w], doh + int64_t(i) * RO, D) - dh[i]);
      }
      const int n = min(32, seq - ib);
      for (int ii = 0; ii < n; ii++) {
        const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
        const T* qi = qh + int64_t(ib + ii) * R;
        const T* dyi = doh + int64_t(ib + ii) * RO;
#pragma unroll
        for (int c = 0; c < kGenC; c++)
          if (lane + 32 * c < D) {
            dv[c] += pi * to_f(dyi[lane + 32 * c]);
            dk[c] += dsi * to_f(qi[lane + 32 * c]);
          }
      }
    }
  }
  T* krow = dqkv + (int64_t(b) * seq + j) * R + int64_t(H + kh) * D;
  T* vrow = krow + int64_t(Hkv) * D;
#pragma unroll
  for (int c = 0; c < kGenC; c++)
    if (lane + 32 * c < D) {
      krow[lane + 32 * c] = from_f<T>(dk[c] * scale);
      vrow[lane + 32 * c] = from_f<T>(dv[c]);
    }
}

// ---- host side ----
struct Dims {
  int B, T, H, Hkv, D;
};

template <typename K>
void set_smem(K kernel, size_t bytes) {
  DSCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <typename T, int D>
void flash_forward(T* out, float* lse, const T* qkv, const Dims& d, cudaStream_t stream) {
  const float scale_log2 = kLog2e / std::sqrt(float(D));
  auto kernel = flash_fwd_kernel<T, D>;
  set_smem(kernel, fwd_smem_bytes<D>());
  kernel<<<dim3(unsigned(ceil_div(d.T, kFwdBlockQ)), d.H, d.B), kFlashThreads, fwd_smem_bytes<D>(), stream>>>(
      out, lse, qkv, d.T, d.H, d.Hkv, scale_log2);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// The paged prompt kernel's launch (Note [Paged prompt attention]).
template <typename T, typename C, typename K>
void launch_paged_tc(K kernel, dim3 grid, size_t smem, int D, const Tensor& out, const Tensor& qkv,
                     const Tensor& cache, const Tensor& block_table, const Tensor& seq_start, const Tensor& pos, int H,
                     int Hkv, cudaStream_t stream) {
  const int64_t S = seq_start.numel() - 1;
  set_smem(kernel, smem);
  kernel<<<grid, kFlashThreads, smem, stream>>>(
      ptr<T>(out), ptr<T>(qkv), ptr<C>(cache), ptr<int32_t>(block_table), ptr<int32_t>(seq_start), ptr<int32_t>(pos),
      int(S), int(block_table.numel() / S), int(cache.size(1)), int(cache.size(0)), H, Hkv,
      kLog2e / std::sqrt(float(D)));
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T, typename C, int D>
void paged_flash_forward(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                         const Tensor& seq_start, const Tensor& pos, int H, int Hkv, cudaStream_t stream) {
  const int64_t N = pos.numel(), S = seq_start.numel() - 1;
  // At most N / 128 + (sequences of 2 or more tokens) query blocks (Note [Paged prompt attention]).
  const int64_t blocks = ceil_div(N, kFwdBlockQ) + std::min<int64_t>(S, N / 2);
  launch_paged_tc<T, C>(paged_flash_fwd_kernel<T, C, D>, dim3(unsigned(blocks), unsigned(H)), fwd_smem_bytes<D>(), D,
                        out, qkv, cache, block_table, seq_start, pos, H, Hkv, stream);
}

template <typename T, int D>
void flash_backward(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Di, const Dims& d,
                    cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(float(D)), scale_log2 = scale * kLog2e;
  auto dq = flash_bwd_dq_kernel<T, D>;
  set_smem(dq, dq_smem_bytes<D>());
  dq<<<dim3(unsigned(ceil_div(d.T, kBlockQ)), d.H, d.B), kFlashThreads, dq_smem_bytes<D>(), stream>>>(
      dqkv, dout, qkv, lse, Di, d.T, d.H, d.Hkv, scale, scale_log2);
  DSCPP_CUDA_CHECK_LAUNCH();
  auto dkdv = flash_bwd_dkdv_kernel<T, D>;
  set_smem(dkdv, dkdv_smem_bytes<D>());
  dkdv<<<dim3(unsigned(ceil_div(d.T, kBlockK)), d.Hkv, d.B), kFlashThreads, dkdv_smem_bytes<D>(), stream>>>(
      dqkv, dout, qkv, lse, Di, d.T, d.H, d.Hkv, scale, scale_log2);
  DSCPP_CUDA_CHECK_LAUNCH();
}

void check_attention_args(const char* op, const Tensor& qkv, const Dims& d) {
  DSCPP_CHECK(d.H > 0 && d.Hkv > 0 && d.D > 0 && d.H % d.Hkv == 0, op, ": bad heads H = ", d.H, ", Hkv = ", d.Hkv,
              ", D = ", d.D);
  DSCPP_CHECK(d.B <= 65535 && d.H <= 65535, op, ": B = ", d.B, " or H = ", d.H, " exceeds the grid limit 65535");
  DSCPP_CHECK(qkv.device().is_cuda(), op, ": qkv is on ", qkv.device().str(), ", expected a CUDA device");
}

bool use_flash(DType t, int D, std::initializer_list<const void*> ptrs) {
  if (t == DType::f32 || (D != 64 && D != 128)) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

Dims make_dims(const char* op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  DSCPP_CHECK(B >= 0 && T >= 0 && B < (int64_t(1) << 31) && T < (int64_t(1) << 31), op, ": bad B = ", B, ", T = ", T);
  return Dims{int(B), int(T), int(H), int(Hkv), int(D)};
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, AttentionBackend backend) {
  const char* op = "attention_forward";
  const Dims d = make_dims(op, B, T, H, Hkv, D);
  check_attention_args(op, qkv, d);
  DSCPP_CHECK(out.dtype() == qkv.dtype(), op, ": out dtype ", dtype_name(out.dtype()), " != qkv dtype ",
              dtype_name(qkv.dtype()));
  DSCPP_CHECK(lse.dtype() == DType::f32, op, ": lse must be f32");
  if (B == 0 || T == 0) return;
  OpLaunch l(qkv);
  AttentionCallCounters& calls = attention_call_counters();
  if (cudnn_attention::forward(backend, qkv.dtype(), {d.B, d.T, d.H, d.Hkv, d.D}, out.raw(), ptr<float>(lse),
                               qkv.raw(), qkv.device().index, l.stream)) {
    calls.cudnn_forward++;
    return;
  }
  calls.own_forward++;
  const bool flash = use_flash(qkv.dtype(), d.D, {qkv.raw(), out.raw()});
  dispatch_float(op, qkv.dtype(), [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    if constexpr (!std::is_same_v<E, float>) {
      if (flash) {
        if (d.D == 64) return flash_forward<E, 64>(ptr<E>(out), ptr<float>(lse), ptr<const E>(qkv), d, l.stream);
        return flash_forward<E, 128>(ptr<E>(out), ptr<float>(lse), ptr<const E>(qkv), d, l.stream);
      }
    }
    DSCPP_CHECK(d.D <= kGenMaxD, op, ": head dim D = ", d.D, " is not supported (at most ", kGenMaxD, ")");
    attn_fwd_general_kernel<E><<<dim3(unsigned(ceil_div(d.T, kGenWarps)), d.H, d.B), 32 * kGenWarps, 0, l.stream>>>(
        ptr<E>(out), ptr<float>(lse), ptr<const E>(qkv), d.T, d.H, d.Hkv, d.D, 1.0f / std::sqrt(float(d.D)));
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        AttentionBackend backend) {
  const char* op = "attention_backward";
  const Dims d = make_dims(op, B, T, H, Hkv, D);
  check_attention_args(op, qkv, d);
  const DType t = qkv.dtype();
  DSCPP_CHECK(dqkv.dtype() == t && dout.dtype() == t && out.dtype() == t, op,
              ": dqkv, dout, qkv and out must share a dtype, got ", dtype_name(dqkv.dtype()), ", ",
              dtype_name(dout.dtype()), ", ", dtype_name(t), ", ", dtype_name(out.dtype()));
  DSCPP_CHECK(lse.dtype() == DType::f32, op, ": lse must be f32");
  if (B == 0 || T == 0) return;
  OpLaunch l(qkv);
  AttentionCallCounters& calls = attention_call_counters();
  if (cudnn_attention::backward(backend, t, {d.B, d.T, d.H, d.Hkv, d.D}, dqkv.raw(), dout.raw(), qkv.raw(),
                                out.raw(), ptr<const float>(lse), qkv.device().index, l.stream)) {
    calls.cudnn_backward++;
    return;
  }
  calls.own_backward++;
  Tensor Di = Tensor::empty({B, H, T}, DType::f32, qkv.device());  // stream-ordered reuse (Note [Current stream])
  const bool flash = use_flash(t, d.D, {dqkv.raw(), dout.raw(), qkv.raw(), out.raw()});
  dispatch_float(op, t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    const int64_t rows = B * T * H;
    attn_bwd_dot_kernel<E><<<unsigned(ceil_div(rows * 32, 256)), 256, 0, l.stream>>>(
        ptr<float>(Di), ptr<const E>(dout), ptr<const E>(out), rows, d.T, d.H, d.D);
    DSCPP_CUDA_CHECK_LAUNCH();
    if constexpr (!std::is_same_v<E, float>) {
      if (flash) {
        if (d.D == 64)
          return flash_backward<E, 64>(ptr<E>(dqkv), ptr<const E>(dout), ptr<const E>(qkv), ptr<const float>(lse),
                                       ptr<const float>(Di), d, l.stream);
        return flash_backward<E, 128>(ptr<E>(dqkv), ptr<const E>(dout), ptr<const E>(qkv), ptr<const float>(lse),
                                      ptr<const float>(Di), d, l.stream);
      }
    }
    DSCPP_CHECK(d.D <= kGenMaxD, op, ": head dim D = ", d.D, " is not supported (at most ", kGenMaxD, ")");
    const float scale = 1.0f / std::sqrt(float(d.D));
    attn_bwd_dq_general_kernel<E><<<dim3(unsigned(ceil_div(d.T, kGenWarps)), d.H, d.B), 32 * kGenWarps, 0,
                                    l.stream>>>(ptr<E>(dqkv), ptr<const E>(dout), ptr<const E>(qkv),
                                                ptr<const float>(lse), ptr<const float>(Di), d.T, d.H, d.Hkv, d.D,
                                                scale);
    DSCPP_CUDA_CHECK_LAUNCH();
    attn_bwd_dkdv_general_kernel<E><<<dim3(unsigned(ceil_div(d.T, kGenWarps)), d.Hkv, d.B), 32 * kGenWarps, 0,
                                      l.stream>>>(ptr<E>(dqkv), ptr<const E>(dout), ptr<const E>(qkv),
                                                  ptr<const float>(lse), ptr<const float>(Di), d.T, d.H, d.Hkv, d.D,
                                                  scale);
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

bool paged_prompt_attention_supported(const Tensor& out, const Tensor& qkv, const Tensor& cache, int64_t D) {
  return (D == 64 || D == 128) && (qkv.dtype() == DType::bf16 || qkv.dtype() == DType::f16) &&
         (cache.dtype() == qkv.dtype() || cache.dtype() == DType::fp8_e4m3) &&
         all_aligned16(out.raw(), qkv.raw(), cache.raw());  // Note [fp8 KV cache]
}

void paged_prompt_attention(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                            const Tensor& seq_start, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D) {
  DSCPP_CHECK(paged_prompt_attention_supported(out, qkv, cache, D), "paged_prompt_attention: unsupported operands");
  const int64_t N = pos.numel(), S = seq_start.numel() - 1;
  OpLaunch L(qkv);
  dispatch_paged("paged_attention_forward", qkv.dtype(), cache.dtype(), [&](auto* tag, auto* ctag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = std::remove_pointer_t<decltype(ctag)>;
    if constexpr (!std::is_same_v<T, float>) {
      const int h = int(H), hkv = int(Hkv);
      if (N == S) return;  // one token per sequence: no prompt chunk
      if (D == 64) paged_flash_forward<T, C, 64>(out, qkv, cache, block_table, seq_start, pos, h, hkv, L.stream);
      else paged_flash_forward<T, C, 128>(out, qkv, cache, block_table, seq_start, pos, h, hkv, L.stream);
    }
  });
}

}  // namespace dscpp::cuda
