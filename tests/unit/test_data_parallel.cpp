// Data-parallel training (ZeRO stage 0) with real processes over Gloo (2 and 4 ranks): N steps on W ranks give the
// parameters of one process that sees the same global batch (its gradient accumulation covers all W ranks'
// micro-batches); overlap on/off and one/many buckets agree; replicas stay bitwise identical; a config that differs
// between ranks, or a group of the wrong size, is reported; checkpoints are written once and loadable everywhere.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "dist/multiprocess.h"
#include "train_compare.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"

using namespace dscpp;
using dscpp::test_fixtures::expect_close;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;
namespace fs = std::filesystem;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);
constexpr int64_t kB = 2, kT = 8, kSteps = 3;

ModelConfig tiny(const std::string& arch) {
  ModelConfig c = ModelConfig::preset(arch == "gpt2" ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = arch == "gpt2" ? 2 : 1;
  c.n_embd = 16;
  c.n_ffn = arch == "gpt2" ? 64 : 40;
  c.vocab_size = 50;
  c.max_seq_len = 16;
  c.tie_embeddings = arch == "gpt2";  // Llama untied: the lm head's gradient is final before the blocks'
  return c;
}

// clip 0.05 is below the tiny models' gradient norms (checked below), so clipping is exercised. optimizer "sgd":
// plain SGD without clipping, whose update is proportional to the gradient (Adam's and clipping's are not).
// "fp16": AdamW with the fp16 engine path (loss scale 2^8, f32 masters) run on the f32 CPU model.
std::string config_json(int64_t gas, int64_t bucket, bool overlap, const std::string& optimizer = "adamw",
                        double lr = 0.01) {
  std::ostringstream j;
  j << R"({"train_micro_batch_size_per_gpu": )" << kB << R"(, "gradient_accumulation_steps": )" << gas;
  if (optimizer == "sgd")
    j << R"(, "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "gradient_clipping": 0.0)";
  else
    j << R"(, "optimizer": {"type": "AdamW", "params": {"lr": )" << lr << R"(, "weight_decay": 0.1}},
        "gradient_clipping": 0.05)";
  if (optimizer == "fp16") j << R"(, "fp16": {"enabled": true, "initial_scale_power": 8})";
  j << R"(,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2, "warmup_type": "linear"}},
        "zero_optimization": {"stage": 0, "reduce_bucket_size": )" << bucket
    << R"(, "overlap_comm": )" << (overlap ? "true" : "false") << "}}";
  return j.str();
}

// Micro-batch j of step s, the same token stream in every process: [kB, kT] inputs and next-token targets.
void micro_batch(int64_t s, int64_t j, Tensor& x, Tensor& y, int64_t vocab) {
  Rng rng(RngState{777, uint64_t(s * 1000 + j) << 20, 4});
  for (int64_t i = 0; i < kB * kT; i++) {
    x.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(vocab));
    y.data<int32_t>()[i] = int32_t(rng.next_u32() % uint32_t(vocab));
  }
}

std::unique_ptr<Engine> make_engine(const std::string& arch, const DeepSpeedConfig& cfg, ProcessGroup* pg,
                                    uint64_t init_seed) {
  auto m = make_model(tiny(arch));
  m->init_weights(init_seed);
  EngineOptions o;
  o.dp_group = pg;
  o.mixed_precision_on_f32_model = cfg.fp16.enabled;
  return initialize(std::move(m), cfg, o);
}

struct Trained {
  std::vector<float> params;  // the flat parameters after kSteps
  std::vector<float> norms;   // gradient norm (before clipping) of each step: sees the gradients' scale, which
                              // clipping and Adam would hide from the parameters
};

