// What Llama, Mistral and Qwen2 share: config.json keys (hidden_size, num_key_value_heads, rope_theta, rope_scaling,
// ...) and tensor names. The per-architecture files add their differences (Mistral's window, Qwen2's QKV biases).
#include "dscpp/core/check.h"
#include "inference/model/weight_source.h"
#include "inference/policies/policy.h"

namespace dscpp::inference {

InferenceModelConfig from_model_config(const ModelConfig& c, const std::string& model_type) {
  InferenceModelConfig r;
  r.model_type = model_type;
  r.n_layer = c.n_layer;
  r.n_head = c.n_head;
  r.n_kv_head = c.n_kv_head;
  r.head_dim = c.head_dim();
  r.hidden = c.n_embd;
  r.ffn = c.n_ffn;
  r.vocab = c.vocab_size;
  r.max_context = c.max_seq_len;
  r.norm_eps = c.norm_eps;
  r.tie_embeddings = c.tie_embeddings;
  if (c.arch == "gpt2") {
    r.norm = NormKind::layernorm;
    r.mlp = MlpKind::gelu;
    r.learned_positions = r.qkv_bias = r.other_bias = true;
  } else {
    r.norm = NormKind::rmsnorm;
    r.mlp = MlpKind::swiglu;
    r.rope = RopeParams(c.rope_theta, c.rope_scaling);
  }
  return r;
}

InferenceModelConfig llama_family_config(const nlohmann::json& j, const std::string& type, int64_t max_context) {
  nlohmann::json as_llama = j;
  as_llama["model_type"] = "llama";
  ModelConfig c;
  try {
    c = ModelConfig::from_hf_json(as_llama);
  } catch (const Error& e) {
    DSCPP_FAIL("config.json (model_type ", type, "): ", e.what());
  }
  InferenceModelConfig r = from_model_config(c, type);
  DSCPP_CHECK(max_context <= r.max_context, "max_context ", max_context, " exceeds the model's ",
              "max_position_embeddings ", r.max_context, " (model_type ", type, ")");
  return r;
}

void refuse_sliding_window(const nlohmann::json& j, const std::string& type, int64_t max_context) {
  if (!j.contains("sliding_window") || j.at("sliding_window").is_null()) return;
  if (j.contains("use_sliding_window") && !j.at("use_sliding_window").get<bool>()) return;  // Qwen2's switch
  const int64_t w = j.at("sliding_window").get<int64_t>();
  const int64_t ctx = max_context > 0 ? max_context : j.value("max_position_embeddings", int64_t(0));
  DSCPP_CHECK(w >= ctx, "config.json (model_type ", type, "): sliding_window ", w, " is smaller than max_context ",
              ctx, "; sliding-window attention is not implemented, so serve at most max_context = ", w,
              " tokens per sequence");
}

void load_llama_family(WeightSource& src, InferenceModel& m) {
  const InferenceModelConfig& c = m.cfg;
  // This rank's rows and columns (Note [Tensor-parallel shards]): c counts its own heads and FFN columns.
  const int64_t qd = c.n_head * c.head_dim, kvd = c.n_kv_head * c.head_dim, r = m.tp.rank;
  read_vocab_rows(src, "model.embed_tokens.weight", m, m.embed);
  for (int64_t i = 0; i < c.n_layer; i++) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& w = m.layers[size_t(i)];
    src.read(p + "input_layernorm.weight", w.norm1_w);
    src.read(p + "self_attn.q_proj.weight", w.qkv_w.narrow0(0, qd), false, rows_from(r * qd));
    src.read(p + "self_attn.k_proj.weight", w.qkv_w.narrow0(qd, kvd), false, rows_from(r * kvd));
    src.read(p + "self_attn.v_proj.weight", w.qkv_w.narrow0(qd + kvd, kvd), false, rows_from(r * kvd));
    if (c.qkv_bias) {
      src.read(p + "self_attn.q_proj.bias", w.qkv_b.narrow0(0, qd), false, rows_from(r * qd));
      src.read(p + "self_attn.k_proj.bias", w.qkv_b.narrow0(qd, kvd), false, rows_from(r * kvd));
      src.read(p + "self_attn.v_proj.bias", w.qkv_b.narrow0(qd + kvd, kvd), false, rows_from(r * kvd));
    }
    src.read(p + "self_attn.o_proj.weight", w.o_w, false, cols_from(r * qd));
    src.read(p + "post_attention_layernorm.weight", w.norm2_w);
    src.read(p + "mlp.gate_proj.weight", w.up_w.narrow0(0, c.ffn), false, rows_from(r * c.ffn));
    src.read(p + "mlp.up_proj.weight", w.up_w.narrow0(c.ffn, c.ffn), false, rows_from(r * c.ffn));
    src.read(p + "mlp.down_proj.weight", w.down_w, false, cols_from(r * c.ffn));
  }
  src.read("model.norm.weight", m.norm_f_w);
  if (!c.tie_embeddings) read_vocab_rows(src, "lm_head.weight", m, m.lm_head);
}

void read_vocab_rows(WeightSource& src, const std::string& name, const InferenceModel& m, const Tensor& t) {
  src.read(name, t.narrow0(0, m.tp.vocab_rows), false, rows_from(m.tp.vocab_begin));
}

}  // namespace dscpp::inference
