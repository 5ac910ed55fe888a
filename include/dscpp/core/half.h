// bf16, f16 and fp8 e4m3 storage types with exact round-to-nearest-even conversion to and from f32.
// Plain structs (not _Float16 / __nv_bfloat16) so host code, nvcc and every compiler agree on the layout.
#pragma once
#include <cstdint>
#include <cstring>

namespace dscpp {

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
    return uint16_t(u >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// OCP fp8 e4m3 ("E4M3FN", the KV cache's fp8): sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals, no
// infinities, 0x7f / 0xff are NaN, the largest finite value 448. from_float rounds to nearest even and saturates
// to +-448 (Inf included), as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); NaN stays NaN.
struct fp8_e4m3 {
  uint8_t bits = 0;
  fp8_e4m3() = default;
  explicit fp8_e4m3(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint8_t from_float(float f);
  static float to_float(uint8_t b);
};

}  // namespace dscpp
