// RaggedBatch: what one forward of the inference engine computes, as the host describes it. Several sequences, each
// bringing some new tokens (a prompt chunk, or one decode token), packed end to end with no padding; each sequence's
// earlier tokens are already in the blocked KV cache (kv_cache.h). The state manager builds it (ragged/state_manager.h);
// the model's ragged forward consumes it and returns one logits row per sequence, for its last new token.
#pragma once
#include <cstdint>
#include <vector>

namespace dscpp::inference {

struct RaggedBatch {
  // Per token, sequence after sequence: the token id and its position in its own sequence (seen + i).
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  // Per sequence (n_seqs = seq_start.size() - 1): its new tokens are tokens[seq_start[s], seq_start[s+1]); seq_seen[s]
  // tokens of it are already cached, so after the forward the cache holds seq_seen[s] + n_new(s).
  std::vector<int32_t> seq_start;  // CSR offsets, seq_start[0] = 0
  std::vector<int32_t> seq_seen;
  // Per sequence, the KV-cache blocks that hold (or will hold) tokens 0 .. seen + n_new - 1, in order:
  // block_table[s * max_blocks_per_seq + j] is the block of token positions [j*block_size, (j+1)*block_size); unused
  // entries are -1.
  std::vector<int32_t> block_table;
  int32_t max_blocks_per_seq = 0;

  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int64_t n_seqs() const { return seq_start.empty() ? 0 : int64_t(seq_start.size()) - 1; }
  int64_t n_new(int64_t s) const { return seq_start[s + 1] - seq_start[s]; }
  // The row of tokens/positions whose logits the forward returns for sequence s (its last new token).
  int64_t last_token(int64_t s) const { return seq_start[s + 1] - 1; }
  void validate(int64_t block_size) const;  // throws dscpp::Error on an inconsistent batch (tests, debug builds)
};

}  // namespace dscpp::inference
