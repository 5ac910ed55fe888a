// What each rank's environment holds and the command lines that start remote nodes: ssh (one per-node launcher
// per host, DeepSpeed's pdsh flow), or the whole job under OpenMPI mpirun, MPICH mpirun or Slurm srun (DeepSpeed's
// multinode_runner.py). All pure functions of the plan, so tests check them without running anything.
#pragma once
#include <string>
#include <vector>

#include "dscpp/launcher/options.h"

namespace dscpp::launcher {

// The environment of local rank `local_rank` on plan.node_rank: `base` plus RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES (GPU runs:
// the node's slot list), OMP_NUM_THREADS (cores / local ranks unless set) and NCCL_NVLS_ENABLE=0 (unless set).
Env rank_env(const LaunchPlan& plan, int local_rank, const Env& base, int cores);

// Variables a remote node inherits: NCCL*, PYTHON*, UCX*, MLFLOW*, MV2*, DSCPP* from `env`, then the KEY=VAL lines
// of each existing file in `env_files` (later files win). Bad lines throw, naming file and line.
Env remote_exports(const Env& env, const std::vector<std::string>& env_files);
// ~/.deepspeed_env and ./.deepspeed_env (DS_ENV_FILE renames them; an absolute DS_ENV_FILE is used as is).
std::vector<std::string> env_file_paths(const Env& env, const std::string& cwd);

std::string shell_quote(const std::string& s);           // 'single quoted' unless plainly safe
std::string join_command(const std::vector<std::string>& argv);  // quoted words, for printing and ssh
std::vector<std::string> split_args(const std::string& s);       // shell-like word split (quotes, no expansion)

// `ssh -o PasswordAuthentication=no -o BatchMode=yes [-p P] host hostname`: the passwordless-ssh check.
std::vector<std::string> ssh_check_command(const LaunchOptions& o, const std::string& host);
// `ssh ... host "export K=V; ...; cd <cwd>; <dscpp> launch --world_info=.. --node_rank=R ... -- <program>"`.
std::vector<std::string> ssh_node_command(const LaunchOptions& o, const LaunchPlan& plan, int node_rank,
                                          const Env& exports, const std::string& cwd);
// The whole job under one mpirun/srun (ranks read OMPI_COMM_WORLD_* / PMI_* / SLURM_* themselves).
std::vector<std::string> mpi_command(const LaunchOptions& o, const LaunchPlan& plan, const Env& exports);

}  // namespace dscpp::launcher
