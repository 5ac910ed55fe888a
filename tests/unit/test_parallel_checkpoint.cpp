// Checkpoints of tensor- and pipeline-parallel training (Note [Model-parallel checkpoints],
// src/checkpoint/model_source.cpp) on forked Gloo ranks: a tag saved under one layout (tp, pp, dp, ZeRO stage)
// resumes under another with the continuing losses of the saving run: bit for bit when the layout is the same (each
// rank reads its own shard), within Note [Equivalence tolerances] otherwise (other summation orders); the whole
// weights read from the parts are one process's after the same steps; the universal conversion merges the slices and
// stages into whole parameters that load as the parts do.
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "checkpoint_fixtures.h"
#include "dist/tensor_parallel_fixtures.h"
#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/checkpoint/universal.h"
#include "dscpp/runtime/pipe_engine.h"
#include "runtime/pipe/partition.h"

namespace fs = std::filesystem;

namespace dscpp::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(30);
constexpr int64_t kGlobalMicro = 4;  // micro-batches per step over all data-parallel ranks
constexpr int64_t kSaveStep = 2, kMoreSteps = 2;

class NeedsGloo : public ::testing::Environment {
  void SetUp() override {
    if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  }
};
[[maybe_unused]] ::testing::Environment* const kNeedsGloo = ::testing::AddGlobalTestEnvironment(new NeedsGloo);

// Forked ranks report their losses through files.
void write_floats(const fs::path& p, const std::vector<float>& v) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
}
std::vector<float> read_floats(const fs::path& p) {
  std::vector<float> v(size_t(fs::file_size(p)) / 4);
  std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  return v;
}

// A tensor x data layout; tensor ranks vary fastest (DeepSpeed's topology), ZeRO over the data axis.
struct Layout {
  int tp = 1, dp = 1, stage = 0;
  std::string name() const {
    return "tp" + std::to_string(tp) + " dp" + std::to_string(dp) + " stage " + std::to_string(stage);
  }
};

DistCase case_of(const DistCase& base, const Layout& l) {
  DistCase c = base;
  c.world = l.dp;
  c.stage = l.stage;
  c.gas = kGlobalMicro / l.dp;
  return c;
}

// fn(engine, case, data-parallel rank, world rank) on tp x dp forked ranks.
void on_layout(const DistCase& base, const Layout& l,
               const std::function<void(Engine&, const DistCase&, int, int)>& fn) {
  const DistCase c = case_of(base, l);
  const int world_size = l.tp * l.dp;
  expect_all_pass(run_ranks(world_size, [&](int rank, int port) {
    omp_set_num_threads(1);  // the parent ran OpenMP: its thread pool does not survive fork
    auto world = new_process_group("gloo", rank, world_size, "127.0.0.1", port, kTimeout);
    std::unique_ptr<ProcessGroup> tp, dp;
    for (int d = 0; d < l.dp && l.tp > 1; d++) {
      std::vector<int> g;
      for (int t = 0; t < l.tp; t++) g.push_back(d * l.tp + t);
      if (auto s = world->new_subgroup(g)) tp = std::move(s);
    }
    for (int t = 0; t < l.tp && l.dp > 1; t++) {
      std::vector<int> g;
      for (int d = 0; d < l.dp; d++) g.push_back(d * l.tp + t);
      if (auto s = world->new_subgroup(g)) dp = std::move(s);
    }
    ProcessGroup* tp_group = l.tp == 1 ? nullptr : l.dp == 1 ? world.get() : tp.get();
    ProcessGroup* dp_group = l.dp == 1 ? nullptr : l.tp == 1 ? world.get() : dp.get();
    auto e = make_tp_engine(c, tp_group, dp_group);
    fn(*e, c, dp_group ? dp_group->rank() : 0, rank);
    leave_together(*world);
  }, std::chrono::seconds(180)));
}

