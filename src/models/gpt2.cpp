// GPT-2: the tensor table with Hugging Face names, and the layer kinds. Learned positions (wpe), LayerNorm with
// bias, GELU MLP with bias, lm head tied to wte. HF's Conv1D weights are [in, out]; ours are torch.nn.Linear
// [out, in], so c_attn.weight is [3C, C] with rows q | k | v (checkpoint import/export transposes). Under tensor
// parallelism each rank declares its shard (Note [Tensor parallelism]): c_attn's rows of its heads in each of q, k
// and v, c_fc's rows and the c_projs' columns of its share, its rows of the vocabulary.
#include "decoder.h"

namespace dscpp {

DecoderLayers declare_gpt2(ParamSet& ps, const ModelConfig& c, const TensorParallel& tp) {
  const int64_t C = c.n_embd, D = c.head_dim(), H = tp.split(c.n_head, "n_head"), F = tp.split(c.n_ffn, "n_ffn");
  DecoderLayers m;
  m.wte = declare_vocab_table(ps, "transformer.wte.weight", c, tp);
  m.wpe = Embedding::declare(ps, "transformer.wpe.weight", c.max_seq_len, C);
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    Block b;
    b.norm1 = Norm::declare(ps, NormKind::layernorm, p + "ln_1", C, c.norm_eps);
    b.attn.qkv = Linear::declare(ps, p + "attn.c_attn", 3 * H * D, C, true);
    b.attn.proj = Linear::declare(ps, p + "attn.c_proj", C, H * D, true);
    b.attn.n_head = b.attn.n_kv_head = H;
    b.attn.head_dim = D;
    b.norm2 = Norm::declare(ps, NormKind::layernorm, p + "ln_2", C, c.norm_eps);
    b.mlp.kind = MlpKind::gelu;
    b.mlp.ffn = F;
    b.mlp.up = Linear::declare(ps, p + "mlp.c_fc", F, C, true);
    b.mlp.down = Linear::declare(ps, p + "mlp.c_proj", C, F, true);
    shard_block(ps, b, tp, {{3 * c.n_head * D, 3}}, c.n_head * D, c.n_ffn);
    m.blocks.push_back(b);
  }
  m.norm_f = Norm::declare(ps, NormKind::layernorm, "transformer.ln_f", C, c.norm_eps);
  m.lm_head_id = m.wte.table_id;  // tied
  return m;
}

}  // namespace dscpp
