// The concrete optimizers (private; created by make_optimizer).
#pragma once
#include "dscpp/kernels/ops.h"
#include "dscpp/runtime/optimizer.h"

namespace dscpp {

// Adam / AdamW with DeepSpeed FusedAdam semantics (adam_w_mode: decoupled decay; else L2 into the gradient).
class AdamOptimizer final : public Optimizer {
 public:
  AdamOptimizer(const AdamConfig& cfg, bool adamw_name, const ParamSet& params, std::vector<FlatRange> owned,
                StateMemory memory);
  const char* name() const override { return adamw_name_ ? "adamw" : "adam"; }
  void zero_state() override;
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  nlohmann::json state_json() const override;
  void set_betas(double beta1, double beta2) override;

 private:
  void update_segment(int64_t begin, int64_t end, const Tensor& p, const Tensor& g, const Tensor& lowp,
                      const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) override;
  AdamConfig cfg_;
  bool adamw_name_;
  Tensor exp_avg_, exp_avg_sq_;  // [owned_numel()] f32
};

// torch.optim.SGD with momentum, dampening, nesterov and L2 weight decay.
class SgdOptimizer final : public Optimizer {
 public:
  SgdOptimizer(const SgdConfig& cfg, const ParamSet& params, std::vector<FlatRange> owned, StateMemory memory);
  const char* name() const override { return "sgd"; }
  void zero_state() override;
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  nlohmann::json state_json() const override;

 private:
  void update_segment(int64_t begin, int64_t end, const Tensor& p, const Tensor& g, const Tensor& lowp,
                      const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) override;
  SgdConfig cfg_;
  Tensor momentum_;  // [owned_numel()] f32; undefined when momentum == 0 (torch keeps no buffer)
};

// Lion (DeepSpeed's FusedLion): one momentum state, the update its sign.
class LionOptimizer final : public Optimizer {
 public:
  LionOptimizer(const LionConfig& cfg, const ParamSet& params, std::vector<FlatRange> owned, StateMemory memory);
  const char* name() const override { return "lion"; }
  void zero_state() override;
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  nlohmann::json state_json() const override;
  void set_betas(double beta1, double beta2) override;

 private:
  void update_segment(int64_t begin, int64_t end, const Tensor& p, const Tensor& g, const Tensor& lowp,
                      const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) override;
  LionConfig cfg_;
  Tensor exp_avg_;  // [owned_numel()] f32
};

// torch.optim.Adagrad: the running sum of squared gradients.
class AdagradOptimizer final : public Optimizer {
 public:
  AdagradOptimizer(const AdagradConfig& cfg, const ParamSet& params, std::vector<FlatRange> owned, StateMemory memory);
  const char* name() const override { return "adagrad"; }
  void zero_state() override;
  std::vector<std::pair<std::string, Tensor>> state_tensors() const override;
  nlohmann::json state_json() const override;

 private:
  void update_segment(int64_t begin, int64_t end, const Tensor& p, const Tensor& g, const Tensor& lowp,
                      const std::vector<Tensor>& states, float lr, float grad_scale, bool decay) override;
  AdagradConfig cfg_;
  Tensor sum_;  // [owned_numel()] f32
};

}  // namespace dscpp
