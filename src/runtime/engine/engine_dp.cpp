// The engine's data-parallel set-up (ZeRO stage 0): config agreement, identical starting parameters, the gradient
// reducer wired to the model's grad-ready hook, and cross-rank loss averaging for printing.
#include "dscpp/runtime/engine.h"

namespace dscpp {

void Engine::init_data_parallel(ProcessGroup* pg) {
  if (!pg) return;
  DSCPP_CHECK(cfg_.dp_world_size == pg->size(), "initialize: the config was resolved for dp_world_size ",
              cfg_.dp_world_size, " but the data-parallel process group '", pg->name(), "' has ", pg->size(),
              " ranks (resolve the config with the group's size)");
  if (pg->size() == 1) return;  // nothing to communicate
  DSCPP_CHECK(pg->store() != nullptr, "initialize: process group '", pg->name(), "' has no store");
  // Keys are per group: one engine per data-parallel group (see check_same_config).
  check_same_config(*pg, *pg->store(), cfg_.hash());
  ParamSet& ps = model_->params();
  Tensor params = ps.flat_params();
  pg->broadcast(params, 0)->wait();  // every rank starts from rank 0's parameters
  dp_ = pg;
  const ZeroConfig& z = cfg_.zero_optimization;
  reducer_ = std::make_unique<GradReducer>(*pg, ps, z.reduce_bucket_size, z.overlap_comm);
  GradReducer* r = reducer_.get();
  model_->set_grad_ready_hook([r](int64_t b, int64_t e) { r->grads_ready(b, e); });
}

float Engine::global_last_loss() {
  if (!dp_) return last_loss_;
  return all_reduce_values(*dp_, {last_loss_}, ReduceOp::avg, model_->params().flat_params().device())[0];
}

}  // namespace dscpp
