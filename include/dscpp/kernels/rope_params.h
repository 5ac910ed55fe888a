// Rotary position embedding parameters, as Hugging Face's Llama: the base theta, and the "llama3" frequency scaling
// of Llama 3.1 and later (config.json "rope_scaling": {"rope_type": "llama3", "factor", "low_freq_factor",
// "high_freq_factor", "original_max_position_embeddings"}). rope_inv_freq is the one definition of the rotation
// frequencies: the CPU reference and the CUDA kernel both call it, so they rotate by the same f32 angles.
#pragma once
#include <cmath>

#include "dscpp/core/philox.h"  // DSCPP_HOST_DEVICE

namespace dscpp {

struct RopeScaling {  // "llama3"; factor 0 = none
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float original_max_position = 8192.0f;
  DSCPP_HOST_DEVICE bool enabled() const { return factor > 0.0f; }
};

struct RopeParams {
  float theta = 10000.0f;
  RopeScaling scaling;
  // Where a head's rotated pairs lie. 0: Hugging Face's rotate_half, pair i = (element i, element i + D/2). k > 0:
  // blocks of k first elements then their k partners, pair i = (element 2k * (i / k) + i % k, that + k): the inference
  // engine's layout, whose q and k weight rows it permutes to match (Note [Rope and KV append in the decode GEMV]).
  int pair_block = 0;
  RopeParams(float theta_ = 10000.0f, RopeScaling s = {}) : theta(theta_), scaling(s) {}  // NOLINT: a bare theta
};

// The element of a head that holds the first of rotated pair i (i < D/2), and how far on its partner lies.
DSCPP_HOST_DEVICE inline int rope_first(int i, int pair_block) {
  return pair_block ? i / pair_block * 2 * pair_block + i % pair_block : i;
}
DSCPP_HOST_DEVICE inline int rope_gap(int D, int pair_block) { return pair_block ? pair_block : D / 2; }

// The pair (x1, x2) rotated by the angle of cosine c and sine s: one expression for the CPU reference and every CUDA
// kernel that rotates (rope.cu, the decode GEMVs' epilogue), so the device's contractions are the same in each.
DSCPP_HOST_DEVICE inline void rope_rotate(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

// One f32 product or sum, rounded on its own as torch's separate ops round it: nvcc may contract a * b + c into one
// FMA, and the device's interpolated frequencies would then differ from the CPU's (and HF's) in the last bit. (The
// host contracts only under DSCPP_NATIVE on an FMA CPU.)
DSCPP_HOST_DEVICE inline float rope_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSCPP_HOST_DEVICE inline float rope_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// inv_freq_i = 1 / theta^(2i/D), in f32 as HF computes it, except the power: f32 powf is not correctly rounded on
// either side (glibc's and CUDA's differ in the last bit for theta 500000), and an ulp of inv_freq turns into
// pos * 6e-8 of angle, 1.5x rope's f32 test threshold at pos 4096 (test_ops on an H100). pow in double rounded to
// f32 is the correctly rounded power on both, so the CPU reference and the kernel rotate by the same angles. With
// llama3 scaling (HF's _compute_llama3_parameters, the same f32 operations in the same order): wavelengths longer
// than original / low_freq_factor are slowed by factor, those shorter than original / high_freq_factor kept, and
// those between interpolated smoothly.
DSCPP_HOST_DEVICE inline float rope_inv_freq(int i, int D, float theta, const RopeScaling& s) {
  const float inv_freq = 1.0f / float(pow(double(theta), double(float(2 * i) / float(D))));
  if (!s.enabled()) return inv_freq;
  const float wavelen = 6.28318530717958647692f / inv_freq;
  const float low_freq_wavelen = s.original_max_position / s.low_freq_factor;
  const float high_freq_wavelen = s.original_max_position / s.high_freq_factor;
  if (wavelen > low_freq_wavelen) return inv_freq / s.factor;
  if (wavelen < high_freq_wavelen) return inv_freq;
  const float smooth =
      (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return rope_add(rope_mul(1.0f - smooth, inv_freq) / s.factor, rope_mul(smooth, inv_freq));
}

}  // namespace dscpp
