// CPU Adam: the run-time choice of ISA, the tiling over OpenMP threads, and the scalar kernel (the generic path and
// every vector kernel's tail). Note [CPU Adam exactness] in kernels/cpu/cpu_adam.h.
#include "kernels/cpu/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "dscpp/core/check.h"
#include "dscpp/core/half.h"
#include "kernels/cpu/cpu_adam_impl.h"

namespace dscpp::cpu {
namespace {

// cpu::adam_update_reference's element (kernels/cpu/optim.cpp), operation for operation.
template <bool kAdamw, AdamCopy kCopy>
struct Scalar {
  static void run(const AdamConsts& k, const AdamTile& t) {
    for (int64_t i = t.begin; i < t.end; ++i) {
      const float w = t.param[i];
      float g = t.grad[i] * k.gs;
      if (!kAdamw) g += k.wd * w;
      const float m = k.b1 * t.exp_avg[i] + k.one_minus_b1 * g;
      const float v = k.b2 * t.exp_avg_sq[i] + k.one_minus_b2 * g * g;
      const float denom = std::sqrt(v / k.bc2) + k.eps;
      float update = (m / k.bc1) / denom;
      if (kAdamw) update += k.wd * w;
      const float w_new = w - k.lr * update;
      t.param[i] = w_new;
      t.exp_avg[i] = m;
      t.exp_avg_sq[i] = v;
      if (kCopy == AdamCopy::bf16) t.lowp[i] = bf16::from_float(w_new);
      if (kCopy == AdamCopy::f16) t.lowp[i] = f16::from_float(w_new);
    }
  }
};

// Tile boundaries fall on multiples of this many elements: one 64-byte line of a 16-bit buffer, two of an f32 one.
constexpr int64_t kTileAlign = 32;
// Below this a single thread does the step: the fork costs more than the work (~16 KB of state per 512 elements).
constexpr int64_t kParallelMin = 32768;

const AdamKernels& kernels_for(CpuIsa isa) {
  switch (isa) {
#ifdef DSCPP_CPU_ADAM_X86
    case CpuIsa::avx512: return adam_kernels_avx512;
    case CpuIsa::avx2: return adam_kernels_avx2;
#endif
    default: return adam_kernels_scalar;
  }
}

}  // namespace

const AdamKernels adam_kernels_scalar = adam_kernel_table<Scalar>();

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  if (isa == CpuIsa::scalar) return true;
#ifdef DSCPP_CPU_ADAM_X86
  __builtin_cpu_init();
  if (isa == CpuIsa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (isa == CpuIsa::avx512) return __builtin_cpu_supports("avx512f");
#endif
  return false;
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = cpu_isa_supported(CpuIsa::avx512) ? CpuIsa::avx512
                             : cpu_isa_supported(CpuIsa::avx2) ? CpuIsa::avx2
                                                               : CpuIsa::scalar;
  return best;
}

void cpu_adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, void* lowp, DType lowp_t,
                   int64_t n, const ops::AdamParams& p, CpuIsa isa) {
  DSCPP_CHECK(cpu_isa_supported(isa), "cpu_adam_step: this CPU does not run the ", cpu_isa_name(isa), " kernel");
  const AdamCopy copy = !lowp ? AdamCopy::none : lowp_t == DType::bf16 ? AdamCopy::bf16 : AdamCopy::f16;
  DSCPP_CHECK(!lowp || lowp_t == DType::bf16 || lowp_t == DType::f16, "cpu_adam_step: the copy must be bf16 or f16");
  // As the reference (and FusedAdam): the corrections are computed in double and used as float.
  AdamConsts k;
  k.b1 = p.beta1, k.b2 = p.beta2, k.one_minus_b1 = 1.0f - p.beta1, k.one_minus_b2 = 1.0f - p.beta2;
  k.eps = p.eps, k.lr = p.lr, k.wd = p.weight_decay, k.gs = p.grad_scale;
  k.bc1 = p.bias_correction ? float(1.0 - std::pow(double(p.beta1), double(p.step))) : 1.0f;
  k.bc2 = p.bias_correction ? float(1.0 - std::pow(double(p.beta2), double(p.step))) : 1.0f;
  const AdamRangeFn fn = kernels_for(isa).fn[p.adamw_mode][int(copy)];
  AdamTile all{param, grad, exp_avg, exp_avg_sq, static_cast<uint16_t*>(lowp), 0, n};
  if (n < kParallelMin) return fn(k, all);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t per = (n + threads - 1) / threads;
    const int64_t tile = (per + kTileAlign - 1) / kTileAlign * kTileAlign;
    AdamTile t = all;
    t.begin = std::min(n, id * tile);
    t.end = std::min(n, t.begin + tile);
    fn(k, t);
  }
}

}  // namespace dscpp::cpu
