// Which hosts and slots a job runs on: DeepSpeed's hostfile (`hostname slots=N`), --include/--exclude filters
// (`host:0,1@host2`), --num_nodes/--num_gpus, and the world info a launcher hands to each node (urlsafe-base64 JSON
// {host: [slots]}). Ranks are assigned in host order, then slot order, so the order of Resources matters.
// Every error names its source (file and line, or the flag) and keeps DeepSpeed's wording.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace dscpp::launcher {

struct Host {
  std::string name;
  std::vector<int> slots;  // device ids (GPU runs) or CPU rank slots, ascending
};
using Resources = std::vector<Host>;

// Parses hostfile text. `source` names it in errors ("hostfile /job/hostfile line 3: ...").
Resources parse_hostfile(const std::string& text, const std::string& source);
// Reads and parses `path`; nullopt when the file does not exist (the caller runs on localhost).
std::optional<Resources> read_hostfile(const std::string& path);

// DeepSpeed's parse_resource_filter: include builds from scratch, exclude removes; the two are exclusive. The
// result keeps the pool's host order; hosts left without slots are dropped.
Resources filter_resources(const Resources& pool, const std::string& include, const std::string& exclude);
// --num_nodes N keeps the first N hosts; --num_gpus G keeps slots [0, G) on each host. Negative = not given.
Resources limit_resources(const Resources& pool, int num_nodes, int num_gpus);

int world_size(const Resources& r);                  // total slots
int first_rank(const Resources& r, int node_rank);   // global rank of node_rank's first slot
std::string format_resources(const Resources& r);    // "worker-0:0,1@worker-1:0" (the include syntax)

std::string encode_world_info(const Resources& r);   // urlsafe base64 of {"host": [slots], ...}
Resources decode_world_info(const std::string& b64);

// GPUs on this machine, counted without initialising CUDA (/proc/driver/nvidia/gpus); 0 when there is no driver.
int local_gpu_count();

}  // namespace dscpp::launcher
