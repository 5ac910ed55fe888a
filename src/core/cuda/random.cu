// Device Philox fills (see include/dscpp/core/random_fill.h): one thread per 4-word Philox block. The arithmetic mirrors
// Rng::uniform/normal and random_fill.cpp operation for operation, with explicit _rn intrinsics so nvcc does not
// contract a multiply and an add into an FMA (the host does not either).
#include "core/cuda/cuda_runtime.cuh"
#include "core/cuda/device_convert.cuh"
#include "core/cuda/tensor_kernels.cuh"
#include "dscpp/core/philox.h"

namespace dscpp::cuda {
namespace {

constexpr int kThreads = 256;

template <typename D>
__global__ void uniform_kernel(D* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  int64_t blocks = (n + 3) / 4, stride = int64_t(gridDim.x) * blockDim.x;
  float range = __fsub_rn(hi, lo);
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    Philox4 r = philox4x32_10(seed, 0, offset + uint64_t(b));
    for (int k = 0; k < 4; k++) {
      int64_t i = b * 4 + k;
      if (i < n) dst[i] = from_f32<D>(__fadd_rn(lo, __fmul_rn(range, philox_uniform01(r.v[k]))));
    }
  }
}

template <typename D>
__global__ void normal_kernel(D* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset, float mean, float sd) {
  int64_t blocks = (n + 1) / 2, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    Philox4 r = philox4x32_10(seed, 0, offset + uint64_t(b));
    for (int k = 0; k < 2; k++) {
      int64_t i = b * 2 + k;
      if (i >= n) break;
      float u1 = philox_uniform01_open0(r.v[2 * k]);
      float u2 = philox_uniform01(r.v[2 * k + 1]);
      float z = __fmul_rn(sqrtf(__fmul_rn(-2.0f, logf(u1))), cosf(__fmul_rn(6.28318530718f, u2)));
      dst[i] = from_f32<D>(__fadd_rn(mean, __fmul_rn(sd, z)));
    }
  }
}

__global__ void bits_kernel(uint32_t* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset) {
  int64_t blocks = (n + 3) / 4, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    Philox4 r = philox4x32_10(seed, 0, offset + uint64_t(b));
    for (int k = 0; k < 4; k++)
      if (b * 4 + k < n) dst[b * 4 + k] = r.v[k];
  }
}

template <typename D>
void run(void* dst, int64_t n, RandomKind kind, uint64_t seed, uint64_t offset, float a, float b,
         cudaStream_t stream) {
  int64_t blocks = kind == RandomKind::normal ? (n + 1) / 2 : (n + 3) / 4;
  if (kind == RandomKind::normal)
    normal_kernel<D><<<core_grid(blocks, kThreads), kThreads, 0, stream>>>(static_cast<D*>(dst), n, seed, offset, a, b);
  else
    uniform_kernel<D><<<core_grid(blocks, kThreads), kThreads, 0, stream>>>(static_cast<D*>(dst), n, seed, offset, a, b);
  DSCPP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_random(void* dst, DType dt, int64_t n, RandomKind kind, uint64_t seed, uint64_t offset, float a,
                   float b, cudaStream_t stream) {
  if (n == 0) return;
  if (kind == RandomKind::bits) {
    DSCPP_CHECK(dt == DType::i32, "random bits need an i32 tensor, got ", dtype_name(dt));
    bits_kernel<<<core_grid((n + 3) / 4, kThreads), kThreads, 0, stream>>>(static_cast<uint32_t*>(dst), n, seed,
                                                                         offset);
    DSCPP_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (dt) {
    case DType::f32: return run<float>(dst, n, kind, seed, offset, a, b, stream);
    case DType::bf16: return run<Bf16Bits>(dst, n, kind, seed, offset, a, b, stream);
    case DType::f16: return run<F16Bits>(dst, n, kind, seed, offset, a, b, stream);
    default: DSCPP_FAIL("random fill of a ", dtype_name(dt), " tensor (f32, bf16 or f16 expected)");
  }
}

}  // namespace dscpp::cuda
