// Activation CUDA ops: GELU (tanh approximation), SiLU, SwiGLU on a fused [gate | up] projection, forward and
// backward. Same formulas as the CPU reference (src/kernels/cpu/activation.cpp): GELU as x * sigmoid(2u).
// Elementwise over 16-byte vectors (Note [Vector width] in common.cuh), f32 math.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;

struct GeluFwd {
  __device__ float operator()(float x) const {
    const float u = kSqrt2OverPi * (x + kGeluCoef * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
  }
};
struct GeluBwd {  // d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx
  __device__ float operator()(float d, float x) const {
    const float u = kSqrt2OverPi * (x + kGeluCoef * x * x * x);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * x * x);
    return d * (s + 2.0f * x * s * (1.0f - s) * du);
  }
};
struct SiluFwd {
  __device__ float operator()(float x) const { return x * sigmoidf(x); }
};
struct SiluBwd {
  __device__ float operator()(float d, float x) const {
    const float s = sigmoidf(x);
    return d * s * (1.0f + x * (1.0f - s));
  }
};

// out[i] = f(inp[i])
template <typename T, int V, typename F>
__global__ void unary_kernel(T* out, const T* inp, int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float x[V];
      load_f<T, V>(inp + i, x);
#pragma unroll
      for (int k = 0; k < V; k++) x[k] = f(x[k]);
      store_f<T, V>(out + i, x);
    } else {
      for (int64_t j = i; j < n; j++) out[j] = from_f<T>(f(to_f(inp[j])));
    }
  }
}

// dinp[i] = f(dout[i], inp[i]); dinp may alias dout (read before write by the same thread).
template <typename T, int V, typename F>
__global__ void binary_kernel(T* dinp, const T* dout, const T* inp, int64_t n, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float d[V], x[V];
      load_f<T, V>(dout + i, d);
      load_f<T, V>(inp + i, x);
#pragma unroll
      for (int k = 0; k < V; k++) d[k] = f(d[k], x[k]);
      store_f<T, V>(dinp + i, d);
    } else {
      for (int64_t j = i; j < n; j++) dinp[j] = from_f<T>(f(to_f(dout[j]), to_f(inp[j])));
    }
  }
}

// gate_up[N,2F] -> out[N,F] = silu(gate) * up. Work item i in [0, N*F) covers out[i..i+V); V divides F on the
// vector path, so a vector never crosses a row.
template <typename T, int V>
__global__ void swiglu_fwd_kernel(T* out, const T* gate_up, int64_t N, int64_t F, int64_t k) {
  const int64_t total = N * F, stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < total; i += stride) {
    const int64_t n = i / F, f = i - n * F;
    const T* g = gate_up + n * 2 * F + f / k * 2 * k + f % k;  // blocks of [k gate | k up] (k % V == 0)
    float gv[V], uv[V];
    load_f<T, V>(g, gv);
    load_f<T, V>(g + k, uv);
#pragma unroll
    for (int k = 0; k < V; k++) gv[k] = gv[k] * sigmoidf(gv[k]) * uv[k];
    store_f<T, V>(out + i, gv);
  }
}

// dgate_up[N,2F] (=): dgate = dout * up * s (1 + g (1 - s)), dup = dout * g * s. Reads everything before writing,
// so dgate_up may alias gate_up.
template <typename T, int V>
__global__ void swiglu_bwd_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t F) {
  const int64_t total = N * F, stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < total; i += stride) {
    const int64_t n = i / F, f = i - n * F;
    const int64_t off = n * 2 * F + f;
    float gv[V], uv[V], dv[V], dg[V], du[V];
    load_f<T, V>(gate_up + off, gv);
    load_f<T, V>(gate_up + off + F, uv);
    load_f<T, V>(dout + i, dv);
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float x = gv[k], s = sigmoidf(x);
      du[k] = dv[k] * x * s;
      dg[k] = dv[k] * uv[k] * s * (1.0f + x * (1.0f - s));
    }
    store_f<T, V>(dgate_up + off, dg);
    store_f<T, V>(dgate_up + off + F, du);
  }
}

}  // namespace

