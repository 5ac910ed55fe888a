// Autotuning's parts without trials: the config section (DeepSpeed's code defaults, errors naming key, value and
// rule), the engine's metrics file at end_profile_step, the space (DeepSpeed's per-stage keys, user lists, inert
// keys, names), the micro-batch arithmetic against DeepSpeed's, the cost model and the tuners (early stopping, the
// model-based tuner finding the best of a space in fewer trials than the grid), the resource manager, arg_mappings
// and the report. The trials themselves run in tests/e2e/test_autotune_e2e.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "dscpp/autotune/autotuner.h"
#include "dscpp/autotune/cost_model.h"
#include "dscpp/autotune/micro_batch.h"
#include "dscpp/autotune/report.h"
#include "dscpp/autotune/resources.h"
#include "dscpp/autotune/space.h"
#include "dscpp/autotune/trial_runner.h"
#include "dscpp/autotune/tuner.h"
#include "dscpp/core/rng.h"
#include "dscpp/runtime/engine.h"
#include "tiny_models.h"

using namespace dscpp;
using namespace dscpp::autotune;
namespace fs = std::filesystem;

namespace {

void expect_config_error(const std::string& text, const std::string& key, const std::vector<std::string>& parts) {
  try {
    DeepSpeedConfig::from_string(text);
    ADD_FAILURE() << "no error for " << text;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, key) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::string with_autotuning(const std::string& section) {
  return R"({"train_micro_batch_size_per_gpu": 2, "autotuning": )" + section + "}";
}

SpaceContext ctx(int world, bool cuda = false) { return SpaceContext{world, cuda, 4}; }

}  // namespace

// ---- the config section -----------------------------------------------------------------------------------------
TEST(AutotuningConfig, DeepSpeedCodeDefaults) {
  const AutotuningConfig a = DeepSpeedConfig::from_string(with_autotuning("{}")).autotuning;
  EXPECT_FALSE(a.enabled);
  EXPECT_TRUE(a.fast);
  EXPECT_EQ(a.results_dir, "autotuning_results");
  EXPECT_EQ(a.exps_dir, "autotuning_exps");
  EXPECT_TRUE(a.overwrite);  // code default (the doc says false)
  EXPECT_EQ(a.start_profile_step, 3);
  EXPECT_EQ(a.end_profile_step, 5);
  EXPECT_FALSE(a.metric_path);
  EXPECT_EQ(a.metric, "throughput");
  EXPECT_EQ(a.tuner_type, "gridsearch");  // code default (the doc says model_based)
  EXPECT_EQ(a.tuner_early_stopping, 5);
  EXPECT_EQ(a.tuner_num_trials, 50);
  EXPECT_TRUE(a.arg_mappings.empty());
  EXPECT_FALSE(a.max_train_batch_size);
  EXPECT_EQ(a.min_train_batch_size, 1);
  EXPECT_EQ(a.max_train_micro_batch_size_per_gpu, 1024);
  EXPECT_EQ(a.min_train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(a.num_tuning_micro_batch_sizes, 3);
  EXPECT_EQ(a.mp_size, 1);
  EXPECT_FALSE(a.model_info.num_params);
}

TEST(AutotuningConfig, ParsesEveryKeyAndRoundTrips) {
  const DeepSpeedConfig c = DeepSpeedConfig::from_string(with_autotuning(R"({
      "enabled": true, "fast": false, "results_dir": "r", "exps_dir": "e", "overwrite": false,
      "start_profile_step": 2, "end_profile_step": 7, "metric_path": "m.json", "metric": "FLOPS",
      "tuner_type": "model_based", "tuner_early_stopping": 0, "tuner_num_trials": 9,
      "arg_mappings": {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"},
      "max_train_batch_size": 64, "min_train_batch_size": 2, "max_train_micro_batch_size_per_gpu": 32,
      "min_train_micro_batch_size_per_gpu": 2, "num_tuning_micro_batch_sizes": 4, "mp_size": 1,
      "model_info_path": "info.json", "model_info": {"profile": true, "num_params": 1000, "hidden_size": 8,
      "num_layers": 2}})"));
  const AutotuningConfig& a = c.autotuning;
  EXPECT_TRUE(a.enabled);
  EXPECT_FALSE(a.fast);
  EXPECT_EQ(a.metric, "flops");  // DeepSpeed reads "FLOPS" too
  EXPECT_EQ(a.tuner_type, "model_based");
  EXPECT_EQ(a.end_profile_step, 7);
  EXPECT_EQ(a.arg_mappings.at("train_micro_batch_size_per_gpu"), "--per_device_train_batch_size");
  EXPECT_EQ(*a.max_train_batch_size, 64);
  EXPECT_EQ(*a.model_info.num_params, 1000);
  const DeepSpeedConfig back = DeepSpeedConfig::parse(c.to_json());
  EXPECT_EQ(back.canonical_dump(), c.canonical_dump());
  EXPECT_EQ(back.to_json()["autotuning"]["metric_path"], "m.json");
}

TEST(AutotuningConfig, ErrorsNameKeyValueAndRule) {
  expect_config_error(with_autotuning(R"({"start_profile_step": 5, "end_profile_step": 5})"),
                      "autotuning.end_profile_step", {"= 5", "must be > autotuning.start_profile_step (5)"});
  expect_config_error(with_autotuning(R"({"metric": "speed"})"), "autotuning.metric",
                      {"\"speed\"", "'throughput', 'latency', 'flops'"});
  expect_config_error(with_autotuning(R"({"tuner_type": "gridserch"})"), "autotuning.tuner_type",
                      {"did you mean 'gridsearch'"});
  expect_config_error(with_autotuning(R"({"tuner_num_trial": 3})"), "autotuning.tuner_num_trial",
                      {"unknown key", "did you mean 'tuner_num_trials'"});
  expect_config_error(with_autotuning(R"({"mp_size": 2})"), "autotuning.mp_size",
                      {"= 2", "without tensor or pipeline parallelism"});
  expect_config_error(with_autotuning(R"({"min_train_micro_batch_size_per_gpu": 8,
                      "max_train_micro_batch_size_per_gpu": 4})"),
                      "autotuning.max_train_micro_batch_size_per_gpu", {"= 4", ">= autotuning.min_train_micro"});
  expect_config_error(with_autotuning(R"({"arg_mappings": {"train_micro_batch_size_per_gpu": "bs"}})"),
                      "autotuning.arg_mappings.train_micro_batch_size_per_gpu", {"\"bs\"", "starting with \"--\""});
  expect_config_error(with_autotuning(R"({"model_info": {"num_params": 0}})"), "autotuning.model_info.num_params",
                      {"must be >= 1"});
}

// ---- the engine's metrics file ----------------------------------------------------------------------------------
TEST(AutotuningMetrics, WrittenAtEndProfileStepAndTheRunEnds) {
  const fs::path dir = fs::temp_directory_path() / ("dscpp_autotune_metrics_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "metrics.json").string();
  const DeepSpeedConfig cfg = DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "autotuning": {"enabled": true, "start_profile_step": 2, "end_profile_step": 4, "metric_path": ")" +
      path + "\"}}");
  auto model = make_model(test_fixtures::tiny_model_config("gpt2"));
  model->init_weights(1);
  auto e = initialize(std::move(model), cfg);
  Tensor x = Tensor::empty({2, 8}, DType::i32), y = Tensor::empty({2, 8}, DType::i32);
  Rng rng(7);
  for (int64_t i = 0; i < x.numel(); i++) x.data<int32_t>()[i] = int32_t(rng.below(97)), y.data<int32_t>()[i] = 1;
  for (int step = 1; step <= 4; step++) {
    EXPECT_FALSE(fs::exists(path)) << "written before end_profile_step, after step " << step - 1;
    EXPECT_FALSE(e->autotuning_finished());
    for (int m = 0; m < 2; m++) e->forward(x, y), e->backward(), e->step();
  }
  ASSERT_TRUE(fs::exists(path));
  EXPECT_TRUE(e->autotuning_finished());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const json m = json::parse(std::ifstream(path));
  const double latency = m.at("latency").get<double>();
  EXPECT_GT(latency, 0);
  EXPECT_NEAR(m.at("throughput").get<double>(), 4 * 1000.0 / latency, 1e-9 * m.at("throughput").get<double>());
  // two steps of 2 x 2 rows of 8 tokens: FLOPs per token x 32 tokens per step / latency
  const double fpt = test_fixtures::tiny_model_config("gpt2").train_flops_per_token(8);
  EXPECT_NEAR(m.at("FLOPS_per_gpu").get<double>(), fpt * 32 * 1000.0 / latency, 1e-6 * fpt * 32 * 1000.0 / latency);
  EXPECT_NEAR(m.at("tokens_per_second").get<double>(), 32 * 1000.0 / latency, 1e-6 * 32 * 1000.0 / latency);
  EXPECT_GT(m.at("peak_memory_bytes").get<int64_t>(), 0);
  EXPECT_EQ(m.at("profile_steps").get<int64_t>(), 2);
  EXPECT_EQ(m.at("tp"), 1);  // the layout that ran (tp x pp trials: tests/e2e/test_autotune_e2e.cpp)
  EXPECT_EQ(m.at("pp"), 1);
  EXPECT_EQ(m.at("dp"), 1);
  fs::remove_all(dir);
}

// ---- the space ---------------------------------------------------------------------------------------------------
TEST(AutotuneSpace, SplitsListsStagesAndMicroBatches) {
  const UserSpace u = split_user_config(json::parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2,
      "train_micro_batch_size_per_gpu": [8, 2, 4, 4], "zero_optimization": {"stage": [3, 1], "overlap_comm": true,
      "reduce_bucket_size": [5e7, 5e8]}, "dscpp": {"fused_head": [true, false]}, "autotuning": {"enabled": true}})"));
  EXPECT_EQ(u.stages, (std::vector<int>{1, 3}));
  EXPECT_EQ(u.micro_batches, (std::vector<int64_t>{2, 4, 8}));
  ASSERT_EQ(u.lists.size(), 2u);
  EXPECT_EQ(u.lists[0].path, "zero_optimization.reduce_bucket_size");
  EXPECT_EQ(u.lists[0].values, (std::vector<json>{50000000, 500000000}));  // written as floats, sizes as integers
  EXPECT_EQ(u.lists[1].path, "dscpp.fused_head");
  EXPECT_FALSE(u.base.contains("autotuning"));
  EXPECT_FALSE(u.base.contains("train_batch_size"));
  EXPECT_EQ(u.base["zero_optimization"], json::parse(R"({"overlap_comm": true})"));
  EXPECT_EQ(split_user_config(json::parse(R"({"zero_optimization": {"stage": "all"}})")).stages,
            (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(split_user_config(json::parse("{}")).stages, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(split_user_config(json::parse(R"({"zero_optimization": {"stage": 2}})")).stages, std::vector<int>{2});
  EXPECT_EQ(split_user_config(json::parse(R"({"zero_optimization": true})")).stages, std::vector<int>{1});
}

TEST(AutotuneSpace, RefusesListsItCannotTune) {
  auto error_key = [](const char* text) {
    try {
      split_user_config(json::parse(text));
    } catch (const ConfigError& e) {
      return e.key + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_NE(error_key(R"({"gradient_accumulation_steps": [1, 2]})").find("gradient_accumulation_steps: "),
            std::string::npos);
  EXPECT_NE(error_key(R"({"zero_optimization": {"stage": [0, 4]}})").find("each stage must be 0, 1, 2, 3"),
            std::string::npos);
  EXPECT_NE(error_key(R"({"zero_optimization": {"overlap_comm": [1, 0]}})").find("true or false"), std::string::npos);
  EXPECT_NE(error_key(R"({"train_micro_batch_size_per_gpu": [0, 2]})").find("whole number >= 1"), std::string::npos);
}

TEST(AutotuneSpace, StageSpacesHoldDeepSpeedsKeysAndOurs) {
  const UserSpace u = split_user_config(json::parse(R"({"dscpp": {"fused_head": false}})"));
  auto paths = [&](int stage, bool cuda) {
    std::set<std::string> p;
    for (const auto& d : stage_dimensions(stage, u, SpaceContext{2, cuda, 4})) p.insert(d.path);
    return p;
  };
  const std::set<std::string> z1 = paths(1, false), z2 = paths(2, false), z3 = paths(3, true);
  for (const char* k : {"zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size"})
    EXPECT_TRUE(z1.count(k) && z2.count(k) && z3.count(k)) << k;
  for (const char* k : {"zero_optimization.overlap_comm", "zero_optimization.reduce_scatter",
                        "zero_optimization.contiguous_gradients"})
    EXPECT_TRUE(z2.count(k) && z3.count(k)) << k;
  EXPECT_TRUE(z3.count("zero_optimization.allgather_partitions"));
  EXPECT_FALSE(z2.count("zero_optimization.allgather_partitions"));
  EXPECT_TRUE(z3.count("zero_optimization.stage3_prefetch_bucket_size"));
  EXPECT_TRUE(z3.count("zero_optimization.offload_optimizer.device"));  // ours, on CUDA
  EXPECT_FALSE(z1.count("zero_optimization.offload_optimizer.device"));  // not on the CPU
  EXPECT_TRUE(z3.count("dscpp.attention"));
  EXPECT_FALSE(z1.count("dscpp.attention"));
  EXPECT_FALSE(z1.count("dscpp.fused_head"));  // the user fixed it
  const std::vector<Dimension> d0 = stage_dimensions(0, u, SpaceContext{2, false, 6});
  auto ac = std::find_if(d0.begin(), d0.end(), [](const Dimension& d) {
    return d.path == "activation_checkpointing.number_checkpoints";
  });
  ASSERT_NE(ac, d0.end());
  EXPECT_EQ(ac->values, (std::vector<json>{nullptr, 6}));  // off, every block
  // reduce_bucket_size x overlap_comm x checkpointing x the layouts of 2 ranks (tp {1, 2} x pp {1, 2}) x sequence
  // parallelism
  EXPECT_EQ(all_choices(d0).size(), 3u * 2 * 2 * 2 * 2 * 2);
  for (const char* k : {"tensor_parallel.autotp_size", "pipeline.stages"}) {
    auto d = std::find_if(d0.begin(), d0.end(), [&](const Dimension& x) { return x.path == k; });
    ASSERT_NE(d, d0.end()) << k;
    EXPECT_EQ(d->values, (std::vector<json>{1, 2})) << k;
  }
  for (const auto& d : stage_dimensions(0, u, SpaceContext{1, false, 6}))  // one rank holds one layout
    EXPECT_TRUE(d.path != "tensor_parallel.autotp_size" && d.path != "pipeline.stages") << d.path;
  auto values = [](const std::vector<Dimension>& dims, const std::string& path) {
    for (const auto& d : dims)
      if (d.path == path) return d.values;
    return std::vector<json>{};
  };
  EXPECT_EQ(values(stage_dimensions(3, u, SpaceContext{4, true, 4}), "tensor_parallel.autotp_size"),
            (std::vector<json>{1, 2, 4}));
  // Parameter offload at stage 3 only, on CUDA; NVMe joins a device's values once its nvme_path is given.
  const std::string param = "zero_optimization.offload_param.device", opt = "zero_optimization.offload_optimizer.device";
  EXPECT_EQ(values(stage_dimensions(3, u, SpaceContext{2, true, 4}), param), (std::vector<json>{"none", "cpu"}));
  EXPECT_TRUE(values(stage_dimensions(2, u, SpaceContext{2, true, 4}), param).empty());
  EXPECT_TRUE(values(stage_dimensions(3, u, SpaceContext{2, false, 4}), param).empty());
  const UserSpace nvme = split_user_config(json::parse(R"({"zero_optimization": {"offload_optimizer":
      {"nvme_path": "/local_nvme"}, "offload_param": {"nvme_path": "/local_nvme"}}})"));
  const std::vector<Dimension> nv = stage_dimensions(3, nvme, SpaceContext{2, true, 4});
  EXPECT_EQ(values(nv, opt), (std::vector<json>{"none", "cpu", "nvme"}));
  EXPECT_EQ(values(nv, param), (std::vector<json>{"none", "cpu", "nvme"}));
  // A degree the user lists is checked as one.
  try {
    split_user_config(json::parse(R"({"pipeline": {"stages": [1, 0]}})"));
    ADD_FAILURE() << "no error for pipeline.stages [1, 0]";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, "pipeline.stages");
    EXPECT_NE(std::string(e.what()).find("a whole number >= 1"), std::string::npos) << e.what();
  }
}

TEST(AutotuneSpace, LayoutsLeaveTheDataParallelRanks) {
  const json base = json::parse(R"({"pipeline": {"stages": 2}})");
  EXPECT_EQ(data_parallel_ranks({}, base, 4), 2);
  EXPECT_EQ(data_parallel_ranks({{"tensor_parallel.autotp_size", 2}}, base, 4), 1);
  EXPECT_EQ(data_parallel_ranks({{"pipeline.stages", 4}}, base, 2), 0);  // 4 does not divide 2
  EXPECT_EQ(layout_degree({}, json::parse(R"({"tensor_parallel": {"tp": {"tp_size": 2}}})"),
                          "tensor_parallel.autotp_size"), 2);  // the inference spelling
  EXPECT_EQ(base_data_parallel_ranks(json::parse(R"({"pipeline": {"stages": [2, 1]}})"), 4), 2);  // the first
  try {
    base_data_parallel_ranks(json::parse(R"({"tensor_parallel": {"autotp_size": 3}})"), 4);
    ADD_FAILURE() << "no error for tp 3 of 4 ranks";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, "tensor_parallel.autotp_size");
    EXPECT_NE(std::string(e.what()).find("= 3 does not divide the 4 ranks of a trial"), std::string::npos) << e.what();
  }
  // The global batch splits over dp: 2 ranks at tp 2 hold one replica.
  UserSpace u = split_user_config(json::parse(R"({"train_batch_size": 6})"));
  EXPECT_EQ(make_config(u, 0, {{"tensor_parallel.autotp_size", 2}}, 3, 2, 1)["train_batch_size"], 6);
  EXPECT_EQ(batch_rules(json::parse(R"({"train_batch_size": 6})"), AutotuningConfig{}, 1).allowed_list(),
            (std::vector<int64_t>{1, 2, 3, 6}));
}

TEST(AutotuneSpace, InertKeysAndOneRankCollapse) {
  Choice c = {{"zero_optimization.reduce_bucket_size", 50000000}, {"zero_optimization.overlap_comm", true},
              {"zero_optimization.contiguous_gradients", false}, {"dscpp.fused_head", true}};
  std::vector<std::string> why;
  EXPECT_EQ(canonical_choice(2, c, json::object(), ctx(2), &why), 2);
  EXPECT_EQ(c, (Choice{{"zero_optimization.overlap_comm", true}, {"dscpp.fused_head", true}}));
  EXPECT_EQ(why.size(), 2u);  // reduce_bucket_size at stage 2, contiguous_gradients always

  Choice one = {{"zero_optimization.overlap_comm", true}, {"dscpp.attention", "own"}};
  why.clear();
  EXPECT_EQ(canonical_choice(3, one, json::object(), ctx(1), &why), 0);  // one rank: stage 3 runs as stage 0
  EXPECT_TRUE(one.empty());
  EXPECT_NE(why[0].find("partitions nothing"), std::string::npos);
  Choice off = {{"zero_optimization.offload_optimizer.device", "cpu"}};
  EXPECT_EQ(canonical_choice(2, off, json::object(), ctx(1, true)), 1);  // offload needs a stage: 1 is enough
  Choice fixed;
  EXPECT_EQ(canonical_choice(1, fixed, json::parse(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})"),
                             ctx(1, true)), 1);
  Choice nvme = {{"zero_optimization.offload_optimizer.device", "nvme"}};
  EXPECT_EQ(canonical_choice(3, nvme, json::object(), ctx(1, true)), 1);  // NVMe is an offload too

  // Parameter offload is what stage 3 adds on one data-parallel rank; below stage 3 it has no effect.
  Choice param = {{"zero_optimization.offload_param.device", "cpu"}, {"zero_optimization.overlap_comm", true}};
  EXPECT_EQ(canonical_choice(3, param, json::object(), ctx(1, true)), 3);
  EXPECT_EQ(param, (Choice{{"zero_optimization.offload_param.device", "cpu"}}));  // overlap_comm: one rank
  Choice param2 = {{"zero_optimization.offload_param.device", "cpu"}};
  EXPECT_EQ(canonical_choice(2, param2, json::object(), ctx(2, true)), 2);
  EXPECT_TRUE(param2.empty());

  // A tp x pp layout that takes every rank leaves one data-parallel rank: ZeRO partitions nothing there either.
  Choice tp = {{"tensor_parallel.autotp_size", 2}, {"zero_optimization.overlap_comm", true}};
  why.clear();
  EXPECT_EQ(canonical_choice(2, tp, json::object(), ctx(2), &why), 0);
  EXPECT_EQ(tp, (Choice{{"tensor_parallel.autotp_size", 2}}));
  EXPECT_NE(why[0].find("one data-parallel rank (tp x pp = 2 ranks): ZeRO stage 2 partitions nothing"),
            std::string::npos) << why[0];
  Choice pp = {{"pipeline.stages", 2}, {"zero_optimization.overlap_comm", true}};
  EXPECT_EQ(canonical_choice(1, pp, json::object(), ctx(4)), 1);  // 2 data-parallel ranks: partitioned
  EXPECT_EQ(pp.size(), 2u);
  // Sequence parallelism splits rows over the tensor-parallel ranks: without them it is the same run.
  Choice sp1 = {{"pipeline.stages", 2}, {"dscpp.sequence_parallel", true}};
  why.clear();
  canonical_choice(0, sp1, json::object(), ctx(2), &why);
  EXPECT_EQ(sp1, (Choice{{"pipeline.stages", 2}}));
  EXPECT_NE(why.back().find("dscpp.sequence_parallel: no effect without tensor parallelism"), std::string::npos);
  Choice sp2 = {{"tensor_parallel.autotp_size", 2}, {"dscpp.sequence_parallel", true}};
  canonical_choice(0, sp2, json::object(), ctx(2));
  EXPECT_EQ(sp2.size(), 2u);
  Choice sp_base = {{"dscpp.sequence_parallel", true}};  // the tp of the base config counts too
  canonical_choice(0, sp_base, json::parse(R"({"tensor_parallel": {"autotp_size": 2}})"), ctx(2));
  EXPECT_EQ(sp_base.size(), 1u);
  // Interleaved stages alike without pipeline stages; searched only when listed.
  Choice v1 = {{"tensor_parallel.autotp_size", 2}, {"dscpp.pipeline.virtual_stages", 2}};
  canonical_choice(0, v1, json::object(), ctx(2));
  EXPECT_EQ(v1, (Choice{{"tensor_parallel.autotp_size", 2}}));
  Choice v2 = {{"pipeline.stages", 2}, {"dscpp.pipeline.virtual_stages", 2}};
  canonical_choice(0, v2, json::object(), ctx(2));
  EXPECT_EQ(v2.size(), 2u);
}

TEST(AutotuneSpace, NamesAndConfigsAreDeepSpeeds) {
  EXPECT_EQ(experiment_name(1, {}, {}, 2, 4), "z1_gas2_tmbspg4");
  const Choice c = {{"zero_optimization.reduce_bucket_size", 50000000}, {"zero_optimization.overlap_comm", true},
                    {"activation_checkpointing.number_checkpoints", nullptr},
                    {"zero_optimization.offload_optimizer.device", "cpu"}};
  const std::vector<std::string> tuned = {"zero_optimization.reduce_bucket_size", "zero_optimization.overlap_comm",
                                          "activation_checkpointing.number_checkpoints",
                                          "zero_optimization.offload_optimizer.device", "dscpp.fused_head"};
  EXPECT_EQ(experiment_name(2, c, tuned, 1, 8), "z2_ncNone_oocpu_ocT_rbs5.0e+07_gas1_tmbspg8");
  EXPECT_EQ(experiment_name(3, {{"tensor_parallel.autotp_size", 2}, {"pipeline.stages", 1},
                                {"zero_optimization.offload_param.device", "cpu"}},
                            {"tensor_parallel.autotp_size", "pipeline.stages", "zero_optimization.offload_param.device"},
                            4, 1),
            "z3_pp1_tp2_opcpu_gas4_tmbspg1");
  UserSpace u = split_user_config(json::parse(R"({"optimizer": {"type": "AdamW"}, "train_batch_size": 64,
      "activation_checkpointing": {"number_checkpoints": 2}})"));
  const json cfg = make_config(u, 2, c, 8, 2, 4);
  EXPECT_EQ(cfg["train_batch_size"], 64);
  EXPECT_EQ(cfg["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(cfg["gradient_accumulation_steps"], 2);
  EXPECT_EQ(cfg["zero_optimization"]["stage"], 2);
  EXPECT_EQ(cfg["zero_optimization"]["offload_optimizer"], json::parse(R"({"device": "cpu"})"));
  EXPECT_FALSE(cfg["activation_checkpointing"].contains("number_checkpoints"));  // null leaves it out
  EXPECT_EQ(DeepSpeedConfig::parse(cfg, 4).zero_optimization.reduce_bucket_size, 50000000);
}

// ---- the micro-batch search -------------------------------------------------------------------------------------
TEST(AutotuneMicroBatch, FixedGlobalBatchAllowsDivisorsOnly) {
  AutotuningConfig at;
  const BatchRules r = batch_rules(json::parse(R"({"train_batch_size": 48})"), at, 2);
  EXPECT_EQ(*r.per_rank, 24);
  EXPECT_EQ(r.allowed_list(), (std::vector<int64_t>{1, 2, 3, 4, 6, 8, 12, 24}));
  EXPECT_EQ(r.gas_for(6), 4);
  // DeepSpeed's list up to 24: from 12 in strides of 4 (12, 16, 20), those allowed with another accumulation than
  // 24's (12), then 24.
  EXPECT_EQ(tuning_micro_batch_sizes(r, 24, 3), (std::vector<int64_t>{12, 24}));
  EXPECT_EQ(tuning_micro_batch_sizes(r, 8, 3), (std::vector<int64_t>{4, 6, 8}));
  EXPECT_EQ(refinement_micro_batches(r, {12, 24}), std::vector<int64_t>{});  // 13..23 in strides of 3: none divides
  EXPECT_EQ(largest_fitting(r, [](int64_t m) { return m <= 10; }), 8);
  EXPECT_EQ(largest_fitting(r, [](int64_t) { return false; }), 0);
}

TEST(AutotuneMicroBatch, FreeGlobalBatchKeepsAccumulation) {
  AutotuningConfig at;
  at.max_train_micro_batch_size_per_gpu = 64;
  at.max_train_batch_size = 96;
  const BatchRules r = batch_rules(json::parse(R"({"gradient_accumulation_steps": 2})"), at, 2);
  EXPECT_FALSE(r.per_rank);
  EXPECT_EQ(r.gas_for(5), 2);
  EXPECT_EQ(r.allowed_list().back(), 24);  // 24 x 2 x 2 = 96
  EXPECT_EQ(tuning_micro_batch_sizes(r, 20, 3), (std::vector<int64_t>{10, 13, 16, 19, 20}));
  EXPECT_EQ(refinement_micro_batches(r, {10, 20}), (std::vector<int64_t>{17, 14, 11}));
  at.max_train_batch_size = 2;  // below one micro-batch of 1 x gas 2 x 2 ranks
  try {
    batch_rules(json::parse(R"({"gradient_accumulation_steps": 2})"), at, 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no micro-batch from 1 to 64"), std::string::npos) << e.what();
  }
  try {
    batch_rules(json::parse(R"({"train_batch_size": 9})"), AutotuningConfig{}, 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key, "train_batch_size");
  }
}

// ---- the cost model and the tuners --------------------------------------------------------------------------------
TEST(AutotuneCostModel, FitsStepsAndRanksUnseenPoints) {
  // score = 3 [x0 > 2] + x1, on a grid; the model sees every other point.
  std::vector<std::vector<double>> x, unseen;
  std::vector<double> y;
  for (int a = 0; a < 6; a++)
    for (int b = 0; b < 4; b++) ((a + b) % 2 ? unseen : x).push_back({double(a), double(b)});
  for (const auto& r : x) y.push_back(3.0 * (r[0] > 2) + r[1]);
  CostModel m;
  m.fit(x, y);
  EXPECT_GT(m.stumps(), 0u);
  for (const auto& r : x) EXPECT_NEAR(m.predict(r), 3.0 * (r[0] > 2) + r[1], 0.05) << r[0] << "," << r[1];
  // unseen points keep their order where the truth differs by a step: (5, 3) above (1, 2) above (0, 1)
  EXPECT_GT(m.predict({5, 3}), m.predict({1, 2}));
  EXPECT_GT(m.predict({1, 2}), m.predict({0, 1}));
  CostModel flat;
  flat.fit({{1}, {2}, {3}}, {4, 4, 4});
  EXPECT_EQ(flat.stumps(), 0u);
  EXPECT_DOUBLE_EQ(flat.predict({9}), 4);
}

namespace {
// A space of 64 points on a 4 x 4 x 4 grid whose best is far from the grid's start: the score rises with every
// feature. Returns the tuner's trials until it ran the best, with the scores seen.
struct Landscape {
  std::vector<std::vector<double>> f;
  std::vector<double> score;
  Landscape() {
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 4; b++)
        for (int c = 0; c < 4; c++) {
          f.push_back({double(a), double(b), double(c)});
          score.push_back(10.0 * a + 3.0 * b + c);
        }
  }
  size_t best() const { return size_t(std::max_element(score.begin(), score.end()) - score.begin()); }
};
}  // namespace

TEST(AutotuneTuner, GridRandomAndModelBased) {
  const Landscape l;
  auto run = [&](const std::string& type, size_t early) {
    auto t = make_tuner(type, l.f, 3);
    std::vector<size_t> order;
    const TuneStats st = tune(*t, 2, 64, early, [&](const std::vector<size_t>& idx) {
      std::vector<std::optional<double>> s;
      for (size_t i : idx) order.push_back(i), s.push_back(l.score[i]);
      return s;
    });
    EXPECT_EQ(st.trials, order.size());
    return std::make_pair(st, order);
  };
  const auto [grid, grid_order] = run("gridsearch", 0);
  EXPECT_EQ(grid.trials, 64u);
  for (size_t i = 0; i < 64; i++) EXPECT_EQ(grid_order[i], i);
  EXPECT_EQ(*grid.best, l.best());

  const auto [rnd, rnd_order] = run("random", 0);
  EXPECT_EQ(std::set<size_t>(rnd_order.begin(), rnd_order.end()).size(), 64u);  // a permutation
  EXPECT_NE(rnd_order, grid_order);
  EXPECT_EQ(run("random", 0).second, rnd_order);  // the same seed, the same order

  const auto [mb, mb_order] = run("model_based", 0);
  const size_t found = size_t(std::find(mb_order.begin(), mb_order.end(), l.best()) - mb_order.begin());
  EXPECT_LE(found + 1, 16u) << "the model-based tuner ran the best only at trial " << found + 1 << " (grid: 64)";
  EXPECT_EQ(mb_order[0], 0u);  // DeepSpeed's first seed
}

TEST(AutotuneTuner, EarlyStoppingCountsTrialsSinceTheBest) {
  // The best comes first; with early stopping 5 and batches of 2 the tuner stops once 6 trials have run.
  const std::vector<double> score = {9, 1, 2, 3, 4, 5, 6, 7, 8, 0};
  auto t = make_tuner("gridsearch", std::vector<std::vector<double>>(score.size(), {0.0}), 0);
  const TuneStats st = tune(*t, 2, 50, 5, [&](const std::vector<size_t>& idx) {
    std::vector<std::optional<double>> s;
    for (size_t i : idx) s.push_back(score[i]);
    return s;
  });
  EXPECT_TRUE(st.early_stopped);
  EXPECT_EQ(st.trials, 6u);
  EXPECT_EQ(*st.best, 0u);
  // Failed trials (nullopt) never become the best; tuner_num_trials bounds the run.
  auto t2 = make_tuner("gridsearch", std::vector<std::vector<double>>(4, {0.0}), 0);
  const TuneStats st2 = tune(*t2, 1, 3, 0, [](const std::vector<size_t>& idx) {
    return std::vector<std::optional<double>>(idx.size(), std::nullopt);
  });
  EXPECT_EQ(st2.trials, 3u);
  EXPECT_FALSE(st2.best);
}

TEST(AutotuneTuner, PriorTrialsSeedTheModelAndTheEarlyStop) {
  // The micro-batch search's trials, handed over as priors, replace the random seeds: the first pick is the model's,
  // and early stopping counts from the priors' best, so a space whose points never beat it stops after `early`.
  const Landscape l;
  auto t = make_tuner("model_based", l.f, 3);
  t->prior({0, 0, 0}, 0.0);
  t->prior({3, 0, 0}, 30.0);
  std::vector<size_t> order;
  const TuneStats st = tune(*t, 1, 64, 3, [&](const std::vector<size_t>& idx) {
    std::vector<std::optional<double>> s;
    for (size_t i : idx) order.push_back(i), s.push_back(l.score[i] >= 40 ? 1.0 : l.score[i]);
    return s;
  }, 40.0);
  ASSERT_FALSE(order.empty());
  EXPECT_NE(order[0], 0u) << "no DeepSpeed seed once priors exist";
  EXPECT_GE(l.f[order[0]][0], 2.0) << "the first pick follows the priors' slope along the first feature";
  EXPECT_TRUE(st.early_stopped);
  EXPECT_EQ(st.trials, 3u);
  EXPECT_FALSE(st.best) << "nothing beat the prior best of 40";
  // Without a prior best, the first trial is the best whatever it scores (and counts towards the early stop).
  auto t2 = make_tuner("gridsearch", l.f, 3);
  const TuneStats st2 = tune(*t2, 1, 64, 3, [&](const std::vector<size_t>& idx) {
    return std::vector<std::optional<double>>(idx.size(), 5.0);
  });
  EXPECT_EQ(st2.trials, 3u);
  EXPECT_EQ(*st2.best, 0u);
  // With a prior best of 5, the same equal scores beat nothing.
  auto t3 = make_tuner("gridsearch", l.f, 3);
  const TuneStats st3 = tune(
      *t3, 1, 64, 3,
      [&](const std::vector<size_t>& idx) { return std::vector<std::optional<double>>(idx.size(), 5.0); }, 5.0);
  EXPECT_EQ(st3.trials, 3u);
  EXPECT_FALSE(st3.best);
}

// ---- resources, arguments ------------------------------------------------------------------------------------------
TEST(AutotuneResources, ReservesDisjointSlotsPerTrial) {
  const launcher::Resources pool = {{"a", {0, 1, 2, 3}}, {"b", {0, 1, 2, 3}}};
  ResourceManager one_node(pool, 1, 2);
  EXPECT_EQ(one_node.capacity(), 4);
  std::vector<Reservation> held;
  while (auto r = one_node.reserve()) held.push_back(*r);
  ASSERT_EQ(held.size(), 4u);
  EXPECT_EQ(launcher::format_resources(held[0]), "a:0,1");
  EXPECT_EQ(launcher::format_resources(held[2]), "b:0,1");
  one_node.release(held[0]);
  EXPECT_EQ(launcher::format_resources(*one_node.reserve()), "a:0,1");
  ResourceManager two_nodes(pool, 2, 4);
  EXPECT_EQ(two_nodes.capacity(), 1);
  EXPECT_EQ(launcher::format_resources(*two_nodes.reserve()), "a:0,1,2,3@b:0,1,2,3");
  EXPECT_FALSE(two_nodes.reserve());
  EXPECT_THROW(ResourceManager(pool, 1, 5), Error);
}

TEST(AutotuneArgs, ArgMappingsReplaceOrAppendFlags) {
  std::vector<std::string> args = {"train", "--steps", "10", "--seed", "3"};
  apply_arg_mappings(args, {{"train_micro_batch_size_per_gpu", "--batch"}, {"seed", "--seed"},
                            {"zero_optimization.stage", "--stage"}, {"absent", "--absent"}},
                     json::parse(R"({"train_micro_batch_size_per_gpu": 4, "seed": 9,
                                     "zero_optimization": {"stage": 2}})"));
  EXPECT_EQ(args, (std::vector<std::string>{"train", "--steps", "10", "--seed", "9", "--batch", "4", "--stage", "2"}));
}

// ---- the report -------------------------------------------------------------------------------------------------
TEST(AutotuneReport, ExplainsEveryStageWhenNothingRan) {
  AutotuneInputs in;
  in.memory_limit = int64_t(1) << 20;
  in.memory_limit_why = "--memory_limit_gib";
  AutotuneResult r;
  Record pruned;
  pruned.exp.name = "z0_gas1_tmbspg1";
  pruned.state = Record::State::pruned;
  pruned.exp.predicted_peak = int64_t(3) << 20;
  pruned.note = "micro-batch 1: predicted peak 3.0 MiB (backward) > limit 1.0 MiB (--memory_limit_gib)";
  r.records.push_back(pruned);
  Record crashed;
  crashed.exp.name = "z1_gas1_tmbspg1";
  crashed.exp.stage = 1;
  crashed.result = TrialResult{Outcome::crash, std::nullopt, "was killed by signal 6 (Aborted): boom", 0.5, false};
  r.records.push_back(crashed);
  r.stages = {{0, "pruned", {"no micro-batch fits: at micro-batch 1: predicted peak 3.0 MiB > limit 1.0 MiB"}, 0, {}},
              {1, "tuned", {"micro-batch search over 1"}, 1, {}}};
  const std::string table = format_ranked_table(r, in);
  EXPECT_NE(table.find("No trial ran successfully"), std::string::npos) << table;
  EXPECT_NE(table.find("stage 0: pruned; no micro-batch fits: at micro-batch 1: predicted peak 3.0 MiB"),
            std::string::npos) << table;
  EXPECT_NE(table.find("stage 1: tuned; micro-batch search over 1; 1 trial(s) failed (crash 1)"), std::string::npos)
      << table;
  EXPECT_NE(table.find("z1_gas1_tmbspg1: crash: was killed by signal 6 (Aborted): boom"), std::string::npos) << table;
  EXPECT_NE(table.find("1 pruned by memory"), std::string::npos) << table;
  const std::string html = format_html_report(r, in, {});
  EXPECT_NE(html.find("No trial ran successfully"), std::string::npos);
  EXPECT_NE(html.find("predicted peak 3.0 MiB (backward) &gt; limit 1.0 MiB"), std::string::npos);
  EXPECT_NE(html.find("<svg"), std::string::npos);  // the failed trial, as a cross
  EXPECT_NE(format_summary(r, in).find("| global | 1 | - | - |"), std::string::npos) << format_summary(r, in);
}
