// One API request run on the engine loop, as OpenAI's response: a JSON object, or server-sent events (each
// "data: {chunk}\n\n", then "data: [DONE]\n\n") written as tokens come. Transport-agnostic: the HTTP layer gives the
// body and a write function; tests can drive it without sockets.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/data/tokenizer.h"
#include "dscpp/serve/engine_loop.h"
#include "dscpp/serve/openai_request.h"

namespace dscpp::serve {

struct CompletionContext {
  EngineLoop* loop = nullptr;
  const Tokenizer* tok = nullptr;
  std::vector<int32_t> stop_ids;  // the model's (tokenizer and generation_config.json); not with ignore_eos
  std::string model_name;
};

// The engine requests of r: n of them, seeds seed, seed + 1, ...
std::vector<inference::GenerationRequest> engine_requests(const CompletionContext& c, const ApiRequest& r);

// Queues r's engine requests (throws ApiError 503 when the queue is full); the channel then feeds one of:
std::shared_ptr<Channel> start(const CompletionContext& c, const ApiRequest& r);

// Non-streaming: waits for every choice; returns the response object (with usage). Throws ApiError 500 when the
// engine failed the request.
nlohmann::json complete(const CompletionContext& c, const ApiRequest& r, Channel& ch);

// Streaming: write(event) per server-sent event; a write that returns false (the client is gone) cancels the
// requests at once and returns false.
bool complete_streaming(const CompletionContext& c, const ApiRequest& r, Channel& ch,
                        const std::function<bool(const std::string&)>& write);

}  // namespace dscpp::serve
