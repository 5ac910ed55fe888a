#include "dscpp/launcher/process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dscpp/core/check.h"

namespace dscpp::launcher {

namespace {
std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}
}  // namespace

pid_t spawn_process(const std::vector<std::string>& argv_in, const Env& env, int in_fd, int out_fd, int err_fd) {
  DSCPP_CHECK(!argv_in.empty(), "spawn_process: empty command");
  std::vector<std::string> argv = argv_in, envs;
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> argv_c = c_strings(argv), env_c = c_strings(envs);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  DSCPP_CHECK(pid >= 0, "fork for ", argv_in[0], ": ", std::strerror(errno));
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);  // the parent died before the prctl took effect
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execvpe(argv_c[0], argv_c.data(), env_c.data());
    const char* msg = "dscpp: cannot execute ";
    (void)!write(2, msg, std::strlen(msg));
    (void)!write(2, argv_c[0], std::strlen(argv_c[0]));
    const char* why = std::strerror(errno);
    (void)!write(2, ": ", 2);
    (void)!write(2, why, std::strlen(why));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so a kill(-pid) right after fork cannot miss the group
  return pid;
}

std::string describe_exit_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
}

int exit_code_of_status(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace dscpp::launcher
