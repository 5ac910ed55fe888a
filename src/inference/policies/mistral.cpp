// Mistral: Llama's architecture and tensor names, with sliding-window attention in v0.1 (window 4096 over a 32K
// context). The window is not implemented here, so a window narrower than the context served is refused by name:
// serving at most `sliding_window` tokens per sequence (max_context) makes the window a no-op and the model exact.
#include "inference/policies/policy.h"

namespace dscpp::inference {
namespace {

InferenceModelConfig mistral_config(const nlohmann::json& j, int64_t max_context) {
  refuse_sliding_window(j, "mistral", max_context);
  return llama_family_config(j, "mistral", max_context);
}

}  // namespace

const Policy& mistral_policy() {
  static const Policy p{"mistral", mistral_config, load_llama_family};
  return p;
}

}  // namespace dscpp::inference
