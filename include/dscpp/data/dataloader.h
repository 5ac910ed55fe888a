// DataLoader: fixed-length training sequences from token shards, shuffled per epoch and split across
// data-parallel ranks.
//
// The shards' tokens are one stream. Sequence i is tokens [i*T, i*T + T + 1): inputs are its first T tokens,
// targets the last T, so consecutive sequences share one token and no (input, target) pair is lost. An optional
// validation split holds out the last `val_fraction` of sequences. Each epoch visits the split's sequences in an
// order fixed by (seed, epoch); a global batch is the next B*W positions of that order and rank r takes its r-th
// block of B, so ranks are disjoint and together cover the global batch. A final partial global batch is dropped, so
// every rank takes the same number of steps. The state (epoch, position, seed) resumes exactly, under any B and W
// (Note [Resuming under another global batch], dataloader.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/core/tensor.h"
#include "dscpp/data/shard.h"

namespace dscpp {

struct DataLoaderConfig {
  std::vector<std::string> shards;  // token shard files, in stream order
  int64_t batch_size = 8;           // B: sequences per rank per step
  int64_t seq_len = 1024;           // T
  uint64_t seed = 1234;
  bool shuffle = true;              // false: sequences in stream order (e.g. for evaluation)
  int rank = 0, world_size = 1;
  double val_fraction = 0.0;        // hold out the last fraction of sequences as the validation split
  bool validation = false;          // iterate the held-out split instead of the training split
};

struct DataLoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;  // sequences of the epoch's order already consumed, summed over all ranks
  uint64_t seed = 0;
};

class DataLoader {
 public:
  explicit DataLoader(const DataLoaderConfig& cfg);  // opens and validates every shard

  // tokens, targets: i32 [B, T] (any device; filled through a host buffer when not on the CPU).
  void next_batch(Tensor tokens, Tensor targets);

  DataLoaderState state() const { return {epoch_, position_, seed_}; }
  void set_state(const DataLoaderState& s);

  int64_t num_sequences() const { return int64_t(seq_end_ - seq_begin_); }  // in this split
  int64_t batches_per_epoch() const;  // steps per epoch (same on every rank)
  int64_t total_tokens() const { return total_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  const DataLoaderConfig& config() const { return cfg_; }

 private:
  void read_tokens(int64_t start, int64_t count, int32_t* out) const;  // from the concatenated stream
  void build_order();                                                  // for epoch_

  DataLoaderConfig cfg_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> shard_start_;  // first stream index of each shard, plus the total at the end
  int64_t total_tokens_ = 0, vocab_size_ = 0;
  uint64_t seq_begin_ = 0, seq_end_ = 0;  // this split's sequence range
  std::vector<uint64_t> order_;           // sequence ids in this epoch's order
  uint64_t order_epoch_ = ~uint64_t(0);
  uint64_t epoch_ = 0, position_ = 0, seed_ = 0;
};

}  // namespace dscpp
