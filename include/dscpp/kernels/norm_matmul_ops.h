// RMSNorm fused into the linear behind it, for the inference forward (a pre-norm block's qkv and gate_up): the op
// contracts of rmsnorm_forward followed by matmul_forward / matmul_q_forward, as one op. The CPU reference is those
// two calls; on CUDA a few rows (a decode step) run one kernel, the GEMV normalizing its own input rows (Note [Norm
// in the decode GEMV], src/kernels/cuda/gemv_norm.cuh), and everything else the two ops, whose checks name the
// argument at fault.
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/kernels/rope_params.h"

namespace dscpp::ops {

// normed[N,C] (=) rmsnorm(inp[N,C]) with norm_weight[C] and eps; out[N,OC] (=) normed @ weight[OC,C]^T + bias[OC]
// (optional). Dtypes as rmsnorm_forward and matmul_forward take them.
void rmsnorm_matmul_forward(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                            float eps, const Tensor& weight, const Tensor& bias);

// The same with a quantized weight (quant_ops.h's matmul_q_forward: int8 when group == 0, else int4).
void rmsnorm_matmul_q_forward(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                              float eps, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group,
                              const Tensor& bias);

// The SwiGLU MLP's first half for a gate_up weight whose rows are blocks of kSwigluPairBlock gate rows and their
// up rows (Note [SwiGLU in the decode GEMV]): mid[N,F] (=) swiglu_forward(rmsnorm_matmul_forward(...), pair block).
// pre [N, 2F] is scratch the op may write (where the GEMV does not take the shapes: the gate_up rows go there);
// normed as rmsnorm_matmul_forward's. On CUDA a few rows run the GEMV with SwiGLU in its epilogue (and, where it
// can, the norm in its prologue): no [N, 2F] activation, no SwiGLU kernel.
constexpr int64_t kSwigluPairBlock = 8;
void rmsnorm_matmul_swiglu_forward(const Tensor& mid, const Tensor& pre, const Tensor& normed, const Tensor& inp,
                                   const Tensor& norm_weight, float eps, const Tensor& weight, const Tensor& bias);
void rmsnorm_matmul_q_swiglu_forward(const Tensor& mid, const Tensor& pre, const Tensor& normed, const Tensor& inp,
                                     const Tensor& norm_weight, float eps, const Tensor& q, const Tensor& scale,
                                     const Tensor& zero, int64_t group, const Tensor& bias);

// The attention's input projection with RoPE and the KV-cache append (Note [Rope and KV append in the decode GEMV]):
// qkv[N, (H+2Hkv)*D] (=) rmsnorm_matmul_forward(...), then rope_kv_cache_append(cache, qkv, pos, slots, H, Hkv, D,
// rope). On CUDA, with rope.pair_block = kRopePairBlock (the weight's q and k rows permuted to match), a few rows run
// the GEMV with the rotation and the cache writes in its epilogue: one kernel where three (norm, linear, rope) ran.
constexpr int kRopePairBlock = 8;
struct RopeKvAppend {  // rope_kv_cache_append's arguments besides qkv
  Tensor cache, pos, slots;
  int64_t H = 0, Hkv = 0, D = 0;
  RopeParams rope;
};
void rmsnorm_matmul_rope_kv_forward(const Tensor& qkv, const Tensor& normed, const Tensor& inp,
                                    const Tensor& norm_weight, float eps, const Tensor& weight, const Tensor& bias,
                                    const RopeKvAppend& kv);
void rmsnorm_matmul_q_rope_kv_forward(const Tensor& qkv, const Tensor& normed, const Tensor& inp,
                                      const Tensor& norm_weight, float eps, const Tensor& q, const Tensor& scale,
                                      const Tensor& zero, int64_t group, const Tensor& bias, const RopeKvAppend& kv);

}  // namespace dscpp::ops
