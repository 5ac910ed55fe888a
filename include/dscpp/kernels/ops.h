// The op contracts. Each op has a CPU reference (src/kernels/cpu/) and, from the CUDA issue on, a CUDA twin with the
// same contract; the checked entry points below validate dtype and shape, then dispatch on the device of the tensors.
// Tensors are handles: an output passed as `const Tensor&` is written through its storage.
// An undefined Tensor (Tensor()) means "absent" for optional arguments.
//
// Shape letters: N rows (= B*T tokens), C channels, OC output channels, V vocab, F ffn width,
// H query heads, Hkv key/value heads, D head dim, B batch, T time.
// Gradient convention: parameter gradients accumulate (+=), activation gradients overwrite (=).
// Float tensors are f32 unless said otherwise; matmul also takes bf16/f16 inputs (f32 accumulation).
#pragma once
#include <cstdint>

#include "dscpp/core/tensor.h"
#include "dscpp/kernels/attention_backend.h"
#include "dscpp/kernels/rope_params.h"

namespace dscpp::ops {

// ---- embedding ----
// out[N,C] = table[ids[N], :]      ids: i32 in [0, V)
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table);
// dtable[ids[n], :] += dout[n, :]
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- matmul (torch.nn.Linear layout: weight[OC, C]) ----
// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] + residual[N,OC]   (bias and residual optional). out f32 or the
// inputs' dtype; residual has out's shape and dtype and may be out itself (on CUDA the GEMM's C input, beta = 1).
void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    const Tensor& residual = Tensor());
// dinp[N,C] = dout @ weight (skipped if dinp undefined); dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout
void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);
// General: c[M,N] = alpha * op(a) @ op(b) + beta * c, op = transpose when the flag is set. 2-D f32 tensors.
void gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float alpha, float beta);
// Matmul fused with GELU (tanh) for a GELU MLP's up projection, and its backward through the down projection. On
// CUDA these are cuBLASLt epilogues where the layout allows (Note [Matmul epilogues], kernels/cuda/matmul.cu); the
// CPU reference composes the ops above. out, pre, inp, weight share one dtype; bias f32 or that dtype (optional).
// pre[N,F] (=) = inp[N,C] @ weight[F,C]^T + bias[F] (the pre-activation, saved for backward); out[N,F] (=) = gelu(pre)
void matmul_bias_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias);
// dpre[N,F] (=) = (dout[N,OC] @ weight[OC,F]) * gelu'(pre[N,F]): the down projection's input gradient carried
// through the GELU. The down projection's dweight/dbias come from matmul_backward with dinp undefined.
void matmul_dgelu_backward(const Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre);

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
// The forward's output again from its saved mean/rstd[N] (no reduction): out[N,C] (=), the same formula and
// rounding as the *_forward ops and the fused_residual_*_forward ops below (whose resid is this inp), so a block can
// recompute a norm output in backward instead of keeping it. bias optional.
void layernorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                     const Tensor& mean, const Tensor& rstd);
void rmsnorm_apply(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& rstd);

// ---- residual add fused with the norm after it (pre-norm blocks: x1 = x + branch; h = norm(x1)) ----
// resid[N,C] (=) = x + residual, the residual stream (stored in its dtype); norm[N,C] (=) = the norm of the stored
// resid; mean/rstd[N] f32 saved when defined. resid may alias x or residual (in place).
void fused_residual_layernorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& x, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, float eps);
void fused_residual_rmsnorm_forward(const Tensor& resid, const Tensor& norm, const Tensor& rstd, const Tensor& x,
                                    const Tensor& residual, const Tensor& weight, float eps);
// The gradient of a residual-stream tensor read by the skip path and by a norm: dresid[N,C] (=) = dskip +
// norm_backward(dnorm) (it flows on to both inputs of the add that made resid); dweight, dbias (+=, optional).
// dresid may alias dskip (in place); resid, mean, rstd as saved by the forward.
void fused_residual_layernorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dbias,
                                       const Tensor& dskip, const Tensor& dnorm, const Tensor& resid,
                                       const Tensor& weight, const Tensor& mean, const Tensor& rstd);
void fused_residual_rmsnorm_backward(const Tensor& dresid, const Tensor& dweight, const Tensor& dskip,
                                     const Tensor& dnorm, const Tensor& resid, const Tensor& weight,
                                     const Tensor& rstd);

