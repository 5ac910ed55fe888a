// Runs a set of child processes (the ranks of one node, or one ssh per remote node) and watches them: each line
// they print is passed on whole with its prefix ("[rank 3] "); the first child to exit non-zero or die by a signal
// stops the rest (SIGTERM to its process group, SIGKILL after a grace period) and decides the exit code; SIGINT,
// SIGTERM and SIGHUP sent to the launcher are forwarded. It returns once every child is reaped: never a hang.
//
// Each child runs in its own process group (so `sh -c` grandchildren die with it, and a terminal's Ctrl-C reaches
// only the launcher, which forwards it) and gets PR_SET_PDEATHSIG=SIGKILL, tied to the thread that calls
// run_supervised(): call it from a thread that outlives the run.
#pragma once
#include <string>
#include <vector>

#include "dscpp/launcher/options.h"

namespace dscpp::launcher {

struct ProcSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  Env env;                        // the child's whole environment
  std::string label;              // names the child in messages: "rank 3", "node worker-1"
  std::string prefix;             // put before each output line; empty passes lines through unchanged
  std::string log_path;           // when set, the child's stdout and stderr go to this file (no prefix) instead
  bool stdin_pipe = false;        // stdin is a pipe the launcher closes when it stops (ssh: the remote side sees
                                  // EOF); otherwise /dev/null
};

struct SuperviseOptions {
  double kill_grace_s = 5.0;       // SIGTERM, then SIGKILL after this long
  int out_fd = 1, err_fd = 2;      // children's stdout/stderr lines; launcher messages go to err_fd
  bool exit_on_stdin_eof = false;  // our stdin closing (the ssh that started us went away) stops the children
  bool forward_signals = true;     // install SIGINT/SIGTERM/SIGHUP handlers for the duration of the run
  // A forwarded stop signal after which every child exits 0 is a clean stop (exit code 0): children that drain
  // their work on SIGTERM, as a server's ranks. Otherwise the launcher's exit code says it was signalled.
  bool clean_stop_is_success = false;
};

struct RunResult {
  int exit_code = 0;    // 0, the first failing child's exit code, 128+signal, or 128+signal the launcher got
  int failed = -1;      // index of the first failing child, -1 if none
  std::string reason;   // "rank 1 (pid 123) exited with code 3"; empty on success
};

RunResult run_supervised(const std::vector<ProcSpec>& procs, const SuperviseOptions& opts);

}  // namespace dscpp::launcher
