// Lion over the owned flat range.
#include "runtime/optim/optimizers.h"

namespace dscpp {

LionOptimizer::LionOptimizer(const LionConfig& cfg, const ParamSet& params, std::vector<FlatRange> owned,
                             StateMemory memory)
    : Optimizer(params, std::move(owned), memory), cfg_(cfg) {
  exp_avg_ = new_state();
}

void LionOptimizer::update_segment(int64_t, int64_t, const Tensor& p, const Tensor& g, const Tensor& lowp,
                                   const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) {
  ops::LionParams l;
  l.lr = lr;
  l.beta1 = float(cfg_.betas[0]);
  l.beta2 = float(cfg_.betas[1]);
  l.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
  l.grad_scale = grad_scale;
  ops::lion_update(p, g, states.at(0), l);
  if (lowp.defined()) Tensor(lowp).copy_from(p);  // the compute copy, rounded
}

void LionOptimizer::zero_state() {
  if (exp_avg_.defined()) exp_avg_.zero();  // undefined with StateMemory::none
  step_count_ = 0;
}

std::vector<std::pair<std::string, Tensor>> LionOptimizer::state_tensors() const { return {{"exp_avg", exp_avg_}}; }

nlohmann::json LionOptimizer::state_json() const {
  return {{"type", name()},
          {"step", step_count_},
          {"owned", owned_json()},
          {"betas", {cfg_.betas[0], cfg_.betas[1]}},
          {"weight_decay", cfg_.weight_decay}};
}

void LionOptimizer::set_betas(double beta1, double beta2) { cfg_.betas = checked_betas(beta1, beta2); }

}  // namespace dscpp