// Trains kSaveStep steps under `l`, saves `tag` in dir, trains kMoreSteps more; rank 0 writes the later losses.
void save_under(const DistCase& base, const Layout& l, const fs::path& dir, const std::string& tag,
                const fs::path& losses) {
  on_layout(base, l, [&](Engine& e, const DistCase& c, int dp_rank, int rank) {
    train(e, c, dp_rank, c.gas, kSaveStep, 0);
    e.save_checkpoint(dir, tag);
    const Trained t = train(e, c, dp_rank, c.gas, kMoreSteps, kSaveStep);
    if (rank == 0) write_floats(losses, t.losses);
  });
}

// Loads dir/tag under `l` and trains kMoreSteps steps from there; rank 0 writes the losses.
void resume_under(const DistCase& base, const Layout& l, const fs::path& dir, const std::string& tag,
                  const fs::path& losses) {
  on_layout(base, l, [&](Engine& e, const DistCase& c, int dp_rank, int rank) {
    e.load_checkpoint(dir, tag);
    EXPECT_EQ(e.global_steps(), kSaveStep);
    const Trained t = train(e, c, dp_rank, c.gas, kMoreSteps, kSaveStep);
    if (rank == 0) write_floats(losses, t.losses);
  });
}

// The same parameters trained in other summation orders: Note [Equivalence tolerances] over the tensor-parallel
// split sums (a few hundred terms) and the global batch.
void expect_close_losses(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double u = unit_roundoff("f32");
  expect_within(got, want, [&](size_t s) { return rounding_bound(u, 256, kSaveStep + int64_t(s) + 1, want[s]); },
                what + ": continuing losses");
}

TEST(ParallelCheckpoint, TensorParallelTagResumesUnderEveryLayout) {
  for (const char* arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    const fs::path tmp = test_fixtures::checkpoint_test_dir(std::string("tpckpt_") + arch);
    const DistCase base = dist_case(1, 0, arch, [](DistCase& d) { d.optimizer = "adamw"; });
    const Layout src{2, 2, 2};
    save_under(base, src, tmp / "ckpt", "step2", tmp / "src.losses");
    const std::vector<float> want = read_floats(tmp / "src.losses");

    // The tag: the job's state and one folder per tensor-parallel rank, each with its data-parallel shards.
    CheckpointReader r(tmp / "ckpt", "step2");
    EXPECT_EQ(r.read_json("engine_state.json").at(kModelParallelKey).at("size"), 2);
    for (const char* f : {"mp_rank_00/zero/rank_0.safetensors", "mp_rank_01/zero/rank_1.safetensors",
                          "mp_rank_01/engine_state.json"})
      EXPECT_TRUE(r.has_file(f)) << f;

    // The whole weights are one process's after the same steps (another summation order).
    DistCase one = case_of(base, {1, 1, 0});
    auto ref = make_engine(one, nullptr);
    train(*ref, one, 0, one.gas, kSaveStep, 0);
    const ParamSet& ps = ref->model().params();
    const std::vector<float> ref_params = named_params(*ref);
    std::string source;
    const NamedTensors weights = read_fp32_weights(r, &source);
    EXPECT_NE(source.find("2 model-parallel parts"), std::string::npos) << source;
    ASSERT_EQ(weights.size(), size_t(ps.size()));
    for (const ParamInfo& p : ps.infos()) {
      auto it = std::find_if(weights.begin(), weights.end(), [&](const auto& w) { return w.first == p.name; });
      ASSERT_NE(it, weights.end()) << p.name;
      ASSERT_EQ(it->second.shape(), p.shape) << p.name;
      const std::vector<float> got(it->second.data<float>(), it->second.data<float>() + p.numel);
      const std::vector<float> w(ref_params.begin() + p.offset, ref_params.begin() + p.offset + p.numel);
      const double bound = rounding_bound(unit_roundoff("f32"), 256, kSaveStep, max_abs(w)) + 1e-6;
      expect_within(got, w, [&](size_t) { return bound; }, p.name);
    }

    // The same layout reads its own shards: bit for bit.
    resume_under(base, src, tmp / "ckpt", "step2", tmp / "same.losses");
    EXPECT_EQ(read_floats(tmp / "same.losses"), want) << "resumed under the saving layout";
    // Other layouts reshard as they read.
    for (const Layout& l : {Layout{1, 1, 0}, Layout{2, 1, 0}, Layout{1, 2, 3}, Layout{2, 2, 1}}) {
      resume_under(base, l, tmp / "ckpt", "step2", tmp / "other.losses");
      expect_close_losses(read_floats(tmp / "other.losses"), want, "tp2 dp2 stage 2 -> " + l.name());
    }
    // The universal tag holds whole parameters and loads as the parts do.
    const UniversalResult u = convert_to_universal(tmp / "ckpt", "step2", "", "");
    EXPECT_EQ(u.source_model_parallel, 2);
    resume_under(base, {1, 1, 0}, tmp / "ckpt", "step2", tmp / "direct.losses");
    resume_under(base, {1, 1, 0}, tmp / "ckpt", u.out_tag, tmp / "universal.losses");
    EXPECT_EQ(read_floats(tmp / "universal.losses"), read_floats(tmp / "direct.losses"));
    resume_under(base, {2, 1, 3}, tmp / "ckpt", u.out_tag, tmp / "universal_tp.losses");
    expect_close_losses(read_floats(tmp / "universal_tp.losses"), want, "universal -> tp2 dp1 stage 3");
    fs::remove_all(tmp);
  }
}