// ---- activations ----
// GELU, tanh approximation (GPT-2's "gelu_new"). dinp may alias dout.
void gelu_forward(const Tensor& out, const Tensor& inp);
void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);
// SiLU: out = x * sigmoid(x)
void silu_forward(const Tensor& out, const Tensor& inp);
void silu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp);
// SwiGLU on a fused projection: gate_up[N, 2F] = [gate | up]; out[N,F] = silu(gate) * up. With pair_block k > 0
// (a divisor of F), gate_up's rows are F/k blocks of [k gate | k up] instead: the inference models' interleaved
// gate_up weight (Note [SwiGLU in the decode GEMV]); k = F is the [gate | up] layout.
void swiglu_forward(const Tensor& out, const Tensor& gate_up, int64_t pair_block = 0);
// dgate_up[N,2F] (=)
void swiglu_backward(const Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

// ---- elementwise ----
void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias a or b)
void add_inplace(const Tensor& acc, const Tensor& x);                       // acc += x
void scale_inplace(const Tensor& x, float s);                               // x *= s
double sum_squares(const Tensor& x);                                        // sum x^2 in f64 (for global norms)
// acc[0] += scale * sum(x), f32 tensors, summed in f64 in a fixed order, on the device: a mean loss without a read-back.
void add_sum(const Tensor& acc, const Tensor& x, float scale);
// acc[0] += sum x^2 (acc f32 [1], x any float dtype the device takes), summed in f64 in a fixed order, on the device:
// a gradient norm that is read once, together with whatever else the step reads.
void add_sum_squares(const Tensor& acc, const Tensor& x);
// out[i] = scale * sum_j in[j*n + i] over the in.numel() / n blocks of in (n = out.numel()), accumulated in f32:
// the local half of an all-reduce built from an all-to-all (comm/process_group.h, all_reduce_by_copies).
void sum_blocks(const Tensor& out, const Tensor& in, float scale);

// ---- attention ----
// Packed projections, per token: qkv[B,T,(H + 2*Hkv)*D] = [q heads | k heads | v heads], each head D wide.
// Query head h reads kv head h / (H/Hkv) (grouped-query attention; H % Hkv == 0).
// RoPE (Hugging Face Llama "rotate_half" convention) in place on the q and k heads of qkv at positions pos[B*T]
// (i32): x1 = x[:D/2], x2 = x[D/2:]; out = [x1*cos - x2*sin, x2*cos + x1*sin], angle = pos * rope_inv_freq(i)
// (theta^(-2i/D), with Llama 3 scaling when rope.scaling is set; kernels/rope_params.h).
void rope_forward(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope);
// In place on dqkv: the inverse rotation of the q and k gradients.
void rope_backward(const Tensor& dqkv, const Tensor& pos, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope);
// Causal softmax(q k^T / sqrt(D)) v. out[B,T,H*D]; lse[B,H,T] f32 = log-sum-exp of each row's scaled scores, saved
// for backward (which recomputes the probabilities: O(T) saved memory, as flash attention does). `backend` picks the
// CUDA implementation (kernels/attention_backend.h); CPU tensors ignore it.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, AttentionBackend backend = AttentionBackend::automatic);
// dqkv[B,T,(H+2Hkv)*D] (=)
void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        AttentionBackend backend = AttentionBackend::automatic);

// ---- loss ----
// losses[N] = logsumexp(logits[n, :V]) - logits[n, targets[n]]; rows with targets[n] < 0 are ignored (loss 0).
// logits[N, Vp] may be padded (Vp >= V): the padded columns are not part of the softmax. V = 0 means Vp.
// lse (optional, f32 [N]) receives logsumexp(logits[n, :V]) (0 for ignored rows), for the backward.
void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets, int64_t V = 0,
                          const Tensor& lse = Tensor());
// dlogits[N,Vp] = dloss * (softmax(logits) - onehot(target)) (0 for ignored rows and padded columns).
// dlogits may alias logits (in place: no extra copy of the logits). Given the forward's lse, the softmax is
// exp(logits - lse) and the row is read once (else its log-sum-exp is recomputed first).
void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                           int64_t V = 0, const Tensor& lse = Tensor());

// ---- optimizers (flat f32 buffers of equal numel) ----
struct AdamParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool adamw_mode = true;   // true: decoupled decay (AdamW); false: L2 added to the gradient (Adam)
  bool bias_correction = true;
  int64_t step = 1;         // 1-based step count after this update
  float grad_scale = 1.0f;  // gradients are multiplied by this first (unscaling, clipping)
};
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamParams& p);
// Mixed precision: adam_update, then param_lowp = the updated param rounded to param_lowp's dtype (bf16 or f16), in
// the same pass on CUDA (the compute copy for the next forward).
void adam_update_with_copy(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor& param_lowp, const AdamParams& p);
struct SgdParams {
  float lr = 1e-3f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;  // momentum buffer is initialised to the gradient on the first step (as torch)
  float grad_scale = 1.0f;
};
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p);
struct LionParams {  // DeepSpeed's FusedLion / DeepSpeedCPULion
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, weight_decay = 0.0f;
  float grad_scale = 1.0f;
};
void lion_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const LionParams& p);
struct AdagradParams {  // torch.optim.Adagrad (lr_decay 0, initial_accumulator_value 0)
  float lr = 1e-2f, eps = 1e-10f, weight_decay = 0.0f;
  float grad_scale = 1.0f;
};
void adagrad_update(const Tensor& param, const Tensor& grad, const Tensor& sum, const AdagradParams& p);

}  // namespace dscpp::ops
