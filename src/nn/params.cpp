#include "dscpp/nn/params.h"

namespace dscpp {

int ParamSet::add(const std::string& name, const Shape& shape, bool weight_decay) {
  DSCPP_CHECK(!materialized(), "parameter '", name, "' declared after materialize()");
  DSCPP_CHECK(!by_name_.count(name), "parameter '", name, "' declared twice");
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = shape_numel(shape);
  p.weight_decay = weight_decay;
  infos_.push_back(p);
  fused_with_prev_.push_back(0);
  by_name_[name] = int(infos_.size()) - 1;
  return int(infos_.size()) - 1;
}

int ParamSet::add_fused(const std::vector<std::pair<std::string, Shape>>& members, bool weight_decay) {
  DSCPP_CHECK(!members.empty(), "empty fused parameter group");
  int first = -1;
  for (size_t i = 0; i < members.size(); i++) {
    int id = add(members[i].first, members[i].second, weight_decay);
    if (i == 0) first = id;
    else fused_with_prev_.back() = 1;
  }
  return first;
}

void ParamSet::materialize(DType dtype, Device device, int64_t align, int64_t pad_multiple,
                           std::optional<DType> grad_dtype) {
  DSCPP_CHECK(!materialized(), "materialize() called twice");
  DSCPP_CHECK(align >= 1 && pad_multiple >= 1, "bad alignment");
  int64_t off = 0;
  for (size_t i = 0; i < infos_.size(); i++) {
    if (!fused_with_prev_[i]) off = (off + align - 1) / align * align;
    infos_[i].offset = off;
    off += infos_[i].numel;
  }
  flat_numel_ = (off + pad_multiple - 1) / pad_multiple * pad_multiple;
  {
    MemoryCategoryScope s(MemoryCategory::parameters);
    params_ = Tensor::zeros({flat_numel_}, dtype, device);
  }
  {
    MemoryCategoryScope s(MemoryCategory::gradients);
    grads_ = Tensor::zeros({flat_numel_}, grad_dtype.value_or(dtype), device);
  }
}

int ParamSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

Tensor ParamSet::param(int id) const {
  DSCPP_CHECK(materialized(), "parameters not materialized");
  const ParamInfo& p = info(id);
  return params_.view_at(p.offset, p.shape);
}

Tensor ParamSet::grad(int id) const {
  DSCPP_CHECK(materialized(), "parameters not materialized");
  const ParamInfo& p = info(id);
  return grads_.view_at(p.offset, p.shape);
}

Tensor ParamSet::fused_view(const Tensor& flat, int first, int count) const {
  DSCPP_CHECK(count >= 1 && first + count <= size(), "bad fused range");
  int64_t rows = 0, cols = info(first).shape.size() == 2 ? info(first).shape[1] : 1;
  for (int i = first; i < first + count; i++) {
    const ParamInfo& p = info(i);
    DSCPP_CHECK(i == first || fused_with_prev_[size_t(i)], "'", p.name, "' is not fused with '", info(i - 1).name, "'");
    DSCPP_CHECK(p.numel % cols == 0, "fused members of '", info(first).name, "' have different widths");
    rows += p.numel / cols;
  }
  Shape s = info(first).shape.size() == 2 ? Shape{rows, cols} : Shape{rows};
  return flat.view_at(info(first).offset, s);
}

Tensor ParamSet::fused_param(int first, int count) const { return fused_view(params_, first, count); }
Tensor ParamSet::fused_grad(int first, int count) const { return fused_view(grads_, first, count); }

int64_t ParamSet::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : infos_) n += p.numel;
  return n;
}

void ParamSet::zero_grads() {
  if (grads_.defined()) grads_.zero();
}

}  // namespace dscpp
