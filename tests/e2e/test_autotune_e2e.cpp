// `dscpp autotune` end to end on CPU ranks and a 2-layer model: real trials (each a `dscpp train` child process)
// through the grid and the model-based tuner with early stopping, DeepSpeed's result folders, reuse of finished
// trials, a trial that crashes, one that hangs past its timeout and one out of memory (Note [Trial faults]), pruning
// by the memory estimate with nothing launched, the report and the best config, `--run`,
// `dscpp launch --autotuning tune` over 2 CPU ranks per trial, and tp x pp layouts on them (run, and pruned with
// their reasons).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "dscpp/comm/process_group.h"
#include "dscpp/data/train_data.h"
#include "dscpp/runtime/config.h"
#include "dscpp/runtime/training_memory.h"
#include "e2e/cli_workspace.h"

namespace fs = std::filesystem;
using dscpp::test::count;
using dscpp::test::dscpp_binary;
using dscpp::test::read_text;
using json = nlohmann::json;

namespace {

class Autotune : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
    ws_ = std::make_unique<dscpp::test::CliWorkspace>("autotune");
  }

  // A ds_config with a global batch of 8 and this autotuning section; results under dir/<name>.
  std::string config(const std::string& name, const std::string& autotuning, const std::string& extra = "") {
    const std::string results = (ws_->dir / name / "results").string(), exps = (ws_->dir / name / "exps").string();
    json at = json::parse(autotuning);
    at["enabled"] = true;
    at["results_dir"] = results;
    at["exps_dir"] = exps;
    return ws_->write(name + ".json", R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params":
        {"lr": 0.003}}, )" + extra + R"("autotuning": )" + at.dump() + "}");
  }
  fs::path results(const std::string& name) const { return ws_->dir / name / "results"; }

  // `dscpp autotune <options> train ...` on the tiny model; *rc its exit status.
  std::string autotune(const std::string& options, const std::string& cfg, int* rc, const std::string& env = "",
                       const std::string& train = "") {
    return dscpp::test::run_command(env + " " + dscpp_binary() + " autotune " + options + ws_->train_args("out") +
                                        " --config " + cfg + " " + train,
                                    rc);
  }

  // The trial folders under a results dir, by name.
  static std::set<std::string> trials(const fs::path& dir) {
    std::set<std::string> out;
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) out.insert(e.path().filename().string());
    return out;
  }

  static json load(const fs::path& p) { return json::parse(read_text(p)); }

  std::unique_ptr<dscpp::test::CliWorkspace> ws_;
};

// The experiment named after "Best: ".
std::string best_of(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("Best: (\\S+) ")) ? m[1].str() : "";
}

}  // namespace

