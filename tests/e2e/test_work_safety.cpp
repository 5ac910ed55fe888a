// The user's work is never lost or silently wrong, through the commands a user types (the built `dscpp`): a data
// cache made from other input or settings is rebuilt, a resume never starts over and a new run never replaces an
// earlier run's checkpoints unasked, no command writes where it reads, token shards made by another tokenizer are
// refused, and what a kill during pruning leaves is reported and then removed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "dscpp/data/corpus.h"

namespace fs = std::filesystem;

namespace {

std::string dscpp_binary() { return std::string(DSCPP_BINARY_DIR) + "/dscpp"; }

struct Ran {
  int rc = -1;  // the exit status
  std::string out;
};

Ran run(const std::string& args, const std::string& env = "") {
  FILE* f = popen((env + " " + dscpp_binary() + " " + args + " 2>&1").c_str(), "r");
  Ran r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The loss printed for `step` of `steps` ("step     4/4 | loss 5.1050 | ..." -> "5.1050").
std::string loss_at(const std::string& out, int step, int steps) {
  char key[64];
  std::snprintf(key, sizeof key, "step %5d/%d | loss ", step, steps);
  const size_t p = out.find(key);
  return p == std::string::npos ? "" : out.substr(p + std::strlen(key), 6);
}

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

// Two different texts (A: the first fortunes, B: the last), a tiny model and a config without a schedule that
// depends on --steps, so a resumed run can be compared with an uninterrupted one.
struct Workspace {
  fs::path dir;
  std::string a, b, base, train;  // base: `train` and the arguments every run shares; train: base + a vocab size
  Workspace() {
    dir = fs::temp_directory_path() / ("dscpp_work_safety_" + std::to_string(getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::vector<std::string> docs = dscpp::default_corpus_documents();
    std::string ta, tb;
    for (size_t i = 0; i < docs.size() && ta.size() < 40000; i++) ta += docs[i] + "\n";
    for (size_t i = docs.size(); i-- > 0 && tb.size() < 30000;) tb += docs[i] + "\n";
    a = (dir / "A.txt").string();
    b = (dir / "B.txt").string();
    std::ofstream(a) << ta;
    std::ofstream(b) << tb;
    std::ofstream(dir / "model.json") << R"({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32,
        "n_inner": 64, "vocab_size": 300, "n_positions": 32, "layer_norm_epsilon": 1e-5})";
    std::ofstream(dir / "ds.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003}}, "steps_per_print": 2})";
    base = "train --model " + (dir / "model.json").string() + " --config " + (dir / "ds.json").string() +
           " --seq-len 32 --eval-every 0 --samples 0";
    train = base + " --vocab-size 300";
  }
  ~Workspace() { fs::remove_all(dir); }
  std::string out(const std::string& name) const { return (dir / name).string(); }
};

#define REQUIRE_DSCPP() \
  if (!fs::exists(dscpp_binary())) GTEST_SKIP() << "build the dscpp target first: " << dscpp_binary()

}  // namespace

// --data B into an --out whose cache was made from A trains on B's tokens (the same as a fresh run on B), and says
// why the cache was rebuilt; so does another --vocab-size.
TEST(WorkSafety, ChangedInputOrVocabSizeRebuildsTheDataCache) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r");
  Ran first = run(w.train + " --data " + w.a + " --out " + r + " --steps 2");
  ASSERT_EQ(first.rc, 0) << first.out;
  Ran second = run(w.train + " --data " + w.b + " --out " + r + " --steps 2 --overwrite");
  ASSERT_EQ(second.rc, 0) << second.out;
  EXPECT_TRUE(has(second.out, "data cache " + r + "/data: it was made from " + w.a)) << second.out;
  Ran fresh_b = run(w.train + " --data " + w.b + " --out " + w.out("fresh_b") + " --steps 2");
  ASSERT_EQ(fresh_b.rc, 0) << fresh_b.out;
  EXPECT_EQ(slurp(r + "/data/tokenizer.json"), slurp(w.out("fresh_b") + "/data/tokenizer.json"));
  EXPECT_EQ(slurp(r + "/data/train_000.bin").substr(256), slurp(w.out("fresh_b") + "/data/train_000.bin").substr(256))
      << "the tokens";
  EXPECT_EQ(loss_at(second.out, 2, 2), loss_at(fresh_b.out, 2, 2)) << second.out << fresh_b.out;

  // An unchanged cache is reused without a word; another --vocab-size retrains the tokenizer.
  Ran same = run(w.train + " --data " + w.b + " --out " + r + " --steps 2 --overwrite");
  ASSERT_EQ(same.rc, 0) << same.out;
  EXPECT_FALSE(has(same.out, "data cache")) << same.out;
  EXPECT_FALSE(has(same.out, "training a")) << same.out;
  Ran vocab = run(w.base + " --data " + w.b + " --out " + r + " --steps 2 --overwrite --vocab-size 280");
  ASSERT_EQ(vocab.rc, 0) << vocab.out;
  EXPECT_TRUE(has(vocab.out, "--vocab-size 300; this run asks for a tokenizer trained on it with --vocab-size 280"))
      << vocab.out;
  EXPECT_TRUE(has(vocab.out, "vocab 280")) << vocab.out;

  // An edited input file under the same name is another input.
  std::ofstream(w.b, std::ios::app) << "one more line\n";
  Ran edited = run(w.base + " --data " + w.b + " --out " + r + " --steps 2 --overwrite --vocab-size 280");
  ASSERT_EQ(edited.rc, 0) << edited.out;
  EXPECT_TRUE(has(edited.out, "rebuilding it")) << edited.out;
}

// The default run's cache (the built-in corpus) is not the cache of `--data my.txt` into the same --out.
TEST(WorkSafety, BuiltInCorpusCacheIsNotReusedForOwnText) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r");
  Ran builtin = run(w.train + " --out " + r + " --steps 1");
  ASSERT_EQ(builtin.rc, 0) << builtin.out;
  Ran own = run(w.train + " --data " + w.a + " --out " + r + " --steps 1 --overwrite");
  ASSERT_EQ(own.rc, 0) << own.out;
  EXPECT_TRUE(has(own.out, "data cache " + r + "/data: it was made from the built-in corpus (")) << own.out;
  Ran fresh = run(w.train + " --data " + w.a + " --out " + w.out("fresh") + " --steps 1");
  ASSERT_EQ(fresh.rc, 0) << fresh.out;
  EXPECT_EQ(slurp(r + "/data/tokenizer.json"), slurp(w.out("fresh") + "/data/tokenizer.json"));
}

