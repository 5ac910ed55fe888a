// ZeRO stages 1-3 around the equivalence harness (test_dist_equivalence.cpp), with real processes over Gloo: an fp16
// overflow on one rank skips the step on every rank; each rank's model-state bytes are within 10% of the stage's
// theoretical figure; stage 3 prefetches and bounds the gathered parameters, and the memory estimator replays its
// buffers exactly; stages 1-2 defer their parameter gathers; checkpoints of partitioned engines resume bit for bit,
// export and reshard. Ownership arithmetic, the per-unit padding and the copy-engine arena budget are checked
// in-process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/runtime/zero_estimate.h"

#include "dist/equivalence.h"

using namespace dscpp;
using dscpp::test::DistCase;
using dscpp::test::expect_all_pass;
using dscpp::test::run_ranks;
using dscpp::test_fixtures::tiny_model_config;

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);
constexpr int64_t kB = 2, kT = 8;  // test::batch, test::seq of a Gloo case

// AdamW, whose two states ZeRO partitions (the estimator counts them too).
DistCase zero_case(int stage, const std::string& arch = "gpt2", int world = 2) {
  return test::dist_case(world, stage, arch, [](DistCase& c) { c.optimizer = "adamw"; });
}

// fn(engine, rank) on each of the case's Gloo ranks.
void on_engines(const DistCase& c, const std::function<void(Engine&, int)>& fn) {
  test::on_ranks(c, [&](ProcessGroup& pg, int rank) {
    auto e = test::make_engine(c, &pg);
    fn(*e, rank);
  });
}

}  // namespace

TEST(ZeroPartition, EveryRankOwnsOneEvenChunkOfEveryUnit) {
  std::vector<FlatRange> units{{0, 64}, {64, 192}, {192, 256}};
  for (int w : {1, 2, 4}) {
    int64_t covered = 0;
    for (int r = 0; r < w; r++) {
      ZeroPartition zp(2, w, r, units);
      auto owned = zp.owned();
      EXPECT_EQ(zp.shard_numel(), w == 1 ? 256 : 256 / w);
      int64_t n = 0;
      for (size_t u = 0; u < owned.size(); u++) {
        n += owned[u].size();
        if (w > 1) {
          EXPECT_EQ(owned[u].size(), units[u].size() / w);
          EXPECT_EQ(owned[u].begin, units[u].begin + r * (units[u].size() / w));
          EXPECT_EQ(zp.shard_offset(u) + owned[u].size(), u + 1 < owned.size() ? zp.shard_offset(u + 1) : n);
        }
      }
      EXPECT_EQ(n, zp.shard_numel());
      covered += n;
    }
    EXPECT_EQ(covered, 256);
    EXPECT_EQ(ZeroPartition(2, w, 0, units).unit_of(64), 1);
    EXPECT_EQ(ZeroPartition(2, w, 0, units).unit_of(255), 2);
  }
  EXPECT_THROW(ZeroPartition(1, 3, 0, units), Error);  // 64 does not split over 3 ranks
  ZeroPartition back = ZeroPartition::from_json(ZeroPartition(3, 4, 1, units).to_json(), 2);
  EXPECT_EQ(back.units(), units);
  EXPECT_EQ(back.stage(), 3);
  EXPECT_EQ(back.rank(), 2);
}

TEST(ZeroPartition, ModelUnitsArePaddedToTheWorldSize) {
  for (const char* arch : {"gpt2", "llama"}) {
    for (int64_t pad : {16, 64}) {
      ModelOptions mo;
      mo.pad_multiple = pad;
      auto m = make_model(tiny_model_config(arch), mo);
      const ParamSet& ps = m->params();
      const int64_t L = tiny_model_config(arch).n_layer;
      ASSERT_EQ(int64_t(ps.units().size()), L + 2) << arch;  // embeddings, blocks, final
      for (const FlatRange& u : ps.units()) EXPECT_EQ(u.begin % pad, 0) << arch;
      EXPECT_EQ(ps.units().back().end, ps.flat_numel());
      for (const ParamInfo& p : ps.infos()) {  // a parameter never straddles a unit
        int u = ps.unit_of(p.offset);
        EXPECT_LE(p.offset + p.numel, ps.units()[size_t(u)].end) << p.name;
      }
    }
  }
}

