// ModelSource: a tag's whole model, from one replica's files or from its model-parallel parts.
//
// Note [Model-parallel checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under tensor or pipeline parallelism each rank of a model replica holds another part of the model: a slice of
// some parameters (ShardSpec, nn/shard_spec.h: rows or columns, GPT-2's fused q | k | v split per part, a padded
// vocabulary) and, on a pipeline stage, only its layers' parameters. The tag keeps each part as the files one replica
// would have, in a folder of its own, so the data-parallel sharding (ZeRO) inside a part is unchanged:
//   engine_state.json              the job's: counters, schedule, scaler, RNG, configs, client state, and
//                                  "model_parallel": {"size": M, "tensor_parallel_size": T, "parts": [dir, ...]}
//   mp_rank_<m>/engine_state.json  model-parallel rank m's "layout", "zero", "dp_world_size" and "shards": every
//                                  parameter it holds, {"shape": its local shape, "dim", "parts", "begin", "full"}
//   mp_rank_<m>/model_states.safetensors, optim_states.safetensors | zero/rank_<d>.safetensors
// Each parameter keeps its Hugging Face name in every part (a tied head on the last stage is a copy of the token
// table, named as the table). Reading maps full-tensor elements to the parts that hold them (the ShardSpec runs);
// a parameter held whole or as the same slice by several parts (norms under TP, the tied copy) is read from the first.
// So any reader sees the whole model by name, and loading into another layout (tp, pp, dp, ZeRO stage) reshards as
// it reads: the target's own ShardSpecs map its elements back to the full tensors (read_owned_states).
#include "checkpoint/model_source.h"

#include <algorithm>
#include <set>