// Trains kSteps; rank r of W takes micro-batches j = r*gas + m, so the W ranks together cover j in [0, W*gas).
Trained train(Engine& e, const std::string& arch, int rank, int64_t gas) {
  Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
  Trained out;
  for (int64_t s = 0; s < kSteps; s++) {
    for (int64_t m = 0; m < gas; m++) {
      micro_batch(s, rank * gas + m, x, y, tiny(arch).vocab_size);
      e.forward(x, y);
      e.backward();
      e.step();
    }
    out.norms.push_back(float(e.last_grad_norm()));
  }
  const Tensor& p = e.model().params().flat_params();
  out.params.assign(p.data<float>(), p.data<float>() + p.numel());
  return out;
}

// One process, the same global batch: gradient accumulation over all W*gas micro-batches.
Trained reference(const std::string& arch, int world, int64_t gas, const std::string& optimizer) {
  DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(gas * world, 1 << 30, false, optimizer), 1);
  auto e = make_engine(arch, cfg, nullptr, 42);
  return train(*e, arch, 0, gas * world);
}


// Every rank's params equal rank 0's bit for bit (stage 0 replicas).
void expect_replicas_identical(ProcessGroup& pg, const std::vector<float>& mine) {
  Tensor t = Tensor::empty({int64_t(mine.size())}, DType::f32);
  std::copy(mine.begin(), mine.end(), t.data<float>());
  pg.broadcast(t, 0)->wait();
  int64_t differ = 0;
  for (size_t i = 0; i < mine.size(); i++) differ += t.data<float>()[i] != mine[i];
  EXPECT_EQ(differ, 0) << "rank " << pg.rank() << " differs from rank 0 in " << differ << " parameters";
}

// DP training on `world` ranks vs the single-process reference (f32, a few steps: 1e-5 relative).
// Buckets overlapping the embedding tables: final only after the embedding backward, the last window.
int64_t buckets_after_last_window(const ParamSet& ps, const std::vector<GradBucket>& buckets) {
  int64_t emb_end = ps.flat_numel();
  for (const auto& p : ps.infos())
    if (p.name.find("wte") == std::string::npos && p.name.find("wpe") == std::string::npos &&
        p.name.find("embed_tokens") == std::string::npos)
      emb_end = std::min(emb_end, p.offset);
  int64_t n = 0;
  for (const GradBucket& b : buckets) n += b.begin < emb_end;
  return n;
}

