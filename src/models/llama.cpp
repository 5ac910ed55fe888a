// Llama: the tensor table with Hugging Face names, and the layer kinds. No position table (RoPE on q and k),
// RMSNorm, grouped-query attention, SwiGLU MLP, no biases. q/k/v and gate/up are declared as fused groups so one
// GEMM computes each; the lm head is its own matrix unless tie_embeddings.
#include "decoder.h"

namespace dscpp {

DecoderLayers declare_llama(ParamSet& ps, const ModelConfig& c) {
  const int64_t C = c.n_embd, D = c.head_dim(), F = c.n_ffn;
  DecoderLayers m;
  m.wte = Embedding::declare(ps, "model.embed_tokens.weight", c.vocab_size, C);
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Block b;
    b.norm1 = Norm::declare(ps, NormKind::rmsnorm, p + "input_layernorm", C, c.norm_eps);
    b.attn.qkv = Linear::declare_fused(ps,
                                       {{p + "self_attn.q_proj.weight", c.n_head * D},
                                        {p + "self_attn.k_proj.weight", c.n_kv_head * D},
                                        {p + "self_attn.v_proj.weight", c.n_kv_head * D}},
                                       C);
    b.attn.proj = Linear::declare(ps, p + "self_attn.o_proj", C, c.n_head * D, false);
    b.attn.n_head = c.n_head;
    b.attn.n_kv_head = c.n_kv_head;
    b.attn.head_dim = D;
    b.attn.rope = true;
    b.attn.rope_params = RopeParams(c.rope_theta, c.rope_scaling);
    b.norm2 = Norm::declare(ps, NormKind::rmsnorm, p + "post_attention_layernorm", C, c.norm_eps);
    b.mlp.kind = MlpKind::swiglu;
    b.mlp.ffn = F;
    b.mlp.up = Linear::declare_fused(ps, {{p + "mlp.gate_proj.weight", F}, {p + "mlp.up_proj.weight", F}}, C);
    b.mlp.down = Linear::declare(ps, p + "mlp.down_proj", C, F, false);
    m.blocks.push_back(b);
  }
  m.norm_f = Norm::declare(ps, NormKind::rmsnorm, "model.norm", C, c.norm_eps);
  m.lm_head_id = c.tie_embeddings ? m.wte.table_id : ps.add("lm_head.weight", {c.vocab_size, C}, true);
  return m;
}

}  // namespace dscpp
