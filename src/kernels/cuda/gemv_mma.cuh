// Private: the decode GEMV on tensor cores (Note [Decode GEMV on tensor cores]) for bf16, int8 and int4 weights.
//
// Note [Decode GEMV on tensor cores]
// out[M, OC] = inp[M, C] @ w[OC, C]^T for M <= 8 input rows (bf16) reads the whole weight to make a few outputs, so
// it must stream the weight at the HBM's speed. Multiplying on the CUDA cores costs an FMA per weight per row plus,
// for 8 and 4-bit weights, a conversion per weight, and that is as many instructions as the SM issues at 3 TB/s: the
// int4 GEMV measured 0.8-1.5 TB/s that way. Here the products run on mma.m16n8k16: a warp owns 16 output rows, the M
// input rows are the mma's 8 columns (padded with zeros), and the conversion is the only per-weight work left.
// Each lane reads 16 bytes of row g and of row g + 8 per macro step (g = lane / 4; the four lanes of a row read 64
// contiguous bytes), i.e. K = 8 (bf16), 16 (int8) or 32 (int4) columns; a dot product is a sum over columns in any
// order, so the lane puts its own columns into the k slots it holds in the A fragment (2t, 2t+1, 2t+8, 2t+9) in
// whatever order its bytes unpack cheaply, and takes the inputs of those same columns into its B fragment:
//   bf16  the 16-bit pairs as they lie;
//   int8  bytes ^ 0x80 placed under the exponent of 2^23, minus 2^23 + 128: the signed value, exact, two packed to bf16;
//   int4  nibbles k and k + 4 of a 32-bit word under bf16's 128 (one LOP3: 0x43004300 | w >> s & 0x000F000F) minus
//         128 + zero: (q - zero) exact; the group's scale multiplies the f32 product of each 128-column macro step.
// int8's per-channel scale multiplies the finished sums. The W warps of a CTA share its 16 rows and split C (each
// warp U consecutive macro steps at a time), summing through shared memory in a fixed order (the same bits every
// run); the epilogue adds bias and residual. W is 4, or 8 for a grid of at most two CTAs per SM (a small OC: o_proj,
// down_proj, a 1B model's qkv), where four warps a CTA left too few loads in flight (H100, each linear of every layer
// replayed in a CUDA graph, int4: Llama-3.1-8B o_proj 8.16 -> 7.06 µs, down 24.2 -> 19.3; Llama-3.2-1B down 11.9 ->
// 8.3), while 8 warps on an int4 gate_up's large grid were 23% slower; bf16 takes 8 on every grid (its gate_up 83.4 ->
// 78.1 µs; batch-8 decode +1.5% on Llama-3.1-8B and 3.2-1B). The weights are read with an L2 prefetch of 256 bytes: 1-4% on
// every shape (the CUDA-core kernel, gemv.cu, measured 1-6% slower with it, and keeps plain loads). On the Llama-3.1-8B shape's decode linears (H100, cold L2) a token's
// int4 GEMVs took 3.48 ms on the CUDA cores and 3.02 here, int8 4.05 and 3.72, at one row; at four rows int4 went
// from 8.50 to 3.11 ms (it does not grow with the rows). bf16 at one row stays on the CUDA-core kernel (6.38 against
// 6.45 ms; Llama-1B batch-1 decode 750 against 716 tokens/s); from two rows it comes here (4 rows: 7.38 to 6.47 ms,
// 8 rows: cuBLASLt's 6.85 to 6.54). Variants swept (loads in flight 2-8 macro steps, 4 or 8 warps, interleaved or
// consecutive macro steps) were within 5% of each other; docs/PERF.md has the table.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_epilogue.cuh"
#include "kernels/cuda/gemv_norm.cuh"
#include "kernels/cuda/mma.cuh"

