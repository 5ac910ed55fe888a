// The ragged forward (DeepSpeed-FastGen's model forward): N new tokens of S sequences packed end to end, each
// sequence's earlier tokens already in the paged KV cache. Per layer, on all N tokens at once:
//   h = norm1(x); qkv = h Wqkv^T (+ b) (one op for RMSNorm); RoPE on q, k at each token's own position and K, V -> cache slots (one op);
//   x = x + (paged causal attention over the sequence's cached positions) Wo^T; x = x + mlp(norm2(x))
// then only each sequence's last token goes through the final norm and the lm head: the engine samples from one row
// per sequence, and the [N, V] logits of a long prompt chunk would be most of the forward's memory (every token
// when asked: a prompt's log-probabilities). A linear whose weight is quantized runs matmul_q_forward instead of
// matmul_forward on the same inputs; a dense model takes exactly the calls it always did.
// Every step is an op of the kernels layer (CPU reference + CUDA contract), so the CUDA path is these same calls.
#include <algorithm>

#include "dscpp/core/check.h"
#include "dscpp/inference/inference_model.h"
#include "dscpp/kernels/norm_matmul_ops.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/kernels/paged_ops.h"
#include "dscpp/kernels/parallel_ops.h"
#include "dscpp/kernels/quant_ops.h"
#include "inference/model/forward_inputs.h"
#include "inference/model/tensor_parallel.h"

