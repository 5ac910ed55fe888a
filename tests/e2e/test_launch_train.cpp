// `dscpp launch --nproc 2 train`: two CPU ranks train data-parallel end to end (progress from rank 0 only, one
// checkpoint), and a rank killed mid-run makes the launcher stop the job and exit non-zero with a message, promptly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "dscpp/comm/process_group.h"
#include "dscpp/data/corpus.h"
#include "e2e/cli_workspace.h"

namespace fs = std::filesystem;

namespace {

using dscpp::test::count;
using dscpp::test::dscpp_binary;

struct Job {
  fs::path dir;
  std::string args;  // train arguments: tiny model, small text, the config
  Job() {
    dir = fs::temp_directory_path() / ("dscpp_launch_train_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string joined;
    for (const auto& d : dscpp::default_corpus_documents()) {
      if (joined.size() > 60000) break;
      joined += d + "\n%\n";
    }
    std::ofstream(dir / "corpus.txt") << joined;
    std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32,
        "n_inner": 64, "vocab_size": 300, "n_positions": 32, "layer_norm_epsilon": 1e-5})";
    std::ofstream(dir / "ds_config.json") << R"({"train_batch_size": 8, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "gradient_clipping": 1.0, "steps_per_print": 2,
        "zero_optimization": {"stage": 0, "reduce_bucket_size": 5000, "overlap_comm": true}})";
    args = " train --model " + (dir / "config.json").string() + " --config " + (dir / "ds_config.json").string() +
           " --data " + (dir / "corpus.txt").string() + " --vocab-size 300 --seq-len 32 --eval-every 0 "
           "--out " + (dir / "out").string();
  }
  ~Job() { fs::remove_all(dir); }
};

std::string run(const std::string& cmd, int* rc) { return dscpp::test::run_command(cmd, rc); }

// The loss printed for step `step` ("step     8/8 | loss 5.1050 | ..." -> "5.1050").
std::string loss_at(const std::string& out, int step, int steps) {
  char key[64];
  std::snprintf(key, sizeof key, "step %5d/%d | loss ", step, steps);
  size_t p = out.find(key);
  return p == std::string::npos ? "" : out.substr(p + std::strlen(key), 6);
}


}  // namespace