namespace dscpp::cuda::gemv_mma {

constexpr int kRows = 16;  // output rows per CTA
constexpr int kMaxM = 8;   // input rows: the mma's N

// The weight operand: bf16 [OC, C]; int8 [OC, C] with scale f32 [OC]; int4 packed [OC, C/2] with scale f32
// [OC, C/G] and zero u8 [OC, C/G] (Note [Quantized weight layout]).
struct Weights {
  const void* q;
  const float* scale;
  const uint8_t* zero;
  int G;
};

template <int BITS>
constexpr int kCols = 128 / BITS;  // columns of a row in one lane's 16 bytes

__device__ __forceinline__ uint4 load_stream(const void* p) {  // read once: keep L1 for the inputs
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The lane-local column of the low half of k-step s's slot pair h (h = 0: slots 2t, 2t + 1; 1: 2t + 8, 2t + 9);
// the high half is kGap columns further.
template <int BITS>
__device__ constexpr int pair_col(int s, int h) {
  return BITS == 4 ? 8 * (s / 2) + 2 * (s % 2) + h : 4 * s + 2 * h;
}
template <int BITS>
constexpr int kGap = BITS == 4 ? 4 : 1;

// The bf16 pair of weights for (s, h) from a lane's 16 bytes of one row; zc = bf16x2 of 128 + zero (int4).
template <int BITS>
__device__ __forceinline__ uint32_t a_pair(const uint4& raw, int s, int h, uint32_t zc) {
  if constexpr (BITS == 16) {
    return word(raw, 2 * s + h);
  } else if constexpr (BITS == 8) {
    const uint32_t u = word(raw, s) ^ 0x80808080u;
    const float lo = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7440 | (2 * h))) - 8388736.0f;
    const float hi = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7440 | (2 * h + 1))) - 8388736.0f;
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    const uint32_t v = (word(raw, s / 2) >> (8 * (s % 2) + 4 * h) & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                               *reinterpret_cast<const __nv_bfloat162*>(&zc));
    return *reinterpret_cast<uint32_t*>(&d);
  }
}

// The inputs of the same two columns, from the lane's K consecutive bf16 inputs xw (pairs in 32-bit words).
template <int BITS>
__device__ __forceinline__ uint32_t b_pair(const uint32_t* xw, int s, int h) {
  const int lo = pair_col<BITS>(s, h), hi = lo + kGap<BITS>;
  if constexpr (kGap<BITS> == 1) return xw[lo / 2];
  else return __byte_perm(xw[lo / 2], xw[hi / 2], (lo & 1) ? 0x7632 : 0x5410);
}

// The end of a CTA of W warps whose mma accumulators `acc` hold its 16 output rows for the M input rows: each
// warp's sums into red, summed over the warps in a fixed order (the same bits every run), times scale(n, row), then
// the bias and the residual; out[n, row] written. With a paired epilogue (gemv_epilogue.h) the CTA's rows are 8 rows
// and their 8 partners, and the first 8 threads of each input row store a pair (store_pair).
template <int W, typename O, typename B, typename Scale>
__device__ __forceinline__ void store_rows(float (&red)[W][kMaxM][kRows], const float (&acc)[4], O* out,
                                           const B* bias, const O* residual, int M, int64_t OC, Scale scale,
                                           const GemvEpilogue& epi) {
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  red[warp][2 * t][g] = acc[0], red[warp][2 * t + 1][g] = acc[1];
  red[warp][2 * t][g + 8] = acc[2], red[warp][2 * t + 1][g + 8] = acc[3];
  __syncthreads();
  if (threadIdx.x >= kMaxM * kRows) return;
  const int n = threadIdx.x / kRows, rr = threadIdx.x % kRows;
  const int64_t row = int64_t(blockIdx.x) * kRows + rr;
  if (n >= M || row >= OC) return;
  auto total = [&](int r, int64_t orow) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < W; k++) sum += red[k][n][r];
    sum *= scale(n, orow);
    return bias ? sum + to_f(bias[orow]) : sum;
  };
  if (epi.paired()) {
    constexpr int P = kRows / 2;
    if (rr < P) store_pair<O>(epi, out, OC, n, int64_t(blockIdx.x) * P + rr, total(rr, row), total(rr + P, row + P));
    return;
  }
  const int64_t at = int64_t(n) * OC + row;
  const float sum = total(rr, row);
  out[at] = from_f<O>(residual ? sum + to_f(residual[at]) : sum);
}