// Note [Copy-engine arena budget]: the wanted size, cut to dscpp.copy_engine.arena_mib; 0 below the least useful.
TEST(Zero, CopyEngineArenaBudget) {
  EXPECT_EQ(copy_engine_arena_elements(int64_t(1) << 40, 10, DType::f32, Device::cpu(), std::nullopt), int64_t(1) << 40)
      << "no limit on the CPU";
  EXPECT_EQ(copy_engine_arena_elements(int64_t(1) << 30, 10, DType::f32, Device::cpu(), 3), 3 * (int64_t(1) << 18));
  EXPECT_EQ(copy_engine_arena_elements(int64_t(1) << 30, 10, DType::bf16, Device::cpu(), 3), 3 * (int64_t(1) << 19));
  EXPECT_EQ(copy_engine_arena_elements(1000, 10, DType::f32, Device::cpu(), 3), 1000) << "under the budget: as wanted";
  EXPECT_EQ(copy_engine_arena_elements(int64_t(1) << 30, int64_t(1) << 20, DType::f32, Device::cpu(), 3), 0)
      << "the budget cannot hold the largest unit's ops";
  EXPECT_THROW(DeepSpeedConfig::from_string(R"({"train_batch_size": 2, "dscpp": {"copy_engine": {"arena_mib": -1}}})"),
               ConfigError);
}

// zero.Init needs stage 3 across ranks: without it nobody initialises the parameters, and the engine says so.
TEST(Zero, ShardedInitNeedsStage3) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  DistCase s = zero_case(2);
  s.sharded_init = true;
  expect_all_pass(run_ranks(2, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    try {
      test::make_engine(s, pg.get());
      ADD_FAILURE() << "stage 2 accepted a model without parameters";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("materialize_params"), std::string::npos) << e.what();
    }
    test::leave_together(*pg);
  }));
}

TEST(Zero, CommunicationDataTypeIsValidated) {
  EXPECT_THROW(DeepSpeedConfig::from_string(R"({"train_batch_size": 2, "communication_data_type": "int8"})"),
               ConfigError);
}

TEST(Zero, EnginePrintsModelStatesAtStartUp) {
  DeepSpeedConfig cfg = DeepSpeedConfig::from_string(test::config_json(DistCase{}), 1);
  auto m = make_model(tiny_model_config("gpt2"));
  m->init_weights(1);
  std::ostringstream log;
  EngineOptions o;
  o.log = &log;
  auto e = initialize(std::move(m), cfg, o);
  EXPECT_EQ(log.str(), e->model_state_report() + "\n");
  EXPECT_NE(log.str().find("allocated params"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("theoretical"), std::string::npos) << log.str();
}

// Stage 3 prefetches along the recorded unit sequence, and with reuse distance 0 and no persistent units keeps
// only a few units gathered at a time.
TEST(Zero, Stage3PrefetchesAndBoundsLiveParameters) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  DistCase s = zero_case(3, "llama");
  s.reuse = 0;
  s.persistence = 0;
  s.prefetch = 1;  // one unit ahead
  on_engines(s, [&](Engine& e, int rank) {
    test::train(e, s, rank, s.gas, 2);
    const ParamSet& ps = e.model().params();
    int64_t largest = 0;
    for (const FlatRange& u : ps.units()) largest = std::max(largest, u.size());
    const ZeroParamCoordinator* c = e.zero_params();
    ASSERT_NE(c, nullptr);
    // Forward/backward use one unit (two at the tied head) plus one prefetched: at most 3 of the largest.
    EXPECT_LE(c->peak_live_elements(), 3 * largest);
    EXPECT_LT(c->peak_live_elements(), ps.flat_numel());
    EXPECT_GE(c->prefetched_units(), int64_t(ps.units().size())) << "the second micro-step follows the recorded sequence";
    // Note [Gathers at the step]: after each of the 2 steps, the first unit and the one prefetched with it.
    EXPECT_EQ(c->gathered_at_step(), 2 * 2);
    EXPECT_EQ(ps.flat_params().defined(), false) << "stage 3 keeps no full parameter buffer";
    EXPECT_EQ(ps.flat_grads().defined(), false) << "stage 3 keeps no full gradient buffer";
  });
}

