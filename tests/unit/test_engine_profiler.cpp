// Engine + profiler integration: the flops_profiler config prints a profile of the configured step whose module
// names and FLOPs match the analytic module tree, a trace file of that step passes validate_chrome_trace and holds
// the engine's and the model's ranges, and profiling leaves losses and gradients bit-identical.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "dscpp/core/rng.h"
#include "dscpp/flops_profiler/module_tree.h"
#include "dscpp/flops_profiler/report.h"
#include "dscpp/profiler/trace.h"
#include "dscpp/runtime/engine.h"
#include "tiny_models.h"

using namespace dscpp;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny() { return test_fixtures::tiny_model_config("gpt2"); }

DeepSpeedConfig config(const std::string& extra) {
  return DeepSpeedConfig::from_string(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "gradient_clipping": 1.0)" + extra + "}");
}

std::unique_ptr<Engine> make_engine(const DeepSpeedConfig& cfg) {
  auto m = make_model(tiny());
  m->init_weights(42);
  return initialize(std::move(m), cfg);
}

// Runs `steps` optimizer steps on a fixed random stream; returns the losses of every micro-batch.
std::vector<float> train(Engine& e, int steps) {
  Tensor x = Tensor::empty({2, 8}, DType::i32), y = Tensor::empty({2, 8}, DType::i32);
  std::vector<float> losses;
  Rng rng(7);
  for (int s = 0; s < steps; s++) {
    for (int m = 0; m < 2; m++) {
      for (int64_t i = 0; i < 16; i++) {
        x.data<int32_t>()[i] = int32_t(rng.below(97));
        y.data<int32_t>()[i] = int32_t(rng.below(97));
      }
      losses.push_back(e.forward(x, y));
      e.backward();
      e.step();
    }
  }
  return losses;
}

TEST(EngineProfiler, ReportHasModulesAndAnalyticFlops) {
  auto e = make_engine(config(R"(, "flops_profiler": {"enabled": true, "profile_step": 2, "detailed": true})"));
  testing::internal::CaptureStdout();
  train(*e, 2);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "") << "profiled before profile_step";
  EXPECT_EQ(e->last_profile_report(), "");
  testing::internal::CaptureStdout();
  train(*e, 2);
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string& rep = e->last_profile_report();
  ASSERT_FALSE(rep.empty());
  EXPECT_NE(out.find(rep.substr(0, 200)), std::string::npos) << "report not printed";
  FlopsOptions fo;
  fo.batch = 4;  // 2 micro-batches of 2 sequences
  fo.seq_len = 8;
  const ModuleNode tree = build_module_tree(tiny(), fo);
  // Analytic forward FLOPs of the step: matmuls 2 x MACs of every Linear plus the attention core.
  EXPECT_NE(rep.find(format_si(tree.fwd_flops(), "")), std::string::npos) << rep;
  // Every module the model times has a measured forward and backward latency on its tree line ("fwd -" = none).
  for (const char* name : {"model (GPT2)", "embeddings (Embeddings)", "0 (Block)", "1 (Block)", "norm_f (LayerNorm)",
                           "lm_head (Linear)", "loss (CrossEntropy)"}) {
    const size_t at = rep.find(std::string(name) + ":");
    ASSERT_NE(at, std::string::npos) << "missing " << name << " in\n" << rep;
    const std::string line = rep.substr(at, rep.find('\n', at) - at);
    EXPECT_EQ(line.find("fwd -"), std::string::npos) << line;
    EXPECT_EQ(line.find("bwd -"), std::string::npos) << line;
  }
  EXPECT_NE(rep.find("MFU"), std::string::npos) << rep;
  EXPECT_EQ(e->profiler()->ranges().size(), 0u) << "profiler ranges kept after the report";
}

TEST(EngineProfiler, TraceFileIsValidAndHasRanges) {
  const fs::path path = fs::temp_directory_path() / ("dscpp_engine_trace_" + std::to_string(::getpid()) + ".json");
  fs::remove(path);
  auto e = make_engine(config(R"(, "flops_profiler": {"profile_step": 1})"));
  e->set_trace_file(path.string());
  testing::internal::CaptureStdout();
  train(*e, 3);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "") << "flops_profiler is off: no report";
  ASSERT_TRUE(fs::exists(path));
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(validate_chrome_trace(j), "");
  std::map<std::string, int> count;
  for (const auto& ev : j["traceEvents"])
    if (ev["ph"] == "X") count[ev["name"].get<std::string>()]++;
  EXPECT_EQ(count["forward"], 2);  // one step of 2 micro-batches
  EXPECT_EQ(count["backward"], 2);
  EXPECT_EQ(count["step"], 2);
  EXPECT_EQ(count["model.blocks.0"], 4);  // forward and backward of each micro-batch
  EXPECT_EQ(count["model.blocks.1"], 4);
  EXPECT_EQ(count["model.embeddings"], 4);
  for (const char* sub : {"model.blocks.0.attn", "model.blocks.0.mlp", "model.blocks.1.attn", "model.blocks.1.mlp"})
    EXPECT_EQ(count[sub], 4) << sub << ": the module tree's attention / MLP level is timed too";
  fs::remove(path);
}

TEST(EngineProfiler, BitIdenticalWithProfilerOnAndOff) {
  auto off = make_engine(config(""));
  auto on = make_engine(config(R"(, "flops_profiler": {"enabled": true, "profile_step": 1,
                                     "output_file": "/dev/null"})"));
  std::vector<float> a = train(*off, 3), b = train(*on, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i], b[i]) << "micro-batch " << i;
  ASSERT_FALSE(on->last_profile_report().empty());
  const Tensor& pa = off->model().params().flat_params();
  const Tensor& pb = on->model().params().flat_params();
  ASSERT_EQ(pa.numel(), pb.numel());
  EXPECT_EQ(std::memcmp(pa.data<float>(), pb.data<float>(), size_t(pa.numel()) * 4), 0) << "parameters differ";
}

}  // namespace
