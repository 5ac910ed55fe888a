// The residual add fused with the LayerNorm/RMSNorm after it, on CUDA: the formulas of
// src/kernels/cpu/fused_norm.cpp. Activations T (f32, bf16, f16); weight/bias W and their gradients G each f32 or T;
// statistics f32; all arithmetic f32.
//
// Forward: one warp per row (8 rows per 256-thread block), 16-byte vector accesses when aligned (Note [Vector width]
// in common.cuh). Pass 1 reads x and residual, rounds the sum to T and writes resid; the statistics are taken on the
// rounded values (what is stored is what backward differentiates), re-reading the row the warp has just written.
//
// Note [Fused norm backward]: dresid = dskip + dx needs two row reductions (mean(g), mean(g * xhat)) before any
// element of dx, and dweight/dbias need column reductions over all rows. Three kernels:
//   1. row sums: one warp per row writes g_mean[n] and gx_mean[n] (2N floats of workspace);
//   2. tiles of 32*V columns by a chunk of rows (G chunks, G a function of N only): each thread walks its V columns
//      down the chunk's rows, writes dresid = dskip + dx, and sums dnorm * xhat and dnorm for its columns; the 8
//      row lanes are then added in a fixed order into part[g][c] (no atomics);
//   3. dweight[c] += sum_g part[g][c], in order of g (and dbias alike).
// The same inputs give the same bits on every run and every GPU (as Note [Deterministic parameter gradients] in
// norm.cu). Against norm backward + add_inplace this saves the dinp buffer (an [N, C] temporary), its write and
// re-read, and a kernel; dresid is rounded to T once instead of twice.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/norm_rows.cuh"

namespace dscpp::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block in the row kernels
constexpr int kColLanes = 32;     // tile kernel: threads along columns (each V columns)
constexpr int kRowLanes = 8;      // tile kernel: threads along rows

// resid[N,C] = round_T(x + r); out[N,C] = (resid - mean) * rstd * w + b (LN) or resid * rstd * w (RMS).
template <typename T, typename W, int V, bool LN>
__global__ void residual_norm_fwd_kernel(T* resid, T* out, float* mean_out, float* rstd_out, const T* x, const T* r,
                                         const W* w, const W* b, int64_t N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps leave together: the shuffles below see full warps
  const int64_t row = n * C;
  float sum = 0.0f;  // LN: sum of resid; RMS: sum of resid^2
  for (int c = lane * V; c < C; c += 32 * V) {
    float a[V], q[V];
    load_f<T, V>(x + row + c, a);
    load_f<T, V>(r + row + c, q);
#pragma unroll
    for (int k = 0; k < V; k++) {
      a[k] = to_f(from_f<T>(a[k] + q[k]));  // the value resid will hold
      sum += LN ? a[k] : a[k] * a[k];
    }
    store_f<T, V>(resid + row + c, a);  // element-wise after the loads: resid may alias x or r
  }
  float m = 0.0f, var;
  if (LN) {
    m = warp_sum(sum) / float(C);
    float ss = 0.0f;  // two-pass variance, as the CPU reference
    for (int c = lane * V; c < C; c += 32 * V) {
      float a[V];
      load_f<T, V>(resid + row + c, a);
#pragma unroll
      for (int k = 0; k < V; k++) ss += (a[k] - m) * (a[k] - m);
    }
    var = warp_sum(ss) / float(C);
  } else {
    var = warp_sum(sum) / float(C);
  }
  const float rs = 1.0f / sqrtf(var + eps);
  write_normalized_row<T, W, V, LN>(out + row, resid + row, w, b, m, rs, C, lane);
  if (lane == 0) {
    if (LN && mean_out) mean_out[n] = m;
    if (rstd_out) rstd_out[n] = rs;
  }
}

// The per-element math of the backward. Row sums over V elements: g = dnorm * w, and g * xhat (LN) or g * x (RMS).
template <int V, bool LN>
__device__ __forceinline__ void add_row_sums(const float* xv, const float* dv, const float* wv, float m, float s,
                                             float& g_sum, float& gx_sum) {
#pragma unroll
  for (int k = 0; k < V; k++) {
    const float g = dv[k] * wv[k];
    g_sum += g;
    gx_sum += LN ? g * ((xv[k] - m) * s) : g * xv[k];
  }
}

