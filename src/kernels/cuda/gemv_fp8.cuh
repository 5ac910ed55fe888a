// Private: the fp8 decode GEMV (Note [fp8 decode GEMV]): out[M, OC] = fp8 matmul of M <= 4 bf16 input rows.
//
// Note [fp8 decode GEMV]
// Note [fp8 matmul]'s product for a few rows on mma.m16n8k32 with both operands in e4m3 (sm_89 and later): the
// weights go into the A fragment as their bytes lie, with no conversion at all, so a lane's only per-weight work is
// its share of the mma. The layout is gemv_mma.cuh's: a warp owns 16 output rows, the M input rows are the mma's 8
// columns (zero past M), each lane reads 16 bytes of row g and of row g + 8 per macro step (g = lane / 4, t = lane %
// 4: the four lanes of a row read 64 contiguous bytes), i.e. two k-steps of 32: its words 2s and 2s + 1 fill the A
// slots (4t..4t+3) and (16+4t..16+4t+3) of k-step s, and the B fragment takes the same columns' input codes. Before
// the loop every CTA quantizes the M input rows itself (RMSNorm'ed first when the op is rmsnorm_matmul_q_forward;
// Note [Norm in the decode GEMV]) into e4m3 codes in shared memory: without a norm by quantize_rows_fp8's f32
// operations, so its codes are the reference's (with one, see quantize_rows_to_shared); the f32 sums of the W warps
// meet in shared memory in a fixed order, then take the row's input scale, the weight row's scale, the bias and the
// residual. On an H100 (docs/PERF.md) Llama-3.1-8B's linears at one row took 18.3 / 15.1 / 54.6 / 32.8 us (qkv / o /
// gate_up / down; int8's tensor-core GEMV 15.7 / 13.4 / 49.4 / 28.4, reading as many bytes, without a prologue), and
// batch-1 decode ran at 238.8 tokens/s against bf16's 169.9.
#pragma once
#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_mma.cuh"
#include "kernels/cuda/gemv_norm.cuh"

