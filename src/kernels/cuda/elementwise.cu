// Elementwise CUDA ops: residual_forward, add_inplace, scale_inplace, sum_blocks, and sum_squares (a deterministic reduction:
// fixed grid, per-thread f64 partials in a fixed order, one block sums the block partials, one D2H copy).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 256;

// out[n] = a[n] + b[n]; out may alias a or b (each element is read before it is written, by the same thread).
template <typename T, int V>
__global__ void residual_kernel(T* out, const T* a, const T* b, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float x[V], y[V];
      load_f<T, V>(a + i, x);
      load_f<T, V>(b + i, y);
#pragma unroll
      for (int k = 0; k < V; k++) x[k] += y[k];
      store_f<T, V>(out + i, x);
    } else {
      for (int64_t j = i; j < n; j++) out[j] = from_f<T>(to_f(a[j]) + to_f(b[j]));
    }
  }
}

// acc[n] += x[n]; acc and x may differ in dtype (e.g. f32 gradient accumulator += bf16 micro-batch gradient).
template <typename A, typename X, int V>
__global__ void add_kernel(A* acc, const X* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float s[V], y[V];
      load_f<A, V>(acc + i, s);
      load_f<X, V>(x + i, y);
#pragma unroll
      for (int k = 0; k < V; k++) s[k] += y[k];
      store_f<A, V>(acc + i, s);
    } else {
      for (int64_t j = i; j < n; j++) acc[j] = from_f<A>(to_f(acc[j]) + to_f(x[j]));
    }
  }
}

template <typename T, int V>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float v[V];
      load_f<T, V>(x + i, v);
#pragma unroll
      for (int k = 0; k < V; k++) v[k] *= s;
      store_f<T, V>(x + i, v);
    } else {
      for (int64_t j = i; j < n; j++) x[j] = from_f<T>(to_f(x[j]) * s);
    }
  }
}

// out[i] = scale * sum_j in[j*n + i], j < blocks, in f32 (the blocks in a fixed order: the same bits on every rank).
template <typename T, int V>
__global__ void sum_blocks_kernel(T* out, const T* in, int64_t n, int64_t blocks, float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float acc[V], v[V];
      load_f<T, V>(in + i, acc);
      for (int64_t j = 1; j < blocks; j++) {
        load_f<T, V>(in + j * n + i, v);
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] += v[k];
      }
#pragma unroll
      for (int k = 0; k < V; k++) acc[k] *= scale;
      store_f<T, V>(out + i, acc);
    } else {
      for (int64_t e = i; e < n; e++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < blocks; j++) acc += to_f(in[j * n + e]);
        out[e] = from_f<T>(acc * scale);
      }
    }
  }
}

// Block partials of sum x^2 (Square) or of sum x: each thread sums its grid-stride elements in f64, the block
// reduces in a fixed tree.
template <typename T, int V, bool Square>
__global__ void sum_partial_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double red[kBlock];
  double acc = 0.0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float v[V];
      load_f<T, V>(x + i, v);
      float s = 0.0f;  // V <= 8 terms in f32, then f64: exact enough, and fast
#pragma unroll
      for (int k = 0; k < V; k++) s = Square ? fmaf(v[k], v[k], s) : s + v[k];
      acc += double(s);
    } else {
      for (int64_t j = i; j < n; j++) {
        const double v = to_f(x[j]);
        acc += Square ? v * v : v;
      }
    }
  }
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

// The G block partials, summed in a fixed order: *out = sum (out != null), *acc += scale * sum (acc != null).
__global__ void sum_partials_kernel(double* out, float* acc, float scale, const double* partial, int G) {
  __shared__ double red[kBlock];
  double sum = 0.0;
  for (int i = threadIdx.x; i < G; i += blockDim.x) sum += partial[i];
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (out) *out = red[0];
    if (acc) *acc = float(double(*acc) + double(scale) * red[0]);
  }
}

constexpr int kMaxSumBlocks = 1024;

// Launches the partials of sum x^2 or sum x over x's n elements into partial[kMaxSumBlocks]; returns their count.
template <typename T, bool Square>
int launch_sum_partials(double* partial, const T* x, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  int G;
  if (aligned16(x)) {
    G = int(grid_for(ceil_div(n, V), kBlock, kMaxSumBlocks));
    sum_partial_kernel<T, V, Square><<<G, kBlock, 0, s>>>(partial, x, n);
  } else {
    G = int(grid_for(n, kBlock, kMaxSumBlocks));
    sum_partial_kernel<T, 1, Square><<<G, kBlock, 0, s>>>(partial, x, n);
  }
  DSCPP_CUDA_CHECK_LAUNCH();
  return G;
}

}  // namespace

