// Multi-process test helper (habit 19: distributed tests are ordinary tests that take a world size): forks one child
// per rank, runs fn(rank, port) in each (port: a free localhost port for the store), and collects how each ended.
// A child passes when fn returns without a failed gtest expectation; an exception's text comes back through a pipe.
// Header-only so every test_comm*.cpp can use it. Call it before anything in the parent starts threads (OpenMP).
#pragma once
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "scratch_dirs.h"

namespace dscpp::test {

// A port no other process listens on, below the kernel's ephemeral range (32768 and up on Linux): a port taken from
// that range can be handed to a concurrent test's outgoing connection before the store binds it (seen under
// `ctest -j`: "cannot host the job's store ... Address already in use").
inline int free_port() {
  static uint64_t x = uint64_t(getpid()) * 0x9E3779B97F4A7C15ull ^
                      uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  for (;;) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int port = 20000 + int((x >> 33) % 12000);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
}

struct RankResult {
  int rank = 0;
  bool passed = false;
  std::string message;  // exception text, "gtest expectation failed", "exit code N", "killed: ..."
};

// Failures recorded so far in the running test. A child inherits its parent's: only those it adds are its own.
inline int failed_test_parts() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return ::testing::Test::HasFailure() ? 1 : 0;
  const auto* r = info->result();
  int n = 0;
  for (int i = 0; i < r->total_part_count(); ++i) n += r->GetTestPartResult(i).failed() ? 1 : 0;
  return n;
}

// Runs fn in `world` child processes; kills every child still running after `limit`.
inline std::vector<RankResult> run_ranks(int world, const std::function<void(int rank, int port)>& fn,
                                         std::chrono::seconds limit = std::chrono::seconds(60)) {
  int port = free_port();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  std::vector<int> pipes(static_cast<size_t>(world), -1);
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      test_fixtures::scratch_dirs().clear();  // the parent's, which it removes itself
      int code = 0;
      std::string msg;
      const int inherited = failed_test_parts();
      try {
        fn(r, port);
        if (failed_test_parts() > inherited) code = 1, msg = "gtest expectation failed (see the output above)";
      } catch (const std::exception& e) {
        code = 2, msg = e.what();
      }
      if (!msg.empty()) (void)!::write(p[1], msg.data(), msg.size());
      if (code == 0) test_fixtures::remove_scratch_dirs();
      ::close(p[1]);
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    ::close(p[1]);
    pids[size_t(r)] = pid;
    pipes[size_t(r)] = p[0];
  }
  std::vector<RankResult> out(static_cast<size_t>(world));
  auto deadline = std::chrono::steady_clock::now() + limit;
  int left = world;
  std::vector<bool> done(static_cast<size_t>(world), false);
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[size_t(r)]) continue;
      int status = 0;
      pid_t w = ::waitpid(pids[size_t(r)], &status, WNOHANG);
      bool expired = std::chrono::steady_clock::now() > deadline;
      if (w == 0 && !expired) continue;
      if (w == 0) {  // our own child, by its pid
        ::kill(pids[size_t(r)], SIGKILL);
        ::waitpid(pids[size_t(r)], &status, 0);
      }
      std::string msg;
      char buf[4096];
      ssize_t n;
      while ((n = ::read(pipes[size_t(r)], buf, sizeof buf)) > 0) msg.append(buf, size_t(n));
      ::close(pipes[size_t(r)]);
      RankResult& res = out[size_t(r)];
      res.rank = r;
      res.passed = w != 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (w == 0) res.message = "killed: still running after " + std::to_string(limit.count()) + " s";
      else if (!msg.empty()) res.message = msg;
      else if (WIFEXITED(status)) res.message = "exit code " + std::to_string(WEXITSTATUS(status));
      else res.message = "signal " + std::to_string(WTERMSIG(status));
      done[size_t(r)] = true;
      --left;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

// Every rank must pass; failures name the rank and what it said.
inline void expect_all_pass(const std::vector<RankResult>& results) {
  for (const auto& r : results) EXPECT_TRUE(r.passed) << "rank " << r.rank << ": " << r.message;
}

}  // namespace dscpp::test
