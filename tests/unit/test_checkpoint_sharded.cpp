// Multi-rank checkpoint saves (sharded_writer.h) with 1, 2 and 4 forked ranks meeting through a TcpStore:
// one committed tag listing every rank's files and read back bit-exactly; a rank killed (or throwing, or hanging)
// at every point of the protocol leaves the previous tag loadable and `latest` untouched while the survivors fail
// promptly naming it; corrupted, truncated or missing shard files and a foreign world size give named errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dist/multiprocess.h"
#include "checkpoint/fault_injection.h"
#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/checkpoint/sharded_writer.h"
#include "dscpp/comm/store.h"
#include "dscpp/core/rng.h"
#include "checkpoint_fixtures.h"

using namespace dscpp;
using dscpp::test_fixtures::random_tensor;
using dscpp::test_fixtures::slurp;
using dscpp::test_fixtures::spit;
using dscpp::test_fixtures::expect_ckpt_error;
namespace fs = std::filesystem;
using K = CheckpointErrorKind;
using namespace std::chrono_literals;

namespace {

std::string test_dir() { return test_fixtures::checkpoint_test_dir("dscpp_ckpt_sharded"); }


void expect_same_bytes(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what << ": bytes differ";
}


std::string shard_name(int rank) { return "zero/rank_" + std::to_string(rank) + ".safetensors"; }

// Rank r's shard of save `version`: two tensors, so a fault after the first tensor lands mid-file.
NamedTensors shard_tensors(int rank, int version) {
  uint64_t seed = uint64_t(1000 * version + rank);
  return {{"fp32", random_tensor({1000 + rank}, DType::f32, seed)},
          {"exp_avg", random_tensor({1000 + rank}, DType::f32, seed + 500)}};
}

// One rank's part of a save, laid out as zero_layout.md says (rank 0 adds the engine state and model).
void save_rank(const std::string& dir, const std::string& tag, const SaveGroup& g, int version, int keep_last = 0) {
  ShardedWriter w(dir, tag, g);
  if (g.rank == 0) {
    w.add_json("engine_state.json", {{"version", version}, {"zero", {{"world_size", g.world_size}}}});
    w.add_tensors("model_states.safetensors", {{"wte", random_tensor({7, 3}, DType::bf16, uint64_t(version))}});
  }
  w.add_tensors(shard_name(g.rank), shard_tensors(g.rank, version), {{"rank", std::to_string(g.rank)}});
  w.commit(true, keep_last);
  EXPECT_GT(w.stats().bytes, 8000u);
}

// The parent's view of a complete tag written by `world` ranks at `version`.
void expect_tag(const std::string& dir, const std::string& tag, int world, int version) {
  CheckpointReader r(dir, tag);
  EXPECT_EQ(checkpoint_world_size(r), world);
  EXPECT_EQ(r.files().size(), size_t(2 + world)) << "engine_state, model_states and one shard per rank";
  EXPECT_EQ(r.read_json("engine_state.json")["version"].get<int>(), version);
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(r.has_file(shard_name(rank))) << "manifest lacks rank " << rank << "'s shard";
    auto files = checkpoint_files_of_rank(r, rank);
    EXPECT_NE(std::find(files.begin(), files.end(), shard_name(rank)), files.end());
    auto got = r.read_tensors(shard_name(rank));
    for (const auto& [name, t] : shard_tensors(rank, version))
      expect_same_bytes(got.at(name), t, tag + "/" + shard_name(rank) + ":" + name);
  }
}

SaveGroup group_of(const StoreHandle& h, int rank, int world, std::chrono::milliseconds timeout = 20s) {
  return SaveGroup{h.store, rank, world, timeout};
}

// Rank 0 hosts the store: it may leave only after the others are done with it.
void leave(TcpStore& s, int rank, int world, int dead_rank = -1) {
  s.set("test/bye/" + std::to_string(rank), std::string("1"));
  if (rank != 0) return;
  auto deadline = std::chrono::steady_clock::now() + 20s;
  for (int r = 1; r < world; ++r)
    while (r != dead_rank && !s.try_get("test/bye/" + std::to_string(r)) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(2ms);
}

// Every rank reaches this point before any leaves it.
// A barrier that rank 0, the store's host, leaves last: a rank still waiting on it when rank 0 goes on and dies
// would see the lost connection instead of the failure under test.
void sync_ranks(TcpStore& s, const std::string& name, int rank, int world) {
  const std::string k = "test/sync/" + name;
  if (s.add(k, 1) == world) s.set(k + "/all", std::string("1"));
  s.wait({k + "/all"});
  if (s.add(k + "/left", 1) == world) s.set(k + "/left/all", std::string("1"));
  if (rank == 0) s.wait({k + "/left/all"});
}

}  // namespace