// Note [ZeRO buffer estimate]: the replays of the coordinators' rules give their own peaks of gathered parameter and
// gradient-window elements, whether units are released after each use, kept for reuse, capped by the live bound,
// persistent or prefetched one or several ahead, with and without overlap_comm.
TEST(ZeroBuffers, ReplayMatchesTheCoordinators) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  struct Case {
    const char* arch;
    int64_t prefetch, persistence, reuse, max_live;
    bool overlap, fused_head = false;
  };
  const Case cases[] = {{"llama", 1, 0, 0, 1000000000, true},            // FSDP-like: one unit ahead, release
                        {"gpt2", 1, 0, 1000000000, 1000000000, true},    // keep every unit its sequence reuses
                        {"llama", 30000, 4000, 1000000000, 40000, false},  // reuse under a live bound; small persistent
                        {"gpt2", 1000000, 0, 30000, 1000000000, true},   // prefetch everything, reuse nearby only
                        {"llama", 20000, 0, 1000000000, 1000000000, false},
                        {"gpt2", 1, 0, 0, 1000000000, true, true},       // Note [Fused head]: no head in backward
                        {"gpt2", 30000, 0, 1000000000, 1000000000, true, true},
                        {"llama", 20000, 0, 1000000000, 1000000000, false, true}};
  for (const Case& c : cases) {
    DistCase s = zero_case(3, c.arch);
    s.n_layer = 4;
    s.prefetch = c.prefetch;
    s.persistence = c.persistence;
    s.reuse = c.reuse;
    s.max_live = c.max_live;
    s.overlap = c.overlap;
    s.fused_head = c.fused_head;
    const int world = s.world;
    on_engines(s, [&](Engine& e, int rank) {
      test::train(e, s, rank, s.gas, 2);
      std::vector<int64_t> units;
      for (const FlatRange& u : e.model().params().units()) units.push_back(u.size());
      ModelConfig mc = tiny_model_config(c.arch);
      mc.n_layer = s.n_layer;
      EXPECT_EQ(model_unit_sizes(mc, 16 * world), units) << "the estimator lays the units out as the engine does";
      ActivationWorkload w{kB, kT, DType::f32, e.model().checkpoint_policy(), false, e.fused_head()};
      ASSERT_EQ(e.fused_head(), c.fused_head);
      TrainingMemorySetup ts;
      ts.stage = 3;
      ts.world_size = world;
      ts.zero = e.config().zero_optimization;
      ts.gradient_accumulation_steps = s.gas;
      const TrainingMemoryEstimate est = estimate_training_memory(mc, w, ts);
      const std::string what = std::string(c.arch) + " prefetch " + std::to_string(c.prefetch) + " persistence " +
                               std::to_string(c.persistence) + " reuse " + std::to_string(c.reuse) + " max live " +
                               std::to_string(c.max_live) + (c.overlap ? " overlap" : "") +
                               (c.fused_head ? " fused head" : "");
      ASSERT_NE(e.zero_params(), nullptr);
      EXPECT_EQ(est.gathered_params, e.zero_params()->peak_live_elements()) << what;
      ASSERT_NE(e.grad_sync(), nullptr);
      EXPECT_EQ(est.grad_windows, e.grad_sync()->window_peak_elements()) << what;
    });
  }
}

// Without overlap_comm, stages 2 and 3 still reduce each unit as soon as backward has produced it (backward waits for
// the reduction), so the live gradient windows stay a few units, not the whole model, and training is unchanged.
TEST(Zero, WithoutOverlapStage2And3FreeEachGradientWindowAtOnce) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (int stage : {2, 3}) {
    DistCase s = zero_case(stage, "llama");
    s.overlap = false;
    s.n_layer = 6;
    on_engines(s, [&](Engine& e, int rank) {
      test::train(e, s, rank, s.gas, 1);
      const std::vector<FlatRange>& units = e.model().params().units();
      int64_t largest_block = 0;
      for (size_t u = 1; u + 1 < units.size(); u++) largest_block = std::max(largest_block, units[u].size());
      // Live at once: the tied embedding (its gradient is final only after the embedding backward), the head's
      // final norm, and the block being differentiated.
      const int64_t bound = units.front().size() + units.back().size() + largest_block;
      ASSERT_EQ(units.size(), size_t(s.n_layer + 2));
      ASSERT_LT(bound, e.model().params().flat_numel() / 2) << "the bound must be able to catch all windows live";
      ASSERT_NE(e.grad_sync(), nullptr);
      EXPECT_LE(e.grad_sync()->window_peak_elements(), bound) << "stage " << stage;
      EXPECT_GT(e.grad_sync()->window_peak_elements(), 0) << "stage " << stage;
    });
  }
}

