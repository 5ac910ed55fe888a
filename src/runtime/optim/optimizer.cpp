// Optimizer base: the owned range, the weight-decay segments, range checks, and state loading.
#include "dscpp/runtime/optimizer.h"

#include <algorithm>

#include "dscpp/core/allocator.h"
#include "dscpp/core/cuda.h"  // empty_pinned

namespace dscpp {

Optimizer::Optimizer(const ParamSet& params, std::vector<FlatRange> owned, StateMemory memory)
    : params_(params), memory_(memory), owned_(std::move(owned)) {
  DSCPP_CHECK(params.materialized(), "optimizer: the ParamSet must be materialized first");
  // Mark each element's decay flag by parameter, then cut each owned range where the flag changes. Padding has none.
  std::vector<std::pair<int64_t, int64_t>> decayed;  // [offset, offset + numel) of decayed params
  for (const ParamInfo& p : params.infos())
    if (p.weight_decay) decayed.push_back({p.offset, p.offset + p.numel});
  std::sort(decayed.begin(), decayed.end());
  int64_t prev_end = 0;
  for (const FlatRange& r : owned_) {
    DSCPP_CHECK(prev_end <= r.begin && r.begin <= r.end && r.end <= params.flat_numel(), "optimizer: owned range [",
                r.begin, ", ", r.end, ") is not ascending inside the flat buffer of ", params.flat_numel(),
                " elements");
    prev_end = r.end;
    owned_offset_.push_back(owned_numel_);
    owned_numel_ += r.size();
    const int64_t begin = r.begin, end = r.end;
    int64_t pos = begin;
    auto push = [&](int64_t b, int64_t e, bool d) {
      b = std::max(b, begin), e = std::min(e, end);
      if (b >= e) return;
      if (!segments_.empty() && segments_.back().decay == d && segments_.back().end == b) segments_.back().end = e;
      else segments_.push_back({b, e, d});
    };
    for (auto [b, e] : decayed) {
      if (e <= pos) continue;
      if (b >= end) break;
      push(pos, b, false);
      push(std::max(b, pos), e, true);
      pos = std::max(pos, e);
    }
    push(pos, end, false);
  }
}

Tensor Optimizer::new_state() const {
  if (memory_ == StateMemory::none) return Tensor();
  MemoryCategoryScope scope(MemoryCategory::optimizer);
  if (memory_ == StateMemory::device) return Tensor::zeros({owned_numel_}, DType::f32, params_.device());
  Tensor t = memory_ == StateMemory::pinned_host ? empty_pinned({owned_numel_}, DType::f32)
                                                 : Tensor::empty({owned_numel_}, DType::f32);
  t.zero();
  return t;
}

int64_t Optimizer::state_offset(int64_t flat) const {
  auto it = std::upper_bound(owned_.begin(), owned_.end(), flat, [](int64_t v, const FlatRange& r) { return v < r.end; });
  DSCPP_CHECK(it != owned_.end() && flat >= it->begin, name(), " optimizer: flat element ", flat, " is not owned");
  const size_t k = size_t(it - owned_.begin());
  return owned_offset_[k] + (flat - it->begin);
}

nlohmann::json Optimizer::owned_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (const FlatRange& r : owned_) a.push_back({r.begin, r.end});
  return a;
}

std::vector<std::string> Optimizer::state_names() const {
  std::vector<std::string> names;
  for (const auto& [n, t] : state_tensors()) names.push_back(n);
  return names;
}

void Optimizer::check_range(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad,
                            const Tensor& lowp) const {
  auto it = std::find_if(owned_.begin(), owned_.end(), [&](const FlatRange& r) { return r.begin <= begin && end <= r.end; });
  DSCPP_CHECK(begin <= end && it != owned_.end(), name(), " optimizer: range [", begin, ", ", end,
              ") is not inside one owned range");
  DSCPP_CHECK(param.numel() == end - begin && grad.numel() == end - begin, name(), " optimizer: range [", begin,
              ", ", end, ") has ", end - begin, " elements, got param ", param.str(), ", grad ", grad.str());
  DSCPP_CHECK(!lowp.defined() || lowp.numel() == end - begin, name(), " optimizer: range [", begin, ", ", end,
              ") has ", end - begin, " elements, got the 16-bit copy ", lowp.str());
  DSCPP_CHECK(step_count_ >= 1, name(), " optimizer: call begin_step() before update_range()");
}

