// CUDA twins of the op contracts in include/dscpp/kernels/ops.h: same names, same arguments, same semantics.
// ops.cpp validates shapes and devices, then calls these for CUDA tensors. Float tensors may be f32, bf16 or f16
// (f32 accumulation inside); statistics saved for backward (mean, rstd, lse, losses) are f32. Each runs on the
// current stream of the tensors' device (core/cuda) and does not synchronize.
#pragma once
#include "dscpp/kernels/ops.h"

namespace dscpp::cuda {


// ---- embedding ----
// out[N,C] = table[ids[N], :]      ids: i32 in [0, V)
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table);
// dtable[ids[n], :] += dout[n, :]
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- matmul (torch.nn.Linear layout: weight[OC, C]) ----
// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC]   (bias optional). out f32 or the inputs' dtype.
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias);
// dinp[N,C] = dout @ weight (skipped if dinp undefined); dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout
void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);
// General: c[M,N] = alpha * op(a) @ op(b) + beta * c, op = transpose when the flag is set. 2-D f32 tensors.
void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float alpha, float beta);
// f32 matmuls use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) unless this is set to false (then full f32).
// Process-wide, default true. (Added by the matmul owner.)
void set_matmul_allow_tf32(bool allow);

// ---- normalisation ----
// out[N,C] = (inp - mean) * rstd * weight + bias; saves mean[N], rstd[N] (f32)
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps);
// dinp = ...; dweight += ...; dbias += ...
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);
// out[N,C] = inp * rstd * weight, rstd[N] = 1/sqrt(mean(inp^2) + eps)
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, float eps);
void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

// ---- activations ----
// GELU, tanh approximation (GPT-2's "gelu_new"). dinp may alias dout.
void gelu_forward(const Tensor& out, const Tensor& inp);
void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);
// SiLU: out = x * sigmoid(x)
void silu_forward(const Tensor& out, const Tensor& inp);
void silu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);
// SwiGLU on a fused projection: gate_up[N, 2F] = [gate | up]; out[N,F] = silu(gate) * up
void swiglu_forward(const Tensor& out, const Tensor& gate_up);
// dgate_up[N,2F] (=)
void swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

// ---- elementwise ----
void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias a or b)
void add_inplace(const Tensor& acc, const Tensor& x);                       // acc += x
void scale_inplace(const Tensor& x, float s);                               // x *= s
double sum_squares(const Tensor& x);                                        // sum x^2 in f64 (for global norms)

// ---- attention ----
// Packed projections, per token: qkv[B,T,(H + 2*Hkv)*D] = [q heads | k heads | v heads], each head D wide.
// Query head h reads kv head h / (H/Hkv) (grouped-query attention; H % Hkv == 0).
// RoPE (Hugging Face Llama "rotate_half" convention) in place on the q and k heads of qkv at positions pos[B*T]
// (i32): x1 = x[:D/2], x2 = x[D/2:]; out = [x1*cos - x2*sin, x2*cos + x1*sin], angle = pos * theta^(-2i/D).
void rope_forward(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, float theta);
// In place on dqkv: the inverse rotation of the q and k gradients.
void rope_backward(const Tensor& dqkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, float theta);
// Causal softmax(q k^T / sqrt(D)) v. out[B,T,H*D]; lse[B,H,T] f32 = log-sum-exp of each row's scaled scores, saved
// for backward (which recomputes the probabilities: O(T) saved memory, as flash attention does).
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D);
// dqkv[B,T,(H+2Hkv)*D] (=)
void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);

// ---- loss ----
// losses[N] = logsumexp(logits[n, :V]) - logits[n, targets[n]]; rows with targets[n] < 0 are ignored (loss 0).
// logits[N, Vp] may be padded (Vp >= V): the padded columns are not part of the softmax. V = 0 means Vp.
void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V);
// dlogits[N,Vp] = dloss * (softmax(logits) - onehot(target)) (0 for ignored rows and padded columns).
// dlogits may alias logits (in place: no extra copy of the logits).
void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                           int64_t V);

// ---- optimizers (flat f32 buffers of equal numel) ----
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const ops::AdamParams& p);
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const ops::SgdParams& p);
// adam_update, and in the same pass param_lowp[i] = param[i] (updated) rounded to param_lowp's dtype (bf16 or f16):
// the compute copy of the parameters for mixed precision. param_lowp has param's numel.
void adam_update_with_copy(const Tensor& param_f32, const Tensor& grad, const Tensor& m, const Tensor& v,
                           const Tensor& param_lowp, const ops::AdamParams& p);


}  // namespace dscpp::cuda
