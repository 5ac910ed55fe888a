// CPU reference kernels: raw pointers and sizes, no checks (src/kernels/ops.cpp validates, then calls these).
// They are the spec for the CUDA twins and the CPU training path, so they are plain loops parallelised with OpenMP.
// Shapes in comments; "(=)" overwrites, "(+=)" accumulates. nullptr for an optional argument means "absent".
// Reductions over rows (dweight, dbias, sum_squares) use per-thread partials summed in thread order, so a rerun with
// the same thread count is bit-identical.
#pragma once
#include <cstdint>

#include "dscpp/core/dtype.h"
#include "dscpp/core/half.h"
#include "dscpp/kernels/rope_params.h"

namespace dscpp::cpu {

// embedding.cpp
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C);  // out[N,C] (=)
// out[N,C] (=) table[ids - first] for ids in [first, first + V), else 0
void embedding_shard_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V,
                             int64_t first);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C);  // dtable[V,C] (+=)
// dtable[ids - first] (+=) dout for ids in [first, first + V); other rows contribute nothing
void embedding_shard_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                              int64_t first);

// matmul.cpp. Weight in nn.Linear layout w[OC,C].
// out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC]   (bias may be null)
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t C, int64_t OC);
// bf16/f16 inp and w (same dtype `in_t`), converted to f32 in blocks of rows and multiplied by sgemm (f32
// accumulation). out is f32 or in_t (out_t); bias (may be null) is f32 or in_t (bias_t).
void matmul_forward_lowp(void* out, DType out_t, const void* inp, const void* w, DType in_t, const void* bias,
                         DType bias_t, int64_t N, int64_t C, int64_t OC);
// dinp[N,C] = dout[N,OC] @ w (=); dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout. Null ones are skipped.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* w,
                     int64_t N, int64_t C, int64_t OC);
// c[M,N] = alpha * op(a) @ op(b) + beta * c; a is [M,K] ([K,M] if trans_a), b is [K,N] ([N,K] if trans_b).
void gemm(float* c, const float* a, bool trans_a, const float* b, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, float beta);
// dst[n] = float(src[n]) and back, for src_t/dst_t in {f32, bf16, f16}.
void convert_to_f32(float* dst, const void* src, DType src_t, int64_t n);
void convert_from_f32(void* dst, DType dst_t, const float* src, int64_t n);

// norm.cpp
// out[N,C] = (inp - mean) * rstd * w[C] + b[C]; mean[N], rstd[N] saved when non-null; b may be null.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C, float eps);
// dinp[N,C] (=); dw[C] (+=, may be null); db[C] (+=, may be null)
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C);
// out[N,C] = inp * rstd * w[C], rstd[N] = 1/sqrt(mean(inp^2) + eps) saved when non-null.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps);
// dinp[N,C] (=); dw[C] (+=, may be null)
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int64_t N, int64_t C);

// out[N,C] (=): the forward's output from its saved mean[N] (LN) and rstd[N], with no reduction; bit for bit the
// out of layernorm_forward / rmsnorm_forward and of the fused_residual_*_forward below. b may be null.
void layernorm_apply(float* out, const float* inp, const float* w, const float* b, const float* mean,
                     const float* rstd, int64_t N, int64_t C);
void rmsnorm_apply(float* out, const float* inp, const float* w, const float* rstd, int64_t N, int64_t C);

// fused_norm.cpp: the residual add fused with the norm after it, row by row.
// resid[N,C] = x + r (=, may alias x or r); out[N,C] = norm(resid) (=); mean[N], rstd[N] saved when non-null.
void fused_residual_layernorm_forward(float* resid, float* out, float* mean, float* rstd, const float* x,
                                      const float* r, const float* w, const float* b, int64_t N, int64_t C, float eps);
void fused_residual_rmsnorm_forward(float* resid, float* out, float* rstd, const float* x, const float* r,
                                    const float* w, int64_t N, int64_t C, float eps);
// dresid[N,C] (=) = dskip + the norm's input gradient for dnorm (dresid may alias dskip); dw, db (+=, may be null).
void fused_residual_layernorm_backward(float* dresid, float* dw, float* db, const float* dskip, const float* dnorm,
                                       const float* resid, const float* w, const float* mean, const float* rstd,
                                       int64_t N, int64_t C);
void fused_residual_rmsnorm_backward(float* dresid, float* dw, const float* dskip, const float* dnorm,
                                     const float* resid, const float* w, const float* rstd, int64_t N, int64_t C);

// activation.cpp. n elements; dinp may alias dout.
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void silu_forward(float* out, const float* inp, int64_t n);
void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// gate_up[N,2F] = [gate | up] -> out[N,F] = silu(gate) * up; dgate_up[N,2F] (=)
// gate_up's rows are F/k blocks of [k gate | k up] (k = F: [gate | up]).
void swiglu_forward(float* out, const float* gate_up, int64_t N, int64_t F, int64_t k);
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int64_t F);

// elementwise.cpp. n elements; out may alias a or b.
void residual_forward(float* out, const float* a, const float* b, int64_t n);
void add_inplace(float* acc, const float* x, int64_t n);
void scale_inplace(float* x, float s, int64_t n);
void sum_blocks(float* out, const float* in, int64_t n, int64_t blocks, float scale);
double sum_squares(const float* x, int64_t n);
void add_sum(float* acc, const float* x, int64_t n, float scale);