void Optimizer::update_range(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad, float lr,
                             float grad_scale, const Tensor& param_lowp) {
  DSCPP_CHECK(memory_ != StateMemory::none, name(), " optimizer keeps no states: pass them to update_range");
  update_segments(begin, end, param, grad, {}, true, lr, grad_scale, param_lowp);
}

void Optimizer::update_range(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad,
                             const std::vector<Tensor>& states, float lr, float grad_scale, const Tensor& param_lowp) {
  const size_t want = state_tensors().size();
  DSCPP_CHECK(states.size() == want, name(), " optimizer: ", states.size(), " state tensors given, it has ", want);
  for (const Tensor& t : states)
    DSCPP_CHECK(t.dtype() == DType::f32 && t.numel() == end - begin, name(), " optimizer: range [", begin, ", ", end,
                ") got the state ", t.str());
  update_segments(begin, end, param, grad, states, false, lr, grad_scale, param_lowp);
}

void Optimizer::update_segments(int64_t begin, int64_t end, const Tensor& param, const Tensor& grad,
                                const std::vector<Tensor>& states, bool own_states, float lr, float grad_scale,
                                const Tensor& param_lowp) {
  check_range(begin, end, param, grad, param_lowp);
  std::vector<Tensor> whole = states, slices;
  if (own_states)
    for (const auto& [n, t] : state_tensors()) whole.push_back(t);
  for (const Segment& s : segments_) {
    int64_t b = std::max(s.begin, begin), e = std::min(s.end, end);
    if (b >= e) continue;
    const Tensor lowp = param_lowp.defined() ? param_lowp.slice(b - begin, e - b) : Tensor();
    const int64_t at = own_states ? state_offset(b) : b - begin;
    slices.clear();
    for (const Tensor& t : whole) slices.push_back(t.slice(at, e - b));
    update_segment(b, e, param.slice(b - begin, e - b), grad.slice(b - begin, e - b), lowp, slices, lr, grad_scale,
                   s.decay);
  }
}

void Optimizer::step(float lr, float grad_scale) {
  const Tensor& p = params_.flat_params();
  const Tensor& g = params_.flat_grads();
  DSCPP_CHECK(p.dtype() == DType::f32 && g.dtype() == DType::f32, name(),
              " optimizer: step() needs f32 flat params and grads, got ", p.str(), " and ", g.str(),
              "; step the fp32 master weights with update_range()");
  begin_step();
  for (const FlatRange& r : owned_)
    update_range(r.begin, r.end, p.slice(r.begin, r.size()), g.slice(r.begin, r.size()), lr, grad_scale);
}

void Optimizer::load_state(const nlohmann::json& meta, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  DSCPP_CHECK(meta.value("type", std::string()) == name(), "optimizer load_state: checkpoint holds a '",
              meta.value("type", std::string()), "' optimizer, this is '", name(), "'");
  nlohmann::json saved = meta.contains("owned") ? meta.at("owned") : nlohmann::json::array(
      {{meta.value("owned_begin", int64_t(-1)), meta.value("owned_end", int64_t(-1))}});  // single-range form
  DSCPP_CHECK(saved == owned_json(), "optimizer load_state: checkpoint owns ", saved.dump(),
              ", this optimizer owns ", owned_json().dump());
  auto mine = state_tensors();
  for (auto& [n, dst] : mine) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == n; });
    DSCPP_CHECK(it != tensors.end(), "optimizer load_state: missing state tensor '", n, "'");
    DSCPP_CHECK(it->second.numel() == owned_numel_, "optimizer load_state: '", n, "' has ", it->second.numel(),
                " elements, expected ", owned_numel_);
    if (!dst.defined()) continue;  // StateMemory::none: the caller keeps them
    Tensor src = it->second.device() == dst.device() ? it->second : it->second.to(dst.device());
    dst.copy_from(src);
  }
  step_count_ = meta.at("step").get<int64_t>();
}

void Optimizer::set_betas(double, double) { DSCPP_FAIL(name(), " optimizer has no betas to set"); }

std::array<double, 2> Optimizer::checked_betas(double beta1, double beta2) const {
  DSCPP_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, name(), " set_betas: betas must be in [0, 1), got ",
              beta1, ", ", beta2);
  return {beta1, beta2};
}

}  // namespace dscpp
