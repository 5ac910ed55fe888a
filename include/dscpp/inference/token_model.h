// TokenModel: what the scheduler needs of a model. One forward over a ragged batch that returns the next token of
// each sequence: the engine's implementation runs forward(model, batch, kv_cache) and samples each logits row; tests
// drive the scheduler with a fake.
#pragma once
#include <cstdint>
#include <vector>

#include "dscpp/inference/ragged_batch.h"

namespace dscpp::inference {

class TokenModel {
 public:
  virtual ~TokenModel() = default;
  // Writes the K/V of every new token of `batch` into the cache and returns one token per sequence (batch.n_seqs()):
  // the token after sequence s's last new token, for each s with wants_token[s]; the rest are ignored. A prompt
  // chunk that is not the prompt's last wants none, so a sampler need not draw for it (a seeded stream then does
  // not depend on how the prompt was split). uids[s] names sequence s (its sampling parameters).
  virtual std::vector<int32_t> next_tokens(const RaggedBatch& batch, const std::vector<int64_t>& uids,
                                           const std::vector<uint8_t>& wants_token) = 0;
};

}  // namespace dscpp::inference