namespace dscpp::cuda::gemv_fp8 {

using gemv_mma::kMaxM;  // input rows: the mma's N (padded with zeros)
using gemv_mma::kRows;  // output rows per CTA
// Rows the launch takes: each CTA quantizes every row itself, so more rows cost every CTA more prologue; from 5 rows
// the quantize + cuBLASLt path (Note [fp8 GEMM]) is as fast (H100, Llama-3.1-8B linears: at 4 rows this kernel took
// 25 / 19 / 66 / 49 us for qkv / o / gate_up / down, the GEMM path at 16 rows 30 / 27 / 70 / 62).
constexpr int kMaxLaunchM = 4;
constexpr int kMacroCols = 64;  // columns of a row per macro step (four lanes, 16 bytes each)
constexpr int kUnroll = 4;      // macro steps of loads in flight per lane
// The input codes a CTA keeps (M * C bytes; an 8B model's down_proj at 4 rows: 56 KB, past the 48 KB default).
constexpr size_t kMaxSmem = 96 * 1024;

__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

using gemv_mma::load_stream;
using gemv_mma::word;

// Element c of input row m as the op sees it: x itself, or normalized and rounded to bf16 (the `normed` output).
__device__ __forceinline__ void row_values(float (&v)[8], const __nv_bfloat16* x, const __nv_bfloat16* gamma, float rs,
                                           int c) {
  load_f<__nv_bfloat16, 8>(x + c, v);
  if (gamma) {
    float w[8];
    load_f<__nv_bfloat16, 8>(gamma + c, w);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __bfloat162float(__float2bfloat16(v[k] * rs * w[k]));
  }
}

// xs[m * C + c] (=) e4m3 codes of the M input rows and sx[m] (=) their scales, by all the CTA's threads; with
// norm.gamma the rows are RMSNorm'ed first and block 0 writes them to norm.normed. Two passes over the rows (each
// thread's sums of squares and its max |x * gamma| of every row, one block-wide reduction for all of them, then the
// codes) and no barrier per row. Without a norm the scale is quantize_rows_fp8's exactly; with one, the row's max
// is taken as rstd * max |x * gamma| (the bf16 rounding of the normed values left out, so the largest may round
// one step past 448 and saturate there). Ends with a barrier.
__device__ __forceinline__ void quantize_rows_to_shared(uint8_t* xs, float* sx, const __nv_bfloat16* __restrict__ inp,
                                                        const GemvNorm& norm, int M, int C) {
  __shared__ float part[32][2 * kMaxM];
  __shared__ float row_rs[kMaxM], row_inv[kMaxM];
  const auto* gamma = static_cast<const __nv_bfloat16*>(norm.gamma);
  auto* normed = blockIdx.x == 0 ? static_cast<__nv_bfloat16*>(norm.normed) : nullptr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float ss[kMaxM], mx[kMaxM];
#pragma unroll
  for (int m = 0; m < kMaxM; m++) {
    ss[m] = 0.0f, mx[m] = 0.0f;
    if (m >= M) continue;
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
      float v[8], w[8];
      load_f<__nv_bfloat16, 8>(inp + int64_t(m) * C + c, v);
      if (gamma) load_f<__nv_bfloat16, 8>(gamma + c, w);
#pragma unroll
      for (int k = 0; k < 8; k++) ss[m] += v[k] * v[k], mx[m] = fmaxf(mx[m], fabsf(gamma ? v[k] * w[k] : v[k]));
    }
    ss[m] = warp_sum(ss[m]), mx[m] = warp_max(mx[m]);
    if (lane == 0) part[warp][2 * m] = ss[m], part[warp][2 * m + 1] = mx[m];
  }
  __syncthreads();
  if (threadIdx.x < M) {
    const int m = threadIdx.x;
    float s2 = 0.0f, amax = 0.0f;
    for (int k = 0; k < warps; k++) s2 += part[k][2 * m], amax = fmaxf(amax, part[k][2 * m + 1]);
    const float rs = gamma ? 1.0f / sqrtf(s2 / float(C) + norm.eps) : 1.0f;
    amax = gamma ? amax * rs : amax;
    row_rs[m] = rs, row_inv[m] = amax == 0.0f ? 0.0f : 448.0f / amax, sx[m] = amax / 448.0f;
  }
  __syncthreads();
  for (int m = 0; m < M; m++) {
    const __nv_bfloat16* x = inp + int64_t(m) * C;
    const float rs = row_rs[m], inv = row_inv[m];
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
      float v[8];
      row_values(v, x, gamma, rs, c);
      if (normed) store_f<__nv_bfloat16, 8>(normed + int64_t(m) * C + c, v);
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        lo |= uint32_t(__nv_cvt_float_to_fp8(v[k] * inv, __NV_SATFINITE, __NV_E4M3)) << (8 * k);
        hi |= uint32_t(__nv_cvt_float_to_fp8(v[k + 4] * inv, __NV_SATFINITE, __NV_E4M3)) << (8 * k);
      }
      *reinterpret_cast<uint2*>(xs + int64_t(m) * C + c) = make_uint2(lo, hi);
    }
  }
  __syncthreads();
}

