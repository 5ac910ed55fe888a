// Starting one child process the way the launcher starts a rank: in its own process group (so `kill(-pid)` reaches
// the programs it starts in turn), with PR_SET_PDEATHSIG=SIGKILL tied to the calling thread (it dies with us: call
// from a thread that outlives the child), default signal dispositions and an empty signal mask, and the given
// descriptors as its stdin, stdout and stderr. The supervisor (supervisor.h) and the autotuner's trials use it.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "dscpp/launcher/options.h"

namespace dscpp::launcher {

// argv[0] is looked up in PATH; env is the child's whole environment. The caller keeps its descriptors (the child
// has its own copies) and reaps the child. A program that cannot be executed exits 127 after saying why on err_fd.
// Throws dscpp::Error when fork fails.
pid_t spawn_process(const std::vector<std::string>& argv, const Env& env, int in_fd, int out_fd, int err_fd);

// A waitpid status in words: "exited with code 3", "was killed by signal 9 (Killed)".
std::string describe_exit_status(int status);
// As a shell reports it: the exit code, or 128 + the signal.
int exit_code_of_status(int status);

}  // namespace dscpp::launcher
