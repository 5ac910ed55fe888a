// Where this process sits in the job, read from the environment the way torchrun / the deepspeed launcher (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (OMPI_COMM_WORLD_*) and
// Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...) describe it. Nothing set = a world of one.
#pragma once
#include <chrono>
#include <string>

namespace dscpp {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;               // DeepSpeed's and torchrun's default
  std::string source = "none";           // "env" (torchrun / dscpp launch), "mpi", "slurm" or "none"
  // The job's identity, the same on every rank (Note [One store per job], comm/store.h): torchrun's
  // TORCHELASTIC_RUN_ID (dscpp launch sets it too), else Slurm's SLURM_JOB_ID.SLURM_STEP_ID; "" when none.
  std::string run_id;
};

// Explicit RANK/WORLD_SIZE win over mpirun's variables, which win over Slurm's. Under mpirun and srun MASTER_ADDR
// defaults to SLURM_LAUNCH_NODE_IPADDR, the first host of SLURM_JOB_NODELIST, or (all ranks on one node) 127.0.0.1.
// Throws dscpp::Error for malformed or inconsistent values, naming the variable.
DistEnv read_dist_env();

// "node[01-04,07],gpu5" -> "node01"; "a,b" -> "a". Throws on an empty list.
std::string slurm_first_host(const std::string& nodelist);

// DEEPSPEED_TIMEOUT (minutes, DeepSpeed's variable; default 30) as a duration.
std::chrono::milliseconds default_comm_timeout();

}  // namespace dscpp
