// Asynchronous checkpoints (async_checkpointer.h): the background path writes the same bytes as the synchronous
// one (manifests differ only in created_unix_ns), alone and with 2 ranks through the store; the caller may change
// its tensors once save() returns; save() returns while its write is held up in the background, and a second save
// waits for the first; a background failure surfaces on wait() and on the next save() and leaves the previous tag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "dist/multiprocess.h"
#include "checkpoint/fault_injection.h"
#include "dscpp/checkpoint/async_checkpointer.h"
#include "dscpp/comm/store.h"
#include "dscpp/core/rng.h"
#include "checkpoint_fixtures.h"

using namespace dscpp;
using dscpp::test_fixtures::random_tensor;
using dscpp::test_fixtures::slurp;
using dscpp::test_fixtures::spit;
using dscpp::test_fixtures::expect_ckpt_error;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::string test_dir() { return test_fixtures::checkpoint_test_dir("dscpp_ckpt_async"); }



// Every file below dir/tag, by relative name.
std::map<std::string, std::string> tree(const std::string& d) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file()) out[fs::relative(e.path(), d).string()] = slurp(e.path().string());
  return out;
}

// Sync and async trees must match byte for byte except the manifest's timestamp.
void expect_same_tree(const std::string& a, const std::string& b) {
  auto ta = tree(a), tb = tree(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (auto& [name, bytes] : ta) {
    ASSERT_TRUE(tb.count(name)) << name << " missing from " << b;
    if (name == "manifest.json") {
      auto ma = nlohmann::json::parse(bytes), mb = nlohmann::json::parse(tb[name]);
      EXPECT_NE(ma["created_unix_ns"], nullptr);
      ma.erase("created_unix_ns");
      mb.erase("created_unix_ns");
      EXPECT_EQ(ma, mb) << "manifests differ beyond created_unix_ns";
    } else {
      EXPECT_TRUE(bytes == tb[name]) << name << " differs between the sync and async saves";
    }
  }
}

// A rank's plan: a shard with several dtypes, rank 0 also a JSON state and a model file.
SavePlan make_plan(const std::string& dir, const std::string& tag, int rank, int64_t n = 3000) {
  SavePlan p{dir, tag, {}, true, 0};
  if (rank == 0) {
    p.files.push_back(PlanFile::json_file("engine_state.json", {{"step", 7}, {"zero", {{"stage", 1}}}}));
    p.files.push_back(PlanFile::tensors_file("model_states.safetensors",
                                             {{"wte", random_tensor({17, 5}, DType::bf16, 3)},
                                              {"ln.w", random_tensor({5}, DType::f16, 4)}},
                                             {{"format", "pt"}}));
  }
  p.files.push_back(PlanFile::tensors_file("zero/rank_" + std::to_string(rank) + ".safetensors",
                                           {{"fp32", random_tensor({n}, DType::f32, 10 + uint64_t(rank))},
                                            {"exp_avg", random_tensor({n}, DType::f32, 20 + uint64_t(rank))}}));
  return p;
}

class AsyncTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test_dir(); }
  void TearDown() override {
    set_checkpoint_fault_hook({});
    fs::remove_all(dir_);
  }
  std::string dir_;
};

}  // namespace

TEST_F(AsyncTest, ByteIdenticalToSyncAndSnapshotIsACopy) {
  SavePlan plan = make_plan(dir_ + "/sync", "t1", 0);
  save_checkpoint(plan);
  plan.save_dir = dir_ + "/async";
  AsyncCheckpointer ck;
  ck.save(plan);
  // The snapshot was taken: overwriting the caller's tensors now must not reach the files.
  for (auto& f : plan.files)
    for (auto& [name, t] : f.tensors) std::memset(t.raw(), 0x7F, t.nbytes());
  ck.wait();
  EXPECT_FALSE(ck.in_flight());
  expect_same_tree(dir_ + "/sync/t1", dir_ + "/async/t1");
  EXPECT_EQ(read_latest_tag(dir_ + "/async"), "t1");
  const AsyncSaveStats& st = ck.last_stats();
  EXPECT_GT(st.bytes, 24000u);
  EXPECT_EQ(st.bytes, st.save.bytes);
  EXPECT_GT(st.write_seconds, 0.0);
}