// W warps a CTA; U consecutive macro steps of loads in flight per lane before any is used. NORM: the input rows are
// RMSNorm'ed by the CTA first (Note [Norm in the decode GEMV]).
// (Five CTAs of 4 warps an SM, as the registers allowed before the norm's prologue came.)
template <int BITS, typename O, typename B, int U, int W, bool NORM>
__global__ void __launch_bounds__(W * 32, W == 4 ? 5 : 2)
    kernel(O* __restrict__ out, const __nv_bfloat16* __restrict__ inp, const Weights w, const B* __restrict__ bias,
           const O* residual, int M, int64_t OC, int C, const GemvNorm norm, const GemvEpilogue epi) {
  constexpr int K = kCols<BITS>, MC = 4 * K, S = K / 4, XV = K / 8;  // XV: 16-byte loads of inputs per macro step
  __shared__ float red[W][kMaxM][kRows];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t r0 = int64_t(blockIdx.x) * kRows + g, r1 = r0 + 8;
  const int64_t c0 = r0 < OC ? r0 : 0, c1 = r1 < OC ? r1 : 0;  // rows past OC read row 0 and are not written
  const int64_t row_bytes = int64_t(C) * BITS / 8;
  const uint8_t* q0 = static_cast<const uint8_t*>(w.q) + c0 * row_bytes + t * 16;
  const uint8_t* q1 = static_cast<const uint8_t*>(w.q) + c1 * row_bytes + t * 16;
  const bool has_x = g < M;
  extern __shared__ __align__(16) unsigned char gemv_xs[];
  if constexpr (NORM) {
#pragma unroll
    for (int u = 0; u < U; u++)
      if ((warp * U + u) * MC < C) {
        gemv::prefetch_l2(q0 + int64_t(warp * U + u) * 64);
        gemv::prefetch_l2(q1 + int64_t(warp * U + u) * 64);
      }
    gemv::norm_rows_to_shared(reinterpret_cast<__nv_bfloat16*>(gemv_xs), inp, norm, M, C);
  }
  const __nv_bfloat16* x = NORM ? reinterpret_cast<const __nv_bfloat16*>(gemv_xs) : inp;
  const __nv_bfloat16* xp = x + int64_t(has_x ? g : 0) * C + t * K;
  const int64_t groups = BITS == 4 ? C / w.G : 0;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int macros = C / MC;
  uint4 wr[U][2];
  float sc[U][2];
  uint32_t zc[U][2] = {};
  auto load_weights = [&](int m0) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = m0 + u;
      if (m >= macros) break;
      wr[u][0] = load_stream(q0 + int64_t(m) * 64);
      wr[u][1] = load_stream(q1 + int64_t(m) * 64);
      if constexpr (BITS == 4) {
        const int64_t gi = int64_t(m) * MC / w.G;
        sc[u][0] = w.scale[c0 * groups + gi], sc[u][1] = w.scale[c1 * groups + gi];
        // 128 + zero in bf16 (twice): exponent 2^7, the zero point as mantissa
        zc[u][0] = (0x4300u | w.zero[c0 * groups + gi]) * 0x10001u;
        zc[u][1] = (0x4300u | w.zero[c1 * groups + gi]) * 0x10001u;
      }
    }
  };
  for (int m0 = warp * U; m0 < macros; m0 += W * U) {
    load_weights(m0);
    uint4 xr[U][XV];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int m = m0 + u;
      if (m >= macros) break;
#pragma unroll
      for (int v = 0; v < XV; v++)
        xr[u][v] = has_x ? *reinterpret_cast<const uint4*>(xp + int64_t(m) * MC + 8 * v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (m0 + u >= macros) break;
      const uint32_t* xw = reinterpret_cast<const uint32_t*>(xr[u]);
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float* into = BITS == 4 ? part : acc;
#pragma unroll
      for (int s = 0; s < S; s++) {
        const uint32_t a[4] = {a_pair<BITS>(wr[u][0], s, 0, zc[u][0]), a_pair<BITS>(wr[u][1], s, 0, zc[u][1]),
                               a_pair<BITS>(wr[u][0], s, 1, zc[u][0]), a_pair<BITS>(wr[u][1], s, 1, zc[u][1])};
        mma16816<__nv_bfloat16>(*reinterpret_cast<float(*)[4]>(into), a, b_pair<BITS>(xw, s, 0),
                                b_pair<BITS>(xw, s, 1));
      }
      if constexpr (BITS == 4) {
        acc[0] = fmaf(part[0], sc[u][0], acc[0]), acc[1] = fmaf(part[1], sc[u][0], acc[1]);
        acc[2] = fmaf(part[2], sc[u][1], acc[2]), acc[3] = fmaf(part[3], sc[u][1], acc[3]);
      }
    }
  }
  if constexpr (BITS == 8) {
    const float s0 = w.scale[c0], s1 = w.scale[c1];
    acc[0] *= s0, acc[1] *= s0, acc[2] *= s1, acc[3] *= s1;
  }
  store_rows<W>(red, acc, out, bias, residual, M, OC, [](int, int64_t) { return 1.0f; }, epi);
}