namespace dscpp::inference {
namespace {

// out (=) norm(inp) with its weight and bias; the statistics go to scratch rows nobody reads (no backward).
void norm_forward(const InferenceModelConfig& c, const Tensor& out, const Tensor& inp, const Tensor& w,
                  const Tensor& b, const Tensor& mean, const Tensor& rstd) {
  const int64_t N = inp.size(0);
  if (c.norm == NormKind::rmsnorm) return ops::rmsnorm_forward(out, rstd.narrow0(0, N), inp, w, c.norm_eps);
  ops::layernorm_forward(out, mean.narrow0(0, N), rstd.narrow0(0, N), inp, w, b, c.norm_eps);
}

// out (=) inp @ W^T + b (+ residual), W the dense weight or its quantized form.
void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& w, const QuantWeight& q, const Tensor& b,
                    const Tensor& residual = Tensor()) {
  if (q.defined()) return ops::matmul_q_forward(out, inp, q.q, q.scale, q.zero, q.group, b, residual);
  ops::matmul_forward(out, inp, w, b, residual);
}

// h (=) norm(x); out (=) h @ W^T + b. RMSNorm goes through the fused op (at decode the GEMV normalizes its own
// input rows: Note [Norm in the decode GEMV]); LayerNorm through the two ops.
void norm_linear_forward(const InferenceModelConfig& c, const Tensor& out, const Tensor& h, const Tensor& x,
                         const Tensor& norm_w, const Tensor& norm_b, const Tensor& w, const QuantWeight& q,
                         const Tensor& b, const Tensor& mean, const Tensor& rstd) {
  if (c.norm != NormKind::rmsnorm) {
    norm_forward(c, h, x, norm_w, norm_b, mean, rstd);
    return linear_forward(out, h, w, q, b);
  }
  if (q.defined())
    return ops::rmsnorm_matmul_q_forward(out, h, x, norm_w, c.norm_eps, q.q, q.scale, q.zero, q.group, b);
  ops::rmsnorm_matmul_forward(out, h, x, norm_w, c.norm_eps, w, b);
}

constexpr int64_t kAlign = 256;
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int64_t ForwardWorkspace::bytes_for(const InferenceModelConfig& c, DType act, int64_t N, int64_t S,
                                    const TpShard& tp) {
  const int64_t e = int64_t(dtype_size(act)), rows = std::max(N, S);
  int64_t b = 0;
  for (int64_t cols : {c.hidden, c.hidden, c.hidden, c.qkv_rows(), c.n_head * c.head_dim, c.hidden, c.up_rows(),
                       c.ffn})  // x, positions, h, qkv, att, x1, pre, mid
    b += aligned(N * cols * e);
  if (tp.size > 1) b += aligned(S * tp.vocab_rows * 4) + aligned(tp.size * S * tp.vocab_rows * 4);  // logits parts
  return b + 2 * aligned(rows * 4) + 2 * aligned(S * c.hidden * e);  // norm statistics; xl, xf
}

ForwardWorkspace::ForwardWorkspace(const InferenceModelConfig& c, DType act, Device d, int64_t max_tokens,
                                   int64_t max_seqs, const TpShard& tp)
    : buf_(Tensor::empty({bytes_for(c, act, max_tokens, max_seqs, tp)}, DType::i8, d)) {}

Tensor ForwardWorkspace::take(const Shape& shape, DType t) {
  const int64_t bytes = shape_numel(shape) * int64_t(dtype_size(t));
  DSCPP_CHECK(used_ + bytes <= capacity(), "forward workspace: ", bytes, " more bytes at ", used_, " of ",
              capacity(), " (sized at start-up for the largest batch)");
  Tensor s = buf_.view_at(used_, {bytes});
  used_ = aligned(used_ + bytes);
  return Tensor::wrap(s.raw(), shape, t, buf_.device());  // a view: the runner keeps the buffer
}

InputLayout InputLayout::of(int64_t N, int64_t S, int64_t width) {
  InputLayout L;
  L.N = N, L.S = S, L.width = width;
  L.tokens = 0, L.pos = N, L.slots = 2 * N, L.last = 3 * N, L.seq_start = 3 * N + S, L.table = 3 * N + 2 * S + 1;
  L.total = L.table + S * width;
  return L;
}

int64_t table_width(const RaggedBatch& b, int64_t block_size) {
  int64_t width = 0;
  for (int32_t p : b.positions) width = std::max<int64_t>(width, p / block_size + 1);
  return width;
}

void pack_inputs(const RaggedBatch& b, int64_t bs, const InputLayout& L, int32_t* out) {
  const int64_t N = b.n_tokens(), S = b.n_seqs();
  DSCPP_CHECK(L.N >= N && L.S >= S && L.N - N == L.S - S && L.width <= b.max_blocks_per_seq,
              "pack_inputs: a layout for ", L.N, " tokens of ", L.S, " sequences (width ", L.width,
              ") cannot hold a batch of ", N, " tokens of ", S, " sequences (", b.max_blocks_per_seq, " blocks each)");
  std::copy(b.tokens.begin(), b.tokens.end(), out + L.tokens);
  std::copy(b.positions.begin(), b.positions.end(), out + L.pos);
  std::copy(b.seq_start.begin(), b.seq_start.end(), out + L.seq_start);
  for (int64_t s = 0; s < S; s++) {
    const int32_t* row = b.block_table.data() + s * b.max_blocks_per_seq;
    // Each token's cache slot: its block (from the sequence's row of the block table) * block_size + offset.
    for (int64_t n = b.seq_start[size_t(s)]; n < b.seq_start[size_t(s + 1)]; n++) {
      const int32_t p = b.positions[size_t(n)];
      out[L.slots + n] = row[p / bs] * int32_t(bs) + p % int32_t(bs);
    }
    out[L.last + s] = int32_t(b.last_token(s));
    std::copy(row, row + L.width, out + L.table + s * L.width);
  }
  for (int64_t i = 0; i < L.N - N; i++) {  // padding: one token per sequence
    out[L.tokens + N + i] = 0;
    out[L.pos + N + i] = 0;
    out[L.slots + N + i] = -1;
    out[L.last + S + i] = int32_t(N + i);
    out[L.seq_start + S + 1 + i] = int32_t(N + i + 1);
    std::fill(out + L.table + (S + i) * L.width, out + L.table + (S + i + 1) * L.width, 0);
  }
}

ForwardInputs ForwardInputs::views(const Tensor& packed, const InputLayout& L) {
  auto at = [&](int64_t off, std::vector<int64_t> shape) { return packed.view_at(off, std::move(shape)); };
  return {at(L.tokens, {L.N}), at(L.pos, {L.N}),           at(L.slots, {L.N}),
          at(L.last, {L.S}),   at(L.seq_start, {L.S + 1}), at(L.table, {L.S, L.width})};
}

void forward_on(const InferenceModel& m, const ForwardInputs& in, KVCache& cache, const Tensor& logits,
                ForwardWorkspace* ws, bool all_tokens) {
  const InferenceModelConfig& c = m.cfg;
  const KVCacheShape& ks = cache.shape();
  const int64_t N = in.tokens.numel(), S = in.last.numel(), C = c.hidden, H = c.n_head, Hkv = c.n_kv_head,
                D = c.head_dim, bs = ks.block_size;
  const Device dev = m.device;
  const DType act = m.dtype;
  if (ws) ws->reset();
  auto empty = [&](const Shape& shape, DType t) { return ws ? ws->take(shape, t) : Tensor::empty(shape, t, dev); };
  const int64_t rows = std::max(N, S);
  const Tensor mean = empty({rows}, DType::f32), rstd = empty({rows}, DType::f32);
  Tensor x = empty({N, C}, act);
  if (m.tp.size > 1) {  // Note [Tensor-parallel shards]: each rank's vocabulary rows, summed
    ops::embedding_shard_forward(x, in.tokens, m.embed, m.tp.vocab_begin);
    tp_sum(m.tp, x);
  } else {
    ops::embedding_forward(x, in.tokens, m.embed);
  }
  const bool first = m.tp.rank == 0;  // adds the residual and the row-parallel biases, once
  if (c.learned_positions) {
    Tensor p = empty({N, C}, act);
    ops::embedding_forward(p, in.pos, m.pos_embed);
    ops::residual_forward(x, x, p);
  }
  Tensor h = empty({N, C}, act), qkv = empty({N, c.qkv_rows()}, act);
  Tensor att = empty({N, H * D}, act), x1 = empty({N, C}, act);
  Tensor pre = empty({N, c.up_rows()}, act), mid = empty({N, c.ffn}, act);
  for (int64_t l = 0; l < c.n_layer; l++) {
    const LayerWeights& w = m.layers[size_t(l)];
    const Tensor layer_cache = cache.data().view_at(cache.offset(l, 0, 0, 0), {ks.n_blocks, bs, 2, Hkv, D});
    if (c.rope.pair_block == ops::kRopePairBlock && c.norm == NormKind::rmsnorm && !c.learned_positions) {
      // the decode GEMV rotates and appends itself (Note [Rope and KV append in the decode GEMV])
      const ops::RopeKvAppend kv{layer_cache, in.pos, in.slots, H, Hkv, D, c.rope};
      const QuantWeight& q = w.qkv_q;
      if (q.defined())
        ops::rmsnorm_matmul_q_rope_kv_forward(qkv, h, x, w.norm1_w, c.norm_eps, q.q, q.scale, q.zero, q.group,
                                              w.qkv_b, kv);
      else
        ops::rmsnorm_matmul_rope_kv_forward(qkv, h, x, w.norm1_w, c.norm_eps, w.qkv_w, w.qkv_b, kv);
    } else {
      norm_linear_forward(c, qkv, h, x, w.norm1_w, w.norm1_b, w.qkv_w, w.qkv_q, w.qkv_b, mean, rstd);
      if (c.learned_positions) ops::kv_cache_append(layer_cache, qkv, in.slots, H, Hkv, D);
      else ops::rope_kv_cache_append(layer_cache, qkv, in.pos, in.slots, H, Hkv, D, c.rope);
    }
    if (m.observe_inputs) m.observe_inputs(l, LinearInput::qkv, h);
    ops::paged_attention_forward(att, qkv, layer_cache, in.table, in.seq_start, in.pos, H, Hkv, D);
    if (m.observe_inputs) m.observe_inputs(l, LinearInput::o, att);
    linear_forward(x1, att, w.o_w, w.o_q, first ? w.o_b : Tensor(), first ? x : Tensor());  // x1 = x + attention
    tp_sum(m.tp, x1);
    if (c.mlp == MlpKind::gelu && !w.up_q.defined()) {
      norm_forward(c, h, x1, w.norm2_w, w.norm2_b, mean, rstd);
      ops::matmul_bias_gelu_forward(mid, pre, h, w.up_w, w.up_b);
    } else if (m.up_pair_block == ops::kSwigluPairBlock && c.norm == NormKind::rmsnorm) {
      // the decode GEMV applies SwiGLU itself (Note [SwiGLU in the decode GEMV])
      const QuantWeight& q = w.up_q;
      if (q.defined())
        ops::rmsnorm_matmul_q_swiglu_forward(mid, pre, h, x1, w.norm2_w, c.norm_eps, q.q, q.scale, q.zero, q.group,
                                             w.up_b);
      else
        ops::rmsnorm_matmul_swiglu_forward(mid, pre, h, x1, w.norm2_w, c.norm_eps, w.up_w, w.up_b);
    } else {
      norm_linear_forward(c, pre, h, x1, w.norm2_w, w.norm2_b, w.up_w, w.up_q, w.up_b, mean, rstd);
      c.mlp == MlpKind::gelu ? ops::gelu_forward(mid, pre) : ops::swiglu_forward(mid, pre, m.up_pair_block);
    }
    if (m.observe_inputs) m.observe_inputs(l, LinearInput::up, h);
    if (m.observe_inputs) m.observe_inputs(l, LinearInput::down, mid);
    linear_forward(x, mid, w.down_w, w.down_q, first ? w.down_b : Tensor(), first ? x1 : Tensor());  // x = x1 + mlp
    tp_sum(m.tp, x);
  }
  // out[R, V] (=) xf @ lm_head^T; a shard's [R, vocab_rows] gathered from every rank.
  auto lm_head = [&](const Tensor& out, const Tensor& xf) {
    if (m.tp.size == 1) return linear_forward(out, xf, m.lm_head, m.lm_head_q, Tensor());
    const int64_t R = xf.size(0);
    const Tensor part = empty({R, m.tp.vocab_rows}, DType::f32);
    linear_forward(part, xf, m.lm_head, m.lm_head_q, Tensor());
    tp_gather_logits(m.tp, part, empty({m.tp.size * R * m.tp.vocab_rows}, DType::f32), out);
  };
  if (all_tokens) {
    norm_forward(c, h, x, m.norm_f_w, m.norm_f_b, mean, rstd);
    return lm_head(logits, h);
  }
  // The last new token of each sequence (embedding_forward is a row gather: out[s] = x[last[s]]).
  Tensor xl = empty({S, C}, act), xf = empty({S, C}, act);
  ops::embedding_forward(xl, in.last, x);
  if (m.tp.size == 1)
    return norm_linear_forward(c, logits, xf, xl, m.norm_f_w, m.norm_f_b, m.lm_head, m.lm_head_q, Tensor(), mean,
                               rstd);
  norm_forward(c, xf, xl, m.norm_f_w, m.norm_f_b, mean, rstd);
  lm_head(logits, xf);
}

Tensor forward(const InferenceModel& m, const RaggedBatch& batch, KVCache& cache, bool all_tokens) {
  const InferenceModelConfig& c = m.cfg;
  const KVCacheShape& ks = cache.shape();
  DSCPP_CHECK(ks.n_layer == c.n_layer && ks.n_kv_head == c.n_kv_head && ks.head_dim == c.head_dim,
              "inference forward: the KV cache is for ", ks.n_layer, " layers of ", ks.n_kv_head, " x ", ks.head_dim,
              ", the model (", c.model_type, ") has ", c.n_layer, " of ", c.n_kv_head, " x ", c.head_dim);
  batch.validate(ks.block_size);
  for (int64_t n = 0; n < batch.n_tokens(); n++)
    DSCPP_CHECK(batch.positions[size_t(n)] < c.max_context, "inference forward: position ", batch.positions[size_t(n)],
                " of token ", n, " is past the model's max_context ", c.max_context);
  const InputLayout L = InputLayout::of(batch.n_tokens(), batch.n_seqs(), table_width(batch, ks.block_size));
  Tensor packed = Tensor::empty({L.total}, DType::i32);
  pack_inputs(batch, ks.block_size, L, packed.data<int32_t>());
  if (!m.device.is_cpu()) packed = packed.to(m.device);
  Tensor logits = Tensor::empty({all_tokens ? batch.n_tokens() : batch.n_seqs(), c.vocab}, DType::f32, m.device);
  forward_on(m, ForwardInputs::views(packed, L), cache, logits, nullptr, all_tokens);
  return logits;
}

}  // namespace dscpp::inference
