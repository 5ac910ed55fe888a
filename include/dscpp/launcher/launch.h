// `dscpp launch`: resolve the plan (options.h), then start this node's ranks under the supervisor, or one
// per-node launcher per host over ssh, or hand the whole job to mpirun/srun. With dry_run it prints the commands
// (runnable shell lines) instead. Returns the exit code for main(); throws dscpp::Error on bad options.
#pragma once
#include <string>
#include <vector>

#include "dscpp/launcher/options.h"
#include "dscpp/launcher/supervisor.h"

namespace dscpp::launcher {

struct LaunchIO {
  int out_fd = 1, err_fd = 2;  // ranks' output lines; launcher messages and dry-run commands go to err_fd/out_fd
  bool forward_signals = true;
  bool clean_stop_is_success = false;  // SuperviseOptions'
};

int launch(const LaunchOptions& o, const LaunchIO& io = {});

// The ranks of plan.node_rank as processes: argv = o.program, env = rank_env(...), "[rank R] " prefixes, and
// DIR/<timestamp>_rank<R>.log when o.each_rank_log_dir is set.
std::vector<ProcSpec> local_rank_procs(const LaunchOptions& o, const LaunchPlan& plan, const Env& base, int cores,
                                       const std::string& timestamp);

int free_tcp_port();  // a port the kernel says is free now (--master_port 0)
bool tcp_port_free(int port);  // nothing on this machine listens on `port` now
std::string new_run_id();      // a fresh job identity for TORCHELASTIC_RUN_ID (Note [One store per job], comm/store.h)
int usable_cores();   // CPUs in this process's affinity mask

}  // namespace dscpp::launcher
