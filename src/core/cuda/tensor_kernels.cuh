// Private: raw launches behind tensor_cuda.h. Each enqueues on `stream` and checks the launch.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "core/cuda/tensor_cuda.h"
#include "dscpp/core/dtype.h"

namespace dscpp::cuda {

// dst[n] (dtype dt) = src[n] (dtype st) converted through f32 exactly as the CPU conversion does (f32, bf16, f16,
// i32, i8). dst and src do not overlap.
void launch_convert(void* dst, DType dt, const void* src, DType st, int64_t n, cudaStream_t stream);
// dst[n] elements of elem_size bytes (2 or 4) = the low elem_size bytes of `pattern`.
void launch_fill_pattern(void* dst, int elem_size, uint32_t pattern, int64_t n, cudaStream_t stream);
// dst[n] (f32/bf16/f16, or i32 for bits) from the Philox stream, see src/core/random_fill.h.
void launch_random(void* dst, DType dt, int64_t n, RandomKind kind, uint64_t seed, uint64_t offset, float a,
                   float b, cudaStream_t stream);

// Grid for grid-stride loops over n items, at most 65536 blocks (core kernels only; ops use common.cuh).
inline unsigned core_grid(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  return unsigned(blocks < 1 ? 1 : blocks);
}

}  // namespace dscpp::cuda
