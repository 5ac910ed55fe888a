// The engine's row layouts for the decode GEMVs' paired epilogues (inference_model.h): interleave_gate_up regroups
// the fused gate | up weight so that each block of kSwigluPairBlock gate rows is followed by the same features' up
// rows (Note [SwiGLU in the decode GEMV]); pair_rope_rows regroups each q and k head so that each block of
// kRopePairBlock first elements of rope's pairs is followed by their partners (Note [Rope and KV append in the
// decode GEMV]).
#include "dscpp/core/copy_2d.h"
#include "dscpp/core/cuda.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/kernels/norm_matmul_ops.h"

namespace dscpp::inference {
namespace {

// dst (=) src [2F, ...] (any dtype: weights, int4 / int8 codes, scales, zero points) with its rows regrouped: two
// strided copies, rows [0, F) into the first half of every 2k-row block, rows [F, 2F) into the second.
void interleave_into(const Tensor& dst, const Tensor& src, int64_t F, int64_t k) {
  const int64_t n = src.numel(), R = n / (2 * F);  // elements a row
  const Tensor s = src.view({n}), d = dst.view({n});
  copy_2d_async(d, 2 * k * R, s, k * R, F / k, k * R);
  copy_2d_async(d.view_at(k * R, {n - k * R}), 2 * k * R, s.view_at(F * R, {n - F * R}), k * R, F / k, k * R);
}

Tensor interleaved(const Tensor& t, int64_t F, int64_t k) {
  if (!t.defined()) return t;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  interleave_into(out, t, F, k);
  return out;
}

// qkv's rows [(H + 2Hkv) D, ...] with each of the H + Hkv q and k heads interleaved by halves (rope's pairs), the v
// heads copied as they are.
Tensor rope_paired(const Tensor& t, int64_t qk_heads, int64_t D, int64_t k) {
  if (!t.defined()) return t;
  const int64_t n = t.numel(), R = n / t.size(0), head = D * R, qk = qk_heads * head;
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  const Tensor s = t.view({n}), d = out.view({n});
  for (int64_t h = 0; h < qk_heads; h++)
    interleave_into(d.view_at(h * head, {head}), s.view_at(h * head, {head}), D / 2, k);
  copy_2d_async(d.view_at(qk, {n - qk}), n - qk, s.view_at(qk, {n - qk}), n - qk, 1, n - qk);
  return out;
}

}  // namespace

void interleave_gate_up(InferenceModel& m) {
  const int64_t F = m.cfg.ffn, k = ops::kSwigluPairBlock;
  if (m.cfg.mlp != MlpKind::swiglu || m.up_pair_block != 0 || F % k != 0) return;
  for (LayerWeights& w : m.layers) {
    w.up_w = interleaved(w.up_w, F, k), w.up_b = interleaved(w.up_b, F, k);
    QuantWeight& q = w.up_q;
    q.q = interleaved(q.q, F, k), q.scale = interleaved(q.scale, F, k), q.zero = interleaved(q.zero, F, k);
  }
  if (m.device.is_cuda()) cuda_synchronize();
  m.up_pair_block = k;
}

void pair_rope_rows(InferenceModel& m) {
  InferenceModelConfig& c = m.cfg;
  const int64_t k = ops::kRopePairBlock, D = c.head_dim, heads = c.n_head + c.n_kv_head;
  if (c.learned_positions || c.rope.pair_block != 0 || D % (2 * k) != 0) return;
  for (LayerWeights& w : m.layers) {
    w.qkv_w = rope_paired(w.qkv_w, heads, D, k), w.qkv_b = rope_paired(w.qkv_b, heads, D, k);
    QuantWeight& q = w.qkv_q;
    q.q = rope_paired(q.q, heads, D, k), q.scale = rope_paired(q.scale, heads, D, k);
    q.zero = rope_paired(q.zero, heads, D, k);
  }
  if (m.device.is_cuda()) cuda_synchronize();
  c.rope.pair_block = int(k);
}

}  // namespace dscpp::inference
