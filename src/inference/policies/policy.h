// A policy (DeepSpeed-FastGen's name) is one architecture's mapping from a Hugging Face folder to an InferenceModel:
// how its config.json reads, and which HF tensor fills which of our parameters (its container). The registry
// (registry.cpp) dispatches on config.json's model_type; one file per architecture defines its policy.
#pragma once
#include <nlohmann/json.hpp>

#include "dscpp/inference/inference_model.h"
#include "dscpp/models/model.h"

namespace dscpp::inference {

class WeightSource;  // model/weight_source.h

struct Policy {
  const char* model_type;
  // config.json -> our config, refusing (by field name) what the architecture's forward here does not compute.
  // max_context: the engine's (0 = the model's own).
  InferenceModelConfig (*config)(const nlohmann::json& j, int64_t max_context);
  // Fills every tensor of m (allocated for m.cfg by allocate_weights) from the folder's tensors.
  void (*load)(WeightSource& src, InferenceModel& m);
};

const Policy& gpt2_policy();
const Policy& llama_policy();
const Policy& mistral_policy();
const Policy& qwen2_policy();
const Policy& find_policy(const std::string& model_type);  // refuses an unknown one, listing the supported

// The shapes both model layers agree on: our training ModelConfig (which parses GPT-2's and Llama's config.json,
// rope_scaling included) seen as an inference config.
InferenceModelConfig from_model_config(const ModelConfig& c, const std::string& model_type);
// The Llama family's config.json (Llama, Mistral, Qwen2 share its keys), parsed as Llama's; `type` names errors.
InferenceModelConfig llama_family_config(const nlohmann::json& j, const std::string& type, int64_t max_context);
// The Llama family's tensors: model.embed_tokens, model.layers.<i>.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head; q/k/v biases when cfg.qkv_bias.
void load_llama_family(WeightSource& src, InferenceModel& m);
// t's rows of this rank's vocabulary (the embedding, an untied lm head) from the HF tensor `name`: all of it on one
// rank (Note [Tensor-parallel shards]).
void read_vocab_rows(WeightSource& src, const std::string& name, const InferenceModel& m, const Tensor& t);
// A sliding-window attention model whose window is narrower than the context it would serve: refused by name.
void refuse_sliding_window(const nlohmann::json& j, const std::string& type, int64_t max_context);

}  // namespace dscpp::inference
