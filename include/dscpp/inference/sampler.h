// Token sampling from a logits row: greedy, or temperature / top-k / top-p (nucleus), seeded.
#pragma once
#include <cstdint>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "dscpp/models/model.h"

namespace dscpp {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

// Picks one token from logits[V] (f32). Rng advances by one draw unless greedy.
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng);

// Autoregressive generation with the model's full forward (no KV cache: the CPU reference path). Returns the prompt
// followed by up to max_new_tokens tokens; stops early at stop_token (when >= 0). The context is cropped to the
// model's max_seq_len from the left. on_token is called with each new token (streaming), when given.
std::vector<int32_t> generate(Model& model, std::vector<int32_t> prompt, int64_t max_new_tokens,
                              const SamplingParams& p, int32_t stop_token = -1,
                              void (*on_token)(int32_t, void*) = nullptr, void* user = nullptr);
// The same, stopping at any of stop_tokens (Llama 3 instruct ends a turn with <|eot_id|>, the text with
// <|end_of_text|>: Tokenizer::stop_ids).
std::vector<int32_t> generate(Model& model, std::vector<int32_t> prompt, int64_t max_new_tokens,
                              const SamplingParams& p, const std::vector<int32_t>& stop_tokens,
                              void (*on_token)(int32_t, void*) = nullptr, void* user = nullptr);

}  // namespace dscpp