// ---- a committed multi-rank save ----

class ShardedSave : public ::testing::TestWithParam<int> {};

TEST_P(ShardedSave, EveryRankCommitsOneTagReadBackBitExact) {
  const int world = GetParam();
  const std::string dir = test_dir();
  auto res = test::run_ranks(world, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 20s);
    SaveGroup g = group_of(h, rank, world);
    save_rank(dir, "s1", g, 1);
    save_rank(dir, "s2", g, 2);
    save_rank(dir, "s2", g, 3);                 // a re-save of a tag replaces it (a new per-tag save count)
    save_rank(dir, "s3", g, 4, /*keep_last=*/2);
    leave(*h.store, rank, world);
  }, 60s);
  test::expect_all_pass(res);
  EXPECT_EQ(read_latest_tag(dir), "s3");
  EXPECT_EQ(list_tags(dir), (std::vector<std::string>{"s2", "s3"})) << "keep_last 2 prunes s1";
  expect_tag(dir, "s2", world, 3);
  expect_tag(dir, "s3", world, 4);
  EXPECT_FALSE(fs::exists(dir + "/s3.tmp"));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(World, ShardedSave, ::testing::Values(2, 4));

// Without a store the writer is CheckpointWriter: same data bytes, a manifest CheckpointReader reads.
TEST(ShardedWriterSingle, MatchesCheckpointWriterBytes) {
  const std::string dir = test_dir();
  NamedTensors ts = shard_tensors(0, 9);
  {
    CheckpointWriter a(dir + "/a", "t");
    a.add_tensors("x.safetensors", ts, {{"k", "v"}});
    a.add_json("s.json", {{"step", 3}});
    a.commit();
  }
  {
    ShardedWriter b(dir + "/b", "t");
    b.add_tensors("x.safetensors", ts, {{"k", "v"}});
    b.add_json("s.json", {{"step", 3}});
    b.commit();
  }
  for (const char* f : {"x.safetensors", "s.json"})
    EXPECT_EQ(slurp(dir + "/a/t/" + f), slurp(dir + "/b/t/" + f)) << f;
  CheckpointReader r(dir + "/b");
  EXPECT_EQ(r.tag(), "t");
  EXPECT_EQ(checkpoint_world_size(r), 1);
  EXPECT_EQ(checkpoint_world_size(CheckpointReader(dir + "/a")), 1) << "a manifest without world_size";
  expect_same_bytes(r.read_tensors("x.safetensors").at("fp32"), ts[0].second, "fp32");
  fs::remove_all(dir);
}

// ---- failures during a save ----

struct Kill {
  int victim;
  FaultPoint point;
  int occurrence;  // die the n-th time the point is reached after the hook is installed
  const char* what;
};

