// The state manager: each of FastGen's scheduling codes hit on purpose (and a refused put changes nothing), query
// and remaining capacity, a put's batch checked by hand, and the prefix cache: hits, misses, refcounts, the
// last-token rule, twins, and LRU eviction tail first.
#include <gtest/gtest.h>

#include "inference/ragged/state_manager.h"
#include "inference_fakes.h"

using namespace dscpp;
using namespace dscpp::inference;

static StateManagerConfig small_config(int64_t max_tracked = 8, int64_t batch = 32, int64_t seqs = 4,
                                       int64_t context = 16) {
  StateManagerConfig c;
  c.max_tracked_sequences = max_tracked;
  c.max_ragged_batch_size = batch;
  c.max_ragged_sequence_count = seqs;
  c.max_context = context;
  return c;
}

static std::vector<int32_t> iota(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; i++) v[size_t(i)] = from + i;
  return v;
}

// put + post_forward, as the engine's put does around the forward.
static const RaggedBatch& run(StateManager& sm, const std::vector<int64_t>& uids,
                              const std::vector<std::vector<int32_t>>& tokens) {
  const RaggedBatch& b = sm.put(uids, tokens);
  b.validate(sm.block_size());
  sm.post_forward();
  sm.check_invariants();
  return b;
}

TEST(StateManager, PutBuildsTheBatchByHand) {
  StateManager sm(small_config(), /*n_blocks=*/8, /*block_size=*/4, /*prefix_caching=*/false);
  RaggedBatch b = sm.put({7, 3}, {iota(10, 6), {20, 21, 22}});
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 20, 21, 22}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2}));
  EXPECT_EQ(b.seq_start, (std::vector<int32_t>{0, 6, 9}));
  EXPECT_EQ(b.seq_seen, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(b.max_blocks_per_seq, 4);  // max_context 16 / 4
  EXPECT_EQ(b.block_table, (std::vector<int32_t>{0, 1, -1, -1, 2, -1, -1, -1}));
  EXPECT_EQ(sm.get(7)->in_flight_tokens, 6);
  EXPECT_EQ(sm.get(7)->seen_tokens, 0);
  EXPECT_THROW(sm.put({7}, {{1}}), Error);  // the previous batch is in flight
  sm.post_forward();
  EXPECT_EQ(sm.get(7)->seen_tokens, 6);
  EXPECT_EQ(sm.get(7)->in_flight_tokens, 0);
  EXPECT_EQ(sm.get_remaining_block_capacity(7), 2);
  EXPECT_EQ(sm.get_remaining_block_capacity(3), 1);

  // Sequence 3 crosses into a new block (3), sequence 7 fills its second.
  b = run(sm, {3, 7}, {{23, 24}, {16}});
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{23, 24, 16}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{3, 4, 6}));
  EXPECT_EQ(b.seq_start, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(b.seq_seen, (std::vector<int32_t>{3, 6}));
  EXPECT_EQ(b.block_table, (std::vector<int32_t>{2, 3, -1, -1, 0, 1, -1, -1}));
  EXPECT_EQ(sm.get_remaining_block_capacity(3), 3);
  EXPECT_EQ(sm.get_remaining_block_capacity(99), 0);
  EXPECT_EQ(sm.free_blocks(), 4);

  // query: FastGen's (tokens, blocks). Sequence 7 holds 7 tokens in 2 blocks.
  EXPECT_EQ(sm.query(7, 1, 0), (std::pair<int64_t, int64_t>{1, 0}));  // fits its last block
  EXPECT_EQ(sm.query(7, 5, 0), (std::pair<int64_t, int64_t>{1, 0}));  // only 1 slot without a new block
  EXPECT_EQ(sm.query(7, 5, 1), (std::pair<int64_t, int64_t>{5, 1}));
  EXPECT_EQ(sm.query(42, 9, 2), (std::pair<int64_t, int64_t>{8, 2}));  // new sequence: 2 blocks hold 8
  EXPECT_EQ(sm.query(42, 9, 4), (std::pair<int64_t, int64_t>{9, 3}));

  sm.flush(7);
  EXPECT_EQ(sm.get(7), nullptr);
  EXPECT_EQ(sm.free_blocks(), 6);
  EXPECT_THROW(sm.flush(7), Error);
  sm.flush(3);
  EXPECT_EQ(sm.free_blocks(), 8);
  sm.check_invariants();
}

