// What users do by habit must not lose work or run wrong without a word, tried with the commands they type: a second
// job on a busy port leaves the first alone, the launcher finds a free port itself, ranks started with different
// configs or models stop at start-up naming the difference, and refusals come before any work, in the user's words.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "dist/multiprocess.h"
#include "dscpp/comm/process_group.h"
#include "e2e/cli_workspace.h"

using namespace dscpp::test;

namespace {

const char* kConfig = R"({"train_batch_size": 8, "steps_per_print": 100,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "gradient_clipping": 1.0})";

#define SKIP_WITHOUT_BINARY()                                                                              \
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary(); \
  if (!dscpp::gloo_available()) GTEST_SKIP() << "CPU ranks need Gloo, not in this build"

}  // namespace

// Note [One store per job]. Job a trains on a port; its rank 0 (which hosts the store) is held still while job b
// starts on the same port, so that b's ranks meet a's store in every interleaving. b fails, naming the port and the
// flag; a, let go, finishes and saves.
TEST(JobSafety, SecondJobOnTheSamePortLeavesTheFirstAlone) {
  SKIP_WITHOUT_BINARY();
  CliWorkspace ws("second_job");
  const std::string config = ws.write("ds.json", kConfig);
  const std::string port = std::to_string(free_port());
  const std::string launch = dscpp_binary() + " launch --nproc 2 -H /nonexistent --master_port " + port;
  // Enough steps that a is still training when it is held (it prints its start-up lines just before the first).
  BackgroundJob a(launch + ws.train_args("a") + " --config " + config + " --steps 300");
  ASSERT_TRUE(a.wait_for("data parallel: 2 ranks")) << a.output();
  const pid_t a_rank0 = a.rank_pid(0);
  ASSERT_GT(a_rank0, 0) << a.output();
  ASSERT_EQ(kill(a_rank0, SIGSTOP), 0);

  int rc = 0;
  const std::string b = run_command(launch + ws.train_args("b") + " --config " + config + " --steps 2", &rc);
  kill(a_rank0, SIGCONT);
  EXPECT_NE(rc, 0) << b;
  EXPECT_NE(b.find("port " + port), std::string::npos) << b;
  EXPECT_NE(b.find("--master_port"), std::string::npos) << b;

  const int a_status = a.wait();
  EXPECT_EQ(a_status, 0) << a.output();
  EXPECT_NE(a.output().find("step   300/300 | loss"), std::string::npos) << a.output();
  EXPECT_TRUE(fs::exists(ws.dir / "a" / "checkpoints" / "global_step300")) << a.output();
}

// With no --master_port, a busy 29500 (DeepSpeed's default) makes the launcher pick a free port and say which; every
// rank of one job gets the same run id, and another job another.
TEST(JobSafety, BusyDefaultPortIsReplacedAndSaid) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first";
  int holder = socket(AF_INET6, SOCK_STREAM, 0);
  int zero = 0;
  setsockopt(holder, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  addr.sin6_port = htons(29500);
  if (bind(holder, (sockaddr*)&addr, sizeof addr) != 0 || listen(holder, 1) != 0) {
    close(holder);
    GTEST_SKIP() << "port 29500 is held by something else on this machine";
  }
  const std::string cmd = dscpp_binary() + " launch --nproc 2 -H /nonexistent -- sh -c 'echo port=$MASTER_PORT " +
                          "id=$TORCHELASTIC_RUN_ID'";
  int rc = 0;
  const std::string out = run_command(cmd, &rc), again = run_command(cmd, &rc);
  close(holder);
  ASSERT_EQ(rc, 0) << again;
  EXPECT_NE(out.find("[launcher] port 29500 (the default MASTER_PORT) is in use on this machine"),
            std::string::npos) << out;
  const size_t said = out.find("this job meets on free port ");
  ASSERT_NE(said, std::string::npos) << out;
  const std::string chosen = out.substr(said + 28, out.find(' ', said + 28) - said - 28);
  EXPECT_NE(chosen, "29500");
  EXPECT_EQ(count(out, "port=" + chosen + " "), 2) << out;
  auto run_id = [](const std::string& text, int rank) {
    size_t p = text.find("[rank " + std::to_string(rank) + "] port=");
    p = text.find("id=", p);
    return p == std::string::npos ? std::string() : text.substr(p + 3, text.find('\n', p) - p - 3);
  };
  EXPECT_FALSE(run_id(out, 0).empty()) << out;
  EXPECT_EQ(run_id(out, 0), run_id(out, 1)) << out;
  EXPECT_NE(run_id(out, 0), run_id(again, 0)) << out << again;
}