// A save of s2 over a committed s1; the victim _exit()s at the fault point (no destructors, like kill -9).
void run_kill(int world, const Kill& k) {
  SCOPED_TRACE(k.what);
  const std::string dir = test_dir();
  auto res = test::run_ranks(world, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 20s);
    SaveGroup g = group_of(h, rank, world);
    save_rank(dir, "s1", g, 1);
    sync_ranks(*h.store, "s1", rank, world);  // rank 0 must not die before every rank has seen s1 committed
    if (rank == k.victim) {
      auto seen = std::make_shared<int>(0);
      set_checkpoint_fault_hook([k, seen](FaultPoint p) {
        if (p == k.point && ++*seen == k.occurrence) _exit(3);
      });
    }
    try {
      save_rank(dir, "s2", g, 2);
      ADD_FAILURE() << "rank " << rank << ": the save succeeded although rank " << k.victim << " died";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(e.kind, K::peer_failed) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(k.victim) + ":"), std::string::npos)
          << "the error does not name the failed rank: " << e.what();
      EXPECT_EQ(std::string(e.what()).find("timed out"), std::string::npos)
          << "survivors must fail on the death, not at the 20 s timeout: " << e.what();
    }
    if (k.victim != 0) leave(*h.store, rank, world, k.victim);
  }, 40s);
  for (const auto& r : res) {
    if (r.rank == k.victim) EXPECT_EQ(r.message, "exit code 3") << "the victim did not reach the fault point";
    else EXPECT_TRUE(r.passed) << "rank " << r.rank << ": " << r.message;
  }
  EXPECT_EQ(read_latest_tag(dir), "s1") << "`latest` must keep naming the previous tag";
  expect_tag(dir, "s1", world, 1);
  bool renamed = k.victim == 0 && k.point == FaultPoint::before_latest;
  EXPECT_EQ(fs::exists(dir + "/s2"), renamed) << "s2 may appear only after rank 0's rename";
  if (renamed) expect_tag(dir, "s2", world, 2);  // complete, just not yet `latest`
  fs::remove_all(dir);
}

TEST(ShardedKill, AnyRankAtAnyPointLeavesPreviousTag) {
  const std::vector<Kill> kills = {  // the hook is installed after s1 is saved: occurrences count within s2
      {1, FaultPoint::before_shard_write, 1, "rank 1 before writing"},
      {1, FaultPoint::after_tensor_write, 1, "rank 1 mid-file"},  // after the 1st of its shard's 2 tensors
      {1, FaultPoint::before_shard_report, 1, "rank 1 after its files, before reporting"},
      {0, FaultPoint::before_shard_write, 1, "rank 0 before writing"},
      {0, FaultPoint::after_tensor_write, 2, "rank 0 mid-file"},
      {0, FaultPoint::before_rename, 1, "rank 0 after the manifest, before the rename"},
      {0, FaultPoint::before_latest, 1, "rank 0 after the rename, before latest"},
  };
  for (const auto& k : kills) run_kill(2, k);
}

TEST(ShardedKill, FourRanksOneDiesMidFile) {
  run_kill(4, {2, FaultPoint::after_tensor_write, 1, "rank 2 of 4 mid-file"});
}

// A rank that throws (disk full, bad tensor) reports it: every other rank fails with its reason.
TEST(ShardedFailure, ExceptionOnOneRankNamesItEverywhere) {
  const int world = 4;
  const std::string dir = test_dir();
  auto res = test::run_ranks(world, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 20s);
    SaveGroup g = group_of(h, rank, world);
    save_rank(dir, "s1", g, 1);
    if (rank == 3)
      set_checkpoint_fault_hook([](FaultPoint p) {
        if (p == FaultPoint::after_tensor_write) throw std::runtime_error("injected: disk full");
      });
    try {
      save_rank(dir, "s2", g, 2);
      ADD_FAILURE() << "the save succeeded";
    } catch (const std::exception& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(rank == 3 ? "injected: disk full" : "rank 3: injected: disk full"), std::string::npos)
          << "rank " << rank << ": " << msg;
    }
    leave(*h.store, rank, world);
  }, 40s);
  test::expect_all_pass(res);
  EXPECT_EQ(read_latest_tag(dir), "s1");
  EXPECT_FALSE(fs::exists(dir + "/s2"));
  EXPECT_FALSE(fs::exists(dir + "/s2.tmp")) << "rank 0 removes the temp dir of a failed save";
  expect_tag(dir, "s1", world, 1);
  fs::remove_all(dir);
}

// A rank that hangs: rank 0 gives up after the group's timeout naming it; the hung rank then learns the save failed.
TEST(ShardedFailure, HungRankTimesOutNamingIt) {
  const std::string dir = test_dir();
  auto res = test::run_ranks(2, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 20s);
    SaveGroup g = group_of(h, rank, 2, 500ms);
    if (rank == 1)
      set_checkpoint_fault_hook([](FaultPoint p) {
        if (p == FaultPoint::before_shard_report) std::this_thread::sleep_for(1500ms);
      });
    try {
      save_rank(dir, "s1", g, 1);
      ADD_FAILURE() << "the save succeeded";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(e.kind, K::peer_failed) << e.what();
      EXPECT_NE(std::string(e.what()).find("timed out after 500 ms waiting for rank(s) 1"), std::string::npos)
          << "rank " << rank << ": " << e.what();
    }
    leave(*h.store, rank, 2);
  }, 30s);
  test::expect_all_pass(res);
  EXPECT_FALSE(fs::exists(dir + "/s1"));
  EXPECT_THROW(read_latest_tag(dir), CheckpointError);
  fs::remove_all(dir);
}

