// Softmax cross-entropy fused with the logits on CUDA (no f32 copy of the logits). One block per row.
//   forward: online (max, sum of exp) over the row's first V columns, then loss = lse - x[target] and, when asked,
//            the row's lse (log-sum-exp), which lets the backward skip its own pass over the row.
//   backward: dx = dloss * (exp(x - lse) - [c == target]) for c < V, 0 for the padded columns c >= V; lse is the
//            forward's when given, else recomputed from the row first (one more read of it).
// Note [Streaming the logits]: the logits are the largest tensor of a step (N x 50304 for GPT-2: 3.3 GB in bf16 at
// B=32, T=1024), read once by the forward and once (plus a write) by the backward, so both kernels are bandwidth
// loops: each thread keeps kUnroll 16-byte loads in flight before using any of them, and the exponentials run in
// base 2 (x * log2 e) so each element costs one ex2. A row's running (max, sum) is rescaled once per kUnroll
// vectors, not per element.
// Each element is read and then written by the same thread, after the row's lse is known, so dlogits may alias
// logits. Rows with target < 0 are ignored (loss 0, lse 0, gradient 0). A target >= V (not range-checked on this
// path) gives a NaN loss and gradient. Logits T (f32, bf16, f16); losses and lse f32; dlogits T.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/parallel_ops_cuda.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 512;
constexpr int kUnroll = 4;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Running (max m, sum s of 2^(y - m)) in base-2 units y = x log2(e); m = -inf means empty.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m)};
}

// Folds n values y[0..n) (base-2 units) into acc with one rescale.
template <int N>
__device__ __forceinline__ MaxSum fold(MaxSum acc, const float* y, const bool* valid) {
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < N; k++)
    if (valid[k]) m = fmaxf(m, y[k]);
  if (m == -INFINITY) return acc;
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < N; k++)
    if (valid[k]) s += exp2f(y[k] - m);
  return combine(acc, {m, s});
}

// The row's log-sum-exp over row[0..V) in natural-log units, for the whole block; every thread gets it.
template <typename T, int VEC>
__device__ float row_lse(const T* row, int64_t V) {
  __shared__ float sm[32], ss[32];
  MaxSum acc{-INFINITY, 0.0f};
  const int64_t stride = int64_t(blockDim.x) * VEC;
  int64_t c = int64_t(threadIdx.x) * VEC;
  for (; c + (kUnroll - 1) * stride + VEC <= V; c += kUnroll * stride) {  // kUnroll whole vectors in flight
    float x[kUnroll * VEC];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) load_f<T, VEC>(row + c + u * stride, x + u * VEC);
    bool valid[kUnroll * VEC];
#pragma unroll
    for (int k = 0; k < kUnroll * VEC; k++) {
      x[k] *= kLog2e;
      valid[k] = true;
    }
    acc = fold<kUnroll * VEC>(acc, x, valid);
  }
  for (; c < V; c += stride) {  // the tail, one vector at a time, masked at V
    float x[VEC];
    load_f<T, VEC>(row + c, x);
    bool valid[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      x[k] *= kLog2e;
      valid[k] = c + k < V;
    }
    acc = fold<VEC>(acc, x, valid);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    acc = combine(acc, {__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = acc.m;
    ss[warp] = acc.s;
  }
  __syncthreads();
  acc = lane < nwarps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    acc = combine(acc, {__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)});
  return (acc.m + log2f(acc.s)) * kLn2;
}

template <typename T, int VEC>
__global__ void ce_fwd_kernel(float* losses, float* lse_out, const T* logits, const int32_t* targets, int64_t V,
                              int64_t Vp) {
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  if (t < 0) {
    if (threadIdx.x == 0) {
      losses[n] = 0.0f;
      if (lse_out) lse_out[n] = 0.0f;
    }
    return;
  }
  const T* row = logits + n * Vp;
  const float lse = row_lse<T, VEC>(row, V);
  if (threadIdx.x == 0) {
    losses[n] = t < V ? lse - to_f(row[t]) : __int_as_float(0x7fc00000);
    if (lse_out) lse_out[n] = lse;
  }
}

