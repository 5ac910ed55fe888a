#include "dscpp/core/half.h"

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

}  // namespace dscpp
