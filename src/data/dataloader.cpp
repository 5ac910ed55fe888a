// DataLoader (design in dataloader.h).
#include "dscpp/data/dataloader.h"

#include <algorithm>
#include <numeric>

#include "dscpp/core/check.h"
#include "dscpp/core/rng.h"

namespace dscpp {

DataLoader::DataLoader(const DataLoaderConfig& cfg) : cfg_(cfg), seed_(cfg.seed) {
  DSCPP_CHECK(!cfg.shards.empty(), "DataLoader: no shard files given");
  DSCPP_CHECK(cfg.batch_size > 0 && cfg.seq_len > 0, "DataLoader: batch_size ", cfg.batch_size, " and seq_len ",
              cfg.seq_len, " must be positive");
  DSCPP_CHECK(cfg.world_size > 0 && cfg.rank >= 0 && cfg.rank < cfg.world_size, "DataLoader: rank ", cfg.rank,
              " outside world_size ", cfg.world_size);
  DSCPP_CHECK(cfg.val_fraction >= 0 && cfg.val_fraction < 1, "DataLoader: val_fraction ", cfg.val_fraction,
              " must be in [0, 1)");
  for (auto& p : cfg.shards) {
    shards_.emplace_back(p);
    const TokenShard& s = shards_.back();
    if (vocab_size_ == 0) vocab_size_ = s.vocab_size();
    DSCPP_CHECK(s.vocab_size() == vocab_size_, "DataLoader: shard ", p, " has vocab size ", s.vocab_size(), ", ",
                cfg.shards[0], " has ", vocab_size_, " (tokenized with different tokenizers?)");
    shard_start_.push_back(total_tokens_);
    total_tokens_ += s.size();
  }
  shard_start_.push_back(total_tokens_);
  const int64_t T = cfg.seq_len;
  const uint64_t n_seq = total_tokens_ > T ? uint64_t((total_tokens_ - 1) / T) : 0;
  const uint64_t n_val = uint64_t(double(n_seq) * cfg.val_fraction);
  seq_begin_ = cfg.validation ? n_seq - n_val : 0;
  seq_end_ = cfg.validation ? n_seq : n_seq - n_val;
  DSCPP_CHECK(batches_per_epoch() > 0, "DataLoader: ", total_tokens_, " tokens make ", num_sequences(), " ",
              cfg.validation ? "validation" : "training", " sequences of ", T, "+1 tokens, fewer than one global batch of ",
              cfg.batch_size, " x ", cfg.world_size, " ranks");
}

int64_t DataLoader::batches_per_epoch() const {
  return num_sequences() / (cfg_.batch_size * cfg_.world_size);
}

// Note [Resuming under another global batch]
// The position counts the epoch's sequences consumed, as Megatron-DeepSpeed's consumed_samples does, and the order
// depends on the seed, the epoch and the split's sequences only, not on B or W: a run resumed with another micro-batch or data-parallel size (another global batch)
// takes its next global batch from that position on, so no sequence of the epoch is skipped or repeated, as
// Megatron's sampler resumes after a batch-size ramp. A position past this layout's last whole global batch starts
// the next epoch (the tail is dropped, as every epoch's is). Only a position beyond the split's sequences is refused:
// that is another corpus or validation split.
void DataLoader::set_state(const DataLoaderState& s) {
  DSCPP_CHECK(s.position <= uint64_t(num_sequences()), "DataLoader: state position ", s.position, " is past the ",
              num_sequences(), " ", cfg_.validation ? "validation" : "training", " sequences of an epoch of this "
              "data (resumed with other data, --seq-len or validation split?)");
  epoch_ = s.epoch;
  position_ = s.position;
  seed_ = s.seed;
  order_epoch_ = ~uint64_t(0);  // the seed may have changed
}

// splitmix64: spreads (seed, epoch) into an independent stream seed.
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void DataLoader::build_order() {
  order_.resize(seq_end_ - seq_begin_);
  std::iota(order_.begin(), order_.end(), seq_begin_);
  if (cfg_.shuffle) {  // Fisher-Yates, the same on every rank
    Rng rng(mix(seed_ ^ mix(epoch_)));
    for (size_t i = order_.size(); i > 1; i--) std::swap(order_[i - 1], order_[rng.below(i)]);
  }
  order_epoch_ = epoch_;
}

void DataLoader::read_tokens(int64_t start, int64_t count, int32_t* out) const {
  size_t s = size_t(std::upper_bound(shard_start_.begin(), shard_start_.end(), start) - shard_start_.begin()) - 1;
  while (count > 0) {
    int64_t off = start - shard_start_[s];
    int64_t n = std::min(count, shards_[s].size() - off);
    shards_[s].read(off, n, out);
    out += n;
    start += n;
    count -= n;
    s++;
  }
}

void DataLoader::next_batch(Tensor tokens, Tensor targets) {
  const int64_t B = cfg_.batch_size, T = cfg_.seq_len;
  for (const Tensor* t : {&tokens, &targets})
    DSCPP_CHECK(t->dtype() == DType::i32 && t->shape() == Shape({B, T}), "DataLoader::next_batch: expected i32[",
                B, ", ", T, "], got ", t->str());
  const uint64_t global = uint64_t(B * cfg_.world_size);
  if (position_ + global > uint64_t(num_sequences())) {  // epoch done
    epoch_++;
    position_ = 0;
  }
  if (order_epoch_ != epoch_) build_order();
  Tensor host_x = tokens.device().is_cpu() ? tokens : Tensor::empty({B, T}, DType::i32);
  Tensor host_y = targets.device().is_cpu() ? targets : Tensor::empty({B, T}, DType::i32);
  int32_t* x = host_x.data<int32_t>();
  int32_t* y = host_y.data<int32_t>();
  std::vector<int32_t> buf(size_t(T + 1));
  for (int64_t b = 0; b < B; b++) {
    uint64_t seq = order_[position_ + uint64_t(cfg_.rank * B + b)];
    read_tokens(int64_t(seq) * T, T + 1, buf.data());
    std::copy(buf.begin(), buf.begin() + T, x + b * T);
    std::copy(buf.begin() + 1, buf.end(), y + b * T);
  }
  position_ += global;
  if (!tokens.device().is_cpu()) tokens.copy_from(host_x);
  if (!targets.device().is_cpu()) targets.copy_from(host_y);
}

}  // namespace dscpp