// Note [Start-up agreement]: ranks started with different configs or models stop before any work, naming the key
// and both values, instead of hanging or aborting inside Gloo.
TEST(JobSafety, RanksThatDisagreeStopNamingTheKey) {
  SKIP_WITHOUT_BINARY();
  CliWorkspace ws("disagree");
  ws.write("ds0.json", R"({"train_batch_size": 8, "dscpp": {"fused_head": false}})");
  ws.write("ds1.json", R"({"train_batch_size": 8, "dscpp": {"fused_head": true}})");
  ws.write("zero0.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "reduce_bucket_size": 5000}})");
  ws.write("zero1.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "reduce_bucket_size": 7000}})");
  std::string model = read_text(ws.model);
  ws.write("model0.json", model);
  ws.write("model1.json", model.replace(model.find("\"n_layer\": 2"), 12, "\"n_layer\": 3"));
  const std::string same_config = " --config " + ws.write("ds.json", kConfig);
  const std::string d = ws.dir.string() + "/";
  struct Case {
    std::string args, want;  // each rank's train arguments ($RANK picks its file), what the error must say
  } cases[] = {
      {ws.train_args("o") + " --config " + d + "ds$RANK.json", "rank 1 has dscpp.fused_head=true, rank 0 false"},
      {ws.train_args("o") + " --config " + d + "zero$RANK.json",
       "rank 1 has zero_optimization.reduce_bucket_size=7000, rank 0 5000"},
      {ws.train_args("o", d + "model$RANK.json") + same_config, "rank 1 has model.n_layer=3, rank 0 2"},
  };
  for (const auto& c : cases) {
    int rc = 0;
    const std::string out = run_command(dscpp_binary() + " launch --nproc 2 -H /nonexistent --master_port 0 -- " +
                                            "sh -c 'exec " + dscpp_binary() + c.args + " --steps 2'", &rc);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("ranks disagree at start-up: " + c.want), std::string::npos) << out;
    EXPECT_EQ(out.find("gloo"), std::string::npos) << "failed inside Gloo:\n" << out;
    EXPECT_FALSE(fs::exists(ws.dir / "o" / "data")) << "data work started before stopping:\n" << out;
  }
}

// Refusals that need no data come before the tokenizer and the data cache, naming the key and the rule.
TEST(JobSafety, MixedPrecisionOnCpuIsRefusedBeforeAnyWork) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first";
  CliWorkspace ws("fp16_cpu");
  for (const char* sec : {"fp16", "bf16"}) {
    const std::string cfg = ws.write(std::string(sec) + ".json", R"({"train_batch_size": 8, ")" + std::string(sec) +
                                                                     R"(": {"enabled": true}})");
    const fs::path out_dir = ws.dir / (std::string("out_") + sec);
    int rc = 0;
    // Text data: without the refusal the run would first train a tokenizer and tokenize the corpus.
    const std::string out = run_command(dscpp_binary() + " train --config " + cfg + " --model " + ws.model +
                                            " --data " + (ws.dir / "corpus.txt").string() + " --out " +
                                            out_dir.string(), &rc);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find(std::string(sec) + ".enabled = true needs --device cuda"), std::string::npos) << out;
    EXPECT_EQ(out.find("tokenizer"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(out_dir / "data")) << "data work started before the refusal:\n" << out;
  }
}

TEST(JobSafety, ErrorsSpeakTheUsersLanguage) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first";
  CliWorkspace ws("words");
  int rc = 0;
  std::string out = run_command(dscpp_binary() + ws.train_args("o") + " --steps 0", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--steps: must be a whole number >= 1, got '0'"), std::string::npos) << out;
  EXPECT_EQ(out.find("1797693"), std::string::npos) << out;
  out = run_command(dscpp_binary() + " launch --nproc 2 --master_port 70000 -- true", &rc);
  EXPECT_NE(out.find("--master_port: must be a whole number from 0 to 65535, got '70000'"), std::string::npos) << out;

  // A negative micro batch is reported under its own name.
  std::string cfg = ws.write("neg.json", R"({"train_micro_batch_size_per_gpu": -1})");
  out = run_command(dscpp_binary() + ws.train_args("o") + " --config " + cfg, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("train_micro_batch_size_per_gpu = -1 in the config; it must be >= 1"), std::string::npos) << out;

  // Source locations only with --debug (before or after the subcommand).
  std::string short_model = read_text(ws.model);
  short_model.replace(short_model.find("\"n_positions\": 32"), 17, "\"n_positions\": 16");
  const std::string too_long = ws.train_args("o", ws.write("short.json", short_model));  // --seq-len 32
  out = run_command(dscpp_binary() + too_long, &rc);
  EXPECT_NE(out.find("--seq-len 32 exceeds the model's context length 16"), std::string::npos) << out;
  EXPECT_EQ(out.find(".cpp:"), std::string::npos) << out;
  for (const std::string& cmd : {dscpp_binary() + " --debug" + too_long, dscpp_binary() + too_long + " --debug"}) {
    out = run_command(cmd, &rc);
    EXPECT_NE(out.find("--seq-len 32 exceeds"), std::string::npos) << out;
    EXPECT_NE(out.find(".cpp:"), std::string::npos) << out;
  }
}

// Current DeepSpeed bf16 keys are known: set to what DeepSpeed.cpp does, a CPU run trains with them.
TEST(JobSafety, CurrentDeepSpeedKeysAreKnown) {
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first";
  CliWorkspace ws("current_keys");
  const std::string cfg = ws.write("ds.json", R"({"train_batch_size": 4, "bf16": {"enabled": false,
      "bf16_master_weights_and_grads": false, "bf16_optimizer_states": false, "check_grad_overflow": true},
      "zero_optimization": {"stage": 0, "stage3_allgather_sequential": false, "enable_sanity_checks": false}})");
  int rc = 0;
  const std::string out = run_command(dscpp_binary() + ws.train_args("o") + " --config " + cfg + " --steps 1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("unknown"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(ws.dir / "o" / "checkpoints" / "global_step1")) << out;
}
