#include "dscpp/nn/params.h"

#include <algorithm>

namespace dscpp {

int ParamSet::add(const std::string& name, const Shape& shape, bool weight_decay) {
  DSCPP_CHECK(!materialized(), "parameter '", name, "' declared after materialize()");
  if (keep_ && !keep_(name)) return -1;
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
  if (keep_) {
    const bool kept = keep_(members[0].first);
    for (const auto& mem : members)
      DSCPP_CHECK(keep_(mem.first) == kept, "declare filter splits the fused group of '", members[0].first, "'");
    if (!kept) return -1;
  }
  for (size_t i = 0; i < members.size(); i++) {
    int id = add(members[i].first, members[i].second, weight_decay);
    if (i == 0) first = id;
    else fused_with_prev_.back() = 1;
  }
  return first;
}

void ParamSet::set_unit_starts(std::vector<int> first_ids) {
  DSCPP_CHECK(!materialized(), "set_unit_starts() after materialize()");
  DSCPP_CHECK(!first_ids.empty() && first_ids[0] == 0, "unit starts must begin with parameter 0");
  for (size_t i = 1; i < first_ids.size(); i++)
    DSCPP_CHECK(first_ids[i] > first_ids[i - 1] && first_ids[i] < size() && !fused_with_prev_[size_t(first_ids[i])],
                "unit starts must be ascending parameter ids that do not split a fused group");
  unit_starts_ = std::move(first_ids);
}

void ParamSet::materialize(DType dtype, Device device, int64_t align, int64_t pad_multiple,
                           std::optional<DType> grad_dtype, bool allocate_grads, bool allocate_params) {
  DSCPP_CHECK(!materialized(), "materialize() called twice");
  DSCPP_CHECK(align >= 1 && pad_multiple >= 1, "bad alignment");
  DSCPP_CHECK(!infos_.empty(), "materialize() with no parameters");
  auto round_up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
  int64_t off = 0;
  size_t next_unit = 1;
  std::vector<int64_t> unit_begin{0};
  for (size_t i = 0; i < infos_.size(); i++) {
    if (next_unit < unit_starts_.size() && int(i) == unit_starts_[next_unit]) {
      off = round_up(off, pad_multiple);  // a unit ends and the next starts on a multiple of pad_multiple
      unit_begin.push_back(off);
      next_unit++;
    }
    if (!fused_with_prev_[i]) off = round_up(off, align);
    infos_[i].offset = off;
    off += infos_[i].numel;
  }
  flat_numel_ = round_up(off, pad_multiple);
  units_.clear();
  for (size_t u = 0; u < unit_begin.size(); u++)
    units_.push_back({unit_begin[u], u + 1 < unit_begin.size() ? unit_begin[u + 1] : flat_numel_});
  param_window_.assign(units_.size(), Tensor());
  grad_window_.assign(units_.size(), Tensor());
  dtype_ = dtype;
  grad_dtype_ = grad_dtype.value_or(dtype);
  device_ = device;
  if (allocate_params) {
    MemoryCategoryScope s(MemoryCategory::parameters);
    params_ = Tensor::zeros({flat_numel_}, dtype, device);
  }
  if (allocate_grads) {
    MemoryCategoryScope s(MemoryCategory::gradients);
    grads_ = Tensor::zeros({flat_numel_}, grad_dtype_, device);
  }
  materialized_ = true;
}

int ParamSet::unit_of(int64_t flat_offset) const {
  auto it = std::upper_bound(units_.begin(), units_.end(), flat_offset,
                             [](int64_t v, const FlatRange& r) { return v < r.end; });
  DSCPP_CHECK(it != units_.end() && flat_offset >= it->begin, "flat offset ", flat_offset, " outside [0, ",
              flat_numel_, ")");
  return int(it - units_.begin());
}

void ParamSet::drop_flat_params() { params_ = Tensor(); }
void ParamSet::drop_flat_grads() { grads_ = Tensor(); }

void ParamSet::replace_flat_grads(Tensor t) {
  DSCPP_CHECK(grads_.defined(), "replace_flat_grads: there is no flat gradient buffer");
  DSCPP_CHECK(t.defined() && t.numel() == flat_numel_ && t.dtype() == grad_dtype_ && t.device() == device_,
              "replace_flat_grads: expected ", flat_numel_, " elements of ", dtype_name(grad_dtype_), " on ",
              device_.str(), ", got ", t.defined() ? t.str() : std::string("an undefined tensor"));
  t.copy_from(grads_);
  grads_ = std::move(t);
}

namespace {
void check_window(const char* what, const Tensor& t, const FlatRange& u, DType dt, Device dev) {
  DSCPP_CHECK(t.defined() && t.numel() == u.size() && t.dtype() == dt && t.device() == dev, what,
              " window for unit [", u.begin, ", ", u.end, ") must be ", u.size(), " elements of ", dtype_name(dt),
              ", got ", t.str());
}
}  // namespace

void ParamSet::attach_param_window(int unit, Tensor t) {
  check_window("parameter", t, units_.at(size_t(unit)), dtype_, device_);
  param_window_[size_t(unit)] = std::move(t);
}
void ParamSet::detach_param_window(int unit) { param_window_.at(size_t(unit)) = Tensor(); }
void ParamSet::attach_grad_window(int unit, Tensor t) {
  check_window("gradient", t, units_.at(size_t(unit)), grad_dtype_, device_);
  grad_window_[size_t(unit)] = std::move(t);
}
void ParamSet::detach_grad_window(int unit) { grad_window_.at(size_t(unit)) = Tensor(); }

Tensor ParamSet::storage_view(bool grad, int64_t offset, const Shape& shape) const {
  const Tensor& flat = grad ? grads_ : params_;
  if (flat.defined()) return flat.view_at(offset, shape);
  const int u = unit_of(offset);
  if (grad && !grad_window_[size_t(u)].defined() && grad_provider_) grad_provider_(u);
  const Tensor& w = grad ? grad_window_[size_t(u)] : param_window_[size_t(u)];
  DSCPP_CHECK(w.defined(), grad ? "gradient" : "parameter", " at flat offset ", offset, " (unit ", u,
              ") is not resident: ZeRO must gather the unit before it is used");
  return w.view_at(offset - units_[size_t(u)].begin, shape);
}

int ParamSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

Tensor ParamSet::param(int id) const {
  DSCPP_CHECK(materialized(), "parameters not materialized");
  const ParamInfo& p = info(id);
  return storage_view(false, p.offset, p.shape);
}

Tensor ParamSet::grad(int id) const {
  DSCPP_CHECK(materialized(), "parameters not materialized");
  const ParamInfo& p = info(id);
  return storage_view(true, p.offset, p.shape);
}

Tensor ParamSet::fused_view(bool grad, int first, int count) const {
  DSCPP_CHECK(count >= 1 && first + count <= size(), "bad fused range");
  int64_t rows = 0, cols = info(first).shape.size() == 2 ? info(first).shape[1] : 1;
  for (int i = first; i < first + count; i++) {
    const ParamInfo& p = info(i);
    DSCPP_CHECK(i == first || fused_with_prev_[size_t(i)], "'", p.name, "' is not fused with '", info(i - 1).name, "'");
    DSCPP_CHECK(p.numel % cols == 0, "fused members of '", info(first).name, "' have different widths");
    rows += p.numel / cols;
  }
  Shape s = info(first).shape.size() == 2 ? Shape{rows, cols} : Shape{rows};
  return storage_view(grad, info(first).offset, s);
}

Tensor ParamSet::fused_param(int first, int count) const { return fused_view(false, first, count); }
Tensor ParamSet::fused_grad(int first, int count) const { return fused_view(true, first, count); }

int64_t ParamSet::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : infos_) n += p.numel;
  return n;
}

void ParamSet::zero_grads() {
  if (grads_.defined()) grads_.zero();
}

}  // namespace dscpp