TEST_F(AsyncTest, SecondSaveWaitsForTheFirst) {
  // The first save's commit is held up in the background until the test releases it: save() has returned while its
  // write is not done (the caller does not pay for it), and a second save() cannot return before the release.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> holds{0};
  set_checkpoint_fault_hook([&](FaultPoint p) {
    if (p == FaultPoint::before_manifest && holds++ == 0) released.wait();
  });
  AsyncCheckpointer ck;
  ck.save(make_plan(dir_, "a", 0));
  EXPECT_TRUE(ck.in_flight());
  EXPECT_FALSE(fs::exists(dir_ + "/a")) << "the first save is held up";
  std::atomic<bool> returned{false};
  std::thread second([&] {
    ck.save(make_plan(dir_, "b", 0));
    returned = true;
  });
  std::this_thread::sleep_for(200ms);  // room for a save() that does not wait to return; one that waits never does
  EXPECT_FALSE(returned) << "save() returned while the save in flight was held up";
  release.set_value();
  second.join();
  EXPECT_TRUE(fs::exists(dir_ + "/a/manifest.json")) << "the first save is committed before the second starts";
  ck.wait();
  EXPECT_EQ(list_tags(dir_), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(read_latest_tag(dir_), "b");
}

TEST_F(AsyncTest, BackgroundFailureSurfacesOnWaitAndNextSave) {
  AsyncCheckpointer ck;
  ck.save(make_plan(dir_, "good", 0));
  ck.wait();
  set_checkpoint_fault_hook([](FaultPoint p) {
    if (p == FaultPoint::after_tensor_write) throw std::runtime_error("injected: disk full");
  });
  ck.save(make_plan(dir_, "bad", 0));  // returns: the failure happens in the background
  try {
    ck.wait();
    ADD_FAILURE() << "wait() did not rethrow the background failure";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("injected: disk full"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ck.wait()) << "a failure is reported once";
  EXPECT_EQ(read_latest_tag(dir_), "good");
  EXPECT_FALSE(fs::exists(dir_ + "/bad"));
  EXPECT_FALSE(fs::exists(dir_ + "/bad.tmp"));

  ck.save(make_plan(dir_, "bad", 0));  // still failing; this time the next save() reports it
  EXPECT_THROW(ck.save(make_plan(dir_, "later", 0)), std::runtime_error);
  set_checkpoint_fault_hook({});
  ck.save(make_plan(dir_, "later", 0));
  ck.wait();
  EXPECT_EQ(read_latest_tag(dir_), "later");
}

// 64 MiB (DSCPP_CKPT_BENCH_MIB): the caller pays for a memory copy, the background thread for the write, CRC and fsync
// (a timing report; that save() returns before the write ends is SecondSaveWaitsForTheFirst's event-ordered check).
TEST_F(AsyncTest, LargeSaveReportsItsTimes) {
  const char* mib_env = std::getenv("DSCPP_CKPT_BENCH_MIB");  // default 64 MiB, two tensors
  const int64_t n = (mib_env ? std::atoll(mib_env) : 64) << 17;
  SavePlan plan{dir_, "big", {}, true, 0};
  plan.files.push_back(PlanFile::tensors_file("zero/rank_0.safetensors",
                                              {{"fp32", random_tensor({n}, DType::f32, 1)},
                                               {"exp_avg", random_tensor({n}, DType::f32, 2)}}));
  AsyncCheckpointer ck;
  ck.save(plan);
  ck.wait();
  const AsyncSaveStats& st = ck.last_stats();
  std::printf("async save of %.0f MiB: stall %.1f ms (snapshot %.1f ms), write %.1f ms (%.2f GB/s), commit %.1f ms\n",
              double(st.bytes) / (1 << 20), st.stall_seconds * 1e3, st.snapshot_seconds * 1e3, st.write_seconds * 1e3,
              st.gbps(), st.commit_seconds * 1e3);
  EXPECT_GE(st.bytes, uint64_t(n) * 8);
}

// Two ranks, each saving in the background through the store; then the same synchronously: identical trees.
TEST_F(AsyncTest, TwoRanksAsyncMatchesSync) {
  const std::string dir = dir_;
  auto res = test::run_ranks(2, [&](int rank, int port) {
    StoreHandle h = connect_store("127.0.0.1", port, rank, rank == 0, 20s);
    SaveGroup g{h.store, rank, 2, 20s};
    AsyncCheckpointer ck(g);
    ck.save(make_plan(dir + "/async", "s1", rank));
    ck.save(make_plan(dir + "/async", "s2", rank));
    ck.wait();
    SaveStats s = save_checkpoint(make_plan(dir + "/sync", "s2", rank), g);
    if (rank == 0) {
      EXPECT_EQ(s.rank_bytes.size(), 2u);
    }
    h.store->set("test/bye/" + std::to_string(rank), std::string("1"));
    if (rank == 0) h.store->wait({"test/bye/1"});
  }, 40s);
  test::expect_all_pass(res);
  EXPECT_EQ(read_latest_tag(dir + "/async"), "s2");
  EXPECT_EQ(list_tags(dir + "/async"), (std::vector<std::string>{"s1", "s2"}));
  expect_same_tree(dir + "/sync/s2", dir + "/async/s2");
  CheckpointReader r(dir + "/async");
  EXPECT_TRUE(r.has_file("zero/rank_0.safetensors"));
  EXPECT_TRUE(r.has_file("zero/rank_1.safetensors"));
}
