// SGD (torch semantics) over the owned flat range, and make_optimizer.
#include "runtime/optim/optimizers.h"

namespace dscpp {

SgdOptimizer::SgdOptimizer(const SgdConfig& cfg, const ParamSet& params, std::vector<FlatRange> owned,
                           StateMemory memory)
    : Optimizer(params, std::move(owned), memory), cfg_(cfg) {
  if (cfg_.momentum != 0.0) momentum_ = new_state();
}

void SgdOptimizer::update_segment(int64_t, int64_t, const Tensor& p, const Tensor& g, const Tensor& lowp,
                                  const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) {
  ops::SgdParams s;
  s.lr = lr;
  s.momentum = float(cfg_.momentum);
  s.dampening = float(cfg_.dampening);
  s.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
  s.nesterov = cfg_.nesterov;
  s.first_step = step_count_ == 1;  // torch creates the buffer from the first gradient
  s.grad_scale = grad_scale;
  ops::sgd_update(p, g, states.empty() ? Tensor() : states[0], s);
  if (lowp.defined()) Tensor(lowp).copy_from(p);  // a view of the same storage
}

void SgdOptimizer::zero_state() {
  if (momentum_.defined()) momentum_.zero();  // undefined without momentum or with StateMemory::none
  step_count_ = 0;
}

std::vector<std::pair<std::string, Tensor>> SgdOptimizer::state_tensors() const {
  if (cfg_.momentum == 0.0) return {};  // torch keeps no buffer
  return {{"momentum_buffer", momentum_}};
}

nlohmann::json SgdOptimizer::state_json() const {
  return {{"type", name()},           {"step", step_count_},         {"owned", owned_json()},
          {"momentum", cfg_.momentum},   {"dampening", cfg_.dampening},
          {"weight_decay", cfg_.weight_decay}, {"nesterov", cfg_.nesterov}};
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const ParamSet& params, int64_t begin,
                                          int64_t end) {
  if (end < 0) end = params.flat_numel();
  return make_optimizer(cfg, params, std::vector<FlatRange>{{begin, end}});
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, const ParamSet& params,
                                          std::vector<FlatRange> owned, StateMemory memory) {
  if (cfg.is_adam())
    return std::make_unique<AdamOptimizer>(cfg.adam, cfg.type == "adamw", params, std::move(owned), memory);
  if (cfg.type == "sgd") return std::make_unique<SgdOptimizer>(cfg.sgd, params, std::move(owned), memory);
  if (cfg.type == "lion") return std::make_unique<LionOptimizer>(cfg.lion, params, std::move(owned), memory);
  if (cfg.type == "adagrad") return std::make_unique<AdagradOptimizer>(cfg.adagrad, params, std::move(owned), memory);
  DSCPP_FAIL("make_optimizer: no optimizer of type '", cfg.type, "' (config has no \"optimizer\" section?)");
}

}  // namespace dscpp
