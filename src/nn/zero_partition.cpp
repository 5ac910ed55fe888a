// ZeRO ownership arithmetic (Note [ZeRO units], nn/zero_partition.h).
#include "dscpp/nn/zero_partition.h"

#include <algorithm>

#include "dscpp/core/check.h"

namespace dscpp {

ZeroPartition::ZeroPartition(int stage, int world_size, int rank, std::vector<FlatRange> units)
    : stage_(stage), world_(world_size), rank_(rank), units_(std::move(units)) {
  DSCPP_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0..3, got ", stage);
  DSCPP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "ZeRO partition: rank ", rank, " of ", world_size);
  DSCPP_CHECK(!units_.empty(), "ZeRO partition: no units");
  int64_t pos = 0;
  for (size_t u = 0; u < units_.size(); u++) {
    const FlatRange& r = units_[u];
    DSCPP_CHECK(r.begin == pos && r.end > r.begin, "ZeRO partition: unit ", u, " [", r.begin, ", ", r.end,
                ") does not continue at ", pos);
    DSCPP_CHECK(!sharded() || r.size() % world_size == 0, "ZeRO partition: unit ", u, " has ", r.size(),
                " elements, not a multiple of the world size ", world_size,
                " (build the model with ModelOptions::unit_pad = 16 * world size)");
    pos = r.end;
  }
}

int64_t ZeroPartition::chunk(size_t unit) const {
  const FlatRange& r = units_.at(unit);
  return sharded() ? r.size() / world_ : r.size();
}

FlatRange ZeroPartition::owned_in(size_t unit, int rank) const {
  const FlatRange& r = units_.at(unit);
  if (!sharded()) return r;
  const int64_t c = r.size() / world_;
  return {r.begin + rank * c, r.begin + (rank + 1) * c};
}

std::vector<FlatRange> ZeroPartition::owned(int rank) const {
  if (!sharded()) return {{0, flat_numel()}};
  std::vector<FlatRange> out;
  for (size_t u = 0; u < units_.size(); u++) out.push_back(owned_in(u, rank));
  return out;
}

int64_t ZeroPartition::shard_numel() const { return sharded() ? flat_numel() / world_ : flat_numel(); }

int64_t ZeroPartition::shard_offset(size_t unit) const {
  int64_t off = 0;
  for (size_t u = 0; u < unit; u++) off += chunk(u);
  return off;
}

int ZeroPartition::unit_of(int64_t flat_offset) const {
  auto it = std::upper_bound(units_.begin(), units_.end(), flat_offset,
                             [](int64_t v, const FlatRange& r) { return v < r.end; });
  DSCPP_CHECK(it != units_.end() && flat_offset >= it->begin, "flat offset ", flat_offset, " is outside [0, ",
              flat_numel(), ")");
  return int(it - units_.begin());
}

nlohmann::json ZeroPartition::to_json() const {
  nlohmann::json u = nlohmann::json::array();
  for (const FlatRange& r : units_) u.push_back({r.begin, r.end});
  return {{"stage", stage_}, {"world_size", world_}, {"units", u}};
}

ZeroPartition ZeroPartition::from_json(const nlohmann::json& j, int rank) {
  std::vector<FlatRange> units;
  for (const auto& u : j.at("units")) units.push_back({u.at(0).get<int64_t>(), u.at(1).get<int64_t>()});
  return ZeroPartition(j.at("stage").get<int>(), j.at("world_size").get<int>(), rank, std::move(units));
}

}  // namespace dscpp