// The SMs of the current device, asked once (every GPU of a job is the same kind).
inline int sm_count() {
  static const int n = [] {
    int d = 0, v = 132;
    cudaGetDevice(&d);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d);
    return v;
  }();
  return n;
}

// The columns one macro step of a row covers: C must be a multiple (and, for int4, the group too).
template <int BITS>
constexpr int kMacroCols = 4 * kCols<BITS>;

// Loads in flight per lane (in macro steps): as many as the registers allow.
template <int BITS>
constexpr int kUnroll = BITS == 4 ? 2 : 4;

// Launches for out bf16 or f32, bias bf16, f32 or none (residual: out's dtype, may be null or out); false, having
// done nothing, for other dtypes or a paired epilogue the shapes do not fit (store_rows, pairs_fit).
template <int BITS>
bool launch(void* out, DType out_t, const __nv_bfloat16* inp, const Weights& w, const void* bias, DType bias_t,
            const void* residual, int64_t M, int64_t OC, int64_t C, const GemvNorm& norm, const GemvEpilogue& epi,
            cudaStream_t s) {
  if (out_t != DType::f32 && out_t != DType::bf16) return false;
  if (!pairs_fit(epi, OC, residual)) return false;
  if (bias && bias_t != DType::f32 && bias_t != DType::bf16) return false;
  const size_t smem = norm.gamma ? size_t(M * C) * sizeof(__nv_bfloat16) : 0;
  // bf16 weights reach this kernel from two rows on, past kMaxNormRows: no norm variant of them is built.
  constexpr bool kNorm = BITS != 16;
  if (norm.gamma && (!kNorm || M > gemv::kMaxNormRows || smem > gemv::kMaxNormSmem)) return false;
  const unsigned grid = unsigned(ceil_div(OC, kRows));
  const bool small = BITS == 16 || grid <= 2u * unsigned(sm_count());
  auto go = [&](auto* o, auto* b) {
    using O = std::remove_pointer_t<decltype(o)>;
    using B = std::remove_pointer_t<decltype(b)>;
    auto args = [&](auto plain, auto normed, int warps) {
      (norm.gamma ? normed : plain)<<<grid, warps * 32, smem, s>>>(
          static_cast<O*>(out), inp, w, static_cast<const B*>(bias), static_cast<const O*>(residual), int(M), OC,
          int(C), norm, epi);
    };
    constexpr int U = kUnroll<BITS>;
    small ? args(kernel<BITS, O, B, U, 8, false>, kernel<BITS, O, B, U, 8, kNorm>, 8)
          : args(kernel<BITS, O, B, U, 4, false>, kernel<BITS, O, B, U, 4, kNorm>, 4);
  };
  const bool bias_f32 = bias && bias_t == DType::f32;
  if (out_t == DType::f32) bias_f32 ? go((float*)nullptr, (float*)nullptr) : go((float*)nullptr, (__nv_bfloat16*)nullptr);
  else bias_f32 ? go((__nv_bfloat16*)nullptr, (float*)nullptr) : go((__nv_bfloat16*)nullptr, (__nv_bfloat16*)nullptr);
  DSCPP_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace dscpp::cuda::gemv_mma
