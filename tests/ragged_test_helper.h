// Test-only block bookkeeping for the ragged forward: sequences with their tokens and KV blocks, and the RaggedBatch
// of one step. Blocks are handed out from a shuffled free list, so a sequence's blocks are never contiguous and a
// forward that ignored the block table would read another sequence's K/V. (The engine's real state manager and
// allocator live in src/inference/ragged/.)
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "dscpp/inference/ragged_batch.h"

namespace dscpp::test_fixtures {

class TestBlocks {
 public:
  TestBlocks(int64_t n_blocks, int64_t block_size, int32_t max_blocks_per_seq, uint32_t seed = 1)
      : block_size_(block_size), max_blocks_(max_blocks_per_seq) {
    for (int32_t b = 0; b < int32_t(n_blocks); b++) free_.push_back(b);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
  }
  int add_sequence() {
    seqs_.push_back({});
    return int(seqs_.size()) - 1;
  }
  int64_t seen(int s) const { return seqs_[size_t(s)].seen; }

  // One forward's batch: for each (sequence, new tokens), in order; grows each sequence's blocks to cover them.
  // Call commit() after the forward (the tokens are then cached).
  inference::RaggedBatch step(const std::vector<std::pair<int, std::vector<int32_t>>>& work) {
    inference::RaggedBatch b;
    b.max_blocks_per_seq = max_blocks_;
    b.seq_start.push_back(0);
    pending_.clear();
    for (const auto& [s, toks] : work) {
      Seq& q = seqs_[size_t(s)];
      const int64_t need = (q.seen + int64_t(toks.size()) + block_size_ - 1) / block_size_;
      while (int64_t(q.blocks.size()) < need) {
        q.blocks.push_back(free_.back());
        free_.pop_back();
      }
      for (size_t i = 0; i < toks.size(); i++) {
        b.tokens.push_back(toks[i]);
        b.positions.push_back(int32_t(q.seen + int64_t(i)));
      }
      b.seq_start.push_back(int32_t(b.tokens.size()));
      b.seq_seen.push_back(int32_t(q.seen));
      for (int32_t j = 0; j < max_blocks_; j++)
        b.block_table.push_back(j < int32_t(q.blocks.size()) ? q.blocks[size_t(j)] : -1);
      pending_.emplace_back(s, int64_t(toks.size()));
    }
    return b;
  }
  void commit() {
    for (const auto& [s, n] : pending_) seqs_[size_t(s)].seen += n;
    pending_.clear();
  }

 private:
  struct Seq {
    int64_t seen = 0;
    std::vector<int32_t> blocks;
  };
  int64_t block_size_;
  int32_t max_blocks_;
  std::vector<int32_t> free_;
  std::vector<Seq> seqs_;
  std::vector<std::pair<int, int64_t>> pending_;
};

}  // namespace dscpp::test_fixtures
