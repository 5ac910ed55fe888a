// ZeroPartition: which flat elements each data-parallel rank owns under ZeRO (Note [ZeRO units]).
//
// Note [ZeRO units]: the flat buffer is cut into units (Model::param_units(): the embeddings, each block, the final
// norm and head), the granule of every ZeRO collective. With stage >= 1 over W ranks each unit's length is a multiple
// of W (the model pads at unit boundaries, ModelOptions::unit_pad), so unit u splits into W equal chunks and rank r
// owns chunk r of every unit: a unit's gradients are reduce-scattered and its parameters all-gathered by one exact
// collective each, as FSDP does per module. Rank r's shard is its chunks back to back in unit order, S = flat_numel
// / W elements on every rank; the f32 masters, optimizer states, the stage-2/3 gradient partition and the stage-3
// parameter partition all use that shard layout. Stage 0 (or W = 1): one unit, rank r owns everything.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/nn/params.h"

namespace dscpp {

class ZeroPartition {
 public:
  ZeroPartition() = default;
  // units: contiguous, in order, covering [0, flat_numel). Checks that each unit divides by world_size when stage > 0.
  ZeroPartition(int stage, int world_size, int rank, std::vector<FlatRange> units);

  int stage() const { return stage_; }
  int world_size() const { return world_; }
  int rank() const { return rank_; }
  bool sharded() const { return stage_ > 0 && world_ > 1; }
  const std::vector<FlatRange>& units() const { return units_; }
  int64_t flat_numel() const { return units_.empty() ? 0 : units_.back().end; }

  int64_t chunk(size_t unit) const;                  // elements rank r owns in the unit
  FlatRange owned_in(size_t unit, int rank) const;   // rank's chunk of the unit (the whole unit when not sharded)
  std::vector<FlatRange> owned(int rank) const;      // in unit order (one range [0, flat_numel) when not sharded)
  std::vector<FlatRange> owned() const { return owned(rank_); }
  int64_t shard_numel() const;                       // sum of owned(r) sizes: flat_numel / W when sharded
  int64_t shard_offset(size_t unit) const;           // where the unit's chunk starts in a shard
  int unit_of(int64_t flat_offset) const;            // the unit holding a flat element

  nlohmann::json to_json() const;                     // {"stage", "world_size", "units": [[b, e], ...]}
  static ZeroPartition from_json(const nlohmann::json& j, int rank);

 private:
  int stage_ = 0, world_ = 1, rank_ = 0;
  std::vector<FlatRange> units_;
};

}  // namespace dscpp
