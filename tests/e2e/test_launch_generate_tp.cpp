// `dscpp launch --nproc_per_node 2 generate --tensor-parallel-size 2` on the CPU: two Gloo ranks print the text one
// rank prints (rank 0 alone prints); a tp_size the model cannot split, or one the job has no ranks for, is refused
// naming the key; and a rank killed mid-request ends the job with a message and a non-zero exit, never a hang.
// The model: a 2-layer GPT-2 (2 heads) of 2048 positions over a 300-token BPE trained on made-up text, exported to a
// Hugging Face folder.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "dscpp/checkpoint/hf_interop.h"
#include "dscpp/comm/process_group.h"
#include "dscpp/kernels/ops.h"
#include "dscpp/models/model.h"
#include "e2e/cli_workspace.h"

namespace fs = std::filesystem;
using dscpp::test::BackgroundJob;
using dscpp::test::dscpp_binary;

namespace {

class TensorParallelGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ws_ = new dscpp::test::CliWorkspace("generate_tp");
    hf_ = (ws_->dir / "hf").string();
    dscpp::ModelConfig c = dscpp::ModelConfig::from_hf_json(nlohmann::json::parse(R"({"model_type": "gpt2",
        "n_layer": 2, "n_head": 2, "n_embd": 32, "n_inner": 64, "vocab_size": 300, "n_positions": 2048,
        "layer_norm_epsilon": 1e-5})"));
    auto m = dscpp::make_model(c);
    m->init_weights(3);
    dscpp::ops::scale_inplace(m->params().flat_params(), 6.0f);  // varied text rather than one token repeated
    dscpp::HfExportOptions o;
    o.tokenizer_json = dscpp::test::read_text(ws_->tokenizer);
    dscpp::export_hf_model(*m, hf_, o);
  }
  static void TearDownTestSuite() { delete ws_; }
  void SetUp() override {
    if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
    if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build";
  }
  static std::string launch(int n) {
    return dscpp_binary() + " launch --nproc_per_node " + std::to_string(n) + " --master_port 0 -H /nonexistent";
  }
  static std::string generate(const std::string& args) { return " generate --hf " + hf_ + " " + args; }

  static dscpp::test::CliWorkspace* ws_;
  static std::string hf_;
};
dscpp::test::CliWorkspace* TensorParallelGenerate::ws_ = nullptr;
std::string TensorParallelGenerate::hf_;

// Rank 0's lines without the launcher's "[rank 0] " prefix; a line of another rank fails the test.
std::string rank0_text(const std::string& out) {
  std::istringstream in(out);
  std::string text;
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(line.rfind("[rank 0] ", 0), 0u) << "a line not from rank 0: " << line;
    text += line.substr(std::min(line.size(), size_t(9))) + "\n";
  }
  return text;
}

TEST_F(TensorParallelGenerate, TwoRanksPrintWhatOneRankPrints) {
  const std::string args = generate("--greedy --max-tokens 40 --prompt 'the old ship'");
  int rc = 0;  // stdout only: the text
  const std::string one = dscpp::test::run_command("(" + dscpp_binary() + args + " 2>/dev/null)", &rc);
  ASSERT_EQ(rc, 0) << one;
  const std::string two =
      dscpp::test::run_command("(" + launch(2) + args + " --tensor-parallel-size 2 2>/dev/null)", &rc);
  ASSERT_EQ(rc, 0) << two;
  ASSERT_GT(one.size(), std::string("the old ship\n").size()) << one;
  EXPECT_EQ(rank0_text(two), one) << two;
}

TEST_F(TensorParallelGenerate, UnlaunchedOrUnsplittableTpSizeIsRefusedNamingTheKey) {
  int rc = 0;
  std::string out = dscpp::test::run_command(dscpp_binary() + generate("--tensor-parallel-size 2"), &rc);
  EXPECT_NE(rc, 0) << out;
  for (const char* part : {"tensor_parallel.tp_size = 2", "needs a job of 2 ranks", "WORLD_SIZE 1"})
    EXPECT_NE(out.find(part), std::string::npos) << out;
  out = dscpp::test::run_command(launch(3) + generate("--tensor-parallel-size 3"), &rc);
  EXPECT_NE(rc, 0) << out;
  for (const char* part : {"tensor_parallel.tp_size = 3", "does not divide the model's 2 KV heads"})
    EXPECT_NE(out.find(part), std::string::npos) << out;
}

TEST_F(TensorParallelGenerate, KilledRankEndsTheJobWithAMessage) {
  // Four requests of 2000 tokens: thousands of steps, each a handful of collectives between the ranks.
  BackgroundJob job(launch(2) + " --kill_grace 2" + generate("--greedy -n 4 --max-tokens 2000 --prompt 'the' "
                                                             "--tensor-parallel-size 2"));
  ASSERT_TRUE(job.wait_for("KV cache:")) << job.output();  // rank 0's engine is up: its requests go in next
  const pid_t victim = job.rank_pid(1);
  ASSERT_GT(victim, 0) << "no rank 1 under the launcher:\n" << job.output();
  kill(victim, SIGKILL);
  // The guard only stops a test that would otherwise hang; it claims no speed.
  const int status = job.wait(std::chrono::seconds(120));
  ASSERT_NE(status, -1) << "the launcher still ran 120 s after rank 1 was killed:\n" << job.output();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << job.output();
  const std::string& out = job.output();
  const bool launcher_says = out.find("rank 1 (pid") != std::string::npos && out.find("Killed") != std::string::npos;
  const bool rank0_says = out.find("failed rank: rank 1") != std::string::npos;
  EXPECT_TRUE(launcher_says || rank0_says) << "no message naming the killed rank 1:\n" << out;
  EXPECT_EQ(out.find("tokens from 4 prompts"), std::string::npos) << "the generation finished before the kill:\n"
                                                                   << out;
}

}  // namespace
