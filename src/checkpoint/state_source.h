// StateSource: element ranges of one parameter's f32 training state from a checkpoint tag of any kind, by partial
// reads (pread of just those bytes), so converting or resharding never loads a whole file. Private to
// src/checkpoint/ (universal.cpp). The kinds (zero_layout contract, Note [Universal checkpoint] in universal.cpp):
//   flat       ZeRO stage 0: optim_states.safetensors holds each optimizer state over [0, flat_numel); "fp32" is its
//              "fp32_master" when present, else the parameters of model_states.safetensors converted to f32
//   sharded    stages 1-3: zero/rank_<r>.safetensors, rank r's shard of "fp32" and each optimizer state
//   universal  universal/<hf_name>.safetensors, each state with the parameter's shape
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/checkpoint/universal.h"

namespace dscpp {

enum class TagKind { flat, sharded, universal };

class StateSource {
 public:
  // Reads engine_state.json and checks every state file's header (names, dtypes, sizes) before any data is read.
  // prefix: the folder of one model-parallel rank's files ("mp_rank_<m>/"), whose engine_state.json holds that
  // part's layout, ZeRO partition and "shards"; "" for a tag of one model replica.
  explicit StateSource(const CheckpointReader& r, std::string prefix = "");
  ~StateSource();
  StateSource(const StateSource&) = delete;
  StateSource& operator=(const StateSource&) = delete;

  TagKind kind() const { return kind_; }
  const nlohmann::json& engine_state() const { return st_; }
  const std::string& where() const { return where_; }  // "<dir>/<tag>/engine_state.json", for messages
  const FlatLayout& layout() const { return layout_; }
  int64_t flat_numel() const { return flat_numel_; }
  // As saved (rank 0's view). flat: stage 0 over the saved world size; universal: stage 0, world size 1.
  const ZeroPartition& partition() const { return part_; }
  const std::vector<std::string>& states() const { return states_; }  // "fp32" first
  int find(const std::string& param) const;                           // index into layout(), -1 when absent
  Shape shape(size_t param) const;  // from model_states / the universal file / the model config; else [numel]

  // dst[0, count) = elements [begin, begin + count) of `state` of parameter layout()[param].
  void read(const std::string& state, size_t param, int64_t begin, int64_t count, float* dst) const;

 private:
  struct File;
  std::string file(const std::string& name) const { return prefix_ + name; }  // a file of this source
  const File& open(const std::string& file_name) const;  // cached
  // dst[0, count) = elements [begin, begin + count) of the tensor (any float dtype, converted to f32).
  void read_range(const std::string& file_name, const std::string& tensor, int64_t begin, int64_t count,
                  float* dst) const;
  void init_flat();
  void init_sharded();
  void init_universal();

  const CheckpointReader& r_;
  std::string prefix_;
  TagKind kind_ = TagKind::flat;
  nlohmann::json st_;
  std::string where_;
  FlatLayout layout_;
  int64_t flat_numel_ = 0;
  ZeroPartition part_;
  std::vector<int64_t> shard_off_;  // sharded: where each unit's chunk starts in a shard
  std::vector<std::string> states_;
  bool has_master_ = false;         // flat: optim_states has "fp32_master"
  std::map<std::string, int> by_name_;
  std::map<std::string, Shape> model_shapes_;
  mutable std::map<std::string, std::unique_ptr<File>> files_;  // at most kMaxOpenFiles (descriptors are finite)
};

}  // namespace dscpp
