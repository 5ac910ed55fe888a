// GELU (tanh approximation, GPT-2's gelu_new), SiLU and SwiGLU, forward and backward.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

static constexpr int64_t kParallelMin = 16384;
static constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
static constexpr float kGeluCoef = 0.044715f;

// 0.5 * (1 + tanh(u)) == sigmoid(2u): the same function as GPT-2's formula, computed with one expf (several times
// faster than tanhf) and without the cancellation of 1 + tanh(u) for negative u.
void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i], u = kSqrt2OverPi * (x + kGeluCoef * x * x * x);
    out[i] = x / (1.0f + std::exp(-2.0f * u));
  }
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  // d/dx [x * s(2u)] = s + 2 x s (1 - s) du/dx, s = sigmoid(2u), u = sqrt(2/pi) (x + a x^3)
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float x = inp[i], u = kSqrt2OverPi * (x + kGeluCoef * x * x * x);
    const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * x * x);
    dinp[i] = dout[i] * (s + 2.0f * x * s * (1.0f - s) * du);
  }
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void silu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = inp[i] * sigmoid(inp[i]);
}

void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i], s = sigmoid(x);
    dinp[i] = dout[i] * s * (1.0f + x * (1.0f - s));
  }
}

void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F, int64_t k) {
#pragma omp parallel for if (N * F >= kParallelMin)
  for (int64_t n = 0; n < N; n++)
    for (int64_t f = 0; f < F; f++) {
      const float* g = gate_up + n * 2 * F + f / k * 2 * k + f % k;
      out[n * F + f] = g[0] * sigmoid(g[0]) * g[k];
    }
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int64_t F) {
#pragma omp parallel for if (N * F >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const float* g = gate_up + n * 2 * F;
    const float* u = g + F;
    const float* d = dout + n * F;
    float* dg = dgate_up + n * 2 * F;
    float* du = dg + F;
    for (int64_t f = 0; f < F; f++) {
      float x = g[f], s = sigmoid(x);
      float gu = u[f];  // read before writing: dgate_up may not alias gate_up, but stay safe for in-place callers
      du[f] = d[f] * x * s;
      dg[f] = d[f] * gu * s * (1.0f + x * (1.0f - s));
    }
  }
}

}  // namespace dscpp::cpu
