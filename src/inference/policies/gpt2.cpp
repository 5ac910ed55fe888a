// GPT-2: learned positions, LayerNorm and every linear with a bias, GELU (tanh) MLP, lm head tied to wte. HF stores
// the linears as Conv1D, [in, out]: the source transposes them into our [out, in]; c_attn is already fused q | k | v.
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
  src.read("transformer.wte.weight", m.embed);
  src.read("transformer.wpe.weight", m.pos_embed);
  for (int64_t i = 0; i < m.cfg.n_layer; i++) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    LayerWeights& w = m.layers[size_t(i)];
    struct Slot {
      const char* hf;
      Tensor& dst;
      bool conv1d;  // stored [in, out]
    };
    for (const Slot& s : {Slot{"ln_1.weight", w.norm1_w, false}, {"ln_1.bias", w.norm1_b, false},
                          {"attn.c_attn.weight", w.qkv_w, true}, {"attn.c_attn.bias", w.qkv_b, false},
                          {"attn.c_proj.weight", w.o_w, true}, {"attn.c_proj.bias", w.o_b, false},
                          {"ln_2.weight", w.norm2_w, false}, {"ln_2.bias", w.norm2_b, false},
                          {"mlp.c_fc.weight", w.up_w, true}, {"mlp.c_fc.bias", w.up_b, false},
                          {"mlp.c_proj.weight", w.down_w, true}, {"mlp.c_proj.bias", w.down_b, false}})
      src.read(p + s.hf, s.dst, s.conv1d);
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
