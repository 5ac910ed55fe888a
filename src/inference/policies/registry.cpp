// The policy registry: config.json's model_type -> its policy (DeepSpeed's build_hf_engine dispatch).
#include <string>
#include <vector>

#include "dscpp/core/check.h"
#include "inference/policies/policy.h"

namespace dscpp::inference {
namespace {
const std::vector<const Policy*>& policies() {
  static const std::vector<const Policy*> all{&gpt2_policy(), &llama_policy(), &mistral_policy(), &qwen2_policy()};
  return all;
}
}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const Policy* p : policies()) out.push_back(p->model_type);
  return out;
}

const Policy& find_policy(const std::string& model_type) {
  std::string names;
  for (const Policy* p : policies()) {
    if (model_type == p->model_type) return *p;
    names += (names.empty() ? "" : ", ") + std::string(p->model_type);
  }
  DSCPP_FAIL("config.json: model_type '", model_type, "' is not supported by the inference engine (supported: ",
             names, ")");
}

InferenceModelConfig inference_config_from_hf(const nlohmann::json& j, int64_t max_context) {
  DSCPP_CHECK(j.is_object() && j.contains("model_type") && j.at("model_type").is_string(),
              "config.json: no model_type (a string) to choose the model's policy by");
  InferenceModelConfig c = find_policy(j.at("model_type").get<std::string>()).config(j, max_context);
  c.validate();
  return c;
}

}  // namespace dscpp::inference