namespace dscpp {

namespace {
using K = CheckpointErrorKind;
constexpr const char* kStateFile = "engine_state.json";

ShardSpec shard_from_json(const nlohmann::json& j) {
  ShardSpec s;
  s.dim = j.at("dim").get<int>();
  s.parts = j.at("parts").get<int>();
  s.begin = j.at("begin").get<int64_t>();
  s.full = j.at("full").get<int64_t>();
  return s;
}
}  // namespace

std::string model_parallel_part_dir(int mp_rank) {
  const std::string n = std::to_string(mp_rank);
  return "mp_rank_" + std::string(n.size() < 2 ? 2 - n.size() : 0, '0') + n + "/";
}

nlohmann::json shard_json(const Shape& local, const ShardSpec& s) {
  return {{"shape", local}, {"dim", s.dim}, {"parts", s.parts}, {"begin", s.begin}, {"full", s.full}};
}

ModelSource::~ModelSource() = default;

ModelSource::ModelSource(const CheckpointReader& r) {
  where_ = r.dir() + "/" + kStateFile;
  st_ = r.read_json(kStateFile);
  model_parallel_ = st_.contains(kModelParallelKey);
  if (!model_parallel_) {
    parts_.push_back(std::make_unique<StateSource>(r));
    const StateSource& s = *parts_[0];
    segments_.resize(s.layout().size());
    for (size_t i = 0; i < s.layout().size(); i++) {
      by_name_[s.layout()[i].name] = int(i);
      params_.push_back({s.layout()[i].name, s.shape(i), s.layout()[i].numel});
      segments_[i].push_back({0, s.layout()[i].numel, 0, i, 0});
    }
    return;
  }
  std::vector<std::string> dirs;
  try {
    dirs = st_.at(kModelParallelKey).at("parts").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    checkpoint_fail(K::bad_header, where_, ": malformed \"", kModelParallelKey, "\": ", e.what());
  }
  if (dirs.empty()) checkpoint_fail(K::bad_header, where_, ": \"", kModelParallelKey, "\" lists no parts");
  for (size_t m = 0; m < dirs.size(); m++) {
    parts_.push_back(std::make_unique<StateSource>(r, dirs[m]));
    if (parts_[m]->states() != parts_[0]->states())
      checkpoint_fail(K::mismatch, parts_[m]->where(), ": holds other optimizer states than ", parts_[0]->where());
    add_part(int(m), *parts_[m]);
  }
  for (size_t i = 0; i < params_.size(); i++) {
    auto& segs = segments_[i];
    std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
    int64_t end = 0;
    for (const Segment& s : segs) {
      if (s.begin != end) break;
      end += s.count;
    }
    if (end != params_[i].numel)
      checkpoint_fail(K::bad_header, where_, ": the model-parallel parts do not hold parameter ", params_[i].name,
                      shape_str(params_[i].shape), " exactly once (their slices cover its elements up to ", end,
                      " of ", params_[i].numel, ")");
  }
}

void ModelSource::add_part(int m, const StateSource& s) {
  const nlohmann::json& st = s.engine_state();
  if (!st.contains("shards"))
    checkpoint_fail(K::bad_header, s.where(), ": a model-parallel part without \"shards\"");
  for (size_t i = 0; i < s.layout().size(); i++) {
    const FlatParam& p = s.layout()[i];
    Shape local;
    ShardSpec spec;
    try {
      const nlohmann::json& j = st.at("shards").at(p.name);
      local = j.at("shape").get<Shape>();
      spec = shard_from_json(j);
    } catch (const nlohmann::json::exception& e) {
      checkpoint_fail(K::bad_header, s.where(), ": \"shards\" of ", p.name, ": ", e.what());
    }
    if (shape_numel(local) != p.numel || (!spec.replicated() && (spec.dim > 1 || local.size() <= size_t(spec.dim))))
      checkpoint_fail(K::bad_header, s.where(), ": \"shards\" of ", p.name, " gives shape ", shape_str(local),
                      " split on dim ", spec.dim, " for a parameter of ", p.numel, " elements");
    const Shape full = spec.full_shape(local);
    auto [it, added] = by_name_.emplace(p.name, int(params_.size()));
    if (added) {
      params_.push_back({p.name, full, shape_numel(full)});
      segments_.emplace_back();
    } else if (params_[size_t(it->second)].shape != full) {
      checkpoint_fail(K::mismatch, s.where(), ": parameter ", p.name, " is ", shape_str(full), " in full here, ",
                      shape_str(params_[size_t(it->second)].shape), " in an earlier part");
    }
    std::set<std::pair<int, int64_t>>& seen = taken_[p.name];
    if (!seen.insert({spec.dim, spec.replicated() ? 0 : spec.begin}).second) continue;  // another copy
    if (spec.replicated() && seen.size() > 1) continue;
    auto& segs = segments_[size_t(it->second)];
    spec.for_each_run(local, [&](int64_t lb, int64_t fb, int64_t n) {
      if (fb >= 0) segs.push_back({fb, n, m, i, lb});
    });
  }
}

int ModelSource::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

const std::vector<std::string>& ModelSource::states() const { return parts_[0]->states(); }

void ModelSource::read(const std::string& state, size_t param, int64_t begin, int64_t count, float* dst) const {
  const Param& p = params_.at(param);
  DSCPP_CHECK(begin >= 0 && count >= 0 && begin + count <= p.numel, "ModelSource::read: elements [", begin, ", ",
              begin + count, ") of ", p.name, " (", p.numel, ")");
  const auto& segs = segments_[param];
  // The last segment starting at or before `begin`; the segments tile [0, numel).
  auto it = std::upper_bound(segs.begin(), segs.end(), begin, [](int64_t v, const Segment& s) { return v < s.begin; });
  for (--it; count > 0; ++it) {
    const int64_t off = begin - it->begin, n = std::min(count, it->count - off);
    parts_[size_t(it->part)]->read(state, it->local, it->local_begin + off, n, dst);
    dst += n, begin += n, count -= n;
  }
}

std::string ModelSource::describe() const {
  const StateSource& s = *parts_[0];
  const ZeroPartition& z = s.partition();
  std::string d = s.kind() == TagKind::universal ? "universal tag"
                  : s.kind() == TagKind::sharded
                      ? "ZeRO stage " + std::to_string(z.stage()) + " shards of " + std::to_string(z.world_size()) +
                            " ranks"
                      : "stage 0";
  if (model_parallel_) d += ", " + std::to_string(parts_.size()) + " model-parallel parts";
  return "fp32 (" + d + ")";
}

}  // namespace dscpp
