// The residual add fused with the LayerNorm/RMSNorm after it (pre-norm blocks: x1 = x + attn(...); h = norm(x1)),
// forward and backward, one row at a time so the row is added, normalised (or differentiated) while it is in cache.
// The per-row arithmetic is norm.cpp's, in the same order: on f32 the fused ops give the same bits as
// residual_forward + layernorm_forward (and layernorm_backward + add_inplace), so the model's numerics do not move.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

static constexpr int64_t kParallelMin = 8192;

// LN: out = (s - mean) * rstd * w + b. RMS (LN = false): mean = 0 and no bias, so out = s * rstd * w with
// rstd = 1/sqrt(mean(s^2) + eps).
template <bool LN>
static void residual_norm_forward(float* resid, float* out, float* mean, float* rstd, const float* x, const float* r,
                                  const float* w, const float* b, int64_t N, int64_t C, float eps) {
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; n++) {
    const float* xn = x + n * C;
    const float* rn = r + n * C;
    float* s = resid + n * C;
    float m = 0.0f;
    for (int64_t c = 0; c < C; c++) {
      s[c] = xn[c] + rn[c];  // element by element, so resid may alias x or r
      if (LN) m += s[c];
    }
    if (LN) m /= float(C);
    float v = 0.0f;
    for (int64_t c = 0; c < C; c++) v += (s[c] - m) * (s[c] - m);
    const float rs = 1.0f / std::sqrt(v / float(C) + eps);
    float* o = out + n * C;
    for (int64_t c = 0; c < C; c++) o[c] = LN ? (s[c] - m) * rs * w[c] + (b ? b[c] : 0.0f) : s[c] * rs * w[c];
    if (LN && mean) mean[n] = m;
    if (rstd) rstd[n] = rs;
  }
}

void fused_residual_layernorm_forward(float* resid, float* out, float* mean, float* rstd, const float* x,
                                      const float* r, const float* w, const float* b, int64_t N, int64_t C, float eps) {
  residual_norm_forward<true>(resid, out, mean, rstd, x, r, w, b, N, C, eps);
}

void fused_residual_rmsnorm_forward(float* resid, float* out, float* rstd, const float* x, const float* r,
                                    const float* w, int64_t N, int64_t C, float eps) {
  residual_norm_forward<false>(resid, out, nullptr, rstd, x, r, w, nullptr, N, C, eps);
}

// dresid = dskip + dx, with dx the norm's input gradient (the formulas of norm.cpp):
//   LN:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dnorm * w, xhat = (s - mean) * rstd;
//        dw += dnorm * xhat, db += dnorm.
//   RMS: dx = rstd * g - s * rstd^3 * mean(g * s);  dw += dnorm * s * rstd.
// dw/db over rows: per-thread partials over a static split, added in thread order (deterministic, as norm.cpp).
template <bool LN>
static void residual_norm_backward(float* dresid, float* dw, float* db, const float* dskip, const float* dnorm,
                                   const float* resid, const float* w, const float* mean, const float* rstd,
                                   int64_t N, int64_t C) {
  const int nt = N * C >= kParallelMin ? omp_get_max_threads() : 1;
  std::vector<float> part(size_t(nt) * 2 * size_t(C), 0.0f);  // per thread: [dw partial C | db partial C]
#pragma omp parallel num_threads(nt)
  {
    float* pw = part.data() + size_t(omp_get_thread_num()) * 2 * size_t(C);
    float* pb = pw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      const float* s = resid + n * C;
      const float* d = dnorm + n * C;
      const float m = LN ? mean[n] : 0.0f, rs = rstd[n];
      float g_mean = 0.0f, gx_mean = 0.0f;
      for (int64_t c = 0; c < C; c++) {
        const float g = d[c] * w[c];
        if (LN) {
          g_mean += g;
          gx_mean += g * ((s[c] - m) * rs);
        } else {
          gx_mean += g * s[c];
        }
      }
      g_mean /= float(C);
      gx_mean /= float(C);
      const float k_rms = rs * rs * rs * gx_mean;
      const float* k = dskip + n * C;
      float* o = dresid + n * C;
      for (int64_t c = 0; c < C; c++) {
        const float dc = d[c];
        float dx;
        if (LN) {
          const float xhat = (s[c] - m) * rs;
          pw[c] += dc * xhat;
          pb[c] += dc;
          dx = rs * (dc * w[c] - g_mean - xhat * gx_mean);
        } else {
          pw[c] += dc * s[c] * rs;
          dx = rs * dc * w[c] - s[c] * k_rms;
        }
        o[c] = k[c] + dx;  // read before write: dresid may alias dskip
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    const float* pw = part.data() + size_t(t) * 2 * size_t(C);
    if (dw)
      for (int64_t c = 0; c < C; c++) dw[c] += pw[c];
    if (db)
      for (int64_t c = 0; c < C; c++) db[c] += pw[C + c];
  }
}

void fused_residual_layernorm_backward(float* dresid, float* dw, float* db, const float* dskip, const float* dnorm,
                                       const float* resid, const float* w, const float* mean, const float* rstd,
                                       int64_t N, int64_t C) {
  residual_norm_backward<true>(dresid, dw, db, dskip, dnorm, resid, w, mean, rstd, N, C);
}

void fused_residual_rmsnorm_backward(float* dresid, float* dw, const float* dskip, const float* dnorm,
                                     const float* resid, const float* w, const float* rstd, int64_t N, int64_t C) {
  residual_norm_backward<false>(dresid, dw, nullptr, dskip, dnorm, resid, w, nullptr, rstd, N, C);
}

}  // namespace dscpp::cpu
