// Adagrad over the owned flat range.
#include "runtime/optim/optimizers.h"

namespace dscpp {

AdagradOptimizer::AdagradOptimizer(const AdagradConfig& cfg, const ParamSet& params, std::vector<FlatRange> owned,
                                   StateMemory memory)
    : Optimizer(params, std::move(owned), memory), cfg_(cfg) {
  sum_ = new_state();
}

void AdagradOptimizer::update_segment(int64_t, int64_t, const Tensor& p, const Tensor& g, const Tensor& lowp,
                                      const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) {
  ops::AdagradParams a;
  a.lr = lr;
  a.eps = float(cfg_.eps);
  a.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
  a.grad_scale = grad_scale;
  ops::adagrad_update(p, g, states.at(0), a);
  if (lowp.defined()) Tensor(lowp).copy_from(p);  // the compute copy, rounded
}

void AdagradOptimizer::zero_state() {
  if (sum_.defined()) sum_.zero();  // undefined with StateMemory::none
  step_count_ = 0;
}

std::vector<std::pair<std::string, Tensor>> AdagradOptimizer::state_tensors() const { return {{"sum", sum_}}; }

nlohmann::json AdagradOptimizer::state_json() const {
  return {{"type", name()},
          {"step", step_count_},
          {"owned", owned_json()},
          {"eps", cfg_.eps},
          {"weight_decay", cfg_.weight_decay}};
}

}  // namespace dscpp
