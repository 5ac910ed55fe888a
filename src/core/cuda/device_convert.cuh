// Private, device code: element conversions through f32, bit-identical to the CPU ones (dscpp/core/half.h and
// convert_cpu in tensor.cpp) for every finite value in range.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace dscpp::cuda {

struct Bf16Bits { uint16_t b; };  // storage of dscpp::bf16 / __nv_bfloat16
struct F16Bits { uint16_t b; };   // storage of dscpp::f16 / __half
struct Fp8E4m3Bits { uint8_t b; };  // storage of dscpp::fp8_e4m3 / __nv_fp8_e4m3

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(Bf16Bits x) { return __uint_as_float(uint32_t(x.b) << 16); }
__device__ inline float to_f32(F16Bits x) { return __half2float(__ushort_as_half(x.b)); }
__device__ inline float to_f32(Fp8E4m3Bits x) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(x.b), __NV_E4M3)));  // exact: f16 holds e4m3
}
__device__ inline float to_f32(int32_t x) { return float(x); }
__device__ inline float to_f32(int8_t x) { return float(x); }

template <typename D> __device__ D from_f32(float f);
template <> __device__ inline float from_f32<float>(float f) { return f; }
template <> __device__ inline int32_t from_f32<int32_t>(float f) { return int32_t(f); }
template <> __device__ inline int8_t from_f32<int8_t>(float f) { return int8_t(int32_t(f)); }  // as x86 host code

// Round to nearest even, saturating to +-448: dscpp::fp8_e4m3::from_float (NaN stays NaN, its sign may differ).
template <> __device__ inline Fp8E4m3Bits from_f32<Fp8E4m3Bits>(float f) {
  return {uint8_t(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3))};
}

template <> __device__ inline Bf16Bits from_f32<Bf16Bits>(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
  return {uint16_t(u >> 16)};
}

// The host's f16::from_float, step for step (so NaN payloads and ties agree too).
template <> __device__ inline F16Bits from_f32<F16Bits>(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return {uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u))};
  if (absx >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};
  int32_t exp = int32_t(absx >> 23) - 127 + 15;
  uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
  if (exp <= 0) {
    if (exp < -10) return {uint16_t(sign)};
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) half_mant++;
    return {uint16_t(sign | half_mant)};
  }
  uint32_t h = (uint32_t(exp) << 10) | ((mant >> 13) & 0x3ffu);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return {uint16_t(sign | h)};
}

}  // namespace dscpp::cuda
