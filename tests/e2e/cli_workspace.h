// The dscpp binary run as a user runs it, in a throw-away folder holding what a tiny training needs: a text corpus
// cut from the built-in one, token shards and the tokenizer that made them (`dscpp tokenize`, once), and a 2-layer
// GPT-2 config.json. Header-only, for the e2e tests that drive the CLI.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>


namespace dscpp::test {

namespace fs = std::filesystem;

// One literal: GCC 12 warned (-Warray-bounds, a false positive) on std::string(DSCPP_BINARY_DIR) + "/dscpp" here.
inline std::string dscpp_binary() { return DSCPP_BINARY_DIR "/dscpp"; }

// Runs a shell command line; returns stdout and stderr together, *rc the exit status (0 = success).
inline std::string run_command(const std::string& cmd, int* rc) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  *rc = pclose(f);
  return out;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Text of made-up sentences from a fixed seed: the same on every machine, with or without Debian's fortunes (the GPU
// image has none), and documents separated by "%" lines as in the fortunes files.
inline std::string made_up_corpus(size_t bytes) {
  static const char* words[] = {"the", "a", "ship", "sails", "over", "quiet", "water", "while", "old", "sailors",
                                "sing", "of", "distant", "harbours", "and", "storms", "that", "never", "came", "home",
                                "light", "falls", "on", "stone", "walls", "in", "morning", "bread", "is", "warm"};
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x](uint64_t n) { x = x * 6364136223846793005ull + 1442695040888963407ull; return (x >> 33) % n; };
  std::string text;
  while (text.size() < bytes) {
    for (uint64_t s = 0, n = 2 + next(4); s < n; s++) {
      for (uint64_t w = 0, m = 4 + next(9); w < m; w++) text += std::string(w ? " " : "") + words[next(30)];
      text += ".\n";
    }
    text += "%\n";
  }
  return text;
}

struct CliWorkspace {
  fs::path dir;
  std::string model, data, tokenizer;  // --model, --data, --tokenizer values

  explicit CliWorkspace(const std::string& name, size_t corpus_bytes = 60000) {
    dir = fs::temp_directory_path() / ("dscpp_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "corpus.txt") << made_up_corpus(corpus_bytes);
    model = (dir / "model.json").string();
    std::ofstream(model) << R"({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_inner": 64,
        "vocab_size": 300, "n_positions": 32, "layer_norm_epsilon": 1e-5})";
    tokenizer = (dir / "tokenizer.json").string();
    int rc = 0;
    std::string out = run_command(dscpp_binary() + " tokenize --train-vocab 300 --save-tokenizer " + tokenizer +
                                      " -o " + (dir / "shards").string() + " " + (dir / "corpus.txt").string(),
                                  &rc);
    EXPECT_EQ(rc, 0) << out;
    for (const auto& e : fs::directory_iterator(dir / "shards"))
      if (e.path().extension() == ".bin") data += (data.empty() ? "" : " ") + e.path().string();
  }
  ~CliWorkspace() { fs::remove_all(dir); }

  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  }
  // `train` arguments for the tiny model (or `model_arg`) on the shards, writing under dir/<out>.
  std::string train_args(const std::string& out, const std::string& model_arg = "") const {
    return " train --model " + (model_arg.empty() ? model : model_arg) + " --data " + data + " --tokenizer " +
           tokenizer + " --seq-len 32 --eval-every 0 --samples 0 --out " + (dir / out).string();
  }
};

// The child of `launcher` (a `dscpp launch`) whose environment says RANK=rank, or -1.
inline pid_t launched_rank_pid(pid_t launcher, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
    std::istringstream s(line.substr(line.rfind(')') + 2));
    char state;
    pid_t ppid;
    s >> state >> ppid;
    if (ppid != launcher) continue;
    std::ifstream env(e.path() / "environ");
    std::string vars(1, '\0');  // every variable then starts after a '\0'
    vars.append(std::istreambuf_iterator<char>(env), std::istreambuf_iterator<char>());
    if (vars.find('\0' + std::string("RANK=") + std::to_string(rank) + '\0') != std::string::npos)
      return pid_t(std::stoi(e.path().filename().string()));
  }
  return -1;
}

// A command line running in the background (`sh -c "exec ..."`), its output collected from a pipe.
class BackgroundJob {
 public:
  explicit BackgroundJob(const std::string& cmd) {
    int p[2];
    if (pipe(p) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[0]);
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), (char*)nullptr);
      _exit(127);
    }
    close(p[1]);
    fd_ = p[0];
    fcntl(fd_, F_SETFL, O_NONBLOCK);
  }
  ~BackgroundJob() {
    if (pid_ > 0 && !done_) {  // a failed test left it running
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  const std::string& output() {
    char buf[4096];
    ssize_t n;
    while (fd_ >= 0 && (n = read(fd_, buf, sizeof buf)) > 0) out_.append(buf, size_t(n));
    return out_;
  }
  // Waits until the output shows `text`; false if the job ends first or `limit` (a guard, not a measurement) passes.
  bool wait_for(const std::string& text, std::chrono::seconds limit = std::chrono::seconds(300)) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (output().find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline || finished()) return output().find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  }
  // The exit status (as from std::system) once the job ends; -1 if it still runs after `limit`.
  int wait(std::chrono::seconds limit = std::chrono::seconds(300)) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!finished() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    output();
    return done_ ? status_ : -1;
  }
  pid_t rank_pid(int rank) const { return launched_rank_pid(pid_, rank); }

 private:
  bool finished() {
    if (!done_ && pid_ > 0 && waitpid(pid_, &status_, WNOHANG) == pid_) done_ = true;
    return done_;
  }
  pid_t pid_ = -1;
  int fd_ = -1, status_ = 0;
  bool done_ = false;
  std::string out_;
};

inline int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) n++;
  return n;
}

}  // namespace dscpp::test