void dp_matches_reference(const std::string& arch, int world, int64_t gas, int64_t bucket, bool overlap,
                          const std::string& optimizer = "adamw", bool windows = false,
                          const std::string& side = "") {
  auto results = run_ranks(world, [&](int rank, int port) {
    omp_set_num_threads(1);
    if (windows) setenv("DSCPP_COMM_WINDOW", "attention", 1);  // a forked rank: the parent's env is untouched
    if (side == "lean") setenv("DSCPP_DP_LEAN_CTAS", "4", 1), setenv("DSCPP_DP_TAIL_BUCKETS", "1", 1);
    if (side.rfind("copies", 0) == 0) setenv("DSCPP_DP_COPY_ENGINE", "1", 1);  // its default tail: 1 bucket
    if (side == "copies-compute-sum") setenv("DSCPP_DP_COPY_SUM", "compute", 1);  // Note [Sums on the compute stream]
    if (side == "split") setenv("DSCPP_DP_SPLIT_TAIL", "1", 1);  // Note [Tail bucket in halves]
    auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, kTimeout);
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(gas, bucket, overlap, optimizer), world);
    // Each rank initialises differently: the engine must broadcast rank 0's parameters.
    auto e = make_engine(arch, cfg, pg.get(), 42 + uint64_t(rank) * 1000);
    ASSERT_NE(e->grad_reducer(), nullptr);
    const auto& buckets = e->grad_reducer()->buckets();
    if (bucket < 1000) EXPECT_GT(buckets.size(), 3u) << "expected several buckets";
    else EXPECT_EQ(buckets.size(), 2u);  // the embeddings, and the rest (Note [Gradient buckets])
    Trained got = train(*e, arch, rank, gas);
    EXPECT_EQ(e->grad_reducer()->launch_at_windows(), windows && overlap);
    const GradReducer& red = *e->grad_reducer();
    const bool side_group = (side == "lean" || side.rfind("copies", 0) == 0) && overlap;
    EXPECT_EQ(red.buckets_on_side_group(), side_group ? int64_t(buckets.size()) - 1 : 0);
    // Note [Tail bucket in halves]: when asked for, for a last bucket the world divides.
    const bool divisible = (buckets.back().end - buckets.back().begin) % world == 0;
    EXPECT_EQ(red.tails_split(), side == "split" && divisible ? kSteps : 0) << "last bucket "
        << buckets.back().end - buckets.back().begin << " elements";
    if (side.rfind("copies", 0) == 0 && overlap) {  // every side bucket whose size the world divides
      int64_t divisible = 0;
      for (int64_t k = 0; k < red.buckets_on_side_group(); k++)
        divisible += (buckets[size_t(k)].end - buckets[size_t(k)].begin) % world == 0;
      EXPECT_GT(divisible, 0);
      EXPECT_EQ(red.buckets_by_copies(), divisible);
      if (side == "copies-compute-sum") {
        EXPECT_GT(red.sums_on_compute_stream(), 0) << "Note [Sums on the compute stream]";
      } else {
        EXPECT_EQ(red.sums_on_compute_stream(), 0);
      }
    } else {
      EXPECT_EQ(red.buckets_by_copies(), 0);
    }
    const int64_t late = windows ? buckets_after_last_window(e->model().params(), buckets) : 0;
    if (windows) {
      EXPECT_GT(late, 0);
    }
    EXPECT_EQ(e->grad_reducer()->buckets_launched_early(), overlap ? int64_t(buckets.size()) - late : 0)
        << "overlap_comm launches every bucket during backward (at windows: all but the embeddings')";
    Trained want = reference(arch, world, gas, optimizer);
    if (optimizer != "sgd") {
      EXPECT_GT(*std::min_element(want.norms.begin(), want.norms.end()), 0.05) << "clipping never engaged";
    }
    const std::string what = arch + " rank " + std::to_string(rank);
    expect_close(got.norms, want.norms, 1e-5, what + " gradient norms");
    expect_close(got.params, want.params, 1e-5, what + " parameters");
    expect_replicas_identical(*pg, got.params);
    // The printed loss is the mean over ranks, the same everywhere.
    float gl = e->global_last_loss();
    std::vector<float> all = all_reduce_values(*pg, {gl}, ReduceOp::max, Device::cpu());
    EXPECT_EQ(all[0], gl);
  });
  expect_all_pass(results);
}

}  // namespace

// Every data-parallel test runs Gloo ranks: in a build without Gloo (the GPU image) they skip instead of failing.
class NeedsGloo : public ::testing::Environment {
  void SetUp() override {
    if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  }
};
[[maybe_unused]] ::testing::Environment* const kNeedsGloo = ::testing::AddGlobalTestEnvironment(new NeedsGloo);

