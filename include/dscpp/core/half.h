// bf16 and f16 storage types with exact round-to-nearest-even conversion to and from f32.
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

}  // namespace dscpp
