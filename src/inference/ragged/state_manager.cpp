#include "inference/ragged/state_manager.h"

#include <algorithm>
#include <unordered_set>

#include "dscpp/core/check.h"

namespace dscpp::inference {

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

StateManager::StateManager(const StateManagerConfig& config, int32_t n_blocks, int64_t block_size,
                           bool prefix_caching)
    : config_(config),
      block_size_(block_size),
      prefix_caching_(prefix_caching),
      alloc_(n_blocks),
      cache_(prefix_caching ? n_blocks : 0, block_size),
      refcount_(size_t(n_blocks), 0) {
  DSCPP_CHECK(block_size > 0, "StateManager: block size ", block_size, " must be > 0");
  batch_.max_blocks_per_seq = int32_t(ceil_div(config.max_context, block_size));
}

const SequenceDescriptor* StateManager::get(int64_t uid) const {
  auto it = seqs_.find(uid);
  return it == seqs_.end() ? nullptr : &it->second;
}

std::vector<int64_t> StateManager::tracked_uids() const {
  std::vector<int64_t> out;
  for (const auto& [uid, s] : seqs_) out.push_back(uid);
  std::sort(out.begin(), out.end());
  return out;
}

// FastGen's dense-cache rule: the blocks needed are ceil((seen + n) / block_size) - allocated; when more than
// max_blocks, the tokens that fit in allocated + max_blocks blocks.
std::pair<int64_t, int64_t> StateManager::kv_requirements(const SequenceDescriptor& s, int64_t n,
                                                          int64_t max_blocks) const {
  int64_t need = ceil_div(s.seen_tokens + n, block_size_) - s.cur_allocated_blocks();
  if (need <= max_blocks) return {n, std::max<int64_t>(need, 0)};
  return {(max_blocks + s.cur_allocated_blocks()) * block_size_ - s.seen_tokens, max_blocks};
}

std::pair<int64_t, int64_t> StateManager::query(int64_t uid, int64_t max_request_tokens,
                                                int64_t max_request_blocks) const {
  const SequenceDescriptor* s = get(uid);
  SequenceDescriptor placeholder;
  if (!s) {
    if (n_tracked() >= config_.max_tracked_sequences) return {0, 0};
    s = &placeholder;
  }
  return kv_requirements(*s, max_request_tokens, max_request_blocks);
}

int64_t StateManager::get_remaining_block_capacity(int64_t uid) const {
  const SequenceDescriptor* s = get(uid);
  return s ? s->cur_allocated_blocks() * block_size_ - s->seen_tokens : 0;
}

SchedulingResult StateManager::can_schedule(const std::vector<int64_t>& uids,
                                            const std::vector<int64_t>& lengths) const {
  return check(uids, lengths, nullptr);
}

SchedulingResult StateManager::check(const std::vector<int64_t>& uids, const std::vector<int64_t>& lengths,
                                     std::string* why) const {
  DSCPP_CHECK(uids.size() == lengths.size(), "can_schedule: ", uids.size(), " uids but ", lengths.size(),
              " lengths");
  auto say = [&](SchedulingResult r, const std::string& msg) {
    if (why) *why = msg;
    return r;
  };
  const StateManagerConfig& c = config_;
  if (int64_t(uids.size()) > c.max_ragged_sequence_count)
    return say(SchedulingResult::BatchSequenceLimitExceeded,
               std::to_string(uids.size()) + " sequences in one batch, state_manager.max_ragged_sequence_count is " +
                   std::to_string(c.max_ragged_sequence_count));
  int64_t cur_seqs = n_tracked(), free = free_blocks(), batch_len = 0;
  SequenceDescriptor placeholder;
  for (size_t i = 0; i < uids.size(); i++) {
    const SequenceDescriptor* s = get(uids[i]);
    if (!s) {
      cur_seqs++;
      s = &placeholder;
    }
    if (s->seen_tokens + lengths[i] > c.max_context)
      return say(SchedulingResult::SequenceTokenLimitExceeded,
                 "sequence " + std::to_string(uids[i]) + " would hold " + std::to_string(s->seen_tokens) + " + " +
                     std::to_string(lengths[i]) + " tokens, state_manager.max_context is " +
                     std::to_string(c.max_context));
    auto [tokens, blocks] = kv_requirements(*s, lengths[i], free);
    if (tokens != lengths[i])
      return say(SchedulingResult::KVCacheLimitExceeded,
                 "sequence " + std::to_string(uids[i]) + " needs " +
                     std::to_string(ceil_div(s->seen_tokens + lengths[i], block_size_) - s->cur_allocated_blocks()) +
                     " more KV blocks for " + std::to_string(lengths[i]) + " tokens, " + std::to_string(free) +
                     " are left of " + std::to_string(n_blocks()));
    batch_len += lengths[i];
    free -= blocks;
  }
  if (cur_seqs > c.max_tracked_sequences)
    return say(SchedulingResult::EngineSequenceLimitExceeded,
               "the batch would make " + std::to_string(cur_seqs) +
                   " tracked sequences, state_manager.max_tracked_sequences is " +
                   std::to_string(c.max_tracked_sequences));
  if (batch_len > c.max_ragged_batch_size)
    return say(SchedulingResult::BatchTokenLimitExceeded,
               std::to_string(batch_len) + " tokens in one batch, state_manager.max_ragged_batch_size is " +
                   std::to_string(c.max_ragged_batch_size));
  return SchedulingResult::Success;
}

std::vector<int32_t> StateManager::take_blocks(int64_t n) {
  while (alloc_.n_free() < n && cache_.n_parked() > 0) {
    alloc_.free({cache_.evict()});
    stats_.evictions++;
  }
  std::vector<int32_t> out = alloc_.allocate(int32_t(n));
  for (int32_t b : out) refcount_[size_t(b)] = 1;
  return out;
}

void StateManager::release(int32_t b) {
  DSCPP_CHECK(refcount_[size_t(b)] > 0, "StateManager: block ", b, " released but nobody holds it");
  if (--refcount_[size_t(b)] > 0) return;
  if (prefix_caching_ && cache_.registered(b)) cache_.park(b);
  else alloc_.free({b});
}

int64_t StateManager::match_prefix(int64_t uid, const std::vector<int32_t>& prompt) {
  DSCPP_CHECK(!in_flight_, "match_prefix(", uid, "): a batch is in flight (call post_forward first)");
  DSCPP_CHECK(!get(uid), "match_prefix: sequence ", uid, " is already tracked");
  if (n_tracked() >= config_.max_tracked_sequences)
    throw SchedulingError(SchedulingResult::EngineSequenceLimitExceeded,
                          "sequence " + std::to_string(uid) + " would be tracked sequence " +
                              std::to_string(n_tracked() + 1) + ", state_manager.max_tracked_sequences is " +
                              std::to_string(config_.max_tracked_sequences));
  SequenceDescriptor& s = seqs_[uid];
  s.uid = uid;
  if (!prefix_caching_ || prompt.empty()) return 0;
  int64_t max_blocks = (int64_t(prompt.size()) - 1) / block_size_;  // the last token is always computed
  for (int64_t j = 0; j < max_blocks; j++) {
    const int32_t* toks = prompt.data() + j * block_size_;
    uint64_t key = PrefixCache::chain(s.chain_key, toks, block_size_);
    int32_t b = cache_.lookup(key, s.chain_key, toks);
    if (b < 0) {
      stats_.prefix_miss_blocks += max_blocks - j;
      break;
    }
    if (refcount_[size_t(b)] == 0) cache_.unpark(b);
    refcount_[size_t(b)]++;
    s.blocks.push_back(b);
    s.chain_key = key;
    s.n_hashed++;
    stats_.prefix_hit_blocks++;
  }
  s.seen_tokens = s.cached_tokens = s.n_hashed * block_size_;
  return s.seen_tokens;
}

const RaggedBatch& StateManager::put(const std::vector<int64_t>& uids,
                                     const std::vector<std::vector<int32_t>>& tokens) {
  DSCPP_CHECK(!in_flight_, "put: the previous batch is still in flight (call post_forward first)");
  DSCPP_CHECK(uids.size() == tokens.size(), "put: ", uids.size(), " uids but ", tokens.size(), " token lists");
  std::vector<int64_t> lengths(uids.size());
  std::unordered_set<int64_t> distinct;
  for (size_t i = 0; i < uids.size(); i++) {
    DSCPP_CHECK(!tokens[i].empty(), "put: sequence ", uids[i], " brings no tokens");
    DSCPP_CHECK(distinct.insert(uids[i]).second, "put: sequence ", uids[i], " appears twice in one batch");
    lengths[i] = int64_t(tokens[i].size());
  }
  std::string why;
  SchedulingResult r = check(uids, lengths, &why);
  if (r != SchedulingResult::Success) throw SchedulingError(r, why);

  RaggedBatch& b = batch_;
  b.tokens.clear();
  b.positions.clear();
  b.seq_start.assign(1, 0);
  b.seq_seen.clear();
  b.block_table.assign(uids.size() * size_t(b.max_blocks_per_seq), -1);
  for (size_t i = 0; i < uids.size(); i++) {
    SequenceDescriptor& s = seqs_[uids[i]];
    s.uid = uids[i];
    int64_t need = ceil_div(s.seen_tokens + lengths[i], block_size_) - s.cur_allocated_blocks();
    std::vector<int32_t> fresh = take_blocks(std::max<int64_t>(need, 0));
    s.blocks.insert(s.blocks.end(), fresh.begin(), fresh.end());
    s.in_flight_tokens = lengths[i];
    if (prefix_caching_) s.tail.insert(s.tail.end(), tokens[i].begin(), tokens[i].end());
    for (int64_t t = 0; t < lengths[i]; t++) {
      b.tokens.push_back(tokens[i][size_t(t)]);
      b.positions.push_back(int32_t(s.seen_tokens + t));
    }
    b.seq_start.push_back(int32_t(b.tokens.size()));
    b.seq_seen.push_back(int32_t(s.seen_tokens));
    std::copy(s.blocks.begin(), s.blocks.end(), b.block_table.begin() + ptrdiff_t(i * size_t(b.max_blocks_per_seq)));
  }
  batch_uids_ = uids;
  in_flight_ = true;
  return b;
}

void StateManager::register_full_blocks(SequenceDescriptor& s) {
  int64_t full = 0;
  while (int64_t(s.tail.size()) - full >= block_size_) {
    const int32_t* toks = s.tail.data() + full;
    uint64_t key = PrefixCache::chain(s.chain_key, toks, block_size_);
    cache_.insert(s.blocks[size_t(s.n_hashed)], key, s.chain_key, toks);  // a twin's copy stays private
    s.chain_key = key;
    s.n_hashed++;
    full += block_size_;
  }
  s.tail.erase(s.tail.begin(), s.tail.begin() + full);
}

void StateManager::post_forward() {
  DSCPP_CHECK(in_flight_, "post_forward: no batch in flight");
  for (int64_t uid : batch_uids_) {
    SequenceDescriptor& s = seqs_.at(uid);
    s.seen_tokens += s.in_flight_tokens;
    s.in_flight_tokens = 0;
    if (prefix_caching_) register_full_blocks(s);
  }
  batch_uids_.clear();
  in_flight_ = false;
}

void StateManager::abort_forward() {
  DSCPP_CHECK(in_flight_, "abort_forward: no batch in flight");
  for (int64_t uid : batch_uids_) {
    SequenceDescriptor& s = seqs_.at(uid);
    if (prefix_caching_) s.tail.resize(s.tail.size() - size_t(s.in_flight_tokens));
    const int64_t keep = ceil_div(s.seen_tokens, block_size_);
    while (s.cur_allocated_blocks() > keep) {
      release(s.blocks.back());
      s.blocks.pop_back();
    }
    s.in_flight_tokens = 0;
    if (s.seen_tokens == 0) seqs_.erase(uid);
  }
  batch_uids_.clear();
  in_flight_ = false;
}

void StateManager::flush(int64_t uid) {
  auto it = seqs_.find(uid);
  DSCPP_CHECK(it != seqs_.end(), "flush: sequence ", uid, " is not tracked");
  DSCPP_CHECK(!(in_flight_ && it->second.in_flight_tokens > 0), "flush: sequence ", uid,
              " is in the batch in flight (call post_forward first)");
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) release(*b);  // tail first: evicted first
  seqs_.erase(it);
}

