// `dscpp launch` options (DeepSpeed's launcher flags, typed) and the plan they resolve to: which hosts and slots
// the job uses, which node this launcher serves, and where ranks meet. plan_launch() is pure (environment and GPU
// count are arguments) so every rule is testable; launch() in launch.h carries the plan out.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "dscpp/launcher/resources.h"

namespace dscpp::launcher {

using Env = std::map<std::string, std::string>;
Env current_environment();  // this process's environ as a map

enum class Runner { ssh, openmpi, mpich, slurm };
Runner parse_runner(const std::string& name);  // "ssh" (also "pdsh"), "openmpi", "mpich", "slurm"
const char* runner_name(Runner r);

struct LaunchOptions {
  std::string hostfile = "/job/hostfile";  // DeepSpeed's default; a missing file means "this machine only"
  std::string include, exclude;            // NODE_SPEC[@NODE_SPEC...], NODE_SPEC = host[:slot[,slot...]]
  int num_nodes = -1, num_gpus = -1;       // -1: not given
  int nproc = 0;                           // >0: N CPU ranks on this machine (no hostfile)
  bool cpu = false;                        // CPU ranks: slots are not GPUs, CUDA_VISIBLE_DEVICES is left alone
  std::string master_addr;                 // "": 127.0.0.1 on one node, else the first host
  int master_port = -1;                    // -1: not given (29500, or a free port when that is busy); 0: a free port
  std::string run_id;                      // "": a new one (one node) or none (--no_ssh); Note [One store per job]
  int node_rank = -1;                      // which node this launcher serves (with world_info or no_ssh)
  std::string world_info;                  // set when another launcher started this one over ssh
  Runner runner = Runner::ssh;
  std::string launcher_args;               // extra words for mpirun/srun
  int ssh_port = 0;                        // 0: ssh's default
  bool no_ssh = false;                     // every node runs `dscpp launch --no_ssh --node_rank=R` itself
  bool no_ssh_check = false;
  bool force_multi = false;                // multi-node flow even for one host
  std::string each_rank_log_dir;           // output of rank r goes to DIR/<timestamp>_rank<r>.log
  bool exit_on_stdin_eof = false;          // remote launchers: ssh closing our stdin means stop
  bool dry_run = false;                    // print what would run, start nothing
  double kill_grace_s = 5.0;               // SIGTERM -> SIGKILL delay when stopping ranks
  std::vector<std::string> program;        // argv each rank runs
  std::string self_exe;                    // absolute path of dscpp (remote nodes run the same path)
};

struct LaunchPlan {
  Resources world;          // active hosts and slots, in rank order
  int node_rank = 0;        // node whose ranks this launcher starts (local flow)
  bool multi_node = false;  // start per-node launchers over ssh, or hand over to mpirun/srun
  bool cpu = false;
  std::string master_addr;
  int master_port = 29500;
  std::string run_id;       // TORCHELASTIC_RUN_ID of every rank ("": none); set by launch() when not given
  bool unset_cuda_visible_devices = false;  // it was turned into --include localhost:<list>
  std::vector<std::string> notes;           // messages for the user (missing hostfile, ignored variables)
};

// DeepSpeed's runner.py rules. Throws dscpp::Error with DeepSpeed's wording on conflicting or bad options.
LaunchPlan plan_launch(const LaunchOptions& o, const Env& env, int gpu_count);

}  // namespace dscpp::launcher
