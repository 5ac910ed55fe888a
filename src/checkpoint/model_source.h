// ModelSource: the f32 training state of the whole model by parameter name and element index of the full tensor,
// from a tag of any kind: one model replica's (flat, sharded or universal: one StateSource), or one part per rank of
// the model-parallel group (Note [Model-parallel checkpoints], universal.cpp), assembled from the parts' ShardSpecs
// as it reads. Private to src/checkpoint/.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/state_source.h"

namespace dscpp {

class ModelSource {
 public:
  // Verifies every part's headers and that the parts cover each parameter exactly once (a replicated parameter is
  // read from the first part that holds it).
  explicit ModelSource(const CheckpointReader& r);
  ~ModelSource();
  ModelSource(const ModelSource&) = delete;
  ModelSource& operator=(const ModelSource&) = delete;

  struct Param {
    std::string name;
    Shape shape;  // the full tensor's
    int64_t numel = 0;
  };
  const std::vector<Param>& params() const { return params_; }  // in the parts' order, each once
  int find(const std::string& name) const;                      // index into params(), -1 when absent
  const std::vector<std::string>& states() const;               // "fp32" first; the same in every part
  // dst[0, count) = elements [begin, begin + count) of `state` of the full parameter params()[param].
  void read(const std::string& state, size_t param, int64_t begin, int64_t count, float* dst) const;

  const nlohmann::json& engine_state() const { return st_; }  // the tag's own (top-level) engine_state.json
  const std::string& where() const { return where_; }
  bool model_parallel() const { return model_parallel_; }
  int num_parts() const { return int(parts_.size()); }
  const StateSource& part(int mp_rank) const { return *parts_.at(size_t(mp_rank)); }
  std::string describe() const;  // "fp32 (ZeRO stage 2 shards of 4 ranks)", "... 4 model-parallel parts ..."

 private:
  struct Segment {  // elements [begin, begin + count) of a full parameter, held by one part
    int64_t begin = 0, count = 0;
    int part = 0;
    size_t local = 0;  // the parameter's index in that part's layout
    int64_t local_begin = 0;
  };
  void add_part(int m, const StateSource& s);

  nlohmann::json st_;
  std::string where_;
  bool model_parallel_ = false;
  std::vector<std::unique_ptr<StateSource>> parts_;
  std::vector<Param> params_;
  std::vector<std::vector<Segment>> segments_;  // per parameter, by begin
  std::map<std::string, int> by_name_;
  std::map<std::string, std::set<std::pair<int, int64_t>>> taken_;  // the (dim, begin) slices read, per parameter
};

}  // namespace dscpp
