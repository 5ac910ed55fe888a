// Llama 2 and 3.x (rope_scaling "llama3" included; other scalings are refused by name in ModelConfig's parser).
// Llama's optional attention_bias / mlp_bias are refused: no released Llama sets them.
#include "dscpp/core/check.h"
#include "inference/policies/policy.h"

namespace dscpp::inference {
namespace {

InferenceModelConfig llama_config(const nlohmann::json& j, int64_t max_context) {
  for (const char* key : {"attention_bias", "mlp_bias"})
    DSCPP_CHECK(!j.contains(key) || !j.at(key).get<bool>(), "config.json (model_type llama): ", key,
                " = true is not supported");
  return llama_family_config(j, "llama", max_context);
}

}  // namespace

const Policy& llama_policy() {
  static const Policy p{"llama", llama_config, load_llama_family};
  return p;
}

}  // namespace dscpp::inference