TEST_F(Autotune, GridSearchRunsEverySpacePointOnceAndWritesTheBest) {
  // One rank per trial on 2 slots: stages 1-3 run as stage 0 there (Note [Inert keys]), so stage 0's space is
  // activation checkpointing x fused head x micro-batches {2, 4}: 8 points, 2 of them the micro-batch search's.
  const std::string cfg = config("grid", R"({"fast": false, "tuner_type": "gridsearch", "tuner_early_stopping": 0,
      "max_train_micro_batch_size_per_gpu": 4, "num_tuning_micro_batch_sizes": 2})");
  int rc = 0;
  const std::string out = autotune("--slots 2", cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("stage 0: micro-batch search over 2, 4"), std::string::npos) << out;
  EXPECT_NE(out.find("6 candidates, 6 run by the gridsearch tuner; 2 equal to trials already run"), std::string::npos)
      << out;
  EXPECT_NE(out.find("Trials: 8 run, 0 reused"), std::string::npos) << out;
  for (int s = 1; s <= 3; s++)
    EXPECT_NE(out.find("stage " + std::to_string(s) + ": equivalent; one rank: ZeRO stage " + std::to_string(s) +
                       " partitions nothing"), std::string::npos) << out;

  // DeepSpeed's folders, one per trial; the best is the trial whose metrics file says the most samples/s.
  const fs::path dir = results("grid");
  std::set<std::string> names = trials(dir);
  ASSERT_EQ(names.size(), 8u) << out;
  EXPECT_TRUE(names.count("z0_gas4_tmbspg2") && names.count("z0_gas2_tmbspg4")) << out;
  EXPECT_TRUE(names.count("z0_nc2_fhT_gas2_tmbspg4")) << out;
  std::string best;
  double best_tp = -1;
  for (const auto& n : names) {
    for (const char* f : {"ds_config.json", "exp.json", "cmd.txt", "stdout.log", "stderr.log", "metrics.json",
                          "result.json"})
      EXPECT_TRUE(fs::exists(dir / n / f)) << n << "/" << f;
    EXPECT_TRUE(fs::exists(ws_->dir / "grid" / "exps" / (n + ".json"))) << n;
    const json cfg_n = load(dir / n / "ds_config.json");
    EXPECT_EQ(cfg_n["autotuning"]["metric_path"], (dir / n / "metrics.json").string());
    EXPECT_EQ(cfg_n["train_batch_size"], 8);  // the global batch stays fixed
    EXPECT_EQ(load(dir / n / "result.json")["outcome"], "ok");
    const double tp = load(dir / n / "metrics.json")["throughput"].get<double>();
    if (tp > best_tp) best_tp = tp, best = n;
  }
  EXPECT_EQ(best_of(out), best) << out;
  const json optimal = load(dir / "ds_config_optimal.json");
  EXPECT_FALSE(optimal.contains("autotuning"));
  json best_cfg = load(dir / best / "ds_config.json");
  best_cfg.erase("autotuning");
  EXPECT_EQ(optimal, best_cfg);
  EXPECT_EQ(dscpp::DeepSpeedConfig::parse(optimal).train_batch_size, 8);
  EXPECT_NE(read_text(dir / "cmd_optimal.txt").find("train --config " + (dir / "ds_config_optimal.json").string()),
            std::string::npos);
  const std::string summary = read_text(dir / "summary.txt");
  EXPECT_NE(summary.find("| global | 8 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Tuning completed in 0:"), std::string::npos) << summary;
  const std::string html = read_text(dir / "autotuning_report.html");
  EXPECT_EQ(count(html, "<svg"), 2) << "metric by trial and by micro-batch";
  EXPECT_NE(html.find("Best: " + best), std::string::npos);
  EXPECT_NE(html.find("z0_nc2_fhT_gas2_tmbspg4"), std::string::npos);
}

TEST_F(Autotune, ModelBasedTunerAndEarlyStopping) {
  // The model-based tuner: two seeds, then the cost model's picks, up to tuner_num_trials.
  int rc = 0;
  std::string out = autotune("", config("model_based", R"({"fast": false, "tuner_type": "model_based",
      "tuner_num_trials": 4, "tuner_early_stopping": 0, "max_train_micro_batch_size_per_gpu": 4,
      "num_tuning_micro_batch_sizes": 2})"), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("6 candidates, 4 run by the model_based tuner (tuner_num_trials 4)"), std::string::npos) << out;
  EXPECT_EQ(trials(results("model_based")).size(), 2u + 4u) << out;
  // Early stopping: with 2 slots the first batch holds 2 trials; tuner_early_stopping 1 stops right after it.
  out = autotune("--slots 2", config("early", R"({"fast": false, "tuner_type": "model_based",
      "tuner_early_stopping": 1, "max_train_micro_batch_size_per_gpu": 4, "num_tuning_micro_batch_sizes": 2})"), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("6 candidates, 2 run by the model_based tuner, stopped early after 2 (tuner_early_stopping 1 "
                     "trials without a better one)"), std::string::npos) << out;
  EXPECT_EQ(trials(results("early")).size(), 2u + 2u) << out;
}

