#include "dscpp/autotune/resources.h"

#include <algorithm>

#include "dscpp/core/check.h"

namespace dscpp::autotune {

ResourceManager::ResourceManager(launcher::Resources pool, int nodes, int slots_per_node)
    : pool_(std::move(pool)), idle_(pool_), nodes_(nodes), slots_per_node_(slots_per_node) {
  DSCPP_CHECK(nodes >= 1 && slots_per_node >= 1, "autotune: a trial needs at least one node and one slot");
  DSCPP_CHECK(capacity() >= 1, "autotune: a trial takes ", slots_per_node, " slot(s) on each of ", nodes,
              " node(s), more than the pool holds (", launcher::format_resources(pool_), ")");
}

std::optional<Reservation> ResourceManager::reserve() {
  Reservation r;
  for (const auto& h : idle_) {
    if (int(r.size()) == nodes_) break;
    if (int(h.slots.size()) >= slots_per_node_)
      r.push_back({h.name, std::vector<int>(h.slots.begin(), h.slots.begin() + slots_per_node_)});
  }
  if (int(r.size()) < nodes_) return std::nullopt;
  for (const auto& taken : r)
    for (auto& h : idle_)
      if (h.name == taken.name)
        h.slots.erase(h.slots.begin(), h.slots.begin() + slots_per_node_);  // the lowest, as taken above
  return r;
}

void ResourceManager::release(const Reservation& r) {
  for (const auto& given : r)
    for (auto& h : idle_)
      if (h.name == given.name) {
        h.slots.insert(h.slots.end(), given.slots.begin(), given.slots.end());
        std::sort(h.slots.begin(), h.slots.end());
      }
}

int ResourceManager::capacity() const {
  int per_host = 0, hosts = 0;
  for (const auto& h : pool_) {
    const int n = int(h.slots.size()) / slots_per_node_;
    if (n > 0) hosts++, per_host = per_host ? std::min(per_host, n) : n;
  }
  return hosts < nodes_ ? 0 : per_host * (hosts / nodes_);
}

}  // namespace dscpp::autotune