// Stages 1 and 2: the step launches every unit's parameter all-gather and returns; the next forward waits for each
// unit's just before using it, and reading the model waits for all (Note [Deferred parameter gathers]). The
// equivalence tests above check the values; this checks that the gathers are in fact deferred and then consumed.
TEST(Zero, Stage1And2DeferTheParameterGatherToTheNextForward) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (int stage : {1, 2}) {
    DistCase s = zero_case(stage, "llama");
    s.gas = 1;
    on_engines(s, [&](Engine& e, int rank) {
      const int64_t units = int64_t(e.zero_partition().units().size());
      Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
      test::micro_batch(s, 0, rank, x, y);
      EXPECT_EQ(e.pending_param_gathers(), 0);
      e.forward(x, y);
      e.backward();
      e.step();
      EXPECT_EQ(e.pending_param_gathers(), units) << "stage " << stage << ": the step waited for its gathers";
      e.forward(x, y);
      EXPECT_EQ(e.pending_param_gathers(), 0) << "stage " << stage << ": forward used a unit without waiting";
      e.backward();
      e.step();
      EXPECT_EQ(e.pending_param_gathers(), units);
      (void)e.model();
      EXPECT_EQ(e.pending_param_gathers(), 0) << "stage " << stage << ": model() handed out stale parameters";
    });
  }
}

// fp16: an overflow in one rank's gradients skips the step on every rank and halves the scale everywhere.
TEST(Zero, OverflowOnOneRankSkipsEverywhere) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (int stage : {1, 2, 3}) {
    DistCase s = zero_case(stage);
    s.precision = "fp16";
    s.gas = 1;
    on_engines(s, [&](Engine& e, int rank) {
      test::train(e, s, rank, 1, 1);  // one normal step
      const double scale = e.loss_scale();
      const std::vector<float> before = test::named_params(e);
      Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
      test::micro_batch(s, 7, rank, x, y);
      e.forward(x, y);
      e.backward();
      if (rank == 1) Tensor(e.owned_grads(0)).fill(INFINITY);  // rank 1's partition overflows
      e.step();
      EXPECT_TRUE(e.last_step_skipped()) << "stage " << stage << " rank " << rank;
      EXPECT_EQ(e.skipped_steps(), 1);
      EXPECT_EQ(e.loss_scale(), scale / 2) << "stage " << stage << " rank " << rank;
      const std::vector<float> after = test::named_params(e);
      EXPECT_EQ(before, after) << "a skipped step changed parameters (stage " << stage << ")";
      test::train(e, s, rank, 1, 1);  // and training goes on
      EXPECT_FALSE(e.last_step_skipped());
    });
  }
}

// Each rank's allocated model states are within 10% of what the stage should need.
TEST(Zero, ModelStateBytesMatchTheory) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (int world : {1, 2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      DistCase s = zero_case(stage, "llama", world);
      s.precision = "fp16";
      on_engines(s, [&](Engine& e, int) {
        ModelStateBytes a = e.model_state_bytes(), t = e.theoretical_model_state_bytes();
        EXPECT_NE(e.model_state_report().find("ZeRO stage " + std::to_string(stage)), std::string::npos);
        const std::string what = "stage " + std::to_string(stage) + " world " + std::to_string(world);
        for (auto [got, want, name] : {std::tuple{a.params, t.params, "params"}, {a.grads, t.grads, "grads"},
                                       {a.optimizer, t.optimizer, "optimizer"}}) {
          EXPECT_NEAR(double(got), double(want), 0.1 * double(want)) << what << " " << name << "\n"
                                                                     << e.model_state_report();
        }
        if (world > 1 && stage >= 1) {
          ModelStateBytes whole = t;  // the same states unpartitioned: stage 0's figure
          whole.optimizer *= world;
          EXPECT_LT(double(a.optimizer), 1.1 * double(whole.optimizer) / world) << what << ": not partitioned";
        }
      });
    }
  }
}