// W warps a CTA, each walking kUnroll consecutive macro steps at a time.
template <typename O, typename B, int W>
__global__ void __launch_bounds__(W * 32) kernel(O* __restrict__ out, const __nv_bfloat16* __restrict__ inp,
                                                 const uint8_t* __restrict__ q, const float* __restrict__ wscale,
                                                 const B* __restrict__ bias, const O* residual, int M, int64_t OC,
                                                 int C, const GemvNorm norm, const GemvEpilogue epi) {
  constexpr int U = kUnroll;
  __shared__ float red[W][kMaxM][kRows];
  __shared__ float sx[kMaxM];
  extern __shared__ __align__(16) unsigned char gemv_fp8_xs[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t r0 = int64_t(blockIdx.x) * kRows + g, r1 = r0 + 8;
  const int64_t c0 = r0 < OC ? r0 : 0, c1 = r1 < OC ? r1 : 0;  // rows past OC read row 0 and are not written
  const uint8_t* q0 = q + c0 * C + t * 16;
  const uint8_t* q1 = q + c1 * C + t * 16;
  const int macros = C / kMacroCols;
#pragma unroll
  for (int u = 0; u < U; u++)  // the weight stream need not wait for the prologue
    if (warp * U + u < macros) {
      gemv::prefetch_l2(q0 + int64_t(warp * U + u) * kMacroCols);
      gemv::prefetch_l2(q1 + int64_t(warp * U + u) * kMacroCols);
    }
  quantize_rows_to_shared(gemv_fp8_xs, sx, inp, norm, M, C);
  const bool has_x = g < M;
  const uint8_t* xp = gemv_fp8_xs + int64_t(has_x ? g : 0) * C + t * 16;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int m0 = warp * U; m0 < macros; m0 += W * U) {
    uint4 wr[U][2], xr[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (m0 + u >= macros) break;
      wr[u][0] = load_stream(q0 + int64_t(m0 + u) * kMacroCols);
      wr[u][1] = load_stream(q1 + int64_t(m0 + u) * kMacroCols);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (m0 + u >= macros) break;
      xr[u] = has_x ? *reinterpret_cast<const uint4*>(xp + (m0 + u) * kMacroCols) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (m0 + u >= macros) break;
#pragma unroll
      for (int s = 0; s < 2; s++) {
        const uint32_t a[4] = {word(wr[u][0], 2 * s), word(wr[u][1], 2 * s), word(wr[u][0], 2 * s + 1),
                               word(wr[u][1], 2 * s + 1)};
        mma_e4m3(acc, a, word(xr[u], 2 * s), word(xr[u], 2 * s + 1));
      }
    }
  }
  gemv_mma::store_rows<W>(red, acc, out, bias, residual, M, OC,
                          [&](int n, int64_t row) { return sx[n] * wscale[row]; }, epi);
}

// Lets kernel<O, B, W> take kMaxSmem of dynamic shared memory, once.
template <typename O, typename B, int W>
void allow_smem() {
  static const bool done = [] {
    DSCPP_CUDA_CHECK(cudaFuncSetAttribute(kernel<O, B, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
    return true;
  }();
  (void)done;
}

// Launches for bf16 inputs, out bf16 or f32, bias bf16, f32 or none (residual: out's dtype, may be null or out);
// false, having done nothing, for other dtypes, C not a multiple of kMacroCols, codes past kMaxSmem, or a paired
// epilogue the shapes do not fit (gemv_mma::store_rows, pairs_fit).
inline bool launch(void* out, DType out_t, const __nv_bfloat16* inp, const uint8_t* q, const float* wscale,
                   const void* bias, DType bias_t, const void* residual, int64_t M, int64_t OC, int64_t C,
                   const GemvNorm& norm, const GemvEpilogue& epi, cudaStream_t s) {
  if (out_t != DType::f32 && out_t != DType::bf16) return false;
  if (!pairs_fit(epi, OC, residual)) return false;
  if (bias && bias_t != DType::f32 && bias_t != DType::bf16) return false;
  const size_t smem = size_t(M * C);
  if (M < 1 || M > kMaxLaunchM || C % kMacroCols != 0 || C > INT32_MAX || smem > kMaxSmem) return false;
  const unsigned grid = unsigned(ceil_div(OC, kRows));
  const bool small = grid <= 2u * unsigned(gemv_mma::sm_count());
  auto go = [&](auto* o, auto* b) {
    using O = std::remove_pointer_t<decltype(o)>;
    using Bt = std::remove_pointer_t<decltype(b)>;
    auto args = [&](auto k, int warps) {
      k<<<grid, warps * 32, smem, s>>>(static_cast<O*>(out), inp, q, wscale, static_cast<const Bt*>(bias),
                                       static_cast<const O*>(residual), int(M), OC, int(C), norm, epi);
    };
    if (small) allow_smem<O, Bt, 8>(), args(kernel<O, Bt, 8>, 8);
    else allow_smem<O, Bt, 4>(), args(kernel<O, Bt, 4>, 4);
  };
  const bool bias_f32 = bias && bias_t == DType::f32;
  using bf16 = __nv_bfloat16;
  if (out_t == DType::f32) bias_f32 ? go((float*)nullptr, (float*)nullptr) : go((float*)nullptr, (bf16*)nullptr);
  else bias_f32 ? go((bf16*)nullptr, (float*)nullptr) : go((bf16*)nullptr, (bf16*)nullptr);
  DSCPP_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace dscpp::cuda::gemv_fp8
