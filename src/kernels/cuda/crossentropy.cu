// Softmax cross-entropy fused with the logits on CUDA (no f32 copy of the logits). One block per row:
//   pass 1: online (max, sum of exp) over the row's first V columns, per thread, then combined across the block;
//   forward writes loss = max + log(sum) - x[target]; backward writes, in place if dlogits aliases logits,
//   dx = dloss * (exp(x - max) / sum - [c == target]) for c < V and 0 for the padded columns c >= V.
// Each element is read and then written by the same thread after the block-wide reduction, so aliasing is safe.
// Rows with target < 0 are ignored (loss 0, gradient 0). A target >= V (not range-checked on this path) gives a
// NaN loss. Logits T (f32, bf16, f16); losses f32; dlogits T.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 512;

// Running (max m, sum s of exp(x - m)); m = -inf means empty.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// (max, sum exp) over row[0..V) for the whole block; every thread gets the result.
template <typename T, int VEC>
__device__ MaxSum row_stats(const T* row, int64_t V, int64_t Vp) {
  __shared__ float sm[32], ss[32];
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < Vp; c += int64_t(blockDim.x) * VEC) {
    if (c >= V) break;
    float x[VEC];
    load_f<T, VEC>(row + c, x);
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; k++)
      if (c + k < V) m = fmaxf(m, x[k]);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; k++)
      if (c + k < V) s += expf(x[k] - m);
    acc = combine(acc, {m, s});
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
    acc = combine(acc, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = acc.m;
    ss[warp] = acc.s;
  }
  __syncthreads();
  acc = lane < nwarps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
    acc = combine(acc, other);
  }
  return acc;
}

template <typename T, int VEC>
__global__ void ce_fwd_kernel(float* losses, const T* logits, const int32_t* targets, int64_t V, int64_t Vp) {
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  if (t < 0) {
    if (threadIdx.x == 0) losses[n] = 0.0f;
    return;
  }
  const T* row = logits + n * Vp;
  const MaxSum st = row_stats<T, VEC>(row, V, Vp);
  if (threadIdx.x == 0) losses[n] = t < V ? st.m + logf(st.s) - to_f(row[t]) : __int_as_float(0x7fc00000);
}

template <typename T, int VEC>
__global__ void ce_bwd_kernel(T* dlogits, const T* logits, const int32_t* targets, float dloss, int64_t V,
                              int64_t Vp) {
  const int64_t n = blockIdx.x;
  const int32_t t = targets[n];
  const T* row = logits + n * Vp;
  T* drow = dlogits + n * Vp;
  if (t < 0) {
    for (int64_t c = int64_t(threadIdx.x) * VEC; c < Vp; c += int64_t(blockDim.x) * VEC) {
      float z[VEC];
#pragma unroll
      for (int k = 0; k < VEC; k++) z[k] = 0.0f;
      store_f<T, VEC>(drow + c, z);
    }
    return;
  }
  const MaxSum st = row_stats<T, VEC>(row, V, Vp);
  const float scale = dloss / st.s;
  const float bad = t < V ? 0.0f : __int_as_float(0x7fc00000);  // out-of-range target: NaN gradient
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < Vp; c += int64_t(blockDim.x) * VEC) {
    float x[VEC];
    load_f<T, VEC>(row + c, x);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const int64_t col = c + k;
      x[k] = col < V ? expf(x[k] - st.m) * scale - (col == t ? dloss : 0.0f) + bad : 0.0f;
    }
    store_f<T, VEC>(drow + c, x);
  }
}

}  // namespace

// ---- raw launchers ---- logits[N, Vp], softmax over the first V columns.
template <typename T>
void launch_crossentropy_forward(float* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                                 int64_t Vp, cudaStream_t s) {
  constexpr int VEC = 16 / sizeof(T);
  if (Vp % VEC == 0 && all_aligned16(logits))
    ce_fwd_kernel<T, VEC><<<unsigned(N), kBlock, 0, s>>>(losses, logits, targets, V, Vp);
  else
    ce_fwd_kernel<T, 1><<<unsigned(N), kBlock, 0, s>>>(losses, logits, targets, V, Vp);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets, float dloss, int64_t N,
                                  int64_t V, int64_t Vp, cudaStream_t s) {
  constexpr int VEC = 16 / sizeof(T);
  if (Vp % VEC == 0 && all_aligned16(dlogits, logits))
    ce_bwd_kernel<T, VEC><<<unsigned(N), kBlock, 0, s>>>(dlogits, logits, targets, dloss, V, Vp);
  else
    ce_bwd_kernel<T, 1><<<unsigned(N), kBlock, 0, s>>>(dlogits, logits, targets, dloss, V, Vp);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// ---- checked entries (ops.cpp has validated shapes and dtypes; V is resolved, 0 < V <= Vp) ----
void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  if (V == 0) V = Vp;
  OpLaunch L(losses);
  dispatch_float("crossentropy_forward", logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_crossentropy_forward<T>(ptr<float>(losses), ptr<T>(logits), ptr<int32_t>(targets), N, V, Vp, L.stream);
  });
}

void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                           int64_t V) {
  const int64_t Vp = logits.size(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  if (V == 0) V = Vp;
  OpLaunch L(dlogits);
  dispatch_float("crossentropy_backward", logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_crossentropy_backward<T>(ptr<T>(dlogits), ptr<T>(logits), ptr<int32_t>(targets), dloss, N, V, Vp,
                                    L.stream);
  });
}

}  // namespace dscpp::cuda
