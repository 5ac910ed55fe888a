// ParamSet: every parameter of a model in one flat buffer, with its gradient in a second flat buffer of the same
// layout. A named parameter is a view (offset, shape) into the buffer, so a ZeRO partition is a slice of it and
// the optimizer runs over the flat buffer in one pass.
//
// Layout: parameters in declaration order (a block's parameters are contiguous, so ZeRO-3 gathers a block with one
// collective); each starts at a multiple of `align` elements, except inside a fused group, whose members are
// adjacent so that one GEMM serves them (q/k/v projections, gate/up projections). The total is padded to a multiple
// of `pad_multiple` (alignment x world size, so every rank's partition has the same size).
//
// Units (Note [ZeRO units], nn/zero_partition.h): a model may name the parameters that start a unit (a block,
// the embeddings, ...); each unit then starts and ends at a multiple of `pad_multiple`, so ZeRO can split every unit
// evenly across the ranks. ZeRO-2/3 drop the flat gradient / parameter buffers and attach a window (a tensor holding
// one whole unit) while the unit is in use; param() and grad() resolve to the flat buffer when it exists, else to
// the unit's window. A grad() on a unit without a window asks the grad-window provider for one (ZeRO-2/3 allocate
// it zeroed on first use in backward).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dscpp/core/tensor.h"
#include "dscpp/nn/shard_spec.h"

namespace dscpp {

struct FlatRange {  // elements [begin, end) of the flat buffer
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

struct ParamInfo {
  std::string name;   // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;
  int64_t offset = 0;  // element offset in the flat buffer
  int64_t numel = 0;
  bool weight_decay = true;  // false for biases and norm weights
  ShardSpec shard;           // under tensor parallelism, the part of the full parameter this rank holds
};

class ParamSet {
 public:
  // Declaration phase. Returns the parameter's id.
  int add(const std::string& name, const Shape& shape, bool weight_decay);
  // Members are laid out back to back with no padding; returns the first member's id (the others follow).
  int add_fused(const std::vector<std::pair<std::string, Shape>>& members, bool weight_decay);
  // Declares only the parameters `keep` accepts: add() and add_fused() return -1 for the others (a fused group is
  // kept or left whole), so a pipeline stage declares the whole model's layers and holds its own (Hugging Face
  // names unchanged).
  void set_declare_filter(std::function<bool(const std::string& name)> keep) { keep_ = std::move(keep); }

  // Under tensor parallelism: which part of the full parameter `id` holds (Note [Tensor parallelism]).
  void set_shard(int id, const ShardSpec& s) { infos_.at(size_t(id)).shard = s; }
  // The parameters that start a unit (ids, ascending; id 0 is always a unit start). Before materialize().
  void set_unit_starts(std::vector<int> first_ids);

  // Allocates the parameter and gradient buffers (gradients zeroed). Call once, after all add()s. The gradients
  // take `grad_dtype` when given (mixed precision: 16-bit parameters, f32 gradient accumulation), else `dtype`.
  // allocate_grads false leaves the flat gradient buffer out (ZeRO-2/3 supply unit windows); allocate_params false
  // the parameter buffer (ZeRO-3 initialises only each rank's shard): the layout is fixed either way.
  void materialize(DType dtype = DType::f32, Device device = Device::cpu(), int64_t align = 16,
                   int64_t pad_multiple = 16, std::optional<DType> grad_dtype = std::nullopt,
                   bool allocate_grads = true, bool allocate_params = true);
  bool materialized() const { return materialized_; }

  int size() const { return int(infos_.size()); }
  const ParamInfo& info(int id) const { return infos_.at(size_t(id)); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int find(const std::string& name) const;  // -1 if absent

  Tensor param(int id) const;          // view into the flat parameter buffer
  Tensor grad(int id) const;           // view into the flat gradient buffer
  Tensor fused_param(int first_id, int count) const;  // adjacent members as one 2-D [sum rows, cols] view
  Tensor fused_grad(int first_id, int count) const;
  const Tensor& flat_params() const { return params_; }
  const Tensor& flat_grads() const { return grads_; }
  int64_t flat_numel() const { return flat_numel_; }     // padded total
  int64_t num_parameters() const;                        // sum of numel, no padding
  DType dtype() const { return dtype_; }
  DType grad_dtype() const { return grad_dtype_; }
  Device device() const { return device_; }
  void zero_grads();  // the flat gradient buffer (windows are the provider's business)

  // Units and windows (see the top of this file).
  const std::vector<FlatRange>& units() const { return units_; }  // contiguous, covering [0, flat_numel)
  int unit_of(int64_t flat_offset) const;
  void drop_flat_params();  // frees the flat parameter buffer (ZeRO-3: each rank keeps its shard elsewhere)
  void drop_flat_grads();
  // Moves the flat gradients into t (flat_numel() elements of grad_dtype() on device(); contents copied), e.g. a
  // process group's symmetric memory (Note [Copy-engine reductions]). Views taken before keep the old buffer.
  void replace_flat_grads(Tensor t);
  void attach_param_window(int unit, Tensor t);  // t: units()[unit].size() elements of dtype()
  void detach_param_window(int unit);
  bool has_param_window(int unit) const { return param_window_.at(size_t(unit)).defined(); }
  void attach_grad_window(int unit, Tensor t);   // t: units()[unit].size() elements of grad_dtype()
  void detach_grad_window(int unit);
  const Tensor& grad_window(int unit) const { return grad_window_.at(size_t(unit)); }
  using GradWindowProvider = std::function<void(int unit)>;  // must attach_grad_window(unit, ...)
  void set_grad_window_provider(GradWindowProvider p) { grad_provider_ = std::move(p); }

 private:
  Tensor fused_view(bool grad, int first_id, int count) const;
  Tensor storage_view(bool grad, int64_t offset, const Shape& shape) const;  // flat buffer or the unit's window
  std::vector<ParamInfo> infos_;
  std::vector<int> fused_with_prev_;  // 1 when the parameter continues a fused group
  std::unordered_map<std::string, int> by_name_;
  Tensor params_, grads_;
  int64_t flat_numel_ = 0;
  bool materialized_ = false;
  DType dtype_ = DType::f32, grad_dtype_ = DType::f32;
  Device device_ = Device::cpu();
  std::vector<int> unit_starts_{0};
  std::vector<FlatRange> units_;
  std::vector<Tensor> param_window_, grad_window_;  // per unit; undefined when not attached
  GradWindowProvider grad_provider_;
  std::function<bool(const std::string&)> keep_;
};

}  // namespace dscpp