// kv += dx over V elements, from the row's statistics and sums (gm, gxm); aw/ab += the column sums' terms.
template <int V, bool LN>
__device__ __forceinline__ void add_dx(float* kv, float* aw, float* ab, const float* xv, const float* dv,
                                       const float* wv, float m, float s, float gm, float gxm) {
  const float k_rms = s * s * s * gxm;
#pragma unroll
  for (int k = 0; k < V; k++) {
    float dx;
    if (LN) {
      const float xhat = (xv[k] - m) * s;
      aw[k] += dv[k] * xhat;
      ab[k] += dv[k];
      dx = s * (dv[k] * wv[k] - gm - xhat * gxm);
    } else {
      aw[k] += dv[k] * xv[k] * s;
      dx = s * dv[k] * wv[k] - xv[k] * k_rms;
    }
    kv[k] += dx;
  }
}

// Note [Fused norm backward], kernel 1: g_mean[n] = mean_c(dnorm * w), gx_mean[n] = mean_c(dnorm * w * xhat) (LN)
// or mean_c(dnorm * w * resid) (RMS).
template <typename T, typename W, int V, bool LN>
__global__ void residual_norm_bwd_rows_kernel(float* g_mean, float* gx_mean, const T* dnorm, const T* resid,
                                              const W* w, const float* mean, const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const int64_t row = n * C;
  const float m = LN ? mean[n] : 0.0f, s = rstd[n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane * V; c < C; c += 32 * V) {
    float xv[V], dv[V], wv[V];
    load_f<T, V>(resid + row + c, xv);
    load_f<T, V>(dnorm + row + c, dv);
    load_f<W, V>(w + c, wv);
    add_row_sums<V, LN>(xv, dv, wv, m, s, g_sum, gx_sum);
  }
  g_sum = warp_sum(g_sum);
  gx_sum = warp_sum(gx_sum);
  if (lane == 0) {
    g_mean[n] = g_sum / float(C);
    gx_mean[n] = gx_sum / float(C);
  }
}

// Note [Fused norm backward], kernel 2. Grid (column tiles of kColLanes * V, G row chunks of rows_per), block
// kColLanes * kRowLanes. dresid[N,C] (=) = dskip + dx; part_w/part_b[G, C] (=), either may be null.
template <typename T, typename W, int V, bool LN>
__global__ void residual_norm_bwd_tile_kernel(T* dresid, float* part_w, float* part_b, const T* dskip,
                                              const T* dnorm, const T* resid, const W* w, const float* mean,
                                              const float* rstd, const float* g_mean, const float* gx_mean, int64_t N,
                                              int C, int64_t rows_per) {
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
    float wv[V];
    load_f<W, V>(w + c0, wv);
    for (int64_t n = r0 + ty; n < r1; n += kRowLanes) {
      const int64_t i = n * C + c0;
      float xv[V], dv[V], kv[V];
      load_f<T, V>(resid + i, xv);
      load_f<T, V>(dnorm + i, dv);
      load_f<T, V>(dskip + i, kv);
      const float m = LN ? mean[n] : 0.0f, s = rstd[n];
      add_dx<V, LN>(kv, aw, ab, xv, dv, wv, m, s, g_mean[n], gx_mean[n]);
      store_f<T, V>(dresid + i, kv);  // after the loads of the same elements: dresid may alias dskip
    }
  }
  if (!part_w && !part_b) return;  // uniform over the block, so no thread skips the barrier alone
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
      for (int j = 0; j < kRowLanes; j++) {
        tw += sw[j][tx * V + k];
        tb += sb[j][tx * V + k];
      }
      if (part_w) part_w[int64_t(blockIdx.y) * C + c0 + k] = tw;
      if (part_b) part_b[int64_t(blockIdx.y) * C + c0 + k] = tb;
    }
  }
}

}  // namespace

