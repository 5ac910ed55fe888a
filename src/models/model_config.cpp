// ModelConfig: validation, presets, Hugging Face config.json mapping, FLOPs; checkpoint_every.
#include <cmath>

#include "decoder.h"

namespace dscpp {

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    DSCPP_CHECK(v > 0, "model config: ", field, " must be positive, got ", v);
  };
  DSCPP_CHECK(arch == "gpt2" || arch == "llama", "model config: arch must be \"gpt2\" or \"llama\", got \"", arch,
              "\"");
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("n_embd", n_embd);
  positive("n_ffn", n_ffn);
  positive("vocab_size", vocab_size);
  positive("max_seq_len", max_seq_len);
  DSCPP_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "model config: norm_eps must be positive, got ", norm_eps);
  DSCPP_CHECK(n_embd % n_head == 0, "model config: n_embd (", n_embd, ") must be divisible by n_head (", n_head,
              ")");
  DSCPP_CHECK(n_head % n_kv_head == 0, "model config: n_head (", n_head, ") must be divisible by n_kv_head (",
              n_kv_head, ")");
  DSCPP_CHECK(vocab_size < (int64_t(1) << 31), "model config: vocab_size ", vocab_size, " does not fit i32 ids");
  if (arch == "gpt2") {
    DSCPP_CHECK(n_kv_head == n_head, "model config: gpt2 needs n_kv_head == n_head (", n_head, "), got ",
                n_kv_head);
    DSCPP_CHECK(tie_embeddings, "model config: gpt2 ties lm_head to wte, tie_embeddings must be true");
    DSCPP_CHECK(!rope_scaling.enabled(), "model config: rope_scaling is for Llama (gpt2 has no RoPE)");
  } else {
    DSCPP_CHECK(head_dim() % 2 == 0, "model config: RoPE needs an even head_dim (n_embd / n_head), got ",
                head_dim());
    DSCPP_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "model config: rope_theta must be positive, got ",
                rope_theta);
    const RopeScaling& s = rope_scaling;
    DSCPP_CHECK(s.factor == 0 || (s.factor >= 1 && std::isfinite(s.factor)), "model config: rope_scaling.factor must "
                "be >= 1 (or 0: none), got ", s.factor);
    DSCPP_CHECK(!s.enabled() || (s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                                 s.original_max_position > 0),
                "model config: rope_scaling needs 0 < low_freq_factor < high_freq_factor and "
                "original_max_position_embeddings > 0, got ", s.low_freq_factor, ", ", s.high_freq_factor, ", ",
                s.original_max_position);
  }
}

namespace {
ModelConfig gpt2_config(int64_t L, int64_t H, int64_t C, int64_t V, int64_t T) {
  ModelConfig c;
  c.arch = "gpt2";
  c.n_layer = L;
  c.n_head = c.n_kv_head = H;
  c.n_embd = C;
  c.n_ffn = 4 * C;
  c.vocab_size = V;
  c.max_seq_len = T;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = true;
  return c;
}
ModelConfig llama_config(int64_t L, int64_t C, int64_t H, int64_t Hkv, int64_t F, int64_t V, int64_t T,
                         float theta, bool tied) {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = H;
  c.n_kv_head = Hkv;
  c.n_ffn = F;
  c.vocab_size = V;
  c.max_seq_len = T;
  c.rope_theta = theta;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = tied;
  return c;
}
}  // namespace

std::vector<std::string> ModelConfig::preset_names() {
  return {"gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-tiny", "llama-1b"};
}

ModelConfig ModelConfig::preset(const std::string& name) {
  // gpt2-tiny: the default training run on 2 CPU cores (~1M parameters).
  if (name == "gpt2-tiny") return gpt2_config(4, 4, 128, 2048, 128);
  if (name == "gpt2") return gpt2_config(12, 12, 768, 50257, 1024);
  if (name == "gpt2-medium") return gpt2_config(24, 16, 1024, 50257, 1024);
  if (name == "gpt2-large") return gpt2_config(36, 20, 1280, 50257, 1024);
  if (name == "gpt2-xl") return gpt2_config(48, 25, 1600, 50257, 1024);
  if (name == "llama-tiny") return llama_config(4, 128, 4, 2, 352, 2048, 128, 10000.0f, false);
  if (name == "llama-1b") return llama_config(16, 2048, 32, 8, 8192, 32000, 1024, 500000.0f, true);
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  DSCPP_FAIL("unknown model preset '", name, "' (known: ", names, ")");
}

