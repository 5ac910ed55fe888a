// OpenAI's /v1/completions and /v1/chat/completions request bodies, parsed and validated into what the engine runs.
// Every field is checked for its type and range before any work; a refusal is an ApiError (HTTP 400) naming the
// field. Fields as OpenAI defines them, plus vLLM's top_k, min_p, repetition_penalty and ignore_eos:
//   model, prompt (a string or a list of token ids) | messages, max_tokens | max_completion_tokens (default: what
//   fits in max_context), temperature, top_p, n, stop (a string or a list of up to 4), seed, stream,
//   stream_options.include_usage, logprobs (completions: an int; chat: a bool with top_logprobs), presence_penalty,
//   frequency_penalty, echo (false only), user (ignored).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/inference/sampler.h"

namespace dscpp::serve {

enum class Endpoint { completions, chat };

struct ApiRequest {
  Endpoint endpoint = Endpoint::completions;
  std::vector<int32_t> prompt;      // token ids, ready for the engine
  int64_t max_tokens = 0;           // >= 1
  int64_t n = 1;                    // engine requests, seeds seed, seed + 1, ...
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  std::vector<std::string> stop;    // stop strings, cut from the output
  int64_t logprobs = -1;            // -1: none; else the top alternatives per token (0..20)
  bool ignore_eos = false;          // do not stop at the model's stop ids
  SamplingParams sampling;          // stop_token_ids left to the server
};

// What parsing needs from the server: its model's name, context, vocabulary, prompt encoding and chat rendering.
struct ApiContext {
  std::string model_name;
  int64_t max_context = 0;
  int64_t vocab = 0;
  std::function<std::vector<int32_t>(const std::string&)> encode_prompt;  // completions: text -> ids (with BOS)
  // chat: messages -> ids; throws ApiError for messages the template refuses
  std::function<std::vector<int32_t>(const nlohmann::json& messages, const nlohmann::json& request)> encode_chat;
  std::function<uint64_t()> random_seed;  // for a request without a seed
};

// Throws ApiError (400) for a body that is not a JSON object, a field of the wrong type or out of range, an unknown
// model (404, as OpenAI), a prompt that leaves no room in max_context.
ApiRequest parse_api_request(const std::string& body, Endpoint endpoint, const ApiContext& ctx);

}  // namespace dscpp::serve
