// Universal checkpoints: a ZeRO tag's f32 training state (master weights, optimizer moments) rewritten per whole
// parameter (DeepSpeed's ds_to_universal), for those who want one file per parameter; any tag loads into any layout
// directly too (read_owned_states). Layouts: the
// contract in Note [Universal checkpoint] (src/checkpoint/universal.cpp):
//   universal/<hf_name>.safetensors  "fp32" and the optimizer's states by name ("exp_avg", "exp_avg_sq" |
//                                    "momentum_buffer" | "sum"): f32, the parameter's shape
//   engine_state.json                the source's, with "universal": true and "zero" removed
//   model_states.safetensors, extra files   copied
#pragma once
#include <map>
#include <string>
#include <vector>

#include "dscpp/checkpoint/checkpoint_io.h"
#include "dscpp/nn/shard_spec.h"
#include "dscpp/nn/zero_partition.h"

namespace dscpp {

inline constexpr const char* kLatestUniversalFile = "latest_universal";  // names the newest universal tag

// Model-parallel tags (Note [Model-parallel checkpoints], src/checkpoint/model_source.cpp): engine_state.json's key
// that lists the parts, each part's folder, and a parameter's entry in a part's "shards".
inline constexpr const char* kModelParallelKey = "model_parallel";
std::string model_parallel_part_dir(int mp_rank);  // "mp_rank_07/"
nlohmann::json shard_json(const Shape& local, const ShardSpec& s);

// Which part of the model a loading rank holds, beyond its flat layout.
struct ModelPart {
  int mp_rank = 0, mp_size = 1;  // in the model-parallel group (pipeline stages x tensor slices)
  bool whole = true;             // false on a pipeline stage: the checkpoint's other parameters are other stages'
};

// One parameter of a flat buffer (engine_state.json "layout" params: [hf_name, offset, numel]). Under tensor
// parallelism a target's parameter may be a slice of the full one: `shard` says which, of the local `shape`.
struct FlatParam {
  std::string name;
  int64_t offset = 0, numel = 0;
  Shape shape = {};      // needed only when shard is not replicated
  ShardSpec shard = {};
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
  int source_model_parallel = 1;  // the source's model-parallel parts (tensor slices x pipeline stages)
  int64_t num_params = 0;
  std::vector<std::string> states;  // "fp32" first, then the optimizer's
  bool latest_updated = false;      // `latest` moved (only when out_dir is not load_dir)
};

// Rewrites tag (stage 0: optim_states.safetensors [+ fp32_master, else the model_states parameters]; stages 1-3:
// zero/rank_<r>.safetensors for every rank; either in every part of a model-parallel tag, whose slices are merged
// into whole parameters) as the universal tag out_tag in out_dir, streaming one parameter at a
// time (partial reads; no shard is loaded whole). "" defaults: tag = `latest`, out_dir = load_dir, out_tag =
// "<tag>_universal". Commits with the checkpoint_io protocol, then writes out_dir/latest_universal; `latest` in
// out_dir moves only when out_dir differs from load_dir (converting in place must not change what a plain resume
// loads). Throws CheckpointError (the source's files are verified first; a universal source is bad_argument).
UniversalResult convert_to_universal(const std::string& load_dir, const std::string& tag, const std::string& out_dir,
                                     const std::string& out_tag);

// This rank's owned states for a run partitioned as `target` whose flat buffer is `target_layout`: for each state
// ("fp32" and each optimizer state) an f32 CPU tensor of target.shard_numel() elements holding target's owned
// ranges in unit order, padding 0. A tag saved exactly so (the same ZeRO stage, world size, units and layout, and the
// same model-parallel part) is read straight from this rank's shard file. Any other tag (another world size, ZeRO
// stage, padding, tensor or pipeline layout, or a universal tag) is read by parameter name and element index of the
// full tensor (ModelSource), each target slice mapped through its ShardSpec, so it reshards as it reads. Parameters
// must match by name and full shape; every checkpoint parameter must be in the target unless part.whole is false.
std::map<std::string, Tensor> read_owned_states(const CheckpointReader& r, const ZeroPartition& target,
                                                const FlatLayout& target_layout, const ModelPart& part = {});
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