// Resuming on new data rebuilds the cache, and the checkpoint's tokenizer then differs from this run's: refused,
// naming both, before any training.
TEST(WorkSafety, ResumeWithAnotherTokenizerIsRefused) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r");
  ASSERT_EQ(run(w.train + " --data " + w.a + " --out " + r + " --steps 2").rc, 0);
  Ran resumed = run(w.train + " --data " + w.b + " --out " + r + " --steps 4 --resume");
  EXPECT_NE(resumed.rc, 0) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "was trained with the tokenizer in " + r + "/checkpoints/global_step2/tokenizer.json"))
      << resumed.out;
  EXPECT_FALSE(has(resumed.out, "| loss ")) << resumed.out;
}

// Without `latest` a resume takes the newest complete tag and continues exactly; with nothing to resume it stops.
TEST(WorkSafety, ResumeNeverStartsOver) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r"), ckpt = r + "/checkpoints";
  const std::string args = w.train + " --data " + w.a + " --save-every 2 --keep-last 3";
  ASSERT_EQ(run(args + " --out " + r + " --steps 4").rc, 0);
  ASSERT_TRUE(fs::exists(ckpt + "/global_step2") && fs::exists(ckpt + "/global_step4"));
  fs::remove(ckpt + "/latest");
  Ran resumed = run(args + " --out " + r + " --steps 6 --resume");
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "latest is missing; resuming from the newest complete tag, global_step4")) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "resumed from " + ckpt + "/global_step4 at step 4")) << resumed.out;
  Ran straight = run(args + " --out " + w.out("straight") + " --steps 6");
  ASSERT_EQ(straight.rc, 0) << straight.out;
  ASSERT_FALSE(loss_at(straight.out, 6, 6).empty()) << straight.out;
  EXPECT_EQ(loss_at(resumed.out, 6, 6), loss_at(straight.out, 6, 6)) << resumed.out << straight.out;

  // A damaged newest tag is passed over for the one before, and the message says why.
  fs::remove(ckpt + "/latest");
  std::ofstream(ckpt + "/global_step6/engine_state.json", std::ios::app) << " ";
  Ran fallback = run(args + " --out " + r + " --steps 8 --resume");
  ASSERT_EQ(fallback.rc, 0) << fallback.out;
  EXPECT_TRUE(has(fallback.out, "newest complete tag, global_step4 (newer, but not loadable: global_step6: ")) << fallback.out;

  Ran nothing = run(args + " --out " + w.out("empty") + " --steps 2 --resume");
  EXPECT_NE(nothing.rc, 0) << nothing.out;
  EXPECT_TRUE(has(nothing.out, "--resume: nothing to resume: " + w.out("empty") + "/checkpoints/latest is missing"))
      << nothing.out;
  EXPECT_FALSE(has(nothing.out, "| loss ")) << nothing.out;
}

