// LayerNorm and RMSNorm on CUDA, forward, backward and apply (the forward's output from saved statistics). Same
// formulas as src/kernels/cpu/norm.cpp.
//
// Forward and the dinp part of backward: one warp per row (8 rows per 256-thread block), f32 statistics, 16-byte
// vector loads (Note [Vector width] in common.cuh). The row is read two or three times; the re-reads hit L1/L2.
//
// Note [Deterministic parameter gradients]: dweight[c] (+)= sum_n dout[n,c] * xhat[n,c] and dbias[c] (+)= sum_n
// dout[n,c] are column reductions over all N rows. A separate kernel computes them without atomics: the rows are
// split into G chunks (G depends only on N), a block reduces one chunk for 32*V columns (each thread walks its rows
// in order, then the 8 row-lanes are summed in a fixed order) and writes partial[g][c]; a second kernel adds the G
// partials in order to dweight/dbias. The same inputs give the same bits on every run and every GPU. The cost is a
// second read of dout and inp (a fused single-pass version is a later optimisation).
//
// Dtypes: activations T (f32, bf16, f16); weight/bias and their gradients W = f32 or T; mean/rstd f32.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/norm_rows.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels
constexpr int kColLanes = 32;     // param-grad kernel: threads along columns (each V columns)
constexpr int kRowLanes = 8;      // param-grad kernel: threads along rows

// out[N,C] = (x - mean) * rstd * w + b (LN) or x * rstd * w (RMS: LN == false).
template <typename T, typename W, int V, bool LN>
__global__ void norm_fwd_kernel(T* out, float* mean_out, float* rstd_out, const T* inp, const W* w, const W* b,
                                int64_t N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const T* x = inp + n * C;
  float m = 0.0f;
  if (LN) {
    float s = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
      float v[V];
      load_f<T, V>(x + c, v);
#pragma unroll
      for (int k = 0; k < V; k++) s += v[k];
    }
    m = warp_sum(s) / float(C);
  }
  float ss = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float v[V];
    load_f<T, V>(x + c, v);
#pragma unroll
    for (int k = 0; k < V; k++) ss += (v[k] - m) * (v[k] - m);
  }
  const float rs = 1.0f / sqrtf(warp_sum(ss) / float(C) + eps);
  write_normalized_row<T, W, V, LN>(out + n * C, x, w, b, m, rs, C, lane);
  if (lane == 0) {
    if (LN && mean_out) mean_out[n] = m;
    if (rstd_out) rstd_out[n] = rs;
  }
}

// Note [Norm of few rows]: at decode a norm sees one row per sequence, and a warp walking a row of 2048-8192 in
// two passes took 5.2 us per call on an H100 (33 calls a token on Llama-1B: 10% of a batch-1 step). With few rows,
// one CTA per row instead: each thread holds its R * V elements in registers (one read of x), block-wide sums.
// The normalized value is norm_rows.cuh's expression, so norm_apply rebuilds the same bits from the statistics.
constexpr int kRowThreads = 256;
template <typename T, typename W, int V, int R, bool LN>
__global__ void __launch_bounds__(kRowThreads)
    norm_fwd_row_block_kernel(T* out, float* mean_out, float* rstd_out, const T* inp, const W* w, const W* b, int C,
                              float eps) {
  __shared__ float scratch[32];
  const int64_t n = blockIdx.x;
  const T* x = inp + n * C;
  float v[R][V];
  float s = 0.0f;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int c = (r * kRowThreads + threadIdx.x) * V;
    if (c < C) {
      load_f<T, V>(x + c, v[r]);
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) v[r][k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < V; k++) s += v[r][k];
  }
  const float m = LN ? block_sum(s, scratch) / float(C) : 0.0f;
  float ss = 0.0f;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int c = (r * kRowThreads + threadIdx.x) * V;
#pragma unroll
    for (int k = 0; k < V; k++) ss += c < C ? (v[r][k] - m) * (v[r][k] - m) : 0.0f;
  }
  const float rs = 1.0f / sqrtf(block_sum(ss, scratch) / float(C) + eps);
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int c = (r * kRowThreads + threadIdx.x) * V;
    if (c >= C) continue;
    float wv[V], bv[V];
    load_f<W, V>(w + c, wv);
    if (LN && b) load_f<W, V>(b + c, bv);
