// Private: the KV cache's elements in the CUDA kernels (paged_kv.cu, rope.cu): T itself, or e4m3 codes converted in
// registers (Note [fp8 KV cache]), so an fp8 cache is read and written at one byte an element.
#pragma once
#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace dscpp::cuda {

using Fp8 = __nv_fp8_e4m3;

// out[0..V) = f32 of the V cache elements at p (aligned as load_f wants for its type).
template <typename C, int V>
__device__ __forceinline__ void load_cache(const C* p, float* out) {
  if constexpr (std::is_same_v<C, Fp8>) {
    const Pack<Fp8, V> x = *reinterpret_cast<const Pack<Fp8, V>*>(p);  // V <= 8: one access of V bytes
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = __half2float(__half(__nv_cvt_fp8_to_halfraw(x.v[k].__x, __NV_E4M3)));
  } else {
    load_f<C, V>(p, out);
  }
}

// The V cache elements at p (=) in[0..V), rounded to nearest even; e4m3 saturates to +-448 (fp8_e4m3::from_float).
template <typename C, int V>
__device__ __forceinline__ void store_cache(C* p, const float* in) {
  if constexpr (std::is_same_v<C, Fp8>) {
    Pack<Fp8, V> x;
#pragma unroll
    for (int k = 0; k < V; k++) x.v[k].__x = __nv_cvt_float_to_fp8(in[k], __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<Pack<Fp8, V>*>(p) = x;
  } else {
    store_f<C, V>(p, in);
  }
}

// f(T*, C*) with null pointers: T the dtype of qkv and out, C the cache's element (T, or fp8 e4m3).
template <typename F>
void dispatch_paged(const char* op, DType t, DType cache, F&& f) {
  dispatch_float(op, t, [&](auto* tag) {
    if (cache == DType::fp8_e4m3) return f(tag, static_cast<Fp8*>(nullptr));
    DSCPP_CHECK(cache == t, op, ": cache dtype ", dtype_name(cache), " with qkv ", dtype_name(t),
                " (expected ", dtype_name(t), " or fp8_e4m3)");
    f(tag, tag);
  });
}

}  // namespace dscpp::cuda
