// The engine's data-parallel set-up: config agreement, identical starting parameters, and cross-rank loss averaging
// for printing. The gradient synchronisation (Note [Gradient sync]) is set up in engine_zero.cpp.
#include "dscpp/runtime/engine.h"

namespace dscpp {

void Engine::init_data_parallel(ProcessGroup* pg, bool copy_engine_over_gloo) {
  if (!pg) return;
  DSCPP_CHECK(cfg_.dp_world_size == pg->size(), "initialize: the config was resolved for dp_world_size ",
              cfg_.dp_world_size, " but the data-parallel process group '", pg->name(), "' has ", pg->size(),
              " ranks (resolve the config with the group's size)");
  if (pg->size() == 1) return;  // nothing to communicate
  // Before any collective, so that every rank stops here with the same message.
  if (cfg_.dscpp.copy_engine.enabled && std::string(pg->backend()) != "nccl" && !copy_engine_over_gloo)
    throw ConfigError("dscpp.copy_engine.enabled", "dscpp.copy_engine.enabled: copy-engine reductions need the nccl "
                      "backend, but the data-parallel group '" + pg->name() + "' is " + pg->backend() +
                      "; set it to false");
  DSCPP_CHECK(pg->store() != nullptr, "initialize: process group '", pg->name(), "' has no store");
  // Each engine on a group checks under its own keys (Note [Config checks per group]).
  check_same_config(*pg, *pg->store(), cfg_.hash());
  ParamSet& ps = model_->params();
  Tensor params = ps.flat_params();
  // Every rank starts from rank 0's parameters; a sharded initialisation (EngineOptions::init_seed) computes the
  // same values on every rank instead.
  if (params.defined()) pg->broadcast(params, 0)->wait();
  dp_ = pg;
}

float Engine::global_last_loss() {
  if (!dp_) return last_loss_;
  return all_reduce_values(*dp_, {last_loss_}, ReduceOp::avg, model_->params().device())[0];
}

}  // namespace dscpp
