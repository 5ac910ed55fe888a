// Optimizer updates: CPU kernels and the checked entries ops::adam_update, sgd_update, lion_update, adagrad_update.
#include "kernels/cpu/optim.h"

#include <cmath>

#include "kernels/cpu/cpu_adam.h"

#ifdef DSCPP_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dscpp::cpu {

void adam_update_reference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                           const ops::AdamParams& p) {
  // As FusedAdam: the corrections are computed on the host in double and used as float.
  const float bc1 = p.bias_correction ? float(1.0 - std::pow(double(p.beta1), double(p.step))) : 1.0f;
  const float bc2 = p.bias_correction ? float(1.0 - std::pow(double(p.beta2), double(p.step))) : 1.0f;
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps, lr = p.lr, wd = p.weight_decay, gs = p.grad_scale;
  const bool adamw = p.adamw_mode;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float w = param[i];
    float g = grad[i] * gs;
    if (!adamw) g += wd * w;
    float m = b1 * exp_avg[i] + (1.0f - b1) * g;
    float v = b2 * exp_avg_sq[i] + (1.0f - b2) * g * g;
    float denom = std::sqrt(v / bc2) + eps;
    float update = (m / bc1) / denom;
    if (adamw) update += wd * w;
    param[i] = w - lr * update;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, const ops::SgdParams& p) {
  const float lr = p.lr, mom = p.momentum, damp = p.dampening, wd = p.weight_decay, gs = p.grad_scale;
  const bool first = p.first_step, nesterov = p.nesterov, use_mom = p.momentum != 0.0f;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float w = param[i];
    float g = grad[i] * gs;
    if (wd != 0.0f) g += wd * w;
    if (use_mom) {
      float b = first ? g : mom * momentum_buf[i] + (1.0f - damp) * g;
      momentum_buf[i] = b;
      g = nesterov ? g + mom * b : b;
    }
    param[i] = w - lr * g;
  }
}

void lion_update(float* param, const float* grad, float* exp_avg, int64_t n, const ops::LionParams& p) {
  const float lr = p.lr, b1 = p.beta1, b2 = p.beta2, gs = p.grad_scale, decay = 1.0f - p.lr * p.weight_decay;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * gs, m = exp_avg[i];
    const float b1m = b1 * m, b1g = (1.0f - b1) * g;  // two roundings, then the sum's: as the CUDA twin
    const float c = b1m + b1g;
    const float w = param[i] * decay;
    param[i] = c > 0.0f ? w - lr : c < 0.0f ? w + lr : w;
    exp_avg[i] = b2 * m + (1.0f - b2) * g;
  }
}

void adagrad_update(float* param, const float* grad, float* sum, int64_t n, const ops::AdagradParams& p) {
  const float lr = p.lr, eps = p.eps, wd = p.weight_decay, gs = p.grad_scale;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float w = param[i];
    float g = grad[i] * gs;
    if (wd != 0.0f) g += wd * w;
    const float s = sum[i] + g * g;
    sum[i] = s;
    param[i] = w - lr * (g / (std::sqrt(s) + eps));
  }
}

}  // namespace dscpp::cpu

// A device tensor's update runs the CUDA twin (a CPU-only build refuses it); a host one falls through to the CPU.
#ifdef DSCPP_WITH_CUDA
#define ON_DEVICE(op, param, call) \
  if (!(param).device().is_cpu()) return cuda::call
#else
#define ON_DEVICE(op, param, call) \
  if (!(param).device().is_cpu()) DSCPP_FAIL(op, ": no CUDA implementation in this build (", (param).str(), ")")
#endif

namespace dscpp::ops {

static void check_flat_f32(const char* op, const char* name, const Tensor& t, const Tensor& param) {
  DSCPP_CHECK(t.defined(), op, ": ", name, " is undefined");
  DSCPP_CHECK(t.dtype() == DType::f32, op, ": ", name, " must be f32, got ", t.str());
  DSCPP_CHECK(t.numel() == param.numel(), op, ": ", name, " has ", t.numel(), " elements, param has ",
              param.numel());
  DSCPP_CHECK(t.device() == param.device(), op, ": ", name, " is on ", t.device().str(), ", param on ",
              param.device().str());
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamParams& p) {
  const char* op = "adam_update";
  check_flat_f32(op, "param", param, param);
  check_flat_f32(op, "grad", grad, param);
  check_flat_f32(op, "exp_avg", exp_avg, param);
  check_flat_f32(op, "exp_avg_sq", exp_avg_sq, param);
  DSCPP_CHECK(p.step >= 1, op, ": step must be >= 1 (1-based count after this update), got ", p.step);
  ON_DEVICE(op, param, adam_update(param, grad, exp_avg, exp_avg_sq, p));
  cpu::cpu_adam_step(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                     nullptr, DType::f32, param.numel(), p);
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p) {
  const char* op = "sgd_update";
  check_flat_f32(op, "param", param, param);
  check_flat_f32(op, "grad", grad, param);
  if (p.momentum != 0.0f) check_flat_f32(op, "momentum_buf", momentum_buf, param);
  ON_DEVICE(op, param, sgd_update(param, grad, momentum_buf, p));
  cpu::sgd_update(param.data<float>(), grad.data<float>(),
                  p.momentum != 0.0f ? momentum_buf.data<float>() : nullptr, param.numel(), p);
}

void lion_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const LionParams& p) {
  const char* op = "lion_update";
  check_flat_f32(op, "param", param, param);
  check_flat_f32(op, "grad", grad, param);
  check_flat_f32(op, "exp_avg", exp_avg, param);
  ON_DEVICE(op, param, lion_update(param, grad, exp_avg, p));
  cpu::lion_update(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), param.numel(), p);
}

void adagrad_update(const Tensor& param, const Tensor& grad, const Tensor& sum, const AdagradParams& p) {
  const char* op = "adagrad_update";
  check_flat_f32(op, "param", param, param);
  check_flat_f32(op, "grad", grad, param);
  check_flat_f32(op, "sum", sum, param);
  ON_DEVICE(op, param, adagrad_update(param, grad, sum, p));
  cpu::adagrad_update(param.data<float>(), grad.data<float>(), sum.data<float>(), param.numel(), p);
}

}  // namespace dscpp::ops
