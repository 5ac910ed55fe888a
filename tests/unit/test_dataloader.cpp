// Token shards (round trip, corruption errors) and the DataLoader (shifted targets, determinism, resume, ranks).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "dscpp/checkpoint/crc32.h"
#include "dscpp/core/check.h"
#include "dscpp/core/rng.h"
#include "dscpp/data/corpus.h"
#include "dscpp/data/dataloader.h"
#include "dscpp/data/shard.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("dscpp_test_dataloader_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Two shards whose tokens are their positions in the stream, so every batch can be checked exactly.
std::vector<std::string> counting_shards(const fs::path& d, int64_t n1, int64_t n2) {
  std::vector<int32_t> a(n1), b(n2);
  for (int64_t i = 0; i < n1; i++) a[i] = int32_t(i);
  for (int64_t i = 0; i < n2; i++) b[i] = int32_t(n1 + i);
  write_token_shard((d / "s0.bin").string(), a, 100000);
  write_token_shard((d / "s1.bin").string(), b, 100000);
  return {(d / "s0.bin").string(), (d / "s1.bin").string()};
}

struct Batch {
  std::vector<int32_t> x, y;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& dl) {
  const int64_t B = dl.config().batch_size, T = dl.config().seq_len;
  Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
  std::fill_n(x.data<int32_t>(), B * T, -7);  // poison: unwritten elements fail the checks
  std::fill_n(y.data<int32_t>(), B * T, -7);
  dl.next_batch(x, y);
  return {std::vector<int32_t>(x.data<int32_t>(), x.data<int32_t>() + B * T),
          std::vector<int32_t>(y.data<int32_t>(), y.data<int32_t>() + B * T)};
}

}  // namespace

TEST(Shard, RoundTripBothTokenWidths) {
  fs::path d = temp_dir();
  Rng rng(5);
  for (int64_t vocab : {int64_t(50257), int64_t(65536), int64_t(100000)}) {
    std::vector<int32_t> tok(12345);
    for (auto& t : tok) t = int32_t(rng.below(uint64_t(vocab)));
    tok[0] = int32_t(vocab - 1);
    std::string p = (d / std::to_string(vocab)).string();
    write_token_shard(p, tok, vocab);
    EXPECT_EQ(fs::file_size(p), kShardHeaderBytes + tok.size() * (vocab <= 65536 ? 2 : 4));
    TokenShard s(p);
    EXPECT_EQ(s.vocab_size(), vocab);
    EXPECT_EQ(s.read_all(), tok);
    EXPECT_EQ(s[777], tok[777]);
  }
  EXPECT_NE(error_of([&] { write_token_shard((d / "x.bin").string(), std::vector<int32_t>{1, 70000}, 65536); })
                .find("70000"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d / "x.bin"));
  fs::remove_all(d);
}

// Version 2 records the tokenizer that made the tokens; version 1 files (zeros there) still read, unrecorded.
TEST(Shard, RecordsItsTokenizerAndReadsVersion1) {
  fs::path d = temp_dir();
  const std::vector<int32_t> tok = {5, 1, 299, 0, 42};
  const std::string p = (d / "v2.bin").string();
  write_token_shard(p, tok, 300, {0x0123456789abcdefull, "runs/x/data/tokenizer.json"});
  TokenShard s(p);
  EXPECT_EQ(s.version(), 2);
  EXPECT_EQ(s.tokenizer().fingerprint, 0x0123456789abcdefull);
  EXPECT_EQ(s.tokenizer().name, "runs/x/data/tokenizer.json");
  EXPECT_EQ(s.read_all(), tok);
  write_token_shard(p, tok, 300, {1, std::string(500, 'n')});  // a long name is cut, never spills over
  EXPECT_EQ(TokenShard(p).tokenizer().name, std::string(203, 'n'));

  // The bytes a version 1 writer made: the same first 36 header bytes with version 1, then zeros.
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint32_t v1 = 1;
  std::memcpy(&bytes[8], &v1, 4);
  std::fill(bytes.begin() + 40, bytes.begin() + kShardHeaderBytes, '\0');
  const uint32_t crc = crc32_update(0, bytes.data(), 36);
  std::memcpy(&bytes[36], &crc, 4);
  const std::string old = (d / "v1.bin").string();
  std::ofstream(old, std::ios::binary) << bytes;
  TokenShard s1(old);
  EXPECT_EQ(s1.version(), 1);
  EXPECT_EQ(s1.tokenizer().fingerprint, 0u);
  EXPECT_EQ(s1.read_all(), tok);
  fs::remove_all(d);
}

