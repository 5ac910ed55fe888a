// Private to src/comm: how the backends are made. Each backend file defines its factory; a build without the
// library defines it as a function that throws (so init_process_group can name what is missing).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"

namespace dscpp::comm_detail {

struct GroupArgs {
  std::string name;
  int rank = 0, size = 1;
  std::vector<int> global_ranks;   // world rank of each group rank
  StoreHandle store;
  std::chrono::milliseconds timeout{};
  GroupOptions options;
};

std::unique_ptr<ProcessGroup> make_gloo_group(GroupArgs args);   // gloo/gloo_process_group.cpp
std::unique_ptr<ProcessGroup> make_nccl_group(GroupArgs args);   // nccl/nccl_process_group.cpp

// Store key for a group's private data: "pg/<group name>/<key>".
inline std::string group_key(const std::string& group, const std::string& key) { return "pg/" + group + "/" + key; }

}  // namespace dscpp::comm_detail
