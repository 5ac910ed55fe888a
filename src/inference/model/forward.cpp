// The ragged forward (DeepSpeed-FastGen's model forward): N new tokens of S sequences packed end to end, each
// sequence's earlier tokens already in the paged KV cache. Per layer, on all N tokens at once:
//   h = norm1(x); qkv = h Wqkv^T (+ b); RoPE on q, k at each token's own position; K, V -> cache slots;
//   x = x + (paged causal attention over the sequence's cached positions) Wo^T; x = x + mlp(norm2(x))
// then only each sequence's last token goes through the final norm and the lm head: the engine samples from one row
// per sequence, and the [N, V] logits of a long prompt chunk would be most of the forward's memory.
// Every step is an op of the kernels layer (CPU reference + CUDA contract), so the CUDA path is these same calls.
#include <algorithm>

#include "dscpp/core/check.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/paged_ops.h"

namespace dscpp::inference {
namespace {

Tensor i32_tensor(const std::vector<int32_t>& v, Device dev) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return dev.is_cpu() ? t : t.to(dev);
}

// out (=) norm(inp) with its weight and bias; the statistics are not kept (no backward).
void norm_forward(const InferenceModelConfig& c, const Tensor& out, const Tensor& inp, const Tensor& w,
                  const Tensor& b) {
  const int64_t N = inp.size(0);
  Tensor rstd = Tensor::empty({N}, DType::f32, inp.device());
  if (c.norm == NormKind::rmsnorm) return ops::rmsnorm_forward(out, rstd, inp, w, c.norm_eps);
  ops::layernorm_forward(out, Tensor::empty({N}, DType::f32, inp.device()), rstd, inp, w, b, c.norm_eps);
}

}  // namespace

Tensor forward(const InferenceModel& m, const RaggedBatch& batch, KVCache& cache) {
  const InferenceModelConfig& c = m.cfg;
  const KVCacheShape& ks = cache.shape();
  DSCPP_CHECK(ks.n_layer == c.n_layer && ks.n_kv_head == c.n_kv_head && ks.head_dim == c.head_dim,
              "inference forward: the KV cache is for ", ks.n_layer, " layers of ", ks.n_kv_head, " x ", ks.head_dim,
              ", the model (", c.model_type, ") has ", c.n_layer, " of ", c.n_kv_head, " x ", c.head_dim);
  batch.validate(ks.block_size);
  const int64_t N = batch.n_tokens(), S = batch.n_seqs(), C = c.hidden, H = c.n_head, Hkv = c.n_kv_head,
                D = c.head_dim, bs = ks.block_size;
  for (int64_t n = 0; n < N; n++)
    DSCPP_CHECK(batch.positions[size_t(n)] < c.max_context, "inference forward: position ", batch.positions[size_t(n)],
                " of token ", n, " is past the model's max_context ", c.max_context);
  const Device dev = m.device;
  const DType act = m.dtype;

  // Each token's cache slot: block (from its sequence's row of the block table) * block_size + offset.
  std::vector<int32_t> slots(static_cast<size_t>(N)), last(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; s++) {
    for (int64_t n = batch.seq_start[size_t(s)]; n < batch.seq_start[size_t(s + 1)]; n++) {
      const int32_t p = batch.positions[size_t(n)];
      slots[size_t(n)] = batch.block_table[size_t(s * batch.max_blocks_per_seq + p / bs)] * int32_t(bs) + p % int32_t(bs);
    }
    last[size_t(s)] = int32_t(batch.last_token(s));
  }
  const Tensor tokens = i32_tensor(batch.tokens, dev), pos = i32_tensor(batch.positions, dev);
  const Tensor slot_t = i32_tensor(slots, dev), last_t = i32_tensor(last, dev);
  // The block table cut to the columns this batch's positions reach: less to upload, and paged attention sizes its
  // split-K from the table's width (the longest context a token may have; Note [Paged attention design]).
  int64_t width = 0;
  for (int32_t p : batch.positions) width = std::max<int64_t>(width, p / bs + 1);
  std::vector<int32_t> used(static_cast<size_t>(S * width));
  for (int64_t s = 0; s < S; s++)
    for (int64_t j = 0; j < width; j++)
      used[size_t(s * width + j)] = batch.block_table[size_t(s * batch.max_blocks_per_seq + j)];
  const Tensor seq_start = i32_tensor(batch.seq_start, dev), table = i32_tensor(used, dev);

  Tensor x = Tensor::empty({N, C}, act, dev);
  ops::embedding_forward(x, tokens, m.embed);
  if (c.learned_positions) {
    Tensor p = Tensor::empty({N, C}, act, dev);
    ops::embedding_forward(p, pos, m.pos_embed);
    ops::residual_forward(x, x, p);
  }
  Tensor h = Tensor::empty({N, C}, act, dev), qkv = Tensor::empty({N, c.qkv_rows()}, act, dev);
  Tensor att = Tensor::empty({N, H * D}, act, dev), x1 = Tensor::empty({N, C}, act, dev);
  Tensor pre = Tensor::empty({N, c.up_rows()}, act, dev), mid = Tensor::empty({N, c.ffn}, act, dev);
  for (int64_t l = 0; l < c.n_layer; l++) {
    const LayerWeights& w = m.layers[size_t(l)];
    const Tensor layer_cache = cache.data().view_at(cache.offset(l, 0, 0, 0), {ks.n_blocks, bs, 2, Hkv, D});
    norm_forward(c, h, x, w.norm1_w, w.norm1_b);
    ops::matmul_forward(qkv, h, w.qkv_w, w.qkv_b);
    if (!c.learned_positions) ops::rope_forward(qkv, pos, H, Hkv, D, c.rope);
    ops::kv_cache_append(layer_cache, qkv, slot_t, H, Hkv, D);
    ops::paged_attention_forward(att, qkv, layer_cache, table, seq_start, pos, H, Hkv, D);
    ops::matmul_forward(x1, att, w.o_w, w.o_b, x);  // x1 = x + attention
    norm_forward(c, h, x1, w.norm2_w, w.norm2_b);
    if (c.mlp == MlpKind::gelu) {
      ops::matmul_bias_gelu_forward(mid, pre, h, w.up_w, w.up_b);
    } else {
      ops::matmul_forward(pre, h, w.up_w, w.up_b);
      ops::swiglu_forward(mid, pre);
    }
    ops::matmul_forward(x, mid, w.down_w, w.down_b, x1);  // x = x1 + mlp
  }
  // The last new token of each sequence (embedding_forward is a row gather: out[s] = x[last[s]]).
  Tensor xl = Tensor::empty({S, C}, act, dev), xf = Tensor::empty({S, C}, act, dev);
  ops::embedding_forward(xl, last_t, x);
  norm_forward(c, xf, xl, m.norm_f_w, m.norm_f_b);
  Tensor logits = Tensor::empty({S, c.vocab}, DType::f32, dev);
  ops::matmul_forward(logits, xf, m.lm_head, Tensor());
  return logits;
}

}  // namespace dscpp::inference