TEST_F(Autotune, FinishedTrialsAreReusedUnlessTheConfigChanged) {
  const std::string at = R"({"overwrite": false, "max_train_micro_batch_size_per_gpu": 4})";
  const std::string cfg = config("reuse", at);
  int rc = 0;
  std::string first = autotune("", cfg, &rc);
  ASSERT_EQ(rc, 0) << first;
  EXPECT_NE(first.find("Trials: 2 run, 0 reused"), std::string::npos) << first;
  const std::string metrics = read_text(results("reuse") / "z0_gas2_tmbspg4" / "metrics.json");
  std::string again = autotune("", cfg, &rc);
  ASSERT_EQ(rc, 0) << again;
  EXPECT_NE(again.find("Trials: 0 run, 2 reused"), std::string::npos) << again;
  EXPECT_NE(again.find("trial z0_gas2_tmbspg4: ok (reused from " + (results("reuse") / "z0_gas2_tmbspg4").string()),
            std::string::npos) << again;
  EXPECT_EQ(best_of(again), best_of(first));
  EXPECT_EQ(read_text(results("reuse") / "z0_gas2_tmbspg4" / "metrics.json"), metrics);  // not run again
  // Another learning rate is another experiment under the same name: run again.
  const std::string changed = config("reuse", at, R"("gradient_clipping": 1.0, )");
  again = autotune("", changed, &rc);
  ASSERT_EQ(rc, 0) << again;
  EXPECT_NE(again.find("Trials: 2 run, 0 reused"), std::string::npos) << again;
}

TEST_F(Autotune, CrashTimeoutAndOutOfMemoryAreRecordedWithTheirReasons) {
  // Four listed micro-batches; three trials fail by fault injection: an abort, a hang (killed at its timeout) and
  // an out-of-memory error. The fourth is the best.
  const std::string cfg = config("faults", R"({})", R"("train_micro_batch_size_per_gpu": [1, 2, 4, 8],
      "zero_optimization": {"stage": 0}, )");
  int rc = 0;
  const std::string out = autotune(
      "--slots 2 --kill_grace 1", cfg, &rc,
      "DSCPP_AUTOTUNE_FAULT=z0_gas8_tmbspg1=crash,z0_gas4_tmbspg2=hang,z0_gas2_tmbspg4=oom");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(best_of(out), "z0_gas1_tmbspg8") << out;
  const fs::path dir = results("faults");
  const json crash = load(dir / "z0_gas8_tmbspg1" / "result.json"), hang = load(dir / "z0_gas4_tmbspg2" / "result.json"),
             oom = load(dir / "z0_gas2_tmbspg4" / "result.json");
  EXPECT_EQ(crash["outcome"], "crash");
  EXPECT_NE(crash["reason"].get<std::string>().find("was killed by signal 6"), std::string::npos) << crash;
  EXPECT_NE(crash["reason"].get<std::string>().find("DSCPP_TRAIN_FAULT=crash: aborting"), std::string::npos) << crash;
  EXPECT_EQ(hang["outcome"], "timeout");
  EXPECT_NE(hang["reason"].get<std::string>().find("timed out after 1 s; its processes were killed"),
            std::string::npos) << hang;
  EXPECT_EQ(oom["outcome"], "out of memory");
  EXPECT_NE(oom["reason"].get<std::string>().find("exited with code 1"), std::string::npos) << oom;
  EXPECT_NE(oom["reason"].get<std::string>().find("CUDA out of memory"), std::string::npos) << oom;
  EXPECT_FALSE(fs::exists(dir / "z0_gas4_tmbspg2" / "metrics.json"));
  EXPECT_NE(out.find("stage 0: tuned; largest micro-batch that fits: 8"), std::string::npos) << out;
  EXPECT_NE(out.find("3 trial(s) failed (crash 1, out of memory 1, timeout 1)"), std::string::npos) << out;
  // The hung trainer is gone: no process runs with the trial's folder on its command line.
  const std::string hung = (dir / "z0_gas4_tmbspg2").string();
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(f)), {});
    EXPECT_EQ(cmdline.find(hung), std::string::npos) << "pid " << e.path().filename() << " still runs";
  }
  const std::string html = read_text(dir / "autotuning_report.html");
  EXPECT_NE(html.find("timed out after 1 s"), std::string::npos);
  EXPECT_NE(html.find("Red crosses: failed trials"), std::string::npos);
}