nlohmann::json ModelConfig::to_hf_json() const {
  validate();
  nlohmann::json j;
  if (arch == "gpt2") {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_layer"] = n_layer;
    j["n_head"] = n_head;
    j["n_embd"] = n_embd;
    j["n_inner"] = n_ffn;
    j["vocab_size"] = vocab_size;
    j["n_positions"] = max_seq_len;
    j["n_ctx"] = max_seq_len;
    j["layer_norm_epsilon"] = norm_eps;
    j["activation_function"] = "gelu_new";
    j["tie_word_embeddings"] = true;
  } else {
    j["model_type"] = "llama";
    j["architectures"] = {"LlamaForCausalLM"};
    j["num_hidden_layers"] = n_layer;
    j["num_attention_heads"] = n_head;
    j["num_key_value_heads"] = n_kv_head;
    j["hidden_size"] = n_embd;
    j["intermediate_size"] = n_ffn;
    j["vocab_size"] = vocab_size;
    j["max_position_embeddings"] = max_seq_len;
    j["rms_norm_eps"] = norm_eps;
    j["rope_theta"] = rope_theta;
    if (rope_scaling.enabled())
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", rope_scaling.factor},
                           {"low_freq_factor", rope_scaling.low_freq_factor},
                           {"high_freq_factor", rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", int64_t(rope_scaling.original_max_position)}};
    j["tie_word_embeddings"] = tie_embeddings;
    j["hidden_act"] = "silu";
    j["head_dim"] = head_dim();
  }
  return j;
}

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, bool shapes_only) {
  DSCPP_CHECK(j.is_object() && j.contains("model_type"), "HF config: no model_type");
  const std::string type = j.at("model_type").get<std::string>();
  auto get = [&](const char* key) -> const nlohmann::json& {
    DSCPP_CHECK(j.contains(key) && !j.at(key).is_null(), "HF config (", type, "): missing field '", key, "'");
    return j.at(key);
  };
  auto has = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  ModelConfig c;
  if (type == "gpt2") {
    c.arch = "gpt2";
    c.n_layer = get("n_layer").get<int64_t>();
    c.n_head = c.n_kv_head = get("n_head").get<int64_t>();
    c.n_embd = get("n_embd").get<int64_t>();
    c.n_ffn = has("n_inner") ? j.at("n_inner").get<int64_t>() : 4 * c.n_embd;
    c.vocab_size = get("vocab_size").get<int64_t>();
    c.max_seq_len = has("n_positions") ? j.at("n_positions").get<int64_t>() : get("n_ctx").get<int64_t>();
    c.norm_eps = has("layer_norm_epsilon") ? j.at("layer_norm_epsilon").get<float>() : 1e-5f;
    c.tie_embeddings = has("tie_word_embeddings") ? j.at("tie_word_embeddings").get<bool>() : true;
    if (has("activation_function")) {
      auto act = j.at("activation_function").get<std::string>();
      DSCPP_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", "HF config (gpt2): activation_function '", act,
                  "' is not supported (tanh GELU only)");
    }
  } else if (type == "llama") {
    c.arch = "llama";
    c.n_layer = get("num_hidden_layers").get<int64_t>();
    c.n_head = get("num_attention_heads").get<int64_t>();
    c.n_kv_head = has("num_key_value_heads") ? j.at("num_key_value_heads").get<int64_t>() : c.n_head;
    c.n_embd = get("hidden_size").get<int64_t>();
    c.n_ffn = get("intermediate_size").get<int64_t>();
    c.vocab_size = get("vocab_size").get<int64_t>();
    c.max_seq_len = get("max_position_embeddings").get<int64_t>();
    c.norm_eps = has("rms_norm_eps") ? j.at("rms_norm_eps").get<float>() : 1e-6f;
    // transformers 5 writes "rope_parameters" ({"rope_type", "rope_theta", and the scaling's fields}); 4 wrote
    // "rope_theta" and "rope_scaling". Read either.
    const bool v5 = has("rope_parameters") && j.at("rope_parameters").is_object();
    const nlohmann::json& rp = v5 ? j.at("rope_parameters") : j;
    c.rope_theta = has("rope_theta")                             ? j.at("rope_theta").get<float>()
                   : v5 && rp.contains("rope_theta") && !rp.at("rope_theta").is_null() ? rp.at("rope_theta").get<float>()
                                                                                      : 10000.0f;
    c.tie_embeddings = has("tie_word_embeddings") ? j.at("tie_word_embeddings").get<bool>() : false;
    const nlohmann::json* scaling = has("rope_scaling") ? &j.at("rope_scaling") : v5 ? &rp : nullptr;
    const std::string no_type = scaling == &rp ? "default" : "(none)";  // rope_parameters name the plain rope default
    const std::string kind = scaling ? scaling->value("rope_type", scaling->value("type", no_type)) : "";
    if (scaling && kind != "default") {
      const nlohmann::json& rs = *scaling;
      const std::string type = kind;
      // Other kinds (linear, dynamic, yarn, longrope) would need other rotary angles than ours.
      DSCPP_CHECK(type == "llama3" || shapes_only, "HF config (llama): rope_scaling.rope_type '", type,
                  "' is not supported (llama3 only)");
      if (type == "llama3") {
        auto num = [&](const char* key) {
          DSCPP_CHECK(rs.contains(key) && rs.at(key).is_number(), "HF config (llama): rope_scaling (llama3) needs a "
                      "number '", key, "'");
          return rs.at(key).get<float>();
        };
        c.rope_scaling.factor = num("factor");
        c.rope_scaling.low_freq_factor = num("low_freq_factor");
        c.rope_scaling.high_freq_factor = num("high_freq_factor");
        c.rope_scaling.original_max_position = num("original_max_position_embeddings");
      }
    }
    DSCPP_CHECK(!has("head_dim") || j.at("head_dim").get<int64_t>() * c.n_head == c.n_embd,
                "HF config (llama): head_dim must be hidden_size / num_attention_heads");
    if (has("hidden_act")) {
      auto act = j.at("hidden_act").get<std::string>();
      DSCPP_CHECK(act == "silu", "HF config (llama): hidden_act '", act, "' is not supported (silu only)");
    }
  } else {
    DSCPP_FAIL("HF config: model_type '", type, "' is not supported (gpt2, llama)");
  }
  c.validate();
  return c;
}

std::vector<ParamInfo> ModelConfig::tensor_table() const {
  validate();
  ParamSet ps;
  declare_layers(ps, *this, TensorParallel{});
  return ps.infos();
}

int64_t ModelConfig::num_parameters() const {
  int64_t n = 0;
  for (const ParamInfo& p : tensor_table()) n += p.numel;
  return n;
}

double ModelConfig::train_flops_per_token(int64_t T) const {
  return 6.0 * double(num_parameters()) + 6.0 * double(n_layer) * double(n_embd) * double(T);
}

CheckpointPolicy checkpoint_every(int64_t n_layer, int64_t number_checkpoints) {
  DSCPP_CHECK(n_layer >= 0, "checkpoint_every: n_layer must be >= 0, got ", n_layer);
  CheckpointPolicy p(size_t(n_layer), false);
  if (number_checkpoints <= 0 || n_layer == 0) return p;
  const int64_t k = (n_layer + number_checkpoints - 1) / number_checkpoints;
  for (int64_t l = 0; l < n_layer; l += k) p[size_t(l)] = true;
  return p;
}

}  // namespace dscpp
