// 10,000 random steps of the state manager (new sequences that share prompt prefixes, forwards of random chunks and
// decode tokens, refused puts, flushes as finishes or preemptions), with and without prefix caching. After every
// step: the invariants (every block free xor held xor parked, refcounts equal holders, no shared block written),
// and every sequence's context read back through its blocks from a shadow KV cache equals what it was fed, which
// catches a block table pointing at a block another sequence overwrote or an evicted block still in use. At the
// end, with everything flushed, no block is leaked.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <tuple>

#include "inference/ragged/state_manager.h"
#include "inference_fakes.h"

using namespace dscpp;
using namespace dscpp::inference;
using dscpp::inference::testing::ShadowKV;

namespace {

using Snapshot = std::vector<std::tuple<int64_t, int64_t, int64_t, std::vector<int32_t>>>;

Snapshot snapshot(const StateManager& sm) {
  Snapshot out;
  for (int64_t uid : sm.tracked_uids()) {
    const SequenceDescriptor* s = sm.get(uid);
    out.emplace_back(uid, s->seen_tokens, s->in_flight_tokens, s->blocks);
  }
  out.emplace_back(-1, sm.free_blocks(), 0, std::vector<int32_t>{});
  return out;
}

void fuzz(bool prefix_caching, uint64_t seed, int steps) {
  StateManagerConfig c;
  c.max_tracked_sequences = 12;
  c.max_ragged_batch_size = 48;
  c.max_ragged_sequence_count = 6;
  c.max_context = 64;
  const int32_t n_blocks = 28;
  const int64_t bs = 4;
  StateManager sm(c, n_blocks, bs, prefix_caching);
  ShadowKV kv(n_blocks, bs);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };

  std::vector<std::vector<int32_t>> bases(4);  // shared prompt prefixes
  for (auto& b : bases)
    for (int i = 0; i < 24; i++) b.push_back(int32_t(uniform(1, 9)));
  std::map<int64_t, std::vector<int32_t>> fed, todo;  // per sequence: tokens in the cache; prompt tokens not yet
  int64_t next_uid = 0, puts = 0, refused = 0, hits = 0;
  std::map<SchedulingResult, int64_t> codes;

