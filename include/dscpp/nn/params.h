// ParamSet: every parameter of a model in one flat buffer, with its gradient in a second flat buffer of the same
// layout. A named parameter is a view (offset, shape) into the buffer, so a ZeRO partition is a slice of it and
// the optimizer runs over the flat buffer in one pass.
//
// Layout: parameters in declaration order (a block's parameters are contiguous, so ZeRO-3 gathers a block with one
// collective); each starts at a multiple of `align` elements, except inside a fused group, whose members are
// adjacent so that one GEMM serves them (q/k/v projections, gate/up projections). The total is padded to a multiple
// of `pad_multiple` (alignment x world size, so every rank's partition has the same size).
#pragma once
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dscpp/core/tensor.h"

namespace dscpp {

struct ParamInfo {
  std::string name;   // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;
  int64_t offset = 0;  // element offset in the flat buffer
  int64_t numel = 0;
  bool weight_decay = true;  // false for biases and norm weights
};

class ParamSet {
 public:
  // Declaration phase. Returns the parameter's id.
  int add(const std::string& name, const Shape& shape, bool weight_decay);
  // Members are laid out back to back with no padding; returns the first member's id (the others follow).
  int add_fused(const std::vector<std::pair<std::string, Shape>>& members, bool weight_decay);

  // Allocates the parameter and gradient buffers (gradients zeroed). Call once, after all add()s. The gradients
  // take `grad_dtype` when given (mixed precision: 16-bit parameters, f32 gradient accumulation), else `dtype`.
  void materialize(DType dtype = DType::f32, Device device = Device::cpu(), int64_t align = 16,
                   int64_t pad_multiple = 16, std::optional<DType> grad_dtype = std::nullopt);
  bool materialized() const { return params_.defined(); }

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
  void zero_grads();

 private:
  Tensor fused_view(const Tensor& flat, int first_id, int count) const;
  std::vector<ParamInfo> infos_;
  std::vector<int> fused_with_prev_;  // 1 when the parameter continues a fused group
  std::unordered_map<std::string, int> by_name_;
  Tensor params_, grads_;
  int64_t flat_numel_ = 0;
};

}  // namespace dscpp
