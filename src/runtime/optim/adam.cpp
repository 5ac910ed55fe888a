// Adam / AdamW over the owned flat range.
#include "runtime/optim/optimizers.h"

namespace dscpp {

AdamOptimizer::AdamOptimizer(const AdamConfig& cfg, bool adamw_name, const ParamSet& params,
                             std::vector<FlatRange> owned, StateMemory memory)
    : Optimizer(params, std::move(owned), memory), cfg_(cfg), adamw_name_(adamw_name) {
  if (adamw_name) cfg_.adam_w_mode = true;  // "adamw" is always decoupled (DeepSpeed engine rule)
  exp_avg_ = new_state();
  exp_avg_sq_ = new_state();
}

void AdamOptimizer::update_segment(int64_t, int64_t, const Tensor& p, const Tensor& g, const Tensor& lowp,
                                   const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) {
  ops::AdamParams a;
  a.lr = lr;
  a.beta1 = float(cfg_.betas[0]);
  a.beta2 = float(cfg_.betas[1]);
  a.eps = float(cfg_.eps);
  a.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
  a.adamw_mode = cfg_.adam_w_mode;
  a.bias_correction = cfg_.bias_correction;
  a.step = step_count_;
  a.grad_scale = grad_scale;
  const Tensor &m = states.at(0), &v = states.at(1);
  if (lowp.defined()) ops::adam_update_with_copy(p, g, m, v, lowp, a);  // one pass writes both copies
  else ops::adam_update(p, g, m, v, a);
}

void AdamOptimizer::zero_state() {
  if (exp_avg_.defined()) exp_avg_.zero(), exp_avg_sq_.zero();  // undefined with StateMemory::none
  step_count_ = 0;
}

std::vector<std::pair<std::string, Tensor>> AdamOptimizer::state_tensors() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

nlohmann::json AdamOptimizer::state_json() const {
  return {{"type", name()},
          {"step", step_count_},
          {"owned", owned_json()},
          {"betas", {cfg_.betas[0], cfg_.betas[1]}},
          {"eps", cfg_.eps},
          {"weight_decay", cfg_.weight_decay},
          {"adam_w_mode", cfg_.adam_w_mode},
          {"bias_correction", cfg_.bias_correction}};
}

void AdamOptimizer::set_betas(double beta1, double beta2) { cfg_.betas = checked_betas(beta1, beta2); }

}  // namespace dscpp