static void expect_code(const StateManager& sm, const std::vector<int64_t>& uids, const std::vector<int64_t>& lens,
                        SchedulingResult want) {
  EXPECT_EQ(int(sm.can_schedule(uids, lens)), int(want)) << scheduling_result_name(want);
}

// A forward that failed is undone: new blocks back, new sequences forgotten, the tail of the prefix cache's
// bookkeeping as before; the sequences go on as if that put never happened.
TEST(StateManager, AbortedForwardChangesNothing) {
  for (bool prefix : {false, true}) {
    StateManager sm(small_config(), /*n_blocks=*/8, /*block_size=*/4, prefix);
    run(sm, {7}, {iota(10, 6)});
    const int64_t free_before = sm.free_blocks();
    sm.put({7, 3}, {iota(16, 5), iota(40, 3)});  // 7 grows into two more blocks, 3 is new
    EXPECT_LT(sm.free_blocks(), free_before);
    sm.abort_forward();
    EXPECT_FALSE(sm.batch_in_flight());
    EXPECT_EQ(sm.free_blocks(), free_before);
    EXPECT_EQ(sm.get(3), nullptr);
    EXPECT_EQ(sm.get(7)->seen_tokens, 6);
    EXPECT_EQ(sm.get(7)->cur_allocated_blocks(), 2);
    sm.check_invariants();
    const RaggedBatch b = run(sm, {7}, {iota(16, 2)});
    EXPECT_EQ(b.positions, (std::vector<int32_t>{6, 7}));
    EXPECT_EQ(sm.get(7)->seen_tokens, 8);
  }
}

