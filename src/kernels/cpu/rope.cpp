// Rotary position embedding, Hugging Face Llama "rotate_half" convention: head vector x = [x1 | x2] (D/2 each),
// out = [x1*cos - x2*sin, x2*cos + x1*sin] (pairs elsewhere in the head with rope.pair_block, rope_params.h) with angle_i = pos * inv_freq_i, inv_freq_i = rope_inv_freq(i)
// (1 / theta^(2i/D), Llama 3 scaling when set: kernels/rope_params.h). inv_freq and the angles are computed in f32, as
// HF does, so positions far from 0 round the same way.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {

// sign = +1 rotates by +angle (forward), -1 by -angle (the inverse = transpose, for backward).
static void rope_apply(float* qkv, const int32_t* pos, int64_t N, int64_t H, int64_t Hkv, int64_t D,
                       const RopeParams& rope, float sign) {
  const int64_t half = D / 2, row = (H + 2 * Hkv) * D, heads = H + Hkv;  // q and k heads are adjacent
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; i++) inv_freq[size_t(i)] = rope_inv_freq(int(i), int(D), rope.theta, rope.scaling);
#pragma omp parallel for if (N * heads * D >= 16384)
  for (int64_t n = 0; n < N; n++) {
    float cs[512], sn[512];  // D/2 <= 512 is checked by the entry point
    for (int64_t i = 0; i < half; i++) {
      const float a = float(pos[n]) * inv_freq[size_t(i)];
      cs[i] = cosf(a);
      sn[i] = sign * sinf(a);
    }
    const int64_t gap = rope_gap(int(D), rope.pair_block);
    for (int64_t h = 0; h < heads; h++)
      for (int64_t i = 0; i < half; i++) {
        float* x = qkv + n * row + h * D + rope_first(int(i), rope.pair_block);
        rope_rotate(x[0], x[gap], cs[i], sn[i], x[0], x[gap]);
      }
  }
}

void rope_forward(float* qkv, const int32_t* pos, int64_t N, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope) {
  rope_apply(qkv, pos, N, H, Hkv, D, rope, 1.0f);
}

void rope_backward(float* dqkv, const int32_t* pos, int64_t N, int64_t H, int64_t Hkv, int64_t D,
                   const RopeParams& rope) {
  rope_apply(dqkv, pos, N, H, Hkv, D, rope, -1.0f);
}

}  // namespace dscpp::cpu
