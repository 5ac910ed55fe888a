// GPT-2: the tensor table with Hugging Face names, and the layer kinds. Learned positions (wpe), LayerNorm with
// bias, GELU MLP with bias, lm head tied to wte. HF's Conv1D weights are [in, out]; ours are torch.nn.Linear
// [out, in], so c_attn.weight is [3C, C] with rows q | k | v (checkpoint import/export transposes).
#include "decoder.h"

namespace dscpp {

DecoderLayers declare_gpt2(ParamSet& ps, const ModelConfig& c) {
  const int64_t C = c.n_embd;
  DecoderLayers m;
  m.wte = Embedding::declare(ps, "transformer.wte.weight", c.vocab_size, C);
  m.wpe = Embedding::declare(ps, "transformer.wpe.weight", c.max_seq_len, C);
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    Block b;
    b.norm1 = Norm::declare(ps, NormKind::layernorm, p + "ln_1", C, c.norm_eps);
    b.attn.qkv = Linear::declare(ps, p + "attn.c_attn", 3 * C, C, true);
    b.attn.proj = Linear::declare(ps, p + "attn.c_proj", C, C, true);
    b.attn.n_head = b.attn.n_kv_head = c.n_head;
    b.attn.head_dim = c.head_dim();
    b.norm2 = Norm::declare(ps, NormKind::layernorm, p + "ln_2", C, c.norm_eps);
    b.mlp.kind = MlpKind::gelu;
    b.mlp.ffn = c.n_ffn;
    b.mlp.up = Linear::declare(ps, p + "mlp.c_fc", c.n_ffn, C, true);
    b.mlp.down = Linear::declare(ps, p + "mlp.c_proj", C, c.n_ffn, true);
    m.blocks.push_back(b);
  }
  m.norm_f = Norm::declare(ps, NormKind::layernorm, "transformer.ln_f", C, c.norm_eps);
  m.lm_head_id = m.wte.table_id;  // tied
  return m;
}

}  // namespace dscpp