  for (int step = 0; step < steps; step++) {
    int64_t op = uniform(0, 99);
    if (op < 20 && sm.n_tracked() < c.max_tracked_sequences) {  // a new sequence
      int64_t uid = next_uid++;
      const auto& base = bases[size_t(uniform(0, 3))];
      std::vector<int32_t> prompt(base.begin(), base.begin() + uniform(0, 24));
      for (int64_t i = uniform(1, 12); i > 0; i--) prompt.push_back(int32_t(uniform(1, 9)));
      int64_t cached = sm.match_prefix(uid, prompt);
      hits += cached > 0;
      ASSERT_LT(cached, int64_t(prompt.size()));
      ASSERT_EQ(cached % bs, 0);
      fed[uid].assign(prompt.begin(), prompt.begin() + cached);
      todo[uid].assign(prompt.begin() + cached, prompt.end());
    } else if (op < 85 && sm.n_tracked() > 0) {  // a forward over a random subset
      std::vector<int64_t> uids = sm.tracked_uids();
      std::shuffle(uids.begin(), uids.end(), rng);
      uids.resize(size_t(uniform(1, std::min<int64_t>(int64_t(uids.size()), 7))));  // 7 > the limit sometimes
      std::vector<std::vector<int32_t>> chunks;
      std::vector<int64_t> lengths;
      for (int64_t uid : uids) {
        std::vector<int32_t>& t = todo[uid];
        std::vector<int32_t> chunk;
        if (!t.empty()) chunk.assign(t.begin(), t.begin() + uniform(1, int64_t(t.size())));
        else for (int64_t i = uniform(1, 2) == 1 ? 1 : uniform(1, 20); i > 0; i--) chunk.push_back(int32_t(uniform(1, 9)));
        lengths.push_back(int64_t(chunk.size()));
        chunks.push_back(chunk);
      }
      SchedulingResult verdict = sm.can_schedule(uids, lengths);
      codes[verdict]++;
      if (verdict != SchedulingResult::Success) {
        Snapshot before = snapshot(sm);
        try {
          sm.put(uids, chunks);
          FAIL() << "put succeeded where can_schedule said " << scheduling_result_name(verdict);
        } catch (const SchedulingError& e) {
          ASSERT_EQ(int(e.result), int(verdict));
        }
        ASSERT_EQ(snapshot(sm), before) << "a refused put changed the state";
        refused++;
        if (verdict == SchedulingResult::KVCacheLimitExceeded && uniform(0, 1)) {  // preempt the newest
          int64_t uid = sm.tracked_uids().back();
          sm.flush(uid);
          fed.erase(uid);
          todo.erase(uid);
        }
      } else {
        const RaggedBatch& b = sm.put(uids, chunks);
        b.validate(bs);
        kv.write(b);
        sm.post_forward();
        puts++;
        for (size_t i = 0; i < uids.size(); i++) {
          auto& f = fed[uids[i]];
          f.insert(f.end(), chunks[i].begin(), chunks[i].end());
          auto& t = todo[uids[i]];
          t.erase(t.begin(), t.begin() + std::min(t.size(), chunks[i].size()));
        }
      }
    } else if (sm.n_tracked() > 0) {  // a finish or a preemption: the same to the state manager
      std::vector<int64_t> uids = sm.tracked_uids();
      int64_t uid = uids[size_t(uniform(0, int64_t(uids.size()) - 1))];
      sm.flush(uid);
      fed.erase(uid);
      todo.erase(uid);
    }
    // Sequences at max_context can only be flushed: do it so the fuzz keeps moving.
    for (int64_t uid : sm.tracked_uids())
      if (sm.get(uid)->seen_tokens >= c.max_context - 1) {
        sm.flush(uid);
        fed.erase(uid);
        todo.erase(uid);
      }
    ASSERT_NO_THROW(sm.check_invariants()) << "step " << step << " seed " << seed;
    for (int64_t uid : sm.tracked_uids()) {
      const SequenceDescriptor* s = sm.get(uid);
      ASSERT_EQ(s->seen_tokens, int64_t(fed[uid].size())) << "step " << step;
      ASSERT_EQ(kv.read(s->blocks.data(), s->seen_tokens), fed[uid])
          << "step " << step << " seed " << seed << ": sequence " << uid << "'s context is not in its blocks";
    }
  }
  for (int64_t uid : sm.tracked_uids()) sm.flush(uid);
  sm.check_invariants();
  EXPECT_EQ(sm.n_tracked(), 0);
  EXPECT_EQ(sm.free_blocks(), n_blocks) << "blocks leaked";
  for (int32_t b = 0; b < n_blocks; b++) EXPECT_EQ(sm.refcount(b), 0);
  std::printf("seed %llu: %lld puts, %lld refused (", (unsigned long long)seed, (long long)puts, (long long)refused);
  for (auto [r, n] : codes) std::printf(" %s %lld", scheduling_result_name(r), (long long)n);
  std::printf(" ), %lld prefix hits, %lld evictions\n", (long long)hits, (long long)sm.stats().evictions);
  // The fuzz must have exercised what it claims to.
  EXPECT_GT(puts, steps / 4);
  EXPECT_GT(refused, 50);
  for (auto r : {SchedulingResult::BatchSequenceLimitExceeded, SchedulingResult::BatchTokenLimitExceeded,
                 SchedulingResult::KVCacheLimitExceeded, SchedulingResult::SequenceTokenLimitExceeded})
    EXPECT_GT(codes[r], 0) << scheduling_result_name(r) << " never happened";
  if (prefix_caching) {
    EXPECT_GT(hits, 100);
    EXPECT_GT(sm.stats().evictions, 50);
  }
}

}  // namespace

TEST(StateFuzz, PrefixCaching) { fuzz(true, 1234, 10000); }
TEST(StateFuzz, NoPrefixCaching) { fuzz(false, 5678, 10000); }
