// plan_launch: DeepSpeed's launcher/runner.py main() decisions, in its order: num_* vs include/exclude, the
// hostfile (or this machine), CUDA_VISIBLE_DEVICES, filters, limits, single vs multi node, master address.
#include <cctype>

#include "dscpp/core/check.h"
#include "dscpp/launcher/options.h"

extern char** environ;

namespace dscpp::launcher {

Env current_environment() {
  Env env;
  for (char** e = environ; e && *e; e++) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

Runner parse_runner(const std::string& name) {
  if (name == "ssh" || name == "pdsh") return Runner::ssh;
  if (name == "openmpi") return Runner::openmpi;
  if (name == "mpich") return Runner::mpich;
  if (name == "slurm") return Runner::slurm;
  DSCPP_FAIL("unknown --launcher '", name, "' (expected ssh, openmpi, mpich or slurm)");
}

const char* runner_name(Runner r) {
  switch (r) {
    case Runner::ssh: return "ssh";
    case Runner::openmpi: return "openmpi";
    case Runner::mpich: return "mpich";
    case Runner::slurm: return "slurm";
  }
  return "?";
}

namespace {

Resources slots_on_localhost(int n) {
  Host h{"localhost", {}};
  for (int i = 0; i < n; i++) h.slots.push_back(i);
  return {h};
}

bool all_digits_list(const std::string& s) {  // "0,2,3"
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isdigit((unsigned char)c) || c == ',')) return false;
  return s.front() != ',' && s.back() != ',' && s.find(",,") == std::string::npos;
}

}  // namespace

LaunchPlan plan_launch(const LaunchOptions& o, const Env& env, int gpu_count) {
  LaunchPlan p;
  p.cpu = o.cpu || o.nproc > 0;
  p.master_port = o.master_port < 0 ? 29500 : o.master_port;  // DeepSpeed's default
  p.run_id = o.run_id;
  DSCPP_CHECK(o.master_port >= -1 && o.master_port < 65536, "--master_port ", o.master_port, " is not a port");
  DSCPP_CHECK(o.nproc >= 0, "--nproc must be positive, got ", o.nproc);

  if (!o.world_info.empty()) {  // started by another launcher: the world is decided, serve one node
    p.world = decode_world_info(o.world_info);
    DSCPP_CHECK(o.node_rank >= 0 && o.node_rank < (int)p.world.size(), "--world_info needs --node_rank in [0, ",
                p.world.size(), "), got ", o.node_rank);
    p.node_rank = o.node_rank;
    p.master_addr = o.master_addr.empty() ? p.world[0].name : o.master_addr;
    return p;
  }

  const bool limits = o.num_nodes >= 0 || o.num_gpus >= 0;
  const bool filters = !o.include.empty() || !o.exclude.empty();
  if (limits && filters) DSCPP_FAIL("Cannot specify num_nodes/gpus with include/exclude");

  std::string include = o.include;
  Resources pool;
  bool from_hostfile = false;
  if (o.nproc > 0) {
    if (read_hostfile(o.hostfile))
      DSCPP_FAIL("--nproc ", o.nproc, " runs CPU ranks on this machine, but hostfile ", o.hostfile,
                 " exists; give slots=N in the hostfile with --cpu, or point --hostfile elsewhere");
    pool = slots_on_localhost(o.nproc);
  } else if (auto hf = read_hostfile(o.hostfile)) {
    pool = *hf;
    from_hostfile = true;
  } else {
    if (p.cpu) DSCPP_FAIL("--cpu without a hostfile needs --nproc N (no hostfile at ", o.hostfile, ")");
    if (gpu_count == 0)
      DSCPP_FAIL("Unable to proceed, no GPU resources available (no hostfile at ", o.hostfile,
                 "); pass --nproc N to run N CPU ranks");
    p.notes.push_back("Unable to find hostfile " + o.hostfile + ", will proceed with training with local resources only (" +
                      std::to_string(gpu_count) + " GPU(s))");
    pool = slots_on_localhost(gpu_count);
  }
  if (!from_hostfile && o.num_nodes > 1) DSCPP_FAIL("Num nodes is >1 but no extra nodes available via hostfile");

  // CUDA_VISIBLE_DEVICES is honoured only where it is unambiguous: one GPU node, no hostfile, no filters or limits.
  auto cvd = env.find("CUDA_VISIBLE_DEVICES");
  if (!p.cpu && cvd != env.end() && !cvd->second.empty()) {
    if (from_hostfile || filters || limits) {
      p.notes.push_back("CUDA_VISIBLE_DEVICES=" + cvd->second + " is ignored: it is used only on a single node " +
                        "with no hostfile and no --include/--exclude/--num_nodes/--num_gpus; select devices with " +
                        "--include instead");
    } else if (!all_digits_list(cvd->second)) {
      p.notes.push_back("CUDA_VISIBLE_DEVICES=" + cvd->second + " is ignored: only a list of device numbers " +
                        "can be turned into --include");
    } else {
      include = "localhost:" + cvd->second;
      p.unset_cuda_visible_devices = true;
      p.notes.push_back("CUDA_VISIBLE_DEVICES=" + cvd->second + " becomes --include " + include);
    }
  }

  p.world = limit_resources(filter_resources(pool, include, o.exclude), o.num_nodes, o.num_gpus);
  p.multi_node = o.force_multi || p.world.size() > 1;

  if (o.runner == Runner::openmpi && p.multi_node) {
    if (filters) DSCPP_FAIL("openmpi backend does not support worker include/exclusion");
    if (limits) DSCPP_FAIL("openmpi backend does not support limiting num nodes/gpus");
    DSCPP_CHECK(from_hostfile, "the openmpi launcher needs a hostfile (none at ", o.hostfile, ")");
  }
  if (o.runner == Runner::mpich && p.multi_node) {
    for (auto& h : p.world)
      if (h.slots.size() != p.world[0].slots.size()) DSCPP_FAIL("MPICH requires same number of devices per node");
  }

  if (!o.master_addr.empty()) p.master_addr = o.master_addr;
  else p.master_addr = p.multi_node ? p.world[0].name : "127.0.0.1";

  if (o.no_ssh && p.multi_node) {  // each node runs its own launcher with the same hostfile
    DSCPP_CHECK(o.node_rank >= 0 && o.node_rank < (int)p.world.size(), "--no_ssh needs --node_rank in [0, ",
                p.world.size(), "), got ", o.node_rank);
    p.node_rank = o.node_rank;
    p.multi_node = false;  // this launcher starts only its own node's ranks
    if (p.run_id.empty())
      p.notes.push_back("--no_ssh without --run_id: ranks of another job that uses the same --master_port are not "
                        "told apart; give every node the same --run_id");
  }
  return p;
}

}  // namespace dscpp::launcher
