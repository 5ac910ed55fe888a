// Token sampling from a logits row, one implementation for the CLI and the engine (the server later). Semantics:
//   1. penalties on the raw logits: repetition (Hugging Face's RepetitionPenaltyLogitsProcessor: every token of
//      prompt + output once, l > 0 ? l / r : l * r), then presence and frequency (OpenAI's, as vLLM: output tokens
//      only, l -= frequency * count + presence * (count > 0));
//   2. temperature 0: argmax (ties to the lower id). Else w_i = exp((l_i - max l) / temperature) and the candidates
//      are the tokens with l_i >= T, T the largest of: top_k's threshold (the top_k-th largest logit, its ties
//      kept), top_p's (the largest tau such that the w-mass of {l >= tau} reaches top_p times the mass of the top-k
//      set, as HF applies TopP after TopK; ties at tau kept), and min_p's (w >= min_p * w_max);
//   3. one uniform u in [0, 1) picks the token by inverse CDF over the candidates in ascending id order: the first
//      whose cumulative w exceeds u times the candidates' sum.
// A threshold and an id-ordered draw let a GPU kernel find the same token with a radix select and a block scan,
// without sorting 128K logits (include/dscpp/kernels/sampling_ops.h holds the ops: the one implementation, CPU
// and CUDA). u is Philox(seed, counter = the request's step), so the draw depends on the seed and the step only.
// Log-probabilities (requested with logprobs >= 0) are of the raw logits, log_softmax before any penalty or
// temperature: what vLLM returns by default and what a client compares across sampling settings.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "dscpp/core/rng.h"
#include "dscpp/core/tensor.h"
#include "dscpp/models/model.h"

namespace dscpp {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy (argmax)
  int64_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off (HF; > 1 discourages repeats)
  float presence_penalty = 0.0f;    // OpenAI, in [-2, 2]
  float frequency_penalty = 0.0f;   // OpenAI, in [-2, 2]
  uint64_t seed = 0;
  std::vector<int32_t> stop_token_ids;  // sampling one of these ends the request (it is returned)
  int64_t logprobs = -1;                // -1: none; n >= 0: the chosen token's and the n most likely tokens'
  void validate() const;                // throws dscpp::Error naming the field, its value and the rule
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};
struct SampleResult {
  int32_t token = -1;
  bool stop = false;              // token is one of stop_token_ids
  float logprob = 0.0f;           // logprobs >= 0 only
  std::vector<TokenLogprob> top;  // the logprobs most likely tokens, most likely first
};

// One request's sampler: its parameters, its step counter (the RNG counter) and the token counts penalties read.
class SequenceSampler {
 public:
  SequenceSampler(SamplingParams p, const std::vector<int32_t>& prompt);
  // Samples from logits[V] (f32, host) and records the token: the engine's batch sampler on this one row.
  SampleResult sample(const float* logits, int64_t V);
  // Records a sampled token as output: advances the step, counts the token for the penalties and says whether it
  // stops the request. The log-probabilities are the caller's to fill.
  SampleResult record(int32_t token);
  bool penalized() const;  // some penalty is on
  // Every token of the prompt and the output once, with its count in the output (0: the prompt's only).
  const std::map<int32_t, int32_t>& history() const { return history_; }
  const SamplingParams& params() const { return p_; }
  int64_t steps() const { return step_; }

 private:
  SamplingParams p_;
  std::map<int32_t, int32_t> history_;
  int64_t step_ = 0;
};

// Autoregressive generation with the model's full forward (no KV cache: the CPU reference path). Returns the prompt
// followed by up to max_new_tokens tokens; stops early at stop_token (when >= 0) or any of p.stop_token_ids. The
// context is cropped to the model's max_seq_len from the left. on_token is called with each new token (streaming).
std::vector<int32_t> generate(Model& model, std::vector<int32_t> prompt, int64_t max_new_tokens,
                              const SamplingParams& p, int32_t stop_token = -1,
                              void (*on_token)(int32_t, void*) = nullptr, void* user = nullptr);
// The same, stopping at any of stop_tokens too (Llama 3 instruct ends a turn with <|eot_id|>, the text with
// <|end_of_text|>: Tokenizer::stop_ids).
std::vector<int32_t> generate(Model& model, std::vector<int32_t> prompt, int64_t max_new_tokens,
                              const SamplingParams& p, const std::vector<int32_t>& stop_tokens,
                              void (*on_token)(int32_t, void*) = nullptr, void* user = nullptr);

}  // namespace dscpp