TEST(Shard, CorruptOrTruncatedFilesNameTheFileAndProblem) {
  fs::path d = temp_dir();
  std::vector<int32_t> tok(1000);
  for (int i = 0; i < 1000; i++) tok[i] = (i * 37) % 50000;
  std::string good = (d / "good.bin").string();
  write_token_shard(good, tok, 50257);
  auto variant = [&](const std::string& name, const std::function<void(std::string&)>& edit) {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    edit(bytes);
    std::string p = (d / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  };
  struct Case { std::string file, expect; };
  std::vector<Case> cases = {
      {variant("flipped.bin", [](std::string& b) { b[kShardHeaderBytes + 501] ^= 0x10; }), "CRC32"},
      {variant("truncated.bin", [](std::string& b) { b.resize(b.size() - 3); }), "truncated"},
      {variant("tiny.bin", [](std::string& b) { b.resize(100); }), "header"},
      {variant("magic.bin", [](std::string& b) { b[0] = 'X'; }), "magic"},
      {variant("header.bin", [](std::string& b) { b[17] ^= 1; }), "header checksum"},
      {variant("record.bin", [](std::string& b) { b[60] ^= 1; }), "tokenizer record checksum"},
  };
  for (auto& c : cases) {
    std::string msg = error_of([&] { TokenShard s(c.file); });
    EXPECT_NE(msg.find(c.file), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { TokenShard s((d / "missing.bin").string()); }).find("missing.bin"), std::string::npos);
  fs::remove_all(d);
}

TEST(DataLoader, TargetsAreInputsShiftedAndAnEpochCoversEverySequence) {
  fs::path d = temp_dir();
  DataLoaderConfig cfg;
  cfg.shards = counting_shards(d, 1000, 1337);  // sequences cross the shard boundary
  cfg.batch_size = 4;
  cfg.seq_len = 16;
  DataLoader dl(cfg);
  const int64_t S = (2337 - 1) / 16;
  EXPECT_EQ(dl.num_sequences(), S);
  EXPECT_EQ(dl.batches_per_epoch(), S / 4);
  std::multiset<int32_t> starts;
  for (int64_t step = 0; step < dl.batches_per_epoch(); step++) {
    Batch b = next(dl);
    for (int64_t r = 0; r < 4; r++) {
      int32_t s0 = b.x[r * 16];
      ASSERT_EQ(s0 % 16, 0);
      starts.insert(s0 / 16);
      for (int t = 0; t < 16; t++) {
        ASSERT_EQ(b.x[r * 16 + t], s0 + t);
        ASSERT_EQ(b.y[r * 16 + t], s0 + t + 1);
      }
    }
  }
  EXPECT_EQ(int64_t(starts.size()), S / 4 * 4);
  EXPECT_EQ(int64_t(std::set<int32_t>(starts.begin(), starts.end()).size()), S / 4 * 4);  // no repeats
  EXPECT_EQ(dl.state().epoch, 0u);
  next(dl);
  EXPECT_EQ(dl.state().epoch, 1u);  // epochs advance by themselves
  fs::remove_all(d);
}

TEST(DataLoader, SeedDeterminesOrderAndResumeIsExact) {
  fs::path d = temp_dir();
  DataLoaderConfig cfg;
  cfg.shards = counting_shards(d, 1000, 1337);
  cfg.batch_size = 3;
  cfg.seq_len = 8;
  cfg.seed = 11;
  DataLoader a(cfg), b(cfg);
  cfg.seed = 12;
  DataLoader c(cfg);
  std::vector<Batch> run;
  bool differs = false;
  const int steps = int(a.batches_per_epoch()) * 2 + 5;  // crosses two epoch boundaries
  for (int i = 0; i < steps; i++) {
    run.push_back(next(a));
    ASSERT_EQ(next(b), run.back()) << "step " << i;
    differs |= !(next(c) == run.back());
  }
  EXPECT_TRUE(differs) << "seeds 11 and 12 gave identical batches";
  EXPECT_FALSE(run[0] == run[a.batches_per_epoch()]) << "epoch 1 repeated epoch 0's order";

  for (int k : {0, 7, int(a.batches_per_epoch()) - 1, int(a.batches_per_epoch()) + 3}) {
    cfg.seed = 11;
    DataLoader first(cfg);
    for (int i = 0; i < k; i++) next(first);
    DataLoaderState st = first.state();
    cfg.seed = 999;  // the state's seed wins over the config's
    DataLoader resumed(cfg);
    resumed.set_state(st);
    for (int i = k; i < k + 20; i++) ASSERT_EQ(next(resumed), run[i]) << "resumed at " << k << ", step " << i;
  }
  fs::remove_all(d);
}

// Note [Resuming under another global batch]: saved after 5 global batches of 2 sequences on one rank, resumed as 3
// ranks of 2 (position 10, no multiple of the new global batch of 6): the ranks' next batches are the epoch's next
// sequences in order, to the last whole global batch; then epoch 1 begins as an uninterrupted run's.
TEST(DataLoader, ResumesUnderAnotherGlobalBatch) {
  fs::path d = temp_dir();
  DataLoaderConfig cfg;
  cfg.shards = counting_shards(d, 1000, 1337);
  cfg.seq_len = 8;
  cfg.seed = 5;
  cfg.batch_size = 1;
  DataLoader one(cfg);  // the order, one sequence at a time
  const int64_t S = one.num_sequences();
  std::vector<std::vector<int32_t>> order;
  for (int64_t i = 0; i < 2 * S; i++) order.push_back(next(one).x);
  cfg.batch_size = 2;
  DataLoader saved(cfg);
  for (int i = 0; i < 5; i++) next(saved);
  const DataLoaderState st = saved.state();
  ASSERT_EQ(st.position, 10u);
  const int W = 3, B = 2;
  cfg.batch_size = B;
  cfg.world_size = W;
  std::vector<DataLoader> ranks;
  for (int r = 0; r < W; r++) {
    cfg.rank = r;
    ranks.emplace_back(cfg);
    ranks.back().set_state(st);  // 10 is no multiple of the new global batch of 6
  }
  int64_t at = 10;
  for (; at + B * W <= S; at += B * W)
    for (int r = 0; r < W; r++) {
      Batch b = next(ranks[size_t(r)]);
      for (int i = 0; i < B; i++)
        ASSERT_EQ(std::vector<int32_t>(b.x.begin() + i * 8, b.x.begin() + (i + 1) * 8), order[size_t(at + r * B + i)])
            << "sequence " << at + r * B + i << " on rank " << r;
    }
  for (int r = 0; r < W; r++) {  // the tail of fewer than 6 is dropped: epoch 1 from its start
    Batch b = next(ranks[size_t(r)]);
    ASSERT_EQ(std::vector<int32_t>(b.x.begin(), b.x.begin() + 8), order[size_t(S + r * B)]) << "rank " << r;
    EXPECT_EQ(ranks[size_t(r)].state().epoch, 1u);
  }
  DataLoaderState past = st;
  past.position = uint64_t(S) + 1;
  EXPECT_NE(error_of([&] { ranks[0].set_state(past); }).find("state position " + std::to_string(S + 1) +
                                                              " is past the " + std::to_string(S) + " training"),
            std::string::npos);
  fs::remove_all(d);
}

TEST(DataLoader, RanksAreDisjointAndCoverTheGlobalBatch) {
  fs::path d = temp_dir();
  DataLoaderConfig cfg;
  cfg.shards = counting_shards(d, 1000, 1337);
  cfg.seq_len = 8;
  const int W = 3, B = 2;
  cfg.batch_size = B * W;
  DataLoader global(cfg);
  std::vector<DataLoader> ranks;
  cfg.batch_size = B;
  cfg.world_size = W;
  for (int r = 0; r < W; r++) {
    cfg.rank = r;
    ranks.emplace_back(cfg);
  }
  EXPECT_EQ(ranks[0].batches_per_epoch(), global.batches_per_epoch());
  for (int step = 0; step < global.batches_per_epoch() + 4; step++) {
    Batch g = next(global);
    std::vector<int32_t> got;
    for (auto& r : ranks) {
      Batch b = next(r);
      got.insert(got.end(), b.x.begin(), b.x.end());
    }
    ASSERT_EQ(got, g.x) << "step " << step;  // rank r holds block r of the global batch, so all are disjoint
    std::set<int32_t> seqs;
    for (int i = 0; i < B * W; i++) seqs.insert(got[i * 8]);
    ASSERT_EQ(int(seqs.size()), B * W) << "a sequence appears on two ranks at step " << step;
  }
  fs::remove_all(d);
}

TEST(DataLoader, ValidationSplitIsHeldOut) {
  fs::path d = temp_dir();
  DataLoaderConfig cfg;
  cfg.shards = counting_shards(d, 1000, 1337);
  cfg.batch_size = 2;
  cfg.seq_len = 8;
  cfg.val_fraction = 0.1;
  DataLoader train(cfg);
  cfg.validation = true;
  cfg.shuffle = false;
  DataLoader val(cfg);
  const int64_t S = (2337 - 1) / 8, n_val = int64_t(S * 0.1);
  EXPECT_EQ(val.num_sequences(), n_val);
  EXPECT_EQ(train.num_sequences(), S - n_val);
  int32_t first_val = int32_t((S - n_val) * 8);
  EXPECT_EQ(next(val).x[0], first_val);  // unshuffled: in stream order
  for (int i = 0; i < train.batches_per_epoch(); i++) {
    Batch b = next(train);
    for (int r = 0; r < 2; r++) ASSERT_LT(b.x[r * 8], first_val);
  }
  cfg.val_fraction = 0.0;
  cfg.validation = false;
  cfg.batch_size = 1000;
  EXPECT_NE(error_of([&] { DataLoader dl(cfg); }).find("fewer than one global batch"), std::string::npos);
  fs::remove_all(d);
}

TEST(Corpus, FortunesSplitIntoDocuments) {
  auto docs = default_corpus_documents();
  EXPECT_GT(docs.size(), 5000u);
  size_t bytes = 0;
  for (auto& doc : docs) {
    bytes += doc.size();
    ASSERT_EQ(doc.find("\n%\n"), std::string::npos);
  }
  EXPECT_GT(bytes, 2000000u);
  EXPECT_EQ(split_documents("a\n%\nb\nc\n%\n", "%"), (std::vector<std::string>{"a\n", "b\nc\n"}));
  EXPECT_EQ(split_documents("a\n%\nb", ""), (std::vector<std::string>{"a\n%\nb"}));
  EXPECT_NE(error_of([] { default_corpus_documents("/nonexistent/fortunes"); }).find("fortunes"), std::string::npos);
}