#pragma unroll
    for (int k = 0; k < V; k++) v[r][k] = (v[r][k] - m) * rs * wv[k] + ((LN && b) ? bv[k] : 0.0f);
    store_f<T, V>(out + n * C + c, v[r]);
  }
  if (threadIdx.x == 0) {
    if (LN && mean_out) mean_out[n] = m;
    if (rstd_out) rstd_out[n] = rs;
  }
}

// The forward's output from saved statistics (no reduction): the row writer of norm_fwd_kernel and of fused_norm.cu's
// residual_norm_fwd_kernel (norm_rows.cuh), so the bits the forward wrote.
template <typename T, typename W, int V, bool LN>
__global__ void norm_apply_kernel(T* out, const T* inp, const W* w, const W* b, const float* mean, const float* rstd,
                                  int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  write_normalized_row<T, W, V, LN>(out + n * C, inp + n * C, w, b, LN ? mean[n] : 0.0f, rstd[n], C, lane);
}

// dinp[N,C] (=). LN: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w, xhat = (x - mean) * rstd.
// RMS: dx = rstd * g - x * rstd^3 * mean(g * x).
template <typename T, typename W, int V, bool LN>
__global__ void norm_bwd_dinp_kernel(T* dinp, const T* dout, const T* inp, const W* w, const float* mean,
                                     const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const T* x = inp + n * C;
  const T* d = dout + n * C;
  const float m = LN ? mean[n] : 0.0f, s = rstd[n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    load_f<T, V>(x + c, xv);
    load_f<T, V>(d + c, dv);
    load_f<W, V>(w + c, wv);
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float g = dv[k] * wv[k];
      g_sum += g;
      gx_sum += LN ? g * (xv[k] - m) * s : g * xv[k];
    }
  }
  const float g_mean = warp_sum(g_sum) / float(C), gx_mean = warp_sum(gx_sum) / float(C);
  const float k_rms = s * s * s * gx_mean;
  T* dx = dinp + n * C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    load_f<T, V>(x + c, xv);
    load_f<T, V>(d + c, dv);
    load_f<W, V>(w + c, wv);
#pragma unroll
    for (int k = 0; k < V; k++) {
      if (LN) {
        const float xhat = (xv[k] - m) * s;
        dv[k] = s * (dv[k] * wv[k] - g_mean - xhat * gx_mean);
      } else {
        dv[k] = s * dv[k] * wv[k] - xv[k] * k_rms;
      }
    }
    store_f<T, V>(dx + c, dv);
  }
}