// ---- loading a damaged multi-rank checkpoint ----


TEST(ShardedLoad, DamagedShardsAndForeignWorldSizeAreNamed) {
  const std::string dir = test_dir();
  auto res = test::run_ranks(2, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 20s);
    save_rank(dir, "s1", group_of(h, rank, 2), 1);
    leave(*h.store, rank, 2);
  });
  test::expect_all_pass(res);
  expect_tag(dir, "s1", 2, 1);
  const std::string shard = dir + "/s1/" + shard_name(1);
  const std::string good = slurp(shard);
  auto put = [&](const std::string& bytes) { std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes; };

  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 0x10;
  put(flipped);
  expect_ckpt_error([&] { CheckpointReader r(dir); }, K::corrupted, {shard, "CRC32"});

  put(good.substr(0, good.size() - 100));
  expect_ckpt_error([&] { CheckpointReader r(dir); }, K::truncated, {shard, "size mismatch"});

  fs::remove(shard);
  expect_ckpt_error([&] { CheckpointReader r(dir); }, K::missing_file, {shard, "missing file"});

  put(good);
  CheckpointReader r(dir);
  check_checkpoint_world_size(r, 2);
  expect_ckpt_error([&] { check_checkpoint_world_size(r, 4); }, K::mismatch,
                    {dir + "/s1/manifest.json", "saved by 2 ranks, this job has 4"});
  EXPECT_TRUE(checkpoint_files_of_rank(r, 3).empty());
  expect_ckpt_error([&] { r.read_tensors(shard_name(3)); }, K::missing_file, {shard_name(3), "not in the manifest"});
  fs::remove_all(dir);
}

// Write bandwidth with several ranks writing at once (DSCPP_CKPT_BENCH_MIB per rank, default 16; world
// DSCPP_CKPT_BENCH_WORLD, default 2): rank 0 prints every rank's bytes and GB/s from their reports.
TEST(ShardedThroughput, PerRankWriteBandwidth) {
  const char* mib_env = std::getenv("DSCPP_CKPT_BENCH_MIB");
  const char* world_env = std::getenv("DSCPP_CKPT_BENCH_WORLD");
  const int64_t mib = mib_env ? std::atoll(mib_env) : 16;
  const int world = world_env ? std::atoi(world_env) : 2;
  const std::string dir = test_dir();
  auto res = test::run_ranks(world, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 60s);
    Tensor big = Tensor::empty({mib << 18}, DType::f32);  // mib MiB
    auto* p = big.data<float>();
    for (int64_t i = 0; i < big.numel(); ++i) p[i] = float(i % 1000) * 0.5f + float(rank);
    ShardedWriter w(dir, "bench", group_of(h, rank, world, 120s));
    w.add_tensors(shard_name(rank), {{"fp32", big}});
    w.commit();
    if (rank == 0) {
      const SaveStats& s = w.stats();
      double total_bytes = 0, slowest = 0;
      for (int r = 0; r < world; ++r) {
        std::printf("rank %d: %.1f MiB in %.3f s = %.3f GB/s\n", r, double(s.rank_bytes[size_t(r)]) / (1 << 20),
                    s.rank_seconds[size_t(r)], double(s.rank_bytes[size_t(r)]) / s.rank_seconds[size_t(r)] / 1e9);
        total_bytes += double(s.rank_bytes[size_t(r)]);
        slowest = std::max(slowest, s.rank_seconds[size_t(r)]);
      }
      std::printf("all %d ranks: %.1f MiB, %.3f GB/s aggregate; commit %.3f s\n", world, total_bytes / (1 << 20),
                  total_bytes / slowest / 1e9, s.commit_seconds);
      EXPECT_EQ(s.rank_bytes.size(), size_t(world));
    }
    leave(*h.store, rank, world);
  }, 300s);
  test::expect_all_pass(res);
  fs::remove_all(dir);
}
