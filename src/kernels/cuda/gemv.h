// Private: matmul_forward's few-row path (Note [Decode GEMV], gemv.cu). out[M, OC] = inp[M, C] @ weight[OC, C]^T
// (+ bias[OC]) (+ residual[M, OC], which may be out itself).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dscpp/core/dtype.h"
#include "kernels/cuda/gemv_epilogue.h"

namespace dscpp::cuda {

// An RMSNorm of the input rows inside the GEMV (Note [Norm in the decode GEMV], gemv_norm.cuh): gamma [C] of the
// input's dtype (null: none); the normalized rows are also written to normed [M, C].
struct GemvNorm {
  const void* gamma = nullptr;
  float eps = 0.0f;
  void* normed = nullptr;
};

struct GemvArgs {
  void* out;
  DType out_t;
  const void* inp;
  const void* weight;
  DType in_t;  // inp's and weight's
  const void* bias;  // may be null
  DType bias_t;
  const void* residual;  // out's dtype; may be null or out
  int64_t M, OC, C;
  GemvNorm norm = {};
  GemvEpilogue epi = {};  // a paired one needs weight's rows paired (gemv_epilogue.h) and no residual
};

// Runs a kernel and returns true when the shapes and dtypes are its own (bf16 / f16 weights, M <= 4, ...; with a
// norm, rows that fit its shared memory); else returns false having done nothing.
bool try_gemv(const GemvArgs& g, cudaStream_t s);

// Benchmark A/B only: false routes every decode GEMV to the CUDA-core kernels (gemv.cuh) instead of the tensor-core
// ones (gemv_mma.cuh).
void set_gemv_tensor_cores(bool on);
bool gemv_tensor_cores();

}  // namespace dscpp::cuda
