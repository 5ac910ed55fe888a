// Rank environments (DeepSpeed launch.py plus torchrun's LOCAL_WORLD_SIZE) and the variables remote nodes inherit
// (runner.py: EXPORT_ENVS prefixes, the accelerator's NCCL prefix, .deepspeed_env lines).
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "dscpp/core/check.h"
#include "launcher/runners.h"

namespace dscpp::launcher {

Env rank_env(const LaunchPlan& plan, int local_rank, const Env& base, int cores) {
  const Host& node = plan.world.at(plan.node_rank);
  const int local_size = (int)node.slots.size();
  DSCPP_CHECK(local_rank >= 0 && local_rank < local_size, "local rank ", local_rank, " out of range for ", local_size,
              " slot(s) on ", node.name);
  Env env = base;
  if (plan.unset_cuda_visible_devices) env.erase("CUDA_VISIBLE_DEVICES");
  env["RANK"] = std::to_string(first_rank(plan.world, plan.node_rank) + local_rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(world_size(plan.world));
  env["LOCAL_WORLD_SIZE"] = std::to_string(local_size);
  env["LOCAL_SIZE"] = std::to_string(local_size);
  env["CROSS_RANK"] = std::to_string(plan.node_rank);
  env["CROSS_SIZE"] = std::to_string(plan.world.size());
  env["MASTER_ADDR"] = plan.master_addr;
  env["MASTER_PORT"] = std::to_string(plan.master_port);
  if (plan.run_id.empty()) env.erase("TORCHELASTIC_RUN_ID");  // never another job's, inherited
  else env["TORCHELASTIC_RUN_ID"] = plan.run_id;
  if (!plan.cpu) {  // every rank sees the node's selected GPUs; LOCAL_RANK indexes into them
    std::string ids;
    for (int s : node.slots) ids.append(ids.empty() ? "" : ",").append(std::to_string(s));
    env["CUDA_VISIBLE_DEVICES"] = ids;
  }
  if (!env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = std::to_string(std::max(1, cores / local_size));
  // NVLink SHARP multicast needs fabric-manager support that lent machines lack; NCCL falls back when it is off.
  if (!env.count("NCCL_NVLS_ENABLE")) env["NCCL_NVLS_ENABLE"] = "0";
  return env;
}

std::vector<std::string> env_file_paths(const Env& env, const std::string& cwd) {
  auto name_it = env.find("DS_ENV_FILE");
  std::string name = name_it != env.end() && !name_it->second.empty() ? name_it->second : ".deepspeed_env";
  if (name.front() == '/') return {name};
  std::vector<std::string> paths;
  if (auto home = env.find("HOME"); home != env.end() && !home->second.empty()) paths.push_back(home->second + "/" + name);
  paths.push_back(cwd + "/" + name);
  if (paths.size() == 2 && std::filesystem::path(paths[0]).lexically_normal() ==
                               std::filesystem::path(paths[1]).lexically_normal())
    paths.pop_back();  // run from $HOME: read the file once
  return paths;
}

Env remote_exports(const Env& env, const std::vector<std::string>& env_files) {
  static const char* kPrefixes[] = {"NCCL", "PYTHON", "UCX", "MLFLOW", "MV2", "DSCPP"};
  Env out;
  for (auto& [k, v] : env)
    for (const char* p : kPrefixes)
      if (k.rfind(p, 0) == 0) out[k] = v;
  for (auto& path : env_files) {
    std::ifstream in(path);
    if (!in.good()) continue;
    std::string line;
    for (int lineno = 1; std::getline(in, line); lineno++) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos || line[line.find_first_not_of(" \t")] == '#') continue;
      size_t eq = line.find('=');
      if (eq == std::string::npos || eq == 0)
        DSCPP_FAIL(path, " line ", lineno, ": expected KEY=VAL, got '", line, "'");
      out[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return out;
}

}  // namespace dscpp::launcher
