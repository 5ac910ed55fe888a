// CPU references of the weight-only quantization ops (quant_ops.h, Note [Quantized weight layout]): f32 math, one
// row or group at a time. The CUDA twins (src/kernels/cuda/quant.cu) make the same f32 operations in the same order,
// so q, scale and zero match these bit for bit.
#include <algorithm>
#include <cmath>

#include "dscpp/core/half.h"
#include "kernels/cpu/cpu_kernels.h"

namespace dscpp::cpu {
namespace {
float row_absmax(const float* row, int64_t C) {
  float amax = 0;
  for (int64_t c = 0; c < C; c++) amax = std::max(amax, std::fabs(row[c]));
  return amax;
}
}  // namespace

// q[OC,C] (=), scale[OC] (=)
void quantize_weight_int8(int8_t* q, float* scale, const float* w, int64_t OC, int64_t C) {
#pragma omp parallel for
  for (int64_t o = 0; o < OC; o++) {
    const float* row = w + o * C;
    const float s = row_absmax(row, C) / 127.0f;
    scale[o] = s;
    for (int64_t c = 0; c < C; c++)
      q[o * C + c] = s == 0 ? int8_t(0) : int8_t(std::clamp(std::rint(row[c] / s), -127.0f, 127.0f));
  }
}

// q[OC,C/2] (=, two nibbles a byte, the even column low), scale[OC,C/G] (=), zero[OC,C/G] (=)
void quantize_weight_int4(uint8_t* q, float* scale, uint8_t* zero, const float* w, int64_t OC, int64_t C, int64_t G) {
  const int64_t groups = C / G;
#pragma omp parallel for
  for (int64_t og = 0; og < OC * groups; og++) {
    const int64_t o = og / groups, c0 = og % groups * G;
    const float* x = w + o * C + c0;
    float lo = 0, hi = 0;
    for (int64_t c = 0; c < G; c++) lo = std::min(lo, x[c]), hi = std::max(hi, x[c]);
    const float s = (hi - lo) / 15.0f;
    const float z = s == 0 ? 0.0f : std::clamp(std::rint(-lo / s), 0.0f, 15.0f);
    scale[og] = s;
    zero[og] = uint8_t(z);
    uint8_t* out = q + (o * C + c0) / 2;
    for (int64_t c = 0; c < G; c += 2) {
      uint8_t nib[2];
      for (int k = 0; k < 2; k++)
        nib[k] = s == 0 ? uint8_t(0) : uint8_t(std::clamp(std::rint(x[c + k] / s) + z, 0.0f, 15.0f));
      out[c / 2] = uint8_t(nib[0] | nib[1] << 4);
    }
  }
}

// q[OC,C] (=, e4m3 codes), scale[OC] (=): scale = absmax / 448, q = e4m3(w * (448 / absmax)); the CUDA kernels make
// the same two f32 operations (a division, then one product per element), so the codes match bit for bit.
void quantize_rows_fp8(uint8_t* q, float* scale, const float* w, int64_t OC, int64_t C) {
#pragma omp parallel for
  for (int64_t o = 0; o < OC; o++) {
    const float* row = w + o * C;
    const float amax = row_absmax(row, C);
    scale[o] = amax / 448.0f;
    const float inv = amax == 0 ? 0.0f : 448.0f / amax;
    for (int64_t c = 0; c < C; c++) q[o * C + c] = fp8_e4m3::from_float(row[c] * inv);
  }
}

void dequantize_weight_fp8(float* w, const uint8_t* q, const float* scale, int64_t OC, int64_t C) {
#pragma omp parallel for
  for (int64_t o = 0; o < OC; o++)
    for (int64_t c = 0; c < C; c++) w[o * C + c] = fp8_e4m3::to_float(q[o * C + c]) * scale[o];
}

// w[OC,C] (=) = q * scale[o]
void dequantize_weight_int8(float* w, const int8_t* q, const float* scale, int64_t OC, int64_t C) {
#pragma omp parallel for
  for (int64_t o = 0; o < OC; o++)
    for (int64_t c = 0; c < C; c++) w[o * C + c] = float(q[o * C + c]) * scale[o];
}

// w[OC,C] (=) = (q - zero) * scale, per group of G columns
void dequantize_weight_int4(float* w, const uint8_t* q, const float* scale, const uint8_t* zero, int64_t OC,
                            int64_t C, int64_t G) {
#pragma omp parallel for
  for (int64_t o = 0; o < OC; o++)
    for (int64_t c = 0; c < C; c++) {
      const int64_t g = o * (C / G) + c / G;
      const int nib = q[(o * C + c) / 2] >> (c % 2 * 4) & 15;
      w[o * C + c] = float(nib - int(zero[g])) * scale[g];
    }
}

}  // namespace dscpp::cpu