TEST(GradBuckets, CoverTheFlatBufferInReverseAtParameterBoundaries) {
  for (const char* arch : {"gpt2", "llama"}) {
    auto m = make_model(tiny(arch));
    const ParamSet& ps = m->params();
    for (int64_t size : {int64_t(1) << 40, int64_t(5000), int64_t(700), int64_t(33)}) {
      std::vector<GradBucket> b = plan_grad_buckets(ps, size);
      ASSERT_FALSE(b.empty());
      EXPECT_EQ(b.front().end, ps.flat_numel()) << arch << " size " << size;
      EXPECT_EQ(b.back().begin, 0);
      for (size_t k = 0; k < b.size(); k++) {
        EXPECT_GT(b[k].end, b[k].begin);
        EXPECT_LE(b[k].end - b[k].begin, size) << arch << " bucket " << k;
        if (k) {
          EXPECT_EQ(b[k].end, b[k - 1].begin) << arch << " buckets " << k - 1 << ", " << k << " not contiguous";
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

TEST(DataParallel, Gpt2TwoRanksOverlapManyBucketsMatchesOneProcess) { dp_matches_reference("gpt2", 2, 2, 700, true); }
TEST(DataParallel, LlamaTwoRanksNoOverlapOneBucketMatchesOneProcess) {
  dp_matches_reference("llama", 2, 3, int64_t(1) << 30, false);
}
TEST(DataParallel, Gpt2FourRanksNoOverlapManyBuckets) { dp_matches_reference("gpt2", 4, 1, 500, false); }
// Note [Tail bucket in halves]: the last bucket reduce-scattered, its gather left to the step; the same result, with
// overlap (the 100-element tail of a 700-element plan) and without (a 200-element tail), and under fp16's scaler.
TEST(DataParallel, SplitTailMatchesOneProcess) {
  dp_matches_reference("gpt2", 2, 2, 700, true, "adamw", false, "split");
  dp_matches_reference("llama", 4, 1, 300, false, "adamw", false, "split");
  dp_matches_reference("llama", 2, 2, 500, true, "fp16", false, "split");
}
TEST(DataParallel, LlamaFourRanksOverlapManyBuckets) { dp_matches_reference("llama", 4, 2, 300, true); }
// Note [Communication windows]: deferring buckets changes when they are reduced, not what.
TEST(DataParallel, CommWindowsMatchOneProcess) {
  dp_matches_reference("gpt2", 2, 2, 700, true, "adamw", true);
  dp_matches_reference("llama", 4, 1, 300, true, "adamw", true);
}
// Note [Lean buckets]: all but the last bucket through a second group (on Gloo an ordinary one): same result.
TEST(DataParallel, LeanGroupForEarlyBucketsMatchesOneProcess) {
  dp_matches_reference("gpt2", 2, 2, 700, true, "adamw", false, "lean");
  dp_matches_reference("llama", 4, 1, 300, true, "adamw", true, "lean");
}
// Note [Copy-engine buckets]: all-reduced as all_to_all + local sum + all_gather (on Gloo, the same three steps),
// the gradients in the side group's symmetric memory: the same result.
// With DSCPP_DP_COPY_SUM=compute each side bucket's sum runs on the compute stream at the next hook or window (Note
// [Sums on the compute stream]); with 300- and 700-element buckets several become ready at one hook, so a scratch
// slice is also summed before its reuse.
TEST(DataParallel, CopyEngineBucketsMatchOneProcess) {
  dp_matches_reference("gpt2", 2, 2, 700, true, "adamw", false, "copies");
  dp_matches_reference("llama", 4, 2, 300, true, "adamw", true, "copies-compute-sum");
  dp_matches_reference("gpt2", 4, 1, 300, true, "adamw", false, "copies-compute-sum");
}
TEST(DataParallel, CopyEngineAndLeanCtasTogetherAreAnError) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    setenv("DSCPP_DP_COPY_ENGINE", "1", 1), setenv("DSCPP_DP_LEAN_CTAS", "4", 1);
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(1, 700, true), 2);
    try {
      make_engine("gpt2", cfg, pg.get(), 42);
      ADD_FAILURE() << "both side-group knobs were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("set one"), std::string::npos) << e.what();
    }
  }));
}
// An engine knob set to a bad value stops initialisation on every rank with an error naming it.
static void env_value_is_rejected(const char* var, const char* value, const char* switched_on = nullptr) {
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    setenv(var, value, 1);  // a forked rank: the parent's env is untouched
    if (switched_on) setenv(switched_on, "1", 1);
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(1, 700, true), 2);
    try {
      make_engine("gpt2", cfg, pg.get(), 42);
      ADD_FAILURE() << var << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(var) + "='" + value + "'"), std::string::npos) << e.what();
    }
  }));
}
TEST(DataParallel, LeanCtasBadValueIsAnError) { env_value_is_rejected("DSCPP_DP_LEAN_CTAS", "many"); }
TEST(DataParallel, CommWindowBadValueIsAnError) { env_value_is_rejected("DSCPP_COMM_WINDOW", "mlp"); }
TEST(DataParallel, CopySumBadValueIsAnError) {
  env_value_is_rejected("DSCPP_DP_COPY_SUM", "gpu", "DSCPP_DP_COPY_ENGINE");
}
TEST(DataParallel, Fp16EnginePathTwoRanks) { dp_matches_reference("llama", 2, 2, 500, true, "fp16"); }
TEST(DataParallel, SgdWithoutClippingTwoAndFourRanks) {
  dp_matches_reference("gpt2", 2, 2, 600, true, "sgd");
  dp_matches_reference("llama", 4, 1, 1 << 30, false, "sgd");
}

