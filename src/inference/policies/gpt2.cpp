// GPT-2: learned positions, LayerNorm and every linear with a bias, GELU (tanh) MLP, lm head tied to wte. HF stores
// the linears as Conv1D, [in, out]: the source transposes them into our [out, in]; c_attn is already fused q | k | v
// (read part by part, which a tensor-parallel shard needs).
// The released checkpoints name tensors without the "transformer." prefix; the source accepts both.
#include "dscpp/core/check.h"
#include "inference/model/weight_source.h"
#include "inference/policies/policy.h"

namespace dscpp::inference {
namespace {

InferenceModelConfig gpt2_config(const nlohmann::json& j, int64_t max_context) {
  InferenceModelConfig c = from_model_config(ModelConfig::from_hf_json(j), "gpt2");
  DSCPP_CHECK(max_context <= c.max_context, "max_context ", max_context, " exceeds GPT-2's n_positions ",
              c.max_context, " (learned positions end there)");
  return c;
}

void load_gpt2(WeightSource& src, InferenceModel& m) {
  read_vocab_rows(src, "transformer.wte.weight", m, m.embed);
  src.read("transformer.wpe.weight", m.pos_embed);
  // This rank's heads and MLP columns (Note [Tensor-parallel shards]): c_attn's q | k | v parts each give d rows.
  const int64_t d = m.cfg.n_head * m.cfg.head_dim, C = m.cfg.hidden, F = m.cfg.ffn, r = m.tp.rank;
  for (int64_t i = 0; i < m.cfg.n_layer; i++) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    LayerWeights& w = m.layers[size_t(i)];
    for (int64_t part = 0; part < 3; part++) {
      src.read(p + "attn.c_attn.weight", w.qkv_w.narrow0(part * d, d), true, rows_from(part * C + r * d));
      src.read(p + "attn.c_attn.bias", w.qkv_b.narrow0(part * d, d), false, rows_from(part * C + r * d));
    }
    struct Slot {
      const char* hf;
      Tensor& dst;
      bool conv1d;  // stored [in, out]
      Slice slice;
    };
    for (const Slot& s : {Slot{"ln_1.weight", w.norm1_w, false, {}}, {"ln_1.bias", w.norm1_b, false, {}},
                          {"attn.c_proj.weight", w.o_w, true, cols_from(r * d)}, {"attn.c_proj.bias", w.o_b, false, {}},
                          {"ln_2.weight", w.norm2_w, false, {}}, {"ln_2.bias", w.norm2_b, false, {}},
                          {"mlp.c_fc.weight", w.up_w, true, rows_from(r * F)},
                          {"mlp.c_fc.bias", w.up_b, false, rows_from(r * F)},
                          {"mlp.c_proj.weight", w.down_w, true, cols_from(r * F)},
                          {"mlp.c_proj.bias", w.down_b, false, {}}})
      src.read(p + s.hf, s.dst, s.conv1d, s.slice);
  }
  src.read("transformer.ln_f.weight", m.norm_f_w);
  src.read("transformer.ln_f.bias", m.norm_f_b);
}

}  // namespace

const Policy& gpt2_policy() {
  static const Policy p{"gpt2", gpt2_config, load_gpt2};
  return p;
}

}  // namespace dscpp::inference