// Note [Deterministic parameter gradients], first pass. Grid (column blocks, G row chunks), block
// (kColLanes * kRowLanes). part_w/part_b[G, C] (=); part_b may be null.
template <typename T, int V, bool LN>
__global__ void norm_param_partial_kernel(float* part_w, float* part_b, const T* dout, const T* inp,
                                          const float* mean, const float* rstd, int64_t N, int C, int64_t rows_per) {
  __shared__ float sw[kRowLanes][kColLanes * V];
  __shared__ float sb[kRowLanes][kColLanes * V];
  const int tx = threadIdx.x % kColLanes, ty = threadIdx.x / kColLanes;
  const int c0 = (blockIdx.x * kColLanes + tx) * V;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per;
  const int64_t r1 = min(r0 + rows_per, N);
  float aw[V], ab[V];
#pragma unroll
  for (int k = 0; k < V; k++) aw[k] = ab[k] = 0.0f;
  if (c0 < C) {
    for (int64_t n = r0 + ty; n < r1; n += kRowLanes) {
      float xv[V], dv[V];
      load_f<T, V>(inp + n * C + c0, xv);
      load_f<T, V>(dout + n * C + c0, dv);
      const float m = LN ? mean[n] : 0.0f, s = rstd[n];
#pragma unroll
      for (int k = 0; k < V; k++) {
        aw[k] += dv[k] * (xv[k] - m) * s;
        ab[k] += dv[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; k++) {
    sw[ty][tx * V + k] = aw[k];
    sb[ty][tx * V + k] = ab[k];
  }
  __syncthreads();
  if (ty == 0 && c0 < C) {
#pragma unroll
    for (int k = 0; k < V; k++) {
      float tw = 0.0f, tb = 0.0f;
      for (int r = 0; r < kRowLanes; r++) {
        tw += sw[r][tx * V + k];
        tb += sb[r][tx * V + k];
      }
      part_w[int64_t(blockIdx.y) * C + c0 + k] = tw;
      if (part_b) part_b[int64_t(blockIdx.y) * C + c0 + k] = tb;
    }
  }
}


}  // namespace

// ---- raw launchers ----
// out[N,C], mean/rstd[N] (either may be null), inp[N,C], w[C], b[C] (may be null; LN only).
template <typename T, typename W, bool LN>
void launch_norm_forward(T* out, float* mean, float* rstd, const T* inp, const W* w, const W* b, int64_t N, int C,
                         float eps, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const unsigned grid = unsigned(ceil_div(N, kRowsPerBlock));
  const bool vec = C % V == 0 && all_aligned16(out, inp) && all_aligned16(w, b);
  if (vec && N <= 256 && C <= 8 * kRowThreads * V) {  // Note [Norm of few rows]
    const int R = int(ceil_div(C, int64_t(kRowThreads) * V));
    auto launch = [&](auto kernel) { kernel<<<unsigned(N), kRowThreads, 0, s>>>(out, mean, rstd, inp, w, b, C, eps); };
    if (R == 1) launch(norm_fwd_row_block_kernel<T, W, V, 1, LN>);
    else if (R == 2) launch(norm_fwd_row_block_kernel<T, W, V, 2, LN>);
    else if (R <= 4) launch(norm_fwd_row_block_kernel<T, W, V, 4, LN>);
    else launch(norm_fwd_row_block_kernel<T, W, V, 8, LN>);
  } else if (vec)
    norm_fwd_kernel<T, W, V, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
  else
    norm_fwd_kernel<T, W, 1, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// out[N,C], inp[N,C], w[C], b[C] (may be null; LN only), mean[N] (LN only), rstd[N].
template <typename T, typename W, bool LN>
void launch_norm_apply(T* out, const T* inp, const W* w, const W* b, const float* mean, const float* rstd, int64_t N,
                       int C, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const unsigned grid = unsigned(ceil_div(N, kRowsPerBlock));
  if (C % V == 0 && all_aligned16(out, inp) && all_aligned16(w, b))
    norm_apply_kernel<T, W, V, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(out, inp, w, b, mean, rstd, N, C);
  else
    norm_apply_kernel<T, W, 1, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(out, inp, w, b, mean, rstd, N, C);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// dinp[N,C] (=), dw[C] (+=, may be null), db[C] (+=, may be null; LN only). Weight W, gradients G (each f32 or T).
template <typename T, typename W, typename G, bool LN>
void launch_norm_backward(T* dinp, G* dw, G* db, const T* dout, const T* inp, const W* w, const float* mean,
                          const float* rstd, int64_t N, int C, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const bool vec = C % V == 0 && all_aligned16(dinp, dout, inp) && all_aligned16(w);
  const unsigned grid = unsigned(ceil_div(N, kRowsPerBlock));
  if (vec)
    norm_bwd_dinp_kernel<T, W, V, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  else
    norm_bwd_dinp_kernel<T, W, 1, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  DSCPP_CUDA_CHECK_LAUNCH();
  if (!dw && !db) return;

  // Note [Deterministic parameter gradients]: G depends only on N.
  const int nchunks = int(std::min<int64_t>(ceil_div(N, 64), 256));
  const int64_t rows_per = ceil_div(N, nchunks);
  float* part = nullptr;  // [G, C] for dw, then [G, C] for db
  const size_t part_elems = size_t(nchunks) * size_t(C);
  DSCPP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&part), 2 * part_elems * sizeof(float), s));
  float* part_w = part;
  float* part_b = LN && db ? part + part_elems : nullptr;
  if (vec) {
    const dim3 grid2(unsigned(ceil_div(C, kColLanes * V)), unsigned(nchunks));
    norm_param_partial_kernel<T, V, LN><<<grid2, kColLanes * kRowLanes, 0, s>>>(part_w, part_b, dout, inp, mean,
                                                                                rstd, N, C, rows_per);
  } else {
    const dim3 grid2(unsigned(ceil_div(C, kColLanes)), unsigned(nchunks));
    norm_param_partial_kernel<T, 1, LN><<<grid2, kColLanes * kRowLanes, 0, s>>>(part_w, part_b, dout, inp, mean,
                                                                                rstd, N, C, rows_per);
  }
  DSCPP_CUDA_CHECK_LAUNCH();
  norm_param_final_kernel<G><<<unsigned(ceil_div(C, 256)), 256, 0, s>>>(dw, LN ? db : nullptr, part_w, part_b, nchunks,
                                                                      C);
  DSCPP_CUDA_CHECK_LAUNCH();
  DSCPP_CUDA_CHECK(cudaFreeAsync(part, s));
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch L(out);
  dispatch_act_param("layernorm_forward", inp.dtype(), weight.dtype(), [&](auto* tt, auto* wt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    launch_norm_forward<T, W, true>(ptr<T>(out), ptr_or_null<float>(mean), ptr_or_null<float>(rstd), ptr<T>(inp),
                                    ptr<W>(weight), ptr_or_null<W>(bias), N, int(C), eps, L.stream);
  });
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch L(dinp);
  // ops.cpp requires dweight and dbias (when both are given) to share one dtype.
  const DType gt = dweight.defined() ? dweight.dtype() : dbias.defined() ? dbias.dtype() : DType::f32;
  dispatch_act_param2("layernorm_backward", inp.dtype(), weight.dtype(), gt, [&](auto* tt, auto* wt, auto* gtag) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    using G = std::remove_pointer_t<decltype(gtag)>;
    launch_norm_backward<T, W, G, true>(ptr<T>(dinp), ptr_or_null<G>(dweight), ptr_or_null<G>(dbias), ptr<T>(dout),
                                        ptr<T>(inp), ptr<W>(weight), ptr<float>(mean), ptr<float>(rstd), N, int(C),
                                        L.stream);
  });
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, float eps) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch L(out);
  dispatch_act_param("rmsnorm_forward", inp.dtype(), weight.dtype(), [&](auto* tt, auto* wt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    launch_norm_forward<T, W, false>(ptr<T>(out), nullptr, ptr_or_null<float>(rstd), ptr<T>(inp), ptr<W>(weight),
                                     static_cast<const W*>(nullptr), N, int(C), eps, L.stream);
  });
}

