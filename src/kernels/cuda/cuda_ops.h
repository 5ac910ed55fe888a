// CUDA twins of the op contracts in include/dscpp/kernels/ops.h: same names, same arguments, same semantics.
// ops.cpp validates shapes and devices, then calls these for CUDA tensors. Float tensors may be f32, bf16 or f16
// (f32 accumulation inside); statistics saved for backward (mean, rstd, lse, losses) are f32. Each runs on the
// current stream of the tensors' device (core/cuda) and does not synchronize.
#pragma once
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/paged_ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "dscpp/kernels/sampling_ops.h"
#include "kernels/cuda/gemv_epilogue.h"

namespace dscpp::cuda {

// ---- embedding ----
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table);
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- matmul (torch.nn.Linear layout: weight[OC, C]) ----
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    const Tensor& residual = Tensor());
// rmsnorm_matmul_forward's one-kernel path (Note [Norm in the decode GEMV]): false, having done nothing, where the
// few-row GEMV does not take the shapes (the caller then runs rmsnorm_forward and matmul_forward). The caller
// (ops_norm_matmul.cpp) has checked devices, dtypes and shapes. norm_weight undefined: no norm (inp as it is);
// epi: what the GEMV does with its rows besides the bias (gemv_epilogue.h: SwiGLU, or rope and the KV append).
bool try_rmsnorm_matmul(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                        float eps, const Tensor& weight, const Tensor& bias, const GemvEpilogue& epi = {});
void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);
void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float alpha, float beta);
void set_matmul_allow_tf32(bool allow);
void matmul_bias_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias);
void matmul_dgelu_backward(const Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre);
// false: every matmul takes the unfused path (GEMM, then separate bias/GELU/dbias kernels); for tests. Default true.
void set_matmul_epilogues(bool enable);
// dbias[OC] += sum over the rows of dout[N, OC] (bias_grad.cu): bandwidth-bound, deterministic; dbias any float dtype.
void bias_grad(const Tensor& dbias, const Tensor& dout);

// ---- normalisation ----
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps);
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, float eps);
void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);
void layernorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                     const Tensor& mean, const Tensor& rstd);
void rmsnorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& rstd);

// ---- residual add fused with the norm (fused_norm.cu) ----
void fused_residual_layernorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& x, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, float eps);
void fused_residual_rmsnorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& rstd, const Tensor& x,
                                    const Tensor& residual, const Tensor& weight, float eps);
void fused_residual_layernorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dskip, const Tensor& dnorm, const Tensor& resid,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void fused_residual_rmsnorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dskip,
                                     const Tensor& dnorm, const Tensor& resid, const Tensor& weight,
                                     const Tensor& rstd);

// ---- activations ----
void gelu_forward(const Tensor& out, const Tensor& inp);
void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);
void silu_forward(const Tensor& out, const Tensor& inp);
void silu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);
void swiglu_forward(const Tensor& out, const Tensor& gate_up, int64_t pair_block);
void swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

// ---- elementwise ----
void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias a or b)
void add_inplace(const Tensor& acc, const Tensor& x);                       // acc += x
void scale_inplace(const Tensor& x, float s);                               // x *= s
double sum_squares(const Tensor& x);                                        // sum x^2 in f64 (for global norms)
void sum_blocks(const Tensor& out, const Tensor& in, float scale);
void add_sum(const Tensor& acc, const Tensor& x, float scale);
void add_sum_squares(const Tensor& acc, const Tensor& x);

// ---- attention ----
void rope_forward(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope);
void rope_backward(const Tensor& dqkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope);
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, AttentionBackend backend);
void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        AttentionBackend backend);

// ---- the paged KV cache (paged_kv.cu; index tensors on the device, range-checked in the kernels) ----
void kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& slots, int64_t H, int64_t Hkv, int64_t D);
void rope_kv_cache_append(const Tensor& cache, const Tensor& qkv, const Tensor& pos, const Tensor& slots, int64_t H,
                          int64_t Hkv, int64_t D, const RopeParams& rope);  // rope.cu
void paged_attention_forward(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                             const Tensor& seq_start, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D);
// The tensor-core prompt path of paged_attention_forward (attention.cu, Note [Paged prompt attention]): the rows of
// the sequences with 2 or more new tokens; for bf16 / f16, head dims 64 and 128, 16-byte aligned operands.
bool paged_prompt_attention_supported(const Tensor& out, const Tensor& qkv, const Tensor& cache, int64_t D);
void paged_prompt_attention(const Tensor& out, const Tensor& qkv, const Tensor& cache, const Tensor& block_table,
                            const Tensor& seq_start, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D);

// ---- sampling (sampling.cu; f32 logits, one CTA per row; history tokens outside [0, V) are skipped) ----
void apply_penalties(const Tensor& out, const Tensor& logits, const Tensor& hist_start, const Tensor& hist_token,
                     const Tensor& hist_count, const Tensor& repetition, const Tensor& presence,
                     const Tensor& frequency);
void sample_rows(const Tensor& tokens, const Tensor& logits, const Tensor& temperature, const Tensor& top_k,
                 const Tensor& top_p, const Tensor& min_p, const Tensor& seed, const Tensor& step);
void logprobs_rows(const Tensor& chosen, const Tensor& top_ids, const Tensor& top_logprob, const Tensor& logits,
                   const Tensor& tokens);

// ---- weight-only quantized matmul (quant.cu; Note [Quantized weight layout], Note [Quantized GEMV]) ----
void quantize_weight_int8(const Tensor& q, const Tensor& scale, const Tensor& w);
void quantize_weight_int4(const Tensor& q, const Tensor& scale, const Tensor& zero, const Tensor& w, int64_t group);
void quantize_weight_fp8(const Tensor& q, const Tensor& scale, const Tensor& w);
void dequantize_weight(const Tensor& w, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group);
// out[N,OC] (=) = (xq[N,C] @ q[OC,C]^T) * sx[n] * scale[o] + bias + residual through cuBLASLt's fp8 GEMM (matmul.cu,
// Note [fp8 GEMM]); xq and q e4m3. False, having done nothing, where cuBLASLt has no algorithm for the case.
bool matmul_fp8(const Tensor& out, const Tensor& xq, const Tensor& sx, const Tensor& q, const Tensor& scale,
                const Tensor& bias, const Tensor& residual);
void matmul_q_forward(const Tensor& out, const Tensor& inp, const Tensor& q, const Tensor& scale, const Tensor& zero,
                      int64_t group, const Tensor& bias, const Tensor& residual);
bool try_rmsnorm_matmul_q(const Tensor& out, const Tensor& normed, const Tensor& inp, const Tensor& norm_weight,
                          float eps, const Tensor& q, const Tensor& scale, const Tensor& zero, int64_t group,
                          const Tensor& bias, const GemvEpilogue& epi = {});  // as try_rmsnorm_matmul

// ---- loss ----
void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V,
                          const Tensor& lse);
void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                           int64_t V, const Tensor& lse);

// ---- optimizers (flat f32 buffers of equal numel) ----
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const ops::AdamParams& p);
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const ops::SgdParams& p);
void lion_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const ops::LionParams& p);
void adagrad_update(const Tensor& param, const Tensor& grad, const Tensor& sum, const ops::AdagradParams& p);
void adam_update_with_copy(const Tensor& param_f32, const Tensor& grad, const Tensor& m, const Tensor& v,
                           const Tensor& param_lowp, const ops::AdamParams& p);

}  // namespace dscpp::cuda