// dx = dloss * 2^(y - lse2) - dloss [c == t] over the row; c >= V gets 0.
template <typename T, int VEC>
__device__ __forceinline__ void grad_vector(T* drow, const T* row, int64_t c, int64_t V, int64_t t, float lse2,
                                            float dloss, float bad) {
  float x[VEC];
  load_f<T, VEC>(row + c, x);
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    const int64_t col = c + k;
    x[k] = col < V ? dloss * exp2f(fmaf(x[k], kLog2e, -lse2)) - (col == t ? dloss : 0.0f) + bad : 0.0f;
  }
  store_f<T, VEC>(drow + c, x);
}

template <typename T, int VEC>
__global__ void ce_bwd_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* lse_in, float dloss,
                              int64_t V, int64_t Vp, int64_t first, bool shard) {
  const int64_t n = blockIdx.x;
  const int32_t target = targets[n];
  const int64_t t = int64_t(target) - first;  // the target's column here; a shard may not hold it
  const T* row = logits + n * Vp;
  T* drow = dlogits + n * Vp;
  const int64_t stride = int64_t(blockDim.x) * VEC;
  if (target < 0) {
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < Vp; c += stride) {
      float z[VEC];
#pragma unroll
      for (int k = 0; k < VEC; k++) z[k] = 0.0f;
      store_f<T, VEC>(drow + c, z);
    }
    return;
  }
  const float lse = lse_in ? lse_in[n] : row_lse<T, VEC>(row, V);
  const float lse2 = lse * kLog2e;
  const float bad = shard || t < V ? 0.0f : __int_as_float(0x7fc00000);  // out-of-range target: NaN gradient
  int64_t c = int64_t(threadIdx.x) * VEC;
  for (; c + (kUnroll - 1) * stride + VEC <= Vp; c += kUnroll * stride) {
    float x[kUnroll * VEC];  // all loads first (Note [Streaming the logits]), then compute and store
#pragma unroll
    for (int u = 0; u < kUnroll; u++) load_f<T, VEC>(row + c + u * stride, x + u * VEC);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const int64_t col = c + u * stride + k;
        float& v = x[u * VEC + k];
        v = col < V ? dloss * exp2f(fmaf(v, kLog2e, -lse2)) - (col == t ? dloss : 0.0f) + bad : 0.0f;
      }
      store_f<T, VEC>(drow + c + u * stride, x + u * VEC);
    }
  }
  for (; c < Vp; c += stride) grad_vector<T, VEC>(drow, row, c, V, t, lse2, dloss, bad);
}

// Note [Vocabulary-parallel cross-entropy]: one block per row of the shard.
template <typename T, int VEC>
__global__ void ce_shard_stats_kernel(float* stats, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                                      int64_t Vp, int64_t first) {
  const int64_t n = blockIdx.x;
  const int32_t target = targets[n];
  if (target < 0) {
    if (threadIdx.x == 0) stats[n] = stats[N + n] = 0.0f;
    return;
  }
  const T* row = logits + n * Vp;
  const float lse = row_lse<T, VEC>(row, V);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(target) - first;
    stats[n] = lse;
    stats[N + n] = t >= 0 && t < V ? to_f(row[t]) : 0.0f;
  }
}

__global__ void ce_combine_kernel(float* losses, float* lse, const float* stats, const int32_t* targets, int64_t N,
                                  int64_t S) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  if (targets[n] < 0) {
    losses[n] = lse[n] = 0.0f;
    return;
  }
  float mx = -INFINITY, target = 0.0f;
  for (int64_t s = 0; s < S; s++) mx = fmaxf(mx, stats[s * 2 * N + n]);
  float sum = 0.0f;
  for (int64_t s = 0; s < S; s++) {
    sum += expf(stats[s * 2 * N + n] - mx);
    target += stats[s * 2 * N + N + n];
  }
  lse[n] = mx + logf(sum);
  losses[n] = lse[n] - target;
}

}  // namespace

