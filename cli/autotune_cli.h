// `dscpp autotune` and `dscpp launch --autotuning tune|run`: the options they share and the run behind both.
#pragma once
#include <string>
#include <vector>

namespace dscpp::cli {

struct AutotuneOptions {
  bool run_after = false;            // `run`: train with the best config once tuning is done
  // Where trials run: the pool (a hostfile's GPUs, or this machine's), filtered as `dscpp launch` does, and each
  // trial's share of it (DeepSpeed's --num_nodes / --num_gpus: default every node, every GPU of one).
  std::string hostfile = "/job/hostfile";
  std::string include, exclude;
  int num_nodes = -1, num_gpus = -1;
  int nproc = 1;                     // CPU runs: ranks per trial
  int slots = 0;                     // CPU runs: process slots on this machine (0: nproc)
  double memory_limit_gib = 0;       // the predicted peak per rank must fit (0: the GPU's less the reserve)
  double memory_reserve_gib = 3;     // GPU: memory the estimate leaves out (CUDA context, workspaces, cache)
  double trial_timeout_s = 1800;
  double kill_grace_s = 5;
  unsigned long long seed = 0;
  std::vector<std::string> program;  // `train` and its arguments
};

int run_autotune(const AutotuneOptions& o);

}  // namespace dscpp::cli
