// The KV block allocator (exhaustion, out of range, double free, all-or-nothing), RaggedBatch::validate on a good
// batch and on each way to break one, and the KV cache's shape.
#include <gtest/gtest.h>

#include "dscpp/inference/kv_cache.h"
#include "dscpp/inference/ragged_batch.h"
#include "inference/ragged/block_allocator.h"

using namespace dscpp;
using namespace dscpp::inference;

template <typename F>
static void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& s : fragments)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << "'" << e.what() << "' lacks '" << s << "'";
  }
}

TEST(BlockAllocator, AllocatesLowestFirstAndCounts) {
  BlockAllocator a(5);
  EXPECT_EQ(a.n_free(), 5);
  EXPECT_EQ(a.allocate(2), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(a.allocate(1), (std::vector<int32_t>{2}));
  EXPECT_EQ(a.n_used(), 3);
  EXPECT_EQ(a.n_free(), 2);
  a.free({1});
  EXPECT_EQ(a.allocate(1), (std::vector<int32_t>{1}));  // the block freed last comes back first
  EXPECT_TRUE(a.allocate(0).empty());
}

TEST(BlockAllocator, ExhaustionTakesNothing) {
  BlockAllocator a(4);
  a.allocate(3);
  expect_error([&] { a.allocate(2); }, {"cannot allocate 2 blocks", "only 1 of 4 are free"});
  EXPECT_EQ(a.n_free(), 1);
  EXPECT_EQ(a.allocate(1), (std::vector<int32_t>{3}));
  expect_error([&] { a.allocate(1); }, {"cannot allocate 1 blocks", "only 0 of 4"});
}

TEST(BlockAllocator, RefusesBadFreesAndFreesNone) {
  BlockAllocator a(4);
  std::vector<int32_t> got = a.allocate(3);  // 0 1 2
  expect_error([&] { a.free({0, 4}); }, {"cannot free block 4", "out of range [0, 4)"});
  expect_error([&] { a.free({-1}); }, {"cannot free block -1"});
  expect_error([&] { a.free({1, 3}); }, {"double free of block 3", "already free"});
  expect_error([&] { a.free({2, 0, 2}); }, {"double free of block 2", "listed twice"});
  EXPECT_EQ(a.n_free(), 1);  // none of the refused lists freed anything
  for (int32_t b : got) EXPECT_FALSE(a.is_free(b));
  a.free({2, 0});
  expect_error([&] { a.free({0}); }, {"double free of block 0"});
  EXPECT_EQ(a.n_free(), 3);
  expect_error([] { BlockAllocator(0); }, {"at least one block"});
}

// Two sequences, block size 4: sequence 0 has 5 cached tokens and brings 2 (blocks 3, 1), sequence 1 brings 3 new.
static RaggedBatch good_batch() {
  RaggedBatch b;
  b.tokens = {11, 12, 20, 21, 22};
  b.positions = {5, 6, 0, 1, 2};
  b.seq_start = {0, 2, 5};
  b.seq_seen = {5, 0};
  b.max_blocks_per_seq = 3;
  b.block_table = {3, 1, -1, 0, -1, -1};
  return b;
}

TEST(RaggedBatch, ValidateAcceptsAndRefuses) {
  RaggedBatch b = good_batch();
  b.validate(4);
  EXPECT_EQ(b.n_seqs(), 2);
  EXPECT_EQ(b.last_token(0), 1);
  EXPECT_EQ(b.last_token(1), 4);
  auto broken = [](auto edit, std::vector<std::string> why) {
    RaggedBatch x = good_batch();
    edit(x);
    expect_error([&] { x.validate(4); }, why);
  };
  broken([](RaggedBatch& x) { x.positions[1] = 7; }, {"sequence 0 token 1 at position 7, expected 6"});
  broken([](RaggedBatch& x) { x.positions.pop_back(); }, {"5 tokens but 4 positions"});
  broken([](RaggedBatch& x) { x.seq_start = {0, 2, 2, 5}; x.seq_seen = {5, 0, 0}; x.block_table.resize(9, -1); },
         {"sequence 1 brings 0 tokens"});
  broken([](RaggedBatch& x) { x.seq_start.back() = 4; }, {"seq_start ends at 4 but there are 5 tokens"});
  broken([](RaggedBatch& x) { x.block_table[1] = -1; }, {"sequence 0 block_table[1] = -1 (no block)"});
  broken([](RaggedBatch& x) { x.block_table[2] = 7; }, {"block_table[2] = 7 beyond its 2 blocks"});
  broken([](RaggedBatch& x) { x.block_table[1] = 3; }, {"lists block 3 twice"});
  broken([](RaggedBatch& x) { x.block_table[3] = 1; }, {"block 1 is written by two sequences"});
  broken([](RaggedBatch& x) { x.seq_seen[0] = 11; for (int i = 0; i < 2; i++) x.positions[i] = 11 + i; },
         {"holds 13 tokens = 4 blocks of 4, more than max_blocks_per_seq 3"});
  broken([](RaggedBatch& x) { x.block_table.pop_back(); }, {"block_table has 5 entries"});
  // Sequence 1 reads block 1 as a full block while sequence 0 appends into it: refused.
  broken([](RaggedBatch& x) {
    x.seq_seen[1] = 4;
    for (int i = 0; i < 3; i++) x.positions[2 + i] = 4 + i;
    x.block_table = {3, 1, -1, 1, 0, -1};
  }, {"block 1 is read by sequence 1 and written by another"});
}

TEST(KVCache, ShapeAndOffsets) {
  KVCacheShape s{2, 3, 4, 2, 8};  // layers, blocks, block size, kv heads, head dim
  KVCache kv(s, DType::f32, Device::cpu());
  EXPECT_EQ(kv.data().shape(), (Shape{2, 3, 4, 2, 2, 8}));
  EXPECT_EQ(s.elements_per_block(), 4 * 2 * 2 * 8);
  EXPECT_EQ(s.bytes_per_block(DType::bf16), 2 * 4 * 2 * 2 * 8 * 2);
  EXPECT_EQ(kv.offset(1, 2, 3, 1), ((((1 * 3 + 2) * 4 + 3) * 2 + 1) * 2) * 8);
  expect_error([] { KVCache(KVCacheShape{2, 0, 4, 2, 8}, DType::f32, Device::cpu()); }, {"blocks 0"});
}

TEST(KVCache, BlocksFromTheMemoryConfig) {
  StateManagerConfig c;
  c.max_context = 1000;  // 16 blocks of 64
  c.memory_config.size = 100;
  EXPECT_EQ(kv_cache_blocks(c, 64, 10, 100 + 10 * 20 + 9), 20);  // reserve: (free - size) / bytes per block
  expect_error([&] { kv_cache_blocks(c, 64, 10, 100 + 10 * 15); },
               {"250 bytes free less state_manager.memory_config.size = 100 reserved, at 10 bytes per block gives 15 "
                "blocks of 64 tokens, fewer than the 16 one sequence of state_manager.max_context = 1000"});
  expect_error([&] { kv_cache_blocks(c, 64, 10, 50); }, {"gives 0 blocks"});
  c.memory_config.mode = "allocate";
  c.memory_config.size = 16;
  EXPECT_EQ(kv_cache_blocks(c, 64, 10, 0), 16);  // allocate: exactly size blocks, whatever is free
  c.memory_config.size = 15;
  expect_error([&] { kv_cache_blocks(c, 64, 10, 1 << 30); }, {"size = 15 blocks (mode allocate) gives 15 blocks"});
}