// A new run into an --out holding checkpoints is refused before any work and the tags stay as they were;
// --overwrite deletes them and starts over.
TEST(WorkSafety, NewRunNeverReplacesCheckpointsUnasked) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r"), ckpt = r + "/checkpoints";
  const std::string args = w.train + " --data " + w.a + " --out " + r;
  ASSERT_EQ(run(args + " --steps 4 --save-every 2 --keep-last 3").rc, 0);
  const std::string manifest = slurp(ckpt + "/global_step2/manifest.json");
  Ran again = run(args + " --steps 2");
  EXPECT_NE(again.rc, 0) << again.out;
  EXPECT_TRUE(has(again.out, "--out " + r + " holds the checkpoints of an earlier run (" + ckpt +
                                 ": global_step2, global_step4)"))
      << again.out;
  EXPECT_TRUE(has(again.out, "--resume") && has(again.out, "--overwrite")) << again.out;
  EXPECT_FALSE(has(again.out, "| loss ")) << again.out;
  EXPECT_EQ(slurp(ckpt + "/global_step2/manifest.json"), manifest);
  EXPECT_EQ(slurp(ckpt + "/latest"), "global_step4");

  Ran over = run(args + " --steps 2 --overwrite");
  ASSERT_EQ(over.rc, 0) << over.out;
  EXPECT_EQ(entries(ckpt), (std::set<std::string>{"global_step2", "latest"}));
  EXPECT_NE(slurp(ckpt + "/global_step2/manifest.json"), manifest);
  EXPECT_NE(run(args + " --steps 2 --resume --overwrite").rc, 0);
}

// Export into the checkpoint folder (where DeepSpeed users run zero_to_fp32), however spelled, is refused and the
// tag still loads; no other command writes where it reads either.
TEST(WorkSafety, NoCommandWritesWhereItReads) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r"), ckpt = r + "/checkpoints";
  ASSERT_EQ(run(w.train + " --data " + w.a + " --out " + r + " --steps 2").rc, 0);
  fs::create_directory_symlink(ckpt, w.out("link"));
  for (const std::string& out : {ckpt + "/global_step2", ckpt + "/global_step2/", ckpt + "/../checkpoints/global_step2",
                                 w.out("link") + "/global_step2", ckpt + "/global_step2/sub", ckpt}) {
    SCOPED_TRACE(out);
    Ran exp = run("ckpt export " + ckpt + " -o " + out);
    EXPECT_NE(exp.rc, 0) << exp.out;
    EXPECT_TRUE(has(exp.out, "-o " + out + " is ")) << exp.out;
  }
  Ran inspect = run("ckpt inspect " + ckpt);
  EXPECT_EQ(inspect.rc, 0) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "all checksums ok")) << inspect.out;
  EXPECT_FALSE(fs::exists(ckpt + "/global_step2/config.json"));
  Ran beside = run("ckpt export " + ckpt + " -o " + ckpt + "/../hf");
  EXPECT_EQ(beside.rc, 0) << beside.out;
  EXPECT_TRUE(fs::exists(r + "/hf/model.safetensors"));

  const std::set<std::string> tag_files = entries(ckpt + "/global_step2");
  Ran uni = run("ckpt to-universal " + ckpt + " -o " + ckpt + "/global_step2");
  EXPECT_NE(uni.rc, 0) << uni.out;
  EXPECT_TRUE(has(uni.out, "is inside the checkpoint tag")) << uni.out;
  EXPECT_EQ(entries(ckpt + "/global_step2"), tag_files);
  Ran logits = run("ckpt hf-logits " + r + "/hf -o " + r + "/hf/config.json");
  EXPECT_NE(logits.rc, 0) << logits.out;
  EXPECT_TRUE(has(slurp(r + "/hf/config.json"), "model_type"));

  const std::string tok = r + "/data/tokenizer.json", before = slurp(tok);
  Ran into_input = run("tokenize --tokenizer " + tok + " -o " + r + "/data/ " + w.a);
  EXPECT_NE(into_input.rc, 0) << into_input.out;
  EXPECT_TRUE(has(into_input.out, "is the folder --tokenizer " + tok + " is read from")) << into_input.out;
  Ran over_tok = run("tokenize --tokenizer " + tok + " --save-tokenizer " + tok + " -o " + w.out("tokens") + " " + w.a);
  EXPECT_NE(over_tok.rc, 0) << over_tok.out;
  EXPECT_EQ(slurp(tok), before);
}

