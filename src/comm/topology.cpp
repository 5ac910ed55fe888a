// ProcessTopology and the groups of each axis (Note [Topology layout], comm/topology.h).
#include "dscpp/comm/topology.h"

#include <algorithm>
#include <cstdio>

#include "dscpp/core/check.h"

namespace dscpp {

static std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

ProcessTopology::ProcessTopology(std::vector<std::string> axes, std::vector<int> dims)
    : axes_(std::move(axes)), dims_(std::move(dims)) {
  DSCPP_CHECK(!axes_.empty() && axes_.size() == dims_.size(), "ProcessTopology: ", axes_.size(), " axes but ",
              dims_.size(), " dims");
  for (size_t i = 0; i < axes_.size(); ++i) {
    DSCPP_CHECK(dims_[i] >= 1, "ProcessTopology: axis '", axes_[i], "' has length ", dims_[i], "; it must be >= 1");
    DSCPP_CHECK(std::count(axes_.begin(), axes_.end(), axes_[i]) == 1, "ProcessTopology: axis '", axes_[i],
                "' is named twice");
  }
}

int ProcessTopology::world_size() const {
  int n = 1;
  for (int d : dims_) n *= d;
  return n;
}

int ProcessTopology::axis_index(const std::string& axis) const {
  auto it = std::find(axes_.begin(), axes_.end(), axis);
  DSCPP_CHECK(it != axes_.end(), "ProcessTopology: no axis '", axis, "' (axes: ", join(axes_), ")");
  return int(it - axes_.begin());
}

int ProcessTopology::get_dim(const std::string& axis) const {
  auto it = std::find(axes_.begin(), axes_.end(), axis);
  return it == axes_.end() ? 0 : dims_[size_t(it - axes_.begin())];
}

int ProcessTopology::get_rank(const std::vector<int>& coord) const {
  DSCPP_CHECK(coord.size() == axes_.size(), "ProcessTopology::get_rank: ", coord.size(), " coordinates for ",
              axes_.size(), " axes (", join(axes_), ")");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    DSCPP_CHECK(coord[i] >= 0 && coord[i] < dims_[i], "ProcessTopology::get_rank: ", axes_[i], " = ", coord[i],
                " is outside [0, ", dims_[i], ")");
    rank = rank * dims_[i] + coord[i];  // row-major: the last axis varies fastest
  }
  return rank;
}

std::vector<int> ProcessTopology::get_coord(int rank) const {
  DSCPP_CHECK(rank >= 0 && rank < world_size(), "ProcessTopology: rank ", rank, " not found in ", str());
  std::vector<int> coord(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    coord[i] = rank % dims_[i];
    rank /= dims_[i];
  }
  return coord;
}

int ProcessTopology::get_coord(int rank, const std::string& axis) const {
  return get_coord(rank)[size_t(axis_index(axis))];
}

int ProcessTopology::rank_at(int rank, const std::string& axis, int idx) const {
  std::vector<int> c = get_coord(rank);
  c[size_t(axis_index(axis))] = idx;
  return get_rank(c);
}

std::vector<int> ProcessTopology::get_axis_list(const std::string& axis, int idx) const {
  const size_t a = size_t(axis_index(axis));
  std::vector<int> ranks;
  for (int r = 0; r < world_size(); ++r)
    if (get_coord(r)[a] == idx) ranks.push_back(r);
  return ranks;
}

std::vector<std::vector<int>> ProcessTopology::get_axis_comm_lists(const std::string& axis) const {
  if (get_dim(axis) == 0) return {};
  const size_t a = size_t(axis_index(axis));
  // The ranks whose coordinate on `axis` is 0 enumerate the other axes' combinations in row-major order.
  std::vector<std::vector<int>> lists;
  for (int first : get_axis_list(axis, 0)) {
    std::vector<int> group;
    for (int i = 0; i < dims_[a]; ++i) group.push_back(rank_at(first, axis, i));
    lists.push_back(std::move(group));
  }
  return lists;
}

std::string ProcessTopology::get_rank_repr(int rank, const std::vector<std::string>& omit) const {
  const std::vector<int> c = get_coord(rank);
  std::string s;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (std::find(omit.begin(), omit.end(), axes_[i]) != omit.end()) continue;
    char idx[16];
    std::snprintf(idx, sizeof idx, "%02d", c[i]);
    s += (s.empty() ? "" : "-") + axes_[i] + "_" + idx;
  }
  return s;
}

std::string ProcessTopology::str() const {
  std::string s;
  for (size_t i = 0; i < axes_.size(); ++i) s += (i ? " x " : "") + axes_[i] + "=" + std::to_string(dims_[i]);
  return s;
}

ProcessTopology pipe_model_data_parallel_topology(int num_pp, int num_mp, int num_dp) {
  return ProcessTopology({"pipe", "data", "model"}, {num_pp, num_dp, num_mp});
}

ParallelGroups make_parallel_groups(ProcessGroup& world, const ProcessTopology& topo, const GroupOptions& options) {
  for (const auto& a : topo.axes())
    DSCPP_CHECK(a == "pipe" || a == "data" || a == "model", "make_parallel_groups: axis '", a,
                "' is not one of pipe, data, model (", topo.str(), ")");
  DSCPP_CHECK(topo.world_size() == world.size(), "make_parallel_groups: the topology ", topo.str(), " holds ",
              topo.world_size(), " ranks but the group '", world.name(), "' has ", world.size());
  ParallelGroups g;
  g.topo = topo;
  g.rank = world.rank();
  auto coord = [&](const char* axis) { return topo.get_dim(axis) ? topo.get_coord(g.rank, axis) : 0; };
  g.stage = coord("pipe");
  g.data_rank = coord("data");
  g.model_rank = coord("model");

  // Every rank walks the same lists in the same order (new_subgroup is a collective), keeping the one it is in.
  auto make = [&](const std::vector<std::vector<int>>& lists) -> ProcessGroup* {
    if (lists.empty() || lists.front().size() == 1) return nullptr;  // Note [Size-one axes]
    if (int(lists.front().size()) == world.size()) return &world;
    ProcessGroup* mine = nullptr;
    for (const auto& ranks : lists)
      if (auto sub = world.new_subgroup(ranks, options)) {
        mine = sub.get();
        g.owned.push_back(std::move(sub));
      }
    DSCPP_CHECK(mine, "make_parallel_groups: rank ", g.rank, " is in no group of ", topo.str());
    return mine;
  };
  g.pipe = make(topo.get_axis_comm_lists("pipe"));
  g.data = make(topo.get_axis_comm_lists("data"));
  g.model = make(topo.get_axis_comm_lists("model"));
  // One model replica per data coordinate (without a data axis, the whole world is one replica).
  std::vector<std::vector<int>> replicas;
  for (int d = 0; d < topo.get_dim("data"); ++d) replicas.push_back(topo.get_axis_list("data", d));
  if (replicas.empty()) {
    replicas.emplace_back();
    for (int r = 0; r < world.size(); ++r) replicas.back().push_back(r);
  }
  g.model_parallel = make(replicas);
  return g;
}

}  // namespace dscpp