// ---- raw launchers ---- logits[N, Vp], softmax over the first V columns; lse may be null.
template <typename T>
void launch_crossentropy_forward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N,
                                 int64_t V, int64_t Vp, cudaStream_t s) {
  constexpr int VEC = 16 / sizeof(T);
  if (Vp % VEC == 0 && all_aligned16(logits))
    ce_fwd_kernel<T, VEC><<<unsigned(N), kBlock, 0, s>>>(losses, lse, logits, targets, V, Vp);
  else
    ce_fwd_kernel<T, 1><<<unsigned(N), kBlock, 0, s>>>(losses, lse, logits, targets, V, Vp);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets, const float* lse, float dloss,
                                  int64_t N, int64_t V, int64_t Vp, cudaStream_t s, int64_t first = 0,
                                  bool shard = false) {
  constexpr int VEC = 16 / sizeof(T);
  if (Vp % VEC == 0 && all_aligned16(dlogits, logits))
    ce_bwd_kernel<T, VEC><<<unsigned(N), kBlock, 0, s>>>(dlogits, logits, targets, lse, dloss, V, Vp, first, shard);
  else
    ce_bwd_kernel<T, 1><<<unsigned(N), kBlock, 0, s>>>(dlogits, logits, targets, lse, dloss, V, Vp, first, shard);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// ---- checked entries (ops.cpp has validated shapes and dtypes; V is resolved, 0 < V <= Vp) ----
void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V,
                          const Tensor& lse) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  if (V == 0) V = Vp;
  OpLaunch L(losses);
  float* lse_p = lse.defined() ? ptr<float>(lse) : nullptr;
  dispatch_float("crossentropy_forward", logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_crossentropy_forward<T>(ptr<float>(losses), lse_p, ptr<T>(logits), ptr<int32_t>(targets), N, V, Vp,
                                   L.stream);
  });
}

void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                           int64_t V, const Tensor& lse) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  if (V == 0) V = Vp;
  OpLaunch L(dlogits);
  const float* lse_p = lse.defined() ? ptr<const float>(lse) : nullptr;
  dispatch_float("crossentropy_backward", logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_crossentropy_backward<T>(ptr<T>(dlogits), ptr<T>(logits), ptr<int32_t>(targets), lse_p, dloss, N, V, Vp,
                                    L.stream);
  });
}

void crossentropy_shard_stats(const Tensor& stats, const Tensor& logits, const Tensor& targets, int64_t V,
                              int64_t first) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  OpLaunch L(stats);
  dispatch_float("crossentropy_shard_stats", logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int VEC = 16 / sizeof(T);
    if (Vp % VEC == 0 && all_aligned16(ptr<T>(logits)))
      ce_shard_stats_kernel<T, VEC><<<unsigned(N), kBlock, 0, L.stream>>>(ptr<float>(stats), ptr<T>(logits),
                                                                         ptr<int32_t>(targets), N, V, Vp, first);
    else
      ce_shard_stats_kernel<T, 1><<<unsigned(N), kBlock, 0, L.stream>>>(ptr<float>(stats), ptr<T>(logits),
                                                                       ptr<int32_t>(targets), N, V, Vp, first);
    DSCPP_CUDA_CHECK_LAUNCH();
  });
}

void crossentropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& stats, const Tensor& targets) {
  const int64_t N = losses.numel(), S = stats.numel() / (2 * std::max<int64_t>(N, 1));
  if (N == 0) return;
  OpLaunch L(losses);
  ce_combine_kernel<<<unsigned(ceil_div(N, int64_t(256))), 256, 0, L.stream>>>(
      ptr<float>(losses), ptr<float>(lse), ptr<float>(stats), ptr<int32_t>(targets), N, S);
  DSCPP_CUDA_CHECK_LAUNCH();
}

void crossentropy_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                                 int64_t V, const Tensor& lse, int64_t first) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  OpLaunch L(dlogits);
  dispatch_float("crossentropy_shard_backward", logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_crossentropy_backward<T>(ptr<T>(dlogits), ptr<T>(logits), ptr<int32_t>(targets), ptr<const float>(lse),
                                    dloss, N, V, Vp, L.stream, first, true);
  });
}

}  // namespace dscpp::cuda