// overlap on/off x one/many buckets in one job (a sub-group per engine: config-hash keys are per group).
TEST(DataParallel, OverlapAndBucketSizeDoNotChangeTheResult) {
  const int world = 2;
  auto results = run_ranks(world, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto world_pg = new_process_group("gloo", rank, world, "127.0.0.1", port, kTimeout);
    std::vector<std::vector<float>> out;
    for (bool overlap : {false, true})
      for (int64_t bucket : {int64_t(1) << 30, int64_t(400)}) {
        auto pg = world_pg->new_subgroup({0, 1});
        auto e = make_engine("llama", DeepSpeedConfig::from_string(config_json(2, bucket, overlap), world), pg.get(), 9);
        out.push_back(train(*e, "llama", rank, 2).params);
      }
    for (size_t v = 1; v < out.size(); v++) expect_close(out[v], out[0], 1e-6, "variant " + std::to_string(v));
  });
  expect_all_pass(results);
}

TEST(DataParallel, ConfigThatDiffersBetweenRanksIsReported) {
  auto results = run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(1, 1000, true, "adamw", rank == 0 ? 0.01 : 0.02), 2);
    try {
      make_engine("gpt2", cfg, pg.get(), 1);
      ADD_FAILURE() << "rank " << rank << ": a config mismatch went unnoticed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ranks disagree at start-up: rank 1 has optimizer.params.lr=0.02, rank 0 "
                                           "0.01"), std::string::npos) << e.what();
    }
  });
  expect_all_pass(results);
}

TEST(DataParallel, GroupSizeMustMatchConfigDpWorldSize) {
  auto results = run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(1, 1000, true), 1);  // resolved for 1 rank
    try {
      make_engine("gpt2", cfg, pg.get(), 1);
      ADD_FAILURE() << "a group of 2 with dp_world_size 1 was accepted";
    } catch (const Error& e) {
      std::string w = e.what();
      EXPECT_TRUE(w.find("dp_world_size 1") != std::string::npos && w.find("has 2 ranks") != std::string::npos) << w;
    }
  });
  expect_all_pass(results);
}

// Rank 0 writes, the others return from save only once the tag is committed; every rank loads the same states.
TEST(DataParallel, CheckpointSavedOnceLoadedEverywhere) {
  const fs::path dir = fs::temp_directory_path() / ("dscpp_dp_ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto results = run_ranks(2, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto world_pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    auto pg_a = world_pg->new_subgroup({0, 1}), pg_b = world_pg->new_subgroup({0, 1});
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(config_json(1, 500, true), 2);
    auto a = make_engine("gpt2", cfg, pg_a.get(), 5);
    std::vector<float> pa = train(*a, "gpt2", rank, 1).params;
    a->save_checkpoint(dir.string(), "", {{"rank_saved", rank}});
    EXPECT_TRUE(fs::exists(dir / "latest")) << "rank " << rank << " returned from save before the commit";
    auto b = make_engine("gpt2", cfg, pg_b.get(), 77);
    nlohmann::json cs = b->load_checkpoint(dir.string());
    EXPECT_EQ(cs.at("rank_saved").get<int>(), 0) << "the checkpoint was not written by rank 0";
    EXPECT_EQ(b->global_steps(), kSteps);
    const Tensor& p = b->model().params().flat_params();
    expect_close(std::vector<float>(p.data<float>(), p.data<float>() + p.numel()), pa, 0.0, "loaded params");
  });
  fs::remove_all(dir);
  expect_all_pass(results);
}
