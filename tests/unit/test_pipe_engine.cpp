// Pipeline parallelism (Note [Pipeline engine], runtime/pipe_engine.h) on forked Gloo ranks: PP 2 (1F1B and
// interleaved), PP 2 x DP 2, TP 2 x PP 2 and TP 2 x PP 2 x DP 2 give the parameters, losses and gradient norms of
// one process training the whole model on the same global batch (gradient accumulation, clipping, fp16 loss
// scaling, activation checkpointing), within Note [Equivalence tolerances]; eval_batch takes fewer micro-batches too;
// a rank that fails mid-pipeline ends the others with an error, not a hang.
#include <gtest/gtest.h>

#include <map>

#include "dist/equivalence.h"
#include "dist/tensor_parallel_fixtures.h"
#include "dscpp/comm/topology.h"
#include "dscpp/runtime/pipe_engine.h"
#include "runtime/pipe/partition.h"

namespace dscpp::test {
namespace {

struct PipeCase {
  DistCase dist;          // model, optimizer, precision, gas, stage; dist.world is the data-parallel size
  int stages = 2, virtual_stages = 1;
  int tp = 1;             // tensor-parallel ranks per stage
  std::string method = "parameters";
  int scale_power = 8;    // fp16.initial_scale_power: high enough, the first steps overflow and are skipped
  int64_t steps = 3;
  // Checkpointing by pipeline.activation_checkpoint_interval 1 (DeepSpeed's PipelineModule argument) instead of
  // activation_checkpointing.number_checkpoints.
  bool interval_checkpointing = false;
  bool partition_activations = false;  // activation_checkpointing.partition_activations (with tp > 1)
};

std::string json(const PipeCase& c) {
  std::string j = config_json(c.dist);
  const std::string from = R"("initial_scale_power": 8)";
  if (const size_t at = j.find(from); at != std::string::npos)
    j.replace(at, from.size(), R"("initial_scale_power": )" + std::to_string(c.scale_power));
  if (c.interval_checkpointing) j.insert(j.rfind('}'), R"(, "pipeline": {"activation_checkpoint_interval": 1})");
  const std::string ac = R"("activation_checkpointing": {)";
  if (const size_t at = j.find(ac); c.partition_activations && at != std::string::npos)
    j.insert(at + ac.size(), R"("partition_activations": true, )");
  return j;
}

using Named = std::map<std::string, std::vector<float>>;

// The full parameters this rank holds shards of (tp: its tensor-parallel group, null for none): a collective over
// the data-parallel group at stage 3, and over tp.
Named named_map(Engine& e, ProcessGroup* tp = nullptr) {
  const ParamSet& ps = e.model().params();
  std::vector<float> full = named_params(e);
  if (tp) full = unshard(*tp, ps, full);
  Named out;
  int64_t at = 0;
  for (const ParamInfo& p : ps.infos()) {
    int64_t n = 1;
    for (int64_t d : p.shard.full_shape(p.shape)) n *= d;
    out[p.name].assign(full.begin() + at, full.begin() + at + n);
    at += n;
  }
  return out;
}

struct Run {
  Named init, params;
  std::vector<float> losses, norms;
  int64_t skipped = 0;
  float eval_loss = 0;  // after training: the mean loss of step 0's micro-batches, forwards only
  float eval_few = 0;   // ... of only the first `stages` micro-batches of each data-parallel rank's
};

PipeCase reference_case_of(PipeCase c) {
  c.dist = reference_case(c.dist);
  return c;
}

// The whole model in one process over the global batch: data-parallel rank d's micro-batches are d * gas + j.
Run reference(const PipeCase& c) {
  const DistCase ref = reference_case(c.dist);
  auto m = make_model(model_config(ref));
  m->init_weights(42);
  EngineOptions eo;
  eo.mixed_precision_on_f32_model = ref.precision == "fp16";
  auto e = initialize(std::move(m), DeepSpeedConfig::from_string(json(reference_case_of(c)), 1), eo);
  Run out;
  out.init = named_map(*e);
  Tensor x = Tensor::empty({batch(ref), seq(ref)}, DType::i32), y = Tensor::empty({batch(ref), seq(ref)}, DType::i32);
  for (int64_t s = 0; s < c.steps; s++) {
    for (int64_t j = 0; j < ref.gas; j++) {
      micro_batch(ref, s, j, x, y);
      e->forward(x, y);
      e->backward();
      e->step();
    }
    out.losses.push_back(e->last_loss());
    out.norms.push_back(float(e->last_grad_norm()));
  }
  out.params = named_map(*e);
  out.skipped = e->skipped_steps();
  for (int64_t j = 0; j < ref.gas; j++) {
    micro_batch(ref, 0, j, x, y);
    const float l = e->model().forward(x, y).value();
    out.eval_loss += l / float(ref.gas);
    if (j % c.dist.gas < c.stages) out.eval_few += l / float(c.dist.world * c.stages);
  }
  return out;
}

Run train_pipeline(const PipeCase& c, const ParallelGroups& g) {
  const DistCase& d = c.dist;
  ProcessGroup& pipe = *g.pipe;
  ProcessGroup* dp = g.data;
  const int dp_world = dp ? dp->size() : 1;
  DeepSpeedConfig cfg = DeepSpeedConfig::from_string(json(c), dp_world);
  const ModelConfig mc = model_config(d);
  const auto parts = partition_layers(c.method, pipe_item_params(mc), c.stages * c.virtual_stages);
  ModelOptions mo;
  mo.pad_multiple = 16 * dp_world;
  mo.allocate_grads = !(d.stage >= 2 && dp_world > 1);
  mo.tp_group = g.model;
  mo.sequence_parallel = d.sequence_parallel;
  auto m = make_pipeline_stage(mc, StageLayers::of_rank(parts, pipe.rank(), c.stages, c.virtual_stages), mo);
  m->init_weights(42);
  EngineOptions eo;
  eo.dp_group = dp;
  eo.mixed_precision_on_f32_model = d.precision == "fp16";
  eo.model_parallel_group = g.model_parallel;  // pipe x model
  auto pe = initialize_pipeline(std::move(m), cfg, eo, {&pipe, c.virtual_stages});
  if (c.interval_checkpointing) {
    EXPECT_EQ(pe->engine().model().checkpoint_policy(), CheckpointPolicy(size_t(mc.n_layer), true))
        << "pipeline.activation_checkpoint_interval 1 leaves some blocks unchecked";
  }
  EXPECT_EQ(pe->engine().model().partition_activations(), c.partition_activations);
  Run out;
  out.init = named_map(pe->engine(), g.model);
  const int dp_rank = dp ? dp->rank() : 0;
  auto step_batch = [&](int64_t s) {
    PipelineEngine::MicroBatches mbs;
    for (int64_t j = 0; j < d.gas; j++) {
      Tensor x = Tensor::empty({batch(d), seq(d)}, DType::i32), y = Tensor::empty({batch(d), seq(d)}, DType::i32);
      micro_batch(d, s, dp_rank * d.gas + j, x, y);
      mbs.push_back({x, y});
    }
    return mbs;
  };
  for (int64_t s = 0; s < c.steps; s++) {
    out.losses.push_back(pe->train_batch(step_batch(s)));
    out.norms.push_back(float(pe->engine().last_grad_norm()));
  }
  EXPECT_THROW(pe->forward(Tensor(), Tensor()), Error);
  EXPECT_THROW(pe->step(), Error);
  out.params = named_map(pe->engine(), g.model);
  out.skipped = pe->engine().skipped_steps();
  const int64_t steps = pe->engine().global_steps();
  out.eval_loss = pe->eval_batch(step_batch(0));
  EXPECT_EQ(pe->eval_batch(step_batch(0)), out.eval_loss) << "eval_batch changed something";
  PipelineEngine::MicroBatches few = step_batch(0);  // fewer than gradient_accumulation_steps
  few.resize(size_t(c.stages));
  out.eval_few = pe->eval_batch(few);
  EXPECT_EQ(pe->engine().global_steps(), steps);
  return out;
}

void expect_matches(const Run& got, const Run& want, const PipeCase& c, const std::string& what) {
  // Tensor parallelism splits the GEMMs' inner sums and the log-sum-exp too: test_tensor_parallel's 256 summands.
  const double S = c.tp > 1 ? 256.0 : double(c.dist.world * c.dist.gas), u = unit_roundoff("f32");
  auto per_step = [&](const std::vector<float>& ref) {
    return [&](size_t s) { return rounding_bound(u, S, int64_t(s) + 1, ref[s]); };
  };
  std::vector<float> got_norms, want_norms;  // the steps that did not overflow (an overflow's norm is inf or nan)
  for (size_t s = 0; s < want.norms.size(); s++) {
    EXPECT_EQ(std::isfinite(got.norms[s]), std::isfinite(want.norms[s])) << what << ": step " << s;
    if (std::isfinite(want.norms[s])) got_norms.push_back(got.norms[s]), want_norms.push_back(want.norms[s]);
  }
  expect_within(got_norms, want_norms, per_step(want_norms), what + ": gradient norms");
  expect_within(got.losses, want.losses, per_step(want.losses), what + ": losses");
  const double eval_bound = rounding_bound(u, S, c.steps + 1, want.eval_loss);
  expect_within({got.eval_loss, got.eval_few}, {want.eval_loss, want.eval_few}, [&](size_t) { return eval_bound; },
                what + ": eval_batch losses (gradient_accumulation_steps and fewer micro-batches)");
  EXPECT_GT(*std::max_element(want_norms.begin(), want_norms.end()), 0.05) << "clipping never engaged";
  if (c.scale_power > 8) {
    EXPECT_GT(want.skipped, 0) << "no step overflowed";
  }
  EXPECT_EQ(got.skipped, want.skipped) << what << ": fp16 overflow skips differ from one process's";
  for (const auto& [name, p] : got.params) {
    ASSERT_TRUE(want.params.count(name)) << name;
    const auto& w = want.params.at(name);
    const auto& w0 = want.init.at(name);
    ASSERT_EQ(got.init.at(name), w0) << what << ": " << name << " starts elsewhere";
    std::vector<float> update(w.size());
    for (size_t i = 0; i < w.size(); i++) update[i] = w[i] - w0[i];
    ASSERT_GT(max_abs(update), 0.0) << name << " never moved";
    const double ub = rounding_bound(u, S, c.steps, max_abs(update));
    expect_within(p, w, [&](size_t i) { return ub + kHeadroom * u * double(c.steps) * std::fabs(w[i]); },
                  what + ": " + name + " after " + std::to_string(c.steps) + " steps");
  }
}

// pp x dp x tp ranks (dist.world is dp) laid out as DeepSpeed's topology (Note [Topology layout]): e.g. PP 2 x DP 2
// has pipelines {0, 2} and {1, 3}, data groups {0, 1} and {2, 3}; TP 2 x PP 2 has tensor groups {0, 1} and {2, 3},
// pipelines {0, 2} and {1, 3}, and the tied copies of model rank m summed over its pipeline's {m, m + 2}.
void run_case(const PipeCase& c) {
  std::string why;
  if (!can_run(c.dist, &why)) GTEST_SKIP() << why;
  const int dp_world = c.dist.world, world = c.stages * dp_world * c.tp;
  DistCase ranks = c.dist;
  ranks.world = world;
  on_ranks(ranks, [&](ProcessGroup& pg, int rank) {
    const ParallelGroups g = make_parallel_groups(pg, pipe_model_data_parallel_topology(c.stages, c.tp, dp_world));
    const Run got = train_pipeline(c, g);
    const Run want = reference(c);
    expect_matches(got, want, c, "rank " + std::to_string(rank));
    leave_together(pg);
  });
}

PipeCase pipe_case(const std::string& arch, int virtual_stages, int dp, int stage = 0, int tp = 1) {
  PipeCase c;
  c.dist = dist_case(dp, stage, arch, [&](DistCase& d) {
    d.gas = 4;
    d.precision = "fp16";
    d.n_layer = 4;
  });
  c.virtual_stages = virtual_stages;
  c.tp = tp;
  if (virtual_stages > 1) c.method = "uniform";  // 6 items in 4 parts
  return c;
}

TEST(PipeEngine, OneFOneBEqualsOneProcessGpt2) { run_case(pipe_case("gpt2", 1, 1)); }
// fp16 overflow: the sum of squares of one stage may stay finite while the whole model's overflows; every stage must
// skip the steps one process skips.
TEST(PipeEngine, OverflowSkipsEveryStageAlike) {
  PipeCase c = pipe_case("llama", 1, 1);
  c.scale_power = 64;  // the first step overflows (checked), the later ones step
  c.steps = 4;
  run_case(c);
}
TEST(PipeEngine, OneFOneBEqualsOneProcessLlama) { run_case(pipe_case("llama", 1, 1)); }
TEST(PipeEngine, InterleavedEqualsOneProcessGpt2) { run_case(pipe_case("gpt2", 2, 1)); }
TEST(PipeEngine, InterleavedEqualsOneProcessLlama) { run_case(pipe_case("llama", 2, 1)); }

// PP 2 x DP 2: ZeRO over the data-parallel axis. GPT-2's tied table: its copies' gradients summed after the
// data-parallel average, from each rank's chunks under ZeRO (Note [Tied gradients under ZeRO]); Llama unties its head.
TEST(PipeEngine, PipeTimesDataStage0Gpt2) { run_case(pipe_case("gpt2", 1, 2, 0)); }
TEST(PipeEngine, PipeTimesDataStage1Gpt2) { run_case(pipe_case("gpt2", 1, 2, 1)); }
TEST(PipeEngine, PipeTimesDataStage2InterleavedGpt2) { run_case(pipe_case("gpt2", 2, 2, 2)); }
TEST(PipeEngine, PipeTimesDataStage3Gpt2) { run_case(pipe_case("gpt2", 1, 2, 3)); }
TEST(PipeEngine, PipeTimesDataStage1Llama) { run_case(pipe_case("llama", 1, 2, 1)); }
TEST(PipeEngine, PipeTimesDataStage2Llama) { run_case(pipe_case("llama", 1, 2, 2)); }
TEST(PipeEngine, PipeTimesDataStage2InterleavedLlama) { run_case(pipe_case("llama", 2, 2, 2)); }
TEST(PipeEngine, PipeTimesDataStage3Llama) { run_case(pipe_case("llama", 1, 2, 3)); }
TEST(PipeEngine, PipeTimesDataStage3InterleavedLlama) { run_case(pipe_case("llama", 2, 2, 3)); }

// TP 2 x PP 2: each stage's blocks, vocabulary-parallel table and loss split over its tensor group; the norm and the
// fp16 overflow over all four ranks (pipe x model); a tied table's shard summed with the other stage's copy of the
// same shard.
// A stage's checkpointed block inputs kept as each tensor rank's rows (Note [Partitioned activations]), stashed per
// micro-batch like any activation.
TEST(PipeEngine, TensorTimesPipeGpt2) {
  PipeCase c = pipe_case("gpt2", 1, 1, 0, 2);
  c.partition_activations = true;
  run_case(c);
}
TEST(PipeEngine, TensorTimesPipeLlama) {
  PipeCase c = pipe_case("llama", 1, 1, 0, 2);
  c.dist.checkpointing = false;
  c.interval_checkpointing = true;
  run_case(c);
}
TEST(PipeEngine, TensorTimesPipeInterleavedGpt2) {
  PipeCase c = pipe_case("gpt2", 2, 1, 0, 2);
  c.partition_activations = true;
  run_case(c);
}
// Note [Sequence parallelism]: the stages send and receive each tensor rank's rows only.
TEST(PipeEngine, TensorTimesPipeSequenceParallelGpt2) {
  PipeCase c = pipe_case("gpt2", 1, 1, 0, 2);
  c.dist.sequence_parallel = true;
  run_case(c);
}
TEST(PipeEngine, TensorTimesPipeInterleavedSequenceParallelLlama) {
  PipeCase c = pipe_case("llama", 2, 1, 0, 2);
  c.dist.sequence_parallel = true;
  run_case(c);
}
// TP 2 x PP 2 x DP 2 on 8 ranks, ZeRO over the data axis.
TEST(PipeEngine, TensorTimesPipeTimesDataStage0Gpt2) { run_case(pipe_case("gpt2", 1, 2, 0, 2)); }
TEST(PipeEngine, TensorTimesPipeTimesDataStage1Llama) { run_case(pipe_case("llama", 1, 2, 1, 2)); }
TEST(PipeEngine, TensorTimesPipeTimesDataStage2Gpt2) { run_case(pipe_case("gpt2", 1, 2, 2, 2)); }
TEST(PipeEngine, TensorTimesPipeTimesDataStage3Llama) { run_case(pipe_case("llama", 1, 2, 3, 2)); }
TEST(PipeEngine, TensorTimesPipeTimesDataStage3SequenceParallelGpt2) {
  PipeCase c = pipe_case("gpt2", 1, 2, 3, 2);
  c.dist.sequence_parallel = true;
  run_case(c);
}

TEST(PipeEngine, ConfigChecksNameTheKey) {
  auto config = [](int gas) {
    return DeepSpeedConfig::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )" +
                                        std::to_string(gas) + "}");
  };
  check_pipeline_config(config(4), 2, 2);  // 4 micro-batches over 2 stages x 2 virtual: fine
  check_pipeline_config(config(3), 2, 1);  // no interleaving: any count
  try {
    check_pipeline_config(config(3), 2, 2);
    ADD_FAILURE() << "3 micro-batches interleaved over 2 stages";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, "gradient_accumulation_steps");
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps = 3 with dscpp.pipeline.virtual_stages 2"),
              std::string::npos) << e.what();
  }
}