// ---- raw launchers ----
// resid, out [N,C] (=); mean, rstd [N] (either may be null; mean LN only); x, r [N,C]; w[C]; b[C] (may be null).
template <typename T, typename W, bool LN>
void launch_fused_residual_norm_forward(T* resid, T* out, float* mean, float* rstd, const T* x, const T* r,
                                        const W* w, const W* b, int64_t N, int C, float eps, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const unsigned grid = unsigned(ceil_div(N, kRowsPerBlock));
  if (C % V == 0 && all_aligned16(resid, out, x, r) && all_aligned16(w, b))
    residual_norm_fwd_kernel<T, W, V, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(resid, out, mean, rstd, x, r, w, b, N,
                                                                             C, eps);
  else
    residual_norm_fwd_kernel<T, W, 1, LN><<<grid, 32 * kRowsPerBlock, 0, s>>>(resid, out, mean, rstd, x, r, w, b, N,
                                                                             C, eps);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// dresid[N,C] (=); dw[C], db[C] (+=, may be null; db LN only); dskip, dnorm, resid [N,C]; w[C]; mean (LN), rstd [N].
template <typename T, typename W, typename G, bool LN>
void launch_fused_residual_norm_backward(T* dresid, G* dw, G* db, const T* dskip, const T* dnorm, const T* resid,
                                         const W* w, const float* mean, const float* rstd, int64_t N, int C,
                                         cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (!LN) db = nullptr;
  const bool vec = C % V == 0 && all_aligned16(dresid, dskip, dnorm, resid) && all_aligned16(w);
  // Note [Fused norm backward]: the chunk count depends only on N.
  const int nchunks = int(std::min<int64_t>(ceil_div(N, 64), 256));
  const int64_t rows_per = ceil_div(N, nchunks);
  const size_t part_elems = size_t(nchunks) * size_t(C);
  const size_t work_elems = 2 * size_t(N) + (dw || db ? 2 * part_elems : 0);
  float* work = nullptr;  // [g_mean N | gx_mean N | part_w G*C | part_b G*C]
  DSCPP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&work), work_elems * sizeof(float), s));
  float* g_mean = work;
  float* gx_mean = work + N;
  float* part_w = dw ? work + 2 * N : nullptr;
  float* part_b = db ? work + 2 * N + part_elems : nullptr;

  const unsigned row_grid = unsigned(ceil_div(N, kRowsPerBlock));
  const int block = kColLanes * kRowLanes;
  if (vec) {
    residual_norm_bwd_rows_kernel<T, W, V, LN><<<row_grid, 32 * kRowsPerBlock, 0, s>>>(g_mean, gx_mean, dnorm, resid,
                                                                                      w, mean, rstd, N, C);
    DSCPP_CUDA_CHECK_LAUNCH();
    const dim3 grid(unsigned(ceil_div(C, kColLanes * V)), unsigned(nchunks));
    residual_norm_bwd_tile_kernel<T, W, V, LN><<<grid, block, 0, s>>>(dresid, part_w, part_b, dskip, dnorm, resid, w,
                                                                      mean, rstd, g_mean, gx_mean, N, C, rows_per);
  } else {
    residual_norm_bwd_rows_kernel<T, W, 1, LN><<<row_grid, 32 * kRowsPerBlock, 0, s>>>(g_mean, gx_mean, dnorm, resid,
                                                                                      w, mean, rstd, N, C);
    DSCPP_CUDA_CHECK_LAUNCH();
    const dim3 grid(unsigned(ceil_div(C, kColLanes)), unsigned(nchunks));
    residual_norm_bwd_tile_kernel<T, W, 1, LN><<<grid, block, 0, s>>>(dresid, part_w, part_b, dskip, dnorm, resid, w,
                                                                      mean, rstd, g_mean, gx_mean, N, C, rows_per);
  }
  DSCPP_CUDA_CHECK_LAUNCH();
  if (dw || db) {
    norm_param_final_kernel<G><<<unsigned(ceil_div(C, 256)), 256, 0, s>>>(dw, db, part_w, part_b, nchunks,
                                                                                  C);
    DSCPP_CUDA_CHECK_LAUNCH();
  }
  DSCPP_CUDA_CHECK(cudaFreeAsync(work, s));
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
void fused_residual_layernorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& x, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, float eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;
  OpLaunch L(resid);
  dispatch_act_param("fused_residual_layernorm_forward", x.dtype(), weight.dtype(), [&](auto* tt, auto* wt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    launch_fused_residual_norm_forward<T, W, true>(ptr<T>(resid), ptr<T>(norm), ptr_or_null<float>(mean),
                                                   ptr_or_null<float>(rstd), ptr<T>(x), ptr<T>(residual),
                                                   ptr<W>(weight), ptr_or_null<W>(bias), N, int(C), eps, L.stream);
  });
}

