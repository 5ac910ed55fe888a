// SequenceDescriptor: what the engine remembers of one sequence between forwards (FastGen's DSSequenceDescriptor).
#pragma once
#include <cstdint>
#include <vector>

namespace dscpp::inference {

struct SequenceDescriptor {
  int64_t uid = -1;
  int64_t seen_tokens = 0;       // tokens whose K/V are in the cache (forwards that ran)
  int64_t in_flight_tokens = 0;  // tokens of the batch being run; post_forward adds them to seen_tokens
  // KV blocks of positions [0, seen + in_flight), in order: block j holds positions [j*block_size, (j+1)*block_size).
  std::vector<int32_t> blocks;
  // Prefix caching (Note [Prefix cache], prefix_cache.h): the first n_hashed blocks have known keys, the last of
  // which is chain_key; `tail` holds the tokens after them (fewer than a block once post_forward has run).
  int64_t n_hashed = 0;
  uint64_t chain_key = 0;
  std::vector<int32_t> tail;
  int64_t cached_tokens = 0;     // tokens the prefix cache supplied when the sequence started

  int64_t cur_allocated_blocks() const { return int64_t(blocks.size()); }
};

}  // namespace dscpp::inference
