// A generation request as the scheduler takes it, and the tokens it hands back, one event per generated token.
#pragma once
#include <cstdint>
#include <vector>

namespace dscpp::inference {

struct Request {
  int64_t uid = -1;                     // the caller's name for it, unique among requests in the scheduler
  std::vector<int32_t> prompt;          // >= 1 token
  int64_t max_new_tokens = 1;           // >= 1; prompt + max_new_tokens <= state_manager.max_context
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
};

enum class FinishReason { none, length, stop };  // still going, max_new_tokens reached, a stop token emitted

struct TokenEvent {
  int64_t uid = -1;
  int32_t token = -1;
  FinishReason finished = FinishReason::none;  // != none: the request is done and its state flushed
};

}  // namespace dscpp::inference