// Shards remember the tokenizer that made them: training them with another (larger, smaller or same-sized
// vocabulary) is refused before any work, naming both.
TEST(WorkSafety, ShardsMadeByAnotherTokenizerAreRefused) {
  REQUIRE_DSCPP();
  Workspace w;
  auto tokenize = [&](const std::string& dir, const std::string& text, int vocab) {
    Ran t = run("tokenize --train-vocab " + std::to_string(vocab) + " -o " + w.out(dir) + " " + text);
    ASSERT_EQ(t.rc, 0) << t.out;
  };
  tokenize("a300", w.a, 300);
  tokenize("a400", w.a, 400);
  tokenize("a280", w.a, 280);
  tokenize("b300", w.b, 300);
  const std::string shards = w.out("a300") + "/shard_00000.bin";
  for (const char* other : {"a400", "a280", "b300"}) {
    SCOPED_TRACE(other);
    const std::string tok = w.out(other) + "/tokenizer.json";
    Ran t = run(w.train + " --data " + shards + " --tokenizer " + tok + " --out " + w.out(std::string("r_") + other) +
                " --steps 2");
    EXPECT_NE(t.rc, 0) << t.out;
    EXPECT_TRUE(has(t.out, "--data " + shards + " was made by tokenizer " + w.out("a300") + "/tokenizer.json")) << t.out;
    EXPECT_TRUE(has(t.out, "but --tokenizer " + tok + " is another tokenizer")) << t.out;
    EXPECT_FALSE(has(t.out, "| loss ")) << t.out;
  }
  Ran own = run(w.train + " --data " + shards + " --tokenizer " + w.out("a300") + "/tokenizer.json --out " +
                w.out("r_own") + " --steps 2");
  EXPECT_EQ(own.rc, 0) << own.out;
}

// A kill while old tags are pruned leaves "<tag>.tmp": `ckpt inspect` reports it and the next save removes it.
// A folder without a manifest that may not be ours is reported and kept.
TEST(WorkSafety, KillDuringPruningLeavesNothingBehind) {
  REQUIRE_DSCPP();
  Workspace w;
  const std::string r = w.out("r"), ckpt = r + "/checkpoints";
  const std::string args = w.train + " --data " + w.a + " --out " + r + " --save-every 2 --keep-last 1";
  Ran killed = run(args + " --steps 4", "DSCPP_CHECKPOINT_CRASH_AT=during_prune");
  ASSERT_EQ(killed.rc, 86) << "the run should die while pruning global_step2:\n" << killed.out;
  EXPECT_EQ(entries(ckpt), (std::set<std::string>{"global_step2.tmp", "global_step4", "latest"}));
  fs::create_directory(ckpt + "/notes");
  std::ofstream(ckpt + "/notes/engine_state.json") << "{}";

  Ran inspect = run("ckpt inspect " + ckpt);
  EXPECT_EQ(inspect.rc, 0) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "leftover: " + ckpt + "/global_step2.tmp: an interrupted save or deletion")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "leftover: " + ckpt + "/notes: not a checkpoint")) << inspect.out;
  EXPECT_TRUE(has(inspect.out, "tags (oldest first): global_step4 (latest)")) << inspect.out;

  Ran resumed = run(args + " --steps 6 --resume");
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_EQ(entries(ckpt), (std::set<std::string>{"global_step6", "latest", "notes"}));
}