// A Hugging Face folder fine-tuned under tensor parallelism (--init-from): each rank takes its slices, padding zero.
TEST(ParallelCheckpoint, HuggingFaceFolderLoadsIntoTensorParallelSlices) {
  for (const char* arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    const fs::path tmp = test_fixtures::checkpoint_test_dir(std::string("tphf_") + arch);
    const ModelConfig cfg = test_fixtures::tiny_model_config(arch);
    auto whole = make_model(cfg);
    whole->init_weights(7);
    export_hf_model(*whole, tmp / "hf");
    const ParamSet& wps = whole->params();
    const std::vector<float> want = named(wps, wps.flat_params());
    expect_all_pass(run_ranks(2, [&](int rank, int port) {
      omp_set_num_threads(1);  // as on_layout
      auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, kTimeout);
      ModelOptions mo;
      mo.tp_group = pg.get();
      auto m = make_model(cfg, mo);
      Tensor(m->params().flat_params()).fill(std::nanf(""));  // every element, padding rows included, must be written
      load_hf_model(tmp / "hf", *m);
      const ParamSet& ps = m->params();
      const std::vector<float> mine = named(ps, ps.flat_params());
      for (float v : mine) ASSERT_FALSE(std::isnan(v)) << "an element was not loaded";
      EXPECT_EQ(unshard(*pg, ps, mine), want) << "rank " << rank;
      leave_together(*pg);
    }));
    fs::remove_all(tmp);
  }
}

// Pipeline stages: PP 2 on 2 ranks, the fp16 path (the loss scale travels in the job's state).
struct PipeRun {
  int stages = 2;
  DistCase dist;
};

PipelineEngine::MicroBatches step_batch(const DistCase& d, int64_t s) {
  PipelineEngine::MicroBatches mbs;
  for (int64_t j = 0; j < d.gas; j++) {
    Tensor x = Tensor::empty({batch(d), seq(d)}, DType::i32), y = Tensor::empty({batch(d), seq(d)}, DType::i32);
    micro_batch(d, s, j, x, y);
    mbs.push_back({x, y});
  }
  return mbs;
}

