// LayerNorm (GPT-2) and RMSNorm (Llama), forward and backward, one row of C channels per token.
// Statistics are accumulated in f32 over a row, two-pass for the variance (as PyTorch's CPU kernel is, to within
// rounding). dweight/dbias reductions over rows use per-thread partials summed in thread order (deterministic).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

static constexpr int64_t kParallelMin = 8192;

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C, float eps) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    float m = 0.0f;
    for (int64_t c = 0; c < C; c++) m += x[c];
    m /= float(C);
    float v = 0.0f;
    for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= float(C);
    const float s = 1.0f / std::sqrt(v + eps);
    float* o = out + n * C;
    for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + (b ? b[c] : 0.0f);
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = s;
  }
}

// Runs body(n, dw_part, db_part) for every row n, with per-thread zeroed partial buffers of C floats each, then adds
// the partials into dw and db (either may be null) in thread order.
template <typename Body>
static void rows_with_partials(int64_t N, int64_t C, float* dw, float* db, Body body) {
  const int nt = N * C >= kParallelMin ? omp_get_max_threads() : 1;
  std::vector<float> part(size_t(nt) * 2 * size_t(C), 0.0f);
#pragma omp parallel num_threads(nt)
  {
    float* pw = part.data() + size_t(omp_get_thread_num()) * 2 * size_t(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) body(n, pw, pw + C);
  }
  for (int t = 0; t < nt; t++) {
    const float* pw = part.data() + size_t(t) * 2 * size_t(C);
    if (dw)
      for (int64_t c = 0; c < C; c++) dw[c] += pw[c];
    if (db)
      for (int64_t c = 0; c < C; c++) db[c] += pw[C + c];
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C) {
  // With xhat = (x - mean) * rstd and g = dout * w:
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dw += dout * xhat; db += dout.
  rows_with_partials(N, C, dw, db, [&](int64_t n, float* pw, float* pb) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float m = mean[n], s = rstd[n];
    float g_mean = 0.0f, gx_mean = 0.0f;
    for (int64_t c = 0; c < C; c++) {
      const float xhat = (x[c] - m) * s, g = d[c] * w[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= float(C);
    gx_mean /= float(C);
    float* dx = dinp + n * C;
    for (int64_t c = 0; c < C; c++) {
      const float xhat = (x[c] - m) * s, dc = d[c];
      pw[c] += dc * xhat;
      pb[c] += dc;
      dx[c] = s * (dc * w[c] - g_mean - xhat * gx_mean);
    }
  });
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    float ss = 0.0f;
    for (int64_t c = 0; c < C; c++) ss += x[c] * x[c];
    const float s = 1.0f / std::sqrt(ss / float(C) + eps);
    float* o = out + n * C;
    for (int64_t c = 0; c < C; c++) o[c] = x[c] * s * w[c];
    if (rstd) rstd[n] = s;
  }
}

// The forward's output from saved statistics, no reduction: the last loop of layernorm_forward / rmsnorm_forward
// (and of fused_norm.cpp's forward, whose RMS case is the same product), so the recomputed bits are the saved ones.
void layernorm_apply(float* out, const float* inp, const float* w, const float* b, const float* mean,
                     const float* rstd, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float m = mean[n], s = rstd[n];
    float* o = out + n * C;
    for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + (b ? b[c] : 0.0f);
  }
}

void rmsnorm_apply(float* out, const float* inp, const float* w, const float* rstd, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const float* x = inp + n * C;
    const float s = rstd[n];
    float* o = out + n * C;
    for (int64_t c = 0; c < C; c++) o[c] = x[c] * s * w[c];
  }
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int64_t N, int64_t C) {
  // y = x * r * w with r = (mean(x^2) + eps)^-1/2, so dr/dx_j = -r^3 x_j / C and
  // dx = r * g - x * r^3 * mean(g * x) with g = dout * w; dw += dout * x * r.
  rows_with_partials(N, C, dw, nullptr, [&](int64_t n, float* pw, float*) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float s = rstd[n];
    float gx_mean = 0.0f;
    for (int64_t c = 0; c < C; c++) gx_mean += d[c] * w[c] * x[c];
    gx_mean /= float(C);
    const float k = s * s * s * gx_mean;
    float* dx = dinp + n * C;
    for (int64_t c = 0; c < C; c++) {
      const float xc = x[c], dc = d[c];
      pw[c] += dc * xc * s;
      dx[c] = s * dc * w[c] - xc * k;
    }
  });
}

}  // namespace dscpp::cpu
