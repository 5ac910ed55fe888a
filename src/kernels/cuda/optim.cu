// Fused optimizer updates on CUDA over flat f32 ranges (params, grads, states): one pass, one kernel, the same
// per-element math as the CPU kernels in src/kernels/cpu/optim.cpp (FusedAdam, torch.optim.SGD, Lion,
// torch.optim.Adagrad). The bias
// corrections are computed on the host in double, as the CPU path does.
// adam_update_with_copy also writes the updated parameters rounded to bf16/f16 (the compute copy used by the next
// forward in mixed precision), saving a separate cast kernel and a second read of the f32 parameters.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace dscpp::cuda {
namespace {

constexpr int kBlock = 256;

struct AdamConsts {
  float lr, b1, b2, eps, wd, bc1, bc2, gs;
  bool adamw;
};

AdamConsts adam_consts(const ops::AdamParams& p) {
  const float bc1 = p.bias_correction ? float(1.0 - std::pow(double(p.beta1), double(p.step))) : 1.0f;
  const float bc2 = p.bias_correction ? float(1.0 - std::pow(double(p.beta2), double(p.step))) : 1.0f;
  return {p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, bc1, bc2, p.grad_scale, p.adamw_mode};
}

__device__ __forceinline__ float adam_one(float& w, float g, float& m, float& v, const AdamConsts& k) {
  g *= k.gs;
  if (!k.adamw) g += k.wd * w;
  m = k.b1 * m + (1.0f - k.b1) * g;
  v = k.b2 * v + (1.0f - k.b2) * g * g;
  const float denom = sqrtf(v / k.bc2) + k.eps;
  float update = (m / k.bc1) / denom;
  if (k.adamw) update += k.wd * w;
  w = w - k.lr * update;
  return w;
}

// V = 4 (float4 accesses) on the vector path, 1 otherwise. lowp may be null (no copy); L is its element type.
template <int V, typename L>
__global__ void adam_kernel(float* param, const float* grad, float* m, float* v, L* lowp, int64_t n, AdamConsts k) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * V;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    if (i + V <= n) {
      float w[V], g[V], mm[V], vv[V];
      load_f<float, V>(param + i, w);
      load_f<float, V>(grad + i, g);
      load_f<float, V>(m + i, mm);
      load_f<float, V>(v + i, vv);
#pragma unroll
      for (int j = 0; j < V; j++) adam_one(w[j], g[j], mm[j], vv[j], k);
      store_f<float, V>(param + i, w);
      store_f<float, V>(m + i, mm);
      store_f<float, V>(v + i, vv);
      if (lowp) store_f<L, V>(lowp + i, w);
    } else {
      for (int64_t j = i; j < n; j++) {
        float w = param[j], mm = m[j], vv = v[j];
        adam_one(w, grad[j], mm, vv, k);
        param[j] = w;
        m[j] = mm;
        v[j] = vv;
        if (lowp) lowp[j] = from_f<L>(w);
      }
    }
  }
}

struct SgdConsts {
  float lr, mom, damp, wd, gs;
  bool nesterov, first, use_mom;
};

__device__ __forceinline__ void sgd_one(float& w, float g, float* buf, const SgdConsts& k) {
  g *= k.gs;
  if (k.wd != 0.0f) g += k.wd * w;
  if (k.use_mom) {
    const float b = k.first ? g : k.mom * *buf + (1.0f - k.damp) * g;
    *buf = b;
    g = k.nesterov ? g + k.mom * b : b;
  }
  w = w - k.lr * g;
}

__global__ void sgd_kernel(float* param, const float* grad, float* buf, int64_t n, SgdConsts k) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float w = param[i];
    sgd_one(w, grad[i], k.use_mom ? buf + i : nullptr, k);
    param[i] = w;
  }
}

// Lion: c rounded after each product and the sum (no FMA contraction), so its sign is the CPU kernel's.
__global__ void lion_kernel(float* param, const float* grad, float* m, int64_t n, ops::LionParams p) {
  const float decay = 1.0f - p.lr * p.weight_decay;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = __fmul_rn(grad[i], p.grad_scale), mi = m[i];
    const float c = __fadd_rn(__fmul_rn(p.beta1, mi), __fmul_rn(1.0f - p.beta1, g));
    const float w = __fmul_rn(param[i], decay);
    param[i] = c > 0.0f ? w - p.lr : c < 0.0f ? w + p.lr : w;
    m[i] = p.beta2 * mi + (1.0f - p.beta2) * g;
  }
}