TEST(StateManager, EverySchedulingCode) {
  // 2 tracked at most, 3 per batch, 10 tokens per batch, max_context 16; 4 blocks of 4 tokens.
  StateManager sm(small_config(2, 10, 3, 16), 4, 4, false);
  expect_code(sm, {1, 2}, {4, 4}, SchedulingResult::Success);
  expect_code(sm, {1, 2, 3}, {1, 1, 1}, SchedulingResult::EngineSequenceLimitExceeded);
  expect_code(sm, {1, 2, 3, 4}, {1, 1, 1, 1}, SchedulingResult::BatchSequenceLimitExceeded);
  expect_code(sm, {1, 2}, {6, 5}, SchedulingResult::BatchTokenLimitExceeded);
  expect_code(sm, {1}, {17}, SchedulingResult::SequenceTokenLimitExceeded);
  run(sm, {1}, {iota(0, 9)});  // 3 blocks
  expect_code(sm, {2}, {5}, SchedulingResult::KVCacheLimitExceeded);  // 2 blocks, 1 free
  expect_code(sm, {2}, {4}, SchedulingResult::Success);
  expect_code(sm, {1}, {8}, SchedulingResult::SequenceTokenLimitExceeded);  // 9 + 8 > 16
  expect_code(sm, {1, 2}, {3, 1}, SchedulingResult::Success);  // 12 tokens still fit 1's 3 blocks
  expect_code(sm, {1, 2}, {4, 4}, SchedulingResult::KVCacheLimitExceeded);  // each fits alone, not both

  // A refused put names the code and the numbers, and changes nothing.
  try {
    sm.put({1, 2}, {{1, 2, 3, 4}, iota(0, 4)});
    ADD_FAILURE() << "no error";
  } catch (const SchedulingError& e) {
    EXPECT_EQ(int(e.result), int(SchedulingResult::KVCacheLimitExceeded));
    std::string msg = e.what();
    EXPECT_NE(msg.find("KVCacheLimitExceeded (4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sequence 2 needs 1 more KV blocks for 4 tokens, 0 are left of 4"), std::string::npos) << msg;
  }
  EXPECT_EQ(sm.n_tracked(), 1);
  EXPECT_EQ(sm.get(2), nullptr);
  EXPECT_EQ(sm.get(1)->seen_tokens, 9);
  EXPECT_EQ(sm.get(1)->cur_allocated_blocks(), 3);
  EXPECT_EQ(sm.free_blocks(), 1);
  EXPECT_FALSE(sm.batch_in_flight());
  sm.check_invariants();
  try {
    sm.put({1}, {iota(0, 8)});
    ADD_FAILURE() << "no error";
  } catch (const SchedulingError& e) {
    EXPECT_EQ(int(e.result), int(SchedulingResult::SequenceTokenLimitExceeded));
    EXPECT_NE(std::string(e.what()).find("9 + 8 tokens, state_manager.max_context is 16"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(sm.put({1, 1}, {{1}, {2}}), Error);  // a uid twice in one batch
  EXPECT_THROW(sm.put({1}, {{}}), Error);           // no tokens
  // query for a new uid when no more can be tracked: (0, 0), as FastGen.
  run(sm, {2}, {{5}});
  EXPECT_EQ(sm.query(3, 1, 4), (std::pair<int64_t, int64_t>{0, 0}));
  EXPECT_THROW(sm.match_prefix(3, {1, 2}), SchedulingError);
}

TEST(PrefixCache, HitsMissesAndRefcounts) {
  StateManager sm(small_config(8, 32, 4, 32), 8, 4, true);
  std::vector<int32_t> a = iota(100, 10);  // blocks [100..103] [104..107] and 2 more tokens
  EXPECT_EQ(sm.match_prefix(1, a), 0);     // empty cache: a miss
  EXPECT_EQ(sm.stats().prefix_miss_blocks, 2);
  run(sm, {1}, {a});
  std::vector<int32_t> blocks_a = sm.get(1)->blocks;  // 0 1 2
  EXPECT_EQ(blocks_a, (std::vector<int32_t>{0, 1, 2}));

  // Same 8 leading tokens: both full blocks are shared; seen starts after them.
  std::vector<int32_t> b = a;
  b[9] = 7;
  EXPECT_EQ(sm.match_prefix(2, b), 8);
  EXPECT_EQ(sm.get(2)->seen_tokens, 8);
  EXPECT_EQ(sm.get(2)->blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(sm.refcount(0), 2);
  EXPECT_EQ(sm.refcount(1), 2);
  EXPECT_EQ(sm.refcount(2), 1);
  sm.check_invariants();
  const RaggedBatch batch = run(sm, {2}, {{b[8], b[9]}});  // only the uncached tokens are computed
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(batch.seq_seen, (std::vector<int32_t>{8}));
  EXPECT_EQ(sm.get(2)->blocks[2], 3);  // its own third block, never block 2 of sequence 1

  // A prompt of exactly 8 cached tokens keeps its last token to compute: one block, not two.
  EXPECT_EQ(sm.match_prefix(3, std::vector<int32_t>(a.begin(), a.begin() + 8)), 4);
  EXPECT_EQ(sm.refcount(0), 3);
  EXPECT_EQ(sm.refcount(1), 2);
  // A different first token misses everything (the key is chained: block 2 alone does not match).
  std::vector<int32_t> c = a;
  c[0] = 99;
  EXPECT_EQ(sm.match_prefix(4, c), 0);
  EXPECT_TRUE(sm.get(4)->blocks.empty());
  EXPECT_EQ(sm.stats().prefix_hit_blocks, 3);

  // Flushing releases references; registered blocks stay cached (parked), others return to the allocator.
  sm.flush(1);
  EXPECT_EQ(sm.refcount(0), 2);
  EXPECT_EQ(sm.refcount(1), 1);
  sm.flush(2);
  sm.flush(3);
  sm.flush(4);
  EXPECT_EQ(sm.refcount(0), 0);
  EXPECT_EQ(sm.free_blocks(), 8);
  sm.check_invariants();
  EXPECT_EQ(sm.match_prefix(5, a), 8);  // parked blocks are found again
  EXPECT_EQ(sm.get(5)->blocks, (std::vector<int32_t>{0, 1}));
  sm.check_invariants();
}

TEST(PrefixCache, ShareableOnlyWhenFullAndComputed) {
  StateManager sm(small_config(8, 32, 4, 32), 8, 4, true);
  std::vector<int32_t> p = iota(1, 9);
  sm.put({1}, {std::vector<int32_t>(p.begin(), p.begin() + 6)});
  EXPECT_THROW(sm.match_prefix(2, p), Error);  // its forward has not run yet
  sm.post_forward();
  EXPECT_EQ(sm.match_prefix(2, p), 4);  // block 0 is full and computed; block 1 holds 2 of 4 tokens
  EXPECT_EQ(sm.get(1)->n_hashed, 1);
  run(sm, {1}, {{p[6], p[7]}});  // fills block 1: now shareable
  EXPECT_EQ(sm.match_prefix(3, p), 8);
  EXPECT_EQ(sm.get(3)->blocks, sm.get(1)->blocks);
  // Sequence 3 appends after the shared blocks, into a block of its own.
  run(sm, {3}, {{p[8]}});
  EXPECT_EQ(sm.get(3)->blocks.size(), 3u);
  EXPECT_NE(sm.get(3)->blocks[2], sm.get(1)->blocks[1]);
}

TEST(PrefixCache, TwinsComputedTogetherStayPrivate) {
  StateManager sm(small_config(8, 32, 4, 32), 8, 4, true);
  std::vector<int32_t> p = iota(1, 5);
  run(sm, {1, 2}, {p, p});  // the same prompt twice in one forward: blocks 0,1 and 2,3
  EXPECT_EQ(sm.match_prefix(3, p), 4);
  EXPECT_EQ(sm.get(3)->blocks, (std::vector<int32_t>{0}));  // the first copy is the cached one
  sm.flush(1);
  sm.flush(2);
  sm.flush(3);
  sm.check_invariants();
  EXPECT_EQ(sm.free_blocks(), 8);
}

TEST(PrefixCache, LeastRecentlyUsedEvictedTailFirst) {
  StateManager sm(small_config(8, 32, 4, 32), 6, 4, true);
  std::vector<int32_t> a = iota(100, 9), b = iota(200, 9);
  run(sm, {1}, {a});  // blocks 0 1 (registered) 2
  run(sm, {2}, {b});  // blocks 3 4 (registered) 5
  sm.flush(1);        // parks 1 then 0 (tail first); frees 2
  sm.flush(2);        // parks 4 then 3; frees 5
  EXPECT_EQ(sm.free_blocks(), 6);
  sm.check_invariants();
  // 4 blocks for a new prompt: 2 free, so the 2 least recently used parked blocks go: a's chain, tail first.
  run(sm, {3}, {iota(300, 13)});
  EXPECT_EQ(sm.stats().evictions, 2);
  EXPECT_EQ(sm.match_prefix(4, a), 0);  // a's head went too (its tail first)
  EXPECT_EQ(sm.match_prefix(5, b), 8);  // b, used later, is intact
  sm.flush(4);
  sm.flush(5);
  // One more block: b's tail (block 4) goes before its head (block 3).
  run(sm, {6}, {iota(400, 1)});
  EXPECT_EQ(sm.stats().evictions, 3);
  EXPECT_EQ(sm.match_prefix(7, b), 4);
  sm.check_invariants();
}

TEST(PrefixCache, OffSharesNothing) {
  StateManager sm(small_config(8, 32, 4, 32), 8, 4, false);
  std::vector<int32_t> p = iota(1, 9);
  run(sm, {1}, {p});
  EXPECT_EQ(sm.match_prefix(2, p), 0);
  sm.flush(1);
  EXPECT_EQ(sm.free_blocks(), 8);
}