void StateManager::check_invariants() const {
  std::vector<int32_t> holders(refcount_.size(), 0);
  for (const auto& [uid, s] : seqs_) {
    int64_t total = s.seen_tokens + s.in_flight_tokens;
    DSCPP_CHECK(total <= config_.max_context, "sequence ", uid, " holds ", total, " tokens > max_context ",
                config_.max_context);
    DSCPP_CHECK(s.cur_allocated_blocks() == ceil_div(total, block_size_), "sequence ", uid, " holds ", total,
                " tokens in ", s.cur_allocated_blocks(), " blocks of ", block_size_);
    std::unordered_set<int32_t> own;
    for (size_t j = 0; j < s.blocks.size(); j++) {
      int32_t b = s.blocks[j];
      DSCPP_CHECK(b >= 0 && b < n_blocks(), "sequence ", uid, " holds block ", b, " out of range");
      DSCPP_CHECK(own.insert(b).second, "sequence ", uid, " holds block ", b, " twice");
      holders[size_t(b)]++;
      // Blocks that are not yet full (or written by the batch in flight) are private and unregistered.
      if (int64_t(j) >= s.seen_tokens / block_size_) {
        DSCPP_CHECK(refcount_[size_t(b)] == 1, "sequence ", uid, " writes block ", b, " which ",
                    refcount_[size_t(b)], " sequences hold");
        DSCPP_CHECK(!prefix_caching_ || !cache_.registered(b), "sequence ", uid, " writes block ", b,
                    " which is in the prefix cache");
      }
    }
    if (prefix_caching_)
      DSCPP_CHECK(s.n_hashed * block_size_ + int64_t(s.tail.size()) == total && s.n_hashed <= total / block_size_,
                  "sequence ", uid, ": ", s.n_hashed, " hashed blocks and ", s.tail.size(), " tail tokens for ",
                  total, " tokens");
  }
  for (int32_t b = 0; b < n_blocks(); b++) {
    bool is_free = alloc_.is_free(b), parked = prefix_caching_ && cache_.parked(b);
    int32_t rc = refcount_[size_t(b)];
    DSCPP_CHECK(rc == holders[size_t(b)], "block ", b, " has refcount ", rc, " but ", holders[size_t(b)],
                " sequences hold it");
    DSCPP_CHECK(int(is_free) + int(parked) + int(rc > 0) == 1, "block ", b, " is free: ", is_free, ", parked: ",
                parked, ", held by ", rc, " (exactly one must hold)");
    if (is_free && prefix_caching_)
      DSCPP_CHECK(!cache_.registered(b), "block ", b, " is free but still registered in the prefix cache");
  }
  if (prefix_caching_) cache_.check();
}

}  // namespace dscpp::inference
