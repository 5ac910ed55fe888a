// The tensors of a Hugging Face folder, memory-mapped: model.safetensors, or the shards model.safetensors.index.json
// names. Each file's header is validated by SafetensorsFile; the bytes are read from the mapping, so a tensor is
// converted (bf16 / f16 -> f32) or transposed straight from the page cache into its fused destination, with no
// intermediate copy of the file. Errors name the tensor, the policy and the file.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/checkpoint/safetensors.h"

namespace dscpp::inference {

// The part of a Hugging Face tensor a destination takes (a tensor-parallel shard, Note [Tensor-parallel shards]):
// along `dim` of the destination (after any transpose), `begin` onwards, as many as the destination has. Past the
// tensor's end the destination is zeroed (the last shard of a vocabulary padded to a multiple of the ranks).
struct Slice {
  int dim = -1;  // -1: the whole tensor
  int64_t begin = 0;
};
inline Slice rows_from(int64_t begin) { return {0, begin}; }
inline Slice cols_from(int64_t begin) { return {1, begin}; }

class WeightSource {
 public:
  // policy: the model_type reading it (named in errors); progress: a line on stderr as the bytes read pass each 10%,
  // for folders of 1 GiB or more.
  WeightSource(const std::string& dir, const std::string& policy, bool progress);
  // Tensors already in memory under their Hugging Face names and in its layout (a model trained here, see
  // inference_model_from); `where` names them in errors.
  WeightSource(std::map<std::string, Tensor> tensors, const std::string& where, const std::string& policy);
  ~WeightSource();
  WeightSource(const WeightSource&) = delete;
  WeightSource& operator=(const WeightSource&) = delete;

  // dst (=) the HF tensor `name` (transposed when `transpose`: HF stores dst's transpose), or its `slice`, converted
  // to dst's dtype. dst must be a CPU tensor (a row range of a fused weight is fine). A name with a "transformer." /
  // "model." prefix also matches the tensor without it (checkpoints saved from the base model). Only the slice's
  // bytes of a file are read.
  void read(const std::string& name, const Tensor& dst, bool transpose = false, Slice slice = {});
  bool has(const std::string& name) const { return find(name) != nullptr; }
  // The stored shape of tensor `name` (a missing one is refused as read() refuses it).
  Shape shape(const std::string& name) const;

 private:
  struct Mapped;
  struct Where {
    const Mapped* file;
    const SafetensorsEntry* entry;
  };
  const Where* find(const std::string& name) const;
  // dst (=) src or its slice (checked against dst's shape; `what` names the tensor and its file in errors); returns
  // the bytes of src read.
  uint64_t copy(const Tensor& dst, const Tensor& src, bool transpose, Slice slice, const std::string& what) const;

  std::string dir_, policy_;
  std::vector<std::unique_ptr<Mapped>> files_;
  std::map<std::string, Where> tensors_;
  std::map<std::string, Tensor> memory_;      // the in-memory source's tensors
  std::map<std::string, std::string> index_;  // the index's weight_map, to name the file a missing tensor was due in
  uint64_t total_ = 0, done_ = 0;
  int reported_ = 0;  // tenths of total_ already reported
  bool progress_;
};

}  // namespace dscpp::inference
