// A stand-in for an NCCL kernel in gemm_bench's carve-out timing: `blocks` CTAs, each filling one SM (all of its
// shared memory, so no GEMM CTA can share the SM), spinning for about `us` microseconds.
#include <cuda_runtime.h>

#include "bench/sm_hog.h"
#include "core/cuda/cuda_runtime.cuh"

namespace bench {
namespace {

__global__ void sm_hog_kernel(long long cycles, int* sink) {
  extern __shared__ int smem[];
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (threadIdx.x == 0 && sink) *sink = smem[0];  // never taken (sink is null): keeps smem alive
}

}  // namespace

void launch_sm_hog(int blocks, double us, cudaStream_t stream) {
  int dev = 0, smem = 0, khz = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&dev));
  DSCPP_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  DSCPP_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  DSCPP_CUDA_CHECK(cudaFuncSetAttribute(sm_hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  sm_hog_kernel<<<blocks, 128, size_t(smem), stream>>>((long long)(us * 1e-3 * khz), nullptr);
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bench
