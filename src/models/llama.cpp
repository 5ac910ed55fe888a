// Llama: the tensor table with Hugging Face names, and the layer kinds. No position table (RoPE on q and k),
// RMSNorm, grouped-query attention, SwiGLU MLP, no biases. q/k/v and gate/up are declared as fused groups so one
// GEMM computes each; the lm head is its own matrix unless tie_embeddings. Under tensor parallelism each rank
// declares its shard (Note [Tensor parallelism]): its q heads and the k/v heads of their groups, its gate/up rows
// and down columns, its rows of the vocabulary.
#include "decoder.h"

namespace dscpp {

DecoderLayers declare_llama(ParamSet& ps, const ModelConfig& c, const TensorParallel& tp) {
  const int64_t C = c.n_embd, D = c.head_dim(), F = tp.split(c.n_ffn, "n_ffn");
  const int64_t H = tp.split(c.n_head, "n_head"), Hkv = tp.split(c.n_kv_head, "n_kv_head");
  DecoderLayers m;
  m.wte = declare_vocab_table(ps, "model.embed_tokens.weight", c, tp);
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Block b;
    b.norm1 = Norm::declare(ps, NormKind::rmsnorm, p + "input_layernorm", C, c.norm_eps);
    b.attn.qkv = Linear::declare_fused(ps,
                                       {{p + "self_attn.q_proj.weight", H * D},
                                        {p + "self_attn.k_proj.weight", Hkv * D},
                                        {p + "self_attn.v_proj.weight", Hkv * D}},
                                       C);
    b.attn.proj = Linear::declare(ps, p + "self_attn.o_proj", C, H * D, false);
    b.attn.n_head = H;
    b.attn.n_kv_head = Hkv;
    b.attn.head_dim = D;
    b.attn.rope = true;
    b.attn.rope_params = RopeParams(c.rope_theta, c.rope_scaling);
    b.norm2 = Norm::declare(ps, NormKind::rmsnorm, p + "post_attention_layernorm", C, c.norm_eps);
    b.mlp.kind = MlpKind::swiglu;
    b.mlp.ffn = F;
    b.mlp.up = Linear::declare_fused(ps, {{p + "mlp.gate_proj.weight", F}, {p + "mlp.up_proj.weight", F}}, C);
    b.mlp.down = Linear::declare(ps, p + "mlp.down_proj", C, F, false);
    const int64_t q = c.n_head * D, kv = c.n_kv_head * D;
    shard_block(ps, b, tp, {{q, 1}, {kv, 1}, {kv, 1}}, q, c.n_ffn);
    m.blocks.push_back(b);
  }
  m.norm_f = Norm::declare(ps, NormKind::rmsnorm, "model.norm", C, c.norm_eps);
  if (c.tie_embeddings) {
    m.lm_head_id = m.wte.table_id;
  } else {
    m.lm_head_id = ps.add("lm_head.weight", {tp.vocab_rows(c.vocab_size), C}, true);
    if (tp.on() && m.lm_head_id >= 0)  // -1: a pipeline stage without the head
      ps.set_shard(m.lm_head_id, {0, 1, tp.rank * tp.vocab_rows(c.vocab_size), c.vocab_size});
  }
  return m;
}

}  // namespace dscpp
