// Universal checkpoints: a ZeRO tag's f32 training state (master weights, optimizer moments) rewritten per parameter,
// so a run at any data-parallel world size and ZeRO stage can load it (DeepSpeed's ds_to_universal). Layouts: the
// contract in Note [Universal checkpoint] (src/checkpoint/universal.cpp):
//   universal/<hf_name>.safetensors  "fp32", "exp_avg", "exp_avg_sq" | "momentum_buffer": f32, the parameter's shape
//   engine_state.json                the source's, with "universal": true and "zero" removed
//   model_states.safetensors, extra files   copied
#pragma once
#include <map>
#include <string>
#include <vector>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/nn/zero_partition.h"

namespace dscpp {

inline constexpr const char* kLatestUniversalFile = "latest_universal";  // names the newest universal tag

// One parameter of a flat buffer (engine_state.json "layout" params: [hf_name, offset, numel]).
struct FlatParam {
  std::string name;
  int64_t offset = 0, numel = 0;
};
using FlatLayout = std::vector<FlatParam>;  // sorted by offset, non-overlapping; gaps are zero padding
FlatLayout flat_layout_from_json(const nlohmann::json& layout);  // {"flat_numel": N, "params": [[n, o, k], ...]}

// Elements [param_begin, param_begin + count) of layout[param] sit at [shard_begin, shard_begin + count) of a rank's
// shard (its owned ranges back to back in unit order). Shard elements no slice covers are padding.
struct ShardSlice {
  size_t param = 0;
  int64_t param_begin = 0, shard_begin = 0, count = 0;
};
// In shard order. The layout must fit in [0, p.flat_numel()).
std::vector<ShardSlice> shard_slices(const FlatLayout& layout, const ZeroPartition& p, int rank);
inline std::vector<ShardSlice> shard_slices(const FlatLayout& layout, const ZeroPartition& p) {
  return shard_slices(layout, p, p.rank());
}

struct UniversalResult {
  std::string out_dir, out_tag;
  int source_stage = 0, source_world_size = 1;
  int64_t num_params = 0;
  std::vector<std::string> states;  // "fp32" first, then the optimizer's
  bool latest_updated = false;      // `latest` moved (only when out_dir is not load_dir)
};

// Rewrites tag (stage 0: optim_states.safetensors [+ fp32_master, else the model_states parameters]; stages 1-3:
// zero/rank_<r>.safetensors for every rank) as the universal tag out_tag in out_dir, streaming one parameter at a
// time (partial reads; no shard is loaded whole). "" defaults: tag = `latest`, out_dir = load_dir, out_tag =
// "<tag>_universal". Commits with the checkpoint_io protocol, then writes out_dir/latest_universal; `latest` in
// out_dir moves only when out_dir differs from load_dir (converting in place must not change what a plain resume
// loads). Throws CheckpointError (the source's files are verified first; a universal source is bad_argument).
UniversalResult convert_to_universal(const std::string& load_dir, const std::string& tag, const std::string& out_dir,
                                     const std::string& out_tag);

// This rank's owned states for a run partitioned as `target` whose flat buffer is `target_layout`: for each state
// ("fp32" and each optimizer state) an f32 CPU tensor of target.shard_numel() elements holding target's owned
// ranges in unit order, padding 0. Reads (a) a universal tag, mapping by parameter name and element index (any
// world size, stage or padding), (b) a sharded tag of the same ZeRO stage and world size (and the same units and
// layout) directly from zero/rank_<rank>.safetensors, (c) a stage-0 tag into a stage-0 run (any world size).
// Anything else is CheckpointError(mismatch) naming both world sizes and stages and pointing to
// `dscpp ckpt to-universal`. Parameters must match by name and numel, both ways.
std::map<std::string, Tensor> read_owned_states(const CheckpointReader& r, const ZeroPartition& target,
                                                const FlatLayout& target_layout);
// The same with the checkpoint's own layout (engine_state.json "layout") as this run's.
std::map<std::string, Tensor> read_owned_states(const CheckpointReader& r, const ZeroPartition& target);

std::string read_latest_universal_tag(const std::string& dir);  // throws CheckpointError(missing_latest)

// Every parameter's f32 weights by name, in its model shape: DeepSpeed's zero_to_fp32. A tag with a flat layout gives
// its f32 training state (the fp32 masters of a mixed-precision run, else the f32 parameters), gathered from every
// rank's shard at ZeRO stages 1-3 or read from a universal tag; a tag without a layout gives model_states, converted.
// `source` (optional) says which: "fp32 (stage 0)", "fp32 (ZeRO stage S shards of W ranks)", "fp32 (universal
// tag)" or "model_states".
NamedTensors read_fp32_weights(const CheckpointReader& r, std::string* source = nullptr);

}  // namespace dscpp