void fused_residual_rmsnorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& rstd, const Tensor& x,
                                    const Tensor& residual, const Tensor& weight, float eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;
  OpLaunch L(resid);
  dispatch_act_param("fused_residual_rmsnorm_forward", x.dtype(), weight.dtype(), [&](auto* tt, auto* wt) {
    using T = std::remove_pointer_t<decltype(tt)>;
    using W = std::remove_pointer_t<decltype(wt)>;
    launch_fused_residual_norm_forward<T, W, false>(ptr<T>(resid), ptr<T>(norm), nullptr, ptr_or_null<float>(rstd),
                                                    ptr<T>(x), ptr<T>(residual), ptr<W>(weight),
                                                    static_cast<const W*>(nullptr), N, int(C), eps, L.stream);
  });
}

void fused_residual_layernorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dskip, const Tensor& dnorm, const Tensor& resid,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const int64_t C = resid.size(-1), N = resid.numel() / C;
  if (N == 0) return;
  OpLaunch L(dresid);
  // ops.cpp requires dweight and dbias (when both are given) to share one dtype.
  const DType gt = dweight.defined() ? dweight.dtype() : dbias.defined() ? dbias.dtype() : DType::f32;
  dispatch_act_param2("fused_residual_layernorm_backward", resid.dtype(), weight.dtype(), gt,
                      [&](auto* tt, auto* wt, auto* gtag) {
                        using T = std::remove_pointer_t<decltype(tt)>;
                        using W = std::remove_pointer_t<decltype(wt)>;
                        using G = std::remove_pointer_t<decltype(gtag)>;
                        launch_fused_residual_norm_backward<T, W, G, true>(
                            ptr<T>(dresid), ptr_or_null<G>(dweight), ptr_or_null<G>(dbias), ptr<T>(dskip),
                            ptr<T>(dnorm), ptr<T>(resid), ptr<W>(weight), ptr<float>(mean), ptr<float>(rstd), N,
                            int(C), L.stream);
                      });
}

void fused_residual_rmsnorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dskip,
                                     const Tensor& dnorm, const Tensor& resid, const Tensor& weight,
                                     const Tensor& rstd) {
  const int64_t C = resid.size(-1), N = resid.numel() / C;
  if (N == 0) return;
  OpLaunch L(dresid);
  const DType gt = dweight.defined() ? dweight.dtype() : DType::f32;
  dispatch_act_param2("fused_residual_rmsnorm_backward", resid.dtype(), weight.dtype(), gt,
                      [&](auto* tt, auto* wt, auto* gtag) {
                        using T = std::remove_pointer_t<decltype(tt)>;
                        using W = std::remove_pointer_t<decltype(wt)>;
                        using G = std::remove_pointer_t<decltype(gtag)>;
                        launch_fused_residual_norm_backward<T, W, G, false>(
                            ptr<T>(dresid), ptr_or_null<G>(dweight), static_cast<G*>(nullptr), ptr<T>(dskip),
                            ptr<T>(dnorm), ptr<T>(resid), ptr<W>(weight), nullptr, ptr<float>(rstd), N, int(C),
                            L.stream);
                      });
}

}  // namespace dscpp::cuda