__global__ void adagrad_kernel(float* param, const float* grad, float* sum, int64_t n, ops::AdagradParams p) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float w = param[i];
    float g = grad[i] * p.grad_scale;
    if (p.weight_decay != 0.0f) g += p.weight_decay * w;
    const float s = sum[i] + g * g;
    sum[i] = s;
    param[i] = w - p.lr * (g / (sqrtf(s) + p.eps));
  }
}

}  // namespace

// ---- raw launchers ---- n elements; param/grad/m/v f32, lowp (may be null) L.
template <typename L>
void launch_adam(float* param, const float* grad, float* m, float* v, L* lowp, int64_t n, const AdamConsts& k,
                 cudaStream_t s) {
  // float4 on the vector path; the copy is then written 4 elements (4 * sizeof(L) bytes) at a time.
  const bool vec = all_aligned16(param, grad, m, v) &&
                   (lowp == nullptr || (reinterpret_cast<uintptr_t>(lowp) & (4 * sizeof(L) - 1)) == 0);
  if (vec)
    adam_kernel<4, L><<<grid_for(ceil_div(n, 4), kBlock), kBlock, 0, s>>>(param, grad, m, v, lowp, n, k);
  else
    adam_kernel<1, L><<<grid_for(n, kBlock), kBlock, 0, s>>>(param, grad, m, v, lowp, n, k);
  DSCPP_CUDA_CHECK_LAUNCH();
}

// ---- checked entries (ops validates dtypes and sizes) ----
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const ops::AdamParams& p) {
  if (param.numel() == 0) return;
  OpLaunch L(param);
  launch_adam<float>(ptr<float>(param), ptr<float>(grad), ptr<float>(exp_avg), ptr<float>(exp_avg_sq), nullptr,
                     param.numel(), adam_consts(p), L.stream);
}

void adam_update_with_copy(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor& param_lowp, const ops::AdamParams& p) {
  if (param.numel() == 0) return;
  OpLaunch L(param);
  dispatch_float("adam_update_with_copy", param_lowp.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_adam<T>(ptr<float>(param), ptr<float>(grad), ptr<float>(exp_avg), ptr<float>(exp_avg_sq), ptr<T>(param_lowp),
                   param.numel(), adam_consts(p), L.stream);
  });
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const ops::SgdParams& p) {
  if (param.numel() == 0) return;
  OpLaunch L(param);
  const bool use_mom = p.momentum != 0.0f;
  const SgdConsts k{p.lr, p.momentum, p.dampening, p.weight_decay, p.grad_scale, p.nesterov, p.first_step, use_mom};
  const int64_t n = param.numel();
  sgd_kernel<<<grid_for(n, kBlock), kBlock, 0, L.stream>>>(ptr<float>(param), ptr<float>(grad),
                                                            use_mom ? ptr<float>(momentum_buf) : nullptr, n, k);
  DSCPP_CUDA_CHECK_LAUNCH();
}

void lion_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const ops::LionParams& p) {
  const int64_t n = param.numel();
  if (n == 0) return;
  OpLaunch L(param);
  lion_kernel<<<grid_for(n, kBlock), kBlock, 0, L.stream>>>(ptr<float>(param), ptr<float>(grad), ptr<float>(exp_avg),
                                                             n, p);
  DSCPP_CUDA_CHECK_LAUNCH();
}

void adagrad_update(const Tensor& param, const Tensor& grad, const Tensor& sum, const ops::AdagradParams& p) {
  const int64_t n = param.numel();
  if (n == 0) return;
  OpLaunch L(param);
  adagrad_kernel<<<grid_for(n, kBlock), kBlock, 0, L.stream>>>(ptr<float>(param), ptr<float>(grad), ptr<float>(sum),
                                                                n, p);
  DSCPP_CUDA_CHECK_LAUNCH();
}

}  // namespace dscpp::cuda