TEST_F(Autotune, MemoryPrunesBeforeLaunchAndTheReportSaysWhy) {
  // The estimate of the tiny model at micro-batches 2 and 8 (f32, CPU, AdamW, a global batch of 8): a limit between
  // them keeps 2 and prunes 8, which is never launched.
  dscpp::ModelConfig m = dscpp::ModelConfig::from_hf_json(json::parse(read_text(ws_->model)));
  m.vocab_size = dscpp::load_tokenizer_file(ws_->tokenizer).vocab_size();
  auto peak = [&](int mbs) {
    const auto c = dscpp::DeepSpeedConfig::from_string(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": )" +
                                                       std::to_string(mbs) + "}");
    return dscpp::estimate_training_memory(m, c, 32, false).peak_bytes;
  };
  ASSERT_LT(peak(2), peak(8));
  const double limit_gib = double(peak(2) + peak(8)) / 2 / double(int64_t(1) << 30);
  const std::string cfg = config("prune", R"({})", R"("train_micro_batch_size_per_gpu": [2, 8], )");
  int rc = 0;
  std::string out = autotune("--memory_limit_gib " + std::to_string(limit_gib), cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(trials(results("prune")), std::set<std::string>{"z0_gas4_tmbspg2"}) << out;
  EXPECT_NE(out.find("1 pruned by memory"), std::string::npos) << out;
  const std::string html = read_text(results("prune") / "autotuning_report.html");
  EXPECT_NE(html.find("z0_gas1_tmbspg8</td><td>pruned"), std::string::npos);
  EXPECT_NE(html.find("micro-batch 8: predicted peak"), std::string::npos);

  // A limit below micro-batch 1: every stage is pruned, nothing runs, and the output says why with the numbers.
  out = autotune("--memory_limit_gib 0.00001", config("none", R"({})"), &rc);
  EXPECT_EQ(rc, 256) << out;  // exit code 1
  EXPECT_TRUE(trials(results("none")).empty()) << out;
  EXPECT_NE(out.find("No trial ran successfully. Why, stage by stage:"), std::string::npos) << out;
  EXPECT_NE(out.find("stage 0: pruned; no micro-batch fits: at micro-batch 1: predicted peak"), std::string::npos)
      << out;
  EXPECT_NE(out.find("> limit 0.0 MiB (--memory_limit_gib)"), std::string::npos) << out;
  EXPECT_NE(out.find("Trials: 0 run"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(results("none") / "ds_config_optimal.json"));
  const std::string none_html = read_text(results("none") / "autotuning_report.html");
  EXPECT_NE(none_html.find("No trial ran successfully"), std::string::npos);
  EXPECT_NE(none_html.find("no micro-batch fits: at micro-batch 1"), std::string::npos);
}

TEST_F(Autotune, RunTrainsWithTheBestConfig) {
  const std::string cfg = config("run", R"({})", R"("train_micro_batch_size_per_gpu": [2, 4], )");
  int rc = 0;
  const std::string out = autotune("--run", cfg, &rc, "", "--steps 4");
  ASSERT_EQ(rc, 0) << out;
  const size_t at = out.find("autotune: training with the best config");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string training = out.substr(at);
  EXPECT_NE(training.find("trained 4 steps"), std::string::npos) << training;  // no autotuning stop at step 5
  const std::string best = best_of(out);
  ASSERT_TRUE(best == "z0_gas4_tmbspg2" || best == "z0_gas2_tmbspg4") << out;
  EXPECT_NE(training.find("at " + best.substr(best.size() - 1) + " x 32 x"), std::string::npos)
      << "the run's micro-batch is the best's\n" << out;
  EXPECT_TRUE(fs::exists(ws_->dir / "out" / "checkpoints" / "latest")) << training;
}

TEST_F(Autotune, LaunchAutotuningOverTwoCpuRanksPerTrial) {
  if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build";
  const std::string cfg = config("launch", R"({})", R"("train_micro_batch_size_per_gpu": [2],
      "zero_optimization": {"stage": [0, 2]}, )");
  int rc = 0;
  const std::string out = dscpp::test::run_command(dscpp_binary() + " launch --autotuning tune --nproc 2" +
                                                       ws_->train_args("out") + " --config " + cfg, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 rank(s) per trial"), std::string::npos) << out;
  EXPECT_EQ(trials(results("launch")), (std::set<std::string>{"z0_gas2_tmbspg2", "z2_gas2_tmbspg2"})) << out;
  for (const char* n : {"z0_gas2_tmbspg2", "z2_gas2_tmbspg2"}) {
    EXPECT_EQ(load(results("launch") / n / "result.json")["outcome"], "ok") << n;
    EXPECT_NE(read_text(results("launch") / n / "cmd.txt").find(" launch --nproc 2 --master_port 0 "),
              std::string::npos);
  }
}

TEST_F(Autotune, TensorAndPipelineLayoutsOnTwoCpuRanks) {
  if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build";
  // 2 Gloo ranks per trial, a global batch of 3, layouts tp {1, 2} x pp {2, 1, 4} (pp 2 first: the micro-batch
  // search's layout). tp 1 x pp 2 and tp 2 x pp 1 leave one data-parallel rank and run; tp 1 x pp 1 leaves 2, which
  // do not divide 3; tp 2 x pp 2 and pp 4 do not divide 2 ranks. The 4 are pruned with their reasons, never launched.
  auto write = [&](const std::string& name, bool overwrite) {
    const fs::path dir = ws_->dir / "layouts";
    return ws_->write(name + ".json", R"({"train_batch_size": 3, "train_micro_batch_size_per_gpu": [1, 3],
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
        "dscpp": {"fused_head": false, "sequence_parallel": false},
        "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e8, "overlap_comm": true},
        "activation_checkpointing": {"number_checkpoints": null},
        "pipeline": {"stages": [2, 1, 4]}, "tensor_parallel": {"autotp_size": [1, 2]},
        "autotuning": {"enabled": true, "fast": false, "tuner_type": "gridsearch", "tuner_early_stopping": 0,
                       "overwrite": )" + std::string(overwrite ? "true" : "false") + R"(, "results_dir": ")" +
                                      (dir / "results").string() + R"(", "exps_dir": ")" + (dir / "exps").string() +
                                      R"("}})");
  };
  int rc = 0;
  std::string out = autotune("--nproc 2", write("layouts", true), &rc);
  ASSERT_EQ(rc, 0) << out;
  const fs::path dir = ws_->dir / "layouts" / "results";
  EXPECT_EQ(trials(dir), (std::set<std::string>{"z0_gas3_tmbspg1", "z0_gas1_tmbspg3", "z0_pp1_tp2_gas3_tmbspg1",
                                                "z0_pp1_tp2_gas1_tmbspg3"})) << out;
  EXPECT_NE(out.find("Not launched: 0 pruned by memory, 4 pruned by layout"), std::string::npos) << out;
  const std::string html = read_text(dir / "autotuning_report.html");
  for (const char* why : {"tensor_parallel.autotp_size 2 x pipeline.stages 2 = 4 does not divide the 2 ranks of a trial",
                          "tensor_parallel.autotp_size 1 x pipeline.stages 4 = 4 does not divide the 2 ranks",
                          "tensor_parallel.autotp_size 2 x pipeline.stages 4 = 8 does not divide the 2 ranks",
                          "tensor_parallel.autotp_size 1 x pipeline.stages 1 leaves 2 data-parallel rank(s): "
                          "DeepSpeed config: train_batch_size = 3: must be a multiple of the 2 data-parallel ranks"})
    EXPECT_NE(html.find(why), std::string::npos) << why;
  // Each trial ran with its layout: the flags on its command line, the engine's metrics, the pipeline's log line.
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& n : trials(dir)) {
    const bool tp = n.find("tp2") != std::string::npos;
    const json m = load(dir / n / "metrics.json"), exp = load(dir / n / "exp.json");
    EXPECT_EQ(m["tp"], tp ? 2 : 1) << n;
    EXPECT_EQ(m["pp"], tp ? 1 : 2) << n;
    EXPECT_EQ(m["dp"], 1) << n;
    const std::string cmd = read_text(dir / n / "cmd.txt");
    EXPECT_NE(cmd.find(tp ? " --tp 2" : " --pp 2"), std::string::npos) << cmd;
    EXPECT_EQ(cmd.find(tp ? "--pp" : "--tp"), std::string::npos) << cmd;
    EXPECT_NE(cmd.find(" --no-save --timing-init"), std::string::npos) << cmd;  // Note [Autotuning trial cost]
    EXPECT_EQ(read_text(dir / n / "stdout.log").find("pipeline: 2 stages") != std::string::npos, !tp) << n;
    EXPECT_EQ(load(dir / n / "ds_config.json")["train_batch_size"], 3) << n;
    lo = std::min(lo, exp["predicted_peak_bytes"].get<int64_t>());
    hi = std::max(hi, exp["predicted_peak_bytes"].get<int64_t>());
  }
  // Again, reusing those trials, under a limit between the smallest and the largest predicted peak: what fits is
  // read back, what does not is pruned by memory, and nothing runs.
  ASSERT_LT(lo, hi);
  const double limit = double(lo + hi) / 2;
  out = autotune("--nproc 2 --memory_limit_gib " + std::to_string(limit / double(int64_t(1) << 30)),
                 write("layouts_again", false), &rc);
  ASSERT_EQ(rc, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("Not launched: (\\d+) pruned by memory, 4 pruned by layout"))) << out;
  EXPECT_GE(std::stoi(m[1].str()), 1) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("Trials: 0 run, (\\d+) reused"))) << out;
  EXPECT_GE(std::stoi(m[1].str()), 1) << out;
  for (const auto& n : trials(dir))
    if (out.find("trial " + n + ": ok (reused") != std::string::npos) {
      EXPECT_LE(load(dir / n / "exp.json")["predicted_peak_bytes"].get<double>(), limit) << n;
    }

  // --pp on the train arguments fixes the layout; 2 stages of a 1-layer model is none the ranks can train.
  const std::string one = ws_->write("one_layer.json", R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2,
      "n_embd": 32, "n_inner": 64, "vocab_size": 300, "n_positions": 32, "layer_norm_epsilon": 1e-5})");
  out = dscpp::test::run_command(dscpp_binary() + " autotune --nproc 2" + ws_->train_args("out", one) + " --pp 2" +
                                     " --config " + config("one", R"({})", R"("zero_optimization": {"stage": 0}, )"),
                                 &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("stage 0: pruned; pipeline.stages 2 exceeds the model's 1 layers"), std::string::npos) << out;
  EXPECT_TRUE(trials(results("one")).empty()) << out;
}

TEST_F(Autotune, ConfigErrorsNameTheKey) {
  int rc = 0;
  std::string out = autotune("", config("bad", R"({"tuner_type": "grid"})"), &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("autotuning.tuner_type = \"grid\": must be one of"), std::string::npos) << out;
  out = dscpp::test::run_command(dscpp_binary() + " autotune" + ws_->train_args("out"), &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("needs the train arguments' --config"), std::string::npos) << out;
  out = autotune("", ws_->write("lists.json", R"({"train_batch_size": 8, "gradient_accumulation_steps": [1, 2]})"),
                 &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("gradient_accumulation_steps = [1,2]: a list is not tuned"), std::string::npos) << out;
}
