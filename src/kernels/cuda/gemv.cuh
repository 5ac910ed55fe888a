// Private: the decode GEMV kernel (Note [Decode GEMV], gemv.cu), templated over how a weight row is read, so that
// bf16 / f16 weights (gemv.cu) and quantized ones (Note [Quantized GEMV], quant.cu) share one kernel.
// A weight loader L is built per output feature and provides:
//   L::V                               columns per 16-byte load (8 for bf16, 16 for int8, 32 for packed int4);
//   L(const typename L::Params&, oc)   the row of output feature oc;
//   uint4 fetch(c) const               the 16 raw bytes holding columns c .. c + V;
//   const void* address(c) const       where they lie (for an L2 prefetch);
//   void expand(raw, c, float* w)      w[0..V) = the f32 weights of those columns.
// The kernel issues kUnroll fetches before expanding any, so each lane keeps four 16-byte loads in flight.
// NORM: the input rows are RMSNorm'ed by the CTA first (Note [Norm in the decode GEMV], gemv_norm.cuh).
// A paired epilogue (gemv_epilogue.h: SwiGLU, or rope + KV append): the weight's rows are blocks of 8 rows and their
// 8 partners; warp w of CTA b takes pair p = 4b + w % 4, its first row (w < 4) or its partner, and warp w < 4 stores
// the pair (store_pair).
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_epilogue.cuh"
#include "kernels/cuda/gemv_norm.cuh"

namespace dscpp::cuda::gemv {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

// out[m, oc] (=) = sum_c w[oc, c] * inp[m, c] + bias[oc] + residual[m, oc], M rows; C a multiple of L::V.
template <typename L, typename T, typename O, typename B, int M, bool NORM>
__global__ void __launch_bounds__(kWarps * 32)
    kernel(O* __restrict__ out, const T* __restrict__ inp, const typename L::Params w, const B* __restrict__ bias,
           const O* residual, int64_t OC, int C, const RowNorm norm, const GemvEpilogue epi) {
  constexpr int V = L::V;
  constexpr int P = kWarps / 2;  // pairs a CTA with a paired epilogue
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool paired = epi.paired();
  const int64_t pair = int64_t(blockIdx.x) * P + warp % P;
  const int64_t oc = paired ? pair / 8 * 16 + pair % 8 + (warp / P) * 8 : int64_t(blockIdx.x) * kWarps + warp;
  extern __shared__ __align__(16) unsigned char gemv_xs[];
  if constexpr (NORM) {  // every thread takes part in the CTA's norm, rows past OC too
    const L first(w, oc < OC ? oc : 0);
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (lane * V + u * 32 * V < C) prefetch_l2(first.address(lane * V + u * 32 * V));
    norm_rows_to_shared(reinterpret_cast<T*>(gemv_xs), inp, norm, M, C);
  }
  const T* x = NORM ? reinterpret_cast<const T*>(gemv_xs) : inp;  // the (normalized) input rows
  if (oc >= OC) return;
  const L row(w, oc);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.0f;
  auto dot = [&](const uint4& raw, int c) {
    float wv[V];
    row.expand(raw, c, wv);
#pragma unroll
    for (int m = 0; m < M; m++) {
      float xv[V];
      load_f<T, V>(x + int64_t(m) * C + c, xv);
#pragma unroll
      for (int k = 0; k < V; k++) acc[m] = fmaf(wv[k], xv[k], acc[m]);
    }
  };
  int c = lane * V;
  for (; c + (kUnroll - 1) * 32 * V < C; c += kUnroll * 32 * V) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) raw[u] = row.fetch(c + u * 32 * V);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) dot(raw[u], c + u * 32 * V);
  }
  for (; c < C; c += 32 * V) dot(row.fetch(c), c);
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = warp_sum(acc[m]);
  if (paired) {  // OC is a multiple of 16: every warp got here
    __shared__ float halves[kWarps][M];
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; m++) halves[warp][m] = acc[m] + (bias ? to_f(bias[oc]) : 0.0f);
    __syncthreads();
    if (warp < P && lane < M) store_pair<O>(epi, out, OC, lane, pair, halves[warp][lane], halves[warp + P][lane]);
    return;
  }
  if (lane == 0) {
    const float b = bias ? to_f(bias[oc]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; m++) {
      const int64_t at = int64_t(m) * OC + oc;
      out[at] = from_f<O>(acc[m] + b + (residual ? to_f(residual[at]) : 0.0f));
    }
  }
}

// The kernel for M in 1..4 rows on stream s; false, having done nothing, when the normalized rows would not fit
// shared memory, or for a paired epilogue that the shapes do not fit (pairs_fit).
template <typename L, typename T, typename O, typename B>
bool launch(O* out, const T* inp, const typename L::Params& w, const B* bias, const O* residual, int64_t M,
            int64_t OC, int64_t C, const RowNorm& norm, const GemvEpilogue& epi, cudaStream_t s) {
  const unsigned grid = unsigned(ceil_div(OC, kWarps));
  const size_t smem = norm.gamma ? size_t(M * C) * sizeof(T) : 0;
  if (norm.gamma && (M > kMaxNormRows || smem > kMaxNormSmem)) return false;
  if (!pairs_fit(epi, OC, residual)) return false;
  auto go = [&](auto plain, auto normed) {
    (norm.gamma ? normed : plain)<<<grid, kWarps * 32, smem, s>>>(out, inp, w, bias, residual, OC, int(C), norm,
                                                                   epi);
  };
  switch (M) {
    case 1: go(kernel<L, T, O, B, 1, false>, kernel<L, T, O, B, 1, true>); break;
    case 2: go(kernel<L, T, O, B, 2, false>, kernel<L, T, O, B, 2, false>); break;  // no norm past kMaxNormRows
    case 3: go(kernel<L, T, O, B, 3, false>, kernel<L, T, O, B, 3, false>); break;
    default: go(kernel<L, T, O, B, 4, false>, kernel<L, T, O, B, 4, false>); break;
  }
  DSCPP_CUDA_CHECK_LAUNCH();
  return true;
}

// launch() for out f32 or T (in_t) and a bias f32 or T (or none); false, having done nothing, for other dtypes.
// residual (may be null or out) has out's dtype.
template <typename L, typename T>
bool launch_dtypes(void* out, DType out_t, DType in_t, const T* inp, const typename L::Params& w, const void* bias,
                   DType bias_t, const void* residual, int64_t M, int64_t OC, int64_t C, const RowNorm& norm,
                   const GemvEpilogue& epi, cudaStream_t s) {
  const bool out_f32 = out_t == DType::f32, bias_f32 = bias && bias_t == DType::f32;
  if (!out_f32 && out_t != in_t) return false;
  if (bias && !bias_f32 && bias_t != in_t) return false;
  auto go = [&](auto* o, auto* b) {
    using O = std::remove_pointer_t<decltype(o)>;
    using B = std::remove_pointer_t<decltype(b)>;
    return launch<L, T, O, B>(static_cast<O*>(out), inp, w, static_cast<const B*>(bias),
                              static_cast<const O*>(residual), M, OC, C, norm, epi, s);
  };
  if (out_f32) return bias_f32 ? go((float*)nullptr, (float*)nullptr) : go((float*)nullptr, (T*)nullptr);
  return bias_f32 ? go((T*)nullptr, (float*)nullptr) : go((T*)nullptr, (T*)nullptr);
}

}  // namespace dscpp::cuda::gemv