TEST(LaunchTrain, TwoCpuRanksTrainAndOnlyRankZeroPrints) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build";
  Job job;
  std::string log = (job.dir / "log").string();
  std::string cmd = dscpp_binary() + " launch --nproc 2 --master_port 0 -H /nonexistent" + job.args + " --steps 6 --samples 1 > " + log + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::string out((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(rc, 0) << out;
  // Progress at steps 2, 4, 6 from rank 0 only; the batch resolved for 2 ranks (8 = 2 x 2 x 2).
  EXPECT_EQ(count(out, "[rank 0] step     6/6 | loss"), 1) << out;
  EXPECT_EQ(count(out, "| loss "), 3) << out;
  EXPECT_EQ(count(out, "[rank 1]"), 0) << "rank 1 printed:\n" << out;
  EXPECT_NE(out.find("at 2 x 32 x 2"), std::string::npos) << out;
  EXPECT_NE(out.find("--- sample 1 ---"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(job.dir / "out" / "checkpoints" / "global_step6" / "model_states.safetensors"));

  // Resuming on 2 ranks continues exactly where an uninterrupted 8-step run would be.
  const std::string launch = dscpp_binary() + " launch --nproc 2 --master_port 0 -H /nonexistent";
  std::string resumed = run(launch + job.args + " --steps 8 --resume --samples 0", &rc);
  ASSERT_EQ(rc, 0) << resumed;
  EXPECT_NE(resumed.find("resumed from"), std::string::npos) << resumed;
  std::string fresh = run(launch + job.args + "_fresh --steps 8 --samples 0", &rc);
  ASSERT_EQ(rc, 0) << fresh;
  EXPECT_FALSE(loss_at(fresh, 8, 8).empty()) << fresh;
  EXPECT_EQ(loss_at(resumed, 8, 8), loss_at(fresh, 8, 8)) << resumed << fresh;
}

// ZeRO-3 through the launcher: every rank writes its shard (in the background), the tag converts to universal, and
// one rank at stage 1 resumes from it.
TEST(LaunchTrain, ZeroStage3SavesShardsAndReshardsThroughUniversal) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build";
  Job job;
  auto config = [&](int stage, bool universal) {
    std::ofstream(job.dir / "ds_config.json") << R"({"train_batch_size": 8, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "gradient_clipping": 1.0, "steps_per_print": 2,
        "checkpoint": {"writer": {"decoupled": true}, "load_universal": )" << (universal ? "true" : "false") << R"(},
        "zero_optimization": {"stage": )" << stage << "}}";
  };
  config(3, false);
  int rc = 0;
  const std::string launch = dscpp_binary() + " launch --nproc 2 --master_port 0 -H /nonexistent";
  std::string out = run(launch + job.args + " --steps 6 --samples 1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("model states per rank (ZeRO stage 3, 2 ranks)"), std::string::npos) << out;
  EXPECT_NE(out.find("--- sample 1 ---"), std::string::npos) << out;  // every rank generates in step under ZeRO-3
  const fs::path ckpt = job.dir / "out" / "checkpoints";
  for (const char* f : {"zero/rank_0.safetensors", "zero/rank_1.safetensors"})
    EXPECT_TRUE(fs::exists(ckpt / "global_step6" / f)) << f;
  // DeepSpeed's default stage3_gather_16bit_weights_on_model_save (false): no gathered model; generate reads the
  // f32 weights from the shards.
  EXPECT_FALSE(fs::exists(ckpt / "global_step6" / "model_states.safetensors"));
  std::string gen =
      run("(" + dscpp_binary() + " generate --checkpoint " + ckpt.string() + " --greedy --max-tokens 8 2>/dev/null)", &rc);
  ASSERT_EQ(rc, 0) << gen;
  EXPECT_FALSE(gen.empty());
  // The same model exported to a Hugging Face folder generates the same text from there (generate --hf; stdout
  // only: stderr carries the KV cache size and the speed).
  const fs::path hf = job.dir / "hf";
  std::string exp = run(dscpp_binary() + " ckpt export " + ckpt.string() + " --format safetensors -o " + hf.string(),
                        &rc);
  ASSERT_EQ(rc, 0) << exp;
  std::string from_hf =
      run("(" + dscpp_binary() + " generate --hf " + hf.string() + " --greedy --max-tokens 8 2>/dev/null)", &rc);
  ASSERT_EQ(rc, 0) << from_hf;
  EXPECT_EQ(from_hf, gen);
  fs::remove(hf / "tokenizer.json");
  std::string no_tok = run(dscpp_binary() + " generate --hf " + hf.string() + " --max-tokens 2 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(no_tok.find("has no tokenizer.json"), std::string::npos) << no_tok;

  std::string conv = run(dscpp_binary() + " ckpt to-universal " + ckpt.string(), &rc);
  ASSERT_EQ(rc, 0) << conv;
  EXPECT_TRUE(fs::exists(ckpt / "latest_universal")) << conv;
  config(1, true);
  std::string one = run(dscpp_binary() + job.args + " --steps 8 --resume --samples 0", &rc);
  ASSERT_EQ(rc, 0) << one;
  EXPECT_NE(one.find("resumed from"), std::string::npos) << one;
  EXPECT_FALSE(loss_at(one, 8, 8).empty()) << one;
}

TEST(LaunchTrain, KilledRankStopsTheJobWithAMessage) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary();
  if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build";
  Job job;
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t launcher = fork();
  if (launcher == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    std::string cmd = "exec " + dscpp_binary() + " launch --nproc 2 --master_port 0 -H /nonexistent --kill_grace 2" + job.args +
                      " --steps 100000";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    _exit(99);
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  std::string out;
  auto read_some = [&] {
    char buf[4096];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  };
  // Wait for training to be under way (a progress line), then SIGKILL rank 1: the launcher's child whose
  // environment says RANK=1.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (out.find("| loss ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    read_some();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const pid_t victim = dscpp::test::launched_rank_pid(launcher, 1);
  if (victim <= 0) {
    kill(launcher, SIGKILL);  // our own child
    waitpid(launcher, nullptr, 0);
    FAIL() << "no rank 1 under the launcher; output:\n" << out;
  }
  // The job has 100000 steps to go: the launcher ends it only by noticing the death (or through rank 0's failed
  // collective). The 120 s bound only stops a test that would otherwise hang; it claims no speed.
  auto t0 = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  int status = 0;
  pid_t w = 0;
  while ((w = waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
    read_some();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (w == 0) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "the launcher still ran 120 s after rank 1 was killed; output:\n" << out;
  }
  read_some();
  close(p[0]);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  // Either the launcher saw rank 1 die first ("rank 1 (pid N) was killed by signal 9 (Killed)"), or rank 0's
  // collective failed first and its error names the dead peer through the store ("failed rank: rank 1 ...").
  const bool launcher_says = out.find("rank 1 (pid") != std::string::npos && out.find("Killed") != std::string::npos;
  const bool rank0_says = out.find("failed rank: rank 1") != std::string::npos;
  EXPECT_TRUE(launcher_says || rank0_says) << "no message naming the killed rank 1:\n" << out;
}
