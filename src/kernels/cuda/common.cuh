// Shared helpers for the op kernels in src/kernels/cuda/*.cu (private; include from .cu files only).
//   - dtype dispatch: DType -> float / __nv_bfloat16 / __half, one switch for every op file
//   - to_f / from_f: element <-> f32 (all math is f32; bf16/f16 are storage types)
//   - load_f / store_f: V consecutive elements through 16-byte vector accesses when V > 1
//   - warp and block reductions
//   - OpLaunch: device guard + current stream of the tensors' device
//
// Note [Vector width]: a kernel templated on V reads V consecutive elements per access. The host picks
// V = 16 / sizeof(T) when every pointer the kernel touches is 16-byte aligned and the row length (or numel) is a
// multiple of V, else V = 1 (scalar path). Both paths are the same code, so odd sizes (C = 13, V = 50257) take the
// scalar path and stay correct; aligned sizes get 128-bit loads.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_runtime.cuh"
#include "dscpp/core/tensor.h"

namespace dscpp::cuda {

// ---- element conversion ----
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// silu(gate) * up of two values of dtype T, rounded to T as a separate projection and swiglu_forward would.
template <typename T>
__device__ __forceinline__ T swiglu_of(float gate, float up) {
  const float g = to_f(from_f<T>(gate)), u = to_f(from_f<T>(up));
  return from_f<T>(g * sigmoidf(g) * u);
}

template <typename T> __device__ __forceinline__ T nan_of() { return from_f<T>(__int_as_float(0x7fc00000)); }

// ---- vector loads (Note [Vector width]) ----
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements per 16-byte access for T, capped at V.
template <typename T, int V> constexpr int chunk_of() { return (16 / int(sizeof(T))) < V ? 16 / int(sizeof(T)) : V; }

// out[0..V) = float(p[0..V)); p aligned to min(16, V*sizeof(T)) bytes.
template <typename T, int V>
__device__ __forceinline__ void load_f(const T* p, float* out) {
  constexpr int K = chunk_of<T, V>();
#pragma unroll
  for (int j = 0; j < V; j += K) {
    const Pack<T, K> x = *reinterpret_cast<const Pack<T, K>*>(p + j);
#pragma unroll
    for (int k = 0; k < K; k++) out[j + k] = to_f(x.v[k]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_f(T* p, const float* in) {
  constexpr int K = chunk_of<T, V>();
#pragma unroll
  for (int j = 0; j < V; j += K) {
    Pack<T, K> x;
#pragma unroll
    for (int k = 0; k < K; k++) x.v[k] = from_f<T>(in[j + k]);
    *reinterpret_cast<Pack<T, K>*>(p + j) = x;
  }
}

// ---- reductions ----
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Inclusive prefix sum over the lanes of a full warp (lane i gets x_0 + ... + x_i), in a fixed order.
template <typename V>
__device__ __forceinline__ V warp_inclusive_sum(V x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const V n = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += n;
  }
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. `scratch` holds 32
// floats of shared memory; the function synchronises before returning so scratch can be reused right after.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_sum(x);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < nwarps ? scratch[lane] : 0.0f;
  x = warp_sum(x);
  __syncthreads();
  return x;
}
__device__ __forceinline__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_max(x);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < nwarps ? scratch[lane] : -INFINITY;
  x = warp_max(x);
  __syncthreads();
  return x;
}

// ---- host side ----
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// True when every non-null pointer is 16-byte aligned.
template <typename... P>
bool all_aligned16(const P*... ptrs) {
  return ((ptrs == nullptr || aligned16(ptrs)) && ...);
}

// Calls f(static_cast<T*>(nullptr)) with T the CUDA element type of a float dtype (f32, bf16, f16).
template <typename F>
void dispatch_float(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(static_cast<float*>(nullptr));
    case DType::bf16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::f16: return f(static_cast<__half*>(nullptr));
    default: DSCPP_FAIL(op, ": dtype ", dtype_name(t), " is not supported on CUDA (expected f32, bf16 or f16)");
  }
}

// Activations of dtype `t` with a parameter-side tensor of dtype `p` that is either f32 or `t` (mixed precision:
// f32 master weights / f32 gradient accumulation with bf16 activations). Calls f(T*, P*) with null pointers.
template <typename F>
void dispatch_act_param(const char* op, DType t, DType p, F&& f) {
  dispatch_float(op, t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (p == DType::f32) return f(tag, static_cast<float*>(nullptr));
    if (p == t) return f(tag, tag);
    DSCPP_FAIL(op, ": parameter dtype ", dtype_name(p), " with activations ", dtype_name(t),
               " is not supported (expected f32 or ", dtype_name(t), ")");
  });
}

// As dispatch_act_param with two parameter-side dtypes (e.g. a bf16 weight read in the forward copy and its f32
// gradient): calls f(T*, P*, G*), each of P and G being f32 or T.
template <typename F>
void dispatch_act_param2(const char* op, DType t, DType p, DType g, F&& f) {
  dispatch_act_param(op, t, p, [&](auto* ttag, auto* ptag) {
    using T = std::remove_pointer_t<decltype(ttag)>;
    if (g == DType::f32) return f(ttag, ptag, static_cast<float*>(nullptr));
    if (g == t) return f(ttag, ptag, ttag);
    DSCPP_FAIL(op, ": gradient dtype ", dtype_name(g), " with activations ", dtype_name(t),
               " is not supported (expected f32 or ", dtype_name(t), ")");
  });
}

template <typename T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw()); }
template <typename T> T* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<T*>(t.raw()) : nullptr; }

// The device of an op's tensors made current for the scope, and its current stream.
struct OpLaunch {
  DeviceGuard guard;
  cudaStream_t stream;
  explicit OpLaunch(const Tensor& t) : guard(t.device().index), stream(current_stream(t.device().index)) {}
};

// Grid size for a grid-stride loop over `work` items with `block` threads: enough blocks to fill the GPU,
// never more than the work needs. Fixed (not derived from the SM count) so reductions built on it give the same
// bits on every GPU.
inline unsigned grid_for(int64_t work, int block, int64_t max_blocks = 65536) {
  int64_t g = ceil_div(work, block);
  if (g < 1) g = 1;
  return unsigned(g < max_blocks ? g : max_blocks);
}

}  // namespace dscpp::cuda