// The last stage fails on micro-batch 2 (targets of the wrong shape) while the first is mid-schedule: the first must
// end with an error naming the failed rank, well before its (long) timeout, not hang.
TEST(PipeEngine, ARankFailingMidPipelineEndsTheOthers) {
  const PipeCase c = pipe_case("gpt2", 1, 1);
  if (!gloo_available()) GTEST_SKIP() << "no Gloo in this build";
  const auto results = run_ranks(2, [&](int rank, int port) {
    omp_set_num_threads(1);
    auto pg = new_process_group("gloo", rank, 2, "127.0.0.1", port, std::chrono::seconds(120));
    const DistCase& d = c.dist;
    DeepSpeedConfig cfg = DeepSpeedConfig::from_string(json(c), 1);
    const ModelConfig mc = model_config(d);
    const auto parts = partition_layers(c.method, pipe_item_params(mc), 2);
    auto m = make_pipeline_stage(mc, StageLayers::of_rank(parts, rank, 2, 1));
    m->init_weights(42);
    EngineOptions eo;
    eo.mixed_precision_on_f32_model = true;
    auto pe = initialize_pipeline(std::move(m), cfg, eo, {pg.get(), 1});
    PipelineEngine::MicroBatches mbs;
    for (int64_t j = 0; j < d.gas; j++) {
      const int64_t T = rank == 1 && j == 2 ? seq(d) - 1 : seq(d);
      Tensor x = Tensor::zeros({batch(d), seq(d)}, DType::i32), y = Tensor::zeros({batch(d), T}, DType::i32);
      mbs.push_back({x, y});
    }
    if (rank == 1) {
      pe->train_batch(mbs);  // throws at micro-batch 2's load
      return;
    }
    try {
      pe->train_batch(mbs);
      ADD_FAILURE() << "train_batch finished without the last stage";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find("timed out"), std::string::npos) << "noticed only at the timeout: " << what;
      EXPECT_NE(what.find("failed rank: rank 1"), std::string::npos) << what;
    }
  }, std::chrono::seconds(180));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].passed) << results[0].message;
  EXPECT_FALSE(results[1].passed);
  EXPECT_NE(results[1].message.find("micro-batch 2"), std::string::npos) << results[1].message;
}

}  // namespace
}  // namespace dscpp::test
