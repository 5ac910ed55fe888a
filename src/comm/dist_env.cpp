// Reading the job's layout from torchrun / mpirun / srun environment variables.
#include "dscpp/comm/dist_env.h"

#include <algorithm>
#include <cstdlib>

#include "dscpp/core/check.h"

namespace dscpp {

static const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

static int env_int(const char* name, int fallback, int lo) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > 1 << 30) DSCPP_FAIL("environment variable ", name, "='", v, "' is not an integer >= ", lo);
  return int(x);
}

std::string slurm_first_host(const std::string& nodelist) {
  DSCPP_CHECK(!nodelist.empty(), "SLURM_JOB_NODELIST is empty");
  // The first entry ends at a ',' outside brackets; a bracket range expands to prefix + first number.
  size_t depth = 0, end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    else if (nodelist[i] == ']') --depth;
    else if (nodelist[i] == ',' && depth == 0) { end = i; break; }
  }
  std::string first = nodelist.substr(0, end);
  size_t lb = first.find('[');
  if (lb == std::string::npos) return first;
  size_t rb = first.find(']', lb);
  DSCPP_CHECK(rb != std::string::npos, "SLURM_JOB_NODELIST '", nodelist, "': unbalanced '['");
  std::string range = first.substr(lb + 1, rb - lb - 1);
  size_t cut = range.find_first_of(",-");
  return first.substr(0, lb) + range.substr(0, cut) + first.substr(rb + 1);
}

std::chrono::milliseconds default_comm_timeout() {
  const char* v = env("DEEPSPEED_TIMEOUT");
  if (!v) return std::chrono::minutes(30);
  char* end = nullptr;
  double minutes = std::strtod(v, &end);
  if (*end != '\0' || !(minutes > 0)) DSCPP_FAIL("DEEPSPEED_TIMEOUT='", v, "' is not a positive number of minutes");
  return std::chrono::milliseconds(int64_t(minutes * 60000.0));
}

DistEnv read_dist_env() {
  DistEnv e;
  bool all_local = true;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.source = "env";
    e.rank = env_int("RANK", 0, 0);
    e.world_size = env_int("WORLD_SIZE", 1, 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank, 0);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size, 1);
    if (e.world_size > 1 && !env("MASTER_ADDR") && e.local_world_size != e.world_size)
      DSCPP_FAIL("WORLD_SIZE=", e.world_size, " spans several nodes but MASTER_ADDR is not set");
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    e.source = "mpi";
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0, 0);
    e.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1, 1);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    e.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size, 1);
    all_local = e.local_world_size == e.world_size;
    if (!env("MASTER_ADDR") && !all_local)
      DSCPP_FAIL("mpirun job over several nodes: set MASTER_ADDR to rank 0's host (e.g. mpirun -x MASTER_ADDR=host0)");
  } else if (env("SLURM_PROCID")) {
    e.source = "slurm";
    e.rank = env_int("SLURM_PROCID", 0, 0);
    e.world_size = env_int("SLURM_NTASKS", 1, 1);
    e.local_rank = env_int("SLURM_LOCALID", 0, 0);
    // SLURM_NTASKS_PER_NODE may read "4(x2)": the leading count is this node's.
    const char* per_node = env("SLURM_NTASKS_PER_NODE");
    e.local_world_size = per_node ? std::max(1, std::atoi(per_node)) : e.world_size;
    if (!env("MASTER_ADDR")) {
      if (const char* ip = env("SLURM_LAUNCH_NODE_IPADDR")) e.master_addr = ip;
      else if (const char* nl = env("SLURM_JOB_NODELIST")) e.master_addr = slurm_first_host(nl);
    }
  }
  if (const char* te = env("TORCHELASTIC_RUN_ID")) e.run_id = te;
  else if (const char* job = env("SLURM_JOB_ID"))
    e.run_id = std::string(job) + "." + (env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
  if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", e.master_port, 1);
  if (e.master_port > 65535) DSCPP_FAIL("MASTER_PORT=", e.master_port, " is not a TCP port");
  if (e.rank >= e.world_size)
    DSCPP_FAIL("rank ", e.rank, " is outside the world of ", e.world_size, " (", e.source, " environment)");
  if (e.local_rank >= e.local_world_size) e.local_world_size = e.local_rank + 1;
  return e;
}

}  // namespace dscpp
