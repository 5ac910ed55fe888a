// Data parallelism around the equivalence harness (test_dist_equivalence.cpp): the stage-0 bucket plan, the start-up
// checks (a config that differs between ranks, a group of the wrong size, copy engines where they cannot run), and
// checkpoints written once and loadable everywhere, with real processes over Gloo.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "dist/equivalence.h"

using namespace dscpp;
using dscpp::test::DistCase;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;
namespace fs = std::filesystem;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);

// Every data-parallel test runs Gloo ranks: in a build without Gloo (the GPU image) they skip instead of failing.
class NeedsGloo : public ::testing::Environment {
  void SetUp() override {
    if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  }
};
[[maybe_unused]] ::testing::Environment* const kNeedsGloo = ::testing::AddGlobalTestEnvironment(new NeedsGloo);

// The engine's start-up throws on every rank, each message holding `needle`.
void start_up_fails_everywhere(const std::function<DistCase(int rank)>& case_of, bool over_gloo_allowed,
                               const std::string& needle) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    const DistCase c = case_of(rank);
    auto m = make_model(test::model_config(c));
    m->init_weights(1);
    EngineOptions o;
    o.dp_group = pg.get();
    o.copy_engine_over_gloo = over_gloo_allowed;
    try {
      initialize(std::move(m), DeepSpeedConfig::from_string(test::config_json(c), 2), o);
      ADD_FAILURE() << "rank " << rank << ": the engine started";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    test::leave_together(*pg);
  }));
}

}  // namespace

TEST(GradBuckets, CoverTheFlatBufferAtParameterBoundaries) {
  for (const char* arch : {"gpt2", "llama"}) {
    auto m = make_model(test_fixtures::tiny_model_config(arch));
    const ParamSet& ps = m->params();
    for (int64_t size : {int64_t(1) << 40, int64_t(5000), int64_t(700), int64_t(33)}) {
      std::vector<FlatRange> b = plan_grad_buckets(ps, size);
      ASSERT_FALSE(b.empty());
      EXPECT_EQ(b.front().begin, 0);
      EXPECT_EQ(b.back().end, ps.flat_numel()) << arch << " size " << size;
      for (size_t k = 0; k < b.size(); k++) {
        EXPECT_GT(b[k].end, b[k].begin);
        EXPECT_LE(b[k].size(), size) << arch << " bucket " << k;
        if (k) {
          EXPECT_EQ(b[k].begin, b[k - 1].end) << arch << " buckets " << k - 1 << ", " << k << " not contiguous";
        }
        // A bucket starts at a parameter's offset unless it is a piece of a parameter larger than the bucket.
        bool at_param = b[k].begin == 0;
        for (const auto& p : ps.infos())
          at_param |= p.offset == b[k].begin ||
                      (p.numel > size && b[k].begin > p.offset && b[k].begin < p.offset + p.numel);
        EXPECT_TRUE(at_param) << arch << " size " << size << " bucket " << k << " starts at " << b[k].begin;
      }
      // The embeddings (the first unit) never share a bucket with a later parameter: a bucket ends there.
      const int64_t first_end = ps.units()[0].end;
      bool cut_there = false;
      for (const auto& bk : b) {
        EXPECT_FALSE(bk.begin < first_end && bk.end > first_end) << arch << " size " << size;
        cut_there |= bk.begin == first_end;
      }
      EXPECT_TRUE(cut_there) << arch << " size " << size;
      if (size == (int64_t(1) << 40)) {
        EXPECT_EQ(b.size(), 2u);  // the embeddings, and the rest
      }
    }
    EXPECT_THROW(plan_grad_buckets(ps, 0), Error);
  }
}

TEST(DataParallel, ConfigThatDiffersBetweenRanksIsReported) {
  start_up_fails_everywhere(
      [](int rank) { return test::dist_case(2, 0, "gpt2", [&](DistCase& c) { c.bucket = rank == 0 ? 1000 : 2000; }); },
      false, "ranks disagree at start-up: rank 1 has zero_optimization.reduce_bucket_size=2000, rank 0 1000");
}

// Our own keys are in the agreement like DeepSpeed's: a kernel choice that differs between ranks would change the
// collectives' order (fused head at stage 3) or the numerics, so it stops the job before the first collective.
TEST(DataParallel, EngineKeyThatDiffersBetweenRanksIsReported) {
  start_up_fails_everywhere(
      [](int rank) { return test::dist_case(2, 3, "gpt2", [&](DistCase& c) { c.fused_head = rank == 1; }); }, false,
      "ranks disagree at start-up: rank 1 has dscpp.fused_head=true, rank 0 false");
}

TEST(DataParallel, GroupSizeMustMatchConfigDpWorldSize) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    const DistCase c;
    auto m = make_model(test::model_config(c));
    EngineOptions o;
    o.dp_group = pg.get();
    try {
      initialize(std::move(m), DeepSpeedConfig::from_string(test::config_json(c), 1), o);  // resolved for 1 rank
      ADD_FAILURE() << "a group of 2 with dp_world_size 1 was accepted";
    } catch (const Error& e) {
      std::string w = e.what();
      EXPECT_TRUE(w.find("dp_world_size 1") != std::string::npos && w.find("has 2 ranks") != std::string::npos) << w;
    }
  }));
}

// dscpp.copy_engine.enabled where copies cannot run stops before any work, naming the key: without overlap_comm and
// at stage 1 when the config is parsed, on a Gloo group at start-up on every rank, before any collective.
TEST(DataParallel, CopyEnginesWhereTheyCannotRunAreAConfigError) {
  for (int stage : {0, 1}) {
    const DistCase c =
        test::dist_case(2, stage, "gpt2", [&](DistCase& d) { d.overlap = stage == 1, d.copy_engine = true; });
    try {
      DeepSpeedConfig::from_string(test::config_json(c), 2);
      ADD_FAILURE() << c.name() << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key, "dscpp.copy_engine.enabled") << e.what();
    }
  }
  start_up_fails_everywhere(
      [](int) { return test::dist_case(2, 0, "gpt2", [](DistCase& c) { c.overlap = true, c.copy_engine = true; }); },
      false, "dscpp.copy_engine.enabled: copy-engine reductions need the nccl backend");
}

// Rank 0 writes, the others return from save only once the tag is committed; every rank loads the same states.
TEST(DataParallel, CheckpointSavedOnceLoadedEverywhere) {
  const fs::path dir = fs::temp_directory_path() / ("dscpp_dp_ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const DistCase c = test::dist_case(2, 0, "gpt2", [](DistCase& d) { d.gas = 1, d.overlap = true, d.bucket = 500; });
  auto results = run_ranks(2, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto world_pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    auto pg_a = world_pg->new_subgroup({0, 1}), pg_b = world_pg->new_subgroup({0, 1});
    auto a = test::make_engine(c, pg_a.get());
    const std::vector<float> pa = test::train(*a, c, rank, c.gas).params;
    a->save_checkpoint(dir.string(), "", {{"rank_saved", rank}});
    EXPECT_TRUE(fs::exists(dir / "latest")) << "rank " << rank << " returned from save before the commit";
    auto b = test::make_engine(c, pg_b.get());
    nlohmann::json cs = b->load_checkpoint(dir.string());
    EXPECT_EQ(cs.at("rank_saved").get<int>(), 0) << "the checkpoint was not written by rank 0";
    EXPECT_EQ(b->global_steps(), 3);
    EXPECT_EQ(test::named_params(*b), pa) << "loaded parameters";
  });
  fs::remove_all(dir);
  expect_all_pass(results);
}
