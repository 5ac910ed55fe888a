// Small helpers any test may use: the text of an error, and a body run in a fork()ed child (for process-wide limits
// such as RLIMIT_FSIZE, or anything that must not outlive the test).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

namespace dscpp::test {

// The message of what f throws, "" when it does not.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Runs body in a fork()ed child and returns the code it returns (what it prints to stderr says why), 99 for an
// exception that escaped it, -1 when the child did not exit.
inline int child_exit_code(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(stderr);
    _exit(code);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace dscpp::test
