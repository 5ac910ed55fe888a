// StateManager: the host side of FastGen's ragged engine (DSStateManager plus the scheduling half of
// InferenceEngineV2): sequences by uid, the KV blocks each holds, the prefix cache, and the RaggedBatch of one put.
//
// One forward, as the engine runs it:
//   const RaggedBatch& b = sm.put(uids, tokens);  // checks (can_schedule), allocates blocks, builds the batch
//   logits = forward(model, b, kv_cache);          // writes K/V of the new tokens, one logits row per sequence
//   sm.post_forward();                             // seen += in_flight; full blocks become shareable
// and sm.flush(uid) when a sequence ends. A new sequence may first take cached blocks with match_prefix(uid,
// prompt) and then put only the prompt's remaining tokens.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dscpp/inference/inference_config.h"
#include "dscpp/inference/ragged_batch.h"
#include "dscpp/inference/scheduling.h"
#include "inference/ragged/block_allocator.h"
#include "inference/ragged/prefix_cache.h"
#include "inference/ragged/sequence.h"

namespace dscpp::inference {

class StateManager {
 public:
  StateManager(const StateManagerConfig& config, int32_t n_blocks, int64_t block_size, bool prefix_caching);

  // FastGen's verdict on a hypothetical forward of lengths[i] new tokens for uids[i] (unknown uids are new
  // sequences). Checks in FastGen's order; SequenceTokenLimitExceeded (seen + new > max_context) is ours.
  SchedulingResult can_schedule(const std::vector<int64_t>& uids, const std::vector<int64_t>& lengths) const;
  // (tokens, blocks): how many of max_request_tokens the sequence can take with at most max_request_blocks new
  // blocks, and the blocks that needs (FastGen's get_kv_requirements; (0, 0) for an unknown uid when no more
  // sequences can be tracked).
  std::pair<int64_t, int64_t> query(int64_t uid, int64_t max_request_tokens, int64_t max_request_blocks) const;
  // Free slots in the sequence's last block (0 for an unknown uid).
  int64_t get_remaining_block_capacity(int64_t uid) const;

  // Starts sequence uid (unknown so far) with the longest run of cached full blocks that prompt begins with, always
  // leaving its last token to compute (its logits give the first new token). Returns the tokens supplied (seen).
  int64_t match_prefix(int64_t uid, const std::vector<int32_t>& prompt);
  // Builds the batch of one forward: each uid brings tokens[i] (>= 1). Throws SchedulingError (naming the code and
  // the numbers) when can_schedule fails, dscpp::Error for a malformed call; either way nothing changes.
  const RaggedBatch& put(const std::vector<int64_t>& uids, const std::vector<std::vector<int32_t>>& tokens);
  void post_forward();  // after the forward of the last put
  // Instead of post_forward when the forward failed: the put is undone (its new blocks freed, new sequences
  // forgotten), so the engine can report the error and go on serving the other sequences.
  void abort_forward();
  void flush(int64_t uid);  // forgets the sequence; its blocks are freed (or parked, when registered)

  const SequenceDescriptor* get(int64_t uid) const;  // nullptr when not tracked
  std::vector<int64_t> tracked_uids() const;         // sorted
  int64_t n_tracked() const { return int64_t(seqs_.size()); }
  int64_t free_blocks() const { return alloc_.n_free() + cache_.n_parked(); }  // free or evictable
  int32_t n_blocks() const { return alloc_.n_blocks(); }
  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  const StateManagerConfig& config() const { return config_; }
  int32_t refcount(int32_t block) const { return refcount_[size_t(block)]; }
  bool batch_in_flight() const { return in_flight_; }

  struct Stats {
    int64_t prefix_hit_blocks = 0;   // blocks match_prefix found in the cache
    int64_t prefix_miss_blocks = 0;  // full prompt blocks it looked for and did not find
    int64_t evictions = 0;           // parked blocks reclaimed for new allocations
  };
  const Stats& stats() const { return stats_; }
  // Every block free xor held (refcount = holders) xor parked; every sequence's blocks cover its tokens; no shared
  // block is written. Throws dscpp::Error naming the first broken rule (tests; cheap enough for debug runs).
  void check_invariants() const;

 private:
  SchedulingResult check(const std::vector<int64_t>& uids, const std::vector<int64_t>& lengths,
                         std::string* why) const;
  std::pair<int64_t, int64_t> kv_requirements(const SequenceDescriptor& s, int64_t n, int64_t max_blocks) const;
  std::vector<int32_t> take_blocks(int64_t n);  // evicts parked blocks when the allocator is short
  void release(int32_t block);
  void register_full_blocks(SequenceDescriptor& s);

  StateManagerConfig config_;
  int64_t block_size_;
  bool prefix_caching_;
  BlockAllocator alloc_;
  PrefixCache cache_;
  std::vector<int32_t> refcount_;  // per block: sequences holding it
  std::unordered_map<int64_t, SequenceDescriptor> seqs_;
  RaggedBatch batch_;
  std::vector<int64_t> batch_uids_;
  bool in_flight_ = false;
  Stats stats_;
};

}  // namespace dscpp::inference