// rope.cpp. qkv[N,(H+2Hkv)*D] with N = B*T tokens at positions pos[N]; rotates the H q heads and Hkv k heads in
// place (HF Llama rotate_half). rope_backward applies the inverse rotation (the transpose) to dqkv.
void rope_forward(float* qkv, const int32_t* pos, int64_t N, int64_t H, int64_t Hkv, int64_t D, const RopeParams& rope);
void rope_backward(float* dqkv, const int32_t* pos, int64_t N, int64_t H, int64_t Hkv, int64_t D,
                   const RopeParams& rope);

// attention.cpp. Causal GQA attention on packed qkv[B,T,(H+2Hkv)*D]; out[B,T,H*D] (=), lse[B,H,T] (=).
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D);
// dqkv[B,T,(H+2Hkv)*D] (=), recomputing the probabilities from lse.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);

// paged_kv.cpp. One layer's paged KV cache, cache[n_blocks, block_size, 2 (K, V), Hkv, D]; qkv rows as attention's.
// The cache's element C is float or fp8_e4m3 (rounded on the append, read as f32: Note [fp8 KV cache]).
// The k and v heads of qkv[n] (=) into slot slots[n] (= block * block_size + offset).
template <typename C>
void kv_cache_append(C* cache, const float* qkv, const int32_t* slots, int64_t N, int64_t H, int64_t Hkv, int64_t D);
// out[N,H*D] (=): token n of sequence s (seq_start[s] <= n < seq_start[s+1], N = seq_start[S]) attends causally to
// positions 0..pos[n] of s, position j in block block_table[s * max_blocks + j / block_size].
template <typename C>
void paged_attention_forward(float* out, const float* qkv, const C* cache, const int32_t* block_table,
                             const int32_t* seq_start, const int32_t* pos, int64_t S, int64_t max_blocks,
                             int64_t block_size, int64_t H, int64_t Hkv, int64_t D);

// sampling.cpp (sampling_ops.h): the rows of logits[S,V]; sample_row is one row's draw at a given u, the semantics
// every other sampler follows (SequenceSampler goes through the ops; the op harness asks where u fell).
void apply_penalties(float* out, const float* logits, const int32_t* hist_start, const int32_t* hist_token,
                     const int32_t* hist_count, const float* repetition, const float* presence, const float* frequency,
                     int64_t S, int64_t V);
struct SampleKnobs {
  float temperature, top_p, min_p;
  int32_t top_k;
};
// The token, and the candidates' cumulative mass (a fraction of their sum) before and after it: u lies in [below,
// above) up to rounding (greedy: 0, 1).
struct RowDraw {
  int32_t token;
  double below, above;
};
RowDraw sample_row(const float* l, int64_t V, const SampleKnobs& k, float u);
float sample_uniform(uint64_t seed, int64_t step);  // u of sample_rows: Philox(seed, counter = step)'s first uniform
void sample_rows(int32_t* tokens, const float* logits, const float* temperature, const int32_t* top_k,
                 const float* top_p, const float* min_p, const int32_t* seed, const int32_t* step, int64_t S,
                 int64_t V);
void logprobs_rows(float* chosen, int32_t* top_ids, float* top_logprob, const float* logits, const int32_t* tokens,
                   int64_t S, int64_t V, int64_t n);

// quant.cpp (quant_ops.h, Note [Quantized weight layout]): int8 q[OC,C] with scale[OC]; int4 q[OC,C/2] (the even
// column in the low nibble) with scale and zero[OC,C/G].
void quantize_weight_int8(int8_t* q, float* scale, const float* w, int64_t OC, int64_t C);
void quantize_weight_int4(uint8_t* q, float* scale, uint8_t* zero, const float* w, int64_t OC, int64_t C, int64_t G);
void dequantize_weight_int8(float* w, const int8_t* q, const float* scale, int64_t OC, int64_t C);
// fp8: q[OC,C] e4m3 codes with scale[OC] (Note [fp8 matmul]: quantize_rows_fp8 is also the activations' rule).
void quantize_rows_fp8(uint8_t* q, float* scale, const float* w, int64_t OC, int64_t C);
void dequantize_weight_fp8(float* w, const uint8_t* q, const float* scale, int64_t OC, int64_t C);
void dequantize_weight_int4(float* w, const uint8_t* q, const float* scale, const uint8_t* zero, int64_t OC,
                            int64_t C, int64_t G);

// crossentropy.cpp. logits[N,Vp], softmax over the first V columns; targets[N] < 0 are ignored.
// lse (nullable) receives each row's log-sum-exp (0 for ignored rows).
void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp);
// dlogits[N,Vp] (=) = dloss * (softmax - onehot), 0 in ignored rows and padded columns; may alias logits.
// lse (nullable): the forward's, so the softmax is exp(x - lse) in one pass.
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, const float* lse, float dloss,
                           int64_t N, int64_t V, int64_t Vp, int64_t first = 0);
// A vocabulary shard holding columns [first, first + V): stats[0][n] = logsumexp(logits[n, :V]), stats[1][n] = the
// target's logit where the target is in the shard, else 0; both 0 in ignored rows. stats f32 [2, N].
void crossentropy_shard_stats(float* stats, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                              int64_t Vp, int64_t first);
// S shards' stats [S, 2, N] joined: lse[n] = log sum_s exp(stats[s][0][n]), losses[n] = lse[n] - sum_s stats[s][1][n].
void crossentropy_combine(float* losses, float* lse, const float* stats, const int32_t* targets, int64_t N, int64_t S);

}  // namespace dscpp::cpu
