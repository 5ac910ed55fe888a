// Causal grouped-query attention on packed qkv, flash-attention style: forward saves only the log-sum-exp of each
// score row; backward recomputes the probabilities from it (O(T) saved memory instead of O(T^2)).
//
// Per token, qkv[b,t,:] = [q heads (H) | k heads (Hkv) | v heads (Hkv)], each D wide; query head h reads kv head
// h / (H/Hkv). With s = q.k / sqrt(D), p = exp(s - lse), Di = dout_i . out_i:
//   dv_j += p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - Di),  dq_i = sum_j ds_ij k_j / sqrt(D),  dk_j += ds_ij q_i / sqrt(D)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

static inline float dot(const float* a, const float* b, int64_t D) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
  return s;
}

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D) {
  const int64_t R = (H + 2 * Hkv) * D, G = H / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      std::vector<float> p(static_cast<size_t>(T));
      const float* kbase = qkv + b * T * R + (H + h / G) * D;
      const float* vbase = kbase + Hkv * D;
      for (int64_t t = 0; t < T; t++) {
        const float* q = qkv + (b * T + t) * R + h * D;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= t; j++) {
          p[size_t(j)] = dot(q, kbase + j * R, D) * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j <= t; j++) {
          p[size_t(j)] = std::exp(p[size_t(j)] - mx);
          sum += p[size_t(j)];
        }
        const float inv = 1.0f / sum;
        float* o = out + (b * T + t) * H * D + h * D;
        std::memset(o, 0, size_t(D) * sizeof(float));
        for (int64_t j = 0; j <= t; j++) {
          const float pj = p[size_t(j)] * inv;
          const float* v = vbase + j * R;
#pragma omp simd
          for (int64_t d = 0; d < D; d++) o[d] += pj * v[d];
        }
        lse[(b * H + h) * T + t] = mx + std::log(sum);
      }
    }
}

// One (b, h): dq into dqkv; dk and dv (+=) into dk/dv with row stride ld (zeroed by the caller).
static void attention_backward_head(float* dqkv, float* dk, float* dv, int64_t ld, const float* dout,
                                    const float* qkv, const float* out, const float* lse, int64_t b, int64_t h,
                                    int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t R = (H + 2 * Hkv) * D, G = H / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
  const float* kbase = qkv + b * T * R + (H + h / G) * D;
  const float* vbase = kbase + Hkv * D;
  std::vector<float> dq(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; t++) {
    const float* q = qkv + (b * T + t) * R + h * D;
    const float* dy = dout + (b * T + t) * H * D + h * D;
    const float* y = out + (b * T + t) * H * D + h * D;
    const float Di = dot(dy, y, D), l = lse[(b * H + h) * T + t];
    std::fill(dq.begin(), dq.end(), 0.0f);
    for (int64_t j = 0; j <= t; j++) {
      const float* k = kbase + j * R;
      const float* v = vbase + j * R;
      const float p = std::exp(dot(q, k, D) * scale - l);
      const float ds = p * (dot(dy, v, D) - Di);
      float* dkj = dk + j * ld;
      float* dvj = dv + j * ld;
#pragma omp simd
      for (int64_t d = 0; d < D; d++) {
        dq[size_t(d)] += ds * k[d];
        dkj[d] += ds * scale * q[d];
        dvj[d] += p * dy[d];
      }
    }
    float* dqt = dqkv + (b * T + t) * R + h * D;
    for (int64_t d = 0; d < D; d++) dqt[d] = dq[size_t(d)] * scale;
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t R = (H + 2 * Hkv) * D, G = H / Hkv;
  if (G == 1) {
    // Each query head owns its k/v head: accumulate straight into dqkv after zeroing the k and v parts.
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < H; h++) {
        float* dk = dqkv + b * T * R + (H + h) * D;
        float* dv = dk + Hkv * D;
        for (int64_t t = 0; t < T; t++) {
          std::memset(dk + t * R, 0, size_t(D) * sizeof(float));
          std::memset(dv + t * R, 0, size_t(D) * sizeof(float));
        }
        attention_backward_head(dqkv, dk, dv, R, dout, qkv, out, lse, b, h, T, H, Hkv, D);
      }
    return;
  }
  // Grouped: each (b, h) writes its own dk/dv slab [T, 2D] of a scratch buffer (no races, full parallelism over
  // b and h), then the G slabs of a group are summed in head order into dqkv (deterministic).
  std::vector<float> scratch(size_t(B * H * T * 2 * D), 0.0f);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      float* dk = scratch.data() + (b * H + h) * T * 2 * D;
      attention_backward_head(dqkv, dk, dk + D, 2 * D, dout, qkv, out, lse, b, h, T, H, Hkv, D);
    }
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t kh = 0; kh < Hkv; kh++) {
        float* dk = dqkv + (b * T + t) * R + (H + kh) * D;
        float* dv = dk + Hkv * D;
        for (int64_t d = 0; d < D; d++) {
          float sk = 0.0f, sv = 0.0f;
          for (int64_t g = 0; g < G; g++) {
            const float* s = scratch.data() + ((b * H + kh * G + g) * T + t) * 2 * D;
            sk += s[d];
            sv += s[D + d];
          }
          dk[d] = sk;
          dv[d] = sv;
        }
      }
}

}  // namespace dscpp::cpu