// ---- checkpoints of partitioned engines ----

namespace {

std::string temp_dir(const std::string& name) {
  std::string d = (std::filesystem::temp_directory_path() / ("dscpp_zero_" + name + "_" + std::to_string(getpid())))
                      .string();
  std::filesystem::remove_all(d);
  return d;
}

// Train 2 steps, save, train 2 more (the uninterrupted run's losses); then fresh engines load the tag and train the
// same 2 steps: the losses must be equal bit for bit. Every rank writes its own shard.
void resume_is_exact(int stage, int world, const std::string& arch, bool async) {
  DistCase s = zero_case(stage, arch, world);
  s.precision = "fp16";
  const std::string dir = temp_dir("resume" + std::to_string(stage) + std::to_string(world) + (async ? "a" : ""));
  auto results = run_ranks(world, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, kTimeout);
    auto e = test::make_engine(s, pg.get());
    if (async) e->set_async_checkpointing(true);
    test::train(*e, s, rank, s.gas, 2, 0);
    e->save_checkpoint(dir, "", {{"note", "client"}});
    const test::Trained straight = test::train(*e, s, rank, s.gas, 2, 2);
    e->wait_for_checkpoint();
    auto f = test::make_engine(s, pg.get());
    nlohmann::json cs = f->load_checkpoint(dir);
    EXPECT_EQ(cs.value("note", ""), "client");
    EXPECT_EQ(f->global_steps(), 2);
    const test::Trained resumed = test::train(*f, s, rank, s.gas, 2, 2);
    EXPECT_EQ(resumed.losses, straight.losses) << "stage " << stage << " world " << world << " rank " << rank;
    EXPECT_EQ(resumed.params, straight.params) << "stage " << stage << " world " << world << " rank " << rank;
  });
  expect_all_pass(results);
  if (stage > 0 && world > 1) {
    CheckpointReader r(dir);
    for (int k = 0; k < world; k++)
      EXPECT_TRUE(r.has_file("zero/rank_" + std::to_string(k) + ".safetensors")) << "rank " << k << " shard";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST(ZeroCheckpoint, ResumeIsExactAtEveryStage) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (int stage : {0, 1, 2, 3}) resume_is_exact(stage, 2, "gpt2", false);
  resume_is_exact(3, 4, "llama", false);
  resume_is_exact(2, 1, "llama", false);
}

// `dscpp ckpt export` of a ZeRO-3 tag saved by 2 ranks gathers the f32 weights from every rank's shard, as
// DeepSpeed's zero_to_fp32 does: the exported model equals the engine's full parameters bit for bit (f32 run; a
// mixed-precision run exports its f32 masters the same way, through the same "fp32" state).
TEST(ZeroCheckpoint, ExportGathersFp32FromEveryShard) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  const std::string dir = temp_dir("export");
  const DistCase s = zero_case(3, "llama");
  auto results = run_ranks(2, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    auto e = test::make_engine(s, pg.get());
    test::train(*e, s, rank, s.gas, 2, 0);
    e->save_checkpoint(dir, "step2");  // returns once every rank's shard is committed
    const Tensor full = e->gather_full_params();
    if (rank != 0) return;
    // DeepSpeed's default (stage3_gather_16bit_weights_on_model_save false): no gathered 16-bit model in the tag.
    EXPECT_FALSE(CheckpointReader(dir, "step2").has_file("model_states.safetensors"));
    const HfExportResult r = export_hf_checkpoint(dir, "step2", dir + "/hf");
    EXPECT_EQ(r.source, "fp32 (ZeRO stage 3 shards of 2 ranks)");
    auto back = make_model(tiny_model_config("llama"));
    Tensor poison = back->params().flat_params();  // unwritten parameters stay NaN and fail the comparison
    poison.fill(std::nanf(""));
    load_hf_model(dir + "/hf", *back);
    const ParamSet& want = e->model().params();
    for (int i = 0; i < want.size(); i++) {
      const ParamInfo& w = want.info(i);
      const int j = back->params().find(w.name);
      ASSERT_GE(j, 0) << w.name;
      const Tensor got = back->params().param(j);
      ASSERT_EQ(got.numel(), w.numel) << w.name;
      EXPECT_EQ(std::memcmp(got.raw(), full.data<float>() + w.offset, size_t(w.numel) * sizeof(float)), 0) << w.name;
    }
  });
  expect_all_pass(results);
  // The same tag made universal exports the same file, byte for byte.
  convert_to_universal(dir, "step2", "", "");
  const HfExportResult u = export_hf_checkpoint(dir, "step2_universal", dir + "/hf_universal");
  EXPECT_EQ(u.source, "fp32 (universal tag)");
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string a = bytes(dir + "/hf/model.safetensors"), b = bytes(dir + "/hf_universal/model.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "exports of the sharded and the universal tag differ";
  std::filesystem::remove_all(dir);
}