void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch L(dinp);
  const DType gt = dweight.defined() ? dweight.dtype() : DType::f32;
  dispatch_act_param2("rmsnorm_backward", inp.dtype(), weight.dtype(), gt, [&](auto* tt, auto* wt, auto* gtag) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    using G = std::remove_pointer_t<decltype(gtag)>;
    launch_norm_backward<T, W, G, false>(ptr<T>(dinp), ptr_or_null<G>(dweight), static_cast<G*>(nullptr),
                                         ptr<T>(dout), ptr<T>(inp), ptr<W>(weight), nullptr, ptr<float>(rstd), N,
                                         int(C), L.stream);
  });
}

void layernorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                     const Tensor& mean, const Tensor& rstd) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch L(out);
  dispatch_act_param("layernorm_apply", inp.dtype(), weight.dtype(), [&](auto* tt, auto* wt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    launch_norm_apply<T, W, true>(ptr<T>(out), ptr<T>(inp), ptr<W>(weight), ptr_or_null<W>(bias), ptr<float>(mean),
                                  ptr<float>(rstd), N, int(C), L.stream);
  });
}

void rmsnorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const int64_t C = inp.size(-1), N = inp.numel() / C;
  if (N == 0) return;
  OpLaunch L(out);
  dispatch_act_param("rmsnorm_apply", inp.dtype(), weight.dtype(), [&](auto* tt, auto* wt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    launch_norm_apply<T, W, false>(ptr<T>(out), ptr<T>(inp), ptr<W>(weight), static_cast<const W*>(nullptr), nullptr,
                                   ptr<float>(rstd), N, int(C), L.stream);
  });
}

}  // namespace dscpp::cuda