// fn(pipeline engine, world rank) on `stages` forked ranks holding the stages of one pipeline.
void on_pipeline(const DistCase& d, int stages, const std::function<void(PipelineEngine&, int)>& fn) {
  expect_all_pass(run_ranks(stages, [&](int rank, int port) {
    omp_set_num_threads(1);  // as on_layout
    auto pipe = new_process_group("gloo", rank, stages, "127.0.0.1", port, kTimeout);
    const ModelConfig mc = model_config(d);
    const auto parts = partition_layers("parameters", pipe_item_params(mc), stages);
    auto m = make_pipeline_stage(mc, StageLayers::of_rank(parts, rank, stages, 1), {});
    m->init_weights(42);
    EngineOptions eo;
    eo.mixed_precision_on_f32_model = d.precision == "fp16";
    auto pe = initialize_pipeline(std::move(m), DeepSpeedConfig::from_string(config_json(d), 1), eo, {pipe.get(), 1});
    fn(*pe, rank);
    leave_together(*pipe);
  }, std::chrono::seconds(120)));
}

std::vector<float> train_pipe(PipelineEngine& pe, const DistCase& d, int64_t first, int64_t steps) {
  std::vector<float> losses;
  for (int64_t s = first; s < first + steps; s++) losses.push_back(pe.train_batch(step_batch(d, s)));
  return losses;
}

TEST(ParallelCheckpoint, PipelineTagResumesInOneProcessAndBack) {
  for (const char* arch : {"gpt2", "llama"}) {  // tied (a copy of the table on the last stage) and untied
    SCOPED_TRACE(arch);
    const fs::path tmp = test_fixtures::checkpoint_test_dir(std::string("ppckpt_") + arch);
    const DistCase d = dist_case(1, 0, arch, [](DistCase& c) {
      c.gas = kGlobalMicro;
      c.precision = "fp16";
      c.optimizer = "adamw";
    });
    on_pipeline(d, 2, [&](PipelineEngine& pe, int rank) {
      train_pipe(pe, d, 0, kSaveStep);
      pe.engine().save_checkpoint(tmp / "pp", "step2");
      const std::vector<float> more = train_pipe(pe, d, kSaveStep, kMoreSteps);
      if (rank == 0) write_floats(tmp / "pp.losses", more);
    });
    const std::vector<float> want = read_floats(tmp / "pp.losses");
    // Stages reload their own parts bit for bit.
    on_pipeline(d, 2, [&](PipelineEngine& pe, int rank) {
      pe.engine().load_checkpoint(tmp / "pp", "step2");
      const std::vector<float> more = train_pipe(pe, d, kSaveStep, kMoreSteps);
      if (rank == 0) {
        EXPECT_EQ(more, want) << "PP 2 -> PP 2";
      }
    });
    // One process takes the whole model from the two stages, and saves a tag the stages take back.
    auto one = make_engine(d, nullptr);
    one->load_checkpoint(tmp / "pp", "step2");
    EXPECT_EQ(one->global_steps(), kSaveStep);
    one->save_checkpoint(tmp / "one", "step2");
    std::vector<float> got;
    Tensor x = Tensor::empty({batch(d), seq(d)}, DType::i32), y = Tensor::empty({batch(d), seq(d)}, DType::i32);
    for (int64_t s = kSaveStep; s < kSaveStep + kMoreSteps; s++) {
      for (int64_t j = 0; j < d.gas; j++) {
        micro_batch(d, s, j, x, y);
        one->forward(x, y);
        one->backward();
        one->step();
      }
      got.push_back(one->last_loss());
    }
    expect_close_losses(got, want, "PP 2 -> one process");
    on_pipeline(d, 2, [&](PipelineEngine& pe, int rank) {
      pe.engine().load_checkpoint(tmp / "one", "step2");
      const std::vector<float> more = train_pipe(pe, d, kSaveStep, kMoreSteps);
      if (rank == 0) {
        EXPECT_EQ(more, want) << "PP 2 -> one process -> PP 2";
      }
    });
    fs::remove_all(tmp);
  }
}

}  // namespace
}  // namespace dscpp::test
