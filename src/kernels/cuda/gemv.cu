// Note [Decode GEMV]
// matmul_forward with a handful of input rows (a decode step of 1-4 sequences) reads a whole weight matrix to
// produce a few outputs: it is bound by the weight bytes, and cuBLASLt's tile kernels reached 1.2-2.8 TB/s on an
// H100 for Llama-1B's projections (o_proj: 1.2), short of the 3.35 TB/s the HBM gives. Here one warp owns one output
// feature: its lanes stream the weight row in 16-byte loads (four in flight per lane), multiply each against the M
// input rows (small, read through L1), keep M f32 sums, reduce across the warp in a fixed order (the same bits on
// every run), and write out = sum + bias + residual in one pass. Taken for bf16 / f16 weights, M <= 4, C a
// multiple of 8 and 16-byte aligned operands; everything else goes to cuBLASLt.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.h"

namespace dscpp::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

template <typename T, typename O, typename B, int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(O* __restrict__ out, const T* __restrict__ inp, const T* __restrict__ w, const B* __restrict__ bias,
                const O* residual, int64_t OC, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t oc = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (oc >= OC) return;
  const T* row = w + oc * C;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.0f;
  constexpr int V = 8;
  int c = lane * V;
  for (; c + (kUnroll - 1) * 32 * V < C; c += kUnroll * 32 * V) {
    float wv[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) load_f<T, V>(row + c + u * 32 * V, wv[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int m = 0; m < M; m++) {
        float xv[V];
        load_f<T, V>(inp + int64_t(m) * C + c + u * 32 * V, xv);
#pragma unroll
        for (int k = 0; k < V; k++) acc[m] = fmaf(wv[u][k], xv[k], acc[m]);
      }
  }
  for (; c < C; c += 32 * V) {
    float wv[V];
    load_f<T, V>(row + c, wv);
#pragma unroll
    for (int m = 0; m < M; m++) {
      float xv[V];
      load_f<T, V>(inp + int64_t(m) * C + c, xv);
#pragma unroll
      for (int k = 0; k < V; k++) acc[m] = fmaf(wv[k], xv[k], acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    const float b = bias ? to_f(bias[oc]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; m++) {
      const int64_t at = int64_t(m) * OC + oc;
      out[at] = from_f<O>(acc[m] + b + (residual ? to_f(residual[at]) : 0.0f));
    }
  }
}

template <typename T, typename O, typename B>
void launch(const GemvArgs& g, cudaStream_t s) {
  const unsigned grid = unsigned(ceil_div(g.OC, kWarps));
  auto go = [&](auto kernel) {
    kernel<<<grid, kWarps * 32, 0, s>>>(static_cast<O*>(g.out), static_cast<const T*>(g.inp),
                                        static_cast<const T*>(g.weight), static_cast<const B*>(g.bias),
                                        static_cast<const O*>(g.residual), g.OC, int(g.C));
  };
  switch (g.M) {
    case 1: go(gemv_kernel<T, O, B, 1>); break;
    case 2: go(gemv_kernel<T, O, B, 2>); break;
    case 3: go(gemv_kernel<T, O, B, 3>); break;
    default: go(gemv_kernel<T, O, B, 4>); break;
  }
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
bool launch_t(const GemvArgs& g, cudaStream_t s) {
  const bool out_f32 = g.out_t == DType::f32, bias_f32 = g.bias && g.bias_t == DType::f32;
  if (!out_f32 && g.out_t != g.in_t) return false;
  if (g.bias && !bias_f32 && g.bias_t != g.in_t) return false;
  if (out_f32) bias_f32 ? launch<T, float, float>(g, s) : launch<T, float, T>(g, s);
  else bias_f32 ? launch<T, T, float>(g, s) : launch<T, T, T>(g, s);
  return true;
}

}  // namespace

bool try_gemv(const GemvArgs& g, cudaStream_t s) {
  if (g.M < 1 || g.M > 4 || g.C % 8 != 0 || g.C > INT32_MAX || g.OC <= 0) return false;
  if (!all_aligned16(g.inp, g.weight)) return false;
  if (g.in_t == DType::bf16) return launch_t<__nv_bfloat16>(g, s);
  if (g.in_t == DType::f16) return launch_t<__half>(g, s);
  return false;
}

}  // namespace dscpp::cuda
