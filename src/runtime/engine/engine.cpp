#include "dscpp/runtime/engine.h"

#include <cmath>

#include "dscpp/kernels/ops.h"
#include "dscpp/runtime/grad_clip.h"

namespace dscpp {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

OptimizerConfig resolved_optimizer(const DeepSpeedConfig& cfg) {
  if (!cfg.optimizer.type.empty()) return cfg.optimizer;
  // DeepSpeed requires a client optimizer when the config names none; our trainer has no client code, so the
  // default is DeepSpeed's own default choice for transformer training: AdamW at its defaults.
  OptimizerConfig o;
  o.type = "adamw";
  return o;
}
}  // namespace

Engine::Engine(std::unique_ptr<Model> model, DeepSpeedConfig config)
    : model_(std::move(model)),
      cfg_(std::move(config)),
      scheduler_(make_lr_scheduler(cfg_.scheduler, resolved_optimizer(cfg_).lr())),
      rng_(cfg_.seed) {
  DSCPP_CHECK(model_ != nullptr, "initialize: no model");
  DSCPP_CHECK(model_->params().materialized(), "initialize: model parameters are not materialized");
  DSCPP_CHECK(cfg_.gradient_accumulation_steps >= 1, "initialize: gradient_accumulation_steps unresolved");
  if (cfg_.fp16.enabled || cfg_.bf16.enabled)
    DSCPP_FAIL("fp16/bf16 mixed precision needs the CUDA backend (not built in this version); "
               "set \"fp16\": {\"enabled\": false} and \"bf16\": {\"enabled\": false} to train in f32 on the CPU");
  if (cfg_.zero_optimization.stage > 0 && cfg_.dp_world_size > 1)
    DSCPP_FAIL("zero_optimization.stage ", cfg_.zero_optimization.stage,
               " across ranks is not available yet in this version");
  optimizer_ = make_optimizer(resolved_optimizer(cfg_), model_->params());
  const auto& ac = cfg_.activation_checkpointing;
  if (ac.number_checkpoints)
    model_->set_checkpoint_policy(checkpoint_every(model_->config().n_layer, *ac.number_checkpoints));
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0;
}

double Engine::get_lr() const { return scheduler_.get_lr(); }

float Engine::forward(const Tensor& tokens, const Tensor& targets) {
  auto t0 = Clock::now();
  float loss = model_->forward(tokens, targets);
  times_.forward_ms += ms_since(t0);
  DSCPP_CHECK(std::isfinite(loss), "loss is ", loss, " at global step ", global_steps_,
              " (diverged: lower the learning rate or enable gradient_clipping)");
  loss_sum_ += loss;
  loss_count_++;
  return loss;
}

void Engine::backward() {
  auto t0 = Clock::now();
  model_->backward(1.0f / float(cfg_.gradient_accumulation_steps));  // DeepSpeed's scale_wrt_gas
  times_.backward_ms += ms_since(t0);
  times_.micro_steps++;
}

void Engine::step() {
  auto t0 = Clock::now();
  if (is_gradient_accumulation_boundary()) {
    ParamSet& ps = model_->params();
    last_grad_norm_ = std::sqrt(grad_sum_squares(ps.flat_grads()));
    float scale = 1.0f;
    if (cfg_.gradient_clipping > 0.0) scale = clip_coefficient(last_grad_norm_, cfg_.gradient_clipping);
    if (auto betas = scheduler_.betas_at(scheduler_.last_batch_iteration()); betas && optimizer_->name()[0] == 'a')
      optimizer_->set_betas((*betas)[0], (*betas)[1]);
    optimizer_->step(float(scheduler_.get_lr()), scale);
    scheduler_.step();
    ps.zero_grads();
    global_steps_++;
    global_samples_ += cfg_.train_batch_size;
    last_loss_ = loss_count_ ? float(loss_sum_ / double(loss_count_)) : 0.0f;
    loss_sum_ = 0.0;
    loss_count_ = 0;
    times_.steps++;
  }
  micro_steps_++;
  times_.step_ms += ms_since(t0);
}

StepTimes Engine::take_step_times() {
  StepTimes t = times_;
  times_ = {};
  return t;
}

std::unique_ptr<Engine> initialize(std::unique_ptr<Model> model, const DeepSpeedConfig& config) {
  return std::make_unique<Engine>(std::move(model), config);
}

}  // namespace dscpp
