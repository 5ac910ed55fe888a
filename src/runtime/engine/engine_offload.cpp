// The engine's optimizer offload (Note [Optimizer offload], runtime/offload/optimizer_offload.h): set-up, where each
// unit's gradients and parameters are, and the optimizer's states over the whole shard wherever they live, for
// checkpoints; the device optimizer's step into offload_param's host partition (Note [Parameter offload]).
#include <algorithm>
#include <iostream>

#include "dscpp/runtime/engine.h"
#include "runtime/dp/grad_sync.h"
#include "runtime/offload/optimizer_offload.h"
#include "runtime/offload/param_offload.h"

namespace dscpp {

void Engine::init_offload() {
  const auto& oo = cfg_.zero_optimization.offload_optimizer;
  if (!oo || !oo->enabled()) return;
  DSCPP_CHECK(cfg_.zero_optimization.stage >= 1, "zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3");
  OptimizerOffload::ChunkFn params = [this](size_t u) { return unit_params(u); };
  OptimizerOffload::ChunkFn grads = [this](size_t u) { return unit_grads(u); };
  SwapOptions swap;
  swap.stage = cfg_.zero_optimization.stage;
  swap.sub_group_size = cfg_.zero_optimization.sub_group_size;
  swap.aio = cfg_.aio;
  offload_ = std::make_unique<OptimizerOffload>(resolved_optimizer(cfg_), *oo, cfg_.dscpp.offload, swap,
                                                model_->params(), zp_, mixed_, /*track_grads=*/!grad_sync_,
                                                /*params_on_host=*/param_offload_ != nullptr, params, grads);
  OptimizerOffload* o = offload_.get();
  if (const NvmeStates* n = o->nvme())  // the I/O backend's fallback, a slow disk: every rank's own
    for (const std::string& line : n->notices())
      std::cerr << (dp_world_size() > 1 ? "[rank " + std::to_string(dp_rank()) + "] " : std::string()) << line
                << std::endl;
  if (o->delayed() && grad_sync_) {  // gradients leave in backward (Note [Optimizer offload])
    grad_sync_->set_final_hook([o](size_t unit) { o->grads_final(unit); });
  } else if (o->delayed()) {
    model_->set_grad_ready_hook([this, o](int64_t b, int64_t e) {
      if (is_gradient_accumulation_boundary()) o->grads_ready(b, e);
    });
  }
  if (zparams_) {
    zparams_->set_shard_hook([o](int unit) { o->wait_unit(size_t(unit)); });
  } else if (!zp_.sharded()) {  // stages 1-2 across ranks wait in wait_param_gather
    Model::UnitHooks hooks;
    hooks.before = [o](int unit, Model::UnitPass) { o->wait_unit(size_t(unit)); };
    model_->set_unit_hooks(std::move(hooks));
  }
}

Tensor Engine::unit_params(size_t unit) const {
  if (param_shard_.defined()) return param_shard_.slice(zp_.shard_offset(unit), zp_.chunk(unit));
  if (zp_.sharded()) return owned_params(unit);  // owned range u is unit u's chunk
  const FlatRange r = zp_.units().at(unit);
  return model_->params().flat_params().slice(r.begin, r.size());
}

Tensor Engine::unit_grads(size_t unit) const {
  if (zp_.sharded()) return owned_grads(unit);
  const FlatRange r = zp_.units().at(unit);
  return model_->params().flat_grads().slice(r.begin, r.size());
}

// Note [Parameter offload]: the device optimizer steps each unit's chunk piece by piece into device staging
// buffers, each copied from there into the host partition; a unit's update is queued before its next gather.
void Engine::step_offloaded_params(float lr, float grad_scale) {
  const int64_t piece = param_offload_->staging_elements();
  for (size_t u = 0; u < zp_.units().size(); u++) {
    const FlatRange c = zp_.owned_in(u, zp_.rank());
    const int64_t shard = zp_.shard_offset(u);
    const Tensor g = unit_grads(u);
    for (int64_t b = 0; b < c.size(); b += piece) {
      const int64_t n = std::min(piece, c.size() - b);
      // Without masters the parameters are the f32 state: the buffer first takes their current values.
      Tensor p = param_offload_->stage_update(u, b, n, /*load=*/!mixed_);
      Tensor m = mixed_ ? master_.slice(shard + b, n) : p;
      const bool lowp = mixed_ && p.dtype() != DType::f32;
      optimizer_->update_range(c.begin + b, c.begin + b + n, m, g.slice(b, n), lr, grad_scale, lowp ? p : Tensor());
      if (mixed_ && !lowp) p.copy_from(m);
      param_offload_->commit_update(u, b, p);
    }
    zparams_->shard_updated(int(u));  // Note [Gathers at the step]: its upload queues after the update's copy
  }
}

nlohmann::json Engine::optimizer_meta() {
  nlohmann::json j = optimizer().state_json();
  nlohmann::json owned = nlohmann::json::array();
  for (const FlatRange& r : owned_) owned.push_back({r.begin, r.end});
  j["owned"] = owned;  // the host optimizer's own ranges are pieces of these
  return j;
}

std::vector<std::pair<std::string, Tensor>> Engine::optimizer_states() const {
  return offload_ ? offload_->state_tensors() : optimizer_->state_tensors();
}

}  // namespace dscpp
