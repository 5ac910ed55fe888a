// Private: cuDNN's fused flash attention (SDPA, through cudnn_frontend's graph API) on the packed layout of ops.h:
// qkv[B,T,(H+2Hkv)*D], out[B,T,H*D], lse[B,H,T] (cuDNN's softmax "Stats" are the same natural-log log-sum-exp of the
// scaled scores). Graphs are built once per shape and kept.
#pragma once
#include <cuda_runtime.h>

#include "dscpp/core/dtype.h"
#include "dscpp/kernels/attention_backend.h"

namespace dscpp::cuda::cudnn_attention {

struct Shape {
  int B, T, H, Hkv, D;
};

// Each returns false, having queued nothing, when `be` keeps the call off cuDNN (attention_backend.h), cuDNN is not
// built in, or it declines the call (dtype, head dim, alignment, or its own support check); the caller then runs
// our kernels. A failure while running throws.
bool forward(AttentionBackend be, DType t, const Shape& s, void* out, float* lse, const void* qkv, int device,
             cudaStream_t stream);
bool backward(AttentionBackend be, DType t, const Shape& s, void* dqkv, const void* dout, const void* qkv,
              const void* out, const float* lse, int device, cudaStream_t stream);

}  // namespace dscpp::cuda::cudnn_attention