// ---- raw launchers ----
template <typename T>
void launch_residual(T* out, const T* a, const T* b, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (all_aligned16(out, a, b))
    residual_kernel<T, V><<<grid_for(ceil_div(n, V), kBlock), kBlock, 0, s>>>(out, a, b, n);
  else
    residual_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(out, a, b, n);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename A, typename X>
void launch_add(A* acc, const X* x, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / (sizeof(A) < sizeof(X) ? sizeof(A) : sizeof(X));
  if (all_aligned16(acc, x))
    add_kernel<A, X, V><<<grid_for(ceil_div(n, V), kBlock), kBlock, 0, s>>>(acc, x, n);
  else
    add_kernel<A, X, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(acc, x, n);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_scale(T* x, float sc, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (all_aligned16(x))
    scale_kernel<T, V><<<grid_for(ceil_div(n, V), kBlock), kBlock, 0, s>>>(x, sc, n);
  else
    scale_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, sc, n);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_sum_blocks(T* out, const T* in, int64_t n, int64_t blocks, float sc, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  // Every block starts on a 16-byte boundary only when n is a multiple of V.
  if (all_aligned16(out, in) && n % V == 0)
    sum_blocks_kernel<T, V><<<grid_for(ceil_div(n, V), kBlock), kBlock, 0, s>>>(out, in, n, blocks, sc);
  else
    sum_blocks_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(out, in, n, blocks, sc);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  OpLaunch L(out);
  dispatch_float("residual_forward", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_residual<T>(ptr<T>(out), ptr<T>(a), ptr<T>(b), out.numel(), L.stream);
  });
}

void add_inplace(const Tensor& acc, const Tensor& x) {
  if (acc.numel() == 0) return;
  OpLaunch L(acc);
  dispatch_float("add_inplace", acc.dtype(), [&](auto* atag) {
    using A = std::remove_pointer_t<decltype(atag)>;
    dispatch_float("add_inplace", x.dtype(), [&](auto* xtag) {
      using X = std::remove_pointer_t<decltype(xtag)>;
      launch_add<A, X>(ptr<A>(acc), ptr<X>(x), acc.numel(), L.stream);
    });
  });
}

void scale_inplace(const Tensor& x, float s) {
  if (x.numel() == 0) return;
  OpLaunch L(x);
  dispatch_float("scale_inplace", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_scale<T>(ptr<T>(x), s, x.numel(), L.stream);
  });
}

void sum_blocks(const Tensor& out, const Tensor& in, float scale) {
  OpLaunch L(out);
  dispatch_float("sum_blocks", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_sum_blocks<T>(ptr<T>(out), ptr<T>(in), out.numel(), in.numel() / out.numel(), scale, L.stream);
  });
}

double sum_squares(const Tensor& x) {
  if (x.numel() == 0) return 0.0;
  OpLaunch L(x);
  double* buf = nullptr;  // [kMaxSumBlocks partials | result]
  DSCPP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), (kMaxSumBlocks + 1) * sizeof(double), L.stream));
  int G = 0;
  dispatch_float("sum_squares", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    G = launch_sum_partials<T, true>(buf, ptr<T>(x), x.numel(), L.stream);
  });
  sum_partials_kernel<<<1, kBlock, 0, L.stream>>>(buf + kMaxSumBlocks, nullptr, 0.0f, buf, G);
  DSCPP_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  DSCPP_CUDA_CHECK(cudaMemcpyAsync(&result, buf + kMaxSumBlocks, sizeof(double), cudaMemcpyDeviceToHost, L.stream));
  DSCPP_CUDA_CHECK(cudaFreeAsync(buf, L.stream));
  DSCPP_CUDA_CHECK(cudaStreamSynchronize(L.stream));
  return result;
}

namespace {
// acc[0] += scale * (sum x or sum x^2), the partials in f64: a scalar that stays on the device until one read.
template <bool Square>
void add_reduced(const char* op, const Tensor& acc, const Tensor& x, float scale) {
  OpLaunch L(acc);
  double* buf = nullptr;  // kMaxSumBlocks partials
  DSCPP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), kMaxSumBlocks * sizeof(double), L.stream));
  int G = 0;
  if (x.numel())
    dispatch_float(op, x.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      G = launch_sum_partials<T, Square>(buf, ptr<T>(x), x.numel(), L.stream);
    });
  sum_partials_kernel<<<1, kBlock, 0, L.stream>>>(nullptr, ptr<float>(acc), scale, buf, G);
  DSCPP_CUDA_CHECK_LAUNCH();
  DSCPP_CUDA_CHECK(cudaFreeAsync(buf, L.stream));
}
}  // namespace

void add_sum(const Tensor& acc, const Tensor& x, float scale) { add_reduced<false>("add_sum", acc, x, scale); }
void add_sum_squares(const Tensor& acc, const Tensor& x) { add_reduced<true>("add_sum_squares", acc, x, 1.0f); }

}  // namespace dscpp::cuda