// stage3_gather_16bit_weights_on_model_save: true gathers the units into model_states (the model's own parameters,
// by name), as DeepSpeed's save_16bit_model.
TEST(ZeroCheckpoint, Stage3GathersModelStatesWhenAsked) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  const std::string dir = temp_dir("gather16");
  DistCase s = zero_case(3);
  s.gather16 = true;
  auto results = run_ranks(2, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
    auto e = test::make_engine(s, pg.get());
    test::train(*e, s, rank, s.gas, 1, 0);
    e->save_checkpoint(dir, "step1");
    const Tensor full = e->gather_full_params();
    if (rank != 0) return;
    CheckpointReader r(dir, "step1");
    ASSERT_TRUE(r.has_file("model_states.safetensors"));
    SafetensorsFile mf = r.open_tensors("model_states.safetensors");
    const ParamSet& ps = e->model().params();
    for (int i = 0; i < ps.size(); i++) {
      const Tensor t = mf.read(ps.info(i).name);
      ASSERT_EQ(t.numel(), ps.info(i).numel) << ps.info(i).name;
      EXPECT_EQ(std::memcmp(t.raw(), full.data<float>() + ps.info(i).offset, size_t(t.numel()) * sizeof(float)), 0)
          << ps.info(i).name;
    }
  });
  expect_all_pass(results);
  std::filesystem::remove_all(dir);
}

TEST(ZeroCheckpoint, AsyncSaveResumesLikeSync) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  resume_is_exact(2, 2, "llama", true);
}

// 4 ranks at stage 3 save; the tag, directly and converted to universal, loads into 2 ranks at stage 1 (and 1 rank at
// stage 0), whose next losses match the uninterrupted 4-rank run (same global batch: gas x world is constant).
TEST(ZeroCheckpoint, TagsReshardAcrossWorldSizesAndStages) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  const std::string dir = temp_dir("universal");
  const int64_t global_micro = 8;
  DistCase s4 = zero_case(3, "gpt2", 4);
  s4.gas = global_micro / 4;
  std::vector<float> want;  // the 4-rank run's losses of steps 2 and 3
  auto r4 = run_ranks(4, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto pg = new_process_group("gloo", rank, 4, "127.0.0.1", port, kTimeout);
    auto e = test::make_engine(s4, pg.get());
    test::train(*e, s4, rank, s4.gas, 2, 0);
    e->save_checkpoint(dir, "step2");
    const test::Trained t = test::train(*e, s4, rank, s4.gas, 2, 2);
    if (rank == 0) {
      std::ofstream(dir + "/want.txt") << t.losses[0] << " " << t.losses[1] << "\n";
    }
  });
  expect_all_pass(r4);
  {
    std::ifstream in(dir + "/want.txt");
    float a, b;
    in >> a >> b;
    want = {a, b};
  }
  UniversalResult u = convert_to_universal(dir, "step2", "", "");
  EXPECT_EQ(u.source_world_size, 4);
  EXPECT_EQ(u.source_stage, 3);
  for (auto [world, stage] : {std::pair{2, 1}, {1, 0}}) {
    DistCase s = zero_case(stage, "gpt2", world);
    s.gas = global_micro / world;
    auto res = run_ranks(world, [&](int rank, int port) {
      omp_set_num_threads(1);
      auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, kTimeout);
      // The sharded tag resharded as it is read, and its universal conversion: the same states, the same run.
      auto direct = test::make_engine(s, pg.get());
      direct->load_checkpoint(dir, "step2");
      const test::Trained d = test::train(*direct, s, rank, s.gas, 2, 2);
      auto e = test::make_engine(s, pg.get());
      e->load_checkpoint(dir, u.out_tag);
      const test::Trained t = test::train(*e, s, rank, s.gas, 2, 2);
      EXPECT_EQ(d.losses, t.losses) << "direct and universal loads into world " << world;
      EXPECT_EQ(d.params, t.params) << "direct and universal loads into world " << world;
      // The same parameters, another summation order of the 8 micro-batches (Note [Equivalence tolerances]).
      test::expect_within(t.losses, want,
                          [&](size_t i) { return test::rounding_bound(test::unit_roundoff("f32"), 8, i + 1, want[i]); },
                          "universal -> world " + std::to_string(world) + " stage " + std::to_string(stage));
    });
    expect_all_pass(res);
  }
  std::filesystem::remove_all(dir);
}

