// Qwen2 / Qwen2.5: Llama's architecture and tensor names plus biases on q, k and v (not on o_proj). Its optional
// sliding window (use_sliding_window, off in the released models) is refused like Mistral's when narrower than the
// context.
#include "inference/policies/policy.h"

namespace dscpp::inference {
namespace {

InferenceModelConfig qwen2_config(const nlohmann::json& j, int64_t max_context) {
  refuse_sliding_window(j, "qwen2", max_context);
  InferenceModelConfig c = llama_family_config(j, "qwen2", max_context);
  c.qkv_bias = true;
  return c;
}

}  // namespace

const Policy& qwen2_policy() {
  static const Policy p{"qwen2", qwen2_config, load_llama_family};
  return p;
}

}  // namespace dscpp::inference