// ---- raw launchers ----
template <typename T, typename F>
void launch_unary(T* out, const T* inp, int64_t n, F f, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (all_aligned16(out, inp))
    unary_kernel<T, V><<<grid_for(ceil_div(n, V), kBlock), kBlock, 0, s>>>(out, inp, n, f);
  else
    unary_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(out, inp, n, f);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T, typename F>
void launch_binary(T* dinp, const T* dout, const T* inp, int64_t n, F f, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (all_aligned16(dinp, dout, inp))
    binary_kernel<T, V><<<grid_for(ceil_div(n, V), kBlock), kBlock, 0, s>>>(dinp, dout, inp, n, f);
  else
    binary_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(dinp, dout, inp, n, f);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t F, int64_t k, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (F % V == 0 && k % V == 0 && all_aligned16(out, gate_up))
    swiglu_fwd_kernel<T, V><<<grid_for(N * F / V, kBlock), kBlock, 0, s>>>(out, gate_up, N, F, k);
  else
    swiglu_fwd_kernel<T, 1><<<grid_for(N * F, kBlock), kBlock, 0, s>>>(out, gate_up, N, F, k);
  DSCPP_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t F, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (F % V == 0 && all_aligned16(dgate_up, dout, gate_up))
    swiglu_bwd_kernel<T, V><<<grid_for(N * F / V, kBlock), kBlock, 0, s>>>(dgate_up, dout, gate_up, N, F);
  else
    swiglu_bwd_kernel<T, 1><<<grid_for(N * F, kBlock), kBlock, 0, s>>>(dgate_up, dout, gate_up, N, F);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// ---- checked entries (ops.cpp has validated shapes and dtypes) ----
namespace {
template <typename F>
void unary(const char* op, const Tensor& out, const Tensor& inp, F f) {
  if (inp.numel() == 0) return;
  OpLaunch L(out);
  dispatch_float(op, inp.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_unary<T>(ptr<T>(out), ptr<T>(inp), inp.numel(), f, L.stream);
  });
}
template <typename F>
void binary(const char* op, const Tensor& dinp, const Tensor& dout, const Tensor& inp, F f) {
  if (inp.numel() == 0) return;
  OpLaunch L(dinp);
  dispatch_float(op, inp.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_binary<T>(ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), inp.numel(), f, L.stream);
  });
}
}  // namespace

void gelu_forward(const Tensor& out, const Tensor& inp) { unary("gelu_forward", out, inp, GeluFwd{}); }
void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  binary("gelu_backward", dinp, dout, inp, GeluBwd{});
}
void silu_forward(const Tensor& out, const Tensor& inp) { unary("silu_forward", out, inp, SiluFwd{}); }
void silu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  binary("silu_backward", dinp, dout, inp, SiluBwd{});
}

void swiglu_forward(const Tensor& out, const Tensor& gate_up, int64_t pair_block) {
  const int64_t F = gate_up.size(-1) / 2, N = gate_up.numel() / (2 * F);
  if (N * F == 0) return;
  OpLaunch L(out);
  dispatch_float("swiglu_forward", gate_up.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_swiglu_forward<T>(ptr<T>(out), ptr<T>(gate_up), N, F, pair_block, L.stream);
  });
}

void swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const int64_t F = gate_up.size(-1) / 2, N = gate_up.numel() / (2 * F);
  if (N * F == 0) return;
  OpLaunch L(dgate_up);
  dispatch_float("swiglu_backward", gate_up.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_swiglu_backward<T>(ptr<T>(dgate_up), ptr<T>(dout), ptr<T>(gate_up), N, F, L.stream);
  });
}

}  // namespace dscpp::cuda