// The whole estimate against the engine's own allocator peak over a step of 2 micro-batches (after a first step, so
// that the optimizer's states exist): exact at stages 0 and 1 (up to the engine's few scalars); at stages 2 and 3
// Gloo adds an f32 copy of each reduce-scatter's input while it runs (NCCL reduces in place), so the measured peak
// may only be higher, by less than those copies.
TEST(ZeroBuffers, EstimateMatchesTheEnginesPeakOnTheCpu) {
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  for (int stage : {0, 1, 2, 3}) {
    for (const char* arch : {"gpt2", "llama"}) {
      DistCase s = zero_case(stage, arch);
      s.n_layer = 4;
      s.persistence = 0;
      s.fused_head = std::string(arch) == "llama";  // Note [Fused head] on one of the two
      const int world = s.world;
      on_engines(s, [&](Engine& e, int rank) {
        Allocator& a = cpu_allocator();
        Tensor x = Tensor::empty({kB, kT}, DType::i32), y = Tensor::empty({kB, kT}, DType::i32);
        auto one_step = [&](int64_t step) {
          for (int64_t m = 0; m < s.gas; m++) {
            test::micro_batch(s, step, rank * s.gas + m, x, y);
            e.forward(x, y);
            e.backward();
            e.step();
          }
        };
        one_step(0);
        a.reset_peak();
        one_step(1);
        ModelConfig mc = tiny_model_config(arch);
        mc.n_layer = s.n_layer;
        ActivationWorkload w{kB, kT, DType::f32, e.model().checkpoint_policy(), false, e.fused_head()};
        ASSERT_EQ(e.fused_head(), s.fused_head);
        TrainingMemorySetup ts;
        ts.stage = stage;
        ts.world_size = world;
        ts.zero = e.config().zero_optimization;
        ts.fp32_master = false;
        ts.gradient_accumulation_steps = s.gas;
        const TrainingMemoryEstimate est = estimate_training_memory(mc, w, ts);
        const std::string what = std::string(arch) + " stage " + std::to_string(stage) + " (peak at " + est.peak_at + ")";
        EXPECT_EQ(est.states.total(), e.model_state_bytes().total()) << what;
        const int64_t measured = a.stats().peak_bytes;
        const int64_t scalars = 4096;  // the batch tensors, the loss sum, the norm: what the model does not allocate
        if (stage <= 1) {
          EXPECT_NEAR(double(measured), double(est.peak_bytes), double(scalars)) << what;
        } else {
          int64_t largest = 0;
          for (const FlatRange& u : e.model().params().units()) largest = std::max(largest, u.size());
          const int64_t gloo_copies = int64_t(GradSync::kMaxInFlight + 1) * largest * 4;
          EXPECT_GE(measured + scalars, est.peak_bytes) << what;
          EXPECT_LE(measured, est.peak_bytes + gloo_copies + scalars) << what;
        }
      });
    }
  }
}
