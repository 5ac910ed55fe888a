// CPU optimizer kernels over flat f32 ranges (raw pointers, no checks; ops::adam_update, sgd_update, ... in
// optim.cpp validate and dispatch). n elements each; every buffer is read and written in place.
#pragma once
#include <cstdint>

#include "dscpp/kernels/ops.h"

namespace dscpp::cpu {

// FusedAdam (DeepSpeed csrc/adam/multi_tensor_adam.cu), per element, f32 math:
//   g = grad * grad_scale;  L2 mode: g += wd * p
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   update = (m / bc1) / (sqrt(v / bc2) + eps)  [+ wd * p in AdamW mode];  p -= lr * update
// bc1 = 1 - b1^step, bc2 = 1 - b2^step (1 when bias correction is off).
// The plain loop: the spec, and the oracle of the vectorised cpu_adam_step (kernels/cpu/cpu_adam.h), which is what
// ops::adam_update runs on the CPU.
void adam_update_reference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const ops::AdamParams& p);

// torch.optim.SGD: g = grad * grad_scale + wd * p; with momentum: buf = first_step ? g : mom buf + (1-damp) g,
// g = nesterov ? g + mom buf : buf; p -= lr g. momentum_buf may be null when momentum == 0.
void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, const ops::SgdParams& p);

// Lion (Chen et al. 2023; DeepSpeed FusedLion): g = grad * grad_scale; p *= 1 - lr wd;
//   c = b1 m + (1-b1) g;  p -= lr sign(c) (sign(0) = 0);  m = b2 m + (1-b2) g.
// c is rounded after each product and the sum (no fused multiply-add), so the CUDA twin takes the same sign.
void lion_update(float* param, const float* grad, float* exp_avg, int64_t n, const ops::LionParams& p);

// torch.optim.Adagrad: g = grad * grad_scale + wd p;  sum += g^2;  p -= lr g / (sqrt(sum) + eps).
// (DeepSpeedCPUAdagrad divides the gradient without the decay term; the GPU path of DeepSpeed runs torch's, and
// here both devices run torch's, so offloading never changes the result.)
void adagrad_update(float* param, const float* grad, float* sum, int64_t n, const ops::AdagradParams& p);

}  // namespace dscpp::cpu
