// DeepSpeed's own configs (tests/data/ds_configs, sources in its README) through `dscpp train` on the CPU, a tiny
// model, one step: each trains, or is refused before any work (no data folder under --out) with a message that
// names the key and says why.
#include <gtest/gtest.h>

#include <set>

#include "dscpp/comm/process_group.h"
#include "e2e/cli_workspace.h"

using namespace dscpp::test;

namespace {

struct Expected {
  const char* file;
  int ranks;            // dscpp launch --nproc N when > 1
  const char* refused;  // nullptr: trains; else the key the refusal names
  const char* why;      // and a fragment of its reason
};

const Expected kConfigs[] = {
    {"ds_accelerator.json", 1, nullptr, nullptr},
    {"ds_bingbertsquad_bsz24_fp32.json", 1, nullptr, nullptr},
    {"ds_megatron_gpt2_bs4_zero2_offload.json", 1, "fp16.enabled", "needs --device cuda"},
    {"ds_megatron_gpt2_bs8_no_zero.json", 1, "fp16.enabled", "needs --device cuda"},
    {"ds_megatron_gpt2_bs8_zero2_gas3.json", 1, "fp16.enabled", "needs --device cuda"},
    {"ds_torch_compile_z2.json", 1, "bf16.enabled", "needs --device cuda"},
    {"ds_torch_compile_z3.json", 1, "bf16.enabled", "needs --device cuda"},
    {"ds_unit_batch.json", 1, "fp16.enabled", "needs --device cuda"},
    {"ex_autotuning_hf_z3.json", 1, "train_micro_batch_size_per_gpu", "only resolved by the Hugging Face Trainer"},
    {"ex_bf16_master_weight_baseline.json", 1, "bf16.enabled", "needs --device cuda"},
    {"ex_bf16_master_weight_full.json", 1, "bf16.bf16_master_weights_and_grads", "not supported by DeepSpeed.cpp"},
    {"ex_bing_bert_onebitadam.json", 1, "optimizer.type", "OneBitAdam"},
    {"ex_bingbertglue_base.json", 1, nullptr, nullptr},
    {"ex_compression_gpt2.json", 1, "fp16.enabled", "needs --device cuda"},
    {"ex_gan.json", 1, nullptr, nullptr},
    {"ex_imagenet.json", 1, nullptr, nullptr},
    {"ex_pipeline_parallelism.json", 2, nullptr, nullptr},
    {"ex_zenflow.json", 1, "zero_optimization.zenflow", "ZenFlow is not supported"},
};

}  // namespace

TEST(DsConfigScan, EachTrainsOrIsRefusedBeforeAnyWorkNamingTheKey) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  const fs::path configs = fs::path(DSCPP_SOURCE_DIR) / "tests" / "data" / "ds_configs";
  std::set<std::string> listed;
  for (const auto& e : kConfigs) listed.insert(e.file);
  for (const auto& f : fs::directory_iterator(configs)) {
    if (f.path().extension() != ".json") continue;
    EXPECT_TRUE(listed.count(f.path().filename().string()))
        << f.path().filename() << " has no expected outcome in this test";
  }

  CliWorkspace ws("ds_config_scan", 120000);  // the largest batches (256 sequences of 32) fit in one epoch
  for (const auto& e : kConfigs) {
    SCOPED_TRACE(e.file);
    if (e.ranks > 1 && !dscpp::gloo_available()) continue;
    const std::string out_name = fs::path(e.file).stem().string();
    const std::string launch =
        e.ranks > 1 ? " launch --nproc " + std::to_string(e.ranks) + " --master_port 0 -H /nonexistent" : "";
    int rc = 0;
    const std::string out = run_command(dscpp_binary() + launch + ws.train_args(out_name) + " --config " +
                                            (configs / e.file).string() + " --steps 1", &rc);
    if (!e.refused) {
      EXPECT_EQ(rc, 0) << out;
      EXPECT_TRUE(fs::exists(ws.dir / out_name / "checkpoints" / "global_step1")) << out;
      continue;
    }
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(std::string("error: DeepSpeed config: ") + e.refused), std::string::npos) << out;
    EXPECT_NE(out.find(e.why), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(ws.dir / out_name / "data")) << "refused after the data work started:\n" << out;
  }
}
