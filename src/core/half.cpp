#include "dscpp/core/half.h"

#include <cmath>

namespace dscpp {

// IEEE binary16 from binary32, round to nearest even, with subnormals, Inf and NaN.
uint16_t f16::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to Inf
  int32_t exp = int32_t(absx >> 23) - 127 + 15;
  uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
  if (exp <= 0) {  // subnormal half (or zero)
    if (exp < -10) return uint16_t(sign);
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) half_mant++;
    return uint16_t(sign | half_mant);
  }
  uint32_t h = (uint32_t(exp) << 10) | ((mant >> 13) & 0x3ffu);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // carry may roll into the exponent: correct
  return uint16_t(sign | h);
}

float f16::to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { mant <<= 1; e++; } while ((mant & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// e4m3 from binary32: the 3 kept mantissa bits rounded to nearest even; below 2^-6 the fixed quantum 2^-9 (the
// subnormals, whose code is the multiple of the quantum itself, 8 being the smallest normal 0x08).
uint8_t fp8_e4m3::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (absx >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (Inf included): saturate
  if (absx < 0x3c800000u) {                                // < 2^-6
    float a;
    std::memcpy(&a, &absx, 4);
    return uint8_t(sign | uint8_t(std::nearbyint(a * 512.0f)));  // exact product; the default mode ties to even
  }
  uint32_t code = absx >> 20;  // exponent and the top 3 mantissa bits
  const uint32_t rem = absx & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) code++;  // a carry rolls into the exponent: correct
  return uint8_t(sign | (code - (120u << 3)));                     // rebias 127 -> 7; < 448 stays <= 0x7e
}

float fp8_e4m3::to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 7u;
  uint32_t u;
  if ((b & 0x7fu) == 0x7fu) {
    u = sign | 0x7fc00000u;
  } else if (exp == 0) {  // zero or subnormal: mant * 2^-9, exact in f32
    const float a = float(mant) * (1.0f / 512.0f);
    std::memcpy(&u, &a, 4);
    u |= sign;
  } else {
    u = sign | ((exp - 7 + 127) << 23) | (mant << 20);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace dscpp
